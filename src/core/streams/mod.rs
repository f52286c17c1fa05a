//! The Redis Streams event transport: Mastra's PubSub semantics, in pure Rust.
//!
//! Each topic is a stream `<keyPrefix>:<topic>` whose entries hold one field, `event`, with
//! the event as JSON: the layout of Mastra's own Redis Streams backend, so processes running
//! either can share topics. [`StreamsPubSub::publish`] stamps `id`, `createdAt` and
//! `deliveryAttempt` and returns once XADD answered. [`StreamsPubSub::subscribe`] returns a
//! [`Subscription`] whose deliveries arrive on a Tokio channel; each [`Delivery`] is acked or
//! nacked through its own methods (dropping it unsettled counts as a nack).
//!
//! Connections: every command that does not block (XADD, XACK, XGROUP, XAUTOCLAIM, DEL,
//! the settle script) multiplexes over one `ConnectionManager`, so concurrent publishes and
//! acks are pipelined. A blocking read holds its connection until it returns, so each
//! subscription has its own reader connection and task (see `subscriber.rs` for why not one
//! shared reader). Every command is bounded by a timeout; readers reconnect with backoff.

mod event;
mod subscriber;

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use redis::{AsyncConnectionConfig, Client, Pipeline, RedisResult, Value};
use serde_json::{Map, Value as Json};

use crate::core::connection::{parse, Connection, TlsOptions};
use crate::core::error::{InputErrorKind, LeaseError, Result};

static APPEND_AGAIN: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(include_str!("append_again.lua")));
/// Most entries `append_again.lua` looks through for the events it sends again (it also
/// stops at 4 MiB of events): a bound on how long it holds Redis.
const AGAIN_SCAN: usize = 5_000;

pub use subscriber::{Acker, Delivery, Settled, Subscription};

/// How to reach Redis, where topics live, and how delivery behaves. The defaults are those
/// of Mastra's own Redis Streams backend wherever it has one.
#[derive(Clone)]
pub struct StreamsOptions {
    /// `redis://[user:pass@]host[:port][/db]`, `rediss://...` for TLS, or
    /// `redis+unix:///path/to.sock`. Default `redis://127.0.0.1:6379`.
    pub url: String,
    /// A topic's stream is `<key_prefix>:<topic>`. Default `mastra:topic`, as Mastra's.
    pub key_prefix: String,
    /// Bound on one attempt to open a connection. Default 2 s.
    pub connect_timeout: Duration,
    /// Bound on every non-blocking command (publish, ack, nack, group creation, clear),
    /// connecting included. Default 2 s.
    pub command_timeout: Duration,
    /// How long one blocking read waits for new entries (`BLOCK`). Default 1 s (Mastra's
    /// `blockMs`). Shorter makes a reclaim pass start sooner after it is due.
    pub block: Duration,
    /// Most entries one read returns (`COUNT`). Default 10, as Mastra's reads.
    pub batch_count: usize,
    /// `MAXLEN ~` threshold applied on every append; 0 disables trimming. Default 10 000
    /// (Mastra's `maxStreamLength`).
    pub max_len: u64,
    /// Sliding idle expiry of a stream, refreshed (PEXPIRE) by every append and group
    /// creation. Default `None` (Mastra's `streamIdleTtlMs: 0`).
    pub idle_ttl: Option<Duration>,
    /// A nacked or reclaimed event is delivered again until its `deliveryAttempt` reaches
    /// this, then dropped with a warning. `None` redelivers forever. Default `Some(5)`, as
    /// Mastra's.
    pub max_delivery_attempts: Option<u64>,
    /// Most events one subscription holds unsettled: read from Redis and not yet acked or
    /// nacked, and not let go by a handler that returned ([`Delivery::handled`]). At the
    /// limit its reader waits, so the rest of a backlog stays for the group's other
    /// consumers. `None` sets no limit. Default `Some(1000)`.
    pub max_in_flight: Option<usize>,
    /// How often a grouped subscription looks for entries another consumer read and never
    /// settled (XAUTOCLAIM). `None` disables reclaiming. Default 30 s (Mastra's
    /// `reclaimIntervalMs`). A subscription also runs one pass as soon as it starts.
    pub reclaim_interval: Option<Duration>,
    /// How long an entry must sit unsettled before it is reclaimed. Default 60 s (Mastra's
    /// `reclaimIdleMs`). A live consumer keeps the entries it is handling claimed, however
    /// long they take: this bounds how soon a dead consumer's entries move to a live one.
    pub reclaim_idle: Duration,
    /// Receives warnings (dropped events, connection trouble) and debug notes.
    pub logger: Option<Arc<dyn Logger>>,
    /// CA, client certificate and key for a `rediss://` URL. Default none.
    pub tls: TlsOptions,
}

