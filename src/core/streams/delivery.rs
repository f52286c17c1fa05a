//! A delivery and how it settles.
//!
//! A delivery is held by its consumer from the moment it is read until it is settled:
//! whether or not the handler's callback has returned, it is never handed to its own consumer
//! again, and (for a group) it is kept claimed so no sibling reclaims it. Only an ack or nack
//! ends the hold; or the in-flight timeout, which nacks on the handler's behalf; or the
//! process's end, after which a sibling reclaims the entry once it has been idle for
//! `reclaimIdleMs`.
//!
//! Settling never fails for the caller. A settle that cannot reach Redis (an outage, a
//! connection broken twice) answers [`Settled::Retrying`] and is sent again in the background
//! until it lands, the entry kept claimed meanwhile; every way of settling is safe to run
//! twice (an XACK, an ownership-checked script, an append that finds itself already done).

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, LazyLock, Mutex, OnceLock};
use std::time::{Duration, Instant};

use redis::{Script, Value};
use serde_json::{Map, Value as Json};
use tokio::sync::OwnedSemaphorePermit;

use super::event::{self, EVENT_FIELD};
use super::group::Consumer;
use super::{lock, publish, Shared};
use crate::core::connection::parse;
use crate::core::error::{LeaseError, Result};
use crate::core::log::{Level, Throttle};

static SETTLE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("settle.lua")));

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
    AlreadySettled,
    /// Redis could not be reached: the settle is sent again in the background until it
    /// lands, and the entry stays claimed by this consumer meanwhile.
    Retrying,
    /// The pubsub was closed: nothing was sent, and the entry stays pending for a sibling.
    Closed,
}

