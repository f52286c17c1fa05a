//! The master behind Redis Sentinel. The sentinels are asked for it on the first call and
//! again whenever the link to it is given up: when it broke, when the node answered READONLY
//! (a demoted master), and when a sentinel announced a new master (`+switch-master`, heard
//! by a watcher subscribed to every sentinel). The announcement comes the moment the
//! failover ends, long before the old master is demoted (a manual `SENTINEL FAILOVER` leaves
//! it taking writes for seconds): the watcher shortens the time calls go to the old one.
//! One watcher serves every connection of a provider; each follows its announcements itself.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use redis::aio::MultiplexedConnection;
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{AsyncConnectionConfig, Client, ConnectionAddr, RedisResult};
use tokio::task::AbortHandle;

use super::address::{self, redact_all, seeds, Protocol};
use super::ConnectionOptions;
use crate::core::error::{Error, InputErrorKind, Result};
use crate::core::lock;

/// Wait before listening to a sentinel again, after it went away.
const AGAIN: Duration = Duration::from_millis(200);

/// The sentinels, asked for the master and watched for a new one.
pub(super) struct Sentinels {
    client: tokio::sync::Mutex<SentinelClient>,
    /// Whether they, and the master, are reached over TLS (`rediss://`).
    tls: bool,
    watched: Arc<Watched>,
    /// The watcher, once started (on the first ask for the master, inside the runtime).
    watcher: Mutex<Option<AbortHandle>>,
}

/// What the watcher needs, and what it tells.
struct Watched {
    /// Plain clients of the sentinels (their own credentials and TLS).
    sentinels: Vec<Client>,
    master_name: String,
    connect_timeout: Duration,
    /// Counts the announcements of a new master for `master_name`.
    announced: AtomicU64,
}

impl Sentinels {
    /// A sentinel client: the sentinels by URL (their own credentials in the URLs,
    /// `rediss://` for TLS to them and to the master), the master's name, and the master's
    /// credentials and database from the options. Connects nowhere.
    pub(super) fn new(
        options: &ConnectionOptions,
        nodes: &[String],
        master_name: &str,
        protocol: Protocol,
    ) -> Result<Self> {
        let range = |message: &str| Error::option(InputErrorKind::Range, message);
        if nodes.is_empty() {
            return Err(range("sentinel.nodes must name at least one sentinel"));
        }
        if master_name.is_empty() {
            return Err(range("sentinel.masterName must not be empty"));
        }
        let no_credentials = ConnectionOptions {
            username: None,
            password: None,
            database: None,
            ..options.clone()
        };
        let infos = seeds(nodes, &no_credentials, "sentinel.nodes")?;
        let first = &infos[0];
        let tls = matches!(first.addr(), ConnectionAddr::TcpTls { .. });
        let mut builder = SentinelClientBuilder::new(
            infos.iter().map(|info| info.addr().clone()),
            master_name,
            SentinelServerType::Master,
        )
        .map_err(|err| range(&format!("sentinel: {err}")))?
        .set_client_to_redis_tcp_settings(options.tcp())
        .set_client_to_sentinel_tcp_settings(options.tcp());
        if let Some(username) = first.redis_settings().username() {
            builder = builder.set_client_to_sentinel_username(username);
        }
        if let Some(password) = first.redis_settings().password() {
            builder = builder.set_client_to_sentinel_password(password);
        }
        if let Some(username) = &options.username {
            builder = builder.set_client_to_redis_username(username);
        }
        if let Some(password) = &options.password {
            builder = builder.set_client_to_redis_password(password);
        }
        if let Some(database) = options.database {
            builder = builder.set_client_to_redis_db(database);
        }
        if protocol == Protocol::Resp3 {
            builder = builder.set_client_to_redis_protocol(redis::ProtocolVersion::RESP3);
        }
        if tls {
            builder = builder
                .set_client_to_redis_tls_mode(redis::TlsMode::Secure)
                .set_client_to_sentinel_tls_mode(redis::TlsMode::Secure);
            if !options.tls.is_empty() {
                builder = builder
                    .set_client_to_redis_certificates(options.tls.certificates())
                    .set_client_to_sentinel_certificates(options.tls.certificates());
            }
        }
        let client = builder.build().map_err(|err| {
            range(&format!(
                "sentinel: {}",
                redact_all(&err.to_string(), nodes)
            ))
        })?;
        let watched = infos
            .into_iter()
            .map(|info| address::client(info, options))
            .collect::<Result<Vec<_>>>()?;
        Ok(Sentinels {
            client: tokio::sync::Mutex::new(client),
            tls,
            watched: Arc::new(Watched {
                sentinels: watched,
                master_name: master_name.to_owned(),
                connect_timeout: options.connect_timeout,
                announced: AtomicU64::new(0),
            }),
            watcher: Mutex::new(None),
        })
    }

