//! Leases in Redis: one Lua script per operation, one round trip per call.
//!
//! A lease is a plain string `<keyPrefix>:lease:<key>` holding the owner, with a PX expiry,
//! the layout Mastra's own Redis backend uses, so a fleet can move over process by process.
//! Redis decides expiry. Scripts are sent by SHA (EVALSHA) and loaded again transparently
//! when Redis answers NOSCRIPT (after a restart or SCRIPT FLUSH).

use std::future::Future;
use std::sync::{Arc, LazyLock, Mutex, Once};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Client, FromRedisValue, Script};

use super::{Grant, LeaseStore, Limits};
use crate::core::error::{InputErrorKind, LeaseError, Result};

static ACQUIRE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("acquire.lua")));
static RENEW: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("renew.lua")));
static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("release.lua")));
static TRANSFER: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("transfer.lua")));

/// How to reach Redis and where the leases live there.
#[derive(Debug, Clone)]
pub struct RedisOptions {
    /// `redis://[user:pass@]host[:port][/db]`, `rediss://...` for TLS, or
    /// `redis+unix:///path/to.sock` (also `unix:///path`). Default `redis://127.0.0.1:6379`.
    pub url: String,
    /// Leases live at `<key_prefix>:lease:<key>`. Default `mastra:topic`, as Mastra's backend.
    pub key_prefix: String,
    /// Bound on one attempt to open the connection. Default 2 s.
    pub connect_timeout: Duration,
    /// Bound on a whole call, connecting included: every call settles within it. Default 2 s.
    pub command_timeout: Duration,
    /// Input limits.
    pub limits: Limits,
}

impl Default for RedisOptions {
    fn default() -> Self {
        Self {
            url: "redis://127.0.0.1:6379".to_owned(),
            key_prefix: "mastra:topic".to_owned(),
            connect_timeout: Duration::from_secs(2),
            command_timeout: Duration::from_secs(2),
            limits: Limits::default(),
        }
    }
}

