//! What a [`Connection`](super::Connection) is opened with: the deployment, the addresses
//! and credentials, TLS, the timeouts and the socket settings.

use std::sync::Arc;
use std::time::Duration;

use super::{Reactor, TlsOptions};

/// Which kind of Redis deployment to reach.
#[derive(Clone, Default, PartialEq, Eq)]
pub enum Deployment {
    /// One server, at [`ConnectionOptions::url`].
    #[default]
    Single,
    /// A Redis Cluster, found through any of these seed nodes (`redis://` or `rediss://`
    /// URLs, every one with the same credentials).
    Cluster { nodes: Vec<String> },
    /// The master these sentinels name `master_name`. The sentinels' own credentials go in
    /// their URLs; `rediss://` means TLS to the sentinels and to the master.
    Sentinel {
        nodes: Vec<String>,
        master_name: String,
    },
}

/// How to reach Redis, and the bounds on reaching it.
#[derive(Clone)]
pub struct ConnectionOptions {
    /// Which kind of deployment. Default one server.
    pub deployment: Deployment,
    /// For one server: `redis://[user:pass@]host[:port][/db]`, `rediss://...` for TLS, or
    /// `redis+unix:///path/to.sock`. Default `redis://127.0.0.1:6379`.
    pub url: String,
    /// The ACL user of the data nodes (the server, the cluster's nodes, the master), in
    /// place of one in a URL.
    pub username: Option<String>,
    /// Their password, in place of one in a URL.
    pub password: Option<String>,
    /// The database number, in place of one in the URL (a cluster has 0 only).
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
    /// `TCP_NODELAY` on every connection: a command is sent at once, not held back to be
    /// coalesced with the next. Default true, as node-redis.
    pub no_delay: bool,
    /// TCP keepalive probes on every connection once it has been idle this long, so a peer
    /// that vanished (or a NAT that dropped the flow) is noticed on connections that wait,
    /// such as the wake-up listener's. `None`: no probes. Default 5 s, as node-redis.
    pub keep_alive: Option<Duration>,
    /// The embedder's event loop, for the shared link to one server at a `redis://` or
    /// `rediss://` URL, to the master behind Sentinel, or to each master of a cluster
    /// (`reactor.rs`). Default none: the runtime's thread does the I/O.
    pub reactor: Option<Arc<dyn Reactor>>,
}

/// node-redis' keepalive delay, ours by default.
pub const DEFAULT_KEEP_ALIVE: Duration = Duration::from_secs(5);

impl ConnectionOptions {
    /// The socket settings every TCP connection is made with.
    pub(crate) fn tcp(&self) -> redis::io::tcp::TcpSettings {
        let tcp = redis::io::tcp::TcpSettings::default().set_nodelay(self.no_delay);
        match self.keep_alive {
            Some(idle) => {
                tcp.set_keepalive(redis::io::tcp::socket2::TcpKeepalive::new().with_time(idle))
            }
            None => tcp,
        }
    }
}

impl Default for ConnectionOptions {
    fn default() -> Self {
        Self {
            deployment: Deployment::Single,
            url: "redis://127.0.0.1:6379".to_owned(),
            username: None,
            password: None,
            database: None,
            tls: TlsOptions::default(),
            name: Some(DEFAULT_NAME.to_owned()),
            connect_timeout: Duration::from_secs(2),
            command_timeout: Duration::from_secs(2),
            no_delay: true,
            keep_alive: Some(DEFAULT_KEEP_ALIVE),
            reactor: None,
        }
    }
}

impl std::fmt::Debug for ConnectionOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URL and the password are secrets: say only what is set.
        let deployment = match &self.deployment {
            Deployment::Single => "single",
            Deployment::Cluster { .. } => "cluster",
            Deployment::Sentinel { .. } => "sentinel",
        };
        f.debug_struct("ConnectionOptions")
            .field("deployment", &deployment)
            .field("username", &self.username.is_some())
            .field("password", &self.password.is_some())
            .field("database", &self.database)
            .field("tls", &self.tls)
            .field("name", &self.name)
            .field("connect_timeout", &self.connect_timeout)
            .field("command_timeout", &self.command_timeout)
            .field("no_delay", &self.no_delay)
            .field("keep_alive", &self.keep_alive)
            .field("reactor", &self.reactor.is_some())
            .finish_non_exhaustive()
    }
}

/// The connection name every connection gets unless the options name another.
pub const DEFAULT_NAME: &str = "mastra-lease";
