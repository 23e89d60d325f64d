//! Rank 0's store: checks every newcomer's token, relays all-gather rounds,
//! and turns one rank's failure or disappearance into an abort notice to
//! all.
//!
//! One thread accepts; one thread per connection reads. A newcomer has
//! [`HELLO_TIMEOUT`] to present a valid hello; anything else (garbage, a
//! wrong token, a rank already taken, another world size) is logged and
//! the connection closed, and the store carries on.

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::Value;
use tracing::{debug, info, warn};

use super::proto::{send, ClientMsg, LineReader, RecvError, ServerMsg, VERSION};
use crate::error::{Error, Result};

/// How long a new connection may take to present its hello.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a write to one client may block.
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);

struct Client {
    writer: TcpStream,
    bye: bool,
}

#[derive(Default)]
struct State {
    clients: BTreeMap<u32, Client>,
    rounds: BTreeMap<u32, BTreeMap<u32, Value>>,
    aborted: Option<(u32, String)>,
    closing: bool,
}

struct Shared {
    token: String,
    world_size: u32,
    state: Mutex<State>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A handler thread that panicked holding the lock leaves the state
        // as consistent as any other moment; keep serving.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The running store. Dropping it tells every client that the store closes
/// cleanly and stops accepting.
pub struct StoreServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: Arc<AtomicBool>,
    acceptor: Option<JoinHandle<()>>,
}

impl StoreServer {
    /// Binds `bind` (`host:port`; port 0 picks one) and serves `world_size`
    /// ranks presenting `token`.
    pub fn start(bind: &str, token: &str, world_size: u32) -> Result<StoreServer> {
        let listener = TcpListener::bind(bind).map_err(|source| Error::Rendezvous {
            call: "bind",
            addr: bind.to_owned(),
            source,
        })?;
        let addr = listener.local_addr().map_err(|source| Error::Rendezvous {
            call: "local_addr",
            addr: bind.to_owned(),
            source,
        })?;
        listener
            .set_nonblocking(true)
            .map_err(|source| Error::Rendezvous {
                call: "set_nonblocking",
                addr: addr.to_string(),
                source,
            })?;
        let shared = Arc::new(Shared {
            token: token.to_owned(),
            world_size,
            state: Mutex::new(State::default()),
        });
        let stop = Arc::new(AtomicBool::new(false));
        let acceptor = {
            let (shared, stop) = (Arc::clone(&shared), Arc::clone(&stop));
            std::thread::Builder::new()
                .name("ringcc-store".into())
                .spawn(move || accept_loop(listener, shared, stop))
                .map_err(|source| Error::Rendezvous {
                    call: "spawn",
                    addr: addr.to_string(),
                    source,
                })?
        };
        info!(%addr, world_size, "rendezvous: store serving");
        Ok(StoreServer {
            addr,
            shared,
            stop,
            acceptor: Some(acceptor),
        })
    }

