//! How a delivery settles (`Delivery::ack`, `nack`, `returned`, `ack_each`): ack, nack,
//! redelivery and the attempt cap, a hand-back of what was never handed out, and settles
//! that could not reach Redis, sent again in the background until they land. Every way of
//! settling is safe to run twice: an XACK, an ownership-checked script (`settle.lua`), an
//! append that first looks for itself.

use std::hash::{Hash, Hasher};
use std::sync::atomic::Ordering;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use redis::Value;
use serde_json::Value as Json;

use super::delivery::{Delivery, Origin, Settled, State, DONE, HELD, RETRYING};
use super::event::{self, EVENT_FIELD};
use super::group::Consumer;
use super::{delivery, publish, Shared, StreamsPubSub};
use crate::core::connection::{parse, slot, Connection};
use crate::core::error::{Error, Result};
use crate::core::lock;
use crate::core::log::{Level, Throttle};
use crate::core::scripts;

/// What a settle asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Settle {
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

/// Settles a delivery, once, on `via`: the first settle of it runs, later ones answer
/// [`Settled::Already`].
pub(super) async fn settle(
    shared: &Arc<Shared>,
    via: &Connection,
    state: &Arc<State>,
    outcome: Settle,
) -> Settled {
    if shared.closed.load(Ordering::Acquire) {
        return Settled::Closed;
    }
    if !state.begin() {
        return Settled::Already;
    }
    conclude(shared, via, state, outcome).await
}

