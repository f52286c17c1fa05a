//! How a batch is split into pipelines: a key's calls all in one, a few pipelines at once, one
//! master's keys per pipeline on a cluster (one slot's where its masters are not on Node's
//! loop), and under `minReplicas` the keys a call may grant apart.

use hashbrown::{HashMap, HashSet};

use super::{Call, RedisStore, Sent};

/// foldhash, seeded per process, rather than std's SipHash: every call's key is hashed here
/// (as in the in-memory table, `memory.rs`).
type Hasher = foldhash::fast::RandomState;

impl RedisStore {
    /// Splits the calls at `good` into pipelines: a key's calls all in the pipeline of its
    /// first; at most [`pipeline_size`] keys' first calls in one; one node's keys per
    /// pipeline ([`Connection::by_node`](crate::core::connection::Connection::by_node)); and,
    /// under `minReplicas`, the keys a call may grant apart from the others.
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
            self.layout.lease(calls[i].call.key())
        });
        let mut pipelines: Vec<Part> = Vec::new();
        let mut of_key: HashMap<&str, usize, Hasher> = HashMap::default();
        for node in nodes {
            // The pipelines before these hold another node's keys.
            let first = pipelines.len();
            for i in node {
                let key = calls[i].call.key();
                if let Some(&at) = of_key.get(key) {
                    pipelines[at].sent.push(i);
                    pipelines[at].keys_repeat = true;
                    continue;
                }
                let confirm = confirmed.contains(key);
                let on = self.connection_of(key);
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
                of_key.insert(key, at);
            }
        }
        pipelines
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
