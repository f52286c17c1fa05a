//! Node's own event loop as the [`Reactor`] of a provider's connection to one server: libuv
//! reports when the socket is ready, and the connection's driver and the turn's lease calls
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
//! libuv's functions are looked up in the running process, not linked: a runtime that has
//! them (Node) gets the loop; one that does not, or only imitates Node (Bun, Deno), and
//! platforms other than unix keep the runtime's thread.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::ffi::{c_int, c_void, CStr};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::task::{Context, Poll, Wake, Waker};

use futures::future::BoxFuture;
use redis::io::tcp::socket2::SockRef;

use super::{give_back, thread_mark, Crossing};
use crate::core::connection::{Reactor, Socket};
use crate::core::lock;
use crate::glue::js::{self, Env};
use crate::glue::runtime;

/// The libuv functions this module calls, found in the process.
struct Uv {
    handle_size: unsafe extern "C" fn(c_int) -> usize,
    close: unsafe extern "C" fn(*mut c_void, Option<unsafe extern "C" fn(*mut c_void)>),
    unref: unsafe extern "C" fn(*mut c_void),
    async_init:
        unsafe extern "C" fn(*mut c_void, *mut c_void, unsafe extern "C" fn(*mut c_void)) -> c_int,
    async_send: unsafe extern "C" fn(*mut c_void) -> c_int,
    poll_init: unsafe extern "C" fn(*mut c_void, *mut c_void, c_int) -> c_int,
    poll_start: unsafe extern "C" fn(*mut c_void, c_int, PollCallback) -> c_int,
    poll_stop: unsafe extern "C" fn(*mut c_void) -> c_int,
}

type PollCallback = unsafe extern "C" fn(*mut c_void, c_int, c_int);

// libuv's `uv_handle_type` and `uv_poll_event` values, stable across its 1.x releases.
const UV_ASYNC: c_int = 1;
const UV_POLL: c_int = 8;
const UV_READABLE: c_int = 1;
const UV_WRITABLE: c_int = 2;

/// libuv, if this process has it.
fn uv() -> Option<&'static Uv> {
    static UV: OnceLock<Option<Uv>> = OnceLock::new();
    UV.get_or_init(|| {
        // SAFETY: each symbol is libuv's function of that name, whose C signature the field's
        // type spells out.
        unsafe {
            Some(Uv {
                handle_size: find(c"uv_handle_size")?,
                close: find(c"uv_close")?,
                unref: find(c"uv_unref")?,
                async_init: find(c"uv_async_init")?,
                async_send: find(c"uv_async_send")?,
                poll_init: find(c"uv_poll_init")?,
                poll_start: find(c"uv_poll_start")?,
                poll_stop: find(c"uv_poll_stop")?,
            })
        }
    })
    .as_ref()
}

/// The function `name` of the process, as a pointer of type `F`.
///
/// # Safety
/// `F` is a function pointer type matching the C signature of the symbol `name`.
unsafe fn find<F: Copy>(name: &CStr) -> Option<F> {
    // SAFETY: dlsym with a NUL-terminated name; a null answer is checked.
    let found = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
    // SAFETY: the caller's promise; a function pointer is as large as a data pointer here.
    (!found.is_null()).then(|| unsafe { std::mem::transmute_copy::<*mut c_void, F>(&found) })
}

/// A libuv handle's memory: zeroed, as large as libuv says that kind is, its first field
/// (`data`) pointing at what its callbacks need. Freed by [`closed`] once libuv let it go.
#[derive(Clone, Copy)]
struct Handle(*mut c_void);

// SAFETY: the pointer is only handed to libuv on Node's thread, but for `uv_async_send`,
// which libuv allows from any thread (and which the `signal` lock keeps off a closed one).
unsafe impl Send for Handle {}

impl Handle {
    fn new(uv: &Uv, kind: c_int, data: *const c_void) -> Self {
        // SAFETY: libuv's size for the kind; calloc zeroes it (or answers null, checked by
        // the caller through `is_null`).
        let raw = unsafe { libc::calloc(1, (uv.handle_size)(kind)) };
        if !raw.is_null() {
            // SAFETY: `data` is the first field of every libuv handle.
            unsafe { *(raw as *mut *const c_void) = data };
        }
        Self(raw)
    }

