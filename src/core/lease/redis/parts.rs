//! How a batch is split into pipelines: a key's calls all in one, a few pipelines at once, one
//! master's keys per pipeline on a cluster (one slot's where its masters are not on Node's
//! loop), over the connections they are spread over by what is in flight on each
//! ([`InFlight`]), and under `minReplicas` the keys a call may grant apart.

use std::hash::BuildHasher;

use hashbrown::{HashMap, HashSet};

use super::{Call, RedisStore, Sent};
use crate::core::lock;

/// foldhash, seeded per process, rather than std's SipHash: every call's key is hashed here
/// (as in the in-memory table, `memory.rs`).
type Hasher = foldhash::fast::RandomState;

/// The calls in flight on each connection a store's calls are spread over, and where each key's
/// are. A key with calls in flight gets its next ones on the same connection, after them, so
/// a key's calls take effect in the order they were made. The others of a batch go whole on
/// the connection with the fewest calls in flight, and are spread by key over every
/// connection only when none has any: each connection then carries a turn's worth of calls
/// in one pipeline, Redis reads them in one go, and while it works on one connection's this
/// process answers the other's. Spread by key every time, the pipelines shrink turn after
/// turn (the answers of one connection's calls make the next calls of both), and Redis
/// reads a few calls at a time: over TLS it spent half as much again per call.
#[derive(Debug, Default)]
pub(super) struct InFlight {
    /// Per connection (0 the first, n the n-th beside it), its calls in flight.
    on: Vec<usize>,
    /// Per key (by its hash: two keys that share one share a connection, no harm), the
    /// connection its calls in flight are on, and how many.
    keys: HashMap<u64, (usize, usize), Hasher>,
}

impl InFlight {
    /// Counts a call on the key of `hash` in flight, on the connection its calls in flight
    /// are on, else on `new`'s; answers which.
    fn count(&mut self, hash: u64, new: impl FnOnce() -> usize) -> usize {
        let (on, count) = self.keys.entry(hash).or_insert_with(|| (new(), 0));
        *count += 1;
        let on = *on;
        self.on[on] += 1;
        on
    }

    /// Counts out a call on the key of `hash`, in flight on connection `on`.
    fn uncount(&mut self, hash: u64, on: usize) {
        if let Some(count) = self.on.get_mut(on) {
            *count = count.saturating_sub(1);
        }
        if let Some((_, count)) = self.keys.get_mut(&hash) {
            *count -= 1;
            if *count == 0 {
                self.keys.remove(&hash);
            }
        }
    }
}

/// A key's hash in [`InFlight`].
fn key_hash(key: &str) -> u64 {
    foldhash::fast::FixedState::default().hash_one(key)
}

/// A pipeline's calls counted in flight until it is dropped.
pub(super) struct Flying<'a> {
    store: &'a RedisStore,
    calls: &'a [Sent],
    pipeline: &'a Part,
}

impl Drop for Flying<'_> {
    fn drop(&mut self) {
        let mut flight = lock(&self.store.in_flight);
        for &i in &self.pipeline.sent {
            flight.uncount(key_hash(self.calls[i].call.key()), self.pipeline.on);
        }
    }
}

impl RedisStore {
    /// Splits the calls at `good` into pipelines: a key's calls all in the pipeline of its
    /// first; at most [`pipeline_size`] keys' first calls in one; one node's keys per
    /// pipeline ([`Connection::by_node`](crate::core::connection::Connection::by_node)); on the
    /// connections they are spread over as [`InFlight`] says, counted in flight there until
    /// the guard of [`RedisStore::flying`] drops; and, under `minReplicas`, the keys a call
    /// may grant apart from the others.
    pub(super) fn pipelines(&self, calls: &[Sent], good: &[usize]) -> Vec<Part> {
        let size = pipeline_size(good.len());
        let confirming = self.replication.is_some();
        let confirmed: HashSet<&str, Hasher> = match confirming {
            true => good
                .iter()
                .map(|&i| &calls[i].call)
                .filter(|call| call.grants())
                .map(Call::key)
                .collect(),
            false => HashSet::default(),
        };
        let nodes = self.connection.by_node(good.iter().copied(), |&i| {
            self.layout.slot(calls[i].call.key().as_bytes())
        });
        // Held while the batch's calls are counted in flight, below (the guards of `flying`
        // count them out): a batch made meanwhile must find this one's keys where they went.
        let mut flight = (!self.beside.is_empty()).then(|| lock(&self.in_flight));
        let connections = self.beside.len() + 1;
        let spread = flight.as_deref_mut().map(|flight| {
            flight.on.resize(connections, 0);
            let least = (0..connections)
                .min_by_key(|&on| flight.on[on])
                .unwrap_or(0);
            (flight.on.iter().all(|&n| n == 0), least)
        });
        let mut pipelines: Vec<Part> = Vec::new();
        // Per key, its pipeline and its hash in `flight`.
        let mut of_key: HashMap<&str, (usize, u64), Hasher> = HashMap::default();
        for node in nodes {
            // The pipelines before these hold another node's keys.
            let first = pipelines.len();
            for i in node {
                let key = calls[i].call.key();
                if let Some(&(at, hash)) = of_key.get(key) {
                    pipelines[at].sent.push(i);
                    pipelines[at].keys_repeat = true;
                    if let Some(flight) = flight.as_deref_mut() {
                        flight.count(hash, || pipelines[at].on);
                    }
                    continue;
                }
                let confirm = confirmed.contains(key);
                let hash = flight.as_ref().map_or(0, |_| key_hash(key));
                let on = match (flight.as_deref_mut(), spread) {
                    (Some(flight), Some((idle, least))) => flight.count(hash, || match idle {
                        true => (hash % connections as u64) as usize,
                        false => least,
                    }),
                    _ => 0,
                };
                let open = pipelines[first..]
                    .iter()
                    .rposition(|p| p.confirm == confirm && p.on == on && p.keys < size);
                let at = match open {
                    Some(at) => first + at,
                    None => {
                        pipelines.push(Part {
                            sent: Vec::new(),
                            keys: 0,
                            keys_repeat: false,
                            confirm,
                            on,
                        });
                        pipelines.len() - 1
                    }
                };
                pipelines[at].sent.push(i);
                pipelines[at].keys += 1;
                of_key.insert(key, (at, hash));
            }
        }
        pipelines
    }

