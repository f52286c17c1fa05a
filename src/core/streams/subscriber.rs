//! Subscriptions: one reader task per subscription, deliveries on a Tokio channel, and the
//! ack / nack / redelivery / reclaim paths.
//!
//! Why a reader connection per subscription rather than one reader for the whole process:
//! a blocking XREADGROUP reads one consumer group, so subscriptions of different groups
//! cannot share a read, and changing the set of streams a shared blocking read waits on
//! means interrupting it from another connection (CLIENT UNBLOCK), which races with the
//! read being (re)sent. Per-subscription readers are what Mastra's backend does too, they
//! stop by simply dropping the connection, and one slow consumer never stalls another.
//! Everything that does not block shares the pubsub's one multiplexed connection.
//!
//! Grouped subscriptions (`group` set) are a Redis consumer group with one consumer per
//! subscription (`<group>-<uuid>`): XREADGROUP `>`, XACK on ack. Fan-out subscriptions use
//! plain XREAD from a position this task keeps, so they leave nothing behind in Redis (no
//! private groups to clean up after a crash); their ack is a no-op.
//!
//! A nack appends the event again with `deliveryAttempt + 1` and, for a group, acks the
//! original, atomically and only while this consumer still owns the entry (`settle.lua`).
//! At `maxDeliveryAttempts` the event is dropped with a warning. Entries another consumer
//! read and never settled (it crashed) are taken over with XAUTOCLAIM once idle long enough;
//! each takeover counts as a delivery (Redis's own delivery counter, read back in the same
//! script), so a message that kills every consumer reading it still reaches the cap and is
//! dropped there, acked, instead of circulating for ever.

use std::collections::hash_map::Entry::{Occupied, Vacant};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::{Script, Value};
use serde_json::{Map, Value as Json};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;

use super::event::{self, Entry};
use super::{Level, Shared, StartFrom, SubscribeOptions};
use crate::core::connection::parse;
use crate::core::error::{LeaseError, Result};

static SETTLE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("settle.lua")));
static RECLAIM: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("reclaim.lua")));
static KEEP: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("keep.lua")));

/// Deliveries read but not yet taken by `recv`, at least. Kept small: what sits here is read
/// (and, for a group, owned by this consumer) but not yet being handled; unsubscribe hands
/// it back.
const MIN_BUFFER: usize = 16;
/// Connection trouble is reported at `warn` at most this often per reader; every
/// occurrence is reported at `debug`. An outage otherwise floods the log.
const WARN_INTERVAL: Duration = Duration::from_secs(30);
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(2);
/// Most reads sent together while a group has a backlog (see [`read_commands`]).
const MAX_READ_AHEAD: usize = 8;

/// A subscription to one topic. Deliveries arrive through [`Subscription::recv`]. Dropping
/// it (or [`Subscription::unsubscribe`]) stops the reader; deliveries still buffered are
/// handed back to the group, unchanged.
pub struct Subscription {
    shared: Arc<Shared>,
    state: Arc<SubState>,
    rx: mpsc::Receiver<Delivery>,
}

impl std::fmt::Debug for Subscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscription")
            .field("topic", &self.state.topic)
            .field("group", &self.state.group)
            .finish_non_exhaustive()
    }
}

impl Subscription {
    /// The next delivery; `None` once the subscription was stopped (unsubscribe or the
    /// pubsub's close) and everything already read was taken.
    pub async fn recv(&mut self) -> Option<Delivery> {
        let delivery = self.rx.recv().await?;
        delivery.inner.handed_out.store(true, Ordering::Release);
        Some(delivery)
    }

    /// Takes up to `limit` deliveries at once, waiting for at least one; 0 means stopped.
    /// For a caller that forwards deliveries in batches.
    pub async fn recv_many(&mut self, buffer: &mut Vec<Delivery>, limit: usize) -> usize {
        let start = buffer.len();
        let count = self.rx.recv_many(buffer, limit).await;
        for delivery in &buffer[start..] {
            delivery.inner.handed_out.store(true, Ordering::Release);
        }
        count
    }

    /// The topic.
    pub fn topic(&self) -> &str {
        &self.state.topic
    }

    /// The consumer group, for a grouped subscription.
    pub fn group(&self) -> Option<&str> {
        self.state.group.as_ref().map(|g| g.name.as_str())
    }

    /// This subscription's consumer name in its group (`<group>-<uuid>`).
    pub fn consumer(&self) -> Option<&str> {
        self.state.group.as_ref().map(|g| g.consumer.as_str())
    }

    /// Stops the reader and hands deliveries still buffered back to the group (appended
    /// again unchanged, for a sibling), bounded by the command timeout. Deliveries already
    /// taken stay valid and can still be acked or nacked.
    pub async fn unsubscribe(mut self) {
        // The reader may be inside a blocking read whose entries the group already counts as
        // this consumer's: aborting it would strand them until a reclaim. Let it finish the
        // read (at most BLOCK + the command timeout), so what it read lands in the buffer
        // and is handed back below; abort only if it does not stop in that time.
        let task = self.state.stop_after_read();
        self.shared.remove_subscription(self.state.id);
        if let Some(mut task) = task {
            let bound = self
                .shared
                .tuning
                .block
                .saturating_add(self.shared.tuning.command_timeout);
            if tokio::time::timeout(bound, &mut task).await.is_err() {
                task.abort();
                let _ = task.await;
            }
        }
        self.rx.close();
        let mut buffered = Vec::new();
        while let Ok(delivery) = self.rx.try_recv() {
            buffered.push(delivery.inner.take_settlement());
        }
        let releases = buffered
            .into_iter()
            .flatten()
            .map(|settlement| settlement.run(Outcome::Release));
        let bound = self
            .shared
            .tuning
            .command_timeout
            .saturating_add(Duration::from_millis(100));
        let _ = tokio::time::timeout(bound, futures::future::join_all(releases)).await;
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.state.stop();
        self.shared.remove_subscription(self.state.id);
        // The receiver drops next: deliveries still in it release themselves (see Inner).
    }
}

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
    /// Nacked at `maxDeliveryAttempts`: dropped, and a warning went to the logger.
    Dropped,
    /// Handed back unchanged (it was read but never taken by the consumer).
    Released,
    /// Another consumer of the group took the entry over (it sat idle past the reclaim
    /// threshold), or this consumer handed it out again in a newer delivery, so this nack
    /// changed nothing; that delivery settles it.
    NotOwned,
    /// Settled earlier by another ack or nack of the same delivery: the first one counts.
    AlreadySettled,
}

