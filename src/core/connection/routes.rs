//! A cluster's masters on the embedder's event loop. redis-rs' cluster connection runs its
//! routing task on the runtime whatever sockets its nodes use, so a request through it
//! crosses to the runtime's thread and back. Here a request goes straight to the master of
//! its key's slot, over a multiplexed connection whose socket the loop polls, as one to a
//! single server does (`reactor.rs`).
//!
//! The slot map is read (`CLUSTER SLOTS`) over these links: a master's, else a seed's. The
//! cluster connection is opened only for what the map cannot route: a request whose slot no
//! master serves, one that is not a plain pipeline of known one-key commands (but for the
//! scripts it loads first, which go with it, and `MULTI` blocks of them), and the commands a
//! master answered MOVED, ASK, TRYAGAIN, CLUSTERDOWN, MASTERDOWN or READONLY (with the rest
//! of their block): it follows the redirections. Those answers mean the command did not run
//! there (nor did its block), so sending it on is sending it once. The map is then read
//! again. A link that broke is given up, as on one server: the request's error goes to the
//! caller, whose rules for a broken connection say what goes again.

use std::collections::{HashMap, HashSet};
use std::ops::RangeInclusive;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{Arg, AsyncConnectionConfig, Cmd, Pipeline, RedisResult, Value};

use super::address::NodeClients;
use super::cluster::{set_name, SharedCluster};
use super::keyspace::grouped;
use super::link::{is_moving, on_master_of, OnLoop};
use super::parse;
use super::slots::{master_in, no_master, read_slot_map, Node, SlotMap};
use crate::core::lock;

/// The masters of one cluster link, on the loop.
pub struct Routes {
    on_loop: OnLoop,
    nodes: NodeClients,
    /// Where the map is read when no master's link answers.
    seeds: Vec<Node>,
    config: AsyncConnectionConfig,
    connect_timeout: Duration,
    /// The connection name (`CLIENT SETNAME`) each link to a master is given.
    name: Option<String>,
    state: Mutex<State>,
    /// Per node, held while a link to it is opened: calls that find none open one between
    /// them, and a node that does not answer holds up no other's.
    opening: Mutex<HashMap<Node, Arc<tokio::sync::Mutex<()>>>>,
    /// Held while the map is read: one read at a time, which the calls meanwhile wait for.
    reading: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct State {
    /// Which master serves which slots, until a reply says the cluster moved.
    map: Option<SlotMap>,
    /// The masters of the last map read, each once: where [`Routes::on_every_master`] goes,
    /// and where the next map is read when their links are gone.
    masters: Vec<Node>,
    /// A link to each master, opened on first use, given up when it breaks.
    links: HashMap<Node, Master>,
    /// How many links were opened: each is numbered, by which a request tells which one
    /// broke under it.
    opened: u64,
    /// The nodes a call ran out of time on (a request on their link given up unanswered, a
    /// link to them not open in time), until a link to them opens: asked for the map last.
    silent: HashSet<Node>,
}

/// A link to a master, its number, and whether a request on it was given up unanswered.
#[derive(Clone)]
struct Master {
    id: u64,
    link: MultiplexedConnection,
    stalled: Arc<AtomicBool>,
}

/// A request out on a master's link, until [`Out::answered`]. Dropped before it was answered
/// (its call ran out of time, and the request with it), it marks the link stalled
/// ([`Routes::replace_stalled`]).
struct Out<'a>(Option<&'a AtomicBool>);

impl Out<'_> {
    fn answered(mut self) {
        self.0 = None;
    }
}

impl Drop for Out<'_> {
    fn drop(&mut self) {
        if let Some(stalled) = &self.0 {
            stalled.store(true, Ordering::Relaxed);
        }
    }
}

/// Where a request goes.
enum Way {
    Link(Master),
    Open(Node),
    Cluster,
    ReadMap,
}

