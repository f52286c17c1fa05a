//! The TLS material's checks, and the handshake a link on an event loop makes, held against
//! redis-rs' own: real redis-servers on TLS (certificates made by `openssl` for the test)
//! trusted and refused alike on either path.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;

use super::*;
use crate::core::connection::{Connection, ConnectionOptions};
use crate::core::connection::{Reactor, Socket};
use crate::core::error::Subject;
use crate::core::test_redis::Server;

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

/// An event loop for the tests: the runtime itself (the glue's is Node's), its sockets
/// Tokio's own. A link opened on it goes through `reactor::open` as one on Node's loop does.
struct OnRuntime;

impl Socket for tokio::net::TcpStream {}

impl Reactor for OnRuntime {
    fn spawn(&self, work: BoxFuture<'static, ()>) {
        tokio::spawn(work);
    }

    fn socket(&self, socket: std::net::TcpStream) -> std::io::Result<Box<dyn Socket>> {
        Ok(Box::new(tokio::net::TcpStream::from_std(socket)?))
    }

    fn caught_up(&self) -> BoxFuture<'static, ()> {
        Box::pin(async {})
    }
}

/// A throwaway CA and what it signed, in a directory of their own: `server` (localhost and
/// 127.0.0.1), `named` (redis.test only), `client` (a client certificate); and `stranger`, a
/// certificate of its own signing. Removed on drop.
struct Pki {
    dir: PathBuf,
}

impl Pki {
    fn new(name: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("mastra-test-pki-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let pki = Self { dir };
        let self_signed = |name: &str, subject: &str| {
            pki.openssl(&[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.crt"),
                "-days",
                "2",
                "-subj",
                subject,
            ]);
        };
        self_signed("ca", "/CN=mastra-lease test CA");
        self_signed("stranger", "/CN=stranger");
        pki.issue(
            "server",
            "/CN=localhost",
            "subjectAltName=DNS:localhost,IP:127.0.0.1",
        );
        pki.issue("named", "/CN=redis.test", "subjectAltName=DNS:redis.test");
        pki.issue(
            "client",
            "/CN=mastra-lease client",
            "extendedKeyUsage=clientAuth",
        );
        pki
    }

    /// A key and a certificate signed by the CA, with the extension `ext`.
    fn issue(&self, name: &str, subject: &str, ext: &str) {
        let (key, csr, cnf) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.cnf"),
        );
        self.openssl(&[
            "req", "-newkey", "rsa:2048", "-nodes", "-keyout", &key, "-out", &csr, "-subj", subject,
        ]);
        std::fs::write(self.file(&cnf), format!("{ext}\n")).unwrap();
        self.openssl(&[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            &format!("{name}.crt"),
            "-days",
            "2",
            "-extfile",
            &cnf,
        ]);
    }

