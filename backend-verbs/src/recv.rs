//! The receiving end of a hop: a queue pair from the predecessor, the
//! registered FIFO it writes slices into (lent to the executor in place,
//! [`RecvEnd::slot`]) and the mailbox it writes call headers into.
//!
//! A slice's last write carries its end step as the immediate; its
//! receive completion plus the mailbox become [`Event::Header`] (when the
//! mailbox holds this slice's header) and [`Event::Tail`] through the
//! core's [`arrival`]. Credit goes back as the core's
//! [`credit_write`]; a send queue without room keeps the latest `head`
//! (credits are cumulative) until completions make room.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ringcc_comm::transport::{FifoMemory, Hop, RecvEnd};
use ringcc_comm::Error as CommError;
use ringcc_core::fifo::FifoGeometry;
use ringcc_core::progress::Event;
use ringcc_core::protocol::post::{credit_write, RemoteCounter};
use ringcc_core::protocol::{arrival, Kind, WrId};
use ringcc_core::wire::call_header::CALL_HEADER_LEN;
use ringcc_core::wire::{Completion, WorkRequest};
use ringcc_core::SlotIndex;
use tracing::debug;

use crate::config::Fault;
use crate::error::{Error, Result};
use crate::exchange::{RecvRecord, RemoteBuf, SendRecord};
use crate::ib::cq::{CqChannel, Cqs};
use crate::ib::mem::HostBuf;
use crate::ib::nic::Nic;
use crate::ib::qp::{Init, Qp, QpAddr, Reset, RetryParams, Rts, RQ_DEPTH, SQ_DEPTH};
use crate::inflight::Outstanding;
use crate::send::{check, fifo_buf, recvs, REMOTE};
use crate::wake::Waker;

type CommResult<T> = std::result::Result<T, CommError>;

/// How long a closing end waits for its last credits to be acknowledged
/// (the predecessor's call finishes only with them).
const DRAIN: Duration = Duration::from_secs(2);

/// A receiving end whose queue pair is not connected yet.
pub(crate) struct RecvHalf {
    qp: Qp<Init>,
    fifo: HostBuf,
    mailbox: HostBuf,
    cqs: Cqs,
    addr: QpAddr,
    hop: Hop,
    geometry: FifoGeometry,
}

impl RecvHalf {
    /// A queue pair in INIT on `nic` with its data receives posted, the
    /// FIFO (`lent`, else memory of its own) and the mailbox registered
    /// for remote write.
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
    ) -> Result<RecvHalf> {
        let cqs = Cqs::new(nic, channel, SQ_DEPTH, RQ_DEPTH)?;
        let qp = Qp::<Reset>::create(nic, &cqs.send, &cqs.recv, psn)?;
        let addr = qp.addr(nic);
        let mut qp = qp.init()?;
        qp.post_recvs(recvs(Kind::TailRecv, hop))?;
        // SAFETY: the caller's contract.
        let fifo = unsafe { fifo_buf(nic, &geometry, lent, REMOTE) }?;
        let mailbox = HostBuf::new(&nic.pd, CALL_HEADER_LEN, REMOTE, &nic.name)?;
        Ok(RecvHalf {
            qp,
            fifo,
            mailbox,
            cqs,
            addr,
            hop,
            geometry,
        })
    }

    /// What the sender needs: the queue pair, the FIFO and the mailbox
    /// (with `fault`'s corruption, for the tests).
    pub fn record(&self, fault: Option<Fault>) -> RecvRecord {
        let mut fifo_rkey = self.fifo.rkey();
        if fault == Some(Fault::CorruptFifoRkey) {
            fifo_rkey ^= 0x8000_0000;
        }
        RecvRecord {
            qp: self.addr,
            fifo: RemoteBuf {
                addr: self.fifo.addr(),
                rkey: fifo_rkey,
                capacity: self.fifo.len() as u64,
            },
            mailbox: RemoteBuf {
                addr: self.mailbox.addr(),
                rkey: self.mailbox.rkey(),
                capacity: self.mailbox.len() as u64,
            },
        }
    }

    /// Connects to the sender `theirs` describes (RTR, RTS).
    pub fn connect(
        self,
        theirs: &SendRecord,
        local_mtu: u32,
        retry: RetryParams,
        waker: Arc<Waker>,
    ) -> CommResult<VerbsRecv> {
        let qp = self
            .qp
            .rtr(&theirs.qp, local_mtu)
            .and_then(|qp| qp.rts(retry))
            .map_err(|e| e.into_comm("accept"))?;
        let slot_bytes = usize::try_from(self.geometry.slot_bytes())
            .map_err(|_| CommError::Internal("verbs: a slot beyond memory".into()))?;
        Ok(VerbsRecv {
            qp,
            fifo: self.fifo,
            mailbox: self.mailbox,
            cqs: self.cqs,
            _waker: waker,
            hop: self.hop,
            geometry: self.geometry,
            slot_bytes,
            counter: theirs.counter(),
            out: Outstanding::default(),
            credit_waits: None,
            tail_seen: 0,
            events: VecDeque::new(),
            wcs: Vec::with_capacity(16),
            failed: false,
        })
    }
}

