//! The raw N-API calls the glue makes by hand, each wrapped once: reading arguments without
//! coercion, making values, errors and functions, and promises settled later from a batch
//! (see `crossing/`). What the values mean (an answer's shape) is `reply.rs`'s business.
//!
//! Every function takes the raw `napi_env` of the JavaScript thread it runs on; none may be
//! called from another thread.

use std::ptr;

use napi::sys;

use crate::core::{Error, ErrorClass};

pub type Env = sys::napi_env;
pub type Value = sys::napi_value;

/// A promise's resolver, carried through other threads as an opaque token and used only
/// back on the JavaScript thread that made it.
pub struct Deferred(sys::napi_deferred);

// SAFETY: the pointer is never dereferenced off the JavaScript thread; other threads only
// move it around until the crossing hands it back to that thread.
unsafe impl Send for Deferred {}

/// The JavaScript type of a value, as `typeof` would name it.
pub fn type_of(env: Env, value: Value) -> sys::napi_valuetype {
    let mut kind = sys::ValueType::napi_undefined;
    // SAFETY: env and value come from the current call on the JavaScript thread.
    unsafe { sys::napi_typeof(env, value, &mut kind) };
    kind
}

/// Why a JavaScript value could not become a Rust `String`.
pub enum StringError {
    /// Not a string.
    NotString,
    /// N-API could not read it.
    Unreadable,
    /// It holds a lone surrogate, which UTF-8 cannot represent: converting it would replace
    /// it with U+FFFD, so two different strings could become the same bytes.
    LoneSurrogate,
}

/// The string's exact text: a lone surrogate is an error instead of silently becoming
/// U+FFFD. Read as UTF-16, which V8 copies as it holds it (UTF-8 it would encode character by
/// character), in one N-API call for a string of fewer than 256 code units; ASCII is narrowed
/// to bytes here, anything else decoded strictly.
pub fn string_value(env: Env, value: Value) -> Result<String, StringError> {
    const STACK: usize = 256;
    // Not zeroed first: N-API writes the units it reports, and only those are read.
    let mut stack = std::mem::MaybeUninit::<[u16; STACK]>::uninit();
    let mut copied = 0usize;
    // SAFETY: the buffer holds STACK units; N-API writes at most STACK - 1 plus a NUL.
    let status = unsafe {
        sys::napi_get_value_string_utf16(env, value, stack.as_mut_ptr().cast(), STACK, &mut copied)
    };
    match status {
        sys::Status::napi_ok => {}
        sys::Status::napi_string_expected => return Err(StringError::NotString),
        _ => return Err(StringError::Unreadable),
    }
    if copied < STACK - 1 {
        // SAFETY: N-API wrote the first `copied` units (fewer than STACK).
        let units = unsafe { std::slice::from_raw_parts(stack.as_ptr().cast::<u16>(), copied) };
        return from_utf16(units);
    }
    // As long as the buffer or longer: read whole.
    let mut len = 0usize;
    // SAFETY: a null buffer asks only for the length.
    let status =
        unsafe { sys::napi_get_value_string_utf16(env, value, ptr::null_mut(), 0, &mut len) };
    if status != sys::Status::napi_ok {
        return Err(StringError::Unreadable);
    }
    let mut units = vec![0u16; len + 1];
    // SAFETY: the buffer holds len units plus the terminator N-API writes.
    let status = unsafe {
        sys::napi_get_value_string_utf16(env, value, units.as_mut_ptr(), len + 1, &mut copied)
    };
    if status != sys::Status::napi_ok {
        return Err(StringError::Unreadable);
    }
    from_utf16(&units[..copied])
}

/// UTF-16 code units as a `String`: ASCII narrowed to bytes, anything else decoded strictly.
fn from_utf16(units: &[u16]) -> Result<String, StringError> {
    if units.iter().fold(0, |all, &unit| all | unit) < 0x80 {
        let bytes = units.iter().map(|&unit| unit as u8).collect();
        // SAFETY: every unit, so every byte, is below 0x80: ASCII, which is valid UTF-8.
        return Ok(unsafe { String::from_utf8_unchecked(bytes) });
    }
    decode_utf16(units)
}

#[cold]
fn decode_utf16(units: &[u16]) -> Result<String, StringError> {
    String::from_utf16(units).map_err(|_| StringError::LoneSurrogate)
}

