//! `RedisLeaseProvider`: leases in Redis, shared by every process that reaches it.

use std::sync::Arc;

use napi::bindgen_prelude::{Env, Unknown};
use napi::JsValue;
use napi_derive::napi;

use super::args;
use super::crossing::{node_loop, resolved, settled, Answers, Crossing, Queue};
use super::log::JsLog;
use super::options;
use super::reply::{LeaseStats, Reply};
use super::{runtime, unknown};
use crate::core::lease::stats::{Operation, Stats};
use crate::core::{Answer, Call, Error, RedisStore, Result, Subject};

/// Leases in Redis, one atomic Lua script and one round trip per call.
///
/// Has exactly the five methods of Mastra's `LeaseProvider`, so `isLeaseProvider()` from
/// `@mastra/core/events` is true for it. Connects on the first call; the calls made in one
/// turn of JavaScript go to Redis together in one pipelined write. Every call settles
/// within `commandTimeoutMs`.
#[napi]
pub struct RedisLeaseProvider {
    open: Option<Open>,
    /// What its calls after `close()` say is closed.
    subject: Subject,
    stats: Arc<Stats>,
}

/// What a provider holds until `close()`: its store, its way across, and the queue its lease
/// calls leave Node's thread in.
struct Open {
    store: Arc<RedisStore>,
    crossing: Arc<Crossing>,
    calls: Arc<Queue<Call>>,
}

impl Open {
    fn new(env: &Env, store: Arc<RedisStore>, stats: Arc<Stats>) -> napi::Result<Self> {
        let crossing = Crossing::new(env.raw())?;
        let batch_store = store.clone();
        let reactor = store.connection().reactor();
        let keyspace = store.connection().keyspace();
        let calls = Queue::new(&crossing, reactor, keyspace, move |calls, answers| {
            let (store, stats) = (batch_store.clone(), stats.clone());
            async move { execute(&store, &stats, calls, &answers).await }
        });
        Ok(Self {
            store,
            crossing,
            calls,
        })
    }
}

