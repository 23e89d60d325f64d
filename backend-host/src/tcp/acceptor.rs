//! The listener of one rank and its acceptor thread.
//!
//! One thread accepts connections; each connection's hello is read and
//! judged by a short-lived thread of its own (bounded by the hello
//! timeout and by [`MAX_HANDSHAKES`] at a time), so a silent or slow
//! client never holds up the next one. An accepted stream is filed by
//! its hop (sender, channel) for [`Acceptor::take`]; anything else gets a
//! refusal (when it said enough to answer) and is closed and logged.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ringcc_comm::{Error, Result};
use ringcc_core::fifo::FifoGeometry;
use ringcc_core::{ChannelId, Rank};

use super::frame::{HelloRepr, Reason, Reply, HELLO_LEN};
use super::io::{fill_by, send, transport_error, ReadFail};
use super::NAME;

/// Hellos read at the same time; connections beyond are closed at once.
pub(super) const MAX_HANDSHAKES: usize = 64;

/// How long `Drop` waits to wake the acceptor with a connection of its own.
const WAKE_TIMEOUT: Duration = Duration::from_secs(1);

/// Where one hop this rank receives stands.
#[derive(Debug)]
enum HopState {
    /// Listened for, with the FIFO the sender must have.
    Listening(FifoGeometry),
    /// A hello was accepted; its reply is being written.
    Claimed,
    /// Connected, waiting for `take`.
    Filed(TcpStream),
    /// Handed to `accept`.
    Taken,
}

#[derive(Debug)]
struct Registry {
    token_hash: u64,
    rank: Rank,
    hops: BTreeMap<(Rank, ChannelId), HopState>,
}

impl Registry {
    /// Whether `h` may connect (the checks of a hello, in order), and the
    /// hop's FIFO when it may.
    fn judge(&self, h: &HelloRepr) -> std::result::Result<FifoGeometry, Reason> {
        if h.token_hash != self.token_hash {
            return Err(Reason::WrongToken);
        }
        if h.receiver != self.rank.0 {
            return Err(Reason::WrongReceiver);
        }
        match self.hops.get(&(Rank(h.sender), ChannelId(h.channel))) {
            None => Err(Reason::UnknownHop),
            Some(HopState::Listening(g))
                if g.slot_bytes() != h.slot_bytes || g.slots_per_slice() != h.slots_per_slice =>
            {
                Err(Reason::Geometry)
            }
            Some(HopState::Listening(g)) => Ok(*g),
            Some(_) => Err(Reason::Duplicate),
        }
    }
}

