//! `memoryLeaseTable()`: the in-memory store behind the shell's `MemoryLeaseProvider`.
//!
//! Its functions answer on the spot, with no thread hop, and synchronously: the shell makes
//! the promise and the `acquireLease` object in JavaScript, where both cost a fraction of
//! what they cost through N-API. They are plain functions bound to their table (not class
//! methods), so a call skips napi-rs's instance lookup and borrow bookkeeping. Together: 1.05M
//! to 2.9M lifecycle calls/s (`docs/benchmarks.md` has what each piece cost).

use std::ffi::{c_void, CStr};
use std::ptr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use napi::bindgen_prelude::{Env, ToNapiValue, Unknown};
use napi::{sys, JsValue};
use napi_derive::napi;

use super::args;
use super::crossing::{catching, Tsfn};
use super::js::{self, Value};
use super::options;
use super::reply::{to_js, LeaseStats, Reply};
use super::{runtime, unknown};
use crate::core::lease::stats::{Operation, Stats};
use crate::core::{Answer, Call, Error, MemoryStore, Result, Subject};

/// How often expired leases nobody touches are swept out of memory.
const SWEEP_EVERY: Duration = Duration::from_millis(250);
/// Leases reclaimed per hold of the table's lock during a sweep.
const SWEEP_CHUNK: usize = 10_000;

/// What the functions of one table share: the leases, the counters `stats()` reads, and
/// whether `close()` was called.
struct Table {
    store: MemoryStore,
    stats: Stats,
    closed: AtomicBool,
}

/// Makes a table of leases in this process's memory, enforcing `options`' limits, and answers
/// an object of functions bound to it: the lease calls (`acquireLease`, ...), `close`,
/// `ping`, `size` and `stats`. Each answers synchronously or throws the coded error the
/// provider rejects with. Throws `ERR_LEASE_INVALID_OPTION` for bad options.
#[napi(
    catch_unwind,
    ts_args_type = "options?: MemoryLeaseProviderOptions | undefined | null",
    ts_return_type = "{
  acquireLease(key: string, owner: string, ttlMs: number, metadata?: string): true | string
  acquireFencedLease(key: string, owner: string, ttlMs: number, metadata?: string): number | string
  getLeaseOwner(key: string): string | undefined
  getLease(key: string): LeaseState | undefined
  getLeaseRecord(key: string): LeaseRecord | undefined
  releaseLease(key: string, owner: string, metadata?: string): void
  renewLease(key: string, owner: string, ttlMs: number, metadata?: string): boolean
  transferLease(key: string, fromOwner: string, toOwner: string, ttlMs: number, fromMetadata?: string, toMetadata?: string): boolean
  close(): void
  ping(): number
  size(): number
  stats(): LeaseStats
}"
)]
pub fn memory_lease_table<'env>(
    env: &'env Env,
    options: Option<Unknown<'env>>,
) -> napi::Result<Unknown<'env>> {
    let raw = env.raw();
    let made = options::memory(raw, options.map(|o| o.raw())).and_then(|limits| {
        let table = Arc::new(Table {
            store: MemoryStore::new(limits),
            stats: Stats::default(),
            closed: AtomicBool::new(false),
        });
        let node = NodeThread::new(raw).map_err(|e| Error::Internal(e.reason))?;
        runtime()?.spawn(sweep(Arc::downgrade(&table), node));
        Ok(table)
    });
    match made {
        Ok(table) => Ok(unknown(env, functions(raw, &table))),
        Err(err) => {
            err.throw(raw);
            Err(napi::Error::from_status(napi::Status::PendingException))
        }
    }
}

/// The object of functions, each holding the table alive for as long as it lives itself.
fn functions(env: js::Env, table: &Arc<Table>) -> Value {
    const FUNCTIONS: [(&CStr, js::Callback); 12] = [
        (c"acquireLease", acquire_lease),
        (c"acquireFencedLease", acquire_fenced_lease),
        (c"getLeaseOwner", get_lease_owner),
        (c"getLease", get_lease),
        (c"getLeaseRecord", get_lease_record),
        (c"releaseLease", release_lease),
        (c"renewLease", renew_lease),
        (c"transferLease", transfer_lease),
        (c"close", close),
        (c"ping", ping),
        (c"size", size),
        (c"stats", stats),
    ];
    let object = js::object(env);
    for (name, callback) in FUNCTIONS {
        let data = Arc::into_raw(Arc::clone(table)).cast_mut().cast();
        let function = js::function(env, name, callback, data, release_table);
        js::set_property(env, object, name, function);
    }
    object
}

