//! Which Redis a [`Connection`](super::Connection) reaches, and the connections it opens
//! there, behind one interface. [`Target`] knows how to open a connection to the deployment
//! the options name; [`Link`] is one such connection, and callers send every command through
//! it (`query_async`, `invoke_async`, [`Link::send_packed_commands`]) without asking which
//! kind it is. A kind of deployment is a variant of each:
//!
//! - one server, by URL: the shared link is redis-rs' `ConnectionManager`, which reconnects
//!   by itself;
//! - a Redis Cluster, by seed nodes: the shared link is redis-rs' cluster connection, which
//!   routes each command to the node of its key, follows MOVED and ASK, and refreshes the
//!   slot map (on an event loop of the embedder's, a request goes straight to its slot's
//!   master there, [`Routes`], which reads the slot map itself, and the cluster connection is
//!   opened only for what that cannot route); a blocking read gets a plain connection to the
//!   master of its key's slot;
//! - a master behind Sentinel ([`Sentinels`]): the sentinels name the master (redis-rs
//!   checks its ROLE), and a link to it answers READONLY (a demoted master) as an error, so
//!   the connection gives it up and asks the sentinels again; so it does when a sentinel
//!   announces a new master. The connections of one provider share the sentinels.
//!
//! With an event loop of the embedder's ([`OnLoop`]), the shared link to one server, to the
//! master the sentinels name, or to each master of a cluster, is a multiplexed connection
//! whose socket that loop polls.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use redis::aio::{
    ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection,
};
use redis::cluster::{ClusterClientBuilder, ClusterConfig};
use redis::cluster_routing::{
    MultipleNodeRoutingInfo, Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr,
};
use redis::{
    AsyncConnectionConfig, Client, Cmd, ConnectionAddr, ConnectionInfo, Pipeline, ProtocolVersion,
    PushInfo, RedisFuture, RedisResult, ServerErrorKind, Value,
};
use tokio::sync::mpsc::UnboundedSender;

use super::address::{
    check_tls, client, redact_all, seeds, with_credentials, NodeClients, Protocol,
};
use super::cluster::SharedCluster;
use super::reactor::{self, Reactor};
use super::routes::Routes;
use super::sentinel::Sentinels;
use super::slots::{master_in, no_master, slot_map, Node, SlotMap};
use super::{tls, ConnectionOptions, Deployment};
use crate::core::error::{Error, InputErrorKind, Result};

/// The deployment to reach.
pub(super) enum Target {
    /// One server, by URL; its shared link on the embedder's event loop when there is one
    /// (a `redis://` or `rediss://` address: a unix socket stays on the runtime).
    Single(Client, Option<OnLoop>),
    /// A Redis Cluster. `nodes` opens plain connections to single nodes (blocking reads, and
    /// the links to the masters on the embedder's event loop when there is one).
    Cluster {
        cluster: SharedCluster,
        nodes: NodeClients,
        /// The seed nodes, where the links on the loop first read the slot map.
        seeds: Vec<Node>,
        on_loop: Option<OnLoop>,
        /// The connection name, given to the links to the masters on the loop.
        name: Option<String>,
        /// The masters' links on the loop, made by the first shared link and kept by those
        /// after it: a call that ran out of time gives up only the links that held it up.
        routes: OnceLock<Arc<Routes>>,
    },
    /// The master the sentinels name; its shared link on the embedder's event loop when
    /// there is one.
    Sentinel {
        /// Shared with the connections beside this one ([`Target::beside`]).
        sentinels: Arc<Sentinels>,
        /// The sentinels' announcements of a new master this connection has followed.
        followed: AtomicU64,
        on_loop: Option<OnLoop>,
    },
}

/// The shared link on the embedder's event loop: the loop, and for `rediss://` how TLS is
/// made there.
#[derive(Clone)]
pub(super) struct OnLoop {
    reactor: Arc<dyn Reactor>,
    tls: Option<Arc<tls::Handshake>>,
}

impl OnLoop {
    /// On `reactor`, for links to TCP addresses, `rediss://` ones when `tls`.
    fn new(reactor: Arc<dyn Reactor>, tls: bool, options: &ConnectionOptions) -> Self {
        let tls = tls.then(|| Arc::new(tls::Handshake::new(&options.tls)));
        Self { reactor, tls }
    }

