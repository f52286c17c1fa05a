//! The Redis connection the lease store and the streams transport send their non-blocking
//! commands through (opened lazily, the first calls sharing one attempt; reconnected by
//! redis-rs' `ConnectionManager`; every call bounded by the command timeout), and the
//! dedicated connections blocking reads need.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Once, OnceLock};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::{
    AsyncConnectionConfig, Client, ClientTlsConfig, ConnectionAddr, FromRedisValue, RedisResult,
    TlsCertificates, Value,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::Value as Json;

use crate::core::error::{Error, InputErrorKind, Result, Subject};
use crate::core::log::{Level, Logger, Notice};

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

/// How to reach one Redis, and the bounds on reaching it.
#[derive(Clone)]
pub struct ConnectionOptions {
    /// `redis://[user:pass@]host[:port][/db]`, `rediss://...` for TLS, or
    /// `redis+unix:///path/to.sock`. Default `redis://127.0.0.1:6379`.
    pub url: String,
    /// The ACL user, in place of one in the URL.
    pub username: Option<String>,
    /// The password, in place of one in the URL.
    pub password: Option<String>,
    /// The database number, in place of one in the URL.
    pub database: Option<i64>,
    /// CA, client certificate and key for a `rediss://` URL. Default none.
    pub tls: TlsOptions,
    /// Given to every connection with `CLIENT SETNAME`, so operators find them in
    /// `CLIENT LIST`. Default `mastra-lease`.
    pub name: Option<String>,
    /// Bound on one attempt to open a connection. Default 2 s.
    pub connect_timeout: Duration,
    /// Bound on every call, connecting included. Default 2 s.
    pub command_timeout: Duration,
}

impl Default for ConnectionOptions {
    fn default() -> Self {
        Self {
            url: "redis://127.0.0.1:6379".to_owned(),
            username: None,
            password: None,
            database: None,
            tls: TlsOptions::default(),
            name: Some(DEFAULT_NAME.to_owned()),
            connect_timeout: Duration::from_secs(2),
            command_timeout: Duration::from_secs(2),
        }
    }
}

impl std::fmt::Debug for ConnectionOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URL and the password are secrets: say only what is set.
        f.debug_struct("ConnectionOptions")
            .field("username", &self.username.is_some())
            .field("password", &self.password.is_some())
            .field("database", &self.database)
            .field("tls", &self.tls)
            .field("name", &self.name)
            .field("connect_timeout", &self.connect_timeout)
            .field("command_timeout", &self.command_timeout)
            .finish_non_exhaustive()
    }
}

/// The connection name every connection gets unless the options name another.
pub const DEFAULT_NAME: &str = "mastra-lease";

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

