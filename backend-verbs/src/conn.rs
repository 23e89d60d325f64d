//! One channel's two connections: to the successor (we write data into
//! its FIFO; it writes credit into our counter) and from the predecessor
//! (it writes data into our FIFO; we write credit into its counter).
//!
//! Built in two halves: a half owns a queue pair in INIT with its
//! registered buffers and describes itself ([`SendEnd`] / [`RecvEnd`]) for
//! the rendezvous; given the peer's description it connects (RTR, RTS).

use std::collections::VecDeque;

use ringcc_core::fifo::{FifoGeometry, STEPS};
use ringcc_core::protocol::post::{RemoteCounter, RemoteFifo, RemoteHeader, CREDIT_LEN};
use ringcc_core::wire::call_header::CALL_HEADER_LEN;
use ringcc_core::wire::Rkey;
use ringcc_core::{ChannelId, Rank};
use serde::{Deserialize, Serialize};
use sideway::ibverbs::AccessFlags;

use crate::config::Fault;
use crate::error::Result;
use crate::ib::cq::EventCqs;
use crate::ib::mem::HostBuf;
use crate::ib::nic::Nic;
use crate::ib::qp::{Init, Qp, QpAddr, Reset, RetryParams, Rts, RQ_DEPTH};
use ringcc_core::protocol::{Kind, WrId};

/// The description of a sending end, for the successor.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SendEnd {
    pub qp: QpAddr,
    pub counter_addr: u64,
    pub counter_rkey: u32,
}

/// The description of a receiving end, for the predecessor.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RecvEnd {
    pub qp: QpAddr,
    pub fifo_addr: u64,
    pub fifo_rkey: u32,
    pub fifo_capacity: u64,
    pub mailbox_addr: u64,
    pub mailbox_rkey: u32,
    pub mailbox_capacity: u64,
}

/// Both ends of one channel of one rank (`None` on a one-rank ring).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ChannelEnds {
    pub send: Option<SendEnd>,
    pub recv: Option<RecvEnd>,
}

/// Signaled requests in flight on one send queue, in posting order.
#[derive(Default)]
pub(crate) struct Outstanding {
    /// (wr_id of the signaled request, requests it retires)
    queue: VecDeque<(u64, u32)>,
    /// Requests posted and not yet retired.
    pub in_flight: u32,
}

impl Outstanding {
    pub fn posted(&mut self, wr_id: u64, requests: u32) {
        self.queue.push_back((wr_id, requests));
        self.in_flight = self.in_flight.saturating_add(requests);
    }

    /// A signaled completion with `wr_id` arrived; false if it was not the
    /// oldest outstanding one (a queue-pair bug or a foreign id).
    pub fn completed(&mut self, wr_id: u64) -> bool {
        match self.queue.front() {
            Some(&(id, n)) if id == wr_id => {
                self.queue.pop_front();
                self.in_flight = self.in_flight.saturating_sub(n);
                true
            }
            _ => false,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }
}

/// Our connection to the successor.
pub(crate) struct SendConn {
    pub peer: Rank,
    pub nic: usize,
    pub qp: Qp<Rts>,
    pub fifo: RemoteFifo,
    pub mailbox: RemoteHeader,
    /// The successor's `head`, written by it (big-endian).
    pub counter: HostBuf,
    /// Results of `recvReduceSend`, slot `s` for FIFO step `s mod 8`.
    pub staging: HostBuf,
    pub out: Outstanding,
    /// End step of the last data slice whose write completed.
    pub sent_done: u64,
}

/// Our connection from the predecessor.
pub(crate) struct RecvConn {
    pub peer: Rank,
    pub qp: Qp<Rts>,
    pub fifo: HostBuf,
    pub mailbox: HostBuf,
    /// The predecessor's credit counter.
    pub counter: RemoteCounter,
    pub out: Outstanding,
}

/// A sending end before it is connected.
pub(crate) struct SendHalf {
    peer: Rank,
    nic: usize,
    qp: Qp<Init>,
    counter: HostBuf,
    staging: HostBuf,
    addr: QpAddr,
}

/// A receiving end before it is connected.
pub(crate) struct RecvHalf {
    peer: Rank,
    qp: Qp<Init>,
    fifo: HostBuf,
    mailbox: HostBuf,
    addr: QpAddr,
}

const REMOTE: AccessFlags = AccessFlags::LocalWrite.or(AccessFlags::RemoteWrite);

fn fifo_len(g: &FifoGeometry) -> usize {
    usize::try_from(g.fifo_bytes()).unwrap_or(usize::MAX)
}

fn recvs(kind: Kind, channel: ChannelId) -> impl Iterator<Item = u64> {
    (0..RQ_DEPTH).map(move |_| WrId::new(kind, channel.0, 0).encode())
}

impl SendHalf {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        channel: ChannelId,
        peer: Rank,
        nic_index: usize,
        nic: &Nic,
        cqs: &EventCqs,
        geometry: &FifoGeometry,
        psn: u32,
    ) -> Result<SendHalf> {
        let qp = Qp::<Reset>::create(nic, &cqs.send, &cqs.recv, psn)?;
        let addr = qp.addr(nic);
        let mut qp = qp.init()?;
        // Credits arrive as WRITE WITH IMMEDIATE: each takes a receive.
        qp.post_recvs(recvs(Kind::CreditRecv, channel))?;
        let counter = HostBuf::new(&nic.pd, CREDIT_LEN, REMOTE, &nic.name)?;
        let staging = HostBuf::new(&nic.pd, fifo_len(geometry), AccessFlags::none(), &nic.name)?;
        Ok(SendHalf {
            peer,
            nic: nic_index,
            qp,
            counter,
            staging,
            addr,
        })
    }