    /// On `reactor`, for the shared link to `client`'s address: `None` for one a socket of
    /// the loop's cannot reach (a unix socket).
    fn to_client(
        reactor: Arc<dyn Reactor>,
        client: &Client,
        options: &ConnectionOptions,
    ) -> Option<Self> {
        match client.get_connection_info().addr() {
            ConnectionAddr::Tcp(..) => Some(Self::new(reactor, false, options)),
            ConnectionAddr::TcpTls { .. } => Some(Self::new(reactor, true, options)),
            _ => None,
        }
    }

    /// A link to the server `info` names (address, credentials, database), its socket and
    /// driver on the loop.
    pub(super) async fn open(
        &self,
        info: &ConnectionInfo,
        config: &AsyncConnectionConfig,
        connect_timeout: Duration,
    ) -> RedisResult<MultiplexedConnection> {
        reactor::open(
            self.reactor.clone(),
            info.addr().clone(),
            self.tls.clone(),
            info.redis_settings().clone(),
            info.tcp_settings().clone(),
            config.clone(),
            connect_timeout,
        )
        .await
    }
}

impl Target {
    /// Checks the URLs, the credentials and the TLS material; connects nowhere. With
    /// `Protocol::Resp3` every connection speaks RESP3 (what a subscription on a multiplexed
    /// connection needs); otherwise the URL's protocol (RESP2 unless it says).
    pub(super) fn new(options: &ConnectionOptions, protocol: Protocol) -> Result<Self> {
        // Before any client: a `rediss://` URL needs it even without TLS options.
        tls::install_provider();
        match &options.deployment {
            Deployment::Single => {
                let client = single(options, protocol)?;
                let on_loop = options
                    .reactor
                    .clone()
                    .and_then(|reactor| OnLoop::to_client(reactor, &client, options));
                Ok(Self::Single(client, on_loop))
            }
            Deployment::Cluster { nodes } => cluster(options, nodes, protocol),
            Deployment::Sentinel { nodes, master_name } => {
                let sentinels = Sentinels::new(options, nodes, master_name, protocol)?;
                Ok(Self::behind(Arc::new(sentinels), options))
            }
        }
    }

    /// The target of another connection to the same deployment, on `options`' reactor
    /// (`options` are the first's otherwise). Behind Sentinel it shares the sentinels, their
    /// one watcher among them, and follows their announcements itself; on a Cluster, redis-rs'
    /// cluster connection.
    pub(super) fn beside(&self, options: &ConnectionOptions) -> Result<Self> {
        match self {
            Self::Sentinel { sentinels, .. } => Ok(Self::behind(sentinels.clone(), options)),
            Self::Cluster { cluster, .. } => {
                let mut beside = Self::new(options, Protocol::AsTheUrlSays)?;
                if let Self::Cluster {
                    cluster: shared, ..
                } = &mut beside
                {
                    *shared = cluster.clone();
                }
                Ok(beside)
            }
            Self::Single(..) => Self::new(options, Protocol::AsTheUrlSays),
        }
    }

    fn behind(sentinels: Arc<Sentinels>, options: &ConnectionOptions) -> Self {
        let on_loop = options
            .reactor
            .clone()
            .map(|reactor| OnLoop::new(reactor, sentinels.tls(), options));
        Self::Sentinel {
            followed: AtomicU64::new(sentinels.announced()),
            sentinels,
            on_loop,
        }
    }

    /// Whether a key's slot decides where a command goes (a pipeline must then hold one
    /// slot's keys only).
    pub(super) fn is_cluster(&self) -> bool {
        matches!(self, Self::Cluster { .. })
    }

    /// Whether a link is given up when its node stops being the master (READONLY) or goes
    /// away: behind Sentinel, where the next link finds the new master.
    pub(super) fn follows_failover(&self) -> bool {
        matches!(self, Self::Sentinel { .. })
    }

    /// Whether a link that broke is given up rather than reconnected by redis-rs: one on the
    /// embedder's event loop (behind Sentinel, [`Target::follows_failover`] says more).
    pub(super) fn forgets_broken(&self) -> bool {
        self.reactor().is_some()
    }