/// A string's text as UTF-8, a lone surrogate becoming U+FFFD: for payloads (an event's
/// JSON), where V8 hands one-byte strings over without decoding. Keys and names, which must
/// not collide, go through [`string_value`].
pub fn text_value(env: Env, value: Value) -> Option<String> {
    let mut len = 0usize;
    // SAFETY: a null buffer asks only for the length.
    let status =
        unsafe { sys::napi_get_value_string_utf8(env, value, ptr::null_mut(), 0, &mut len) };
    if status != sys::Status::napi_ok {
        return None;
    }
    let mut bytes = vec![0u8; len + 1];
    let mut copied = 0usize;
    // SAFETY: the buffer holds len bytes plus the terminator N-API writes.
    let status = unsafe {
        sys::napi_get_value_string_utf8(env, value, bytes.as_mut_ptr().cast(), len + 1, &mut copied)
    };
    if status != sys::Status::napi_ok {
        return None;
    }
    bytes.truncate(copied);
    // N-API wrote UTF-8 (lone surrogates replaced), so this does not fail.
    String::from_utf8(bytes).ok()
}

/// A number's value, or `None` when the value is not a number.
pub fn number_checked(env: Env, value: Value) -> Option<f64> {
    let mut out = f64::NAN;
    // SAFETY: N-API checks the type and answers `napi_number_expected` for any other.
    let status = unsafe { sys::napi_get_value_double(env, value, &mut out) };
    (status == sys::Status::napi_ok).then_some(out)
}

/// A number's value (the caller checked the type).
pub fn number(env: Env, value: Value) -> f64 {
    let mut out = f64::NAN;
    // SAFETY: value was checked to be a number.
    unsafe { sys::napi_get_value_double(env, value, &mut out) };
    out
}

/// `object[name]`, or what reading it threw (a throwing getter, a Proxy's trap).
pub fn property(env: Env, object: Value, name: &std::ffi::CStr) -> Result<Value, Value> {
    let mut out = ptr::null_mut();
    // SAFETY: object was checked to be an object; name is NUL-terminated.
    let status = unsafe { sys::napi_get_named_property(env, object, name.as_ptr(), &mut out) };
    if status != sys::Status::napi_ok || out.is_null() {
        return Err(take_exception(env));
    }
    Ok(out)
}

/// The exception pending on this thread, cleared (`undefined` when there is none).
pub fn take_exception(env: Env) -> Value {
    let mut pending = false;
    let mut thrown = undefined(env);
    // SAFETY: exception inspection on the JavaScript thread.
    unsafe {
        sys::napi_is_exception_pending(env, &mut pending);
        if pending {
            sys::napi_get_and_clear_last_exception(env, &mut thrown);
        }
    }
    thrown
}

/// A short description of a thrown value, for a message: an error's `message`, or the
/// value as text.
pub fn describe(env: Env, value: Value) -> String {
    let text = match type_of(env, value) {
        sys::ValueType::napi_object => property(env, value, c"message")
            .ok()
            .filter(|message| type_of(env, *message) == sys::ValueType::napi_string),
        sys::ValueType::napi_string => Some(value),
        _ => None,
    };
    text.and_then(|text| string_value(env, text).ok())
        .unwrap_or_else(|| "a value that is not an error".to_owned())
}

/// A boolean's value (the caller checked the type).
pub fn bool_value(env: Env, value: Value) -> bool {
    let mut out = false;
    // SAFETY: value was checked to be a boolean.
    unsafe { sys::napi_get_value_bool(env, value, &mut out) };
    out
}

/// A copy of the bytes of a `Uint8Array` (a `Buffer` is one), or `None` for anything else.
pub fn uint8_bytes(env: Env, value: Value) -> Option<Vec<u8>> {
    let mut is_typed = false;
    // SAFETY: value comes from the current call on the JavaScript thread.
    let status = unsafe { sys::napi_is_typedarray(env, value, &mut is_typed) };
    if status != sys::Status::napi_ok || !is_typed {
        return None;
    }
    let mut kind = sys::TypedarrayType::int8_array;
    let mut len = 0usize;
    let mut data = ptr::null_mut();
    // SAFETY: value is a typed array; N-API reports its element type, length and data.
    let status = unsafe {
        sys::napi_get_typedarray_info(
            env,
            value,
            &mut kind,
            &mut len,
            &mut data,
            ptr::null_mut(),
            ptr::null_mut(),
        )
    };
    if status != sys::Status::napi_ok || kind != sys::TypedarrayType::uint8_array {
        return None;
    }
    if len == 0 || data.is_null() {
        return Some(Vec::new());
    }
    // SAFETY: a Uint8Array's data holds `len` bytes, alive during this call.
    Some(unsafe { std::slice::from_raw_parts(data.cast::<u8>(), len) }.to_vec())
}

