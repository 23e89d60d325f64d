//! A rank's connection to the store: hello, all-gather rounds, and, once
//! the communicator is up, a watcher thread that turns the store's abort
//! notices (or its disappearance) into this rank's abort flag.

use std::net::{TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ringcc_core::Rank;
use serde_json::Value;
use tracing::{debug, warn};

use super::proto::{send, ClientMsg, LineReader, RecvError, ServerMsg, VERSION};
use crate::error::{Error, Result};

/// Pause between connection attempts while rank 0's store is not up yet.
const RETRY_EVERY: Duration = Duration::from_millis(100);

/// One connection attempt's limit.
const CONNECT_ATTEMPT: Duration = Duration::from_secs(2);

/// The job-wide abort flag of one rank, set by a local failure, by
/// [`AbortHandle::abort`](crate::AbortHandle::abort) or by the store's
/// notice; read by the progress loop at every turn.
#[derive(Debug, Default)]
pub struct AbortState {
    flag: AtomicBool,
    reason: Mutex<Option<(Option<u32>, String)>>,
}

impl AbortState {
    /// Whether the job is aborted.
    pub fn is_set(&self) -> bool {
        self.flag.load(Ordering::Acquire)
    }

    /// Records the first abort (later ones are ignored). Returns whether
    /// this call set it.
    pub fn set(&self, rank: Option<u32>, reason: String) -> bool {
        let mut r = self.reason.lock().unwrap_or_else(|p| p.into_inner());
        if r.is_some() {
            return false;
        }
        *r = Some((rank, reason));
        self.flag.store(true, Ordering::Release);
        true
    }

    /// The abort as an error, if set.
    pub fn error(&self) -> Option<Error> {
        if !self.is_set() {
            return None;
        }
        let r = self.reason.lock().unwrap_or_else(|p| p.into_inner());
        let (rank, reason) = r.clone().unwrap_or((None, "aborted".into()));
        Some(Error::Aborted {
            rank: rank.map(Rank),
            reason,
        })
    }
}

/// A connected, accepted rank.
pub struct StoreClient {
    addr: String,
    rank: u32,
    reader: LineReader,
    writer: TcpStream,
}

impl StoreClient {
    /// Connects to `addr`, retrying until `deadline` while the store is not
    /// up, and presents the hello.
    pub fn connect(
        addr: &str,
        token: &str,
        rank: u32,
        world_size: u32,
        timeout: Duration,
    ) -> Result<StoreClient> {
        let deadline = Instant::now() + timeout;
        let stream = connect_retrying(addr, deadline)?;
        let _ = stream.set_nodelay(true);
        let io_err = |call: &'static str| {
            let addr = addr.to_owned();
            move |source| Error::Rendezvous { call, addr, source }
        };
        stream
            .set_write_timeout(Some(Duration::from_secs(5)))
            .map_err(io_err("set_write_timeout"))?;
        let mut writer = stream.try_clone().map_err(io_err("try_clone"))?;
        let mut reader = LineReader::new(stream);
        let hello = ClientMsg::Hello {
            version: VERSION,
            token: token.to_owned(),
            rank,
            world_size,
        };
        send(&mut writer, &hello).map_err(io_err("write"))?;
        match reader.recv::<ServerMsg>(Some(deadline)) {
            Ok(ServerMsg::Welcome) => {}
            Ok(ServerMsg::Reject { reason }) => return Err(Error::Rejected { reason }),
            Ok(other) => {
                return Err(Error::RendezvousProtocol(format!(
                    "expected welcome, got {other:?}"
                )))
            }
            Err(e) => return Err(recv_error(addr, "the store's welcome", timeout, e)),
        }
        debug!(rank, addr, "rendezvous: joined");
        Ok(StoreClient {
            addr: addr.to_owned(),
            rank,
            reader,
            writer,
        })
    }

    /// Contributes `data` to round `round`; returns every rank's
    /// contribution, index = rank.
    pub fn all_gather(&mut self, round: u32, data: Value, timeout: Duration) -> Result<Vec<Value>> {
        let deadline = Instant::now() + timeout;
        send(&mut self.writer, &ClientMsg::Gather { round, data }).map_err(|source| {
            Error::Rendezvous {
                call: "write",
                addr: self.addr.clone(),
                source,
            }
        })?;
        match self.reader.recv::<ServerMsg>(Some(deadline)) {
            Ok(ServerMsg::Gathered { round: r, data }) if r == round => Ok(data),
            Ok(ServerMsg::Abort { rank, reason }) => Err(Error::Aborted {
                rank: Some(Rank(rank)),
                reason,
            }),
            Ok(ServerMsg::Closing) => Err(Error::Aborted {
                rank: Some(Rank(0)),
                reason: "rank 0 closed the store during setup".into(),
            }),
            Ok(other) => Err(Error::RendezvousProtocol(format!(
                "expected round {round}, got {other:?}"
            ))),
            Err(e) => Err(recv_error(
                &self.addr,
                "the other ranks (rendezvous all-gather)",
                timeout,
                e,
            )),
        }
    }

    /// Tells the store this rank failed (best effort, never blocks long).
    pub fn send_abort(&mut self, reason: &str) {
        let _ = send(
            &mut self.writer,
            &ClientMsg::Abort {
                reason: reason.to_owned(),
            },
        );
    }

    /// Hands the connection to a watcher thread that sets `state` when the
    /// store reports an abort or disappears.
    pub fn into_watcher(self, state: Arc<AbortState>) -> Result<Watcher> {
        let leaving = Arc::new(AtomicBool::new(false));
        let StoreClient {
            addr,
            rank,
            mut reader,
            writer,
        } = self;
        let thread = {
            let (state, leaving) = (Arc::clone(&state), Arc::clone(&leaving));
            std::thread::Builder::new()
                .name("ringcc-watch".into())
                .spawn(move || watch(&mut reader, &state, &leaving, rank))
                .map_err(|source| Error::Rendezvous {
                    call: "spawn",
                    addr: addr.clone(),
                    source,
                })?
        };
        Ok(Watcher {
            writer: Mutex::new(writer),
            leaving,
            thread: Some(thread),
        })
    }
}

