//! `RedisStreamsTransport`: the native half of `RedisStreamsPubSub` — Mastra's PubSub over
//! Redis Streams, with the leases on the same connection. The TypeScript shell turns it into
//! a Mastra `PubSub` (event objects, callbacks with ack/nack, `localOnly`); this class moves
//! JSON text and delivery ids across, nothing more.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use napi::bindgen_prelude::{Env, Unknown};
use napi::sys::ValueType;
use napi::JsValue;
use napi_derive::napi;
use tokio::sync::oneshot;

use super::inbox::{lock, Inbox};
use super::js::{self, Value};
use super::log::JsLog;
use super::options::RedisStreamsOptions;
use super::redis::RedisLeaseProvider;
use super::reply::{guarded, settled, Reply};
use super::tsfn::JsCallback;
use super::turn::Outbox;
use super::{runtime, unknown};
use crate::core::streams::{
    Delivery, Level, Logger, Notice, StartFrom, StreamsPubSub, SubscribeOptions,
};
use crate::core::{InputErrorKind, LeaseError, RedisStore};

/// Most deliveries handed to JavaScript in one call.
const DELIVERY_BATCH: usize = 256;
/// Most deliveries whose callback returned unsettled that are kept for a late ack.
const MAX_LET_GO: usize = 10_000;

/// Mastra's PubSub over Redis Streams, in Rust. Used through `RedisStreamsPubSub`.
#[napi]
pub struct RedisStreamsTransport {
    shared: Option<Arc<Shared>>,
    store: Arc<RedisStore>,
}

struct Shared {
    pubsub: StreamsPubSub,
    inbox: Arc<Inbox>,
    /// Deliveries handed to JavaScript and not yet settled, by id.
    deliveries: Mutex<HashMap<u32, Delivery>>,
    /// Deliveries whose callback returned without settling them, oldest first: kept for a
    /// late ack or nack, the last [`MAX_LET_GO`] of them (see `handled`).
    let_go: Mutex<VecDeque<u32>>,
    next_delivery: AtomicU32,
    /// Running subscriptions: the signal that stops each one's forwarding task.
    subscriptions: Mutex<HashMap<u32, Running>>,
    next_subscription: AtomicU32,
    /// Each publish holds a read guard from the moment JavaScript makes it (taken on Node's
    /// thread, before any scheduling); `flush` and `close` take the write side, so they wait
    /// for every publish made before them, whenever the runtime gets to run it.
    publishes: Arc<tokio::sync::RwLock<()>>,
    /// Publishes made in this turn of JavaScript: they leave together, as one pipelined
    /// write in call order (Mastra publishes without awaiting and relies on that order).
    outbox: Outbox<Pending>,
    /// Acks made in this turn of JavaScript: they leave together, one XACK per subscription.
    acks: Outbox<(js::Deferred, Delivery)>,
}

/// A running subscription: the signal that stops its forwarding task, and the signal the
/// task gives once its subscription is fully stopped (entries read handed back).
struct Running {
    stop: oneshot::Sender<()>,
    done: oneshot::Receiver<()>,
}

struct Pending {
    deferred: js::Deferred,
    topic: String,
    json: String,
    /// Keeps a flush or close waiting until this publish was written.
    guard: Option<tokio::sync::OwnedRwLockReadGuard<()>>,
}