/// Whether `value` is an array (`Array.isArray`).
pub fn is_array(env: Env, value: Value) -> bool {
    let mut is_array = false;
    // SAFETY: a type check on a live value.
    unsafe { sys::napi_is_array(env, value, &mut is_array) };
    is_array
}

/// The items of an array, or `None` when `value` is not one; `Err` with what reading an
/// item threw (a getter, a Proxy's trap).
pub fn array_items(env: Env, value: Value) -> Result<Option<Vec<Value>>, Value> {
    if !is_array(env, value) {
        return Ok(None);
    }
    let mut len = 0u32;
    // SAFETY: value is an array.
    unsafe { sys::napi_get_array_length(env, value, &mut len) };
    let mut items = Vec::with_capacity(len as usize);
    for i in 0..len {
        let mut item = ptr::null_mut();
        // SAFETY: i is below the array's length; a getter may throw.
        let status = unsafe { sys::napi_get_element(env, value, i, &mut item) };
        if status != sys::Status::napi_ok {
            return Err(take_exception(env));
        }
        items.push(item);
    }
    Ok(Some(items))
}

/// The names of an object's enumerable string-keyed properties (as `for...in` lists them),
/// or what listing them threw (a Proxy's trap).
pub fn property_names(env: Env, object: Value) -> Result<Vec<String>, Value> {
    let mut names = ptr::null_mut();
    // SAFETY: object was checked to be an object.
    let status = unsafe { sys::napi_get_property_names(env, object, &mut names) };
    if status != sys::Status::napi_ok || names.is_null() {
        return Err(take_exception(env));
    }
    let mut len = 0u32;
    // SAFETY: names is the array N-API just made.
    unsafe { sys::napi_get_array_length(env, names, &mut len) };
    Ok((0..len)
        .filter_map(|i| {
            let mut name = ptr::null_mut();
            // SAFETY: i is below the array's length.
            let status = unsafe { sys::napi_get_element(env, names, i, &mut name) };
            (status == sys::Status::napi_ok)
                .then(|| string_value(env, name).ok())
                .flatten()
        })
        .collect())
}

pub fn undefined(env: Env) -> Value {
    let mut out = ptr::null_mut();
    // SAFETY: plain value creation on the JavaScript thread.
    unsafe { sys::napi_get_undefined(env, &mut out) };
    out
}

pub fn null(env: Env) -> Value {
    let mut out = ptr::null_mut();
    // SAFETY: plain value creation on the JavaScript thread.
    unsafe { sys::napi_get_null(env, &mut out) };
    out
}

pub fn boolean(env: Env, value: bool) -> Value {
    let mut out = ptr::null_mut();
    // SAFETY: plain value creation on the JavaScript thread.
    unsafe { sys::napi_get_boolean(env, value, &mut out) };
    out
}

pub fn number_value(env: Env, value: f64) -> Value {
    let mut out = ptr::null_mut();
    // SAFETY: plain value creation on the JavaScript thread.
    unsafe { sys::napi_create_double(env, value, &mut out) };
    out
}

/// A new empty object.
pub fn object(env: Env) -> Value {
    let mut out = ptr::null_mut();
    // SAFETY: plain object creation on the JavaScript thread.
    unsafe { sys::napi_create_object(env, &mut out) };
    out
}

/// Sets `object[name] = value`.
pub fn set_property(env: Env, object: Value, name: &std::ffi::CStr, value: Value) {
    // SAFETY: object and value are live values of this environment; name is NUL-terminated.
    unsafe { sys::napi_set_named_property(env, object, name.as_ptr(), value) };
}

/// Sets `object[name] = value`, for a name known only at run time.
pub fn set_key(env: Env, object: Value, name: &str, value: Value) {
    let name = string(env, name);
    // SAFETY: object, name and value are live values of this environment.
    unsafe { sys::napi_set_property(env, object, name, value) };
}

/// The global object (`globalThis`).
pub fn global(env: Env) -> Value {
    let mut out = ptr::null_mut();
    // SAFETY: a plain lookup on the JavaScript thread.
    unsafe { sys::napi_get_global(env, &mut out) };
    out
}

