//! Leases in Redis: one Lua script per operation, one round trip per call.
//!
//! A lease is a plain string `<keyPrefix>:lease:<key>` holding the owner, with a PX expiry,
//! the layout Mastra's own Redis backend uses, so a fleet can move over process by process;
//! its holder's metadata and its fencing token live beside it in one companion key, in the
//! same hash slot on a cluster (`keys.rs`). Redis decides expiry. Scripts are sent by SHA (EVALSHA) and loaded
//! again transparently when Redis answers NOSCRIPT (after a restart or SCRIPT FLUSH).
//!
//! An acquire that asks for no token and carries no metadata (Mastra's `acquireLease` today)
//! is one plain `SET key owner NX PX ttl GET`, no script for Redis to run, with an `EXISTS` of
//! its companion key beside it in the pipeline; only when it finds the caller's owner already
//! holding the lease (a refresh, whose metadata the script compares), claims a key whose
//! companion key is still there (left by a grant another client released: the script deletes
//! it, so the new grant inherits neither token nor metadata), or on a server that refuses the
//! form (before 7.0), is the acquire script sent after it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use redis::Value;
use serde_json::Value as Json;

use super::keys::Layout;
use super::{Answer, Answered, Call, Limits};
use crate::core::connection::{parse, Connection, ConnectionOptions, Keyspace, Link};
use crate::core::error::{Error, InputErrorKind, Result, Subject};
use crate::core::log::{Level, Notice, Throttle};
use crate::core::scripts;
pub(super) use commands::decode;
use commands::{is_noscript, lua, Delivery, How};
use parts::{repeated_keys, InFlight, Part};

/// How to reach Redis and where the leases live there.
#[derive(Debug, Clone)]
pub struct RedisOptions {
    /// The server, the credentials, TLS, the connection name and the timeouts (every call
    /// settles within the command timeout).
    pub connection: ConnectionOptions,
    /// Leases live at `<key_prefix>:lease:<key>`. Default `mastra:topic`, as Mastra's backend.
    pub key_prefix: String,
    /// Input limits.
    pub limits: Limits,
    /// Failover-safe grants: a write that grants or moves a lease (acquire, renew,
    /// transfer) is answered only once this many replicas confirmed it (`WAIT`, on a link
    /// lent to it alone). Default none.
    pub replication: Option<Replication>,
}

/// How many replicas must confirm a lease write, and how long to wait for them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Replication {
    pub replicas: u32,
    pub timeout: Duration,
}

impl Default for RedisOptions {
    fn default() -> Self {
        Self {
            connection: ConnectionOptions::default(),
            key_prefix: "mastra:topic".to_owned(),
            limits: Limits::default(),
            replication: None,
        }
    }
}

/// A lease store in Redis. Cheap to share behind an `Arc`; calls multiplex over one
/// connection (or, on Node's loop, two: see [`RedisStore::spread_over`]), so calls made at the
/// same time are pipelined.
#[derive(Debug)]
pub struct RedisStore {
    connection: Arc<Connection>,
    /// Connections beside `connection` that the calls are spread over, a key's calls on the
    /// one its calls in flight are on ([`InFlight`]).
    beside: Vec<Connection>,
    /// The calls in flight on each connection, when they are spread over more than one.
    in_flight: std::sync::Mutex<InFlight>,
    layout: Layout,
    limits: Limits,
    replication: Option<Replication>,
    /// `false` once the server refused `SET NX GET` (before Redis 7.0) or the `EXISTS` beside
    /// it (an ACL user without it): acquires then go as the script.
    plain_acquire: AtomicBool,
    /// Acquires that failed in Redis or on the way, since the last warning about them.
    acquire_failures: Throttle,
    /// The other calls that failed so.
    failures: Throttle,
    /// Set once the server refused `WAIT`: every grant under `minReplicas` is then refused
    /// so, before anything is sent.
    no_wait: OnceLock<Error>,
}

