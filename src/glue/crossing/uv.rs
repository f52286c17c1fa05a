//! libuv, behind a small safe wrapper: the one file that calls its functions. They are looked
//! up in the running process, not linked: a runtime that has them (Node) gets them; one that
//! does not, or whose libuv is not the loop it runs (Bun, Deno: `node_loop.rs` asks), keeps
//! the runtime's thread.
//!
//! Three kinds of handle are used, each owning the memory libuv is handed and freeing it in
//! libuv's close callback, once libuv let it go:
//! - [`Signal`] (`uv_async_t`): wakes the loop's thread from any thread.
//! - [`Check`] (`uv_check_t`): runs on the loop's thread once the loop's poll for I/O is done.
//! - [`Poll`] (`uv_poll_t`): reports a socket ready to what watches it ([`Ready`]).
//!
//! All are unref'd: they never keep the process alive by themselves.

use std::ffi::{c_int, c_void, CStr};
use std::marker::PhantomData;
use std::os::fd::RawFd;
use std::sync::{Arc, OnceLock};

use crate::glue::js::{self, Env};

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
    check_init: unsafe extern "C" fn(*mut c_void, *mut c_void) -> c_int,
    check_start: unsafe extern "C" fn(*mut c_void, unsafe extern "C" fn(*mut c_void)) -> c_int,
    check_stop: unsafe extern "C" fn(*mut c_void) -> c_int,
}

type PollCallback = unsafe extern "C" fn(*mut c_void, c_int, c_int);

// libuv's `uv_handle_type` and `uv_poll_event` values, stable across its 1.x releases.
const UV_ASYNC: c_int = 1;
const UV_CHECK: c_int = 2;
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
                check_init: find(c"uv_check_init")?,
                check_start: find(c"uv_check_start")?,
                check_stop: find(c"uv_check_stop")?,
            })
        }
    })
    .as_ref()
}

/// Whether this process has libuv's functions.
pub fn available() -> bool {
    uv().is_some()
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

/// An environment's libuv loop (`uv_loop_t *`), as N-API hands it over.
#[derive(Clone, Copy)]
pub struct Loop(*mut c_void);

impl Loop {
    /// The loop of `env`, on its thread, if the runtime has one to give.
    pub fn of(env: Env) -> Option<Self> {
        js::uv_loop(env).map(Self)
    }
}

/// A handle's memory: zeroed, as large as libuv says that kind is, its first field (`data`)
/// holding what its callback needs. Freed by [`closed`] once libuv let it go.
#[derive(Clone, Copy)]
struct Handle(*mut c_void);

impl Handle {
    fn new(uv: &Uv, kind: c_int, data: *const c_void) -> Option<Self> {
        // SAFETY: libuv's size for the kind; calloc zeroes it (or answers null, checked).
        let raw = unsafe { libc::calloc(1, (uv.handle_size)(kind)) };
        if raw.is_null() {
            return None;
        }
        // SAFETY: `data` is the first field of every libuv handle.
        unsafe { *(raw as *mut *const c_void) = data };
        Some(Self(raw))
    }

    /// What [`Handle::new`] stored in `data`.
    ///
    /// # Safety
    /// `raw` is a live handle made by [`Handle::new`].
    unsafe fn data(raw: *mut c_void) -> *const c_void {
        // SAFETY: the caller's promise.
        unsafe { *(raw as *const *const c_void) }
    }

    /// Memory libuv was never told of: freed by hand.
    fn free(self) {
        // SAFETY: calloc'd by `new`, unknown to libuv.
        unsafe { libc::free(self.0) };
    }

    /// Closes an initialized handle on its loop's thread; `on_closed` frees it.
    fn close(self, uv: &Uv, on_closed: unsafe extern "C" fn(*mut c_void)) {
        // SAFETY: an initialized handle, closed once (its owner is consumed).
        unsafe { (uv.close)(self.0, Some(on_closed)) };
    }
}

/// A `uv_async_t`: [`Signal::send`], from any thread, runs `callback` on the loop's thread.
pub struct Signal(Handle);

// SAFETY: `uv_async_send` is the one libuv call made off the loop's thread, and libuv allows
// it from any thread; the owner keeps it off a closed handle (it closes the handle itself).
unsafe impl Send for Signal {}
// SAFETY: as above.
unsafe impl Sync for Signal {}

impl Signal {
    /// On the loop's thread: a signal that runs `callback` there (in a `catch_unwind`).
    pub fn open(on: Loop, callback: fn()) -> Option<Self> {
        let uv = uv()?;
        let handle = Handle::new(uv, UV_ASYNC, callback as *const c_void)?;
        // SAFETY: a fresh zeroed handle of the async kind, on the loop's own thread.
        if unsafe { (uv.async_init)(on.0, handle.0, call_back) } != 0 {
            handle.free();
            return None;
        }
        // SAFETY: an initialized handle, on its loop's thread.
        unsafe { (uv.unref)(handle.0) };
        Some(Self(handle))
    }

    /// From any thread: the callback runs on the loop's thread once it comes round.
    pub fn send(&self) {
        if let Some(uv) = uv() {
            // SAFETY: open while `self` lives (closing consumes it).
            unsafe { (uv.async_send)(self.0 .0) };
        }
    }

    /// On the loop's thread: closed for good.
    pub fn close(self) {
        if let Some(uv) = uv() {
            self.0.close(uv, closed_plain);
        }
    }
}

/// A `uv_check_t`: once [`Check::start`]ed, `callback` runs on the loop's thread each time the
/// loop is done with its poll for I/O (every callback of the sockets found ready has run),
/// until [`Check::stop`]. Made, used and closed on the loop's thread.
pub struct Check(Handle);

impl Check {
    /// On the loop's thread: a check, stopped, that runs `callback` there once started.
    pub fn open(on: Loop, callback: fn()) -> Option<Self> {
        let uv = uv()?;
        let handle = Handle::new(uv, UV_CHECK, callback as *const c_void)?;
        // SAFETY: a fresh zeroed handle of the check kind, on the loop's own thread.
        if unsafe { (uv.check_init)(on.0, handle.0) } != 0 {
            handle.free();
            return None;
        }
        // SAFETY: an initialized handle, on its loop's thread.
        unsafe { (uv.unref)(handle.0) };
        Some(Self(handle))
    }

    /// `callback` runs once this turn of the loop is done polling, and each turn after; a
    /// started check is left as it is. `false` if libuv refused.
    pub fn start(&self) -> bool {
        // SAFETY: open while `self` lives, on its loop's thread.
        uv().is_some_and(|uv| unsafe { (uv.check_start)(self.0 .0, call_back) } == 0)
    }

    /// `callback` no longer runs.
    pub fn stop(&self) {
        if let Some(uv) = uv() {
            // SAFETY: open while `self` lives, on its loop's thread.
            unsafe { (uv.check_stop)(self.0 .0) };
        }
    }

    /// Closed for good.
    pub fn close(self) {
        if let Some(uv) = uv() {
            self.0.close(uv, closed_plain);
        }
    }
}

/// The callback of a [`Signal`] or a [`Check`]: the `fn()` in its `data`.
unsafe extern "C" fn call_back(raw: *mut c_void) {
    let _ = std::panic::catch_unwind(|| {
        // SAFETY: an open signal's or check's `data` is the `fn()` it was opened with.
        let callback: fn() = unsafe { std::mem::transmute(Handle::data(raw)) };
        callback();
    });
}

/// A [`Signal`]'s or a [`Check`]'s memory, freed once libuv let it go.
unsafe extern "C" fn closed_plain(raw: *mut c_void) {
    let _ = std::panic::catch_unwind(|| Handle(raw).free());
}

/// What a [`Poll`] reports a socket's readiness to, on the loop's thread.
pub trait Ready: Send + Sync + 'static {
    /// `failed`: libuv met an error on the socket and stopped polling it, for good.
    fn ready(&self, failed: bool, readable: bool, writable: bool);
}

