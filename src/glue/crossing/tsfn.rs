//! N-API thread-safe functions, the one way from the Tokio runtime's threads back onto
//! Node's thread: made on Node's thread, called from any thread, released when dropped, and
//! guarded against use after Node finalized them (at process exit).
//!
//! Written by hand rather than with napi-rs' `ThreadsafeFunction`, for what it does not
//! offer: the crossing's wake-up runs Rust on Node's thread, not a JavaScript function; its
//! hold on the event loop is taken and given back as promises come and go (napi-rs keeps
//! `refer`/`unref` only as deprecated methods needing `&mut`); and what a callback throws is
//! cleared, where napi-rs hands it to `napi_fatal_exception`, which ends the process (a
//! logger that throws must not).

use std::ffi::c_void;
use std::marker::PhantomData;
use std::ptr;
use std::sync::{Arc, RwLock};

use napi::sys;

use crate::glue::js::{self, Env, Value};

/// The signature N-API calls on Node's thread with each queued `data` pointer.
pub type CallJs = unsafe extern "C" fn(Env, Value, *mut c_void, *mut c_void);

/// A raw thread-safe function.
pub struct Tsfn {
    raw: sys::napi_threadsafe_function,
    /// Set to `true` by the finalizer; checked under the read lock before every use.
    finalized: Arc<RwLock<bool>>,
}

// SAFETY: N-API thread-safe functions are made to be called and released from any thread;
// the lock orders every such call before Node's finalizer.
unsafe impl Send for Tsfn {}
// SAFETY: as for `Send`: every use through a shared reference takes the lock first.
unsafe impl Sync for Tsfn {}

impl Tsfn {
    /// Makes one on Node's thread: `call_js(env, function, context, data)` runs there for
    /// each [`Tsfn::call`]. It does not keep the event loop alive until [`Tsfn::refer`].
    pub fn new(
        env: Env,
        function: Option<Value>,
        context: *mut c_void,
        call_js: CallJs,
    ) -> napi::Result<Self> {
        let finalized = Arc::new(RwLock::new(false));
        let finalize_data = Arc::into_raw(finalized.clone()) as *mut c_void;
        let name = js::string(env, "mastra-lease");
        let mut raw = ptr::null_mut();
        // SAFETY: the finalize data is an `Arc` that `on_finalize` takes back exactly once.
        let status = unsafe {
            sys::napi_create_threadsafe_function(
                env,
                function.unwrap_or(ptr::null_mut()),
                ptr::null_mut(),
                name,
                0,
                1,
                finalize_data,
                Some(on_finalize),
                context,
                Some(call_js),
                &mut raw,
            )
        };
        if status != sys::Status::napi_ok {
            // SAFETY: creation failed, so the finalizer will never take the `Arc` back.
            drop(unsafe { Arc::from_raw(finalize_data as *const RwLock<bool>) });
            return Err(napi::Error::from_reason(
                "could not create a thread-safe function",
            ));
        }
        // SAFETY: raw was just created on this thread.
        unsafe { sys::napi_unref_threadsafe_function(env, raw) };
        Ok(Self { raw, finalized })
    }

    /// From any thread: queues `data` for `call_js`. Answers `false` when Node is shutting
    /// down and the call was refused (the caller then still owns `data`).
    pub fn call(&self, data: *mut c_void) -> bool {
        let finalized = self.finalized.read().unwrap_or_else(|e| e.into_inner());
        if *finalized {
            return false;
        }
        // SAFETY: not finalized, and the read lock keeps the finalizer out meanwhile.
        let status = unsafe {
            sys::napi_call_threadsafe_function(
                self.raw,
                data,
                sys::ThreadsafeFunctionCallMode::nonblocking,
            )
        };
        status == sys::Status::napi_ok
    }

    /// On Node's thread: keep the event loop alive while this function may be called.
    pub fn refer(&self, env: Env) {
        // SAFETY: on the thread that made it; not finalized while its owner is reachable.
        unsafe { sys::napi_ref_threadsafe_function(env, self.raw) };
    }

    /// On Node's thread: stop keeping the event loop alive.
    pub fn unref(&self, env: Env) {
        // SAFETY: as for `refer`.
        unsafe { sys::napi_unref_threadsafe_function(env, self.raw) };
    }
}

impl Drop for Tsfn {
    fn drop(&mut self) {
        let finalized = self.finalized.read().unwrap_or_else(|e| e.into_inner());
        if !*finalized {
            // SAFETY: not finalized, and the read lock keeps the finalizer out meanwhile.
            unsafe {
                sys::napi_release_threadsafe_function(
                    self.raw,
                    sys::ThreadsafeFunctionReleaseMode::release,
                )
            };
        }
    }
}

unsafe extern "C" fn on_finalize(_env: Env, data: *mut c_void, _hint: *mut c_void) {
    // SAFETY: `Tsfn::new` leaked this `Arc` for the finalizer alone.
    let finalized = unsafe { Arc::from_raw(data as *const RwLock<bool>) };
    // A panic must not unwind into Node; this cannot panic, but be sure.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        *finalized.write().unwrap_or_else(|e| e.into_inner()) = true;
    }));
}

/// A JavaScript function the runtime calls with values of type `T`, converted to arguments
/// on Node's thread by `to_args`. Exceptions the function throws are cleared: the shell's
/// callbacks catch their own.
pub struct JsCallback<T> {
    tsfn: Tsfn,
    _values: PhantomData<fn(T)>,
}

/// Turns a value into a JavaScript function's arguments, on Node's thread.
pub type ToArgs<T> = fn(Env, T) -> Vec<Value>;

impl<T: Send + 'static> JsCallback<T> {
    /// Wraps `function` (checked by the caller to be a function).
    pub fn new(env: Env, function: Value, to_args: ToArgs<T>) -> napi::Result<Self> {
        let context = to_args as *mut c_void;
        Ok(Self {
            tsfn: Tsfn::new(env, Some(function), context, call_function::<T>)?,
            _values: PhantomData,
        })
    }

    /// From any thread: calls the function with `value` soon, on Node's thread. Answers
    /// `false` when Node is shutting down.
    pub fn call(&self, value: T) -> bool {
        let data = Box::into_raw(Box::new(value)) as *mut c_void;
        let queued = self.tsfn.call(data);
        if !queued {
            // SAFETY: the call was refused, so `call_function` will not take the box.
            drop(unsafe { Box::from_raw(data as *mut T) });
        }
        queued
    }

    /// See [`Tsfn::refer`].
    pub fn refer(&self, env: Env) {
        self.tsfn.refer(env);
    }
}

unsafe extern "C" fn call_function<T>(
    env: Env,
    function: Value,
    context: *mut c_void,
    data: *mut c_void,
) {
    // SAFETY: `JsCallback::call` boxed exactly one `T` per accepted call.
    let value = unsafe { Box::from_raw(data as *mut T) };
    if env.is_null() || function.is_null() {
        return;
    }
    // SAFETY: the context is the `ToArgs<T>` `JsCallback::new` stored, a plain fn pointer.
    let to_args: ToArgs<T> = unsafe { std::mem::transmute::<*mut c_void, ToArgs<T>>(context) };
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // What it throws is cleared there.
        js::call(env, function, &to_args(env, *value));
    }));
}