    /// The address the store listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for StoreServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        {
            let mut st = self.shared.lock();
            st.closing = true;
            for c in st.clients.values_mut() {
                let _ = send(&mut c.writer, &ServerMsg::Closing);
            }
        }
        if let Some(t) = self.acceptor.take() {
            let _ = t.join();
        }
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::Acquire) {
        match listener.accept() {
            Ok((stream, peer)) => {
                let shared = Arc::clone(&shared);
                let spawned = std::thread::Builder::new()
                    .name("ringcc-store-conn".into())
                    .spawn(move || serve(stream, peer, shared));
                if let Err(e) = spawned {
                    warn!(%peer, "rendezvous: cannot serve connection: {e}");
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => {
                warn!("rendezvous: accept failed: {e}");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

fn reject(mut stream: TcpStream, peer: SocketAddr, reason: String) {
    warn!(%peer, "rendezvous: rejected connection: {reason}");
    let _ = send(&mut stream, &ServerMsg::Reject { reason });
    let _ = stream.shutdown(std::net::Shutdown::Both);
}

/// Checks a hello; the reason it is refused, if it is.
fn check_hello(shared: &Shared, msg: &ClientMsg) -> std::result::Result<u32, String> {
    let ClientMsg::Hello {
        version,
        token,
        rank,
        world_size,
    } = msg
    else {
        return Err("first message is not a hello".into());
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

fn serve(stream: TcpStream, peer: SocketAddr, shared: Arc<Shared>) {
    let _ = stream.set_nodelay(true);
    let _ = stream.set_write_timeout(Some(WRITE_TIMEOUT));
    let Ok(read_half) = stream.try_clone() else {
        return;
    };
    let mut reader = LineReader::new(read_half);
    let hello = match reader.recv::<ClientMsg>(Some(Instant::now() + HELLO_TIMEOUT)) {
        Ok(m) => m,
        Err(e) => return reject(stream, peer, format!("bad hello: {e}")),
    };
    let rank = match check_hello(&shared, &hello) {
        Ok(r) => r,
        Err(reason) => return reject(stream, peer, reason),
    };
    {
        let mut st = shared.lock();
        if st.closing {
            drop(st);
            return reject(stream, peer, "the store is closing".into());
        }
        if st.clients.contains_key(&rank) {
            drop(st);
            return reject(stream, peer, format!("rank {rank} is already connected"));
        }
        let Ok(writer) = stream.try_clone() else {
            return;
        };
        let mut client = Client { writer, bye: false };
        if send(&mut client.writer, &ServerMsg::Welcome).is_err() {
            return;
        }
        if let Some((r, reason)) = st.aborted.clone() {
            let _ = send(&mut client.writer, &ServerMsg::Abort { rank: r, reason });
        }
        st.clients.insert(rank, client);
    }
    debug!(%peer, rank, "rendezvous: rank joined");
    loop {
        match reader.recv::<ClientMsg>(None) {
            Ok(ClientMsg::Gather { round, data }) => gather(&shared, rank, round, data),
            Ok(ClientMsg::Abort { reason }) => {
                warn!(rank, "rendezvous: rank aborts: {reason}");
                abort(&shared, rank, reason);
            }
            Ok(ClientMsg::Bye) => {
                if let Some(c) = shared.lock().clients.get_mut(&rank) {
                    c.bye = true;
                }
            }
            Ok(ClientMsg::Hello { .. }) => {
                warn!(rank, "rendezvous: second hello from rank {rank}");
                abort(&shared, rank, "sent a second hello".into());
            }
            Err(RecvError::Closed) | Err(RecvError::Io(_)) => break,
            Err(e @ (RecvError::Garbage(_) | RecvError::TimedOut)) => {
                warn!(rank, "rendezvous: rank {rank} sent garbage: {e}");
                abort(&shared, rank, format!("sent garbage to the store: {e}"));
                break;
            }
        }
    }
    let mut st = shared.lock();
    let left = st.clients.remove(&rank);
    let clean = left.is_some_and(|c| c.bye) || st.closing;
    drop(st);
    if clean {
        debug!(rank, "rendezvous: rank left");
    } else {
        warn!(rank, "rendezvous: rank {rank} lost its connection");
        abort(
            &shared,
            rank,
            format!("rank {rank} lost its rendezvous connection (crashed or killed?)"),
        );
    }
    let _ = stream.shutdown(std::net::Shutdown::Both);
}

fn gather(shared: &Shared, rank: u32, round: u32, data: Value) {
    let mut st = shared.lock();
    if let Some((r, reason)) = st.aborted.clone() {
        if let Some(c) = st.clients.get_mut(&rank) {
            let _ = send(&mut c.writer, &ServerMsg::Abort { rank: r, reason });
        }
        return;
    }
    let entries = st.rounds.entry(round).or_default();
    entries.insert(rank, data);
    if entries.len() < shared.world_size as usize {
        return;
    }
    let data: Vec<Value> = st
        .rounds
        .remove(&round)
        .unwrap_or_default()
        .into_values()
        .collect();
    let msg = ServerMsg::Gathered { round, data };
    for (r, c) in st.clients.iter_mut() {
        if let Err(e) = send(&mut c.writer, &msg) {
            warn!(rank = *r, "rendezvous: cannot send round {round}: {e}");
        }
    }
}

fn abort(shared: &Shared, rank: u32, reason: String) {
    let mut st = shared.lock();
    if st.aborted.is_some() {
        return;
    }
    st.aborted = Some((rank, reason.clone()));
    let msg = ServerMsg::Abort { rank, reason };
    for c in st.clients.values_mut() {
        let _ = send(&mut c.writer, &msg);
    }
}
