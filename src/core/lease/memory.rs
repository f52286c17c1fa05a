//! Leases in this process's memory: the embedded default, for a single process.
//!
//! Time is a monotonic clock (`Instant`), so changes to the wall clock never extend or cut a
//! lease. Expired leases are reclaimed two ways: every call reclaims a few of the oldest,
//! and [`MemoryStore::reclaim_expired`] (run periodically by the owner of the store) sweeps
//! the rest, so a million leases that expire do not stay resident.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::future::{ready, Future};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::{Grant, LeaseStore, Limits};
use crate::core::error::Result;

/// How many expired leases each call reclaims on its way, so no single call pays for a
/// large backlog: the periodic sweep does that.
const RECLAIM_PER_CALL: usize = 32;

/// An in-memory lease table guarded by one mutex. All operations are synchronous; the
/// [`LeaseStore`] implementation wraps them in ready futures.
#[derive(Debug, Default)]
pub struct MemoryStore {
    limits: Limits,
    table: Mutex<Table>,
}

#[derive(Debug, Default)]
struct Table {
    leases: HashMap<Arc<str>, Lease>,
    /// Every deadline ever set, earliest first. An entry is stale when its lease was renewed,
    /// transferred or released since; stale entries are skipped when they come up.
    deadlines: BinaryHeap<Reverse<(Instant, Arc<str>)>>,
}

#[derive(Debug)]
struct Lease {
    owner: String,
    expires: Instant,
}

impl MemoryStore {
    /// An empty store enforcing `limits`.
    pub fn new(limits: Limits) -> Self {
        Self {
            limits,
            table: Mutex::default(),
        }
    }

    /// Claims `key` for `owner`, or refreshes the TTL if `owner` already holds it.
    pub fn acquire(&self, key: &str, owner: &str, ttl_ms: u64) -> Result<Grant> {
        self.acquire_at(Instant::now(), key, owner, ttl_ms)
    }

    /// The live holder of `key`.
    pub fn owner(&self, key: &str) -> Result<Option<String>> {
        self.owner_at(Instant::now(), key)
    }

    /// Deletes the lease if `owner` holds it.
    pub fn release(&self, key: &str, owner: &str) -> Result<bool> {
        self.release_at(Instant::now(), key, owner)
    }

    /// Extends the lease if `owner` still holds it.
    pub fn renew(&self, key: &str, owner: &str, ttl_ms: u64) -> Result<bool> {
        self.renew_at(Instant::now(), key, owner, ttl_ms)
    }

    /// Hands the lease from `from` to `to` with a fresh TTL.
    pub fn transfer(&self, key: &str, from: &str, to: &str, ttl_ms: u64) -> Result<bool> {
        self.transfer_at(Instant::now(), key, from, to, ttl_ms)
    }

    /// Leases resident in memory, including expired ones not yet reclaimed.
    pub fn resident(&self) -> usize {
        self.lock().leases.len()
    }

    /// Drops every lease (used by `close()`).
    pub fn clear(&self) {
        *self.lock() = Table::default();
    }

    /// Reclaims up to `budget` expired leases; answers how many deadlines it looked at, so a
    /// caller sweeping a large backlog can release the lock between rounds.
    pub fn reclaim_expired(&self, budget: usize) -> usize {
        self.lock().reclaim(Instant::now(), budget)
    }

    fn acquire_at(&self, now: Instant, key: &str, owner: &str, ttl_ms: u64) -> Result<Grant> {
        self.limits.check_key(key)?;
        self.limits.check_owner(owner, "owner")?;
        self.limits.check_ttl(ttl_ms)?;
        let mut table = self.lock_at(now);
        if let Some(holder) = table.live(key, now) {
            if holder.owner != owner {
                let holder = Some(holder.owner.clone());
                return Ok(Grant {
                    acquired: false,
                    owner: holder,
                });
            }
        }
        table.put(key, owner, now + ms(ttl_ms));
        Ok(Grant {
            acquired: true,
            owner: Some(owner.to_owned()),
        })
    }

