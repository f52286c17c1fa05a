//! Reading where and how to connect: `url`, `cluster` or `sentinel`, `tls`, `connectionName`,
//! the timeouts and `minReplicas`, with what `redisOptions` gives
//! (`node_redis.rs` reads node-redis' shapes).

use std::time::Duration;

use napi::sys::ValueType;

use super::reader::{closest, Options};
use super::{OptionError, Read, MAX_TIMEOUT_MS};
use crate::core::connection::{ConnectionOptions, Deployment, TlsOptions};
use crate::core::lease::redis::Replication;
use crate::core::{Error, InputErrorKind};
use crate::glue::args::type_name;
use crate::glue::js::{self, Value};

impl Options {
    /// The connection options: `url`, `cluster` or `sentinel`, `redisOptions`, `tls`,
    /// `connectionName` and the two timeouts.
    pub(super) fn connection(&self) -> Read<ConnectionOptions> {
        let d = ConnectionOptions::default();
        let url = self.string("url")?;
        let cluster = self.cluster()?;
        let sentinel = self.sentinel()?;
        let client = self.redis_options()?;
        let name = self.string("connectionName")?;
        let mut tls = self.tls()?;
        let conflict = |what: &str| -> OptionError {
            Error::option(
                InputErrorKind::Type,
                format!("{what} conflict: give one of them (or the same value in both)"),
            )
            .into()
        };
        let url = match (url, client.url) {
            (Some(a), Some(b)) if a != b => return Err(conflict("url and redisOptions.url")),
            (a, b) => a.or(b),
        };
        let name = match (name, client.name) {
            (Some(a), Some(b)) if a != b => {
                return Err(conflict("connectionName and redisOptions.name"))
            }
            (a, b) => a.or(b),
        };
        if let Some(name) = &name {
            // Redis' own rule for CLIENT SETNAME, which would refuse it on every connection.
            if !name.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(Error::option(
                    InputErrorKind::Range,
                    format!(
                        "connectionName (or redisOptions.name) must be printable ASCII without \
                         spaces: Redis refuses names with spaces, newlines or other characters \
                         (CLIENT SETNAME); got {name:?}"
                    ),
                )
                .into());
            }
        }
        let name = name.or(d.name);
        // Where: one server by url, a cluster, or the master behind sentinels; one of them.
        let (deployment, nodes_credentials) = match (cluster, sentinel) {
            (Some(_), Some(_)) => return Err(conflict("cluster and sentinel")),
            (Some(_), None) | (None, Some(_)) if url.is_some() => {
                return Err(conflict(
                    "url and cluster or sentinel (which name the servers)",
                ))
            }
            (Some(_), None) | (None, Some(_)) if client.tls.is_some() => {
                return Err(Error::option(
                    InputErrorKind::Type,
                    "redisOptions.socket.tls applies to url: give rediss:// node URLs instead",
                )
                .into())
            }
            (Some(cluster), None) => (
                Deployment::Cluster {
                    nodes: cluster.nodes,
                },
                cluster.credentials,
            ),
            (None, Some(sentinel)) => (
                Deployment::Sentinel {
                    nodes: sentinel.nodes,
                    master_name: sentinel.master_name,
                },
                sentinel.credentials,
            ),
            (None, None) => (Deployment::Single, Credentials::default()),
        };
        let both = |a: Option<String>, b: Option<String>, what: &str| match (a, b) {
            (Some(a), Some(b)) if a != b => Err(conflict(what)),
            (a, b) => Ok(a.or(b)),
        };
        let username = both(
            client.username,
            nodes_credentials.username,
            "redisOptions.username and the nodes' username",
        )?;
        let password = both(
            client.password,
            nodes_credentials.password,
            "redisOptions.password and the nodes' password",
        )?;
        let database = match (client.database, nodes_credentials.database) {
            (Some(a), Some(b)) if a != b => {
                return Err(conflict("redisOptions.database and sentinel.database"))
            }
            (a, b) => a.or(b),
        };
        let mut url = url.unwrap_or(d.url);
        match client.tls {
            Some(true) if url.starts_with("redis://") => url.replace_range(..5, "rediss"),
            Some(true) if !url.starts_with("rediss://") => {
                return Err(Error::option(
                    InputErrorKind::Range,
                    "redisOptions.socket.tls needs a redis:// or rediss:// url",
                )
                .into())
            }
            Some(false) if url.starts_with("rediss://") => {
                return Err(conflict(
                    "redisOptions.socket.tls false and a rediss:// url",
                ))
            }
            _ => {}
        }
        // Any `tls` given, even `{}`, says TLS was meant: a URL without it is refused, as it is
        // with certificates (the core's check sees only what `tls` holds).
        let rediss = |url: &str| url.starts_with("rediss://");
        let asks_tls = match &deployment {
            Deployment::Single => rediss(&url),
            Deployment::Cluster { nodes } | Deployment::Sentinel { nodes, .. } => {
                nodes.iter().any(|node| rediss(node))
            }
        };
        if tls.is_some() && !asks_tls {
            return Err(Error::option(
                InputErrorKind::Range,
                "tls is set but url is not a rediss:// URL: TLS options apply to rediss:// only",
            )
            .into());
        }
        if client.tls == Some(true) && tls.is_none() {
            tls = Some(TlsOptions::default());
        }
        let connect_timeout = match (
            self.whole("connectTimeoutMs", 1, MAX_TIMEOUT_MS)?,
            client.connect_timeout,
        ) {
            (Some(a), Some(b)) if a != b => {
                return Err(conflict(
                    "connectTimeoutMs and redisOptions.socket.connectTimeout",
                ))
            }
            (a, b) => a.or(b).map_or(d.connect_timeout, Duration::from_millis),
        };
        Ok(ConnectionOptions {
            deployment,
            url,
            username,
            password,
            database: database.map(i64::from),
            tls: tls.unwrap_or_default(),
            name,
            connect_timeout,
            command_timeout: self
                .whole("commandTimeoutMs", 1, MAX_TIMEOUT_MS)?
                .map_or(d.command_timeout, Duration::from_millis),
            no_delay: client.no_delay.unwrap_or(d.no_delay),
            keep_alive: client.keep_alive.unwrap_or(d.keep_alive),
            reactor: None,
        })
    }

    /// `cluster`: `{ nodes, username?, password? }`, the seed nodes of a Redis Cluster; or
    /// node-redis' shape, as Mastra's backend takes it: `{ rootNodes: [{ url }], defaults?:
    /// { username?, password? }, useReplicas?: false }`.
    fn cluster(&self) -> Read<Option<Nodes>> {
        let Some(fields) = self.object_fields("cluster", CLUSTER)? else {
            return Ok(None);
        };
        let has = |name: &str| fields.iter().any(|(field, _, _)| field == name);
        let refuse =
            |message: &str| -> OptionError { Error::option(InputErrorKind::Type, message).into() };
        if let Some((_, value, kind)) = fields.iter().find(|(name, _, _)| name == "useReplicas") {
            if *kind != ValueType::napi_boolean {
                return Err(refuse(&format!(
                    "cluster.useReplicas must be a boolean, got {}",
                    type_name(*kind)
                )));
            }
            if js::bool_value(self.env, *value) {
                return Err(refuse(
                    "cluster.useReplicas true is not supported: every call goes to the masters \
                     (a replica may not have a lease's latest write yet)",
                ));
            }
        }
        if !has("rootNodes") {
            if has("defaults") {
                return Err(refuse(
                    "cluster.defaults goes with cluster.rootNodes (node-redis' shape); with \
                     cluster.nodes give cluster.username and cluster.password",
                ));
            }
            return Ok(Some(Nodes {
                nodes: self.urls(&fields, "cluster")?,
                master_name: String::new(),
                credentials: Credentials {
                    username: self.field_text(&fields, "username", "cluster")?,
                    password: self.field_text(&fields, "password", "cluster")?,
                    database: None,
                },
            }));
        }
        self.node_redis_cluster(&fields).map(Some)
    }

    /// `sentinel`: `{ nodes, masterName, username?, password?, database? }`: the sentinels
    /// (their own credentials in their URLs), the master's name, and the master's
    /// credentials and database.
    fn sentinel(&self) -> Read<Option<Nodes>> {
        let Some(fields) = self.object_fields("sentinel", SENTINEL)? else {
            return Ok(None);
        };
        let master_name = self
            .field_text(&fields, "masterName", "sentinel")?
            .ok_or_else(|| {
                OptionError::from(Error::option(
                    InputErrorKind::Type,
                    "sentinel.masterName is required: the name the sentinels monitor the master by",
                ))
            })?;
        let database = match fields.iter().find(|(name, _, _)| name == "database") {
            Some((_, value, kind)) => {
                Some(self.number_in(*value, *kind, "sentinel.database", 0, 1 << 31)? as u32)
            }
            None => None,
        };
        Ok(Some(Nodes {
            nodes: self.urls(&fields, "sentinel")?,
            master_name,
            credentials: Credentials {
                username: self.field_text(&fields, "username", "sentinel")?,
                password: self.field_text(&fields, "password", "sentinel")?,
                database,
            },
        }))
    }

    /// The fields of the object option `name`, each one of `known` (any other is refused by
    /// name); `None` when the option is absent.
    fn object_fields(
        &self,
        name: &'static str,
        known: &[&str],
    ) -> Read<Option<Vec<(String, Value, napi::sys::napi_valuetype)>>> {
        let Some((value, kind)) = self.get(name)? else {
            return Ok(None);
        };
        self.fields_of(value, kind, name, known).map(Some)
    }

    /// The fields of an object labelled `name` in errors, each one of `known` (any other is
    /// refused by name).
    pub(super) fn fields_of(
        &self,
        value: Value,
        kind: napi::sys::napi_valuetype,
        name: &str,
        known: &[&str],
    ) -> Read<Vec<(String, Value, napi::sys::napi_valuetype)>> {
        if kind != ValueType::napi_object {
            return Err(Error::option(
                InputErrorKind::Type,
                format!("{name} must be an object, got {}", type_name(kind)),
            )
            .into());
        }
        let names = js::property_names(self.env, value).map_err(|thrown| OptionError {
            error: Error::option(InputErrorKind::Type, format!("{name}: listing it threw")),
            cause: Some(thrown),
        })?;
        let mut fields = Vec::new();
        for field in names {
            let label = format!("{name}.{}", field.escape_debug());
            if !known.contains(&field.as_str()) {
                let hint = closest(&field, known)
                    .map_or_else(String::new, |k| format!("; did you mean {k}?"));
                return Err(Error::option(
                    InputErrorKind::Type,
                    format!(
                        "{label} is not an option of {name} ({} are){hint}",
                        known.join(", ")
                    ),
                )
                .into());
            }
            if let Some((value, kind)) = self.field(value, &field, &label)? {
                fields.push((field, value, kind));
            }
        }
        Ok(fields)
    }

    /// A text field of an object option.
    pub(super) fn field_text(
        &self,
        fields: &Fields,
        name: &str,
        option: &str,
    ) -> Read<Option<String>> {
        match fields.iter().find(|(field, _, _)| field == name) {
            Some((_, value, kind)) => Ok(Some(self.text(
                *value,
                *kind,
                &format!("{option}.{name}"),
            )?)),
            None => Ok(None),
        }
    }

    /// `<option>.nodes`: a non-empty array of URL strings.
    fn urls(&self, fields: &Fields, option: &str) -> Read<Vec<String>> {
        let label = format!("{option}.nodes");
        let invalid = |message: String| -> OptionError {
            Error::option(InputErrorKind::Type, message).into()
        };
        let Some((_, value, _)) = fields.iter().find(|(field, _, _)| field == "nodes") else {
            return Err(invalid(format!(
                "{label} is required: the URLs of the nodes to reach"
            )));
        };
        let items = js::array_items(self.env, *value)
            .map_err(|thrown| OptionError {
                error: Error::option(InputErrorKind::Type, format!("{label}: reading it threw")),
                cause: Some(thrown),
            })?
            .ok_or_else(|| invalid(format!("{label} must be an array of URL strings")))?;
        if items.is_empty() {
            return Err(Error::option(
                InputErrorKind::Range,
                format!("{label} must name at least one node"),
            )
            .into());
        }
        items
            .into_iter()
            .enumerate()
            .map(|(i, item)| self.text(item, js::type_of(self.env, item), &format!("{label}[{i}]")))
            .collect()
    }

    /// Failover-safe grants: `minReplicas` (default 0, off) and `replicaTimeoutMs` (how long
    /// `WAIT` waits; default 1000, or half `commandTimeoutMs` when that is shorter; it must be
    /// shorter than `commandTimeoutMs`, so a call still settles in time).
    pub(super) fn replication(&self, command_timeout: Duration) -> Read<Option<Replication>> {
        let replicas = self.whole("minReplicas", 0, 100)?.unwrap_or(0);
        let timeout = self.whole("replicaTimeoutMs", 1, MAX_TIMEOUT_MS)?;
        let range = |message: String| -> OptionError {
            Error::option(InputErrorKind::Range, message).into()
        };
        if replicas == 0 {
            return match timeout {
                Some(_) => Err(Error::option(
                    InputErrorKind::Type,
                    "replicaTimeoutMs without minReplicas: give minReplicas (1 or more) too",
                )
                .into()),
                None => Ok(None),
            };
        }
        let command_ms = u64::try_from(command_timeout.as_millis()).unwrap_or(u64::MAX);
        let timeout_ms = timeout.unwrap_or_else(|| 1_000.min(command_ms / 2).max(1));
        if timeout_ms >= command_ms {
            return Err(range(format!(
                "replicaTimeoutMs ({timeout_ms}) must be shorter than commandTimeoutMs ({command_ms}), so a call still settles in time"
            )));
        }
        Ok(Some(Replication {
            replicas: replicas as u32,
            timeout: Duration::from_millis(timeout_ms),
        }))
    }

    /// `tls`: an object with `ca`, `cert` and `key`, each a string or a `Uint8Array` (a
    /// `Buffer`). `null` means none. Any other property is refused, so a misspelt option
    /// (or one this library does not have, like `servername` or `rejectUnauthorized`)
    /// cannot silently change what is verified.
    fn tls(&self) -> Read<Option<TlsOptions>> {
        let Some((value, kind)) = self.get("tls")? else {
            return Ok(None);
        };
        match kind {
            ValueType::napi_null => return Ok(None),
            ValueType::napi_object => {}
            _ => {
                return Err(Error::option(
                    InputErrorKind::Type,
                    format!("tls must be an object, got {}", type_name(kind)),
                )
                .into())
            }
        }
        let names = js::property_names(self.env, value).map_err(|thrown| OptionError {
            error: Error::option(InputErrorKind::Type, "tls: listing it threw"),
            cause: Some(thrown),
        })?;
        for name in names {
            let why = match name.as_str() {
                known if TLS.contains(&known) => continue,
                "servername" => {
                    "; the server certificate is verified against the URL's host, so reach the \
                     server by the name on its certificate (a DNS or hosts entry)"
                }
                "rejectUnauthorized" | "checkServerIdentity" => {
                    "; the server certificate and its name are always verified"
                }
                _ => "",
            };
            return Err(Error::option(
                InputErrorKind::Type,
                format!(
                    "tls.{} is not supported (tls takes {}){why}",
                    name.escape_debug(),
                    listing(TLS)
                ),
            )
            .into());
        }
        let pem = |name: &str| -> Read<Option<Vec<u8>>> {
            let label = format!("tls.{name}");
            let Some((field, kind)) = self.field(value, name, &label)? else {
                return Ok(None);
            };
            if kind == ValueType::napi_string {
                return self
                    .text(field, kind, &label)
                    .map(|text| Some(text.into_bytes()));
            }
            js::uint8_bytes(self.env, field).map(Some).ok_or_else(|| {
                Error::option(
                    InputErrorKind::Type,
                    format!(
                        "{label} must be a PEM string or Buffer, got {}",
                        type_name(kind)
                    ),
                )
                .into()
            })
        };
        Ok(Some(TlsOptions {
            ca: pem("ca")?,
            cert: pem("cert")?,
            key: pem("key")?,
        }))
    }
}

