//! Constructor options: read by hand, so a wrong type or value becomes a coded
//! `TypeError`/`RangeError` instead of a generic conversion error. The `#[napi(object)]`
//! structs give `index.d.ts` its documented interfaces.

use std::ffi::CStr;
use std::time::Duration;

use napi::sys::ValueType;
use napi_derive::napi;

use super::args::{safe_integer, type_name};
use super::js::{self, Env, Value};
use crate::core::connection::TlsOptions as CoreTls;
use crate::core::lease::TTL_CEILING_MS;
use crate::core::streams::StreamsOptions;
use crate::core::{InputErrorKind, LeaseError, Limits, RedisOptions, Result};

/// Options of `new MemoryLeaseProvider(options?)`.
#[napi(object)]
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

impl TlsOptions {
    fn into_core(self) -> CoreTls {
        CoreTls {
            ca: self.ca,
            cert: self.cert,
            key: self.key,
        }
    }
}

/// Options of `new RedisLeaseProvider(options?)`.
#[napi(object, object_from_js = false, object_to_js = false)]
pub struct RedisLeaseProviderOptions {
    /// `redis://[user:pass@]host[:port][/db]`, `rediss://` for TLS, or
    /// `redis+unix:///path/to.sock` (also `unix:///path`). Default `redis://127.0.0.1:6379`.
    pub url: Option<String>,
    /// CA, client certificate and key for a `rediss://` URL. Default: none (the platform's
    /// roots).
    #[napi(ts_type = "TlsOptions")]
    pub tls: Option<TlsOptions>,
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
    /// but `noeviction` with `maxmemory` set), once per policy, and a debug note when the
    /// policy cannot be read. Anything with `warn(message, fields)` and
    /// `debug(message, fields)`, as Mastra's logger. Default: none, and the warning goes to
    /// `process.emitWarning` with code `MASTRA_LEASE_EVICTION_POLICY`.
    #[napi(
        ts_type = "{ warn(message: string, fields?: Record<string, unknown>): void; debug(message: string, fields?: Record<string, unknown>): void }"
    )]
    pub logger: Option<Value>,
}

/// Options of the Redis Streams transport underneath `RedisStreamsPubSub`. Lease limits are
/// those of `RedisLeaseProviderOptions`.
#[napi(object, object_from_js = false, object_to_js = false)]
pub struct RedisStreamsOptions {
    /// As for `RedisLeaseProviderOptions`. Default `redis://127.0.0.1:6379`.
    pub url: Option<String>,
    /// CA, client certificate and key for a `rediss://` URL, for the publishing, reading
    /// and lease connections alike. Default: none (the platform's roots).
    #[napi(ts_type = "TlsOptions")]
    pub tls: Option<TlsOptions>,
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
    /// Streams are trimmed to about this many entries (`MAXLEN ~`); 0 disables trimming.
    /// Default 10000.
    pub max_stream_length: Option<f64>,
    /// A stream idle this long expires; 0 (the default) never.
    pub stream_idle_ttl_ms: Option<f64>,
    /// A nacked or reclaimed event is delivered again until its `deliveryAttempt` reaches
    /// this, then dropped with a warning; 0 or `Infinity` redeliver forever. Default 5.
    pub max_delivery_attempts: Option<f64>,
    /// Most events one subscription holds unsettled (read, and not yet acked, nacked, or
    /// let go by a callback that returned); at the limit it reads no more, and the rest of a
    /// backlog stays for the group's other consumers. 0 or `Infinity` set no limit. Default
    /// 1000.
    pub max_in_flight: Option<f64>,
    /// How often a consumer group looks for entries a crashed consumer never settled
    /// (XAUTOCLAIM), in milliseconds; 0 disables it. Default 30000.
    pub reclaim_interval_ms: Option<f64>,
    /// How long an entry sits unsettled before it is reclaimed, in milliseconds. Default
    /// 60000. An event whose callback is still running is kept claimed, however long it
    /// runs: this bounds how soon a dead consumer's events move to a live one.
    pub reclaim_idle_ms: Option<f64>,
    /// Longest lease key accepted, in UTF-8 bytes. Default 4096.
    pub max_key_bytes: Option<u32>,
    /// Longest lease owner accepted, in UTF-8 bytes. Default 1024.
    pub max_owner_bytes: Option<u32>,
    /// Longest lease TTL accepted, in milliseconds. Default 86 400 000 (one day).
    pub max_ttl_ms: Option<f64>,
}