    pub fn end(&self) -> SendEnd {
        SendEnd {
            qp: self.addr,
            counter_addr: self.counter.addr(),
            counter_rkey: self.counter.rkey(),
        }
    }

    pub fn connect(self, remote: &RecvEnd, nic: &Nic, t: RetryParams) -> Result<SendConn> {
        let qp = self.qp.rtr(&remote.qp, nic.active_mtu)?.rts(t)?;
        Ok(SendConn {
            peer: self.peer,
            nic: self.nic,
            qp,
            fifo: RemoteFifo {
                addr: remote.fifo_addr,
                rkey: Rkey(remote.fifo_rkey),
                capacity: remote.fifo_capacity,
            },
            mailbox: RemoteHeader {
                addr: remote.mailbox_addr,
                rkey: Rkey(remote.mailbox_rkey),
                capacity: remote.mailbox_capacity,
            },
            counter: self.counter,
            staging: self.staging,
            out: Outstanding::default(),
            sent_done: 0,
        })
    }
}

impl RecvHalf {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        channel: ChannelId,
        peer: Rank,
        nic: &Nic,
        cqs: &EventCqs,
        geometry: &FifoGeometry,
        psn: u32,
    ) -> Result<RecvHalf> {
        let qp = Qp::<Reset>::create(nic, &cqs.send, &cqs.recv, psn)?;
        let addr = qp.addr(nic);
        let mut qp = qp.init()?;
        qp.post_recvs(recvs(Kind::TailRecv, channel))?;
        let fifo = HostBuf::new(&nic.pd, fifo_len(geometry), REMOTE, &nic.name)?;
        let mailbox = HostBuf::new(&nic.pd, CALL_HEADER_LEN, REMOTE, &nic.name)?;
        Ok(RecvHalf {
            peer,
            qp,
            fifo,
            mailbox,
            addr,
        })
    }

    pub fn end(&self, fault: Option<Fault>) -> RecvEnd {
        let mut fifo_rkey = self.fifo.rkey();
        if fault == Some(Fault::CorruptFifoRkey) {
            fifo_rkey ^= 0x8000_0000;
        }
        RecvEnd {
            qp: self.addr,
            fifo_addr: self.fifo.addr(),
            fifo_rkey,
            fifo_capacity: self.fifo.len() as u64,
            mailbox_addr: self.mailbox.addr(),
            mailbox_rkey: self.mailbox.rkey(),
            mailbox_capacity: self.mailbox.len() as u64,
        }
    }

    pub fn connect(self, remote: &SendEnd, nic: &Nic, t: RetryParams) -> Result<RecvConn> {
        let qp = self.qp.rtr(&remote.qp, nic.active_mtu)?.rts(t)?;
        Ok(RecvConn {
            peer: self.peer,
            qp,
            fifo: self.fifo,
            mailbox: self.mailbox,
            counter: RemoteCounter {
                addr: remote.counter_addr,
                rkey: Rkey(remote.counter_rkey),
            },
            out: Outstanding::default(),
        })
    }
}

/// Whether the staging slots of a send span starting at `step` are free:
/// every slice that used them (8 steps earlier) has completed.
pub(crate) fn staging_free(sent_done: u64, step: u64, slots: u64) -> bool {
    sent_done >= step.saturating_add(slots).saturating_sub(STEPS)
}
