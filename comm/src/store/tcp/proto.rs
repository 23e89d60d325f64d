//! The TCP store's messages: one JSON object per line, bounded in length;
//! values travel as hex strings (any bytes, total to decode).

use std::io::{self, BufRead, Write};
use std::net::TcpStream;
use std::time::Instant;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Protocol version; a client of another version is refused (version 1
/// was ringcc-verbs' own rendezvous).
pub const VERSION: u32 = 2;

/// The longest line accepted from a client that said hello, and from the
/// server (a value of up to 32 MiB, hex-encoded).
pub const MAX_LINE: usize = 64 << 20;

/// The longest line accepted before the hello.
pub const MAX_HELLO_LINE: usize = 4096;

/// Client → server.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub(crate) enum Request {
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
    /// Sets a key.
    Set { key: String, value: Hex },
    /// The value of a key, waiting up to `timeout_ms` for it.
    Get { key: String, timeout_ms: u64 },
    /// Adds to a counter.
    Add { key: String, delta: i64 },
    /// Whether a key is set.
    Check { key: String },
    /// This connection is leaving cleanly: its close is not an abort.
    Bye,
}

/// Server → client.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub(crate) enum Reply {
    /// The hello was accepted.
    Welcome,
    /// The hello was refused; the server closes the connection.
    Reject { reason: String },
    /// A set was done.
    Done,
    /// A get's value.
    Value { value: Hex },
    /// An add's new value.
    Counter { value: i64 },
    /// A check's answer.
    Exists { exists: bool },
    /// A get's key was not set within its timeout.
    TimedOut { key: String },
    /// The request failed (an add on a value that is not a counter).
    Failed { reason: String },
    /// The store is shutting down cleanly: the last line of a connection.
    Closing,
}

/// Bytes as a lowercase hex string on the wire.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Hex(pub Vec<u8>);

impl std::fmt::Debug for Hex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} bytes", self.0.len())
    }
}

const DIGITS: &[u8; 16] = b"0123456789abcdef";

fn nibble(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

impl Hex {
    fn encode(&self) -> String {
        let mut s = String::with_capacity(self.0.len().saturating_mul(2));
        for &b in &self.0 {
            s.push(char::from(DIGITS[usize::from(b >> 4)]));
            s.push(char::from(DIGITS[usize::from(b & 15)]));
        }
        s
    }

    fn decode(s: &str) -> Option<Hex> {
        let s = s.as_bytes();
        if !s.len().is_multiple_of(2) {
            return None;
        }
        s.chunks_exact(2)
            .map(|p| match p {
                [h, l] => Some((nibble(*h)? << 4) | nibble(*l)?),
                _ => None,
            })
            .collect::<Option<Vec<u8>>>()
            .map(Hex)
    }
}

impl Serialize for Hex {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.encode())
    }
}

impl<'de> Deserialize<'de> for Hex {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Hex, D::Error> {
        let s = String::deserialize(d)?;
        Hex::decode(&s).ok_or_else(|| serde::de::Error::custom("not a hex string"))
    }
}

/// Writes one message as a line.
pub(crate) fn send<M: Serialize>(w: &mut impl Write, msg: &M) -> io::Result<()> {
    let mut line = serde_json::to_vec(msg).map_err(io::Error::other)?;
    line.push(b'\n');
    w.write_all(&line)?;
    w.flush()
}

/// Why a message could not be read.
#[derive(Debug)]
pub(crate) enum RecvError {
    /// The peer closed the connection (cleanly, between messages).
    Closed,
    /// The deadline passed.
    TimedOut,
    /// The line is too long or not a message.
    Garbage(String),
    /// The socket failed.
    Io(io::Error),
}

impl std::fmt::Display for RecvError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RecvError::Closed => f.write_str("connection closed"),
            RecvError::TimedOut => f.write_str("timed out"),
            RecvError::Garbage(why) => write!(f, "not a store message: {why}"),
            RecvError::Io(e) => write!(f, "{e}"),
        }
    }
}

/// A line reader over a socket that keeps partial lines across timeouts.
pub(crate) struct LineReader {
    reader: io::BufReader<TcpStream>,
    line: Vec<u8>,
    max: usize,
}

impl LineReader {
    /// Reads lines of at most `max` bytes from `stream`.
    pub fn new(stream: TcpStream, max: usize) -> LineReader {
        LineReader {
            reader: io::BufReader::new(stream),
            line: Vec::new(),
            max,
        }
    }

    /// Changes the longest line accepted.
    pub fn set_max(&mut self, max: usize) {
        self.max = max;
    }

    /// The socket.
    pub fn get_ref(&self) -> &TcpStream {
        self.reader.get_ref()
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
            let room = self.max.saturating_add(1).saturating_sub(self.line.len());
            let r = io::Read::take(&mut self.reader, room as u64).read_until(b'\n', &mut self.line);
            match r {
                Ok(0) if self.line.is_empty() => return Err(RecvError::Closed),
                Ok(0) if self.line.len() <= self.max => {
                    return Err(RecvError::Garbage("connection closed mid-line".into()))
                }
                Ok(_) if self.line.last() == Some(&b'\n') => {
                    let line = std::mem::take(&mut self.line);
                    return serde_json::from_slice(&line)
                        .map_err(|e| RecvError::Garbage(e.to_string()));
                }
                Ok(_) if self.line.len() > self.max => {
                    return Err(RecvError::Garbage(format!(
                        "line longer than {} bytes",
                        self.max
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips_and_refuses_what_is_not_hex() {
        let all: Vec<u8> = (0..=255).collect();
        let h = Hex(all.clone());
        assert_eq!(Hex::decode(&h.encode()).map(|h| h.0), Some(all));
        assert_eq!(Hex::decode("0aFf").map(|h| h.0), Some(vec![10, 255]));
        assert!(Hex::decode("abc").is_none());
        assert!(Hex::decode("zz").is_none());
        assert!(Hex::decode("é1").is_none());
    }

    #[test]
    fn messages_are_json_lines_with_a_type() {
        let set = Request::Set {
            key: "k".into(),
            value: Hex(b"hi".to_vec()),
        };
        let text = serde_json::to_string(&set).unwrap();
        assert_eq!(text, r#"{"type":"set","key":"k","value":"6869"}"#);
        assert_eq!(serde_json::from_str::<Request>(&text).unwrap(), set);
        assert!(serde_json::from_str::<Request>(r#"{"type":"set","key":"k"}"#).is_err());
        assert!(serde_json::from_str::<Request>(r#"{"type":"nuke"}"#).is_err());
        let r: Reply = serde_json::from_str(r#"{"type":"closing"}"#).unwrap();
        assert_eq!(r, Reply::Closing);
    }
}
