//! Fan-out: every fan-out subscription of this process is served by one reader on one
//! connection, a blocking `XREAD` over the streams of all their topics. Fan-out leaves
//! nothing behind in Redis (no private groups to clean up after a crash): each subscription
//! keeps its own position, the reader reads each stream from the lowest position among its
//! subscriptions and gives every subscription the entries past its own. A subscription that
//! joins a topic already being read with `startFrom: 'earliest'` so gets the backlog, and the
//! others do not get it twice.
//!
//! When a topic is added, the blocking read is interrupted (`CLIENT UNBLOCK`, from the
//! shared connection) so the next read includes it; so it is when the pubsub closes. Were that refused (an ACL without it),
//! the new topic is read from the next read on, at most `blockMs` later: its starting point
//! was fixed when it subscribed, so nothing is missed.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::core::connection::{Link, Shard};
use tokio::task::JoinHandle;

use super::delivery::{self, Origin};
use super::event::{self, Entry, EntryId};
use super::member::Member;
use super::reader::{self, Backoff, WAKE_TRIES};
use super::settle::{self, Settle};
use super::Shared;
use crate::core::error::Error;
use crate::core::lock;
use crate::core::log::{Level, Throttle};

/// Every fan-out subscription of one pubsub, by reader: one per shard their topics live in,
/// since one read may name the streams of one shard only (on one server, one reader serves
/// them all; on a cluster, one per hash slot).
#[derive(Default)]
pub(crate) struct Fanouts {
    readers: Mutex<HashMap<Shard, Arc<Fanout>>>,
}

impl Fanouts {
    /// The reader for the stream `key`, made when there is none.
    fn of(&self, shared: &Shared, key: &str) -> Arc<Fanout> {
        let shard = shared.writer.shard(key.as_bytes());
        let mut readers = lock(&self.readers);
        Arc::clone(readers.entry(shard).or_insert_with(|| {
            Arc::new(Fanout {
                node_key: key.to_owned(),
                ..Fanout::default()
            })
        }))
    }

    /// Adds a subscription to the topic whose stream is `key` (see [`Fanout::add`]).
    pub fn add(&self, shared: &Arc<Shared>, key: String, topic: &str, member: Arc<Member>) {
        self.of(shared, &key).add(shared, key, topic, member);
    }

    /// Removes a subscription (see [`Fanout::remove`]).
    pub fn remove(&self, shared: &Arc<Shared>, key: &str, member: u64) {
        self.of(shared, key).remove(shared, key, member);
    }

    /// The fan-out subscriptions of the topic whose stream is `key`, in the order they came.
    pub fn subscriptions(&self, shared: &Shared, key: &str) -> Vec<u64> {
        let shard = shared.writer.shard(key.as_bytes());
        let Some(reader) = lock(&self.readers).get(&shard).cloned() else {
            return Vec::new();
        };
        let state = reader.state();
        state.topics.get(key).map_or_else(Vec::new, |topic| {
            topic.members.iter().map(|member| member.id).collect()
        })
    }

    /// The stream was deleted (see [`Fanout::restart`]).
    pub fn restart(&self, shared: &Shared, key: &str) {
        self.of(shared, key).restart(key);
    }

    /// Stops every reader and forgets every subscription (the pubsub is closing).
    pub async fn stop_all(&self, shared: &Shared) {
        let readers: Vec<Arc<Fanout>> = lock(&self.readers).drain().map(|(_, r)| r).collect();
        futures::future::join_all(readers.iter().map(|reader| reader.stop_all(shared))).await;
    }
}

/// Fan-out subscriptions whose topics one read can name, and their reader.
#[derive(Default)]
pub(crate) struct Fanout {
    /// A stream key of this reader's: its connection goes to that key's node.
    node_key: String,
    state: Mutex<State>,
    /// The reader connection's `CLIENT ID`; 0 while there is none (or the server did not
    /// tell it).
    reader_id: AtomicI64,
    /// Bumped whenever a subscription is added.
    generation: AtomicU64,
    /// The generation the reader's current read was made for.
    seen: AtomicU64,
}

#[derive(Default)]
struct State {
    /// By stream key.
    topics: HashMap<String, Topic>,
    reader: Option<JoinHandle<()>>,
}

struct Topic {
    topic: String,
    members: Vec<Arc<Member>>,
    /// Bumped by clearTopic: a read issued before it is discarded, its positions are stale.
    epoch: u64,
}

/// What one read asks of one stream.
struct Read {
    key: String,
    topic: String,
    epoch: u64,
    members: Vec<Arc<Member>>,
    from: EntryId,
}