/// The receiving end of a connected hop.
///
/// Field order is drop order: the queue pair goes first, so nothing lands
/// in the FIFO or the mailbox once they are deregistered and freed; the
/// waker goes last.
pub(crate) struct VerbsRecv {
    qp: Qp<Rts>,
    fifo: HostBuf,
    mailbox: HostBuf,
    cqs: Cqs,
    _waker: Arc<Waker>,
    hop: Hop,
    geometry: FifoGeometry,
    slot_bytes: usize,
    /// The predecessor's credit counter.
    counter: RemoteCounter,
    out: Outstanding,
    /// A credit return that waits for room on the send queue: the latest
    /// `head`.
    credit_waits: Option<u64>,
    tail_seen: u64,
    /// Arrivals not yet reported (a header and its tail come together).
    events: VecDeque<Event>,
    wcs: Vec<Completion>,
    /// A completion failed: the queue pair is broken, closing does not
    /// wait for it.
    failed: bool,
}

impl VerbsRecv {
    fn internal(&self, what: String) -> CommError {
        crate::send::internal(self.hop.channel, what)
    }

    /// Takes the send queue's completions (credit returns retired).
    fn reap(&mut self) -> CommResult<()> {
        let mut wcs = std::mem::take(&mut self.wcs);
        wcs.clear();
        let mut r = self
            .cqs
            .poll_send(&mut wcs)
            .map_err(|e| e.into_comm("ibv_poll_cq"));
        for wc in wcs.iter() {
            if r.is_err() {
                break;
            }
            r = check(wc, Kind::Credit, self.hop, self.hop.sender)
                .map_err(|e| e.into_comm("credit return"));
            let ours = matches!(
                WrId::decode(wc.wr_id),
                Some(WrId {
                    kind: Kind::Credit,
                    ..
                })
            );
            if r.is_ok() && !(ours && self.out.completed(wc.wr_id)) {
                r = Err(self.internal(format!("an unexpected send completion {:#x}", wc.wr_id)));
            }
        }
        self.wcs = wcs;
        self.failed |= r.is_err();
        r
    }

    /// Posts credit `head` now (the send queue has room).
    fn post_credit(&mut self, head: u64) -> CommResult<()> {
        let wr_id = WrId::new(Kind::Credit, self.hop.channel.0, head as u32).encode();
        let wr: WorkRequest<1> = credit_write(head, &self.counter, wr_id)
            .map_err(|e| Error::core("credit_write")(e).into_comm("post_head"))?;
        // SAFETY: the payload is inline; no local memory is referenced.
        let n = unsafe { self.qp.post_writes([wr]) }.map_err(|e| e.into_comm("ibv_post_send"))?;
        self.out.posted(wr_id, n);
        Ok(())
    }

