//! What a provider's lease calls came to since it was made: calls per operation, errors per
//! code, grants, refusals and renewals that found the lease lost. For a health endpoint that
//! has no OpenTelemetry; counting costs a few adds per call (relaxed atomic ones where the
//! calls are answered on another thread than the one reading the counters).

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use super::Answer;
use crate::core::{lock, Error};

/// A lease method, in the order [`Snapshot::calls`] counts them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    AcquireLease,
    GetLeaseOwner,
    ReleaseLease,
    RenewLease,
    TransferLease,
    AcquireFencedLease,
    GetLease,
    GetLeaseRecord,
}

/// How many [`Operation`]s there are.
pub const OPERATIONS: usize = 8;

impl Operation {
    /// The method's JavaScript name.
    pub fn name(self) -> &'static str {
        match self {
            Operation::AcquireLease => "acquireLease",
            Operation::GetLeaseOwner => "getLeaseOwner",
            Operation::ReleaseLease => "releaseLease",
            Operation::RenewLease => "renewLease",
            Operation::TransferLease => "transferLease",
            Operation::AcquireFencedLease => "acquireFencedLease",
            Operation::GetLease => "getLease",
            Operation::GetLeaseRecord => "getLeaseRecord",
        }
    }
}

/// One counter: an `AtomicU64` for a provider whose calls are answered on the runtime's
/// threads, a `Cell` for one whose calls are all made and answered on one thread.
pub trait Counter: Default {
    fn add_one(&self);
    fn get(&self) -> u64;
}

impl Counter for AtomicU64 {
    fn add_one(&self) {
        self.fetch_add(1, Ordering::Relaxed);
    }

    fn get(&self) -> u64 {
        self.load(Ordering::Relaxed)
    }
}

impl Counter for Cell<u64> {
    fn add_one(&self) {
        self.set(self.get() + 1);
    }

    fn get(&self) -> u64 {
        Cell::get(self)
    }
}

/// The counters of one provider.
#[derive(Debug, Default)]
pub struct Stats<C: Counter = AtomicU64> {
    calls: [C; OPERATIONS],
    granted: C,
    refused: C,
    lost: C,
    /// Calls that rejected, per error code, in the order the codes first came.
    errors: Mutex<Vec<(&'static str, u64)>>,
}

/// The counters at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// Calls made, per operation (in [`Operation`]'s order), rejected ones included.
    pub calls: [u64; OPERATIONS],
    /// Grants: acquires that left the caller holding the lease, and transfers that moved it.
    pub granted: u64,
    /// Acquires answered with another owner.
    pub refused: u64,
    /// Renewals answered `false`: the caller had lost the lease.
    pub lost: u64,
    /// Rejected calls per error code.
    pub errors: Vec<(&'static str, u64)>,
}

impl<C: Counter> Stats<C> {
    /// Counts one call of `operation` and how it ended.
    pub fn record(&self, operation: Operation, outcome: Result<&Answer, &Error>) {
        self.calls[operation as usize].add_one();
        let counter = match outcome {
            Ok(Answer::Grant(grant)) if grant.acquired => &self.granted,
            Ok(Answer::Grant(_)) => &self.refused,
            Ok(Answer::Transferred(true)) => &self.granted,
            Ok(Answer::Renewed(false)) => &self.lost,
            Ok(_) => return,
            Err(err) => {
                let code = err.code();
                let mut errors = lock(&self.errors);
                match errors.iter_mut().find(|(c, _)| *c == code) {
                    Some((_, n)) => *n += 1,
                    None => errors.push((code, 1)),
                }
                return;
            }
        };
        counter.add_one();
    }

    /// The counters now.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            calls: std::array::from_fn(|i| self.calls[i].get()),
            granted: self.granted.get(),
            refused: self.refused.get(),
            lost: self.lost.get(),
            errors: lock(&self.errors).clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::lease::Grant;

    #[test]
    fn every_call_is_counted_once_with_how_it_ended_by_either_kind_of_counter() {
        assert_counts(&Stats::<AtomicU64>::default());
        assert_counts(&Stats::<Cell<u64>>::default());
    }

    fn assert_counts<C: Counter>(stats: &Stats<C>) {
        let grant = |acquired| {
            Answer::Grant(Grant {
                acquired,
                owner: Some("a".into()),
                token: None,
                fenced: false,
            })
        };
        stats.record(Operation::AcquireLease, Ok(&grant(true)));
        stats.record(Operation::AcquireLease, Ok(&grant(false)));
        stats.record(Operation::RenewLease, Ok(&Answer::Renewed(false)));
        stats.record(Operation::RenewLease, Ok(&Answer::Renewed(true)));
        stats.record(Operation::TransferLease, Ok(&Answer::Transferred(true)));
        stats.record(
            Operation::GetLeaseOwner,
            Err(&Error::timeout(Default::default())),
        );
        stats.record(
            Operation::ReleaseLease,
            Err(&Error::timeout(Default::default())),
        );
        assert_eq!(
            stats.snapshot(),
            Snapshot {
                calls: [2, 1, 1, 2, 1, 0, 0, 0],
                granted: 2,
                refused: 1,
                lost: 1,
                errors: vec![("ERR_LEASE_TIMEOUT", 2)],
            }
        );
    }
}
