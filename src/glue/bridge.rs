//! The crossing between Node's thread and the Tokio runtime, batched both ways.
//!
//! A napi `async fn` pays, per call, for a hop onto the runtime and a thread-safe function
//! that wakes Node's event loop to settle it; at 64 calls in flight that crossing, not Redis,
//! is the bottleneck. Here the calls made in one turn of JavaScript (before its microtasks
//! run out) wait in an outbox; one microtask hands them all to the runtime at once, where
//! the store pipelines them into one write. On the way back, outcomes queue up and the first
//! to queue wakes JavaScript once; that wake-up settles every promise queued by then.
//!
//! The thread-safe function keeps Node's event loop alive only while calls are in flight,
//! so a process whose providers are idle or closed exits by itself.

use std::ffi::c_void;
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use futures::FutureExt;
use napi::sys;

use super::js::{self, Deferred, Env, Value};
use super::reply::{panic_message, to_js};
use super::{runtime, turn};
use crate::core::{Answer, Call, LeaseError, LeaseStore, Result};

type Outcome = Result<Answer>;

/// The most calls sent as one pipeline.
const MAX_PIPELINE: usize = 64;

/// How many calls of a turn of `n` go in one pipeline: small turns travel whole; larger
/// ones in at least two pipelines, so Redis works on one while the other's callers run.
/// (Measured on 2 cores: 64 in flight went from 95k to 130k calls/s, 256 from 120k to 185k.)
fn pipeline_size(n: usize) -> usize {
    if n <= 16 {
        n
    } else {
        n.div_ceil(2).min(MAX_PIPELINE)
    }
}

/// One provider's two-way crossing, and the store its calls run on.
pub struct Bridge<S> {
    store: Arc<S>,
    tsfn: Tsfn,
    /// Calls made since the last flush, waiting for the end of this turn of JavaScript.
    outbox: Mutex<Vec<(Deferred, Call)>>,
    /// Outcomes waiting for the JavaScript thread.
    inbox: Mutex<Vec<(Deferred, Outcome)>>,
    /// A wake-up of the JavaScript thread is on its way; later outcomes ride along with it.
    wake_scheduled: AtomicBool,
    /// Calls in flight; while non-zero the event loop stays alive. Changed on the JS thread.
    in_flight: AtomicUsize,
}

/// The raw thread-safe function, guarded against use after Node finalized it (at exit).
struct Tsfn {
    raw: sys::napi_threadsafe_function,
    /// Set to `true` by the finalizer; checked under the read lock before every use.
    finalized: Arc<RwLock<bool>>,
}

// SAFETY: N-API thread-safe functions are made to be called and released from any thread;
// the lock orders every such call before Node's finalizer.
unsafe impl Send for Tsfn {}
unsafe impl Sync for Tsfn {}