/// One event delivered to a subscriber, with its settlement. Ack or nack it once (further
/// calls answer [`Settled::AlreadySettled`]). Dropping it, and every [`Acker`] of it,
/// without settling counts as a nack: the consumer failed.
pub struct Delivery {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Delivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Delivery")
            .field("topic", &self.inner.sub.topic)
            .field("entry_id", &self.inner.entry_id)
            .field("attempt", &self.inner.attempt)
            .finish_non_exhaustive()
    }
}

impl Delivery {
    /// The event, as published: a JSON object with `id`, `createdAt`, `deliveryAttempt`.
    /// Decoded from [`Delivery::json`] on each call.
    pub fn event(&self) -> Map<String, Json> {
        event::object(&self.inner.json).unwrap_or_default()
    }

    /// The event exactly as stored in the entry's `event` field.
    pub fn json(&self) -> &str {
        &self.inner.json
    }

    /// [`Delivery::json`], shared rather than copied, for a caller that keeps it.
    pub fn shared_json(&self) -> Arc<str> {
        Arc::clone(&self.inner.json)
    }

    /// The event's `deliveryAttempt` (1 when the producer did not set one).
    pub fn delivery_attempt(&self) -> u64 {
        self.inner.attempt
    }

    /// The stream entry id (`<ms>-<seq>`).
    pub fn entry_id(&self) -> &str {
        &self.inner.entry_id
    }

    /// The topic it was published to.
    pub fn topic(&self) -> &str {
        &self.inner.sub.topic
    }

    /// The consumer's handler has returned without settling this delivery: it is no longer
    /// kept claimed, so once idle for `reclaimIdleMs` a sibling's reclaim pass may take it
    /// over (an ack or nack made later still counts, if it comes first), and it no longer
    /// counts against `maxInFlight`. Dropped unsettled, it stays pending (no nack).
    pub fn handled(&self) {
        self.inner.let_go.store(true, Ordering::Release);
        if let Some(hold) = self.inner.sub.in_flight().get_mut(&self.inner.entry_id) {
            if hold.token == self.inner.token {
                hold.kept = false;
            }
        }
        self.inner
            .permit
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
    }

    /// A cloneable handle that acks or nacks this delivery, for a caller that settles it
    /// from elsewhere (two callbacks, say). The delivery counts as dropped only once the
    /// delivery and all its ackers are gone.
    pub fn acker(&self) -> Acker {
        Acker {
            inner: Arc::clone(&self.inner),
        }
    }

    /// Acknowledges: a grouped entry is XACKed, so no consumer of the group gets it again.
    pub async fn ack(&self) -> Result<Settled> {
        self.inner.settle(Outcome::Ack).await
    }

    /// Rejects: appended again with `deliveryAttempt + 1` (and acked, for a group), or
    /// dropped with a warning once `maxDeliveryAttempts` is reached.
    pub async fn nack(&self) -> Result<Settled> {
        self.inner.settle(Outcome::Nack).await
    }

    /// Acks many deliveries in one round trip: one XACK per subscription, naming all its
    /// entries, the XACKs pipelined. Answers, in order, what [`Delivery::ack`] would have
    /// answered for each; a failed XACK fails the deliveries it named, which stay pending.
    pub async fn ack_all(deliveries: &[Delivery]) -> Vec<Result<Settled>> {
        let Some(shared) = deliveries.first().map(|d| Arc::clone(&d.inner.shared)) else {
            return Vec::new();
        };
        let claimed: Vec<bool> = deliveries.iter().map(|d| d.inner.begin()).collect();
        let mut answers: Vec<Result<Settled>> = vec![Ok(Settled::AlreadySettled); deliveries.len()];
        // A group's entries go in its subscription's XACK; the rest (fan-out, which holds
        // nothing in Redis, or another pubsub's delivery) settle on their own.
        let mut xacks: Vec<(&SubState, Vec<usize>)> = Vec::new();
        let mut lone = Vec::new();
        for (i, delivery) in deliveries.iter().enumerate().filter(|(i, _)| claimed[*i]) {
            let inner = &delivery.inner;
            if inner.sub.group.is_none() || !Arc::ptr_eq(&inner.shared, &shared) {
                lone.push(i);
                continue;
            }
            match xacks.iter_mut().find(|(sub, _)| sub.id == inner.sub.id) {
                Some((_, members)) => members.push(i),
                None => xacks.push((&inner.sub, vec![i])),
            }
        }
        let mut pipe = redis::pipe();
        for (sub, members) in &xacks {
            if let Some(group) = &sub.group {
                let cmd = pipe.cmd("XACK").arg(&sub.key).arg(&group.name);
                for &i in members {
                    cmd.arg(&deliveries[i].inner.entry_id);
                }
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
            (
                i,
                deliveries[i]
                    .inner
                    .settlement()
                    .run_checked(Outcome::Ack)
                    .await,
            )
        }));
        let (replies, singles) = futures::join!(batch, singles);
        for (i, answer) in singles {
            answers[i] = answer;
        }
        for (k, (_, members)) in xacks.iter().enumerate() {
            let answer = match &replies {
                Ok(replies) => match parse::<Value>(replies.get(k).cloned().unwrap_or_default()) {
                    Ok(_) => Ok(Settled::Acked),
                    // The stream or group is gone, and with it every pending entry.
                    Err(err) if err.code() == Some("NOGROUP") => Ok(Settled::Acked),
                    Err(err) => Err(shared.writer.sort(err)),
                },
                Err(err) => Err(err.clone()),
            };
            for &i in members {
                answers[i] = answer.clone();
            }
        }
        for (i, delivery) in deliveries.iter().enumerate().filter(|(i, _)| claimed[*i]) {
            let inner = &delivery.inner;
            if answers[i].is_ok() {
                inner.sub.release_hold(&inner.entry_id, inner.token);
            }
            inner.end(Outcome::Ack, &answers[i]);
        }
        answers
    }
}

/// Acks or nacks one [`Delivery`]; cloneable. See [`Delivery::acker`].
#[derive(Clone)]
pub struct Acker {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Acker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Acker")
            .field("entry_id", &self.inner.entry_id)
            .finish_non_exhaustive()
    }
}

impl Acker {
    /// As [`Delivery::ack`].
    pub async fn ack(&self) -> Result<Settled> {
        self.inner.settle(Outcome::Ack).await
    }

