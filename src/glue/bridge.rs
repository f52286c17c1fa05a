//! The crossing from Node's thread to the Tokio runtime for lease calls, batched: the calls
//! made in one turn of JavaScript (before its microtasks run out) wait in an outbox, and one
//! microtask hands them all to the runtime, where the store pipelines them into one write.
//! Their outcomes come back through the provider's [`Inbox`].
//!
//! A napi `async fn` pays, per call, for a hop onto the runtime and a wake-up of Node's event
//! loop; at 64 calls in flight that crossing, not Redis, is the bottleneck.

use std::sync::Arc;

use super::inbox::Inbox;
use super::js::{Deferred, Env, Value};
use super::reply::{guarded, Reply};
use super::turn::Outbox;
use crate::core::lease::stats::{Operation, Stats};
use crate::core::{Call, Error, LeaseStore};

/// The most calls sent as one pipeline.
const MAX_PIPELINE: usize = 64;

/// How many calls of a turn of `n` go in one pipeline: small turns travel whole; larger
/// ones in at least two pipelines, so Redis works on one while the other's callers run
/// (docs/benchmarks.md has what that is worth).
fn pipeline_size(n: usize) -> usize {
    if n <= 16 {
        n
    } else {
        n.div_ceil(2).min(MAX_PIPELINE)
    }
}

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

    /// Sends everything in the outbox to the runtime, in a few pipelines that travel
    /// concurrently (see `pipeline_size`): replies to the first come back, and their callers
    /// run, while Redis still works on the rest, instead of everyone waiting for the last
    /// reply of one big batch.
    fn flush(self: &Arc<Self>) {
        let Some((runtime, batch)) = self.inbox.take_batch(&self.outbox, |(d, _)| d) else {
            return;
        };
        let size = pipeline_size(batch.len());
        let mut batch = batch.into_iter().peekable();
        while batch.peek().is_some() {
            let (deferreds, calls): (Vec<Deferred>, Vec<Call>) = batch.by_ref().take(size).unzip();
            let operations: Vec<Operation> = calls.iter().map(Call::operation).collect();
            let bridge = self.clone();
            runtime.spawn(async move {
                let count = calls.len();
                let mut answers = guarded(async { Ok(bridge.store.execute(calls).await) })
                    .await
                    .unwrap_or_else(|panic| vec![Err(panic); count]);
                answers.resize_with(count, || {
                    Err(Error::Internal("a call went unanswered".into()))
                });
                for (&operation, answer) in operations.iter().zip(&answers) {
                    bridge.stats.record(operation, answer.as_ref());
                }
                let outcomes = deferreds
                    .into_iter()
                    .zip(answers)
                    .map(|(deferred, answer)| (deferred, answer.map(Reply::Answer)));
                bridge.inbox.complete(outcomes.collect());
            });
        }
    }
}
