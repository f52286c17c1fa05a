//! Which Redis a [`Connection`](super::Connection) reaches, and the connections it opens
//! there, behind one interface. [`Target`] knows how to open a connection to the deployment
//! the options name; [`Link`] is one such connection, and callers send every command through
//! it (`query_async`, `invoke_async`, [`Link::send_packed_commands`]) without asking which
//! kind it is. A kind of deployment is a variant of each.

use redis::aio::{
    ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection,
};
use redis::{
    AsyncConnectionConfig, Client, Cmd, ConnectionAddr, Pipeline, RedisFuture, RedisResult, Value,
};

use super::{redact, tls, ConnectionOptions};
use crate::core::error::{Error, InputErrorKind, Result};

/// The deployment to reach.
pub(super) enum Target {
    /// One server, by URL.
    Single(Client),
}

impl Target {
    /// Checks the URL, the credentials and the TLS material; connects nowhere.
    pub(super) fn new(options: &ConnectionOptions) -> Result<Self> {
        Ok(Self::Single(single(options)?))
    }

    /// The shared connection: opened on its first command, reopened by redis-rs after an
    /// I/O error.
    pub(super) fn shared(&self, config: &ConnectionManagerConfig) -> RedisResult<Link> {
        match self {
            Self::Single(client) => {
                ConnectionManager::new_lazy_with_config(client.clone(), config.clone())
                    .map(Link::Managed)
            }
        }
    }

    /// A connection of its own, opened now, for a caller that blocks on it.
    pub(super) async fn open(&self, config: &AsyncConnectionConfig) -> RedisResult<Link> {
        match self {
            Self::Single(client) => client
                .get_multiplexed_async_connection_with_config(config)
                .await
                .map(Link::Direct),
        }
    }
}

/// One connection, of whichever kind the target opens.
#[derive(Clone)]
pub enum Link {
    /// The shared connection to a single server.
    Managed(ConnectionManager),
    /// A connection of its own to a single server.
    Direct(MultiplexedConnection),
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
}

impl ConnectionLike for Link {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Managed(c) => c.req_packed_command(cmd),
            Self::Direct(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipe: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Managed(c) => c.req_packed_commands(pipe, offset, count),
            Self::Direct(c) => c.req_packed_commands(pipe, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Managed(c) => c.get_db(),
            Self::Direct(c) => c.get_db(),
        }
    }
}

/// The client of a single server: the URL, with the credentials and database the options
/// give beside it, and the TLS material for a `rediss://` URL.
fn single(options: &ConnectionOptions) -> Result<Client> {
    // Before any client: a `rediss://` URL needs it even without TLS options.
    tls::install_provider();
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
    if tls.is_empty() {
        return Client::open(info).map_err(|err| Error::from_redis(err, options.connect_timeout));
    }
    if !matches!(info.addr(), ConnectionAddr::TcpTls { .. }) {
        return Err(Error::option(
            InputErrorKind::Range,
            "tls is set but url is not a rediss:// URL: TLS options apply to rediss:// only",
        ));
    }
    tls.check()?;
    // The material was checked above, so this fails only on what redis-rs itself refuses;
    // its message is not repeated in case it quotes the material.
    Client::build_with_tls(info, tls.certificates()).map_err(|_| {
        Error::option(
            InputErrorKind::Range,
            "tls: the Redis client refused the certificates or key",
        )
    })
}
