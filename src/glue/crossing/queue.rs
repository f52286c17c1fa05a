//! Batches: what one turn of JavaScript queued leaves together at the turn's end.

use std::future::Future;
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use futures::FutureExt;

use super::{panic_message, turn, Crossing};
use crate::core::connection::Reactor;
use crate::core::{lock, Error};
use crate::glue::js::{Deferred, Env, Value};
use crate::glue::reply::Outcome;
use crate::glue::runtime;

/// What a queue runs on the runtime with each batch.
type Sender<T> = dyn Fn(Vec<T>, Arc<Answers>) -> BoxFuture<'static, ()> + Send + Sync;

/// Items of one kind (lease calls, publishes, acks, nacks), each with a promise, queued on
/// Node's thread. The first item of a turn schedules the send for the turn's end; the send
/// takes everything queued by then, in order, and runs `send` with it: on the runtime, or on
/// Node's own loop for a connection that runs there.
pub struct Queue<T> {
    crossing: Arc<Crossing>,
    items: Mutex<Vec<(Deferred, T)>>,
    send: Box<Sender<T>>,
    /// Where batches run when not on the runtime: the event loop the connection runs on.
    reactor: Option<Arc<dyn Reactor>>,
}

impl<T: Send + 'static> Queue<T> {
    /// A queue whose batches `send` runs on `reactor` (the runtime when `None`), answering
    /// each item's promise through the [`Answers`] it is given.
    pub fn new<F>(
        crossing: &Arc<Crossing>,
        reactor: Option<Arc<dyn Reactor>>,
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
            turn::at_end(env, Box::new(move || queue.send()));
        }
        promise
    }

    /// Sends everything queued as one task. Whatever `send` leaves unanswered (it panicked,
    /// say) rejects with `ERR_LEASE_INTERNAL`.
    fn send(&self) {
        let batch = std::mem::take(&mut *lock(&self.items));
        if batch.is_empty() {
            return;
        }
        let (deferreds, items): (Vec<Deferred>, Vec<T>) = batch.into_iter().unzip();
        let answers = Arc::new(Answers {
            crossing: self.crossing.clone(),
            waiting: Mutex::new(deferreds.into_iter().map(Some).collect()),
        });
        let runtime = match runtime() {
            Ok(runtime) => runtime,
            Err(err) => return answers.reject_unanswered(err),
        };
        let work = std::panic::AssertUnwindSafe((self.send)(items, answers.clone()));
        let task = async move {
            let unanswered = match work.catch_unwind().await {
                Ok(()) => Error::Internal("a call went unanswered".into()),
                Err(panic) => Error::Internal(panic_message(panic.as_ref())),
            };
            answers.reject_unanswered(unanswered);
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

    /// Answers the items in order, from the first.
    pub fn answer_in_order(&self, outcomes: impl IntoIterator<Item = Outcome>) {
        self.answer(outcomes.into_iter().enumerate());
    }

    /// Rejects every item not answered yet with `err`.
    fn reject_unanswered(&self, err: Error) {
        let left: Vec<_> = lock(&self.waiting)
            .iter_mut()
            .filter_map(Option::take)
            .map(|deferred| (deferred, Err(err.clone())))
            .collect();
        if !left.is_empty() {
            self.crossing.complete(left);
        }
    }
}