fn recv_error(addr: &str, what: &str, after: Duration, e: RecvError) -> Error {
    match e {
        RecvError::TimedOut => Error::Timeout {
            waiting_for: format!("{what} via {addr}"),
            after,
        },
        RecvError::Closed => Error::Aborted {
            rank: Some(Rank(0)),
            reason: format!("the store at {addr} closed the connection"),
        },
        RecvError::Garbage(g) => Error::RendezvousProtocol(g),
        RecvError::Io(source) => Error::Rendezvous {
            call: "read",
            addr: addr.to_owned(),
            source,
        },
    }
}

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
            return Err(Error::Rendezvous {
                call: "connect",
                addr: addr.to_owned(),
                source: last.unwrap_or_else(|| std::io::Error::other("no address")),
            });
        }
        std::thread::sleep(RETRY_EVERY);
    }
}

fn watch(reader: &mut LineReader, state: &AbortState, leaving: &AtomicBool, rank: u32) {
    loop {
        match reader.recv::<ServerMsg>(None) {
            Ok(ServerMsg::Abort { rank: r, reason }) => {
                if state.set(Some(r), reason.clone()) {
                    warn!(rank, "abort notice from the store: rank {r}: {reason}");
                }
            }
            Ok(ServerMsg::Closing) => {
                debug!(rank, "rendezvous: the store closed cleanly");
                return;
            }
            Ok(other) => debug!(rank, "rendezvous: ignoring {other:?}"),
            Err(e) => {
                if !leaving.load(Ordering::Acquire) {
                    state.set(
                        Some(0),
                        format!("lost the connection to rank 0's store ({e})"),
                    );
                }
                return;
            }
        }
    }
}

/// The store connection after setup: abort notices in, this rank's abort
/// out.
pub struct Watcher {
    writer: Mutex<TcpStream>,
    leaving: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Watcher {
    /// Tells the store this rank failed (best effort; the socket's write
    /// timeout bounds it).
    pub fn send_abort(&self, reason: &str) {
        let mut w = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        let _ = send(
            &mut *w,
            &ClientMsg::Abort {
                reason: reason.to_owned(),
            },
        );
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.leaving.store(true, Ordering::Release);
        {
            let mut w = self.writer.lock().unwrap_or_else(|p| p.into_inner());
            let _ = send(&mut *w, &ClientMsg::Bye);
            let _ = w.shutdown(std::net::Shutdown::Both);
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
