//! A cluster's masters on the embedder's event loop. redis-rs' cluster connection runs its
//! routing task on the runtime whatever sockets its nodes use, so a request through it
//! crosses to the runtime's thread and back. Here a request goes straight to the master of
//! its key's slot, over a multiplexed connection whose socket the loop polls, as one to a
//! single server does (`reactor.rs`).
//!
//! The cluster connection stays the authority. It reads the slot map (`CLUSTER SLOTS`), and
//! takes what the map cannot route: a request whose slot is not known, one that is not a
//! plain pipeline of known one-key commands, and the commands a master answered MOVED, ASK,
//! TRYAGAIN, CLUSTERDOWN, MASTERDOWN or READONLY: it follows the redirections. Those answers
//! mean the command did not run there, so sending it on is sending it once. The map is then
//! read again. A link that broke is given up, as on one server: the request's error goes to
//! the caller, whose rules for a broken connection say what goes again.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::{Arg, AsyncConnectionConfig, Cmd, Pipeline, RedisResult, Value};

use super::address::NodeClients;
use super::link::{is_moving, OnLoop};
use super::slots::{master_in, slot_map, Node, SlotMap};
use crate::core::lock;

/// The masters of one cluster link, on the loop.
pub struct Routes {
    on_loop: OnLoop,
    nodes: NodeClients,
    config: AsyncConnectionConfig,
    connect_timeout: Duration,
    /// The connection name (`CLIENT SETNAME`) each link to a master is given.
    name: Option<String>,
    state: Mutex<State>,
    /// Held while a link to a master is opened: one at a time, so calls that find none open
    /// one between them.
    opening: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct State {
    /// Which master serves which slots, until a reply says the cluster moved.
    map: Option<SlotMap>,
    /// Whether the map is being read: calls meanwhile go through the cluster connection.
    reading: bool,
    /// A link to each master, opened on first use, given up when it breaks; each numbered
    /// (`opened` counts them), by which a request tells which one broke under it.
    links: HashMap<Node, (u64, MultiplexedConnection)>,
    opened: u64,
}

/// Where a request goes.
enum Way {
    Link(u64, MultiplexedConnection),
    Open(Node),
    Cluster,
    ReadMap,
}

/// Clears `reading` when the read of the map ends, finished or abandoned (its call timed out).
struct Reading<'a>(&'a Routes);

impl Drop for Reading<'_> {
    fn drop(&mut self) {
        self.0.state().reading = false;
    }
}