/// Runs one turn's lease calls, in the order they were made, the store pipelining them; each
/// promise is settled, and its outcome counted, as soon as the store answers its call.
async fn execute(store: &RedisStore, stats: &Stats, calls: Vec<Call>, answers: &Answers) {
    let operations: Vec<Operation> = calls.iter().map(Call::operation).collect();
    let answered = |done: Vec<(usize, Result<Answer>)>| {
        answers.answer(done.into_iter().map(|(i, answer)| {
            if let Some(&operation) = operations.get(i) {
                stats.record(operation, answer.as_ref());
            }
            (i, answer.map(Reply::Answer))
        }))
    };
    store.execute_each(calls, &answered).await;
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
        catch_unwind,
        ts_args_type = "options?: RedisLeaseProviderOptions | undefined | null"
    )]
    pub fn new(env: Env, options: Option<Unknown>) -> napi::Result<Self> {
        let raw = env.raw();
        let store = options::redis_lease(raw, options.map(|o| o.raw())).and_then(
            |(mut options, logger)| {
                let log = JsLog::logger_or_process(raw, logger)?;
                let _context = runtime()?.enter();
                options.connection.reactor = node_loop(raw);
                let connection = options.connection.clone();
                let mut store = RedisStore::new(options)?;
                store.spread_over(&connection)?;
                if let Some(log) = log {
                    store.connection().set_logger(Arc::new(log));
                }
                Ok(store)
            },
        );
        match store {
            Ok(store) => {
                let stats = Arc::<Stats>::default();
                Ok(Self {
                    open: Some(Open::new(&env, Arc::new(store), stats.clone())?),
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
            open: Some(Open::new(env, store, stats.clone())?),
            subject: Subject::StreamsPubSub,
            stats,
        })
    }

    /// Stops taking calls; later calls reject with `ERR_LEASE_CLOSED`. Calls already made
    /// still settle. Idempotent. Leases stay in Redis until they expire or are released.
    #[napi(catch_unwind, ts_return_type = "Promise<void>")]
    pub fn close<'env>(&mut self, env: &'env Env) -> Unknown<'env> {
        if let Some(open) = self.open.take() {
            // Whoever waits for a release looks once more and finds the provider closed.
            open.store.unwatch_all();
        }
        unknown(env, resolved(env.raw()))
    }

    /// Calls `onRelease()` whenever the lease on `key` may have been freed or moved: released
    /// or transferred by a provider of this package, or messages may have been missed (once
    /// the lost listening connection is back). Expiry calls nothing: set a timer at the
    /// lease's remaining TTL. Resolves the watch's id once Redis confirmed the subscription
    /// (sharded pub/sub, Redis 7.0 or later), within `commandTimeoutMs`. What
    /// `hold(…, { wait: true })` waits with; what `onRelease` throws is ignored.
    #[napi(
        catch_unwind,
        ts_args_type = "key: string, onRelease: () => void",
        ts_return_type = "Promise<number>"
    )]
    pub fn watch_release<'env>(
        &self,
        env: &'env Env,
        key: Unknown<'env>,
        on_release: Unknown<'env>,
    ) -> Unknown<'env> {
        let e = env.raw();
        let checked = (|| {
            let key = args::key(e, key.raw())?;
            let wake = args::callback(e, on_release.raw(), "onRelease")?;
            Ok((key, wake))
        })();
        let promise = match (&self.open, checked) {
            (_, Err(err)) => settled(e, Err(err)),
            (None, _) => settled(e, Err(Error::Closed(self.subject))),
            (Some(open), Ok((key, wake))) => {
                let store = open.store.clone();
                open.crossing.run(e, async move {
                    let wake = Arc::new(move || {
                        wake.call(());
                    });
                    let id = store.watch(&key, wake).await?;
                    Ok(Reply::Number(id as f64))
                })
            }
        };
        unknown(env, promise)
    }

    /// Stops the watch `watchRelease` answered `id` for; nothing once closed.
    #[napi(catch_unwind)]
    pub fn unwatch_release(&self, key: String, id: f64) {
        if let Some(open) = &self.open {
            open.store.unwatch(&key, id as u64);
        }
    }

    /// A round trip to Redis (`PING`), connecting if need be: resolves how long it took, in
    /// milliseconds; rejects like a lease call (`ERR_LEASE_TIMEOUT` within
    /// `commandTimeoutMs`, `ERR_LEASE_CONNECTION`, `ERR_LEASE_CLOSED`, ...). For a health check.
    #[napi(catch_unwind, ts_return_type = "Promise<number>")]
    pub fn ping<'env>(&self, env: &'env Env) -> Unknown<'env> {
        let e = env.raw();
        let promise = match &self.open {
            None => settled(e, Err(Error::Closed(self.subject))),
            Some(open) => {
                let store = open.store.clone();
                open.crossing.run(e, async move {
                    let took = store.connection().ping().await?;
                    Ok(Reply::Number(took.as_secs_f64() * 1000.0))
                })
            }
        };
        unknown(env, promise)
    }

    /// One page of the live leases under `keyPrefix`, for operators: `{ leases: [{ key, owner,
    /// token, ttlMs }], cursor }` (`ttlMs` `null` for a key that never expires); pass `cursor` back for the next page, until it is absent.
    /// A `SCAN` of every master (never `KEYS`), about `count` keys per page (default 1000);
    /// a lease that comes or goes meanwhile may or may not be listed. Plain reads (`GET`,
    /// `PTTL`, no script), so a read-only ACL user (`+@read`) may list. Every key is listed,
    /// one longer than `maxKeyBytes` too; a key that is not UTF-8 (written by another client)
    /// has U+FFFD in `key` and its bytes in `rawKey`. Rejects with `ERR_LEASE_INVALID_OPTION`
    /// for an unknown option or a cursor it did not answer.
    #[napi(
        catch_unwind,
        ts_args_type = "options?: ListLeasesOptions",
        ts_return_type = "Promise<{ leases: Array<LeaseState & { key: string; rawKey?: Buffer }>; cursor?: string }>"
    )]
    pub fn list_leases<'env>(
        &self,
        env: &'env Env,
        options: Option<Unknown<'env>>,
    ) -> Unknown<'env> {
        let e = env.raw();
        let promise = match (
            &self.open,
            options::list_leases(e, options.map(|o| o.raw())),
        ) {
            (_, Err(refused)) => settled(e, Err(refused.error)),
            (None, _) => settled(e, Err(Error::Closed(self.subject))),
            (Some(open), Ok((cursor, count))) => {
                let store = open.store.clone();
                open.crossing.run(e, async move {
                    Ok(Reply::Page(store.list(cursor.as_deref(), count).await?))
                })
            }
        };
        unknown(env, promise)
    }

    /// Queues a checked call for the end of this turn; a closed provider or bad input is
    /// answered at once.
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
        let promise = match (&self.open, call) {
            (None, _) => refused(Error::Closed(self.subject)),
            (Some(_), Err(err)) => refused(err),
            (Some(open), Ok(call)) => open.calls.push(e, call),
        };
        unknown(env, promise)
    }
}

