//! What a finished lease call hands back to JavaScript.

use super::js::{self, Env, Value};
use crate::core::{Grant, LeaseError};

/// The result of one of the five operations, before it becomes a JavaScript value.
pub enum Reply {
    /// `acquireLease`: `{ acquired, owner }`.
    Grant(Grant),
    /// `getLeaseOwner`: a string or `undefined`.
    Owner(Option<String>),
    /// `renewLease`, `transferLease`: a boolean.
    Done(bool),
    /// `releaseLease`, `close`: `undefined`.
    Nothing,
}

/// A finished call: its reply, or the error to reject with.
pub type Outcome = Result<Reply, LeaseError>;

/// Turns an outcome into the value to resolve or reject with (on the JavaScript thread).
pub trait IntoJs {
    fn into_js(self, env: Env) -> Result<Value, Value>;
}

impl IntoJs for Outcome {
    fn into_js(self, env: Env) -> Result<Value, Value> {
        match self {
            Ok(Reply::Grant(grant)) => Ok(js::grant(env, grant.acquired, grant.owner.as_deref())),
            Ok(Reply::Owner(owner)) => Ok(js::string_or_undefined(env, owner.as_deref())),
            Ok(Reply::Done(done)) => Ok(js::boolean(env, done)),
            Ok(Reply::Nothing) => Ok(js::undefined(env)),
            Err(err) => Err(js::error(env, &err)),
        }
    }
}

/// Runs `f`, turning a panic into an internal error so it never unwinds into Node.
pub fn catching(f: impl FnOnce() -> Outcome) -> Outcome {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
        .unwrap_or_else(|panic| Err(LeaseError::Internal(panic_message(panic.as_ref()))))
}

/// The text of a caught panic.
pub fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned())
}

/// What `acquireLease` resolves to.
#[napi_derive::napi(object)]
pub struct LeaseGrant {
    /// `true` when the caller holds the lease after the call.
    pub acquired: bool,
    /// The holder: the caller when `acquired`, otherwise the owner to route work to.
    pub owner: Option<String>,
}
