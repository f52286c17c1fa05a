//! The command each lease call becomes on the wire, and what its reply means: `encode` and
//! `decode`, the plain acquire's fast path and when it goes as the script after all.

use std::sync::atomic::Ordering;

use redis::{Cmd, Pipeline, Value};
use serde_json::Value as Json;

use super::{RedisStore, Sent};
use crate::core::connection::parse;
use crate::core::lease::keys::Joined;
use crate::core::lease::{Answer, Call, Grant, Holder, Lease};
use crate::core::log::{Level, Notice};
use crate::core::scripts::{self, Lua};

impl RedisStore {
    /// Whether a plain acquire's reply asks for the acquire script: the owner already holds
    /// the lease (a refresh, if the metadata agrees: the script decides), the server refused
    /// `SET NX GET` (before Redis 7.0; every later acquire then goes as the script), or it
    /// refused it for want of memory (OOM, under `maxmemory` with `noeviction`): Redis refuses
    /// a SET before looking at the key, but a refresh or a refusal needs no memory, and the
    /// script answers them truly (Mastra counts a rejected acquire as acquired); a claim it
    /// cannot write rejects there as well.
    pub(super) fn acquire_again(&self, call: &Call, reply: &Value) -> bool {
        let Call::Acquire { holder, .. } = call else {
            return false;
        };
        match reply {
            Value::BulkString(found) => found == holder.owner.as_bytes(),
            Value::ServerError(err) if err.details().is_some_and(|d| d.contains("syntax")) => {
                self.plain_acquire.store(false, Ordering::Relaxed);
                true
            }
            Value::ServerError(err) if err.code() == "OOM" => true,
            _ => false,
        }
    }

    /// The server refused a plain acquire's `EXISTS` (an ACL without it): every later acquire
    /// goes as the script, one round trip as before, which needs no `EXISTS`.
    pub(super) fn refused_exists(&self, err: &redis::ServerError) {
        if self.plain_acquire.swap(false, Ordering::Relaxed) {
            self.connection.notice(Notice::new(
                Level::Debug,
                "mastra-lease: the server refuses EXISTS; acquires go as the acquire script \
                 (add +exists to the ACL user for the plain SET)",
                &[("err", Json::from(err.to_string()))],
            ));
        }
    }

