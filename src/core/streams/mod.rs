//! The Redis Streams event transport: Mastra's PubSub semantics, in pure Rust.
//!
//! Each topic is a stream `<keyPrefix>:<topic>` whose entries hold one field, `event`, with
//! the event as JSON: the layout of Mastra's own Redis Streams backend, so processes running
//! either can share topics. [`StreamsPubSub::publish_stamped_each`] appends events the
//! caller stamped; [`StreamsPubSub::subscribe`] returns a [`Subscription`] whose deliveries
//! arrive on a channel. A [`Delivery`] is held by its consumer until it is acked or nacked;
//! its handler may say it is still alive ([`Delivery::extend`]).
//!
//! The files, by concept:
//! - `event.rs`: events on the wire: reading entries back, the fields delivery needs.
//! - `publish.rs`: appends, and the second send of appends a broken connection cut off.
//! - `subscription.rs`: subscribing and unsubscribing; which reader serves a subscription.
//! - `group.rs`: this process's consumer of a group on a topic: what it holds, its places,
//!   where it reads.
//! - `member.rs`: a subscription as its reader sees it; a consumer's subscriptions in turn.
//! - `reader.rs`: a consumer's reader (reads, NOGROUP recovery, reconnects), and what the
//!   fan-out reader shares with it (interrupting a blocking read, stopping a reader).
//! - `fanout.rs`: the one reader of every fan-out subscription of this process (on a
//!   cluster, one per hash slot their topics live in).
//! - `delivery.rs`: a delivery, held until settled (its handler's heartbeat, `extend`), and
//!   the table of those held.
//! - `settle.rs`: ack, nack, redelivery, the attempt cap; settles that could not reach Redis
//!   retried in the background.
//! - `local.rs`: events published `localOnly`, never in Redis: who gets one, and whether a
//!   nacked one is delivered again, by the rules of every other delivery.
//! - `reclaim.rs`: taking over what a dead consumer left idle; keeping held entries claimed.
//! - `keeper.rs`: the task beside the readers: keeping claims, the in-flight timeout,
//!   warnings about long holds.
//! - `trim.rs`: trimming streams without cutting entries a group has not settled.
//! - `trim_topic.rs`: `trimTopic`, removing one run's entries from a shared topic, in pages,
//!   sparing those a group has not settled.
//! - `*.lua`: the scripts the files above run, registered in `core/scripts.rs`:
//!   `append_again.lua` (`publish.rs`), `settle.lua` (`settle.rs`), `reclaim.lua` and
//!   `keep.lua` (`reclaim.rs`), `trim.lua` and `trim_topic.lua` (theirs).
//! - `tests/`: against real `redis-server` processes, a file per what they prove
//!   (`delivery.rs`, `local.rs`, `recovery.rs`, `settling.rs`); `mod.rs` what they share.
//!
//! Connections: every command that does not block (XADD, XACK, XGROUP, XAUTOCLAIM, DEL, the
//! scripts) multiplexes over one connection, shared with the lease store; where the caller
//! runs an event loop a connection can run on, the caller's publishes, acks, nacks and
//! extends (and the lease store's calls) go on one polled there instead. Blocking reads
//! need connections of their own: one for all fan-out subscriptions, and one per topic and
//! consumer group this process reads. Every command is bounded by a timeout; readers
//! reconnect with backoff.

mod delivery;
mod event;
mod fanout;
mod group;
mod keeper;
mod local;
mod member;
mod publish;
mod reader;
mod reclaim;
mod settle;
mod subscription;
mod trim;
mod trim_topic;

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Once};
use std::time::Duration;

use serde_json::Value as Json;

use crate::core::connection::{Connection, ConnectionOptions};
use crate::core::error::{Error, InputErrorKind, Result, Subject};
use crate::core::lock;
use crate::core::log::{Level, Logger, Notice, Throttle};

pub use delivery::{Delivery, Settled};
pub use subscription::Subscription;
pub use trim_topic::RunEntries;

