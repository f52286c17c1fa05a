//! The one way across: from Node's thread to the Tokio runtime, and back.
//!
//! **Across.** Work leaves Node's thread alone ([`Crossing::run`]) or in a batch: what a
//! [`Queue`] takes during one turn of JavaScript (before its microtasks run out) leaves
//! together at the turn's end, as one task on the runtime, however many calls the turn made.
//! Lease calls, publishes, acks and nacks each have a queue. The lease calls of a provider
//! whose connection runs on Node's own loop (`node_loop.rs`) stay on Node's thread: their
//! batch is polled there.
//!
//! **Back.** Finished work hands its outcomes to the crossing ([`Crossing::complete`], from
//! any thread); the first to arrive wakes Node's thread once through a thread-safe function,
//! and that wake-up settles every promise that arrived by then. Work that ran on Node's own
//! loop (`node_loop.rs`: a connection's sockets polled there) settles its promises there,
//! once the loop's work at hand is done, waking nothing.
//!
//! A napi-rs `async fn` pays a hop onto the runtime and a wake-up of Node's event loop per
//! call; under load that, not Redis, is what limits a client (`docs/benchmarks.md`).
//!
//! The thread-safe function keeps Node's event loop alive only while promises are pending,
//! so a process whose providers are idle or closed exits by itself. Panics stop here: a
//! panic in work on the runtime rejects its promises with `ERR_LEASE_INTERNAL`, and one on
//! Node's thread never unwinds into Node.

#[cfg(unix)]
mod node_loop;
mod queue;
mod tsfn;
mod turn;
#[cfg(unix)]
mod uv;

use std::ffi::c_void;
use std::future::Future;
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

pub use queue::{Answers, Queue};
pub use tsfn::JsCallback;
use tsfn::Tsfn;

use super::js::{self, Deferred, Env, Value};
use super::reply::{to_js, Outcome};
use super::runtime;
use crate::core::connection::Reactor;
use crate::core::{lock, Error, Result};

/// Node's event loop, for a connection to run on (`node_loop.rs`): none on Bun
/// or Deno, or where libuv cannot be found in the process.
#[cfg(unix)]
pub fn node_loop(env: Env) -> Option<Arc<dyn Reactor>> {
    node_loop::NodeLoop::of(env).map(|l| l as Arc<dyn Reactor>)
}

/// Node's event loop: not used off Unix, where the runtime's thread does the I/O.
#[cfg(not(unix))]
pub fn node_loop(_env: Env) -> Option<Arc<dyn Reactor>> {
    None
}

/// One class instance's way across and back.
pub struct Crossing {
    tsfn: Tsfn,
    /// Outcomes waiting for Node's thread.
    arrived: Mutex<Vec<(Deferred, Outcome)>>,
    /// A wake-up of Node's thread is on its way; later outcomes ride along with it.
    wake_scheduled: AtomicBool,
    /// Promises pending; while non-zero the event loop stays alive. Changed on Node's thread.
    pending: AtomicUsize,
    /// Node's thread, where the promises were made ([`thread_mark`]).
    thread: usize,
}

impl Crossing {
    /// On Node's thread: makes the thread-safe function, not keeping the event loop alive.
    pub fn new(env: Env) -> napi::Result<Arc<Self>> {
        let tsfn = Tsfn::new(env, None, ptr::null_mut(), wake)?;
        Ok(Arc::new(Self {
            tsfn,
            arrived: Mutex::new(Vec::new()),
            wake_scheduled: AtomicBool::new(false),
            pending: AtomicUsize::new(0),
            thread: thread_mark(),
        }))
    }

    /// On Node's thread: a new promise whose outcome will come back through this crossing.
    /// The event loop stays alive until it does.
    pub fn promise(&self, env: Env) -> (Deferred, Value) {
        if self.pending.fetch_add(1, Ordering::Relaxed) == 0 {
            self.tsfn.refer(env);
        }
        js::promise(env)
    }