/// One event delivered to a subscriber. Ack or nack it once (further calls answer
/// [`Settled::AlreadySettled`]); until then its consumer holds it.
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
    pub fn event(&self) -> Map<String, Json> {
        event::object(&self.state.json).unwrap_or_default()
    }

    /// The event exactly as stored in the entry's `event` field.
    pub fn json(&self) -> &str {
        &self.state.json
    }

    /// [`Delivery::json`], shared rather than copied, for a caller that keeps it.
    pub fn shared_json(&self) -> Arc<str> {
        Arc::clone(&self.state.json)
    }

    /// The event's `deliveryAttempt` (1 when the producer did not set one).
    pub fn delivery_attempt(&self) -> u64 {
        self.state.attempt
    }

    /// The stream entry id (`<ms>-<seq>`).
    pub fn entry_id(&self) -> &str {
        &self.state.entry_id
    }

    /// The topic it was published to.
    pub fn topic(&self) -> &str {
        self.state.topic()
    }

    /// Acknowledges: a grouped entry is XACKed, so no consumer of the group gets it again.
    pub async fn ack(&self) -> Settled {
        settle(&self.shared, &self.state, Outcome::Ack).await
    }

    /// Rejects: appended again with `deliveryAttempt + 1` (and acked, for a group), or
    /// dropped with a warning once `maxDeliveryAttempts` is reached. Fan-out subscribers of
    /// this process that share the read and nack it too cause one redelivery, not several.
    pub async fn nack(&self) -> Settled {
        settle(&self.shared, &self.state, Outcome::Nack).await
    }

    /// The subscriber's callback has returned (or resolved) without settling. A group's
    /// delivery stays held until it is settled; a fan-out delivery, which holds nothing in
    /// Redis, is done: its place among `maxInFlight` is given back, and a later ack or nack
    /// changes nothing.
    pub fn returned(&self) {
        let state = &self.state;
        if matches!(state.origin, Origin::Fanout { .. }) && state.advance(HELD, DONE) {
            finish(&self.shared, state);
        }
    }

    /// Acks many deliveries in one round trip: one XACK per consumer, naming all its
    /// entries, the XACKs pipelined. Answers, in order, what [`Delivery::ack`] would have
    /// answered for each; a failed XACK is retried in the background for the deliveries it
    /// named, which answer [`Settled::Retrying`].
    pub async fn ack_all(deliveries: &[Delivery]) -> Vec<Settled> {
        let Some(shared) = deliveries.first().map(|d| Arc::clone(&d.shared)) else {
            return Vec::new();
        };
        let mut answers = vec![Settled::AlreadySettled; deliveries.len()];
        if shared.closed.load(Ordering::Acquire) {
            return vec![Settled::Closed; deliveries.len()];
        }
        // A group's entries go in its consumer's XACK; the rest (fan-out, which holds
        // nothing in Redis, or another pubsub's delivery) settle on their own.
        let mut xacks: Vec<(&Arc<Consumer>, Vec<usize>)> = Vec::new();
        let mut lone = Vec::new();
        for (i, delivery) in deliveries.iter().enumerate() {
            let state = &delivery.state;
            if !state.begin() {
                continue;
            }
            match &state.origin {
                Origin::Group(consumer) if Arc::ptr_eq(&delivery.shared, &shared) => {
                    match xacks.iter_mut().find(|(c, _)| Arc::ptr_eq(c, consumer)) {
                        Some((_, members)) => members.push(i),
                        None => xacks.push((consumer, vec![i])),
                    }
                }
                _ => lone.push(i),
            }
        }
        let mut pipe = redis::pipe();
        for (consumer, members) in &xacks {
            let cmd = pipe.cmd("XACK").arg(&consumer.key).arg(&consumer.group);
            for &i in members {
                cmd.arg(&deliveries[i].state.entry_id);
            }
        }
        let count = xacks.len();
        let batch = async {
            if count == 0 {
                return Ok(Vec::new());
            }
            // XACK twice is harmless: a connection that breaks under it costs nothing.
            shared
                .writer
                .run_again_if_broken(|mut c| {
                    let pipe = &pipe;
                    async move { c.send_packed_commands(pipe, 0, count).await }
                })
                .await
        };
        let singles = futures::future::join_all(lone.iter().map(|&i| async move {
            let delivery = &deliveries[i];
            (
                i,
                conclude(&delivery.shared, &delivery.state, Outcome::Ack).await,
            )
        }));
        let (replies, singles) = futures::join!(batch, singles);
        for (i, answer) in singles {
            answers[i] = answer;
        }
        for (k, (_, members)) in xacks.iter().enumerate() {
            let result = match &replies {
                Ok(replies) => match parse::<Value>(replies.get(k).cloned().unwrap_or_default()) {
                    Ok(_) => Ok(Settled::Acked),
                    // The stream or group is gone, and with it every pending entry.
                    Err(err) if err.code() == Some("NOGROUP") => Ok(Settled::Acked),
                    Err(err) => Err(shared.writer.sort(err)),
                },
                Err(err) => Err(err.clone()),
            };
            for &i in members {
                let state = &deliveries[i].state;
                answers[i] = match &result {
                    Ok(settled) => {
                        state.phase.store(DONE, Ordering::Release);
                        finish(&shared, state);
                        *settled
                    }
                    Err(err) => retry_later(&shared, state, Outcome::Ack, err),
                };
            }
        }
        answers
    }
}

/// What a settle asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Outcome {
    Ack,
    Nack,
    /// Nacked on the handler's behalf: it held the delivery past `inFlightTimeoutMs`.
    Expire,
    /// Give back unchanged: read, never handed to a subscriber.
    Release,
    /// Reclaimed past `maxDeliveryAttempts` (delivered that often and never settled):
    /// dropped with the nack cap's warning, never handed to a subscriber.
    Drop,
}

/// Read, waiting in a subscription's channel.
const QUEUED: u8 = 0;
/// Handed to the subscriber, not yet settled.
const HELD: u8 = 1;
/// A settle is on its way to Redis.
const SETTLING: u8 = 2;
/// A settle failed and is being sent again in the background.
const RETRYING: u8 = 3;
/// Settled (or given up because the pubsub closed).
const DONE: u8 = 4;

