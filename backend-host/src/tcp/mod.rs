//! The TCP transport: ranks on different hosts (or anywhere without
//! shared memory or RDMA), one TCP connection per hop.
//!
//! [`TcpTransport::publish`] binds a listener and starts one acceptor
//! thread; [`listen`](Transport::listen) tells it which hops to expect;
//! [`connect`](Transport::connect) dials the receiver's published address
//! and sends a hello (the job token's hash, both ranks, the channel, the
//! FIFO geometry), which the acceptor answers at once;
//! [`accept`](Transport::accept) picks up the stream the acceptor filed
//! for the hop. The frames (see `frame`) then carry the call header, one
//! data frame per slot (the last of a slice publishes `tail`), and, the
//! other way, credit (`head`).
//!
//! The data path has no thread of its own: the communicator's drive
//! thread reads and writes the sockets without blocking, in the ends'
//! `poll` and `post`, so a slice is picked up by the thread that works
//! on it, with no hand-off. The receiving end checks every frame header
//! before it touches memory (`inbound`: kind, length within a slot, step
//! in order and within the credit window, call sequence never going
//! back) and reads payloads straight into the slots; the sending end
//! queues each slice's frames (headers in the queue, payloads in their
//! staging slots) and writes as many as the socket takes with one
//! `sendmsg`, the rest from later polls; credit for a burst of slices
//! goes back in one frame. A violation, or a connection that ends, is
//! the typed error ([`Error::Protocol`], [`Error::PeerGone`]) of the
//! end's next `poll`. Each end has a watcher thread (`watch`) that, once
//! the end has been idle a while, waits for its socket in `poll(2)` and
//! rings the rank's bell, so that a sleeping rank wakes for its traffic
//! and a dead peer is seen promptly.
//!
//! Call order (as the [`Transport`] trait): `publish` once, then per hop
//! `listen` (receiver), `connect` (sender), `accept` (receiver).

mod acceptor;
mod frame;
mod inbound;
mod io;
mod recv;
mod send;
mod watch;

#[cfg(test)]
mod tests;

use std::io::ErrorKind;
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ringcc_comm::transport::{Hop, Job, PeerInfo, RecvEnd, SendEnd, Transport};
use ringcc_comm::{Error, Result};
use ringcc_core::fifo::FifoGeometry;
use ringcc_core::Rank;

use crate::token_hash;
use acceptor::Acceptor;
use frame::{HelloRepr, Reason, Reply, REPLY_LEN};
use io::{fill_by, send, transport_error, Peer, ReadFail};
use recv::TcpRecvEnd;
use send::TcpSendEnd;

/// The transport's name (in `PeerInfo::transports`, in errors).
const NAME: &str = "tcp";

/// The shortest timeout a socket takes.
const MIN_TIMEOUT: Duration = Duration::from_millis(1);

/// Pause between attempts to reach a receiver that is not listening yet.
const REDIAL: Duration = Duration::from_millis(20);

/// One rank's TCP transport (one per communicator).
///
/// Nothing is bound until [`publish`](Transport::publish); dropping the
/// transport stops its acceptor (connected ends live on).
#[derive(Debug)]
pub struct TcpTransport {
    bind_ip: IpAddr,
    hello_timeout: Duration,
    timeout: Duration,
    acceptor: Option<Acceptor>,
}

impl TcpTransport {
    /// A transport that listens on `bind_ip` (a port the system picks),
    /// waits `hello_timeout` for a connection's hello, and gives up a
    /// frame write that makes no progress for `timeout` (the
    /// communicator's timeout) with [`Error::Timeout`]. Both are at least
    /// a millisecond (a socket timeout cannot be zero).
    pub fn new(bind_ip: IpAddr, hello_timeout: Duration, timeout: Duration) -> TcpTransport {
        TcpTransport {
            bind_ip,
            hello_timeout: hello_timeout.max(MIN_TIMEOUT),
            timeout: timeout.max(MIN_TIMEOUT),
            acceptor: None,
        }
    }

