//! The napi glue: one file per JavaScript class, plus the crossing they share. Checks and
//! converts arguments, carries the work across to the core and the answers back; no lease
//! outcome is decided here.

mod args;
#[cfg(test)]
mod conventions;
mod crossing;
mod js;
mod log;
pub mod memory;
pub mod options;
pub mod redis;
pub mod reply;
pub mod streams;

use std::sync::LazyLock;

use tokio::runtime::{Builder, Handle};

use crate::core::Error;

/// One Tokio runtime for every provider in the process, on a thread of its own. A single
/// thread: the work per call is tiny, and Node's own thread needs the other core. A
/// current-thread scheduler: work arriving from Node's thread wakes it through its I/O
/// driver alone, where the multi-thread one with a single worker also paid about one `futex`
/// call per lease call (`strace -c`, one call in flight; docs/benchmarks.md).
static RUNTIME: LazyLock<std::io::Result<Handle>> = LazyLock::new(|| {
    let runtime = Builder::new_current_thread().enable_all().build()?;
    let handle = runtime.handle().clone();
    std::thread::Builder::new()
        .name("mastra-lease".into())
        .spawn(move || runtime.block_on(std::future::pending::<()>()))?;
    Ok(handle)
});

fn runtime() -> Result<&'static Handle, Error> {
    RUNTIME
        .as_ref()
        .map_err(|err| Error::Internal(format!("could not start the Tokio runtime: {err}")))
}

/// Hands a value made on this thread back to napi-rs as the method's return value.
fn unknown<'env>(env: &'env napi::Env, value: js::Value) -> napi::bindgen_prelude::Unknown<'env> {
    // SAFETY: value was made on this thread during the current call.
    unsafe { napi::bindgen_prelude::Unknown::from_raw_unchecked(env.raw(), value) }
}
