//! Node's own event loop as the [`Reactor`] of a provider's connection (to one server, the
//! master behind Sentinel, or a Cluster's masters): libuv reports when a socket is ready, and the connection's driver and the turn's lease calls
//! are polled here, on Node's thread. A call is then written from Node's thread and its
//! reply read there, as node-redis does; the runtime's thread is not woken on the way
//! (docs/benchmarks.md: two wake-ups of a thread per call were most of what a call cost).
//!
//! - **Work** ([`Reactor::spawn`]) is a future polled on Node's
//!   thread, inside the runtime's context (its timers still bound every call). Work woken
//!   here runs before the current callback returns; work woken on another thread (a timer, a
//!   command sent from the runtime) wakes Node's loop through a `uv_async_t`.
//! - **Sockets** ([`Reactor::socket`]) are read and written without blocking, each with a
//!   `uv_poll_t` that reports them ready. Every handle is unref'd: the promises of the calls
//!   keep the process alive (the crossing refs its thread-safe function while any is pending),
//!   an idle connection does not.
//! - **Teardown**: when the environment goes (a worker ends, Node exits), the work left is
//!   dropped and the handles are closed.
//!
//! libuv is reached through `uv.rs`, which finds it in the running process: a runtime that
//! has it (Node) gets the loop; one that does not, or only imitates Node (Bun, Deno), and
//! platforms other than unix keep the runtime's thread. The sockets are `socket.rs`'s.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::ffi::c_void;
use std::io;
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll, Wake, Waker};

use futures::future::BoxFuture;

use super::turn::Job;
use super::uv::{self, Check, Signal};
use super::{give_back, thread_mark, Crossing};
use crate::core::connection::{Reactor, Socket};
use crate::core::lock;
use crate::glue::js::{self, Env};
use crate::glue::runtime;
use socket::{Io, LoopSocket};

mod socket;

/// What other threads share with Node's thread.
struct Shared {
    /// Node's thread ([`thread_mark`]).
    thread: usize,
    /// Tasks woken, by id.
    woken: Mutex<Vec<u64>>,
    /// Work handed in, for Node's thread to take up.
    incoming: Mutex<Vec<BoxFuture<'static, ()>>>,
    /// What wakes Node's thread; `None` once the environment is gone.
    signal: Mutex<Option<Signal>>,
}

impl Shared {
    fn here(&self) -> bool {
        thread_mark() == self.thread
    }

    /// Makes sure Node's thread runs what was woken or handed in: now, where that is this
    /// thread in the middle of running it; otherwise through the loop.
    fn nudge(&self) {
        if self.here() && DRAINING.get() {
            return;
        }
        if let Some(signal) = &*lock(&self.signal) {
            signal.send();
        }
    }
}

/// A task's waker: from any thread, marks it woken.
struct TaskWaker {
    id: u64,
    shared: Arc<Shared>,
}

impl Wake for TaskWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let first = {
            let mut woken = lock(&self.shared.woken);
            woken.push(self.id);
            woken.len() == 1
        };
        if first {
            self.shared.nudge();
        }
    }
}

struct Task {
    work: BoxFuture<'static, ()>,
    waker: Waker,
}

/// This thread's loop: its environment, the tasks, the shared part.
struct Local {
    env: Env,
    shared: Arc<Shared>,
    /// By id: ids count up from 1, so a fixed hash seed is as good as a random one.
    tasks: HashMap<u64, Task, foldhash::fast::FixedState>,
    next: u64,
    /// For settling promises from libuv's callbacks.
    context: js::AsyncContext,
    /// The sockets polled here, for [`catch_up`]; a dropped one is forgotten as the next is
    /// made.
    sockets: Vec<Weak<Io>>,
    /// Runs the jobs deferred by [`after_poll`] once the loop is done with its poll.
    after_poll: Check,
}