/// Runs a settle [`State::begin`] claimed, on `via` (the caller's connection for a settle
/// the caller made, the writer for the transport's own), and ends the hold once it landed;
/// a transport failure hands it to the background, on the writer. `close` waits for it
/// either way.
pub(super) async fn conclude(
    shared: &Arc<Shared>,
    via: &Connection,
    state: &Arc<State>,
    outcome: Settle,
) -> Settled {
    let on_its_way = OnItsWay::new(shared);
    // Every fan-out subscriber of this process gets an event: once one of them redelivered
    // it, it reaches all of them again, so the others' nacks of it add nothing.
    if let (Origin::Fanout { key, .. }, Settle::Nack | Settle::Expire) = (&state.origin, outcome) {
        if !shared.first_fanout_nack(key, state) {
            state.phase.store(DONE, Ordering::Release);
            finish(shared, state);
            return Settled::Redelivered {
                attempt: state.attempt.saturating_add(1),
            };
        }
    }
    if outcome == Settle::Expire {
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
    match run(shared, via, state, outcome).await {
        Ok(settled) => {
            state.phase.store(DONE, Ordering::Release);
            finish(shared, state);
            settled
        }
        // Closed meanwhile: nothing more reaches Redis, and the entry stays pending there.
        Err(Error::Closed(_)) => {
            state.phase.store(DONE, Ordering::Release);
            finish(shared, state);
            Settled::Closed
        }
        Err(err) => retry_later(shared, state, outcome, &err, on_its_way),
    }
}

/// A settle on its way to Redis, its first send or its retries: `close` waits until none is
/// left (within a bound), so what a caller settled before closing lands before the
/// connection goes.
pub(super) struct OnItsWay(Arc<Shared>);

impl OnItsWay {
    pub(super) fn new(shared: &Arc<Shared>) -> Self {
        shared.settling.send_modify(|n| *n += 1);
        Self(Arc::clone(shared))
    }
}

impl Drop for OnItsWay {
    fn drop(&mut self) {
        self.0.settling.send_modify(|n| *n = n.saturating_sub(1));
    }
}

/// Ends a settled delivery's hold: out of the registry, the consumer's hold on the entry
/// released, its `maxInFlight` place given back.
pub(super) fn finish(shared: &Shared, state: &State) {
    shared.deliveries().remove(&state.id);
    if let Origin::Group(consumer) = &state.origin {
        consumer.release_hold(&state.entry_id, state.id);
    }
    lock(&state.permit).take();
}

/// Warnings about settles that failed: at most one every 30 s, per process.
static SETTLE_FAILURES: LazyLock<Throttle> = LazyLock::new(Throttle::default);

/// Reports a settle that could not reach Redis and sends it again in the background, with
/// backoff, until it lands. The entry stays held (and kept claimed) meanwhile, so no sibling
/// reclaims an event whose handler has finished with it. Once the pubsub closes it is sent
/// one last time at once, and `close` waits for that (`on_its_way`); if that fails too, the
/// entry stays pending for a sibling to reclaim, and a warning says so.
pub(super) fn retry_later(
    shared: &Arc<Shared>,
    state: &Arc<State>,
    outcome: Settle,
    err: &Error,
    on_its_way: OnItsWay,
) -> Settled {
    state.phase.store(RETRYING, Ordering::Release);
    let fields = move |state: &State| -> Vec<(&'static str, Json)> {
        vec![
            ("topic", state.topic().into()),
            ("entryId", state.entry_id.clone().into()),
            ("settle", format!("{outcome:?}").to_lowercase().into()),
        ]
    };
    shared.throttled(
        &SETTLE_FAILURES,
        "could not settle an event; retrying in the background (it stays claimed meanwhile)",
        Some(err),
        &fields(state),
    );
    let (shared, state) = (Arc::clone(shared), Arc::clone(state));
    let runtime = shared.runtime.clone();
    runtime.spawn(async move {
        let _on_its_way = on_its_way;
        let mut closing = shared.closing.subscribe();
        let mut delay = RETRY_MIN;
        loop {
            let last = tokio::select! {
                _ = tokio::time::sleep(delay) => shared.closed.load(Ordering::Acquire),
                _ = closing.wait_for(|closing| *closing) => true,
            };
            delay = (delay * 2).min(RETRY_MAX);
            match run(&shared, &shared.writer, &state, outcome).await {
                Ok(_) => {
                    state.phase.store(DONE, Ordering::Release);
                    finish(&shared, &state);
                    shared.notice(
                        Level::Debug,
                        "a settle that had failed landed",
                        &fields(&state),
                    );
                    return;
                }
                Err(err) if last => {
                    state.phase.store(DONE, Ordering::Release);
                    finish(&shared, &state);
                    let mut fields = fields(&state);
                    fields.push(("code", err.code().into()));
                    fields.push(("err", err.full_message().into()));
                    shared.notice(
                        Level::Warn,
                        "closed before a settle could reach Redis; the entry stays pending, for \
                         a sibling to reclaim after reclaimIdleMs",
                        &fields,
                    );
                    return;
                }
                Err(err) => shared.throttled(
                    &SETTLE_FAILURES,
                    "could not settle an event; retrying in the background (it stays claimed \
                     meanwhile)",
                    Some(&err),
                    &fields(&state),
                ),
            }
        }
    });
    Settled::Retrying
}

const RETRY_MIN: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(5);

/// Sends one settle to Redis, on `via`.
async fn run(
    shared: &Arc<Shared>,
    via: &Connection,
    state: &State,
    outcome: Settle,
) -> Result<Settled> {
    let result = match (&state.origin, outcome) {
        (Origin::Fanout { .. }, Settle::Ack | Settle::Release) => Ok(Settled::Acked),
        (Origin::Group(consumer), Settle::Ack) => {
            let mut cmd = redis::cmd("XACK");
            cmd.arg(&consumer.key)
                .arg(&consumer.group)
                .arg(&state.entry_id);
            via.run_again_if_broken(|mut c| {
                let cmd = &cmd;
                async move { cmd.query_async::<Value>(&mut c).await }
            })
            .await
            .map(|_| Settled::Acked)
        }
        (_, Settle::Release) => settle_owned(shared, via, state, &state.json)
            .await
            .map(|owned| {
                if owned {
                    Settled::Released
                } else {
                    Settled::NotOwned
                }
            }),
        (_, Settle::Nack | Settle::Expire) => nack(shared, via, state, "nacked").await,
        (_, Settle::Drop) => drop_at_cap(shared, via, state, "reclaimed").await,
    };
    // NOGROUP: the stream or group was deleted (clearTopic, TTL expiry), and with it every
    // pending entry. Nothing is left to settle or to redeliver.
    match result {
        Err(Error::Server(err)) if err.code() == Some("NOGROUP") => Ok(match outcome {
            Settle::Ack => Settled::Acked,
            _ => Settled::NotOwned,
        }),
        other => other,
    }
}

async fn nack(
    shared: &Arc<Shared>,
    via: &Connection,
    state: &State,
    reason: &str,
) -> Result<Settled> {
    if used_up(shared, state.attempt) {
        return drop_at_cap(shared, via, state, reason).await;
    }
    let next = state.attempt.saturating_add(1);
    let payload = event::with_attempt(&state.json, next)?;
    match &state.origin {
        Origin::Group(_) => Ok(if settle_owned(shared, via, state, &payload).await? {
            Settled::Redelivered { attempt: next }
        } else {
            Settled::NotOwned
        }),
        Origin::Fanout { key, .. } => {
            publish::append_one(shared, via, key, payload).await?;
            Ok(Settled::Redelivered { attempt: next })
        }
    }
}

/// Whether an event nacked at `attempt` has used up its delivery attempts: it is dropped,
/// not delivered again.
pub(super) fn used_up(shared: &Shared, attempt: u64) -> bool {
    shared
        .options
        .max_delivery_attempts
        .is_some_and(|max| attempt >= max)
}

/// Acks the entry without appending it again (if still ours) and warns: the event used up
/// its delivery attempts. `reason` says how the last one ended (`nacked`, `reclaimed`).
async fn drop_at_cap(
    shared: &Arc<Shared>,
    via: &Connection,
    state: &State,
    reason: &str,
) -> Result<Settled> {
    if state.is_group() && !settle_owned(shared, via, state, "").await? {
        return Ok(Settled::NotOwned);
    }
    let event = Dropped {
        topic: state.topic(),
        id: event_field(state, "id"),
        kind: event_field(state, "type"),
        attempt: state.attempt,
        reason,
        local_only: false,
    };
    warn_dropped(shared, event);
    Ok(Settled::Dropped)
}

/// An event dropped at `maxDeliveryAttempts`, as its warning describes it.
pub(crate) struct Dropped<'a> {
    pub topic: &'a str,
    /// The event's `id` and `type`, as published (`null` when missing).
    pub id: Json,
    pub kind: Json,
    pub attempt: u64,
    /// How the last attempt ended: `nacked` or `reclaimed`.
    pub reason: &'a str,
    /// Published with `localOnly`, so it never reached Redis.
    pub local_only: bool,
}

