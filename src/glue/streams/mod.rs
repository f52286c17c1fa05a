//! `RedisStreamsTransport`: the native half of `RedisStreamsPubSub` — Mastra's PubSub over
//! Redis Streams, with the leases on the same connection. The TypeScript shell turns it into
//! a Mastra `PubSub` (event objects, callbacks with ack, nack and extend, `localOnly`); this
//! class moves JSON text and delivery ids across, and passes on the core's answer to who
//! gets a `localOnly` event; it decides nothing itself.

use std::sync::Arc;

use napi::bindgen_prelude::{Env, Unknown};
use napi::sys::ValueType;
use napi::JsValue;
use napi_derive::napi;
use tokio::sync::oneshot;

use super::args;
use super::crossing::{node_loop, resolved, settled, JsCallback};
use super::js::{self, Value};
use super::log::JsLog;
use super::options;
use super::redis::RedisLeaseProvider;
use super::reply::Reply;
use super::{runtime, unknown};
use crate::core::lock;
use crate::core::log::{Level, Notice};
use crate::core::streams::{Delivery, RunEntries, StreamsPubSub, SubscribeOptions};
use crate::core::{Error, InputErrorKind, Limits, RedisStore, Subject};
use open::{queued_settle, Open, Publish, Running, Sent};

mod open;

/// Most deliveries handed to JavaScript in one call.
const DELIVERY_BATCH: usize = 256;

/// Mastra's PubSub over Redis Streams, in Rust. Used through `RedisStreamsPubSub`.
#[napi]
pub struct RedisStreamsTransport {
    open: Option<Arc<Open>>,
    store: Arc<RedisStore>,
    /// Topic and group names obey the lease key limit.
    limits: Limits,
}

