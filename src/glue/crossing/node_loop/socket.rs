//! A TCP socket polled by Node's loop: read and written without blocking on Node's thread,
//! libuv's poll handle (`uv.rs`) saying when either may go on.

use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use redis::io::tcp::socket2::SockRef;

use super::{drain, settle_in_poll, DRAINING};
use crate::core::connection::Socket;
use crate::core::lock;
use crate::glue::crossing::uv;

/// Who waits for a socket to become readable or writable.
#[derive(Default)]
struct Wakers {
    read: Option<Waker>,
    write: Option<Waker>,
    /// A read may find data: true until one would block, and again once libuv reports the
    /// socket readable. While false a read waits without asking the kernel (redis-rs' driver
    /// reads again after each write and each reply; most of those reads would find nothing).
    readable: bool,
    /// Writability is being watched for (only while a write would have blocked).
    watching_write: bool,
    /// libuv reported an error on the socket (a reset, say) and stopped polling it, for good:
    /// every read and write now asks the kernel, which hands over what the socket still holds
    /// (replies that came before the reset) and then the error. Nothing will report the socket
    /// ready again, so one that would block has failed.
    failed: bool,
}

/// A socket's state shared with its poll handle's callback.
pub(super) struct Io {
    wakers: Mutex<Wakers>,
    /// The poll handle; `None` once closed.
    poll: Mutex<Option<uv::Poll<Io>>>,
}

impl Io {
    /// On Node's thread: the socket is read again, whatever libuv last reported (a reply may
    /// sit in it unread when the loop could not run), its reader woken.
    pub(super) fn catch_up(&self) {
        let read = {
            let mut wakers = lock(&self.wakers);
            wakers.readable = true;
            wakers.read.take()
        };
        if let Some(read) = read {
            read.wake();
        }
    }
}

impl uv::Ready for Io {
    /// Wakes who waits for what libuv reports (both, on an error, so the next read or write
    /// meets it), then runs what that woke.
    fn ready(&self, failed: bool, readable: bool, writable: bool) {
        let (read, write) = {
            let mut wakers = lock(&self.wakers);
            wakers.failed |= failed;
            let readable = failed || readable;
            wakers.readable |= readable;
            let read = readable.then(|| wakers.read.take()).flatten();
            let writable = failed || writable;
            let write = writable.then(|| wakers.write.take()).flatten();
            if writable && wakers.watching_write && !wakers.failed {
                wakers.watching_write = false;
                if let Some(poll) = &*lock(&self.poll) {
                    poll.watch(false);
                }
            }
            (read, write)
        };
        // Woken here and run just below: no need to signal the loop.
        DRAINING.set(true);
        read.into_iter().chain(write).for_each(Waker::wake);
        drain();
        settle_in_poll();
    }
}

/// A TCP socket polled by Node's loop. Made, used and dropped on Node's thread (the
/// connection's driver runs there).
pub(super) struct LoopSocket {
    stream: std::net::TcpStream,
    io: Arc<Io>,
}

impl Socket for LoopSocket {}

impl LoopSocket {
    /// On Node's thread: `stream`, made non-blocking and polled by `on`.
    pub(super) fn new(stream: std::net::TcpStream, on: uv::Loop) -> io::Result<Self> {
        stream.set_nonblocking(true)?;
        let io = Arc::new(Io {
            wakers: Mutex::new(Wakers {
                readable: true,
                ..Wakers::default()
            }),
            poll: Mutex::new(None),
        });
        *lock(&io.poll) = Some(uv::Poll::open(on, stream.as_raw_fd(), io.clone())?);
        Ok(Self { stream, io })
    }

    /// What its poll handle's callback shares with it.
    pub(super) fn io(&self) -> &Arc<Io> {
        &self.io
    }

    /// Watches for writability too, until a write can go on.
    fn watch_write(&self, cx: &Context<'_>) {
        let mut wakers = lock(&self.io.wakers);
        wakers.write = Some(cx.waker().clone());
        if !wakers.watching_write && !wakers.failed {
            wakers.watching_write = true;
            if let Some(poll) = &*lock(&self.io.poll) {
                poll.watch(true);
            }
        }
    }

    fn would_block<T>(
        &self,
        outcome: io::Result<T>,
        cx: &Context<'_>,
        read: bool,
    ) -> Poll<io::Result<T>> {
        match outcome {
            Err(err) if err.kind() == io::ErrorKind::WouldBlock && lock(&self.io.wakers).failed => {
                let reported = self.stream.take_error().ok().flatten();
                Poll::Ready(Err(reported.unwrap_or_else(|| {
                    io::Error::new(
                        io::ErrorKind::ConnectionReset,
                        "the event loop reported the socket failed",
                    )
                })))
            }
            Err(err) if err.kind() == io::ErrorKind::WouldBlock => {
                match read {
                    true => {
                        let mut wakers = lock(&self.io.wakers);
                        wakers.readable = false;
                        wakers.read = Some(cx.waker().clone());
                    }
                    false => self.watch_write(cx),
                }
                Poll::Pending
            }
            Err(err) if err.kind() == io::ErrorKind::Interrupted => {
                cx.waker().wake_by_ref();
                Poll::Pending
            }
            other => Poll::Ready(other),
        }
    }
}

impl tokio::io::AsyncRead for LoopSocket {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        {
            let mut wakers = lock(&this.io.wakers);
            if !wakers.readable && !wakers.failed {
                wakers.read = Some(cx.waker().clone());
                return Poll::Pending;
            }
        }
        let wanted = buf.remaining();
        // Into the buffer's spare room as it is: zeroing it first (`initialize_unfilled`)
        // cost more than the rest of the read (its room is kilobytes, a reply a few bytes).
        // SAFETY: `recv` only writes into the room, never de-initializes any of it.
        let read = SockRef::from(&this.stream).recv(unsafe { buf.unfilled_mut() });
        if matches!(read, Ok(n) if n > 0 && n < wanted) {
            // The kernel had less than asked for: nothing is left, until libuv says so.
            lock(&this.io.wakers).readable = false;
        }
        this.would_block(read, cx, true).map_ok(|n| {
            // SAFETY: `recv` wrote the first `n` bytes of the room.
            unsafe { buf.assume_init(n) };
            buf.advance(n);
        })
    }
}

impl tokio::io::AsyncWrite for LoopSocket {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bytes: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let written = (&this.stream).write(bytes);
        this.would_block(written, cx, false)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let written = (&this.stream).write_vectored(bufs);
        this.would_block(written, cx, false)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(self.stream.shutdown(std::net::Shutdown::Write))
    }
}

impl Drop for LoopSocket {
    fn drop(&mut self) {
        // Stopped and closed before the socket itself closes (after this body); sockets are
        // dropped on their loop's thread (their driver runs there), and teardown drops them
        // before the loop goes.
        if let Some(poll) = lock(&self.io.poll).take() {
            poll.close();
        }
    }
}