impl Fanout {
    fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// Adds a subscription to the topic whose stream is `key`, starts the reader if none
    /// runs, and has the reader's next read include it.
    fn add(self: &Arc<Self>, shared: &Arc<Shared>, key: String, topic: &str, member: Arc<Member>) {
        let generation = {
            let mut state = self.state();
            state
                .topics
                .entry(key)
                .or_insert_with(|| Topic {
                    topic: topic.to_owned(),
                    members: Vec::new(),
                    epoch: 0,
                })
                .members
                .push(member);
            if state.reader.is_none() {
                let reader = read_loop(Arc::clone(shared), Arc::clone(self));
                state.reader = Some(shared.runtime.spawn(reader));
            }
            self.generation.fetch_add(1, Ordering::AcqRel) + 1
        };
        self.wake(shared, generation);
    }

    /// Removes a subscription. The reader stops reading a topic left without any, and stops
    /// altogether (closing its connection) once no topic is left: its blocking read is
    /// interrupted, and it finishes handing out what it read.
    fn remove(self: &Arc<Self>, shared: &Arc<Shared>, key: &str, member: u64) {
        let generation = {
            let mut state = self.state();
            if let Some(topic) = state.topics.get_mut(key) {
                topic.members.retain(|m| m.id != member);
                if topic.members.is_empty() {
                    state.topics.remove(key);
                }
            }
            self.generation.fetch_add(1, Ordering::AcqRel) + 1
        };
        self.wake(shared, generation);
    }

    /// The stream was deleted (clearTopic): its subscriptions read the new stream from its
    /// start.
    fn restart(&self, key: &str) {
        if let Some(topic) = self.state().topics.get_mut(key) {
            topic.epoch += 1;
            for member in &topic.members {
                member.set_position(EntryId::ZERO);
            }
        }
    }

    /// Stops the reader and forgets every subscription (the pubsub is closing). Left without
    /// topics, the reader returns once its read is interrupted (see [`reader::stop`]).
    async fn stop_all(&self, shared: &Shared) {
        let task = {
            let mut state = self.state();
            state.topics.clear();
            state.reader.take()
        };
        if let Some(task) = task {
            let id = || self.reader_id.load(Ordering::Acquire);
            reader::stop(shared, &self.node_key, id, task).await;
        }
    }

    /// Interrupts the reader's blocking read until it reads with `generation`'s topics. A
    /// wake-up that arrives before the read is sent finds nothing to interrupt, so it is
    /// repeated a few times; past those, the read ends by itself within `blockMs`.
    fn wake(self: &Arc<Self>, shared: &Arc<Shared>, generation: u64) {
        let shared = Arc::clone(shared);
        let fanout = Arc::clone(self);
        shared.runtime.clone().spawn(async move {
            let id = || fanout.reader_id.load(Ordering::Acquire);
            let done = || {
                fanout.seen.load(Ordering::Acquire) >= generation
                    || shared.closed.load(Ordering::Acquire)
            };
            let woken = reader::interrupt(&shared, &fanout.node_key, id, WAKE_TRIES, done).await;
            if let Err(err) = woken {
                shared.notice(
                    Level::Debug,
                    "could not interrupt the fan-out read (CLIENT UNBLOCK); a new topic is read \
                     within blockMs",
                    &[("err", err.full_message().into())],
                );
            }
        });
    }

    /// What the next read asks for: the topics whose subscriptions all have room, each from
    /// the lowest position among its subscriptions. Also the subscriptions without room.
    fn plan(&self) -> Option<(Vec<Read>, Vec<Arc<Member>>)> {
        let state = self.state();
        if state.topics.is_empty() {
            return None;
        }
        self.seen
            .store(self.generation.load(Ordering::Acquire), Ordering::Release);
        let mut reads = Vec::new();
        let mut full = Vec::new();
        for (key, topic) in &state.topics {
            let waiting: Vec<_> = topic
                .members
                .iter()
                .filter(|m| m.free() == 0)
                .cloned()
                .collect();
            if !waiting.is_empty() {
                full.extend(waiting);
                continue;
            }
            let from = topic
                .members
                .iter()
                .map(|m| m.position())
                .min()
                .unwrap_or_default();
            reads.push(Read {
                key: key.clone(),
                topic: topic.topic.clone(),
                epoch: topic.epoch,
                members: topic.members.clone(),
                from,
            });
        }
        Some((reads, full))
    }

    /// Whether the read made for `epoch` of `key` still counts (no clearTopic since).
    fn current(&self, key: &str, epoch: u64) -> bool {
        self.state()
            .topics
            .get(key)
            .is_some_and(|topic| topic.epoch == epoch)
    }

    /// The reader is gone: forget it, unless topics came meanwhile (then keep going).
    fn retire(&self) -> bool {
        let mut state = self.state();
        if state.topics.is_empty() {
            state.reader = None;
            true
        } else {
            false
        }
    }
}

