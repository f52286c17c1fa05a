//! Which master serves which slot of a cluster, read with `CLUSTER SLOTS` (answered by every
//! version, where `CLUSTER SHARDS` would do as well): for connections that go to one node.

use redis::cluster_async::ClusterConnection;
use redis::{RedisResult, ServerErrorKind, Value};

use super::parse;

/// A cluster node, by host and port.
pub(super) type Node = (String, u16);

/// Which master serves which slots: ranges of slots, first and last included.
pub(super) type SlotMap = Vec<(u16, u16, Node)>;

/// The master serving `slot`, in `map`.
pub(super) fn master_in(map: &SlotMap, slot: u16) -> Option<&Node> {
    map.iter()
        .find(|(start, end, _)| (*start..=*end).contains(&slot))
        .map(|(_, _, node)| node)
}

/// What a caller gets when no master serves a slot.
pub(super) fn no_master() -> redis::RedisError {
    redis::RedisError::from((
        redis::ErrorKind::Server(ServerErrorKind::ClusterDown),
        "no node serves the slot",
    ))
}

/// Every slot range and its master, from `CLUSTER SLOTS` through redis-rs' cluster connection.
pub(super) async fn slot_map(mut cluster: ClusterConnection) -> RedisResult<SlotMap> {
    let reply = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query_async::<Value>(&mut cluster)
        .await?;
    read_slot_map(parse(reply)?)
}

/// The slot map a `CLUSTER SLOTS` reply tells: per range, its first and last slot and its
/// master (`[host, port, id, …]`), then its replicas.
pub(super) fn read_slot_map(ranges: Vec<Vec<Value>>) -> RedisResult<SlotMap> {
    let mut map = SlotMap::new();
    for range in ranges {
        let mut fields = range.into_iter();
        let (Some(start), Some(end), Some(master)) = (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let node: Vec<Value> = parse(master)?;
        let mut node = node.into_iter();
        if let (Some(host), Some(port)) = (node.next(), node.next()) {
            map.push((
                parse(start)?,
                parse(end)?,
                (parse::<String>(host)?, parse::<u16>(port)?),
            ));
        }
    }
    Ok(map)
}

/// Each master of `map` once, as the first slot it serves, in slot order.
pub(super) fn first_slots(map: &SlotMap) -> Vec<u16> {
    let mut firsts: Vec<(&Node, u16)> = Vec::new();
    for (start, _, node) in map {
        match firsts.iter_mut().find(|(master, _)| *master == node) {
            Some((_, first)) => *first = (*first).min(*start),
            None => firsts.push((node, *start)),
        }
    }
    let mut firsts: Vec<u16> = firsts.into_iter().map(|(_, first)| first).collect();
    firsts.sort_unstable();
    firsts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_master_is_visited_once_from_its_first_slot() {
        let node = |port: u16| ("127.0.0.1".to_owned(), port);
        let map: SlotMap = vec![
            (10923, 16383, node(3)),
            (0, 5460, node(1)),
            (5461, 10000, node(2)),
            (10001, 10922, node(1)),
        ];
        assert_eq!(first_slots(&map), vec![0, 5461, 10923]);
        assert_eq!(first_slots(&SlotMap::new()), Vec::<u16>::new());
    }
}