    /// Posts the credit that waited for room, if there is room now.
    fn flush(&mut self) -> CommResult<()> {
        if let Some(head) = self.credit_waits {
            if self.out.has_room(1, SQ_DEPTH) {
                self.credit_waits = None;
                self.post_credit(head)?;
            }
        }
        Ok(())
    }

    /// Takes the receive queue's completions: each a slice's arrival.
    fn arrivals(&mut self) -> CommResult<()> {
        let mut wcs = std::mem::take(&mut self.wcs);
        wcs.clear();
        let mut r = self
            .cqs
            .poll_recv(&mut wcs)
            .map_err(|e| e.into_comm("ibv_poll_cq"));
        for wc in wcs.iter() {
            if r.is_err() {
                break;
            }
            r = self.arrival(wc);
        }
        self.wcs = wcs;
        self.failed |= r.is_err();
        r
    }

    fn arrival(&mut self, wc: &Completion) -> CommResult<()> {
        check(wc, Kind::TailRecv, self.hop, self.hop.sender)
            .and_then(|()| self.qp.post_recvs([wc.wr_id]))
            .map_err(|e| e.into_comm("data receive"))?;
        let imm = wc
            .imm
            .ok_or_else(|| self.internal("a slice without an immediate".into()))?;
        // The header (if this slice carries one) was written before the
        // data, and RC delivers in order: it is in the mailbox now. The
        // next call's header cannot have replaced it yet: the sender
        // finishes a call only once every slice of it was credited.
        let mailbox: [u8; CALL_HEADER_LEN] = self
            .mailbox
            .read_array(0)
            .ok_or_else(|| self.internal("a mailbox shorter than a header".into()))?;
        let a = arrival(
            imm,
            self.tail_seen,
            self.geometry.slots_per_slice(),
            &mailbox,
        );
        if let Some((step, desc)) = a.header {
            debug!(channel = self.hop.channel.0, step, call = %desc, "verbs: call header");
            self.events.push_back(Event::Header { step, desc });
        }
        self.tail_seen = a.tail;
        self.events.push_back(Event::Tail(a.tail));
        Ok(())
    }
}

impl RecvEnd for VerbsRecv {
    fn poll(&mut self) -> CommResult<Option<Event>> {
        if let Some(e) = self.events.pop_front() {
            return Ok(Some(e));
        }
        self.reap()?;
        self.flush()?;
        self.arrivals()?;
        Ok(self.events.pop_front())
    }

    fn slot(&self, slot: SlotIndex, len: usize) -> CommResult<&[u8]> {
        if len > self.slot_bytes {
            return Err(self.internal(format!("{len} B of a {} B slot", self.slot_bytes)));
        }
        let at = u64::from(slot.0).saturating_mul(self.slot_bytes as u64);
        // SAFETY: the engine asks only for slots of steps below the `tail`
        // this end reported and not yet credited back, which the
        // predecessor writes again only after our credit; the slice
        // borrows `self`, so it ends before `post_head` can run.
        unsafe { self.fifo.bytes(at, len) }
            .ok_or_else(|| self.internal(format!("slot {} beyond the FIFO", slot.0)))
    }

    fn post_head(&mut self, head: u64) -> CommResult<()> {
        if self.credit_waits.is_some() || !self.out.has_room(1, SQ_DEPTH) {
            self.credit_waits = Some(head);
            return Ok(());
        }
        self.post_credit(head)
    }
}

impl Drop for VerbsRecv {
    /// Sees the last credits out: the predecessor's call finishes only
    /// once they arrive, and a queue pair destroyed first may never send
    /// them. Bounded; skipped when the queue pair already failed.
    fn drop(&mut self) {
        let t0 = Instant::now();
        while !self.failed && t0.elapsed() < DRAIN {
            if self.flush().and_then(|()| self.reap()).is_err() {
                break;
            }
            if self.credit_waits.is_none() && self.out.is_empty() {
                break;
            }
            std::thread::sleep(Duration::from_micros(100));
        }
    }
}