impl RedisStore {
    /// Checks the options; does not connect. Must run inside a Tokio runtime.
    pub fn new(options: RedisOptions) -> Result<Self> {
        let connection = Connection::new(&options.connection, Subject::LeaseProvider)?;
        let mut store =
            Self::with_connection(Arc::new(connection), options.key_prefix, options.limits)?;
        store.replication = options.replication;
        Ok(store)
    }

    /// Grants confirmed by this many replicas before they are answered, or not (see
    /// [`RedisOptions::replication`]).
    pub fn set_replication(&mut self, replication: Option<Replication>) {
        self.replication = replication;
    }

    /// A store on an existing connection (the one a streams transport writes through, so
    /// events and leases share it). Leases live at `<key_prefix>:lease:<key>`.
    pub fn with_connection(
        connection: Arc<Connection>,
        key_prefix: String,
        limits: Limits,
    ) -> Result<Self> {
        if key_prefix.is_empty() {
            return Err(Error::option(
                InputErrorKind::Range,
                "keyPrefix must not be empty",
            ));
        }
        if key_prefix.len() > super::MAX_KEY_PREFIX_BYTES {
            return Err(Error::option(
                InputErrorKind::Range,
                format!(
                    "keyPrefix must be at most {} bytes (UTF-8), got {}",
                    super::MAX_KEY_PREFIX_BYTES,
                    key_prefix.len()
                ),
            ));
        }
        Ok(Self {
            layout: Layout::new(&key_prefix, connection.keyspace())?,
            connection,
            beside: Vec::new(),
            in_flight: std::sync::Mutex::default(),
            limits,
            replication: None,
            plain_acquire: AtomicBool::new(true),
            failures: Throttle::default(),
            acquire_failures: Throttle::default(),
            no_wait: OnceLock::new(),
        })
    }

    /// Where the leases live in Redis.
    pub(super) fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The input limits.
    pub(super) fn limits(&self) -> &Limits {
        &self.limits
    }

    /// The connection the calls go through (the first, when they are spread over more).
    pub fn connection(&self) -> &Connection {
        &self.connection
    }

    /// Spreads the calls over a second connection beside the first, when one can be opened
    /// on the first's reactor (one server at a `redis://` or `rediss://` address, or the
    /// master behind Sentinel, on Node's loop; a cluster's calls are spread over its masters
    /// already). With many calls in flight on one connection, Redis and this process take
    /// turns, each idle while the other works (a turn's pipeline, then its answers); over two,
    /// each works on one connection's calls while the other's are away. How a batch is
    /// spread, and why a key's calls still take effect in the order they were made:
    /// [`InFlight`]. It opens on first use.
    pub fn spread_over(&mut self, options: &ConnectionOptions) -> Result<()> {
        if self.replication.is_none() && self.connection.keyspace() == Keyspace::Single {
            self.beside.extend(self.connection.beside(options)?);
        }
        Ok(())
    }

    /// Closes every connection the calls go through.
    pub fn close(&self) {
        self.connection.close();
        for connection in &self.beside {
            connection.close();
        }
    }

    /// The connection the pipeline `on` goes through.
    fn on(&self, on: usize) -> &Connection {
        match on {
            0 => &self.connection,
            n => &self.beside[n - 1],
        }
    }

    /// Runs one call (for tests).
    #[cfg(test)]
    pub async fn execute_one(&self, call: Call) -> Result<Answer> {
        let mut answers = self.execute(vec![call]).await;
        answers
            .pop()
            .unwrap_or_else(|| Err(Error::Internal("a call went unanswered".into())))
    }