    /// As [`Delivery::nack`].
    pub async fn nack(&self) -> Result<Settled> {
        self.inner.settle(Outcome::Nack).await
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Ack,
    Nack,
    /// Give back unchanged: read, never handed to the consumer.
    Release,
    /// Reclaimed past `maxDeliveryAttempts` (it was delivered that often and never settled):
    /// dropped with the nack cap's warning, never handed to the consumer.
    Drop,
}

const PENDING: u8 = 0;
const BUSY: u8 = 1;
const DONE: u8 = 2;

struct Inner {
    shared: Arc<Shared>,
    sub: Arc<SubState>,
    entry_id: String,
    /// Shared, not copied: every settlement carries it, and most only need the entry id.
    json: Arc<str>,
    attempt: u64,
    state: AtomicU8,
    handed_out: AtomicBool,
    /// The consumer acked but the ack did not reach Redis: the event was handled, so a drop
    /// retries the ack instead of counting as a failure.
    ack_failed: AtomicBool,
    /// Its handler returned without settling it: dropping it leaves it pending.
    let_go: AtomicBool,
    /// Which delivery of the entry this is, for the subscription's holds (see [`Hold`]).
    token: u64,
    /// This delivery's place among the subscription's `maxInFlight`; given back when the
    /// delivery is gone or its handler let it go.
    permit: Mutex<Option<OwnedSemaphorePermit>>,
}

impl Inner {
    /// What settling this entry needs, detached from the delivery (the event is shared).
    fn settlement(&self) -> Settlement {
        Settlement {
            shared: Arc::clone(&self.shared),
            sub: Arc::clone(&self.sub),
            entry_id: self.entry_id.clone(),
            json: Arc::clone(&self.json),
            attempt: self.attempt,
            token: self.token,
        }
    }

    async fn settle(&self, outcome: Outcome) -> Result<Settled> {
        if !self.begin() {
            return Ok(Settled::AlreadySettled);
        }
        let result = self.settlement().run_checked(outcome).await;
        self.end(outcome, &result);
        result
    }

