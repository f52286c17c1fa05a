//! Batches: what one turn of JavaScript queued leaves together at the turn's end.

use std::future::Future;
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use futures::FutureExt;

use super::{give_back, node_loop, panic_message, turn, Crossing};
use crate::core::connection::{Keyspace, Reactor};
use crate::core::{lock, Error};
use crate::glue::js::{Deferred, Env, Value};
use crate::glue::reply::Outcome;
use crate::glue::runtime;

/// What a queue runs on the runtime with each batch.
type Sender<T> = dyn Fn(Vec<T>, Arc<Answers>) -> BoxFuture<'static, ()> + Send + Sync;

/// Items of one kind (lease calls, publishes, acks, nacks), each with a promise, queued on
/// Node's thread. The first item of a turn schedules the send for the turn's end (or, on a
/// Cluster, made as a socket's answers settle, for the end of the loop's poll: [`Queue::new`]);
/// the send takes everything queued by then, in order, and runs `send` with it: on the
/// runtime, or on Node's own loop for a connection that runs there.
pub struct Queue<T> {
    crossing: Arc<Crossing>,
    items: Mutex<Vec<(Deferred, T)>>,
    send: Box<Sender<T>>,
    /// Where batches run when not on the runtime: the event loop the connection runs on.
    reactor: Option<Arc<dyn Reactor>>,
    /// Whether what the answers of Node's loop's sockets queue leaves once the loop has
    /// called back every socket it found ready ([`node_loop::after_poll`]), not at the end of
    /// each answer's turn.
    after_poll: bool,
}

impl<T: Send + 'static> Queue<T> {
    /// A queue whose batches `send` runs on `reactor` (the runtime when `None`), answering
    /// each item's promise through the [`Answers`] it is given. On a Cluster (`keyspace`),
    /// what the answers of several of Node's loop's sockets queue leaves together, once the
    /// loop is done polling them ([`node_loop::after_poll`]): the calls three masters'
    /// answers make go as one write to each, where each master's answers made three. On one
    /// server and behind Sentinel a turn's calls leave at its end: two connections' answers,
    /// made one batch, would go whole on one connection where two pipelines alternate.
    pub fn new<F>(
        crossing: &Arc<Crossing>,
        reactor: Option<Arc<dyn Reactor>>,
        keyspace: Keyspace,
        send: impl Fn(Vec<T>, Arc<Answers>) -> F + Send + Sync + 'static,
    ) -> Arc<Self>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        Arc::new(Self {
            crossing: crossing.clone(),
            items: Mutex::new(Vec::new()),
            send: Box::new(move |items, answers| send(items, answers).boxed()),
            reactor,
            after_poll: keyspace == Keyspace::Slotted,
        })
    }

    /// On Node's thread: queues `item` and answers its promise.
    pub fn push(self: &Arc<Self>, env: Env, item: T) -> Value {
        let (deferred, promise) = self.crossing.promise(env);
        let first = {
            let mut items = lock(&self.items);
            items.push((deferred, item));
            items.len() == 1
        };
        if first {
            let queue = self.clone();
            let job: turn::Job = Box::new(move || queue.send());
            let job = match self.after_poll {
                true => node_loop::after_poll(job).err(),
                false => Some(job),
            };
            if let Some(job) = job {
                turn::at_end(env, job);
            }
        }
        promise
    }

    /// Sends everything queued as one task. Whatever `send` leaves unanswered (it panicked,
    /// say) rejects with `ERR_LEASE_INTERNAL`.
    fn send(&self) {
        let mut batch = std::mem::take(&mut *lock(&self.items));
        if batch.is_empty() {
            return;
        }
        let (waiting, items): (Vec<Option<Deferred>>, Vec<T>) = batch
            .drain(..)
            .map(|(deferred, item)| (Some(deferred), item))
            .unzip();
        give_back(&mut lock(&self.items), batch);
        let answers = Arc::new(Answers {
            crossing: self.crossing.clone(),
            waiting: Mutex::new(waiting),
        });
        let runtime = match runtime() {
            Ok(runtime) => runtime,
            Err(err) => return answers.reject_unanswered(|| err),
        };
        let work = std::panic::AssertUnwindSafe((self.send)(items, answers.clone()));
        let task = async move {
            let panicked = work.catch_unwind().await.err();
            answers.reject_unanswered(|| match panicked {
                None => Error::Internal("a call went unanswered".into()),
                Some(panic) => Error::Internal(panic_message(panic.as_ref())),
            });
        };
        match &self.reactor {
            Some(reactor) => reactor.spawn(task.boxed()),
            None => drop(runtime.spawn(task)),
        }
    }
}

/// The promises of one batch, answered by their item's position, from any thread, each
/// as soon as its outcome is known.
pub struct Answers {
    crossing: Arc<Crossing>,
    waiting: Mutex<Vec<Option<Deferred>>>,
}

impl Answers {
    /// Answers the items at these positions; a position already answered is skipped.
    pub fn answer(&self, outcomes: impl IntoIterator<Item = (usize, Outcome)>) {
        let settled: Vec<_> = {
            let mut waiting = lock(&self.waiting);
            outcomes
                .into_iter()
                .filter_map(|(i, outcome)| Some((waiting.get_mut(i)?.take()?, outcome)))
                .collect()
        };
        if !settled.is_empty() {
            self.crossing.complete(settled);
        }
    }

    /// Rejects every item not answered yet with the error `err` makes (made only if one is
    /// left: a batch all answered, the usual end, makes none).
    fn reject_unanswered(&self, err: impl FnOnce() -> Error) {
        let mut waiting = lock(&self.waiting);
        if waiting.iter().all(Option::is_none) {
            return;
        }
        let err = err();
        let left: Vec<_> = waiting
            .iter_mut()
            .filter_map(Option::take)
            .map(|deferred| (deferred, Err(err.clone())))
            .collect();
        drop(waiting);
        self.crossing.complete(left);
    }
}