/// The one warning for an event dropped at the attempt cap, wherever it was dropped.
pub(super) fn warn_dropped(shared: &Shared, event: Dropped<'_>) {
    let mut fields = vec![
        ("topic", event.topic.into()),
        ("eventId", event.id),
        ("eventType", event.kind),
        ("attempt", event.attempt.into()),
        ("max", shared.options.max_delivery_attempts.into()),
        ("reason", event.reason.into()),
    ];
    if event.local_only {
        fields.push(("localOnly", true.into()));
    }
    shared.notice(
        Level::Warn,
        "dropping event after max delivery attempts",
        &fields,
    );
}

/// One field of the event, for a notice.
fn event_field(state: &State, name: &str) -> Json {
    event::object(&state.json)
        .and_then(|mut event| event.remove(name))
        .unwrap_or(Json::Null)
}

/// Runs `settle.lua`: appends `payload` (unless empty) and acks, if the entry is still this
/// consumer's. Answers whether it was.
async fn settle_owned(
    shared: &Arc<Shared>,
    via: &Connection,
    state: &State,
    payload: &str,
) -> Result<bool> {
    let Origin::Group(consumer) = &state.origin else {
        return Ok(true);
    };
    let mut invocation = scripts::SETTLE.script().prepare_invoke();
    invocation
        .key(&consumer.key)
        .arg(&consumer.group)
        .arg(&consumer.name)
        .arg(&state.entry_id)
        .arg(payload)
        .arg(shared.options.idle_ttl_ms())
        .arg(EVENT_FIELD);
    // Safe to run twice: a second run finds the entry settled (no longer ours) and changes
    // nothing, so a connection that breaks under it costs nothing.
    let owned: i64 = via
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

/// Settling, as a delivery's holder asks for it.
impl Delivery {
    /// Acknowledges: a grouped entry is XACKed, so no consumer of the group gets it again.
    #[cfg(test)]
    pub async fn ack(&self) -> Settled {
        settle(&self.shared, self.shared.front(), &self.state, Settle::Ack).await
    }

    /// Rejects: appended again with `deliveryAttempt + 1` (and acked, for a group), or
    /// dropped with a warning once `maxDeliveryAttempts` is reached. Fan-out subscribers of
    /// this process that share the read and nack it too cause one redelivery, not several.
    pub async fn nack(&self) -> Settled {
        settle(&self.shared, self.shared.front(), &self.state, Settle::Nack).await
    }

    /// The subscriber's callback has returned (or resolved) without settling. A group's
    /// delivery stays held until it is settled; a fan-out delivery, which holds nothing in
    /// Redis, is done: its place among `maxInFlight` is given back, a later ack changes
    /// nothing, and a later nack comes through [`StreamsPubSub::nack_returned`].
    pub fn returned(&self) {
        let state = &self.state;
        if matches!(state.origin, Origin::Fanout { .. }) && state.advance(HELD, DONE) {
            finish(&self.shared, state);
        }
    }

    /// Acks many deliveries in one round trip: one XACK per consumer, naming all its
    /// entries, the XACKs pipelined (one pipeline per node). Hands `answered` what
    /// [`Delivery::ack`] would have answered for each, with its place in `deliveries`, as
    /// each pipeline's are known (on a cluster, a master's do not wait for another's); a
    /// failed XACK is retried in the background for the deliveries it named, which answer
    /// [`Settled::Retrying`].
    pub async fn ack_each(
        deliveries: &[Delivery],
        answered: &(dyn Fn(Vec<(usize, Settled)>) + Sync),
    ) {
        let Some(shared) = deliveries.first().map(|d| Arc::clone(&d.shared)) else {
            return;
        };
        if shared.closed.load(Ordering::Acquire) {
            return answered(
                (0..deliveries.len())
                    .map(|i| (i, Settled::Closed))
                    .collect(),
            );
        }
        let _on_their_way = OnItsWay::new(&shared);
        // A group's entries go in its consumer's XACK; the rest (fan-out, which holds
        // nothing in Redis, or another pubsub's delivery) settle on their own.
        let mut xacks: Vec<(&Arc<Consumer>, Vec<usize>)> = Vec::new();
        let mut lone = Vec::new();
        let mut already = Vec::new();
        for (i, delivery) in deliveries.iter().enumerate() {
            let state = &delivery.state;
            if !state.begin() {
                already.push((i, Settled::Already));
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
        if !already.is_empty() {
            answered(already);
        }
        let xack = |consumer: &Consumer, members: &[usize], pipe: &mut redis::Pipeline| {
            let cmd = pipe.cmd("XACK").arg(&consumer.key).arg(&consumer.group);
            for &i in members {
                cmd.arg(&deliveries[i].state.entry_id);
            }
        };
        // XACK twice is harmless: a connection that breaks under it costs nothing. One
        // pipeline per node, all at once.
        let send = |pipe: redis::Pipeline| {
            let shared = &shared;
            async move {
                let count = pipe.len();
                shared
                    .front()
                    .run_again_if_broken(|mut c| {
                        let pipe = &pipe;
                        async move { c.send_packed_commands(pipe, 0, count).await }
                    })
                    .await
            }
        };
        let groups = shared
            .front()
            .by_node(&xacks, |(consumer, _)| slot(consumer.key.as_bytes()));
        let each_group = groups.iter().map(|group| {
            let mut pipe = redis::pipe();
            for (consumer, members) in group {
                xack(consumer, members, &mut pipe);
            }
            let shared = &shared;
            async move {
                let replies: Vec<Result<Value>> = match send(pipe).await {
                    Ok(values) => values.into_iter().map(Ok).collect(),
                    Err(err) => vec![Err(err); group.len()],
                };
                let mut replies = replies.into_iter();
                let mut answers = Vec::new();
                for (_, members) in group {
                    let result = match replies.next().unwrap_or(Ok(Value::Nil)) {
                        Ok(reply) => match parse::<Value>(reply) {
                            Ok(_) => Ok(Settled::Acked),
                            // The stream or group is gone, and with it every pending entry.
                            Err(err) if err.code() == Some("NOGROUP") => Ok(Settled::Acked),
                            Err(err) => Err(shared.front().classify(err)),
                        },
                        Err(err) => Err(err),
                    };
                    for &i in members {
                        let state = &deliveries[i].state;
                        let answer = match &result {
                            Ok(settled) => {
                                state.phase.store(DONE, Ordering::Release);
                                finish(shared, state);
                                *settled
                            }
                            Err(err) => {
                                retry_later(shared, state, Settle::Ack, err, OnItsWay::new(shared))
                            }
                        };
                        answers.push((i, answer));
                    }
                }
                answered(answers);
            }
        });
        let each_lone = lone.iter().map(|&i| async move {
            let delivery = &deliveries[i];
            let answer = conclude(
                &delivery.shared,
                delivery.shared.front(),
                &delivery.state,
                Settle::Ack,
            )
            .await;
            answered(vec![(i, answer)]);
        });
        futures::join!(
            futures::future::join_all(each_group),
            futures::future::join_all(each_lone)
        );
    }

    /// [`Delivery::ack_each`], its answers in order (for tests; the glue hands each answer on
    /// as it comes).
    #[cfg(test)]
    pub async fn ack_all(deliveries: &[Delivery]) -> Vec<Settled> {
        let answers = std::sync::Mutex::new(vec![Settled::Already; deliveries.len()]);
        Self::ack_each(deliveries, &|each| {
            let mut answers = lock(&answers);
            for (i, answer) in each {
                answers[i] = answer;
            }
        })
        .await;
        answers.into_inner().unwrap_or_else(|e| e.into_inner())
    }
}

/// How many fan-out redeliveries this process remembers, so that its other subscribers'
/// nacks of the same event add none. A nack of an event redelivered longer ago than that
/// redelivers it again.
const FANOUT_NACKS_KEPT: usize = 4096;

impl Shared {
    /// Whether this nack of a fan-out event is the first of this process: no fan-out
    /// subscriber here redelivered the event (its `id`, at this attempt) yet. An event without
    /// an `id` is told apart by its entry, when known.
    fn first_fanout_nack(&self, key: &str, state: &State) -> bool {
        let id = event::head(&state.json)
            .and_then(|(id, _)| id)
            .or_else(|| (!state.entry_id.is_empty()).then(|| state.entry_id.clone()));
        let Some(id) = id else {
            return true;
        };
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        (key, id, state.attempt).hash(&mut hasher);
        let nack = hasher.finish();
        let mut nacks = lock(&self.fanout_nacks);
        if nacks.contains(&nack) {
            return false;
        }
        if nacks.len() == FANOUT_NACKS_KEPT {
            nacks.pop_front();
        }
        nacks.push_back(nack);
        true
    }
}

impl StreamsPubSub {
    /// Nacks a fan-out event after its subscriber's callback returned (it is no longer held:
    /// see [`Delivery::returned`]). The subscriber kept the event's `json` as it was
    /// delivered, and passes it back: appended again to the topic with `deliveryAttempt + 1`,
    /// or dropped with a warning at `maxDeliveryAttempts`, as a nack made inside the callback
    /// is, and once for all this process's fan-out subscribers that nack it. Retried in the
    /// background when Redis cannot be reached; `close` waits for it.
    pub async fn nack_returned(&self, topic: &str, json: Arc<str>) -> Settled {
        let shared = &self.shared;
        if shared.closed.load(Ordering::Acquire) {
            return Settled::Closed;
        }
        let origin = Origin::Fanout {
            key: shared.stream_key(topic),
            topic: topic.to_owned(),
        };
        let state = delivery::settling(shared, origin, json);
        conclude(shared, shared.front(), &state, Settle::Nack).await
    }
}

/// Settles a delivery that never reached a subscriber (released, or dropped at the cap),
/// once. Also while the pubsub closes: what a stopping reader took goes back to the group
/// while the connection is still open.
pub(super) async fn settle_unread(delivery: &Delivery, how: Settle) -> Settled {
    if !delivery.state.begin() {
        return Settled::Already;
    }
    let shared = &delivery.shared;
    conclude(shared, &shared.writer, &delivery.state, how).await
}
