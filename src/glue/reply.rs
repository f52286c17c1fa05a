//! What a finished call hands back to JavaScript: the shape of every answer, and the
//! declared types of those shapes (for `src/shell/native.d.ts`).

use std::cell::Cell;

use super::js::{self, Env, Persistent, Value};
use crate::core::lease::{Holder, Lease, Page};
use crate::core::{Answer, Result};

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
            Ok(self::grant(env, grant.acquired, owner, token))
        }
        Ok(Reply::Answer(Answer::Owner(owner))) => {
            Ok(js::string_or_undefined(env, owner.as_deref()))
        }
        Ok(Reply::Answer(Answer::Lease(lease))) => Ok(match lease {
            Some(lease) => self::lease(env, &lease),
            None => js::undefined(env),
        }),
        Ok(Reply::Answer(Answer::Record(record))) => Ok(match record {
            Some(holder) => self::record(env, &holder),
            None => js::undefined(env),
        }),
        Ok(Reply::Answer(Answer::Released(_)) | Reply::Undefined) => Ok(js::undefined(env)),
        Ok(Reply::Number(n)) => Ok(js::number_value(env, n)),
        Ok(Reply::Page(page)) => Ok(self::page(env, &page)),
        Ok(Reply::Answer(Answer::Renewed(done) | Answer::Transferred(done))) => {
            Ok(js::boolean(env, done))
        }
        Err(err) => Err(js::error(env, &err)),
    }
}

/// `{ acquired, owner }`, the answer of `acquireLease`; with a token (`Some`, its value
/// `None` when refused), `{ acquired, owner, token }`, the answer of `acquireFencedLease`.
///
/// Made by a tiny JavaScript function rather than property by property: an object literal
/// gets V8's ready-made shape, where setting the properties one by one walks a map
/// transition and internalizes each name on every call (`docs/benchmarks.md`).
fn grant(env: Env, acquired: bool, owner: Value, token: Option<Option<u64>>) -> Value {
    let fenced = token.is_some();
    let token = token
        .flatten()
        .map_or_else(|| js::undefined(env), |t| js::number_value(env, t as f64));
    let args = [js::boolean(env, acquired), owner, token];
    let args = &args[..if fenced { 3 } else { 2 }];
    if let Some(made) = grant_factory(env, fenced).and_then(|f| js::call(env, f, args)) {
        return made;
    }
    // No factory (the environment is shutting down): the same object, property by property.
    let out = js::object(env);
    for (name, value) in [c"acquired", c"owner", c"token"].into_iter().zip(args) {
        js::set_property(env, out, name, *value);
    }
    out
}

thread_local! {
    /// This thread's environment and its grant factories (plain, fenced). Each Node
    /// environment (the main thread or a worker) runs on its own thread.
    static GRANT_FACTORIES: Cell<Option<(Env, [Persistent; 2])>> = const { Cell::new(None) };
}

/// The environment's grant factory, plain or fenced, compiled on first use.
fn grant_factory(env: Env, fenced: bool) -> Option<Value> {
    const SOURCES: [&str; 2] = [
        "(function grant(acquired, owner) { return { acquired, owner } })",
        "(function fencedGrant(acquired, owner, token) { return { acquired, owner, token } })",
    ];
    let factories = match GRANT_FACTORIES.get() {
        Some((made_in, factories)) if made_in == env => factories,
        _ => {
            let factories = [js::compile(env, SOURCES[0])?, js::compile(env, SOURCES[1])?];
            GRANT_FACTORIES.set(Some((env, factories)));
            factories
        }
    };
    factories[usize::from(fenced)].value(env)
}

/// `{ leases: [{ key, owner, token, ttlMs }, ...], cursor }`, a page of `listLeases`.
fn page(env: Env, page: &Page) -> Value {
    let rows: Vec<Value> = page
        .leases
        .iter()
        .map(|(key, l)| {
            let row = lease(env, l);
            match std::str::from_utf8(key) {
                Ok(key) => js::set_property(env, row, c"key", js::string(env, key)),
                // No string holds these bytes: the key as text shows U+FFFD for them, and
                // `rawKey` is the key as Redis holds it.
                Err(_) => {
                    let text = String::from_utf8_lossy(key);
                    js::set_property(env, row, c"key", js::string(env, &text));
                    js::set_property(env, row, c"rawKey", js::buffer(env, key));
                }
            }
            row
        })
        .collect();
    let out = js::object(env);
    js::set_property(env, out, c"leases", js::array(env, &rows));
    let cursor = js::string_or_undefined(env, page.cursor.as_deref());
    js::set_property(env, out, c"cursor", cursor);
    out
}

/// `{ owner, token, ttlMs }`, what `getLease` resolves to for a live lease; `ttlMs` is `null`
/// for a key that never expires (the same in JavaScript and in JSON, where `Infinity` is not).
fn lease(env: Env, lease: &Lease) -> Value {
    let out = js::object(env);
    js::set_property(env, out, c"owner", js::string(env, &lease.owner));
    let token = lease.token;
    let token = token.map_or_else(|| js::undefined(env), |t| js::number_value(env, t as f64));
    js::set_property(env, out, c"token", token);
    let ttl = lease.ttl_ms;
    let ttl = ttl.map_or_else(|| js::null(env), |t| js::number_value(env, t as f64));
    js::set_property(env, out, c"ttlMs", ttl);
    // No string holds these bytes: `owner` shows U+FFFD for them.
    if let Some(raw) = &lease.raw_owner {
        js::set_property(env, out, c"rawOwner", js::buffer(env, raw));
    }
    out
}

/// `{ owner, metadata }` (`metadata` absent for none), the answer of `getLeaseRecord`.
fn record(env: Env, holder: &Holder) -> Value {
    let out = js::object(env);
    js::set_property(env, out, c"owner", js::string(env, &holder.owner));
    if let Some(metadata) = &holder.metadata {
        js::set_property(env, out, c"metadata", js::string(env, metadata));
    }
    out
}

/// What `acquireLease` resolves to, Mastra's shape exactly.
#[napi_derive::napi(object)]
pub struct LeaseGrant {
    /// `true` when the caller holds the lease after the call.
    pub acquired: bool,
    /// The holder: the caller when `acquired`, otherwise the owner to route work to (which
    /// may be the caller's own owner id, holding with other metadata). Always there:
    /// Mastra's type has it optional, and this is assignable to it.
    pub owner: String,
}

/// What `acquireFencedLease` resolves to.
#[napi_derive::napi(object)]
pub struct FencedLeaseGrant {
    /// `true` when the caller holds the lease after the call.
    pub acquired: bool,
    /// The holder: the caller when `acquired`, otherwise the owner to route work to.
    pub owner: String,
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
    /// The owner as Redis holds it, when that is not UTF-8 (another client wrote it): `owner`
    /// shows U+FFFD for the bytes it cannot show. Absent otherwise.
    pub raw_owner: Option<napi::bindgen_prelude::Buffer>,
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