impl Routes {
    pub(super) fn new(
        on_loop: OnLoop,
        nodes: NodeClients,
        config: AsyncConnectionConfig,
        connect_timeout: Duration,
        name: Option<String>,
    ) -> Self {
        Self {
            on_loop,
            nodes,
            config,
            connect_timeout,
            name,
            state: Mutex::default(),
            opening: tokio::sync::Mutex::new(()),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// Sends `pipe`'s commands (`offset`, `count` as `ConnectionLike` takes them) to the
    /// master of their slot, or through `cluster`: in the form `repeatable` makes, where it
    /// is given (see [`Link::send_either`](super::Link::send_either)).
    pub(super) async fn send(
        &self,
        cluster: &mut ClusterConnection,
        pipe: &Pipeline,
        offset: usize,
        count: usize,
        repeatable: Option<&(dyn Fn() -> Pipeline + Sync)>,
    ) -> RedisResult<Vec<Value>> {
        let key = match pipe.is_transaction() {
            true => None,
            false => pipe.cmd_iter().next().and_then(key_of),
        };
        // What goes through the cluster connection goes in the repeatable form, if any.
        let for_cluster = || repeatable.map(|make| make());
        let Some((id, mut link)) = self.link_for(key, cluster).await else {
            let made = for_cluster();
            let pipe = made.as_ref().unwrap_or(pipe);
            return cluster.req_packed_commands(pipe, offset, count).await;
        };
        let mut replies = self.answered(id, link.req_packed_commands(pipe, offset, count).await)?;
        if replies.len() != pipe.len() || !replies.iter().any(is_moving) {
            return Ok(replies);
        }
        self.moved();
        let made = for_cluster();
        let mut again = redis::pipe();
        let mut at = Vec::new();
        let cmds = made.as_ref().unwrap_or(pipe).cmd_iter();
        for (i, (cmd, reply)) in cmds.zip(&replies).enumerate() {
            if is_moving(reply) {
                again.add_command(cmd.clone());
                at.push(i);
            }
        }
        let answers = cluster.req_packed_commands(&again, 0, again.len()).await?;
        for (i, answer) in at.into_iter().zip(answers) {
            replies[i] = answer;
        }
        Ok(replies)
    }

    /// Sends one command to the master of its slot, or through `cluster`.
    pub(super) async fn send_one(
        &self,
        cluster: &mut ClusterConnection,
        cmd: &Cmd,
    ) -> RedisResult<Value> {
        let Some((id, mut link)) = self.link_for(key_of(cmd), cluster).await else {
            return cluster.req_packed_command(cmd).await;
        };
        let reply = self.answered(id, link.req_packed_command(cmd).await)?;
        if !is_moving(&reply) {
            return Ok(reply);
        }
        self.moved();
        cluster.req_packed_command(cmd).await
    }

    /// What link `id` answered; a link that broke is given up, and the map with it (its
    /// master may be gone).
    fn answered<T>(&self, id: u64, replies: RedisResult<T>) -> RedisResult<T> {
        if let Err(err) = &replies {
            if err.is_io_error() || err.is_unrecoverable_error() {
                let mut state = self.state();
                state.links.retain(|_, (opened, _)| *opened != id);
                state.map = None;
            }
        }
        replies
    }

    /// A master said the cluster moved: the map is read again.
    fn moved(&self) {
        self.state().map = None;
    }

    /// A link to the master of `key`'s slot, and its number; `None` where the cluster
    /// connection must take the request.
    async fn link_for(
        &self,
        key: Option<&[u8]>,
        cluster: &ClusterConnection,
    ) -> Option<(u64, MultiplexedConnection)> {
        let slot = super::slot(key?);
        let mut way = self.way(slot);
        if let Way::ReadMap = way {
            let reading = Reading(self);
            let map = slot_map(cluster.clone()).await.ok();
            let mut state = self.state();
            if let Some(map) = &map {
                // A master no longer in the map is let go.
                state
                    .links
                    .retain(|node, _| map.iter().any(|(_, _, it)| it == node));
            }
            state.map = map;
            drop(state);
            drop(reading);
            way = self.way(slot);
        }
        match way {
            Way::Link(id, link) => Some((id, link)),
            Way::Open(node) => match self.open(node).await {
                Ok(link) => Some(link),
                Err(_) => {
                    // Perhaps gone: the map is read again, the request goes the other way.
                    self.moved();
                    None
                }
            },
            Way::Cluster | Way::ReadMap => None,
        }
    }

    fn way(&self, slot: u16) -> Way {
        let mut state = self.state();
        let Some(map) = &state.map else {
            if state.reading {
                return Way::Cluster;
            }
            state.reading = true;
            return Way::ReadMap;
        };
        match master_in(map, slot) {
            Some(node) => match state.links.get(node) {
                Some((id, link)) => Way::Link(*id, link.clone()),
                None => Way::Open(node.clone()),
            },
            None => Way::Cluster,
        }
    }

    /// A link to `node` on the loop, named as the connection's others are, and its number.
    async fn open(&self, node: Node) -> RedisResult<(u64, MultiplexedConnection)> {
        let _opening = self.opening.lock().await;
        if let Some((id, link)) = self.state().links.get(&node) {
            return Ok((*id, link.clone()));
        }
        let client = self.nodes.client(&node.0, node.1)?;
        let info = client.get_connection_info();
        let mut link = self
            .on_loop
            .open(info, &self.config, self.connect_timeout)
            .await?;
        if let Some(name) = &self.name {
            // Advice, as for the connection's others: refused, the link serves unnamed.
            let _ = redis::cmd("CLIENT")
                .arg("SETNAME")
                .arg(name)
                .query_async::<Value>(&mut link)
                .await;
        }
        let mut state = self.state();
        state.opened += 1;
        let id = state.opened;
        state.links.insert(node, (id, link.clone()));
        Ok((id, link))
    }
}

/// The key of a one-key command this package sends, by which its slot is found; `None` for
/// any other (it goes through the cluster connection).
fn key_of(cmd: &Cmd) -> Option<&[u8]> {
    let mut args = cmd.args_iter().map(|arg| match arg {
        Arg::Simple(bytes) => Some(bytes),
        _ => None,
    });
    let name = args.next()??;
    let named = |names: &[&[u8]]| names.iter().any(|it| it.eq_ignore_ascii_case(name));
    if named(&[b"EVALSHA", b"EVAL", b"EVALSHA_RO", b"EVAL_RO"]) {
        let _script = args.next()?;
        let keys = std::str::from_utf8(args.next()??).ok()?;
        if keys.parse::<usize>().ok()? == 0 {
            return None;
        }
    } else if !named(&[
        b"GET",
        b"SET",
        b"DEL",
        b"EXISTS",
        b"PEXPIRE",
        b"PTTL",
        b"XADD",
        b"XACK",
        b"XCLAIM",
        b"XDEL",
        b"XLEN",
        b"XRANGE",
        b"SPUBLISH",
    ]) {
        return None;
    }
    args.next()?
}

#[cfg(test)]
mod tests {
    use super::key_of;

    #[test]
    fn a_commands_key_is_found_for_the_one_key_commands_sent_and_for_no_other() {
        let mut evalsha = redis::cmd("EVALSHA");
        evalsha.arg("abc").arg(2).arg("k1").arg("k2").arg("a");
        assert_eq!(key_of(&evalsha), Some(&b"k1"[..]));
        let mut keyless = redis::cmd("EVALSHA");
        keyless.arg("abc").arg(0).arg("a");
        assert_eq!(key_of(&keyless), None);
        let mut xadd = redis::cmd("xadd");
        xadd.arg("stream").arg("*").arg("event").arg("{}");
        assert_eq!(key_of(&xadd), Some(&b"stream"[..]));
        let mut ping = redis::cmd("PING");
        ping.arg("x");
        assert_eq!(key_of(&ping), None);
        let mut config = redis::cmd("CONFIG");
        config.arg("GET").arg("maxmemory");
        assert_eq!(key_of(&config), None);
        assert_eq!(key_of(&redis::cmd("GET")), None);
    }
}
