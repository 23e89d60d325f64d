//! A rank's connection to the TCP store.

use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ringcc_core::Rank;
use tracing::debug;

use super::proto::{send, Hex, LineReader, RecvError, Reply, Request, MAX_LINE, VERSION};
use crate::error::{BoxError, Error, Result};
use crate::store::{get_timeout, Store};

/// Pause between connection attempts while the store is not up yet.
const RETRY_EVERY: Duration = Duration::from_millis(50);

/// One connection attempt's limit.
const CONNECT_ATTEMPT: Duration = Duration::from_secs(2);

/// How long a write to the store may block.
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a reply may take beyond the request's own wait.
const REPLY_GRACE: Duration = Duration::from_secs(10);

/// The least time left for the welcome after a late connect.
const MIN_WELCOME_WAIT: Duration = Duration::from_secs(1);

struct Conn {
    reader: LineReader,
    writer: TcpStream,
    /// Why the connection takes no more requests (a bye, a lost or
    /// desynchronised connection, the store's close).
    done: Option<String>,
}

/// One connection to a [`TcpStoreServer`](super::TcpStoreServer),
/// accepted as rank `rank` of the job. Requests from several threads take
/// turns on the connection; a thread that needs to wait independently (a
/// watcher) takes its own connection with [`try_clone`](TcpStore::try_clone).
/// Dropping it says bye (a clean leave, not an abort).
pub struct TcpStore {
    addr: String,
    token: String,
    rank: Rank,
    world_size: u32,
    timeout: Duration,
    conn: Mutex<Conn>,
    server_closed: AtomicBool,
}

impl std::fmt::Debug for TcpStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpStore")
            .field("addr", &self.addr)
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .finish_non_exhaustive()
    }
}

fn store_error(call: &'static str, key: &str, source: impl Into<BoxError>) -> Error {
    Error::Store {
        call,
        key: key.to_owned(),
        source: source.into(),
    }
}

impl TcpStore {
    /// Connects to the store at `addr` (`host:port`), retrying until
    /// `timeout` while it is not up yet, and presents the hello. A
    /// refusal is [`Error::Stranger`] with the store's reason; no store
    /// within the timeout is [`Error::Store`] (`connect`).
    pub fn connect(
        addr: &str,
        token: &str,
        rank: Rank,
        world_size: u32,
        timeout: Duration,
    ) -> Result<TcpStore> {
        let deadline = after(timeout);
        let stream = connect_retrying(addr, deadline)?;
        let _ = stream.set_nodelay(true);
        let io = |call| move |e: std::io::Error| store_error(call, addr, e);
        stream
            .set_write_timeout(Some(WRITE_TIMEOUT))
            .map_err(io("set_write_timeout"))?;
        let mut writer = stream.try_clone().map_err(io("try_clone"))?;
        let mut reader = LineReader::new(stream, MAX_LINE);
        let hello = Request::Hello {
            version: VERSION,
            token: token.to_owned(),
            rank: rank.0,
            world_size,
        };
        send(&mut writer, &hello).map_err(io("hello"))?;
        let wait = deadline.max(Instant::now() + MIN_WELCOME_WAIT);
        match reader.recv::<Reply>(Some(wait)) {
            Ok(Reply::Welcome) => {}
            Ok(Reply::Reject { reason }) => {
                return Err(Error::Stranger {
                    at: addr.to_owned(),
                    reason,
                })
            }
            Ok(Reply::Closing) => return Err(store_error("hello", addr, "the store is closing")),
            Ok(other) => {
                return Err(store_error(
                    "hello",
                    addr,
                    format!("expected a welcome, got {other:?}"),
                ))
            }
            Err(RecvError::TimedOut) => {
                return Err(Error::Timeout {
                    waiting_for: format!("the store's welcome from {addr}"),
                    after: timeout,
                })
            }
            Err(e) => return Err(store_error("hello", addr, e.to_string())),
        }
        debug!(rank = rank.0, addr, "rendezvous: joined the store");
        Ok(TcpStore {
            addr: addr.to_owned(),
            token: token.to_owned(),
            rank,
            world_size,
            timeout,
            conn: Mutex::new(Conn {
                reader,
                writer,
                done: None,
            }),
            server_closed: AtomicBool::new(false),
        })
    }

    /// A second connection to the same store as the same rank (for a
    /// thread that waits on its own, such as an abort watcher), with the
    /// same connect timeout.
    pub fn try_clone(&self) -> Result<TcpStore> {
        TcpStore::connect(
            &self.addr,
            &self.token,
            self.rank,
            self.world_size,
            self.timeout,
        )
    }

    /// The rank this connection presented.
    pub fn rank(&self) -> Rank {
        self.rank
    }

    /// The store's address, as given to [`connect`](TcpStore::connect).
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Whether the server said it closes cleanly (its owner left): the
    /// connection's errors since then are not a crash.
    pub fn server_closed(&self) -> bool {
        self.server_closed.load(Ordering::Acquire)
    }