    /// Appends the command that performs a call, as `how` says for an acquire without token or
    /// metadata (the caller has checked the server takes a plain one), in the form `delivery`
    /// says. `true` when it went as a plain acquire: a `SET NX GET` and an `EXISTS` of its
    /// companion key, two replies. Both forms of a call are the same number of commands.
    pub(super) fn encode(
        &self,
        sent: &Sent,
        how: How,
        delivery: Delivery,
        pipe: &mut Pipeline,
    ) -> bool {
        let call = &sent.call;
        match call {
            Call::Owner { key } => {
                // A plain GET: one read is already atomic, and Redis never returns a key
                // whose PX expiry has passed.
                command(pipe, "GET").arg(self.layout.lease_arg(key.as_bytes()));
            }
            Call::Lease { key } => {
                let k = self.layout.args(key.as_bytes());
                // A waiter reads the lease it was refused before it waits: a key this process
                // listens to is marked waited for, so its release publishes (lease.lua).
                let waiting = self.connection.listens(&k.lease.to_vec());
                let cmd = self.evalsha(pipe, call, [k.lease, k.companion]);
                if waiting {
                    cmd.arg("waiting");
                }
            }
            Call::Record { key } => {
                let k = self.layout.args(key.as_bytes());
                self.evalsha(pipe, call, [k.lease, k.companion]);
            }
            Call::Acquire {
                key,
                holder,
                ttl_ms,
                fenced: false,
            } if holder.metadata.is_none() && how == How::Plain => {
                // Answers nil when it claimed the key, else the holder (and writes nothing).
                let k = self.layout.args(key.as_bytes());
                let cmd = command(pipe, "SET").arg(k.lease).arg(&holder.owner);
                cmd.arg("NX").arg("PX").arg(*ttl_ms).arg("GET");
                command(pipe, "EXISTS").arg(k.companion);
                return true;
            }
            Call::Acquire {
                key,
                holder,
                ttl_ms,
                fenced,
            } => {
                let k = self.layout.args(key.as_bytes());
                // Only a fenced acquire takes a token: the others leave the counter out
                // (every key costs Redis to hand the script).
                let cmd = match fenced {
                    true => self.evalsha(pipe, call, [k.lease, k.companion, k.counter]),
                    false => self.evalsha(pipe, call, [k.lease, k.companion]),
                };
                let cmd = cmd.arg(&holder.owner).arg(*ttl_ms);
                cmd.arg(holder.metadata_arg()).arg(match (fenced, how) {
                    (true, _) => "1",
                    (false, How::Claimed) => "claimed",
                    (false, _) => "0",
                });
            }
            Call::Renew {
                key,
                holder,
                ttl_ms,
            } => {
                let k = self.layout.args(key.as_bytes());
                let keys = [k.lease, k.companion];
                let cmd = self
                    .evalsha(pipe, call, keys)
                    .arg(&holder.owner)
                    .arg(*ttl_ms);
                // Every argument costs Redis to hand the script: none stands for no metadata.
                if let Some(metadata) = &holder.metadata {
                    cmd.arg(metadata);
                }
            }
            Call::Release { key, holder } => {
                let k = self.layout.args(key.as_bytes());
                let keys = [k.lease, k.companion];
                let cmd = self.evalsha(pipe, call, keys).arg(&holder.owner);
                if let Some(metadata) = &holder.metadata {
                    cmd.arg(metadata);
                }
            }
            Call::Transfer {
                key,
                from,
                to,
                ttl_ms,
            } => {
                let k = self.layout.args(key.as_bytes());
                let keys = [k.lease, k.companion, k.counter];
                let cmd = self
                    .evalsha(pipe, call, keys)
                    .arg(&from.owner)
                    .arg(&to.owner);
                cmd.arg(*ttl_ms);
                let metadata = from.metadata.is_some() || to.metadata.is_some();
                let again = sent.again.load(Ordering::Relaxed);
                // Its id (on a cluster), where Redis must keep it: where the send may reach
                // Redis again unseen, and on a send made again knowingly, whose first send
                // may have gone either way. Kept while the transfer may be sent again (its
                // timeout, at most the TTL).
                let id = match (again, delivery) {
                    _ if sent.id.is_empty() => None,
                    (true, _) => Some(std::borrow::Cow::Owned(format!("again:{}", sent.id))),
                    (false, Delivery::AtLeastOnce) => Some(std::borrow::Cow::from(&sent.id)),
                    (false, Delivery::AtMostOnce) => None,
                };
                if let Some(id) = id {
                    let resend_ms = u64::try_from(self.connection.timeout().as_millis());
                    cmd.arg(id.as_bytes())
                        .arg(resend_ms.unwrap_or(u64::MAX).min(*ttl_ms));
                } else if metadata {
                    // Only `send` sends it again here, and says so. Every argument costs Redis
                    // to hand the script: none stands for a first send without metadata.
                    cmd.arg(if again { "again" } else { "" }).arg("");
                } else if again {
                    cmd.arg("again");
                }
                match (&from.metadata, &to.metadata) {
                    (_, Some(to_metadata)) => cmd.arg(from.metadata_arg()).arg(to_metadata),
                    (Some(from_metadata), None) => cmd.arg(from_metadata),
                    (None, None) => cmd,
                };
            }
        }
        false
    }

    /// `EVALSHA <sha> <n> KEYS...` of the call's script with the lease keys it names in its
    /// header, in that order.
    fn evalsha<'p, const N: usize>(
        &self,
        pipe: &'p mut Pipeline,
        call: &Call,
        keys: [Joined; N],
    ) -> &'p mut Pipeline {
        let sha = lua(call).map_or("", |lua| lua.script().get_hash());
        let cmd = command(pipe, "EVALSHA").arg(sha).arg(N);
        for key in keys {
            cmd.arg(key);
        }
        cmd
    }
}

/// Starts the command `name` in `pipe`, with room for what a lease call's command holds
/// (a dozen arguments, a few hundred bytes), so its arguments go in without regrowing it.
fn command<'p>(pipe: &'p mut Pipeline, name: &str) -> &'p mut Pipeline {
    pipe.add_command(Cmd::with_capacity(12, 256)).arg(name)
}