    /// Claims the delivery for one settlement; `false` if another ack or nack has it.
    fn begin(&self) -> bool {
        self.state
            .compare_exchange(PENDING, BUSY, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Ends the settlement [`Inner::begin`] claimed. A transport failure leaves the entry
    /// pending: the caller may try again. If it never does, dropping the delivery retries a
    /// failed ack, and nacks otherwise (ownership-checked, no duplicate).
    fn end(&self, outcome: Outcome, result: &Result<Settled>) {
        if result.is_err() && outcome == Outcome::Ack {
            self.ack_failed.store(true, Ordering::Release);
        }
        let next = if result.is_ok() { DONE } else { PENDING };
        self.state.store(next, Ordering::Release);
    }

    /// Claims the settlement for a caller that settles on this delivery's behalf.
    fn take_settlement(&self) -> Option<Settlement> {
        self.state
            .compare_exchange(PENDING, DONE, Ordering::AcqRel, Ordering::Acquire)
            .ok()?;
        Some(self.settlement())
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if *self.state.get_mut() != PENDING {
            return;
        }
        if *self.let_go.get_mut() && !*self.ack_failed.get_mut() {
            // Its handler returned without settling it (`Delivery::handled`): it stays
            // pending, for a reclaim pass, unless a reclaim already handed it out again.
            let mut in_flight = self.sub.in_flight();
            if in_flight
                .get(&self.entry_id)
                .is_some_and(|hold| hold.token == self.token && !hold.kept)
            {
                in_flight.remove(&self.entry_id);
            }
            return;
        }
        // Never taken by the consumer (a stopped subscription's buffer): hand it back as
        // it was. Acked, but the ack was lost: ack again. Taken and abandoned: the consumer
        // failed, which is a nack.
        let outcome = if *self.ack_failed.get_mut() {
            Outcome::Ack
        } else if *self.handed_out.get_mut() {
            Outcome::Nack
        } else {
            Outcome::Release
        };
        if outcome == Outcome::Release && self.sub.group.is_none() {
            return; // fan-out: nothing is held in Redis
        }
        let settlement = self.settlement();
        let runtime = self.shared.runtime.clone();
        runtime.spawn(async move {
            let _ = settlement.run(outcome).await;
        });
    }
}

/// Everything needed to settle an entry, detached from the delivery.
struct Settlement {
    shared: Arc<Shared>,
    sub: Arc<SubState>,
    entry_id: String,
    json: Arc<str>,
    attempt: u64,
    token: u64,
}

impl Settlement {
    /// Settles and reports a failure to the logger (for settlements nobody awaits).
    async fn run(self, outcome: Outcome) -> Result<Settled> {
        let shared = Arc::clone(&self.shared);
        let sub = Arc::clone(&self.sub);
        let (entry_id, token) = (self.entry_id.clone(), self.token);
        let topic = self.sub.topic.clone();
        let result = self.run_checked(outcome).await;
        if let Err(err) = &result {
            // Nobody holds this delivery any more: let a reclaim pass (ours included)
            // hand the entry out again once it is idle.
            sub.release_hold(&entry_id, token);
            shared.notice(
                Level::Warn,
                "could not settle an abandoned delivery; it stays pending for reclaim",
                &[("topic", topic.into()), ("err", err.full_message().into())],
            );
        }
        result
    }

    async fn run_checked(self, outcome: Outcome) -> Result<Settled> {
        let shared = &self.shared;
        let sub = &self.sub;
        // This consumer's own reclaim pass handed the entry out again (its handler had let
        // it go): that newer delivery settles it. An ack still acks; anything else here
        // would append a duplicate of an event being handled.
        if outcome != Outcome::Ack && sub.superseded(&self.entry_id, self.token) {
            return Ok(Settled::NotOwned);
        }
        let result = match (outcome, &sub.group) {
            (Outcome::Ack, None) | (Outcome::Release, None) => Ok(Settled::Acked),
            (Outcome::Ack, Some(group)) => {
                let mut cmd = redis::cmd("XACK");
                cmd.arg(&sub.key).arg(&group.name).arg(&self.entry_id);
                shared
                    .writer
                    .run_again_if_broken(|mut c| {
                        let cmd = &cmd;
                        async move { cmd.query_async::<Value>(&mut c).await }
                    })
                    .await
                    .map(|_| Settled::Acked)
            }
            (Outcome::Release, Some(_)) => self.settle_owned(&self.json).await.map(|owned| {
                if owned {
                    Settled::Released
                } else {
                    Settled::NotOwned
                }
            }),
            (Outcome::Nack, _) => self.nack().await,
            (Outcome::Drop, _) => self.drop_at_cap("reclaimed").await,
        };
        // NOGROUP: the stream or group was deleted (clearTopic, TTL expiry), and with it
        // every pending entry. Nothing is left to settle or to redeliver.
        let result = match result {
            Err(LeaseError::Server(err)) if err.code() == Some("NOGROUP") => Ok(match outcome {
                Outcome::Ack => Settled::Acked,
                Outcome::Nack | Outcome::Release | Outcome::Drop => Settled::NotOwned,
            }),
            other => other,
        };
        if result.is_ok() {
            sub.release_hold(&self.entry_id, self.token);
        }
        result
    }

    async fn nack(&self) -> Result<Settled> {
        let shared = &self.shared;
        let sub = &self.sub;
        if shared
            .tuning
            .max_attempts
            .is_some_and(|max| self.attempt >= max)
        {
            return self.drop_at_cap("nacked").await;
        }
        let next = self.attempt.saturating_add(1);
        let payload = event::with_attempt(&self.json, next)?;
        match sub.group {
            Some(_) => Ok(if self.settle_owned(&payload).await? {
                Settled::Redelivered { attempt: next }
            } else {
                Settled::NotOwned
            }),
            None => {
                let mut pipe = redis::pipe();
                let mut replies = 0;
                let at = shared.append(&mut pipe, &sub.key, &payload, &mut replies);
                let values = shared
                    .writer
                    .run(|mut c| async move { c.send_packed_commands(&pipe, 0, replies).await })
                    .await?;
                let value = values.into_iter().nth(at).unwrap_or_default();
                super::appended_id(value).map_err(|err| shared.writer.sort(err))?;
                Ok(Settled::Redelivered { attempt: next })
            }
        }
    }

    /// Acks the entry without appending it again (if still ours) and warns: the event used up
    /// its delivery attempts. `reason` says how the last one ended (`nacked`, `reclaimed`).
    async fn drop_at_cap(&self, reason: &str) -> Result<Settled> {
        let shared = &self.shared;
        let sub = &self.sub;
        let settled = match sub.group {
            Some(_) => self.settle_owned("").await?,
            None => true,
        };
        if !settled {
            return Ok(Settled::NotOwned);
        }
        let event = event::object(&self.json).unwrap_or_default();
        shared.notice(
            Level::Warn,
            "dropping event after max delivery attempts",
            &[
                ("topic", sub.topic.clone().into()),
                ("eventId", event.get("id").cloned().unwrap_or(Json::Null)),
                (
                    "eventType",
                    event.get("type").cloned().unwrap_or(Json::Null),
                ),
                ("attempt", self.attempt.into()),
                ("max", shared.tuning.max_attempts.into()),
                ("reason", reason.into()),
            ],
        );
        Ok(Settled::Dropped)
    }

    /// Runs `settle.lua`: appends `payload` (unless empty) and acks, if still ours.
    async fn settle_owned(&self, payload: &str) -> Result<bool> {
        let shared = &self.shared;
        let sub = &self.sub;
        let Some(group) = &sub.group else {
            return Ok(true);
        };
        let mut invocation = SETTLE.prepare_invoke();
        invocation
            .key(&sub.key)
            .arg(&group.name)
            .arg(&group.consumer)
            .arg(&self.entry_id)
            .arg(payload)
            .arg(shared.tuning.ttl_ms)
            .arg(shared.tuning.max_len);
        // Safe to run twice: a second run finds the entry settled (no longer ours) and
        // changes nothing, so a connection that breaks under it costs nothing.
        let owned: i64 = shared
            .writer
            .run_again_if_broken(|mut c| {
                let invocation = &invocation;
                async move { invocation.invoke_async(&mut c).await }
            })
            .await?;
        Ok(owned == 1)
    }
}

/// A grouped entry read and not yet settled: which delivery of it holds it (a reclaim by
/// this very consumer can hand an entry out again once its handler let it go), and whether
/// it is kept claimed (its handler is running, or it waits in the buffer; see
/// [`keep_claimed`]).
#[derive(Debug, Clone, Copy)]
struct Hold {
    kept: bool,
    token: u64,
}

/// A consumer group and this subscription's consumer in it.
#[derive(Debug)]
pub(crate) struct Group {
    pub name: String,
    pub consumer: String,
}

/// Where a reader is: for fan-out the id to XREAD after; for a group the last entry read
/// (where to recreate the group after NOGROUP) and the anchor used before any.
#[derive(Debug)]
struct Cursor {
    position: Option<String>,
    /// For a group, the event `id` of the entry at `position`: after NOGROUP, tells the
    /// stream we read from apart from one re-created under the same key.
    position_event: Option<String>,
    anchor: &'static str,
    /// Bumped by clearTopic: a read issued before it is discarded, its position is stale.
    epoch: u64,
}

/// A subscription's state, shared by its handle, its reader task and its deliveries.
pub(crate) struct SubState {
    pub id: u64,
    pub topic: String,
    pub key: String,
    pub group: Option<Group>,
    cursor: Mutex<Cursor>,
    /// Grouped entries delivered and not yet settled, so a reclaim pass (which also claims
    /// this consumer's own idle entries) never hands the consumer one it is handling; each
    /// with which delivery holds it and whether it is still kept claimed.
    in_flight: Mutex<HashMap<String, Hold>>,
    /// Numbers the deliveries of this subscription (see [`Hold`]).
    next_token: AtomicU64,
    task: Mutex<Option<JoinHandle<()>>>,
    stopped: AtomicBool,
    /// `maxInFlight` places: each delivery holds one until it is gone or let go.
    room: Option<Arc<Semaphore>>,
}

impl SubState {
    fn cursor(&self) -> MutexGuard<'_, Cursor> {
        self.cursor.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn in_flight(&self) -> MutexGuard<'_, HashMap<String, Hold>> {
        self.in_flight.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Ends delivery `token`'s hold on `entry`; a newer delivery's hold stays.
    fn release_hold(&self, entry: &str, token: u64) {
        let mut in_flight = self.in_flight();
        if in_flight.get(entry).is_some_and(|hold| hold.token == token) {
            in_flight.remove(entry);
        }
    }

    /// Whether a newer delivery than `token` holds `entry` now.
    fn superseded(&self, entry: &str, token: u64) -> bool {
        self.in_flight()
            .get(entry)
            .is_some_and(|hold| hold.token != token)
    }

    /// Aborts the reader task; returns it so the caller may wait for it to be gone.
    pub fn stop(&self) -> Option<JoinHandle<()>> {
        self.stopped.store(true, Ordering::Release);
        let task = self.task.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(task) = &task {
            task.abort();
        }
        task
    }

    /// Asks the reader to stop once its current read is delivered; nothing is aborted.
    pub fn stop_after_read(&self) -> Option<JoinHandle<()>> {
        self.stopped.store(true, Ordering::Release);
        self.task.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    /// The stream was deleted (clearTopic): stream ids can restart below our position, so
    /// read the new stream from its start.
    pub fn restart(&self) {
        let mut cursor = self.cursor();
        cursor.position = self.group.is_none().then(|| "0-0".to_owned());
        cursor.position_event = None;
        cursor.anchor = "0";
        cursor.epoch += 1;
    }
}

/// Creates the group (or resolves the fan-out position), registers the subscription and
/// starts its reader.
pub(crate) async fn open(
    shared: Arc<Shared>,
    topic: &str,
    options: SubscribeOptions,
) -> Result<Subscription> {
    let key = shared.stream_key(topic);
    let anchor = match options.start_from {
        StartFrom::Earliest => "0",
        StartFrom::Latest => "$",
    };
    let (group, position) = match options.group {
        Some(name) => {
            create_group(&shared, &key, &name, anchor).await?;
            shared.keeper.call_once(|| {
                shared.runtime.spawn(keep_claimed(Arc::downgrade(&shared)));
            });
            let consumer = format!("{name}-{}", event::uuid_v4()?);
            (Some(Group { name, consumer }), None)
        }
        None => {
            let position = match options.start_from {
                StartFrom::Earliest => "0-0".to_owned(),
                // `$` is relative to each call, so a loop of XREAD $ would miss entries
                // appended between reads: pin the current last id instead.
                StartFrom::Latest => last_entry_id(&shared, &key).await?,
            };
            (None, Some(position))
        }
    };
    let state = Arc::new(SubState {
        id: shared.next_subscription.fetch_add(1, Ordering::Relaxed),
        topic: topic.to_owned(),
        key,
        group,
        cursor: Mutex::new(Cursor {
            position,
            position_event: None,
            anchor,
            epoch: 0,
        }),
        in_flight: Mutex::new(HashMap::new()),
        next_token: AtomicU64::new(0),
        task: Mutex::new(None),
        stopped: AtomicBool::new(false),
        room: shared
            .tuning
            .max_in_flight
            .map(|n| Arc::new(Semaphore::new(n.min(Semaphore::MAX_PERMITS)))),
    });
    // Room for several reads, so the reader can ask for a full COUNT while the consumer still
    // works through the previous batch (measured in bench/streams.mjs at 64 in flight: 8.0
    // entries per XREADGROUP with room for 16, 10.0 with room for 40).
    let (tx, rx) = mpsc::channel((shared.tuning.batch_count * 4).max(MIN_BUFFER));
    shared.add_subscription(Arc::clone(&state));
    let task = shared
        .runtime
        .spawn(read_loop(Arc::clone(&shared), Arc::clone(&state), tx));
    *state.task.lock().unwrap_or_else(|p| p.into_inner()) = Some(task);
    // close() may have run between the check in subscribe and the registration above.
    if shared.closed.load(Ordering::Acquire) {
        state.stop();
        shared.remove_subscription(state.id);
    }
    Ok(Subscription { shared, state, rx })
}

/// XGROUP CREATE ... MKSTREAM (with PEXPIRE in the same MULTI when an idle TTL is set, so
/// a stream created only by a subscribe still expires). An existing group (BUSYGROUP)
/// keeps its position, which is what a second subscriber of the group wants.
async fn create_group(shared: &Shared, key: &str, group: &str, at: &str) -> Result<()> {
    let ttl = shared.tuning.ttl_ms;
    let mut pipe = redis::pipe();
    if ttl > 0 {
        pipe.cmd("MULTI");
    }
    pipe.cmd("XGROUP")
        .arg("CREATE")
        .arg(key)
        .arg(group)
        .arg(at)
        .arg("MKSTREAM");
    let count = if ttl > 0 {
        pipe.cmd("PEXPIRE").arg(key).arg(ttl).cmd("EXEC");
        4
    } else {
        1
    };
    let values = shared
        .writer
        .run(|mut c| async move { c.send_packed_commands(&pipe, 0, count).await })
        .await?;
    let reply = match values.into_iter().last() {
        Some(Value::Array(inner)) if ttl > 0 => inner.into_iter().next().unwrap_or_default(),
        Some(other) => other,
        None => Value::Nil,
    };
    match parse::<Value>(reply) {
        Ok(_) => Ok(()),
        Err(err) if err.code() == Some("BUSYGROUP") => Ok(()),
        Err(err) => Err(shared.writer.sort(err)),
    }
}

/// The greatest entry of the stream at or below `id`, with its event `id` (if it has one).
async fn greatest_at_or_below(
    shared: &Shared,
    key: &str,
    id: &str,
) -> Result<Option<(String, Option<String>)>> {
    let mut cmd = redis::cmd("XREVRANGE");
    cmd.arg(key).arg(id).arg("-").arg("COUNT").arg(1);
    let reply = shared
        .writer
        .run(|mut c| async move { cmd.query_async::<Value>(&mut c).await })
        .await?;
    let wrapped = Value::Array(vec![Value::Array(vec![Value::Nil, reply])]);
    Ok(event::read_reply(wrapped).pop().map(|entry| {
        let event = entry.event.and_then(event::parse);
        (entry.id, event.as_ref().and_then(event_id))
    }))
}

/// The `id` field of a parsed event.
fn event_id(parsed: &event::Parsed) -> Option<String> {
    parsed.id.clone()
}

/// The id of the stream's last entry, `0-0` when it is empty or missing.
async fn last_entry_id(shared: &Shared, key: &str) -> Result<String> {
    let mut cmd = redis::cmd("XREVRANGE");
    cmd.arg(key).arg("+").arg("-").arg("COUNT").arg(1);
    let reply = shared
        .writer
        .run(|mut c| async move { cmd.query_async::<Value>(&mut c).await })
        .await?;
    let wrapped = Value::Array(vec![Value::Array(vec![Value::Nil, reply])]);
    Ok(event::read_reply(wrapped)
        .pop()
        .map_or_else(|| "0-0".to_owned(), |entry| entry.id))
}

/// `now + delay`, without the overflow panic of `+` for an absurdly long delay.
fn later(delay: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(delay)
        .or_else(|| now.checked_add(Duration::from_secs(365 * 86_400)))
        .unwrap_or(now)
}

/// Exponential backoff between failed reads, so an outage never becomes a hot loop.
struct Backoff(Duration);

impl Backoff {
    fn next(&mut self) -> Duration {
        let delay = self.0;
        self.0 = (self.0 * 2).min(BACKOFF_MAX);
        delay
    }

    fn reset(&mut self) {
        self.0 = BACKOFF_MIN;
    }
}

/// Reports every failure at debug, and at warn at most once per [`WARN_INTERVAL`].
struct Throttle(Option<Instant>);

impl Throttle {
    fn report(&mut self, shared: &Shared, sub: &SubState, message: &str, err: &str) {
        let now = Instant::now();
        let warn = self
            .0
            .is_none_or(|last| now.duration_since(last) >= WARN_INTERVAL);
        if warn {
            self.0 = Some(now);
        }
        let level = if warn { Level::Warn } else { Level::Debug };
        shared.notice(
            level,
            message,
            &[("topic", sub.topic.clone().into()), ("err", err.into())],
        );
    }
}

/// The reader: reads, hands entries to the channel, reclaims idle entries, recovers from
/// NOGROUP and reconnects. Runs until aborted or until the subscription is dropped.
async fn read_loop(shared: Arc<Shared>, sub: Arc<SubState>, tx: mpsc::Sender<Delivery>) {
    let tuning = shared.tuning.clone();
    let mut connection: Option<MultiplexedConnection> = None;
    let mut backoff = Backoff(BACKOFF_MIN);
    let mut throttle = Throttle(None);
    // The first pass runs at once: a new consumer picks up what a crashed one left.
    let mut reclaim_at = Instant::now();
    let mut reclaim_cursor = "0-0".to_owned();
    // The last read came back full: more is likely waiting, so read ahead without blocking.
    let mut backlog = false;
    // After the reader's connection broke, a read may have run whose reply was lost: its
    // entries are pending for this consumer, which never saw them. Until this consumer's own
    // pending entries have been read back (from this id on), reads read those.
    let mut history: Option<String> = None;
    loop {
        if sub.stopped.load(Ordering::Acquire) {
            return;
        }
        // Read only what the channel can take, so a read never waits on the consumer and
        // nothing read sits in this task.
        match tx.reserve().await {
            Ok(permit) => drop(permit),
            Err(_) => return,
        }
        let mut free = tx.capacity().max(1);
        if let Some(places) = &sub.room {
            // At `maxInFlight`: wait until a delivery is settled or let go.
            if places.available_permits() == 0 && places.acquire().await.is_err() {
                return;
            }
            free = free.min(places.available_permits().max(1));
        }
        let room = free.min(tuning.batch_count);

        if let (Some(group), Some(interval)) = (&sub.group, tuning.reclaim_interval) {
            if Instant::now() >= reclaim_at {
                match reclaim(&shared, &sub, group, &reclaim_cursor, room).await {
                    Ok((cursor, entries)) => {
                        // A cursor other than 0-0 means more to scan: continue promptly.
                        reclaim_at = if cursor == "0-0" {
                            later(interval)
                        } else {
                            Instant::now()
                        };
                        reclaim_cursor = cursor;
                        if !deliver(&shared, &sub, entries, &tx, Source::Reclaim).await {
                            return;
                        }
                    }
                    Err(err) => {
                        reclaim_at = later(interval);
                        // NOGROUP is the read's to recover from; anything else is trouble.
                        if !matches!(&err, LeaseError::Server(e) if e.code() == Some("NOGROUP")) {
                            throttle.report(
                                &shared,
                                &sub,
                                "reclaim pass failed",
                                &err.full_message(),
                            );
                        }
                    }
                }
                continue;
            }
        }

        let mut conn = match connection.take() {
            Some(conn) => conn,
            None => match connect(&shared).await {
                Ok(conn) => conn,
                Err(err) => {
                    throttle.report(&shared, &sub, "reader cannot connect; retrying", &err);
                    tokio::time::sleep(backoff.next()).await;
                    continue;
                }
            },
        };
        let (pipe, reads, epoch) = read_commands(&shared, &sub, free, backlog, history.as_deref());
        let outcome = tokio::time::timeout(
            tuning.block.saturating_add(tuning.command_timeout),
            read_all(&mut conn, &pipe, reads),
        )
        .await;
        match outcome {
            Ok(Ok(entries)) => {
                connection = Some(conn);
                backoff.reset();
                if sub.cursor().epoch != epoch {
                    history = None;
                    continue; // read from a stream clearTopic deleted meanwhile
                }
                let full = entries.len() >= reads * room;
                let source = if history.is_some() {
                    // Read back until a read comes back short.
                    history = entries.last().filter(|_| full).map(|e| e.id.clone());
                    Source::History
                } else {
                    backlog = sub.group.is_some() && full;
                    Source::Read
                };
                if !deliver(&shared, &sub, entries, &tx, source).await {
                    return;
                }
            }
            Ok(Err(err)) if err.code() == Some("NOGROUP") => {
                connection = Some(conn);
                recover_group(&shared, &sub).await;
                // Grows only if recovery keeps failing (a successful read resets it).
                tokio::time::sleep(backoff.next()).await;
            }
            Ok(Err(err)) => {
                // A server error (READONLY, WRONGTYPE, OOM) leaves the connection usable;
                // anything else may have broken it.
                if matches!(err.kind(), redis::ErrorKind::Server(_)) {
                    connection = Some(conn);
                } else if sub.group.is_some() {
                    history = Some("0".to_owned());
                }
                let message = LeaseError::from_redis(err, tuning.command_timeout).full_message();
                throttle.report(&shared, &sub, "read failed; retrying", &message);
                tokio::time::sleep(backoff.next()).await;
            }
            Err(_) => {
                // No answer past BLOCK + timeout: frozen or unreachable. A fresh connection
                // is the only way to know; the old one may never answer.
                throttle.report(&shared, &sub, "read timed out; reconnecting", "timeout");
                if sub.group.is_some() {
                    history = Some("0".to_owned());
                }
                tokio::time::sleep(backoff.next()).await;
            }
        }
    }
}

async fn connect(shared: &Shared) -> std::result::Result<MultiplexedConnection, String> {
    let bound = shared
        .tuning
        .connect_timeout
        .saturating_add(shared.tuning.command_timeout);
    let attempt = shared
        .client
        .get_multiplexed_async_connection_with_config(&shared.reader_config);
    match tokio::time::timeout(bound, attempt).await {
        Ok(Ok(conn)) => Ok(conn),
        Ok(Err(err)) => Err(LeaseError::from_redis(err, bound).full_message()),
        Err(_) => Err(LeaseError::Timeout(bound).full_message()),
    }
}

/// The next read: XREADGROUP for a group (`>`: entries never delivered to any consumer of
/// it), XREAD from the kept position for fan-out, each of at most `batchCount` entries.
///
/// Normally one read that blocks until entries arrive. While a group has a backlog (the last
/// read came back full), as many reads as the channel has room for go out together in one
/// round trip, none blocking: a consumer keeps up with a producer at `free / batchCount`
/// times the rate of one read per round trip, and never holds more than its channel's room.
/// (Fan-out reads from a position, so reads sent together would return the same entries.)
/// With `history`, one read, not blocking, of this consumer's own pending entries after that
/// id: after a broken connection, what a read whose reply was lost had taken.
/// Returns the pipeline, how many reads it holds, and the cursor epoch they belong to.
fn read_commands(
    shared: &Shared,
    sub: &SubState,
    free: usize,
    backlog: bool,
    history: Option<&str>,
) -> (redis::Pipeline, usize, u64) {
    let batch = shared.tuning.batch_count;
    let reads = if backlog && history.is_none() && sub.group.is_some() {
        (free / batch).clamp(1, MAX_READ_AHEAD)
    } else {
        1
    };
    let block = super::duration_ms(shared.tuning.block);
    let cursor = sub.cursor();
    let mut pipe = redis::pipe();
    for _ in 0..reads {
        let cmd = match &sub.group {
            Some(group) => pipe
                .cmd("XREADGROUP")
                .arg("GROUP")
                .arg(&group.name)
                .arg(&group.consumer),
            None => pipe.cmd("XREAD"),
        };
        cmd.arg("COUNT").arg(free.min(batch));
        if !backlog && history.is_none() {
            cmd.arg("BLOCK").arg(block);
        }
        cmd.arg("STREAMS").arg(&sub.key);
        match &sub.group {
            // This consumer's own pending entries after `history`, or new ones.
            Some(_) => cmd.arg(history.unwrap_or(">")),
            None => cmd.arg(cursor.position.as_deref().unwrap_or("0-0")),
        };
    }
    (pipe, reads, cursor.epoch)
}

/// Sends the reads and gathers their entries, in order. A read that failed ends the batch:
/// what the reads before it returned is delivered (the next read meets the error again, if
/// it lasts), and the error is the answer only when nothing was read. Entries a read after
/// it returned stay pending for this consumer until a reclaim hands them out.
async fn read_all(
    conn: &mut MultiplexedConnection,
    pipe: &redis::Pipeline,
    reads: usize,
) -> redis::RedisResult<Vec<Entry>> {
    let replies = conn.send_packed_commands(pipe, 0, reads).await?;
    let mut entries = Vec::new();
    for reply in replies {
        match parse::<Value>(reply) {
            Ok(reply) => entries.extend(event::read_reply(reply)),
            Err(err) if entries.is_empty() => return Err(err),
            Err(_) => break,
        }
    }
    Ok(entries)
}

/// After NOGROUP (stream or group deleted: clearTopic elsewhere, TTL expiry, FLUSHALL),
/// recreate the group after the last entry this subscription read, so entries appended
/// since are delivered; before any read, at the subscription's own anchor.
///
/// The key may now hold another stream: deleted and re-created by another process (its
/// clearTopic, then a publish). A re-created stream numbers entries from the current time
/// again, so within the millisecond of our position its first entries have ids at or below
/// it, and a group created there would skip them. So the stream is checked first (one
/// XREVRANGE, on this rare path only): when the greatest entry at or below our position is
/// the very entry we last read (same id, same event `id`), it is the same stream and the
/// group resumes after it; when the stream holds nothing at or below our position, starting
/// at `0` is the same as starting there, and also right for a stream re-created moments ago
/// whose first entries are yet to come; anything else means a new stream, read from its
/// start. (If the entry we last read was XDELed from the old stream, this reads the old
/// stream's earlier entries again: at least once, never lost.)
async fn recover_group(shared: &Shared, sub: &SubState) {
    let Some(group) = &sub.group else { return };
    let (position, seen_event) = {
        let cursor = sub.cursor();
        (cursor.position.clone(), cursor.position_event.clone())
    };
    let at = match position {
        None => sub.cursor().anchor.to_owned(),
        Some(position) => match greatest_at_or_below(shared, &sub.key, &position).await {
            Ok(None) => "0".to_owned(),
            Ok(Some((id, event))) if id == position && event == seen_event => position,
            Ok(Some(_)) => {
                shared.notice(
                    Level::Debug,
                    "the stream was re-created; reading it from its start",
                    &[("topic", sub.topic.clone().into())],
                );
                "0".to_owned()
            }
            // Cannot tell: resume after our position, as before (the create will likely fail
            // the same way and be retried).
            Err(_) => position,
        },
    };
    match create_group(shared, &sub.key, &group.name, &at).await {
        Ok(()) => shared.notice(
            Level::Debug,
            "recreated consumer group after NOGROUP",
            &[
                ("topic", sub.topic.clone().into()),
                ("group", group.name.clone().into()),
            ],
        ),
        Err(err) => shared.notice(
            Level::Debug,
            "consumer group re-create failed",
            &[
                ("topic", sub.topic.clone().into()),
                ("err", err.full_message().into()),
            ],
        ),
    }
}

/// One XAUTOCLAIM step (`reclaim.lua`): takes over up to `count` entries of the group idle
/// for at least the reclaim threshold, starting at `cursor`, each with the number of times
/// Redis has now delivered it. One round trip, whatever the batch.
async fn reclaim(
    shared: &Shared,
    sub: &SubState,
    group: &Group,
    cursor: &str,
    count: usize,
) -> Result<(String, Vec<Entry>)> {
    let mut invocation = RECLAIM.prepare_invoke();
    invocation
        .key(&sub.key)
        .arg(&group.name)
        .arg(&group.consumer)
        .arg(shared.tuning.reclaim_idle_ms)
        .arg(cursor)
        .arg(count);
    let reply: Value = shared
        .writer
        .run(|mut c| async move { invocation.invoke_async(&mut c).await })
        .await?;
    Ok(event::reclaim_reply(reply))
}

/// Most entry ids one `keep.lua` call names.
const KEEP_CHUNK: usize = 500;

/// Keeps the entries this pubsub's consumers are handling claimed: every third of
/// `reclaimIdleMs` it resets their idle time (`keep.lua`, which leaves alone any entry a
/// sibling already took over), so a handler slower than the threshold never has its event
/// reclaimed and handled a second time while it still runs, nor its `deliveryAttempt`
/// raised. Only a consumer that stops keeping — its process died or froze, or its handler
/// returned without settling ([`Delivery::handled`]) — has its entries reclaimed.
/// Started by the pubsub's first grouped subscription; ends with the pubsub (closed or
/// dropped).
async fn keep_claimed(shared: Weak<Shared>) {
    let Some(every) = shared
        .upgrade()
        .map(|s| Duration::from_millis((s.tuning.reclaim_idle_ms / 3).max(1)))
    else {
        return;
    };
    let mut throttle = Throttle(None);
    loop {
        tokio::time::sleep(every).await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        if shared.closed.load(Ordering::Acquire) {
            return;
        }
        let subs: Vec<Arc<SubState>> = shared.subscriptions().values().cloned().collect();
        let mut calls = Vec::new();
        for sub in &subs {
            let Some(group) = &sub.group else { continue };
            let kept: Vec<String> = sub
                .in_flight()
                .iter()
                .filter(|(_, hold)| hold.kept)
                .map(|(id, _)| id.clone())
                .collect();
            for ids in kept.chunks(KEEP_CHUNK) {
                let mut invocation = KEEP.prepare_invoke();
                invocation
                    .key(&sub.key)
                    .arg(&group.name)
                    .arg(&group.consumer)
                    .arg(ids);
                calls.push((sub, invocation));
            }
        }
        let runs = calls.into_iter().map(|(sub, invocation)| {
            let writer = &shared.writer;
            async move {
                let run =
                    writer.run(|mut c| async move { invocation.invoke_async::<i64>(&mut c).await });
                (sub, run.await)
            }
        });
        for (sub, result) in futures::future::join_all(runs).await {
            match result {
                Ok(_) => {}
                // The stream or group is gone, and with it every pending entry.
                Err(LeaseError::Server(err)) if err.code() == Some("NOGROUP") => {}
                Err(err) => throttle.report(
                    &shared,
                    sub,
                    "could not keep the events being handled claimed; a sibling may reclaim them",
                    &err.full_message(),
                ),
            }
        }
    }
}

/// Where entries handed to [`deliver`] come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// A read of new entries (`>`, or fan-out's position): the cursor moves past them.
    Read,
    /// This consumer's own pending entries read back after a broken connection: only those
    /// it never handed out are delivered.
    History,
    /// A reclaim pass: entries idle past the threshold, this consumer's own among them.
    Reclaim,
}

/// Hands entries to the channel. Returns `false` once the subscription is gone.
///
/// A reclaimed entry was delivered `deliveries` times by Redis, each a consumer that never
/// settled it: its attempt is the one it was appended with plus the deliveries after the
/// first, and the event handed out carries that `deliveryAttempt`. Past the cap it is
/// dropped (acked, with the cap's warning) instead of handed out.
async fn deliver(
    shared: &Arc<Shared>,
    sub: &Arc<SubState>,
    entries: Vec<Entry>,
    tx: &mpsc::Sender<Delivery>,
    source: Source,
) -> bool {
    let mut drops = Vec::new();
    let mut open = true;
    for entry in entries {
        let parsed = entry.event.and_then(event::parse);
        if source == Source::Read {
            let mut cursor = sub.cursor();
            cursor.position = Some(entry.id.clone());
            if sub.group.is_some() {
                cursor.position_event = parsed.as_ref().and_then(event_id);
            }
        }
        let Some(mut parsed) = parsed else {
            malformed(shared, sub, &entry.id).await;
            continue;
        };
        // A reclaim pass also claims this consumer's own idle entries: those still being
        // handled are not handed out twice.
        let token = sub.next_token.fetch_add(1, Ordering::Relaxed);
        if sub.group.is_some() {
            let hold = Hold { kept: true, token };
            match sub.in_flight().entry(entry.id.clone()) {
                // Its handler returned without settling it (`Delivery::handled`): this
                // reclaim delivers it again, as a sibling's would.
                Occupied(mut slot) if !slot.get().kept && source == Source::Reclaim => {
                    slot.insert(hold);
                }
                Occupied(_) => continue,
                Vacant(slot) => {
                    slot.insert(hold);
                }
            };
        }
        let attempt = parsed
            .attempt
            .saturating_add(entry.deliveries.saturating_sub(1));
        if attempt != parsed.attempt {
            // A map with string keys always serialises; were it not to, the stored JSON
            // (with the older attempt) is still the event.
            if let Ok(json) = event::with_attempt(&parsed.json, attempt) {
                parsed.json = json;
            }
        }
        // The reader read no more than there were places; were one missing all the same,
        // the entry is handed out rather than held back.
        let permit = sub
            .room
            .as_ref()
            .and_then(|places| Arc::clone(places).try_acquire_owned().ok());
        let delivery = Delivery {
            inner: Arc::new(Inner {
                shared: Arc::clone(shared),
                sub: Arc::clone(sub),
                entry_id: entry.id,
                json: Arc::from(parsed.json),
                attempt,
                state: AtomicU8::new(PENDING),
                handed_out: AtomicBool::new(false),
                ack_failed: AtomicBool::new(false),
                let_go: AtomicBool::new(false),
                token,
                permit: Mutex::new(permit),
            }),
        };
        if shared.tuning.max_attempts.is_some_and(|max| attempt > max) {
            if let Some(settlement) = delivery.inner.take_settlement() {
                drops.push(settlement.run(Outcome::Drop));
            }
            continue;
        }
        if tx.send(delivery).await.is_err() {
            open = false;
            break;
        }
    }
    // Concurrent over the multiplexed connection: one round trip for the whole batch.
    futures::future::join_all(drops).await;
    open
}

/// An entry without a usable `event` field can never be handled: warn, and for a group
/// ack it so it does not come back forever.
async fn malformed(shared: &Shared, sub: &SubState, id: &str) {
    shared.notice(
        Level::Warn,
        "malformed entry (no JSON object in its event field); dropping it",
        &[("topic", sub.topic.clone().into()), ("entryId", id.into())],
    );
    if let Some(group) = &sub.group {
        let mut cmd = redis::cmd("XACK");
        cmd.arg(&sub.key).arg(&group.name).arg(id);
        if let Err(err) = shared
            .writer
            .run(|mut c| async move { cmd.query_async::<Value>(&mut c).await })
            .await
        {
            shared.notice(
                Level::Debug,
                "ack of a malformed entry failed",
                &[
                    ("topic", sub.topic.clone().into()),
                    ("err", err.full_message().into()),
                ],
            );
        }
    }
}
