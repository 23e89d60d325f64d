//! Rank 0's store server: the map, the hello check, the waits of `get`,
//! and a vanished rank turned into the job's abort notice.
//!
//! One thread accepts; one thread per connection reads its requests and
//! answers them in order. A `get` on a missing key waits in that
//! connection's thread (on the map's condition variable, so other
//! connections are served meanwhile) until some connection sets the key,
//! its timeout passes, or its client goes away.

use std::collections::HashMap;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ringcc_core::Rank;
use tracing::{debug, info, warn};

use super::proto::{send, Hex, LineReader, Reply, Request, MAX_HELLO_LINE, MAX_LINE, VERSION};
use super::HELLO_TIMEOUT;
use crate::error::{Error, Result};
use crate::store::abort::{notice, parse_notice};
use crate::store::{counter_value, ABORT_KEY};

/// How long a write to one client may block.
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);

/// How long the acceptor waits for a connection before it looks for the
/// stop. It wakes at once for a connection (it waits in `poll`, not in a
/// sleep), and at once for the stop too (the server connects to itself);
/// this bounds only a stop whose wake-up connection failed. (A 10 ms
/// sleep between non-blocking accepts woke rank 0's process a hundred
/// times a second for the job's whole life.)
const ACCEPT_EVERY: Duration = Duration::from_millis(200);

/// How often a waiting `get` looks whether its client is still there.
const LIVENESS_EVERY: Duration = Duration::from_millis(100);

/// The longest wait a `get` may ask for.
const MAX_GET_WAIT: Duration = Duration::from_secs(24 * 3600);

/// How long a refused connection is drained before it is closed (so that
/// the refusal is read, not lost to a reset).
const DRAIN_FOR: Duration = Duration::from_millis(200);

/// One connection's write half; `closed` once its last line (`Closing`)
/// went out.
struct Writer {
    stream: TcpStream,
    closed: bool,
}

impl Writer {
    fn send(&mut self, reply: &Reply) -> std::io::Result<()> {
        if self.closed {
            return Err(std::io::Error::other("the connection is closed"));
        }
        send(&mut self.stream, reply)
    }

    /// Says `Closing` (once) and shuts the connection down.
    fn close(&mut self) {
        if !self.closed {
            let _ = send(&mut self.stream, &Reply::Closing);
            self.closed = true;
        }
        let _ = self.stream.shutdown(Shutdown::Both);
    }
}

#[derive(Default)]
struct Conns {
    next: u64,
    live: HashMap<u64, Arc<Mutex<Writer>>>,
    threads: Vec<JoinHandle<()>>,
}

struct Shared {
    token: String,
    world_size: u32,
    hello_timeout: Duration,
    map: Mutex<HashMap<String, Vec<u8>>>,
    changed: Condvar,
    closing: AtomicBool,
    conns: Mutex<Conns>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A thread that panicked holding the lock leaves the data as
    // consistent as any other moment; keep serving.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    fn closing(&self) -> bool {
        self.closing.load(Ordering::Acquire)
    }
}

/// The store served to a job's ranks over TCP (by rank 0). Dropping it
/// tells every connection that the store closes cleanly (so that no rank
/// takes it for a crash), closes them and joins every thread.
pub struct TcpStoreServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for TcpStoreServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpStoreServer")
            .field("addr", &self.addr)
            .field("world_size", &self.shared.world_size)
            .finish_non_exhaustive()
    }
}

impl TcpStoreServer {
    /// Binds `bind` (port 0 picks one) and serves the `world_size` ranks
    /// of the job whose token is `token`.
    pub fn start(bind: SocketAddr, token: &str, world_size: u32) -> Result<TcpStoreServer> {
        TcpStoreServer::start_with_hello_timeout(bind, token, world_size, HELLO_TIMEOUT)
    }

