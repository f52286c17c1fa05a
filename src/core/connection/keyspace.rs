//! How the deployment spreads its keys over nodes, told to the callers that lay keys out,
//! group them into requests, or walk every master, so none of them asks which kind of
//! deployment it is: [`Keyspace`], [`Shard`], [`Connection::by_shard`] and
//! [`Connection::masters`].

use super::{parse, slots, Connection};
use crate::core::error::Result;

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
            Keyspace::Slotted => Shard(crate::core::lease::keys::slot(key)),
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
        let mut groups: Vec<Vec<T>> = Vec::new();
        let mut of_shard: std::collections::HashMap<Shard, usize> = Default::default();
        for item in items {
            let shard = self.shard(key(&item).as_ref());
            let at = *of_shard.entry(shard).or_insert_with(|| {
                groups.push(Vec::new());
                groups.len() - 1
            });
            groups[at].push(item);
        }
        groups
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
