//! Where a lease lives in Redis: its key, its companion key, and the counter tokens come from.
//!
//! - `<keyPrefix>:lease:<key>`: the owner, with a PX expiry. Mastra's own backend's layout,
//!   name and value, so a fleet may move from one backend to the other process by process.
//! - `<keyPrefix>:fence:{<tag>}:<key>`: the lease's companion key, everything a lease holds
//!   beside its owner, as `<token>:<transfer id>:<holder's length>:<holder><metadata>`: the
//!   token (empty for none), the last transfer's id (empty but after a transfer on a Redis
//!   Cluster), the owner it belongs to (its length in bytes, then its bytes) and that holder's
//!   metadata (empty for none; any bytes, as the owner's, read back whole). Naming its holder,
//!   it is never read as the token or metadata of a grant another client wrote to the lease key
//!   alone. It lives as long as the lease while it holds a token or metadata; for a lease with
//!   neither on a Redis Cluster it holds the last transfer's id alone, and lives only while
//!   that transfer may be sent again (the cluster client may resend it unseen; see
//!   `transfer.lua`). For a lease without one that a waiter waits for, `:::`, naming no
//!   holder: the mark that makes its release publish (`lease.lua`; a transfer's id marks the
//!   lease too, kept then as long as the lease). A lease of Mastra's calls (no token, no
//!   metadata, nobody waiting) has none.
//! - `<keyPrefix>:fence:{<tag>}`: the counter every token of that hash slot comes from; it
//!   never expires, so a token is greater than every one granted before for the key.
//!
//! `<tag>` is a short string whose hash slot is the lease key's, so on a Redis Cluster the
//! three keys live in one slot (a script may touch them together, and they move together
//! when the slot migrates), whatever characters the key holds. There is one counter per slot
//! in use: at most 16,384 per key prefix, however many keys were ever leased.

use std::io::Write;

use redis::{RedisWrite, ToRedisArgs};

use crate::core::connection::{hash_tag, slot_tag, Keyspace, PrefixSlots};
use crate::core::error::{Error, InputErrorKind, Result};

/// The Redis keys of one lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseKeys {
    /// `<keyPrefix>:lease:<key>`: the owner.
    pub lease: Vec<u8>,
    /// `<keyPrefix>:fence:{<tag>}:<key>`: the lease's token, transfer id, holder and
    /// metadata.
    pub companion: Vec<u8>,
    /// `<keyPrefix>:fence:{<tag>}`: the slot's token counter.
    pub counter: Vec<u8>,
}

/// Names the keys of the leases under one key prefix.
#[derive(Debug, Clone)]
pub struct Layout {
    lease_prefix: Vec<u8>,
    fence_prefix: Vec<u8>,
    /// The lease keys' hash slots, from the key alone.
    lease_slots: PrefixSlots,
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
        let lease_prefix = [key_prefix.as_bytes(), b":lease:"].concat();
        Ok(Self {
            lease_slots: PrefixSlots::new(&lease_prefix),
            lease_prefix,
            fence_prefix: [key_prefix.as_bytes(), b":fence:{"].concat(),
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
        self.lease_arg(key.as_bytes()).to_vec()
    }

    /// The hash slot of the lease key of `key`, and so of all three (found without them).
    pub fn slot(&self, key: &[u8]) -> u16 {
        self.lease_slots.of(key)
    }

    /// All three keys of the lease on `key`, any bytes (a listing finds keys another client
    /// wrote: not UTF-8, or longer than the limits take).
    pub fn keys_of(&self, key: &[u8]) -> LeaseKeys {
        let args = self.args(key);
        LeaseKeys {
            lease: args.lease.to_vec(),
            companion: args.companion.to_vec(),
            counter: args.counter.to_vec(),
        }
    }

    /// [`Layout::lease`] as a command's argument, its parts written into the command.
    pub fn lease_arg<'a>(&'a self, key: &'a [u8]) -> Joined<'a> {
        Joined([&self.lease_prefix, key, b"", b""])
    }

    /// The three keys of the lease on `key` as a command's arguments, each written into the
    /// command from its parts: a call's keys are never built apart from its command.
    pub fn args<'a>(&'a self, key: &'a [u8]) -> KeyArgs<'a> {
        let tag = slot_tag(self.slot(key)).as_bytes();
        let fence = &self.fence_prefix[..];
        KeyArgs {
            lease: self.lease_arg(key),
            companion: Joined([fence, tag, b"}:", key]),
            counter: Joined([fence, tag, b"}", b""]),
        }
    }
}

/// [`LeaseKeys`] as a command's arguments ([`Layout::args`]).
#[derive(Debug, Clone, Copy)]
pub struct KeyArgs<'a> {
    pub lease: Joined<'a>,
    pub companion: Joined<'a>,
    pub counter: Joined<'a>,
}

/// One argument made of parts, written one after the other into the command.
#[derive(Debug, Clone, Copy)]
pub struct Joined<'a>([&'a [u8]; 4]);

impl Joined<'_> {
    /// The argument's bytes.
    pub fn to_vec(self) -> Vec<u8> {
        self.0.concat()
    }
}

impl ToRedisArgs for Joined<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        let mut arg = out.writer_for_next_arg();
        for part in self.0 {
            // Into the command's own buffer: a `Vec`, which takes every byte.
            let _ = arg.write_all(part);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::connection::slot;

    #[test]
    fn a_command_given_the_keys_as_arguments_holds_the_keys_themselves() {
        let layout = Layout::new("mastra:topic", Keyspace::Slotted).unwrap();
        for key in ["thread-1", "", "res\0thread", "a{b}c"] {
            let args = layout.args(key.as_bytes());
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(args.lease).arg(args.companion).arg(args.counter);
            let written: Vec<Vec<u8>> = cmd
                .args_iter()
                .skip(1)
                .map(|arg| match arg {
                    redis::Arg::Simple(bytes) => bytes.to_vec(),
                    _ => Vec::new(),
                })
                .collect();
            let keys = layout.keys_of(key.as_bytes());
            assert_eq!(
                written,
                [keys.lease, keys.companion, keys.counter],
                "{key:?}"
            );
        }
    }

    #[test]
    fn the_three_keys_share_the_lease_key_slot_on_a_cluster_whatever_the_key_holds() {
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
                let k = layout.keys_of(key.as_bytes());
                let lease = slot(&k.lease);
                assert_eq!(layout.slot(key.as_bytes()), lease, "{prefix} / {key:?}");
                assert_eq!(slot(&k.companion), lease, "{prefix} / {key:?}");
                assert_eq!(slot(&k.counter), lease, "{prefix} / {key:?}");
            }
        }
        // The lease key is Mastra's, so either backend reads the other's owner; the companion
        // key is named alike on one server.
        let single = Layout::new("mastra:topic", Keyspace::Single)
            .unwrap()
            .keys_of(b"thread-1");
        assert_eq!(single.lease, b"mastra:topic:lease:thread-1");
        let tag = slot_tag(slot(b"mastra:topic:lease:thread-1"));
        assert_eq!(
            single.companion,
            format!("mastra:topic:fence:{{{tag}}}:thread-1").as_bytes()
        );
        assert_eq!(
            single.counter,
            format!("mastra:topic:fence:{{{tag}}}").as_bytes()
        );
        assert!(!Layout::cluster_safe("app{"));
        assert!(!Layout::cluster_safe("app{}x"));
        assert!(Layout::new("app{", Keyspace::Slotted).is_err());
        assert!(Layout::new("app{", Keyspace::Single).is_ok());
    }
}
