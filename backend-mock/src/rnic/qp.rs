//! A reliable-connected queue pair: its state machine
//! (RESET → INIT → RTR → RTS, any → ERROR), its send queue of formatted
//! mlx5 WQEs, its receive queue, and its requester and responder state.

use std::collections::VecDeque;

use ringcc_core::wire::mlx5::WqeRepr;
use ringcc_core::wire::segment::{PathMtu, PsnChecker, Segmenter};
use ringcc_core::wire::{Psn, Qpn, WorkRequest, WrOpcode};

use crate::events::Ps;

/// `enum ibv_qp_state`, the states this RNIC uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum QpState {
    Reset,
    Init,
    /// Ready to receive: the responder works.
    Rtr,
    /// Ready to send: the requester works too.
    Rts,
    /// Failed: everything is dropped or flushed.
    Error,
}

/// Which end of a ring connection a queue pair is: the data sender
/// (requester of data, responder of credits) or the data receiver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    Sender,
    Receiver,
}

/// Bytes of one send-queue entry: two 64-byte basic blocks, enough for
/// control + remote address + a 64-byte inline segment.
pub(crate) const WQE_BYTES: usize = 128;

/// A message the NIC has fetched and is sending.
#[derive(Debug)]
pub(crate) struct Msg {
    pub seg: Segmenter,
    pub first: Psn,
    pub packets: u32,
    pub data: Vec<u8>,
    pub wr_id: u64,
    pub opcode: WrOpcode,
    pub signaled: bool,
    /// When its first packet first left (for the trace).
    pub tx_start: Ps,
}

impl Msg {
    pub fn last(&self) -> Psn {
        self.first.add(self.packets.saturating_sub(1))
    }
}

/// Where the responder is writing the current message.
#[derive(Clone, Copy, Debug)]
pub(crate) struct WriteCtx {
    /// Arena offset of the next byte.
    pub offset: usize,
    pub remaining: u64,
    pub total: u32,
}

/// Why a queue-pair operation was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum QpError {
    BadTransition,
    NotReady,
    SqFull,
    RqFull,
    Format(ringcc_core::wire::Error),
}

#[derive(Debug)]
pub(crate) struct Qp {
    pub qpn: Qpn,
    pub rank: u32,
    pub port: u32,
    /// The lane whose progress loop owns this queue pair.
    pub lane: u32,
    pub role: Role,
    pub state: QpState,
    /// The connected queue pair (index) and its port.
    pub peer: u32,
    pub peer_port: u32,
    pub dest_qpn: Qpn,
    pub mtu: PathMtu,
    pub sq_depth: u32,
    pub rq_depth: u32,
    // Send queue: WQE bytes per entry, the driver's wr_id per entry.
    sq: Vec<[u8; WQE_BYTES]>,
    sq_len: Vec<u16>,
    sq_wr_id: Vec<u64>,
    /// Producer index (work requests posted).
    pub pi: u32,
    /// Work requests the NIC fetched.
    pub fetched: u32,
    /// Work requests completed or flushed.
    pub retired: u32,
    /// WQE index in 64-byte basic blocks (the control segment's field).
    bb_index: u16,
    // Requester.
    pub msgs: VecDeque<Msg>,
    /// PSN of the next message's first packet.
    pub next_psn: Psn,
    /// Oldest unacknowledged PSN.
    pub una: Psn,
    /// Next PSN to transmit.
    pub tx: Psn,
    /// Next PSN never transmitted.
    pub high: Psn,
    pub queued: bool,
    pub retries: u8,
    pub timer: Option<Ps>,
    pub timer_event: bool,
    pub rnr_until: Option<Ps>,
    // Responder.
    pub checker: PsnChecker,
    pub rq: VecDeque<u64>,
    pub write: Option<WriteCtx>,
    pub msn: u32,
}

impl Qp {
    /// A queue pair in RESET.
    pub fn new(qpn: Qpn, rank: u32, port: u32, lane: u32, role: Role) -> Qp {
        Qp {
            qpn,
            rank,
            port,
            lane,
            role,
            state: QpState::Reset,
            peer: u32::MAX,
            peer_port: u32::MAX,
            dest_qpn: Qpn::new(0),
            mtu: PathMtu::Mtu4096,
            sq_depth: 0,
            rq_depth: 0,
            sq: Vec::new(),
            sq_len: Vec::new(),
            sq_wr_id: Vec::new(),
            pi: 0,
            fetched: 0,
            retired: 0,
            bb_index: 0,
            msgs: VecDeque::new(),
            next_psn: Psn::new(0),
            una: Psn::new(0),
            tx: Psn::new(0),
            high: Psn::new(0),
            queued: false,
            retries: 0,
            timer: None,
            timer_event: false,
            rnr_until: None,
            checker: PsnChecker::new(Psn::new(0)),
            rq: VecDeque::new(),
            write: None,
            msn: 0,
        }
    }

    /// RESET → INIT: queue sizes.
    pub fn modify_init(&mut self, sq_depth: u32, rq_depth: u32) -> Result<(), QpError> {
        if self.state != QpState::Reset {
            return Err(QpError::BadTransition);
        }
        self.sq_depth = sq_depth;
        self.rq_depth = rq_depth;
        self.sq = vec![[0; WQE_BYTES]; sq_depth as usize];
        self.sq_len = vec![0; sq_depth as usize];
        self.sq_wr_id = vec![0; sq_depth as usize];
        self.state = QpState::Init;
        Ok(())
    }