#[napi]
impl RedisStreamsTransport {
    /// Checks the options; connects on first use. Throws a `TypeError`/`RangeError` with
    /// code `ERR_LEASE_INVALID_OPTION` for a bad or unknown option. `logger` receives the
    /// transport's warnings and debug notes, the eviction-policy warning among them
    /// (without one, that goes to `process.emitWarning`).
    #[napi(
        constructor,
        catch_unwind,
        ts_args_type = "options?: RedisStreamsOptions | undefined | null"
    )]
    pub fn new(env: Env, options: Option<Unknown>) -> napi::Result<Self> {
        let raw = env.raw();
        let built = options::redis_streams(raw, options.map(|o| o.raw())).and_then(
            |options::Streams {
                 transport: mut options,
                 limits,
                 replication,
                 logger,
                 zero_attempts,
             }| {
                let key_prefix = options.key_prefix.clone();
                let log = JsLog::logger_or_process(raw, logger)?.map(Arc::new);
                // Warnings and notes go to the logger; without one, only the eviction-policy
                // warning and the one about maxDeliveryAttempts 0 go anywhere
                // (process.emitWarning).
                if logger.is_some() {
                    options.logger = log.clone().map(|log| log as _);
                }
                let _context = runtime()?.enter();
                // Publishes, acks, nacks and extends, and the lease calls with them, on a
                // connection of Node's loop where it can run there (`crossing/node_loop.rs`);
                // else on the transport's, on the runtime.
                options.connection.reactor = node_loop(raw);
                let on_loop = options.connection.clone();
                let pubsub = StreamsPubSub::new(options)?;
                if let Some(log) = &log {
                    pubsub.connection().set_logger(log.clone());
                }
                let mut store =
                    RedisStore::with_connection(pubsub.connection(), key_prefix, limits)?;
                store.set_replication(replication);
                store.spread_over(&on_loop)?;
                if zero_attempts {
                    let warning = Notice::new(
                        Level::Warn,
                        super::options::ZERO_ATTEMPTS_WARNING,
                        &[("code", super::options::ZERO_ATTEMPTS_CODE.into())],
                    );
                    super::log::warn_now(raw, logger, warning);
                }
                Ok((pubsub, store, limits))
            },
        );
        match built {
            Ok((pubsub, store, limits)) => Ok(Self {
                open: Some(Arc::new(Open::new(raw, pubsub)?)),
                store: Arc::new(store),
                limits,
            }),
            Err(err) => {
                err.throw(raw);
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
    #[napi(
        catch_unwind,
        ts_args_type = "topic: string, json: string",
        ts_return_type = "Promise<void>"
    )]
    pub fn publish<'env>(
        &self,
        env: &'env Env,
        topic: Unknown<'env>,
        json: Unknown<'env>,
    ) -> Unknown<'env> {
        let raw = env.raw();
        let Some(open) = &self.open else {
            return unknown(env, closed(raw, Subject::StreamsPublish));
        };
        let checked =
            args::stream_name(raw, topic.raw(), "topic", &self.limits).and_then(|topic| {
                let json = (js::type_of(raw, json.raw()) == ValueType::napi_string)
                    .then(|| js::text_value(raw, json.raw()))
                    .flatten();
                json.map(|json| (topic, json)).ok_or_else(|| {
                    Error::streams_argument(
                        InputErrorKind::Type,
                        "event must be an object's JSON text",
                    )
                })
            });
        let (topic, json) = match checked {
            Ok(checked) => checked,
            Err(err) => return unknown(env, settled(raw, Err(err))),
        };
        let guard = open.hold(&open.publishes);
        let publish = Publish { topic, json, guard };
        unknown(env, open.sends.push(raw, Sent::Publish(publish)))
    }

    /// Subscribes; `onEvents` receives `[deliveryId, json, deliveryId, json, ...]` batches.
    /// Answers the subscription's id at once, and a promise that resolves once the starting
    /// point is fixed. Throws on a bad argument or a closed transport.
    #[napi(
        catch_unwind,
        ts_args_type = "topic: string, group: string | undefined | null, startFrom: 'earliest' | 'latest' | undefined | null, onEvents: (batch: Array<number | string>) => void",
        ts_return_type = "[id: number, opened: Promise<void>]"
    )]
    pub fn subscribe<'env>(
        &self,
        env: &'env Env,
        topic: Unknown<'env>,
        group: Unknown<'env>,
        start_from: Unknown<'env>,
        on_events: Unknown<'env>,
    ) -> Unknown<'env> {
        let raw = env.raw();
        let checked = (|| {
            let open = self.opened(Subject::StreamsSubscribe)?;
            let topic = args::stream_name(raw, topic.raw(), "topic", &self.limits)?;
            let group = match js::type_of(raw, group.raw()) {
                ValueType::napi_undefined | ValueType::napi_null => None,
                _ => Some(args::stream_name(raw, group.raw(), "group", &self.limits)?),
            };
            let start_from = args::start_from(raw, start_from.raw())?;
            if js::type_of(raw, on_events.raw()) != ValueType::napi_function {
                return Err(Error::streams_argument(
                    InputErrorKind::Type,
                    "onEvents must be a function",
                ));
            }
            let sink = JsCallback::new(raw, on_events.raw(), delivery_args)
                .map_err(|err| Error::Internal(err.reason))?;
            Ok((open, topic, SubscribeOptions { group, start_from }, sink))
        })();
        let (open, topic, options, sink) = match checked {
            Ok(checked) => checked,
            Err(err) => return thrown(env, &err),
        };
        // A live subscription keeps the process alive, as a listening socket would.
        sink.refer(raw);
        // Numbered and filed at once: an unsubscribe made before it opens stops it, and a
        // `localOnly` event published meanwhile reaches it.
        let id = open.pubsub.subscription_id(&topic, &options);
        let (stop, mut stopped) = oneshot::channel();
        let (finished, done) = oneshot::channel();
        lock(&open.subscriptions).insert(id.get(), Running { stop, done });
        let open = Arc::clone(open);
        let crossing = open.crossing.clone();
        let opened = crossing.run(raw, async move {
            let mut subscription = match open.pubsub.subscribe_as(id, &topic, options).await {
                Ok(subscription) => subscription,
                Err(err) => {
                    lock(&open.subscriptions).remove(&id.get());
                    return Err(err);
                }
            };
            runtime()?.spawn(async move {
                let mut batch = Vec::with_capacity(DELIVERY_BATCH);
                loop {
                    tokio::select! {
                        _ = &mut stopped => break,
                        taken = subscription.recv_many(&mut batch, DELIVERY_BATCH) => {
                            if taken == 0 {
                                break;
                            }
                            let handed: Vec<_> = batch
                                .drain(..)
                                .map(|d| (d.id() as f64, d.shared_json()))
                                .collect();
                            sink.call(handed);
                        }
                    }
                }
                subscription.unsubscribe().await;
                drop(sink);
                let _ = finished.send(());
            });
            Ok(Reply::Undefined)
        });
        let id = js::number_value(raw, id.get() as f64);
        unknown(env, js::array(raw, &[id, opened]))
    }

    /// Acknowledges a delivery. Never rejects: a settled or unknown delivery, a closed
    /// transport, or an ack that could not reach Redis (it is retried in the background)
    /// all resolve.
    #[napi(catch_unwind, ts_return_type = "Promise<void>")]
    pub fn ack<'env>(&self, env: &'env Env, delivery: f64) -> Unknown<'env> {
        let raw = env.raw();
        let Some((open, delivery)) = self.held(delivery) else {
            return unknown(env, resolved(raw));
        };
        unknown(
            env,
            open.sends.push(raw, Sent::Ack(open.settling(delivery))),
        )
    }

    /// Rejects a delivery: redelivered with `deliveryAttempt + 1`, or dropped with a warning
    /// at `maxDeliveryAttempts`. Never rejects, as `ack`.
    #[napi(catch_unwind, ts_return_type = "Promise<void>")]
    pub fn nack<'env>(&self, env: &'env Env, delivery: f64) -> Unknown<'env> {
        self.on_delivery(
            env,
            delivery,
            |delivery| async move { delivery.nack().await },
        )
    }

    /// Nacks a fan-out event after its callback returned (see `returned`): `json` is the
    /// event as it was delivered, appended again with `deliveryAttempt + 1` (once for all the
    /// subscriptions of this transport that nack it), or dropped with a warning at
    /// `maxDeliveryAttempts`. Never rejects, as `nack`.
    #[napi(catch_unwind, ts_return_type = "Promise<void>")]
    pub fn nack_returned<'env>(
        &self,
        env: &'env Env,
        topic: String,
        json: String,
    ) -> Unknown<'env> {
        let Some(open) = &self.open else {
            return unknown(env, resolved(env.raw()));
        };
        let pubsub = Arc::clone(&open.pubsub);
        let json: Arc<str> = json.into();
        queued_settle(env, open, async move {
            pubsub.nack_returned(&topic, json).await;
        })
    }

    /// The handler of a delivery is alive (the callback's `extend()`): its in-flight timeout
    /// counts from now, and a group's entry has its idle time reset in Redis if it is still
    /// this consumer's. Never rejects: a settled or unknown delivery, a closed transport, or
    /// a Redis that cannot be reached (within the command timeout) all resolve.
    #[napi(catch_unwind, ts_return_type = "Promise<void>")]
    pub fn extend<'env>(&self, env: &'env Env, delivery: f64) -> Unknown<'env> {
        self.on_delivery(
            env,
            delivery,
            |delivery| async move { delivery.extend().await },
        )
    }

    /// Who gets an event published `localOnly` now: the ids of this transport's
    /// subscriptions it goes to (every fan-out one of the topic, a member of each group in
    /// turn). The shell hands the event itself to their callbacks. Throws on a bad topic or a
    /// closed transport.
    #[napi(
        catch_unwind,
        ts_args_type = "topic: string",
        ts_return_type = "number[]"
    )]
    pub fn local_recipients<'env>(&self, env: &'env Env, topic: Unknown<'env>) -> Unknown<'env> {
        let raw = env.raw();
        let checked = self.opened(Subject::StreamsPublish).and_then(|open| {
            let topic = args::stream_name(raw, topic.raw(), "topic", &self.limits)?;
            Ok((open, topic))
        });
        let (open, topic) = match checked {
            Ok(checked) => checked,
            Err(err) => return thrown(env, &err),
        };
        let recipients = open.pubsub.local_recipients(&topic, |id| open.serves(id));
        let ids: Vec<_> = recipients
            .into_iter()
            .map(|id| js::number_value(raw, id as f64))
            .collect();
        unknown(env, js::array(raw, &ids))
    }

    /// A `localOnly` event was nacked at `attempt`: the attempt its redelivery carries, or
    /// `null` when it used up `maxDeliveryAttempts` and was dropped (with the warning any
    /// dropped event gets, through the logger).
    #[napi(
        catch_unwind,
        ts_args_type = "topic: string, eventId: string, eventType: string, attempt: number"
    )]
    pub fn local_nacked(
        &self,
        topic: String,
        id: String,
        kind: String,
        attempt: f64,
    ) -> Option<f64> {
        let open = self.open.as_ref()?;
        let attempt = args::safe_integer(attempt)?;
        let next = open
            .pubsub
            .local_nacked(&topic, id.into(), kind.into(), attempt);
        next.map(|attempt| attempt as f64)
    }

    /// Who gets a nacked `localOnly` event again: the fan-out subscription that nacked it
    /// while it lasts, or the group's member whose turn it is; `null` when nobody is left.
    #[napi(catch_unwind)]
    pub fn local_redelivery(
        &self,
        topic: String,
        group: Option<String>,
        subscription: f64,
    ) -> Option<f64> {
        let open = self.open.as_ref()?;
        let subscription = args::safe_integer(subscription)?;
        let live = |id| open.serves(id);
        let next = open
            .pubsub
            .local_redelivery(&topic, group.as_deref(), subscription, live);
        next.map(|id| id as f64)
    }

    /// A fan-out delivery is done: its callback acked it (nothing of it is in Redis), or
    /// returned (or resolved) without settling it (see `Delivery::returned`); a later nack
    /// is `nackReturned`'s. A group's delivery stays held.
    #[napi(catch_unwind)]
    pub fn returned(&self, delivery: f64) {
        if let Some((_, delivery)) = self.held(delivery) {
            delivery.returned();
        }
    }

    /// Stops a subscription; what it had read but not handed out goes back to its group.
    /// Resolves once that is done, so the group's next entry goes to a remaining member.
    #[napi(catch_unwind, ts_return_type = "Promise<void>")]
    pub fn unsubscribe<'env>(&self, env: &'env Env, subscription: f64) -> Unknown<'env> {
        let running = self.open.as_ref().and_then(|open| {
            let id = args::safe_integer(subscription)?;
            lock(&open.subscriptions).remove(&id)
        });
        let Some(Running { stop, done }) = running else {
            return unknown(env, resolved(env.raw()));
        };
        let _ = stop.send(());
        self.run(env, |_| async move {
            let _ = done.await;
            Ok(Reply::Undefined)
        })
    }

    /// Resolves once every publish made so far has settled, and every ack, nack and extend
    /// has been sent (one that could not reach Redis goes on being retried in the background).
    #[napi(catch_unwind, ts_return_type = "Promise<void>")]
    pub fn flush<'env>(&self, env: &'env Env) -> Unknown<'env> {
        self.run(env, |open| async move {
            drop(futures::join!(
                open.publishes.write(),
                open.settling.write()
            ));
            open.pubsub.flush().await;
            Ok(Reply::Undefined)
        })
    }

    /// Deletes the topic's stream; never rejects for Redis' sake (failures go to the log).
    #[napi(
        catch_unwind,
        ts_args_type = "topic: string",
        ts_return_type = "Promise<void>"
    )]
    pub fn clear_topic<'env>(&self, env: &'env Env, topic: Unknown<'env>) -> Unknown<'env> {
        let topic = match args::stream_name(env.raw(), topic.raw(), "topic", &self.limits) {
            Ok(topic) => topic,
            Err(err) => return unknown(env, settled(env.raw(), Err(err))),
        };
        self.run(env, move |open| async move {
            open.pubsub.clear_topic(&topic).await;
            Ok(Reply::Undefined)
        })
    }

    /// Removes one run's entries from the topic's stream (those with its `runId`; with
    /// `producedBefore`, epoch milliseconds, only those whose `data.producedAt` is no later),
    /// sparing what a consumer group holds unsettled. Rejects only for bad arguments, before
    /// any I/O; Redis' failures go to the log.
    #[napi(
        catch_unwind,
        ts_args_type = "topic: string, runId: string, producedBefore?: number | undefined | null",
        ts_return_type = "Promise<void>"
    )]
    pub fn trim_topic<'env>(
        &self,
        env: &'env Env,
        topic: Unknown<'env>,
        run_id: Unknown<'env>,
        produced_before: Option<Unknown<'env>>,
    ) -> Unknown<'env> {
        let raw = env.raw();
        let checked = (|| {
            let topic = args::stream_name(raw, topic.raw(), "topic", &self.limits)?;
            let run_id = args::stream_name(raw, run_id.raw(), "runId", &self.limits)?;
            let produced_before = match produced_before {
                Some(value) => args::produced_before(raw, value.raw())?,
                None => None,
            };
            let run = RunEntries {
                run_id,
                produced_before,
            };
            run.check()?;
            Ok::<_, Error>((topic, run))
        })();
        let (topic, run) = match checked {
            Ok(checked) => checked,
            Err(err) => return unknown(env, settled(raw, Err(err))),
        };
        self.run(env, move |open| async move {
            open.pubsub.trim_topic(&topic, &run).await?;
            Ok(Reply::Undefined)
        })
    }

    /// Stops every subscription, drains publishes, acks and nacks (each made before this has
    /// reached Redis when it resolves, or failed for good and been logged) and closes every
    /// connection; later calls reject with `ERR_LEASE_CLOSED` (acks and nacks resolve, doing
    /// nothing). When it resolves, no read of this transport is left that could take an
    /// entry. Idempotent, bounded by the block and command timeouts.
    #[napi(catch_unwind, ts_return_type = "Promise<void>")]
    pub fn close<'env>(&mut self, env: &'env Env) -> Unknown<'env> {
        let Some(open) = self.open.take() else {
            return unknown(env, resolved(env.raw()));
        };
        let stopped: Vec<_> = lock(&open.subscriptions)
            .drain()
            .map(|(_, Running { stop, done })| {
                let _ = stop.send(());
                done
            })
            .collect();
        let crossing = open.crossing.clone();
        let store = self.store.clone();
        unknown(
            env,
            crossing.run(env.raw(), async move {
                // Each subscription stops as an unsubscribe does (its reader interrupted, what
                // it read handed back) while the connection is still open; publishes and
                // settles made before this are bounded by the command timeout. So these waits
                // are bounded too, and every publish, ack and nack made before this reaches
                // the core before it closes, a flush waiting meanwhile or not.
                let mut unsent = open.unsent.subscribe();
                futures::join!(futures::future::join_all(stopped), async {
                    let _ = unsent.wait_for(|n| *n == 0).await;
                });
                open.pubsub.close().await;
                // The lease calls' connections, when they are their own.
                store.close();
                Ok(Reply::Undefined)
            }),
        )
    }

    /// Runs `work` on a held delivery, on the runtime, and resolves once it is done, whatever
    /// happened: a settled or unknown delivery, or a closed transport, resolves at once; a
    /// panic is a bug, reported as one on stderr, and resolves too.
    fn on_delivery<'env, F, Fut>(&self, env: &'env Env, delivery: f64, work: F) -> Unknown<'env>
    where
        F: FnOnce(Delivery) -> Fut + Send + 'static,
        Fut: std::future::Future + Send + 'static,
    {
        let raw = env.raw();
        let Some((open, delivery)) = self.held(delivery) else {
            return unknown(env, resolved(raw));
        };
        queued_settle(env, open, async move {
            work(delivery).await;
        })
    }

    /// The held delivery with this id, with the transport's state; `None` once closed, or
    /// for an id that is not a held delivery's.
    fn held(&self, delivery: f64) -> Option<(&Arc<Open>, Delivery)> {
        let open = self.open.as_ref()?;
        let id = args::safe_integer(delivery)?;
        Some((open, open.pubsub.delivery(id)?))
    }

    /// The transport while open, or the error saying what a closed one refused.
    fn opened(&self, refused: Subject) -> crate::core::Result<&Arc<Open>> {
        self.open.as_ref().ok_or(Error::Closed(refused))
    }

    /// Runs `work` on the runtime; a closed transport rejects at once.
    fn run<'env, F, Fut>(&self, env: &'env Env, work: F) -> Unknown<'env>
    where
        F: FnOnce(Arc<Open>) -> Fut,
        Fut: std::future::Future<Output = crate::core::Result<Reply>> + Send + 'static,
    {
        let Some(open) = &self.open else {
            return unknown(env, closed(env.raw(), Subject::StreamsPubSub));
        };
        unknown(env, open.crossing.run(env.raw(), work(open.clone())))
    }
}

/// Throws `err` from a method that answers synchronously.
fn thrown<'env>(env: &'env Env, err: &Error) -> Unknown<'env> {
    js::throw(env.raw(), err, None);
    unknown(env, js::undefined(env.raw()))
}

/// A promise rejected because the transport was closed, saying what was refused.
fn closed(env: js::Env, refused: Subject) -> Value {
    settled(env, Err(Error::Closed(refused)))
}

fn delivery_args(env: js::Env, batch: Vec<(f64, Arc<str>)>) -> Vec<Value> {
    let mut flat = Vec::with_capacity(batch.len() * 2);
    for (id, json) in &batch {
        flat.push(js::number_value(env, *id));
        flat.push(js::string(env, json));
    }
    vec![js::array(env, &flat)]
}