impl RedisStreamsOptions {
    /// Reads the options object (`undefined` and `null` mean all defaults).
    pub fn read(env: Env, value: Option<Value>) -> Result<Self> {
        let reader = Reader::new(env, value)?;
        Ok(Self {
            url: reader.string(c"url")?,
            tls: reader.tls()?,
            key_prefix: reader.string(c"keyPrefix")?,
            connect_timeout_ms: reader.millis(c"connectTimeoutMs", MAX_TIMEOUT_MS)?,
            command_timeout_ms: reader.millis(c"commandTimeoutMs", MAX_TIMEOUT_MS)?,
            block_ms: reader.millis(c"blockMs", MAX_TIMEOUT_MS)?,
            batch_count: reader
                .whole_from(c"batchCount", 1, 10_000)?
                .map(|n| n as u32),
            max_stream_length: reader
                .whole_from(c"maxStreamLength", 0, MAX_COUNT)?
                .map(|n| n as f64),
            stream_idle_ttl_ms: reader
                .whole_from(c"streamIdleTtlMs", 0, TTL_CEILING_MS)?
                .map(|n| n as f64),
            max_delivery_attempts: reader.count_or_unlimited(c"maxDeliveryAttempts")?,
            max_in_flight: reader.count_or_unlimited(c"maxInFlight")?,
            reclaim_interval_ms: reader
                .whole_from(c"reclaimIntervalMs", 0, TTL_CEILING_MS)?
                .map(|n| n as f64),
            reclaim_idle_ms: reader.millis(c"reclaimIdleMs", TTL_CEILING_MS)?,
            max_key_bytes: reader.count(c"maxKeyBytes")?,
            max_owner_bytes: reader.count(c"maxOwnerBytes")?,
            max_ttl_ms: reader.millis(c"maxTtlMs", TTL_CEILING_MS)?,
        })
    }

    /// The core's transport options (defaults filled in) and the lease limits.
    pub fn into_core(self) -> (StreamsOptions, Limits) {
        let d = StreamsOptions::default();
        let ms = |v: Option<f64>, default: Duration| {
            v.map_or(default, |ms| Duration::from_millis(ms as u64))
        };
        let limits = limits(self.max_key_bytes, self.max_owner_bytes, self.max_ttl_ms);
        let options = StreamsOptions {
            url: self.url.unwrap_or(d.url),
            tls: self.tls.map_or(d.tls, TlsOptions::into_core),
            key_prefix: self.key_prefix.unwrap_or(d.key_prefix),
            connect_timeout: ms(self.connect_timeout_ms, d.connect_timeout),
            command_timeout: ms(self.command_timeout_ms, d.command_timeout),
            block: ms(self.block_ms, d.block),
            batch_count: self.batch_count.map_or(d.batch_count, |n| n as usize),
            max_len: self.max_stream_length.map_or(d.max_len, |n| n as u64),
            idle_ttl: match self.stream_idle_ttl_ms {
                Some(ms) if ms > 0.0 => Some(Duration::from_millis(ms as u64)),
                Some(_) => None,
                None => d.idle_ttl,
            },
            max_delivery_attempts: match self.max_delivery_attempts {
                Some(n) if n > 0.0 => Some(n as u64),
                Some(_) => None,
                None => d.max_delivery_attempts,
            },
            max_in_flight: match self.max_in_flight {
                Some(n) if n > 0.0 => Some(n as usize),
                Some(_) => None,
                None => d.max_in_flight,
            },
            reclaim_interval: match self.reclaim_interval_ms {
                Some(ms) if ms > 0.0 => Some(Duration::from_millis(ms as u64)),
                Some(_) => None,
                None => d.reclaim_interval,
            },
            reclaim_idle: ms(self.reclaim_idle_ms, d.reclaim_idle),
            logger: None,
        };
        (options, limits)
    }
}

/// The largest count option accepted (stream lengths, attempts).
const MAX_COUNT: u64 = 1 << 40;

/// The longest timeout option accepted: ten minutes.
const MAX_TIMEOUT_MS: u64 = 600_000;
/// The largest byte cap accepted for keys and owners.
const MAX_TEXT_BYTES: u64 = 1 << 26;