    /// The address it listens on, once published.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.acceptor.as_ref().map(Acceptor::addr)
    }

    fn acceptor(&self, step: &str) -> Result<&Acceptor> {
        self.acceptor
            .as_ref()
            .ok_or_else(|| Error::BadConfig(format!("{NAME}: {step} before publish")))
    }

    /// [`accept`](Transport::accept), the slots first filled with `fill`.
    fn accept_end(&mut self, job: &Job<'_>, hop: Hop, fill: u8) -> Result<TcpRecvEnd> {
        let stream = self
            .acceptor("accept")?
            .take(hop.sender, hop.channel, job.deadline)?;
        let peer = Peer {
            rank: hop.sender,
            channel: hop.channel,
        };
        TcpRecvEnd::start(
            stream,
            peer,
            job.geometry,
            self.timeout,
            fill,
            Arc::clone(job.bell),
        )
    }
}

/// What both ends start from: the stream with its options set and its
/// watcher running, and the FIFO's sizes in bytes.
struct Opened {
    stream: Arc<TcpStream>,
    watch: watch::Watch,
    slot_bytes: usize,
    /// `slot_bytes` × the FIFO's slots: the receiver's slots, the
    /// sender's staging.
    fifo_bytes: usize,
}

/// Opens one end (`side`: `recv` or `send`, the watcher thread's name)
/// of the hop to or from `peer` over `stream`.
fn open_end(
    stream: TcpStream,
    peer: &Peer,
    geometry: FifoGeometry,
    bell: Arc<dyn ringcc_comm::transport::Bell>,
    side: &str,
) -> Result<Opened> {
    let beyond = || Error::BadConfig(format!("{NAME}: slots beyond memory"));
    let slot_bytes = usize::try_from(geometry.slot_bytes()).map_err(|_| beyond())?;
    let fifo_bytes = slot_bytes
        .checked_mul(ringcc_core::fifo::STEPS as usize)
        .ok_or_else(beyond)?;
    let setup = |call| move |e| transport_error(call, e);
    tune(&stream).map_err(setup("setsockopt"))?;
    let stream = Arc::new(stream);
    let watch = watch::Watch::start(
        Arc::clone(&stream),
        bell,
        format!("ringcc-tcp-{side}-r{}-c{}", peer.rank, peer.channel),
    )
    .map_err(setup("start the watcher"))?;
    Ok(Opened {
        stream,
        watch,
        slot_bytes,
        fifo_bytes,
    })
}

/// Where slot `slot`'s first `len` bytes lie in a FIFO of `fifo_len`
/// bytes cut into [`STEPS`](ringcc_core::fifo::STEPS) slots of
/// `slot_bytes` (a receiving end's slots, a sending end's staging); a
/// slot beyond the FIFO or a length beyond a slot is `call`'s typed
/// error.
fn slot_bytes_of(
    call: &'static str,
    slot: ringcc_core::SlotIndex,
    len: usize,
    slot_bytes: usize,
    fifo_len: usize,
) -> Result<std::ops::Range<usize>> {
    let i = u64::from(slot.0);
    let bad = |e: crate::Error| Error::Transport {
        transport: NAME,
        call,
        source: Box::new(e),
    };
    if len > slot_bytes {
        return Err(bad(crate::Error::SlotOverflow {
            slot: i,
            len,
            capacity: slot_bytes as u64,
        }));
    }
    let start = usize::from(slot.0).saturating_mul(slot_bytes);
    match start.checked_add(len) {
        Some(end) if i < ringcc_core::fifo::STEPS && end <= fifo_len => Ok(start..end),
        _ => Err(bad(crate::Error::NoSuchSlot { slot: i })),
    }
}

/// The FIFO slot a ring with a TCP hop uses unless the user sets one
/// ([`Transport::slot_bytes`]).
pub const TCP_SLOT_BYTES: u64 = 512 << 10;

/// A connected stream's options: no Nagle (a slice's last frame must
/// not wait for an acknowledgement). The socket buffers are left to the
/// kernel's autotuning: fixed sizes (1 or 4 MiB each way) measured no
/// faster.
fn tune(s: &TcpStream) -> std::io::Result<()> {
    s.set_nodelay(true)
}

