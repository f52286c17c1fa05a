//! A consumer's reader: it reads its group (`XREADGROUP ... >`), hands entries out, runs a
//! reclaim pass every `reclaimIntervalMs` (`reclaim.rs`), recovers from NOGROUP (a deleted
//! stream or group) by creating the group again, and reconnects with backoff. A read whose
//! reply was lost with its connection took entries this consumer never saw: after a broken
//! connection the reader first reads its own pending entries back. Also what the fan-out
//! reader shares with it: sending reads, gathering their entries, backoff, interrupting a
//! blocking read and stopping a reader.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::Value;
use tokio::task::JoinHandle;

use super::delivery::{self, Origin};
use super::event::{self, Entry};
use super::group::{self, Consumer};
use super::member;
use super::reclaim;
use super::settle::{self, Settle};
use super::Shared;
use crate::core::connection::{parse, Link};
use crate::core::error::{Error, Result};
use crate::core::log::{Level, Throttle};

/// Deliveries read but not yet taken by a subscription, at least. Kept small: what sits in a
/// channel is read (for a group, owned by this consumer) but not yet being handled.
pub(super) const MIN_BUFFER: usize = 16;
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(2);

/// Most reads sent together while a group has a backlog (see [`read_commands`]).
const MAX_READ_AHEAD: usize = 8;

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
pub(super) async fn read_loop(shared: Arc<Shared>, consumer: Arc<Consumer>, generation: u64) {
    // Held while the reader may still read: close waits for every reader, whoever stopped it.
    let Ok(_reading) = shared.readers.try_read() else {
        return; // the pubsub is closing
    };
    read(&shared, &consumer, generation).await;
    consumer.set_reader_id(generation, None);
}