#[napi]
impl RedisStreamsTransport {
    /// Checks the options; connects on first use. `log(level, message, fieldsJson)`, when
    /// given, receives the transport's warnings and debug notes, the eviction-policy warning
    /// among them (without it, that one goes to `process.emitWarning`).
    #[napi(
        constructor,
        catch_unwind,
        ts_args_type = "options?: RedisStreamsOptions | undefined | null, log?: ((level: 'debug' | 'warn', message: string, fieldsJson: string) => void) | undefined | null"
    )]
    pub fn new(env: Env, options: Option<Unknown>, log: Option<Unknown>) -> napi::Result<Self> {
        let raw = env.raw();
        let built = (|| {
            let (mut options, limits) =
                RedisStreamsOptions::read(raw, options.map(|o| o.raw()))?.into_core();
            if let Some(log) = log.map(|l| l.raw()) {
                match js::type_of(raw, log) {
                    ValueType::napi_undefined | ValueType::napi_null => {}
                    ValueType::napi_function => {
                        let logger = JsLogger(
                            JsCallback::new(raw, log, notice_args)
                                .map_err(|e| LeaseError::Internal(e.reason.clone()))?,
                        );
                        options.logger = Some(Arc::new(logger));
                    }
                    _ => {
                        return Err(LeaseError::option(
                            InputErrorKind::Type,
                            "log must be a function",
                        ))
                    }
                }
            }
            let key_prefix = options.key_prefix.clone();
            // The eviction-policy warning goes to the log, or to process.emitWarning.
            let eviction_log = match &options.logger {
                Some(logger) => Some(logger.clone()),
                None => JsLog::process(raw)
                    .ok()
                    .map(|log| Arc::new(log) as Arc<dyn Logger>),
            };
            let _context = runtime()?.enter();
            let pubsub = StreamsPubSub::new(options)?;
            if let Some(log) = eviction_log {
                pubsub.connection().set_logger(log);
            }
            let store = RedisStore::with_connection(pubsub.connection(), key_prefix, limits)?;
            Ok((pubsub, store))
        })();
        match built {
            Ok((pubsub, store)) => Ok(Self {
                shared: Some(Arc::new(Shared {
                    pubsub,
                    inbox: Inbox::new(raw)?,
                    deliveries: Mutex::new(HashMap::new()),
                    let_go: Mutex::new(VecDeque::new()),
                    next_delivery: AtomicU32::new(1),
                    subscriptions: Mutex::new(HashMap::new()),
                    next_subscription: AtomicU32::new(1),
                    publishes: Arc::new(tokio::sync::RwLock::new(())),
                    outbox: Outbox::default(),
                    acks: Outbox::default(),
                })),
                store: Arc::new(store),
            }),
            Err(err) => {
                js::throw(raw, &err);
                Err(napi::Error::from_status(napi::Status::PendingException))
            }
        }
    }

    /// A `RedisLeaseProvider` on this transport's connection and key prefix.
    #[napi(catch_unwind)]
    pub fn lease_provider(&self, env: Env) -> napi::Result<RedisLeaseProvider> {
        RedisLeaseProvider::over(&env, self.store.clone())
    }

    /// Appends `json`, an event object's JSON already stamped with `id`, `createdAt` and
    /// `deliveryAttempt` (the TypeScript shell does that), to the topic's stream as it is.
    #[napi(catch_unwind, ts_return_type = "Promise<void>")]
    pub fn publish<'env>(&self, env: &'env Env, topic: String, json: String) -> Unknown<'env> {
        let Some(shared) = &self.shared else {
            return unknown(env, settled(env.raw(), Err(LeaseError::Closed)));
        };
        let (deferred, promise) = shared.inbox.promise(env.raw());
        // Unavailable only while a flush or close is waiting: a publish made after it need
        // not be waited for.
        let guard = shared.publishes.clone().try_read_owned().ok();
        let pending = Pending {
            deferred,
            topic,
            json,
            guard,
        };
        shared
            .outbox
            .push(env.raw(), pending, shared, Shared::send_publishes);
        unknown(env, promise)
    }

    /// Subscribes; `onEvents` receives `[deliveryId, json, deliveryId, json, ...]` batches.
    /// Resolves the subscription's id once the starting point is fixed.
    #[napi(
        catch_unwind,
        ts_args_type = "topic: string, group: string | undefined | null, startFrom: 'earliest' | 'latest', onEvents: (batch: Array<number | string>) => void",
        ts_return_type = "Promise<number>"
    )]
    pub fn subscribe<'env>(
        &self,
        env: &'env Env,
        topic: String,
        group: Option<String>,
        start_from: String,
        on_events: Unknown<'env>,
    ) -> Unknown<'env> {
        let raw = env.raw();
        let start_from = match start_from.as_str() {
            "latest" => StartFrom::Latest,
            _ => StartFrom::Earliest,
        };
        if js::type_of(raw, on_events.raw()) != ValueType::napi_function {
            let err = LeaseError::option(InputErrorKind::Type, "onEvents must be a function");
            return unknown(env, settled(raw, Err(err)));
        }
        let sink = match JsCallback::new(raw, on_events.raw(), delivery_args) {
            Ok(sink) => sink,
            Err(err) => return unknown(env, settled(raw, Err(LeaseError::Internal(err.reason)))),
        };
        // A live subscription keeps the process alive, as a listening socket would.
        sink.refer(raw);
        let options = SubscribeOptions {
            group: group.filter(|g| !g.is_empty()),
            start_from,
        };
        self.run(env, move |shared| async move {
            let mut subscription = shared.pubsub.subscribe(&topic, options).await?;
            let id = shared.next_subscription.fetch_add(1, Ordering::Relaxed);
            let (stop, mut stopped) = oneshot::channel();
            let (finished, done) = oneshot::channel();
            lock(&shared.subscriptions).insert(id, Running { stop, done });
            let forward = shared.clone();
            runtime()?.spawn(async move {
                let mut batch = Vec::with_capacity(DELIVERY_BATCH);
                loop {
                    tokio::select! {
                        _ = &mut stopped => break,
                        taken = subscription.recv_many(&mut batch, DELIVERY_BATCH) => {
                            if taken == 0 {
                                break;
                            }
                            sink.call(forward.hand_out(&mut batch));
                        }
                    }
                }
                subscription.unsubscribe().await;
                drop(sink);
                let _ = finished.send(());
            });
            Ok(Reply::Number(f64::from(id)))
        })
    }

    /// Acknowledges a delivery. Settling twice, or an unknown id, is a no-op.
    #[napi(catch_unwind, ts_return_type = "Promise<void>")]
    pub fn ack<'env>(&self, env: &'env Env, delivery: u32) -> Unknown<'env> {
        self.settle(env, delivery, true)
    }

    /// Rejects a delivery: redelivered with `deliveryAttempt + 1`, or dropped with a warning
    /// at `maxDeliveryAttempts`.
    #[napi(catch_unwind, ts_return_type = "Promise<void>")]
    pub fn nack<'env>(&self, env: &'env Env, delivery: u32) -> Unknown<'env> {
        self.settle(env, delivery, false)
    }

    /// The subscriber's callback has returned (or resolved) without settling the delivery:
    /// it is no longer kept claimed while idle, and a sibling may reclaim it after
    /// `reclaimIdleMs`. A late ack or nack still counts; past the last [`MAX_LET_GO`] such
    /// deliveries, the oldest is forgotten (it stays pending for a reclaim, and an ack of it
    /// does nothing), so a callback that never settles does not grow memory without end.
    /// A settled or unknown delivery is ignored.
    #[napi(catch_unwind)]
    pub fn handled(&self, delivery: u32) {
        let Some(shared) = &self.shared else { return };
        let mut deliveries = lock(&shared.deliveries);
        let Some(found) = deliveries.get(&delivery) else {
            return;
        };
        found.handled();
        let mut let_go = lock(&shared.let_go);
        let_go.push_back(delivery);
        while let_go.len() > MAX_LET_GO {
            if let Some(oldest) = let_go.pop_front() {
                deliveries.remove(&oldest);
            }
        }
    }

    /// Stops a subscription; what it had read but not handed out goes back to its group.
    /// Resolves once that is done, so the group's next entry goes to a remaining member.
    #[napi(catch_unwind, ts_return_type = "Promise<void>")]
    pub fn unsubscribe<'env>(&self, env: &'env Env, subscription: u32) -> Unknown<'env> {
        let running = self
            .shared
            .as_ref()
            .and_then(|shared| lock(&shared.subscriptions).remove(&subscription));
        let Some(Running { stop, done }) = running else {
            return unknown(env, settled(env.raw(), Ok(Reply::Undefined)));
        };
        let _ = stop.send(());
        self.run(env, |_| async move {
            let _ = done.await;
            Ok(Reply::Undefined)
        })
    }

    /// Resolves once every publish made so far has settled.
    #[napi(catch_unwind, ts_return_type = "Promise<void>")]
    pub fn flush<'env>(&self, env: &'env Env) -> Unknown<'env> {
        self.run(env, |shared| async move {
            drop(shared.publishes.write().await);
            shared.pubsub.flush().await;
            Ok(Reply::Undefined)
        })
    }

    /// Deletes the topic's stream; never rejects (failures go to the log).
    #[napi(catch_unwind, ts_return_type = "Promise<void>")]
    pub fn clear_topic<'env>(&self, env: &'env Env, topic: String) -> Unknown<'env> {
        self.run(env, move |shared| async move {
            shared.pubsub.clear_topic(&topic).await;
            Ok(Reply::Undefined)
        })
    }

    /// Stops every subscription and drains publishes; later calls reject with
    /// `ERR_LEASE_CLOSED`. Idempotent, bounded by the command timeout.
    #[napi(catch_unwind, ts_return_type = "Promise<void>")]
    pub fn close<'env>(&mut self, env: &'env Env) -> Unknown<'env> {
        let Some(shared) = self.shared.take() else {
            return unknown(env, settled(env.raw(), Ok(Reply::Undefined)));
        };
        for (_, running) in lock(&shared.subscriptions).drain() {
            let _ = running.stop.send(());
        }
        let inbox = shared.inbox.clone();
        unknown(
            env,
            inbox.spawn(env.raw(), async move {
                // Publishes are bounded by the command timeout, so this wait is too.
                drop(shared.publishes.write().await);
                shared.pubsub.close().await;
                Ok(Reply::Undefined)
            }),
        )
    }

    fn settle<'env>(&self, env: &'env Env, delivery: u32, ack: bool) -> Unknown<'env> {
        let Some(shared) = &self.shared else {
            return unknown(env, settled(env.raw(), Err(LeaseError::Closed)));
        };
        let Some(delivery) = lock(&shared.deliveries).remove(&delivery) else {
            return unknown(env, settled(env.raw(), Ok(Reply::Undefined)));
        };
        if ack {
            let (deferred, promise) = shared.inbox.promise(env.raw());
            shared
                .acks
                .push(env.raw(), (deferred, delivery), shared, Shared::send_acks);
            return unknown(env, promise);
        }
        unknown(
            env,
            shared.inbox.defer(env.raw(), async move {
                delivery.nack().await?;
                Ok(Reply::Undefined)
            }),
        )
    }

    /// Runs `work` on the runtime; a closed transport rejects at once.
    fn run<'env, F, Fut>(&self, env: &'env Env, work: F) -> Unknown<'env>
    where
        F: FnOnce(Arc<Shared>) -> Fut,
        Fut: std::future::Future<Output = crate::core::Result<Reply>> + Send + 'static,
    {
        let Some(shared) = &self.shared else {
            return unknown(env, settled(env.raw(), Err(LeaseError::Closed)));
        };
        let inbox = shared.inbox.clone();
        unknown(env, inbox.spawn(env.raw(), work(shared.clone())))
    }
}

