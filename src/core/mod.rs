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
pub use lease::{Answer, Call, Limits};

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{LazyLock, Mutex, MutexGuard};

/// Locks a mutex, poisoned or not. Every mutex in this crate guards state its holders only
/// insert into, remove from or replace whole, so a panic under the lock cannot leave it
/// half-written and the state is still safe to use.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// An id no other call of any process is likely to have: this process's random 64 bits,
/// then a counter.
pub(crate) fn unique_id() -> String {
    static PROCESS: LazyLock<u64> = LazyLock::new(|| {
        let mut bytes = [0u8; 8];
        match getrandom::getrandom(&mut bytes) {
            Ok(()) => u64::from_le_bytes(bytes),
            // No entropy source: the clock and the pid still tell processes apart.
            Err(_) => {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos() as u64);
                now ^ (u64::from(std::process::id()) << 32)
            }
        }
    });
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "{:016x}{:x}",
        *PROCESS,
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}