/// How to reach Redis, where topics live, and how delivery behaves. The defaults are those
/// of Mastra's own Redis Streams backend wherever it has one.
#[derive(Clone)]
pub struct StreamsOptions {
    /// The server, credentials, TLS, connection name, and the bounds on connecting and on
    /// every non-blocking command (publish, ack, nack, group creation, clear). With a
    /// `reactor` (the caller's event loop), the caller's own publishes, acks, nacks and
    /// extends go on a connection polled there, where the deployment allows it (one server
    /// at a `redis://` or `rediss://` URL, the master behind Sentinel, a cluster): a call and its
    /// answer never wait for the runtime's thread.
    /// Everything else (reads, the keeper, reclaims, trims, settles sent again in the
    /// background) stays on the runtime, which goes on while the caller's loop is busy.
    pub connection: ConnectionOptions,
    /// A topic's stream is `<key_prefix>:<topic>`. Default `mastra:topic`, as Mastra's.
    pub key_prefix: String,
    /// How long one blocking read waits for new entries (`BLOCK`). Default 1 s (Mastra's
    /// `blockMs`).
    pub block: Duration,
    /// Most entries one read returns (`COUNT`). Default 10, as Mastra's reads.
    pub batch_count: usize,
    /// Streams are trimmed to about this many entries, never cutting an entry a consumer
    /// group has not settled; 0 disables trimming. Default 10 000 (Mastra's
    /// `maxStreamLength`).
    pub max_len: u64,
    /// Where trimming cuts entries a group has not settled after all (each one lost is
    /// counted in a warning); 0 never does. Default ten times `max_len`.
    pub hard_max_len: u64,
    /// Sliding idle expiry of a stream, refreshed (PEXPIRE) by every append and group
    /// creation. Default `None` (Mastra's `streamIdleTtlMs: 0`).
    pub idle_ttl: Option<Duration>,
    /// A nacked or reclaimed event is delivered again until its `deliveryAttempt` reaches
    /// this, then dropped with a warning. `None` redelivers forever. Default `Some(5)`, as
    /// Mastra's.
    pub max_delivery_attempts: Option<u64>,
    /// Most events one consumer holds unsettled (a group consumer of this process, or one
    /// fan-out subscription). At the limit its reader waits, so the rest of a backlog stays
    /// for the group's other consumers. `None` sets no limit. Default `Some(1000)`.
    pub max_in_flight: Option<usize>,
    /// A delivery held unsettled this long is nacked on its handler's behalf, with a
    /// warning (Mastra's `inFlightTimeoutMs`). Default `None`: held until settled.
    pub in_flight_timeout: Option<Duration>,
    /// How often a consumer looks for entries another consumer read and never settled
    /// (XAUTOCLAIM). `None` disables reclaiming. Default 30 s (Mastra's
    /// `reclaimIntervalMs`). A consumer also runs one pass as soon as it starts.
    pub reclaim_interval: Option<Duration>,
    /// How long an entry must sit unclaimed before it is reclaimed. Default 60 s (Mastra's
    /// `reclaimIdleMs`). A live consumer keeps the entries it holds claimed, however long
    /// they take: this bounds how soon a dead consumer's entries move to a live one.
    pub reclaim_idle: Duration,
    /// Receives warnings (dropped events, connection trouble) and debug notes.
    pub logger: Option<Arc<dyn Logger>>,
}

impl Default for StreamsOptions {
    fn default() -> Self {
        Self {
            connection: ConnectionOptions::default(),
            key_prefix: "mastra:topic".to_owned(),
            block: Duration::from_secs(1),
            batch_count: 10,
            max_len: DEFAULT_MAX_LEN,
            hard_max_len: DEFAULT_MAX_LEN * HARD_MAX_LEN_FACTOR,
            idle_ttl: None,
            max_delivery_attempts: Some(DEFAULT_MAX_DELIVERY_ATTEMPTS),
            max_in_flight: Some(1000),
            in_flight_timeout: None,
            reclaim_interval: Some(Duration::from_secs(30)),
            reclaim_idle: Duration::from_secs(60),
            logger: None,
        }
    }
}

impl StreamsOptions {
    /// `idle_ttl` as the scripts take it: whole milliseconds, 0 for none.
    pub(crate) fn idle_ttl_ms(&self) -> u64 {
        self.idle_ttl.map_or(0, duration_ms)
    }

    /// `reclaim_idle` in whole milliseconds, as XAUTOCLAIM takes it.
    pub(crate) fn reclaim_idle_ms(&self) -> u64 {
        duration_ms(self.reclaim_idle)
    }
}

/// Mastra's `maxStreamLength` default.
pub const DEFAULT_MAX_LEN: u64 = 10_000;
/// `hard_max_len` is this many times `max_len` unless set.
pub const HARD_MAX_LEN_FACTOR: u64 = 10;
/// Mastra's `maxDeliveryAttempts` default.
pub const DEFAULT_MAX_DELIVERY_ATTEMPTS: u64 = 5;

