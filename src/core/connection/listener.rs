//! Shard channels listened to on a connection of their own, for wake-ups: a lease's release
//! and transfer scripts publish on the lease key's name (`SPUBLISH`, in the key's own slot)
//! when a waiter marked the lease, and a process waiting for the key hears it here at once
//! instead of polling.
//!
//! One RESP3 connection per [`Connection`](super::Connection), opened on the first
//! [`Listener::listen`]; every channel is subscribed once (`SSUBSCRIBE`), however many listen
//! to it. When the connection is lost, nothing said meanwhile is heard, so a fresh connection
//! is opened in the background with every channel subscribed again, and every listener is
//! woken once it is up (it checks again for itself). Not at the loss itself: when it is the
//! server that went away (a restart, a failover), a check then could only fail, and a waiter
//! whose check fails gives up its wait a moment before the server is back. A wake-up
//! therefore means "the key may have changed": a listener must check, never assume.
//!
//! A server that refuses `SSUBSCRIBE` (older than 7.0, a service or a fork that leaves shard
//! channels out, a renamed command, an ACL without it) gets the same channels as classic
//! ones (`SUBSCRIBE`): the scripts publish with `PUBLISH` where `SPUBLISH` is refused.
//! One that refuses `SUBSCRIBE` too gets no subscription at all: a listen then succeeds and
//! hears nothing, and waiters wake at the lease's TTL (their own timer). Each step down is
//! told once, as a warning, and holds for the listener's life: a server does not grow
//! commands back between two waits.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use futures::future::BoxFuture;
use redis::cluster::ClusterConfig;
use redis::{AsyncConnectionConfig, PushInfo, PushKind, RedisError, RedisResult, Value};
use serde_json::Value as Json;
use tokio::runtime::Handle;
use tokio::sync::mpsc;

use super::address::Protocol;
use super::link::{Channels, Link, Target};
use super::setup::Setup;
use super::ConnectionOptions;
use crate::core::error::{Error, Result};
use crate::core::lock;
use crate::core::log::{Level, Notice};

/// What a listener calls, with nothing to say but "look again".
pub type Wake = Arc<dyn Fn() + Send + Sync>;

/// The first wait before opening the connection again after it was lost; it doubles up to
/// [`AGAIN_AT_MOST`].
const AGAIN: Duration = Duration::from_millis(100);
const AGAIN_AT_MOST: Duration = Duration::from_secs(2);

/// The `code` field of the warning that waiters listen another way, or not at all.
const WAKE_UPS_WARNING_CODE: &str = "MASTRA_LEASE_WAKE_UPS";

/// How the listener listens, from the best the server allows down: [`Channels::Shard`],
/// [`Channels::Classic`], or not at all.
const SHARD: u8 = 0;
const CLASSIC: u8 = 1;
const DEAF: u8 = 2;

/// The listening connection and who listens to what.
pub struct Listener {
    shared: Arc<Shared>,
}

struct Shared {
    /// Where to listen: the connection's options, made a RESP3 target by the first listen
    /// (so a provider nobody waits on builds nothing more than its own connection).
    options: ConnectionOptions,
    target: OnceLock<Target>,
    /// The runtime the first listen ran on, where the background work runs: `unlisten` and
    /// `close` may be called from any thread.
    runtime: OnceLock<Handle>,
    config: AsyncConnectionConfig,
    cluster: ClusterConfig,
    timeout: Duration,
    /// Given to each listening connection (`CLIENT SETNAME`), as to every other.
    name: Option<String>,
    /// Where the warnings go: the connection's logger.
    setup: Arc<Setup>,
    /// [`SHARD`], [`CLASSIC`] or [`DEAF`]: only ever moves down.
    channels_kind: AtomicU8,
    /// The listeners of each channel, by the id [`Listener::listen`] answered.
    channels: Mutex<HashMap<Vec<u8>, Vec<Listening>>>,
    next: AtomicU64,
    /// The connection the subscriptions are on; `None` before the first and once one was
    /// lost, until the next is up.
    live: tokio::sync::Mutex<Option<Live>>,
    made: AtomicU64,
    /// A reconnection is under way (so a second loss does not start another).
    reconnecting: AtomicBool,
    closed: AtomicBool,
}

/// One listener of a channel: its id and what to call.
type Listening = (u64, Wake);

