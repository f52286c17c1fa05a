//! node-redis' option shapes, as Mastra's own backend takes them: `redisOptions` (client
//! options, `socket` included) and `cluster` as `{ rootNodes, defaults }`. The fields that mean
//! something here are taken with the same meaning; any other is refused by name, with what to
//! give instead.

use std::time::Duration;

use napi::sys::ValueType;

use super::connection::{listing, Credentials, Fields, Nodes};
use super::reader::{closest, Options};
use super::{OptionError, Read, MAX_TIMEOUT_MS};
use crate::core::connection::DEFAULT_KEEP_ALIVE;
use crate::core::{Error, InputErrorKind};
use crate::glue::args::type_name;
use crate::glue::js::{self, Value};

impl Options {
    /// `cluster` in node-redis' shape: `{ rootNodes: [{ url }], defaults?: { username?,
    /// password? }, useReplicas?: false }`, given as `fields`, which hold `rootNodes`.
    pub(super) fn node_redis_cluster(&self, fields: &Fields) -> Read<Nodes> {
        let has = |name: &str| fields.iter().any(|(field, _, _)| field == name);
        let refuse =
            |message: &str| -> OptionError { Error::option(InputErrorKind::Type, message).into() };
        if has("nodes") {
            return Err(refuse(
                "cluster.nodes and cluster.rootNodes conflict: give nodes (with username and \
                 password) or node-redis' rootNodes (with defaults)",
            ));
        }
        if has("username") || has("password") {
            return Err(refuse(
                "cluster.username and cluster.password go with cluster.nodes; with rootNodes give \
                 them in cluster.defaults",
            ));
        }
        let defaults = match fields.iter().find(|(name, _, _)| name == "defaults") {
            Some((_, value, kind)) => {
                self.fields_of(*value, *kind, "cluster.defaults", CLUSTER_DEFAULTS)?
            }
            None => Vec::new(),
        };
        Ok(Nodes {
            nodes: self.root_nodes(fields)?,
            master_name: String::new(),
            credentials: Credentials {
                username: self.field_text(&defaults, "username", "cluster.defaults")?,
                password: self.field_text(&defaults, "password", "cluster.defaults")?,
                database: None,
            },
        })
    }

    /// `cluster.rootNodes`: a non-empty array of `{ url }`, node-redis' seed nodes.
    fn root_nodes(&self, fields: &Fields) -> Read<Vec<String>> {
        let invalid = |kind: InputErrorKind, message: String| -> OptionError {
            Error::option(kind, message).into()
        };
        let Some((_, value, _)) = fields.iter().find(|(field, _, _)| field == "rootNodes") else {
            return Ok(Vec::new());
        };
        let items = js::array_items(self.env, *value)
            .map_err(|thrown| OptionError {
                error: Error::option(InputErrorKind::Type, "cluster.rootNodes: reading it threw"),
                cause: Some(thrown),
            })?
            .ok_or_else(|| {
                invalid(
                    InputErrorKind::Type,
                    "cluster.rootNodes must be an array of { url } objects".into(),
                )
            })?;
        if items.is_empty() {
            return Err(invalid(
                InputErrorKind::Range,
                "cluster.rootNodes must name at least one node".into(),
            ));
        }
        let mut urls = Vec::with_capacity(items.len());
        for (i, item) in items.into_iter().enumerate() {
            let label = format!("cluster.rootNodes[{i}]");
            let kind = js::type_of(self.env, item);
            if kind != ValueType::napi_object || js::is_array(self.env, item) {
                return Err(invalid(
                    InputErrorKind::Type,
                    format!(
                        "{label} must be an object with a url, got {}",
                        type_name(kind)
                    ),
                ));
            }
            let node =
                self.fields_of(item, kind, &label, &[ROOT_NODE, ROOT_NODE_REFUSED].concat())?;
            for (field, _, _) in &node {
                let why = match field.as_str() {
                    taken if ROOT_NODE.contains(&taken) => continue,
                    "socket" => "give the node's url",
                    _ => "every node takes the same credentials: give them in cluster.defaults",
                };
                return Err(invalid(
                    InputErrorKind::Type,
                    format!("{label}.{field} is not supported: {why}"),
                ));
            }
            urls.push(self.field_text(&node, "url", &label)?.ok_or_else(|| {
                invalid(InputErrorKind::Type, format!("{label}.url is required"))
            })?);
        }
        Ok(urls)
    }

