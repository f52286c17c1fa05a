//! Listing the leases under a key prefix, for operators (`listLeases`, the `mastra-lease`
//! command): a `SCAN` of every master, page by page, each key found read with plain reads
//! (`GET`, `PTTL`). Never `KEYS`: a page costs Redis about `count` keys' work.
//!
//! Plain reads, not the script `getLease` runs: an operator's read-only ACL user (`+@read`)
//! may list, and every key found is listed, whatever wrote it (a key that is not UTF-8, or
//! longer than `maxKeyBytes`, which no lease call takes). The three reads of a lease are not
//! one moment, as the script's are; the companion key names its holder, so a token is never shown
//! for another owner, and a lease that changes between them may show a later moment's TTL.

use redis::{Pipeline, Value};

use super::redis::{decode, RedisStore};
use super::{keys, Answer, Call, Lease};
use crate::core::connection::{in_slot, parse, Keyspace, SLOTS};
use crate::core::error::{Error, InputErrorKind, Result};

/// One page of a listing: the live leases found, each with its key as Redis holds it (after
/// the prefix; any bytes), and where the next page starts (`None` once every master has been
/// scanned through).
#[derive(Debug)]
pub struct Page {
    pub leases: Vec<(Vec<u8>, Lease)>,
    pub cursor: Option<String>,
}

/// Where a listing stands: the masters left to scan, each as a slot it serves (`None` on one
/// node) and its SCAN cursor; the first is the one being scanned. As text (the cursor the
/// caller hands back): `<cursor>` on one node, `<slot>.<cursor>,…` over hash slots.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Position(Vec<(Option<u16>, u64)>);

impl Position {
    fn parse(text: &str, keyspace: Keyspace) -> Result<Self> {
        let bad = || {
            Error::option(
                InputErrorKind::Range,
                format!("cursor {text:?} is not one a listing answered"),
            )
        };
        let nodes = text
            .split(',')
            .map(|node| match (keyspace, node.split_once('.')) {
                (Keyspace::Slotted, Some((slot, cursor))) => {
                    let slot = slot.parse::<u16>().ok().filter(|s| *s < SLOTS);
                    Some((Some(slot?), cursor.parse().ok()?))
                }
                (Keyspace::Single, None) => Some((None, node.parse().ok()?)),
                _ => None,
            })
            .collect::<Option<Vec<_>>>()
            .ok_or_else(bad)?;
        if nodes.is_empty() || (keyspace == Keyspace::Single && nodes.len() != 1) {
            return Err(bad());
        }
        Ok(Self(nodes))
    }

    fn text(&self) -> String {
        let node = |(slot, cursor): &(Option<u16>, u64)| match slot {
            Some(slot) => format!("{slot}.{cursor}"),
            None => cursor.to_string(),
        };
        self.0.iter().map(node).collect::<Vec<_>>().join(",")
    }
}

impl RedisStore {
    /// One page of the live leases under this store's prefix, from `cursor` (`None`: the
    /// start), about `count` keys scanned. A lease that expires or is released meanwhile is
    /// left out; one created meanwhile may or may not be in (SCAN's guarantees).
    pub async fn list(&self, cursor: Option<&str>, count: u32) -> Result<Page> {
        let mut position = match cursor {
            Some(text) => Position::parse(text, self.connection().keyspace())?,
            None => {
                let masters = self.connection().masters().await?;
                Position(masters.into_iter().map(|master| (master, 0)).collect())
            }
        };
        let Some(&(slot, from)) = position.0.first() else {
            // A cluster that serves no slot holds no lease.
            return Ok(Page {
                leases: Vec::new(),
                cursor: None,
            });
        };
        let (next, found) = self.scan(slot, from, count).await?;
        if next == 0 {
            position.0.remove(0);
        } else {
            position.0[0].1 = next;
        }
        let prefix = self.layout().lease_prefix();
        let keys: Vec<Vec<u8>> = found
            .iter()
            .filter_map(|key| key.strip_prefix(prefix))
            .map(<[u8]>::to_vec)
            .collect();
        let read = self.read(&keys).await?;
        // A lease gone since the scan saw it is left out.
        let leases = keys
            .into_iter()
            .zip(read)
            .filter_map(|(key, lease)| Some((key, lease?)))
            .collect();
        let cursor = (!position.0.is_empty()).then(|| position.text());
        Ok(Page { leases, cursor })
    }

