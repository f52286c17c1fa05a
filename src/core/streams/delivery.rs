//! A delivery, and the table of those held (`settle.rs` has how one settles).
//!
//! A delivery is held by its consumer from the moment it is read until it is settled:
//! whether or not the handler's callback has returned, it is never handed to its own consumer
//! again, and (for a group) it is kept claimed so no sibling reclaims it. Only an ack or nack
//! ends the hold; or the in-flight timeout, which nacks on the handler's behalf; or the
//! process's end, after which a sibling reclaims the entry once it has been idle for
//! `reclaimIdleMs`.
//!
//! A handler that works long may say it is alive ([`Delivery::extend`]): the in-flight timeout
//! counts again from then, and a group's entry has its idle time in Redis reset, if it is
//! still this consumer's. The hold itself needs no heartbeat: the keeper keeps every held
//! entry claimed anyway; `extend` is what lets a live handler outlast `inFlightTimeoutMs`.
//!
//! Settling never fails for the caller. A settle that cannot reach Redis (an outage, a
//! connection broken twice) answers [`Settled::Retrying`] and is sent again in the background
//! until it lands, the entry kept claimed meanwhile; every way of settling is safe to run
//! twice (an XACK, an ownership-checked script, an append that finds itself already done).

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::OwnedSemaphorePermit;

use super::group::Consumer;
use super::{reclaim, Shared};
use crate::core::error::Error;
use crate::core::lock;

/// How a delivery ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    /// Acked: the group will not deliver the entry again.
    Acked,
    /// Nacked and appended again with this `deliveryAttempt`.
    Redelivered {
        /// The attempt number the redelivery carries.
        attempt: u64,
    },
    /// Nacked at `maxDeliveryAttempts` (or reclaimed past it): dropped, with a warning.
    Dropped,
    /// Handed back unchanged (it was read but never handed to a subscriber).
    Released,
    /// The entry was no longer this consumer's (another consumer of the group took it over
    /// while this one was gone, or the stream was deleted), so this settle changed nothing.
    NotOwned,
    /// Settled earlier (by another ack or nack of it, or by the in-flight timeout): the
    /// first one counts.
    Already,
    /// Redis could not be reached: the settle is sent again in the background until it
    /// lands, and the entry stays claimed by this consumer meanwhile.
    Retrying,
    /// The pubsub was closed: nothing was sent, and the entry stays pending for a sibling.
    Closed,
}

/// What [`Delivery::extend`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Extended {
    /// The in-flight timeout counts from now; a group's entry had its idle time reset.
    Kept,
    /// The in-flight timeout counts from now, but the entry is no longer this consumer's in
    /// Redis (a sibling took it over, or the stream was deleted): nothing changed there.
    NotOwned,
    /// The in-flight timeout counts from now, but Redis could not be reached to reset the
    /// entry's idle time (the keeper's next pass keeps it claimed, as for every held entry).
    Unreachable,
    /// Not held (settled, being settled, or never handed out): nothing changed.
    NotHeld,
    /// The pubsub was closed: nothing changed.
    Closed,
}

/// One event delivered to a subscriber. Ack or nack it once (further calls answer
/// [`Settled::Already`]); until then its consumer holds it.
#[derive(Clone)]
pub struct Delivery {
    pub(super) shared: Arc<Shared>,
    pub(super) state: Arc<State>,
}

impl std::fmt::Debug for Delivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Delivery")
            .field("id", &self.state.id)
            .field("topic", &self.state.topic())
            .field("entry_id", &self.state.entry_id)
            .field("attempt", &self.state.attempt)
            .finish_non_exhaustive()
    }
}

impl Delivery {
    /// Identifies the delivery while it is held: [`super::StreamsPubSub::delivery`] finds it.
    pub fn id(&self) -> u64 {
        self.state.id
    }

    /// The event, as published: a JSON object with `id`, `createdAt`, `deliveryAttempt`.
    /// Decoded from [`Delivery::json`] on each call.
    #[cfg(test)]
    pub fn event(&self) -> serde_json::Map<String, serde_json::Value> {
        super::event::object(&self.state.json).unwrap_or_default()
    }

    /// The event exactly as stored in the entry's `event` field.
    #[cfg(test)]
    pub fn json(&self) -> &str {
        &self.state.json
    }

    /// [`Delivery::json`], shared rather than copied, for a caller that keeps it.
    pub fn shared_json(&self) -> Arc<str> {
        Arc::clone(&self.state.json)
    }

    /// The event's `deliveryAttempt` (1 when the producer did not set one).
    #[cfg(test)]
    pub fn delivery_attempt(&self) -> u64 {
        self.state.attempt
    }

    /// The stream entry id (`<ms>-<seq>`).
    #[cfg(test)]
    pub fn entry_id(&self) -> &str {
        &self.state.entry_id
    }

    /// The handler is alive and still working on it: the in-flight timeout (if set) counts
    /// from now, and a group's entry has its idle time in Redis reset (`keep.lua`), only if
    /// it is still this consumer's, so a late heartbeat never takes an entry back from a
    /// sibling. Does nothing once settled. Bounded by the command timeout; never fails (a
    /// Redis that cannot be reached answers [`Extended::Unreachable`]).
    pub async fn extend(&self) -> Extended {
        let (shared, state) = (&self.shared, &self.state);
        if shared.closed.load(Ordering::Acquire) {
            return Extended::Closed;
        }
        if !state.touch() {
            return Extended::NotHeld;
        }
        let Origin::Group(consumer) = &state.origin else {
            return Extended::Kept;
        };
        let ids = std::slice::from_ref(&state.entry_id);
        match reclaim::keep(shared.front(), consumer, ids).await {
            Ok(kept) if kept > 0 => Extended::Kept,
            Ok(_) => Extended::NotOwned,
            // The stream or group is gone, and with it every pending entry.
            Err(Error::Server(err)) if err.code() == Some("NOGROUP") => Extended::NotOwned,
            Err(_) => Extended::Unreachable,
        }
    }
}