    /// The embedder's event loop the shared link runs on, if it does.
    pub(super) fn reactor(&self) -> Option<&Arc<dyn Reactor>> {
        match self {
            Self::Single(_, on_loop)
            | Self::Sentinel { on_loop, .. }
            | Self::Cluster { on_loop, .. } => on_loop.as_ref().map(|on| &on.reactor),
        }
    }

    /// Whether a sentinel announced a new master since the last ask (`+switch-master`):
    /// the link to the old one is then given up before it is used again.
    pub(super) fn switched(&self) -> bool {
        match self {
            Self::Sentinel {
                sentinels,
                followed,
                ..
            } => sentinels.switched(followed),
            Self::Single(..) | Self::Cluster { .. } => false,
        }
    }

    /// Stops what runs in the background for the deployment (the sentinels' watcher, which
    /// the connections beside share: a provider closes them together), and lets go of a
    /// cluster connection shared with them.
    pub(super) fn close(&self) {
        match self {
            Self::Sentinel { sentinels, .. } => sentinels.stop(),
            Self::Cluster { cluster, .. } => cluster.close(),
            Self::Single(..) => {}
        }
    }

    /// For each of `slots`, which master serves it (an index among the masters), by the map
    /// the masters' links on the embedder's event loop last read; `None` where there is none
    /// (no map read yet, not on a loop, not a cluster) or a slot has no master.
    pub(super) fn masters_of(&self, slots: &[u16]) -> Option<Vec<usize>> {
        match self {
            Self::Cluster { routes, .. } => routes.get()?.masters_of(slots),
            Self::Single(..) | Self::Sentinel { .. } => None,
        }
    }

    /// A shared link was given up (it timed out, or its credentials were refused): on a
    /// cluster, what it may have left silent is replaced: the cluster connection it shared,
    /// opened afresh in the background while it serves on ([`SharedCluster::renew`]), and the
    /// masters' links on which a request went unanswered. The connections beside keep theirs
    /// until they give them up themselves.
    pub(super) fn replace_stalled(&self) {
        if let Self::Cluster {
            cluster, routes, ..
        } = self
        {
            cluster.renew();
            if let Some(routes) = routes.get() {
                routes.replace_stalled();
            }
        }
    }

    /// The shared connection: for one server, opened on its first command and reopened by
    /// redis-rs after an I/O error, or, on the embedder's event loop, opened now and given up
    /// when it breaks; for a cluster, connected to the seeds now, or, on the embedder's event
    /// loop, its masters' links there opened as calls need them (the slot map read over them)
    /// and the cluster connection only when one of them needs it; behind Sentinel, to the
    /// master the sentinels name now (on the embedder's event loop when there is one).
    pub(super) async fn shared(
        &self,
        manager: &ConnectionManagerConfig,
        direct: &AsyncConnectionConfig,
        connect_timeout: Duration,
    ) -> RedisResult<Link> {
        match self {
            Self::Single(client, Some(on)) => on
                .open(client.get_connection_info(), direct, connect_timeout)
                .await
                .map(Link::Direct),
            Self::Single(client, None) => {
                ConnectionManager::new_lazy_with_config(client.clone(), manager.clone())
                    .map(Link::Managed)
            }
            Self::Cluster {
                cluster,
                nodes,
                seeds,
                on_loop,
                name,
                routes,
            } => {
                let Some(on) = on_loop else {
                    cluster.get().await?;
                    return Ok(Link::Cluster(cluster.clone(), None));
                };
                let routes = routes.get_or_init(|| {
                    Arc::new(Routes::new(
                        on.clone(),
                        nodes.clone(),
                        seeds.clone(),
                        direct.clone(),
                        connect_timeout,
                        name.clone(),
                    ))
                });
                Ok(Link::Cluster(cluster.clone(), Some(routes.clone())))
            }
            Self::Sentinel {
                sentinels,
                on_loop: Some(on),
                ..
            } => {
                let master = sentinels.master().await?;
                on.open(master.get_connection_info(), direct, connect_timeout)
                    .await
                    .map(Link::Master)
            }
            Self::Sentinel { sentinels, .. } => sentinels.connect(direct).await.map(Link::Master),
        }
    }

