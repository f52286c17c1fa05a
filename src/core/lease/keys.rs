//! Where a lease lives in Redis: its key, its fencing token, and the counter tokens come from.
//!
//! - `<keyPrefix>:lease:<key>`: the owner, with a PX expiry. Mastra's own backend's layout.
//! - `<keyPrefix>:lease-metadata:<key>`: the holder's metadata, with the same expiry, absent
//!   for none; Mastra's layout too. On a Redis Cluster that name hashes to another slot than
//!   the lease key, so there it is `<keyPrefix>:lease-metadata:{<tag>}:<key>`, in the lease
//!   key's slot, as the token key is: one script reads and writes both.
//! - `<keyPrefix>:fence:{<tag>}:<key>`: the token of the live lease, with the same expiry, as
//!   `<token>:<transfer id>:<holder>`; naming its holder, it is never read as the token of a
//!   grant another client wrote to the lease key alone. For a lease without a token it holds
//!   the last transfer's id alone, and lives only while that transfer may be sent again.
//! - `<keyPrefix>:fence:{<tag>}`: the counter every token of that hash slot comes from; it
//!   never expires, so a token is greater than every one granted before for the key.
//!
//! `<tag>` is a short string whose hash slot is the lease key's, so on a Redis Cluster the
//! four keys live in one slot (a script may touch them together, and they move together
//! when the slot migrates), whatever characters the key holds. There is one counter per slot
//! in use: at most 16,384 per key prefix, however many keys were ever leased.

use std::sync::LazyLock;

use crate::core::connection::Keyspace;
use crate::core::error::{Error, InputErrorKind, Result};

/// The hash slots of a Redis Cluster.
pub const SLOTS: u16 = 16_384;

/// The hash slot of a key, as Redis Cluster computes it: CRC16 (XMODEM) of the key, or of
/// its hash tag (what lies between the first `{` and the next `}`, when not empty).
pub fn slot(key: &[u8]) -> u16 {
    crc16::State::<crc16::XMODEM>::calculate(hash_tag(key).unwrap_or(key)) % SLOTS
}

fn hash_tag(key: &[u8]) -> Option<&[u8]> {
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

/// A key in hash slot `slot` (`{<tag>}`), to route a keyless command to the slot's master.
pub fn in_slot(slot: u16) -> Vec<u8> {
    format!("{{{}}}", TAGS[usize::from(slot % SLOTS)]).into_bytes()
}

/// The Redis keys of one lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseKeys {
    /// `<keyPrefix>:lease:<key>`: the owner.
    pub lease: Vec<u8>,
    /// `<keyPrefix>:lease-metadata:<key>` (on a cluster `…:lease-metadata:{<tag>}:<key>`):
    /// the holder's metadata.
    pub metadata: Vec<u8>,
    /// `<keyPrefix>:fence:{<tag>}:<key>`: the live lease's token.
    pub token: Vec<u8>,
    /// `<keyPrefix>:fence:{<tag>}`: the slot's token counter.
    pub counter: Vec<u8>,
}

/// Names the keys of the leases under one key prefix.
#[derive(Debug, Clone)]
pub struct Layout {
    lease_prefix: Vec<u8>,
    metadata_prefix: Vec<u8>,
    fence_prefix: Vec<u8>,
    /// Over hash slots the metadata key carries the lease key's slot tag.
    keyspace: Keyspace,
}

impl Layout {
    /// The layout under `key_prefix` in `keyspace`. Over hash slots the prefix must not open
    /// a brace it does not close (see [`Layout::cluster_safe`]).
    pub fn new(key_prefix: &str, keyspace: Keyspace) -> Result<Self> {
        if keyspace == Keyspace::Slotted && !Self::cluster_safe(key_prefix) {
            return Err(Error::option(
                InputErrorKind::Range,
                "keyPrefix opens a brace it does not close ({ without }, or an empty {}): on a \
                 cluster a key's own braces would then decide its slot, and a lease's keys could \
                 land in different slots",
            ));
        }
        Ok(Self {
            lease_prefix: [key_prefix.as_bytes(), b":lease:"].concat(),
            metadata_prefix: [key_prefix.as_bytes(), b":lease-metadata:"].concat(),
            fence_prefix: [key_prefix.as_bytes(), b":fence:{"].concat(),
            keyspace,
        })
    }

