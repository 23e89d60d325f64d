//! Reads and writes on a stream, bounded in time, and how their failures
//! become `ringcc_comm::Error`s naming the peer.

use std::io::{self, ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ringcc_comm::Error;
use ringcc_core::{ChannelId, Rank};

use super::NAME;

/// How often a reader thread blocked in `read` looks at its stop flag.
pub(super) const READ_TICK: Duration = Duration::from_millis(200);

/// How long a dropped end tries to send its goodbye (drop never blocks
/// long).
pub(super) const GOODBYE_TIMEOUT: Duration = Duration::from_millis(100);

/// Why a [`fill`] stopped short.
#[derive(Debug)]
pub(super) enum ReadFail {
    /// The peer closed the connection after `got` bytes of the buffer.
    Eof {
        /// Bytes read before the end.
        got: usize,
    },
    /// The stop flag was raised.
    Stopped,
    /// The deadline passed ([`fill_by`]).
    TimedOut,
    /// Any other failure of `read`.
    Io(io::Error),
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)
}

/// Reads exactly `buf.len()` bytes. The stream's read timeout (set to
/// [`READ_TICK`] by the caller) only makes it look at `stop`.
pub(super) fn fill(mut r: impl Read, buf: &mut [u8], stop: &AtomicBool) -> Result<(), ReadFail> {
    let mut got = 0;
    while let Some(rest) = buf.get_mut(got..).filter(|r| !r.is_empty()) {
        if stop.load(Ordering::Acquire) {
            return Err(ReadFail::Stopped);
        }
        match r.read(rest) {
            Ok(0) => return Err(ReadFail::Eof { got }),
            Ok(n) => got += n,
            Err(e) if e.kind() == ErrorKind::Interrupted || is_timeout(&e) => {}
            Err(e) => return Err(ReadFail::Io(e)),
        }
    }
    Ok(())
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

    /// A failed read of `what` (`len` bytes) as an error, or `None` when
    /// the reader was stopped.
    pub fn read_error(&self, f: ReadFail, what: &str, len: usize) -> Option<Error> {
        match f {
            ReadFail::Stopped => None,
            ReadFail::Eof { got: 0 } if what == "frame header" => {
                Some(self.gone("the connection was closed"))
            }
            ReadFail::Eof { got } => Some(self.gone(format!(
                "the connection was closed mid-frame ({got} of {len} bytes of a {what})"
            ))),
            ReadFail::TimedOut => Some(self.gone(format!("no {what} in time"))),
            ReadFail::Io(e) => Some(self.io(e, "read", Duration::ZERO)),
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
