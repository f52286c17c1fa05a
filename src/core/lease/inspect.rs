//! Listing the leases under a key prefix, for operators (`listLeases`, the `mastra-lease`
//! command): a `SCAN` of every master, page by page, each key found read whole as
//! `getLease` reads it. Never `KEYS`: a page costs Redis about `count` keys' work.

use redis::Value;

use super::redis::RedisStore;
use super::{keys, Answer, Call, Lease};
use crate::core::connection::parse;
use crate::core::error::{Error, InputErrorKind, Result};

/// One page of a listing: the live leases found, and where the next page starts (`None`
/// once every master has been scanned through).
#[derive(Debug)]
pub struct Page {
    pub leases: Vec<(String, Lease)>,
    pub cursor: Option<String>,
}

/// Where a listing stands: the masters left to scan, each as a slot it serves (`None` on one
/// server) and its SCAN cursor; the first is the one being scanned. As text (the cursor the
/// caller hands back): `<cursor>` on one server, `<slot>.<cursor>,…` on a cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Position(Vec<(Option<u16>, u64)>);

impl Position {
    fn parse(text: &str, cluster: bool) -> Result<Self> {
        let bad = || {
            Error::option(
                InputErrorKind::Range,
                format!("cursor {text:?} is not one a listing answered"),
            )
        };
        let nodes = text
            .split(',')
            .map(|node| match (cluster, node.split_once('.')) {
                (true, Some((slot, cursor))) => {
                    let slot = slot.parse::<u16>().ok().filter(|s| *s < keys::SLOTS);
                    Some((Some(slot?), cursor.parse().ok()?))
                }
                (false, None) => Some((None, node.parse().ok()?)),
                _ => None,
            })
            .collect::<Option<Vec<_>>>()
            .ok_or_else(bad)?;
        if nodes.is_empty() || (!cluster && nodes.len() != 1) {
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
        let cluster = self.connection().is_cluster();
        let mut position = match cursor {
            Some(text) => Position::parse(text, cluster)?,
            None if cluster => self.masters().await?,
            None => Position(vec![(None, 0)]),
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
        let keys: Vec<String> = found
            .iter()
            .filter_map(|key| key.strip_prefix(prefix))
            .filter_map(|key| String::from_utf8(key.to_vec()).ok())
            .collect();
        let reads = keys.iter().map(|key| Call::Lease { key: key.clone() });
        let answers = self.execute(reads.collect()).await;
        let mut leases = Vec::with_capacity(keys.len());
        for (key, answer) in keys.into_iter().zip(answers) {
            match answer {
                Ok(Answer::Lease(Some(lease))) => leases.push((key, lease)),
                // Gone since the scan saw it, or a key this store's limits refuse to read.
                Ok(_) | Err(Error::InvalidArgument { .. }) => {}
                Err(err) => return Err(err),
            }
        }
        let cursor = (!position.0.is_empty()).then(|| position.text());
        Ok(Page { leases, cursor })
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
        let route = keys::in_slot(slot.unwrap_or(0));
        let connection = self.connection();
        let reply = connection
            .run(|mut link| async move { link.on_node_of(&route, &cmd).await })
            .await?;
        parse::<(u64, Vec<Vec<u8>>)>(reply).map_err(|err| connection.classify_reply(err))
    }

    /// The cluster's masters, each as the first slot it serves (`CLUSTER SLOTS`).
    async fn masters(&self) -> Result<Position> {
        let cmd = redis::cmd("CLUSTER").arg("SLOTS").to_owned();
        let connection = self.connection();
        let reply = connection
            .run(|mut link| async move { link.on_node_of(b"", &cmd).await })
            .await?;
        let ranges =
            parse::<Vec<Vec<Value>>>(reply).map_err(|err| connection.classify_reply(err))?;
        let mut firsts: Vec<(String, u16)> = Vec::new();
        for range in ranges {
            let (Some(start), Some(master)) = (range.first(), range.get(2)) else {
                continue;
            };
            // The master: [host, port, id, …].
            let (Ok(start), Ok(master)) = (
                parse::<u16>(start.clone()),
                parse::<Vec<Value>>(master.clone()),
            ) else {
                continue;
            };
            let (Some(host), Some(port)) = (master.first(), master.get(1)) else {
                continue;
            };
            let (Ok(host), Ok(port)) = (parse::<String>(host.clone()), parse::<u16>(port.clone()))
            else {
                continue;
            };
            let address = format!("{host}:{port}");
            match firsts.iter_mut().find(|(a, _)| *a == address) {
                Some((_, first)) => *first = (*first).min(start),
                None => firsts.push((address, start)),
            }
        }
        firsts.sort_by_key(|(_, first)| *first);
        Ok(Position(
            firsts
                .into_iter()
                .map(|(_, first)| (Some(first), 0))
                .collect(),
        ))
    }
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
        assert_eq!(Position::parse(&single.text(), false).unwrap(), single);
        let cluster = Position(vec![(Some(0), 17), (Some(5461), 0), (Some(10923), 0)]);
        assert_eq!(cluster.text(), "0.17,5461.0,10923.0");
        assert_eq!(Position::parse(&cluster.text(), true).unwrap(), cluster);
    }

    #[test]
    fn a_cursor_of_the_wrong_shape_is_an_invalid_option() {
        for (text, cluster) in [
            ("", false),
            ("x", false),
            ("1,2", false),
            ("1", true),
            ("16384.0", true),
            ("0.-1", true),
        ] {
            let err = Position::parse(text, cluster).unwrap_err();
            assert_eq!(err.code(), "ERR_LEASE_INVALID_OPTION", "{text:?}");
        }
    }

    #[test]
    fn glob_characters_of_a_prefix_match_themselves() {
        assert_eq!(
            glob_escaped(b"a*b?[c]\\:lease:"),
            b"a\\*b\\?\\[c\\]\\\\:lease:".to_vec()
        );
    }
}