/// The finalizer of each function: gives back its hold on the table.
unsafe extern "C" fn release_table(_env: js::Env, data: *mut c_void, _hint: *mut c_void) {
    // SAFETY: data is the `Arc::into_raw` made for this function in `functions`, and a
    // finalizer runs once.
    drop(unsafe { Arc::from_raw(data.cast::<Table>().cast_const()) });
}

/// One lease call: reads the `N` arguments, runs the call on the table and counts it, then
/// answers as [`answered`] says or throws the call's coded error.
///
/// # Safety
/// `info` is the callback info of a call to a function made by `functions`.
unsafe fn lease_call<const N: usize>(
    env: js::Env,
    info: sys::napi_callback_info,
    operation: Operation,
    read: impl FnOnce(js::Env, [Value; N]) -> Result<Call>,
) -> Value {
    // SAFETY: as this function's contract says.
    let (table, args) = unsafe { bound::<N>(env, info) };
    let outcome = catching(|| {
        if table.closed.load(Ordering::Relaxed) {
            return Err(Error::Closed(Subject::LeaseProvider));
        }
        table.store.apply(&read(env, args)?)
    });
    table.stats.record(operation, outcome.as_ref());
    match outcome {
        Ok(answer) => answered(env, answer),
        Err(err) => {
            js::throw(env, &err, None);
            ptr::null_mut()
        }
    }
}

/// A lease answer as a table function gives it: as a Redis call resolves (`reply::to_js`),
/// except an acquire: when granted, `true` (a fenced one: its token, a number), when refused
/// the holder's owner (a string), of which the shell makes `{ acquired, owner }` (and
/// `token`).
fn answered(env: js::Env, answer: Answer) -> Value {
    match answer {
        Answer::Grant(grant) if grant.acquired => match grant.token {
            Some(token) => js::number_value(env, token as f64),
            None => js::boolean(env, true),
        },
        Answer::Grant(grant) => js::string_or_undefined(env, grant.owner.as_deref()),
        other => match to_js(env, Ok(Reply::Answer(other))) {
            Ok(value) | Err(value) => value,
        },
    }
}

/// The table a function was made for, and its first `N` arguments.
///
/// # Safety
/// As [`lease_call`]'s.
unsafe fn bound<'a, const N: usize>(
    env: js::Env,
    info: sys::napi_callback_info,
) -> (&'a Table, [Value; N]) {
    let (data, args) = js::callback_args::<N>(env, info);
    // SAFETY: data is the table pointer `functions` gave this function, kept alive until the
    // function's finalizer runs, which cannot happen while it is being called.
    (unsafe { &*data.cast::<Table>() }, args)
}

/// `acquireLease(key, owner, ttlMs, metadata?)`: `true` when granted, the holder's owner
/// when refused.
unsafe extern "C" fn acquire_lease(env: js::Env, info: sys::napi_callback_info) -> Value {
    let read = |env, args: [Value; 4]| args::acquire_lease(env, args, false);
    // SAFETY: called by N-API for a function made by `functions`.
    unsafe { lease_call(env, info, Operation::AcquireLease, read) }
}

/// `acquireFencedLease(key, owner, ttlMs, metadata?)`: the fencing token when granted, the
/// holder's owner when refused.
unsafe extern "C" fn acquire_fenced_lease(env: js::Env, info: sys::napi_callback_info) -> Value {
    let read = |env, args: [Value; 4]| args::acquire_lease(env, args, true);
    // SAFETY: called by N-API for a function made by `functions`.
    unsafe { lease_call(env, info, Operation::AcquireFencedLease, read) }
}

/// `getLeaseOwner(key)`: the owner, or `undefined`.
unsafe extern "C" fn get_lease_owner(env: js::Env, info: sys::napi_callback_info) -> Value {
    let read = |env, [key]: [Value; 1]| args::get_lease_owner(env, key);
    // SAFETY: called by N-API for a function made by `functions`.
    unsafe { lease_call(env, info, Operation::GetLeaseOwner, read) }
}

/// `getLease(key)`: `{ owner, token, ttlMs }`, or `undefined`.
unsafe extern "C" fn get_lease(env: js::Env, info: sys::napi_callback_info) -> Value {
    let read = |env, [key]: [Value; 1]| args::get_lease(env, key);
    // SAFETY: called by N-API for a function made by `functions`.
    unsafe { lease_call(env, info, Operation::GetLease, read) }
}

/// `getLeaseRecord(key)`: `{ owner, metadata? }`, or `undefined`.
unsafe extern "C" fn get_lease_record(env: js::Env, info: sys::napi_callback_info) -> Value {
    let read = |env, [key]: [Value; 1]| args::get_lease_record(env, key);
    // SAFETY: called by N-API for a function made by `functions`.
    unsafe { lease_call(env, info, Operation::GetLeaseRecord, read) }
}