    /// On Node's thread: runs `work` on the runtime, alone, and answers a promise of its
    /// outcome.
    pub fn run(
        self: &Arc<Self>,
        env: Env,
        work: impl Future<Output = Outcome> + Send + 'static,
    ) -> Value {
        let (deferred, promise) = self.promise(env);
        match runtime() {
            Ok(runtime) => {
                let crossing = self.clone();
                runtime.spawn(async move {
                    let outcome = guarded(work).await;
                    crossing.complete(vec![(deferred, outcome)]);
                });
            }
            Err(err) => self.complete(vec![(deferred, Err(err))]),
        }
        promise
    }

    /// From any thread: queues outcomes for Node's thread and wakes it, unless a wake-up is
    /// already on its way.
    pub fn complete(self: &Arc<Self>, outcomes: Vec<(Deferred, Outcome)>) {
        lock(&self.arrived).extend(outcomes);
        if self.wake_scheduled.swap(true, Ordering::AcqRel) {
            return;
        }
        // Answered on Node's own loop: settled there as soon as the loop's work is done.
        #[cfg(unix)]
        if self.thread == thread_mark() && node_loop::settle_after(self) {
            return;
        }
        let data = Arc::into_raw(self.clone()) as *mut c_void;
        if !self.tsfn.call(data) {
            // Node is shutting down: nothing is left to settle the promises for.
            // SAFETY: the call was refused, so `wake` will not take this `Arc` back.
            drop(unsafe { Arc::from_raw(data as *const Self) });
        }
    }

    /// On Node's thread: settles everything that arrived.
    pub(super) fn settle_arrived(&self, env: Env) {
        self.wake_scheduled.store(false, Ordering::Release);
        let mut arrived = std::mem::take(&mut *lock(&self.arrived));
        let settled = arrived.len();
        for (deferred, outcome) in arrived.drain(..) {
            js::settle(env, deferred, to_js(env, outcome));
        }
        give_back(&mut lock(&self.arrived), arrived);
        if settled > 0 && self.pending.fetch_sub(settled, Ordering::Relaxed) == settled {
            self.tsfn.unref(env);
        }
    }
}

/// Runs on Node's thread for each wake-up. `data` is the `Arc<Crossing>` that `complete`
/// leaked for it.
unsafe extern "C" fn wake(env: Env, _callback: Value, _context: *mut c_void, data: *mut c_void) {
    // SAFETY: `complete` leaked exactly one `Arc` per accepted call; take it back.
    let crossing = unsafe { Arc::from_raw(data as *const Crossing) };
    if env.is_null() {
        // The environment is being torn down; there is no JavaScript left to answer.
        return;
    }
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        crossing.settle_arrived(env)
    }));
}

thread_local! {
    static MARK: u8 = const { 0 };
}

/// A number unique to this thread while it lives (the address of a thread-local of its own):
/// cheaper to ask for than the thread's id, on the path of every call.
fn thread_mark() -> usize {
    MARK.with(|mark| mark as *const u8 as usize)
}

/// On Node's thread: a promise already settled with `outcome` (bad input, a closed class).
pub fn settled(env: Env, outcome: Outcome) -> Value {
    let (deferred, promise) = js::promise(env);
    js::settle(env, deferred, to_js(env, outcome));
    promise
}

/// On Node's thread: a promise already resolved with `undefined`.
pub fn resolved(env: Env) -> Value {
    settled(env, Ok(super::reply::Reply::Undefined))
}

/// Awaits `work` on the runtime, turning a panic into an internal error so it never tears
/// down the task that would have answered the caller.
pub async fn guarded<T>(work: impl Future<Output = Result<T>>) -> Result<T> {
    use futures::FutureExt;
    std::panic::AssertUnwindSafe(work)
        .catch_unwind()
        .await
        .unwrap_or_else(|panic| Err(Error::Internal(panic_message(panic.as_ref()))))
}

/// Runs `f` on Node's thread, turning a panic into an internal error so it never unwinds
/// into Node.
pub fn catching<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
        .unwrap_or_else(|panic| Err(Error::Internal(panic_message(panic.as_ref()))))
}

/// The text of a caught panic.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned())
}

/// Puts `spent` back, emptied, where it was taken from whole, unless something was added
/// there since (the slot has room of its own): the crossing's lists are taken once or more
/// per call, and the next call then finds room where it would grow a list from nothing.
fn give_back<T>(slot: &mut Vec<T>, mut spent: Vec<T>) {
    spent.clear();
    if slot.capacity() == 0 {
        *slot = spent;
    }
}
