//! Leases: the five operations Mastra's Signals runtime calls, and the limits every store
//! enforces on its input before doing any work.

mod inspect;
pub mod keys;
pub use inspect::Page;
pub mod memory;
#[cfg(test)]
mod props;
pub mod redis;
pub mod stats;
mod watch;

use crate::core::error::{Argument, Error, InputErrorKind, Result};

/// Who holds a lease: an owner and, optionally, the metadata it holds it with (Mastra passes
/// a run's identity, so that one owner id running two runs holds a key for one of them only).
/// The pair is the holder: a call whose pair differs from the holder's is refused as a call of
/// another owner is. No metadata is a value of its own, "none", never a wildcard.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Holder {
    pub owner: String,
    pub metadata: Option<String>,
}

impl Holder {
    /// An owner with no metadata.
    #[cfg(test)]
    pub fn new(owner: impl Into<String>) -> Self {
        Self {
            owner: owner.into(),
            metadata: None,
        }
    }

    /// An owner holding with `metadata`.
    #[cfg(test)]
    pub fn with(owner: impl Into<String>, metadata: impl Into<String>) -> Self {
        Self {
            owner: owner.into(),
            metadata: Some(metadata.into()),
        }
    }

    /// The metadata as a Redis script takes it where another argument follows: empty for
    /// none (an empty metadata is refused before any I/O, so the two never meet). Last in
    /// line, none is left out instead.
    pub fn metadata_arg(&self) -> &str {
        self.metadata.as_deref().unwrap_or("")
    }

    /// Checks the owner and the metadata against `limits`; `name` is the owner's argument.
    fn check(&self, limits: &Limits, name: &str, metadata_name: &str) -> Result<()> {
        limits.check_owner(&self.owner, name)?;
        match &self.metadata {
            Some(metadata) => limits.check_metadata(metadata, metadata_name),
            None => Ok(()),
        }
    }
}

/// The answer to an acquire: whether the caller holds the lease now, and who does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// `true` when the caller holds the lease after the call.
    pub acquired: bool,
    /// The owner holding after the call: the caller when `acquired`, else the other holder's
    /// (which may be the caller's own owner id, holding with other metadata).
    pub owner: Option<String>,
    /// For a fenced acquire that granted: the lease's fencing token, greater than every token
    /// granted before for the key (a refresh keeps it). `None` otherwise.
    pub token: Option<u64>,
    /// Whether the call asked for a token (`acquireFencedLease`): its answer has a `token`.
    pub fenced: bool,
}

/// A live lease, read whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub owner: String,
    /// Its fencing token; `None` for a lease no fenced call has granted (an `acquireLease`,
    /// or a grant written by another client, such as Mastra's own backend).
    pub token: Option<u64>,
    /// Milliseconds left before it expires; `None` for a key with no expiry at all (written
    /// without `PX` by another client: a raw `SET`), which only a release or a `DEL` ends.
    pub ttl_ms: Option<u64>,
    /// The owner as Redis holds it, when that is not UTF-8 (another client wrote it): `owner`
    /// shows U+FFFD for the bytes it cannot show.
    pub raw_owner: Option<Vec<u8>>,
}

/// One lease operation and its arguments. Calls are what stores execute, alone or in
/// batches (Redis pipelines a batch into one write).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    /// Claim a free or expired key, or refresh the TTL when `holder` already holds it.
    /// `fenced`: the grant carries a fencing token (one is taken if the lease has none).
    Acquire {
        key: String,
        holder: Holder,
        ttl_ms: u64,
        fenced: bool,
    },
    /// Read the owner of a live lease.
    Owner { key: String },
    /// Read a live lease whole: owner, fencing token, time left.
    Lease { key: String },
    /// Read a live lease's holder: owner and metadata.
    Record { key: String },
    /// Delete the lease if `holder` holds it; otherwise do nothing.
    Release { key: String, holder: Holder },
    /// Extend the TTL if `holder` still holds the lease; never bring an expired one back.
    Renew {
        key: String,
        holder: Holder,
        ttl_ms: u64,
    },
    /// Move a lease `from` holds to `to` with a fresh TTL, never leaving the key free. A
    /// fenced lease stays fenced: `to` gets a new token.
    Transfer {
        key: String,
        from: Holder,
        to: Holder,
        ttl_ms: u64,
    },
}

/// What a [`Call`] answers, variant for variant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// From [`Call::Acquire`].
    Grant(Grant),
    /// From [`Call::Owner`]: the live owner, if any.
    Owner(Option<String>),
    /// From [`Call::Lease`]: the live lease, if any.
    Lease(Option<Lease>),
    /// From [`Call::Record`]: the live lease's holder, if any.
    Record(Option<Holder>),
    /// From [`Call::Release`]: whether a lease was deleted.
    Released(bool),
    /// From [`Call::Renew`]: whether the holder still held the lease.
    Renewed(bool),
    /// From [`Call::Transfer`]: whether the lease moved.
    Transferred(bool),
}

impl Answer {
    /// Whether the call granted or moved a lease: the answers failover-safe grants hold back
    /// until replicas confirm them (a refusal wrote nothing to confirm).
    pub fn granted(&self) -> bool {
        match self {
            Answer::Grant(grant) => grant.acquired,
            Answer::Renewed(done) | Answer::Transferred(done) => *done,
            Answer::Owner(_) | Answer::Lease(_) | Answer::Record(_) | Answer::Released(_) => false,
        }
    }
}

