//! An event loop of the embedder's that the shared connection to one server can run on in
//! place of the runtime's thread: the loop reports when the socket is ready and runs the
//! connection's driver and the calls' work on its own thread. Calls made on that thread are
//! then written and answered there, with no other thread woken. The glue hands in Node's own
//! loop (`glue/crossing/node_loop.rs`); without one, the runtime's thread does the I/O.
//!
//! redis-rs runs a multiplexed connection over any `AsyncRead + AsyncWrite` stream and hands
//! its driver back as a future for the caller to poll: that is the seam. What the loop adds is
//! readiness (when a read or write that would block may go on), not RESP: redis-rs encodes,
//! parses and pairs every reply with its request.

use std::sync::Arc;

use futures::future::BoxFuture;
use redis::aio::MultiplexedConnection;
use redis::io::tcp::socket2::SockRef;
use redis::io::tcp::TcpSettings;
use redis::{AsyncConnectionConfig, RedisConnectionInfo, RedisResult};

/// An event loop on a thread of its own choosing.
pub trait Reactor: Send + Sync {
    /// Polls `work` on the loop's thread until it completes, inside the runtime's context (its
    /// timers may be set there). Work handed in after the loop closed is dropped.
    fn spawn(&self, work: BoxFuture<'static, ()>);

    /// Takes a connected, non-blocking TCP socket over: its reads and writes are made on the
    /// loop's thread, when the loop reports it ready.
    fn socket(&self, socket: std::net::TcpStream) -> std::io::Result<Box<dyn Socket>>;
}

/// A socket a [`Reactor`] polls.
pub trait Socket: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Sync + Unpin {}

/// Opens a connection to `host`:`port` whose socket and driver run on `reactor`: connected
/// (within `connect_timeout`) and set up (credentials, database) on the loop's thread, the
/// driver polled there afterwards until the connection's last handle is dropped.
pub(super) async fn open(
    reactor: Arc<dyn Reactor>,
    (host, port): (String, u16),
    redis: RedisConnectionInfo,
    tcp: TcpSettings,
    config: AsyncConnectionConfig,
    connect_timeout: std::time::Duration,
) -> RedisResult<MultiplexedConnection> {
    let (opened, connection) = tokio::sync::oneshot::channel();
    let on = reactor.clone();
    reactor.spawn(Box::pin(async move {
        let connect = async {
            let stream = tokio::net::TcpStream::connect((host.as_str(), port)).await?;
            let stream = stream.into_std()?;
            let sock = SockRef::from(&stream);
            sock.set_tcp_nodelay(tcp.nodelay())?;
            if let Some(keepalive) = tcp.keepalive() {
                sock.set_tcp_keepalive(keepalive)?;
            }
            let socket = on.socket(stream)?;
            MultiplexedConnection::new_with_config(&redis, socket, config).await
        };
        let outcome = match tokio::time::timeout(connect_timeout, connect).await {
            Ok(outcome) => outcome,
            Err(_) => Err(std::io::Error::from(std::io::ErrorKind::TimedOut).into()),
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
