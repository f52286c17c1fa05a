//! Constructor options, read by hand (`reader.rs`): a wrong type or value becomes a coded
//! `TypeError`/`RangeError`, an option this class does not know is an error naming it (a
//! typo must not quietly connect somewhere else), and an option whose getter throws
//! surfaces with what it threw as `cause`. The `#[napi(object)]` structs in `types.rs` only
//! give `src/shell/native.d.ts` its documented interfaces; `tests.rs` checks that each names the
//! options its reader reads, no more and no fewer.

mod connection;
mod node_redis;
mod reader;
#[cfg(test)]
mod tests;
mod types;

use std::time::Duration;

use super::js::{self, Env, Value};
use crate::core::lease::redis::Replication;
use crate::core::lease::TTL_CEILING_MS;
use crate::core::streams::{StreamsOptions, HARD_MAX_LEN_FACTOR};
use crate::core::{Error, Limits, RedisOptions};
use reader::Options;

pub use types::{
    ClusterOptions, ListLeasesOptions, MemoryLeaseProviderOptions, NodeRedisClusterDefaults,
    NodeRedisClusterOptions, NodeRedisRootNode, RedisClientOptions, RedisLeaseProviderOptions,
    RedisSocketOptions, RedisStreamsOptions, SentinelOptions, TlsOptions,
};

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

/// Reads an options object with `body`, then refuses any option `body` did not read.
fn read<T>(
    env: Env,
    value: Option<Value>,
    class: &'static str,
    body: fn(&Options) -> Read<T>,
) -> Read<T> {
    let options = Options::new(env, value, class)?;
    let read = body(&options)?;
    options.finish()?;
    Ok(read)
}

/// What `new MemoryLeaseProvider(options)` is made of.
pub struct Memory {
    pub limits: Limits,
    /// The `clock` function, if any (valid during this call only).
    pub clock: Option<Value>,
}

/// `new MemoryLeaseProvider(options)`.
pub fn memory(env: Env, value: Option<Value>) -> Read<Memory> {
    read(env, value, "MemoryLeaseProvider", memory_options)
}

fn memory_options(options: &Options) -> Read<Memory> {
    Ok(Memory {
        clock: options.function(
            "clock",
            "a function answering milliseconds, such as () => Date.now()",
        )?,
        limits: options.limits()?,
    })
}

/// `listLeases(options)`: the cursor to go on from, and about how many keys a page scans.
pub fn list_leases(env: Env, value: Option<Value>) -> Read<(Option<String>, u32)> {
    read(env, value, "listLeases", list_leases_options)
}

fn list_leases_options(options: &Options) -> Read<(Option<String>, u32)> {
    let cursor = options.string("cursor")?;
    let count = options.whole("count", 1, 100_000)?.unwrap_or(1_000);
    Ok((cursor, count as u32))
}

/// `new RedisLeaseProvider(options)`: the store's options, and the logger object.
pub fn redis_lease(env: Env, value: Option<Value>) -> Read<(RedisOptions, Option<Value>)> {
    read(env, value, "RedisLeaseProvider", redis_lease_options)
}

fn redis_lease_options(options: &Options) -> Read<(RedisOptions, Option<Value>)> {
    let connection = options.connection()?;
    let replication = options.replication(connection.command_timeout)?;
    let read = RedisOptions {
        connection,
        key_prefix: options.string("keyPrefix")?.unwrap_or_else(default_prefix),
        limits: options.limits()?,
        replication,
    };
    let logger = options.logger()?;
    Ok((read, logger))
}

/// What `new RedisStreamsPubSub(options)` is made of.
pub struct Streams {
    /// The transport's options, without the logger.
    pub transport: StreamsOptions,
    /// The lease store's limits, and whether replicas confirm its grants.
    pub limits: Limits,
    pub replication: Option<Replication>,
    /// The logger object, if any.
    pub logger: Option<Value>,
    /// `maxDeliveryAttempts: 0` was given: unlimited, as `Infinity`, with
    /// [`ZERO_ATTEMPTS_WARNING`].
    pub zero_attempts: bool,
}

/// Mastra's backend takes `maxDeliveryAttempts: 0` as `Infinity` and warns that it does (a
/// 0 that meant "never redeliver" would otherwise redeliver forever unnoticed); so do we.
pub const ZERO_ATTEMPTS_WARNING: &str = "mastra-lease streams: maxDeliveryAttempts=0 is \
     treated as Infinity for back-compat (no cap: a nacked event is redelivered forever), as \
     Mastra's backend does; pass Infinity to disable the cap explicitly";
/// The code of [`ZERO_ATTEMPTS_WARNING`] (`process.emitWarning`'s, and the logger's `code`).
pub const ZERO_ATTEMPTS_CODE: &str = "MASTRA_LEASE_ZERO_DELIVERY_ATTEMPTS";

/// `new RedisStreamsPubSub(options)`.
pub fn redis_streams(env: Env, value: Option<Value>) -> Read<Streams> {
    read(env, value, "RedisStreamsPubSub", redis_streams_options)
}

fn redis_streams_options(options: &Options) -> Read<Streams> {
    let d = StreamsOptions::default();
    let ms = |value: Option<u64>| value.map(Duration::from_millis);
    let max_len = options
        .whole("maxStreamLength", 0, MAX_COUNT)?
        .unwrap_or(d.max_len);
    let connection = options.connection()?;
    let replication = options.replication(connection.command_timeout)?;
    let attempts = options.count_or_infinity("maxDeliveryAttempts")?;
    let transport = StreamsOptions {
        connection,
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
        max_delivery_attempts: attempts.map_or(d.max_delivery_attempts, |n| n.filter(|&n| n > 0)),
        max_in_flight: options
            .count_or_infinity("maxInFlight")?
            .map_or(d.max_in_flight, |n| {
                n.filter(|&n| n > 0).map(|n| n as usize)
            }),
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
    Ok(Streams {
        transport,
        limits,
        replication,
        logger,
        zero_attempts: attempts == Some(Some(0)),
    })
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
