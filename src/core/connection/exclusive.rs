//! Links lent to one caller at a time, for work that blocks the connection it runs on:
//! `WAIT` holds up every later command of its connection until the replicas confirm or its
//! timeout passes, and it confirms only that connection's own writes. So each batch of
//! grants that waits for replicas writes and waits on a link no other call uses meanwhile,
//! and a confirmation never delays a read, a refusal, a release, a publish or another
//! batch's confirmation.
//!
//! On a cluster a lent link is a plain connection to the master of the caller's slot (a
//! cluster connection of its own would first connect to every node, and wait for any that
//! does not answer); the slots' masters are read once (`CLUSTER SLOTS`) and again after a
//! lent link met a moved slot or a lost node.
//!
//! A link is opened when none is idle, up to [`MOST_LENT`] at once; a caller past that waits
//! for one to come back (within its own bound). A caller keeps its link for the next ones
//! ([`Lent::keep`]) only once its work on it finished; a link dropped otherwise (its work
//! broke, timed out, or was abandoned mid-`WAIT`) is closed, never lent again.

use std::sync::atomic::Ordering;
use std::sync::Mutex;

use tokio::sync::{Semaphore, SemaphorePermit};

use super::slots::{self, master_in, Node, SlotMap};
use super::{Connection, Link};
use crate::core::error::{Error, Result};
use crate::core::lock;

/// The most links lent at once: a bound on the connections a lagging replica can make one
/// provider open, whatever its call rate.
pub(super) const MOST_LENT: usize = 64;

/// Links kept open, idle, for the next callers.
const KEPT_IDLE: usize = 4;

pub(super) struct Exclusive {
    /// Idle links, with the cluster node each leads to.
    idle: Mutex<Vec<(Option<Node>, Link)>>,
    lent: Semaphore,
    /// On a cluster: the slots' masters, as last read.
    slots: Mutex<SlotMap>,
}

impl Default for Exclusive {
    fn default() -> Self {
        Self {
            idle: Mutex::new(Vec::new()),
            lent: Semaphore::new(MOST_LENT),
            slots: Mutex::new(SlotMap::new()),
        }
    }
}

impl Exclusive {
    /// Waits for a place among the lent links; `None` once [`Exclusive::close`] ran.
    pub(super) async fn place(&self) -> Option<SemaphorePermit<'_>> {
        self.lent.acquire().await.ok()
    }

    /// An idle link to `node`, if one is kept.
    pub(super) fn take(&self, node: Option<&Node>) -> Option<Link> {
        let mut idle = lock(&self.idle);
        let at = idle.iter().rposition(|(to, _)| to.as_ref() == node)?;
        Some(idle.swap_remove(at).1)
    }

    /// Keeps `link` for the next caller, or drops it when enough are kept.
    fn give_back(&self, node: Option<Node>, link: Link) {
        let mut idle = lock(&self.idle);
        if idle.len() < KEPT_IDLE && !self.lent.is_closed() {
            idle.push((node, link));
        }
    }

    /// Drops every idle link (the deployment moved: they lead to the old master).
    pub(super) fn forget_idle(&self) {
        lock(&self.idle).clear();
    }

    /// The master of `slot`, as last read.
    pub(super) fn master_of(&self, slot: u16) -> Option<Node> {
        master_in(&lock(&self.slots), slot).cloned()
    }

    /// Remembers the slots' masters.
    pub(super) fn set_slots(&self, map: SlotMap) {
        *lock(&self.slots) = map;
    }

    /// Forgets the slots' masters and the idle links to them: a slot moved or a node was
    /// lost, so they are read again on the next lend.
    pub(super) fn forget_slots(&self) {
        lock(&self.slots).clear();
        self.forget_idle();
    }

    /// Lends no more links; those lent are dropped when they come back.
    pub(super) fn close(&self) {
        self.lent.close();
        self.forget_idle();
    }
}

/// A link lent to one caller. Dropped, it is closed; [`Lent::keep`] keeps it for the next.
pub struct Lent<'a> {
    link: Link,
    node: Option<Node>,
    pool: &'a Exclusive,
    _place: SemaphorePermit<'a>,
}

impl<'a> Lent<'a> {
    pub(super) fn new(
        link: Link,
        node: Option<Node>,
        pool: &'a Exclusive,
        place: SemaphorePermit<'a>,
    ) -> Self {
        Self {
            link,
            node,
            pool,
            _place: place,
        }
    }

    /// The link, for commands.
    pub fn link(&mut self) -> &mut Link {
        &mut self.link
    }

    /// Gives the link back for the next caller: only once nothing of this caller's is still
    /// on its way on it.
    pub fn keep(self) {
        self.pool.give_back(self.node, self.link);
    }
}

impl Connection {
    /// A link no other caller sends anything on until it is dropped or kept: for `WAIT`,
    /// which holds up every later command of its connection and confirms only that
    /// connection's writes. Waits for one when [`exclusive::MOST_LENT`] are lent already; the
    /// caller bounds the wait. On a cluster the link leads to the master of `key`'s slot.
    pub async fn lend(&self, key: &[u8]) -> Result<Lent<'_>> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed(self.subject));
        }
        let Some(place) = self.exclusive.place().await else {
            return Err(Error::Closed(self.subject));
        };
        let node = match self.target.is_cluster() {
            true => Some(self.master_of(key).await?),
            false => None,
        };
        let link = match self.exclusive.take(node.as_ref()) {
            Some(link) => link,
            None => self.open_exclusive(node.as_ref()).await?,
        };
        Ok(Lent::new(link, node, &self.exclusive, place))
    }

    /// The cluster master serving `key`'s slot: as last read, or read now on the shared link.
    async fn master_of(&self, key: &[u8]) -> Result<Node> {
        let slot = super::slot(key);
        if let Some(node) = self.exclusive.master_of(slot) {
            return Ok(node);
        }
        let map = self
            .link()
            .await?
            .slot_map()
            .await
            .map_err(|err| self.classify(err))?;
        let node = slots::master_in(&map, slot).cloned();
        self.exclusive.set_slots(map);
        node.ok_or_else(|| self.classify(slots::no_master()))
    }

    /// A link to lend, named like every other (best effort, as elsewhere).
    async fn open_exclusive(&self, node: Option<&Node>) -> Result<Link> {
        let mut link = self
            .target
            .exclusive(&self.lent, node)
            .await
            .map_err(|err| self.classify(err))?;
        if let Some(name) = &self.name {
            let mut setname = redis::cmd("CLIENT");
            setname.arg("SETNAME").arg(name);
            let _ = link.on_every_master(&setname).await;
        }
        Ok(link)
    }
}