    /// What [`Handle::new`] stored in `data`.
    ///
    /// # Safety
    /// `raw` is a live handle made by [`Handle::new`].
    unsafe fn data(raw: *mut c_void) -> *const c_void {
        // SAFETY: the caller's promise.
        unsafe { *(raw as *const *const c_void) }
    }
}

/// libuv's close callback: the handle's memory goes, and what its `data` held.
unsafe extern "C" fn closed(raw: *mut c_void) {
    let _ = std::panic::catch_unwind(|| {
        // SAFETY: every handle of this module keeps in `data` either nothing or one leaked
        // `Arc<Io>` (sockets), taken back here once; the memory came from calloc.
        unsafe {
            let data = Handle::data(raw);
            if !data.is_null() {
                drop(Arc::from_raw(data as *const Io));
            }
            libc::free(raw);
        }
    });
}

/// What other threads share with Node's thread.
struct Shared {
    /// Node's thread ([`thread_mark`]).
    thread: usize,
    /// Tasks woken, by id.
    woken: Mutex<Vec<u64>>,
    /// Work handed in, for Node's thread to take up.
    incoming: Mutex<Vec<BoxFuture<'static, ()>>>,
    /// The `uv_async_t` that wakes Node's thread; `None` once the environment is gone.
    signal: Mutex<Option<Handle>>,
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
        if let (Some(uv), Some(signal)) = (uv(), *lock(&self.signal)) {
            // SAFETY: the handle is open while `signal` holds it (teardown takes it first).
            unsafe { (uv.async_send)(signal.0) };
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
}

thread_local! {
    static LOCAL: RefCell<Option<Local>> = const { RefCell::new(None) };
    /// Woken tasks are being polled on this thread now.
    static DRAINING: Cell<bool> = const { Cell::new(false) };
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
        let uv = uv()?;
        if imitates_node(env) {
            return None;
        }
        let uv_loop = js::uv_loop(env)?;
        let context = js::async_context(env, "mastra-lease")?;
        let shared = Arc::new(Shared {
            thread: thread_mark(),
            woken: Mutex::new(Vec::new()),
            incoming: Mutex::new(Vec::new()),
            signal: Mutex::new(None),
        });
        let signal = Handle::new(uv, UV_ASYNC, std::ptr::null());
        if signal.0.is_null() {
            return None;
        }
        // SAFETY: a fresh zeroed handle of the async kind, on the loop's own thread.
        if unsafe { (uv.async_init)(uv_loop, signal.0, on_signal) } != 0 {
            // SAFETY: never initialized, so libuv does not know it.
            unsafe { libc::free(signal.0) };
            return None;
        }
        // SAFETY: an initialized handle, on its loop's thread.
        unsafe { (uv.unref)(signal.0) };
        *lock(&shared.signal) = Some(signal);
        js::on_teardown(env, teardown);
        LOCAL.with(|local| {
            *local.borrow_mut() = Some(Local {
                env,
                shared: shared.clone(),
                tasks: HashMap::default(),
                next: 0,
                context,
                sockets: Vec::new(),
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
        let uv = uv().filter(|_| self.shared.here()).ok_or_else(|| {
            io::Error::new(io::ErrorKind::Unsupported, "not on the event loop's thread")
        })?;
        let uv_loop = LOCAL
            .with(|local| local.borrow().as_ref().and_then(|l| js::uv_loop(l.env)))
            .ok_or_else(|| io::Error::new(io::ErrorKind::BrokenPipe, "the event loop is gone"))?;
        socket.set_nonblocking(true)?;
        let io = Arc::new(Io {
            wakers: Mutex::new(Wakers {
                readable: true,
                ..Wakers::default()
            }),
            poll: Mutex::new(None),
        });
        let handle = Handle::new(uv, UV_POLL, Arc::into_raw(io.clone()).cast());
        if handle.0.is_null() {
            // SAFETY: the Arc leaked for the handle that was not made.
            drop(unsafe { Arc::from_raw(Arc::as_ptr(&io)) });
            return Err(io::Error::from(io::ErrorKind::OutOfMemory));
        }
        let refused = || io::Error::other("libuv would not poll the socket");
        // SAFETY: a fresh zeroed poll handle on this loop's thread, the socket open.
        if unsafe { (uv.poll_init)(uv_loop, handle.0, socket.as_raw_fd()) } != 0 {
            // SAFETY: libuv does not know the handle: its memory and the Arc leaked for it go
            // by hand.
            unsafe {
                drop(Arc::from_raw(Arc::as_ptr(&io)));
                libc::free(handle.0);
            }
            return Err(refused());
        }
        // SAFETY: an initialized poll handle, on its loop's thread; closing it frees it.
        unsafe {
            if (uv.poll_start)(handle.0, UV_READABLE, on_ready) != 0 {
                (uv.close)(handle.0, Some(closed));
                return Err(refused());
            }
            (uv.unref)(handle.0);
        }
        *lock(&io.poll) = Some(handle);
        LOCAL.with(|local| {
            if let Some(local) = local.borrow_mut().as_mut() {
                local.sockets.retain(|io| io.strong_count() > 0);
                local.sockets.push(Arc::downgrade(&io));
            }
        });
        Ok(Box::new(LoopSocket { stream: socket, io }))
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
        let read = {
            let mut wakers = lock(&io.wakers);
            wakers.readable = true;
            wakers.read.take()
        };
        if let Some(read) = read {
            read.wake();
        }
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

/// The `uv_async_t`'s callback: work was woken or handed in on another thread.
unsafe extern "C" fn on_signal(_handle: *mut c_void) {
    let _ = std::panic::catch_unwind(|| {
        drain();
        settle(true);
    });
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
        let signal = lock(&local.shared.signal).take();
        if let (Some(uv), Some(signal)) = (uv(), signal) {
            // SAFETY: open until now, on its loop's thread; `closed` frees it.
            unsafe { (uv.close)(signal.0, Some(closed)) };
        }
    });
}

/// Who waits for a socket to become readable or writable.
#[derive(Default)]
struct Wakers {
    read: Option<Waker>,
    write: Option<Waker>,
    /// A read may find data: true until one would block, and again once libuv reports the
    /// socket readable. While false a read waits without asking the kernel (redis-rs' driver
    /// reads again after each write and each reply; most of those reads would find nothing).
    readable: bool,
    /// Writability is being watched for (only while a write would have blocked).
    watching_write: bool,
    /// libuv reported an error on the socket (a reset, say) and stopped polling it, for good:
    /// every read and write now asks the kernel, which hands over what the socket still holds
    /// (replies that came before the reset) and then the error. Nothing will report the socket
    /// ready again, so one that would block has failed.
    failed: bool,
}

/// A socket's state shared with its poll handle's callback.
struct Io {
    wakers: Mutex<Wakers>,
    /// The poll handle; `None` once closed.
    poll: Mutex<Option<Handle>>,
}

/// A TCP socket polled by Node's loop. Made, used and dropped on Node's thread (the
/// connection's driver runs there).
struct LoopSocket {
    stream: std::net::TcpStream,
    io: Arc<Io>,
}

impl Socket for LoopSocket {}

impl LoopSocket {
    /// Watches for writability too, until a write can go on.
    fn watch_write(&self, cx: &Context<'_>) {
        let mut wakers = lock(&self.io.wakers);
        wakers.write = Some(cx.waker().clone());
        if !wakers.watching_write && !wakers.failed {
            wakers.watching_write = true;
            if let (Some(uv), Some(poll)) = (uv(), *lock(&self.io.poll)) {
                // SAFETY: an open poll handle, on its loop's thread.
                unsafe { (uv.poll_start)(poll.0, UV_READABLE | UV_WRITABLE, on_ready) };
            }
        }
    }

    fn would_block<T>(
        &self,
        outcome: io::Result<T>,
        cx: &Context<'_>,
        read: bool,
    ) -> Poll<io::Result<T>> {
        match outcome {
            Err(err) if err.kind() == io::ErrorKind::WouldBlock && lock(&self.io.wakers).failed => {
                let reported = self.stream.take_error().ok().flatten();
                Poll::Ready(Err(reported.unwrap_or_else(|| {
                    io::Error::new(
                        io::ErrorKind::ConnectionReset,
                        "the event loop reported the socket failed",
                    )
                })))
            }
            Err(err) if err.kind() == io::ErrorKind::WouldBlock => {
                match read {
                    true => {
                        let mut wakers = lock(&self.io.wakers);
                        wakers.readable = false;
                        wakers.read = Some(cx.waker().clone());
                    }
                    false => self.watch_write(cx),
                }
                Poll::Pending
            }
            Err(err) if err.kind() == io::ErrorKind::Interrupted => {
                cx.waker().wake_by_ref();
                Poll::Pending
            }
            other => Poll::Ready(other),
        }
    }
}

impl tokio::io::AsyncRead for LoopSocket {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        {
            let mut wakers = lock(&this.io.wakers);
            if !wakers.readable && !wakers.failed {
                wakers.read = Some(cx.waker().clone());
                return Poll::Pending;
            }
        }
        let wanted = buf.remaining();
        // Into the buffer's spare room as it is: zeroing it first (`initialize_unfilled`)
        // cost more than the rest of the read (its room is kilobytes, a reply a few bytes).
        // SAFETY: `recv` only writes into the room, never de-initializes any of it.
        let read = SockRef::from(&this.stream).recv(unsafe { buf.unfilled_mut() });
        if matches!(read, Ok(n) if n > 0 && n < wanted) {
            // The kernel had less than asked for: nothing is left, until libuv says so.
            lock(&this.io.wakers).readable = false;
        }
        this.would_block(read, cx, true).map_ok(|n| {
            // SAFETY: `recv` wrote the first `n` bytes of the room.
            unsafe { buf.assume_init(n) };
            buf.advance(n);
        })
    }
}

impl tokio::io::AsyncWrite for LoopSocket {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bytes: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let written = (&this.stream).write(bytes);
        this.would_block(written, cx, false)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let written = (&this.stream).write_vectored(bufs);
        this.would_block(written, cx, false)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(self.stream.shutdown(std::net::Shutdown::Write))
    }
}

impl Drop for LoopSocket {
    fn drop(&mut self) {
        // Stopped and closed before the socket itself closes (after this body).
        if let (Some(uv), Some(poll)) = (uv(), lock(&self.io.poll).take()) {
            // SAFETY: an open poll handle; sockets are dropped on their loop's thread (their
            // driver runs there), and teardown drops them before the loop goes.
            unsafe {
                (uv.poll_stop)(poll.0);
                (uv.close)(poll.0, Some(closed));
            }
        }
    }
}

/// A poll handle's callback: wakes who waits for what libuv reports (both, on an error,
/// so the next read or write meets it), then runs what that woke.
unsafe extern "C" fn on_ready(raw: *mut c_void, status: c_int, events: c_int) {
    let _ = std::panic::catch_unwind(|| {
        // SAFETY: the handle is open, so its `data` still holds its leaked `Arc<Io>`.
        let io = unsafe { &*(Handle::data(raw) as *const Io) };
        let (read, write) = {
            let mut wakers = lock(&io.wakers);
            let failed = status < 0;
            wakers.failed |= failed;
            let readable = failed || events & UV_READABLE != 0;
            wakers.readable |= readable;
            let read = readable.then(|| wakers.read.take()).flatten();
            let writable = failed || events & UV_WRITABLE != 0;
            let write = writable.then(|| wakers.write.take()).flatten();
            if writable && wakers.watching_write && !wakers.failed {
                wakers.watching_write = false;
                if let Some(uv) = uv() {
                    // SAFETY: this open handle, on its loop's thread.
                    unsafe { (uv.poll_start)(raw, UV_READABLE, on_ready) };
                }
            }
            (read, write)
        };
        // Woken here and run just below: no need to signal the loop.
        DRAINING.set(true);
        read.into_iter().chain(write).for_each(Waker::wake);
        drain();
        settle(true);
    });
}
