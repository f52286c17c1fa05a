//! TLS for `rediss://` URLs: the material an application gives (a CA, a client certificate
//! and key), checked before anything connects, and rustls' process-wide crypto provider.

use std::sync::Once;

use redis::{ClientTlsConfig, TlsCertificates};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::core::error::{Error, InputErrorKind, Result};

/// TLS material for a `rediss://` URL, each PEM-encoded. Without any, the server certificate
/// is verified against the platform's roots (and the file named by `SSL_CERT_FILE`).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct TlsOptions {
    /// The certificates trusted to sign the server's, one or more; replaces the platform's
    /// roots.
    pub ca: Option<Vec<u8>>,
    /// The client certificate (chain), for servers with `tls-auth-clients yes`. With `key`.
    pub cert: Option<Vec<u8>>,
    /// The client certificate's private key. With `cert`.
    pub key: Option<Vec<u8>>,
}

impl TlsOptions {
    /// Whether nothing is set.
    pub fn is_empty(&self) -> bool {
        self.ca.is_none() && self.cert.is_none() && self.key.is_none()
    }

    /// Checks the PEM: `ca` and `cert` hold certificates that parse, `key` a private key
    /// that matches `cert`. The messages never repeat the material.
    pub(super) fn check(&self) -> Result<()> {
        let range = |message: String| Error::option(InputErrorKind::Range, message);
        let mut roots = rustls::RootCertStore::empty();
        if let Some(ca) = &self.ca {
            for (n, cert) in certificates("ca", ca)?.into_iter().enumerate() {
                roots.add(cert).map_err(|_| {
                    range(format!(
                        "tls.ca: certificate {} is not a valid X.509 certificate",
                        n + 1
                    ))
                })?;
            }
        }
        match (&self.cert, &self.key) {
            (None, None) => Ok(()),
            (Some(_), None) | (None, Some(_)) => Err(Error::option(
                InputErrorKind::Type,
                "tls.cert and tls.key go together: give both (the client certificate and its \
                 private key) or neither",
            )),
            (Some(cert), Some(key)) => {
                let chain = certificates("cert", cert)?;
                let key = PrivateKeyDer::from_pem_slice(key).map_err(|_| {
                    range("tls.key holds no PEM private key (PKCS#8, PKCS#1 or SEC1)".to_owned())
                })?;
                // The same check rustls makes when it connects, made now: an unsupported key
                // type, or a key that is not the certificate's.
                let provider = rustls::crypto::ring::default_provider();
                rustls::sign::CertifiedKey::from_der(chain, key, &provider)
                    .map(drop)
                    .map_err(|_| {
                        range(
                            "tls.key is not the private key of tls.cert's first certificate, \
                             or its type is not supported"
                                .to_owned(),
                        )
                    })
            }
        }
    }

    /// The material as redis-rs takes it.
    pub(super) fn certificates(&self) -> TlsCertificates {
        TlsCertificates {
            client_tls: self
                .cert
                .clone()
                .zip(self.key.clone())
                .map(|(client_cert, client_key)| ClientTlsConfig {
                    client_cert,
                    client_key,
                }),
            root_cert: self.ca.clone(),
        }
    }
}

impl std::fmt::Debug for TlsOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Says only what is set: the key is a secret.
        f.debug_struct("TlsOptions")
            .field("ca", &self.ca.is_some())
            .field("cert", &self.cert.is_some())
            .field("key", &self.key.is_some())
            .finish()
    }
}

/// The certificates in a PEM option: at least one, each block well-formed.
fn certificates(label: &str, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>> {
    let range = |message: String| Error::option(InputErrorKind::Range, message);
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|_| range(format!("tls.{label} is not well-formed PEM")))?;
    if certs.is_empty() {
        return Err(range(format!(
            "tls.{label} holds no PEM certificate (-----BEGIN CERTIFICATE-----)"
        )));
    }
    Ok(certs)
}

/// rustls needs one process-wide crypto provider before the first `rediss://` connection.
pub(super) fn install_provider() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // Another library in the process may have installed one already; that one serves.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::connection::{Connection, ConnectionOptions};
    use crate::core::error::Subject;

    #[test]
    fn tls_options_never_print_or_echo_their_material() {
        let secret = b"-----BEGIN PRIVATE KEY-----\nc2VjcmV0\n-----END PRIVATE KEY-----\n";
        let tls = TlsOptions {
            ca: Some(secret.to_vec()),
            cert: None,
            key: Some(secret.to_vec()),
        };
        let shown = format!("{tls:?}");
        assert_eq!(shown, "TlsOptions { ca: true, cert: false, key: true }");
        let options = ConnectionOptions {
            url: "rediss://localhost:1".into(),
            tls: tls.clone(),
            ..ConnectionOptions::default()
        };
        let err = Connection::new(&options, Subject::LeaseProvider).unwrap_err();
        let message = err.to_string();
        assert!(
            message.contains("tls.ca holds no PEM certificate"),
            "{message}"
        );
        assert!(!message.contains("c2VjcmV0"), "{message}");
        let lone_key = TlsOptions {
            key: Some(secret.to_vec()),
            ..TlsOptions::default()
        };
        assert!(matches!(
            lone_key.check(),
            Err(Error::InvalidOption {
                kind: InputErrorKind::Type,
                ..
            })
        ));
    }
}
