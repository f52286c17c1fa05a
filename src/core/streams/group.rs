//! Consumer groups: this process is one consumer of each group it subscribes to on a topic,
//! named `<group>-<uuid>`, with one reader and one connection, shared by all its
//! subscriptions of that group on that topic (each entry goes to one of them in turn).
//!
//! The reader reads (`XREADGROUP ... >`), hands entries out, and every `reclaimIntervalMs`
//! takes over entries other consumers read and left idle for `reclaimIdleMs` (XAUTOCLAIM):
//! a consumer that died. Each takeover counts as a delivery (Redis's own counter, read back
//! in the same script), so a message that kills every consumer reading it reaches
//! `maxDeliveryAttempts` and is dropped there instead of circulating for ever. A read whose
//! reply was lost with its connection took entries this consumer never saw: after a broken
//! connection the reader first reads its own pending entries back. NOGROUP (a deleted stream
//! or group) is recovered from by creating the group again.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};
use std::time::Instant;

use redis::aio::MultiplexedConnection;
use redis::{Script, Value};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

use super::delivery::{self, Delivery, Origin, Outcome};
use super::event::{self, Entry};
use super::reader::{self, Backoff, Member};
use super::{lock, Shared};
use crate::core::connection::parse;
use crate::core::error::{LeaseError, Result};
use crate::core::log::{Level, Throttle};

static RECLAIM: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("reclaim.lua")));

/// Most reads sent together while a group has a backlog (see [`read_commands`]).
const MAX_READ_AHEAD: usize = 8;

/// This process's consumer of one group on one topic.
pub(crate) struct Consumer {
    pub topic: String,
    pub key: String,
    pub group: String,
    /// `<group>-<uuid>`.
    pub name: String,
    /// Entries read and not yet settled, each with the delivery that holds it: a reclaim
    /// pass (which also claims this consumer's own idle entries) never hands one out again.
    held: Mutex<HashMap<String, u64>>,
    /// `maxInFlight` places, shared by the consumer's subscriptions.
    room: Option<Arc<Semaphore>>,
    members: Mutex<Members>,
    cursor: Mutex<Cursor>,
    /// Numbers the readers started, so one replaced by a newer one stops.
    generations: AtomicU64,
}

/// The subscriptions a consumer serves, and its reader while it has any.
#[derive(Default)]
struct Members {
    list: Vec<Arc<Member>>,
    /// Whose turn the next entry is.
    next: usize,
    reader: Option<(u64, JoinHandle<()>)>,
}

/// Where a reader is: the last entry read (where to create the group again after NOGROUP)
/// and the anchor used before any.
#[derive(Debug)]
struct Cursor {
    position: Option<String>,
    /// The event `id` of the entry at `position`: after NOGROUP, tells the stream we read
    /// from apart from one re-created under the same key.
    position_event: Option<String>,
    anchor: &'static str,
    /// Bumped by clearTopic: a read issued before it is discarded, its position is stale.
    epoch: u64,
}

impl Consumer {
    pub fn new(
        shared: &Shared,
        topic: &str,
        key: String,
        group: String,
        anchor: &'static str,
    ) -> Result<Self> {
        let name = format!("{group}-{}", event::uuid_v4()?);
        Ok(Self {
            topic: topic.to_owned(),
            key,
            group,
            name,
            held: Mutex::new(HashMap::new()),
            room: shared
                .tuning
                .max_in_flight
                .map(|n| Arc::new(Semaphore::new(n.min(Semaphore::MAX_PERMITS)))),
            members: Mutex::new(Members::default()),
            cursor: Mutex::new(Cursor {
                position: None,
                position_event: None,
                anchor,
                epoch: 0,
            }),
            generations: AtomicU64::new(0),
        })
    }

    /// Holds `entry` for delivery `id`; `false` if it is held already.
    pub fn hold(&self, entry: &str, id: u64) -> bool {
        let mut held = lock(&self.held);
        if held.contains_key(entry) {
            return false;
        }
        held.insert(entry.to_owned(), id);
        true
    }

    /// Ends delivery `id`'s hold on `entry`.
    pub fn release_hold(&self, entry: &str, id: u64) {
        let mut held = lock(&self.held);
        if held.get(entry) == Some(&id) {
            held.remove(entry);
        }
    }

    /// The entries held, to keep claimed.
    pub fn held_entries(&self) -> Vec<String> {
        lock(&self.held).keys().cloned().collect()
    }

