//! Leases in this process's memory: the embedded default, for a single process.
//!
//! Time is an `Instant` each call is given: the monotonic clock's (`Instant::now()`), so
//! changes to the wall clock never extend or cut a lease, or a [`FollowedClock`]'s, for an
//! embedder that follows another clock (a test's fake one). Expired leases are reclaimed two
//! ways: every call reclaims a few of the oldest, and [`MemoryStore::reclaim_expired_at`]
//! (run periodically by the owner of the store) sweeps the rest, so a million leases that
//! expire do not stay resident.
//!
//! A store is used on one thread (the glue's: Node's, where its calls are made and its sweep
//! runs), so it takes no lock.

use std::cell::{RefCell, RefMut};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::num::NonZeroU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hashbrown::hash_map::EntryRef;
use hashbrown::HashMap;

use super::{Answer, Call, Grant, Holder, Limits};
use crate::core::error::Result;

mod clock;
pub use clock::FollowedClock;

/// How many expired leases each call reclaims on its way, so no single call pays for a
/// large backlog: the periodic sweep does that.
const RECLAIM_PER_CALL: usize = 32;

/// An in-memory lease table, for one thread. All operations are synchronous.
#[derive(Debug, Default)]
pub struct MemoryStore {
    limits: Limits,
    table: RefCell<Table>,
}

#[derive(Debug, Default)]
struct Table {
    /// foldhash rather than std's SipHash: every call hashes its key, and foldhash, still
    /// seeded per process, keeps keys from being chosen to collide, which is all SipHash's
    /// strength buys here (what it saves: docs/benchmarks.md).
    leases: HashMap<Arc<str>, Lease, foldhash::fast::RandomState>,
    /// Earliest first: each resident lease's `queued` deadline, and stale entries (of leases
    /// released since, or queued again earlier), skipped when they come up. A call that moves
    /// a lease later queues nothing: its entry moves when it comes up.
    deadlines: BinaryHeap<Reverse<(Instant, Arc<str>)>>,
    /// The last fencing token handed out, for any key: every fenced claim takes the next, so
    /// each is greater than every token granted before for its key.
    last_token: u64,
}

#[derive(Debug)]
struct Lease {
    holder: Holder,
    expires: Instant,
    /// Its fencing token: taken by the first fenced grant, kept by refreshes and renewals.
    /// Tokens start at 1, so `None` costs no room.
    token: Option<NonZeroU64>,
    /// The deadline its entry in `deadlines` has: never later than `expires`, so a sweep
    /// finds it once expired. A renewal that moves `expires` later leaves it (the entry is
    /// moved when it comes up); one that moves it earlier adds an entry.
    queued: Instant,
}

impl Lease {
    fn is_live(&self, now: Instant) -> bool {
        self.expires > now
    }

    fn is_held_by(&self, holder: &Holder, now: Instant) -> bool {
        self.is_live(now) && self.holder == *holder
    }

    /// Sets its expiry; `true` when that comes before its queued deadline, which must then be
    /// queued again at `expires`.
    fn expire_at(&mut self, expires: Instant) -> bool {
        self.expires = expires;
        let earlier = expires < self.queued;
        if earlier {
            self.queued = expires;
        }
        earlier
    }
}

impl MemoryStore {
    /// An empty store enforcing `limits`.
    pub fn new(limits: Limits) -> Self {
        Self {
            limits,
            table: RefCell::default(),
        }
    }

    /// Leases resident in memory, including expired ones not yet reclaimed.
    pub fn resident(&self) -> usize {
        self.table().leases.len()
    }

    /// Drops every lease (used by `close()`).
    pub fn clear(&self) {
        *self.table() = Table::default();
    }

    /// Reclaims up to `budget` leases expired at `now`; answers how many deadlines it looked
    /// at, so a caller sweeping a large backlog can let other work run between rounds.
    pub fn reclaim_expired_at(&self, now: Instant, budget: usize) -> usize {
        self.table().reclaim(now, budget)
    }