    /// Whether the companion keys share the lease key's slot for every key: true unless the
    /// prefix holds a `{` with no `}` after it, or an empty `{}`, before any complete tag
    /// (then a key's own braces could decide the lease key's slot and not the others').
    pub fn cluster_safe(key_prefix: &str) -> bool {
        let bytes = key_prefix.as_bytes();
        match bytes.iter().position(|&b| b == b'{') {
            None => true,
            Some(_) => hash_tag(bytes).is_some(),
        }
    }

    /// `<keyPrefix>:lease:`, what every lease key starts with.
    pub fn lease_prefix(&self) -> &[u8] {
        &self.lease_prefix
    }

    /// `<keyPrefix>:lease:<key>`.
    pub fn lease(&self, key: &str) -> Vec<u8> {
        [&self.lease_prefix[..], key.as_bytes()].concat()
    }

    /// All four keys of the lease on `key`.
    pub fn keys(&self, key: &str) -> LeaseKeys {
        self.keys_of(key.as_bytes())
    }

    /// [`Layout::keys`] of a key as Redis holds it: any bytes, for a listing that finds keys
    /// another client wrote (not UTF-8, or longer than the limits take).
    pub fn keys_of(&self, key: &[u8]) -> LeaseKeys {
        let lease = [&self.lease_prefix[..], key].concat();
        let tag = TAGS[usize::from(slot(&lease))].as_bytes();
        let counter = [&self.fence_prefix[..], tag, b"}"].concat();
        let token = [&counter[..], b":", key].concat();
        let metadata = match self.keyspace {
            Keyspace::Slotted => [&self.metadata_prefix[..], b"{", tag, b"}:", key].concat(),
            Keyspace::Single => [&self.metadata_prefix[..], key].concat(),
        };
        LeaseKeys {
            lease,
            metadata,
            token,
            counter,
        }
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
    fn every_slot_has_a_tag_that_hashes_to_it() {
        assert_eq!(TAGS.len(), usize::from(SLOTS));
        for (n, tag) in TAGS.iter().enumerate() {
            assert!(!tag.is_empty() && tag.len() <= 4, "slot {n}: {tag:?}");
            assert!(tag.bytes().all(|b| b.is_ascii_alphanumeric()));
            assert_eq!(usize::from(slot(tag.as_bytes())), n);
        }
    }

    #[test]
    fn the_four_keys_share_the_lease_key_slot_on_a_cluster_whatever_the_key_holds() {
        let keys = [
            "plain",
            "res\0thread",
            "{",
            "}",
            "{}",
            "a{b}c",
            "{tag}rest",
            "x}{y",
            "é{ü}",
            "}{",
        ];
        for prefix in ["mastra:topic", "{app}:topic", "app{x}y"] {
            assert!(Layout::cluster_safe(prefix));
            let layout = Layout::new(prefix, Keyspace::Slotted).unwrap();
            for key in keys {
                let k = layout.keys(key);
                let lease = slot(&k.lease);
                assert_eq!(slot(&k.metadata), lease, "{prefix} / {key:?}");
                assert_eq!(slot(&k.token), lease, "{prefix} / {key:?}");
                assert_eq!(slot(&k.counter), lease, "{prefix} / {key:?}");
            }
        }
        // Elsewhere the metadata key is Mastra's, so either backend reads the other's.
        let single = Layout::new("mastra:topic", Keyspace::Single)
            .unwrap()
            .keys("thread-1");
        assert_eq!(single.metadata, b"mastra:topic:lease-metadata:thread-1");
        assert_eq!(single.lease, b"mastra:topic:lease:thread-1");
        assert!(!Layout::cluster_safe("app{"));
        assert!(!Layout::cluster_safe("app{}x"));
        assert!(Layout::new("app{", Keyspace::Slotted).is_err());
        assert!(Layout::new("app{", Keyspace::Single).is_ok());
    }
}
