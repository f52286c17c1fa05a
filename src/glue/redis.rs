//! `RedisLeaseProvider`: leases in Redis, shared by every process that reaches it.

use std::future::Future;
use std::sync::Arc;

use futures::FutureExt;
use napi::bindgen_prelude::{Env, Unknown};
use napi::JsValue;
use napi_derive::napi;

use super::args;
use super::bridge::Bridge;
use super::js::{self, Value};
use super::options::RedisLeaseProviderOptions;
use super::reply::{panic_message, IntoJs, Outcome, Reply};
use super::runtime;
use crate::core::{LeaseError, RedisStore, Result};

/// Leases in Redis, one atomic Lua script and one round trip per call.
///
/// Has exactly the five methods of Mastra's `LeaseProvider`, so `isLeaseProvider()` from
/// `@mastra/core/events` is true for it. Connects on the first call; calls made together
/// are pipelined on one connection. Every call settles within `commandTimeoutMs`.
#[napi]
pub struct RedisLeaseProvider {
    store: Option<Arc<RedisStore>>,
    bridge: Arc<Bridge>,
}

#[napi]
impl RedisLeaseProvider {
    /// Checks the options and prepares the connection; nothing connects until the first
    /// call. Throws a `TypeError`/`RangeError` with code `ERR_LEASE_INVALID_OPTION`.
    #[napi(
        constructor,
        ts_args_type = "options?: RedisLeaseProviderOptions | undefined | null"
    )]
    pub fn new(env: Env, options: Option<Unknown>) -> napi::Result<Self> {
        let raw = env.raw();
        let store =
            RedisLeaseProviderOptions::read(raw, options.map(|o| o.raw())).and_then(|options| {
                let _context = runtime()?.enter();
                RedisStore::new(options.into_core())
            });
        match store {
            Ok(store) => Ok(Self {
                store: Some(Arc::new(store)),
                bridge: Bridge::new(raw)?,
            }),
            Err(err) => {
                js::throw(raw, &err);
                Err(napi::Error::from_status(napi::Status::PendingException))
            }
        }
    }

    /// Claims `key` for `owner` for `ttlMs`, or refreshes the TTL when `owner` already holds
    /// it. Resolves `{ acquired: true, owner }`, or `{ acquired: false, owner: holder }`.
    #[napi(
        ts_args_type = "key: string, owner: string, ttlMs: number",
        ts_return_type = "Promise<LeaseGrant>"
    )]
    pub fn acquire_lease<'env>(
        &self,
        env: &'env Env,
        key: Unknown<'env>,
        owner: Unknown<'env>,
        ttl_ms: Unknown<'env>,
    ) -> Unknown<'env> {
        let e = env.raw();
        let input = (|| {
            Ok((
                args::key(e, key.raw())?,
                args::owner(e, owner.raw(), "owner")?,
                args::ttl(e, ttl_ms.raw())?,
            ))
        })();
        self.call(env, input, |store, (key, owner, ttl)| async move {
            store.acquire(&key, &owner, ttl).await.map(Reply::Grant)
        })
    }

    /// The owner holding a live lease on `key`, or `undefined`.
    #[napi(
        ts_args_type = "key: string",
        ts_return_type = "Promise<string | undefined>"
    )]
    pub fn get_lease_owner<'env>(&self, env: &'env Env, key: Unknown<'env>) -> Unknown<'env> {
        let input = args::key(env.raw(), key.raw());
        self.call(env, input, |store, key| async move {
            store.owner(&key).await.map(Reply::Owner)
        })
    }

    /// Releases the lease if `owner` holds it; otherwise does nothing.
    #[napi(
        ts_args_type = "key: string, owner: string",
        ts_return_type = "Promise<void>"
    )]
    pub fn release_lease<'env>(
        &self,
        env: &'env Env,
        key: Unknown<'env>,
        owner: Unknown<'env>,
    ) -> Unknown<'env> {
        let e = env.raw();
        let input = (|| {
            Ok((
                args::key(e, key.raw())?,
                args::owner(e, owner.raw(), "owner")?,
            ))
        })();
        self.call(env, input, |store, (key, owner)| async move {
            store.release(&key, &owner).await.map(|_| Reply::Nothing)
        })
    }

    /// Extends the lease to `ttlMs` from now if `owner` still holds it: `true`; `false` when
    /// it was lost. Never brings an expired lease back.
    #[napi(
        ts_args_type = "key: string, owner: string, ttlMs: number",
        ts_return_type = "Promise<boolean>"
    )]
    pub fn renew_lease<'env>(
        &self,
        env: &'env Env,
        key: Unknown<'env>,
        owner: Unknown<'env>,
        ttl_ms: Unknown<'env>,
    ) -> Unknown<'env> {
        let e = env.raw();
        let input = (|| {
            Ok((
                args::key(e, key.raw())?,
                args::owner(e, owner.raw(), "owner")?,
                args::ttl(e, ttl_ms.raw())?,
            ))
        })();
        self.call(env, input, |store, (key, owner, ttl)| async move {
            store.renew(&key, &owner, ttl).await.map(Reply::Done)
        })
    }

    /// Hands the lease from `fromOwner` to `toOwner` with a fresh `ttlMs`, atomically and
    /// without the key ever being free: `true`; `false` when `fromOwner` no longer held it.
    #[napi(
        ts_args_type = "key: string, fromOwner: string, toOwner: string, ttlMs: number",
        ts_return_type = "Promise<boolean>"
    )]
    pub fn transfer_lease<'env>(
        &self,
        env: &'env Env,
        key: Unknown<'env>,
        from_owner: Unknown<'env>,
        to_owner: Unknown<'env>,
        ttl_ms: Unknown<'env>,
    ) -> Unknown<'env> {
        let e = env.raw();
        let input = (|| {
            Ok((
                args::key(e, key.raw())?,
                args::owner(e, from_owner.raw(), "fromOwner")?,
                args::owner(e, to_owner.raw(), "toOwner")?,
                args::ttl(e, ttl_ms.raw())?,
            ))
        })();
        self.call(env, input, |store, (key, from, to, ttl)| async move {
            store.transfer(&key, &from, &to, ttl).await.map(Reply::Done)
        })
    }

    /// Stops taking calls; later calls reject with `ERR_LEASE_CLOSED`. Calls already made
    /// still settle. Idempotent. Leases stay in Redis until they expire or are released.
    #[napi(ts_return_type = "Promise<void>")]
    pub fn close<'env>(&mut self, env: &'env Env) -> Unknown<'env> {
        self.store = None;
        settled(env, Ok(Reply::Nothing))
    }

    /// Checks nothing is closed, then runs `op` on the runtime; its outcome comes back
    /// through the provider's bridge. Bad input and a closed provider are answered at once.
    fn call<'env, A, F, Fut>(&self, env: &'env Env, input: Result<A>, op: F) -> Unknown<'env>
    where
        A: Send + 'static,
        F: FnOnce(Arc<RedisStore>, A) -> Fut + Send + 'static,
        Fut: Future<Output = Outcome> + Send + 'static,
    {
        let Some(store) = self.store.clone() else {
            return settled(env, Err(LeaseError::Closed));
        };
        let (input, runtime) = match input.and_then(|input| Ok((input, runtime()?))) {
            Ok(ready) => ready,
            Err(err) => return settled(env, Err(err)),
        };
        let (deferred, promise) = js::promise(env.raw());
        self.bridge.begin(env.raw());
        let bridge = self.bridge.clone();
        runtime.spawn(async move {
            let outcome = std::panic::AssertUnwindSafe(op(store, input))
                .catch_unwind()
                .await
                .unwrap_or_else(|panic| Err(LeaseError::Internal(panic_message(panic.as_ref()))));
            bridge.complete(deferred, outcome);
        });
        unknown(env, promise)
    }
}

/// A promise already settled with `outcome`.
pub(super) fn settled<'env>(env: &'env Env, outcome: Outcome) -> Unknown<'env> {
    let (deferred, promise) = js::promise(env.raw());
    js::settle(env.raw(), deferred, outcome.into_js(env.raw()));
    unknown(env, promise)
}

pub(super) fn unknown<'env>(env: &'env Env, value: Value) -> Unknown<'env> {
    // SAFETY: value was made on this thread in this call's handle scope.
    unsafe { Unknown::from_raw_unchecked(env.raw(), value) }
}
