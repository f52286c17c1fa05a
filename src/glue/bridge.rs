//! The crossing back from the Tokio runtime to JavaScript, batched.
//!
//! A napi `async fn` pays for a thread-safe function and a wake-up of Node's event loop per
//! call; at 64 calls in flight that crossing, not Redis, is the bottleneck. Here each provider
//! owns one thread-safe function. Finished calls queue their outcome; the first to queue
//! wakes the JavaScript thread once, and that wake-up settles every promise queued by then.
//! Under load one wake-up settles hundreds of calls.
//!
//! The thread-safe function keeps Node's event loop alive only while calls are in flight,
//! so a process whose providers are idle or closed exits by itself.

use std::ffi::c_void;
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use napi::sys;

use super::js::{self, Deferred, Env, Value};
use super::reply::{IntoJs, Outcome};

/// One provider's way back to JavaScript.
pub struct Bridge {
    tsfn: Tsfn,
    /// Outcomes waiting for the JavaScript thread.
    queue: Mutex<Vec<(Deferred, Outcome)>>,
    /// A wake-up is on its way; later outcomes ride along with it.
    scheduled: AtomicBool,
    /// Calls in flight, counted on the JavaScript thread; while non-zero the event loop stays
    /// alive.
    in_flight: AtomicUsize,
}

/// The raw thread-safe function, guarded against use after Node finalized it (at exit).
struct Tsfn {
    raw: sys::napi_threadsafe_function,
    /// Set to `true` by the finalizer; checked under the read lock before every use.
    finalized: Arc<RwLock<bool>>,
}

// SAFETY: N-API thread-safe functions are made to be called and released from any thread;
// the lock keeps every such call before Node's finalizer.
unsafe impl Send for Tsfn {}
unsafe impl Sync for Tsfn {}

impl Bridge {
    /// Makes the provider's thread-safe function, not keeping the event loop alive.
    pub fn new(env: Env) -> napi::Result<Arc<Self>> {
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
                Some(call_js),
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
            tsfn: Tsfn { raw, finalized },
            queue: Mutex::new(Vec::new()),
            scheduled: AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
        }))
    }

    /// On the JavaScript thread, before a call leaves for the runtime: keeps the event loop
    /// alive until its outcome comes back.
    pub fn begin(&self, env: Env) {
        if self.in_flight.fetch_add(1, Ordering::Relaxed) == 0 {
            // SAFETY: on the JavaScript thread that made the function, which is not finalized
            // while this provider is reachable.
            unsafe { sys::napi_ref_threadsafe_function(env, self.tsfn.raw) };
        }
    }

    /// From any thread: queues a finished call's outcome and wakes JavaScript if no wake-up
    /// is already on its way.
    pub fn complete(self: &Arc<Self>, deferred: Deferred, outcome: Outcome) {
        self.lock_queue().push((deferred, outcome));
        if self.scheduled.swap(true, Ordering::AcqRel) {
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
            drop(unsafe { Arc::from_raw(data as *const Bridge) });
        }
    }

    /// On the JavaScript thread: settles everything queued so far.
    fn drain(&self, env: Env) {
        self.scheduled.store(false, Ordering::Release);
        let batch = std::mem::take(&mut *self.lock_queue());
        let settled = batch.len();
        for (deferred, outcome) in batch {
            let value: Result<Value, Value> = outcome.into_js(env);
            js::settle(env, deferred, value);
        }
        if settled > 0 && self.in_flight.fetch_sub(settled, Ordering::Relaxed) == settled {
            // SAFETY: on the JavaScript thread, inside this function's own callback.
            unsafe { sys::napi_unref_threadsafe_function(env, self.tsfn.raw) };
        }
    }

    fn lock_queue(&self) -> std::sync::MutexGuard<'_, Vec<(Deferred, Outcome)>> {
        // Only pushes and a swap happen under this lock; poisoning cannot corrupt it.
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for Bridge {
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

/// Runs on the JavaScript thread for each wake-up. `data` is the `Arc<Bridge>` that
/// `complete` leaked for it.
unsafe extern "C" fn call_js(env: Env, _callback: Value, _context: *mut c_void, data: *mut c_void) {
    // SAFETY: `complete` leaked exactly one `Arc` per successful call; take it back.
    let bridge = unsafe { Arc::from_raw(data as *const Bridge) };
    if env.is_null() {
        // The environment is being torn down; there is no JavaScript left to answer.
        return;
    }
    // A panic must not unwind into Node; `drain` does not panic, but be sure.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| bridge.drain(env)));
}

unsafe extern "C" fn on_finalize(_env: Env, data: *mut c_void, _hint: *mut c_void) {
    // SAFETY: `Bridge::new` leaked this `Arc` for the finalizer alone.
    let finalized = unsafe { Arc::from_raw(data as *const RwLock<bool>) };
    *finalized.write().unwrap_or_else(|e| e.into_inner()) = true;
}
