//! Reads and writes on a stream, bounded in time, and how their failures
//! become `ringcc_comm::Error`s naming the peer.

use std::io::{self, ErrorKind, IoSlice, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use rustix::io::Errno;
use rustix::net::{RecvFlags, SendAncillaryBuffer, SendFlags};

use ringcc_comm::Error;
use ringcc_core::{ChannelId, Rank};

use super::NAME;

/// How long a dropped end tries to send its goodbye (drop never blocks
/// long).
pub(super) const GOODBYE_TIMEOUT: Duration = Duration::from_millis(100);

/// Why a read of a whole buffer ([`fill_by`], or a frame in the ends)
/// stopped short.
#[derive(Debug)]
pub(super) enum ReadFail {
    /// The peer closed the connection after `got` bytes of the buffer.
    Eof {
        /// Bytes read before the end.
        got: usize,
    },
    /// The deadline passed ([`fill_by`]).
    TimedOut,
    /// Any other failure of `read`.
    Io(io::Error),
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)
}

/// Reads exactly `buf.len()` bytes before `deadline` (a peer that trickles
/// bytes cannot stretch it).
pub(super) fn fill_by(s: &TcpStream, buf: &mut [u8], deadline: Instant) -> Result<(), ReadFail> {
    let mut got = 0;
    while let Some(rest) = buf.get_mut(got..).filter(|r| !r.is_empty()) {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ReadFail::TimedOut);
        }
        s.set_read_timeout(Some(left)).map_err(ReadFail::Io)?;
        match (&mut &*s).read(rest) {
            Ok(0) => return Err(ReadFail::Eof { got }),
            Ok(n) => got += n,
            Err(e) if e.kind() == ErrorKind::Interrupted || is_timeout(&e) => {}
            Err(e) => return Err(ReadFail::Io(e)),
        }
    }
    Ok(())
}

/// The other end of one connection, for errors.
#[derive(Clone, Copy, Debug)]
pub(super) struct Peer {
    /// The rank at the other end.
    pub rank: Rank,
    /// The connection's channel.
    pub channel: ChannelId,
}

impl Peer {
    /// [`Error::Protocol`] from this peer.
    pub fn protocol(&self, reason: impl Into<String>) -> Error {
        Error::Protocol {
            transport: NAME,
            peer: self.rank,
            channel: self.channel,
            reason: reason.into(),
        }
    }

    /// [`Error::PeerGone`] for this peer.
    pub fn gone(&self, reason: impl Into<String>) -> Error {
        Error::PeerGone {
            transport: NAME,
            peer: self.rank,
            channel: self.channel,
            reason: reason.into(),
        }
    }

    /// A failed read of `what` (`len` bytes) as an error.
    pub fn read_error(&self, f: ReadFail, what: &str, len: usize) -> Error {
        match f {
            ReadFail::Eof { got: 0 } if what == "frame header" => {
                self.gone("the connection was closed")
            }
            ReadFail::Eof { got } => self.gone(format!(
                "the connection was closed mid-frame ({got} of {len} bytes of a {what})"
            )),
            ReadFail::TimedOut => self.gone(format!("no {what} in time")),
            ReadFail::Io(e) => self.io(e, "read", Duration::ZERO),
        }
    }

    /// A failed `call` (`write`, `read`) on this peer's stream: a write
    /// timeout is [`Error::Timeout`], a reset or broken pipe
    /// [`Error::PeerGone`], anything else [`Error::Transport`].
    pub fn io(&self, e: io::Error, call: &'static str, after: Duration) -> Error {
        match e.kind() {
            ErrorKind::WouldBlock | ErrorKind::TimedOut => Error::Timeout {
                waiting_for: format!(
                    "{NAME}: rank {} on channel {} to take our frames",
                    self.rank, self.channel
                ),
                after,
            },
            ErrorKind::BrokenPipe
            | ErrorKind::ConnectionReset
            | ErrorKind::ConnectionAborted
            | ErrorKind::NotConnected
            | ErrorKind::UnexpectedEof => self.gone(format!("{call}: {e}")),
            _ => transport_error(call, e),
        }
    }
}

/// [`Error::Transport`] for a failed system call.
pub(super) fn transport_error(call: &'static str, e: io::Error) -> Error {
    Error::Transport {
        transport: NAME,
        call,
        source: Box::new(e),
    }
}

/// Writes all of `bytes`; the stream's write timeout bounds each wait.
pub(super) fn send(mut s: &TcpStream, bytes: &[u8]) -> io::Result<()> {
    s.write_all(bytes)
}

/// Reads what `s` holds now into `buf` (not empty), without blocking:
/// `Ok(None)` when nothing is there, `Ok(Some(0))` at the end of the
/// stream.
pub(super) fn recv_now(s: &TcpStream, buf: &mut [u8]) -> io::Result<Option<usize>> {
    loop {
        return match rustix::net::recv(s, &mut *buf, RecvFlags::DONTWAIT) {
            Ok((n, _)) => Ok(Some(n)),
            Err(Errno::AGAIN) => Ok(None),
            Err(Errno::INTR) => continue,
            Err(e) => Err(e.into()),
        };
    }
}

/// Writes what `s` takes now of `iov`, without blocking: the bytes
/// taken, 0 when it has no room.
pub(super) fn send_now(s: &TcpStream, iov: &[IoSlice<'_>]) -> io::Result<usize> {
    loop {
        let flags = SendFlags::DONTWAIT | SendFlags::NOSIGNAL;
        return match rustix::net::sendmsg(s, iov, &mut SendAncillaryBuffer::default(), flags) {
            Ok(n) => Ok(n),
            Err(Errno::AGAIN) => Ok(0),
            Err(Errno::INTR) => continue,
            Err(e) => Err(e.into()),
        };
    }
}