/// What the acceptor thread, the handshakes and the transport share.
#[derive(Debug)]
struct Shared {
    registry: Mutex<Registry>,
    filed: Condvar,
    stop: AtomicBool,
    handshakes: AtomicUsize,
    hello_timeout: Duration,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Registry> {
        // The critical sections only move map entries: a panic elsewhere
        // leaves the map consistent.
        self.registry.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A bound listener and its acceptor thread; dropping it stops the thread.
#[derive(Debug)]
pub(super) struct Acceptor {
    shared: Arc<Shared>,
    addr: SocketAddr,
    thread: Option<JoinHandle<()>>,
}

impl Acceptor {
    /// Binds `(ip, 0)` and starts accepting for `rank` of the job whose
    /// token hashes to `token_hash`.
    pub fn start(
        ip: IpAddr,
        token_hash: u64,
        rank: Rank,
        hello_timeout: Duration,
    ) -> Result<Acceptor> {
        let listener = TcpListener::bind((ip, 0)).map_err(|e| transport_error("bind", e))?;
        let addr = listener
            .local_addr()
            .map_err(|e| transport_error("getsockname", e))?;
        let shared = Arc::new(Shared {
            registry: Mutex::new(Registry {
                token_hash,
                rank,
                hops: BTreeMap::new(),
            }),
            filed: Condvar::new(),
            stop: AtomicBool::new(false),
            handshakes: AtomicUsize::new(0),
            hello_timeout,
        });
        let s = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name(format!("ringcc-tcp-accept-r{rank}"))
            .spawn(move || accept_loop(&s, &listener))
            .map_err(|e| transport_error("spawn the acceptor thread", e))?;
        tracing::debug!(%addr, %rank, "tcp: listening");
        Ok(Acceptor {
            shared,
            addr,
            thread: Some(thread),
        })
    }

    /// The address peers connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The rank it accepts for.
    pub fn rank(&self) -> Rank {
        self.shared.lock().rank
    }

    /// The token hash it accepts.
    pub fn token_hash(&self) -> u64 {
        self.shared.lock().token_hash
    }

    /// Makes the hop from `sender` on `channel` connectable, with FIFO
    /// `geometry`.
    pub fn expect(&self, sender: Rank, channel: ChannelId, geometry: FifoGeometry) -> Result<()> {
        let mut reg = self.shared.lock();
        if reg.hops.contains_key(&(sender, channel)) {
            return Err(Error::BadConfig(format!(
                "{NAME}: the hop from rank {sender} on channel {channel} was listened for already"
            )));
        }
        reg.hops
            .insert((sender, channel), HopState::Listening(geometry));
        Ok(())
    }

    /// The stream of the hop from `sender` on `channel`, once its sender
    /// connected; [`Error::Timeout`] after `deadline`.
    pub fn take(&self, sender: Rank, channel: ChannelId, deadline: Instant) -> Result<TcpStream> {
        let start = Instant::now();
        let mut reg = self.shared.lock();
        loop {
            match reg.hops.get_mut(&(sender, channel)) {
                None => {
                    return Err(Error::BadConfig(format!(
                        "{NAME}: accept before listen for the hop from rank {sender} on channel {channel}"
                    )))
                }
                Some(HopState::Taken) => {
                    return Err(Error::BadConfig(format!(
                        "{NAME}: the hop from rank {sender} on channel {channel} was accepted already"
                    )))
                }
                Some(state @ HopState::Filed(_)) => {
                    if let HopState::Filed(s) = std::mem::replace(state, HopState::Taken) {
                        return Ok(s);
                    }
                }
                Some(HopState::Listening(_) | HopState::Claimed) => {}
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::Timeout {
                    waiting_for: format!(
                        "{NAME}: rank {sender} to connect to rank {} on channel {channel}",
                        reg.rank
                    ),
                    after: start.elapsed(),
                });
            }
            reg = self
                .shared
                .filed
                .wait_timeout(reg, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }
}

impl Drop for Acceptor {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        let Some(thread) = self.thread.take() else {
            return;
        };
        // The acceptor blocks in `accept`: one connection of our own wakes
        // it to see the flag.
        let ip = match self.addr.ip() {
            IpAddr::V4(a) if a.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(a) if a.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
            a => a,
        };
        match TcpStream::connect_timeout(&SocketAddr::new(ip, self.addr.port()), WAKE_TIMEOUT) {
            Ok(_) => {
                if thread.join().is_err() {
                    tracing::warn!(addr = %self.addr, "tcp: the acceptor thread panicked");
                }
            }
            // Never block in drop: the thread stays parked in `accept`
            // (holding the port) until the process ends.
            Err(e) => tracing::warn!(addr = %self.addr, error = %e,
                "tcp: could not wake the acceptor thread; leaving it behind"),
        }
    }
}

/// Releases a handshake's place when the handshake ends, however it ends.
struct HandshakeSlot(Arc<Shared>);

impl Drop for HandshakeSlot {
    fn drop(&mut self) {
        self.0.handshakes.fetch_sub(1, Ordering::AcqRel);
    }
}

fn accept_loop(shared: &Arc<Shared>, listener: &TcpListener) {
    loop {
        let accepted = listener.accept();
        if shared.stop.load(Ordering::Acquire) {
            return;
        }
        let (stream, from) = match accepted {
            Ok(c) => c,
            Err(e) => {
                // Out of descriptors, a connection reset before accept:
                // keep serving, without spinning.
                tracing::warn!(error = %e, "tcp: accept failed");
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        if shared.handshakes.fetch_add(1, Ordering::AcqRel) >= MAX_HANDSHAKES {
            shared.handshakes.fetch_sub(1, Ordering::AcqRel);
            tracing::warn!(%from, "tcp: too many hellos in progress; closing a connection");
            continue;
        }
        let slot = HandshakeSlot(Arc::clone(shared));
        let spawned = std::thread::Builder::new()
            .name("ringcc-tcp-hello".into())
            .spawn(move || {
                let slot = slot;
                handshake(&slot.0, stream, from);
            });
        if let Err(e) = spawned {
            // The closure (and the slot in it) was dropped with the error.
            tracing::warn!(%from, error = %e, "tcp: could not start a hello thread");
        }
    }
}

/// Reads, judges and answers one hello; files the stream when accepted.
fn handshake(shared: &Shared, stream: TcpStream, from: SocketAddr) {
    let deadline = Instant::now() + shared.hello_timeout;
    let mut b = [0u8; HELLO_LEN];
    let hello = match fill_by(&stream, &mut b, deadline) {
        Ok(()) => HelloRepr::parse(&b),
        Err(ReadFail::TimedOut) => {
            tracing::warn!(%from, timeout = ?shared.hello_timeout,
                "tcp: refused a connection that sent no hello in time");
            return;
        }
        Err(e) => {
            tracing::warn!(%from, error = ?e, "tcp: a connection ended before its hello");
            return;
        }
    };
    let verdict = match hello {
        Err(e) => {
            tracing::warn!(%from, error = %e, "tcp: refused a connection with a malformed hello");
            Err(Reason::BadHello)
        }
        Ok(h) => {
            let mut reg = shared.lock();
            let v = reg.judge(&h);
            match v {
                Ok(_) => {
                    reg.hops
                        .insert((Rank(h.sender), ChannelId(h.channel)), HopState::Claimed);
                }
                Err(reason) => tracing::warn!(%from, sender = h.sender, receiver = h.receiver,
                    channel = h.channel, ?reason, "tcp: refused a hello"),
            }
            v.map(|g| (h, g))
        }
    };
    let reply = match verdict {
        Ok(_) => Reply::Accepted,
        Err(r) => Reply::Refused(r),
    };
    let sent = stream
        .set_write_timeout(Some(shared.hello_timeout))
        .and_then(|()| send(&stream, &reply.emit()));
    let Ok((h, geometry)) = verdict else {
        return;
    };
    let key = (Rank(h.sender), ChannelId(h.channel));
    let mut reg = shared.lock();
    match sent {
        Ok(()) => {
            tracing::debug!(%from, sender = h.sender, channel = h.channel, "tcp: accepted a hop");
            reg.hops.insert(key, HopState::Filed(stream));
            shared.filed.notify_all();
        }
        Err(e) => {
            tracing::warn!(%from, error = %e, "tcp: could not answer an accepted hello");
            // The sender's connect fails; it may come again.
            reg.hops.insert(key, HopState::Listening(geometry));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn judge_checks_in_order() {
        let g = FifoGeometry::new(4096, 2).unwrap();
        let mut reg = Registry {
            token_hash: 7,
            rank: Rank(1),
            hops: BTreeMap::new(),
        };
        reg.hops
            .insert((Rank(0), ChannelId(0)), HopState::Listening(g));
        reg.hops.insert((Rank(0), ChannelId(1)), HopState::Taken);
        let ok = HelloRepr {
            token_hash: 7,
            sender: 0,
            receiver: 1,
            channel: 0,
            slot_bytes: 4096,
            slots_per_slice: 2,
        };
        assert_eq!(reg.judge(&ok), Ok(g));
        let t = |f: fn(&mut HelloRepr)| {
            let mut h = ok;
            f(&mut h);
            reg.judge(&h)
        };
        assert_eq!(t(|h| h.token_hash = 8), Err(Reason::WrongToken));
        assert_eq!(t(|h| h.receiver = 2), Err(Reason::WrongReceiver));
        assert_eq!(t(|h| h.sender = 2), Err(Reason::UnknownHop));
        assert_eq!(t(|h| h.channel = 2), Err(Reason::UnknownHop));
        assert_eq!(t(|h| h.slot_bytes = 16), Err(Reason::Geometry));
        assert_eq!(t(|h| h.slots_per_slice = 1), Err(Reason::Geometry));
        assert_eq!(t(|h| h.channel = 1), Err(Reason::Duplicate));
    }
}