/// Where a delivery came from, and so how it settles.
pub(super) enum Origin {
    /// A consumer group: the entry is pending for this process's consumer until settled.
    Group(Arc<Consumer>),
    /// A fan-out read: nothing is held in Redis.
    Fanout {
        key: String,
        topic: String,
        /// Shared by the deliveries of one read entry to this process's fan-out subscribers
        /// of its topic: the first nack redelivers it to all of them, later ones need not.
        nacked: Arc<AtomicBool>,
    },
}

/// A delivery's state, shared by its handles, the registry of deliveries not yet settled,
/// and the tasks that settle it.
pub(crate) struct State {
    pub id: u64,
    origin: Origin,
    pub entry_id: String,
    /// Shared, not copied: most settles only need the entry id.
    json: Arc<str>,
    attempt: u64,
    phase: AtomicU8,
    /// When it was handed to the subscriber (for the in-flight timeout).
    taken_at: OnceLock<Instant>,
    /// This delivery's place among its consumer's `maxInFlight`, given back when it is done.
    permit: Mutex<Option<OwnedSemaphorePermit>>,
}

impl State {
    pub fn topic(&self) -> &str {
        match &self.origin {
            Origin::Group(consumer) => &consumer.topic,
            Origin::Fanout { topic, .. } => topic,
        }
    }

    fn key(&self) -> &str {
        match &self.origin {
            Origin::Group(consumer) => &consumer.key,
            Origin::Fanout { key, .. } => key,
        }
    }