impl fmt::Debug for StreamsOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamsOptions")
            .field("connection", &self.connection)
            .field("key_prefix", &self.key_prefix)
            .field("block", &self.block)
            .field("batch_count", &self.batch_count)
            .field("max_len", &self.max_len)
            .field("hard_max_len", &self.hard_max_len)
            .field("idle_ttl", &self.idle_ttl)
            .field("max_delivery_attempts", &self.max_delivery_attempts)
            .field("max_in_flight", &self.max_in_flight)
            .field("in_flight_timeout", &self.in_flight_timeout)
            .field("reclaim_interval", &self.reclaim_interval)
            .field("reclaim_idle", &self.reclaim_idle)
            .field("logger", &self.logger.is_some())
            .finish()
    }
}

/// A subscription's number, given before it opens ([`StreamsPubSub::subscription_id`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SubscriptionId(u64);

impl SubscriptionId {
    pub fn get(self) -> u64 {
        self.0
    }
}

/// Where a new subscription starts reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StartFrom {
    /// The stream's first entry: a late subscriber still gets the backlog. Mastra's default.
    #[default]
    Earliest,
    /// Only entries appended after `subscribe` returned.
    Latest,
}

/// How to subscribe to a topic.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SubscribeOptions {
    /// With a group, subscribers of that group compete: each entry goes to one of them
    /// (a Redis consumer group; this process is one consumer of it per topic). Without one,
    /// every subscriber sees every entry (fan-out). Must not be empty.
    pub group: Option<String>,
    /// Where a new group (or a fan-out subscription) starts. An existing group keeps its
    /// position.
    pub start_from: StartFrom,
}

/// Mastra's PubSub over Redis Streams. Cheap to share behind an `Arc`.
pub struct StreamsPubSub {
    shared: Arc<Shared>,
}