impl MemoryLeaseProviderOptions {
    /// Reads the options object (`undefined` and `null` mean all defaults).
    pub fn read(env: Env, value: Option<Value>) -> Result<Self> {
        let reader = Reader::new(env, value)?;
        Ok(Self {
            max_key_bytes: reader.count(c"maxKeyBytes")?,
            max_owner_bytes: reader.count(c"maxOwnerBytes")?,
            max_ttl_ms: reader.millis(c"maxTtlMs", TTL_CEILING_MS)?,
        })
    }

    /// The core's limits, defaults filled in.
    pub fn limits(&self) -> Limits {
        limits(self.max_key_bytes, self.max_owner_bytes, self.max_ttl_ms)
    }
}

impl RedisLeaseProviderOptions {
    /// Reads the options object (`undefined` and `null` mean all defaults).
    pub fn read(env: Env, value: Option<Value>) -> Result<Self> {
        let reader = Reader::new(env, value)?;
        Ok(Self {
            url: reader.string(c"url")?,
            tls: reader.tls()?,
            key_prefix: reader.string(c"keyPrefix")?,
            connect_timeout_ms: reader.millis(c"connectTimeoutMs", MAX_TIMEOUT_MS)?,
            command_timeout_ms: reader.millis(c"commandTimeoutMs", MAX_TIMEOUT_MS)?,
            max_key_bytes: reader.count(c"maxKeyBytes")?,
            max_owner_bytes: reader.count(c"maxOwnerBytes")?,
            max_ttl_ms: reader.millis(c"maxTtlMs", TTL_CEILING_MS)?,
            logger: reader.logger()?,
        })
    }

    /// The core's options, defaults filled in.
    pub fn into_core(self) -> RedisOptions {
        let defaults = RedisOptions::default();
        let ms = |value: Option<f64>, default: Duration| {
            value.map_or(default, |ms| Duration::from_millis(ms as u64))
        };
        RedisOptions {
            limits: limits(self.max_key_bytes, self.max_owner_bytes, self.max_ttl_ms),
            url: self.url.unwrap_or(defaults.url),
            tls: self.tls.map_or(defaults.tls, TlsOptions::into_core),
            key_prefix: self.key_prefix.unwrap_or(defaults.key_prefix),
            connect_timeout: ms(self.connect_timeout_ms, defaults.connect_timeout),
            command_timeout: ms(self.command_timeout_ms, defaults.command_timeout),
        }
    }
}

fn limits(key: Option<u32>, owner: Option<u32>, ttl: Option<f64>) -> Limits {
    let defaults = Limits::default();
    Limits {
        max_key_bytes: key.map_or(defaults.max_key_bytes, |n| n as usize),
        max_owner_bytes: owner.map_or(defaults.max_owner_bytes, |n| n as usize),
        max_ttl_ms: ttl.map_or(defaults.max_ttl_ms, |ms| ms as u64),
    }
}

/// Reads optional properties of an options object, checking each.
struct Reader {
    env: Env,
    object: Option<Value>,
}

impl Reader {
    fn new(env: Env, value: Option<Value>) -> Result<Self> {
        let object = match value.map(|v| (v, js::type_of(env, v))) {
            None => None,
            Some((_, ValueType::napi_undefined | ValueType::napi_null)) => None,
            Some((v, ValueType::napi_object)) => Some(v),
            Some((_, kind)) => {
                return Err(LeaseError::option(
                    InputErrorKind::Type,
                    format!("options must be an object, got {}", type_name(kind)),
                ))
            }
        };
        Ok(Self { env, object })
    }

    /// The property's value and type, or `None` when absent or `undefined`.
    fn get(&self, name: &CStr) -> Option<(Value, napi::sys::napi_valuetype)> {
        let object = self.object?;
        let value = js::property(self.env, object, name);
        let kind = js::type_of(self.env, value);
        (kind != ValueType::napi_undefined).then_some((value, kind))
    }

    /// `logger`: an object with `warn` and `debug` methods, valid during this call only.
    fn logger(&self) -> Result<Option<Value>> {
        let Some((value, kind)) = self.get(c"logger") else {
            return Ok(None);
        };
        let method = |name: &CStr| {
            js::type_of(self.env, js::property(self.env, value, name)) == ValueType::napi_function
        };
        let object = matches!(kind, ValueType::napi_object | ValueType::napi_function);
        if kind == ValueType::napi_null || !(object && method(c"warn") && method(c"debug")) {
            return Err(LeaseError::option(
                InputErrorKind::Type,
                "logger must have debug(message, fields) and warn(message, fields) methods",
            ));
        }
        Ok(Some(value))
    }

