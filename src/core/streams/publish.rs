//! Appending events: one pipelined write per batch, and a second send, exactly once, of the
//! appends a broken connection cut off.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use redis::{Cmd, Pipeline, RedisResult, Value};

use super::event::EVENT_FIELD;
use super::{Shared, StreamsPubSub};
use crate::core::connection::{parse, slot, Connection};
use crate::core::error::{Error, InputErrorKind, Result, Subject};
use crate::core::lock;
use crate::core::log::Level;
use crate::core::scripts;

/// Most entries `append_again.lua` looks through for the events it sends again (it also
/// stops at 4 MiB of events): a bound on how long it holds Redis.
const AGAIN_SCAN: usize = 5_000;

impl StreamsPubSub {
    /// Appends events whose JSON already carries `id`, `createdAt` and `deliveryAttempt`, as
    /// the TypeScript shell stamps them: the text goes to Redis as it is, never parsed and
    /// written again. Each must be an object's JSON (it starts with `{`). Hands `answered`
    /// the entry ids Redis assigned, each with its event's place in `events`, as each
    /// pipeline's are known (on a cluster, a master's do not wait for another's).
    pub async fn publish_stamped_each(
        &self,
        events: Vec<(String, String)>,
        answered: &Appended<'_>,
    ) {
        let checked = events
            .into_iter()
            .map(|(topic, json)| {
                if json.starts_with('{') {
                    Ok((self.shared.stream_key(&topic), json))
                } else {
                    Err(Error::streams_argument(
                        InputErrorKind::Type,
                        "event must be a JSON object",
                    ))
                }
            })
            .collect();
        append_each(&self.shared, self.shared.front(), checked, answered).await
    }

    /// [`StreamsPubSub::publish_stamped_each`], its answers in order (for tests; the glue
    /// hands each answer on as it comes).
    #[cfg(test)]
    pub async fn publish_stamped_batch(
        &self,
        events: Vec<(String, String)>,
    ) -> Vec<Result<String>> {
        let gathered = InOrder::new(events.len());
        self.publish_stamped_each(events, &|each| gathered.take(each))
            .await;
        gathered.answers()
    }
}

/// Where appends' answers go: each entry id (or error) with its event's place in the batch.
pub type Appended<'a> = dyn Fn(Vec<(usize, Result<String>)>) + Send + Sync + 'a;

/// Appends' answers gathered in their places, for a caller that takes them all at once.
struct InOrder(Mutex<Vec<Option<Result<String>>>>);

impl InOrder {
    fn new(count: usize) -> Self {
        Self(Mutex::new((0..count).map(|_| None).collect()))
    }

    fn take(&self, each: Vec<(usize, Result<String>)>) {
        let mut answers = lock(&self.0);
        for (i, answer) in each {
            if let Some(place) = answers.get_mut(i) {
                *place = Some(answer);
            }
        }
    }

    fn answers(self) -> Vec<Result<String>> {
        let unanswered = || Err(Error::Internal("an append went unanswered".into()));
        let answers = self.0.into_inner().unwrap_or_else(|e| e.into_inner());
        answers
            .into_iter()
            .map(|a| a.unwrap_or_else(unanswered))
            .collect()
    }
}

/// An event on its way: the index of its answer, its stream key, its JSON.
type Append = (usize, String, String);

