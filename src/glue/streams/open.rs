//! The transport while it is open: the core's pubsub, the crossing, the running
//! subscriptions, and the queue that carries a turn's publishes, acks, nacks and extends
//! across together, each holding off `flush` and `close` until it is done.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use futures::stream::{FuturesUnordered, StreamExt};
use futures::FutureExt;
use napi::bindgen_prelude::{Env, Unknown};
use tokio::sync::oneshot;

use crate::core::lock;
use crate::core::streams::{Delivery, Settled, StreamsPubSub};
use crate::glue::crossing::{guarded, Answers, Crossing, Queue};
use crate::glue::js;
use crate::glue::reply::Reply;
use crate::glue::unknown;

/// What a publish, ack, nack or extend holds until it is done: its place in `unsent`, which
/// `close` waits for, and a read guard on `publishes` or `settling`, which `flush` waits for
/// (none for a call made while a flush waits: that flush waits only for what came before it).
pub(super) struct Hold {
    _flush: Option<tokio::sync::OwnedRwLockReadGuard<()>>,
    _close: Unsent,
}

/// A call counted in [`Open::unsent`] until it is dropped.
struct Unsent(Arc<tokio::sync::watch::Sender<usize>>);

impl Drop for Unsent {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n = n.saturating_sub(1));
    }
}

/// The transport while it is open; `close()` drops it.
pub(super) struct Open {
    pub(super) pubsub: Arc<StreamsPubSub>,
    pub(super) crossing: Arc<Crossing>,
    /// Subscriptions from `subscribe` until `unsubscribe` (filed before they open, so an
    /// unsubscribe made meanwhile stops them): the signal that stops each one's forwarding.
    pub(super) subscriptions: Mutex<HashMap<u64, Running>>,
    /// Each publish holds a read guard from the moment JavaScript makes it (taken on Node's
    /// thread, before any scheduling); `flush` takes the write side, so it waits for every
    /// publish made before it, whenever it gets to run.
    pub(super) publishes: Arc<tokio::sync::RwLock<()>>,
    /// Each ack, nack and extend holds a read guard from the moment JavaScript makes it until
    /// the core has sent it (or handed it to its background retries, which `close` waits
    /// for in the core): `flush` takes the write side, as for publishes.
    pub(super) settling: Arc<tokio::sync::RwLock<()>>,
    /// How many publishes, acks, nacks and extends were made and are not done yet (counted
    /// on Node's thread when JavaScript makes them, whether or not a flush was waiting):
    /// `close` waits until none is left. None is made once `close` began.
    pub(super) unsent: Arc<tokio::sync::watch::Sender<usize>>,
    /// What this turn of JavaScript sent: it leaves at the turn's end, together, on the
    /// connection of JavaScript's calls (see [`send`]).
    pub(super) sends: Arc<Queue<Sent>>,
}

