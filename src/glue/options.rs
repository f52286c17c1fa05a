//! Constructor options, read by hand: a wrong type or value becomes a coded
//! `TypeError`/`RangeError`, an option this class does not know is an error naming it (a
//! typo must not quietly connect somewhere else), and an option whose getter throws
//! surfaces with what it threw as `cause`. The `#[napi(object)]` structs only give
//! `index.d.ts` its documented interfaces.

use std::cell::RefCell;
use std::ffi::CString;
use std::time::Duration;

use napi::sys::ValueType;
use napi_derive::napi;

use super::args::{safe_integer, type_name};
use super::js::{self, Env, Value};
use crate::core::connection::{ConnectionOptions, TlsOptions as CoreTls};
use crate::core::lease::TTL_CEILING_MS;
use crate::core::streams::{StreamsOptions, HARD_MAX_LEN_FACTOR};
use crate::core::{Error, InputErrorKind, Limits, RedisOptions};

/// Options of `new MemoryLeaseProvider(options?)`.
#[napi(object, object_from_js = false, object_to_js = false)]
pub struct MemoryLeaseProviderOptions {
    /// Longest key accepted, in UTF-8 bytes. Default 4096.
    pub max_key_bytes: Option<u32>,
    /// Longest owner accepted, in UTF-8 bytes. Default 1024.
    pub max_owner_bytes: Option<u32>,
    /// Longest TTL accepted, in milliseconds. Default 86 400 000 (one day).
    pub max_ttl_ms: Option<f64>,
}

/// TLS material for a `rediss://` URL (option `tls`), each a PEM string or `Buffer`. Without
/// it, the server certificate is verified against the platform's roots and the file named
/// by `SSL_CERT_FILE`. Checked at construction: unparsable PEM, a `cert` without its `key`
/// (or the reverse), a key that is not the certificate's, or `tls` with a URL that is not
/// `rediss://` throw `ERR_LEASE_INVALID_OPTION`; no message repeats the material.
///
/// The server certificate is always verified against the URL's host: reach the server by
/// the name on its certificate (a DNS or hosts entry), not by its IP address, unless the
/// certificate names the IP. (`servername`, to verify against another name, is not
/// supported and is refused.)
#[napi(object, object_from_js = false, object_to_js = false)]
pub struct TlsOptions {
    /// The CA certificates (PEM, one or more) trusted to sign the server's certificate, in
    /// place of the platform's roots.
    #[napi(ts_type = "string | Buffer")]
    pub ca: Option<Vec<u8>>,
    /// The client certificate (PEM, the chain leaf first) for servers with
    /// `tls-auth-clients yes`. Give `key` with it.
    #[napi(ts_type = "string | Buffer")]
    pub cert: Option<Vec<u8>>,
    /// The private key of `cert` (PEM: PKCS#8, PKCS#1 or SEC1, unencrypted).
    #[napi(ts_type = "string | Buffer")]
    pub key: Option<Vec<u8>>,
}

/// The fields of node-redis client options (Mastra's own backend's `redisOptions`) that
/// mean something here, with the same meaning, so a configuration written for Mastra's
/// backend works unchanged. Any other field is refused by name.
#[napi(object, object_from_js = false, object_to_js = false)]
pub struct RedisClientOptions {
    /// As `url`; give one of the two (the same URL in both is accepted).
    pub url: Option<String>,
    /// The ACL user, in place of one in the URL.
    pub username: Option<String>,
    /// The password, in place of one in the URL.
    pub password: Option<String>,
    /// The database number, in place of one in the URL.
    pub database: Option<u32>,
    /// The connection name, as `connectionName`.
    pub name: Option<String>,
    /// `{ tls: true }` for TLS with a `redis://` URL (as `rediss://`).
    #[napi(ts_type = "{ tls?: boolean }")]
    pub socket: Option<Value>,
}