impl Routes {
    pub(super) fn new(
        on_loop: OnLoop,
        nodes: NodeClients,
        seeds: Vec<Node>,
        config: AsyncConnectionConfig,
        connect_timeout: Duration,
        name: Option<String>,
    ) -> Self {
        Self {
            on_loop,
            nodes,
            seeds,
            config,
            connect_timeout,
            name,
            state: Mutex::default(),
            opening: Mutex::default(),
            reading: tokio::sync::Mutex::new(()),
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
        cluster: &SharedCluster,
        pipe: &Pipeline,
        offset: usize,
        count: usize,
        repeatable: Option<&(dyn Fn() -> Pipeline + Sync)>,
    ) -> RedisResult<Vec<Value>> {
        let key = key_of_pipeline(pipe);
        // What goes through the cluster connection goes in the repeatable form, if any.
        let for_cluster = || repeatable.map(|make| make());
        let Some(mut master) = self.link_for(key).await? else {
            let made = for_cluster();
            let pipe = made.as_ref().unwrap_or(pipe);
            return through_cluster(cluster, pipe, offset, count).await;
        };
        let out = Out(Some(&master.stalled));
        let sent = master.link.req_packed_commands(pipe, offset, count).await;
        out.answered();
        let mut replies = self.answered(master.id, sent)?;
        if replies.len() != pipe.len() || !replies.iter().any(is_moving) {
            return Ok(replies);
        }
        self.moved();
        let made = for_cluster();
        let cmds: Vec<&Cmd> = made.as_ref().unwrap_or(pipe).cmd_iter().collect();
        let mut again = redis::pipe();
        let mut at = Vec::new();
        // A command answered MOVED (or the like) did not run; nor did the rest of its `MULTI`
        // block, which goes again whole.
        for unit in units(&cmds) {
            if replies[unit.clone()].iter().any(is_moving) {
                for i in unit {
                    again.add_command(cmds[i].clone());
                    at.push(i);
                }
            }
        }
        let answers = through_cluster(cluster, &again, 0, again.len()).await?;
        for (i, answer) in at.into_iter().zip(answers) {
            replies[i] = answer;
        }
        Ok(replies)
    }

    /// Sends one command to the master of its slot, or through `cluster`.
    pub(super) async fn send_one(&self, cluster: &SharedCluster, cmd: &Cmd) -> RedisResult<Value> {
        let Some(master) = self.link_for(key_of(cmd)).await? else {
            return cluster.get().await?.req_packed_command(cmd).await;
        };
        let reply = self.ask(master, cmd).await?;
        if !is_moving(&reply) {
            return Ok(reply);
        }
        self.moved();
        cluster.get().await?.req_packed_command(cmd).await
    }

    /// Sends a keyless `cmd` to the master of `key`'s slot (`SCRIPT LOAD`, `CLIENT UNBLOCK`),
    /// or through `cluster` where that master's link cannot take it.
    pub(super) async fn on_master_of(
        &self,
        cluster: &SharedCluster,
        key: &[u8],
        cmd: &Cmd,
    ) -> RedisResult<Value> {
        let slot = super::slot(key);
        if let Some(master) = self.link_to(slot).await? {
            let reply = self.ask(master, cmd).await?;
            if !is_moving(&reply) {
                return Ok(reply);
            }
            self.moved();
        }
        on_master_of(cluster, slot, cmd).await
    }

    /// Sends `cmd` to every master of the map at once, answering each one's reply.
    pub(super) async fn on_every_master(&self, cmd: &Cmd) -> RedisResult<Vec<Value>> {
        let known = self.state().map.is_some();
        if !known {
            self.read_map().await?;
        }
        let masters = self.state().masters.clone();
        let each = masters
            .into_iter()
            .map(|node| async move { self.ask(self.open(node).await?, cmd).await });
        futures::future::try_join_all(each).await
    }

    /// Reads the map now (`CLUSTER SLOTS`) and keeps it: over a master's link, else a seed's
    /// (one that is not a master is let go).
    pub(super) async fn read_map(&self) -> RedisResult<SlotMap> {
        let _reading = self.reading.lock().await;
        self.read_map_held().await
    }

    /// [`Routes::read_map`], `reading` held.
    async fn read_map_held(&self) -> RedisResult<SlotMap> {
        let reply = self.ask_any(redis::cmd("CLUSTER").arg("SLOTS")).await;
        let map = read_slot_map(parse(reply?)?)?;
        let mut state = self.state();
        // A node no longer a master is let go.
        state
            .links
            .retain(|node, _| map.iter().any(|(_, _, it)| it == node));
        state.masters.clear();
        for (_, _, node) in &map {
            if !state.masters.contains(node) {
                state.masters.push(node.clone());
            }
        }
        state.map = Some(map.clone());
        Ok(map)
    }

    /// Asks `cmd` of the first node that answers: those with a link open, then the masters of
    /// the last map, then the seeds; a node a call ran out of time on is asked last, so a
    /// master that stopped answering holds up no read of the map while another answers.
    async fn ask_any(&self, cmd: &Cmd) -> RedisResult<Value> {
        let (mut nodes, silent) = {
            let state = self.state();
            let nodes: Vec<Node> = state.links.keys().chain(&state.masters).cloned().collect();
            (nodes, state.silent.clone())
        };
        nodes.extend(self.seeds.iter().cloned());
        let mut unique: Vec<Node> = Vec::with_capacity(nodes.len());
        for node in nodes {
            if !unique.contains(&node) {
                unique.push(node);
            }
        }
        // Stable: the order above stays within each part.
        unique.sort_by_key(|node| silent.contains(node));
        let mut last = None;
        for node in unique {
            let asked = async { self.ask(self.open(node).await?, cmd).await };
            match asked.await {
                Ok(Value::ServerError(err)) => last = Some(err.into()),
                Ok(reply) => return Ok(reply),
                Err(err) => last = Some(err),
            }
        }
        Err(last.unwrap_or_else(no_master))
    }

    /// Sends `cmd` on `master`'s link.
    async fn ask(&self, mut master: Master, cmd: &Cmd) -> RedisResult<Value> {
        let out = Out(Some(&master.stalled));
        let reply = master.link.req_packed_command(cmd).await;
        out.answered();
        self.answered(master.id, reply)
    }

    /// What link `id` answered; a link that broke is given up, and the map with it (its
    /// master may be gone).
    fn answered<T>(&self, id: u64, replies: RedisResult<T>) -> RedisResult<T> {
        if let Err(err) = &replies {
            if err.is_io_error() || err.is_unrecoverable_error() {
                let mut state = self.state();
                state.links.retain(|_, master| master.id != id);
                state.map = None;
            }
        }
        replies
    }

    /// The shared link was given up: a call ran out of time (or credentials were refused). The
    /// links on which a request was given up unanswered go (a master that stopped answering,
    /// a connection gone silent: the next call opens a fresh one), their nodes asked for the
    /// map last; the others stay, so the masters that answer go on answering. The map is read
    /// again by the next call: a master that stopped answering may have been replaced by its
    /// replica meanwhile, and its keys' calls must find the new one without an answer from
    /// the old.
    pub(super) fn replace_stalled(&self) {
        let mut state = self.state();
        let State {
            links, silent, map, ..
        } = &mut *state;
        links.retain(|node, master| {
            let stalled = master.stalled.load(Ordering::Relaxed);
            if stalled {
                silent.insert(node.clone());
            }
            !stalled
        });
        *map = None;
    }

    /// For each of `slots`, its master's place among the map's masters; `None` without a map
    /// or where a slot has no master.
    pub(super) fn masters_of(&self, slots: &[u16]) -> Option<Vec<usize>> {
        let state = self.state();
        let map = state.map.as_ref()?;
        slots
            .iter()
            .map(|&slot| {
                let node = master_in(map, slot)?;
                state.masters.iter().position(|it| it == node)
            })
            .collect()
    }

    /// A master said the cluster moved: the map is read again.
    fn moved(&self) {
        self.state().map = None;
    }

    /// A link to the master of `key`'s slot; `None` where the cluster connection must take
    /// the request. Fails where no node answers for the map.
    async fn link_for(&self, key: Option<&[u8]>) -> RedisResult<Option<Master>> {
        match key {
            Some(key) => self.link_to(super::slot(key)).await,
            None => Ok(None),
        }
    }

    /// A link to the master of `slot`; `None` where the cluster connection must take the
    /// request.
    async fn link_to(&self, slot: u16) -> RedisResult<Option<Master>> {
        let mut way = self.way(slot);
        if let Way::ReadMap = way {
            let _reading = self.reading.lock().await;
            // Read by a call that held it first, or read now.
            if self.state().map.is_none() {
                self.read_map_held().await?;
            }
            way = self.way(slot);
        }
        Ok(match way {
            Way::Link(master) => Some(master),
            Way::Open(node) => match self.open(node).await {
                Ok(master) => Some(master),
                Err(_) => {
                    // Perhaps gone: the map is read again, the request goes the other way.
                    self.moved();
                    None
                }
            },
            Way::Cluster | Way::ReadMap => None,
        })
    }

    fn way(&self, slot: u16) -> Way {
        let state = self.state();
        let Some(map) = &state.map else {
            return Way::ReadMap;
        };
        match master_in(map, slot) {
            Some(node) => match state.links.get(node) {
                Some(master) => Way::Link(master.clone()),
                None => Way::Open(node.clone()),
            },
            None => Way::Cluster,
        }
    }

    /// A link to `node` on the loop, named as the connection's others are.
    async fn open(&self, node: Node) -> RedisResult<Master> {
        let gate = lock(&self.opening).entry(node.clone()).or_default().clone();
        let _opening = gate.lock().await;
        {
            let mut state = self.state();
            if let Some(master) = state.links.get(&node) {
                return Ok(master.clone());
            }
            // Until it is open: an open given up midway (its call ran out of time) leaves it so.
            state.silent.insert(node.clone());
        }
        let client = self.nodes.client(&node.0, node.1)?;
        let info = client.get_connection_info();
        let mut link = self
            .on_loop
            .open(info, &self.config, self.connect_timeout)
            .await?;
        set_name(&mut link, self.name.as_deref()).await;
        let mut state = self.state();
        state.silent.remove(&node);
        state.opened += 1;
        let master = Master {
            id: state.opened,
            link,
            stalled: Arc::default(),
        };
        state.links.insert(node, master.clone());
        Ok(master)
    }
}

/// Sends `pipe` through the cluster connection, which takes one slot's commands per pipeline:
/// one of one-key commands of several slots (a master's:
/// [`Connection::by_node`](super::Connection::by_node)) goes as one pipeline per slot at once,
/// each with the scripts `pipe` loads first, and the replies are put back in `pipe`'s order.
/// Any other goes whole, as redis-rs routes it: a `MULTI` block (an append under an idle TTL)
/// must not be parted from its keyless `MULTI` and `EXEC`.
async fn through_cluster(
    cluster: &SharedCluster,
    pipe: &Pipeline,
    offset: usize,
    count: usize,
) -> RedisResult<Vec<Value>> {
    let mut connection = cluster.get().await?;
    if pipe.is_transaction() || offset != 0 || count != pipe.len() {
        return connection.req_packed_commands(pipe, offset, count).await;
    }
    let cmds: Vec<&Cmd> = pipe.cmd_iter().collect();
    let loads = cmds.iter().take_while(|cmd| is_script_load(cmd)).count();
    let slot_of: Option<Vec<u16>> = cmds[loads..]
        .iter()
        .map(|cmd| key_of(cmd).map(super::slot))
        .collect();
    let Some(slot_of) = slot_of else {
        return connection.req_packed_commands(pipe, offset, count).await;
    };
    let slots = grouped(loads..cmds.len(), |&i| slot_of[i - loads]);
    if slots.len() <= 1 {
        return connection.req_packed_commands(pipe, offset, count).await;
    }
    let each = slots.iter().map(|at| {
        let mut part = redis::pipe();
        for cmd in cmds[..loads].iter().chain(at.iter().map(|&i| &cmds[i])) {
            part.add_command((*cmd).clone());
        }
        let mut connection = connection.clone();
        async move { connection.req_packed_commands(&part, 0, part.len()).await }
    });
    let answered = futures::future::try_join_all(each).await?;
    let mut replies = vec![Value::Nil; cmds.len()];
    for (n, (at, answers)) in slots.iter().zip(answered).enumerate() {
        let mut answers = answers.into_iter();
        for (i, answer) in answers.by_ref().take(loads).enumerate() {
            if n == 0 {
                replies[i] = answer;
            }
        }
        for (&i, answer) in at.iter().zip(answers) {
            replies[i] = answer;
        }
    }
    Ok(replies)
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

/// The key by which a pipeline's slot is found: its first command's, past the scripts it loads
/// first (they go along to the master where the calls after them run) and a `MULTI` (an
/// append under an idle TTL: its block runs on that master); `None` for a transaction, or
/// where that command has none [`key_of`] knows.
fn key_of_pipeline(pipe: &Pipeline) -> Option<&[u8]> {
    if pipe.is_transaction() {
        return None;
    }
    pipe.cmd_iter()
        .find(|cmd| !is_script_load(cmd) && !is(cmd, &[b"MULTI"]))
        .and_then(key_of)
}

/// The commands of `cmds` that run or fail together, in order: each on its own, but for a
/// `MULTI` block, from `MULTI` to its `EXEC` (or `DISCARD`).
fn units(cmds: &[&Cmd]) -> Vec<RangeInclusive<usize>> {
    let mut units = Vec::with_capacity(cmds.len());
    let mut i = 0;
    while i < cmds.len() {
        let mut end = i;
        if is(cmds[i], &[b"MULTI"]) {
            while end + 1 < cmds.len() && !is(cmds[end], &[b"EXEC", b"DISCARD"]) {
                end += 1;
            }
        }
        units.push(i..=end);
        i = end + 1;
    }
    units
}

/// Whether `cmd`'s name is one of `names`, alone (`MULTI`, `EXEC`).
fn is(cmd: &Cmd, names: &[&[u8]]) -> bool {
    let mut args = cmd.args_iter();
    matches!(args.next(), Some(Arg::Simple(name)) if names.iter().any(|it| it.eq_ignore_ascii_case(name)))
        && args.next().is_none()
}

/// Whether `cmd` is `SCRIPT LOAD`.
fn is_script_load(cmd: &Cmd) -> bool {
    let mut args = cmd.args_iter().map(|arg| match arg {
        Arg::Simple(bytes) => bytes,
        _ => &[],
    });
    args.next()
        .is_some_and(|it| it.eq_ignore_ascii_case(b"SCRIPT"))
        && args
            .next()
            .is_some_and(|it| it.eq_ignore_ascii_case(b"LOAD"))
}

#[cfg(test)]
mod tests {
    use super::{key_of, key_of_pipeline, units};

    #[test]
    fn a_pipeline_goes_by_its_first_key_past_the_scripts_it_loads_first() {
        let mut pipe = redis::pipe();
        pipe.cmd("SCRIPT").arg("LOAD").arg("return 1");
        pipe.cmd("script").arg("load").arg("return 2");
        pipe.cmd("EVALSHA").arg("abc").arg(1).arg("k1").arg("a");
        assert_eq!(key_of_pipeline(&pipe), Some(&b"k1"[..]));
        let mut loads_only = redis::pipe();
        loads_only.cmd("SCRIPT").arg("LOAD").arg("return 1");
        assert_eq!(key_of_pipeline(&loads_only), None);
        let mut flush = redis::pipe();
        flush.cmd("SCRIPT").arg("FLUSH");
        flush.cmd("GET").arg("k1");
        assert_eq!(key_of_pipeline(&flush), None);
        let mut transaction = redis::pipe();
        transaction.atomic().cmd("GET").arg("k1");
        assert_eq!(key_of_pipeline(&transaction), None);
    }

    #[test]
    fn a_pipeline_of_multi_blocks_goes_by_the_key_of_the_first_command_in_its_first_block() {
        let mut pipe = redis::pipe();
        pipe.cmd("MULTI")
            .cmd("XADD")
            .arg("s1")
            .arg("*")
            .arg("event")
            .arg("{}")
            .cmd("PEXPIRE")
            .arg("s1")
            .arg(1000)
            .cmd("EXEC");
        assert_eq!(key_of_pipeline(&pipe), Some(&b"s1"[..]));
        let mut group = redis::pipe();
        group.cmd("MULTI").cmd("XGROUP").arg("CREATE").arg("s1");
        assert_eq!(key_of_pipeline(&group), None);
    }

    #[test]
    fn a_multi_block_is_one_unit_from_multi_to_exec_and_every_other_command_its_own() {
        let mut pipe = redis::pipe();
        pipe.cmd("SCRIPT").arg("LOAD").arg("return 1");
        pipe.cmd("MULTI")
            .cmd("XADD")
            .arg("s1")
            .cmd("PEXPIRE")
            .arg("s1")
            .cmd("EXEC");
        pipe.cmd("GET").arg("k");
        pipe.cmd("multi").cmd("XADD").arg("s2").cmd("discard");
        // An unfinished block runs to the end.
        pipe.cmd("MULTI").cmd("XADD").arg("s3");
        let cmds: Vec<_> = pipe.cmd_iter().collect();
        assert_eq!(units(&cmds), vec![0..=0, 1..=4, 5..=5, 6..=8, 9..=10]);
        assert_eq!(units(&[]), vec![]);
    }

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
