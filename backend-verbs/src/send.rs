//! The sending end of a hop: a queue pair to the successor, a registered
//! staging copy of the successor's FIFO that the executor writes into
//! ([`SendEnd::slot_mut`]), and the credit counter the successor writes.
//!
//! [`SendEnd::post`] hands the core protocol's work requests for the
//! slice ([`SliceWrites`]: the call header inline into the mailbox, then
//! the slots' bytes from staging, the last write WITH IMMEDIATE carrying
//! the new `tail`) to the queue pair as they are. A call of at least
//! [`LEND_MIN`] bytes lends the end its buffers ([`SendEnd::lend`]): they
//! are registered for the call (read only, one registration per buffer
//! and device, [`Leases`]), and a slice that lies in them — a send of the
//! input, or of what the slice wrote to the output — leaves from there
//! ([`SendEnd::post_from`]) instead of a staging copy; the call settles
//! by waiting for those writes' completions. A send queue without
//! room keeps them, in order, until completions make room
//! ([`SendEnd::poll`] posts them): nothing is dropped. The successor's
//! credit arrives as a WRITE WITH IMMEDIATE (the immediate: the low half
//! of its `head`), reported as [`Event::Head`].

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ringcc_comm::transport::{post_staged, FifoMemory, Hop, SendEnd};
use ringcc_comm::Error as CommError;
use ringcc_core::fifo::FifoGeometry;
use ringcc_core::prim::{Exec, SlotSpan};
use ringcc_core::progress::Event;
use ringcc_core::protocol::post::{
    widen_step, LocalBuf, RemoteFifo, RemoteHeader, SliceWrites, CREDIT_LEN,
};
use ringcc_core::protocol::{Kind, WrId};
use ringcc_core::wire::call_header::{CallHeader, CallHeaderRepr, CALL_HEADER_LEN};
use ringcc_core::wire::{Completion, Lkey, WorkRequest};
use ringcc_core::{ChunkId, Primitive, SlotIndex};
use sideway::ibverbs::AccessFlags;

use crate::error::{Error, Result};
use crate::exchange::{RecvRecord, RemoteBuf, SendRecord};
use crate::ib::cq::{status_name, CqChannel, Cqs};
use crate::ib::mem::{HostBuf, Lease, Leases};
use crate::ib::nic::Nic;
use crate::ib::qp::{Init, Qp, QpAddr, Reset, RetryParams, Rts, RQ_DEPTH, SQ_DEPTH};
use crate::inflight::{Outstanding, StagingUse};
use crate::wake::Waker;
use tracing::debug;

type CommResult<T> = std::result::Result<T, CommError>;

/// The smallest call (its buffers' bytes together) whose buffers are
/// registered to send from ([`SendEnd::lend`]). Registering pins the
/// pages (tens of µs per MiB, on Soft-RoCE as on hardware) and costs a
/// system call or two; copying into staging costs about ten times that
/// per byte on the host, and on Soft-RoCE, where the host's CPU is also
/// the NIC, those copies were a tenth of a 16 MiB AllReduce's time.
/// Below a MiB the fixed cost is about the copies' own.
pub const LEND_MIN: usize = 1 << 20;

/// Memory a peer writes into.
pub(crate) const REMOTE: AccessFlags = AccessFlags::LocalWrite.or(AccessFlags::RemoteWrite);

/// Posted receives, each taken by one WRITE WITH IMMEDIATE of `kind`.
pub(crate) fn recvs(kind: Kind, hop: Hop) -> impl Iterator<Item = u64> {
    (0..RQ_DEPTH).map(move |_| WrId::new(kind, hop.channel.0, 0).encode())
}

/// A FIFO's bytes (slots × slot size) as a length.
pub(crate) fn fifo_len(g: &FifoGeometry) -> usize {
    usize::try_from(g.fifo_bytes()).unwrap_or(usize::MAX)
}