/// A publish, an ack, or a nack or extend, made in a turn of JavaScript.
pub(super) enum Sent {
    Publish(Publish),
    Ack(Settling<Delivery>),
    /// A nack or extend, its hold on `settling` inside.
    Settle(BoxFuture<'static, ()>),
}

impl Open {
    pub(super) fn new(env: js::Env, pubsub: StreamsPubSub) -> napi::Result<Self> {
        let pubsub = Arc::new(pubsub);
        let crossing = Crossing::new(env)?;
        // Run where their connection does: on Node's loop when it runs there.
        let reactor = pubsub.connection().reactor();
        let sender = pubsub.clone();
        let keyspace = pubsub.connection().keyspace();
        let sends = Queue::new(
            &crossing,
            reactor,
            keyspace,
            move |batch: Vec<Sent>, answers| send(sender.clone(), batch, answers),
        );
        Ok(Self {
            pubsub,
            crossing,
            subscriptions: Mutex::new(HashMap::new()),
            publishes: Arc::new(tokio::sync::RwLock::new(())),
            settling: Arc::new(tokio::sync::RwLock::new(())),
            unsent: Arc::new(tokio::sync::watch::Sender::new(0)),
            sends,
        })
    }
}

/// Sends what a turn of JavaScript sent, each answered as soon as it is done: its publishes
/// first (one pipelined write, in the order they were made: Mastra publishes without awaiting
/// and relies on that order), then its acks (one XACK per consumer), then its nacks and
/// extends (concurrently, sharing the connection's pipeline). The three are polled in that
/// order, so on one connection a turn's settles reach Redis after its publishes: a handler
/// that publishes its result and acks its job never has the job acked before the result is
/// written.
async fn send(pubsub: Arc<StreamsPubSub>, batch: Vec<Sent>, answers: Arc<Answers>) {
    let (mut publishes, mut acks, mut settles) = (Vec::new(), Vec::new(), Vec::new());
    for (i, sent) in batch.into_iter().enumerate() {
        match sent {
            Sent::Publish(publish) => publishes.push((i, publish)),
            Sent::Ack(ack) => acks.push((i, ack)),
            Sent::Settle(work) => settles.push(work.map(move |()| i)),
        }
    }
    futures::join!(
        publish_all(&pubsub, publishes, &answers),
        ack_all(acks, &answers),
        settle_all(settles, &answers),
    );
}

/// The turn's publishes, each answered once its write is (on a cluster, a master's do not
/// wait for another's); a panic is a bug, answered as one to those not answered yet.
async fn publish_all(pubsub: &StreamsPubSub, batch: Vec<(usize, Publish)>, answers: &Answers) {
    if batch.is_empty() {
        return;
    }
    let (at, events, guards) = split(batch, |p| ((p.topic, p.json), p.guard));
    let answered = |written: Vec<(usize, crate::core::error::Result<String>)>| {
        answers.answer(
            written
                .into_iter()
                .filter_map(|(i, w)| Some((*at.get(i)?, w.map(|_| Reply::Undefined)))),
        )
    };
    let written = guarded(async {
        pubsub.publish_stamped_each(events, &answered).await;
        Ok(())
    });
    if let Err(err) = written.await {
        answers.answer(at.iter().map(|&i| (i, Err(err.clone()))));
    }
    // The guards drop here, after the writes: a flush waiting on them sees the publishes done.
    drop(guards);
}

/// The turn's acks, each resolved once its pipeline is answered (on a cluster, a master's do
/// not wait for another's). They resolve whatever happened: one that could not land is
/// retried in the background, and a panic is a bug, reported as one on stderr.
async fn ack_all(batch: Vec<(usize, Settling<Delivery>)>, answers: &Answers) {
    if batch.is_empty() {
        return;
    }
    let (at, deliveries, guards) = split(batch, |ack| (ack.work, ack.guard));
    let answered = |acked: Vec<(usize, Settled)>| {
        answers.answer(
            acked
                .into_iter()
                .filter_map(|(i, _)| Some((*at.get(i)?, Ok(Reply::Undefined)))),
        )
    };
    let acked = guarded(async {
        Delivery::ack_each(&deliveries, &answered).await;
        Ok(())
    });
    let _ = acked.await;
    // Those a panic left unanswered resolve too.
    answers.answer(at.into_iter().map(|i| (i, Ok(Reply::Undefined))));
    drop(guards);
}

/// A kind's items apart: their positions in the turn's batch, their work, their holds.
fn split<T, W>(
    batch: Vec<(usize, T)>,
    part: impl Fn(T) -> (W, Hold),
) -> (Vec<usize>, Vec<W>, Vec<Hold>) {
    let mut at = Vec::with_capacity(batch.len());
    let mut work = Vec::with_capacity(batch.len());
    let mut guards = Vec::with_capacity(batch.len());
    for (i, item) in batch {
        let (w, guard) = part(item);
        at.push(i);
        work.push(w);
        guards.push(guard);
    }
    (at, work, guards)
}

/// The turn's nacks and extends, each answered once done (each resolves whatever happened,
/// see [`queued_settle`]).
async fn settle_all(work: Vec<impl std::future::Future<Output = usize>>, answers: &Answers) {
    let mut running: FuturesUnordered<_> = work.into_iter().collect();
    while let Some(i) = running.next().await {
        answers.answer([(i, Ok(Reply::Undefined))]);
    }
}

impl Open {
    /// `work` with its hold (see [`Hold`]).
    pub(super) fn settling<T>(&self, work: T) -> Settling<T> {
        let guard = self.hold(&self.settling);
        Settling { work, guard }
    }

    /// A call's hold, taken on Node's thread as JavaScript makes the call: a place in
    /// `unsent`, and a read guard on `flushed` unless a flush waits on it.
    pub(super) fn hold(&self, flushed: &Arc<tokio::sync::RwLock<()>>) -> Hold {
        self.unsent.send_modify(|n| *n += 1);
        Hold {
            _flush: flushed.clone().try_read_owned().ok(),
            _close: Unsent(Arc::clone(&self.unsent)),
        }
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
    pub(super) guard: Hold,
}

/// A publish on its way: the topic, the stamped event, and its hold on `publishes`.
pub(super) struct Publish {
    pub(super) topic: String,
    pub(super) json: String,
    /// Keeps a flush (made after it) and close waiting until this publish was written.
    pub(super) guard: Hold,
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
    unknown(env, open.sends.push(env.raw(), Sent::Settle(work.boxed())))
}