    /// A connection of its own, opened now, for a caller that has it to itself: to the
    /// server, to `node` (a cluster's master, found by the caller), or to the master the
    /// sentinels name now.
    pub(super) async fn exclusive(
        &self,
        config: &AsyncConnectionConfig,
        node: Option<&Node>,
    ) -> RedisResult<Link> {
        match (self, node) {
            (Self::Single(client, _), _) => client
                .get_multiplexed_async_connection_with_config(config)
                .await
                .map(Link::Direct),
            (Self::Cluster { nodes, .. }, Some((host, port))) => nodes
                .client(host, *port)?
                .get_multiplexed_async_connection_with_config(config)
                .await
                .map(Link::Master),
            (Self::Cluster { .. }, None) => Err(redis::RedisError::from((
                redis::ErrorKind::Client,
                "a link of its own on a cluster needs the node",
            ))),
            (Self::Sentinel { sentinels, .. }, _) => {
                sentinels.connect(config).await.map(Link::Master)
            }
        }
    }

    /// A connection of its own, opened now, for a caller that blocks on it. On a cluster it
    /// goes to the master of `key`'s slot, as the shared link reports it (`CLUSTER SHARDS`
    /// would do as well; `CLUSTER SLOTS` is answered by every version).
    pub(super) async fn open(
        &self,
        config: &AsyncConnectionConfig,
        shared: Option<&Link>,
        key: Option<&[u8]>,
    ) -> RedisResult<Link> {
        match self {
            Self::Single(client, _) => client
                .get_multiplexed_async_connection_with_config(config)
                .await
                .map(Link::Direct),
            Self::Cluster { nodes, .. } => {
                let (Some(shared @ Link::Cluster(..)), Some(key)) = (shared, key) else {
                    return Err(redis::RedisError::from((
                        redis::ErrorKind::Client,
                        "a blocking read on a cluster needs the cluster link and a key",
                    )));
                };
                let slot = super::slot(key);
                let map = shared.slot_map().await?;
                let (host, port) = master_in(&map, slot).cloned().ok_or_else(no_master)?;
                nodes
                    .client(&host, port)?
                    .get_multiplexed_async_connection_with_config(config)
                    .await
                    .map(Link::Direct)
            }
            Self::Sentinel { sentinels, .. } => sentinels.connect(config).await.map(Link::Master),
        }
    }
}

impl Target {
    /// A connection of its own whose pushes (subscription messages, and redis-rs' notice
    /// that it was disconnected) go to `pushes`: to the server, a cluster (redis-rs routes
    /// each shard channel to its slot's node and moves the subscriptions when slots move),
    /// or the master the sentinels name now. The target must speak RESP3.
    pub(super) async fn listening(
        &self,
        config: &AsyncConnectionConfig,
        cluster: ClusterConfig,
        pushes: UnboundedSender<PushInfo>,
    ) -> RedisResult<Link> {
        match self {
            Self::Single(client, _) => client
                .get_multiplexed_async_connection_with_config(
                    &config.clone().set_push_sender(pushes),
                )
                .await
                .map(Link::Direct),
            Self::Cluster {
                cluster: shared, ..
            } => shared
                .client
                .get_async_connection_with_config(cluster.set_push_sender(pushes))
                .await
                .map(|cluster| Link::Cluster(shared.holding(cluster), None)),
            Self::Sentinel { sentinels, .. } => sentinels
                .connect(&config.clone().set_push_sender(pushes))
                .await
                .map(Link::Master),
        }
    }
}

/// One connection, of whichever kind the target opens.
#[derive(Clone)]
pub enum Link {
    /// The shared connection to a single server.
    Managed(ConnectionManager),
    /// A connection to one server or one cluster node: one of its own, or the shared one on
    /// the embedder's event loop (given up when it breaks: nothing reconnects it by itself;
    /// a cluster's masters on the loop are [`Routes`]' own).
    Direct(MultiplexedConnection),
    /// The shared connection to a cluster, and its masters on the embedder's event loop when
    /// it runs there.
    Cluster(SharedCluster, Option<Arc<Routes>>),
    /// A connection to a master found beforehand (the one the sentinels named, a cluster
    /// slot's): a reply saying it no longer is (READONLY, MOVED, ...) fails the whole request,
    /// so the caller's connection is given up.
    Master(MultiplexedConnection),
}

