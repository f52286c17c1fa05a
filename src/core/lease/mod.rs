//! Leases: the five operations Mastra's Signals runtime calls, and the limits every store
//! enforces on its input before doing any work.

pub mod memory;
pub mod redis;

use std::future::Future;

use crate::core::error::{Argument, InputErrorKind, LeaseError, Result};

/// The answer to an acquire: whether the caller holds the lease now, and who does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// `true` when the caller holds the lease after the call.
    pub acquired: bool,
    /// The holder after the call: the caller when `acquired`, else the other owner.
    pub owner: Option<String>,
}

/// A place leases live. Every operation is atomic on its own.
///
/// Owners are opaque strings; a key is held by at most one live owner at a time; expiry is
/// decided by the store's own clock (Redis' for Redis, a monotonic clock in memory).
pub trait LeaseStore: Send + Sync {
    /// Claims a free or expired key, or refreshes the TTL when `owner` already holds it.
    /// When another owner holds it, answers `acquired: false` with that holder.
    fn acquire(
        &self,
        key: &str,
        owner: &str,
        ttl_ms: u64,
    ) -> impl Future<Output = Result<Grant>> + Send;

    /// The current holder of a live lease, if any.
    fn owner(&self, key: &str) -> impl Future<Output = Result<Option<String>>> + Send;

    /// Deletes the lease if `owner` holds it; otherwise does nothing. Answers whether it did.
    fn release(&self, key: &str, owner: &str) -> impl Future<Output = Result<bool>> + Send;

    /// Extends the TTL if `owner` still holds the lease. Never brings an expired lease back.
    fn renew(
        &self,
        key: &str,
        owner: &str,
        ttl_ms: u64,
    ) -> impl Future<Output = Result<bool>> + Send;

    /// Moves a lease `from` holds to `to` with a fresh TTL, never leaving the key free.
    fn transfer(
        &self,
        key: &str,
        from: &str,
        to: &str,
        ttl_ms: u64,
    ) -> impl Future<Output = Result<bool>> + Send;
}

/// Upper bounds on input, checked before any work so a bad call changes nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Longest key, in UTF-8 bytes. Default 4096.
    pub max_key_bytes: usize,
    /// Longest owner, in UTF-8 bytes. Default 1024.
    pub max_owner_bytes: usize,
    /// Longest TTL, in milliseconds. Default 86 400 000 (one day).
    pub max_ttl_ms: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_key_bytes: 4096,
            max_owner_bytes: 1024,
            max_ttl_ms: 86_400_000,
        }
    }
}

/// The largest `maxTtlMs` accepted: about 285 years, far below where Redis' PX arithmetic
/// or `Instant` addition could overflow.
pub const TTL_CEILING_MS: u64 = 1 << 53;

impl Limits {
    /// Rejects an empty or over-long key.
    pub fn check_key(&self, key: &str) -> Result<()> {
        check_text(key, "key", Argument::Key, self.max_key_bytes)
    }

    /// Rejects an empty or over-long owner. `name` is the argument's name in messages.
    pub fn check_owner(&self, owner: &str, name: &str) -> Result<()> {
        check_text(owner, name, Argument::Owner, self.max_owner_bytes)
    }

    /// Rejects a TTL outside `1..=max_ttl_ms` (0 would delete a Redis key on renew).
    pub fn check_ttl(&self, ttl_ms: u64) -> Result<()> {
        if ttl_ms == 0 || ttl_ms > self.max_ttl_ms {
            return Err(LeaseError::argument(
                Argument::Ttl,
                InputErrorKind::Range,
                format!(
                    "ttlMs must be an integer from 1 to {} milliseconds, got {ttl_ms}",
                    self.max_ttl_ms
                ),
            ));
        }
        Ok(())
    }
}

fn check_text(value: &str, name: &str, argument: Argument, max_bytes: usize) -> Result<()> {
    if value.is_empty() {
        return Err(LeaseError::argument(
            argument,
            InputErrorKind::Range,
            format!("{name} must not be empty"),
        ));
    }
    if value.len() > max_bytes {
        return Err(LeaseError::argument(
            argument,
            InputErrorKind::Range,
            format!(
                "{name} is {} bytes in UTF-8, over the limit of {max_bytes}",
                value.len()
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_reject_empty_and_oversized_text_and_zero_ttl() {
        let limits = Limits {
            max_key_bytes: 4,
            max_owner_bytes: 2,
            max_ttl_ms: 10,
        };
        assert!(limits.check_key("abcd").is_ok());
        assert_eq!(
            limits.check_key("abcde").unwrap_err().code(),
            "ERR_LEASE_INVALID_KEY"
        );
        assert!(limits.check_key("").is_err());
        // "é" is two bytes: the cap counts UTF-8 bytes, not characters.
        assert!(limits.check_owner("é", "owner").is_ok());
        assert!(limits.check_owner("éa", "owner").is_err());
        assert!(limits.check_ttl(0).is_err());
        assert!(limits.check_ttl(10).is_ok());
        assert!(limits.check_ttl(11).is_err());
    }
}