/// A FIFO of `g` registered on `nic` with `access`: the memory `lent`
/// (which must hold it), else a buffer of its own.
///
/// # Safety
/// `lent`'s contract ([`FifoMemory::new`]).
pub(crate) unsafe fn fifo_buf(
    nic: &Nic,
    g: &FifoGeometry,
    lent: Option<FifoMemory>,
    access: AccessFlags,
) -> Result<HostBuf> {
    match lent {
        // SAFETY: the caller's contract.
        Some(mem) if mem.holds(g) => unsafe { HostBuf::lent(&nic.pd, mem, access, &nic.name) },
        Some(mem) => Err(Error::Verbs {
            call: if mem.device().is_some() {
                "ibv_reg_dmabuf_mr"
            } else {
                "ibv_reg_mr"
            },
            device: nic.name.clone(),
            source: format!(
                "{} B of lent memory for a {} B FIFO",
                mem.len(),
                g.fifo_bytes()
            )
            .into(),
        }),
        None => HostBuf::new(&nic.pd, fifo_len(g), access, &nic.name),
    }
}

/// A completion's status as a typed error (`None`: success).
pub(crate) fn check(wc: &Completion, kind: Kind, hop: Hop, peer: ringcc_core::Rank) -> Result<()> {
    if wc.is_ok() {
        return Ok(());
    }
    Err(Error::Completion {
        what: kind.what(),
        channel: hop.channel,
        peer,
        status: wc.status.code(),
        status_name: status_name(wc.status),
    })
}

/// A sending end whose queue pair is not connected yet.
pub(crate) struct SendHalf {
    qp: Qp<Init>,
    leases: Arc<Leases>,
    counter: HostBuf,
    staging: HostBuf,
    cqs: Cqs,
    addr: QpAddr,
    hop: Hop,
    geometry: FifoGeometry,
}

impl SendHalf {
    /// A queue pair in INIT on `nic` with its credit receives posted, the
    /// credit counter (remote write) and staging (`lent`, else memory of
    /// its own; local access) registered.
    ///
    /// # Safety
    /// `lent`'s contract ([`FifoMemory::new`]).
    pub unsafe fn new(
        nic: &Nic,
        channel: &CqChannel,
        geometry: FifoGeometry,
        hop: Hop,
        psn: u32,
        lent: Option<FifoMemory>,
    ) -> Result<SendHalf> {
        let cqs = Cqs::new(nic, channel, SQ_DEPTH, RQ_DEPTH)?;
        let qp = Qp::<Reset>::create(nic, &cqs.send, &cqs.recv, psn)?;
        let addr = qp.addr(nic);
        let mut qp = qp.init()?;
        qp.post_recvs(recvs(Kind::CreditRecv, hop))?;
        let counter = HostBuf::new(&nic.pd, CREDIT_LEN, REMOTE, &nic.name)?;
        // SAFETY: the caller's contract.
        let staging = unsafe { fifo_buf(nic, &geometry, lent, AccessFlags::none()) }?;
        Ok(SendHalf {
            qp,
            leases: Arc::clone(&nic.leases),
            counter,
            staging,
            cqs,
            addr,
            hop,
            geometry,
        })
    }

    /// What the receiver needs: the queue pair, the credit counter.
    pub fn record(&self) -> SendRecord {
        SendRecord {
            qp: self.addr,
            counter: RemoteBuf {
                addr: self.counter.addr(),
                rkey: self.counter.rkey(),
                capacity: self.counter.len() as u64,
            },
        }
    }

    /// Connects to the receiver `theirs` describes (RTR, RTS).
    pub fn connect(
        self,
        theirs: &RecvRecord,
        local_mtu: u32,
        retry: RetryParams,
        waker: Arc<Waker>,
        slot_wait: Duration,
    ) -> CommResult<VerbsSend> {
        let hop = self.hop;
        let fifo = self.geometry.fifo_bytes();
        if theirs.fifo.capacity < fifo || theirs.mailbox.capacity < CALL_HEADER_LEN as u64 {
            return Err(CommError::Protocol {
                transport: "verbs",
                peer: hop.receiver,
                channel: hop.channel,
                reason: format!(
                    "it advertises a {} B FIFO and a {} B mailbox; the job's FIFO is {fifo} B",
                    theirs.fifo.capacity, theirs.mailbox.capacity
                ),
            });
        }
        let qp = self
            .qp
            .rtr(&theirs.qp, local_mtu)
            .and_then(|qp| qp.rts(retry))
            .map_err(|e| e.into_comm("connect"))?;
        let slot_bytes = usize::try_from(self.geometry.slot_bytes())
            .map_err(|_| CommError::Internal("verbs: a slot beyond memory".into()))?;
        Ok(VerbsSend {
            qp,
            loans: Vec::new(),
            leases: self.leases,
            _counter: self.counter,
            staging: self.staging,
            cqs: self.cqs,
            _waker: waker,
            hop,
            geometry: self.geometry,
            slot_bytes,
            fifo: theirs.fifo(),
            mailbox: theirs.mailbox(),
            out: Outstanding::default(),
            staged: StagingUse::default(),
            waiting: VecDeque::new(),
            head_seen: 0,
            wcs: Vec::with_capacity(16),
            slot_wait,
        })
    }
}