    /// Executes a batch of calls, answering each in order (for tests; the glue hands each
    /// answer on as it comes, with [`RedisStore::execute_each`]).
    #[cfg(test)]
    pub async fn execute(&self, calls: Vec<Call>) -> Vec<Result<Answer>> {
        let count = calls.len();
        let answers = std::sync::Mutex::new(Vec::with_capacity(count));
        self.execute_each(calls, &|answered| {
            crate::core::lock(&answers).extend(answered)
        })
        .await;
        let mut answers = answers.into_inner().unwrap_or_else(|e| e.into_inner());
        answers.sort_unstable_by_key(|(i, _)| *i);
        let mut answers = answers.into_iter().peekable();
        (0..count)
            .map(|i| match answers.next_if(|(at, _)| *at == i) {
                Some((_, answer)) => answer,
                None => Err(Error::Internal("a call went unanswered".into())),
            })
            .collect()
    }

    /// Executes a batch of calls, handing each answer (with the call's place in the batch)
    /// to `answered` as soon as it is known. Every call with good arguments becomes one
    /// command (EVALSHA of its script, GET, or SET NX for a plain acquire), sent in
    /// a few pipelines at once (see `parts.rs`): the callers of the first run while
    /// Redis works on the rest. Every call on one key goes in the pipeline of that key's
    /// first call, so calls on one key take effect in the order they were made. On a
    /// cluster, a pipeline holds one hash slot's keys only. The whole batch is bounded by the
    /// command timeout.
    ///
    /// With [`Grants::replication`], the calls on a key that one of them may grant go on a
    /// link lent to them alone, and only the grants wait for `WAIT` there: reads, releases,
    /// refusals and publishes never wait behind a confirmation, and each grant answers
    /// within `replicaTimeoutMs` of being sent, whatever else is in flight.
    ///
    /// A connection that breaks under a pipeline (a server restart, an idle connection
    /// closed by the server or a proxy, a failover) leaves unknown whether its calls ran. Those
    /// whose second run answers as the first would have are sent once more, in order, on a
    /// fresh connection and within the same timeout: a key's one call (acquire and renew by
    /// the same holder refresh again, a release or a read is harmless), or its reads and
    /// renewals alone.
    /// A transfer is told it is sent again: it moves a lease still with its old holder, and
    /// otherwise cannot know, unless Redis kept its id (see `transfer.lua`). On a cluster a
    /// transfer has an id, which it carries wherever it may reach Redis twice unseen (through
    /// redis-rs' cluster connection, which sends a command again when its connection
    /// dropped) and on a send made again, so the same transfer run twice answers `true`
    /// twice; on a link that sends nothing again by itself (a master's on Node's loop) its
    /// first send goes without, and leaves the lease its key alone, as on one server. A
    /// server still loading its data after a start (`LOADING`), which ran nothing, is asked
    /// again every 50 ms within the same timeout. A key's calls when an acquire, release or
    /// transfer is among several, and such a transfer that cannot know, reject with
    /// [`Error::OutcomeUnknown`]: never an answer that was not the first run's.
    pub async fn execute_each(&self, calls: Vec<Call>, answered: &Answered<'_>) {
        let started = Instant::now();
        let deadline = started + self.connection.timeout();
        let keeps_ids = self.connection.keyspace() == Keyspace::Slotted;
        let calls: Vec<Sent> = calls
            .into_iter()
            .map(|call| Sent::new(call, keeps_ids))
            .collect();
        let report = |answers: Vec<(usize, Result<Answer>)>| {
            self.report_failures(&calls, &answers);
            answered(answers);
        };
        let mut refused = Vec::new();
        let mut good = Vec::new();
        for (i, sent) in calls.iter().enumerate() {
            match self.refusal(&sent.call) {
                Some(err) => refused.push((i, Err(err))),
                None => good.push(i),
            }
        }
        if !refused.is_empty() {
            report(refused);
        }
        let pipelines = self.pipelines(&calls, &good);
        let sends = pipelines.iter().map(|pipeline| {
            // Counted in flight (by `pipelines`) until its calls are answered or given up,
            // whatever ends the send: taken here, before anything awaits.
            let flying = self.flying(&calls, pipeline);
            let report = &report;
            let calls = &calls;
            async move {
                let _flying = flying;
                self.send(calls, pipeline, Timing { started, deadline }, report)
                    .await
            }
        });
        futures::future::join_all(sends).await;
    }