/// Options of `new RedisLeaseProvider(options?)`.
#[napi(object, object_from_js = false, object_to_js = false)]
pub struct RedisLeaseProviderOptions {
    /// `redis://[user:pass@]host[:port][/db]`, `rediss://` for TLS, or
    /// `redis+unix:///path/to.sock` (also `unix:///path`). Default `redis://127.0.0.1:6379`.
    pub url: Option<String>,
    /// node-redis client options, as Mastra's backend takes them: `url`, `username`,
    /// `password`, `database`, `name`, `socket.tls`. Any other field throws.
    #[napi(ts_type = "RedisClientOptions")]
    pub redis_options: Option<RedisClientOptions>,
    /// CA, client certificate and key for a `rediss://` URL. Default: none (the platform's
    /// roots).
    #[napi(ts_type = "TlsOptions")]
    pub tls: Option<TlsOptions>,
    /// The name every connection gets (`CLIENT SETNAME`), to find them in `CLIENT LIST`.
    /// Default `mastra-lease`.
    pub connection_name: Option<String>,
    /// Leases live at `<keyPrefix>:lease:<key>`. Default `mastra:topic`, as in Mastra's own
    /// Redis backend, so both can share a fleet's leases.
    pub key_prefix: Option<String>,
    /// Bound on one attempt to open the connection, in milliseconds. Default 2000.
    pub connect_timeout_ms: Option<f64>,
    /// Bound on every call, connecting included, in milliseconds: a call settles within it
    /// whatever Redis does. Default 2000 (well under Mastra's 5 s renewal interval).
    pub command_timeout_ms: Option<f64>,
    /// Longest key accepted, in UTF-8 bytes. Default 4096.
    pub max_key_bytes: Option<u32>,
    /// Longest owner accepted, in UTF-8 bytes. Default 1024.
    pub max_owner_bytes: Option<u32>,
    /// Longest TTL accepted, in milliseconds. Default 86 400 000 (one day).
    pub max_ttl_ms: Option<f64>,
    /// Gets the warning when the server's eviction policy could evict leases (any policy
    /// but `noeviction` with `maxmemory` set), once per policy, and debug notes when it has
    /// `debug`. Default: none, and the warning goes to `process.emitWarning` with code
    /// `MASTRA_LEASE_EVICTION_POLICY`.
    #[napi(
        ts_type = "{ warn(message: string, fields?: Record<string, unknown>): void; debug?(message: string, fields?: Record<string, unknown>): void }"
    )]
    pub logger: Option<Value>,
}