    /// [`start`](TcpStoreServer::start) with another time a newcomer has
    /// to say hello than [`HELLO_TIMEOUT`].
    pub fn start_with_hello_timeout(
        bind: SocketAddr,
        token: &str,
        world_size: u32,
        hello_timeout: Duration,
    ) -> Result<TcpStoreServer> {
        if world_size == 0 {
            return Err(Error::BadConfig("a store for a world of 0 ranks".into()));
        }
        let io = |call: &'static str| {
            move |source: std::io::Error| Error::Store {
                call,
                key: bind.to_string(),
                source: source.into(),
            }
        };
        let listener = TcpListener::bind(bind).map_err(io("bind"))?;
        let addr = listener.local_addr().map_err(io("local_addr"))?;
        listener
            .set_nonblocking(true)
            .map_err(io("set_nonblocking"))?;
        let shared = Arc::new(Shared {
            token: token.to_owned(),
            world_size,
            hello_timeout: hello_timeout.min(MAX_GET_WAIT),
            map: Mutex::new(HashMap::new()),
            changed: Condvar::new(),
            closing: AtomicBool::new(false),
            conns: Mutex::new(Conns::default()),
        });
        let acceptor = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("ringcc-store".into())
                .spawn(move || accept_loop(&listener, &shared))
                .map_err(|source| Error::Io {
                    call: "spawn (store acceptor)",
                    source,
                })?
        };
        info!(%addr, world_size, "rendezvous: store serving");
        Ok(TcpStoreServer {
            addr,
            shared,
            acceptor: Some(acceptor),
        })
    }

    /// The address the store listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Where this process reaches its own listener: its address, or
    /// loopback for a listener on every interface.
    fn wake_addr(&self) -> SocketAddr {
        let mut a = self.addr;
        if a.ip().is_unspecified() {
            a.set_ip(match a.ip() {
                std::net::IpAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
                std::net::IpAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
            });
        }
        a
    }
}

impl Drop for TcpStoreServer {
    fn drop(&mut self) {
        self.shared.closing.store(true, Ordering::Release);
        {
            // Wake the waiting gets (under the map's lock, so that none
            // misses it between its check and its wait).
            let _map = lock(&self.shared.map);
            self.shared.changed.notify_all();
        }
        if let Some(t) = self.acceptor.take() {
            // Wake the acceptor from its `poll` (it sees `closing` before
            // it would accept this); should the connection fail, it wakes
            // within `ACCEPT_EVERY` anyway.
            let _ = TcpStream::connect_timeout(&self.wake_addr(), ACCEPT_EVERY);
            let _ = t.join();
        }
        // No connection is added any more: close them all, then join.
        let (writers, threads) = {
            let mut c = lock(&self.shared.conns);
            let w: Vec<_> = c.live.values().cloned().collect();
            (w, std::mem::take(&mut c.threads))
        };
        for w in writers {
            lock(&w).close();
        }
        for t in threads {
            let _ = t.join();
        }
        debug!(addr = %self.addr, "rendezvous: store closed");
    }
}

fn accept_loop(listener: &TcpListener, shared: &Arc<Shared>) {
    while !shared.closing() {
        match listener.accept() {
            Ok((stream, peer)) => admit(stream, peer, shared),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => wait_readable(listener),
            Err(e) => {
                warn!("rendezvous: accept failed: {e}");
                std::thread::sleep(ACCEPT_EVERY);
            }
        }
    }
}

/// Waits until `listener` has a connection to accept, at most
/// [`ACCEPT_EVERY`] (a failed `poll` waits that long too: the caller's
/// `accept` then says what is wrong).
fn wait_readable(listener: &TcpListener) {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    let timeout = Timespec::try_from(ACCEPT_EVERY).ok();
    let mut fds = [PollFd::new(listener, PollFlags::IN)];
    if timeout.is_none() || poll(&mut fds, timeout.as_ref()).is_err() {
        std::thread::sleep(ACCEPT_EVERY);
    }
}

/// Registers a new connection and starts its thread.
fn admit(stream: TcpStream, peer: SocketAddr, shared: &Arc<Shared>) {
    let setup = stream
        .set_nonblocking(false)
        .and_then(|()| stream.set_write_timeout(Some(WRITE_TIMEOUT)))
        .and_then(|()| stream.try_clone());
    let write_half = match setup {
        Ok(w) => w,
        Err(e) => return warn!(%peer, "rendezvous: cannot serve a connection: {e}"),
    };
    let _ = stream.set_nodelay(true);
    let writer = Arc::new(Mutex::new(Writer {
        stream: write_half,
        closed: false,
    }));
    let mut conns = lock(&shared.conns);
    conns.threads.retain(|t| !t.is_finished());
    let limit = (shared.world_size as usize)
        .saturating_mul(4)
        .saturating_add(256);
    if conns.live.len() >= limit {
        drop(conns);
        warn!(%peer, "rendezvous: rejected connection: too many connections");
        let mut w = lock(&writer);
        let _ = w.send(&Reply::Reject {
            reason: "too many connections".into(),
        });
        w.closed = true;
        return;
    }
    let id = conns.next;
    conns.next = conns.next.wrapping_add(1);
    conns.live.insert(id, Arc::clone(&writer));
    let spawned = {
        let shared = Arc::clone(shared);
        std::thread::Builder::new()
            .name("ringcc-store-conn".into())
            .spawn(move || {
                serve(stream, peer, &shared, &writer);
                lock(&shared.conns).live.remove(&id);
            })
    };
    match spawned {
        Ok(t) => conns.threads.push(t),
        Err(e) => {
            if let Some(w) = conns.live.remove(&id) {
                lock(&w).close();
            }
            warn!(%peer, "rendezvous: cannot serve a connection: {e}");
        }
    }
}