    /// Why a call is answered before anything is sent: its arguments, or a grant under
    /// `minReplicas` on a server known not to run `WAIT`.
    fn refusal(&self, call: &Call) -> Option<Error> {
        if let Err(err) = call.check(&self.limits) {
            return Some(err);
        }
        match self.no_wait.get() {
            Some(err) if call.grants() => Some(err.clone()),
            _ => None,
        }
    }

    /// Sends one pipeline, once more when the connection broke under it (what of it can go
    /// again, [`Part::again`]; the rest is told its outcome is unknown), and answers each of
    /// its calls.
    async fn send(
        &self,
        calls: &[Sent],
        pipeline: &Part,
        timing: Timing,
        answered: &(dyn Fn(Vec<(usize, Result<Answer>)>) + Sync),
    ) {
        let mut part = std::borrow::Cow::Borrowed(pipeline);
        let mut broke = false;
        loop {
            let pipeline = part.as_ref();
            let sent = &pipeline.sent;
            let budget = timing.deadline.saturating_duration_since(Instant::now());
            // Whether any of it may have reached Redis: not when no connection could be had.
            let mut went = true;
            let result = match self.replication.filter(|_| pipeline.confirm) {
                Some(wanted) => {
                    self.confirmed(calls, pipeline, timing, wanted, answered)
                        .await
                }
                None => {
                    went = false;
                    let went = &mut went;
                    let replies = self
                        .on(pipeline.on)
                        .run_within(budget, |mut link| {
                            *went = true;
                            async move { self.passes(&mut link, calls, pipeline).await }
                        })
                        .await;
                    match replies {
                        // Nothing ran: asked again after a pause, while the calls' time allows.
                        Ok(replies) if loading(&replies) && pause(timing.deadline).await => {
                            continue;
                        }
                        replies => replies.map(|replies| self.decode_all(calls, sent, replies)),
                    }
                }
            };
            match result {
                Ok(answers) => return answered(answers),
                Err(Error::Connection(..)) if !broke && !went => broke = true,
                Err(Error::Connection(..)) if !broke => {
                    broke = true;
                    let (again, unknown) = pipeline.again(calls);
                    if !unknown.is_empty() {
                        answered(
                            unknown
                                .into_iter()
                                .map(|i| (i, Err(Error::OutcomeUnknown)))
                                .collect(),
                        );
                    }
                    if again.sent.is_empty() {
                        return;
                    }
                    for &i in &again.sent {
                        calls[i].again.store(true, Ordering::Relaxed);
                    }
                    part = std::borrow::Cow::Owned(again);
                }
                Err(err) => {
                    return answered(sent.iter().map(|&i| (i, Err(err.clone()))).collect());
                }
            }
        }
    }

    /// Each call's answer from its reply.
    fn decode_all(
        &self,
        calls: &[Sent],
        sent: &[usize],
        replies: Vec<Value>,
    ) -> Vec<(usize, Result<Answer>)> {
        sent.iter()
            .zip(replies)
            .map(|(&i, reply)| {
                let call = &calls[i].call;
                // A transfer sent again that cannot tell whether its first run moved the lease.
                if matches!(call, Call::Transfer { .. }) && reply == Value::Int(-1) {
                    return (i, Err(Error::OutcomeUnknown));
                }
                let answer = decode(call, reply).map_err(|e| self.connection.classify_reply(e));
                (i, answer)
            })
            .collect()
    }

