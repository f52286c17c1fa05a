#![deny(clippy::all)]
//! mastra-lease: distributed leases for Mastra's Signals runtime.
//!
//! Three layers, one direction: JavaScript calls a class in [`glue`] (argument checks and
//! conversion), which calls the pure-Rust [`core`] (lease stores), which talks to Redis or
//! an in-memory table. The TypeScript shell lives outside `src/`.

pub mod core;
mod glue;

pub use glue::options::{MemoryLeaseProviderOptions, RedisLeaseProviderOptions};
pub use glue::reply::LeaseGrant;