/// The sending end of a connected hop.
///
/// Field order is drop order: the queue pair goes first, so no request
/// still reads staging or lent memory (or lands in the counter) when the
/// buffers are deregistered and freed; the waker goes last.
pub(crate) struct VerbsSend {
    qp: Qp<Rts>,
    /// The running call's buffers, registered ([`SendEnd::lend`]).
    loans: Vec<Lease>,
    leases: Arc<Leases>,
    /// The successor's `head`, written by it (the protocol's target;
    /// we read the immediates that come with it).
    _counter: HostBuf,
    /// Slot `s` holds the slice of FIFO step `s mod 8` until its write
    /// completed.
    staging: HostBuf,
    cqs: Cqs,
    _waker: Arc<Waker>,
    hop: Hop,
    geometry: FifoGeometry,
    slot_bytes: usize,
    fifo: RemoteFifo,
    mailbox: RemoteHeader,
    out: Outstanding,
    staged: StagingUse,
    /// Slices formed but not yet posted (the send queue was full), in
    /// order.
    waiting: VecDeque<(u64, Vec<WorkRequest<1>>)>,
    head_seen: u64,
    wcs: Vec<Completion>,
    /// How long a staging slot may stay read by a write the successor
    /// has already credited (its completion is on its way).
    slot_wait: Duration,
}

/// A fault of this end's own bookkeeping on `channel`.
pub(crate) fn internal(channel: ringcc_core::ChannelId, what: String) -> CommError {
    CommError::Internal(format!("verbs, channel {channel}: {what}"))
}

impl VerbsSend {
    fn internal(&self, what: String) -> CommError {
        internal(self.hop.channel, what)
    }

    /// Takes the send queue's completions: data writes retired, their
    /// staging slots free again.
    fn reap(&mut self) -> CommResult<()> {
        let mut wcs = std::mem::take(&mut self.wcs);
        wcs.clear();
        let r = self.reap_from(&mut wcs);
        self.wcs = wcs;
        r
    }

    fn reap_from(&mut self, wcs: &mut Vec<Completion>) -> CommResult<()> {
        self.cqs
            .poll_send(wcs)
            .map_err(|e| e.into_comm("ibv_poll_cq"))?;
        for wc in wcs.iter() {
            check(wc, Kind::Data, self.hop, self.hop.receiver)
                .map_err(|e| e.into_comm("data write"))?;
            match WrId::decode(wc.wr_id) {
                Some(WrId {
                    kind: Kind::Data,
                    low,
                    ..
                }) if self.out.completed(wc.wr_id) => self.staged.completed(low),
                _ => {
                    return Err(
                        self.internal(format!("an unexpected send completion {:#x}", wc.wr_id))
                    )
                }
            }
        }
        Ok(())
    }

    /// Posts the slices that waited for room, as far as there is room.
    fn flush(&mut self) -> CommResult<()> {
        while let Some((_, wrs)) = self.waiting.front() {
            if !self.out.has_room(wrs.len() as u32, SQ_DEPTH) {
                break;
            }
            if let Some((wr_id, wrs)) = self.waiting.pop_front() {
                self.post_now(wr_id, wrs)?;
            }
        }
        Ok(())
    }

    fn post_now(
        &mut self,
        wr_id: u64,
        wrs: impl IntoIterator<Item = WorkRequest<1>>,
    ) -> CommResult<()> {
        // SAFETY: every gather entry names staging (registered under its
        // lkey, owned by this end and freed only after the queue pair is
        // destroyed: field order) or lent memory (registered under its
        // lkey; the lender keeps it valid and unwritten until `settle`,
        // which waits for these writes or deregisters it first);
        // `slot_mut` lends a staging slot only once the write reading it
        // has completed (`StagingUse`).
        let n = unsafe { self.qp.post_writes(wrs) }.map_err(|e| e.into_comm("ibv_post_send"))?;
        self.out.posted(wr_id, n);
        Ok(())
    }