/// The fan-out reader: reads every topic with subscriptions and hands each subscription the
/// entries past its position. Runs while there are fan-out subscriptions.
async fn read_loop(shared: Arc<Shared>, fanout: Arc<Fanout>) {
    let options = &shared.options;
    let throttle = Throttle::default();
    let mut connection: Option<Link> = None;
    let mut backoff = Backoff::default();
    let report = |message: &str, err: &Error| shared.throttled(&throttle, message, Some(err), &[]);
    loop {
        if shared.closed.load(Ordering::Acquire) {
            return;
        }
        let Some((reads, full)) = fanout.plan() else {
            if fanout.retire() {
                return;
            }
            continue;
        };
        if reads.is_empty() {
            // Every topic has a subscription at `maxInFlight`: wait until one has room (or
            // a while, for topics added meanwhile).
            let room = full
                .iter()
                .filter_map(|m| m.room.clone())
                .map(|places| Box::pin(async move { drop(places.acquire_owned().await) }));
            let _ = tokio::time::timeout(options.block, futures::future::select_all(room)).await;
            continue;
        }
        let count = reads
            .iter()
            .flat_map(|read| read.members.iter().map(|m| m.free()))
            .min()
            .unwrap_or(usize::MAX)
            .min(options.batch_count)
            .max(1);

        let mut conn = match connection.take() {
            Some(conn) => conn,
            None => match shared.writer.dedicated(fanout.node_key.as_bytes()).await {
                Ok((conn, id)) => {
                    fanout.reader_id.store(id.unwrap_or(0), Ordering::Release);
                    conn
                }
                Err(err) => {
                    report("fan-out reader cannot connect; retrying", &err);
                    tokio::time::sleep(backoff.next()).await;
                    continue;
                }
            },
        };
        let mut pipe = redis::pipe();
        let cmd = pipe
            .cmd("XREAD")
            .arg("COUNT")
            .arg(count)
            .arg("BLOCK")
            .arg(super::duration_ms(options.block))
            .arg("STREAMS");
        for read in &reads {
            cmd.arg(&read.key);
        }
        for read in &reads {
            cmd.arg(read.from.to_string());
        }
        let outcome = tokio::time::timeout(
            options
                .block
                .saturating_add(options.connection.command_timeout),
            reader::read_all(&mut conn, &pipe, 1),
        )
        .await;
        match outcome {
            Ok(Ok(streams)) => {
                connection = Some(conn);
                backoff.reset();
                for (key, entries) in streams {
                    let Some(read) = reads.iter().find(|read| read.key == key) else {
                        continue;
                    };
                    if fanout.current(&key, read.epoch) {
                        deliver(&shared, read, entries).await;
                    }
                }
            }
            Ok(Err(err)) => {
                // A server error (WRONGTYPE, OOM) leaves the connection usable; anything
                // else may have broken it.
                if matches!(err.kind(), redis::ErrorKind::Server(_)) {
                    connection = Some(conn);
                } else {
                    fanout.reader_id.store(0, Ordering::Release);
                }
                report(
                    "fan-out read failed; retrying",
                    &Error::from_redis(err, options.connection.command_timeout),
                );
                tokio::time::sleep(backoff.next()).await;
            }
            Err(_) => {
                // No answer past BLOCK + timeout: frozen or unreachable. A fresh connection
                // is the only way to know; the old one may never answer.
                fanout.reader_id.store(0, Ordering::Release);
                report(
                    "fan-out read timed out; reconnecting",
                    &Error::timeout(
                        options
                            .block
                            .saturating_add(options.connection.command_timeout),
                    ),
                );
                tokio::time::sleep(backoff.next()).await;
            }
        }
    }
}

/// Hands each entry to every subscription of the topic whose position is before it.
async fn deliver(shared: &Arc<Shared>, read: &Read, entries: Vec<Entry>) {
    for entry in entries {
        let Some(id) = EntryId::parse(&entry.id) else {
            continue;
        };
        let takers: Vec<&Arc<Member>> = read.members.iter().filter(|m| m.position() < id).collect();
        if takers.is_empty() {
            continue;
        }
        let Some(parsed) = entry.event.and_then(event::parse) else {
            shared.notice(
                Level::Warn,
                "malformed entry (no JSON object in its event field); skipping it",
                &[
                    ("topic", read.topic.clone().into()),
                    ("entryId", entry.id.into()),
                ],
            );
            for member in takers {
                member.set_position(id);
            }
            continue;
        };
        let json: Arc<str> = Arc::from(parsed.json);
        for member in takers {
            member.set_position(id);
            let origin = Origin::Fanout {
                key: read.key.clone(),
                topic: read.topic.clone(),
            };
            let place = member
                .room
                .as_ref()
                .and_then(|places| Arc::clone(places).try_acquire_owned().ok());
            let Some(delivery) = delivery::register(
                shared,
                origin,
                entry.id.clone(),
                Arc::clone(&json),
                parsed.attempt,
                place,
            ) else {
                continue;
            };
            if let Err(unsent) = member.tx.send(delivery).await {
                // Unsubscribed meanwhile.
                settle::settle_unread(&unsent.0, Settle::Release).await;
            }
        }
    }
}