/// The five methods of Mastra's `LeaseProvider` (with this package's lease records' metadata), its
/// `getLeaseRecord`, then `acquireFencedLease`, `getLease` and `stats`: each checks its
/// arguments (`args.rs`) and hands the call to `submit`.
#[napi]
impl RedisLeaseProvider {
    /// Claims `key` for `owner` (holding with `metadata`, when given) for `ttlMs`, or
    /// refreshes the TTL when that holder already holds it. Resolves `{ acquired: true, owner
    /// }`, or `{ acquired: false, owner }` with the holder's owner (the caller's own, holding
    /// with other metadata, refuses too). No fencing token: `acquireFencedLease` for one.
    #[napi(
        catch_unwind,
        ts_args_type = "key: string, owner: string, ttlMs: number, metadata?: string",
        ts_return_type = "Promise<LeaseGrant>"
    )]
    pub fn acquire_lease<'env>(
        &self,
        env: &'env Env,
        key: Unknown<'env>,
        owner: Unknown<'env>,
        ttl_ms: Unknown<'env>,
        // Not an Option: napi reads null as None, and null is bad metadata (a TypeError, as
        // in memory), not none. A left-out argument arrives as undefined.
        metadata: Unknown<'env>,
    ) -> Unknown<'env> {
        let e = env.raw();
        let values = [key.raw(), owner.raw(), ttl_ms.raw(), metadata.raw()];
        let call = args::acquire_lease(e, values, false);
        self.submit(env, Operation::AcquireLease, call)
    }

    /// The owner holding a live lease on `key`, or `undefined`.
    #[napi(
        catch_unwind,
        ts_args_type = "key: string",
        ts_return_type = "Promise<string | undefined>"
    )]
    pub fn get_lease_owner<'env>(&self, env: &'env Env, key: Unknown<'env>) -> Unknown<'env> {
        let call = args::get_lease_owner(env.raw(), key.raw());
        self.submit(env, Operation::GetLeaseOwner, call)
    }

    /// Releases the lease if `owner` holds it with `metadata` (none when left out);
    /// otherwise does nothing.
    #[napi(
        catch_unwind,
        ts_args_type = "key: string, owner: string, metadata?: string",
        ts_return_type = "Promise<void>"
    )]
    pub fn release_lease<'env>(
        &self,
        env: &'env Env,
        key: Unknown<'env>,
        owner: Unknown<'env>,
        metadata: Unknown<'env>,
    ) -> Unknown<'env> {
        let e = env.raw();
        let call = args::release_lease(e, [key.raw(), owner.raw(), metadata.raw()]);
        self.submit(env, Operation::ReleaseLease, call)
    }

    /// Extends the lease to `ttlMs` from now if `owner` still holds it with `metadata` (none
    /// when left out): `true`; `false` when it was lost. Never brings an expired lease back.
    #[napi(
        catch_unwind,
        ts_args_type = "key: string, owner: string, ttlMs: number, metadata?: string",
        ts_return_type = "Promise<boolean>"
    )]
    pub fn renew_lease<'env>(
        &self,
        env: &'env Env,
        key: Unknown<'env>,
        owner: Unknown<'env>,
        ttl_ms: Unknown<'env>,
        metadata: Unknown<'env>,
    ) -> Unknown<'env> {
        let e = env.raw();
        let values = [key.raw(), owner.raw(), ttl_ms.raw(), metadata.raw()];
        let call = args::renew_lease(e, values);
        self.submit(env, Operation::RenewLease, call)
    }

    /// Hands the lease from `fromOwner` (holding with `fromMetadata`) to `toOwner` (with
    /// `toMetadata`) with a fresh `ttlMs`, atomically and without the key ever being free:
    /// `true`; `false` when the old holder no longer held it. A lease with a fencing token
    /// gets a new one for its new holder (`getLease` tells it).
    #[napi(
        catch_unwind,
        ts_args_type = "key: string, fromOwner: string, toOwner: string, ttlMs: number, fromMetadata?: string, toMetadata?: string",
        ts_return_type = "Promise<boolean>"
    )]
    #[allow(clippy::too_many_arguments)]
    pub fn transfer_lease<'env>(
        &self,
        env: &'env Env,
        key: Unknown<'env>,
        from_owner: Unknown<'env>,
        to_owner: Unknown<'env>,
        ttl_ms: Unknown<'env>,
        from_metadata: Unknown<'env>,
        to_metadata: Unknown<'env>,
    ) -> Unknown<'env> {
        let e = env.raw();
        let values = [
            key.raw(),
            from_owner.raw(),
            to_owner.raw(),
            ttl_ms.raw(),
            from_metadata.raw(),
            to_metadata.raw(),
        ];
        self.submit(
            env,
            Operation::TransferLease,
            args::transfer_lease(e, values),
        )
    }

    /// Who holds the live lease on `key`: `{ owner, metadata? }` (`metadata` absent for
    /// none), or `undefined`: this package's lease record.
    #[napi(
        catch_unwind,
        ts_args_type = "key: string",
        ts_return_type = "Promise<LeaseRecord | undefined>"
    )]
    pub fn get_lease_record<'env>(&self, env: &'env Env, key: Unknown<'env>) -> Unknown<'env> {
        let call = args::get_lease_record(env.raw(), key.raw());
        self.submit(env, Operation::GetLeaseRecord, call)
    }

    /// `acquireLease` with a fencing token, in the same round trip: resolves `{ acquired:
    /// true, owner, token }` (`token` greater than every token granted before for the key; a
    /// refresh keeps the lease's, or takes one if it had none), or `{ acquired: false, owner,
    /// token: undefined }`.
    #[napi(
        catch_unwind,
        ts_args_type = "key: string, owner: string, ttlMs: number, metadata?: string",
        ts_return_type = "Promise<FencedLeaseGrant>"
    )]
    pub fn acquire_fenced_lease<'env>(
        &self,
        env: &'env Env,
        key: Unknown<'env>,
        owner: Unknown<'env>,
        ttl_ms: Unknown<'env>,
        metadata: Unknown<'env>,
    ) -> Unknown<'env> {
        let e = env.raw();
        let values = [key.raw(), owner.raw(), ttl_ms.raw(), metadata.raw()];
        let call = args::acquire_lease(e, values, true);
        self.submit(env, Operation::AcquireFencedLease, call)
    }

    /// The live lease on `key` whole: `{ owner, token, ttlMs }`, or `undefined`; `ttlMs` is
    /// `null` for a key that never expires (written without one by another client), `token`
    /// absent for a lease no fenced call granted. After a transfer, the new holder of a
    /// fenced lease learns its token here.
    #[napi(
        catch_unwind,
        ts_args_type = "key: string",
        ts_return_type = "Promise<LeaseState | undefined>"
    )]
    pub fn get_lease<'env>(&self, env: &'env Env, key: Unknown<'env>) -> Unknown<'env> {
        self.submit(
            env,
            Operation::GetLease,
            args::get_lease(env.raw(), key.raw()),
        )
    }

    /// What this provider's lease calls came to since it was made (closed or not):
    /// calls per method, rejections per error code, grants (acquires that left the
    /// caller holding the lease, transfers), refusals (acquires answered with another
    /// owner) and lost leases (renewals answered `false`). For a health endpoint.
    #[napi(catch_unwind)]
    pub fn stats(&self) -> LeaseStats {
        LeaseStats::from(self.stats.snapshot())
    }
}