/// A `uv_poll_t` on a socket, reporting to a `T` it holds until closed.
pub struct Poll<T: Ready> {
    handle: Handle,
    target: PhantomData<Arc<T>>,
}

// SAFETY: made, used and closed on the loop's thread alone; it only moves between threads
// inside the values that own it.
unsafe impl<T: Ready> Send for Poll<T> {}
// SAFETY: as above.
unsafe impl<T: Ready> Sync for Poll<T> {}

impl<T: Ready> Poll<T> {
    /// On the loop's thread: polls the socket `fd` for reading, reporting to `target`.
    pub fn open(on: Loop, fd: RawFd, target: Arc<T>) -> std::io::Result<Self> {
        let refused = || std::io::Error::other("libuv would not poll the socket");
        let uv = uv().ok_or_else(refused)?;
        let data = Arc::into_raw(target);
        let Some(handle) = Handle::new(uv, UV_POLL, data.cast()) else {
            // SAFETY: the Arc leaked for the handle that was not made.
            drop(unsafe { Arc::from_raw(data) });
            return Err(std::io::Error::from(std::io::ErrorKind::OutOfMemory));
        };
        // SAFETY: a fresh zeroed poll handle on this loop's thread, the socket open.
        if unsafe { (uv.poll_init)(on.0, handle.0, fd) } != 0 {
            // SAFETY: libuv does not know the handle: the Arc leaked for it goes by hand.
            drop(unsafe { Arc::from_raw(data) });
            handle.free();
            return Err(refused());
        }
        let poll = Self {
            handle,
            target: PhantomData,
        };
        if !poll.watch(false) {
            poll.close();
            return Err(refused());
        }
        // SAFETY: an initialized handle, on its loop's thread.
        unsafe { (uv.unref)(handle.0) };
        Ok(poll)
    }

    /// Watches for readability, and for writability too when `writable`.
    pub fn watch(&self, writable: bool) -> bool {
        let events = match writable {
            true => UV_READABLE | UV_WRITABLE,
            false => UV_READABLE,
        };
        // SAFETY: open while `self` lives, on its loop's thread.
        uv().is_some_and(|uv| unsafe { (uv.poll_start)(self.handle.0, events, on_ready::<T>) } == 0)
    }

    /// Stops and closes it; its target is let go once libuv closed it.
    pub fn close(self) {
        if let Some(uv) = uv() {
            // SAFETY: open until now, on its loop's thread.
            unsafe { (uv.poll_stop)(self.handle.0) };
            self.handle.close(uv, closed_poll::<T>);
        }
    }
}

unsafe extern "C" fn on_ready<T: Ready>(raw: *mut c_void, status: c_int, events: c_int) {
    let _ = std::panic::catch_unwind(|| {
        // SAFETY: the handle is open, so its `data` still holds its leaked `Arc<T>`.
        let target = unsafe { &*(Handle::data(raw) as *const T) };
        target.ready(
            status < 0,
            events & UV_READABLE != 0,
            events & UV_WRITABLE != 0,
        );
    });
}

unsafe extern "C" fn closed_poll<T: Ready>(raw: *mut c_void) {
    let _ = std::panic::catch_unwind(|| {
        // SAFETY: a poll handle's `data` is one leaked `Arc<T>`, taken back here once.
        drop(unsafe { Arc::from_raw(Handle::data(raw) as *const T) });
        Handle(raw).free();
    });
}