/// `cluster`'s fields: `ClusterOptions`' and node-redis' (`NodeRedisClusterOptions`).
pub(super) const CLUSTER: &[&str] = &[
    "nodes",
    "username",
    "password",
    "rootNodes",
    "defaults",
    "useReplicas",
];
/// `sentinel`'s fields (`SentinelOptions`).
pub(super) const SENTINEL: &[&str] = &["nodes", "masterName", "username", "password", "database"];
/// `tls`'s fields (`TlsOptions`).
pub(super) const TLS: &[&str] = &["ca", "cert", "key"];

/// `a, b and c`, for messages that list what an option takes.
pub(super) fn listing(names: &[&str]) -> String {
    match names {
        [] => String::new(),
        [one] => (*one).to_owned(),
        [rest @ .., last] => format!("{} and {last}", rest.join(", ")),
    }
}

/// The fields of an object option: name, value and type.
pub(super) type Fields = [(String, Value, napi::sys::napi_valuetype)];

/// The credentials an object option gives for its data nodes.
#[derive(Default)]
pub(super) struct Credentials {
    pub(super) username: Option<String>,
    pub(super) password: Option<String>,
    pub(super) database: Option<u32>,
}

/// `cluster` or `sentinel`, read.
pub(super) struct Nodes {
    pub(super) nodes: Vec<String>,
    pub(super) master_name: String,
    pub(super) credentials: Credentials,
}
