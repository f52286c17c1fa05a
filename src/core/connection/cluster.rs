//! redis-rs' cluster connection as the connections of one deployment share it, opened when
//! first needed ([`SharedCluster`]), and the naming every connection gets.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::{BoxFuture, FutureExt, Shared};
use redis::aio::ConnectionLike;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{RedisResult, Value};

use crate::core::lock;

/// redis-rs' cluster connection, opened when first needed and shared with the targets beside
/// this one ([`Target::beside`](super::link::Target::beside)): one routing task and one
/// connection per master for them all, replaced when the shared link that uses it is given up
/// ([`SharedCluster::renew`]). On the embedder's event loop only what the masters' links there
/// cannot take needs it ([`Routes`](super::routes::Routes)): a redirection, a slot no master
/// serves.
///
/// Opening one waits for every seed, one that does not answer too (frozen, or a host that
/// drops what is sent to it), until the connect timeout: longer than a call may wait, perhaps.
/// So it is opened apart from the calls that need it, on the runtime: a call that runs out of
/// time leaves it opening, and the next one waits for the same opening rather than start
/// another, which would run out of time in turn.
#[derive(Clone)]
pub struct SharedCluster {
    pub(super) client: Arc<ClusterClient>,
    /// The connection name, given to the connections it opens.
    name: Option<String>,
    kept: Arc<Mutex<Kept>>,
    /// How long an opening may take before it is given up.
    open_within: Duration,
}

/// The connection a [`SharedCluster`] keeps, and the one it is opening.
#[derive(Default)]
struct Kept {
    /// The connection calls take.
    open: Option<ClusterConnection>,
    /// A connection being opened, which takes `open`'s place once it is.
    opening: Option<Opening>,
    /// Closed: nothing opened is kept any more.
    closed: bool,
}

type Opening = Shared<BoxFuture<'static, RedisResult<ClusterConnection>>>;

impl SharedCluster {
    pub(super) fn new(client: ClusterClient, name: Option<String>, open_within: Duration) -> Self {
        Self {
            client: Arc::new(client),
            name,
            kept: Arc::default(),
            open_within,
        }
    }

    /// The connection; the one being opened when there is none, opened now if none is.
    pub(super) async fn get(&self) -> RedisResult<ClusterConnection> {
        let opening = {
            let mut kept = lock(&self.kept);
            match (&kept.open, &kept.opening, kept.closed) {
                (Some(open), ..) => return Ok(open.clone()),
                (None, Some(opening), _) => Some(opening.clone()),
                (None, None, false) => Some(self.start_opening(&mut kept)),
                (None, None, true) => None,
            }
        };
        match opening {
            Some(opening) => opening.await,
            // A call that was in flight when it closed: one of its own, kept by none.
            None => self.open().await,
        }
    }

    /// `connection`, opened by this client for a caller of its own: never shared.
    pub(super) fn holding(&self, connection: ClusterConnection) -> Self {
        Self {
            client: self.client.clone(),
            name: self.name.clone(),
            kept: Arc::new(Mutex::new(Kept {
                open: Some(connection),
                ..Kept::default()
            })),
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
        let mut kept = lock(&self.kept);
        if kept.open.is_none() || kept.opening.is_some() {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(_) => drop(self.start_opening(&mut kept)),
            // Nothing would run it in the background: the next call opens one.
            Err(_) => kept.open = None,
        }
    }

    /// Starts opening a connection, kept once open unless it was closed meanwhile: on the
    /// runtime when there is one, else as its callers wait for it.
    fn start_opening(&self, kept: &mut Kept) -> Opening {
        let this = self.clone();
        let opening = async move {
            let opened = match tokio::time::timeout(this.open_within, this.open()).await {
                Ok(opened) => opened,
                Err(_) => Err(redis::RedisError::from((
                    redis::ErrorKind::Io,
                    "the cluster connection did not open in time",
                ))),
            };
            let mut kept = lock(&this.kept);
            kept.opening = None;
            if let (Ok(fresh), false) = (&opened, kept.closed) {
                kept.open = Some(fresh.clone());
            }
            opened
        };
        let opening: Opening = match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                let task = runtime.spawn(opening);
                let joined = async move {
                    task.await.unwrap_or_else(|_| {
                        Err(redis::RedisError::from((
                            redis::ErrorKind::Io,
                            "the cluster connection's opening was cancelled",
                        )))
                    })
                };
                joined.boxed().shared()
            }
            Err(_) => opening.boxed().shared(),
        };
        kept.opening = Some(opening.clone());
        opening
    }

    /// A fresh connection, named.
    async fn open(&self) -> RedisResult<ClusterConnection> {
        let mut opened = self.client.get_async_connection().await?;
        set_name(&mut opened, self.name.as_deref()).await;
        Ok(opened)
    }

    /// Lets go of the connection, and of one being opened: nothing is kept from now on.
    pub(super) fn close(&self) {
        let mut kept = lock(&self.kept);
        kept.closed = true;
        kept.open = None;
        kept.opening = None;
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