    /// The live lease on each of `keys`, by plain reads: per key, `GET` and `PTTL` of the
    /// lease key and `GET` of its companion key (one slot), in one pipeline per shard (on a
    /// cluster, per slot), all at once.
    async fn read(&self, keys: &[Vec<u8>]) -> Result<Vec<Option<Lease>>> {
        let layout = self.layout();
        let all: Vec<keys::LeaseKeys> = keys.iter().map(|key| layout.keys_of(key)).collect();
        let groups = self.connection().by_shard(0..all.len(), |&i| &all[i].lease);
        let pipes: Vec<(Vec<usize>, Pipeline)> = groups
            .into_iter()
            .map(|group| {
                let mut pipe = redis::pipe();
                for &i in &group {
                    let lease = &all[i];
                    pipe.cmd("GET").arg(&lease.lease);
                    pipe.cmd("PTTL").arg(&lease.lease);
                    pipe.cmd("GET").arg(&lease.companion);
                }
                (group, pipe)
            })
            .collect();
        let connection = self.connection();
        let sent = &pipes;
        let replies = connection
            .run(|link| async move {
                let reads = sent.iter().map(|(_, pipe)| {
                    let mut link = link.clone();
                    async move { link.send_packed_commands(pipe, 0, pipe.len()).await }
                });
                futures::future::try_join_all(reads).await
            })
            .await?;
        let mut leases = vec![None; keys.len()];
        for ((group, _), replies) in pipes.iter().zip(replies) {
            let mut replies = replies.into_iter();
            for &i in group {
                let three = replies.by_ref().take(3).collect();
                leases[i] = lease_of(three).map_err(|err| connection.classify_reply(err))?;
            }
        }
        Ok(leases)
    }

    /// One `SCAN` step on the master serving `slot` (on one server, on it): the next cursor
    /// and the lease keys seen.
    async fn scan(
        &self,
        slot: Option<u16>,
        cursor: u64,
        count: u32,
    ) -> Result<(u64, Vec<Vec<u8>>)> {
        let pattern = [glob_escaped(self.layout().lease_prefix()), b"*".to_vec()].concat();
        let mut cmd = redis::cmd("SCAN");
        cmd.arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(count);
        // Only strings: a topic's stream may be named like a lease.
        cmd.arg("TYPE").arg("string");
        let route = in_slot(slot.unwrap_or(0));
        let connection = self.connection();
        let reply = connection
            .run(|mut link| async move { link.on_node_of(&route, &cmd).await })
            .await?;
        parse::<(u64, Vec<Vec<u8>>)>(reply).map_err(|err| connection.classify_reply(err))
    }
}

/// The lease that a key's plain reads (its owner, its PTTL, its companion key) show, read as
/// `getLease` reads the script's answer: `None` when it is not live.
fn lease_of(replies: Vec<Value>) -> redis::RedisResult<Option<Lease>> {
    let mut replies = replies.into_iter();
    let (Some(owner), Some(pttl), Some(fence)) = (replies.next(), replies.next(), replies.next())
    else {
        return Err(redis::RedisError::from((
            redis::ErrorKind::Client,
            "a read of the listing went unanswered",
        )));
    };
    let Some(owner) = parse::<Option<Vec<u8>>>(owner)? else {
        return Ok(None);
    };
    let pttl = parse::<i64>(pttl)?;
    // -2: deleted or expired between the two reads.
    if pttl == -2 {
        return Ok(None);
    }
    let token = parse::<Option<Vec<u8>>>(fence)?
        .and_then(|fence| token_of(&fence, &owner))
        .and_then(|token| i64::try_from(token).ok());
    let reply = Value::Array(vec![
        Value::BulkString(owner),
        Value::Int(pttl),
        token.map_or(Value::Nil, Value::Int),
    ]);
    // The script's answer, so the TTL and the owner read as getLease's do.
    match decode(&Call::Lease { key: String::new() }, reply)? {
        Answer::Lease(lease) => Ok(lease),
        _ => Ok(None),
    }
}