    fn owner_at(&self, now: Instant, key: &str) -> Result<Option<String>> {
        self.limits.check_key(key)?;
        let mut table = self.lock_at(now);
        Ok(table.live(key, now).map(|lease| lease.owner.clone()))
    }

    fn release_at(&self, now: Instant, key: &str, owner: &str) -> Result<bool> {
        self.limits.check_key(key)?;
        self.limits.check_owner(owner, "owner")?;
        let mut table = self.lock_at(now);
        if table.holds(key, owner, now) {
            table.leases.remove(key);
            return Ok(true);
        }
        Ok(false)
    }

    fn renew_at(&self, now: Instant, key: &str, owner: &str, ttl_ms: u64) -> Result<bool> {
        self.limits.check_key(key)?;
        self.limits.check_owner(owner, "owner")?;
        self.limits.check_ttl(ttl_ms)?;
        let mut table = self.lock_at(now);
        if table.holds(key, owner, now) {
            table.put(key, owner, now + ms(ttl_ms));
            return Ok(true);
        }
        Ok(false)
    }

    fn transfer_at(
        &self,
        now: Instant,
        key: &str,
        from: &str,
        to: &str,
        ttl_ms: u64,
    ) -> Result<bool> {
        self.limits.check_key(key)?;
        self.limits.check_owner(from, "fromOwner")?;
        self.limits.check_owner(to, "toOwner")?;
        self.limits.check_ttl(ttl_ms)?;
        let mut table = self.lock_at(now);
        if table.holds(key, from, now) {
            table.put(key, to, now + ms(ttl_ms));
            return Ok(true);
        }
        Ok(false)
    }

    /// Locks the table and reclaims a few expired leases on the way in.
    fn lock_at(&self, now: Instant) -> MutexGuard<'_, Table> {
        let mut table = self.lock();
        table.reclaim(now, RECLAIM_PER_CALL);
        table
    }

    fn lock(&self) -> MutexGuard<'_, Table> {
        // A panic while holding the lock cannot leave the table half-written (every update
        // is a single insert or remove), so a poisoned lock is still safe to use.
        self.table
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Table {
    fn live(&mut self, key: &str, now: Instant) -> Option<&Lease> {
        self.leases.get(key).filter(|lease| lease.expires > now)
    }

    fn holds(&mut self, key: &str, owner: &str, now: Instant) -> bool {
        self.live(key, now)
            .is_some_and(|lease| lease.owner == owner)
    }

    fn put(&mut self, key: &str, owner: &str, expires: Instant) {
        let key: Arc<str> = match self.leases.get_key_value(key) {
            Some((existing, _)) => existing.clone(),
            None => Arc::from(key),
        };
        self.deadlines.push(Reverse((expires, key.clone())));
        self.leases.insert(
            key,
            Lease {
                owner: owner.to_owned(),
                expires,
            },
        );
        // Renewals and early releases leave stale deadlines behind; when they outnumber the
        // leases, rebuild the heap so memory tracks the live table, not the call history.
        if self.deadlines.len() > 2 * self.leases.len() + 1024 {
            self.deadlines = self
                .leases
                .iter()
                .map(|(key, lease)| Reverse((lease.expires, key.clone())))
                .collect();
        }
    }

    fn reclaim(&mut self, now: Instant, budget: usize) -> usize {
        let mut seen = 0;
        while seen < budget {
            match self.deadlines.peek() {
                Some(Reverse((deadline, _))) if *deadline <= now => {}
                _ => break,
            }
            let Some(Reverse((_, key))) = self.deadlines.pop() else {
                break;
            };
            seen += 1;
            if self.leases.get(&key).is_some_and(|l| l.expires <= now) {
                self.leases.remove(&key);
            }
        }
        seen
    }
}

fn ms(ttl_ms: u64) -> Duration {
    Duration::from_millis(ttl_ms)
}

impl LeaseStore for MemoryStore {
    fn acquire(&self, key: &str, owner: &str, ttl_ms: u64) -> impl Future<Output = Result<Grant>> {
        ready(MemoryStore::acquire(self, key, owner, ttl_ms))
    }

    fn owner(&self, key: &str) -> impl Future<Output = Result<Option<String>>> {
        ready(MemoryStore::owner(self, key))
    }

