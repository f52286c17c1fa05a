//! The multiplexed Redis connection the lease store and the streams transport send their
//! non-blocking commands through: opened lazily (the first calls share one attempt),
//! reconnected by redis-rs' `ConnectionManager`, every call bounded by the command timeout.

use std::future::Future;
use std::sync::{Mutex, MutexGuard, Once};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Client, FromRedisValue, RedisResult, Value};

use crate::core::error::{InputErrorKind, LeaseError, Result};

/// A lazily opened, shared connection to one Redis.
pub struct Connection {
    client: Client,
    config: ConnectionManagerConfig,
    /// Made on first use. Replaced only when Redis refused the connection itself (a wrong
    /// password), which the manager keeps and would answer every later call with.
    slot: Mutex<Option<ConnectionManager>>,
    timeout: Duration,
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
    /// Checks the URL; does not connect.
    pub fn new(url: &str, connect_timeout: Duration, command_timeout: Duration) -> Result<Self> {
        install_tls_provider();
        let client = Client::open(url).map_err(|err| {
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
            timeout: command_timeout,
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

    /// Runs commands on the connection, the whole call (connecting included) bounded by the
    /// command timeout. Must run inside a Tokio runtime.
    pub async fn run<T, F, Fut>(&self, work: F) -> Result<T>
    where
        F: FnOnce(ConnectionManager) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        let connection = self.get()?;
        match tokio::time::timeout(self.timeout, work(connection)).await {
            Ok(outcome) => outcome.map_err(|err| self.sort(err)),
            Err(_) => Err(LeaseError::Timeout(self.timeout)),
        }
    }

    /// Sorts a redis-rs error into the variant a caller can act on, and forgets a connection
    /// Redis refused to authenticate so the next call tries again.
    pub fn sort(&self, err: redis::RedisError) -> LeaseError {
        let err = LeaseError::from_redis(err, self.timeout);
        if matches!(err, LeaseError::Auth(_)) {
            self.slot().take();
        }
        err
    }

    fn get(&self) -> Result<ConnectionManager> {
        let mut slot = self.slot();
        if let Some(connection) = slot.as_ref() {
            return Ok(connection.clone());
        }
        let connection =
            ConnectionManager::new_lazy_with_config(self.client.clone(), self.config.clone())
                .map_err(|err| LeaseError::from_redis(err, self.timeout))?;
        *slot = Some(connection.clone());
        Ok(connection)
    }

    fn slot(&self) -> MutexGuard<'_, Option<ConnectionManager>> {
        // Only a clone or a replacement happens under this lock; poisoning cannot leave it
        // half-written.
        self.slot
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
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
