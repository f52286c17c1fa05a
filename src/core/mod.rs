//! The core: pure Rust, no JavaScript. Lease stores and their errors.

pub mod error;
pub mod lease;

pub use error::{Argument, ErrorClass, InputErrorKind, LeaseError, Result};
pub use lease::memory::MemoryStore;
pub use lease::redis::{RedisOptions, RedisStore};
pub use lease::{Answer, Call, Grant, LeaseStore, Limits};