impl Link {
    /// Sends a pipeline and answers each of its replies, an error reply included as such
    /// (`Value::ServerError`), unlike `Pipeline::query_async`, which fails on the first.
    pub async fn send_packed_commands(
        &mut self,
        pipe: &Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisResult<Vec<Value>> {
        self.req_packed_commands(pipe, offset, count).await
    }

    /// Sends a pipeline as [`Link::send_packed_commands`] does, whole. `repeatable` makes the
    /// same commands, one for one, in a form that answers the same when it runs twice: what
    /// goes through redis-rs' cluster connection goes in that form, since it sends a command
    /// again, unseen, when the connection it went on dropped. `pipe` goes where nothing
    /// sends it again but the caller.
    pub async fn send_either(
        &mut self,
        pipe: &Pipeline,
        repeatable: &(dyn Fn() -> Pipeline + Sync),
    ) -> RedisResult<Vec<Value>> {
        let Self::Cluster(cluster, routes) = self else {
            return self.send_packed_commands(pipe, 0, pipe.len()).await;
        };
        let replies = match routes {
            Some(routes) => {
                routes
                    .send(cluster, pipe, 0, pipe.len(), Some(repeatable))
                    .await
            }
            None => {
                let pipe = repeatable();
                let mut cluster = cluster.get().await?;
                cluster.req_packed_commands(&pipe, 0, pipe.len()).await
            }
        };
        refuse_moving(replies, |r| first_moving(r))
    }

    /// Sends `cmd` to the master of `key`'s slot (on a cluster; elsewhere, where every
    /// command goes): for a keyless command that must reach that node, such as `SCRIPT LOAD`
    /// or `CLIENT UNBLOCK` of a reader blocked there.
    pub async fn on_node_of(&mut self, key: &[u8], cmd: &Cmd) -> RedisResult<Value> {
        match self {
            Self::Cluster(cluster, Some(routes)) => routes.on_master_of(cluster, key, cmd).await,
            Self::Cluster(cluster, None) => on_master_of(cluster, super::slot(key), cmd).await,
            _ => cmd.query_async(self).await,
        }
    }

    /// Which master serves which slot, read now (`CLUSTER SLOTS`): on a cluster link only.
    pub(super) async fn slot_map(&self) -> RedisResult<SlotMap> {
        match self {
            Self::Cluster(_, Some(routes)) => routes.read_map().await,
            Self::Cluster(cluster, None) => slot_map(cluster.get().await?).await,
            _ => Err(redis::RedisError::from((
                redis::ErrorKind::Client,
                "only a cluster link has a slot map",
            ))),
        }
    }
}

/// Sends `cmd` through redis-rs' cluster connection to the master of `slot`.
pub(super) async fn on_master_of(
    cluster: &SharedCluster,
    slot: u16,
    cmd: &Cmd,
) -> RedisResult<Value> {
    let route = Route::new(slot, SlotAddr::Master);
    let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route));
    cluster
        .get()
        .await?
        .route_command(cmd.clone(), routing)
        .await
}

/// Which of Redis's two pub/sub spaces a listener's channels are in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Channels {
    /// Shard channels (`SSUBSCRIBE`, Redis 7.0): on a cluster a message stays in its slot's
    /// shard.
    Shard,
    /// Classic channels (`SUBSCRIBE`), for a server without shard channels: on a cluster
    /// every message goes to every node.
    Classic,
}

impl Link {
    /// Subscribes `channel` (on a cluster, a shard channel at the node of its slot). The link
    /// must speak RESP3 and send its pushes somewhere ([`Target::listening`]).
    pub(super) async fn subscribe(
        &mut self,
        channels: Channels,
        channel: &[u8],
    ) -> RedisResult<()> {
        match (self, channels) {
            (Self::Cluster(cluster, _), Channels::Shard) => {
                cluster.get().await?.ssubscribe(channel).await
            }
            (Self::Cluster(cluster, _), Channels::Classic) => {
                cluster.get().await?.subscribe(channel).await
            }
            (link, Channels::Shard) => redis::cmd("SSUBSCRIBE").arg(channel).exec_async(link).await,
            (link, Channels::Classic) => {
                redis::cmd("SUBSCRIBE").arg(channel).exec_async(link).await
            }
        }
    }