impl Shared {
    /// Sends the turn's publishes as one ordered batch.
    fn send_publishes(self: &Arc<Self>) {
        let Some((runtime, batch)) = self.inbox.take_batch(&self.outbox, |p| p.deferred) else {
            return;
        };
        let shared = self.clone();
        runtime.spawn(async move {
            let (waiting, events): (Vec<_>, Vec<_>) = batch
                .into_iter()
                .map(|p| ((p.deferred, p.guard), (p.topic, p.json)))
                .unzip();
            let answers = shared.pubsub.publish_stamped_batch(events).await;
            // Each pending publish's guard drops here, after the write: a flush waiting on
            // it sees the publish done.
            let outcomes = waiting
                .into_iter()
                .zip(answers)
                .map(|((deferred, _guard), answer)| (deferred, answer.map(|_| Reply::Undefined)));
            shared.inbox.complete(outcomes.collect());
        });
    }

    /// Sends the turn's acks as one round trip.
    fn send_acks(self: &Arc<Self>) {
        let Some((runtime, batch)) = self.inbox.take_batch(&self.acks, |(d, _)| d) else {
            return;
        };
        let inbox = self.inbox.clone();
        runtime.spawn(async move {
            let (waiting, deliveries): (Vec<_>, Vec<_>) = batch.into_iter().unzip();
            let answers: Vec<_> =
                match guarded(async { Ok(Delivery::ack_all(&deliveries).await) }).await {
                    Ok(answers) => answers
                        .into_iter()
                        .map(|answer| answer.map(|_| Reply::Undefined))
                        .collect(),
                    Err(err) => waiting.iter().map(|_| Err(err.clone())).collect(),
                };
            inbox.complete(waiting.into_iter().zip(answers).collect());
        });
    }