    /// Waits until no write reads staging slot `slot` (its completion is
    /// due: the successor has credited the step).
    fn wait_staging(&mut self, slot: SlotIndex) -> CommResult<()> {
        self.wait_until(
            |s| s.staged.is_free(slot),
            || format!("that read staging slot {}", slot.0),
        )
    }

    /// Reaps and flushes until `done` holds, yielding in between; a write
    /// that takes longer than [`slot_wait`](VerbsSend::slot_wait) to
    /// complete (`which`) is a timeout.
    fn wait_until(
        &mut self,
        done: impl Fn(&VerbsSend) -> bool,
        which: impl Fn() -> String,
    ) -> CommResult<()> {
        let t0 = Instant::now();
        while !done(self) {
            self.reap()?;
            self.flush()?;
            if t0.elapsed() > self.slot_wait {
                return Err(CommError::Timeout {
                    waiting_for: format!(
                        "verbs: the write to rank {} on channel {} {} to complete",
                        self.hop.receiver,
                        self.hop.channel,
                        which()
                    ),
                    after: t0.elapsed(),
                });
            }
            std::thread::yield_now();
        }
        Ok(())
    }

    /// Posts the slice at `span` (`bytes` from `local`: staging when
    /// `staged`, else lent memory) with its call header when given.
    fn post_local(
        &mut self,
        span: SlotSpan,
        header: Option<&[u8; CALL_HEADER_LEN]>,
        (local, staged): (LocalBuf, bool),
        bytes: usize,
    ) -> CommResult<()> {
        let desc = match header {
            Some(h) => {
                let repr = CallHeader::new_checked(&h[..])
                    .and_then(|v| CallHeaderRepr::parse(&v))
                    .map_err(|e| Error::core("CallHeaderRepr::parse")(e).into_comm("post"))?;
                Some(repr.desc)
            }
            None => None,
        };
        // The core forms a slice's requests from the engine's `Exec`; the
        // send span, the byte count and the header are all it reads.
        let exec = Exec {
            primitive: Primitive::SEND,
            chunk: ChunkId(0),
            loop_index: 0,
            step_index: 0,
            slice: 0,
            input_offset: 0,
            output_offset: 0,
            count: bytes as u64,
            recv: None,
            send: Some(span),
            header: desc,
        };
        let wr_id = WrId::new(Kind::Data, self.hop.channel.0, span.end() as u32).encode();
        let writes = SliceWrites::<1>::new(
            &exec,
            &self.geometry,
            ringcc_core::DataType::U8,
            local,
            &self.fifo,
            &self.mailbox,
            wr_id,
        )
        .map_err(|e| Error::core("SliceWrites::new")(e).into_comm("post"))?;
        if staged {
            self.staged.posted(span.step, span.end());
        }
        let n = writes.len() as u32;
        if self.waiting.is_empty() && self.out.has_room(n, SQ_DEPTH) {
            self.post_now(wr_id, writes)
        } else {
            self.waiting.push_back((wr_id, writes.collect()));
            Ok(())
        }
    }
}

impl SendEnd for VerbsSend {
    fn poll(&mut self) -> CommResult<Option<Event>> {
        self.reap()?;
        self.flush()?;
        let mut wcs = std::mem::take(&mut self.wcs);
        wcs.clear();
        let polled = self.cqs.poll_recv(&mut wcs);
        let mut head = self.head_seen;
        let mut r = polled.map_err(|e| e.into_comm("ibv_poll_cq"));
        for wc in wcs.iter() {
            if r.is_err() {
                break;
            }
            r = check(wc, Kind::CreditRecv, self.hop, self.hop.receiver)
                .and_then(|()| self.qp.post_recvs([wc.wr_id]))
                .map_err(|e| e.into_comm("credit receive"));
            // The immediate is the low half of the successor's `head`
            // (exact; the counter it also wrote could be read mid-write).
            match wc.imm {
                Some(imm) => head = head.max(widen_step(imm, self.head_seen)),
                None if r.is_ok() => r = Err(self.internal("a credit without an immediate".into())),
                None => {}
            }
        }
        self.wcs = wcs;
        r?;
        if head > self.head_seen {
            self.head_seen = head;
            return Ok(Some(Event::Head(head)));
        }
        Ok(None)
    }