impl Call {
    /// The lease method that makes this call.
    pub fn operation(&self) -> stats::Operation {
        match self {
            Call::Acquire { fenced: false, .. } => stats::Operation::AcquireLease,
            Call::Acquire { fenced: true, .. } => stats::Operation::AcquireFencedLease,
            Call::Owner { .. } => stats::Operation::GetLeaseOwner,
            Call::Lease { .. } => stats::Operation::GetLease,
            Call::Record { .. } => stats::Operation::GetLeaseRecord,
            Call::Release { .. } => stats::Operation::ReleaseLease,
            Call::Renew { .. } => stats::Operation::RenewLease,
            Call::Transfer { .. } => stats::Operation::TransferLease,
        }
    }

    /// The lease key the call is about.
    pub fn key(&self) -> &str {
        match self {
            Call::Acquire { key, .. }
            | Call::Owner { key }
            | Call::Lease { key }
            | Call::Record { key }
            | Call::Release { key, .. }
            | Call::Renew { key, .. }
            | Call::Transfer { key, .. } => key,
        }
    }

    /// Whether the call may change who holds the lease (an acquire, a release, a transfer;
    /// a renew only extends it): what the key's other calls find depends on it.
    pub fn may_change_holder(&self) -> bool {
        matches!(
            self,
            Call::Acquire { .. } | Call::Release { .. } | Call::Transfer { .. }
        )
    }

    /// Whether the call may grant or move a lease (under `minReplicas`, confirmed by `WAIT`).
    pub fn grants(&self) -> bool {
        matches!(
            self,
            Call::Acquire { .. } | Call::Renew { .. } | Call::Transfer { .. }
        )
    }

    /// Checks the call's arguments against `limits`; a failing call is never executed.
    pub fn check(&self, limits: &Limits) -> Result<()> {
        match self {
            Call::Acquire {
                key,
                holder,
                ttl_ms,
                ..
            }
            | Call::Renew {
                key,
                holder,
                ttl_ms,
            } => {
                limits.check_key(key)?;
                holder.check(limits, "owner", "metadata")?;
                limits.check_ttl(*ttl_ms)
            }
            Call::Owner { key } | Call::Lease { key } | Call::Record { key } => {
                limits.check_key(key)
            }
            Call::Release { key, holder } => {
                limits.check_key(key)?;
                holder.check(limits, "owner", "metadata")
            }
            Call::Transfer {
                key,
                from,
                to,
                ttl_ms,
            } => {
                limits.check_key(key)?;
                from.check(limits, "fromOwner", "fromMetadata")?;
                to.check(limits, "toOwner", "toMetadata")?;
                limits.check_ttl(*ttl_ms)
            }
        }
    }
}

/// Where [`RedisStore::execute_each`](redis::RedisStore::execute_each) hands answers: each
/// with its call's place in the batch.
pub type Answered<'a> = dyn Fn(Vec<(usize, Result<Answer>)>) + Send + Sync + 'a;

/// Longest `keyPrefix`, in UTF-8 bytes: it starts every key a provider or pubsub writes, so
/// it is held to what an owner may be, and not to a key's own (larger) limit.
pub const MAX_KEY_PREFIX_BYTES: usize = 1024;

/// Upper bounds on input, checked before any work so a bad call changes nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Longest key, in UTF-8 bytes. Default 4096.
    pub max_key_bytes: usize,
    /// Longest owner, in UTF-8 bytes. Default 1024.
    pub max_owner_bytes: usize,
    /// Longest metadata, in UTF-8 bytes. Default 4096.
    pub max_metadata_bytes: usize,
    /// Longest TTL, in milliseconds. Default 86 400 000 (one day).
    pub max_ttl_ms: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_key_bytes: 4096,
            max_owner_bytes: 1024,
            max_metadata_bytes: 4096,
            max_ttl_ms: 86_400_000,
        }
    }
}

/// The largest `maxTtlMs` accepted: about 285,000 years (2^53 ms), far below where Redis' PX arithmetic
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

    /// Rejects an empty or over-long metadata (empty would read as none in Redis, where the
    /// scripts take "" for no metadata). `name` is the argument's name in messages.
    pub fn check_metadata(&self, metadata: &str, name: &str) -> Result<()> {
        check_text(metadata, name, Argument::Metadata, self.max_metadata_bytes)
    }

    /// Rejects a TTL outside `1..=max_ttl_ms` (0 would delete a Redis key on renew).
    pub fn check_ttl(&self, ttl_ms: u64) -> Result<()> {
        if ttl_ms == 0 || ttl_ms > self.max_ttl_ms {
            return Err(Error::argument(
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
        return Err(Error::argument(
            argument,
            InputErrorKind::Range,
            format!("{name} must not be empty"),
        ));
    }
    if value.len() > max_bytes {
        return Err(Error::argument(
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
    fn only_an_answer_that_granted_or_moved_a_lease_waits_for_replicas() {
        let grant = |acquired| {
            Answer::Grant(Grant {
                acquired,
                owner: Some("a".into()),
                token: acquired.then_some(1),
                fenced: true,
            })
        };
        assert!(grant(true).granted());
        assert!(!grant(false).granted());
        assert!(Answer::Renewed(true).granted() && Answer::Transferred(true).granted());
        assert!(!Answer::Renewed(false).granted() && !Answer::Transferred(false).granted());
        assert!(!Answer::Released(true).granted() && !Answer::Owner(None).granted());
    }

    #[test]
    fn limits_reject_empty_and_oversized_text_and_zero_ttl() {
        let limits = Limits {
            max_key_bytes: 4,
            max_owner_bytes: 2,
            max_metadata_bytes: 3,
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
        assert!(limits.check_metadata("abc", "metadata").is_ok());
        assert_eq!(
            limits.check_metadata("", "metadata").unwrap_err().code(),
            "ERR_LEASE_INVALID_METADATA"
        );
        assert!(limits.check_metadata("abcd", "metadata").is_err());
    }
}
