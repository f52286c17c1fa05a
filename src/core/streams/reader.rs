//! What the group readers and the fan-out reader share: sending reads and gathering their
//! entries, backoff between failures, and the members a reader hands entries to.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::Value;
use tokio::sync::{mpsc, Semaphore};

use super::delivery::Delivery;
use super::event::{self, Entry, EntryId};
use crate::core::connection::parse;

/// Deliveries read but not yet taken by a subscription, at least. Kept small: what sits in a
/// channel is read (for a group, owned by this consumer) but not yet being handled.
pub(super) const MIN_BUFFER: usize = 16;
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(2);

/// One subscription as its reader sees it: where its deliveries go.
pub(crate) struct Member {
    pub id: u64,
    pub tx: mpsc::Sender<Delivery>,
    /// Fan-out: the last entry this subscription was given; reads skip entries up to it.
    pub position: Mutex<EntryId>,
    /// Fan-out: this subscription's `maxInFlight` places (a group's belong to its consumer).
    pub room: Option<std::sync::Arc<Semaphore>>,
}

impl Member {
    pub fn position(&self) -> EntryId {
        *super::lock(&self.position)
    }

    pub fn set_position(&self, id: EntryId) {
        *super::lock(&self.position) = id;
    }

    /// How many more deliveries its `maxInFlight` lets it hold (`usize::MAX` unlimited).
    pub fn free(&self) -> usize {
        self.room
            .as_ref()
            .map_or(usize::MAX, |places| places.available_permits())
    }
}

/// Sends the reads of `pipe` and gathers their entries, stream by stream, in order. A read
/// that failed ends the batch: what the reads before it returned is delivered (the next read
/// meets the error again, if it lasts), and the error is the answer only when nothing was
/// read. Entries a read after it returned stay pending for this consumer until a reclaim
/// hands them out.
pub(super) async fn read_all(
    conn: &mut MultiplexedConnection,
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
