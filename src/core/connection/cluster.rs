//! redis-rs' cluster connection as the connections of one deployment share it, opened when
//! first needed ([`SharedCluster`]), and the naming every connection gets.

use std::sync::{Arc, Mutex};

use redis::aio::ConnectionLike;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{RedisResult, Value};

use crate::core::lock;

/// redis-rs' cluster connection, opened when first needed and shared with the targets beside
/// this one ([`Target::beside`](super::link::Target::beside)): one routing task and one connection per master for them
/// all, let go with the shared link that gives it up. On the embedder's event loop only what
/// the masters' links there cannot take needs it ([`Routes`](super::routes::Routes)): a redirection, a slot no master
/// serves.
#[derive(Clone)]
pub struct SharedCluster {
    pub(super) client: Arc<ClusterClient>,
    /// The connection name, given to the connections it opens.
    name: Option<String>,
    connection: Arc<Mutex<Option<ClusterConnection>>>,
}

impl SharedCluster {
    pub(super) fn new(client: ClusterClient, name: Option<String>) -> Self {
        Self {
            client: Arc::new(client),
            name,
            connection: Arc::default(),
        }
    }

    /// The connection, opened now if it is not. Two opened at once (by connections beside
    /// each other) settle on the one stored first, and the other goes.
    pub(super) async fn get(&self) -> RedisResult<ClusterConnection> {
        if let Some(open) = self.opened() {
            return Ok(open);
        }
        let mut opened = self.client.get_async_connection().await?;
        set_name(&mut opened, self.name.as_deref()).await;
        Ok(lock(&self.connection).get_or_insert(opened).clone())
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
        }
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
