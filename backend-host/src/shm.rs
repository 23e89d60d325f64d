//! The shared-memory transport: ranks of one node (one process each)
//! joined through [`Segment`]s, as a [`Transport`] of the communicator.
//!
//! Every rank owns, per channel, the segment its ring predecessor writes
//! into (created in [`listen`](Transport::listen), unlinked in
//! [`accept`](Transport::accept) once the predecessor has mapped it: a
//! job that crashes after connecting leaves no names behind) and opens its
//! successor's (in [`connect`](Transport::connect)). The ends are thin:
//!
//! - [`ShmRecv`]: reports the predecessor's call header (the mailbox) and
//!   `tail` (acquire) as events, lends the executor the incoming slot in
//!   place, and returns credit by posting `head`;
//! - [`ShmSend`]: reports the successor's `head`, lends the executor the
//!   successor's own slot to write the result into (no staging copy), and
//!   publishes header, then `tail` (release).
//!
//! A peer killed mid-call is noticed two ways: the job's abort notice (the
//! store sees its connection close) and, here, the process table — an
//! idle end checks now and then that the peer's process still exists
//! (when both run in the same PID namespace).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ringcc_comm::transport::{Hop, Job, PeerInfo, RecvEnd, SendEnd, Transport};
use ringcc_comm::Error as CommError;
use ringcc_core::prim::SlotSpan;
use ringcc_core::progress::Event;
use ringcc_core::wire::call_header::{CallHeader, CallHeaderRepr, CALL_HEADER_LEN};
use ringcc_core::{ChannelId, Rank, SlotIndex};

use crate::{Bell, Segment, SegmentName};

/// The longest nap while waiting for a peer to map a segment.
const NAP: Duration = Duration::from_micros(200);

/// Idle polls between two looks at the clock for the liveness check.
const LIVENESS_POLLS: u32 = 16;

/// The least time between two looks at the peer's process.
const LIVENESS_EVERY: Duration = Duration::from_millis(200);

/// How long opening this rank's own, just created bell may take.
const OWN_BELL: Duration = Duration::from_secs(5);

type Result<T> = std::result::Result<T, CommError>;

/// The shared-memory transport of one communicator.
#[derive(Debug, Default)]
pub struct ShmTransport {
    token: String,
    /// Segments created by `listen`, waiting for `accept`.
    inboxes: HashMap<Hop, Segment>,
    /// This rank's bell as created (its name is unlinked when the
    /// transport is dropped, after every neighbour has opened it) …
    bell_owner: Option<Bell>,
    /// … and as the ends share it.
    bell: Option<Arc<Bell>>,
}

impl ShmTransport {
    /// A transport with nothing connected yet.
    pub fn new() -> ShmTransport {
        ShmTransport::default()
    }
}

/// This process's PID namespace (`/proc/self/ns/pid`'s target), so two
/// ranks know whether each other's pids mean anything to them.
fn pid_namespace() -> String {
    std::fs::read_link("/proc/self/ns/pid")
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The peer's pid when it runs in our PID namespace.
fn watchable_pid(job: &Job<'_>, peer: Rank) -> Option<u32> {
    let p = job.peer(peer)?;
    let ns = p.transports.get("shm")?.get("pidns")?.as_str()?;
    (!ns.is_empty() && ns == pid_namespace()).then_some(p.pid)
}

fn uid_of(p: &PeerInfo) -> Option<u64> {
    p.transports.get("shm")?.get("uid")?.as_u64()
}

impl Transport for ShmTransport {
    fn name(&self) -> &'static str {
        "shm"
    }

    fn publish(&mut self, token: &str, rank: Rank) -> Result<Option<serde_json::Value>> {
        self.token = token.to_owned();
        self.bell_owner = Some(Bell::create(token, rank)?);
        self.bell = Some(Arc::new(Bell::open(
            token,
            rank,
            Instant::now() + OWN_BELL,
        )?));
        Ok(Some(serde_json::json!({
            "uid": rustix::process::getuid().as_raw(),
            "pidns": pid_namespace(),
        })))
    }

    /// The same node, and the same user (segments are owner-only).
    fn reaches(&self, a: &PeerInfo, b: &PeerInfo) -> bool {
        a.node == b.node && uid_of(a).is_some() && uid_of(a) == uid_of(b)
    }

    /// This rank's bell: its neighbours ring it through shared memory.
    fn bell(&mut self) -> Option<Arc<dyn ringcc_comm::transport::Bell>> {
        self.bell
            .clone()
            .map(|b| b as Arc<dyn ringcc_comm::transport::Bell>)
    }

    fn listen(&mut self, job: &Job<'_>, hop: Hop) -> Result<()> {
        let name = SegmentName::new(job.token, hop.receiver, hop.channel);
        let seg = Segment::create(&name, job.geometry, job.token)?;
        self.inboxes.insert(hop, seg);
        Ok(())
    }

    fn connect(&mut self, job: &Job<'_>, hop: Hop) -> Result<Box<dyn SendEnd>> {
        let name = SegmentName::new(job.token, hop.receiver, hop.channel);
        let seg = Segment::open(&name, job.token, job.geometry, job.deadline)?;
        Ok(Box::new(ShmSend {
            seg,
            head_seen: 0,
            peer: Peer::new(hop.receiver, hop.channel, watchable_pid(job, hop.receiver)),
            peer_bell: Bell::open(job.token, hop.receiver, job.deadline)?,
        }))
    }

    fn accept(&mut self, job: &Job<'_>, hop: Hop) -> Result<Box<dyn RecvEnd>> {
        let mut seg = self
            .inboxes
            .remove(&hop)
            .ok_or_else(|| CommError::Internal(format!("shm: accept of {hop:?} without listen")))?;
        let deadline: Instant = job.deadline;
        let seg_ref = &seg;
        crate::wait::poll_until(
            deadline,
            NAP,
            || Ok(seg_ref.peer_mapped().then_some(())),
            || {
                format!(
                    "rank {} to map {} (channel {})",
                    hop.sender,
                    seg_ref.name(),
                    hop.channel
                )
            },
        )?;
        seg.unlink()?;
        Ok(Box::new(ShmRecv {
            seg,
            tail_seen: 0,
            header_seen: 0,
            peer: Peer::new(hop.sender, hop.channel, watchable_pid(job, hop.sender)),
            peer_bell: Bell::open(job.token, hop.sender, job.deadline)?,
        }))
    }
}

