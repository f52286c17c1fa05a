//! redis-rs' cluster connection as the connections of one deployment share it, opened when
//! first needed ([`SharedCluster`]), and the naming every connection gets.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{RedisResult, Value};

use crate::core::lock;

/// redis-rs' cluster connection, opened when first needed and shared with the targets beside
/// this one ([`Target::beside`](super::link::Target::beside)): one routing task and one connection per master for them
/// all, replaced when the shared link that uses it is given up ([`SharedCluster::renew`]). On
/// the embedder's event loop only what the masters' links there cannot take needs it
/// ([`Routes`](super::routes::Routes)): a redirection, a slot no master serves.
#[derive(Clone)]
pub struct SharedCluster {
    pub(super) client: Arc<ClusterClient>,
    /// The connection name, given to the connections it opens.
    name: Option<String>,
    connection: Arc<Mutex<Option<ClusterConnection>>>,
    /// A fresh connection is being opened to replace the one in `connection`.
    renewing: Arc<AtomicBool>,
    /// How long a replacement may take to open before it is given up.
    open_within: Duration,
}

impl SharedCluster {
    pub(super) fn new(client: ClusterClient, name: Option<String>, open_within: Duration) -> Self {
        Self {
            client: Arc::new(client),
            name,
            connection: Arc::default(),
            renewing: Arc::default(),
            open_within,
        }
    }

    /// The connection, opened now if it is not. Two opened at once (by connections beside
    /// each other) settle on the one stored first, and the other goes.
    pub(super) async fn get(&self) -> RedisResult<ClusterConnection> {
        if let Some(open) = self.opened() {
            return Ok(open);
        }
        let opened = self.open().await?;
        Ok(lock(&self.connection).get_or_insert(opened).clone())
    }

    /// A fresh connection, named.
    async fn open(&self) -> RedisResult<ClusterConnection> {
        let mut opened = self.client.get_async_connection().await?;
        set_name(&mut opened, self.name.as_deref()).await;
        Ok(opened)
    }

    /// The connection, if it is open.
    pub(super) fn opened(&self) -> Option<ClusterConnection> {
        lock(&self.connection).clone()
    }

    /// `connection`, opened by this client for a caller of its own: never shared.
    pub(super) fn holding(&self, connection: ClusterConnection) -> Self {
        Self {
            client: self.client.clone(),
            name: self.name.clone(),
            connection: Arc::new(Mutex::new(Some(connection))),
            renewing: Arc::default(),
            open_within: self.open_within,
        }
    }

    /// Replaces the open connection with a fresh one, opened in the background while the old
    /// one keeps serving. A call timed out on it: a node's connection may have gone silent,
    /// which redis-rs keeps (a timeout is no I/O error to it). But opening one waits for every
    /// seed, a frozen one too, so the calls of the masters that answer go on over the old
    /// connection meanwhile rather than wait for that. A replacement that fails or takes
    /// longer than `open_within` is dropped, the old one kept; the next timeout tries again.
    pub(super) fn renew(&self) {
        if self.opened().is_none() || self.renewing.swap(true, Ordering::AcqRel) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.renewing.store(false, Ordering::Release);
            return self.let_go();
        };
        let this = self.clone();
        runtime.spawn(async move {
            if let Ok(Ok(fresh)) = tokio::time::timeout(this.open_within, this.open()).await {
                let mut connection = lock(&this.connection);
                // Let go of meanwhile (closed): the fresh one goes too.
                if connection.is_some() {
                    *connection = Some(fresh);
                }
            }
            this.renewing.store(false, Ordering::Release);
        });
    }

    pub(super) fn let_go(&self) {
        lock(&self.connection).take();
    }
}

/// Names `connection` (`CLIENT SETNAME`), as every connection is named: advice, so one that
/// is refused (an ACL) serves unnamed.
pub(super) async fn set_name<C: ConnectionLike + Send>(connection: &mut C, name: Option<&str>) {
    if let Some(name) = name {
        let _ = redis::cmd("CLIENT")
            .arg("SETNAME")
            .arg(name)
            .query_async::<Value>(connection)
            .await;
    }
}