/// `releaseLease(key, owner, metadata?)`: `undefined`.
unsafe extern "C" fn release_lease(env: js::Env, info: sys::napi_callback_info) -> Value {
    // SAFETY: called by N-API for a function made by `functions`.
    unsafe { lease_call(env, info, Operation::ReleaseLease, args::release_lease) }
}

/// `renewLease(key, owner, ttlMs, metadata?)`: whether the holder still held the lease.
unsafe extern "C" fn renew_lease(env: js::Env, info: sys::napi_callback_info) -> Value {
    // SAFETY: called by N-API for a function made by `functions`.
    unsafe { lease_call(env, info, Operation::RenewLease, args::renew_lease) }
}

/// `transferLease(key, fromOwner, toOwner, ttlMs, fromMetadata?, toMetadata?)`: whether the
/// lease moved.
unsafe extern "C" fn transfer_lease(env: js::Env, info: sys::napi_callback_info) -> Value {
    // SAFETY: called by N-API for a function made by `functions`.
    unsafe { lease_call(env, info, Operation::TransferLease, args::transfer_lease) }
}

/// `close()`: drops every lease; later calls throw `ERR_LEASE_CLOSED`. Idempotent.
unsafe extern "C" fn close(env: js::Env, info: sys::napi_callback_info) -> Value {
    // SAFETY: called by N-API for a function made by `functions`.
    let (table, []) = unsafe { bound::<0>(env, info) };
    if !table.closed.swap(true, Ordering::Relaxed) {
        table.store.clear();
    }
    js::undefined(env)
}

/// `ping()`: 0 (milliseconds: there is no server to reach); throws `ERR_LEASE_CLOSED` once
/// closed.
unsafe extern "C" fn ping(env: js::Env, info: sys::napi_callback_info) -> Value {
    // SAFETY: called by N-API for a function made by `functions`.
    let (table, []) = unsafe { bound::<0>(env, info) };
    if table.closed.load(Ordering::Relaxed) {
        js::throw(env, &Error::Closed(Subject::LeaseProvider), None);
        return ptr::null_mut();
    }
    js::number_value(env, 0.0)
}

/// `size()`: leases resident, expired ones not yet swept included (0 once closed).
unsafe extern "C" fn size(env: js::Env, info: sys::napi_callback_info) -> Value {
    // SAFETY: called by N-API for a function made by `functions`.
    let (table, []) = unsafe { bound::<0>(env, info) };
    js::number_value(env, table.store.resident() as f64)
}

/// `stats()`: the table's counters (see `LeaseStats`).
unsafe extern "C" fn stats(env: js::Env, info: sys::napi_callback_info) -> Value {
    // SAFETY: called by N-API for a function made by `functions`.
    let (table, []) = unsafe { bound::<0>(env, info) };
    let stats = LeaseStats::from(table.stats.snapshot());
    // SAFETY: a plain object conversion on the JavaScript thread.
    unsafe { LeaseStats::to_napi_value(env, stats) }.unwrap_or(ptr::null_mut())
}

/// Sweeps expired leases out of `table` until it is dropped. After a sweep that removed many,
/// the memory they held goes back to the system: the leases were made on Node's thread and
/// freed on this one, and the allocator returns such memory only when the thread that owns it
/// collects (see `crate::give_back_memory`).
async fn sweep(table: Weak<Table>, node: NodeThread) {
    let mut every = tokio::time::interval(SWEEP_EVERY);
    loop {
        every.tick().await;
        let Some(table) = table.upgrade() else {
            return;
        };
        let store = &table.store;
        let before = store.resident();
        while store.reclaim_expired(SWEEP_CHUNK) == SWEEP_CHUNK {
            tokio::task::yield_now().await;
        }
        if before.saturating_sub(store.resident()) >= SWEEP_CHUNK {
            crate::give_back_memory();
            node.give_back_memory();
        }
    }
}

/// A way onto Node's thread, to give back memory freed there.
struct NodeThread(Tsfn);

impl NodeThread {
    fn new(env: js::Env) -> napi::Result<Self> {
        Tsfn::new(env, None, ptr::null_mut(), give_back_on_node).map(Self)
    }

    /// From any thread: has Node's thread give back the memory freed in its heap.
    fn give_back_memory(&self) {
        self.0.call(ptr::null_mut());
    }
}

unsafe extern "C" fn give_back_on_node(
    _env: js::Env,
    _callback: Value,
    _context: *mut c_void,
    _data: *mut c_void,
) {
    crate::give_back_memory();
}
