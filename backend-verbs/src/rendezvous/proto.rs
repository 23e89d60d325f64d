//! The store's messages: one JSON object per line, bounded in length.

use std::io::{self, BufRead, Write};
use std::net::TcpStream;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Protocol version; a client of another version is rejected.
pub const VERSION: u32 = 1;

/// Longest line accepted (an all-gather of every rank's connection info
/// for 1024 ranks × 64 channels stays well below).
pub const MAX_LINE: usize = 64 << 20;

/// Client → server.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum ClientMsg {
    /// The first message of every connection.
    Hello {
        /// [`VERSION`].
        version: u32,
        /// The job token.
        token: String,
        /// The sender's rank.
        rank: u32,
        /// The sender's world size.
        world_size: u32,
    },
    /// This rank's contribution to all-gather round `round`.
    Gather {
        /// Round number (0, 1, …, the same sequence on every rank).
        round: u32,
        /// The contribution.
        data: Value,
    },
    /// This rank failed; tell everyone.
    Abort {
        /// Why.
        reason: String,
    },
    /// This rank is leaving cleanly; its disconnection is not an abort.
    Bye,
}

/// Server → client.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum ServerMsg {
    /// The hello was accepted.
    Welcome,
    /// The hello was refused; the server closes the connection.
    Reject {
        /// Why.
        reason: String,
    },
    /// Every rank's contribution to a round, by rank.
    Gathered {
        /// Round number.
        round: u32,
        /// Contributions, index = rank.
        data: Vec<Value>,
    },
    /// A rank failed or vanished: every rank must stop.
    Abort {
        /// The rank.
        rank: u32,
        /// Why.
        reason: String,
    },
    /// Rank 0 is shutting the store down cleanly.
    Closing,
}

/// Writes one message as a line.
pub fn send<M: Serialize>(w: &mut impl Write, msg: &M) -> io::Result<()> {
    let mut line = serde_json::to_vec(msg).map_err(io::Error::other)?;
    line.push(b'\n');
    w.write_all(&line)?;
    w.flush()
}

/// Why a message could not be read.
#[derive(Debug)]
pub enum RecvError {
    /// The peer closed the connection (cleanly, between messages).
    Closed,
    /// The deadline passed.
    TimedOut,
    /// The line is longer than [`MAX_LINE`] or not a message.
    Garbage(String),
    /// The socket failed.
    Io(io::Error),
}

impl std::fmt::Display for RecvError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RecvError::Closed => f.write_str("connection closed"),
            RecvError::TimedOut => f.write_str("timed out"),
            RecvError::Garbage(why) => write!(f, "not a rendezvous message: {why}"),
            RecvError::Io(e) => write!(f, "{e}"),
        }
    }
}

/// A line reader over a socket that keeps partial lines across timeouts.
pub struct LineReader {
    reader: io::BufReader<TcpStream>,
    line: Vec<u8>,
}

impl LineReader {
    /// Reads from `stream`.
    pub fn new(stream: TcpStream) -> LineReader {
        LineReader {
            reader: io::BufReader::new(stream),
            line: Vec::new(),
        }
    }

    /// The next message, waiting until `deadline` (`None`: forever).
    pub fn recv<M: for<'de> Deserialize<'de>>(
        &mut self,
        deadline: Option<Instant>,
    ) -> Result<M, RecvError> {
        loop {
            let timeout = match deadline {
                None => None,
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(RecvError::TimedOut);
                    }
                    Some(left)
                }
            };
            self.reader
                .get_ref()
                .set_read_timeout(timeout)
                .map_err(RecvError::Io)?;
            let room = MAX_LINE.saturating_add(1).saturating_sub(self.line.len());
            let r = io::Read::take(&mut self.reader, room as u64).read_until(b'\n', &mut self.line);
            match r {
                Ok(0) if self.line.is_empty() => return Err(RecvError::Closed),
                Ok(0) => return Err(RecvError::Garbage("connection closed mid-line".into())),
                Ok(_) if self.line.last() == Some(&b'\n') => {
                    let line = std::mem::take(&mut self.line);
                    return serde_json::from_slice(&line)
                        .map_err(|e| RecvError::Garbage(e.to_string()));
                }
                Ok(_) if self.line.len() > MAX_LINE => {
                    return Err(RecvError::Garbage(format!(
                        "line longer than {MAX_LINE} bytes"
                    )))
                }
                Ok(_) => continue,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        return Err(RecvError::TimedOut);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(RecvError::Io(e)),
            }
        }
    }
}
