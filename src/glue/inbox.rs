//! The way back from the Tokio runtime to JavaScript, batched: finished calls queue their
//! outcomes, the first to queue wakes Node's thread once through a thread-safe function, and
//! that wake-up settles every promise queued by then. Under load one wake-up settles
//! hundreds of calls, where a napi `async fn` pays one per call.
//!
//! The thread-safe function keeps Node's event loop alive only while calls are in flight,
//! so a process whose providers are idle or closed exits by itself.

use std::ffi::c_void;
use std::future::Future;
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use futures::stream::{FuturesUnordered, StreamExt};

use super::js::{self, Deferred, Env, Value};
use super::reply::{guarded, to_js, Outcome};
use super::runtime;
use super::tsfn::Tsfn;
use super::turn::Outbox;
use crate::core::lock;

type Work = BoxFuture<'static, Outcome>;

/// One provider's way back to JavaScript.
pub struct Inbox {
    tsfn: Tsfn,
    /// Work deferred in this turn of JavaScript, sent to the runtime together at its end.
    deferred: Outbox<(Deferred, Work)>,
    /// Outcomes waiting for the JavaScript thread.
    queue: Mutex<Vec<(Deferred, Outcome)>>,
    /// A wake-up of the JavaScript thread is on its way; later outcomes ride along with it.
    wake_scheduled: AtomicBool,
    /// Calls in flight; while non-zero the event loop stays alive. Changed on the JS thread.
    in_flight: AtomicUsize,
}

impl Inbox {
    /// Makes the thread-safe function, not keeping the event loop alive.
    pub fn new(env: Env) -> napi::Result<Arc<Self>> {
        let tsfn = Tsfn::new(env, None, ptr::null_mut(), call_js)?;
        Ok(Arc::new(Self {
            tsfn,
            deferred: Outbox::default(),
            queue: Mutex::new(Vec::new()),
            wake_scheduled: AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
        }))
    }

    /// On the JavaScript thread: a new promise whose outcome will come back through this
    /// inbox. The event loop stays alive until it does.
    pub fn promise(&self, env: Env) -> (Deferred, Value) {
        if self.in_flight.fetch_add(1, Ordering::Relaxed) == 0 {
            self.tsfn.refer(env);
        }
        js::promise(env)
    }

    /// On the JavaScript thread: runs `work` on the runtime and answers a promise of its
    /// outcome. A panic in `work` becomes an `ERR_LEASE_INTERNAL` rejection.
    pub fn spawn(
        self: &Arc<Self>,
        env: Env,
        work: impl Future<Output = Outcome> + Send + 'static,
    ) -> Value {
        let (deferred, promise) = self.promise(env);
        match runtime() {
            Ok(runtime) => {
                let inbox = self.clone();
                runtime.spawn(async move {
                    let outcome = guarded(work).await;
                    inbox.complete(vec![(deferred, outcome)]);
                });
            }
            Err(err) => self.complete(vec![(deferred, Err(err))]),
        }
        promise
    }

    /// On the JavaScript thread: like [`Inbox::spawn`], but the work waits for the end of this
    /// turn of JavaScript and leaves with every other piece deferred in it: one hop onto the
    /// runtime per turn instead of one per call. The pieces then run concurrently, and their
    /// commands share the connection's pipeline.
    pub fn defer(
        self: &Arc<Self>,
        env: Env,
        work: impl Future<Output = Outcome> + Send + 'static,
    ) -> Value {
        let (deferred, promise) = self.promise(env);
        self.deferred
            .push(env, (deferred, Box::pin(work)), self, Self::send_deferred);
        promise
    }

    /// What `outbox` holds at the end of a turn, with the runtime to send it on; `None` when
    /// it holds nothing, or when there is no runtime (then every item's promise is rejected
    /// with why). `deferred` names the promise of an item.
    pub fn take_batch<T>(
        self: &Arc<Self>,
        outbox: &Outbox<T>,
        deferred: fn(T) -> Deferred,
    ) -> Option<(&'static tokio::runtime::Runtime, Vec<T>)> {
        let batch = outbox.take();
        if batch.is_empty() {
            return None;
        }
        match runtime() {
            Ok(runtime) => Some((runtime, batch)),
            Err(err) => {
                let failed = batch
                    .into_iter()
                    .map(|item| (deferred(item), Err(err.clone())));
                self.complete(failed.collect());
                None
            }
        }
    }

    /// Sends the turn's deferred work to the runtime as one task.
    fn send_deferred(self: &Arc<Self>) {
        let Some((runtime, batch)) = self.take_batch(&self.deferred, |(d, _)| d) else {
            return;
        };
        let inbox = self.clone();
        runtime.spawn(async move {
            let mut running: FuturesUnordered<_> = batch
                .into_iter()
                .map(|(deferred, work)| async move { (deferred, guarded(work).await) })
                .collect();
            while let Some(done) = running.next().await {
                inbox.complete(vec![done]);
            }
        });
    }

    /// From any thread: queues outcomes and wakes JavaScript unless a wake-up is on its way.
    pub fn complete(self: &Arc<Self>, outcomes: Vec<(Deferred, Outcome)>) {
        lock(&self.queue).extend(outcomes);
        if self.wake_scheduled.swap(true, Ordering::AcqRel) {
            return;
        }
        let data = Arc::into_raw(self.clone()) as *mut c_void;
        if !self.tsfn.call(data) {
            // Node is shutting down: nothing is left to settle the promises for.
            // SAFETY: the call was refused, so `call_js` will not take this `Arc` back.
            drop(unsafe { Arc::from_raw(data as *const Self) });
        }
    }

    /// On the JavaScript thread: settles everything queued.
    fn settle_all(&self, env: Env) {
        self.wake_scheduled.store(false, Ordering::Release);
        let batch = std::mem::take(&mut *lock(&self.queue));
        let settled = batch.len();
        for (deferred, outcome) in batch {
            js::settle(env, deferred, to_js(env, outcome));
        }
        if settled > 0 && self.in_flight.fetch_sub(settled, Ordering::Relaxed) == settled {
            self.tsfn.unref(env);
        }
    }
}

/// Runs on the JavaScript thread for each wake-up. `data` is the `Arc<Inbox>` that
/// `complete` leaked for it.
unsafe extern "C" fn call_js(env: Env, _callback: Value, _context: *mut c_void, data: *mut c_void) {
    // SAFETY: `complete` leaked exactly one `Arc` per accepted call; take it back.
    let inbox = unsafe { Arc::from_raw(data as *const Inbox) };
    if env.is_null() {
        // The environment is being torn down; there is no JavaScript left to answer.
        return;
    }
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| inbox.settle_all(env)));
}