    /// Executes one call on the spot at `now`: arguments checked first, then the operation.
    /// The call is taken whole, so a lease it makes keeps the call's own key and holder, not
    /// copies. A store's calls all take one clock's instants (`Instant::now()`'s, or one
    /// [`FollowedClock`]'s), each no earlier than the last.
    pub fn apply_at(&self, now: Instant, call: Call) -> Result<Answer> {
        call.check(&self.limits)?;
        let mut table = self.table_at(now);
        Ok(match call {
            Call::Acquire {
                key,
                holder,
                ttl_ms,
                fenced,
            } => Answer::Grant(table.acquire(now, &key, holder, ttl_ms, fenced)),
            Call::Owner { key } => {
                Answer::Owner(table.live(&key, now).map(|l| l.holder.owner.clone()))
            }
            Call::Lease { key } => Answer::Lease(table.live(&key, now).map(|l| super::Lease {
                owner: l.holder.owner.clone(),
                token: l.token.map(NonZeroU64::get),
                ttl_ms: Some(
                    u64::try_from(l.expires.duration_since(now).as_millis()).unwrap_or(u64::MAX),
                ),
                raw_owner: None,
            })),
            Call::Record { key } => Answer::Record(table.live(&key, now).map(|l| l.holder.clone())),
            Call::Release { key, holder } => Answer::Released(table.release(now, &key, &holder)),
            Call::Renew {
                key,
                holder,
                ttl_ms,
            } => Answer::Renewed(table.renew(now, &key, &holder, ttl_ms)),
            Call::Transfer {
                key,
                from,
                to,
                ttl_ms,
            } => Answer::Transferred(table.transfer(now, &key, &from, to, ttl_ms)),
        })
    }

    /// The table, a few expired leases reclaimed on the way in.
    fn table_at(&self, now: Instant) -> RefMut<'_, Table> {
        let mut table = self.table();
        table.reclaim(now, RECLAIM_PER_CALL);
        table
    }

    fn table(&self) -> RefMut<'_, Table> {
        self.table.borrow_mut()
    }
}

impl Table {
    // Each call finds its key once: a hash and a probe less than a look first and a write
    // after. The token counter and the heap are other fields than the map, so they can be
    // touched while an entry of it is held.

    /// A claim takes a token only when fenced; a refresh keeps the lease's, and a fenced
    /// refresh of a lease without one takes one.
    fn acquire(
        &mut self,
        now: Instant,
        key: &str,
        holder: Holder,
        ttl_ms: u64,
        fenced: bool,
    ) -> Grant {
        let expires = now + ms(ttl_ms);
        let (token, owner, queue) = match self.leases.entry_ref(key) {
            EntryRef::Occupied(mut entry) => {
                let lease = entry.get_mut();
                let live = lease.is_live(now);
                let same = lease.holder == holder;
                if live && !same {
                    return Grant {
                        acquired: false,
                        owner: Some(lease.holder.owner.clone()),
                        token: None,
                        fenced,
                    };
                }
                // A refresh keeps its token and its holder (the call's is the same, and
                // becomes the answer); a claim of an expired lease starts afresh.
                let owner = if same {
                    holder.owner
                } else {
                    let owner = holder.owner.clone();
                    lease.holder = holder;
                    owner
                };
                let kept = lease.token.filter(|_| live);
                lease.token = kept.or_else(|| fenced.then(|| next_token(&mut self.last_token)));
                let token = lease.token;
                let queue = lease.expire_at(expires).then(|| entry.key().clone());
                (token, owner, queue)
            }
            EntryRef::Vacant(free) => {
                let token = fenced.then(|| next_token(&mut self.last_token));
                let owner = holder.owner.clone();
                let entry = free.insert_entry(Lease {
                    holder,
                    expires,
                    token,
                    queued: expires,
                });
                (token, owner, Some(entry.key().clone()))
            }
        };
        if let Some(key) = queue {
            self.queue(expires, key);
        }
        Grant {
            acquired: true,
            owner: Some(owner),
            token: token.filter(|_| fenced).map(NonZeroU64::get),
            fenced,
        }
    }

    fn release(&mut self, now: Instant, key: &str, holder: &Holder) -> bool {
        match self.leases.entry_ref(key) {
            EntryRef::Occupied(entry) if entry.get().is_held_by(holder, now) => {
                entry.remove();
                true
            }
            _ => false,
        }
    }