impl Default for StreamsOptions {
    fn default() -> Self {
        Self {
            url: "redis://127.0.0.1:6379".to_owned(),
            key_prefix: "mastra:topic".to_owned(),
            connect_timeout: Duration::from_secs(2),
            command_timeout: Duration::from_secs(2),
            block: Duration::from_secs(1),
            batch_count: 10,
            max_len: 10_000,
            idle_ttl: None,
            max_delivery_attempts: Some(5),
            max_in_flight: Some(1000),
            reclaim_interval: Some(Duration::from_secs(30)),
            reclaim_idle: Duration::from_secs(60),
            logger: None,
            tls: TlsOptions::default(),
        }
    }
}

impl fmt::Debug for StreamsOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The URL may carry a password: never print it.
        f.debug_struct("StreamsOptions")
            .field("key_prefix", &self.key_prefix)
            .field("connect_timeout", &self.connect_timeout)
            .field("command_timeout", &self.command_timeout)
            .field("block", &self.block)
            .field("batch_count", &self.batch_count)
            .field("max_len", &self.max_len)
            .field("idle_ttl", &self.idle_ttl)
            .field("max_delivery_attempts", &self.max_delivery_attempts)
            .field("max_in_flight", &self.max_in_flight)
            .field("reclaim_interval", &self.reclaim_interval)
            .field("reclaim_idle", &self.reclaim_idle)
            .field("logger", &self.logger.is_some())
            .field("tls", &self.tls)
            .finish_non_exhaustive()
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
    /// (a Redis consumer group, one consumer per subscription). Without one, every
    /// subscriber sees every entry (fan-out). Must not be empty.
    pub group: Option<String>,
    /// Where a new group, or a fan-out subscription, starts. An existing group keeps its
    /// own position whatever this says.
    pub start_from: StartFrom,
}

/// What [`StreamsPubSub::publish`] appended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Published {
    /// The event's `id` (a UUID) as stamped into the JSON.
    pub id: String,
    /// The stream entry id Redis assigned (`<ms>-<seq>`).
    pub entry_id: String,
}

/// How much a [`Notice`] matters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// Expected trouble the transport recovered from (a group that already existed, a
    /// retried read). Mastra's backend logs these at `debug`.
    Debug,
    /// Something an operator should see: a dropped event, a connection that keeps failing.
    Warn,
}

/// One message for the [`Logger`]: a sentence and structured fields (topic, group, event
/// id, error), shaped like the `(message, fields)` pair Mastra's logger takes.
#[derive(Debug, Clone, PartialEq)]
pub struct Notice {
    /// Debug or warn.
    pub level: Level,
    /// A sentence, prefixed `mastra-lease streams:`.
    pub message: String,
    /// Context as JSON fields.
    pub fields: Map<String, Json>,
}

/// Where the transport reports what it could not report as an error to a caller: events
/// dropped after too many attempts, malformed entries, connection trouble in readers.
pub trait Logger: Send + Sync {
    /// Called from Tokio tasks; must not block.
    fn log(&self, notice: Notice);
}

/// Mastra's PubSub over Redis Streams. Cheap to share behind an `Arc`.
pub struct StreamsPubSub {
    shared: Arc<Shared>,
}