    /// `pipeline`'s calls, counted in flight by [`RedisStore::pipelines`], until the result
    /// is dropped; nothing when the calls go on one connection.
    pub(super) fn flying<'a>(
        &'a self,
        calls: &'a [Sent],
        pipeline: &'a Part,
    ) -> Option<Flying<'a>> {
        (!self.beside.is_empty()).then_some(Flying {
            store: self,
            calls,
            pipeline,
        })
    }
}

/// The most calls sent as one pipeline.
const MAX_PIPELINE: usize = 64;

/// How many keys of a batch of `n` calls go in one pipeline: small batches travel whole;
/// larger ones in at least two pipelines, so Redis works on one while the other's callers
/// run (docs/benchmarks.md has what that is worth).
pub(super) fn pipeline_size(n: usize) -> usize {
    if n <= 16 {
        n
    } else {
        n.div_ceil(2).min(MAX_PIPELINE)
    }
}

/// A part of a batch sent as one pipeline.
#[derive(Clone)]
pub(super) struct Part {
    /// The calls, by their place in the batch, in order.
    pub(super) sent: Vec<usize>,
    /// How many keys they are on.
    pub(super) keys: usize,
    /// Some key has more than one call here.
    pub(super) keys_repeat: bool,
    /// One of the calls on every key here may grant a lease, under `minReplicas`: they go on
    /// a lent link, the grants confirmed there.
    pub(super) confirm: bool,
    /// The connection it goes through: 0 the store's first, n its n-th beside it (a part to
    /// confirm goes on a link the first lends).
    pub(super) on: usize,
}

/// For each call at `sent`: whether its key has another call among them.
pub(super) fn repeated_keys(calls: &[Sent], sent: &[usize]) -> Vec<bool> {
    let mut count: HashMap<&str, u32, Hasher> = HashMap::default();
    for &i in sent {
        *count.entry(calls[i].call.key()).or_default() += 1;
    }
    sent.iter()
        .map(|&i| count.get(calls[i].call.key()).is_some_and(|&n| n > 1))
        .collect()
}

impl Part {
    /// What of this part goes again after the connection broke under it, leaving unknown
    /// which of its calls Redis ran (a prefix of them, in order), and the calls that cannot:
    /// those of a key with a call that may change its holder among several. A key's one call
    /// answers the same when run twice (an acquire or renew by the same holder refreshes
    /// again, a release or a read is harmless; a transfer says whether it can know, see
    /// `transfer.lua`), and so do reads and renewals alone; but a key's later calls change
    /// what its earlier ones find when sent again (`acquire(A); transfer(A, B)` run twice
    /// would answer the acquire `false`), and their first answers are lost.
    pub(super) fn again(&self, calls: &[Sent]) -> (Part, Vec<usize>) {
        let mut unknowable: HashSet<&str, Hasher> = HashSet::default();
        if self.keys_repeat {
            let mut seen: HashMap<&str, bool, Hasher> = HashMap::default();
            for &i in &self.sent {
                let call = &calls[i].call;
                let moves = call.may_change_holder();
                match seen.get_mut(call.key()) {
                    Some(moved) => {
                        *moved |= moves;
                        if *moved {
                            unknowable.insert(call.key());
                        }
                    }
                    None => {
                        seen.insert(call.key(), moves);
                    }
                }
            }
        }
        let (unknown, again): (Vec<usize>, Vec<usize>) = self
            .sent
            .iter()
            .partition(|&&i| unknowable.contains(calls[i].call.key()));
        let keys = self.keys - unknowable.len();
        let part = Part {
            sent: again,
            keys,
            keys_repeat: self.keys_repeat && keys < self.sent.len() - unknown.len(),
            ..*self
        };
        (part, unknown)
    }
}
