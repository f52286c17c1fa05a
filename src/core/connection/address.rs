//! Where a deployment is and how to sign in there: a URL's connection info with the
//! credentials and database the options give beside it, the seeds of a cluster or of the
//! sentinels, a cluster node by address, the TLS material's fit with the URLs, and URLs kept
//! out of messages (where a deployment is, as messages name it: [`place`]).

use std::sync::Arc;

use redis::{Client, ConnectionAddr, ConnectionInfo, IntoConnectionInfo, RedisResult};

use super::{ConnectionOptions, Deployment, TlsOptions};
use crate::core::error::{Error, InputErrorKind, Result};

/// The protocol a target's connections speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Protocol {
    /// The one the URL names (RESP2 unless it says otherwise).
    AsTheUrlSays,
    /// RESP3, for connections that receive pushes (subscriptions).
    Resp3,
}

/// A URL's connection info, the credentials and database the options give beside it
/// applied, each refused when the URL already says otherwise.
pub(super) fn with_credentials(
    url: &str,
    options: &ConnectionOptions,
    what: &str,
) -> Result<ConnectionInfo> {
    let mut info = url.into_connection_info().map_err(|err| {
        // The URL may carry a password, so neither it nor the parser's echo of it is
        // repeated; the parser's complaint without the URL is enough to fix it.
        Error::option(
            InputErrorKind::Range,
            format!(
                "{what} is not a Redis URL (redis://, rediss://, redis+unix://): {}",
                redact(&err.to_string(), url)
            ),
        )
    })?;
    let mut settings = info.redis_settings().clone();
    // Given twice, differently: which one was meant cannot be told.
    let twice = |field: &str| {
        Error::option(
            InputErrorKind::Type,
            format!("the {field} is given both in the url and as an option, differently"),
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
    info = info
        .set_redis_settings(settings)
        .set_tcp_settings(options.tcp());
    Ok(info)
}

/// The TLS material applies to `rediss://` only.
pub(super) fn check_tls(options: &ConnectionOptions, info: &ConnectionInfo) -> Result<()> {
    if options.tls.is_empty() {
        return Ok(());
    }
    if !matches!(info.addr(), ConnectionAddr::TcpTls { .. }) {
        return Err(Error::option(
            InputErrorKind::Range,
            "tls is set but url is not a rediss:// URL: TLS options apply to rediss:// only",
        ));
    }
    options.tls.check()
}

/// Whether the URLs ask for TLS (`rediss://`).
pub(super) fn asks_tls(options: &ConnectionOptions) -> bool {
    let rediss = |url: &String| url.starts_with("rediss://");
    match &options.deployment {
        Deployment::Single => rediss(&options.url),
        Deployment::Cluster { nodes } | Deployment::Sentinel { nodes, .. } => {
            nodes.iter().any(rediss)
        }
    }
}

/// A client of `info`, with the options' TLS material when there is some.
pub(super) fn client(info: ConnectionInfo, options: &ConnectionOptions) -> Result<Client> {
    if options.tls.is_empty() {
        return Client::open(info).map_err(|err| Error::from_redis(err, options.connect_timeout));
    }
    Client::build_with_tls(info, options.tls.certificates()).map_err(refused_tls)
}

/// The material was checked, so a refusal is redis-rs' own; its message is not repeated in
/// case it quotes the material.
fn refused_tls(_: redis::RedisError) -> Error {
    Error::option(
        InputErrorKind::Range,
        "tls: the Redis client refused the certificates or key",
    )
}

/// Seed URLs (a cluster's nodes, the sentinels), parsed with `options`' credentials applied
/// and checked against its TLS options: TCP only, and one scheme and one set of credentials
/// for all, so no seed quietly connects differently from the others.
pub(super) fn seeds(
    urls: &[String],
    options: &ConnectionOptions,
    what: &str,
) -> Result<Vec<ConnectionInfo>> {
    let range = |message: String| Error::option(InputErrorKind::Range, message);
    let infos = urls
        .iter()
        .map(|url| with_credentials(url, options, what))
        .collect::<Result<Vec<_>>>()?;
    let Some(first) = infos.first() else {
        return Err(range(format!("{what} must name at least one")));
    };
    let tls = |info: &ConnectionInfo| matches!(info.addr(), ConnectionAddr::TcpTls { .. });
    for info in &infos {
        check_tls(options, info)?;
        if matches!(info.addr(), ConnectionAddr::Unix(_)) {
            return Err(range(format!(
                "{what} must be redis:// or rediss:// URLs, not unix sockets"
            )));
        }
        if tls(info) != tls(first) {
            return Err(range(format!("{what} mix redis:// and rediss:// URLs")));
        }
        if info.redis_settings().username() != first.redis_settings().username()
            || info.redis_settings().password() != first.redis_settings().password()
        {
            return Err(range(format!(
                "{what} give different credentials: every one takes the same"
            )));
        }
    }
    Ok(infos)
}

/// Where `options` reach, as an error names it ([`At`](crate::core::error::At)): the server's
/// address, a cluster's seed nodes, the sentinels and the master's name. Made from the parsed
/// addresses alone, so no credentials, database or query of a URL can show.
pub(super) fn place(options: &ConnectionOptions) -> Arc<str> {
    let listed = |one: &str, urls: &[String]| {
        let addresses: Vec<_> = urls.iter().map(|url| address(url)).collect();
        let plural = if addresses.len() == 1 { "" } else { "s" };
        format!("{one}{plural} {}", addresses.join(", "))
    };
    match &options.deployment {
        Deployment::Single => address(&options.url),
        Deployment::Cluster { nodes } => format!("the cluster of {}", listed("seed node", nodes)),
        Deployment::Sentinel { nodes, master_name } => {
            format!(
                "the master {master_name:?} of {}",
                listed("sentinel", nodes)
            )
        }
    }
    .into()
}

/// A URL's address: `host:port` (`[v6]:port`), marked when over TLS, or the unix socket.
fn address(url: &str) -> String {
    let host_port = |host: &str, port: u16| match host.contains(':') {
        true => format!("[{host}]:{port}"),
        false => format!("{host}:{port}"),
    };
    match url.into_connection_info().map(|info| info.addr().clone()) {
        Ok(ConnectionAddr::Tcp(host, port)) => host_port(&host, port),
        Ok(ConnectionAddr::TcpTls { host, port, .. }) => {
            format!("{} (TLS)", host_port(&host, port))
        }
        Ok(ConnectionAddr::Unix(path)) => format!("the unix socket {}", path.display()),
        Ok(other) => other.to_string(),
        // Not reached: a connection is made of URLs that parsed.
        Err(_) => "<url>".to_owned(),
    }
}

/// Removes every URL (and so any password in one) from a message.
pub(super) fn redact_all(message: &str, urls: &[String]) -> String {
    urls.iter()
        .fold(message.to_owned(), |message, url| redact(&message, url))
}

/// Removes the URL (and so any password in it) from a message.
fn redact(message: &str, url: &str) -> String {
    if url.is_empty() {
        message.to_owned()
    } else {
        message.replace(url, "<url>")
    }
}

/// How to open a plain connection to one node of a cluster, found by address: the seed's
/// scheme, credentials and TLS material, another host and port.
#[derive(Clone)]
pub(super) struct NodeClients {
    template: ConnectionInfo,
    tls: TlsOptions,
}

impl NodeClients {
    /// Nodes reached as `seed` is, with the options' TLS material.
    pub(super) fn new(seed: &ConnectionInfo, options: &ConnectionOptions) -> Self {
        Self {
            template: seed.clone(),
            tls: options.tls.clone(),
        }
    }

    /// A client of the node at `host` and `port`.
    pub(super) fn client(&self, host: &str, port: u16) -> RedisResult<Client> {
        let addr = match self.template.addr() {
            ConnectionAddr::TcpTls { insecure, .. } => ConnectionAddr::TcpTls {
                host: host.to_owned(),
                port,
                insecure: *insecure,
                tls_params: None,
            },
            _ => ConnectionAddr::Tcp(host.to_owned(), port),
        };
        let info = self.template.clone().set_addr(addr);
        if self.tls.is_empty() {
            Client::open(info)
        } else {
            Client::build_with_tls(info, self.tls.certificates())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_place_names_addresses_and_never_credentials_database_or_query() {
        let single = |url: &str| {
            let options = ConnectionOptions {
                url: url.to_owned(),
                ..ConnectionOptions::default()
            };
            place(&options).to_string()
        };
        assert_eq!(
            single("redis://alice:s3cret@127.0.0.1:6390/4"),
            "127.0.0.1:6390"
        );
        assert_eq!(
            single("redis://:s3cret@redis.internal"),
            "redis.internal:6379"
        );
        assert_eq!(single("redis://[::1]:6390"), "[::1]:6390");
        assert_eq!(
            single("rediss://bob:pw@cache.example:6380"),
            "cache.example:6380 (TLS)"
        );
        assert_eq!(
            single("redis+unix:///run/redis.sock?db=2&pass=s3cret"),
            "the unix socket /run/redis.sock"
        );
        let nodes = |urls: &[&str]| urls.iter().map(|u| (*u).to_owned()).collect::<Vec<_>>();
        let cluster = ConnectionOptions {
            deployment: Deployment::Cluster {
                nodes: nodes(&["redis://u:pw@10.0.0.1:7000", "redis://u:pw@10.0.0.2:7001"]),
            },
            ..ConnectionOptions::default()
        };
        assert_eq!(
            &*place(&cluster),
            "the cluster of seed nodes 10.0.0.1:7000, 10.0.0.2:7001"
        );
        let sentinel = ConnectionOptions {
            deployment: Deployment::Sentinel {
                nodes: nodes(&["redis://s:pw@10.0.0.3:26379"]),
                master_name: "mymaster".to_owned(),
            },
            ..ConnectionOptions::default()
        };
        assert_eq!(
            &*place(&sentinel),
            "the master \"mymaster\" of sentinel 10.0.0.3:26379"
        );
    }

    #[test]
    fn every_connection_is_made_with_the_socket_options() {
        let url = "redis://127.0.0.1:1";
        let info = with_credentials(url, &ConnectionOptions::default(), "url").unwrap();
        assert!(info.tcp_settings().nodelay(), "TCP_NODELAY by default");
        assert!(
            info.tcp_settings().keepalive().is_some(),
            "keepalive by default"
        );
        let off = ConnectionOptions {
            no_delay: false,
            keep_alive: None,
            ..ConnectionOptions::default()
        };
        let info = with_credentials(url, &off, "url").unwrap();
        assert!(!info.tcp_settings().nodelay());
        assert!(info.tcp_settings().keepalive().is_none());
    }
}