/// A JavaScript array holding `items`.
pub fn array(env: Env, items: &[Value]) -> Value {
    let mut out = ptr::null_mut();
    // SAFETY: plain array creation and element writes on the JavaScript thread.
    unsafe {
        sys::napi_create_array_with_length(env, items.len(), &mut out);
        for (i, item) in items.iter().enumerate() {
            sys::napi_set_element(env, out, i as u32, *item);
        }
    }
    out
}

pub fn string(env: Env, text: &str) -> Value {
    let mut out = ptr::null_mut();
    let (bytes, len) = (text.as_ptr().cast(), text.len() as isize);
    // ASCII is Latin-1 too, and V8 copies Latin-1 as it is, where UTF-8 is decoded first
    // (events are mostly ASCII JSON).
    // SAFETY: the pointer and length describe valid UTF-8 (NUL bytes included), and in the
    // first branch valid Latin-1.
    unsafe {
        if text.is_ascii() {
            sys::napi_create_string_latin1(env, bytes, len, &mut out)
        } else {
            sys::napi_create_string_utf8(env, bytes, len, &mut out)
        }
    };
    out
}

/// `undefined` for `None` (never `null`: Mastra checks `=== undefined`).
pub fn string_or_undefined(env: Env, text: Option<&str>) -> Value {
    match text {
        Some(text) => string(env, text),
        None => undefined(env),
    }
}

/// What a native function runs for each call: the call's environment and its arguments.
pub type Callback = unsafe extern "C" fn(Env, sys::napi_callback_info) -> Value;
/// What frees a native function's data once the function is collected.
pub type Free = unsafe extern "C" fn(Env, *mut std::ffi::c_void, *mut std::ffi::c_void);

/// A JavaScript function named `name` running `callback`, which finds `data` with the call's
/// [`arguments`]. With `free`, `free(data)` runs once the function is collected, or here when
/// it could not be made.
pub fn function(
    env: Env,
    name: &std::ffi::CStr,
    callback: Callback,
    data: *mut std::ffi::c_void,
    free: Option<Free>,
) -> Option<Value> {
    let mut out = ptr::null_mut();
    let length = name.to_bytes().len() as isize;
    // SAFETY: name is NUL-terminated and `length` bytes long; `free` owns `data` from here on,
    // called by N-API with the function's collection or below when there is no function.
    unsafe {
        let mut made =
            sys::napi_create_function(env, name.as_ptr(), length, Some(callback), data, &mut out)
                == sys::Status::napi_ok;
        if let Some(free) = free {
            made = made
                && sys::napi_add_finalizer(
                    env,
                    out,
                    data,
                    Some(free),
                    ptr::null_mut(),
                    ptr::null_mut(),
                ) == sys::Status::napi_ok;
            if !made {
                free(env, data, ptr::null_mut());
            }
        }
        made.then_some(out)
    }
}

/// The first `N` arguments of a call to a function made by [`function`] (`undefined` for
/// those not passed), and the data the function was made with.
pub fn arguments<const N: usize>(
    env: Env,
    info: sys::napi_callback_info,
) -> Option<([Value; N], *mut std::ffi::c_void)> {
    let mut args = [ptr::null_mut(); N];
    let mut count = N;
    let mut data = ptr::null_mut();
    // SAFETY: `info` is the current call's; `args` holds `count` values, and N-API fills those
    // not passed with `undefined`.
    let status = unsafe {
        sys::napi_get_cb_info(
            env,
            info,
            &mut count,
            args.as_mut_ptr(),
            ptr::null_mut(),
            &mut data,
        )
    };
    (status == sys::Status::napi_ok).then_some((args, data))
}

/// A strong reference to a value of this environment, held for the environment's life.
#[derive(Clone, Copy)]
pub struct Persistent(sys::napi_ref);

impl Persistent {
    /// The value referred to (`None` once it is gone).
    pub fn value(self, env: Env) -> Option<Value> {
        let mut out = ptr::null_mut();
        // SAFETY: the reference was made in this environment and is never deleted.
        unsafe { sys::napi_get_reference_value(env, self.0, &mut out) };
        (!out.is_null()).then_some(out)
    }
}

/// A strong reference to `value`, kept for the environment's life.
pub fn persist(env: Env, value: Value) -> Option<Persistent> {
    let mut reference = ptr::null_mut();
    // SAFETY: a strong reference to a live value of this environment, never deleted.
    let status = unsafe { sys::napi_create_reference(env, value, 1, &mut reference) };
    (status == sys::Status::napi_ok).then_some(Persistent(reference))
}