/// A listening connection: its number and the channels subscribed on it, and how.
struct Live {
    number: u64,
    link: Link,
    kind: Channels,
    subscribed: HashSet<Vec<u8>>,
}

impl Listener {
    /// Connects nowhere and builds nothing yet: the deployment `options` name (already
    /// checked by the connection they belong to) is reached when someone first listens.
    /// Every subscription, connecting included, is bounded by the command timeout; each
    /// connection is named as the options say; warnings go to `setup`'s logger.
    pub(super) fn new(options: &ConnectionOptions, setup: Arc<Setup>) -> Self {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(options.connect_timeout))
            .set_response_timeout(Some(options.command_timeout));
        let cluster = ClusterConfig::new()
            .set_connection_timeout(options.connect_timeout)
            .set_response_timeout(options.command_timeout);
        Self {
            shared: Arc::new(Shared {
                options: options.clone(),
                target: OnceLock::new(),
                runtime: OnceLock::new(),
                config,
                cluster,
                timeout: options.command_timeout,
                name: options.name.clone(),
                setup,
                channels_kind: AtomicU8::new(SHARD),
                channels: Mutex::new(HashMap::new()),
                next: AtomicU64::new(1),
                live: tokio::sync::Mutex::new(None),
                made: AtomicU64::new(0),
                reconnecting: AtomicBool::new(false),
                closed: AtomicBool::new(false),
            }),
        }
    }

    /// Calls `wake` whenever a message is published on `channel` (and once listening again
    /// after messages may have been missed), until [`Listener::unlisten`] with the id it
    /// answers. Resolves once Redis confirmed the subscription, so anything published
    /// afterwards is heard (or at once, hearing nothing, on a server that refuses both kinds of
    /// subscription); fails, listening to nothing, when it could not be made within the
    /// timeout.
    pub async fn listen(&self, channel: &[u8], wake: Wake) -> Result<u64> {
        let shared = &self.shared;
        shared.runtime.get_or_init(Handle::current);
        let id = shared.next.fetch_add(1, Ordering::Relaxed);
        lock(&shared.channels)
            .entry(channel.to_vec())
            .or_default()
            .push((id, wake));
        match shared.subscribe(channel).await {
            Ok(()) => Ok(id),
            Err(err) => {
                self.forget(channel, id);
                Err(err)
            }
        }
    }

    /// Stops calling listener `id` of `channel`; the last one gone unsubscribes (best
    /// effort, in the background: a subscription left behind costs a message now and then).
    pub fn unlisten(&self, channel: &[u8], id: u64) {
        // A channel has listeners only after a listen, so the runtime is known.
        if let (true, Some(runtime)) = (self.forget(channel, id), self.shared.runtime.get()) {
            let shared = self.shared.clone();
            let channel = channel.to_vec();
            runtime.spawn(async move {
                let mut live = shared.live.lock().await;
                let unused = !lock(&shared.channels).contains_key(&channel);
                if let (Some(live), true) = (live.as_mut(), unused) {
                    if live.subscribed.remove(&channel) {
                        let unsubscribe = live.link.unsubscribe(live.kind, &channel);
                        let _ = tokio::time::timeout(shared.timeout, unsubscribe).await;
                    }
                }
            });
        }
    }

    /// Whether `channel` has a listener.
    pub fn listens(&self, channel: &[u8]) -> bool {
        lock(&self.shared.channels).contains_key(channel)
    }

    /// Removes listener `id`; answers whether its channel has no listener left.
    fn forget(&self, channel: &[u8], id: u64) -> bool {
        let mut channels = lock(&self.shared.channels);
        let Some(listeners) = channels.get_mut(channel) else {
            return false;
        };
        listeners.retain(|(listener, _)| *listener != id);
        let empty = listeners.is_empty();
        if empty {
            channels.remove(channel);
        }
        empty
    }

    /// Wakes every listener once more (they will find what closed), forgets them all, drops
    /// the connection and stops what the target runs in the background (a Sentinel watcher).
    pub fn close(&self) {
        let shared = &self.shared;
        shared.closed.store(true, Ordering::Release);
        shared.wake_all();
        lock(&shared.channels).clear();
        if let Some(target) = shared.target.get() {
            target.close();
        }
        if let Some(runtime) = shared.runtime.get() {
            let shared = shared.clone();
            runtime.spawn(async move { *shared.live.lock().await = None });
        }
    }
}