/// Options of `new RedisStreamsPubSub(options?)`. The connection options and lease limits
/// are those of `RedisLeaseProviderOptions`.
#[napi(object, object_from_js = false, object_to_js = false)]
pub struct RedisStreamsOptions {
    /// As for `RedisLeaseProviderOptions`. Default `redis://127.0.0.1:6379`.
    pub url: Option<String>,
    /// As for `RedisLeaseProviderOptions`: node-redis client options, as Mastra's backend
    /// takes them.
    #[napi(ts_type = "RedisClientOptions")]
    pub redis_options: Option<RedisClientOptions>,
    /// CA, client certificate and key for a `rediss://` URL, for every connection. Default:
    /// none (the platform's roots).
    #[napi(ts_type = "TlsOptions")]
    pub tls: Option<TlsOptions>,
    /// The name every connection gets (`CLIENT SETNAME`). Default `mastra-lease`.
    pub connection_name: Option<String>,
    /// A topic's stream is `<keyPrefix>:<topic>`, a lease `<keyPrefix>:lease:<key>`. Default
    /// `mastra:topic`, Mastra's own layout.
    pub key_prefix: Option<String>,
    /// Bound on one attempt to open a connection, in milliseconds. Default 2000.
    pub connect_timeout_ms: Option<f64>,
    /// Bound on every non-blocking command (publish, ack, lease calls), connecting
    /// included, in milliseconds. Default 2000.
    pub command_timeout_ms: Option<f64>,
    /// How long one blocking read waits for new entries, in milliseconds. Default 1000.
    pub block_ms: Option<f64>,
    /// Most entries one read returns. Default 10.
    pub batch_count: Option<u32>,
    /// Streams are trimmed to about this many entries, never cutting one a consumer group
    /// has not settled; 0 disables trimming. Default 10000.
    pub max_stream_length: Option<f64>,
    /// Past this many entries trimming cuts unsettled entries after all, each one lost
    /// counted in a warning; 0 never does. Default 10 × `maxStreamLength`.
    pub hard_max_stream_length: Option<f64>,
    /// A stream idle this long expires; 0 (the default) never.
    pub stream_idle_ttl_ms: Option<f64>,
    /// A nacked or reclaimed event is delivered again until its `deliveryAttempt` reaches
    /// this, then dropped with a warning; 0 or `Infinity` redeliver forever. Default 5.
    pub max_delivery_attempts: Option<f64>,
    /// Most events a consumer holds unsettled (this process's consumer of a group on a
    /// topic, or one fan-out subscription); at the limit it reads no more, and the rest of a
    /// backlog stays for the group's other consumers. 0 or `Infinity` set no limit. Default
    /// 1000.
    pub max_in_flight: Option<f64>,
    /// An event held unsettled this long (its callback neither acked nor nacked it) is
    /// nacked on its behalf, with a warning: Mastra's `inFlightTimeoutMs`. 0 (the default)
    /// holds it until it is settled or the process ends.
    pub in_flight_timeout_ms: Option<f64>,
    /// How often a consumer group looks for entries a dead consumer never settled
    /// (XAUTOCLAIM), in milliseconds; 0 disables it. Default 30000.
    pub reclaim_interval_ms: Option<f64>,
    /// How long a dead consumer's entry sits unclaimed before it is reclaimed, in
    /// milliseconds. Default 60000. A live process keeps the entries it holds claimed,
    /// however long their handlers run.
    pub reclaim_idle_ms: Option<f64>,
    /// Longest lease key (and topic or group name) accepted, in UTF-8 bytes. Default 4096.
    pub max_key_bytes: Option<u32>,
    /// Longest lease owner accepted, in UTF-8 bytes. Default 1024.
    pub max_owner_bytes: Option<u32>,
    /// Longest lease TTL accepted, in milliseconds. Default 86 400 000 (one day).
    pub max_ttl_ms: Option<f64>,
    /// Gets dropped-event warnings, connection trouble (at most once per 30 s), events held
    /// unusually long, the eviction-policy warning, and debug notes when it has `debug`.
    /// Without it, the eviction-policy warning goes to `process.emitWarning`.
    #[napi(
        ts_type = "{ warn(message: string, fields?: Record<string, unknown>): void; debug?(message: string, fields?: Record<string, unknown>): void }"
    )]
    pub logger: Option<Value>,
}

/// Why options were refused: the coded error, and what a getter threw, if that was it.
pub struct OptionError {
    pub error: Error,
    pub cause: Option<Value>,
}

impl From<Error> for OptionError {
    fn from(error: Error) -> Self {
        Self { error, cause: None }
    }
}

impl OptionError {
    /// Throws it (constructors cannot answer with a promise).
    pub fn throw(self, env: Env) {
        js::throw(env, &self.error, self.cause);
    }
}

type Read<T> = Result<T, OptionError>;

/// `new MemoryLeaseProvider(options)`: its limits.
pub fn memory(env: Env, value: Option<Value>) -> Read<Limits> {
    let options = Options::new(env, value, "MemoryLeaseProvider")?;
    let limits = options.limits()?;
    options.finish()?;
    Ok(limits)
}

/// `new RedisLeaseProvider(options)`: the store's options, and the logger object.
pub fn redis_lease(env: Env, value: Option<Value>) -> Read<(RedisOptions, Option<Value>)> {
    let options = Options::new(env, value, "RedisLeaseProvider")?;
    let read = RedisOptions {
        connection: options.connection()?,
        key_prefix: options.string("keyPrefix")?.unwrap_or_else(default_prefix),
        limits: options.limits()?,
    };
    let logger = options.logger()?;
    options.finish()?;
    Ok((read, logger))
}