impl fmt::Debug for StreamsPubSub {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamsPubSub")
            .field("key_prefix", &self.shared.options.key_prefix)
            .field("closed", &self.shared.closed.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl StreamsPubSub {
    /// Checks the options; does not connect. Must run inside a Tokio runtime, whose handle
    /// the reader tasks are spawned on.
    pub fn new(options: StreamsOptions) -> Result<Self> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
            Error::Internal("StreamsPubSub must be created inside a Tokio runtime".into())
        })?;
        check(&options)?;
        let mut on_runtime = options.connection.clone();
        on_runtime.reactor = None;
        let writer = Arc::new(Connection::new(&on_runtime, Subject::StreamsPubSub)?);
        let front = writer.beside(&options.connection)?.map(Arc::new);
        Ok(Self {
            shared: Arc::new(Shared {
                writer,
                front,
                options,
                closed: AtomicBool::new(false),
                closing: tokio::sync::watch::Sender::new(false),
                settling: tokio::sync::watch::Sender::new(0),
                publishes: tokio::sync::RwLock::new(()),
                readers: tokio::sync::RwLock::new(()),
                consumers: Mutex::new(HashMap::new()),
                fanout: fanout::Fanouts::default(),
                deliveries: Mutex::new(HashMap::new()),
                fanout_nacks: Mutex::new(VecDeque::new()),
                next_id: AtomicU64::new(1),
                opening: Mutex::new(HashMap::new()),
                trim: trim::Trimmer::default(),
                keeper: Once::new(),
                runtime,
            }),
        })
    }

    /// The connection the caller's publishes, acks, nacks and extends go through (on the
    /// caller's loop where it can run there, see [`StreamsOptions::connection`]); a lease
    /// store can share it.
    pub fn connection(&self) -> Arc<Connection> {
        Arc::clone(self.shared.front())
    }

    /// Subscribes to a topic. When this returns, the starting point is fixed (the group
    /// exists, or the fan-out position is resolved), so an event published afterwards is
    /// delivered. Fails on a transport error rather than subscribing deaf.
    #[cfg(test)]
    pub async fn subscribe(&self, topic: &str, options: SubscribeOptions) -> Result<Subscription> {
        let id = self.subscription_id(topic, &options);
        self.subscribe_as(id, topic, options).await
    }

    /// Numbers a subscription to `topic` before it opens: a caller can file it under its id
    /// at once, and [`StreamsPubSub::local_recipients`] names it from now on. Pass the id to
    /// [`StreamsPubSub::subscribe_as`] with the same topic and options.
    pub fn subscription_id(&self, topic: &str, options: &SubscribeOptions) -> SubscriptionId {
        let shared = &self.shared;
        let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
        let opening = (shared.stream_key(topic), options.group.clone());
        lock(&shared.opening).insert(id, opening);
        SubscriptionId(id)
    }

    /// [`StreamsPubSub::subscribe`], the subscription numbered `id`.
    pub async fn subscribe_as(
        &self,
        id: SubscriptionId,
        topic: &str,
        options: SubscribeOptions,
    ) -> Result<Subscription> {
        let opened = self.open_as(id, topic, options).await;
        // Open or failed: it is a member of its reader's now, or nothing.
        lock(&self.shared.opening).remove(&id.0);
        opened
    }

    async fn open_as(
        &self,
        id: SubscriptionId,
        topic: &str,
        options: SubscribeOptions,
    ) -> Result<Subscription> {
        let shared = &self.shared;
        if shared.closed.load(Ordering::Acquire) {
            return Err(Error::Closed(Subject::StreamsSubscribe));
        }
        if options.group.as_deref() == Some("") {
            return Err(Error::streams_argument(
                InputErrorKind::Range,
                "group must not be empty",
            ));
        }
        subscription::open(Arc::clone(shared), id.0, topic, options).await
    }

    /// The delivery with this id ([`Delivery::id`]), while it is held: handed out and not yet
    /// settled (nor nacked on its behalf by the in-flight timeout).
    pub fn delivery(&self, id: u64) -> Option<Delivery> {
        delivery::find(&self.shared, id)
    }

    /// Waits until every publish already in flight has settled (each is bounded by the
    /// command timeout, so this is too).
    pub async fn flush(&self) {
        let bound = self
            .shared
            .options
            .connection
            .command_timeout
            .saturating_add(Duration::from_millis(100));
        let _ = tokio::time::timeout(bound, self.shared.publishes.write()).await;
    }

    /// Deletes a topic's stream, its entries and every consumer group on it. Never fails:
    /// a failure is reported to the logger (the idle TTL, if set, is the backstop).
    /// Subscriptions of this process on the topic carry on from the new stream's start.
    pub async fn clear_topic(&self, topic: &str) {
        let shared = &self.shared;
        if shared.closed.load(Ordering::Acquire) {
            return;
        }
        let key = shared.stream_key(topic);
        let mut del = redis::cmd("DEL");
        del.arg(&key);
        match shared
            .writer
            .run(|mut c| async move { del.query_async::<redis::Value>(&mut c).await })
            .await
        {
            Ok(_) => {
                shared.forget_appends(&key);
                shared.fanout.restart(shared, &key);
                for consumer in shared.consumers().values() {
                    if consumer.key == key {
                        consumer.restart();
                    }
                }
            }
            Err(err) => shared.notice(
                Level::Warn,
                "clearTopic failed; the stream was not deleted",
                &[("topic", topic.into()), ("err", err.full_message().into())],
            ),
        }
    }

    /// Removes the entries of one run from a topic's stream (`trimTopic`): those whose event's
    /// `runId` is the run's and, with `produced_before`, whose `data.producedAt` is no later.
    /// An entry a consumer group holds unsettled stays, as does every other run's. Fails only
    /// on bad arguments, before any I/O; a Redis failure is reported to the logger. Works page
    /// by page, each page one XRANGE and one script, each bounded by the command timeout.
    pub async fn trim_topic(&self, topic: &str, run: &RunEntries) -> Result<()> {
        run.check()?;
        if !self.shared.closed.load(Ordering::Acquire) {
            self.shared.trim_topic(topic, run).await;
        }
        Ok(())
    }

    /// Stops every reader, waits for the publishes and settles in flight, and closes every
    /// connection; takes no more publishes or subscriptions. Each blocking read is
    /// interrupted (`CLIENT UNBLOCK`), so when this returns no read of this pubsub is left
    /// that could take an entry: what is published next goes to a live consumer. Where the
    /// server refuses `CLIENT ID` or `CLIENT UNBLOCK`, a read is waited for instead (within
    /// BLOCK). Entries a read took meanwhile, never handed out, go back to the group. Every ack
    /// and nack begun before this has reached Redis when it returns, or failed for good and
    /// been reported (one that was retrying in the background is sent once more at once).
    /// Deliveries still held stay pending in Redis, for a sibling to reclaim after
    /// `reclaimIdleMs`; acking or nacking them afterwards does nothing. Idempotent; bounded
    /// by the block and command timeouts even while Redis is down.
    pub async fn close(&self) {
        let shared = &self.shared;
        if !shared.closed.swap(true, Ordering::AcqRel) {
            shared.closing.send_replace(true);
            let consumers: Vec<_> = shared.consumers().values().cloned().collect();
            let stops = consumers.iter().map(|consumer| consumer.stop_all(shared));
            futures::join!(
                futures::future::join_all(stops),
                shared.fanout.stop_all(shared)
            );
            let timeout = shared.options.connection.command_timeout;
            // Readers an unsubscribe (or a dropped subscription) was stopping meanwhile, and
            // what their subscriptions hand back, end too before the connection closes.
            let bound = shared
                .options
                .block
                .saturating_add(timeout.saturating_mul(2));
            let _ = tokio::time::timeout(bound, shared.readers.write()).await;
            // A settle's send is bounded by the command timeout, and one retrying makes its
            // last attempt now: two sends at most.
            let mut settling = shared.settling.subscribe();
            let bound = timeout
                .saturating_mul(2)
                .saturating_add(Duration::from_millis(100));
            let _ = tokio::time::timeout(bound, settling.wait_for(|n| *n == 0)).await;
            self.flush().await;
            shared.writer.close();
            if let Some(front) = &shared.front {
                front.close();
            }
            shared.deliveries().clear();
        }
        self.flush().await;
    }
}