/// A lazily opened, shared connection to one Redis.
///
/// ## Behavior
/// - Nothing connects until the first call; the calls made meanwhile share one attempt.
/// - Every call, connecting included, is bounded by the command timeout: it answers, or it
///   fails with [`Error::Timeout`].
/// - An I/O error breaks the connection; redis-rs' `ConnectionManager` opens a new one for the
///   next call. A call that broke with it fails with [`Error::Connection`], unless it went
///   through [`Connection::run_again_if_broken`].
/// - A call that timed out gives up its connection (see [`Connection::run`]).
/// - Each new connection is named (`CLIENT SETNAME`) and, with a logger, has its eviction
///   policy read, in a task of its own after a call on it succeeded.
/// - After [`Connection::close`] every call fails with [`Error::Closed`].
pub struct Connection {
    client: Client,
    config: ConnectionManagerConfig,
    /// For the dedicated connections blocking reads need.
    dedicated: AsyncConnectionConfig,
    /// Made on first use, numbered. Replaced when Redis refused the connection itself (a
    /// wrong password, which the manager keeps and would answer every later call with), and
    /// when a call on it timed out (see [`Connection::run`]).
    slot: Mutex<Option<(u64, ConnectionManager)>>,
    /// The number the next connection made gets.
    made: AtomicU64,
    timeout: Duration,
    connect_timeout: Duration,
    name: Option<String>,
    /// What a call after `close` says is closed.
    subject: Subject,
    closed: AtomicBool,
    /// Names a fresh connection and checks the server's eviction policy on it.
    setup: Arc<Setup>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The client holds the URL, which may carry a password: never print it.
        f.debug_struct("Connection")
            .field("timeout", &self.timeout)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl Connection {
    /// Checks the URL, the credentials and the TLS material; does not connect. `subject` is
    /// what a call after [`Connection::close`] says was closed.
    pub fn new(options: &ConnectionOptions, subject: Subject) -> Result<Self> {
        install_tls_provider();
        let url = &options.url;
        let client = Client::open(url.as_str()).map_err(|err| {
            // The URL may carry a password, so neither it nor the parser's echo of it is
            // repeated; the parser's complaint without the URL is enough to fix it.
            Error::option(
                InputErrorKind::Range,
                format!(
                    "url is not a Redis URL (redis://, rediss://, redis+unix://): {}",
                    redact(&err.to_string(), url)
                ),
            )
        })?;
        let mut info = client.get_connection_info().clone();
        let mut settings = info.redis_settings().clone();
        // Given twice, differently: which one was meant cannot be told.
        let twice = |what: &str| {
            Error::option(
                InputErrorKind::Type,
                format!("the {what} is given both in the url and as an option, differently"),
            )
        };
        if let Some(username) = &options.username {
            if settings.username().is_some_and(|u| u != username) {
                return Err(twice("username"));
            }
            settings = settings.set_username(username);
        }
        if let Some(password) = &options.password {
            if settings.password().is_some_and(|p| p != password) {
                return Err(twice("password"));
            }
            settings = settings.set_password(password);
        }
        if let Some(database) = options.database {
            if settings.db() != 0 && settings.db() != database {
                return Err(twice("database"));
            }
            settings = settings.set_db(database);
        }
        info = info.set_redis_settings(settings);
        let tls = &options.tls;
        let client = if tls.is_empty() {
            Client::open(info)
        } else {
            if !matches!(info.addr(), ConnectionAddr::TcpTls { .. }) {
                return Err(Error::option(
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
            Client::build_with_tls(info, certificates)
        }
        // The material was checked above, so this fails only on what redis-rs itself
        // refuses; its message is not repeated in case it quotes the material.
        .map_err(|_| {
            Error::option(
                InputErrorKind::Range,
                "tls: the Redis client refused the certificates or key",
            )
        })?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(options.connect_timeout))
            .set_response_timeout(Some(options.command_timeout))
            .set_number_of_retries(1)
            .set_min_delay(Duration::from_millis(50))
            .set_max_delay(Duration::from_millis(500));
        // A blocking read answers after its BLOCK, which the caller bounds: no response
        // timeout of redis-rs' own on these.
        let dedicated = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(options.connect_timeout))
            .set_response_timeout(None);
        Ok(Self {
            client,
            config,
            dedicated,
            slot: Mutex::new(None),
            made: AtomicU64::new(0),
            timeout: options.command_timeout,
            connect_timeout: options.connect_timeout,
            name: options.name.clone(),
            subject,
            closed: AtomicBool::new(false),
            setup: Arc::new(Setup::default()),
        })
    }

    /// The bound on every call.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Where the eviction-policy warning goes. Until a logger is set, the policy is never
    /// read (no extra command). The first logger set stays.
    pub fn set_logger(&self, logger: Arc<dyn Logger>) {
        let _ = self.setup.logger.set(logger);
    }

    /// Opens a connection of its own for a caller that blocks on it (XREAD BLOCK must not
    /// hold up the shared one), named like every other, bounded by the connect and command
    /// timeouts. Answers it with its `CLIENT ID`, when the server tells it (an ACL may not):
    /// another connection can interrupt a blocking read with `CLIENT UNBLOCK <id>`.
    pub async fn dedicated(&self) -> Result<(MultiplexedConnection, Option<i64>)> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed(self.subject));
        }
        let bound = self.connect_timeout.saturating_add(self.timeout);
        let attempt = async {
            let mut connection = self
                .client
                .get_multiplexed_async_connection_with_config(&self.dedicated)
                .await?;
            let mut pipe = redis::pipe();
            if let Some(name) = &self.name {
                pipe.cmd("CLIENT").arg("SETNAME").arg(name);
            }
            pipe.cmd("CLIENT").arg("ID");
            let replies = connection
                .send_packed_commands(&pipe, 0, pipe.len())
                .await?;
            // Both are conveniences: an ACL that refuses them costs a name and a prompt
            // wake-up, not the connection.
            let id = replies
                .into_iter()
                .last()
                .and_then(|reply| parse::<i64>(reply).ok());
            Ok::<_, redis::RedisError>((connection, id))
        };
        match tokio::time::timeout(bound, attempt).await {
            Ok(Ok(opened)) => Ok(opened),
            Ok(Err(err)) => Err(Error::from_redis(err, bound)),
            Err(_) => Err(Error::Timeout(bound)),
        }
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
            Err(Error::Connection(_)) => {
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
                self.set_up_fresh();
                Ok(value)
            }
            Ok(Err(err)) => {
                let err = self.sort(err);
                if matches!(err, Error::Timeout(_)) {
                    self.forget(number);
                }
                Err(err)
            }
            Err(_) => {
                self.forget(number);
                Err(Error::Timeout(self.timeout))
            }
        }
    }

    /// Closes the connection; every later call fails with [`Error::Closed`]. Calls in
    /// flight keep the connection until they settle.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.slot().take();
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
            self.setup.fresh.store(true, Ordering::Relaxed);
        }
    }

    /// Sorts a redis-rs error into the variant a caller can act on, and forgets a connection
    /// Redis refused to authenticate so the next call tries again.
    pub fn sort(&self, err: redis::RedisError) -> Error {
        if err.is_unrecoverable_error() || err.is_io_error() {
            // The manager replaces the connection after these: the next one is set up.
            self.setup.fresh.store(true, Ordering::Relaxed);
        }
        let err = Error::from_redis(err, self.timeout);
        if matches!(err, Error::Auth(_)) {
            self.slot().take();
            self.setup.fresh.store(true, Ordering::Relaxed);
        }
        err
    }

    /// Sorts the error in one reply of a pipeline. The connection answered, so it is kept,
    /// even for NOPERM: a key outside the user's ACL must not cost a reconnect per call.
    pub fn sort_reply(&self, err: redis::RedisError) -> Error {
        Error::from_redis(err, self.timeout)
    }

    /// After a call succeeded on a connection not yet set up: names it and reads the
    /// eviction policy, in a task of its own, so the call that got here is never delayed or
    /// failed by either.
    fn set_up_fresh(&self) {
        // A plain load first: the calls on a set-up connection only read the flag.
        let fresh = &self.setup.fresh;
        if !fresh.load(Ordering::Relaxed) {
            return;
        }
        let logger = self.setup.logger.get().cloned();
        if (self.name.is_none() && logger.is_none()) || !fresh.swap(false, Ordering::Relaxed) {
            return;
        }
        let Ok((_, mut connection)) = self.get() else {
            return;
        };
        let mut pipe = redis::pipe();
        if let Some(name) = &self.name {
            pipe.cmd("CLIENT").arg("SETNAME").arg(name);
        }
        if logger.is_some() {
            pipe.cmd("INFO").arg("memory");
        }
        let (setup, timeout) = (self.setup.clone(), self.timeout);
        tokio::spawn(async move {
            let replies = connection.send_packed_commands(&pipe, 0, pipe.len());
            let error = match tokio::time::timeout(timeout, replies).await {
                Ok(Ok(replies)) => {
                    // Each reply answers for itself: a refused name leaves the check standing.
                    let failed = replies.iter().find_map(|reply| match reply {
                        Value::ServerError(err) => Some(err.to_string()),
                        _ => None,
                    });
                    if let (Some(logger), Some(Ok(text))) =
                        (&logger, replies.into_iter().last().map(parse::<String>))
                    {
                        setup.judge(&text, &**logger);
                    }
                    match failed {
                        Some(error) => error,
                        None => return,
                    }
                }
                Ok(Err(err)) => {
                    if err.is_unrecoverable_error() || err.is_io_error() {
                        setup.fresh.store(true, Ordering::Relaxed);
                    }
                    Error::from_redis(err, timeout).to_string()
                }
                Err(_) => {
                    setup.fresh.store(true, Ordering::Relaxed);
                    Error::Timeout(timeout).to_string()
                }
            };
            // Refused (an ACL without CLIENT SETNAME or INFO) or failed: both are advice, so
            // they are skipped.
            if let Some(logger) = logger {
                logger.log(Notice::new(
                    Level::Debug,
                    SKIPPED,
                    &[("error", Json::from(error))],
                ));
            }
        });
    }

    fn get(&self) -> Result<(u64, ConnectionManager)> {
        let mut slot = self.slot();
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed(self.subject));
        }
        if let Some(current) = slot.as_ref() {
            return Ok(current.clone());
        }
        let connection =
            ConnectionManager::new_lazy_with_config(self.client.clone(), self.config.clone())
                .map_err(|err| Error::from_redis(err, self.timeout))?;
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

const SKIPPED: &str = "mastra-lease: could not name the connection (CLIENT SETNAME) or read the \
                       Redis eviction policy (INFO memory); skipped";

/// What a fresh connection gets once: its name, and a check of the server's eviction
/// policy.
struct Setup {
    logger: OnceLock<Arc<dyn Logger>>,
    /// Set while the connection in use has not been set up: at first, and whenever an
    /// error means the manager replaces the connection.
    fresh: AtomicBool,
    /// Policies already warned about: one warning per policy value.
    warned: Mutex<Vec<String>>,
}

impl Default for Setup {
    fn default() -> Self {
        Self {
            logger: OnceLock::new(),
            fresh: AtomicBool::new(true),
            warned: Mutex::new(Vec::new()),
        }
    }
}

impl Setup {
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
        logger.log(Notice::new(Level::Warn, message, &fields));
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
        let check = Setup::default();
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
