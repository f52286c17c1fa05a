//! The napi glue: one file per JavaScript class, plus the crossing they share. Checks and
//! converts arguments, carries the work across to the core and the answers back; no lease
//! outcome is decided here.

mod args;
mod crossing;
mod js;
mod log;
pub mod memory;
pub mod options;
pub mod redis;
pub mod reply;
pub mod streams;

use std::sync::LazyLock;

use tokio::runtime::{Builder, Runtime};

use crate::core::Error;

/// One Tokio runtime for every provider in the process. A single worker thread: the work
/// per call is tiny, and Node's own thread needs the other core.
static RUNTIME: LazyLock<std::io::Result<Runtime>> = LazyLock::new(|| {
    Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("mastra-lease")
        .enable_all()
        .build()
});

fn runtime() -> Result<&'static Runtime, Error> {
    RUNTIME
        .as_ref()
        .map_err(|err| Error::Internal(format!("could not start the Tokio runtime: {err}")))
}

/// Hands a value made on this thread back to napi-rs as the method's return value.
fn unknown<'env>(env: &'env napi::Env, value: js::Value) -> napi::bindgen_prelude::Unknown<'env> {
    // SAFETY: value was made on this thread during the current call.
    unsafe { napi::bindgen_prelude::Unknown::from_raw_unchecked(env.raw(), value) }
}