/// Refuses a connection with `reason`: logged, told, drained, closed.
fn reject(writer: &Mutex<Writer>, stream: TcpStream, peer: SocketAddr, reason: String) {
    warn!(%peer, "rendezvous: rejected connection: {reason}");
    let mut w = lock(writer);
    let _ = w.send(&Reply::Reject { reason });
    w.closed = true;
    let _ = w.stream.shutdown(Shutdown::Write);
    drop(w);
    // Read what the stranger still sends, briefly, so that closing does
    // not reset the connection before it read the refusal.
    let deadline = Instant::now() + DRAIN_FOR;
    let mut buf = [0u8; 4096];
    let mut s = &stream;
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        if left.is_zero() || s.set_read_timeout(Some(left)).is_err() {
            break;
        }
        match std::io::Read::read(&mut s, &mut buf) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
    }
    let _ = stream.shutdown(Shutdown::Both);
}

/// Checks a hello; the reason it is refused, if it is.
fn check_hello(shared: &Shared, msg: &Request) -> std::result::Result<u32, String> {
    let Request::Hello {
        version,
        token,
        rank,
        world_size,
    } = msg
    else {
        return Err("the first message is not a hello".into());
    };
    if *version != VERSION {
        return Err(format!(
            "protocol version {version}, this store speaks {VERSION}"
        ));
    }
    if !constant_time_eq(token.as_bytes(), shared.token.as_bytes()) {
        return Err(format!("wrong job token (rank {rank} claimed)"));
    }
    if *world_size != shared.world_size {
        return Err(format!(
            "world size {world_size}, the job has {}",
            shared.world_size
        ));
    }
    if *rank >= shared.world_size {
        return Err(format!(
            "rank {rank} out of range for world size {world_size}"
        ));
    }
    Ok(*rank)
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// How a session ended.
enum End {
    /// The client said bye.
    Bye,
    /// The connection closed or failed without a bye.
    Lost(String),
    /// The client broke the protocol.
    Garbage(String),
    /// The store is closing.
    Closing,
}

fn serve(stream: TcpStream, peer: SocketAddr, shared: &Shared, writer: &Mutex<Writer>) {
    let Ok(read_half) = stream.try_clone() else {
        return lock(writer).close();
    };
    let mut reader = LineReader::new(read_half, MAX_HELLO_LINE);
    let hello = match reader.recv::<Request>(Some(Instant::now() + shared.hello_timeout)) {
        Ok(m) => m,
        Err(e) => return reject(writer, stream, peer, format!("bad hello: {e}")),
    };
    let rank = match check_hello(shared, &hello) {
        Ok(r) => r,
        Err(reason) => return reject(writer, stream, peer, reason),
    };
    if shared.closing() || lock(writer).send(&Reply::Welcome).is_err() {
        return lock(writer).close();
    }
    debug!(%peer, rank, "rendezvous: rank joined");
    reader.set_max(MAX_LINE);
    let end = session(&mut reader, shared, writer, rank);
    match end {
        _ if shared.closing() => {}
        End::Bye | End::Closing => {
            debug!(%peer, rank, "rendezvous: rank left");
            // Nothing more to tell a client that left.
            lock(writer).closed = true;
        }
        End::Lost(why) => {
            warn!(%peer, rank, "rendezvous: rank {rank} lost its connection ({why})");
            abort_unless_set(
                shared,
                rank,
                &format!("rank {rank} vanished (its store connection closed)"),
            );
        }
        End::Garbage(why) => {
            warn!(%peer, rank, "rendezvous: rank {rank} sent garbage: {why}");
            abort_unless_set(
                shared,
                rank,
                &format!("rank {rank} sent garbage to the store: {why}"),
            );
        }
    }
    lock(writer).close();
}

fn session(reader: &mut LineReader, shared: &Shared, writer: &Mutex<Writer>, rank: u32) -> End {
    loop {
        let req = match reader.recv::<Request>(None) {
            Ok(r) => r,
            Err(super::proto::RecvError::Garbage(g)) => return End::Garbage(g),
            Err(e) => return End::Lost(e.to_string()),
        };
        let reply = match req {
            Request::Set { key, value } => {
                set(shared, rank, key, value.0);
                Reply::Done
            }
            Request::Get { key, timeout_ms } => {
                let wait = Duration::from_millis(timeout_ms).min(MAX_GET_WAIT);
                match wait_for(shared, reader.get_ref(), &key, wait) {
                    Ok(Some(v)) => Reply::Value { value: Hex(v) },
                    Ok(None) => Reply::TimedOut { key },
                    Err(end) => return end,
                }
            }
            Request::Add { key, delta } => {
                let mut map = lock(&shared.map);
                match counter_value(&key, map.get(&key).map(Vec::as_slice)) {
                    Ok(v) => {
                        let now = v.saturating_add(delta);
                        map.insert(key, now.to_string().into_bytes());
                        shared.changed.notify_all();
                        Reply::Counter { value: now }
                    }
                    Err(e) => Reply::Failed {
                        reason: std::error::Error::source(&e)
                            .map_or_else(|| e.to_string(), ToString::to_string),
                    },
                }
            }
            Request::Check { key } => Reply::Exists {
                exists: lock(&shared.map).contains_key(&key),
            },
            Request::Bye => return End::Bye,
            Request::Hello { .. } => return End::Garbage("a second hello".into()),
        };
        if lock(writer).send(&reply).is_err() {
            return if shared.closing() {
                End::Closing
            } else {
                End::Lost("cannot write a reply".into())
            };
        }
    }
}

fn set(shared: &Shared, rank: u32, key: String, value: Vec<u8>) {
    if key == ABORT_KEY {
        if let crate::Error::Aborted { reason, .. } = parse_notice(&value) {
            warn!(rank, "rendezvous: rank aborts: {reason}");
        }
    }
    lock(&shared.map).insert(key, value);
    shared.changed.notify_all();
}

/// Waits for `key` up to `wait`: its value, `None` after the wait, or how
/// the session ends (the client went away, the store closes).
fn wait_for(
    shared: &Shared,
    client: &TcpStream,
    key: &str,
    wait: Duration,
) -> std::result::Result<Option<Vec<u8>>, End> {
    let deadline = Instant::now() + wait;
    let mut map = lock(&shared.map);
    loop {
        if shared.closing() {
            return Err(End::Closing);
        }
        if let Some(v) = map.get(key) {
            return Ok(Some(v.clone()));
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(None);
        }
        let (m, t) = shared
            .changed
            .wait_timeout(map, left.min(LIVENESS_EVERY))
            .unwrap_or_else(|p| p.into_inner());
        map = m;
        if t.timed_out() {
            drop(map);
            if let Some(why) = gone(client) {
                return Err(End::Lost(why));
            }
            map = lock(&shared.map);
        }
    }
}

/// Whether the client closed its end (`Some(why)`), looked at without
/// consuming anything.
fn gone(client: &TcpStream) -> Option<String> {
    if client.set_nonblocking(true).is_err() {
        return None;
    }
    let r = client.peek(&mut [0u8; 1]);
    let _ = client.set_nonblocking(false);
    match r {
        Ok(0) => Some("connection closed during a get".into()),
        Err(e) if e.kind() != std::io::ErrorKind::WouldBlock => Some(e.to_string()),
        _ => None,
    }
}

/// Publishes a rank's disappearance as the job's abort notice, unless an
/// abort is already published.
fn abort_unless_set(shared: &Shared, rank: u32, reason: &str) {
    let mut map = lock(&shared.map);
    if !map.contains_key(ABORT_KEY) {
        map.insert(ABORT_KEY.to_owned(), notice(Some(Rank(rank)), reason));
        shared.changed.notify_all();
    }
}