    /// Tells the logger when calls failed in Redis or on the way: Mastra swallows those
    /// failures (a failed `acquireLease` counts as acquired), so without this nobody would
    /// know leases are failing open. A warning the first time and at most every 30 s (with
    /// how many calls failed since), debug notes in between; failed acquires have warnings
    /// of their own, which say what Mastra makes of them, and failed reads, renewals,
    /// releases and transfers theirs, which do not.
    fn report_failures(&self, calls: &[Sent], answers: &[(usize, Result<Answer>)]) {
        let failed = answers.iter().filter_map(|(i, answer)| match answer {
            Err(err) if err.is_unavailable() => Some((&calls[*i].call, err)),
            _ => None,
        });
        let (acquires, others): (Vec<_>, Vec<_>) =
            failed.partition(|(call, _)| matches!(call, Call::Acquire { .. }));
        let acquires_failing = "mastra-lease: lease calls are failing, and Mastra counts a \
                                failed acquireLease as acquired: until Redis answers again, \
                                more than one process may run the same thread";
        let calls_failing = "mastra-lease: lease calls are failing: until Redis answers again, \
                             they reject";
        self.report(&self.acquire_failures, &acquires, acquires_failing);
        self.report(&self.failures, &others, calls_failing);
    }

    /// One notice about `failed` calls, `warning` when the throttle says it is time for one.
    fn report(&self, throttle: &Throttle, failed: &[(&Call, &Error)], warning: &str) {
        let Some((call, err)) = failed.first() else {
            return;
        };
        let (level, since) = throttle.level_of(failed.len() as u64);
        let message = match level {
            Level::Warn => warning,
            Level::Debug => "mastra-lease: lease calls failed",
        };
        self.connection.notice(Notice::new(
            level,
            message,
            &[
                ("code", Json::from(err.code())),
                ("err", Json::from(err.full_message())),
                ("operation", Json::from(call.operation().name())),
                ("key", Json::from(call.key())),
                ("failedCalls", Json::from(since)),
            ],
        ));
    }

    /// Sends a pipeline's calls on `link` and reads their replies. A call whose reply asks
    /// for another command goes again in a later pass, invisibly to callers: a script Redis
    /// does not know (NOSCRIPT, after a restart or SCRIPT FLUSH) is loaded first, with every
    /// other lease script (a flush forgot them all, so no later call finds one known and
    /// another not), and a plain acquire that found its owner already holding the lease, that
    /// claimed a key beside a leftover companion key, or that the server refused, goes as the
    /// acquire script. At most three passes (the script sent in the second may itself be
    /// unknown).
    ///
    /// Sending again must not reorder the calls on one key: a plain acquire is used only for
    /// a key with no other call in the pipeline; a script call on a key is unknown to Redis
    /// only when every script is, so the key's later script calls are sent again with it; and
    /// the reads after the first call sent again go again too (reads are safe to repeat), so
    /// a read never reports a state from before a write preceding it.
    async fn passes(
        &self,
        link: &mut Link,
        calls: &[Sent],
        pipeline: &Part,
    ) -> redis::RedisResult<Vec<Value>> {
        let sent = &pipeline.sent;
        let mut replies: Vec<Value> = Vec::with_capacity(sent.len());
        // A key with several calls has its acquires sent as the script from the start.
        let mut how: Vec<How> = match pipeline.keys_repeat {
            true => repeated_keys(calls, sent)
                .into_iter()
                .map(|repeated| if repeated { How::Script } else { How::Plain })
                .collect(),
            false => vec![How::Plain; sent.len()],
        };
        let mut plain = vec![false; sent.len()];
        let mut pending: Vec<usize> = (0..sent.len()).collect();
        let mut load = false;
        for pass in 0..3 {
            let loads = match load {
                true => scripts::LEASE_SCRIPTS.len(),
                false => 0,
            };
            // A server that refused the plain acquire takes the script from now on.
            if !self.plain_acquire.load(Ordering::Relaxed) {
                how.iter_mut()
                    .filter(|how| **how == How::Plain)
                    .for_each(|how| *how = How::Script);
            }
            let encoded = |delivery: Delivery, plain: &mut [bool]| {
                let mut pipe = redis::pipe();
                for lua in scripts::LEASE_SCRIPTS.iter().take(loads) {
                    pipe.cmd("SCRIPT").arg("LOAD").arg(lua.source);
                }
                for &j in &pending {
                    plain[j] = self.encode(&calls[sent[j]], how[j], delivery, &mut pipe);
                }
                pipe
            };
            let pipe = encoded(Delivery::AtMostOnce, &mut plain);
            let repeatable = || encoded(Delivery::AtLeastOnce, &mut vec![false; sent.len()]);
            let mut answers = link.send_either(&pipe, &repeatable).await?;
            // A refused SCRIPT LOAD (an ACL without it) explains the NOSCRIPT that follows:
            // the caller gets that error (NOPERM), not a puzzling NOSCRIPT.
            let refused = answers
                .drain(..loads)
                .find(|reply| matches!(reply, Value::ServerError(_)));
            load = false;
            let mut again = Vec::new();
            let mut answers = answers.into_iter();
            for &j in &pending {
                let mut reply = answers.next().unwrap_or_default();
                // A plain acquire's second reply: whether its companion key is there.
                let leftovers = match plain[j] {
                    true => answers.next().unwrap_or_default(),
                    false => Value::Nil,
                };
                let call = &calls[sent[j]].call;
                if is_noscript(&reply) {
                    match (&refused, lua(call)) {
                        (Some(load_error), _) => reply = load_error.clone(),
                        (None, Some(_)) => {
                            load = true;
                            again.push(j);
                        }
                        // A plain command answered NOSCRIPT: that is its answer.
                        (None, None) => {}
                    }
                } else if plain[j] && self.acquire_again(call, &reply) {
                    how[j] = How::Script;
                    again.push(j);
                } else if plain[j] && reply == Value::Nil && leftovers != Value::Int(0) {
                    // Claimed beside leftovers (or not knowing: the EXISTS was refused): the
                    // script makes sure the new grant has none.
                    if let Value::ServerError(err) = &leftovers {
                        self.refused_exists(err);
                    }
                    how[j] = How::Claimed;
                    again.push(j);
                }
                if pass == 0 {
                    replies.push(reply);
                } else {
                    replies[j] = reply;
                }
            }
            let Some(&first) = again.first() else { break };
            pending = (first..sent.len())
                .filter(|j| again.contains(j) || lua(&calls[sent[*j]].call).is_none())
                .collect();
        }
        Ok(replies)
    }
}

