//! Links lent to one caller at a time, for work that blocks the connection it runs on:
//! `WAIT` holds up every later command of its connection until the replicas confirm or its
//! timeout passes, and it confirms only that connection's own writes. So each batch of
//! grants that waits for replicas writes and waits on a link no other call uses meanwhile,
//! and a confirmation never delays a read, a refusal, a release, a publish or another
//! batch's confirmation.
//!
//! A link is opened when none is idle, up to [`MOST_LENT`] at once; a caller past that waits
//! for one to come back (within its own bound). A caller keeps its link for the next ones
//! ([`Lent::keep`]) only once its work on it finished; a link dropped otherwise (its work
//! broke, timed out, or was abandoned mid-`WAIT`) is closed, never lent again.

use std::sync::Mutex;

use tokio::sync::{Semaphore, SemaphorePermit};

use super::Link;
use crate::core::lock;

/// The most links lent at once: a bound on the connections a lagging replica can make one
/// provider open, whatever its call rate.
pub(super) const MOST_LENT: usize = 64;

/// Links kept open, idle, for the next callers.
const KEPT_IDLE: usize = 4;

pub(super) struct Exclusive {
    idle: Mutex<Vec<Link>>,
    lent: Semaphore,
}

impl Default for Exclusive {
    fn default() -> Self {
        Self {
            idle: Mutex::new(Vec::new()),
            lent: Semaphore::new(MOST_LENT),
        }
    }
}

impl Exclusive {
    /// Waits for a place among the lent links; `None` once [`Exclusive::close`] ran.
    pub(super) async fn place(&self) -> Option<SemaphorePermit<'_>> {
        self.lent.acquire().await.ok()
    }

    /// An idle link, if one is kept.
    pub(super) fn take(&self) -> Option<Link> {
        lock(&self.idle).pop()
    }

    /// Keeps `link` for the next caller, or drops it when enough are kept.
    fn give_back(&self, link: Link) {
        let mut idle = lock(&self.idle);
        if idle.len() < KEPT_IDLE && !self.lent.is_closed() {
            idle.push(link);
        }
    }

    /// Drops every idle link (the deployment moved: they lead to the old master).
    pub(super) fn forget_idle(&self) {
        lock(&self.idle).clear();
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
    pool: &'a Exclusive,
    _place: SemaphorePermit<'a>,
}

impl<'a> Lent<'a> {
    pub(super) fn new(link: Link, pool: &'a Exclusive, place: SemaphorePermit<'a>) -> Self {
        Self {
            link,
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
        self.pool.give_back(self.link);
    }
}