    fn slot_mut(&mut self, slot: SlotIndex, len: usize) -> CommResult<&mut [u8]> {
        if len > self.slot_bytes {
            return Err(self.internal(format!("{len} B into a {} B slot", self.slot_bytes)));
        }
        if !self.staged.is_free(slot) {
            self.wait_staging(slot)?;
        }
        let at = u64::from(slot.0).saturating_mul(self.slot_bytes as u64);
        // The error is made only when needed (this runs for every slot
        // sent); the closure cannot borrow `self`, which the slice does.
        let channel = self.hop.channel;
        // SAFETY: staging has no remote access, and no posted write reads
        // this slot (checked just above); the slice borrows `self`
        // mutably, so it ends before `post` hands the slot to the NIC.
        unsafe { self.staging.bytes_mut(at, len) }
            .ok_or_else(|| internal(channel, format!("slot {} beyond staging", slot.0)))
    }

    fn post(
        &mut self,
        _seq: u64,
        span: SlotSpan,
        header: Option<&[u8; CALL_HEADER_LEN]>,
        bytes: usize,
    ) -> CommResult<()> {
        let local = LocalBuf {
            addr: self
                .staging
                .addr()
                .wrapping_add(span.byte_offset(&self.geometry)),
            lkey: Lkey(self.staging.lkey()),
        };
        self.post_local(span, header, (local, true), bytes)
    }

    /// From lent memory when `data` lies in it (and is cut into slots as
    /// this end's are), else copied into staging.
    fn post_from(
        &mut self,
        seq: u64,
        span: SlotSpan,
        header: Option<&[u8; CALL_HEADER_LEN]>,
        data: &[u8],
        slot_bytes: usize,
    ) -> CommResult<()> {
        match self.loans.iter().find_map(|l| l.lkey_of(data)) {
            Some(lkey) if slot_bytes == self.slot_bytes => {
                let local = LocalBuf {
                    addr: data.as_ptr() as u64,
                    lkey: Lkey(lkey),
                };
                self.post_local(span, header, (local, false), data.len())
            }
            _ => post_staged(self, seq, span, header, data, slot_bytes),
        }
    }

    /// Registers the call's buffers when the call is large enough
    /// ([`LEND_MIN`]); a registration that fails leaves the call to
    /// staging, as for a small one.
    unsafe fn lend(&mut self, regions: &[&[u8]]) -> CommResult<bool> {
        self.loans.clear();
        let total = regions
            .iter()
            .fold(0usize, |t, r| t.saturating_add(r.len()));
        if total < LEND_MIN {
            return Ok(false);
        }
        for r in regions.iter().filter(|r| !r.is_empty()) {
            // SAFETY: the caller's contract (`SendEnd::lend`) is the
            // lease's: the memory stays valid until `settle` or drop,
            // which end the loans after the writes reading them.
            match unsafe { self.leases.lease(r) } {
                Ok(lease) => self.loans.push(lease),
                Err(e) => {
                    debug!(
                        channel = self.hop.channel.0,
                        "verbs: sending from staging: {e}"
                    );
                    self.loans.clear();
                    return Ok(false);
                }
            }
        }
        Ok(true)
    }

    /// Waits for every write posted so far (those from lent memory among
    /// them; the successor has credited them all, their completions are
    /// due), then drops the registrations. Without `drain` (the call
    /// failed) it drops them at once, with the slices still waiting for
    /// room: the NIC can no longer read the memory through them.
    fn settle(&mut self, drain: bool) -> CommResult<()> {
        if self.loans.is_empty() {
            return Ok(());
        }
        let r = if drain {
            self.wait_until(
                |s| s.out.is_empty() && s.waiting.is_empty(),
                || "that read the call's buffers".into(),
            )
        } else {
            self.waiting.clear();
            Ok(())
        };
        self.loans.clear();
        r
    }
}