/// `new RedisStreamsPubSub(options)`: the transport's options (without the logger), the
/// lease limits, and the logger object.
pub fn redis_streams(
    env: Env,
    value: Option<Value>,
) -> Read<(StreamsOptions, Limits, Option<Value>)> {
    let options = Options::new(env, value, "RedisStreamsPubSub")?;
    let d = StreamsOptions::default();
    let ms = |value: Option<u64>| value.map(Duration::from_millis);
    let max_len = options
        .whole("maxStreamLength", 0, MAX_COUNT)?
        .unwrap_or(d.max_len);
    let read = StreamsOptions {
        connection: options.connection()?,
        key_prefix: options.string("keyPrefix")?.unwrap_or(d.key_prefix),
        block: ms(options.whole("blockMs", 1, MAX_TIMEOUT_MS)?).unwrap_or(d.block),
        batch_count: options
            .whole("batchCount", 1, 10_000)?
            .map_or(d.batch_count, |n| n as usize),
        max_len,
        hard_max_len: options
            .whole("hardMaxStreamLength", 0, MAX_COUNT)?
            .unwrap_or(max_len.saturating_mul(HARD_MAX_LEN_FACTOR)),
        idle_ttl: ms(options
            .whole("streamIdleTtlMs", 0, TTL_CEILING_MS)?
            .filter(|&n| n > 0)),
        max_delivery_attempts: options
            .count_or_unlimited("maxDeliveryAttempts")?
            .unwrap_or(d.max_delivery_attempts),
        max_in_flight: options
            .count_or_unlimited("maxInFlight")?
            .map_or(d.max_in_flight, |n| n.map(|n| n as usize)),
        in_flight_timeout: ms(options
            .whole("inFlightTimeoutMs", 0, TTL_CEILING_MS)?
            .filter(|&n| n > 0)),
        reclaim_interval: match options.whole("reclaimIntervalMs", 0, TTL_CEILING_MS)? {
            Some(0) => None,
            Some(n) => Some(Duration::from_millis(n)),
            None => d.reclaim_interval,
        },
        reclaim_idle: ms(options.whole("reclaimIdleMs", 1, TTL_CEILING_MS)?)
            .unwrap_or(d.reclaim_idle),
        logger: None,
    };
    let limits = options.limits()?;
    let logger = options.logger()?;
    options.finish()?;
    Ok((read, limits, logger))
}

fn default_prefix() -> String {
    RedisOptions::default().key_prefix
}

/// The largest count option accepted (stream lengths, attempts).
const MAX_COUNT: u64 = 1 << 40;
/// The longest timeout option accepted: ten minutes.
const MAX_TIMEOUT_MS: u64 = 600_000;
/// The largest byte cap accepted for keys and owners.
const MAX_TEXT_BYTES: u64 = 1 << 26;

/// What node-redis client options (`redisOptions`) hold that has no meaning here, and what
/// to use instead.
fn redis_options_instead(field: &str) -> &'static str {
    match field {
        "socket" => "socket takes only tls here",
        "RESP" => "RESP 2 is used",
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
        | "disableClientInfo" => "it does not apply to this client",
        _ => "redisOptions takes url, username, password, database, name and socket.tls",
    }
}

/// Options being read: each option read is noted, and [`Options::finish`] refuses the
/// rest.
struct Options {
    env: Env,
    object: Option<Value>,
    class: &'static str,
    read: RefCell<Vec<&'static str>>,
}

impl Options {
    fn new(env: Env, value: Option<Value>, class: &'static str) -> Read<Self> {
        let object = match value.map(|v| (v, js::type_of(env, v))) {
            None => None,
            Some((_, ValueType::napi_undefined | ValueType::napi_null)) => None,
            Some((v, ValueType::napi_object)) => Some(v),
            Some((_, kind)) => {
                return Err(Error::option(
                    InputErrorKind::Type,
                    format!("options must be an object, got {}", type_name(kind)),
                )
                .into())
            }
        };
        Ok(Self {
            env,
            object,
            class,
            read: RefCell::new(Vec::new()),
        })
    }