/// The token a companion key holds (`<token>:<transfer id>:<holder's length>:<holder>
/// <metadata>`) when it names `owner`, as `lease.lua` reads it: a companion key naming another
/// holder is a leftover of a grant written without it.
fn token_of(companion: &[u8], owner: &[u8]) -> Option<u64> {
    let mut parts = companion.splitn(4, |&b| b == b':');
    let (token, _, length, rest) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let digits = |field: &[u8]| !field.is_empty() && field.iter().all(u8::is_ascii_digit);
    if !digits(token) || !digits(length) {
        return None;
    }
    let length: usize = std::str::from_utf8(length).ok()?.parse().ok()?;
    if rest.get(..length)? != owner {
        return None;
    }
    std::str::from_utf8(token).ok()?.parse().ok()
}

/// `bytes` with SCAN's glob characters (`*?[]\`) escaped, to match them as themselves.
fn glob_escaped(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len());
    for &b in bytes {
        if matches!(b, b'*' | b'?' | b'[' | b']' | b'\\') {
            out.push(b'\\');
        }
        out.push(b);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_reads_back_as_it_was_written() {
        let single = Position(vec![(None, 1234)]);
        assert_eq!(
            Position::parse(&single.text(), Keyspace::Single).unwrap(),
            single
        );
        let cluster = Position(vec![(Some(0), 17), (Some(5461), 0), (Some(10923), 0)]);
        assert_eq!(cluster.text(), "0.17,5461.0,10923.0");
        assert_eq!(
            Position::parse(&cluster.text(), Keyspace::Slotted).unwrap(),
            cluster
        );
    }

    #[test]
    fn a_cursor_of_the_wrong_shape_is_an_invalid_option() {
        for (text, keyspace) in [
            ("", Keyspace::Single),
            ("x", Keyspace::Single),
            ("1,2", Keyspace::Single),
            ("1", Keyspace::Slotted),
            ("16384.0", Keyspace::Slotted),
            ("0.-1", Keyspace::Slotted),
        ] {
            let err = Position::parse(text, keyspace).unwrap_err();
            assert_eq!(err.code(), "ERR_LEASE_INVALID_OPTION", "{text:?}");
        }
    }

    #[test]
    fn a_companion_key_gives_its_token_to_the_holder_it_names_only() {
        assert_eq!(token_of(b"42:id:5:run-1", b"run-1"), Some(42));
        assert_eq!(token_of(b"42:id:5:run-1meta:data", b"run-1"), Some(42));
        assert_eq!(
            token_of(b"42::17:owner:with:colons", b"owner:with:colons"),
            Some(42)
        );
        // An owner that ends as another begins: the length says where it ends.
        assert_eq!(token_of(b"42::6:run-12", b"run-1"), None);
        assert_eq!(token_of(b"42::5:run-12", b"run-1"), Some(42));
        assert_eq!(token_of(b"42::5:run-1", b"run-12"), None);
        assert_eq!(token_of(b"42::6:a\0b:c\0", b"a\0b:c\0"), Some(42));
        assert_eq!(token_of(b"42:id:5:run-2", b"run-1"), None);
        assert_eq!(token_of(b":id:5:run-1", b"run-1"), None);
        assert_eq!(token_of(b"4x:id:5:run-1", b"run-1"), None);
        assert_eq!(token_of(b"42:id:9:run-1", b"run-1"), None);
        // A waiter's mark names nobody.
        assert_eq!(token_of(b":::", b""), None);
        assert_eq!(token_of(b"42", b"run-1"), None);
    }

    #[test]
    fn a_lease_read_with_plain_reads_decodes_as_get_lease_does() {
        let replies = |fence: Value| {
            vec![
                Value::BulkString(b"run-1".to_vec()),
                Value::Int(5_000),
                fence,
            ]
        };
        let fenced = lease_of(replies(Value::BulkString(b"7::5:run-1".to_vec()))).unwrap();
        assert_eq!(
            fenced,
            Some(Lease {
                owner: "run-1".into(),
                token: Some(7),
                ttl_ms: Some(5_000),
                raw_owner: None,
            })
        );
        let plain = lease_of(replies(Value::Nil)).unwrap();
        assert_eq!(plain.map(|lease| lease.token), Some(None));
    }

    #[test]
    fn glob_characters_of_a_prefix_match_themselves() {
        assert_eq!(
            glob_escaped(b"a*b?[c]\\:lease:"),
            b"a\\*b\\?\\[c\\]\\\\:lease:".to_vec()
        );
    }
}
