//! An event loop of the embedder's that the shared connection to one server (to the master
//! behind Sentinel, to a cluster's masters: `routes.rs`) can run on in place of the runtime's
//! thread: the loop reports when the socket is ready and runs the connection's driver and the
//! calls' work on its own thread. Calls made on that thread are then written and answered
//! there, with no other thread woken. The glue hands in Node's own
//! loop (`glue/crossing/node_loop.rs`); without one, the runtime's thread does the I/O.
//!
//! redis-rs runs a multiplexed connection over any `AsyncRead + AsyncWrite` stream and hands
//! its driver back as a future for the caller to poll: that is the seam. What the loop adds is
//! readiness (when a read or write that would block may go on), not RESP: redis-rs encodes,
//! parses and pairs every reply with its request. Over TLS (`rediss://`), rustls runs between
//! the two, on the loop's thread as well: `tokio-rustls` needs only a stream that reads and
//! writes, nothing of Tokio's own reactor, and the handshake is made as redis-rs would make
//! it (`tls.rs`, [`Handshake`]).

use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use futures::future::BoxFuture;
use redis::aio::MultiplexedConnection;
use redis::io::tcp::socket2::SockRef;
use redis::io::tcp::TcpSettings;
use redis::{
    AsyncConnectionConfig, ConnectionAddr, ErrorKind, RedisConnectionInfo, RedisError, RedisResult,
};
use tokio::time::Instant;

use super::tls::Handshake;

/// An event loop on a thread of its own choosing.
pub trait Reactor: Send + Sync {
    /// Polls `work` on the loop's thread until it completes, inside the runtime's context (its
    /// timers may be set there). Work handed in after the loop closed is dropped.
    fn spawn(&self, work: BoxFuture<'static, ()>);

    /// Takes a connected, non-blocking TCP socket over: its reads and writes are made on the
    /// loop's thread, when the loop reports it ready.
    fn socket(&self, socket: std::net::TcpStream) -> std::io::Result<Box<dyn Socket>>;

    /// Completes once the loop has read whatever its sockets hold now and handed it to the
    /// work waiting for it. A deadline asks for this before it gives work up ([`within`]):
    /// a loop kept from running (a long synchronous stretch, a GC pause, a debugger) may hold
    /// the answers, unread, when the time runs out.
    fn caught_up(&self) -> BoxFuture<'static, ()>;
}

/// `work`, bounded by `budget`, the time judged where the answer is. On a loop's connection,
/// once the time is up, what the loop's sockets already hold is read before the work is
/// given up, so a loop that could not run never turns an answer that came in time into a
/// timeout; and a loop that came to the deadline late (it was kept from running: the
/// connection's handshake, say, could not go on meanwhile) gives the work back the time it
/// took, up to `budget` more in all. `None` when it timed out.
pub async fn within<F: std::future::Future>(
    reactor: Option<&Arc<dyn Reactor>>,
    budget: Duration,
    work: F,
) -> Option<F::Output> {
    let mut work = std::pin::pin!(work);
    let mut deadline = Instant::now() + budget;
    let mut spare = budget;
    loop {
        if let Ok(done) = tokio::time::timeout_at(deadline, work.as_mut()).await {
            return Some(done);
        }
        let reactor = reactor?;
        let late = Instant::now().saturating_duration_since(deadline);
        reactor.caught_up().await;
        if let Poll::Ready(done) = futures::poll!(work.as_mut()) {
            return Some(done);
        }
        let given = late.min(spare);
        if given < LATE {
            return None;
        }
        spare -= given;
        deadline = Instant::now() + given;
    }
}

/// How late a loop must come to a deadline to have been kept from running, rather than busy
/// with its ordinary work.
const LATE: Duration = Duration::from_millis(10);

/// A socket a [`Reactor`] polls.
pub trait Socket: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Sync + Unpin {}

/// TLS over a socket a [`Reactor`] polls: read and written where the socket is.
impl Socket for tokio_rustls::client::TlsStream<Box<dyn Socket>> {}

/// Opens a connection to `addr` (a TCP address, with TLS made as `tls` says for a `rediss://`
/// one) whose socket and driver run on `reactor`: connected (within `connect_timeout`, the
/// TLS handshake included) and set up (credentials, database) on the loop's thread, the
/// driver polled there afterwards until the connection's last handle is dropped.
pub(super) async fn open(
    reactor: Arc<dyn Reactor>,
    addr: ConnectionAddr,
    tls: Option<Arc<Handshake>>,
    redis: RedisConnectionInfo,
    tcp: TcpSettings,
    config: AsyncConnectionConfig,
    connect_timeout: Duration,
) -> RedisResult<MultiplexedConnection> {
    let ((host, port), tls) = match (addr, tls) {
        (ConnectionAddr::Tcp(host, port), _) => ((host, port), None),
        (
            ConnectionAddr::TcpTls {
                host,
                port,
                insecure,
                ..
            },
            Some(handshake),
        ) => ((host.clone(), port), Some((handshake, host, insecure))),
        _ => {
            return Err(RedisError::from((
                ErrorKind::Client,
                "a connection on the event loop needs a TCP address, and TLS settings for a rediss:// one",
            )))
        }
    };
    let (opened, connection) = tokio::sync::oneshot::channel();
    let on = reactor.clone();
    reactor.spawn(Box::pin(async move {
        let connect = async {
            // Before the socket: made once, off the loop's thread (see `Handshake`).
            let tls = match &tls {
                Some((handshake, host, insecure)) => {
                    Some(handshake.connector(host, *insecure).await?)
                }
                None => None,
            };
            let stream = tokio::net::TcpStream::connect((host.as_str(), port)).await?;
            let stream = stream.into_std()?;
            let sock = SockRef::from(&stream);
            sock.set_tcp_nodelay(tcp.nodelay())?;
            if let Some(keepalive) = tcp.keepalive() {
                sock.set_tcp_keepalive(keepalive)?;
            }
            let mut socket = on.socket(stream)?;
            if let Some((connector, name)) = tls {
                socket = Box::new(connector.connect(name, socket).await?);
            }
            MultiplexedConnection::new_with_config(&redis, socket, config).await
        };
        let outcome = match within(Some(&on), connect_timeout, connect).await {
            Some(outcome) => outcome,
            None => Err(std::io::Error::from(std::io::ErrorKind::TimedOut).into()),
        };
        match outcome {
            Ok((connection, driver)) => {
                // Nobody waits for it any more (the call gave up): let it go.
                if opened.send(Ok(connection)).is_ok() {
                    driver.await;
                }
            }
            Err(err) => {
                let _ = opened.send(Err(err));
            }
        }
    }));
    connection.await.unwrap_or_else(|_| {
        Err(std::io::Error::new(
            std::io::ErrorKind::BrokenPipe,
            "the event loop closed before the connection was made",
        )
        .into())
    })
}
