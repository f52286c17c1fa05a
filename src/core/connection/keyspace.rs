//! How the deployment spreads its keys over nodes, told to the callers that lay keys out,
//! group them into requests, or walk every master, so none of them asks which kind of
//! deployment it is: [`Keyspace`], [`Shard`], [`Connection::by_shard`] and
//! [`Connection::masters`]; and Redis Cluster's hash slots themselves ([`slot`], [`slot_tag`],
//! [`in_slot`]), which the connection routes by and the lease layout names keys with.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::LazyLock;

use super::{parse, slots, Connection};
use crate::core::error::Result;

/// The hash slots of a Redis Cluster.
pub const SLOTS: u16 = 16_384;

/// The hash slot of a key, as Redis Cluster computes it: CRC16 (XMODEM) of the key, or of
/// its hash tag (what lies between the first `{` and the next `}`, when not empty).
pub fn slot(key: &[u8]) -> u16 {
    crc16::State::<crc16::XMODEM>::calculate(hash_tag(key).unwrap_or(key)) % SLOTS
}

/// The hash slots of keys that share a prefix, each found from the rest of its key: the
/// prefix is read once, not again with every key (a lease's key is mostly its prefix).
#[derive(Debug, Clone)]
pub enum PrefixSlots {
    /// The prefix holds a hash tag: it decides every key's slot.
    Tagged(u16),
    /// The prefix's first `{}` is empty: every key is hashed whole, the rest's braces too.
    Whole(Crc),
    /// The prefix holds no `{`: the rest's own tag decides, else the whole key is hashed.
    Plain(Crc),
    /// The prefix opens a `{` it does not close: the rest may close it, so each key is read
    /// whole, the prefix again.
    Open(Vec<u8>),
}

type Crc = crc16::State<crc16::XMODEM>;

impl PrefixSlots {
    /// For the keys that start with `prefix`.
    pub fn new(prefix: &[u8]) -> Self {
        let hashed = || {
            let mut crc = Crc::new();
            crc.update(prefix);
            crc
        };
        let Some(open) = prefix.iter().position(|&b| b == b'{') else {
            return Self::Plain(hashed());
        };
        match prefix[open + 1..].iter().position(|&b| b == b'}') {
            None => Self::Open(prefix.to_vec()),
            Some(0) => Self::Whole(hashed()),
            Some(_) => Self::Tagged(slot(prefix)),
        }
    }

    /// The slot of the prefix followed by `rest`.
    pub fn of(&self, rest: &[u8]) -> u16 {
        let go_on = |crc: &Crc| {
            let mut crc = *crc;
            crc.update(rest);
            crc.get() % SLOTS
        };
        match self {
            Self::Tagged(slot) => *slot,
            Self::Whole(crc) => go_on(crc),
            Self::Plain(crc) => match hash_tag(rest) {
                Some(tag) => slot(tag),
                None => go_on(crc),
            },
            Self::Open(prefix) => slot(&[prefix, rest].concat()),
        }
    }
}

/// A key's hash tag: what lies between its first `{` and the next `}`, when not empty.
pub fn hash_tag(key: &[u8]) -> Option<&[u8]> {
    let open = key.iter().position(|&b| b == b'{')?;
    let close = key[open + 1..].iter().position(|&b| b == b'}')?;
    let tag = &key[open + 1..open + 1 + close];
    (!tag.is_empty()).then_some(tag)
}

/// For every slot, the shortest alphanumeric string hashing to it (the first found).
static TAGS: LazyLock<Vec<String>> = LazyLock::new(|| {
    const ALPHABET: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
    let mut tags: Vec<Option<String>> = vec![None; usize::from(SLOTS)];
    let mut missing = usize::from(SLOTS);
    let mut candidate: Vec<u8> = Vec::new();
    'lengths: for length in 1..=4 {
        candidate.resize(length, 0);
        let count = ALPHABET.len().pow(length as u32);
        for n in 0..count {
            let mut rest = n;
            for byte in candidate.iter_mut() {
                *byte = ALPHABET[rest % ALPHABET.len()];
                rest /= ALPHABET.len();
            }
            let entry = &mut tags[usize::from(slot(&candidate))];
            if entry.is_none() {
                *entry = Some(String::from_utf8_lossy(&candidate).into_owned());
                missing -= 1;
                if missing == 0 {
                    break 'lengths;
                }
            }
        }
    }
    tags.into_iter().map(Option::unwrap_or_default).collect()
});

/// A short alphanumeric string in hash slot `slot`: `{<it>}` in a key puts the key there.
pub fn slot_tag(slot: u16) -> &'static str {
    &TAGS[usize::from(slot % SLOTS)]
}

/// A key in hash slot `slot` (`{<tag>}`), to route a keyless command to the slot's master.
pub fn in_slot(slot: u16) -> Vec<u8> {
    format!("{{{}}}", slot_tag(slot)).into_bytes()
}

/// `items` in groups by `group` (asked once per item, in order): each group keeps the items'
/// order, the groups the order of their first item; none is empty. Groups are looked up by
/// foldhash rather than std's SipHash: a Cluster's every batch passes here, and a group is a
/// slot or a node, not a caller's key.
pub(super) fn grouped<T, G: Hash + Eq>(
    items: impl IntoIterator<Item = T>,
    mut group: impl FnMut(&T) -> G,
) -> Vec<Vec<T>> {
    let mut groups: Vec<Vec<T>> = Vec::new();
    let mut of_group: HashMap<G, usize, foldhash::fast::RandomState> = HashMap::default();
    for item in items {
        let at = *of_group.entry(group(&item)).or_insert_with(|| {
            groups.push(Vec::new());
            groups.len() - 1
        });
        groups[at].push(item);
    }
    groups
}