    fn renew(&mut self, now: Instant, key: &str, holder: &Holder, ttl_ms: u64) -> bool {
        let expires = now + ms(ttl_ms);
        match self.leases.get_key_value_mut(key) {
            Some((key, lease)) if lease.is_held_by(holder, now) => {
                if lease.expire_at(expires) {
                    let key = key.clone();
                    self.queue(expires, key);
                }
                true
            }
            _ => false,
        }
    }

    /// A fenced lease's new holder gets a new token, so a resource that checks tokens
    /// refuses the old holder's late writes.
    fn transfer(
        &mut self,
        now: Instant,
        key: &str,
        from: &Holder,
        to: Holder,
        ttl_ms: u64,
    ) -> bool {
        let expires = now + ms(ttl_ms);
        match self.leases.get_key_value_mut(key) {
            Some((key, lease)) if lease.is_held_by(from, now) => {
                if lease.token.is_some() {
                    lease.token = Some(next_token(&mut self.last_token));
                }
                lease.holder = to;
                if lease.expire_at(expires) {
                    let key = key.clone();
                    self.queue(expires, key);
                }
                true
            }
            _ => false,
        }
    }

    fn live(&self, key: &str, now: Instant) -> Option<&Lease> {
        self.leases.get(key).filter(|lease| lease.is_live(now))
    }

    fn queue(&mut self, deadline: Instant, key: Arc<str>) {
        self.deadlines.push(Reverse((deadline, key)));
        // Releases and shortened leases leave stale deadlines behind; when they outnumber the
        // leases, rebuild the heap so memory tracks the live table, not the call history.
        if self.deadlines.len() > 2 * self.leases.len() + 1024 {
            self.deadlines = self
                .leases
                .iter_mut()
                .map(|(key, lease)| {
                    lease.queued = lease.expires;
                    Reverse((lease.expires, key.clone()))
                })
                .collect();
        }
    }

    /// Looks at up to `budget` deadlines that have come: a lease that expired is dropped, one
    /// renewed or moved since gets its deadline again at its new expiry.
    fn reclaim(&mut self, now: Instant, budget: usize) -> usize {
        let mut seen = 0;
        while seen < budget {
            match self.deadlines.peek() {
                Some(Reverse((deadline, _))) if *deadline <= now => {}
                _ => break,
            }
            let Some(Reverse((deadline, key))) = self.deadlines.pop() else {
                break;
            };
            seen += 1;
            match self.leases.get_mut(&key) {
                Some(lease) if !lease.is_live(now) => {
                    self.leases.remove(&key);
                }
                // Its own entry, come up while it lives on: queued again at its expiry.
                Some(lease) if lease.queued == deadline => {
                    lease.queued = lease.expires;
                    let expires = lease.expires;
                    self.queue(expires, key);
                }
                _ => {}
            }
        }
        if seen > 0 {
            self.shrink_if_sparse();
        }
        seen
    }

    /// Gives memory back once the table has emptied to a quarter of its room: a table that
    /// held a million leases keeps its buckets (and its heap its slots) otherwise, long after
    /// they expired. Halving the room each time keeps the rehashing amortized.
    fn shrink_if_sparse(&mut self) {
        if self.leases.capacity() > MIN_ROOM && self.leases.len() * 4 < self.leases.capacity() {
            self.leases.shrink_to(self.leases.len() * 2);
        }
        if self.deadlines.capacity() > MIN_ROOM
            && self.deadlines.len() * 4 < self.deadlines.capacity()
        {
            self.deadlines.shrink_to(self.deadlines.len() * 2);
        }
    }
}

/// The token after `last`, which becomes the last.
fn next_token(last: &mut u64) -> NonZeroU64 {
    *last = last.saturating_add(1);
    NonZeroU64::new(*last).unwrap_or(NonZeroU64::MAX)
}

/// Below this many slots a table is not worth shrinking.
const MIN_ROOM: usize = 1024;

fn ms(ttl_ms: u64) -> Duration {
    Duration::from_millis(ttl_ms)
}

#[cfg(test)]
mod tests;