    /// Registers a batch of deliveries under fresh ids; answers `[id, json, id, json, ...]`.
    fn hand_out(&self, batch: &mut Vec<Delivery>) -> Vec<(u32, Arc<str>)> {
        let mut deliveries = lock(&self.deliveries);
        batch
            .drain(..)
            .map(|delivery| {
                let id = self.next_delivery.fetch_add(1, Ordering::Relaxed);
                let json = delivery.shared_json();
                deliveries.insert(id, delivery);
                (id, json)
            })
            .collect()
    }
}

fn delivery_args(env: js::Env, batch: Vec<(u32, Arc<str>)>) -> Vec<Value> {
    let mut flat = Vec::with_capacity(batch.len() * 2);
    for (id, json) in &batch {
        flat.push(js::number_value(env, f64::from(*id)));
        flat.push(js::string(env, json));
    }
    vec![js::array(env, &flat)]
}

/// Forwards the transport's notices to the shell's `log(level, message, fieldsJson)`.
struct JsLogger(JsCallback<Notice>);

impl Logger for JsLogger {
    fn log(&self, notice: Notice) {
        self.0.call(notice);
    }
}

fn notice_args(env: js::Env, notice: Notice) -> Vec<Value> {
    let level = match notice.level {
        Level::Debug => "debug",
        Level::Warn => "warn",
    };
    let fields = serde_json::Value::Object(notice.fields).to_string();
    vec![
        js::string(env, level),
        js::string(env, &notice.message),
        js::string(env, &fields),
    ]
}
