//! The crossing from Node's thread to the Tokio runtime for lease calls, batched: the calls
//! made in one turn of JavaScript (before its microtasks run out) wait in an outbox, and one
//! microtask hands them all to the runtime, where the store pipelines them. Their outcomes
//! come back through the provider's [`Inbox`], each as soon as the store answers it.
//!
//! A napi `async fn` pays, per call, for a hop onto the runtime and a wake-up of Node's event
//! loop; at 64 calls in flight that crossing, not Redis, is the bottleneck.

use std::sync::{Arc, Mutex};

use super::inbox::Inbox;
use super::js::{Deferred, Env, Value};
use super::reply::{guarded, Reply};
use super::turn::Outbox;
use crate::core::lease::stats::{Operation, Stats};
use crate::core::{lock, Answer, Call, Error, LeaseStore};

/// One provider's outbox, the store its calls run on, its way back, and its counters.
pub struct Bridge<S> {
    store: Arc<S>,
    inbox: Arc<Inbox>,
    /// Calls made since the last flush, waiting for the end of this turn of JavaScript.
    outbox: Outbox<(Deferred, Call)>,
    stats: Arc<Stats>,
}

impl<S: LeaseStore + 'static> Bridge<S> {
    /// A bridge to `store`, with a fresh inbox, counting its calls' outcomes in `stats`.
    pub fn new(env: Env, store: Arc<S>, stats: Arc<Stats>) -> napi::Result<Arc<Self>> {
        Ok(Arc::new(Self {
            store,
            inbox: Inbox::new(env)?,
            outbox: Outbox::default(),
            stats,
        }))
    }

    /// The store the calls run on.
    pub fn store(&self) -> &Arc<S> {
        &self.store
    }

    /// On the JavaScript thread: a promise settled by `work`, run on the runtime.
    pub fn spawn(
        &self,
        env: Env,
        work: impl std::future::Future<Output = super::reply::Outcome> + Send + 'static,
    ) -> Value {
        self.inbox.spawn(env, work)
    }

    /// On the JavaScript thread: queues `call` and answers its promise. The first call of a
    /// turn schedules the flush that sends the whole turn's calls together.
    pub fn submit(self: &Arc<Self>, env: Env, call: Call) -> Value {
        let (deferred, promise) = self.inbox.promise(env);
        self.outbox.push(env, (deferred, call), self, Self::flush);
        promise
    }

    /// Sends everything in the outbox to the runtime as one batch, in the order the calls
    /// were made; each promise is settled as soon as the store answers its call.
    fn flush(self: &Arc<Self>) {
        let Some((runtime, batch)) = self.inbox.take_batch(&self.outbox, |(d, _)| d) else {
            return;
        };
        let (deferreds, calls): (Vec<Deferred>, Vec<Call>) = batch.into_iter().unzip();
        let operations: Vec<Operation> = calls.iter().map(Call::operation).collect();
        let bridge = self.clone();
        runtime.spawn(async move {
            let waiting = Mutex::new(deferreds.into_iter().map(Some).collect::<Vec<_>>());
            let settle = |answers: Vec<(usize, Result<Answer, Error>)>| {
                let mut waiting = lock(&waiting);
                let outcomes = answers
                    .into_iter()
                    .filter_map(|(i, answer)| {
                        let deferred = waiting.get_mut(i)?.take()?;
                        if let Some(&operation) = operations.get(i) {
                            bridge.stats.record(operation, answer.as_ref());
                        }
                        Some((deferred, answer.map(Reply::Answer)))
                    })
                    .collect();
                bridge.inbox.complete(outcomes);
            };
            let outcome = guarded(async {
                bridge.store.execute_each(calls, &settle).await;
                Ok(())
            })
            .await;
            let unanswered = match outcome {
                Err(panic) => panic,
                Ok(()) => Error::Internal("a call went unanswered".into()),
            };
            let left: Vec<_> = lock(&waiting)
                .iter()
                .enumerate()
                .filter(|(_, d)| d.is_some())
                .map(|(i, _)| (i, Err(unanswered.clone())))
                .collect();
            if !left.is_empty() {
                settle(left);
            }
        });
    }
}
