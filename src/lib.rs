#![deny(clippy::all)]
// Every unsafe block says why it is sound, and every unsafe fn what its callers must uphold:
// enforced here, so `cargo clippy` fails on one that does not.
#![deny(clippy::undocumented_unsafe_blocks, clippy::missing_safety_doc)]
//! mastra-lease: distributed leases for Mastra's Signals runtime.
//!
//! Three layers, one direction: the TypeScript shell (`src/shell/`) calls a class in `glue`
//! (argument checks and conversion), which calls the pure-Rust `core` (lease stores, the
//! event transport), which talks to Redis or an in-memory table. DEVELOPING.md has the map.

/// Calls allocate on Node's thread and free on the runtime's (and back); glibc's allocator pays
/// for that crossing in lock traffic and consolidation, mimalloc does not (docs/benchmarks.md
/// has the measurements). Its version-2 line: version 3 sets up its main heap on whichever
/// thread first loads the addon, and crashes in the next thread once that one has exited (a
/// worker thread), which `__test__/worker-threads.spec.ts` checks.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Gives the memory freed in this thread's heap back to the system now, rather than whenever
/// the allocator next gets round to it: the in-memory provider's sweep does so once it has
/// reclaimed many leases.
pub(crate) fn give_back_memory() {
    // SAFETY: a plain call into the allocator, allowed from any thread at any time.
    unsafe { libmimalloc_sys::mi_collect(true) };
}

mod core;
mod glue;

pub use glue::options::{
    ClusterOptions, ListLeasesOptions, MemoryLeaseProviderOptions, NodeRedisClusterDefaults,
    NodeRedisClusterOptions, NodeRedisRootNode, RedisClientOptions, RedisLeaseProviderOptions,
    RedisSocketOptions, RedisStreamsOptions, SentinelOptions, TlsOptions,
};
pub use glue::reply::{FencedLeaseGrant, LeaseGrant, LeaseRecord, LeaseState};
// The in-memory table's constructor is a plain function; the rlib exports it so it stays
// reachable in test builds, where napi-derive registers nothing.
pub use glue::memory::memory_lease_table;