    /// Moves from one phase to another; `false` if it was not in `from`.
    fn advance(&self, from: u8, to: u8) -> bool {
        self.phase
            .compare_exchange(from, to, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Claims the delivery for one settle; `false` if it is settling or settled already.
    fn begin(&self) -> bool {
        self.advance(HELD, SETTLING) || self.advance(QUEUED, SETTLING)
    }

    /// Marks a queued delivery as handed to its subscriber; `false` if it was settled
    /// meanwhile (released by an unsubscribe), and must not be handed out.
    pub fn take(&self) -> bool {
        let taken = self.advance(QUEUED, HELD);
        if taken {
            let _ = self.taken_at.set(Instant::now());
        }
        taken
    }

    /// How long it has been held by its subscriber, if it is held and not settling.
    pub fn held_for(&self, now: Instant) -> Option<Duration> {
        if self.phase.load(Ordering::Acquire) != HELD {
            return None;
        }
        self.taken_at
            .get()
            .map(|at| now.saturating_duration_since(*at))
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
        taken_at: OnceLock::new(),
        permit: Mutex::new(permit),
    });
    shared.deliveries().insert(id, Arc::clone(&state));
    Some(Delivery {
        shared: Arc::clone(shared),
        state,
    })
}

/// Settles a delivery that never reached a subscriber (released, or dropped at the cap).
pub(super) async fn settle_unread(delivery: &Delivery, outcome: Outcome) -> Settled {
    settle(&delivery.shared, &delivery.state, outcome).await
}

/// The held delivery with this id, if any.
pub(super) fn find(shared: &Arc<Shared>, id: u64) -> Option<Delivery> {
    let state = shared.deliveries().get(&id).cloned()?;
    (state.phase.load(Ordering::Acquire) == HELD).then(|| Delivery {
        shared: Arc::clone(shared),
        state,
    })
}

/// Settles a delivery, once: the first settle of it runs, later ones answer
/// [`Settled::AlreadySettled`].
pub(super) async fn settle(shared: &Arc<Shared>, state: &Arc<State>, outcome: Outcome) -> Settled {
    if shared.closed.load(Ordering::Acquire) {
        return Settled::Closed;
    }
    if !state.begin() {
        return Settled::AlreadySettled;
    }
    conclude(shared, state, outcome).await
}

/// Runs a settle [`State::begin`] claimed, and ends the hold once it landed; a transport
/// failure hands it to the background.
async fn conclude(shared: &Arc<Shared>, state: &Arc<State>, outcome: Outcome) -> Settled {
    // Fan-out subscribers of this process share a read: once one of them redelivered the
    // event, it reaches all of them again, so the others' nacks add nothing.
    if let (Origin::Fanout { nacked, .. }, Outcome::Nack | Outcome::Expire) =
        (&state.origin, outcome)
    {
        if nacked.swap(true, Ordering::AcqRel) {
            state.phase.store(DONE, Ordering::Release);
            finish(shared, state);
            return Settled::Redelivered {
                attempt: state.attempt.saturating_add(1),
            };
        }
    }
    if outcome == Outcome::Expire {
        shared.notice(
            Level::Warn,
            "a handler held an event past inFlightTimeoutMs; nacking it on its behalf",
            &[
                ("topic", state.topic().into()),
                ("entryId", state.entry_id.clone().into()),
                ("eventId", event_field(state, "id")),
                ("attempt", state.attempt.into()),
            ],
        );
    }
    match run(shared, state, outcome).await {
        Ok(settled) => {
            state.phase.store(DONE, Ordering::Release);
            finish(shared, state);
            settled
        }
        Err(err) => retry_later(shared, state, outcome, &err),
    }
}

/// Ends a settled delivery's hold: out of the registry, the consumer's hold on the entry
/// released, its `maxInFlight` place given back.
fn finish(shared: &Shared, state: &State) {
    shared.deliveries().remove(&state.id);
    if let Origin::Group(consumer) = &state.origin {
        consumer.release_hold(&state.entry_id, state.id);
    }
    lock(&state.permit).take();
}

/// Warnings about settles that failed: at most one every 30 s, per process.
static SETTLE_FAILURES: LazyLock<Throttle> = LazyLock::new(Throttle::default);

/// Reports a settle that could not reach Redis and sends it again in the background, with
/// backoff, until it lands or the pubsub closes. The entry stays held (and kept claimed)
/// meanwhile, so no sibling reclaims an event whose handler has finished with it.
fn retry_later(
    shared: &Arc<Shared>,
    state: &Arc<State>,
    outcome: Outcome,
    err: &LeaseError,
) -> Settled {
    state.phase.store(RETRYING, Ordering::Release);
    shared.throttled(
        &SETTLE_FAILURES,
        "could not settle an event; retrying in the background (it stays claimed meanwhile)",
        Some(err),
        &[
            ("topic", state.topic().into()),
            ("entryId", state.entry_id.clone().into()),
            ("settle", format!("{outcome:?}").to_lowercase().into()),
        ],
    );
    let (shared, state) = (Arc::clone(shared), Arc::clone(state));
    let runtime = shared.runtime.clone();
    runtime.spawn(async move {
        let mut delay = RETRY_MIN;
        loop {
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(RETRY_MAX);
            if shared.closed.load(Ordering::Acquire) {
                shared.notice(
                    Level::Debug,
                    "closed before a settle could land; the entry stays pending for a sibling",
                    &[
                        ("topic", state.topic().into()),
                        ("entryId", state.entry_id.clone().into()),
                    ],
                );
                return;
            }
            match run(&shared, &state, outcome).await {
                Ok(_) => {
                    state.phase.store(DONE, Ordering::Release);
                    finish(&shared, &state);
                    shared.notice(
                        Level::Debug,
                        "a settle that had failed landed",
                        &[
                            ("topic", state.topic().into()),
                            ("entryId", state.entry_id.clone().into()),
                        ],
                    );
                    return;
                }
                Err(err) => shared.throttled(
                    &SETTLE_FAILURES,
                    "could not settle an event; retrying in the background (it stays claimed \
                     meanwhile)",
                    Some(&err),
                    &[
                        ("topic", state.topic().into()),
                        ("entryId", state.entry_id.clone().into()),
                    ],
                ),
            }
        }
    });
    Settled::Retrying
}

const RETRY_MIN: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(5);

/// Sends one settle to Redis.
async fn run(shared: &Arc<Shared>, state: &State, outcome: Outcome) -> Result<Settled> {
    let result = match (&state.origin, outcome) {
        (Origin::Fanout { .. }, Outcome::Ack | Outcome::Release) => Ok(Settled::Acked),
        (Origin::Group(consumer), Outcome::Ack) => {
            let mut cmd = redis::cmd("XACK");
            cmd.arg(&consumer.key)
                .arg(&consumer.group)
                .arg(&state.entry_id);
            shared
                .writer
                .run_again_if_broken(|mut c| {
                    let cmd = &cmd;
                    async move { cmd.query_async::<Value>(&mut c).await }
                })
                .await
                .map(|_| Settled::Acked)
        }
        (_, Outcome::Release) => settle_owned(shared, state, &state.json).await.map(|owned| {
            if owned {
                Settled::Released
            } else {
                Settled::NotOwned
            }
        }),
        (_, Outcome::Nack | Outcome::Expire) => nack(shared, state, "nacked").await,
        (_, Outcome::Drop) => drop_at_cap(shared, state, "reclaimed").await,
    };
    // NOGROUP: the stream or group was deleted (clearTopic, TTL expiry), and with it every
    // pending entry. Nothing is left to settle or to redeliver.
    match result {
        Err(LeaseError::Server(err)) if err.code() == Some("NOGROUP") => Ok(match outcome {
            Outcome::Ack => Settled::Acked,
            _ => Settled::NotOwned,
        }),
        other => other,
    }
}

async fn nack(shared: &Arc<Shared>, state: &State, reason: &str) -> Result<Settled> {
    if shared
        .tuning
        .max_attempts
        .is_some_and(|max| state.attempt >= max)
    {
        return drop_at_cap(shared, state, reason).await;
    }
    let next = state.attempt.saturating_add(1);
    let payload = event::with_attempt(&state.json, next)?;
    match &state.origin {
        Origin::Group(_) => Ok(if settle_owned(shared, state, &payload).await? {
            Settled::Redelivered { attempt: next }
        } else {
            Settled::NotOwned
        }),
        Origin::Fanout { key, .. } => {
            publish::append_one(shared, key, payload).await?;
            Ok(Settled::Redelivered { attempt: next })
        }
    }
}

/// Acks the entry without appending it again (if still ours) and warns: the event used up
/// its delivery attempts. `reason` says how the last one ended (`nacked`, `reclaimed`).
async fn drop_at_cap(shared: &Arc<Shared>, state: &State, reason: &str) -> Result<Settled> {
    if state.is_group() && !settle_owned(shared, state, "").await? {
        return Ok(Settled::NotOwned);
    }
    shared.notice(
        Level::Warn,
        "dropping event after max delivery attempts",
        &[
            ("topic", state.topic().into()),
            ("eventId", event_field(state, "id")),
            ("eventType", event_field(state, "type")),
            ("attempt", state.attempt.into()),
            ("max", shared.tuning.max_attempts.into()),
            ("reason", reason.into()),
        ],
    );
    Ok(Settled::Dropped)
}

/// One field of the event, for a notice.
fn event_field(state: &State, name: &str) -> Json {
    event::object(&state.json)
        .and_then(|mut event| event.remove(name))
        .unwrap_or(Json::Null)
}

/// Runs `settle.lua`: appends `payload` (unless empty) and acks, if the entry is still this
/// consumer's. Answers whether it was.
async fn settle_owned(shared: &Arc<Shared>, state: &State, payload: &str) -> Result<bool> {
    let Origin::Group(consumer) = &state.origin else {
        return Ok(true);
    };
    let mut invocation = SETTLE.prepare_invoke();
    invocation
        .key(&consumer.key)
        .arg(&consumer.group)
        .arg(&consumer.name)
        .arg(&state.entry_id)
        .arg(payload)
        .arg(shared.tuning.ttl_ms)
        .arg(EVENT_FIELD);
    // Safe to run twice: a second run finds the entry settled (no longer ours) and changes
    // nothing, so a connection that breaks under it costs nothing.
    let owned: i64 = shared
        .writer
        .run_again_if_broken(|mut c| {
            let invocation = &invocation;
            async move { invocation.invoke_async(&mut c).await }
        })
        .await?;
    if owned == 1 && !payload.is_empty() {
        shared.appended(state.key(), 1);
    }
    Ok(owned == 1)
}
