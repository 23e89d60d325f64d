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
//! Under LL and LL128 ([`SendEnd::begin`]) the sender writes the slice
//! as lines carrying their own arrival into the receiver's line slots and
//! posts no `tail`; the receiver tells the ways apart per step
//! (`shm_lines.rs`). Credit and the call header travel as under Simple.
//!
//! A peer killed mid-call is noticed two ways: the job's abort notice (the
//! store sees its connection close) and, here, the process table — an
//! idle end checks now and then that the peer's process still exists
//! (when both run in the same PID namespace).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ringcc_comm::peer::{pid_namespace, PeerProcess};
use ringcc_comm::transport::{Hop, Job, PeerInfo, RecvEnd, SendEnd, Transport};
use ringcc_comm::Error as CommError;
use ringcc_core::prim::SlotSpan;
use ringcc_core::progress::Event;
use ringcc_core::wire::call_header::CALL_HEADER_LEN;
use ringcc_core::{Protocol, Rank, SlotIndex};

use crate::shm_lines::{LineRecv, LineSend};
use crate::{Bell, Segment, SegmentName};

/// The longest nap while waiting for a peer to map a segment.
const NAP: Duration = Duration::from_micros(200);

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
            peer: PeerProcess::new(
                "shm",
                hop.receiver,
                hop.channel,
                watchable_pid(job, hop.receiver),
            ),
            peer_bell: Bell::open(job.token, hop.receiver, job.deadline)?,
            lines: LineSend::new(),
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
            peer: PeerProcess::new(
                "shm",
                hop.sender,
                hop.channel,
                watchable_pid(job, hop.sender),
            ),
            peer_bell: Bell::open(job.token, hop.sender, job.deadline)?,
            lines: LineRecv::new(),
        }))
    }
}

/// The receiving end: this rank's own segment.
#[derive(Debug)]
pub struct ShmRecv {
    seg: Segment,
    peer: PeerProcess,
    /// The sender's bell, rung after returning credit.
    peer_bell: Bell,
    /// Steps that came as LL / LL128 lines.
    lines: LineRecv,
}

impl RecvEnd for ShmRecv {
    fn poll(&mut self) -> Result<Option<Event>> {
        let tail = self
            .lines
            .arrived(&self.seg, self.peer.tail_seen(), self.peer.channel)?;
        let seg = &self.seg;
        let event = self.peer.poll_tail(
            tail,
            || seg.call_header_seq().load(),
            || seg.read_call_header(),
        )?;
        if let Some(Event::Tail(_)) = event {
            self.lines.reported();
        }
        Ok(event)
    }

    fn slot(&self, slot: SlotIndex, len: usize) -> Result<&[u8]> {
        if let Some(decoded) = self.lines.slot(slot, len) {
            return decoded;
        }
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
    peer: PeerProcess,
    /// The receiver's bell, rung after posting `tail`.
    peer_bell: Bell,
    /// The current call's protocol and its staging slots.
    lines: LineSend,
}

impl SendEnd for ShmSend {
    fn poll(&mut self) -> Result<Option<Event>> {
        let head = self.seg.head().load();
        self.peer.poll_head(head)
    }

    fn begin(&mut self, protocol: Protocol) {
        self.lines.set(protocol);
    }

    fn slot_mut(&mut self, slot: SlotIndex, len: usize) -> Result<&mut [u8]> {
        if self.lines.active() {
            return self.lines.slot_mut(&self.seg, slot, len);
        }
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
        if self.lines.active() {
            // The lines carry their own arrival (each store a release,
            // after the header's): no `tail`.
            self.lines.post(&self.seg, span, self.peer.channel)?;
            self.peer_bell.ring();
            return Ok(());
        }
        // Release: the header and the bytes before the counter.
        self.seg.tail().post(span.end());
        self.peer_bell.ring();
        Ok(())
    }
}