/// Slots a frame's 32-bit length can describe.
fn check_geometry(g: FifoGeometry) -> Result<()> {
    if g.slot_bytes() > u64::from(u32::MAX) {
        return Err(Error::BadConfig(format!(
            "{NAME}: {}-byte slots do not fit a frame (at most 4 GiB - 1)",
            g.slot_bytes()
        )));
    }
    Ok(())
}

/// The address `rank` published for this transport.
fn published_addr(job: &Job<'_>, rank: Rank) -> Result<SocketAddr> {
    let bad = |what: &str| Error::BadConfig(format!("{NAME}: rank {rank} {what}"));
    let info = job.peer(rank).ok_or_else(|| bad("published nothing"))?;
    let entry = info
        .transports
        .get(NAME)
        .ok_or_else(|| bad("published no tcp address"))?;
    entry
        .get("addr")
        .and_then(|a| a.as_str())
        .and_then(|a| a.parse().ok())
        .ok_or_else(|| bad(&format!("published a malformed tcp entry {entry}")))
}

/// Connects to `addr` (retrying while nothing listens), sends `hello` and
/// reads the verdict, all before `deadline`.
fn dial(addr: SocketAddr, hello: &HelloRepr, deadline: Instant) -> Result<TcpStream> {
    let start = Instant::now();
    let receiver = hello.receiver;
    let timeout = || Error::Timeout {
        waiting_for: format!(
            "{NAME}: rank {receiver} at {addr} to accept the hop from rank {} on channel {}",
            hello.sender, hello.channel
        ),
        after: start.elapsed(),
    };
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(timeout());
        }
        let s = match TcpStream::connect_timeout(&addr, left) {
            Ok(s) => s,
            Err(e) if e.kind() == ErrorKind::ConnectionRefused => {
                std::thread::sleep(REDIAL.min(left));
                continue;
            }
            Err(e) if matches!(e.kind(), ErrorKind::TimedOut | ErrorKind::WouldBlock) => continue,
            Err(e) => return Err(transport_error("connect", e)),
        };
        let setup = |call| move |e| transport_error(call, e);
        s.set_nodelay(true).map_err(setup("set_nodelay"))?;
        s.set_write_timeout(Some(left))
            .map_err(setup("set_write_timeout"))?;
        // A connection closed before the verdict: the acceptor had too
        // many hellos to read, or was restarting. Come again.
        let dropped = |e: &std::io::Error| {
            matches!(
                e.kind(),
                ErrorKind::BrokenPipe | ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted
            )
        };
        match send(&s, &hello.emit()) {
            Ok(()) => {}
            Err(e) if dropped(&e) => {
                std::thread::sleep(REDIAL.min(left));
                continue;
            }
            Err(e) => return Err(transport_error("write the hello", e)),
        }
        let mut b = [0u8; REPLY_LEN];
        match fill_by(&s, &mut b, deadline) {
            Ok(()) => {}
            Err(ReadFail::Eof { .. }) => {
                std::thread::sleep(REDIAL.min(left));
                continue;
            }
            Err(ReadFail::Io(e)) if dropped(&e) => {
                std::thread::sleep(REDIAL.min(left));
                continue;
            }
            Err(ReadFail::Io(e)) => return Err(transport_error("read the reply", e)),
            Err(ReadFail::TimedOut) => return Err(timeout()),
        }
        let refused = |r: Reason| {
            format!(
                "rank {receiver} refused the hop from rank {} on channel {}: {}",
                hello.sender,
                hello.channel,
                r.describe()
            )
        };
        return match Reply::parse(&b) {
            Reply::Accepted => Ok(s),
            Reply::Refused(r @ (Reason::Geometry | Reason::UnknownHop | Reason::Duplicate)) => {
                Err(Error::BadConfig(format!("{NAME}: {}", refused(r))))
            }
            Reply::Refused(r) => Err(Error::Stranger {
                at: addr.to_string(),
                reason: refused(r),
            }),
            Reply::Unknown(v) => Err(Error::Stranger {
                at: addr.to_string(),
                reason: format!("not a ringcc tcp listener (it answered {v:#04x})"),
            }),
        };
    }
}