    /// INIT → RTR: the remote queue pair, the path MTU and the first PSN
    /// expected from it.
    pub fn modify_rtr(
        &mut self,
        peer: u32,
        peer_port: u32,
        dest_qpn: Qpn,
        mtu: PathMtu,
        rq_psn: Psn,
    ) -> Result<(), QpError> {
        if self.state != QpState::Init {
            return Err(QpError::BadTransition);
        }
        self.peer = peer;
        self.peer_port = peer_port;
        self.dest_qpn = dest_qpn;
        self.mtu = mtu;
        self.checker = PsnChecker::new(rq_psn);
        self.state = QpState::Rtr;
        Ok(())
    }

    /// RTR → RTS: the first PSN to send.
    pub fn modify_rts(&mut self, sq_psn: Psn) -> Result<(), QpError> {
        if self.state != QpState::Rtr {
            return Err(QpError::BadTransition);
        }
        self.next_psn = sq_psn;
        self.una = sq_psn;
        self.tx = sq_psn;
        self.high = sq_psn;
        self.state = QpState::Rts;
        Ok(())
    }

    /// Work requests posted and not yet retired.
    pub fn in_flight(&self) -> u32 {
        self.pi.wrapping_sub(self.retired)
    }

    /// `ibv_post_send` of one request: formats it as an mlx5 WQE into the
    /// next send-queue entry (the doorbell is rung separately).
    pub fn post_send(&mut self, wr: &WorkRequest<1>) -> Result<(), QpError> {
        if self.state != QpState::Rts {
            return Err(QpError::NotReady);
        }
        if self.in_flight() >= self.sq_depth {
            return Err(QpError::SqFull);
        }
        let repr = WqeRepr::from_request(wr, self.qpn, self.bb_index).map_err(QpError::Format)?;
        let len = repr.buffer_len().map_err(QpError::Format)?;
        let i = (self.pi % self.sq_depth) as usize;
        let slot = &mut self.sq[i];
        let out = slot
            .get_mut(..len)
            .ok_or(QpError::Format(ringcc_core::wire::Error::Exhausted))?;
        repr.emit(out).map_err(QpError::Format)?;
        self.sq_len[i] = len as u16;
        self.sq_wr_id[i] = wr.wr_id;
        self.bb_index = self.bb_index.wrapping_add((len / 64) as u16);
        self.pi = self.pi.wrapping_add(1);
        Ok(())
    }

    /// The WQE bytes and wr_id of send-queue entry `index` (a producer
    /// count).
    pub fn sq_entry(&self, index: u32) -> (&[u8], u64) {
        let i = (index % self.sq_depth.max(1)) as usize;
        let len = usize::from(self.sq_len.get(i).copied().unwrap_or(0));
        let bytes = self.sq.get(i).and_then(|s| s.get(..len)).unwrap_or(&[]);
        (bytes, self.sq_wr_id.get(i).copied().unwrap_or(0))
    }

    /// `ibv_post_recv`.
    pub fn post_recv(&mut self, wr_id: u64) -> Result<(), QpError> {
        if matches!(self.state, QpState::Reset | QpState::Error) {
            return Err(QpError::NotReady);
        }
        if self.rq.len() as u32 >= self.rq_depth {
            return Err(QpError::RqFull);
        }
        self.rq.push_back(wr_id);
        Ok(())
    }

    /// Whether `psn` lies in `[una, next_psn]`.
    pub fn in_window(&self, psn: Psn) -> bool {
        self.una.distance_to(psn) <= self.una.distance_to(self.next_psn)
    }

    /// Whether the requester has a packet to put on the wire now.
    pub fn has_packet(&self, now: Ps) -> bool {
        self.state == QpState::Rts
            && self.tx != self.next_psn
            && self.rnr_until.is_none_or(|t| t <= now)
    }

    /// The message holding `psn`, and the packet's index in it.
    pub fn msg_of(&self, psn: Psn) -> Option<(usize, u32)> {
        self.msgs.iter().enumerate().find_map(|(i, m)| {
            let d = m.first.distance_to(psn);
            (d < m.packets).then_some((i, d))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringcc_core::wire::{RemoteAddr, Rkey};

    #[test]
    fn state_machine_and_queues() {
        let mut q = Qp::new(Qpn::new(0x100), 0, 0, 0, Role::Sender);
        let wr = WorkRequest::<1>::inline_write(
            1,
            &[1, 2, 3, 4],
            RemoteAddr {
                addr: 0x1000,
                rkey: Rkey(7),
            },
        )
        .unwrap();
        assert_eq!(q.post_send(&wr), Err(QpError::NotReady));
        assert_eq!(q.modify_rts(Psn::new(1)), Err(QpError::BadTransition));
        q.modify_init(8, 8).unwrap();
        assert_eq!(q.modify_init(8, 8), Err(QpError::BadTransition));
        q.modify_rtr(1, 1, Qpn::new(0x101), PathMtu::Mtu1024, Psn::new(5))
            .unwrap();
        assert_eq!(q.post_send(&wr), Err(QpError::NotReady));
        q.modify_rts(Psn::new(0xff_fffe)).unwrap();
        for _ in 0..8 {
            q.post_send(&wr).unwrap();
        }
        assert_eq!(q.post_send(&wr), Err(QpError::SqFull));
        let (bytes, id) = q.sq_entry(3);
        assert_eq!(id, 1);
        assert_eq!(bytes.len(), 64);
        for i in 0..8 {
            q.post_recv(i).unwrap();
        }
        assert_eq!(q.post_recv(9), Err(QpError::RqFull));
        assert!(q.in_window(Psn::new(0xff_fffe)));
        assert!(!q.in_window(Psn::new(0)));
    }
}