/// The other end's identity, and a cheap check that its process lives.
#[derive(Debug)]
struct Peer {
    rank: Rank,
    channel: ChannelId,
    pid: Option<u32>,
    idle: u32,
    last_look: Instant,
}

impl Peer {
    fn new(rank: Rank, channel: ChannelId, pid: Option<u32>) -> Peer {
        Peer {
            rank,
            channel,
            pid,
            idle: 0,
            last_look: Instant::now(),
        }
    }

    /// Counts an idle poll; at most every [`LIVENESS_EVERY`], checks the
    /// peer's process is still there.
    fn idle_check(&mut self) -> Result<()> {
        self.idle = self.idle.wrapping_add(1);
        if !self.idle.is_multiple_of(LIVENESS_POLLS) && self.idle > 1 {
            return Ok(());
        }
        if self.last_look.elapsed() < LIVENESS_EVERY {
            return Ok(());
        }
        self.last_look = Instant::now();
        let Some(pid) = self.pid else {
            return Ok(());
        };
        // A zombie (killed, not yet reaped) counts as gone.
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"));
        let gone = match &stat {
            Err(_) => true,
            Ok(s) => s
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next())
                .is_some_and(|state| state == "Z" || state == "X"),
        };
        if gone {
            return Err(CommError::PeerGone {
                transport: "shm",
                peer: self.rank,
                channel: self.channel,
                reason: format!("its process {pid} has exited"),
            });
        }
        Ok(())
    }
}

/// The receiving end: this rank's own segment.
#[derive(Debug)]
pub struct ShmRecv {
    seg: Segment,
    tail_seen: u64,
    /// The mailbox sequence (header step + 1) last reported.
    header_seen: u64,
    peer: Peer,
    /// The sender's bell, rung after returning credit.
    peer_bell: Bell,
}

impl RecvEnd for ShmRecv {
    fn poll(&mut self) -> Result<Option<Event>> {
        let tail = self.seg.tail().load();
        if tail > self.tail_seen {
            self.peer.idle = 0;
            // The acquire load of `tail` makes the mailbox written before
            // it visible.
            let seq = self.seg.call_header_seq().load();
            if seq != self.header_seen && seq != 0 && seq - 1 < tail {
                self.header_seen = seq;
                let bytes = self.seg.read_call_header();
                let repr =
                    CallHeaderRepr::parse(&CallHeader::new_unchecked(&bytes[..])).map_err(|e| {
                        CommError::Core {
                            channel: Some(self.peer.channel),
                            call: "CallHeaderRepr::parse",
                            source: ringcc_core::Error::Wire(e),
                        }
                    })?;
                return Ok(Some(Event::Header {
                    step: seq - 1,
                    desc: repr.desc,
                }));
            }
            self.tail_seen = tail;
            return Ok(Some(Event::Tail(tail)));
        }
        self.peer.idle_check()?;
        Ok(None)
    }

    fn slot(&self, slot: SlotIndex, len: usize) -> Result<&[u8]> {
        let s = self.seg.slot(slot)?;
        // SAFETY: the engine asks only for slots of steps below the `tail`
        // this end reported (loaded with acquire) and above the `head` it
        // posted, which the sender does not write until credited; the
        // slice borrows `self`, so it ends before `post_head` can run.
        Ok(unsafe { s.as_slice(len) }?)
    }

    fn post_head(&mut self, head: u64) -> Result<()> {
        self.seg.head().post(head);
        self.peer_bell.ring();
        Ok(())
    }
}

/// The sending end: the successor's segment, mapped here.
#[derive(Debug)]
pub struct ShmSend {
    seg: Segment,
    head_seen: u64,
    peer: Peer,
    /// The receiver's bell, rung after posting `tail`.
    peer_bell: Bell,
}

impl SendEnd for ShmSend {
    fn poll(&mut self) -> Result<Option<Event>> {
        let head = self.seg.head().load();
        if head > self.head_seen {
            self.peer.idle = 0;
            self.head_seen = head;
            return Ok(Some(Event::Head(head)));
        }
        self.peer.idle_check()?;
        Ok(None)
    }

    fn slot_mut(&mut self, slot: SlotIndex, len: usize) -> Result<&mut [u8]> {
        let s = self.seg.slot(slot)?;
        // SAFETY: the engine hands out a send span only for steps the
        // successor has credited (`head` loaded with acquire) and not yet
        // published by a `tail`, so the receiver does not read the slot
        // meanwhile; the slice borrows `self` mutably, so no other slice
        // into the segment is alive at the same time.
        Ok(unsafe { s.as_mut_slice(len) }?)
    }

    fn post(
        &mut self,
        _seq: u64,
        span: SlotSpan,
        header: Option<&[u8; CALL_HEADER_LEN]>,
        _bytes: usize,
    ) -> Result<()> {
        if let Some(h) = header {
            self.seg.post_call_header(span.step + 1, h);
        }
        // Release: the header and the bytes before the counter.
        self.seg.tail().post(span.end());
        self.peer_bell.ring();
        Ok(())
    }
}