thread_local! {
    static LOCAL: RefCell<Option<Local>> = const { RefCell::new(None) };
    /// Woken tasks are being polled on this thread now.
    static DRAINING: Cell<bool> = const { Cell::new(false) };
    /// What a socket's answers settle runs now: libuv is calling back the sockets it found
    /// ready, and more may follow before its poll is done.
    static IN_POLL: Cell<bool> = const { Cell::new(false) };
    /// Jobs for the end of the loop's poll ([`after_poll`]).
    static AFTER_POLL: RefCell<Vec<Job>> = const { RefCell::new(Vec::new()) };
    /// Crossings with outcomes to settle once the tasks are polled.
    static SETTLE: RefCell<Vec<Arc<Crossing>>> = const { RefCell::new(Vec::new()) };
    /// The lists [`drain`] swaps with the shared ones, empty, their room kept between drains.
    static SPARE: Cell<(Vec<BoxFuture<'static, ()>>, Vec<u64>)> = const { Cell::new((Vec::new(), Vec::new())) };
}

/// On Node's thread, while this loop polls its tasks: `crossing` settles what arrived once
/// they are done (`false` when not polling: the crossing wakes Node's thread itself).
pub(super) fn settle_after(crossing: &Arc<Crossing>) -> bool {
    if !DRAINING.get() {
        return false;
    }
    SETTLE.with(|settle| settle.borrow_mut().push(crossing.clone()));
    true
}

/// Settles what the tasks just polled answered: in a callback scope when libuv called
/// (`scoped`), so promise reactions run as it closes; as they are within a turn of
/// JavaScript otherwise.
fn settle(scoped: bool) {
    let crossings = SETTLE.with(|settle| std::mem::take(&mut *settle.borrow_mut()));
    if crossings.is_empty() {
        return;
    }
    // Not borrowed while settling: closing the callback scope runs JavaScript, which may call
    // in again.
    let Some((env, context)) = LOCAL.with(|l| l.borrow().as_ref().map(|l| (l.env, l.context)))
    else {
        return;
    };
    let settle_all = || crossings.iter().for_each(|c| c.settle_arrived(env));
    match scoped {
        true => js::in_callback_scope(env, &context, settle_all),
        false => settle_all(),
    }
    SETTLE.with(|settle| {
        if let Ok(mut settle) = settle.try_borrow_mut() {
            give_back(&mut settle, crossings);
        }
    });
}

/// Node's event loop, as a [`Reactor`].
pub struct NodeLoop {
    shared: Arc<Shared>,
}

impl NodeLoop {
    /// On Node's thread: the loop of this environment, made on first use; `None` where libuv
    /// is not there to be used (see the module's comment).
    pub fn of(env: Env) -> Option<Arc<Self>> {
        if let Some(shared) = LOCAL.with(|local| {
            let local = local.borrow();
            local
                .as_ref()
                .filter(|l| l.env == env)
                .map(|l| l.shared.clone())
        }) {
            return Some(Arc::new(Self { shared }));
        }
        if !uv::available() || imitates_node(env) {
            return None;
        }
        let uv_loop = uv::Loop::of(env)?;
        let context = js::async_context(env, "mastra-lease")?;
        let shared = Arc::new(Shared {
            thread: thread_mark(),
            woken: Mutex::new(Vec::new()),
            incoming: Mutex::new(Vec::new()),
            signal: Mutex::new(Some(Signal::open(uv_loop, on_signal)?)),
        });
        let after_poll = Check::open(uv_loop, run_after_poll)?;
        js::on_teardown(env, teardown);
        LOCAL.with(|local| {
            *local.borrow_mut() = Some(Local {
                env,
                shared: shared.clone(),
                tasks: HashMap::default(),
                next: 0,
                context,
                sockets: Vec::new(),
                after_poll,
            })
        });
        Some(Arc::new(Self { shared }))
    }
}

impl Reactor for NodeLoop {
    /// On Node's thread, outside this loop's own polling (a turn's end, where a queue sends
    /// its batch), `work` is polled at once, until it waits on something; from anywhere else,
    /// once the loop comes round.
    fn spawn(&self, work: BoxFuture<'static, ()>) {
        if lock(&self.shared.signal).is_none() {
            return; // The environment is gone: nothing would ever poll it.
        }
        if self.shared.here() && !DRAINING.get() {
            lock(&self.shared.incoming).push(work);
            drain();
            return settle(false);
        }
        let first = {
            let mut incoming = lock(&self.shared.incoming);
            incoming.push(work);
            incoming.len() == 1
        };
        if first {
            self.shared.nudge();
        }
    }

    fn socket(&self, socket: std::net::TcpStream) -> io::Result<Box<dyn Socket>> {
        if !self.shared.here() {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "not on the event loop's thread",
            ));
        }
        let uv_loop = LOCAL
            .with(|local| local.borrow().as_ref().and_then(|l| uv::Loop::of(l.env)))
            .ok_or_else(|| io::Error::new(io::ErrorKind::BrokenPipe, "the event loop is gone"))?;
        let socket = LoopSocket::new(socket, uv_loop)?;
        LOCAL.with(|local| {
            if let Some(local) = local.borrow_mut().as_mut() {
                local.sockets.retain(|io| io.strong_count() > 0);
                local.sockets.push(Arc::downgrade(socket.io()));
            }
        });
        Ok(Box::new(socket))
    }

    fn caught_up(&self) -> BoxFuture<'static, ()> {
        let (done, caught_up) = futures::channel::oneshot::channel::<()>();
        self.spawn(Box::pin(async move {
            catch_up();
            // Polled again once the readers just woken were: they come first in the queue.
            let mut yielded = false;
            std::future::poll_fn(|cx| match std::mem::replace(&mut yielded, true) {
                false => {
                    cx.waker().wake_by_ref();
                    Poll::Pending
                }
                true => Poll::Ready(()),
            })
            .await;
            let _ = done.send(());
        }));
        // Dropped unsent when the loop is gone: nothing is left to read then.
        Box::pin(async move {
            let _ = caught_up.await;
        })
    }
}

