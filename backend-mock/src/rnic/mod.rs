//! The software RNIC (payload mode): RC queue pairs on NIC ports.
//!
//! What a real RNIC does, in the order the seed describes it:
//!
//! 1. `post_send` writes the work request as an mlx5 WQE (formatted with
//!    `ringcc_core::wire::mlx5`) into the send queue, and rings the
//!    doorbell ([`qp`]).
//! 2. After the doorbell latency the NIC fetches the WQEs, parses them
//!    back, checks the local key and bounds of every gather entry and
//!    DMA-reads the bytes; each message gets consecutive PSNs and is cut at
//!    the path MTU (`wire::segment`) ([`tx`]).
//! 3. The port puts one packet at a time on the wire (round robin over its
//!    queue pairs, ACKs first), each a whole RoCEv2 frame
//!    (Ethernet/IPv4/UDP 4791/BTH/RETH/ImmDt/payload/ICRC, emitted and
//!    later parsed with `wire::roce`), through the fault wrapper
//!    ([`frame`], [`tx`]).
//! 4. The responder parses the frame (ICRC checked), runs the go-back-N
//!    PSN check, checks the remote key, bounds and access of the region,
//!    DMA-writes the payload, consumes a receive for an immediate, and
//!    ACKs the messages' last packets, re-ACKs duplicates, NAKs gaps,
//!    access errors and empty receive queues ([`rx`]).
//! 5. The requester retires messages on ACKs (completions for the
//!    signaled ones), goes back on a sequence NAK or a timeout, and fails
//!    with `RETRY_EXC_ERR` after `retry_cnt` retries, `REM_ACCESS_ERR` on
//!    an access NAK, flushing the rest ([`tx`]).

pub(crate) mod frame;
pub(crate) mod qp;
pub(crate) mod rx;
pub(crate) mod tx;

use std::collections::VecDeque;

use ringcc_core::wire::Completion;

use crate::events::Slab;

pub(crate) use qp::{Qp, Role};

/// A NIC port's packet scheduler.
#[derive(Debug)]
pub(crate) struct NicPort {
    pub mac: [u8; 6],
    pub ip: [u8; 4],
    /// Queue pairs with packets to send, served round robin.
    pub rr: VecDeque<u32>,
    /// ACK / NAK frames to send first.
    pub ctrl: VecDeque<CtrlFrame>,
    /// A `PortTx` event is pending.
    pub tx_scheduled: bool,
}

impl NicPort {
    pub fn new(node: u32, nic: u16) -> NicPort {
        let n = node.to_be_bytes();
        NicPort {
            mac: [0x02, 0x00, n[2], n[3], (nic >> 8) as u8, nic as u8],
            ip: [10, n[2].wrapping_add(1), n[3], (nic as u8).wrapping_add(1)],
            rr: VecDeque::new(),
            ctrl: VecDeque::new(),
            tx_scheduled: false,
        }
    }
}

/// An ACK or NAK waiting for its port. It is counted in
/// [`Stats`](crate::Stats) when it leaves the port, where the capture
/// records it, not when it is queued: the run can end with some still
/// queued (the last messages' ACKs, which no rank waits for), and those go
/// out, and count, in the next run.
#[derive(Debug)]
pub(crate) struct CtrlFrame {
    /// The frame.
    pub bytes: Vec<u8>,
    /// The destination port.
    pub to: u32,
    /// A NAK (sequence error, fatal error, receiver not ready) rather than
    /// an ACK.
    pub nak: bool,
}

/// A frame on the wire.
#[derive(Debug)]
pub(crate) struct Frame {
    pub to_port: u32,
    pub bytes: Vec<u8>,
}

/// QPNs start here (the low ones are reserved on real devices).
pub(crate) const QPN_BASE: u32 = 0x100;

/// All RNICs of the cluster.
#[derive(Debug)]
pub(crate) struct Rnic {
    pub qps: Vec<Qp>,
    pub ports: Vec<NicPort>,
    pub frames: Slab<Frame>,
    /// Completions for the progress loops, in the order they happened.
    pub cq: VecDeque<(u32, Completion)>,
}

impl Rnic {
    pub fn new(ports: Vec<NicPort>) -> Rnic {
        Rnic {
            qps: Vec::new(),
            ports,
            frames: Slab::new(),
            cq: VecDeque::new(),
        }
    }

    /// The queue pair with number `qpn`.
    pub fn by_qpn(&self, qpn: u32) -> Option<u32> {
        let i = qpn.checked_sub(QPN_BASE)?;
        (i < self.qps.len() as u32).then_some(i)
    }
}