/// XADDs every `Ok((stream key, json))` on `via`, in order, in one pipelined write per node
/// (per slot under an idle TTL); an `Err` answers for itself. Hands `answered` each appended
/// entry's id as its write is answered.
///
/// A connection that breaks under the write (a server restart, an idle connection closed by
/// the server or a proxy, a killed client) leaves unknown which appends ran. They go once
/// more, on a fresh connection and within the same `commandTimeoutMs`, through
/// `append_again.lua`, which first looks for each payload among the entries appended since:
/// every event lands exactly once. Only when too much came since to tell (over
/// [`AGAIN_SCAN`] entries or 4 MiB) does the append fail, as at first.
pub(super) async fn append_each(
    shared: &Arc<Shared>,
    via: &Connection,
    events: Vec<Result<(String, String)>>,
    answered: &Appended<'_>,
) {
    if shared.closed.load(Ordering::Acquire) {
        let closed = || Err(Error::Closed(Subject::StreamsPublish));
        return answered((0..events.len()).map(|i| (i, closed())).collect());
    }
    let started = Instant::now();
    let deadline = started + via.timeout();
    let mut refused = Vec::new();
    let mut sent: Vec<Append> = Vec::new();
    for (i, event) in events.into_iter().enumerate() {
        match event {
            Ok((key, json)) => sent.push((i, key, json)),
            Err(err) => refused.push((i, Err(err))),
        }
    }
    if !refused.is_empty() {
        answered(refused);
    }
    if sent.is_empty() {
        return;
    }
    // Held across the writes so `flush` and `close` can wait for them to settle. An append
    // begun while a flush waits is not one it waits for, and does not wait for it either: the
    // settles of its turn, sent after it, must not overtake it.
    let _in_flight = shared.publishes.try_read().ok();
    // One write per node, all at once; a topic's events stay in order: its stream is one key.
    // Under an idle TTL each append is a `MULTI` block, which a cluster takes in one pipeline
    // per hash slot only.
    let groups = match shared.options.idle_ttl_ms() {
        0 => via.by_node(&sent, |e| slot(stream_of(e))),
        _ => via.by_shard(&sent, stream_of),
    };
    let writes = groups.iter().map(|group| async move {
        let results = append_group(shared, via, group, started, deadline).await;
        // Counted per stream: a group mostly goes to a few.
        let mut appended: Vec<(&str, u64)> = Vec::new();
        for ((_, key, _), result) in group.iter().zip(&results) {
            if result.is_ok() {
                match appended.iter_mut().find(|(k, _)| *k == key.as_str()) {
                    Some((_, count)) => *count += 1,
                    None => appended.push((key, 1)),
                }
            }
        }
        for (key, count) in appended {
            shared.appended(key, count);
        }
        answered(group.iter().map(|(i, _, _)| *i).zip(results).collect());
    });
    futures::future::join_all(writes).await;
}

/// The stream an append goes to, by which appends are grouped.
fn stream_of<'a>(append: &&'a Append) -> &'a [u8] {
    append.1.as_bytes()
}

/// Appends one pipeline's worth of events (one node's, or one slot's), sending them again,
/// each once, when the connection broke under the write.
async fn append_group(
    shared: &Arc<Shared>,
    via: &Connection,
    sent: &[&Append],
    started: Instant,
    deadline: Instant,
) -> Vec<Result<String>> {
    let mut pipe = redis::pipe();
    let mut replies = 0;
    let at: Vec<usize> = sent
        .iter()
        .map(|(_, key, json)| append(shared, &mut pipe, key, json, &mut replies))
        .collect();
    let budget = deadline.saturating_duration_since(Instant::now());
    match via
        .run_within(budget, |mut c| async move {
            c.send_packed_commands(&pipe, 0, replies).await
        })
        .await
    {
        Ok(mut values) => at
            .into_iter()
            .map(|at| {
                let value = values.get_mut(at).map(std::mem::take).unwrap_or_default();
                appended_id(value).map_err(|err| via.classify(err))
            })
            .collect(),
        Err(err @ Error::Connection(..)) => {
            shared.notice(
                Level::Debug,
                "a connection broke under appends; sending them again, each once",
                &[
                    ("events", sent.len().into()),
                    ("err", err.full_message().into()),
                ],
            );
            append_again(shared, via, sent, started, deadline)
                .await
                .into_iter()
                .map(|answer| answer.unwrap_or_else(|| Err(err.clone())))
                .collect()
        }
        Err(err) => sent.iter().map(|_| Err(err.clone())).collect(),
    }
}

