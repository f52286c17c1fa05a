#![deny(clippy::all)]
//! mastra-lease: distributed leases for Mastra's Signals runtime.
//!
//! Three layers, one direction: JavaScript calls a class in [`glue`] (argument checks and
//! conversion), which calls the pure-Rust [`core`] (lease stores), which talks to Redis or
//! an in-memory table. The TypeScript shell lives outside `src/`.

/// Calls allocate on Node's thread and free on the runtime's (and back); glibc's allocator
/// pays for that crossing in lock traffic and consolidation, mimalloc does not.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

pub mod core;
mod glue;

pub use glue::options::{MemoryLeaseProviderOptions, RedisLeaseProviderOptions};
pub use glue::reply::LeaseGrant;
