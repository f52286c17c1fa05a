//! What a finished lease call hands back to JavaScript.

use super::js::{self, Env, Value};
use crate::core::lease::Page;
use crate::core::{Answer, Error, Result};

/// What a finished call hands back: a lease answer, or a plain value.
pub enum Reply {
    /// One of the five lease operations.
    Answer(Answer),
    /// `undefined` (`close()`, `flush()`, `publish()`, ...).
    Undefined,
    /// A number (a subscription's id).
    Number(f64),
    /// A page of `listLeases`.
    Page(Page),
}

/// A finished call: its reply, or the error to reject with.
pub type Outcome = Result<Reply>;

/// Turns an outcome into the value to resolve or reject with (on the JavaScript thread).
/// `releaseLease` resolves `undefined`, as Mastra's contract says.
pub fn to_js(env: Env, outcome: Outcome) -> std::result::Result<Value, Value> {
    match outcome {
        Ok(Reply::Answer(Answer::Grant(grant))) => {
            let owner = js::string_or_undefined(env, grant.owner.as_deref());
            let token = grant.fenced.then_some(grant.token);
            Ok(js::grant(env, grant.acquired, owner, token))
        }
        Ok(Reply::Answer(Answer::Owner(owner))) => {
            Ok(js::string_or_undefined(env, owner.as_deref()))
        }
        Ok(Reply::Answer(Answer::Lease(lease))) => Ok(match lease {
            Some(lease) => js::lease(env, &lease.owner, lease.token, lease.ttl_ms),
            None => js::undefined(env),
        }),
        Ok(Reply::Answer(Answer::Record(record))) => Ok(match record {
            Some(holder) => js::record(env, &holder),
            None => js::undefined(env),
        }),
        Ok(Reply::Answer(Answer::Released(_)) | Reply::Undefined) => Ok(js::undefined(env)),
        Ok(Reply::Number(n)) => Ok(js::number_value(env, n)),
        Ok(Reply::Page(page)) => Ok(js::page(env, &page)),
        Ok(Reply::Answer(Answer::Renewed(done) | Answer::Transferred(done))) => {
            Ok(js::boolean(env, done))
        }
        Err(err) => Err(js::error(env, &err)),
    }
}

/// A promise already settled with `outcome`.
pub fn settled(env: Env, outcome: Outcome) -> Value {
    let (deferred, promise) = js::promise(env);
    js::settle(env, deferred, to_js(env, outcome));
    promise
}

/// A promise already resolved with `undefined` (what `close()` answers).
pub fn resolved(env: Env) -> Value {
    let (deferred, promise) = js::promise(env);
    js::settle(env, deferred, Ok(js::undefined(env)));
    promise
}

/// Awaits `work` on the runtime, turning a panic into an internal error so it never tears
/// down the task that would have answered the caller.
pub async fn guarded<T>(work: impl std::future::Future<Output = Result<T>>) -> Result<T> {
    use futures::FutureExt;
    std::panic::AssertUnwindSafe(work)
        .catch_unwind()
        .await
        .unwrap_or_else(|panic| Err(Error::Internal(panic_message(panic.as_ref()))))
}

/// Runs `f`, turning a panic into an internal error so it never unwinds into Node.
pub fn catching<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
        .unwrap_or_else(|panic| Err(Error::Internal(panic_message(panic.as_ref()))))
}

/// The text of a caught panic.
pub fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned())
}

/// What `acquireLease` resolves to, Mastra's shape exactly.
#[napi_derive::napi(object)]
pub struct LeaseGrant {
    /// `true` when the caller holds the lease after the call.
    pub acquired: bool,
    /// The holder: the caller when `acquired`, otherwise the owner to route work to (which
    /// may be the caller's own owner id, holding with other metadata).
    pub owner: Option<String>,
}

/// What `acquireFencedLease` resolves to.
#[napi_derive::napi(object)]
pub struct FencedLeaseGrant {
    /// `true` when the caller holds the lease after the call.
    pub acquired: bool,
    /// The holder: the caller when `acquired`, otherwise the owner to route work to.
    pub owner: Option<String>,
    /// When `acquired`: the lease's fencing token, a safe integer greater than every token
    /// granted before for the key (a refresh by the holder keeps it). Hand it to the
    /// resource the lease guards, which refuses writes carrying a lower one.
    pub token: Option<f64>,
}

/// What `getLeaseRecord` resolves to for a live lease: who holds it.
#[napi_derive::napi(object)]
pub struct LeaseRecord {
    /// The owner.
    pub owner: String,
    /// The metadata it holds the lease with; absent for none.
    pub metadata: Option<String>,
}

/// What `getLease` resolves to for a live lease.
#[napi_derive::napi(object)]
pub struct LeaseState {
    /// The holder.
    pub owner: String,
    /// Its fencing token (absent for a lease no fenced call granted: one `acquireLease` took,
    /// or another client wrote, until its holder calls `acquireFencedLease`).
    pub token: Option<f64>,
    /// Milliseconds left before it expires; `null` for a key that never expires (one written
    /// without an expiry by another client, e.g. a raw `SET`), which only a release or a
    /// deletion ends.
    pub ttl_ms: napi::Either<f64, napi::bindgen_prelude::Null>,
}

/// Calls made per lease method.
#[napi_derive::napi(object)]
pub struct LeaseCalls {
    pub acquire_lease: f64,
    pub get_lease_owner: f64,
    pub release_lease: f64,
    pub renew_lease: f64,
    pub transfer_lease: f64,
    pub acquire_fenced_lease: f64,
    pub get_lease: f64,
    pub get_lease_record: f64,
}

/// What `stats()` returns: a provider's lease calls since it was made.
#[napi_derive::napi(object)]
pub struct LeaseStats {
    /// Calls made per method, rejected ones included.
    pub calls: LeaseCalls,
    /// Rejected calls per error code (`ERR_LEASE_TIMEOUT`, `ERR_LEASE_INVALID_KEY`, ...).
    #[napi(ts_type = "Record<string, number>")]
    pub errors: std::collections::HashMap<String, f64>,
    /// Acquires that left the caller holding the lease, and transfers that moved it.
    pub granted: f64,
    /// Acquires answered with another owner.
    pub refused: f64,
    /// Renewals answered `false`: the caller had lost the lease.
    pub lost: f64,
}

impl From<crate::core::lease::stats::Snapshot> for LeaseStats {
    fn from(s: crate::core::lease::stats::Snapshot) -> Self {
        let [acquire_lease, get_lease_owner, release_lease, renew_lease, transfer_lease, acquire_fenced_lease, get_lease, get_lease_record] =
            s.calls.map(|n| n as f64);
        Self {
            calls: LeaseCalls {
                acquire_lease,
                get_lease_owner,
                release_lease,
                renew_lease,
                transfer_lease,
                acquire_fenced_lease,
                get_lease,
                get_lease_record,
            },
            errors: s
                .errors
                .into_iter()
                .map(|(code, n)| (code.to_owned(), n as f64))
                .collect(),
            granted: s.granted as f64,
            refused: s.refused as f64,
            lost: s.lost as f64,
        }
    }
}