/// How often a command may reach Redis for one send of it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Delivery {
    /// Once at most: a link that sends nothing again by itself (this client sends a call
    /// again only knowingly, and says so).
    AtMostOnce,
    /// Perhaps more than once, unseen: redis-rs' cluster connection sends a command again
    /// when the connection it went on dropped. A transfer then carries its id
    /// (`transfer.lua`), by which a second run answers as the first.
    AtLeastOnce,
}

/// How an acquire without token or metadata goes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum How {
    /// A plain `SET NX GET`, beside an `EXISTS` of the lease's companion key.
    Plain,
    /// The acquire script.
    Script,
    /// The acquire script, after the plain `SET NX GET` claimed the key beside a leftover
    /// companion key: it deletes it while the key is still the caller's.
    Claimed,
}

/// The script behind a call (`None` for a plain GET).
pub(super) fn lua(call: &Call) -> Option<&'static Lua> {
    match call {
        Call::Acquire { .. } => Some(&scripts::ACQUIRE),
        Call::Renew { .. } => Some(&scripts::RENEW),
        Call::Release { .. } => Some(&scripts::RELEASE),
        Call::Transfer { .. } => Some(&scripts::TRANSFER),
        Call::Lease { .. } => Some(&scripts::LEASE),
        Call::Record { .. } => Some(&scripts::RECORD),
        Call::Owner { .. } => None,
    }
}

/// Reads a call's reply. A server error in the reply (OOM, WRONGTYPE, NOPERM, ...) is that
/// call's error alone.
pub(in crate::core::lease) fn decode(call: &Call, reply: Value) -> redis::RedisResult<Answer> {
    Ok(match call {
        // The acquire script's answer: a plain acquire is told no token, a kept one either.
        Call::Acquire { fenced, .. } if matches!(reply, Value::Array(_)) => {
            let (acquired, holder, token): (i64, Vec<u8>, Option<u64>) = parse(reply)?;
            Answer::Grant(Grant {
                acquired: acquired == 1,
                owner: Some(text(holder)),
                token: token.filter(|_| acquired == 1 && *fenced),
                fenced: *fenced,
            })
        }
        // A plain `SET NX GET`'s: nil when it claimed the key, else the other holder (the
        // caller's own goes as the script).
        Call::Acquire { holder, .. } => match parse::<Option<Vec<u8>>>(reply)? {
            None => Answer::Grant(Grant {
                acquired: true,
                owner: Some(holder.owner.clone()),
                token: None,
                fenced: false,
            }),
            Some(found) => Answer::Grant(Grant {
                acquired: false,
                owner: Some(text(found)),
                token: None,
                fenced: false,
            }),
        },
        Call::Owner { .. } => Answer::Owner(parse::<Option<Vec<u8>>>(reply)?.map(text)),
        Call::Lease { .. } => Answer::Lease(read_lease(reply)?),
        Call::Record { .. } => {
            let record: Option<(Vec<u8>, Option<Vec<u8>>)> = parse(reply)?;
            Answer::Record(record.map(|(owner, metadata)| Holder {
                owner: text(owner),
                metadata: metadata.map(text),
            }))
        }
        Call::Release { .. } => Answer::Released(parse::<i64>(reply)? == 1),
        Call::Renew { .. } => Answer::Renewed(parse::<i64>(reply)? == 1),
        Call::Transfer { .. } => Answer::Transferred(parse::<i64>(reply)? == 1),
    })
}

/// `lease.lua`'s answer: the live lease, if any.
fn read_lease(reply: Value) -> redis::RedisResult<Option<Lease>> {
    let lease: Option<(Vec<u8>, i64, Option<u64>)> = parse(reply)?;
    Ok(lease.map(|(owner, pttl, token)| Lease {
        raw_owner: std::str::from_utf8(&owner).is_err().then(|| owner.clone()),
        owner: text(owner),
        token,
        // -1: a key without an expiry, which our writes never leave but others' can.
        ttl_ms: u64::try_from(pttl).ok(),
    }))
}

pub(super) fn is_noscript(reply: &Value) -> bool {
    matches!(reply, Value::ServerError(err) if err.code() == "NOSCRIPT")
}

/// Owners we write are valid UTF-8; a foreign writer's bytes are shown, not rejected.
pub(super) fn text(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes).unwrap_or_else(|err| String::from_utf8_lossy(err.as_bytes()).into())
}