/// Whether every reply says the server is still loading its data after a start (`LOADING`):
/// then nothing ran, and the same calls may go again as first sends.
fn loading(replies: &[Value]) -> bool {
    !replies.is_empty()
        && replies.iter().all(|reply| {
            matches!(reply, Value::ServerError(err)
                if err.kind() == Some(redis::ServerErrorKind::BusyLoading))
        })
}

/// Waits a little for a server that is loading its data, if `deadline` leaves time to ask it
/// again afterwards: `false` when it does not (the calls then fail as with a server not
/// reached, `ERR_LEASE_CONNECTION`).
async fn pause(deadline: Instant) -> bool {
    const PAUSE: Duration = Duration::from_millis(50);
    if deadline.saturating_duration_since(Instant::now()) <= PAUSE * 2 {
        return false;
    }
    tokio::time::sleep(PAUSE).await;
    true
}

/// When a batch began, and when it must be answered by.
#[derive(Clone, Copy)]
struct Timing {
    started: Instant,
    deadline: Instant,
}

/// A call on its way, with the id a transfer has on a cluster (carried where Redis must keep
/// it, see `commands::Delivery`), and whether it is being sent again after a connection
/// broke under it.
struct Sent {
    call: Call,
    id: String,
    again: AtomicBool,
}

impl Sent {
    fn new(call: Call, keeps_ids: bool) -> Self {
        let id = match call {
            Call::Transfer { .. } if keeps_ids => crate::core::unique_id(),
            _ => String::new(),
        };
        let again = AtomicBool::new(false);
        Self { call, id, again }
    }
}

mod commands;
mod confirm;
mod parts;
#[cfg(test)]
mod tests;