    /// Says bye: this connection leaves cleanly, and its close is no
    /// abort. It takes no more requests afterwards. Done by `Drop` too
    /// (best effort).
    pub fn bye(&self) -> Result<()> {
        let mut c = self.lock();
        if c.done.is_some() {
            return Ok(());
        }
        c.done = Some("this rank said bye".into());
        let r = send(&mut c.writer, &Request::Bye);
        let _ = c.writer.shutdown(Shutdown::Write);
        r.map_err(|e| store_error("bye", &self.addr, e))
    }

    fn lock(&self) -> MutexGuard<'_, Conn> {
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sends `req` and reads its reply, waiting up to `wait` for it.
    fn request(
        &self,
        call: &'static str,
        key: &str,
        req: &Request,
        wait: Duration,
    ) -> Result<Reply> {
        let mut c = self.lock();
        if let Some(why) = &c.done {
            return Err(store_error(
                call,
                key,
                format!("the connection to {} is closed: {why}", self.addr),
            ));
        }
        if let Err(e) = send(&mut c.writer, req) {
            c.done = Some(format!("write failed: {e}"));
            return Err(store_error(call, key, e));
        }
        let r = c.reader.recv::<Reply>(Some(after(wait)));
        match r {
            Ok(Reply::Closing) => {
                self.server_closed.store(true, Ordering::Release);
                let why = format!("the store at {} closed (its owner left)", self.addr);
                c.done = Some(why.clone());
                Err(store_error(call, key, why))
            }
            Ok(reply) => Ok(reply),
            Err(e) => {
                c.done = Some(e.to_string());
                Err(match e {
                    RecvError::TimedOut => Error::Timeout {
                        waiting_for: format!(
                            "the store's reply to {call} {key:?} from {}",
                            self.addr
                        ),
                        after: wait,
                    },
                    RecvError::Closed => store_error(
                        call,
                        key,
                        format!("the store at {} closed the connection", self.addr),
                    ),
                    RecvError::Io(e) => store_error(call, key, e),
                    RecvError::Garbage(g) => store_error(call, key, g),
                })
            }
        }
    }

    /// A reply that does not answer the request: the connection is out of
    /// step and takes no more requests.
    fn unexpected(&self, call: &'static str, key: &str, reply: &Reply) -> Error {
        self.lock().done = Some(format!("unexpected reply {reply:?}"));
        store_error(call, key, format!("unexpected reply {reply:?}"))
    }
}

impl Store for TcpStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        let req = Request::Set {
            key: key.to_owned(),
            value: Hex(value.to_vec()),
        };
        match self.request("set", key, &req, REPLY_GRACE)? {
            Reply::Done => Ok(()),
            Reply::Failed { reason } => Err(store_error("set", key, reason)),
            other => Err(self.unexpected("set", key, &other)),
        }
    }

    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        let req = Request::Get {
            key: key.to_owned(),
            timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
        };
        match self.request("get", key, &req, timeout.saturating_add(REPLY_GRACE))? {
            Reply::Value { value } => Ok(value.0),
            Reply::TimedOut { .. } => Err(get_timeout(key, timeout)),
            Reply::Failed { reason } => Err(store_error("get", key, reason)),
            other => Err(self.unexpected("get", key, &other)),
        }
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        let req = Request::Add {
            key: key.to_owned(),
            delta,
        };
        match self.request("add", key, &req, REPLY_GRACE)? {
            Reply::Counter { value } => Ok(value),
            Reply::Failed { reason } => Err(store_error("add", key, reason)),
            other => Err(self.unexpected("add", key, &other)),
        }
    }

    fn check(&self, key: &str) -> Result<bool> {
        let req = Request::Check {
            key: key.to_owned(),
        };
        match self.request("check", key, &req, REPLY_GRACE)? {
            Reply::Exists { exists } => Ok(exists),
            Reply::Failed { reason } => Err(store_error("check", key, reason)),
            other => Err(self.unexpected("check", key, &other)),
        }
    }
}

impl Drop for TcpStore {
    fn drop(&mut self) {
        let _ = self.bye();
    }
}

/// The instant `d` from now (a year from now when `d` is beyond what a
/// clock can add).
fn after(d: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(d)
        .or_else(|| now.checked_add(Duration::from_secs(365 * 24 * 3600)))
        .unwrap_or(now)
}

/// Connects to `addr`, retrying until `deadline` while nobody listens.
fn connect_retrying(addr: &str, deadline: Instant) -> Result<TcpStream> {
    let mut last: Option<std::io::Error> = None;
    loop {
        match addr.to_socket_addrs() {
            Ok(addrs) => {
                for a in addrs {
                    let left = deadline.saturating_duration_since(Instant::now());
                    let limit = left.min(CONNECT_ATTEMPT).max(Duration::from_millis(10));
                    match TcpStream::connect_timeout(&a, limit) {
                        Ok(s) => return Ok(s),
                        Err(e) => last = Some(e),
                    }
                }
            }
            Err(e) => last = Some(e),
        }
        if Instant::now() + RETRY_EVERY >= deadline {
            return Err(store_error(
                "connect",
                addr,
                last.unwrap_or_else(|| std::io::Error::other("the address resolves to nothing")),
            ));
        }
        std::thread::sleep(RETRY_EVERY);
    }
}