/// A strong reference to a value, deleted when dropped: for a value kept only as long as what
/// holds it (a provider's clock), where [`Persistent`] keeps its value for the environment's
/// life. Dropped on the thread of its environment, as everything holding one is `!Send`.
pub struct Held {
    env: Env,
    reference: sys::napi_ref,
}

impl Held {
    /// A strong reference to `value`, a live value of this environment.
    pub fn new(env: Env, value: Value) -> Option<Self> {
        let mut reference = ptr::null_mut();
        // SAFETY: a strong reference to a live value of this environment.
        let status = unsafe { sys::napi_create_reference(env, value, 1, &mut reference) };
        (status == sys::Status::napi_ok).then_some(Self { env, reference })
    }

    /// The value referred to (`None` if it could not be read).
    pub fn value(&self) -> Option<Value> {
        let mut out = ptr::null_mut();
        // SAFETY: the reference was made in this environment and lives until `drop`.
        unsafe { sys::napi_get_reference_value(self.env, self.reference, &mut out) };
        (!out.is_null()).then_some(out)
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        // SAFETY: deleted once, on its environment's thread (a finalizer's included, where
        // N-API allows deleting references).
        unsafe { sys::napi_delete_reference(self.env, self.reference) };
    }
}

/// Compiles and runs `source`, a constant expression, and keeps what it evaluates to.
pub fn compile(env: Env, source: &str) -> Option<Persistent> {
    let source = string(env, source);
    let mut value = ptr::null_mut();
    // SAFETY: runs a script of this environment.
    let ran = unsafe { sys::napi_run_script(env, source, &mut value) } == sys::Status::napi_ok;
    let kept = ran.then(|| persist(env, value)).flatten();
    if kept.is_none() {
        clear_exception(env);
    }
    kept
}

/// `function(...args)` with `this` undefined: what it returned, or `None` when it threw
/// (the exception cleared).
pub fn call(env: Env, function: Value, args: &[Value]) -> Option<Value> {
    call_on(env, undefined(env), function, args)
}

/// `function(...args)` with `this` undefined: what it returned, or what it threw (cleared).
pub fn try_call(env: Env, function: Value, args: &[Value]) -> Result<Value, Value> {
    let mut out = ptr::null_mut();
    // SAFETY: a call of a live function of this environment with values made in it.
    let status = unsafe {
        sys::napi_call_function(
            env,
            undefined(env),
            function,
            args.len(),
            args.as_ptr(),
            &mut out,
        )
    };
    if status != sys::Status::napi_ok || out.is_null() {
        return Err(take_exception(env));
    }
    Ok(out)
}

/// `function.call(this, ...args)`: what it returned, or `None` when it threw (the exception
/// cleared).
pub fn call_on(env: Env, this: Value, function: Value, args: &[Value]) -> Option<Value> {
    let mut out = ptr::null_mut();
    // SAFETY: a call of a live function of this environment with values made in it.
    let status = unsafe {
        sys::napi_call_function(env, this, function, args.len(), args.as_ptr(), &mut out)
    };
    if status != sys::Status::napi_ok || out.is_null() {
        clear_exception(env);
        return None;
    }
    Some(out)
}

/// A Node `Buffer` holding a copy of `bytes`.
pub fn buffer(env: Env, bytes: &[u8]) -> Value {
    let mut out = ptr::null_mut();
    let mut data = ptr::null_mut();
    // SAFETY: N-API copies `bytes.len()` bytes from a live slice into a new buffer.
    unsafe {
        sys::napi_create_buffer_copy(env, bytes.len(), bytes.as_ptr().cast(), &mut data, &mut out)
    };
    out
}

/// A `TypeError`, `RangeError` or `Error` with `err.code` set to the error's stable code.
pub fn error(env: Env, err: &Error) -> Value {
    let code = string(env, err.code());
    let message = string(env, &err.full_message());
    let mut out = ptr::null_mut();
    // SAFETY: code and message are strings made just above.
    unsafe {
        match err.class() {
            ErrorClass::Type => sys::napi_create_type_error(env, code, message, &mut out),
            ErrorClass::Range => sys::napi_create_range_error(env, code, message, &mut out),
            ErrorClass::Error => sys::napi_create_error(env, code, message, &mut out),
        };
    }
    out
}