impl Transport for TcpTransport {
    fn name(&self) -> &'static str {
        NAME
    }

    /// One channel per call: a second connection costs the kernel more
    /// per byte than it adds (two network namespaces over a veth pair,
    /// 2 ranks, interleaved runs: 16 MiB AllReduce 5.9–8.4 ms on one
    /// channel vs 11.7–12.1 ms on two, 18 ms on four; 64 MiB 36 vs
    /// 42 ms; `_copy_from_iter` 16 % of a rank's time on one channel,
    /// 35 % on two). Each rank's one drive thread serves every channel,
    /// so more connections add no parallelism.
    fn channel_bytes(&self) -> u64 {
        u64::MAX
    }

    /// 512 KiB (NCCL's Simple slot): every slice costs a rank system
    /// calls on both ends, so larger slices move more per call.
    /// Measured interleaved between two network namespaces (2 ranks):
    /// against 128 KiB, 256 KiB took 1 MiB 601 → 444 µs, 4 MiB 2.93 →
    /// 1.84 ms, 16 MiB 11.6 → 9.2 ms, 64 MiB 46 → 39 ms (medians of 5);
    /// 512 KiB against 256 KiB: 1 MiB 500 → 432 µs (8 rounds), 4 MiB
    /// 2.04 → 1.77 ms, 16 MiB 9.8 → 9.4 ms, 8 B alike (6 rounds).
    fn slot_bytes(&self) -> Option<u64> {
        Some(TCP_SLOT_BYTES)
    }

    /// Binds `(bind_ip, 0)`, starts the acceptor and publishes
    /// `{"addr": "ip:port"}`.
    fn publish(&mut self, token: &str, rank: Rank) -> Result<Option<serde_json::Value>> {
        if self.acceptor.is_some() {
            return Err(Error::BadConfig(format!("{NAME}: published twice")));
        }
        let a = Acceptor::start(self.bind_ip, token_hash(token), rank, self.hello_timeout)?;
        let addr = a.addr().to_string();
        self.acceptor = Some(a);
        Ok(Some(serde_json::json!({ "addr": addr })))
    }

    /// Both ranks published a tcp entry.
    fn reaches(&self, a: &PeerInfo, b: &PeerInfo) -> bool {
        a.transports.contains_key(NAME) && b.transports.contains_key(NAME)
    }

    fn listen(&mut self, job: &Job<'_>, hop: Hop) -> Result<()> {
        check_geometry(job.geometry)?;
        let a = self.acceptor("listen")?;
        if hop.receiver != job.rank || a.rank() != job.rank || hop.sender.0 >= job.world {
            return Err(Error::BadConfig(format!(
                "{NAME}: rank {} (published as {}) cannot listen for {hop:?} in a job of {}",
                job.rank,
                a.rank(),
                job.world
            )));
        }
        if token_hash(job.token) != a.token_hash() {
            return Err(Error::BadConfig(format!(
                "{NAME}: listen with another token than publish"
            )));
        }
        a.expect(hop.sender, hop.channel, job.geometry)
    }

    fn connect(&mut self, job: &Job<'_>, hop: Hop) -> Result<Box<dyn SendEnd>> {
        check_geometry(job.geometry)?;
        if hop.sender != job.rank || hop.receiver.0 >= job.world {
            return Err(Error::BadConfig(format!(
                "{NAME}: rank {} cannot connect {hop:?} in a job of {}",
                job.rank, job.world
            )));
        }
        let addr = published_addr(job, hop.receiver)?;
        let hello = HelloRepr {
            token_hash: token_hash(job.token),
            sender: hop.sender.0,
            receiver: hop.receiver.0,
            channel: hop.channel.0,
            slot_bytes: job.geometry.slot_bytes(),
            slots_per_slice: job.geometry.slots_per_slice(),
        };
        let stream = dial(addr, &hello, job.deadline)?;
        let peer = Peer {
            rank: hop.receiver,
            channel: hop.channel,
        };
        Ok(Box::new(TcpSendEnd::start(
            stream,
            peer,
            job.geometry,
            self.timeout,
            Arc::clone(job.bell),
        )?))
    }

    fn accept(&mut self, job: &Job<'_>, hop: Hop) -> Result<Box<dyn RecvEnd>> {
        Ok(Box::new(self.accept_end(job, hop, 0)?))
    }
}
