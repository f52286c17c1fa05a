//! `RedisLeaseProvider`: leases in Redis, shared by every process that reaches it.

use std::sync::Arc;

use napi::bindgen_prelude::{Env, Unknown};
use napi::JsValue;
use napi_derive::napi;

use super::args;
use super::bridge::Bridge;
use super::lease_methods::lease_methods;
use super::log::JsLog;
use super::options;
use super::reply::{resolved, settled, LeaseStats, Reply};
use super::{runtime, unknown};
use crate::core::lease::stats::{Operation, Stats};
use crate::core::{Call, Error, RedisStore, Result, Subject};

/// Leases in Redis, one atomic Lua script and one round trip per call.
///
/// Has exactly the five methods of Mastra's `LeaseProvider`, so `isLeaseProvider()` from
/// `@mastra/core/events` is true for it. Connects on the first call; the calls made in one
/// turn of JavaScript go to Redis together in one pipelined write. Every call settles
/// within `commandTimeoutMs`.
#[napi]
pub struct RedisLeaseProvider {
    bridge: Option<Arc<Bridge<RedisStore>>>,
    /// What its calls after `close()` say is closed.
    subject: Subject,
    stats: Arc<Stats>,
}

#[napi]
impl RedisLeaseProvider {
    /// Checks the options and prepares the connection; nothing connects until the first
    /// call. Throws a `TypeError`/`RangeError` with code `ERR_LEASE_INVALID_OPTION` for a bad
    /// or unknown option.
    ///
    /// Once per connection (the first, and each after a reconnect) it names the connection
    /// and reads the server's eviction policy with `INFO memory`, after a call succeeded and
    /// without delaying any, and warns through `logger` (or `process.emitWarning`) if Redis
    /// could evict leases.
    #[napi(
        constructor,
        ts_args_type = "options?: RedisLeaseProviderOptions | undefined | null"
    )]
    pub fn new(env: Env, options: Option<Unknown>) -> napi::Result<Self> {
        let raw = env.raw();
        let store =
            options::redis_lease(raw, options.map(|o| o.raw())).and_then(|(options, logger)| {
                let log = JsLog::logger_or_process(raw, logger)?;
                let _context = runtime()?.enter();
                let store = RedisStore::new(options)?;
                if let Some(log) = log {
                    store.connection().set_logger(Arc::new(log));
                }
                Ok(store)
            });
        match store {
            Ok(store) => {
                let stats = Arc::<Stats>::default();
                Ok(Self {
                    bridge: Some(Bridge::new(raw, Arc::new(store), stats.clone())?),
                    subject: Subject::LeaseProvider,
                    stats,
                })
            }
            Err(err) => {
                err.throw(raw);
                Err(napi::Error::from_status(napi::Status::PendingException))
            }
        }
    }

    /// A provider over a store that already exists (the one sharing a streams transport's
    /// connection): its calls after `close()` say the streams pubsub is closed.
    pub(super) fn over(env: &Env, store: Arc<RedisStore>) -> napi::Result<Self> {
        let stats = Arc::<Stats>::default();
        Ok(Self {
            bridge: Some(Bridge::new(env.raw(), store, stats.clone())?),
            subject: Subject::StreamsPubSub,
            stats,
        })
    }

    /// Stops taking calls; later calls reject with `ERR_LEASE_CLOSED`. Calls already made
    /// still settle. Idempotent. Leases stay in Redis until they expire or are released.
    #[napi(catch_unwind, ts_return_type = "Promise<void>")]
    pub fn close<'env>(&mut self, env: &'env Env) -> Unknown<'env> {
        self.bridge = None;
        unknown(env, resolved(env.raw()))
    }

    /// A round trip to Redis (`PING`), connecting if need be: resolves how long it took, in
    /// milliseconds; rejects like a lease call (`ERR_LEASE_TIMEOUT` within
    /// `commandTimeoutMs`, `ERR_LEASE_CONNECTION`, `ERR_LEASE_CLOSED`, ...). For a health check.
    #[napi(catch_unwind, ts_return_type = "Promise<number>")]
    pub fn ping<'env>(&self, env: &'env Env) -> Unknown<'env> {
        let e = env.raw();
        let promise = match &self.bridge {
            None => settled(e, Err(Error::Closed(self.subject))),
            Some(bridge) => {
                let store = bridge.store().clone();
                bridge.spawn(e, async move {
                    let took = store.connection().ping().await?;
                    Ok(Reply::Number(took.as_secs_f64() * 1000.0))
                })
            }
        };
        unknown(env, promise)
    }

    /// Hands a checked call to the bridge; a closed provider or bad input is answered at once.
    fn submit<'env>(
        &self,
        env: &'env Env,
        operation: Operation,
        call: Result<Call>,
    ) -> Unknown<'env> {
        let e = env.raw();
        let refused = |err: Error| {
            self.stats.record(operation, Err(&err));
            settled(e, Err(err))
        };
        let promise = match (&self.bridge, call) {
            (None, _) => refused(Error::Closed(self.subject)),
            (Some(_), Err(err)) => refused(err),
            (Some(bridge), Ok(call)) => bridge.submit(e, operation, call),
        };
        unknown(env, promise)
    }
}

lease_methods!(RedisLeaseProvider);
