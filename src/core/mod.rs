//! The core: pure Rust, no JavaScript. Lease stores, the Redis Streams event transport,
//! the connection they share, and their errors.

pub mod connection;
pub mod error;
pub mod lease;
pub mod log;
mod scripts;
pub mod streams;
#[cfg(test)]
pub(crate) mod test_redis;

pub use error::{Argument, Error, ErrorClass, InputErrorKind, Result, Subject};
pub use lease::memory::MemoryStore;
pub use lease::redis::{RedisOptions, RedisStore};
pub use lease::{Answer, Call, LeaseStore, Limits};

use std::sync::{Mutex, MutexGuard};

/// Locks a mutex, poisoned or not. Every mutex in this crate guards state its holders only
/// insert into, remove from or replace whole, so a panic under the lock cannot leave it
/// half-written and the state is still safe to use.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