    /// A `maxInFlight` place for a delivery, if one is free (and `None` when unlimited).
    pub fn place(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        self.room
            .as_ref()
            .and_then(|places| Arc::clone(places).try_acquire_owned().ok())
    }

    fn members(&self) -> MutexGuard<'_, Members> {
        lock(&self.members)
    }

    fn cursor(&self) -> MutexGuard<'_, Cursor> {
        lock(&self.cursor)
    }

    /// Adds a subscription, and starts the reader if none runs.
    pub fn join(self: &Arc<Self>, shared: &Arc<Shared>, member: Arc<Member>) {
        let mut members = self.members();
        members.list.push(member);
        if members.reader.is_none() {
            let generation = self.generations.fetch_add(1, Ordering::Relaxed) + 1;
            let task =
                shared
                    .runtime
                    .spawn(read_loop(Arc::clone(shared), Arc::clone(self), generation));
            members.reader = Some((generation, task));
        }
    }

    /// Removes a subscription. The last one stops the reader (see [`Consumer::stop_reader`]).
    pub async fn leave(&self, shared: &Shared, member: u64) {
        let reader = {
            let mut members = self.members();
            members.list.retain(|m| m.id != member);
            if members.list.is_empty() {
                members.reader.take()
            } else {
                None
            }
        };
        stop_reader(shared, reader).await;
    }

    /// Stops serving every subscription (the pubsub is closing), and stops the reader.
    pub async fn stop_all(&self, shared: &Shared) {
        let reader = {
            let mut members = self.members();
            members.list.clear();
            members.reader.take()
        };
        stop_reader(shared, reader).await;
    }

    /// Whether reader `generation` should go on: it is the current one and has subscriptions.
    fn serves(&self, generation: u64) -> bool {
        let members = self.members();
        !members.list.is_empty()
            && members
                .reader
                .as_ref()
                .is_some_and(|(g, _)| *g == generation)
    }

    /// The stream was deleted (clearTopic): stream ids can restart below our position, so
    /// read the new stream from its start.
    pub fn restart(&self) {
        let mut cursor = self.cursor();
        cursor.position = None;
        cursor.position_event = None;
        cursor.anchor = "0";
        cursor.epoch += 1;
    }

    /// Hands a delivery to the subscriptions in turn; gives it back when none is left.
    async fn hand_out(&self, mut delivery: Delivery) -> std::result::Result<(), Delivery> {
        let turn = {
            let mut members = self.members();
            if members.list.is_empty() {
                return Err(delivery);
            }
            let turn = members.next % members.list.len();
            members.next = members.next.wrapping_add(1);
            Arc::clone(&members.list[turn])
        };
        match turn.tx.send(delivery).await {
            Ok(()) => return Ok(()),
            Err(unsent) => delivery = unsent.0,
        }
        // That one left meanwhile: any other.
        let others = self.members().list.clone();
        for member in others.iter().filter(|m| !Arc::ptr_eq(m, &turn)) {
            match member.tx.send(delivery).await {
                Ok(()) => return Ok(()),
                Err(unsent) => delivery = unsent.0,
            }
        }
        Err(delivery)
    }

    /// Room in the subscriptions' channels; waits for some when they are all full.
    async fn channel_room(&self) -> usize {
        let (room, first) = {
            let members = self.members();
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
}

/// Waits for a reader that was told to stop. It may be inside a blocking read whose entries
/// the group already counts as this consumer's, so it finishes the read (at most BLOCK + the
/// command timeout) and hands what it read back to the group; only a reader that does not
/// stop in that time is aborted.
async fn stop_reader(shared: &Shared, reader: Option<(u64, JoinHandle<()>)>) {
    let Some((_, mut task)) = reader else { return };
    let bound = shared
        .tuning
        .block
        .saturating_add(shared.tuning.command_timeout);
    if tokio::time::timeout(bound, &mut task).await.is_err() {
        task.abort();
        let _ = task.await;
    }
}

/// XGROUP CREATE ... MKSTREAM (with PEXPIRE in the same MULTI when an idle TTL is set, so
/// a stream created only by a subscribe still expires). An existing group (BUSYGROUP)
/// keeps its position, which is what a second subscriber of the group wants.
pub(super) async fn create_group(shared: &Shared, key: &str, group: &str, at: &str) -> Result<()> {
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

/// Where entries handed to [`deliver`] come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// A read of new entries (`>`): the cursor moves past them.
    Read,
    /// This consumer's own pending entries read back after a broken connection: only those
    /// it does not hold already are delivered.
    History,
    /// A reclaim pass: entries idle past the threshold, this consumer's own among them.
    Reclaim,
}

/// The reader of one consumer: reads, hands entries out, reclaims idle entries, recovers
/// from NOGROUP and reconnects. Runs while it is its consumer's current reader and the
/// consumer has subscriptions.
async fn read_loop(shared: Arc<Shared>, consumer: Arc<Consumer>, generation: u64) {
    let tuning = shared.tuning.clone();
    let throttle = Throttle::default();
    let mut connection: Option<MultiplexedConnection> = None;
    let mut backoff = Backoff::default();
    // The first pass runs at once: a new consumer picks up what a crashed one left.
    let mut reclaim_at = Instant::now();
    let mut reclaim_cursor = "0-0".to_owned();
    // The last read came back full: more is likely waiting, so read ahead without blocking.
    let mut backlog = false;
    // After the reader's connection broke, a read may have run whose reply was lost: its
    // entries are pending for this consumer, which never saw them. Until this consumer's own
    // pending entries have been read back (from this id on), reads read those.
    let mut history: Option<String> = None;
    let report = |message: &str, err: &LeaseError| {
        shared.throttled(
            &throttle,
            message,
            Some(err),
            &[
                ("topic", consumer.topic.clone().into()),
                ("group", consumer.group.clone().into()),
            ],
        );
    };
    loop {
        if shared.closed.load(Ordering::Acquire) || !consumer.serves(generation) {
            return;
        }
        if let Some(places) = &consumer.room {
            // At `maxInFlight`: wait until a delivery is settled.
            if places.available_permits() == 0 {
                match places.acquire().await {
                    Ok(place) => drop(place),
                    Err(_) => return,
                }
                continue;
            }
        }
        let free = consumer
            .room
            .as_ref()
            .map_or(usize::MAX, |places| places.available_permits())
            .min(consumer.channel_room().await)
            .max(1);
        let count = free.min(tuning.batch_count);

        if let Some(interval) = tuning.reclaim_interval {
            if Instant::now() >= reclaim_at {
                match reclaim(&shared, &consumer, &reclaim_cursor, count).await {
                    Ok((cursor, entries)) => {
                        // A cursor other than 0-0 means more to scan: continue promptly.
                        reclaim_at = if cursor == "0-0" {
                            reader::later(interval)
                        } else {
                            Instant::now()
                        };
                        reclaim_cursor = cursor;
                        deliver(&shared, &consumer, entries, Source::Reclaim).await;
                    }
                    Err(err) => {
                        reclaim_at = reader::later(interval);
                        // NOGROUP is the read's to recover from; anything else is trouble.
                        if !is_nogroup(&err) {
                            report("reclaim pass failed", &err);
                        }
                    }
                }
                continue;
            }
        }

        let mut conn = match connection.take() {
            Some(conn) => conn,
            None => match shared.writer.dedicated().await {
                Ok((conn, _)) => conn,
                Err(err) => {
                    report("reader cannot connect; retrying", &err);
                    tokio::time::sleep(backoff.next()).await;
                    continue;
                }
            },
        };
        let (pipe, reads, epoch) =
            read_commands(&shared, &consumer, free, backlog, history.as_deref());
        let outcome = tokio::time::timeout(
            tuning.block.saturating_add(tuning.command_timeout),
            reader::read_all(&mut conn, &pipe, reads),
        )
        .await;
        match outcome {
            Ok(Ok(streams)) => {
                connection = Some(conn);
                backoff.reset();
                if consumer.cursor().epoch != epoch {
                    history = None;
                    continue; // read from a stream clearTopic deleted meanwhile
                }
                let entries: Vec<Entry> = streams.into_iter().flat_map(|(_, e)| e).collect();
                let full = entries.len() >= reads * count;
                let source = if history.is_some() {
                    // Read back until a read comes back short.
                    history = entries.last().filter(|_| full).map(|e| e.id.clone());
                    Source::History
                } else {
                    backlog = full;
                    Source::Read
                };
                deliver(&shared, &consumer, entries, source).await;
            }
            Ok(Err(err)) if err.code() == Some("NOGROUP") => {
                connection = Some(conn);
                recover_group(&shared, &consumer).await;
                // Grows only if recovery keeps failing (a successful read resets it).
                tokio::time::sleep(backoff.next()).await;
            }
            Ok(Err(err)) => {
                // A server error (READONLY, WRONGTYPE, OOM) leaves the connection usable;
                // anything else may have broken it.
                if matches!(err.kind(), redis::ErrorKind::Server(_)) {
                    connection = Some(conn);
                } else {
                    history = Some("0".to_owned());
                }
                report(
                    "read failed; retrying",
                    &LeaseError::from_redis(err, tuning.command_timeout),
                );
                tokio::time::sleep(backoff.next()).await;
            }
            Err(_) => {
                // No answer past BLOCK + timeout: frozen or unreachable. A fresh connection
                // is the only way to know; the old one may never answer.
                report(
                    "read timed out; reconnecting",
                    &LeaseError::Timeout(tuning.block.saturating_add(tuning.command_timeout)),
                );
                history = Some("0".to_owned());
                tokio::time::sleep(backoff.next()).await;
            }
        }
    }
}

fn is_nogroup(err: &LeaseError) -> bool {
    matches!(err, LeaseError::Server(e) if e.code() == Some("NOGROUP"))
}

/// The next read: XREADGROUP `>` (entries never delivered to any consumer of the group) of
/// at most `batchCount` entries.
///
/// Normally one read that blocks until entries arrive. While the group has a backlog (the
/// last read came back full), as many reads as there is room for go out together in one
/// round trip, none blocking: a consumer keeps up with a producer at `free / batchCount`
/// times the rate of one read per round trip, and never holds more than it has room for.
/// With `history`, one read, not blocking, of this consumer's own pending entries after
/// that id: after a broken connection, what a read whose reply was lost had taken.
/// Returns the pipeline, how many reads it holds, and the cursor epoch they belong to.
fn read_commands(
    shared: &Shared,
    consumer: &Consumer,
    free: usize,
    backlog: bool,
    history: Option<&str>,
) -> (redis::Pipeline, usize, u64) {
    let batch = shared.tuning.batch_count;
    let reads = if backlog && history.is_none() {
        (free / batch).clamp(1, MAX_READ_AHEAD)
    } else {
        1
    };
    let block = super::duration_ms(shared.tuning.block);
    let epoch = consumer.cursor().epoch;
    let mut pipe = redis::pipe();
    for _ in 0..reads {
        let cmd = pipe
            .cmd("XREADGROUP")
            .arg("GROUP")
            .arg(&consumer.group)
            .arg(&consumer.name)
            .arg("COUNT")
            .arg(free.min(batch));
        if !backlog && history.is_none() {
            cmd.arg("BLOCK").arg(block);
        }
        cmd.arg("STREAMS")
            .arg(&consumer.key)
            .arg(history.unwrap_or(">"));
    }
    (pipe, reads, epoch)
}

/// Hands entries to the consumer's subscriptions.
///
/// A reclaimed entry was delivered `deliveries` times by Redis, each a consumer that never
/// settled it: its attempt is the one it was appended with plus the deliveries after the
/// first, and the event handed out carries that `deliveryAttempt`. Past the cap it is
/// dropped (acked, with the cap's warning) instead of handed out. An entry this consumer
/// holds already (a reclaim pass or a read-back found it) is skipped.
async fn deliver(
    shared: &Arc<Shared>,
    consumer: &Arc<Consumer>,
    entries: Vec<Entry>,
    source: Source,
) {
    let mut settles = Vec::new();
    for entry in entries {
        let parsed = entry.event.and_then(event::parse);
        if source == Source::Read {
            let mut cursor = consumer.cursor();
            cursor.position = Some(entry.id.clone());
            cursor.position_event = parsed.as_ref().and_then(|p| p.id.clone());
        }
        let Some(parsed) = parsed else {
            malformed(shared, consumer, &entry.id).await;
            continue;
        };
        let attempt = parsed
            .attempt
            .saturating_add(entry.deliveries.saturating_sub(1));
        let json = if attempt == parsed.attempt {
            parsed.json
        } else {
            // A map with string keys always serialises; were it not to, the stored JSON
            // (with the older attempt) is still the event.
            event::with_attempt(&parsed.json, attempt).unwrap_or(parsed.json)
        };
        let origin = Origin::Group(Arc::clone(consumer));
        let Some(delivery) = delivery::register(
            shared,
            origin,
            entry.id,
            json.into(),
            attempt,
            consumer.place(),
        ) else {
            continue;
        };
        if shared.tuning.max_attempts.is_some_and(|max| attempt > max) {
            settles.push(async move { delivery::settle_unread(&delivery, Outcome::Drop).await });
            continue;
        }
        if let Err(unread) = consumer.hand_out(delivery).await {
            // Nobody to hand it to (the last subscription left): back to the group.
            delivery::settle_unread(&unread, Outcome::Release).await;
        }
    }
    // Concurrent over the multiplexed connection: one round trip for the whole batch.
    futures::future::join_all(settles).await;
}

/// An entry without a usable `event` field can never be handled: warn, and ack it so it
/// does not come back forever.
async fn malformed(shared: &Shared, consumer: &Consumer, id: &str) {
    shared.notice(
        Level::Warn,
        "malformed entry (no JSON object in its event field); dropping it",
        &[
            ("topic", consumer.topic.clone().into()),
            ("entryId", id.into()),
        ],
    );
    let mut cmd = redis::cmd("XACK");
    cmd.arg(&consumer.key).arg(&consumer.group).arg(id);
    if let Err(err) = shared
        .writer
        .run(|mut c| async move { cmd.query_async::<Value>(&mut c).await })
        .await
    {
        shared.notice(
            Level::Debug,
            "ack of a malformed entry failed",
            &[
                ("topic", consumer.topic.clone().into()),
                ("err", err.full_message().into()),
            ],
        );
    }
}

/// After NOGROUP (stream or group deleted: clearTopic elsewhere, TTL expiry, FLUSHALL),
/// create the group again after the last entry this consumer read, so entries appended
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
async fn recover_group(shared: &Shared, consumer: &Consumer) {
    let (position, seen_event, anchor) = {
        let cursor = consumer.cursor();
        (
            cursor.position.clone(),
            cursor.position_event.clone(),
            cursor.anchor,
        )
    };
    let at = match position {
        None => anchor.to_owned(),
        Some(position) => match greatest_at_or_below(shared, &consumer.key, &position).await {
            Ok(None) => "0".to_owned(),
            Ok(Some((id, event))) if id == position && event == seen_event => position,
            Ok(Some(_)) => {
                shared.notice(
                    Level::Debug,
                    "the stream was re-created; reading it from its start",
                    &[("topic", consumer.topic.clone().into())],
                );
                "0".to_owned()
            }
            // Cannot tell: resume after our position, as before (the create will likely fail
            // the same way and be retried).
            Err(_) => position,
        },
    };
    match create_group(shared, &consumer.key, &consumer.group, &at).await {
        Ok(()) => shared.notice(
            Level::Debug,
            "recreated consumer group after NOGROUP",
            &[
                ("topic", consumer.topic.clone().into()),
                ("group", consumer.group.clone().into()),
            ],
        ),
        Err(err) => shared.notice(
            Level::Debug,
            "consumer group re-create failed",
            &[
                ("topic", consumer.topic.clone().into()),
                ("err", err.full_message().into()),
            ],
        ),
    }
}

/// The greatest entry of the stream at or below `id`, with its event `id` (if it has one).
async fn greatest_at_or_below(
    shared: &Shared,
    key: &str,
    id: &str,
) -> Result<Option<(String, Option<String>)>> {
    Ok(super::last_entry(shared, key, id).await?.map(|entry| {
        let event = entry.event.and_then(event::parse);
        (entry.id, event.and_then(|p| p.id))
    }))
}

/// One XAUTOCLAIM step (`reclaim.lua`): takes over up to `count` entries of the group idle
/// for at least the reclaim threshold, starting at `cursor`, each with the number of times
/// Redis has now delivered it. One round trip, whatever the batch.
async fn reclaim(
    shared: &Shared,
    consumer: &Consumer,
    cursor: &str,
    count: usize,
) -> Result<(String, Vec<Entry>)> {
    let mut invocation = RECLAIM.prepare_invoke();
    invocation
        .key(&consumer.key)
        .arg(&consumer.group)
        .arg(&consumer.name)
        .arg(shared.tuning.reclaim_idle_ms)
        .arg(cursor)
        .arg(count);
    let reply: Value = shared
        .writer
        .run(|mut c| async move { invocation.invoke_async(&mut c).await })
        .await?;
    Ok(event::reclaim_reply(reply))
}