    /// Refuses every option of the object that was not read, naming it.
    fn finish(self) -> Read<()> {
        let Some(object) = self.object else {
            return Ok(());
        };
        let read = self.read.borrow();
        let names = js::property_names(self.env, object).map_err(|thrown| OptionError {
            error: Error::option(InputErrorKind::Type, "options: listing the options threw"),
            cause: Some(thrown),
        })?;
        for name in names {
            if read.contains(&name.as_str()) {
                continue;
            }
            let hint = match name.as_str() {
                "client" => "; a ready-made client cannot be used: this class makes its own \
                             connections in Rust. Give url (or redisOptions) instead"
                    .to_owned(),
                "inFlightTimeoutMs" | "hardMaxStreamLength" | "blockMs" | "maxStreamLength" => {
                    "; it is an option of RedisStreamsPubSub".to_owned()
                }
                _ => match closest(&name, &read) {
                    Some(near) => format!("; did you mean {near}?"),
                    None => String::new(),
                },
            };
            return Err(Error::option(
                InputErrorKind::Type,
                format!(
                    "{}: unknown option {}{hint}",
                    self.class,
                    name.escape_debug()
                ),
            )
            .into());
        }
        Ok(())
    }

    /// The property's value and type, or `None` when absent or `undefined`. A getter that
    /// throws is an error carrying what it threw.
    fn get(&self, name: &'static str) -> Read<Option<(Value, napi::sys::napi_valuetype)>> {
        self.read.borrow_mut().push(name);
        let Some(object) = self.object else {
            return Ok(None);
        };
        self.field(object, name, name)
    }

    /// `object[name]` of a nested object, labelled `label` in errors.
    fn field(
        &self,
        object: Value,
        name: &str,
        label: &str,
    ) -> Read<Option<(Value, napi::sys::napi_valuetype)>> {
        let c_name = CString::new(name)
            .map_err(|_| Error::Internal(format!("option name {name:?} holds a NUL")))?;
        let value = js::property(self.env, object, &c_name).map_err(|thrown| OptionError {
            error: Error::option(
                InputErrorKind::Type,
                format!(
                    "reading option {label} threw: {}",
                    js::describe(self.env, thrown)
                ),
            ),
            cause: Some(thrown),
        })?;
        let kind = js::type_of(self.env, value);
        Ok((kind != ValueType::napi_undefined).then_some((value, kind)))
    }

    /// The connection options: `url`, `redisOptions`, `tls`, `connectionName` and the two
    /// timeouts.
    fn connection(&self) -> Read<ConnectionOptions> {
        let d = ConnectionOptions::default();
        let url = self.string("url")?;
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
            (a, b) => a.or(b).or(d.name),
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
        if client.tls == Some(true) && tls.is_none() {
            tls = Some(CoreTls::default());
        }
        Ok(ConnectionOptions {
            url,
            username: client.username,
            password: client.password,
            database: client.database.map(i64::from),
            tls: tls.unwrap_or_default(),
            name,
            connect_timeout: self
                .whole("connectTimeoutMs", 1, MAX_TIMEOUT_MS)?
                .map_or(d.connect_timeout, Duration::from_millis),
            command_timeout: self
                .whole("commandTimeoutMs", 1, MAX_TIMEOUT_MS)?
                .map_or(d.command_timeout, Duration::from_millis),
        })
    }