/// Throws `err` (for constructors, which cannot answer with a promise), with `cause` (what a
/// getter threw, say) as its `cause` property.
pub fn throw(env: Env, err: &Error, cause: Option<Value>) {
    let value = error(env, err);
    // SAFETY: value is an error object made on this thread; cause is a live value of it.
    unsafe {
        if let Some(cause) = cause {
            sys::napi_set_named_property(env, value, c"cause".as_ptr(), cause);
        }
        sys::napi_throw(env, value);
    }
}

/// A new pending promise and its resolver.
pub fn promise(env: Env) -> (Deferred, Value) {
    let mut deferred = ptr::null_mut();
    let mut promise = ptr::null_mut();
    // SAFETY: plain promise creation on the JavaScript thread.
    unsafe { sys::napi_create_promise(env, &mut deferred, &mut promise) };
    (Deferred(deferred), promise)
}

/// Settles a promise made by [`promise`] on this same thread. Consumes the resolver, as
/// N-API frees it on settlement.
pub fn settle(env: Env, deferred: Deferred, outcome: Result<Value, Value>) {
    // SAFETY: the resolver was made on this thread and is settled exactly once (it is moved
    // in, and `Deferred` is not `Clone`).
    unsafe {
        match outcome {
            Ok(value) => sys::napi_resolve_deferred(env, deferred.0, value),
            Err(error) => sys::napi_reject_deferred(env, deferred.0, error),
        };
    }
}

/// This environment's libuv loop (`uv_loop_t *`), if the runtime has one to give.
pub fn uv_loop(env: Env) -> Option<*mut std::ffi::c_void> {
    let mut out = ptr::null_mut();
    // SAFETY: asks for the loop of the environment of this thread.
    let status = unsafe { sys::napi_get_uv_event_loop(env, &mut out) };
    (status == sys::Status::napi_ok && !out.is_null()).then_some(out.cast())
}

/// What native code running outside any JavaScript call (a libuv callback) opens to call into
/// JavaScript as Node's own callbacks do: promise reactions and ticks run when it closes.
#[derive(Clone, Copy)]
pub struct AsyncContext {
    resource: Persistent,
    context: sys::napi_async_context,
}

/// An async context named `name`, for [`in_callback_scope`], kept for the environment's life.
pub fn async_context(env: Env, name: &str) -> Option<AsyncContext> {
    let resource = object(env);
    let mut context = ptr::null_mut();
    // SAFETY: a fresh object and name of this environment; the context is never destroyed.
    let status = unsafe { sys::napi_async_init(env, resource, string(env, name), &mut context) };
    (status == sys::Status::napi_ok).then_some(())?;
    Some(AsyncContext {
        resource: persist(env, resource)?,
        context,
    })
}

/// Runs `f` in a handle scope and a callback scope of `context`: for native code called by
/// libuv, not by JavaScript. The microtasks queued meanwhile run as the scope closes.
pub fn in_callback_scope(env: Env, context: &AsyncContext, f: impl FnOnce()) {
    let mut handles = ptr::null_mut();
    // SAFETY: scopes opened and closed in order on the environment's thread, outside any
    // JavaScript call.
    unsafe {
        if sys::napi_open_handle_scope(env, &mut handles) != sys::Status::napi_ok {
            return;
        }
        let mut scope = ptr::null_mut();
        let opened = match context.resource.value(env) {
            Some(resource) => {
                sys::napi_open_callback_scope(env, resource, context.context, &mut scope)
                    == sys::Status::napi_ok
            }
            None => false,
        };
        f();
        if opened {
            sys::napi_close_callback_scope(env, scope);
        }
        sys::napi_close_handle_scope(env, handles);
    }
}

/// Calls `hook` (with a null argument) when the environment is torn down.
pub fn on_teardown(env: Env, hook: unsafe extern "C" fn(*mut std::ffi::c_void)) {
    // SAFETY: registers a hook of static lifetime for this environment.
    unsafe { sys::napi_add_env_cleanup_hook(env, Some(hook), ptr::null_mut()) };
}

pub fn clear_exception(env: Env) {
    let mut pending = false;
    // SAFETY: exception inspection on the JavaScript thread.
    unsafe {
        sys::napi_is_exception_pending(env, &mut pending);
        if pending {
            let mut discarded = ptr::null_mut();
            sys::napi_get_and_clear_last_exception(env, &mut discarded);
        }
    }
}