/// The option rules the types do not express.
fn check(options: &StreamsOptions) -> Result<()> {
    let range = |message: &str| Err(Error::option(InputErrorKind::Range, message));
    if options.key_prefix.is_empty() {
        return range("keyPrefix must not be empty");
    }
    let connection = &options.connection;
    if connection.command_timeout.is_zero() || connection.connect_timeout.is_zero() {
        return range("connectTimeoutMs and commandTimeoutMs must be at least 1 ms");
    }
    if options.batch_count == 0 {
        return range("batchCount must be at least 1");
    }
    if options.block.is_zero() {
        return range("blockMs must be at least 1 ms");
    }
    if options.max_in_flight == Some(0) {
        return range("maxInFlight must be at least 1 (or unlimited)");
    }
    if options.max_delivery_attempts == Some(0) {
        return range("maxDeliveryAttempts must be at least 1 (or unlimited)");
    }
    if options.idle_ttl.is_some_and(|ttl| ttl.as_millis() < 1)
        || options.in_flight_timeout.is_some_and(|t| t.as_millis() < 1)
    {
        return range("streamIdleTtlMs and inFlightTimeoutMs must be at least 1 ms when set");
    }
    if options.reclaim_idle.as_millis() < 1 || options.reclaim_interval.is_some_and(|i| i.is_zero())
    {
        return range("reclaimIdleMs and reclaimIntervalMs must be at least 1 ms");
    }
    if options.hard_max_len != 0 && options.hard_max_len < options.max_len {
        return range("hardMaxStreamLength must be at least maxStreamLength (or 0: never cut)");
    }
    if options.max_len == 0 && options.hard_max_len != 0 {
        return range(
            "hardMaxStreamLength needs maxStreamLength: with trimming off, nothing is cut",
        );
    }
    Ok(())
}