impl fmt::Debug for StreamsPubSub {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamsPubSub")
            .field("key_prefix", &self.shared.prefix)
            .field("closed", &self.shared.closed.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl StreamsPubSub {
    /// Checks the options; does not connect. Must run inside a Tokio runtime, whose handle
    /// the reader tasks (and the nacks of dropped deliveries) are spawned on.
    pub fn new(options: StreamsOptions) -> Result<Self> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
            LeaseError::Internal("StreamsPubSub must be created inside a Tokio runtime".into())
        })?;
        let writer = Arc::new(Connection::new(
            &options.url,
            &options.tls,
            options.connect_timeout,
            options.command_timeout,
        )?);
        let range = |message: &str| Err(LeaseError::option(InputErrorKind::Range, message));
        if options.key_prefix.is_empty() {
            return range("keyPrefix must not be empty");
        }
        if options.command_timeout.is_zero() || options.connect_timeout.is_zero() {
            return range("connectTimeoutMs and commandTimeoutMs must be at least 1 ms");
        }
        if options.block.as_millis() < 1 {
            // BLOCK 0 waits forever: a reader could then never notice a dead server.
            return range("blockMs must be at least 1 ms");
        }
        if options.batch_count == 0 {
            return range("batchCount must be at least 1");
        }
        if options.max_in_flight == Some(0) {
            return range("maxInFlight must be at least 1 (or unlimited)");
        }
        if options.max_delivery_attempts == Some(0) {
            return range("maxDeliveryAttempts must be at least 1 (or unlimited)");
        }
        if options.idle_ttl.is_some_and(|ttl| ttl.as_millis() < 1) {
            return range("streamIdleTtlMs must be at least 1 ms when set");
        }
        if options.reclaim_idle.as_millis() < 1
            || options.reclaim_interval.is_some_and(|i| i.is_zero())
        {
            return range("reclaimIdleMs and reclaimIntervalMs must be at least 1 ms");
        }
        // A blocking read legitimately takes up to `block` before answering.
        let reader_config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(options.connect_timeout))
            .set_response_timeout(Some(options.block.saturating_add(options.command_timeout)));
        let tuning = Tuning {
            connect_timeout: options.connect_timeout,
            command_timeout: options.command_timeout,
            block: options.block,
            batch_count: options.batch_count,
            max_len: options.max_len,
            ttl_ms: options.idle_ttl.map_or(0, duration_ms),
            max_attempts: options.max_delivery_attempts,
            max_in_flight: options.max_in_flight,
            reclaim_interval: options.reclaim_interval,
            reclaim_idle_ms: duration_ms(options.reclaim_idle),
        };
        Ok(Self {
            shared: Arc::new(Shared {
                client: writer.client().clone(),
                writer,
                reader_config,
                prefix: options.key_prefix,
                tuning,
                logger: options.logger,
                closed: AtomicBool::new(false),
                publishes: tokio::sync::RwLock::new(()),
                subscriptions: Mutex::new(HashMap::new()),
                next_subscription: AtomicU64::new(1),
                runtime,
                keeper: std::sync::Once::new(),
            }),
        })
    }

    /// The stream key of a topic: `<keyPrefix>:<topic>`.
    /// The multiplexed connection this transport writes through, for a lease store that
    /// should share it ([`crate::core::RedisStore::with_connection`]).
    pub fn connection(&self) -> Arc<Connection> {
        self.shared.writer.clone()
    }

    pub fn stream_key(&self, topic: &str) -> String {
        self.shared.stream_key(topic)
    }

    /// Appends one event to its topic's stream and returns once Redis answered. `event` must
    /// be a JSON object; `id`, `createdAt` and `deliveryAttempt` are stamped into it.
    pub async fn publish(&self, topic: &str, event: Json) -> Result<Published> {
        let mut answers = self.publish_batch(vec![(topic.to_owned(), event)]).await;
        answers
            .pop()
            .unwrap_or_else(|| Err(LeaseError::Internal("a publish went unanswered".into())))
    }

    /// Appends several events in one pipelined write; each gets its own answer, in order.
    /// A bad event fails alone, before anything is sent.
    pub async fn publish_batch(&self, events: Vec<(String, Json)>) -> Vec<Result<Published>> {
        let mut ids = Vec::with_capacity(events.len());
        let stamped = events
            .into_iter()
            .map(|(topic, event)| {
                let (id, json) = event::stamp(event)?;
                ids.push(id);
                Ok((topic, json))
            })
            .collect::<Vec<_>>();
        // The ids of the events that stamped, in order; the others answer with their error.
        let mut ids = ids.into_iter();
        let stamped_ok: Vec<bool> = stamped.iter().map(Result::is_ok).collect();
        self.append_batch(stamped)
            .await
            .into_iter()
            .zip(stamped_ok)
            .map(|(appended, ok)| {
                let id = if ok { ids.next() } else { None };
                appended.map(|entry_id| Published {
                    id: id.unwrap_or_default(),
                    entry_id,
                })
            })
            .collect()
    }

    /// Appends events whose JSON already carries `id`, `createdAt` and `deliveryAttempt`, as
    /// the TypeScript shell stamps them: the text goes to Redis as it is, never parsed and
    /// written again. Each must be an object's JSON (it starts with `{`). Answers the entry
    /// ids Redis assigned, in order.
    pub async fn publish_stamped_batch(
        &self,
        events: Vec<(String, String)>,
    ) -> Vec<Result<String>> {
        let checked = events
            .into_iter()
            .map(|(topic, json)| {
                if json.starts_with('{') {
                    Ok((topic, json))
                } else {
                    Err(LeaseError::streams_argument(
                        InputErrorKind::Type,
                        "event must be a JSON object",
                    ))
                }
            })
            .collect();
        self.append_batch(checked).await
    }

    /// XADDs every `Ok((topic, json))` in one pipelined write, in order; an `Err` answers
    /// for itself. Answers each appended entry's id.
    ///
    /// A connection that breaks under the write (a server restart, an idle connection closed
    /// by the server or a proxy, a killed client) leaves unknown which appends ran. They go
    /// once more, on a fresh connection and within the same `commandTimeoutMs`, through
    /// `append_again.lua`, which first looks for each event by its `id` among the entries
    /// appended since: every event lands exactly once. Only when too much came since to
    /// tell (over [`AGAIN_SCAN`] entries or 4 MiB) does the publish reject, as at first.
    async fn append_batch(&self, events: Vec<Result<(String, String)>>) -> Vec<Result<String>> {
        let shared = &self.shared;
        if shared.closed.load(Ordering::Acquire) {
            return events.iter().map(|_| Err(LeaseError::Closed)).collect();
        }
        let started = Instant::now();
        let deadline = started + shared.writer.timeout();
        let mut answers: Vec<Option<Result<String>>> = Vec::with_capacity(events.len());
        // (answer index, stream key, payload)
        let mut sent: Vec<(usize, String, String)> = Vec::new();
        for (i, event) in events.into_iter().enumerate() {
            match event {
                Ok((topic, json)) => {
                    sent.push((i, shared.stream_key(&topic), json));
                    answers.push(None);
                }
                Err(err) => answers.push(Some(Err(err))),
            }
        }
        if !sent.is_empty() {
            let mut pipe = redis::pipe();
            let mut replies = 0;
            let at: Vec<usize> = sent
                .iter()
                .map(|(_, key, json)| shared.append(&mut pipe, key, json, &mut replies))
                .collect();
            // Held across the write so `flush` and `close` can wait for it to settle.
            let _in_flight = shared.publishes.read().await;
            let budget = deadline.saturating_duration_since(Instant::now());
            match shared
                .writer
                .run_within(budget, |mut c| async move {
                    c.send_packed_commands(&pipe, 0, replies).await
                })
                .await
            {
                Ok(mut values) => {
                    for ((i, _, _), at) in sent.iter().zip(at) {
                        let value = values.get_mut(at).map(std::mem::take).unwrap_or_default();
                        answers[*i] =
                            Some(appended_id(value).map_err(|err| shared.writer.sort(err)));
                    }
                }
                Err(err @ LeaseError::Connection(_)) => {
                    shared.notice(
                        Level::Debug,
                        "a connection broke under publishes; sending them again, each once",
                        &[
                            ("events", sent.len().into()),
                            ("err", err.full_message().into()),
                        ],
                    );
                    let again = self.append_again(&sent, started, deadline).await;
                    for ((i, _, _), answer) in sent.iter().zip(again) {
                        answers[*i] = Some(answer.unwrap_or_else(|| Err(err.clone())));
                    }
                }
                Err(err) => {
                    for (i, _, _) in &sent {
                        answers[*i] = Some(Err(err.clone()));
                    }
                }
            }
        }
        answers
            .into_iter()
            .map(|a| {
                a.unwrap_or_else(|| Err(LeaseError::Internal("a publish went unanswered".into())))
            })
            .collect()
    }

    /// The second send of appends a broken connection cut off (see [`Self::append_batch`]):
    /// one `append_again.lua` per stream, pipelined. `None` for an event whose fate cannot be
    /// told (no `id` to look for, too many entries since, or this send failed too).
    async fn append_again(
        &self,
        sent: &[(usize, String, String)],
        started: Instant,
        deadline: Instant,
    ) -> Vec<Option<Result<String>>> {
        let shared = &self.shared;
        let mut answers: Vec<Option<Result<String>>> = vec![None; sent.len()];
        // Per stream, in order: (index into `sent`, event id).
        let mut streams: Vec<(&str, Vec<(usize, String)>)> = Vec::new();
        for (k, (_, key, json)) in sent.iter().enumerate() {
            let Some(id) = event::parse(json.clone().into_bytes()).and_then(|p| p.id) else {
                continue;
            };
            match streams
                .iter_mut()
                .find(|(stream, _)| *stream == key.as_str())
            {
                Some((_, events)) => events.push((k, id)),
                None => streams.push((key, vec![(k, id)])),
            }
        }
        let elapsed = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let runs = streams.iter().map(|(key, events)| {
            let mut invocation = APPEND_AGAIN.prepare_invoke();
            invocation
                .key(*key)
                .arg(elapsed)
                .arg(AGAIN_SCAN)
                .arg(shared.tuning.max_len)
                .arg(shared.tuning.ttl_ms);
            for (k, id) in events {
                invocation.arg(id).arg(&sent[*k].2);
            }
            let budget = deadline.saturating_duration_since(Instant::now());
            async move {
                shared
                    .writer
                    .run_within(budget, |mut c| async move {
                        invocation.invoke_async::<Vec<Option<String>>>(&mut c).await
                    })
                    .await
            }
        });
        let results = futures::future::join_all(runs).await;
        for ((_, events), result) in streams.iter().zip(results) {
            match result {
                Ok(ids) => {
                    for ((k, _), id) in events.iter().zip(ids) {
                        answers[*k] = id.map(Ok);
                    }
                }
                Err(LeaseError::Connection(_)) => {}
                Err(err) => {
                    for (k, _) in events {
                        answers[*k] = Some(Err(err.clone()));
                    }
                }
            }
        }
        answers
    }

    /// Parses `json` (a JSON object) and publishes it; for callers that hold text.
    pub async fn publish_json(&self, topic: &str, json: &str) -> Result<Published> {
        let event = serde_json::from_str::<Json>(json).map_err(|err| {
            LeaseError::streams_argument(InputErrorKind::Type, format!("event is not JSON: {err}"))
        })?;
        self.publish(topic, event).await
    }

    /// Subscribes to a topic. When this returns, the starting point is fixed (the group
    /// exists, or the fan-out position is resolved), so an event published afterwards is
    /// delivered. Fails on a transport error rather than subscribing deaf.
    pub async fn subscribe(&self, topic: &str, options: SubscribeOptions) -> Result<Subscription> {
        let shared = &self.shared;
        if shared.closed.load(Ordering::Acquire) {
            return Err(LeaseError::Closed);
        }
        if options.group.as_deref() == Some("") {
            return Err(LeaseError::streams_argument(
                InputErrorKind::Range,
                "group must not be empty",
            ));
        }
        subscriber::open(Arc::clone(shared), topic, options).await
    }

    /// Waits until every publish already in flight has settled (each is bounded by the
    /// command timeout, so this is too).
    pub async fn flush(&self) {
        let bound = self
            .shared
            .tuning
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
            .run(|mut c| async move { del.query_async::<Value>(&mut c).await })
            .await
        {
            Ok(_) => {
                for sub in shared.subscriptions().values() {
                    if sub.topic == topic {
                        sub.restart();
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

    /// Stops every reader, waits for publishes in flight to settle, and takes no more
    /// publishes or subscriptions. Idempotent; bounded by the command timeout even while
    /// Redis is down. Deliveries already handed out can still be acked or nacked.
    pub async fn close(&self) {
        let shared = &self.shared;
        if !shared.closed.swap(true, Ordering::AcqRel) {
            let subs: Vec<_> = shared.subscriptions().drain().map(|(_, s)| s).collect();
            for sub in subs {
                sub.stop();
            }
        }
        self.flush().await;
    }

    /// Whether `close` was called.
    pub fn is_closed(&self) -> bool {
        self.shared.closed.load(Ordering::Acquire)
    }
}

/// Settings fixed at construction that the tasks read.
#[derive(Debug, Clone)]
pub(crate) struct Tuning {
    pub connect_timeout: Duration,
    pub command_timeout: Duration,
    pub block: Duration,
    pub batch_count: usize,
    pub max_len: u64,
    /// 0 = no idle TTL.
    pub ttl_ms: u64,
    pub max_attempts: Option<u64>,
    pub max_in_flight: Option<usize>,
    pub reclaim_interval: Option<Duration>,
    pub reclaim_idle_ms: u64,
}

/// State shared by the pubsub, its reader tasks and its deliveries.
pub(crate) struct Shared {
    pub writer: Arc<Connection>,
    pub client: Client,
    pub reader_config: AsyncConnectionConfig,
    pub prefix: String,
    pub tuning: Tuning,
    logger: Option<Arc<dyn Logger>>,
    pub closed: AtomicBool,
    /// Publishes hold it shared while in flight; flush takes it exclusively.
    publishes: tokio::sync::RwLock<()>,
    subscriptions: Mutex<HashMap<u64, Arc<subscriber::SubState>>>,
    pub next_subscription: AtomicU64,
    pub runtime: tokio::runtime::Handle,
    /// Starts the task that keeps handled entries claimed, once a group needs it.
    pub keeper: std::sync::Once,
}

impl Shared {
    pub fn stream_key(&self, topic: &str) -> String {
        format!("{}:{}", self.prefix, topic)
    }

    pub fn subscriptions(&self) -> MutexGuard<'_, HashMap<u64, Arc<subscriber::SubState>>> {
        // Only inserts and removes happen under this lock; poisoning cannot leave it torn.
        self.subscriptions
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Appends the commands that add `payload` to `key` (XADD with `MAXLEN ~`, and when an
    /// idle TTL is set, PEXPIRE in the same MULTI so the stream can never be left immortal)
    /// and returns the index of the reply holding the entry id (`replies` counts them).
    pub fn append(
        &self,
        pipe: &mut Pipeline,
        key: &str,
        payload: &str,
        replies: &mut usize,
    ) -> usize {
        let ttl = self.tuning.ttl_ms;
        if ttl > 0 {
            pipe.cmd("MULTI");
        }
        pipe.cmd("XADD").arg(key);
        if self.tuning.max_len > 0 {
            pipe.arg("MAXLEN").arg("~").arg(self.tuning.max_len);
        }
        pipe.arg("*").arg(event::EVENT_FIELD).arg(payload);
        if ttl > 0 {
            pipe.cmd("PEXPIRE").arg(key).arg(ttl).cmd("EXEC");
            *replies += 4;
            *replies - 1
        } else {
            *replies += 1;
            *replies - 1
        }
    }

    /// Reports to the logger, if any.
    pub fn notice(&self, level: Level, message: &str, fields: &[(&str, Json)]) {
        if let Some(logger) = &self.logger {
            logger.log(Notice {
                level,
                message: format!("mastra-lease streams: {message}"),
                fields: fields
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), v.clone()))
                    .collect(),
            });
        }
    }

    pub fn remove_subscription(&self, id: u64) {
        self.subscriptions().remove(&id);
    }

    pub fn add_subscription(&self, sub: Arc<subscriber::SubState>) {
        self.subscriptions().insert(sub.id, sub);
    }
}

/// The entry id an append answered: XADD's reply, or inside EXEC's reply when the append
/// ran in a MULTI with PEXPIRE.
fn appended_id(value: Value) -> RedisResult<String> {
    match parse::<Value>(value)? {
        Value::Array(mut inner) if !inner.is_empty() => parse::<String>(inner.swap_remove(0)),
        other => parse::<String>(other),
    }
}

pub(crate) fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

#[cfg(test)]
mod tests;