/// Read, waiting in a subscription's channel.
pub(super) const QUEUED: u8 = 0;
/// Handed to the subscriber, not yet settled.
pub(super) const HELD: u8 = 1;
/// A settle is on its way to Redis.
pub(super) const SETTLING: u8 = 2;
/// A settle failed and is being sent again in the background.
pub(super) const RETRYING: u8 = 3;
/// Settled (or given up because the pubsub closed).
pub(super) const DONE: u8 = 4;

/// Where a delivery came from, and so how it settles.
pub(super) enum Origin {
    /// A consumer group: the entry is pending for this process's consumer until settled.
    Group(Arc<Consumer>),
    /// A fan-out read: nothing is held in Redis.
    Fanout { key: String, topic: String },
}

/// A delivery's state, shared by its handles, the registry of deliveries not yet settled,
/// and the tasks that settle it.
pub(crate) struct State {
    pub id: u64,
    pub(super) origin: Origin,
    pub entry_id: String,
    /// Shared, not copied: most settles only need the entry id.
    pub(super) json: Arc<str>,
    pub(super) attempt: u64,
    pub(super) phase: AtomicU8,
    /// When it was handed to the subscriber, or its handler last said it was alive
    /// ([`Delivery::extend`]): what the in-flight timeout counts from.
    held_since: Mutex<Option<Instant>>,
    /// This delivery's place among its consumer's `maxInFlight`, given back when it is done.
    pub(super) permit: Mutex<Option<OwnedSemaphorePermit>>,
}

impl State {
    pub fn topic(&self) -> &str {
        match &self.origin {
            Origin::Group(consumer) => &consumer.topic,
            Origin::Fanout { topic, .. } => topic,
        }
    }

    pub(super) fn key(&self) -> &str {
        match &self.origin {
            Origin::Group(consumer) => &consumer.key,
            Origin::Fanout { key, .. } => key,
        }
    }

    /// Moves from one phase to another; `false` if it was not in `from`.
    pub(super) fn advance(&self, from: u8, to: u8) -> bool {
        self.phase
            .compare_exchange(from, to, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Claims the delivery for one settle; `false` if it is settling or settled already.
    pub(super) fn begin(&self) -> bool {
        self.advance(HELD, SETTLING) || self.advance(QUEUED, SETTLING)
    }

    /// Marks a queued delivery as handed to its subscriber; `false` if it was settled
    /// meanwhile (released by an unsubscribe), and must not be handed out.
    pub fn take(&self) -> bool {
        let taken = self.advance(QUEUED, HELD);
        if taken {
            *lock(&self.held_since) = Some(Instant::now());
        }
        taken
    }

    /// Counts the hold from now; `false` if it is not held (settled, or settling).
    fn touch(&self) -> bool {
        let mut since = lock(&self.held_since);
        if self.phase.load(Ordering::Acquire) != HELD {
            return false;
        }
        *since = Some(Instant::now());
        true
    }

    /// How long it has been held by its subscriber, if it is held and not settling.
    pub fn held_for(&self, now: Instant) -> Option<Duration> {
        if self.phase.load(Ordering::Acquire) != HELD {
            return None;
        }
        lock(&self.held_since).map(|at| now.saturating_duration_since(at))
    }

    pub fn is_group(&self) -> bool {
        matches!(self.origin, Origin::Group(_))
    }
}

/// Makes a delivery of an entry read from Redis and registers it, with (for a group) the
/// consumer's hold on the entry. `None` when the consumer holds the entry already: a reclaim
/// pass or a read-back found an entry this process is still handling.
pub(super) fn register(
    shared: &Arc<Shared>,
    origin: Origin,
    entry_id: String,
    json: Arc<str>,
    attempt: u64,
    permit: Option<OwnedSemaphorePermit>,
) -> Option<Delivery> {
    let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
    if let Origin::Group(consumer) = &origin {
        if !consumer.hold(&entry_id, id) {
            return None;
        }
    }
    let state = Arc::new(State {
        id,
        origin,
        entry_id,
        json,
        attempt,
        phase: AtomicU8::new(QUEUED),
        held_since: Mutex::new(None),
        permit: Mutex::new(permit),
    });
    shared.deliveries().insert(id, Arc::clone(&state));
    Some(Delivery {
        shared: Arc::clone(shared),
        state,
    })
}

/// A delivery made only to be settled, never registered nor handed out: its event as the
/// subscriber passes it back (its attempt read from it), its entry unknown.
pub(super) fn settling(shared: &Arc<Shared>, origin: Origin, json: Arc<str>) -> Arc<State> {
    let attempt = super::event::head(&json).map_or(1, |(_, attempt)| attempt);
    Arc::new(State {
        id: shared.next_id.fetch_add(1, Ordering::Relaxed),
        origin,
        entry_id: String::new(),
        json,
        attempt,
        phase: AtomicU8::new(SETTLING),
        held_since: Mutex::new(None),
        permit: Mutex::new(None),
    })
}

/// The held delivery with this id, if any.
pub(super) fn find(shared: &Arc<Shared>, id: u64) -> Option<Delivery> {
    let state = shared.deliveries().get(&id).cloned()?;
    (state.phase.load(Ordering::Acquire) == HELD).then(|| Delivery {
        shared: Arc::clone(shared),
        state,
    })
}