    /// Whether the sentinels and the master are reached over TLS.
    pub(super) fn tls(&self) -> bool {
        self.tls
    }

    /// A client of the master the sentinels name now: its address, credentials, database.
    pub(super) async fn master(&self) -> RedisResult<Client> {
        self.watch();
        self.client.lock().await.async_get_client().await
    }

    /// A connection to the master the sentinels name now.
    pub(super) async fn connect(
        &self,
        config: &AsyncConnectionConfig,
    ) -> RedisResult<MultiplexedConnection> {
        self.master()
            .await?
            .get_multiplexed_async_connection_with_config(config)
            .await
    }

    /// How many times a sentinel announced a new master so far.
    pub(super) fn announced(&self) -> u64 {
        self.watched.announced.load(Ordering::Acquire)
    }

    /// Whether a sentinel announced a new master since `followed` was last brought up to
    /// date, which this does. Asked on every call: a plain read, a write only when there was
    /// an announcement.
    pub(super) fn switched(&self, followed: &AtomicU64) -> bool {
        let announced = self.announced();
        followed.load(Ordering::Relaxed) != announced
            && followed.swap(announced, Ordering::AcqRel) != announced
    }

    /// Stops the watcher.
    pub(super) fn stop(&self) {
        if let Some(watcher) = lock(&self.watcher).take() {
            watcher.abort();
        }
    }

    fn watch(&self) {
        let mut watcher = lock(&self.watcher);
        if watcher.is_none() {
            let watched = self.watched.clone();
            *watcher = Some(tokio::spawn(watch(watched)).abort_handle());
        }
    }
}

impl Drop for Sentinels {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Listens to every sentinel at once (the one that led the failover announces it first; the
/// others learn of it later), each again after it went away, for as long as it is not
/// stopped.
async fn watch(watched: Arc<Watched>) {
    let listeners = watched.sentinels.iter().map(|sentinel| {
        let watched = &watched;
        async move {
            loop {
                // Whatever ended the listening (the sentinel went away, or never answered),
                // it is tried again; a failover is still followed through READONLY meanwhile.
                let _ = listen(sentinel, watched).await;
                tokio::time::sleep(AGAIN).await;
            }
        }
    });
    futures::future::join_all(listeners).await;
}

/// Subscribes to one sentinel's `+switch-master` and marks every announcement for the
/// watched master, until the connection ends.
async fn listen(sentinel: &Client, watched: &Watched) -> RedisResult<()> {
    let connecting = sentinel.get_async_pubsub();
    let Ok(pubsub) = tokio::time::timeout(watched.connect_timeout, connecting).await else {
        return Ok(());
    };
    let mut pubsub = pubsub?;
    pubsub.subscribe("+switch-master").await?;
    let mut messages = pubsub.on_message();
    while let Some(message) = messages.next().await {
        // "<master name> <old ip> <old port> <new ip> <new port>"
        let payload: String = message.get_payload()?;
        if payload.split(' ').next() == Some(watched.master_name.as_str()) {
            watched.announced.fetch_add(1, Ordering::Release);
        }
    }
    Ok(())
}
