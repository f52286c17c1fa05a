//! The transport while it is open: the core's pubsub, the crossing, the running
//! subscriptions, and the queues that carry a turn's publishes, acks, nacks and extends across
//! together, each holding off `flush` and `close` until it is done.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use futures::stream::{FuturesUnordered, StreamExt};
use futures::FutureExt;
use napi::bindgen_prelude::{Env, Unknown};
use tokio::sync::oneshot;

use crate::core::lock;
use crate::core::streams::{Delivery, StreamsPubSub};
use crate::glue::crossing::{guarded, Crossing, Queue};
use crate::glue::js;
use crate::glue::reply::Reply;
use crate::glue::unknown;

/// The transport while it is open; `close()` drops it.
pub(super) struct Open {
    pub(super) pubsub: Arc<StreamsPubSub>,
    pub(super) crossing: Arc<Crossing>,
    /// Subscriptions from `subscribe` until `unsubscribe` (filed before they open, so an
    /// unsubscribe made meanwhile stops them): the signal that stops each one's forwarding.
    pub(super) subscriptions: Mutex<HashMap<u64, Running>>,
    /// Each publish holds a read guard from the moment JavaScript makes it (taken on Node's
    /// thread, before any scheduling); `flush` and `close` take the write side, so they wait
    /// for every publish made before them, whenever the runtime gets to run it.
    pub(super) publishes: Arc<tokio::sync::RwLock<()>>,
    /// Publishes made in this turn of JavaScript: they leave together, as one pipelined
    /// write in call order (Mastra publishes without awaiting and relies on that order).
    pub(super) publishes_queued: Arc<Queue<Publish>>,
    /// Each ack, nack and extend holds a read guard from the moment JavaScript makes it until
    /// the core has sent it (or handed it to its background retries, which `close` waits
    /// for in the core): `flush` and `close` take the write side, as for publishes.
    pub(super) settling: Arc<tokio::sync::RwLock<()>>,
    /// Acks made in this turn of JavaScript: they leave together, one XACK per consumer.
    pub(super) acks: Arc<Queue<Settling<Delivery>>>,
    /// Nacks and extends made in this turn of JavaScript: they leave together and run
    /// concurrently, their commands sharing the connection's pipeline.
    pub(super) settles: Arc<Queue<BoxFuture<'static, ()>>>,
}

impl Open {
    pub(super) fn new(env: js::Env, pubsub: StreamsPubSub) -> napi::Result<Self> {
        let pubsub = Arc::new(pubsub);
        let crossing = Crossing::new(env)?;
        // A turn's publishes, acks, nacks and extends run where their connection does: on
        // Node's loop when it runs there, each queue's in the order of its first call.
        let reactor = pubsub.connection().reactor();
        let writer = pubsub.clone();
        let publishes_queued = Queue::new(
            &crossing,
            reactor.clone(),
            move |batch: Vec<Publish>, answers| {
                let pubsub = writer.clone();
                async move {
                    let (guards, events): (Vec<_>, Vec<_>) = batch
                        .into_iter()
                        .map(|p| (p.guard, (p.topic, p.json)))
                        .unzip();
                    let written = pubsub.publish_stamped_batch(events).await;
                    answers
                        .answer_in_order(written.into_iter().map(|w| w.map(|_| Reply::Undefined)));
                    // The guards drop here, after the write: a flush waiting on them sees the
                    // publishes done.
                    drop(guards);
                }
            },
        );
        // Acks resolve whatever happened: one that could not land is retried in the
        // background, and a panic is a bug, reported as one on stderr.
        let acks = Queue::new(
            &crossing,
            reactor.clone(),
            |batch: Vec<Settling<Delivery>>, answers| async move {
                let (deliveries, guards): (Vec<_>, Vec<_>) =
                    batch.into_iter().map(|s| (s.work, s.guard)).unzip();
                let _ = guarded(async { Ok(Delivery::ack_all(&deliveries).await) }).await;
                answers.answer_in_order(deliveries.iter().map(|_| Ok(Reply::Undefined)));
                drop(guards);
            },
        );
        let settles = Queue::new(
            &crossing,
            reactor,
            |work: Vec<BoxFuture<'static, ()>>, answers| async move {
                let mut running: FuturesUnordered<_> = work
                    .into_iter()
                    .enumerate()
                    .map(|(i, work)| work.map(move |()| i))
                    .collect();
                while let Some(i) = running.next().await {
                    answers.answer([(i, Ok(Reply::Undefined))]);
                }
            },
        );
        Ok(Self {
            pubsub,
            crossing,
            subscriptions: Mutex::new(HashMap::new()),
            publishes: Arc::new(tokio::sync::RwLock::new(())),
            publishes_queued,
            settling: Arc::new(tokio::sync::RwLock::new(())),
            acks,
            settles,
        })
    }
}

impl Open {
    /// `work` with its hold on `settling`: unavailable only while a flush or close is
    /// waiting, and a settle made after it need not be waited for.
    pub(super) fn settling<T>(&self, work: T) -> Settling<T> {
        let guard = self.settling.clone().try_read_owned().ok();
        Settling { work, guard }
    }

    /// Whether the subscription numbered `id` is still this transport's: subscribed, and
    /// neither unsubscribed nor stopped by `close`.
    pub(super) fn serves(&self, id: u64) -> bool {
        lock(&self.subscriptions).contains_key(&id)
    }
}

/// A running subscription: the signal that stops its forwarding task, and the signal the
/// task gives once its subscription is fully stopped (entries read handed back).
pub(super) struct Running {
    pub(super) stop: oneshot::Sender<()>,
    pub(super) done: oneshot::Receiver<()>,
}

/// An ack, nack or extend on its way, with its hold on `settling`.
pub(super) struct Settling<T> {
    pub(super) work: T,
    pub(super) guard: Option<tokio::sync::OwnedRwLockReadGuard<()>>,
}

/// A publish on its way: the topic, the stamped event, and its hold on `publishes`.
pub(super) struct Publish {
    pub(super) topic: String,
    pub(super) json: String,
    /// Keeps a flush or close waiting until this publish was written.
    pub(super) guard: Option<tokio::sync::OwnedRwLockReadGuard<()>>,
}

/// Queues a nack or extend to leave at the turn's end, holding `settling` until it is done,
/// and answers its promise, resolved whatever happened: a panic is a bug, reported as one on
/// stderr, and resolves too.
pub(super) fn queued_settle<'env>(
    env: &'env Env,
    open: &Arc<Open>,
    work: impl std::future::Future<Output = ()> + Send + 'static,
) -> Unknown<'env> {
    let Settling { work, guard } = open.settling(work);
    let work = async move {
        let _ = guarded(async {
            work.await;
            Ok(())
        })
        .await;
        drop(guard);
    };
    unknown(env, open.settles.push(env.raw(), work.boxed()))
}