    /// `redisOptions`: node-redis client options, of which the fields that mean something
    /// here are taken and any other is refused by name.
    pub(super) fn redis_options(&self) -> Read<ClientFields> {
        let mut out = ClientFields::default();
        let Some((value, kind)) = self.get("redisOptions")? else {
            return Ok(out);
        };
        if kind != ValueType::napi_object {
            return Err(Error::option(
                InputErrorKind::Type,
                format!("redisOptions must be an object, got {}", type_name(kind)),
            )
            .into());
        }
        let names = js::property_names(self.env, value).map_err(|thrown| OptionError {
            error: Error::option(InputErrorKind::Type, "redisOptions: listing it threw"),
            cause: Some(thrown),
        })?;
        for name in names {
            let label = format!("redisOptions.{}", name.escape_debug());
            // Undefined is "not given" for a field it takes; a name it does not take is
            // refused whatever its value, as at the top level.
            let (field, kind) = match self.field(value, &name, &label)? {
                Some(found) => found,
                None if REDIS_OPTIONS.contains(&name.as_str()) => continue,
                None => (js::undefined(self.env), ValueType::napi_undefined),
            };
            let text = || self.text(field, kind, &label);
            match name.as_str() {
                "url" => out.url = Some(text()?),
                "username" => out.username = Some(text()?),
                "password" => out.password = Some(text()?),
                "name" => out.name = Some(text()?),
                "database" => {
                    out.database = Some(self.number_in(field, kind, &label, 0, 1 << 31)? as u32)
                }
                "socket" => self.socket(field, kind, &mut out)?,
                other => {
                    return Err(Error::option(
                        InputErrorKind::Type,
                        format!("{label} is not supported: {}", redis_options_instead(other)),
                    )
                    .into())
                }
            }
        }
        Ok(out)
    }

    /// `redisOptions.socket`: node-redis' socket options, those that mean something here:
    /// `tls` (a boolean), `connectTimeout`, `noDelay`, `keepAlive` and
    /// `keepAliveInitialDelay`.
    fn socket(
        &self,
        value: Value,
        kind: napi::sys::napi_valuetype,
        out: &mut ClientFields,
    ) -> Read<()> {
        let invalid = |kind: InputErrorKind, message: String| -> OptionError {
            Error::option(kind, message).into()
        };
        if kind != ValueType::napi_object {
            return Err(invalid(
                InputErrorKind::Type,
                format!(
                    "redisOptions.socket must be an object, got {}",
                    type_name(kind)
                ),
            ));
        }
        let names = js::property_names(self.env, value).map_err(|thrown| OptionError {
            error: Error::option(
                InputErrorKind::Type,
                "redisOptions.socket: listing it threw",
            ),
            cause: Some(thrown),
        })?;
        // node-redis 4 takes the delay as `keepAlive: ms`, node-redis 5 as
        // `keepAliveInitialDelay` beside `keepAlive: true`.
        let (mut keep_alive, mut delay, mut initial_delay) = (None, None, None);
        for name in names {
            let label = format!("redisOptions.socket.{}", name.escape_debug());
            let (field, kind) = match self.field(value, &name, &label)? {
                Some(found) => found,
                None if SOCKET.contains(&name.as_str()) => continue,
                None => (js::undefined(self.env), ValueType::napi_undefined),
            };
            let flag = || -> Read<bool> {
                match kind {
                    ValueType::napi_boolean => Ok(js::bool_value(self.env, field)),
                    _ => Err(invalid(
                        InputErrorKind::Type,
                        format!("{label} must be a boolean, got {}", type_name(kind)),
                    )),
                }
            };
            match name.as_str() {
                "tls" if kind == ValueType::napi_boolean => out.tls = Some(flag()?),
                "tls" => {
                    return Err(invalid(
                        InputErrorKind::Type,
                        format!("{label} must be a boolean (give certificates in tls)"),
                    ))
                }
                "connectTimeout" => {
                    out.connect_timeout =
                        Some(self.number_in(field, kind, &label, 1, MAX_TIMEOUT_MS)?)
                }
                "noDelay" => out.no_delay = Some(flag()?),
                "keepAlive" if kind == ValueType::napi_number => {
                    keep_alive = Some(true);
                    delay = Some(self.number_in(field, kind, &label, 1, MAX_TIMEOUT_MS)?);
                }
                "keepAlive" if kind == ValueType::napi_boolean => keep_alive = Some(flag()?),
                "keepAlive" => {
                    return Err(invalid(
                        InputErrorKind::Type,
                        format!(
                            "{label} must be a boolean or a delay in milliseconds, got {}",
                            type_name(kind)
                        ),
                    ))
                }
                "keepAliveInitialDelay" => {
                    initial_delay = Some(self.number_in(field, kind, &label, 1, MAX_TIMEOUT_MS)?)
                }
                // `false` (node-redis: never reconnect in the background) is what this client
                // does: nothing reconnects between calls.
                "reconnectStrategy" if kind == ValueType::napi_boolean && !flag()? => {}
                "reconnectStrategy" => {
                    return Err(invalid(
                        InputErrorKind::Type,
                        format!(
                            "{label} is not supported but as false: this client has no \
                             reconnection loop to pace. When a connection breaks, the next call \
                             opens it again (within connectTimeoutMs), and every call settles \
                             within commandTimeoutMs, rejecting during an outage instead of \
                             waiting in a queue. Remove it, or pass false"
                        ),
                    ))
                }
                "host" | "port" | "path" => {
                    return Err(invalid(
                        InputErrorKind::Type,
                        format!("{label} is not supported: give the server in url"),
                    ))
                }
                "ca" | "cert" | "key" | "servername" | "rejectUnauthorized" => {
                    return Err(invalid(
                        InputErrorKind::Type,
                        format!("{label} is not supported: give TLS material in the tls option"),
                    ))
                }
                other => {
                    let hint = closest(other, SOCKET)
                        .map_or_else(String::new, |k| format!("; did you mean {k}?"));
                    return Err(invalid(
                        InputErrorKind::Type,
                        format!(
                            "{label} is not supported: redisOptions.socket takes {}{hint}",
                            SOCKET.join(", ")
                        ),
                    ));
                }
            }
        }
        out.keep_alive =
            match (keep_alive, delay, initial_delay) {
                (Some(false), _, Some(_)) => return Err(invalid(
                    InputErrorKind::Type,
                    "redisOptions.socket.keepAliveInitialDelay with keepAlive false: give one of \
                     them"
                        .into(),
                )),
                (_, Some(a), Some(b)) if a != b => return Err(invalid(
                    InputErrorKind::Type,
                    "redisOptions.socket.keepAlive and redisOptions.socket.keepAliveInitialDelay \
                     conflict: give one of them (or the same value in both)"
                        .into(),
                )),
                (Some(false), _, None) => Some(None),
                (on, a, b) => match a.or(b) {
                    Some(ms) => Some(Some(Duration::from_millis(ms))),
                    None => on.map(|_| Some(DEFAULT_KEEP_ALIVE)),
                },
            };
        Ok(())
    }
}

