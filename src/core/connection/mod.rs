//! The Redis connection the lease store and the streams transport send their non-blocking
//! commands through (opened lazily, the first calls sharing one attempt; reconnected by
//! redis-rs' `ConnectionManager`; every call bounded by the command timeout), and the
//! dedicated connections blocking reads need.
//!
//! - `mod.rs`: [`Connection`], the shared slot, timeouts, classifying errors.
//! - `options.rs`: what the connection is opened with ([`ConnectionOptions`], [`Deployment`]).
//! - `link.rs`: the deployment reached ([`Target`]) and a connection to it ([`Link`]), the
//!   one place that knows what kind of deployment it is.
//! - `keyspace.rs`: what the kind means to callers: how keys are spread ([`Keyspace`]),
//!   which may share a request ([`Shard`], [`Connection::by_shard`]), every master to visit;
//!   a key's hash slot ([`slot`]), which the lease layout takes from here.
//! - `address.rs`: URLs, credentials, seeds and node addresses, checked against the TLS
//!   options; URLs kept out of messages.
//! - `exclusive.rs`: links lent to one caller at a time, for work that blocks its connection
//!   (`WAIT`).
//! - `slots.rs`: which master serves a cluster slot, for links to one node.
//! - `listener.rs`: shard channels heard on a RESP3 connection of its own, for waiters'
//!   wake-ups (`SSUBSCRIBE`, else `SUBSCRIBE`); subscribed again after a loss.
//! - `reactor.rs`: an event loop of the embedder's (Node's) that the shared link runs on in
//!   place of the runtime's thread ([`Reactor`]).
//! - `routes.rs`: a cluster's masters on that loop, each request to its slot's master.
//! - `sentinel.rs`: the master behind Sentinel, and the `+switch-master` watcher.
//! - `setup.rs`: naming a fresh connection and checking the server's eviction policy.
//! - `tick.rs`: a timer kept ahead of the calls' deadlines, so setting theirs wakes nothing.
//! - `tls.rs`: TLS material for `rediss://`.

mod address;
mod cluster;
mod exclusive;
mod keyspace;
mod link;
mod listener;
mod options;
mod reactor;
mod routes;
mod sentinel;
mod setup;
mod slots;
mod tick;
mod tls;

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use redis::aio::ConnectionManagerConfig;
use redis::{AsyncConnectionConfig, FromRedisValue, RedisResult, Value};

use crate::core::error::{Error, Result, Subject};
use crate::core::lock;
use crate::core::log::{Logger, Notice};

use address::Protocol;
use exclusive::Exclusive;
pub use keyspace::{hash_tag, in_slot, slot, slot_tag, Keyspace, PrefixSlots, Shard, SLOTS};
pub use link::Link;
use link::Target;
use listener::Listener;
pub use listener::Wake;
pub use options::{ConnectionOptions, Deployment, DEFAULT_KEEP_ALIVE};
use reactor::within;
pub use reactor::{Reactor, Socket};
use setup::Setup;
pub use setup::EVICTION_WARNING_CODE;
pub use tls::TlsOptions;

