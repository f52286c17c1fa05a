//! Every Lua script the core runs, listed in one place. Each is a file beside the code that
//! runs it, with a header naming its KEYS, ARGV and answer; all are compiled into the addon,
//! hashed once, and sent by SHA (EVALSHA), loaded again on NOSCRIPT (after a restart or a
//! SCRIPT FLUSH). Keys and values travel in KEYS and ARGV, never in the source.

use std::sync::OnceLock;

use redis::Script;

/// A script's source, and the script made from it on first use.
pub(crate) struct Lua {
    pub source: &'static str,
    script: OnceLock<Script>,
}

impl Lua {
    const fn new(source: &'static str) -> Self {
        Self {
            source,
            script: OnceLock::new(),
        }
    }

    /// The script, its SHA computed once.
    pub fn script(&self) -> &Script {
        self.script.get_or_init(|| Script::new(self.source))
    }
}

/// Claims a free or expired lease, or refreshes the owner's own.
pub(crate) static ACQUIRE: Lua = Lua::new(include_str!("lease/acquire.lua"));
/// Extends a lease its owner still holds.
pub(crate) static RENEW: Lua = Lua::new(include_str!("lease/renew.lua"));
/// Deletes a lease its owner holds.
pub(crate) static RELEASE: Lua = Lua::new(include_str!("lease/release.lua"));
/// Hands a lease from one owner to another without ever freeing it.
pub(crate) static TRANSFER: Lua = Lua::new(include_str!("lease/transfer.lua"));
/// Reads a live lease whole: owner, fencing token, time left.
pub(crate) static LEASE: Lua = Lua::new(include_str!("lease/lease.lua"));

/// The lease scripts, loaded together when Redis has forgotten one (it forgets all at once).
pub(crate) static LEASE_SCRIPTS: [&Lua; 5] = [&ACQUIRE, &RENEW, &RELEASE, &TRANSFER, &LEASE];

/// Appends events again, each exactly once, after a broken connection.
pub(crate) static APPEND_AGAIN: Lua = Lua::new(include_str!("streams/append_again.lua"));
/// Settles a group's entry (ack, or redeliver and ack) while the consumer still owns it.
pub(crate) static SETTLE: Lua = Lua::new(include_str!("streams/settle.lua"));
/// Takes over idle entries of a group, with how often Redis has delivered each.
pub(crate) static RECLAIM: Lua = Lua::new(include_str!("streams/reclaim.lua"));
/// Keeps the entries a live consumer holds claimed.
pub(crate) static KEEP: Lua = Lua::new(include_str!("streams/keep.lua"));
/// Trims a stream without cutting what a group has not settled.
pub(crate) static TRIM: Lua = Lua::new(include_str!("streams/trim.lua"));
