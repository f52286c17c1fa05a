//! The multiplexed Redis connection the lease store and the streams transport send their
//! non-blocking commands through: opened lazily (the first calls share one attempt),
//! reconnected by redis-rs' `ConnectionManager`, every call bounded by the command timeout.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Once, OnceLock};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{
    Client, ClientTlsConfig, ConnectionAddr, FromRedisValue, RedisResult, TlsCertificates, Value,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::{Map, Value as Json};

use crate::core::error::{InputErrorKind, LeaseError, Result};
use crate::core::streams::{Level, Logger, Notice};

/// The `code` field of the eviction-policy warning (and of Node's `process.emitWarning`).
pub const EVICTION_WARNING_CODE: &str = "MASTRA_LEASE_EVICTION_POLICY";

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
    fn check(&self) -> Result<()> {
        let range = |message: String| LeaseError::option(InputErrorKind::Range, message);
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
            (Some(_), None) | (None, Some(_)) => Err(LeaseError::option(
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
    let range = |message: String| LeaseError::option(InputErrorKind::Range, message);
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

/// A lazily opened, shared connection to one Redis.
pub struct Connection {
    client: Client,
    config: ConnectionManagerConfig,
    /// Made on first use, numbered. Replaced when Redis refused the connection itself (a
    /// wrong password, which the manager keeps and would answer every later call with), and
    /// when a call on it timed out (see [`Connection::run`]).
    slot: Mutex<Option<(u64, ConnectionManager)>>,
    /// The number the next connection made gets.
    made: AtomicU64,
    timeout: Duration,
    /// Checks the server's eviction policy once per established connection.
    eviction: Arc<EvictionCheck>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The client holds the URL, which may carry a password: never print it.
        f.debug_struct("Connection")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl Connection {
    /// Checks the URL and the TLS material; does not connect.
    pub fn new(
        url: &str,
        tls: &TlsOptions,
        connect_timeout: Duration,
        command_timeout: Duration,
    ) -> Result<Self> {
        install_tls_provider();
        let mut client = Client::open(url).map_err(|err| {
            // The URL may carry a password, so neither it nor the parser's echo of it is
            // repeated; the parser's complaint without the URL is enough to fix it.
            LeaseError::option(
                InputErrorKind::Range,
                format!(
                    "url is not a Redis URL (redis://, rediss://, redis+unix://): {}",
                    redact(&err.to_string(), url)
                ),
            )
        })?;
        if !tls.is_empty() {
            if !matches!(
                client.get_connection_info().addr(),
                ConnectionAddr::TcpTls { .. }
            ) {
                return Err(LeaseError::option(
                    InputErrorKind::Range,
                    "tls is set but url is not a rediss:// URL: TLS options apply to rediss:// \
                     only",
                ));
            }
            tls.check()?;
            let certificates = TlsCertificates {
                client_tls: tls.cert.clone().zip(tls.key.clone()).map(
                    |(client_cert, client_key)| ClientTlsConfig {
                        client_cert,
                        client_key,
                    },
                ),
                root_cert: tls.ca.clone(),
            };
            // The material was checked above, so this fails only on what redis-rs itself
            // refuses; its message is not repeated in case it quotes the material.
            client = Client::build_with_tls(client.get_connection_info().clone(), certificates)
                .map_err(|_| {
                    LeaseError::option(
                        InputErrorKind::Range,
                        "tls: the Redis client refused the certificates or key",
                    )
                })?;
        }
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(connect_timeout))
            .set_response_timeout(Some(command_timeout))
            .set_number_of_retries(1)
            .set_min_delay(Duration::from_millis(50))
            .set_max_delay(Duration::from_millis(500));
        Ok(Self {
            client,
            config,
            slot: Mutex::new(None),
            made: AtomicU64::new(0),
            timeout: command_timeout,
            eviction: Arc::new(EvictionCheck::default()),
        })
    }

    /// The client, for connections of their own (blocking reads must not share this one).
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The bound on every call.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Where the eviction-policy warning goes. Until a logger is set, the policy is never
    /// read (no extra command). The first logger set stays.
    pub fn set_logger(&self, logger: Arc<dyn Logger>) {
        let _ = self.eviction.logger.set(logger);
    }

    /// Runs commands on the connection, the whole call (connecting included) bounded by the
    /// command timeout. Must run inside a Tokio runtime.
    pub async fn run<T, F, Fut>(&self, work: F) -> Result<T>
    where
        F: FnOnce(ConnectionManager) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        self.run_within(self.timeout, work).await
    }

    /// Like [`Connection::run`], for work that may run twice (an XACK; a script that checks
    /// before it writes): when the connection breaks under it, leaving unknown whether it
    /// ran, it runs once more on a fresh connection within the same timeout. A server
    /// restart or an idle connection closed by a server, NAT or proxy then costs the
    /// caller nothing.
    pub async fn run_again_if_broken<T, F, Fut>(&self, work: F) -> Result<T>
    where
        F: Fn(ConnectionManager) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        let deadline = tokio::time::Instant::now() + self.timeout;
        match self.run_within(self.timeout, &work).await {
            Err(LeaseError::Connection(_)) => {
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                self.run_within(left, work).await
            }
            other => other,
        }
    }

    /// Like [`Connection::run`], bounded by `budget` (what is left of a call's timeout).
    pub async fn run_within<T, F, Fut>(&self, budget: Duration, work: F) -> Result<T>
    where
        F: FnOnce(ConnectionManager) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        let (number, connection) = self.get()?;
        match tokio::time::timeout(budget, work(connection)).await {
            Ok(Ok(value)) => {
                self.check_eviction();
                Ok(value)
            }
            Ok(Err(err)) => {
                let err = self.sort(err);
                if matches!(err, LeaseError::Timeout(_)) {
                    self.forget(number);
                }
                Err(err)
            }
            Err(_) => {
                self.forget(number);
                Err(LeaseError::Timeout(self.timeout))
            }
        }
    }

    /// Drops connection `number` after a call on it timed out, unless a newer one replaced
    /// it already. The manager reconnects after I/O errors only, and a connection that went
    /// silent (a forgotten NAT flow, a vanished host, a reply lost by a middlebox) raises
    /// none: without this every later call would time out on it, for as long as the kernel
    /// keeps the socket (minutes). Calls still waiting on it keep it until they settle; the
    /// price is one reconnect when the server was merely slow.
    fn forget(&self, number: u64) {
        let mut slot = self.slot();
        if slot.as_ref().is_some_and(|(current, _)| *current == number) {
            *slot = None;
            self.eviction.unchecked.store(true, Ordering::Relaxed);
        }
    }

    /// Sorts a redis-rs error into the variant a caller can act on, and forgets a connection
    /// Redis refused to authenticate so the next call tries again.
    pub fn sort(&self, err: redis::RedisError) -> LeaseError {
        if err.is_unrecoverable_error() || err.is_io_error() {
            // The manager replaces the connection after these: the next one is checked.
            self.eviction.unchecked.store(true, Ordering::Relaxed);
        }
        let err = LeaseError::from_redis(err, self.timeout);
        if matches!(err, LeaseError::Auth(_)) {
            self.slot().take();
            self.eviction.unchecked.store(true, Ordering::Relaxed);
        }
        err
    }

    /// Sorts the error in one reply of a pipeline. The connection answered, so it is kept,
    /// even for NOPERM: a key outside the user's ACL must not cost a reconnect per call.
    pub fn sort_reply(&self, err: redis::RedisError) -> LeaseError {
        LeaseError::from_redis(err, self.timeout)
    }

    /// After a call succeeded on a connection not yet checked: reads the eviction policy in
    /// a task of its own, so the call that got here is never delayed or failed by it.
    fn check_eviction(&self) {
        let Some(logger) = self.eviction.logger.get() else {
            return;
        };
        // A plain load first: the calls on a checked connection only read the flag.
        let unchecked = &self.eviction.unchecked;
        if !unchecked.load(Ordering::Relaxed) || !unchecked.swap(false, Ordering::Relaxed) {
            return;
        }
        let Ok((_, mut connection)) = self.get() else {
            return;
        };
        let (check, logger, timeout) = (self.eviction.clone(), logger.clone(), self.timeout);
        tokio::spawn(async move {
            let mut info = redis::cmd("INFO");
            info.arg("memory");
            let info = info.query_async::<String>(&mut connection);
            let error = match tokio::time::timeout(timeout, info).await {
                Ok(Ok(text)) => return check.judge(&text, &*logger),
                Ok(Err(err)) => {
                    if err.is_unrecoverable_error() || err.is_io_error() {
                        check.unchecked.store(true, Ordering::Relaxed);
                    }
                    LeaseError::from_redis(err, timeout).to_string()
                }
                Err(_) => {
                    check.unchecked.store(true, Ordering::Relaxed);
                    LeaseError::Timeout(timeout).to_string()
                }
            };
            // Refused (an ACL without INFO) or failed: the check is advice, so it is skipped.
            notice(
                &*logger,
                Level::Debug,
                SKIPPED,
                [("error", Json::from(error))],
            );
        });
    }

    fn get(&self) -> Result<(u64, ConnectionManager)> {
        let mut slot = self.slot();
        if let Some(current) = slot.as_ref() {
            return Ok(current.clone());
        }
        let connection =
            ConnectionManager::new_lazy_with_config(self.client.clone(), self.config.clone())
                .map_err(|err| LeaseError::from_redis(err, self.timeout))?;
        let current = (self.made.fetch_add(1, Ordering::Relaxed), connection);
        *slot = Some(current.clone());
        Ok(current)
    }

    fn slot(&self) -> MutexGuard<'_, Option<(u64, ConnectionManager)>> {
        // Only a clone or a replacement happens under this lock; poisoning cannot leave it
        // half-written.
        self.slot
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

const SKIPPED: &str =
    "mastra-lease: could not read the Redis eviction policy (INFO memory); not checked";

/// The eviction-policy check of one [`Connection`].
struct EvictionCheck {
    logger: OnceLock<Arc<dyn Logger>>,
    /// Set while the connection in use has not been checked: at first, and whenever an
    /// error means the manager replaces the connection.
    unchecked: AtomicBool,
    /// Policies already warned about: one warning per policy value.
    warned: Mutex<Vec<String>>,
}

impl Default for EvictionCheck {
    fn default() -> Self {
        Self {
            logger: OnceLock::new(),
            unchecked: AtomicBool::new(true),
            warned: Mutex::new(Vec::new()),
        }
    }
}

impl EvictionCheck {
    /// Warns, once per policy value, when `INFO memory` shows a policy that may evict leases.
    fn judge(&self, info: &str, logger: &dyn Logger) {
        let field = |name: &str| {
            info.lines()
                .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
                .map(str::trim)
        };
        let maxmemory = field("maxmemory").and_then(|v| v.parse::<u64>().ok());
        let (Some(maxmemory), Some(policy)) = (maxmemory, field("maxmemory_policy")) else {
            return;
        };
        let Some(message) = eviction_warning(maxmemory, policy) else {
            return;
        };
        {
            let mut warned = self.warned.lock().unwrap_or_else(|p| p.into_inner());
            if warned.iter().any(|p| p == policy) {
                return;
            }
            warned.push(policy.to_owned());
        }
        let fields = [
            ("code", Json::from(EVICTION_WARNING_CODE)),
            ("maxmemory", Json::from(maxmemory)),
            ("maxmemoryPolicy", Json::from(policy)),
        ];
        notice(logger, Level::Warn, &message, fields);
    }
}

/// The warning for a server that may evict lease keys, or `None` when it never does: only
/// `noeviction` is safe once `maxmemory` is set (0 means no limit).
pub fn eviction_warning(maxmemory: u64, policy: &str) -> Option<String> {
    if maxmemory == 0 || policy == "noeviction" {
        return None;
    }
    let why = if policy.starts_with("volatile-") {
        " (volatile-* policies evict keys that have a TTL, and every lease has one)"
    } else {
        ""
    };
    Some(format!(
        "mastra-lease: Redis may evict lease keys under memory pressure: maxmemory-policy is \
         {policy}{why} with maxmemory {maxmemory}. An evicted lease is free for another owner \
         while its holder still believes it holds it. Set maxmemory-policy noeviction, or keep \
         leases on a Redis of their own."
    ))
}

fn notice<const N: usize>(
    logger: &dyn Logger,
    level: Level,
    message: &str,
    fields: [(&str, Json); N],
) {
    let fields: Map<String, Json> = fields.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
    logger.log(Notice {
        level,
        message: message.to_owned(),
        fields,
    });
}

/// Parses a reply, turning an error reply into the error.
pub fn parse<T: FromRedisValue>(reply: Value) -> RedisResult<T> {
    redis::from_redis_value::<RedisResult<T>>(reply)?
}

/// Removes the URL (and so any password in it) from a message.
fn redact(message: &str, url: &str) -> String {
    if url.is_empty() {
        message.to_owned()
    } else {
        message.replace(url, "<url>")
    }
}

/// rustls needs one process-wide crypto provider before the first `rediss://` connection.
fn install_tls_provider() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // Another library in the process may have installed one already; that one serves.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Collect(Mutex<Vec<Notice>>);

    impl Logger for Collect {
        fn log(&self, notice: Notice) {
            self.0.lock().unwrap().push(notice);
        }
    }

    fn info(maxmemory: u64, policy: &str) -> String {
        format!(
            "# Memory\r\nused_memory:1024\r\nmaxmemory:{maxmemory}\r\nmaxmemory_human:x\r\n\
             maxmemory_policy:{policy}\r\nmem_allocator:jemalloc\r\n"
        )
    }

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
        let err = Connection::new(
            "rediss://localhost:1",
            &tls,
            Duration::from_secs(1),
            Duration::from_secs(1),
        )
        .unwrap_err();
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
            Err(LeaseError::InvalidOption {
                kind: InputErrorKind::Type,
                ..
            })
        ));
    }

    #[test]
    fn only_noeviction_or_no_limit_is_safe() {
        assert_eq!(eviction_warning(0, "allkeys-lru"), None);
        assert_eq!(eviction_warning(1 << 20, "noeviction"), None);
        for policy in [
            "allkeys-lru",
            "allkeys-lfu",
            "allkeys-random",
            "volatile-ttl",
        ] {
            let message = eviction_warning(1 << 20, policy).unwrap();
            assert!(message.contains(policy), "{message}");
        }
        assert!(eviction_warning(1, "volatile-lru")
            .unwrap()
            .contains("every lease has one"));
        assert!(!eviction_warning(1, "allkeys-lru")
            .unwrap()
            .contains("every lease has one"));
    }

    #[test]
    fn warns_once_per_policy_from_info_memory() {
        let check = EvictionCheck::default();
        let logger = Collect::default();
        check.judge(&info(0, "allkeys-lru"), &logger);
        check.judge(&info(100, "noeviction"), &logger);
        check.judge("# Memory\r\nmaxmemory_human:0B\r\n", &logger);
        assert!(logger.0.lock().unwrap().is_empty());
        check.judge(&info(100, "allkeys-lru"), &logger);
        check.judge(&info(200, "allkeys-lru"), &logger);
        check.judge(&info(100, "volatile-lru"), &logger);
        let notices = logger.0.lock().unwrap();
        let policies: Vec<_> = notices
            .iter()
            .map(|n| (n.level, n.fields["maxmemoryPolicy"].clone()))
            .collect();
        assert_eq!(
            policies,
            [
                (Level::Warn, Json::from("allkeys-lru")),
                (Level::Warn, Json::from("volatile-lru"))
            ]
        );
        assert_eq!(notices[0].fields["maxmemory"], Json::from(100));
        assert_eq!(notices[0].fields["code"], Json::from(EVICTION_WARNING_CODE));
    }
}