async fn read(shared: &Arc<Shared>, consumer: &Arc<Consumer>, generation: u64) {
    let options = &shared.options;
    let throttle = Throttle::default();
    let mut connection: Option<Link> = None;
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
    let report = |message: &str, err: &Error| {
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
        // Told to stop while waiting for room, the reader stops at once, not when room comes.
        let stopping = consumer.stopping.notified();
        tokio::pin!(stopping);
        stopping.as_mut().enable();
        if shared.closed.load(Ordering::Acquire) || !consumer.serves(generation) {
            return;
        }
        if let Some(places) = &consumer.room {
            // At `maxInFlight`: wait until a delivery is settled.
            if places.available_permits() == 0 {
                tokio::select! {
                    place = places.acquire() => match place {
                        Ok(place) => drop(place),
                        Err(_) => return,
                    },
                    _ = &mut stopping => {}
                }
                continue;
            }
        }
        let room = tokio::select! {
            room = member::channel_room(&consumer.members) => room,
            _ = &mut stopping => continue,
        };
        let free = consumer
            .room
            .as_ref()
            .map_or(usize::MAX, |places| places.available_permits())
            .min(room)
            .max(1);
        let count = free.min(options.batch_count);

        if let Some(interval) = options.reclaim_interval {
            if Instant::now() >= reclaim_at {
                let held_before = held(consumer);
                match reclaim::reclaim(shared, consumer, &reclaim_cursor, count).await {
                    Ok((cursor, entries)) => {
                        // A cursor other than 0-0 means more to scan: continue promptly.
                        reclaim_at = if cursor == "0-0" {
                            later(interval)
                        } else {
                            Instant::now()
                        };
                        reclaim_cursor = cursor;
                        deliver(shared, consumer, entries, Source::Reclaim, &held_before).await;
                    }
                    Err(err) => {
                        reclaim_at = later(interval);
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
            None => match shared.writer.dedicated(consumer.key.as_bytes()).await {
                Ok((conn, id)) => {
                    consumer.set_reader_id(generation, id);
                    conn
                }
                Err(err) => {
                    report("reader cannot connect; retrying", &err);
                    tokio::time::sleep(backoff.next()).await;
                    continue;
                }
            },
        };
        let (pipe, reads, epoch) =
            read_commands(shared, consumer, free, backlog, history.as_deref());
        // New entries (`>`) are nobody's yet: only a read-back may find one held.
        let held_before = match history {
            Some(_) => held(consumer),
            None => HashSet::new(),
        };
        let outcome = tokio::time::timeout(
            options
                .block
                .saturating_add(options.connection.command_timeout),
            read_all(&mut conn, &pipe, reads),
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
                deliver(shared, consumer, entries, source, &held_before).await;
            }
            Ok(Err(err)) if group_gone(&err) => {
                connection = Some(conn);
                recover_group(shared, consumer).await;
                // Grows only if recovery keeps failing (a successful read resets it).
                tokio::time::sleep(backoff.next()).await;
            }
            Ok(Err(err)) => {
                // A server error (READONLY, WRONGTYPE, OOM) leaves the connection usable;
                // anything else may have broken it.
                if matches!(err.kind(), redis::ErrorKind::Server(_)) {
                    connection = Some(conn);
                } else {
                    consumer.set_reader_id(generation, None);
                    history = Some("0".to_owned());
                }
                report(
                    "read failed; retrying",
                    &Error::from_redis(err, options.connection.command_timeout),
                );
                tokio::time::sleep(backoff.next()).await;
            }
            Err(_) => {
                // No answer past BLOCK + timeout: frozen or unreachable. A fresh connection
                // is the only way to know; the old one may never answer.
                report(
                    "read timed out; reconnecting",
                    &Error::timeout(
                        options
                            .block
                            .saturating_add(options.connection.command_timeout),
                    ),
                );
                consumer.set_reader_id(generation, None);
                history = Some("0".to_owned());
                tokio::time::sleep(backoff.next()).await;
            }
        }
    }
}

/// Interrupts a reader's blocking read: `CLIENT UNBLOCK` of its connection's id (`id()`; 0
/// while none is known), from the shared connection to the reader's node (`node_key`'s), up
/// to `tries` times, a few milliseconds apart and past [`WAKE_TRIES`] a tenth of a second
/// apart, until `done()`. A wake-up that arrives before the read is sent finds nothing to
/// interrupt, hence the repeats. An unblocked read answers as if its BLOCK ran out: it took
/// nothing. Fails when Redis refused the command (an ACL without `CLIENT UNBLOCK`) or could
/// not be reached; the read then ends within BLOCK.
pub(super) async fn interrupt(
    shared: &Shared,
    node_key: &str,
    id: impl Fn() -> i64,
    tries: usize,
    done: impl Fn() -> bool,
) -> Result<()> {
    for tried in 0..tries {
        if done() {
            return Ok(());
        }
        let id = id();
        if id > 0 {
            let mut unblock = redis::cmd("CLIENT");
            unblock.arg("UNBLOCK").arg(id);
            // To the reader's node (on a cluster, not wherever a keyless command goes).
            let node = node_key.as_bytes();
            shared
                .writer
                .run(|mut c| async move { c.on_node_of(node, &unblock).await })
                .await?;
        }
        let pause = if tried < WAKE_TRIES {
            WAKE_PAUSE
        } else {
            LATE_PAUSE
        };
        tokio::time::sleep(pause).await;
    }
    Ok(())
}

/// Tries of [`interrupt`] for a reader that will read again anyway (within BLOCK).
pub(super) const WAKE_TRIES: usize = 20;
const WAKE_PAUSE: Duration = Duration::from_millis(5);
/// Past [`WAKE_TRIES`], a reader busy elsewhere (a reclaim pass, handing entries out) rather
/// than about to send its read.
const LATE_PAUSE: Duration = Duration::from_millis(100);

/// Stops a reader already told to stop (it returns at its next turn): interrupts its blocking
/// read until the task has ended (see [`interrupt`]) and waits for it, at most BLOCK + the
/// command timeout; one that has not ended by then is aborted. Where the read cannot be
/// interrupted (an ACL that refuses `CLIENT ID` or `CLIENT UNBLOCK`), it is waited for: it
/// ends within BLOCK, and a group reader hands back what it took. Dropping its connection
/// instead would be quicker, but the server may still hand an entry to a read whose
/// connection it has not yet seen close, and that entry would wait for a reclaim.
pub(super) async fn stop(
    shared: &Shared,
    node_key: &str,
    id: impl Fn() -> i64,
    mut task: JoinHandle<()>,
) {
    let bound = shared
        .options
        .block
        .saturating_add(shared.options.connection.command_timeout);
    let interrupting = async {
        if let Err(err) = interrupt(shared, node_key, id, usize::MAX, || false).await {
            shared.notice(
                Level::Debug,
                "could not interrupt a read (CLIENT UNBLOCK); waiting for it to end, within \
                 blockMs",
                &[("err", err.full_message().into())],
            );
        }
        std::future::pending::<()>().await
    };
    let ended = tokio::time::timeout(bound, async {
        tokio::select! {
            _ = &mut task => {}
            _ = interrupting => {}
        }
    })
    .await;
    if ended.is_err() {
        task.abort();
        let _ = task.await;
    }
}

fn is_nogroup(err: &Error) -> bool {
    matches!(err, Error::Server(e) if e.code() == Some("NOGROUP"))
}

/// Whether a read's answer says its group is gone, for [`recover_group`]: NOGROUP, or what
/// Redis answers a read that was blocked when its stream was deleted (`UNBLOCKED the stream
/// key no longer exists`), where Valkey answers NOGROUP.
fn group_gone(err: &redis::RedisError) -> bool {
    match err.code() {
        Some("NOGROUP") => true,
        Some("UNBLOCKED") => err
            .detail()
            .is_some_and(|detail| detail.contains("stream key no longer exists")),
        _ => false,
    }
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
    let batch = shared.options.batch_count;
    let reads = if backlog && history.is_none() {
        (free / batch).clamp(1, MAX_READ_AHEAD)
    } else {
        1
    };
    let block = super::duration_ms(shared.options.block);
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

/// The entries `consumer` holds now, for a read that may find them ([`deliver`]).
fn held(consumer: &Consumer) -> HashSet<String> {
    consumer.held_entries().into_iter().collect()
}

/// Hands entries to the consumer's subscriptions.
///
/// A reclaimed entry was delivered `deliveries` times by Redis, each a consumer that never
/// settled it: its attempt is the one it was appended with plus the deliveries after the
/// first, and the event handed out carries that `deliveryAttempt`. Past the cap it is
/// dropped (acked, with the cap's warning) instead of handed out. An entry this consumer
/// holds (a reclaim pass or a read-back found it) is skipped, and so is one it held when
/// the read was sent (`held_before`): its settle may have landed while the reply was on its
/// way, and that settle decided the entry's fate (acked, or appended anew by a nack), so
/// handing it out again would have it handled twice.
async fn deliver(
    shared: &Arc<Shared>,
    consumer: &Arc<Consumer>,
    entries: Vec<Entry>,
    source: Source,
    held_before: &HashSet<String>,
) {
    let mut settles = Vec::new();
    for entry in entries {
        if held_before.contains(&entry.id) {
            continue;
        }
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
        if shared
            .options
            .max_delivery_attempts
            .is_some_and(|max| attempt > max)
        {
            settles.push(async move { settle::settle_unread(&delivery, Settle::Drop).await });
            continue;
        }
        if let Err(unread) = member::hand_out(&consumer.members, delivery).await {
            // Nobody to hand it to (the last subscription left): back to the group.
            settle::settle_unread(&unread, Settle::Release).await;
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
    match group::create_group(shared, &consumer.key, &consumer.group, &at).await {
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

/// Sends the reads of `pipe` and gathers their entries, stream by stream, in order. A read
/// that failed ends the batch: what the reads before it returned is delivered (the next read
/// meets the error again, if it lasts), and the error is the answer only when nothing was
/// read. Entries a read after it returned stay pending for this consumer until a reclaim
/// hands them out.
pub(super) async fn read_all(
    conn: &mut Link,
    pipe: &redis::Pipeline,
    reads: usize,
) -> redis::RedisResult<Vec<(String, Vec<Entry>)>> {
    let replies = conn.send_packed_commands(pipe, 0, reads).await?;
    let mut streams = Vec::new();
    for reply in replies {
        match parse::<Value>(reply) {
            Ok(reply) => streams.extend(event::read_reply(reply)),
            Err(err) if streams.is_empty() => return Err(err),
            Err(_) => break,
        }
    }
    Ok(streams)
}

/// `now + delay`, without the overflow panic of `+` for an absurdly long delay.
pub(super) fn later(delay: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(delay)
        .or_else(|| now.checked_add(Duration::from_secs(365 * 86_400)))
        .unwrap_or(now)
}

/// Exponential backoff between failed reads, so an outage never becomes a hot loop.
pub(super) struct Backoff(Duration);

impl Default for Backoff {
    fn default() -> Self {
        Self(BACKOFF_MIN)
    }
}

impl Backoff {
    pub fn next(&mut self) -> Duration {
        let delay = self.0;
        self.0 = (self.0 * 2).min(BACKOFF_MAX);
        delay
    }

    pub fn reset(&mut self) {
        self.0 = BACKOFF_MIN;
    }
}

#[cfg(test)]
mod tests {
    use super::group_gone;

    /// The error a server's reply line makes, as redis-rs hands it over.
    fn reply(line: &str) -> redis::RedisError {
        let value = redis::parse_redis_value(format!("-{line}\r\n").as_bytes()).unwrap();
        value.extract_error().unwrap_err()
    }

    #[test]
    fn a_read_whose_stream_or_group_was_deleted_recovers_whichever_way_the_server_says_it() {
        for gone in [
            // Valkey, for a deleted stream or group; Redis for a deleted group
            "NOGROUP No such key 'k' or consumer group 'g' in XREADGROUP with GROUP option",
            "NOGROUP the consumer group this client was blocked on no longer exists",
            // Redis, for a deleted stream
            "UNBLOCKED the stream key no longer exists",
        ] {
            assert!(group_gone(&reply(gone)), "{gone}");
        }
        for other in [
            "UNBLOCKED force unblock from blocking operation, instance state changed (master -> replica?)",
            "UNBLOCKED client unblocked via CLIENT UNBLOCK",
            "WRONGTYPE Operation against a key holding the wrong kind of value",
        ] {
            assert!(!group_gone(&reply(other)), "{other}");
        }
    }
}