/// How a deployment's keys are spread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keyspace {
    /// Every key on one node: a server, or the master behind Sentinel.
    Single,
    /// Over a Redis Cluster's hash slots: the keys one script or one pipeline names must
    /// share a slot.
    Slotted,
}

/// The keys that may go together in one pipeline, one transaction or one script: every key
/// on one node; on a cluster, the keys of one hash slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Shard(u16);

impl Connection {
    /// How the deployment spreads its keys.
    pub fn keyspace(&self) -> Keyspace {
        match self.target.is_cluster() {
            true => Keyspace::Slotted,
            false => Keyspace::Single,
        }
    }

    /// The shard of `key`.
    pub fn shard(&self, key: &[u8]) -> Shard {
        match self.keyspace() {
            Keyspace::Slotted => Shard(slot(key)),
            Keyspace::Single => Shard(0),
        }
    }

    /// Splits `items` into groups that may share one request, by the key `key` names for
    /// each (read only on a cluster): every item in one group on one node, one group per
    /// hash slot on a cluster. Each group keeps the items' order; no group is empty.
    pub fn by_shard<T, K, F>(&self, items: impl IntoIterator<Item = T>, key: F) -> Vec<Vec<T>>
    where
        K: AsRef<[u8]>,
        F: Fn(&T) -> K,
    {
        let mut items = items.into_iter().peekable();
        if items.peek().is_none() {
            return Vec::new();
        }
        if self.keyspace() == Keyspace::Single {
            return vec![items.collect()];
        }
        grouped(items, |item| self.shard(key(item).as_ref()))
    }

    /// Splits `items` into groups that may share one pipeline (neither a transaction nor one
    /// script), by the hash slot `slot_of` tells for each (asked only on a cluster): all in
    /// one group on one node; on a cluster whose masters are on the embedder's event loop,
    /// one group per master by the slot map last read there (a master runs the commands of
    /// every slot it serves), else one per slot. Each group keeps the items' order; no group
    /// is empty.
    pub fn by_node<T>(
        &self,
        items: impl IntoIterator<Item = T>,
        slot_of: impl Fn(&T) -> u16,
    ) -> Vec<Vec<T>> {
        let items: Vec<T> = items.into_iter().collect();
        if items.is_empty() {
            return Vec::new();
        }
        if self.keyspace() == Keyspace::Single {
            return vec![items];
        }
        let slots: Vec<u16> = items.iter().map(slot_of).collect();
        // `grouped` asks for each item's group once, in order.
        match self.target.masters_of(&slots) {
            Some(masters) => {
                let mut masters = masters.into_iter();
                grouped(items, |_| masters.next())
            }
            None => {
                let mut slots = slots.into_iter();
                grouped(items, |_| slots.next())
            }
        }
    }

    /// Every master, for a caller that visits each (a `SCAN` of every key): on one node,
    /// `None`, the node itself; on a cluster, each master by the first slot it serves, in
    /// slot order (none when no master serves a slot). A keyless command reaches the master
    /// of slot `s` through [`Link::on_node_of`](super::Link::on_node_of) with a key of that
    /// slot.
    pub async fn masters(&self) -> Result<Vec<Option<u16>>> {
        if self.keyspace() == Keyspace::Single {
            return Ok(vec![None]);
        }
        let cmd = redis::cmd("CLUSTER").arg("SLOTS").to_owned();
        let reply = self
            .run(|mut link| async move { link.on_node_of(b"", &cmd).await })
            .await?;
        let map = parse(reply)
            .and_then(slots::read_slot_map)
            .map_err(|err| self.classify_reply(err))?;
        Ok(slots::first_slots(&map).into_iter().map(Some).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_those_redis_computes() {
        // Known values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(slot(b"123456789"), 12_739);
        assert_eq!(slot(b"foo"), 12_182);
        assert_eq!(slot(b"{user1000}.following"), slot(b"user1000"));
        assert_ne!(slot(b"foo{}{bar}"), slot(b"bar"));
        assert_eq!(slot(b"foo{{bar}}zap"), slot(b"{bar"));
        assert_eq!(slot(b"foo{bar}{zap}"), slot(b"bar"));
    }

    #[test]
    fn a_prefix_read_once_gives_each_key_the_slot_of_the_whole_key() {
        let prefixes = [
            "mastra:topic:lease:",
            "",
            "app{users}:lease:",
            "app{}:lease:",
            "app{open:lease:",
            "app}{:lease:",
            "{t}",
        ];
        let rests = [
            "thread-1",
            "",
            "{",
            "}",
            "{}",
            "a{b}c",
            "{tag}rest",
            "x}y",
            "{}{z}",
            "é{ü}",
        ];
        for prefix in prefixes {
            let slots = PrefixSlots::new(prefix.as_bytes());
            for rest in rests {
                let whole = [prefix, rest].concat();
                assert_eq!(
                    slots.of(rest.as_bytes()),
                    slot(whole.as_bytes()),
                    "{whole:?}"
                );
            }
        }
    }

    #[test]
    fn every_slot_has_a_tag_that_hashes_to_it() {
        assert_eq!(TAGS.len(), usize::from(SLOTS));
        for (n, tag) in TAGS.iter().enumerate() {
            assert!(!tag.is_empty() && tag.len() <= 4, "slot {n}: {tag:?}");
            assert!(tag.bytes().all(|b| b.is_ascii_alphanumeric()));
            assert_eq!(usize::from(slot(tag.as_bytes())), n);
        }
        assert_eq!(slot(&in_slot(12_182)), 12_182);
    }
}