    /// Undoes [`Link::subscribe`].
    pub(super) async fn unsubscribe(
        &mut self,
        channels: Channels,
        channel: &[u8],
    ) -> RedisResult<()> {
        match (self, channels) {
            (Self::Cluster(cluster, _), Channels::Shard) => {
                cluster.get().await?.sunsubscribe(channel).await
            }
            (Self::Cluster(cluster, _), Channels::Classic) => {
                cluster.get().await?.unsubscribe(channel).await
            }
            (link, Channels::Shard) => {
                redis::cmd("SUNSUBSCRIBE")
                    .arg(channel)
                    .exec_async(link)
                    .await
            }
            (link, Channels::Classic) => {
                redis::cmd("UNSUBSCRIBE")
                    .arg(channel)
                    .exec_async(link)
                    .await
            }
        }
    }
}

impl Link {
    /// Runs `cmd` on every master (one server's link: on it), answering each node's reply,
    /// an error reply as such.
    pub async fn on_every_master(&mut self, cmd: &Cmd) -> RedisResult<Vec<Value>> {
        match self {
            Self::Cluster(_, Some(routes)) => routes.on_every_master(cmd).await,
            Self::Cluster(cluster, None) => {
                let routing = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
                match cluster
                    .get()
                    .await?
                    .route_command(cmd.clone(), routing)
                    .await?
                {
                    Value::Map(by_node) => {
                        Ok(by_node.into_iter().map(|(_, reply)| reply).collect())
                    }
                    other => Ok(vec![other]),
                }
            }
            _ => {
                let mut pipe = redis::pipe();
                pipe.add_command(cmd.clone());
                self.send_packed_commands(&pipe, 0, 1).await
            }
        }
    }
}

/// Fails a request whose replies say the deployment is moving under it: a demoted master
/// (READONLY), a slot that moved or is moving (MOVED, ASK, TRYAGAIN: redis-rs follows these
/// until its retries run out, then hands them over), a cluster or master that is down
/// (CLUSTERDOWN, MASTERDOWN). Every command of such a request went to the node that answered
/// so; the caller sends it again by the rules for a broken connection.
fn refuse_moving<T>(
    replies: RedisResult<T>,
    moving: impl Fn(&T) -> Option<Value>,
) -> RedisResult<T> {
    match replies {
        Ok(replies) => match moving(&replies) {
            Some(reply) => reply.extract_error().map(|_| replies),
            None => Ok(replies),
        },
        other => other,
    }
}

/// The first of `replies` that [`refuse_moving`] looks for.
fn first_moving(replies: &[Value]) -> Option<Value> {
    replies.iter().find(|v| is_moving(v)).cloned()
}

/// Whether a reply is one of the errors [`refuse_moving`] looks for.
pub(super) fn is_moving(value: &Value) -> bool {
    matches!(value, Value::ServerError(err) if err.kind().is_some_and(moving_kind))
}

/// The kinds of error that say the deployment is moving.
pub(super) fn moving_kind(kind: ServerErrorKind) -> bool {
    matches!(
        kind,
        ServerErrorKind::ReadOnly
            | ServerErrorKind::Moved
            | ServerErrorKind::Ask
            | ServerErrorKind::TryAgain
            | ServerErrorKind::ClusterDown
            | ServerErrorKind::MasterDown
    )
}