    /// `tls`: an object with `ca`, `cert` and `key`, each a string or a `Uint8Array` (a
    /// `Buffer`). `null` means none. Any other property is refused, so a misspelt option
    /// (or one this library does not have, like `servername` or `rejectUnauthorized`)
    /// cannot silently change what is verified.
    fn tls(&self) -> Result<Option<TlsOptions>> {
        let Some((value, kind)) = self.get(c"tls") else {
            return Ok(None);
        };
        match kind {
            ValueType::napi_null => return Ok(None),
            ValueType::napi_object => {}
            _ => {
                return Err(LeaseError::option(
                    InputErrorKind::Type,
                    format!("tls must be an object, got {}", type_name(kind)),
                ))
            }
        }
        for name in js::property_names(self.env, value) {
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
            return Err(LeaseError::option(
                InputErrorKind::Type,
                format!(
                    "tls.{} is not supported (tls takes ca, cert and key){why}",
                    name.escape_debug()
                ),
            ));
        }
        let pem = |name: &CStr| -> Result<Option<Vec<u8>>> {
            let field = js::property(self.env, value, name);
            let label = name.to_string_lossy();
            match js::type_of(self.env, field) {
                ValueType::napi_undefined => Ok(None),
                ValueType::napi_string => js::string_value(self.env, field)
                    .map(|text| Some(text.into_bytes()))
                    .map_err(|_| {
                        LeaseError::option(
                            InputErrorKind::Type,
                            format!("tls.{label} must be well-formed UTF-16"),
                        )
                    }),
                kind => js::uint8_bytes(self.env, field).map(Some).ok_or_else(|| {
                    LeaseError::option(
                        InputErrorKind::Type,
                        format!(
                            "tls.{label} must be a PEM string or Buffer, got {}",
                            type_name(kind)
                        ),
                    )
                }),
            }
        };
        Ok(Some(TlsOptions {
            ca: pem(c"ca")?,
            cert: pem(c"cert")?,
            key: pem(c"key")?,
        }))
    }

    fn string(&self, name: &CStr) -> Result<Option<String>> {
        let Some((value, kind)) = self.get(name) else {
            return Ok(None);
        };
        let label = name.to_string_lossy();
        if kind != ValueType::napi_string {
            return Err(LeaseError::option(
                InputErrorKind::Type,
                format!("{label} must be a string, got {}", type_name(kind)),
            ));
        }
        js::string_value(self.env, value).map(Some).map_err(|_| {
            LeaseError::option(
                InputErrorKind::Type,
                format!("{label} must be well-formed UTF-16"),
            )
        })
    }

    /// A whole number of milliseconds from 1 to `max`.
    fn millis(&self, name: &CStr, max: u64) -> Result<Option<f64>> {
        self.whole(name, max).map(|n| n.map(|n| n as f64))
    }

    /// A byte count from 1 to 64 MiB.
    fn count(&self, name: &CStr) -> Result<Option<u32>> {
        self.whole(name, MAX_TEXT_BYTES)
            .map(|n| n.map(|n| n as u32))
    }

    fn whole(&self, name: &CStr, max: u64) -> Result<Option<u64>> {
        self.whole_from(name, 1, max)
    }

    /// A whole number from `min` to `max`.
    /// A count where 0 and `Infinity` both mean unlimited (answered as 0).
    fn count_or_unlimited(&self, name: &CStr) -> Result<Option<f64>> {
        if let Some((value, ValueType::napi_number)) = self.get(name) {
            if js::number(self.env, value) == f64::INFINITY {
                return Ok(Some(0.0));
            }
        }
        Ok(self.whole_from(name, 0, MAX_COUNT)?.map(|n| n as f64))
    }

    fn whole_from(&self, name: &CStr, min: u64, max: u64) -> Result<Option<u64>> {
        let Some((value, kind)) = self.get(name) else {
            return Ok(None);
        };
        let label = name.to_string_lossy();
        if kind != ValueType::napi_number {
            return Err(LeaseError::option(
                InputErrorKind::Type,
                format!("{label} must be a number, got {}", type_name(kind)),
            ));
        }
        let number = js::number(self.env, value);
        match safe_integer(number) {
            Some(n) if (min..=max).contains(&n) => Ok(Some(n)),
            _ => Err(LeaseError::option(
                InputErrorKind::Range,
                format!("{label} must be a whole number from {min} to {max}, got {number}"),
            )),
        }
    }
}