/// State shared by the pubsub, its reader tasks and its deliveries.
pub(crate) struct Shared {
    /// Every non-blocking command of the transport's own goes through it, on the runtime;
    /// readers open connections of their own from it.
    pub writer: Arc<Connection>,
    /// The caller's publishes, acks, nacks and extends, where they go on the caller's loop
    /// (see [`Shared::front`]).
    front: Option<Arc<Connection>>,
    /// As constructed: the tasks read their settings here.
    pub options: StreamsOptions,
    pub closed: AtomicBool,
    /// Turns true when `close` begins: settles retrying in the background make their last
    /// attempt at once.
    pub closing: tokio::sync::watch::Sender<bool>,
    /// How many settles are on their way to Redis (`settle::OnItsWay`): `close` waits for
    /// none to be left before the connection goes.
    pub settling: tokio::sync::watch::Sender<usize>,
    /// Publishes hold it shared while in flight; flush takes it exclusively.
    publishes: tokio::sync::RwLock<()>,
    /// Group readers hold it shared while they may read, and leaving subscriptions while
    /// they hand entries back; close takes it exclusively before closing the connection.
    pub readers: tokio::sync::RwLock<()>,
    /// This process's consumer of each (stream key, group) it subscribed to: it stays for
    /// the pubsub's life, so a group sees one consumer name per process and topic.
    consumers: Mutex<HashMap<(String, String), Arc<group::Consumer>>>,
    /// The reader of every fan-out subscription.
    pub fanout: fanout::Fanouts,
    /// Deliveries read and not yet settled, by id.
    deliveries: Mutex<HashMap<u64, Arc<delivery::State>>>,
    /// The fan-out events this process redelivered lately, hashed with their attempt: a
    /// nack of one by another subscriber here adds nothing (`settle.rs`).
    fanout_nacks: Mutex<VecDeque<u64>>,
    /// Numbers subscriptions and deliveries.
    pub next_id: AtomicU64,
    /// Subscriptions numbered and not yet open, by id: their stream key and group. They take
    /// part in `localOnly` deliveries already (`local.rs`), as they would in an in-process
    /// pubsub, from the `subscribe` call on.
    pub opening: Mutex<HashMap<u64, (String, Option<String>)>>,
    pub trim: trim::Trimmer,
    /// Starts the task that keeps held entries claimed, once a subscription needs it.
    pub keeper: Once,
    pub runtime: tokio::runtime::Handle,
}

impl Shared {
    /// The stream a topic lives in: `<keyPrefix>:<topic>`.
    pub fn stream_key(&self, topic: &str) -> String {
        format!("{}:{}", self.options.key_prefix, topic)
    }

    /// The topic a stream key belongs to.
    pub fn topic_of<'k>(&self, key: &'k str) -> &'k str {
        key.get(self.options.key_prefix.len() + 1..).unwrap_or(key)
    }

    /// The connection a caller's publishes, acks, nacks and extends go on: one on the
    /// caller's loop where it was given one ([`StreamsOptions::connection`]), else the
    /// writer. What is sent again in the background goes on the writer.
    pub fn front(&self) -> &Arc<Connection> {
        self.front.as_ref().unwrap_or(&self.writer)
    }

    pub fn consumers(&self) -> MutexGuard<'_, HashMap<(String, String), Arc<group::Consumer>>> {
        lock(&self.consumers)
    }

    pub fn deliveries(&self) -> MutexGuard<'_, HashMap<u64, Arc<delivery::State>>> {
        lock(&self.deliveries)
    }

    /// Reports to the logger, if any.
    pub fn notice(&self, level: Level, message: &str, fields: &[(&str, Json)]) {
        if let Some(logger) = &self.options.logger {
            logger.log(Notice::new(
                level,
                format!("mastra-lease streams: {message}"),
                fields,
            ));
        }
    }

    /// Reports one occurrence of a lasting kind of trouble: a warning the first time and
    /// then at most every 30 s (saying how many occurred since), debug notes in between.
    /// An error, if any, is reported with its code.
    pub fn throttled(
        &self,
        throttle: &Throttle,
        message: &str,
        err: Option<&Error>,
        fields: &[(&str, Json)],
    ) {
        let (level, count) = throttle.level();
        let mut all = Vec::with_capacity(fields.len() + 3);
        if let Some(err) = err {
            all.push(("code", Json::from(err.code())));
            all.push(("err", Json::from(err.full_message())));
        }
        if level == Level::Warn && count > 1 {
            all.push(("occurrences", Json::from(count)));
        }
        all.extend(fields.iter().cloned());
        self.notice(level, message, &all);
    }

    /// Starts the task that keeps held entries claimed, unless it runs already.
    pub fn start_keeper(self: &Arc<Self>) {
        self.keeper.call_once(|| {
            self.runtime.spawn(keeper::run(Arc::downgrade(self)));
        });
    }
}

/// The greatest entry of the stream at or below `upper` (`+`: its last entry), if any.
pub(crate) async fn last_entry(
    shared: &Shared,
    key: &str,
    upper: &str,
) -> Result<Option<event::Entry>> {
    let mut cmd = redis::cmd("XREVRANGE");
    cmd.arg(key).arg(upper).arg("-").arg("COUNT").arg(1);
    let reply = shared
        .writer
        .run(|mut c| async move { cmd.query_async::<redis::Value>(&mut c).await })
        .await?;
    Ok(event::range_reply(reply).pop())
}

pub(crate) fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

#[cfg(test)]
mod tests;