    fn openssl(&self, args: &[&str]) {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(&self.dir)
            .output()
            .expect("openssl must be on the PATH");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn pem(&self, name: &str) -> Vec<u8> {
        std::fs::read(self.file(name)).unwrap()
    }

    /// The server files of `cert` (`server` or `named`) and the CA, as a server takes them.
    fn server_files(&self, cert: &str) -> [PathBuf; 3] {
        [
            self.file(&format!("{cert}.crt")),
            self.file(&format!("{cert}.key")),
            self.file("ca.crt"),
        ]
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[tokio::test]
async fn a_rediss_link_on_an_event_loop_trusts_and_refuses_exactly_what_redis_rs_does() {
    let pki = Pki::new("loop");
    let (_open, open) = Server::start_tls("tls-loop-open", &pki.server_files("server"), false);
    let (_mutual, mutual) = Server::start_tls("tls-loop-mutual", &pki.server_files("server"), true);
    let (_named, named) = Server::start_tls("tls-loop-named", &pki.server_files("named"), false);
    let tls = |ca: &str, client: Option<&str>| TlsOptions {
        ca: Some(pki.pem(&format!("{ca}.crt"))),
        cert: client.map(|c| pki.pem(&format!("{c}.crt"))),
        key: client.map(|c| pki.pem(&format!("{c}.key"))),
    };
    let cases = [
        (
            "the CA given",
            format!("rediss://localhost:{open}"),
            tls("ca", None),
            true,
        ),
        (
            "an IP address the certificate names",
            format!("rediss://127.0.0.1:{open}"),
            tls("ca", None),
            true,
        ),
        (
            "a CA that did not sign it",
            format!("rediss://localhost:{open}"),
            tls("stranger", None),
            false,
        ),
        (
            "a host the certificate does not name",
            format!("rediss://127.0.0.1:{named}"),
            tls("ca", None),
            false,
        ),
        (
            "no client certificate where one is asked for",
            format!("rediss://localhost:{mutual}"),
            tls("ca", None),
            false,
        ),
        (
            "a client certificate the server's CA signed",
            format!("rediss://localhost:{mutual}"),
            tls("ca", Some("client")),
            true,
        ),
        (
            "a client certificate of another CA",
            format!("rediss://localhost:{mutual}"),
            tls("ca", Some("stranger")),
            false,
        ),
        (
            "#insecure (verify nothing)",
            format!("rediss://localhost:{open}/#insecure"),
            tls("ca", None),
            false,
        ),
    ];
    for (case, url, tls, trusted) in cases {
        let options = ConnectionOptions {
            url,
            tls,
            command_timeout: Duration::from_secs(3),
            ..ConnectionOptions::default()
        };
        let looped = ConnectionOptions {
            reactor: Some(Arc::new(OnRuntime)),
            ..options.clone()
        };
        let on_loop = Connection::new(&looped, Subject::LeaseProvider).unwrap();
        assert!(
            on_loop.reactor().is_some(),
            "{case}: the link runs on the loop"
        );
        let redis_rs = Connection::new(&options, Subject::LeaseProvider).unwrap();
        let (ours, theirs) = (on_loop.ping().await, redis_rs.ping().await);
        assert_eq!(ours.is_ok(), trusted, "{case}, on the loop: {ours:?}");
        assert_eq!(theirs.is_ok(), trusted, "{case}, redis-rs: {theirs:?}");
        if let (Err(ours), Err(theirs)) = (&ours, &theirs) {
            assert_eq!(ours.code(), theirs.code(), "{case}: {ours} / {theirs}");
        }
        on_loop.close();
        redis_rs.close();
    }
}

#[tokio::test]
async fn a_handshake_is_configured_once_per_material_names_the_host_and_refuses_insecure_as_redis_rs(
) {
    let pki = Pki::new("once");
    let ca = TlsOptions {
        ca: Some(pki.pem("ca.crt")),
        ..TlsOptions::default()
    };
    let handshake = Handshake::new(&ca);
    let (first, name) = handshake.connector("127.0.0.1", false).await.unwrap();
    assert!(matches!(name, ServerName::IpAddress(_)), "{name:?}");
    let (again, name) = handshake.connector("localhost", false).await.unwrap();
    assert!(Arc::ptr_eq(first.config(), again.config()), "made once");
    let (another, _) = Handshake::new(&ca)
        .connector("localhost", false)
        .await
        .unwrap();
    assert!(
        Arc::ptr_eq(first.config(), another.config()),
        "made once in the process for the same material"
    );
    assert!(!first.config().client_auth_cert_resolver.has_certs());
    assert_eq!(name, ServerName::try_from("localhost").unwrap());
    let mutual = TlsOptions {
        cert: Some(pki.pem("client.crt")),
        key: Some(pki.pem("client.key")),
        ..ca.clone()
    };
    let (connector, _) = Handshake::new(&mutual)
        .connector("localhost", false)
        .await
        .unwrap();
    assert!(connector.config().client_auth_cert_resolver.has_certs());
    assert!(
        !Arc::ptr_eq(first.config(), connector.config()),
        "other material, another"
    );
    // redis-rs, built without its `tls-rustls-insecure` feature, refuses `#insecure` so: its
    // own refusal, asked of it directly, is the same.
    let Err(ours) = Handshake::new(&ca).connector("localhost", true).await else {
        panic!("#insecure was not refused");
    };
    let info =
        redis::IntoConnectionInfo::into_connection_info("rediss://127.0.0.1:1/#insecure").unwrap();
    let theirs = redis::Client::build_with_tls(info, ca.certificates())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap_err();
    assert_eq!(
        (ours.kind(), ours.to_string()),
        (theirs.kind(), theirs.to_string())
    );
}