    fn release(&self, key: &str, owner: &str) -> impl Future<Output = Result<bool>> {
        ready(MemoryStore::release(self, key, owner))
    }

    fn renew(&self, key: &str, owner: &str, ttl_ms: u64) -> impl Future<Output = Result<bool>> {
        ready(MemoryStore::renew(self, key, owner, ttl_ms))
    }

    fn transfer(
        &self,
        key: &str,
        from: &str,
        to: &str,
        ttl_ms: u64,
    ) -> impl Future<Output = Result<bool>> {
        ready(MemoryStore::transfer(self, key, from, to, ttl_ms))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> MemoryStore {
        MemoryStore::new(Limits::default())
    }

    fn at(base: Instant, ms: u64) -> Instant {
        base + Duration::from_millis(ms)
    }

    #[test]
    fn a_lease_is_free_again_exactly_when_its_ttl_runs_out() {
        let s = store();
        let t0 = Instant::now();
        assert!(s.acquire_at(t0, "k", "a", 100).unwrap().acquired);
        let lost = s.acquire_at(at(t0, 99), "k", "b", 100).unwrap();
        assert_eq!(lost.owner.as_deref(), Some("a"));
        assert!(!lost.acquired);
        assert!(s.acquire_at(at(t0, 100), "k", "b", 100).unwrap().acquired);
    }

    #[test]
    fn renew_after_expiry_returns_false_and_does_not_resurrect_the_lease() {
        let s = store();
        let t0 = Instant::now();
        s.acquire_at(t0, "k", "a", 50).unwrap();
        assert!(!s.renew_at(at(t0, 50), "k", "a", 1000).unwrap());
        assert_eq!(s.owner_at(at(t0, 51), "k").unwrap(), None);
    }

    #[test]
    fn transfer_moves_the_lease_with_a_fresh_ttl_and_only_from_the_holder() {
        let s = store();
        let t0 = Instant::now();
        s.acquire_at(t0, "k", "a", 100).unwrap();
        assert!(!s.transfer_at(at(t0, 10), "k", "x", "b", 100).unwrap());
        assert!(s.transfer_at(at(t0, 90), "k", "a", "b", 100).unwrap());
        assert_eq!(s.owner_at(at(t0, 180), "k").unwrap().as_deref(), Some("b"));
        assert_eq!(s.owner_at(at(t0, 190), "k").unwrap(), None);
    }

    #[test]
    fn release_by_another_owner_changes_nothing() {
        let s = store();
        let t0 = Instant::now();
        s.acquire_at(t0, "k", "a", 100).unwrap();
        assert!(!s.release_at(t0, "k", "b").unwrap());
        assert!(s.release_at(t0, "k", "a").unwrap());
        assert_eq!(s.owner_at(t0, "k").unwrap(), None);
    }

    #[test]
    fn bad_input_is_rejected_and_leaves_the_holder_in_place() {
        let s = store();
        let t0 = Instant::now();
        s.acquire_at(t0, "k", "a", 100).unwrap();
        assert!(s.renew_at(t0, "k", "a", 0).is_err());
        assert!(s.acquire_at(t0, "k", "", 100).is_err());
        assert!(s.transfer_at(t0, "k", "a", "", 100).is_err());
        assert_eq!(s.owner_at(at(t0, 99), "k").unwrap().as_deref(), Some("a"));
    }

    #[test]
    fn expired_leases_are_reclaimed_and_stale_deadlines_do_not_pile_up() {
        let s = store();
        let t0 = Instant::now();
        for i in 0..10_000 {
            s.acquire_at(t0, &format!("k{i}"), "a", 10).unwrap();
        }
        assert_eq!(s.resident(), 10_000);
        while s.lock().reclaim(at(t0, 10), 1000) > 0 {}
        assert_eq!(s.resident(), 0);

        s.acquire_at(t0, "held", "a", 1_000_000).unwrap();
        for i in 0..100_000 {
            s.renew_at(at(t0, i), "held", "a", 1_000_000).unwrap();
        }
        let one_lease_bound = 2 + 1024 + 1;
        assert!(s.lock().deadlines.len() <= one_lease_bound);
    }
}