/// `redisOptions`' fields (`RedisClientOptions`).
pub(super) const REDIS_OPTIONS: &[&str] =
    &["url", "username", "password", "database", "name", "socket"];
/// `redisOptions.socket`'s fields (`RedisSocketOptions`).
pub(super) const SOCKET: &[&str] = &[
    "tls",
    "connectTimeout",
    "noDelay",
    "keepAlive",
    "keepAliveInitialDelay",
    "reconnectStrategy",
];
/// `cluster.defaults`' fields (`NodeRedisClusterDefaults`).
pub(super) const CLUSTER_DEFAULTS: &[&str] = &["username", "password"];
/// A root node's fields that are taken (`NodeRedisRootNode`), and those refused with a
/// reason of their own.
pub(super) const ROOT_NODE: &[&str] = &["url"];
const ROOT_NODE_REFUSED: &[&str] = &["socket", "username", "password"];

/// The fields of `redisOptions` that mean something here.
#[derive(Default)]
pub(super) struct ClientFields {
    pub(super) url: Option<String>,
    pub(super) username: Option<String>,
    pub(super) password: Option<String>,
    pub(super) database: Option<u32>,
    pub(super) name: Option<String>,
    pub(super) tls: Option<bool>,
    /// `socket.connectTimeout`, in milliseconds.
    pub(super) connect_timeout: Option<u64>,
    /// `socket.noDelay`.
    pub(super) no_delay: Option<bool>,
    /// `socket.keepAlive` (and `keepAliveInitialDelay`): `Some(None)` for off.
    pub(super) keep_alive: Option<Option<Duration>>,
}

/// What node-redis client options (`redisOptions`) hold that has no meaning here, and what
/// to use instead.
fn redis_options_instead(field: &str) -> String {
    match field {
        "RESP" => "RESP 2 is used".to_owned(),
        "pingInterval"
        | "disableOfflineQueue"
        | "readonly"
        | "legacyMode"
        | "isolationPoolOptions"
        | "scripts"
        | "functions"
        | "modules"
        | "commandOptions"
        | "clientInfoTag"
        | "disableClientInfo" => "it does not apply to this client".to_owned(),
        _ => format!("redisOptions takes {}", listing(REDIS_OPTIONS)),
    }
}