/// Adds to `pipe` the commands that append `payload` to `key` (XADD, and when an idle TTL is
/// set, PEXPIRE in the same MULTI so the stream can never be left immortal). Returns the
/// index of the reply holding the entry id; `replies` counts them.
fn append(
    shared: &Shared,
    pipe: &mut Pipeline,
    key: &str,
    payload: &str,
    replies: &mut usize,
) -> usize {
    let ttl = shared.options.idle_ttl_ms();
    if ttl > 0 {
        pipe.cmd("MULTI");
    }
    // Room for every argument, so a long payload goes in without regrowing the command.
    let size = "XADD*".len() + key.len() + EVENT_FIELD.len() + payload.len();
    pipe.add_command(Cmd::with_capacity(5, size))
        .arg("XADD")
        .arg(key)
        .arg("*")
        .arg(EVENT_FIELD)
        .arg(payload);
    if ttl > 0 {
        pipe.cmd("PEXPIRE").arg(key).arg(ttl).cmd("EXEC");
        *replies += 4;
    } else {
        *replies += 1;
    }
    *replies - 1
}

/// The second send of appends a broken connection cut off (see [`append_each`]): one
/// `append_again.lua` per stream, pipelined. `None` for an event whose fate cannot be told
/// (too many entries since, or this send failed too).
async fn append_again(
    shared: &Shared,
    via: &Connection,
    sent: &[&Append],
    started: Instant,
    deadline: Instant,
) -> Vec<Option<Result<String>>> {
    let mut answers: Vec<Option<Result<String>>> = vec![None; sent.len()];
    // Per stream, in order: indexes into `sent`.
    let mut streams: Vec<(&str, Vec<usize>)> = Vec::new();
    for (k, (_, key, _)) in sent.iter().enumerate() {
        match streams
            .iter_mut()
            .find(|(stream, _)| *stream == key.as_str())
        {
            Some((_, events)) => events.push(k),
            None => streams.push((key, vec![k])),
        }
    }
    let elapsed = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    let runs = streams.iter().map(|(key, events)| {
        let mut invocation = scripts::APPEND_AGAIN.script().prepare_invoke();
        invocation
            .key(*key)
            .arg(EVENT_FIELD)
            .arg(elapsed)
            .arg(AGAIN_SCAN)
            .arg(shared.options.idle_ttl_ms());
        for k in events {
            invocation.arg(&sent[*k].2);
        }
        let budget = deadline.saturating_duration_since(Instant::now());
        async move {
            via.run_within(budget, |mut c| async move {
                invocation.invoke_async::<Vec<Option<String>>>(&mut c).await
            })
            .await
        }
    });
    let results = futures::future::join_all(runs).await;
    for ((_, events), result) in streams.iter().zip(results) {
        match result {
            Ok(ids) => {
                for (k, id) in events.iter().zip(ids) {
                    answers[*k] = id.map(Ok);
                }
            }
            Err(Error::Connection(..)) => {}
            Err(err) => {
                for k in events {
                    answers[*k] = Some(Err(err.clone()));
                }
            }
        }
    }
    answers
}

/// Appends one payload (a redelivery) on `via`, exactly once as [`append_each`] does.
pub(super) async fn append_one(
    shared: &Arc<Shared>,
    via: &Connection,
    key: &str,
    payload: String,
) -> Result<String> {
    let gathered = InOrder::new(1);
    let event = vec![Ok((key.to_owned(), payload))];
    append_each(shared, via, event, &|each| gathered.take(each)).await;
    let mut answers = gathered.answers();
    answers
        .pop()
        .unwrap_or_else(|| Err(Error::Internal("an append went unanswered".into())))
}

/// The entry id an append answered: XADD's reply, or inside EXEC's reply when the append
/// ran in a MULTI with PEXPIRE.
fn appended_id(value: Value) -> RedisResult<String> {
    match parse::<Value>(value)? {
        Value::Array(mut inner) if !inner.is_empty() => parse::<String>(inner.swap_remove(0)),
        other => parse::<String>(other),
    }
}
