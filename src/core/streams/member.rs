//! A subscription as the reader serving it sees it ([`Member`]), and the subscriptions of a
//! consumer taking its deliveries in turn ([`Members`]).

use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinHandle;

use super::delivery::Delivery;
use super::event::EntryId;
use crate::core::lock;

/// One subscription as its reader sees it: where its deliveries go.
pub(crate) struct Member {
    pub id: u64,
    pub tx: mpsc::Sender<Delivery>,
    /// Fan-out: the last entry this subscription was given; reads skip entries up to it.
    pub position: Mutex<EntryId>,
    /// Fan-out: this subscription's `maxInFlight` places (a group's belong to its consumer).
    pub room: Option<Arc<Semaphore>>,
}

impl Member {
    pub fn position(&self) -> EntryId {
        *lock(&self.position)
    }

    pub fn set_position(&self, id: EntryId) {
        *lock(&self.position) = id;
    }

    /// How many more deliveries its `maxInFlight` lets it hold (`usize::MAX` unlimited).
    pub fn free(&self) -> usize {
        self.room
            .as_ref()
            .map_or(usize::MAX, |places| places.available_permits())
    }
}

/// The subscriptions a consumer serves, and its reader while it has any.
#[derive(Default)]
pub(super) struct Members {
    pub(super) list: Vec<Arc<Member>>,
    /// Whose turn the next entry is.
    pub(super) next: usize,
    /// The running reader and its generation.
    pub(super) reader: Option<(u64, JoinHandle<()>)>,
}

impl Members {
    /// The member whose turn it is, of those `accept` takes; the turn moves past it. Every
    /// delivery a consumer hands out takes its turn here, read from a stream or published
    /// `localOnly`.
    pub(super) fn turn(&mut self, accept: impl Fn(&Member) -> bool) -> Option<Arc<Member>> {
        let len = self.list.len();
        let first = (0..len)
            .map(|step| self.next.wrapping_add(step) % len)
            .find(|&i| accept(&self.list[i]))?;
        self.next = first.wrapping_add(1);
        Some(Arc::clone(&self.list[first]))
    }
}

/// Hands a delivery to the subscriptions in turn; gives it back when none is left.
pub(super) async fn hand_out(
    members: &Mutex<Members>,
    mut delivery: Delivery,
) -> std::result::Result<(), Delivery> {
    let Some(turn) = lock(members).turn(|_| true) else {
        return Err(delivery);
    };
    match turn.tx.send(delivery).await {
        Ok(()) => return Ok(()),
        Err(unsent) => delivery = unsent.0,
    }
    // That one left meanwhile: any other.
    let others = lock(members).list.clone();
    for member in others.iter().filter(|m| !Arc::ptr_eq(m, &turn)) {
        match member.tx.send(delivery).await {
            Ok(()) => return Ok(()),
            Err(unsent) => delivery = unsent.0,
        }
    }
    Err(delivery)
}

/// Room in the subscriptions' channels; waits for some when they are all full.
pub(super) async fn channel_room(members: &Mutex<Members>) -> usize {
    let (room, first) = {
        let members = lock(members);
        let room: usize = members.list.iter().map(|m| m.tx.capacity()).sum();
        (room, members.list.first().cloned())
    };
    if room > 0 {
        return room;
    }
    if let Some(first) = first {
        if let Ok(permit) = first.tx.reserve().await {
            drop(permit);
        }
    }
    1
}