/// A lazily opened, shared connection to one Redis deployment (a server, a cluster, the
/// master behind Sentinel).
///
/// ## Behavior
/// - Nothing connects until the first call; the calls made meanwhile share one attempt.
/// - Every call, connecting included, is bounded by the command timeout: it answers, or it
///   fails with [`Error::Timeout`].
/// - An I/O error breaks the connection; redis-rs' `ConnectionManager` (one server) or its
///   cluster connection (a cluster: per node) opens a new one. Behind Sentinel, the
///   connection is given up and the next call asks the sentinels for the master again; so
///   it is when the node answers READONLY (a demoted master), which fails the call with
///   [`Error::Connection`]. A call that broke fails with [`Error::Connection`], unless it
///   went through [`Connection::run_again_if_broken`].
/// - A call that timed out gives up its connection (see [`Connection::run`]).
/// - Each new connection is named (`CLIENT SETNAME`) and, with a logger, has its eviction
///   policy read, in a task of its own after a call on it succeeded.
/// - After [`Connection::close`] every call fails with [`Error::Closed`].
pub struct Connection {
    target: Target,
    config: ConnectionManagerConfig,
    /// For the dedicated connections blocking reads need.
    dedicated: AsyncConnectionConfig,
    /// For the links lent by [`Connection::run_exclusive`].
    lent: AsyncConnectionConfig,
    /// Links lent to one caller at a time.
    exclusive: Exclusive,
    /// Made on first use, numbered. Replaced when Redis refused the connection itself (a
    /// wrong password, which the manager keeps and would answer every later call with), and
    /// when a call on it timed out (see [`Connection::run`]).
    slot: Mutex<Option<(u64, Link)>>,
    /// Held while a connection is being made, so the calls waiting for it share one attempt.
    connecting: tokio::sync::Mutex<()>,
    /// The number the next connection made gets.
    made: AtomicU64,
    timeout: Duration,
    connect_timeout: Duration,
    name: Option<String>,
    /// What a call after `close` says is closed.
    subject: Subject,
    closed: AtomicBool,
    /// Names a fresh connection and checks the server's eviction policy on it.
    setup: Arc<Setup>,
    /// The connection of its own that listens to shard channels, opened on first use.
    listener: Listener,
    /// Whether the URLs ask for TLS (`rediss://`), and whether any call has been answered
    /// yet: a timeout before the first answer over TLS names the likely cause.
    tls: bool,
    answered: AtomicBool,
    /// Where the connection reaches, as its connection errors name it (addresses only).
    place: Arc<str>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The target holds the URL, which may carry a password: never print it.
        f.debug_struct("Connection")
            .field("timeout", &self.timeout)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl Connection {
    /// Checks the URL, the credentials and the TLS material; does not connect. `subject` is
    /// what a call after [`Connection::close`] says was closed.
    pub fn new(options: &ConnectionOptions, subject: Subject) -> Result<Self> {
        let target = Target::new(options, Protocol::AsTheUrlSays)?;
        Self::with_target(target, options, subject, Setup::default())
    }

    /// Another connection to the same deployment, for work best run on `options.reactor`
    /// (a lease store beside a streams transport, on Node's loop): `None` when its shared
    /// link could not run there (a unix socket; see [`ConnectionOptions::reactor`]). It
    /// shares this one's logger (and the sentinels, or a cluster's redis-rs connection), and
    /// a policy warned about on either is not warned about again on the other. `options` are
    /// this one's, the reactor aside.
    pub fn beside(&self, options: &ConnectionOptions) -> Result<Option<Self>> {
        if options.reactor.is_none() {
            return Ok(None);
        }
        let target = self.target.beside(options)?;
        let connection = Self::with_target(target, options, self.subject, self.setup.beside())?;
        Ok(connection.reactor().is_some().then_some(connection))
    }

    fn with_target(
        target: Target,
        options: &ConnectionOptions,
        subject: Subject,
        setup: Setup,
    ) -> Result<Self> {
        let tls = address::asks_tls(options);
        // No response timeout of redis-rs' own on the shared link: every use of it is bounded
        // by `run_within`, which forgets a link that timed out. A second timer per command
        // would wake the runtime's thread once more per call for nothing.
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(options.connect_timeout))
            .set_response_timeout(None)
            .set_number_of_retries(1)
            .set_min_delay(Duration::from_millis(50))
            .set_max_delay(Duration::from_millis(500));
        // A blocking read answers after its BLOCK, which the caller bounds: no response
        // timeout of redis-rs' own on these.
        let dedicated = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(options.connect_timeout))
            .set_response_timeout(None);
        let lent = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(options.connect_timeout))
            .set_response_timeout(Some(options.command_timeout));
        let setup = Arc::new(setup);
        Ok(Self {
            target,
            config,
            dedicated,
            lent,
            exclusive: Exclusive::default(),
            slot: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
            made: AtomicU64::new(0),
            timeout: options.command_timeout,
            connect_timeout: options.connect_timeout,
            name: options.name.clone(),
            subject,
            closed: AtomicBool::new(false),
            listener: Listener::new(options, setup.clone()),
            setup,
            tls,
            answered: AtomicBool::new(false),
            place: address::place(options),
        })
    }

    /// The embedder's event loop the shared link runs on, if it does ([`Reactor`]): work that
    /// uses the link is best polled there too.
    pub fn reactor(&self) -> Option<Arc<dyn Reactor>> {
        self.target.reactor().cloned()
    }

    /// The bound on every call.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// A round trip to the server (`PING`; on a cluster, to every master at once: the leases
    /// of a slot whose master does not answer are unreachable), connecting if need be: how
    /// long it took. Settles within the command timeout, as every call does; a server that
    /// cannot be reached, or refuses the command, is the call's error.
    pub async fn ping(&self) -> Result<Duration> {
        let started = std::time::Instant::now();
        let ping = redis::cmd("PING");
        let replies = self
            .run_within(self.timeout, |mut link| async move {
                link.on_every_master(&ping).await
            })
            .await?;
        for reply in replies {
            parse::<String>(reply).map_err(|err| self.classify_reply(err))?;
        }
        Ok(started.elapsed())
    }

    /// Where the eviction-policy warning goes. Until a logger is set, the policy is never
    /// read (no extra command). The first logger set stays.
    pub fn set_logger(&self, logger: Arc<dyn Logger>) {
        self.setup.set_logger(logger);
    }

    /// Reports `notice` to the logger, if one is set.
    pub fn notice(&self, notice: Notice) {
        self.setup.notice(notice);
    }

    /// Opens a connection of its own for a caller that blocks on it (XREAD BLOCK must not
    /// hold up the shared one), named like every other, bounded by the connect and command
    /// timeouts. Answers it with its `CLIENT ID`, when the server tells it (an ACL may not):
    /// another connection can interrupt a blocking read with `CLIENT UNBLOCK <id>`, sent to
    /// the same node ([`Link::on_node_of`] with the same key). On a cluster it goes to the
    /// master of `key`'s slot.
    pub async fn dedicated(&self, key: &[u8]) -> Result<(Link, Option<i64>)> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed(self.subject));
        }
        let bound = self.connect_timeout.saturating_add(self.timeout);
        let shared = match self.target.is_cluster() {
            true => Some(self.link().await?),
            false => None,
        };
        let attempt = async {
            let mut connection = self
                .target
                .open(&self.dedicated, shared.as_ref(), Some(key))
                .await?;
            let mut pipe = redis::pipe();
            if let Some(name) = &self.name {
                pipe.cmd("CLIENT").arg("SETNAME").arg(name);
            }
            pipe.cmd("CLIENT").arg("ID");
            let replies = connection
                .send_packed_commands(&pipe, 0, pipe.len())
                .await?;
            // Both are conveniences: an ACL that refuses them costs a name and a prompt
            // wake-up, not the connection.
            let id = replies
                .into_iter()
                .last()
                .and_then(|reply| parse::<i64>(reply).ok());
            Ok::<_, redis::RedisError>((connection, id))
        };
        match tokio::time::timeout(bound, attempt).await {
            Ok(Ok(opened)) => Ok(opened),
            Ok(Err(err)) => Err(Error::from_redis(err, bound).at(&self.place)),
            Err(_) => Err(self.timed_out(bound)),
        }
    }

    /// Calls `wake` whenever something is published on the shard channel `channel` (the
    /// classic one of that name on a server that refuses shard channels; nothing at all on
    /// one that refuses both, which the listener warns about once), and whenever messages may
    /// have been missed (once the lost listening connection is back), until
    /// [`Connection::unlisten`] with the id it answers. Resolves once Redis confirmed the
    /// subscription, within the command timeout. The subscriptions share one RESP3 connection
    /// of their own, opened on the first.
    pub async fn listen(&self, channel: &[u8], wake: Wake) -> Result<u64> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed(self.subject));
        }
        self.listener
            .listen(channel, wake)
            .await
            .map_err(|err| err.at(&self.place))
    }

    /// Stops calling listener `id` of `channel`.
    pub fn unlisten(&self, channel: &[u8], id: u64) {
        self.listener.unlisten(channel, id);
    }

    /// Whether a listener of this connection listens to `channel`.
    pub fn listens(&self, channel: &[u8]) -> bool {
        self.listener.listens(channel)
    }

    /// Wakes every listener once more, forgets them all and closes the listening connection,
    /// for good: for an owner that takes no more listeners.
    pub fn close_listener(&self) {
        self.listener.close();
    }

    /// Runs commands on the connection, the whole call (connecting included) bounded by the
    /// command timeout. Must run inside a Tokio runtime.
    pub async fn run<T, F, Fut>(&self, work: F) -> Result<T>
    where
        F: FnOnce(Link) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        self.run_within(self.timeout, work).await
    }

    /// Like [`Connection::run`], for work that may run twice (an XACK; a script that checks
    /// before it writes): when the connection breaks under it, leaving unknown whether it
    /// ran, it runs once more on a fresh connection within the same timeout. A server
    /// restart or an idle connection closed by a server, NAT or proxy then costs the
    /// caller nothing.
    pub async fn run_again_if_broken<T, F, Fut>(&self, work: F) -> Result<T>
    where
        F: Fn(Link) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        let deadline = tokio::time::Instant::now() + self.timeout;
        match self.run_within(self.timeout, &work).await {
            Err(Error::Connection(..)) => {
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                self.run_within(left, work).await
            }
            other => other,
        }
    }

    /// Like [`Connection::run`], bounded by `budget` (what is left of a call's timeout).
    pub async fn run_within<T, F, Fut>(&self, budget: Duration, work: F) -> Result<T>
    where
        F: FnOnce(Link) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        tick::keep();
        let mut number = None;
        let attempt = async {
            let (made, connection) = self.get().await?;
            number = Some(made);
            Ok(work(connection).await)
        };
        match within(self.target.reactor(), budget, attempt).await {
            Some(Ok(Ok(value))) => {
                self.answered.store(true, Ordering::Relaxed);
                self.set_up_fresh();
                Ok(value)
            }
            Some(Ok(Err(err))) => {
                let err = self.classify_on(err, number);
                if let (Error::Timeout(..), Some(number)) = (&err, number) {
                    self.forget(number);
                }
                Err(self.explained(err))
            }
            Some(Err(err)) => Err(self.explained(err)),
            None => {
                if let Some(number) = number {
                    self.forget(number);
                }
                Err(self.explained(self.timed_out(self.timeout)))
            }
        }
    }

    /// No answer within `after` from this deployment, named in the error.
    pub(crate) fn timed_out(&self, after: Duration) -> Error {
        Error::timeout(after).at(&self.place)
    }

    /// A timeout over TLS before anything ever answered becomes [`Error::TlsTimeout`], which
    /// names the likely cause.
    fn explained(&self, err: Error) -> Error {
        match err {
            Error::Timeout(after, at) if self.tls && !self.answered.load(Ordering::Relaxed) => {
                Error::TlsTimeout(after, at)
            }
            err => err,
        }
    }

    /// The shared link, made now if there is none (within the caller's bound).
    async fn link(&self) -> Result<Link> {
        self.get().await.map(|(_, link)| link)
    }

    /// Closes the connection; every later call fails with [`Error::Closed`]. Calls in
    /// flight keep the connection until they settle.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.slot().take();
        self.exclusive.close();
        self.target.close();
        self.listener.close();
    }

    /// Drops connection `number` after a call on it timed out, unless a newer one replaced
    /// it already. The manager reconnects after I/O errors only, and a connection that went
    /// silent (a forgotten NAT flow, a vanished host, a reply lost by a middlebox) raises
    /// none: without this every later call would time out on it, for as long as the kernel
    /// keeps the socket (minutes). Calls still waiting on it keep it until they settle; the
    /// price is one reconnect when the server was merely slow.
    fn forget(&self, number: u64) {
        let mut slot = self.slot();
        if slot.as_ref().is_some_and(|(current, _)| *current == number) {
            *slot = None;
            self.setup.renew();
            self.target.replace_stalled();
        }
    }

    /// Classifies a redis-rs error as the variant a caller can act on (a connection error
    /// naming where it sought Redis), and forgets a connection Redis refused to authenticate
    /// so the next call tries again. Behind
    /// Sentinel, a connection that broke or reached a demoted master (READONLY) is given up
    /// too, and the error is a connection error: the next call finds the new master. On a
    /// cluster, a request cut short by a moving slot or a failover (MOVED, TRYAGAIN,
    /// CLUSTERDOWN, ...) is a connection error too: sent again, it finds the new owner.
    pub fn classify(&self, err: redis::RedisError) -> Error {
        self.classify_on(err, None)
    }

    /// [`Connection::classify`] for an error met on connection `number` (`None`: the
    /// current one).
    fn classify_on(&self, err: redis::RedisError, number: Option<u64>) -> Error {
        self.sorted_on(err, number).at(&self.place)
    }

    /// [`Connection::classify_on`] but for the place.
    fn sorted_on(&self, err: redis::RedisError, number: Option<u64>) -> Error {
        if err.is_unrecoverable_error() || err.is_io_error() {
            // The manager replaces the connection after these: the next one is set up.
            self.setup.renew();
        }
        let moving =
            matches!(err.kind(), redis::ErrorKind::Server(kind) if link::moving_kind(kind));
        // A refused password is not a lost master: it stays an authentication error.
        let broken = (err.is_unrecoverable_error() || err.is_io_error()) && !Error::is_auth(&err);
        // The reply itself could not be read: the server is not Redis. (A reply that does not
        // convert to what a caller expected is read later, and goes through classify_reply.)
        if err.kind() == redis::ErrorKind::Parse {
            if self.target.follows_failover() {
                self.forget_any(number);
            }
            return Error::Protocol;
        }
        let err = if self.target.follows_failover() && (broken || moving) {
            // Every link to the old master goes, the idle lent ones too.
            self.forget_any(number);
            self.exclusive.forget_idle();
            Error::Connection(err, Default::default())
        } else if self.target.is_cluster() && (moving || broken) {
            // The cluster connection follows the new slot owners by itself; the lent links
            // read them again.
            self.exclusive.forget_slots();
            match moving {
                true => Error::Connection(err, Default::default()),
                false => Error::from_redis(err, self.timeout),
            }
        } else {
            if broken && self.target.forgets_broken() {
                self.forget_any(number);
            }
            Error::from_redis(err, self.timeout)
        };
        if matches!(err, Error::Auth(_)) {
            self.forget_any(number);
        }
        err
    }

    /// Forgets connection `number`, or whatever connection is current.
    fn forget_any(&self, number: Option<u64>) {
        match number {
            Some(number) => self.forget(number),
            None => {
                self.slot().take();
                self.setup.renew();
                self.target.replace_stalled();
            }
        }
    }

    /// Classifies the error in one reply of a pipeline. The connection answered, so it is kept,
    /// even for NOPERM: a key outside the user's ACL must not cost a reconnect per call.
    pub fn classify_reply(&self, err: redis::RedisError) -> Error {
        Error::from_redis(err, self.timeout).at(&self.place)
    }

    /// After a call succeeded on a connection not yet set up: names it and reads the
    /// eviction policy (`setup.rs`).
    fn set_up_fresh(&self) {
        if !self.setup.claim(self.name.is_some()) {
            return;
        }
        if let Ok(Some((_, link))) = self.current() {
            self.setup.spawn(link, self.name.as_deref(), self.timeout);
        }
    }

    /// The shared connection and its number; made when there is none, one attempt at a
    /// time (a caller that finds one being made waits for it).
    async fn get(&self) -> Result<(u64, Link)> {
        if let Some(current) = self.current()? {
            return Ok(current);
        }
        let _making = self.connecting.lock().await;
        if let Some(current) = self.current()? {
            return Ok(current);
        }
        let connection = self
            .target
            .shared(&self.config, &self.dedicated, self.connect_timeout)
            .await
            .map_err(|err| self.classify_on(err, None))?;
        let current = (self.made.fetch_add(1, Ordering::Relaxed), connection);
        let mut slot = self.slot();
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed(self.subject));
        }
        *slot = Some(current.clone());
        Ok(current)
    }

    fn current(&self) -> Result<Option<(u64, Link)>> {
        let mut slot = self.slot();
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed(self.subject));
        }
        if self.target.switched() {
            self.exclusive.forget_idle();
            if slot.take().is_some() {
                self.setup.renew();
            }
        }
        Ok(slot.clone())
    }

    fn slot(&self) -> MutexGuard<'_, Option<(u64, Link)>> {
        lock(&self.slot)
    }
}

/// Parses a reply, turning an error reply into the error.
pub fn parse<T: FromRedisValue>(reply: Value) -> RedisResult<T> {
    redis::from_redis_value::<RedisResult<T>>(reply)?
}