impl ConnectionLike for Link {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        let one = |value: &Value| is_moving(value).then(|| value.clone());
        match self {
            Self::Managed(c) => c.req_packed_command(cmd),
            Self::Direct(c) => c.req_packed_command(cmd),
            Self::Cluster(c, None) => {
                Box::pin(
                    async move { refuse_moving(c.get().await?.req_packed_command(cmd).await, one) },
                )
            }
            Self::Cluster(c, Some(routes)) => {
                Box::pin(async move { refuse_moving(routes.send_one(c, cmd).await, one) })
            }
            Self::Master(c) => {
                Box::pin(async move { refuse_moving(c.req_packed_command(cmd).await, one) })
            }
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipe: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        let any = |values: &Vec<Value>| first_moving(values);
        match self {
            Self::Managed(c) => c.req_packed_commands(pipe, offset, count),
            Self::Direct(c) => c.req_packed_commands(pipe, offset, count),
            Self::Cluster(c, None) => Box::pin(async move {
                let replies = c
                    .get()
                    .await?
                    .req_packed_commands(pipe, offset, count)
                    .await;
                refuse_moving(replies, any)
            }),
            Self::Cluster(c, Some(routes)) => Box::pin(async move {
                refuse_moving(routes.send(c, pipe, offset, count, None).await, any)
            }),
            Self::Master(c) => Box::pin(async move {
                refuse_moving(c.req_packed_commands(pipe, offset, count).await, any)
            }),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Managed(c) => c.get_db(),
            Self::Direct(c) | Self::Master(c) => c.get_db(),
            // A cluster has database 0 only.
            Self::Cluster(..) => 0,
        }
    }
}

/// The client of a single server: the URL, with the credentials and database the options
/// give beside it, and the TLS material for a `rediss://` URL.
fn single(options: &ConnectionOptions, protocol: Protocol) -> Result<Client> {
    let mut info = with_credentials(&options.url, options, "url")?;
    if protocol == Protocol::Resp3 {
        let settings = info
            .redis_settings()
            .clone()
            .set_protocol(ProtocolVersion::RESP3);
        info = info.set_redis_settings(settings);
    }
    check_tls(options, &info)?;
    client(info, options)
}

/// A cluster client: the seed nodes (one scheme, one set of credentials), the timeouts.
/// redis-rs retries a command that met MOVED, ASK, TRYAGAIN or a dropped node within the
/// call's timeout, which `Connection` bounds; its own bound is set to the same.
fn cluster(options: &ConnectionOptions, nodes: &[String], protocol: Protocol) -> Result<Target> {
    let range = |message: &str| Error::option(InputErrorKind::Range, message);
    if nodes.is_empty() {
        return Err(range("cluster.nodes must name at least one node"));
    }
    if options.database.is_some_and(|db| db != 0) {
        return Err(range("a cluster has database 0 only"));
    }
    let infos = seeds(nodes, options, "cluster.nodes")?;
    let first = &infos[0];
    if infos.iter().any(|info| info.redis_settings().db() != 0) {
        return Err(range("a cluster has database 0 only"));
    }
    let mut builder = ClusterClientBuilder::new(infos.clone())
        .tcp_settings(options.tcp())
        .connection_timeout(options.connect_timeout)
        .response_timeout(options.command_timeout)
        .overall_response_timeout(Some(options.command_timeout))
        .min_retry_wait(10)
        .max_retry_wait(200);
    if protocol == Protocol::Resp3 {
        builder = builder.use_protocol(ProtocolVersion::RESP3);
    }
    if let Some(username) = first.redis_settings().username() {
        builder = builder.username(username);
    }
    if let Some(password) = first.redis_settings().password() {
        builder = builder.password(password);
    }
    if !options.tls.is_empty() {
        builder = builder.certs(options.tls.certificates());
    }
    let client = builder.build().map_err(|err| {
        Error::option(
            InputErrorKind::Range,
            format!("cluster: {}", redact_all(&err.to_string(), nodes)),
        )
    })?;
    let tls = matches!(first.addr(), ConnectionAddr::TcpTls { .. });
    let seeds = infos
        .iter()
        .filter_map(|info| match info.addr() {
            ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => {
                Some((host.clone(), *port))
            }
            _ => None,
        })
        .collect();
    Ok(Target::Cluster {
        cluster: SharedCluster::new(
            client,
            options.name.clone(),
            // Connecting the seeds, then the masters of the slot map they read.
            2 * (options.connect_timeout + options.command_timeout),
        ),
        nodes: NodeClients::new(first, options),
        seeds,
        on_loop: options
            .reactor
            .clone()
            .map(|reactor| OnLoop::new(reactor, tls, options)),
        name: options.name.clone(),
        routes: OnceLock::new(),
    })
}