/// On Node's thread: every socket polled here is read again, whatever libuv last reported
/// (a reply may sit in it unread when the loop could not run), its reader woken.
fn catch_up() {
    let sockets: Vec<Arc<Io>> = LOCAL.with(|local| {
        local.borrow().as_ref().map_or_else(Vec::new, |l| {
            l.sockets.iter().filter_map(Weak::upgrade).collect()
        })
    });
    for io in sockets {
        io.catch_up();
    }
}

/// Whether the runtime only imitates Node's API (Bun, Deno), whose libuv, if any, is not the
/// loop it runs.
fn imitates_node(env: Env) -> bool {
    let global = js::global(env);
    [c"Bun", c"Deno"].iter().any(|name| {
        js::property(env, global, name)
            .is_ok_and(|value| js::type_of(env, value) != napi::sys::ValueType::napi_undefined)
    })
}

/// Polls every task woken and all work handed in, until none is left, on Node's thread.
fn drain() {
    let Some(shared) = LOCAL.with(|l| l.borrow().as_ref().map(|l| l.shared.clone())) else {
        return;
    };
    let _context = runtime().ok().map(|runtime| runtime.enter());
    DRAINING.set(true);
    // Each list is swapped with a spare of the same room, not taken: a wake-up or work handed
    // in then finds room, where a list taken whole grew from nothing for every call.
    let (mut incoming, mut woken) = SPARE.take();
    loop {
        std::mem::swap(&mut incoming, &mut *lock(&shared.incoming));
        for work in incoming.drain(..) {
            LOCAL.with(|local| {
                if let Some(local) = local.borrow_mut().as_mut() {
                    local.next += 1;
                    let id = local.next;
                    let waker = Waker::from(Arc::new(TaskWaker {
                        id,
                        shared: shared.clone(),
                    }));
                    local.tasks.insert(id, Task { work, waker });
                    lock(&shared.woken).push(id);
                }
            });
        }
        std::mem::swap(&mut woken, &mut *lock(&shared.woken));
        if woken.is_empty() {
            break;
        }
        for id in woken.drain(..) {
            let Some(mut task) = LOCAL.with(|l| l.borrow_mut().as_mut()?.tasks.remove(&id)) else {
                continue;
            };
            let mut context = Context::from_waker(&task.waker);
            let pending = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                task.work.as_mut().poll(&mut context).is_pending()
            }));
            if pending.unwrap_or(false) {
                LOCAL.with(|l| {
                    if let Some(local) = l.borrow_mut().as_mut() {
                        local.tasks.insert(id, task);
                    }
                });
            }
            // A finished (or panicked) task is dropped here, outside the borrow: dropping a
            // connection's driver closes its socket's handle.
        }
    }
    SPARE.set((incoming, woken));
    DRAINING.set(false);
}

/// Settles what the tasks just polled answered, from a socket's callback: the JavaScript
/// that runs then is in [`after_poll`]'s reach.
pub(super) fn settle_in_poll() {
    /// Puts `IN_POLL` back as it was, however the settling ends.
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            IN_POLL.set(self.0);
        }
    }
    let _restore = Restore(IN_POLL.replace(true));
    settle(true);
}

/// On Node's thread, while a socket's answers settle (JavaScript reacting to them): runs
/// `job` once the loop has called back every socket it found ready, with the jobs the other
/// sockets' answers deferred, as node-redis writes on `setImmediate`. So the calls that the
/// answers of several connections make leave together: one write per connection, where each
/// answer's turn of JavaScript wrote its own. Anywhere else, hands `job` back.
pub(super) fn after_poll(job: Job) -> Result<(), Job> {
    if !IN_POLL.get() {
        return Err(job);
    }
    let started = LOCAL.with(|l| l.borrow().as_ref().is_some_and(|l| l.after_poll.start()));
    if !started {
        return Err(job);
    }
    AFTER_POLL.with(|jobs| jobs.borrow_mut().push(job));
    Ok(())
}

/// The check's callback: the loop's poll is done; the deferred jobs run, in a callback scope
/// (what they settle runs its reactions as it closes).
fn run_after_poll() {
    let Some((env, context)) = LOCAL.with(|l| {
        let local = l.borrow();
        let local = local.as_ref()?;
        local.after_poll.stop();
        Some((local.env, local.context))
    }) else {
        return;
    };
    let jobs = AFTER_POLL.with(|jobs| std::mem::take(&mut *jobs.borrow_mut()));
    js::in_callback_scope(env, &context, || jobs.into_iter().for_each(|job| job()));
}

/// The signal's callback: work was woken or handed in on another thread.
fn on_signal() {
    drain();
    settle(true);
}

/// The environment is going: its work is dropped (closing the sockets' handles) and the
/// async handle closed.
unsafe extern "C" fn teardown(_arg: *mut c_void) {
    let _ = std::panic::catch_unwind(|| {
        let Some(local) = LOCAL.with(|l| l.borrow_mut().take()) else {
            return;
        };
        lock(&local.shared.incoming).clear();
        drop(local.tasks);
        AFTER_POLL.with(|jobs| jobs.borrow_mut().clear());
        local.after_poll.close();
        let signal = lock(&local.shared.signal).take();
        if let Some(signal) = signal {
            signal.close();
        }
    });
}