/// A lease store in Redis. Cheap to share behind an `Arc`; all calls multiplex over one
/// connection, so calls made at the same time are pipelined.
pub struct RedisStore {
    client: Client,
    config: ConnectionManagerConfig,
    /// Made lazily: nothing connects until the first call, and the first calls share one
    /// connection attempt. Replaced only when Redis refused the connection itself (for
    /// example a wrong password), since the manager does not retry those by itself.
    connection: Mutex<Option<ConnectionManager>>,
    key_prefix: Vec<u8>,
    command_timeout: Duration,
    limits: Limits,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The client holds the URL, which may carry a password: never print it.
        f.debug_struct("RedisStore")
            .field("key_prefix", &String::from_utf8_lossy(&self.key_prefix))
            .field("command_timeout", &self.command_timeout)
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// Checks the options; does not connect. Must run inside a Tokio runtime.
    pub fn new(options: RedisOptions) -> Result<Self> {
        install_tls_provider();
        let client = Client::open(options.url.as_str()).map_err(|err| {
            // The URL may carry a password, so neither it nor the parser's echo of it is
            // repeated; the parser's complaint without the URL is enough to fix it.
            LeaseError::option(
                InputErrorKind::Range,
                format!(
                    "url is not a Redis URL (redis://, rediss://, redis+unix://): {}",
                    redact(&err.to_string(), &options.url)
                ),
            )
        })?;
        if options.key_prefix.is_empty() {
            return Err(LeaseError::option(
                InputErrorKind::Range,
                "keyPrefix must not be empty",
            ));
        }
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(options.connect_timeout))
            .set_response_timeout(Some(options.command_timeout))
            .set_number_of_retries(1)
            .set_min_delay(Duration::from_millis(50))
            .set_max_delay(Duration::from_millis(500));
        let mut key_prefix = options.key_prefix.into_bytes();
        key_prefix.extend_from_slice(b":lease:");
        Ok(Self {
            client,
            config,
            connection: Mutex::new(None),
            key_prefix,
            command_timeout: options.command_timeout,
            limits: options.limits,
        })
    }

    /// The Redis key a lease key lives at: `<keyPrefix>:lease:<key>`.
    pub fn redis_key(&self, key: &str) -> Vec<u8> {
        let mut full = Vec::with_capacity(self.key_prefix.len() + key.len());
        full.extend_from_slice(&self.key_prefix);
        full.extend_from_slice(key.as_bytes());
        full
    }

    /// Claims the key for `owner`, or refreshes it when `owner` already holds it.
    pub async fn acquire(&self, key: &str, owner: &str, ttl_ms: u64) -> Result<Grant> {
        self.limits.check_key(key)?;
        self.limits.check_owner(owner, "owner")?;
        self.limits.check_ttl(ttl_ms)?;
        let mut call = ACQUIRE.prepare_invoke();
        call.key(self.redis_key(key)).arg(owner).arg(ttl_ms);
        let (acquired, holder): (i64, Vec<u8>) = self.run(&call).await?;
        Ok(Grant {
            acquired: acquired == 1,
            owner: Some(text(holder)),
        })
    }

    /// The holder of a live lease. A plain GET: a single read is already atomic, and Redis
    /// never returns a key whose PX expiry has passed.
    pub async fn owner(&self, key: &str) -> Result<Option<String>> {
        self.limits.check_key(key)?;
        let mut connection = self.connection()?;
        let mut get = redis::cmd("GET");
        get.arg(self.redis_key(key));
        let holder: Option<Vec<u8>> = self.bounded(get.query_async(&mut connection)).await?;
        Ok(holder.map(text))
    }

    /// Deletes the lease if `owner` holds it; answers whether it did.
    pub async fn release(&self, key: &str, owner: &str) -> Result<bool> {
        self.limits.check_key(key)?;
        self.limits.check_owner(owner, "owner")?;
        let mut call = RELEASE.prepare_invoke();
        call.key(self.redis_key(key)).arg(owner);
        let deleted: i64 = self.run(&call).await?;
        Ok(deleted == 1)
    }

    /// Extends the lease if `owner` still holds it.
    pub async fn renew(&self, key: &str, owner: &str, ttl_ms: u64) -> Result<bool> {
        self.limits.check_key(key)?;
        self.limits.check_owner(owner, "owner")?;
        self.limits.check_ttl(ttl_ms)?;
        let mut call = RENEW.prepare_invoke();
        call.key(self.redis_key(key)).arg(owner).arg(ttl_ms);
        let renewed: i64 = self.run(&call).await?;
        Ok(renewed == 1)
    }

    /// Hands the lease from `from` to `to` with a fresh TTL, in place.
    pub async fn transfer(&self, key: &str, from: &str, to: &str, ttl_ms: u64) -> Result<bool> {
        self.limits.check_key(key)?;
        self.limits.check_owner(from, "fromOwner")?;
        self.limits.check_owner(to, "toOwner")?;
        self.limits.check_ttl(ttl_ms)?;
        let mut call = TRANSFER.prepare_invoke();
        call.key(self.redis_key(key)).arg(from).arg(to).arg(ttl_ms);
        let moved: i64 = self.run(&call).await?;
        Ok(moved == 1)
    }

    /// Runs one script by SHA (loading it on NOSCRIPT) within the command timeout.
    async fn run<T: FromRedisValue>(&self, call: &redis::ScriptInvocation<'_>) -> Result<T> {
        let mut connection = self.connection()?;
        self.bounded(call.invoke_async(&mut connection)).await
    }

    /// Bounds a Redis call by the command timeout and sorts its error.
    async fn bounded<T>(&self, call: impl Future<Output = redis::RedisResult<T>>) -> Result<T> {
        match tokio::time::timeout(self.command_timeout, call).await {
            Err(_) => Err(LeaseError::Timeout(self.command_timeout)),
            Ok(Ok(value)) => Ok(value),
            Ok(Err(err)) => {
                let err = LeaseError::from_redis(err, self.command_timeout);
                if matches!(err, LeaseError::Auth(_)) {
                    // The manager keeps a connection that failed its handshake; drop it so
                    // the next call tries again (the password or ACL may have been fixed).
                    self.slot().take();
                }
                Err(err)
            }
        }
    }

    fn connection(&self) -> Result<ConnectionManager> {
        let mut slot = self.slot();
        if let Some(connection) = slot.as_ref() {
            return Ok(connection.clone());
        }
        let connection =
            ConnectionManager::new_lazy_with_config(self.client.clone(), self.config.clone())
                .map_err(|err| LeaseError::from_redis(err, self.command_timeout))?;
        *slot = Some(connection.clone());
        Ok(connection)
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Option<ConnectionManager>> {
        // Only a clone or a replacement happens under this lock; poisoning cannot leave it
        // half-written.
        self.connection
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl LeaseStore for RedisStore {
    fn acquire(&self, key: &str, owner: &str, ttl_ms: u64) -> impl Future<Output = Result<Grant>> {
        RedisStore::acquire(self, key, owner, ttl_ms)
    }

    fn owner(&self, key: &str) -> impl Future<Output = Result<Option<String>>> {
        RedisStore::owner(self, key)
    }

    fn release(&self, key: &str, owner: &str) -> impl Future<Output = Result<bool>> {
        RedisStore::release(self, key, owner)
    }

    fn renew(&self, key: &str, owner: &str, ttl_ms: u64) -> impl Future<Output = Result<bool>> {
        RedisStore::renew(self, key, owner, ttl_ms)
    }

    fn transfer(
        &self,
        key: &str,
        from: &str,
        to: &str,
        ttl_ms: u64,
    ) -> impl Future<Output = Result<bool>> {
        RedisStore::transfer(self, key, from, to, ttl_ms)
    }
}

/// Owners we write are valid UTF-8; a foreign writer's bytes are shown, not rejected.
fn text(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes).unwrap_or_else(|err| String::from_utf8_lossy(err.as_bytes()).into())
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

/// Shared handle used by the glue.
pub type SharedRedisStore = Arc<RedisStore>;