impl<S: LeaseStore + 'static> Bridge<S> {
    /// Makes the provider's thread-safe function, not keeping the event loop alive.
    pub fn new(env: Env, store: S) -> napi::Result<Arc<Self>> {
        let finalized = Arc::new(RwLock::new(false));
        let finalize_data = Arc::into_raw(finalized.clone()) as *mut c_void;
        let name = js::string(env, "mastra-lease");
        let mut raw = ptr::null_mut();
        // SAFETY: no JavaScript function (call_js settles promises itself); the finalize data
        // is an `Arc` that `on_finalize` takes back exactly once.
        let status = unsafe {
            sys::napi_create_threadsafe_function(
                env,
                ptr::null_mut(),
                ptr::null_mut(),
                name,
                0,
                1,
                finalize_data,
                Some(on_finalize),
                ptr::null_mut(),
                Some(call_js::<S>),
                &mut raw,
            )
        };
        if status != sys::Status::napi_ok {
            // SAFETY: creation failed, so the finalizer will never take the `Arc` back.
            drop(unsafe { Arc::from_raw(finalize_data as *const RwLock<bool>) });
            return Err(napi::Error::from_reason(
                "could not create the thread-safe function that settles lease promises",
            ));
        }
        // SAFETY: raw was just created on this thread.
        unsafe { sys::napi_unref_threadsafe_function(env, raw) };
        Ok(Arc::new(Self {
            store: Arc::new(store),
            tsfn: Tsfn { raw, finalized },
            outbox: Mutex::new(Vec::new()),
            inbox: Mutex::new(Vec::new()),
            wake_scheduled: AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
        }))
    }

    /// On the JavaScript thread: queues `call` and answers its promise. The first call of a
    /// turn schedules the flush that sends the whole turn's calls together.
    pub fn submit(self: &Arc<Self>, env: Env, call: Call) -> Value {
        let (deferred, promise) = js::promise(env);
        if self.in_flight.fetch_add(1, Ordering::Relaxed) == 0 {
            // SAFETY: on the JavaScript thread that made the function; it is not finalized
            // while this provider is reachable.
            unsafe { sys::napi_ref_threadsafe_function(env, self.tsfn.raw) };
        }
        let first = {
            let mut outbox = lock(&self.outbox);
            outbox.push((deferred, call));
            outbox.len() == 1
        };
        if first {
            let bridge = self.clone();
            turn::at_end(env, Box::new(move || bridge.flush()));
        }
        promise
    }

    /// Sends everything in the outbox to the runtime, in a few pipelines that travel
    /// concurrently (see `pipeline_size`): replies to the first come back, and their callers
    /// run, while Redis still works on the rest, instead of everyone waiting for the last
    /// reply of one big batch.
    fn flush(self: &Arc<Self>) {
        let batch = std::mem::take(&mut *lock(&self.outbox));
        if batch.is_empty() {
            return;
        }
        let runtime = match runtime() {
            Ok(runtime) => runtime,
            Err(err) => {
                let count = batch.len();
                let deferreds = batch.into_iter().map(|(deferred, _)| deferred).collect();
                return self.complete(deferreds, vec![Err(err); count]);
            }
        };
        let size = pipeline_size(batch.len());
        let mut batch = batch.into_iter().peekable();
        while batch.peek().is_some() {
            let (deferreds, calls): (Vec<Deferred>, Vec<Call>) = batch.by_ref().take(size).unzip();
            let bridge = self.clone();
            runtime.spawn(async move {
                let count = calls.len();
                let answers = std::panic::AssertUnwindSafe(bridge.store.execute(calls))
                    .catch_unwind()
                    .await
                    .unwrap_or_else(|panic| {
                        vec![Err(LeaseError::Internal(panic_message(panic.as_ref()))); count]
                    });
                bridge.complete(deferreds, answers);
            });
        }
    }

    /// From any thread: queues outcomes and wakes JavaScript unless a wake-up is on its way.
    fn complete(self: &Arc<Self>, deferreds: Vec<Deferred>, mut answers: Vec<Outcome>) {
        answers.resize_with(deferreds.len(), || {
            Err(LeaseError::Internal("a call went unanswered".into()))
        });
        lock(&self.inbox).extend(deferreds.into_iter().zip(answers));
        if self.wake_scheduled.swap(true, Ordering::AcqRel) {
            return;
        }
        let data = Arc::into_raw(self.clone()) as *mut c_void;
        let finalized = self
            .tsfn
            .finalized
            .read()
            .unwrap_or_else(|e| e.into_inner());
        let status = if *finalized {
            sys::Status::napi_closing
        } else {
            // SAFETY: not finalized, and the read lock keeps the finalizer out meanwhile.
            unsafe {
                sys::napi_call_threadsafe_function(
                    self.tsfn.raw,
                    data,
                    sys::ThreadsafeFunctionCallMode::nonblocking,
                )
            }
        };
        if status != sys::Status::napi_ok {
            // Node is shutting down: nothing is left to settle the promises for.
            // SAFETY: the call was refused, so `call_js` will not take this `Arc` back.
            drop(unsafe { Arc::from_raw(data as *const Self) });
        }
    }

    /// On the JavaScript thread: settles everything in the inbox.
    fn settle_inbox(&self, env: Env) {
        self.wake_scheduled.store(false, Ordering::Release);
        let batch = std::mem::take(&mut *lock(&self.inbox));
        let settled = batch.len();
        for (deferred, outcome) in batch {
            js::settle(env, deferred, to_js(env, outcome));
        }
        if settled > 0 && self.in_flight.fetch_sub(settled, Ordering::Relaxed) == settled {
            // SAFETY: on the JavaScript thread, inside this function's own callback.
            unsafe { sys::napi_unref_threadsafe_function(env, self.tsfn.raw) };
        }
    }
}

impl<S> Drop for Bridge<S> {
    fn drop(&mut self) {
        let finalized = self
            .tsfn
            .finalized
            .read()
            .unwrap_or_else(|e| e.into_inner());
        if !*finalized {
            // SAFETY: not finalized, and the read lock keeps the finalizer out meanwhile.
            unsafe {
                sys::napi_release_threadsafe_function(
                    self.tsfn.raw,
                    sys::ThreadsafeFunctionReleaseMode::release,
                )
            };
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Only pushes and swaps happen under these locks; poisoning cannot leave them torn.
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs on the JavaScript thread for each wake-up. `data` is the `Arc<Bridge>` that
/// `complete` leaked for it.
unsafe extern "C" fn call_js<S: LeaseStore + 'static>(
    env: Env,
    _callback: Value,
    _context: *mut c_void,
    data: *mut c_void,
) {
    // SAFETY: `complete` leaked exactly one `Arc` per accepted call; take it back.
    let bridge = unsafe { Arc::from_raw(data as *const Bridge<S>) };
    if env.is_null() {
        // The environment is being torn down; there is no JavaScript left to answer.
        return;
    }
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| bridge.settle_inbox(env)));
}

unsafe extern "C" fn on_finalize(_env: Env, data: *mut c_void, _hint: *mut c_void) {
    // SAFETY: `Bridge::new` leaked this `Arc` for the finalizer alone.
    let finalized = unsafe { Arc::from_raw(data as *const RwLock<bool>) };
    *finalized.write().unwrap_or_else(|e| e.into_inner()) = true;
}