    /// `redisOptions`: node-redis client options, of which the fields that mean something
    /// here are taken and any other is refused by name.
    fn redis_options(&self) -> Read<ClientFields> {
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
            let field = self.field(value, &name, &label)?;
            let Some((field, kind)) = field else { continue };
            let text = || self.text(field, kind, &label);
            match name.as_str() {
                "url" => out.url = Some(text()?),
                "username" => out.username = Some(text()?),
                "password" => out.password = Some(text()?),
                "name" => out.name = Some(text()?),
                "database" => {
                    out.database = Some(self.number_in(field, kind, &label, 0, 1 << 31)? as u32)
                }
                "socket" => out.tls = self.socket(field, kind)?,
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

    /// `redisOptions.socket`: only `tls` (a boolean) means something here.
    fn socket(&self, value: Value, kind: napi::sys::napi_valuetype) -> Read<Option<bool>> {
        if kind != ValueType::napi_object {
            return Err(Error::option(
                InputErrorKind::Type,
                format!(
                    "redisOptions.socket must be an object, got {}",
                    type_name(kind)
                ),
            )
            .into());
        }
        let mut tls = None;
        let names = js::property_names(self.env, value).map_err(|thrown| OptionError {
            error: Error::option(
                InputErrorKind::Type,
                "redisOptions.socket: listing it threw",
            ),
            cause: Some(thrown),
        })?;
        for name in names {
            let label = format!("redisOptions.socket.{}", name.escape_debug());
            let Some((field, kind)) = self.field(value, &name, &label)? else {
                continue;
            };
            match name.as_str() {
                "tls" if kind == ValueType::napi_boolean => {
                    tls = Some(js::bool_value(self.env, field))
                }
                "tls" => {
                    return Err(Error::option(
                        InputErrorKind::Type,
                        format!("{label} must be a boolean (give certificates in tls)"),
                    )
                    .into())
                }
                "host" | "port" | "path" => {
                    return Err(Error::option(
                        InputErrorKind::Type,
                        format!("{label} is not supported: give the server in url"),
                    )
                    .into())
                }
                "ca" | "cert" | "key" | "servername" | "rejectUnauthorized" => {
                    return Err(Error::option(
                        InputErrorKind::Type,
                        format!("{label} is not supported: give TLS material in the tls option"),
                    )
                    .into())
                }
                _ => {
                    return Err(Error::option(
                        InputErrorKind::Type,
                        format!("{label} is not supported: redisOptions.socket takes only tls"),
                    )
                    .into())
                }
            }
        }
        Ok(tls)
    }

    /// The lease limits: `maxKeyBytes`, `maxOwnerBytes`, `maxTtlMs`.
    fn limits(&self) -> Read<Limits> {
        let d = Limits::default();
        Ok(Limits {
            max_key_bytes: self
                .whole("maxKeyBytes", 1, MAX_TEXT_BYTES)?
                .map_or(d.max_key_bytes, |n| n as usize),
            max_owner_bytes: self
                .whole("maxOwnerBytes", 1, MAX_TEXT_BYTES)?
                .map_or(d.max_owner_bytes, |n| n as usize),
            max_ttl_ms: self
                .whole("maxTtlMs", 1, TTL_CEILING_MS)?
                .unwrap_or(d.max_ttl_ms),
        })
    }

    /// `logger`: an object with a `warn` method, and optionally `debug`. Valid during this
    /// call only.
    fn logger(&self) -> Read<Option<Value>> {
        let Some((value, kind)) = self.get("logger")? else {
            return Ok(None);
        };
        let object = matches!(kind, ValueType::napi_object | ValueType::napi_function);
        let warn = if object {
            self.field(value, "warn", "logger.warn")?
        } else {
            None
        };
        if !object || !matches!(warn, Some((_, ValueType::napi_function))) {
            return Err(Error::option(
                InputErrorKind::Type,
                "logger must have a warn(message, fields) method (and may have debug)",
            )
            .into());
        }
        match self.field(value, "debug", "logger.debug")? {
            None | Some((_, ValueType::napi_function)) => Ok(Some(value)),
            Some((_, kind)) => Err(Error::option(
                InputErrorKind::Type,
                format!("logger.debug must be a function, got {}", type_name(kind)),
            )
            .into()),
        }
    }

    /// `tls`: an object with `ca`, `cert` and `key`, each a string or a `Uint8Array` (a
    /// `Buffer`). `null` means none. Any other property is refused, so a misspelt option
    /// (or one this library does not have, like `servername` or `rejectUnauthorized`)
    /// cannot silently change what is verified.
    fn tls(&self) -> Read<Option<CoreTls>> {
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
                "ca" | "cert" | "key" => continue,
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
                    "tls.{} is not supported (tls takes ca, cert and key){why}",
                    name.escape_debug()
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
        Ok(Some(CoreTls {
            ca: pem("ca")?,
            cert: pem("cert")?,
            key: pem("key")?,
        }))
    }

    fn string(&self, name: &'static str) -> Read<Option<String>> {
        match self.get(name)? {
            Some((value, kind)) => self.text(value, kind, name).map(Some),
            None => Ok(None),
        }
    }

    /// A string option's value: well-formed UTF-16.
    fn text(&self, value: Value, kind: napi::sys::napi_valuetype, label: &str) -> Read<String> {
        if kind != ValueType::napi_string {
            return Err(Error::option(
                InputErrorKind::Type,
                format!("{label} must be a string, got {}", type_name(kind)),
            )
            .into());
        }
        js::string_value(self.env, value).map_err(|_| {
            Error::option(
                InputErrorKind::Type,
                format!("{label} must be well-formed UTF-16"),
            )
            .into()
        })
    }

    /// A whole number from `min` to `max`.
    fn whole(&self, name: &'static str, min: u64, max: u64) -> Read<Option<u64>> {
        match self.get(name)? {
            Some((value, kind)) => self.number_in(value, kind, name, min, max).map(Some),
            None => Ok(None),
        }
    }

    fn number_in(
        &self,
        value: Value,
        kind: napi::sys::napi_valuetype,
        label: &str,
        min: u64,
        max: u64,
    ) -> Read<u64> {
        if kind != ValueType::napi_number {
            return Err(Error::option(
                InputErrorKind::Type,
                format!("{label} must be a number, got {}", type_name(kind)),
            )
            .into());
        }
        let number = js::number(self.env, value);
        match safe_integer(number) {
            Some(n) if (min..=max).contains(&n) => Ok(n),
            _ => Err(Error::option(
                InputErrorKind::Range,
                format!("{label} must be a whole number from {min} to {max}, got {number}"),
            )
            .into()),
        }
    }

    /// A count where 0 and `Infinity` both mean unlimited (`Some(None)`).
    fn count_or_unlimited(&self, name: &'static str) -> Read<Option<Option<u64>>> {
        let Some((value, kind)) = self.get(name)? else {
            return Ok(None);
        };
        if kind == ValueType::napi_number && js::number(self.env, value) == f64::INFINITY {
            return Ok(Some(None));
        }
        let n = self.number_in(value, kind, name, 0, MAX_COUNT)?;
        Ok(Some((n > 0).then_some(n)))
    }
}

/// The fields of `redisOptions` that mean something here.
#[derive(Default)]
struct ClientFields {
    url: Option<String>,
    username: Option<String>,
    password: Option<String>,
    database: Option<u32>,
    name: Option<String>,
    tls: Option<bool>,
}

/// The option among `known` closest to a misspelt `name`, when it is close enough to be
/// what was meant.
fn closest<'k>(name: &str, known: &[&'k str]) -> Option<&'k str> {
    let name = name.to_ascii_lowercase();
    known
        .iter()
        .map(|k| (distance(&name, &k.to_ascii_lowercase()), *k))
        .filter(|(d, k)| *d <= 2.max(k.len() / 4))
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

/// Levenshtein distance.
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(ca != *cb));
            diagonal = above;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_misspelt_option_names_the_one_meant() {
        let known = ["url", "keyPrefix", "inFlightTimeoutMs", "reclaimIdleMs"];
        assert_eq!(closest("urll", &known), Some("url"));
        assert_eq!(closest("keyprefix", &known), Some("keyPrefix"));
        assert_eq!(
            closest("inFlightTimeoutMz", &known),
            Some("inFlightTimeoutMs")
        );
        assert_eq!(closest("somethingElse", &known), None);
        assert_eq!(distance("kitten", "sitting"), 3);
    }
}
