//! Consumer groups: this process is one consumer of each group it subscribes to on a topic,
//! named `<group>-<uuid>`, with one reader (`reader.rs`) and one connection, shared by all
//! its subscriptions of that group on that topic; each entry goes to one of them in turn.
//! Here: the consumer itself (the entries it holds, its `maxInFlight` places, its read
//! position), its subscriptions joining and leaving, and creating the group.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use redis::Value;
use tokio::sync::{Notify, Semaphore};
use tokio::task::JoinHandle;

use super::event;
use super::member::{Member, Members};
use super::reader;
use super::Shared;
use crate::core::connection::parse;
use crate::core::error::Result;
use crate::core::lock;

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
    pub(super) room: Option<Arc<Semaphore>>,
    /// Its subscriptions, and its reader while it has any.
    pub(super) members: Mutex<Members>,
    cursor: Mutex<Cursor>,
    /// Numbers the readers started, so one replaced by a newer one stops.
    generations: AtomicU64,
    /// The `CLIENT ID` of each reader's connection, by generation, while it has one the
    /// server told: what interrupts its blocking read when it is stopped. By generation, as
    /// a reader being stopped and the next one started meanwhile may both be reading.
    reader_ids: Mutex<HashMap<u64, i64>>,
    /// Wakes a reader waiting for room when it is stopped.
    pub(super) stopping: Notify,
}

/// Where a reader is: the last entry read (where to create the group again after NOGROUP)
/// and the anchor used before any.
#[derive(Debug)]
pub(super) struct Cursor {
    pub(super) position: Option<String>,
    /// The event `id` of the entry at `position`: after NOGROUP, tells the stream we read
    /// from apart from one re-created under the same key.
    pub(super) position_event: Option<String>,
    pub(super) anchor: &'static str,
    /// Bumped by clearTopic: a read issued before it is discarded, its position is stale.
    pub(super) epoch: u64,
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
                .options
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
            reader_ids: Mutex::new(HashMap::new()),
            stopping: Notify::new(),
        })
    }

    /// Reader `generation`'s connection id, or 0 when none is known.
    fn reader_id(&self, generation: u64) -> i64 {
        lock(&self.reader_ids)
            .get(&generation)
            .copied()
            .unwrap_or(0)
    }

    /// Records reader `generation`'s connection id (`None`: it has none, or no id is known).
    pub(super) fn set_reader_id(&self, generation: u64, id: Option<i64>) {
        let mut ids = lock(&self.reader_ids);
        match id {
            Some(id) => ids.insert(generation, id),
            None => ids.remove(&generation),
        };
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

    pub(super) fn cursor(&self) -> MutexGuard<'_, Cursor> {
        lock(&self.cursor)
    }

    /// Adds a subscription; when no reader runs, starts one with `start`, given the
    /// reader's generation.
    pub fn join(&self, member: Arc<Member>, start: impl FnOnce(u64) -> JoinHandle<()>) {
        let mut members = self.members();
        members.list.push(member);
        if members.reader.is_none() {
            let generation = self.generations.fetch_add(1, Ordering::Relaxed) + 1;
            members.reader = Some((generation, start(generation)));
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
        self.stop_reader(shared, reader).await;
    }

    /// Stops serving every subscription (the pubsub is closing), and stops the reader.
    pub async fn stop_all(&self, shared: &Shared) {
        let reader = {
            let mut members = self.members();
            members.list.clear();
            members.reader.take()
        };
        self.stop_reader(shared, reader).await;
    }

    /// Stops a reader that was told to stop (taken out of `members`): its blocking read is
    /// interrupted, so it takes no entry meanwhile, and whatever a read had taken it hands
    /// back to the group before it ends (see [`reader::stop`]).
    async fn stop_reader(&self, shared: &Shared, reader: Option<(u64, JoinHandle<()>)>) {
        let Some((generation, task)) = reader else {
            return;
        };
        self.stopping.notify_waiters();
        reader::stop(shared, &self.key, || self.reader_id(generation), task).await;
    }

    /// Whether reader `generation` should go on: it is the current one and has subscriptions.
    pub(super) fn serves(&self, generation: u64) -> bool {
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
}

/// XGROUP CREATE ... MKSTREAM (with PEXPIRE in the same MULTI when an idle TTL is set, so
/// a stream created only by a subscribe still expires). An existing group (BUSYGROUP)
/// keeps its position, which is what a second subscriber of the group wants.
pub(super) async fn create_group(shared: &Shared, key: &str, group: &str, at: &str) -> Result<()> {
    let ttl = shared.options.idle_ttl_ms();
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
        Err(err) => Err(shared.writer.classify(err)),
    }
}
