//! `MemoryLeaseProvider`: leases in this process's memory, the embedded default.

use std::ffi::c_void;
use std::ptr;
use std::sync::{Arc, Weak};
use std::time::Duration;

use napi::bindgen_prelude::{Env, Unknown};
use napi::JsValue;
use napi_derive::napi;

use super::args;
use super::js;
use super::lease_methods::lease_methods;
use super::options;
use super::reply::{catching, resolved, settled, LeaseStats, Reply};
use super::tsfn::Tsfn;
use super::{runtime, unknown};
use crate::core::lease::stats::{Operation, Stats};
use crate::core::{Call, Error, MemoryStore, Result, Subject};

/// How often expired leases nobody touches are swept out of memory.
const SWEEP_EVERY: Duration = Duration::from_millis(250);
/// Leases reclaimed per hold of the table's lock during a sweep.
const SWEEP_CHUNK: usize = 10_000;

/// Leases in this process's memory: correct for one process (all its async callers and
/// `worker_threads` that share the object), not across processes.
///
/// Same five methods as `RedisLeaseProvider`; calls are answered on the spot, with no
/// thread hop. Time is a monotonic clock, so wall-clock changes never move a deadline.
#[napi]
pub struct MemoryLeaseProvider {
    store: Option<Arc<MemoryStore>>,
    stats: Arc<Stats>,
}

#[napi]
impl MemoryLeaseProvider {
    /// Throws a `TypeError`/`RangeError` with code `ERR_LEASE_INVALID_OPTION` for bad options.
    #[napi(
        constructor,
        ts_args_type = "options?: MemoryLeaseProviderOptions | undefined | null"
    )]
    pub fn new(env: Env, options: Option<Unknown>) -> napi::Result<Self> {
        let raw = env.raw();
        let built = options::memory(raw, options.map(|o| o.raw())).and_then(|limits| {
            let store = Arc::new(MemoryStore::new(limits));
            let node = NodeThread::new(raw).map_err(|e| Error::Internal(e.reason))?;
            runtime()?.spawn(sweep(Arc::downgrade(&store), node));
            Ok(store)
        });
        match built {
            Ok(store) => Ok(Self {
                store: Some(store),
                stats: Arc::default(),
            }),
            Err(err) => {
                err.throw(raw);
                Err(napi::Error::from_status(napi::Status::PendingException))
            }
        }
    }

    /// Drops every lease and stops taking calls; later calls reject with
    /// `ERR_LEASE_CLOSED`. Idempotent.
    #[napi(catch_unwind, ts_return_type = "Promise<void>")]
    pub fn close<'env>(&mut self, env: &'env Env) -> Unknown<'env> {
        if let Some(store) = self.store.take() {
            store.clear();
        }
        unknown(env, resolved(env.raw()))
    }

    /// Resolves 0 (milliseconds: there is no server to reach), or rejects with
    /// `ERR_LEASE_CLOSED` once closed; the same health check as `RedisLeaseProvider`'s.
    #[napi(catch_unwind, ts_return_type = "Promise<number>")]
    pub fn ping<'env>(&self, env: &'env Env) -> Unknown<'env> {
        let outcome = match &self.store {
            None => Err(Error::Closed(Subject::LeaseProvider)),
            Some(_) => Ok(Reply::Number(0.0)),
        };
        unknown(env, settled(env.raw(), outcome))
    }

    /// Leases resident in memory, expired ones not yet swept included (0 once closed).
    #[napi(getter, catch_unwind)]
    pub fn size(&self) -> u32 {
        self.store.as_ref().map_or(0, |store| {
            u32::try_from(store.resident()).unwrap_or(u32::MAX)
        })
    }

    /// Answers a checked call on the spot; a closed provider or bad input is answered too.
    fn submit<'env>(
        &self,
        env: &'env Env,
        operation: Operation,
        call: Result<Call>,
    ) -> Unknown<'env> {
        let outcome = match &self.store {
            None => Err(Error::Closed(Subject::LeaseProvider)),
            Some(store) => call.and_then(|call| catching(|| store.apply(&call))),
        };
        self.stats.record(operation, outcome.as_ref());
        unknown(env, settled(env.raw(), outcome.map(Reply::Answer)))
    }
}

lease_methods!(MemoryLeaseProvider);

/// Sweeps expired leases out of `store` until it is dropped. After a sweep that removed many,
/// the memory they held goes back to the system: the leases were made on Node's thread and
/// freed on this one, and the allocator returns such memory only when the thread that owns it
/// collects (see `crate::give_back_memory`).
async fn sweep(store: Weak<MemoryStore>, node: NodeThread) {
    let mut every = tokio::time::interval(SWEEP_EVERY);
    loop {
        every.tick().await;
        let Some(store) = store.upgrade() else {
            return;
        };
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
    _callback: js::Value,
    _context: *mut c_void,
    _data: *mut c_void,
) {
    crate::give_back_memory();
}
