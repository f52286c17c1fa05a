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
