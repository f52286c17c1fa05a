//! TLS for `rediss://` URLs: the material an application gives (a CA, a client certificate
//! and key), checked before anything connects, and rustls' process-wide crypto provider.
//! redis-rs makes the TLS of the connections it opens itself; for the shared link to one
//! server on the embedder's event loop ([`Handshake`], `reactor.rs`), rustls' client
//! configuration is made here as redis-rs makes its own, which it keeps to itself.

use std::sync::{Arc, Mutex, Once};

use redis::{ClientTlsConfig, ErrorKind, RedisError, RedisResult, TlsCertificates};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore};
use tokio_rustls::TlsConnector;

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

/// How a connection of ours makes its TLS handshake: with the rustls configuration redis-rs
/// 1.8 would make for the same URL and material (`create_rustls_config`, which it keeps to
/// itself), so the verification is the same on either path:
///
/// - the server's certificate chains to `tls.ca` when it is given, which replaces the
///   platform's roots; to the platform's roots otherwise (rustls-native-certs, which reads
///   `SSL_CERT_FILE` and `SSL_CERT_DIR` too); the platform's roots are loaded in either case,
///   and an error loading them fails the connection, as in redis-rs;
/// - the name verified (and sent as SNI, unless it is an IP address) is the host connected
///   to (the URL's, or the master's the sentinels name);
/// - no session is resumed: each connection makes a full handshake, as with redis-rs;
/// - `tls.cert` and `tls.key`, when given, are the client's certificate;
/// - `#insecure` (a URL fragment redis-rs reads as: verify nothing) is refused with
///   redis-rs' own error, as a build without its `tls-rustls-insecure` feature refuses it.
pub(super) struct Handshake {
    options: TlsOptions,
}

impl Handshake {
    /// TLS with `options`' material.
    pub(super) fn new(options: &TlsOptions) -> Self {
        Self {
            options: options.clone(),
        }
    }

    /// The connector and the name the certificate of the server at `host` must bear, or the
    /// error redis-rs would fail the connection with (`insecure` as the URL says). Must run
    /// inside the runtime's context.
    pub(super) async fn connector(
        &self,
        host: &str,
        insecure: bool,
    ) -> RedisResult<(TlsConnector, ServerName<'static>)> {
        if insecure {
            return Err(RedisError::from((
                ErrorKind::InvalidClientConfig,
                "Cannot create insecure client without tls-rustls-insecure feature",
            )));
        }
        // Made once in the process for this material ([`MADE`]), on a thread of the runtime's
        // blocking pool: loading the platform's roots reads and parses files, milliseconds the
        // caller's loop would not run.
        let config = match made(&self.options) {
            Some(config) => config,
            None => {
                let options = self.options.clone();
                tokio::task::spawn_blocking(move || {
                    let config = Arc::new(client_config(&options)?);
                    Ok::<_, RedisError>(keep(options, config))
                })
                .await
                .map_err(|_| {
                    RedisError::from(std::io::Error::other(
                        "the TLS configuration could not be made",
                    ))
                })??
            }
        };
        let name = ServerName::try_from(host)?.to_owned();
        Ok((TlsConnector::from(config.clone()), name))
    }
}

impl std::fmt::Debug for Handshake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handshake")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// The configurations made in this process, by the material they were made with: the
/// connection targets that share their material share one, the platform's roots read once
/// (some 27 ms the first time) rather than once per target. A configuration resumes no
/// session, so sharing it shares nothing of one connection with another.
static MADE: Mutex<Vec<(TlsOptions, Arc<ClientConfig>)>> = Mutex::new(Vec::new());

/// The configuration made for `options` in this process, if one was.
fn made(options: &TlsOptions) -> Option<Arc<ClientConfig>> {
    let made = crate::core::lock(&MADE);
    made.iter()
        .find(|(material, _)| material == options)
        .map(|(_, config)| config.clone())
}

/// Keeps `config`, made for `options`, unless one was kept for them meanwhile: answers the one
/// kept.
fn keep(options: TlsOptions, config: Arc<ClientConfig>) -> Arc<ClientConfig> {
    let mut made = crate::core::lock(&MADE);
    match made.iter().find(|(material, _)| *material == options) {
        Some((_, kept)) => kept.clone(),
        None => {
            made.push((options, config.clone()));
            config
        }
    }
}

/// rustls' client configuration for `options`, step for step as redis-rs 1.8 makes it
/// (`create_rustls_config`), its errors the same.
fn client_config(options: &TlsOptions) -> RedisResult<ClientConfig> {
    let mut platform = RootCertStore::empty();
    let mut loaded = rustls_native_certs::load_native_certs();
    if let Some(err) = loaded.errors.pop() {
        return Err(err.into());
    }
    for cert in loaded.certs {
        platform.add(cert)?;
    }
    let roots = match &options.ca {
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(ca) {
                let cert = cert.map_err(|err| {
                    std::io::Error::other(format!("Unable to parse root certificate PEM: {err}"))
                })?;
                if roots.add(cert).is_err() {
                    return Err(std::io::Error::other("Unable to parse TLS trust anchors").into());
                }
            }
            roots
        }
        None => platform,
    };
    let builder = ClientConfig::builder().with_root_certificates(roots);
    let mut config = match (&options.cert, &options.key) {
        (Some(cert), Some(key)) => {
            let chain = CertificateDer::pem_slice_iter(cert)
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(|err| {
                    std::io::Error::other(format!(
                        "Unable to parse client certificate chain PEM: {err}"
                    ))
                })?;
            let key = PrivateKeyDer::from_pem_slice(key).map_err(|err| {
                std::io::Error::other(format!(
                    "Unable to extract private key from PEM file: {err}"
                ))
            })?;
            builder.with_client_auth_cert(chain, key).map_err(|err| {
                RedisError::from((
                    ErrorKind::InvalidClientConfig,
                    "Unable to build client with TLS parameters provided.",
                    err.to_string(),
                ))
            })?
        }
        // A certificate without its key is refused when the options are read (`check`).
        _ => builder.with_no_client_auth(),
    };
    // redis-rs makes a configuration per connection, whose session cache starts empty: no
    // session is ever resumed, every connection verifies the server's certificate. Nor here,
    // where one configuration serves every connection with the same material.
    config.resumption = rustls::client::Resumption::disabled();
    Ok(config)
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
mod tests;