impl Shared {
    /// Makes sure `channel` is subscribed on the connection, opening one if there is none
    /// (which subscribes every channel), within the timeout. A refused subscription steps
    /// down a kind and tries again on a fresh connection.
    async fn subscribe(self: &Arc<Self>, channel: &[u8]) -> Result<()> {
        let target = self.target()?;
        let work = async {
            let mut live = self.live.lock().await;
            let before = self.kind();
            let mut refusal = None;
            loop {
                let Some(kind) = self.kind() else {
                    self.tell(before, refusal);
                    return Ok(());
                };
                let (used, done) = match live.as_mut() {
                    Some(live) if live.subscribed.contains(channel) => (live.kind, Ok(())),
                    Some(live) => {
                        let done = live.link.subscribe(live.kind, channel).await;
                        if done.is_ok() {
                            live.subscribed.insert(channel.to_vec());
                        }
                        (live.kind, done)
                    }
                    None => match self.open(target, kind).await {
                        Ok(opened) => {
                            *live = Some(opened);
                            (kind, Ok(()))
                        }
                        Err(err) => (kind, Err(err)),
                    },
                };
                match done {
                    Err(err) if refused(&err) => {
                        *live = None;
                        self.step_down(used);
                        refusal = Some(err);
                    }
                    other => {
                        self.tell(before, refusal);
                        return other;
                    }
                }
            }
        };
        match tokio::time::timeout(self.timeout, work).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(err)) => Err(Error::from_redis(err, self.timeout)),
            Err(_) => Err(Error::timeout(self.timeout)),
        }
    }

    /// How to subscribe: `None` when the server refuses every kind.
    fn kind(&self) -> Option<Channels> {
        match self.channels_kind.load(Ordering::Acquire) {
            SHARD => Some(Channels::Shard),
            CLASSIC => Some(Channels::Classic),
            _ => None,
        }
    }

    /// The server refused subscriptions of `kind`: the next kind from now on.
    fn step_down(&self, kind: Channels) {
        let to = match kind {
            Channels::Shard => CLASSIC,
            Channels::Classic => DEAF,
        };
        self.channels_kind.fetch_max(to, Ordering::AcqRel);
    }

    /// One warning, when the listener stepped down from `before` (a refusal, `err`, moved it):
    /// what waiters get now. Called with the connection's lock held, so one caller tells each
    /// step.
    fn tell(&self, before: Option<Channels>, err: Option<RedisError>) {
        let (now, Some(err)) = (self.kind(), err) else {
            return;
        };
        if now == before {
            return;
        }
        let message = match now {
            Some(_) => {
                "mastra-lease: Redis refused SSUBSCRIBE: waiters listen for releases with SUBSCRIBE \
                 instead, which hears the releases that servers without SPUBLISH publish (with \
                 PUBLISH); a release published with SPUBLISH wakes them only at the lease's TTL"
            }
            None => {
                "mastra-lease: Redis refused SSUBSCRIBE and SUBSCRIBE: waiters hear no releases and \
                 take a lease once its holder's TTL runs out"
            }
        };
        let fields = [
            ("code", Json::from(WAKE_UPS_WARNING_CODE)),
            ("err", Json::from(err.to_string())),
        ];
        self.setup
            .notice(Notice::new(Level::Warn, message, &fields));
    }

    /// The RESP3 target, built by the first caller (its options were checked when the
    /// connection was made, so this fails only as that did not).
    fn target(&self) -> Result<&Target> {
        if let Some(target) = self.target.get() {
            return Ok(target);
        }
        let target = Target::new(&self.options, Protocol::Resp3)?;
        Ok(self.target.get_or_init(|| target))
    }

    /// A fresh connection with every channel listened to subscribed on it as `kind`, its
    /// pushes read by a task of its own.
    async fn open(self: &Arc<Self>, target: &Target, kind: Channels) -> RedisResult<Live> {
        let number = self.made.fetch_add(1, Ordering::Relaxed) + 1;
        let (pushes, heard) = mpsc::unbounded_channel();
        let mut link = target
            .listening(&self.config, self.cluster.clone(), pushes)
            .await?;
        tokio::spawn(read_pushes(Arc::downgrade(self), number, heard));
        if let Some(name) = &self.name {
            // A convenience, as on every connection: an ACL that refuses it costs the name.
            let _ = link
                .on_every_master(redis::cmd("CLIENT").arg("SETNAME").arg(name))
                .await;
        }
        let subscribed: HashSet<Vec<u8>> = lock(&self.channels).keys().cloned().collect();
        let subscriptions = subscribed.iter().map(|channel| {
            let mut link = link.clone();
            async move { link.subscribe(kind, channel).await }
        });
        for done in futures::future::join_all(subscriptions).await {
            done?;
        }
        Ok(Live {
            number,
            link,
            kind,
            subscribed,
        })
    }

    fn wake(&self, channel: &[u8]) {
        let listeners: Vec<Wake> = match lock(&self.channels).get(channel) {
            Some(listeners) => listeners.iter().map(|(_, wake)| wake.clone()).collect(),
            None => return,
        };
        for wake in listeners {
            wake();
        }
    }

    fn wake_all(&self) {
        let listeners: Vec<Wake> = lock(&self.channels)
            .values()
            .flatten()
            .map(|(_, wake)| wake.clone())
            .collect();
        for wake in listeners {
            wake();
        }
    }

    /// Connection `number` is gone: whatever was published meanwhile is not heard, so
    /// everyone looks again once a fresh connection listens, whether this opened it or a
    /// `listen` did meanwhile, or once none can (the server refuses every kind now).
    /// (Boxed: it opens a connection whose reader may call it again.)
    fn lost(self: Arc<Self>, number: u64) -> BoxFuture<'static, ()> {
        Box::pin(async move { self.reconnect(number).await })
    }

    async fn reconnect(self: Arc<Self>, number: u64) {
        {
            let mut live = self.live.lock().await;
            if live.as_ref().is_some_and(|live| live.number == number) {
                *live = None;
            }
        }
        if self.reconnecting.swap(true, Ordering::AcqRel) {
            return;
        }
        let mut pause = AGAIN;
        while !self.closed.load(Ordering::Acquire) && !lock(&self.channels).is_empty() {
            let reopened = {
                let mut live = self.live.lock().await;
                if live.is_some() {
                    break;
                }
                // A connection was open before, so the target exists.
                let (Some(target), Some(kind)) = (self.target.get(), self.kind()) else {
                    break;
                };
                match tokio::time::timeout(self.timeout, self.open(target, kind)).await {
                    Ok(Ok(opened)) => {
                        *live = Some(opened);
                        true
                    }
                    Ok(Err(err)) if refused(&err) => {
                        self.step_down(kind);
                        self.tell(Some(kind), Some(err));
                        continue;
                    }
                    Ok(Err(_)) | Err(_) => false,
                }
            };
            if reopened {
                break;
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(AGAIN_AT_MOST);
        }
        // However it ended; after a close nobody is left to wake (close woke them all).
        self.wake_all();
        self.reconnecting.store(false, Ordering::Release);
    }
}

/// Hands the messages of connection `number` to their listeners, and its loss to
/// [`Shared::lost`]. Holds the listener weakly: the connection holds the sender, so a strong
/// reference would keep both alive forever.
async fn read_pushes(
    shared: Weak<Shared>,
    number: u64,
    mut heard: mpsc::UnboundedReceiver<PushInfo>,
) {
    while let Some(push) = heard.recv().await {
        let Some(shared) = shared.upgrade() else {
            return;
        };
        match push.kind {
            PushKind::SMessage | PushKind::Message => {
                if let Some(Value::BulkString(channel)) = push.data.first() {
                    shared.wake(channel);
                }
            }
            PushKind::Disconnection => {
                tokio::spawn(shared.lost(number));
                return;
            }
            _ => {}
        }
    }
    // Every sender is gone: the connection was dropped (replaced, or the listener closed).
}

/// Whether the server refused a subscription for good: an unknown command (renamed away, left
/// out, older than the command) or one the ACL user may not run, or a channel it may not
/// use. Anything else (a timeout, a broken connection) is the call's error.
fn refused(err: &RedisError) -> bool {
    Error::is_unknown_command(err).is_some() || err.code() == Some("NOPERM")
}
