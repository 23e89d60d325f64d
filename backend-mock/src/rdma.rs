//! The simulator's RDMA transport (payload mode): the connection protocol
//! of `ringcc_core::protocol`, unpatched, as the verbs backend runs it:
//! registered buffers and connected queue pairs at setup; a finished SEND
//! slice becomes `SliceWrites` (call header, data, the
//! `tail`-publishing immediate) from the staging slot into the successor's
//! FIFO; a credit becomes an inline WRITE WITH IMMEDIATE of the `head`
//! counter; completions become engine events: the receiver learns its `tail`
//! from the immediate and the call header from its mailbox, the sender its
//! `head` from the counter.

use ringcc_core::prim::Exec;
use ringcc_core::protocol::post::{
    credit_write, decode_credit, LocalBuf, RemoteCounter, RemoteFifo, RemoteHeader, SliceWrites,
    CREDIT_LEN,
};
use ringcc_core::protocol::{arrival, Kind, WrId};
use ringcc_core::wire::call_header::CALL_HEADER_LEN;
use ringcc_core::wire::{Completion, Lkey, Psn, Qpn, Rkey, WcOpcode};
use ringcc_core::{ChannelId, Rank};

use crate::error::Error;
use crate::fabric::Hop;
use crate::faults::{ConnId, Rng};
use crate::memory::Memory;
use crate::rnic::qp::QpError;
use crate::rnic::{Qp, Role, QPN_BASE};
use crate::sim::Sim;

fn post_error(rank: Rank, channel: ChannelId, e: QpError) -> Error {
    match e {
        QpError::Format(source) => Error::Wire {
            rank,
            channel,
            call: "WqeRepr::from_request",
            source,
        },
        QpError::SqFull => Error::Post {
            rank,
            channel,
            what: "send queue full",
        },
        _ => Error::Post {
            rank,
            channel,
            what: "queue pair not ready to send",
        },
    }
}

/// A random first PSN, near the wrap point for every other queue pair so
/// that runs cross it.
fn first_psn(rng: &mut Rng) -> Psn {
    let r = rng.next_u64() as u32;
    if r & 1 == 0 {
        Psn::new(0xff_f000 | (r >> 8) & 0xfff)
    } else {
        Psn::new(r >> 8)
    }
}

impl<const N: usize> Sim<N> {
    /// Registers every lane's buffers and connects a queue pair per RDMA
    /// connection: RESET → INIT → RTR → RTS, receives posted.
    pub(crate) fn setup_payload(&mut self) -> Result<(), Error> {
        let mut rng = Rng::new(self.cfg.seed ^ 0x6b65_7973);
        let fifo = self.cfg.geometry.fifo_bytes() as usize;
        for l in 0..self.lanes.len() {
            let t = self.fab.lanes[l as usize];
            let pred = self.fab.lane(t.channel, t.prev);
            let m = &mut self.lanes.cold[l as usize].mem;
            match self.fab.lanes[pred as usize].hop {
                Hop::Loopback => {}
                Hop::Nvlink { .. } => m.inbox = self.mem.alloc(t.rank, fifo),
                Hop::Net { .. } => {
                    m.inbox = self.mem.alloc(t.rank, fifo);
                    m.inbox_key = self.mem.register(t.rank, m.inbox, fifo, true, &mut rng);
                    m.mailbox = self.mem.alloc(t.rank, CALL_HEADER_LEN);
                    m.mailbox_key =
                        self.mem
                            .register(t.rank, m.mailbox, CALL_HEADER_LEN, true, &mut rng);
                }
            }
            if let Hop::Net { .. } = t.hop {
                m.staging = self.mem.alloc(t.rank, fifo);
                m.staging_key = self.mem.register(t.rank, m.staging, fifo, false, &mut rng);
                m.counter = self.mem.alloc(t.rank, CREDIT_LEN);
                m.counter_key = self
                    .mem
                    .register(t.rank, m.counter, CREDIT_LEN, true, &mut rng);
            }
        }
        self.mem.commit();
        let mtu = self.cfg.path_mtu()?;
        let (sq, rq) = (self.cfg.rnic.sq_depth, self.cfg.rnic.rq_depth);
        let setup_err = |what| Error::BadConfig {
            what: format!("queue pair setup: {what:?}"),
        };
        for l in 0..self.lanes.len() {
            let t = self.fab.lanes[l as usize];
            let Hop::Net { tx, rx, .. } = t.hop else {
                continue;
            };
            let succ = self.fab.lane(t.channel, t.next);
            let a = self.nic.qps.len() as u32;
            let b = a + 1;
            let (qa, qb) = (Qpn::new(QPN_BASE + a), Qpn::new(QPN_BASE + b));
            let mut qpa = Qp::new(qa, t.rank, tx, l, Role::Sender);
            let mut qpb = Qp::new(qb, t.next, rx, succ, Role::Receiver);
            let (pa, pb) = (first_psn(&mut rng), first_psn(&mut rng));
            qpa.modify_init(sq, rq).map_err(setup_err)?;
            qpb.modify_init(sq, rq).map_err(setup_err)?;
            qpa.modify_rtr(b, rx, qb, mtu, pb).map_err(setup_err)?;
            qpb.modify_rtr(a, tx, qa, mtu, pa).map_err(setup_err)?;
            qpa.modify_rts(pa).map_err(setup_err)?;
            qpb.modify_rts(pb).map_err(setup_err)?;
            for i in 0..u64::from(rq) {
                // The core's ids, as verbs posts them: the sender's queue
                // pair receives credits, the receiver's slices.
                let ch = t.channel as u8;
                qpa.post_recv(WrId::new(Kind::CreditRecv, ch, i as u32).encode())
                    .map_err(setup_err)?;
                qpb.post_recv(WrId::new(Kind::TailRecv, ch, i as u32).encode())
                    .map_err(setup_err)?;
            }
            self.nic.qps.push(qpa);
            self.nic.qps.push(qpb);
            let m = &mut self.lanes.cold[l as usize].mem;
            m.qp_tx = a;
            m.qp_rx = b;
        }
        Ok(())
    }

    /// Posts the work requests of lane `l`'s finished SEND slice.
    pub(crate) fn post_slice(&mut self, l: u32, e: &Exec) -> Result<(), Error> {
        let t = self.fab.lanes[l as usize];
        let (Hop::Net { .. }, Some(span)) = (t.hop, e.send) else {
            return Ok(());
        };
        let g = self.cfg.geometry;
        let succ = self.fab.lane(t.channel, t.next);
        let m = self.lanes.cold[l as usize].mem;
        let sm = self.lanes.cold[succ as usize].mem;
        let local = LocalBuf {
            addr: Memory::va(t.rank, m.staging) + span.byte_offset(&g),
            lkey: Lkey(m.staging_key),
        };
        let me = ConnId {
            channel: t.channel_id(),
            rank: t.rank_id(),
        };
        let (rkey, addr) = self.faults.remote(
            me,
            sm.inbox_key,
            Memory::va(t.next, sm.inbox),
            g.fifo_bytes(),
        );
        let fifo = RemoteFifo {
            addr,
            rkey: Rkey(rkey),
            capacity: g.fifo_bytes(),
        };
        let mailbox = RemoteHeader {
            addr: Memory::va(t.next, sm.mailbox),
            rkey: Rkey(sm.mailbox_key),
            capacity: CALL_HEADER_LEN as u64,
        };
        let dtype = self.run.calls[t.rank as usize].dtype;
        let wr_id = WrId::new(Kind::Data, t.channel as u8, span.end() as u32).encode();
        let writes = SliceWrites::<1>::new(e, &g, dtype, local, &fifo, &mailbox, wr_id).map_err(
            |source| Error::Wire {
                rank: t.rank_id(),
                channel: t.channel_id(),
                call: "SliceWrites::new",
                source,
            },
        )?;
        for wr in writes {
            self.nic.qps[m.qp_tx as usize]
                .post_send(&wr)
                .map_err(|e| post_error(t.rank_id(), t.channel_id(), e))?;
            self.stats.work_requests += 1;
        }
        self.ring_doorbell(m.qp_tx);
        Ok(())
    }

    /// Posts lane `l`'s credit `head` to its predecessor lane `pred`.
    pub(crate) fn post_credit(&mut self, l: u32, pred: u32, head: u64) -> Result<(), Error> {
        let t = self.fab.lanes[l as usize];
        let Hop::Net { .. } = self.fab.lanes[pred as usize].hop else {
            return Ok(());
        };
        let pm = self.lanes.cold[pred as usize].mem;
        let counter = RemoteCounter {
            addr: Memory::va(t.prev, pm.counter),
            rkey: Rkey(pm.counter_key),
        };
        let wr = credit_write::<1>(
            head,
            &counter,
            WrId::new(Kind::Credit, t.channel as u8, head as u32).encode(),
        )
        .map_err(|source| Error::Wire {
            rank: t.rank_id(),
            channel: t.channel_id(),
            call: "credit_write",
            source,
        })?;
        self.nic.qps[pm.qp_rx as usize]
            .post_send(&wr)
            .map_err(|e| post_error(t.rank_id(), t.channel_id(), e))?;
        self.stats.work_requests += 1;
        self.ring_doorbell(pm.qp_rx);
        Ok(())
    }

    /// Hands every pending completion to its progress loop.
    pub(crate) fn drain_cq(&mut self) {
        while let Some((qp, wc)) = self.nic.cq.pop_front() {
            self.stats.completions += 1;
            self.on_completion(qp, wc);
        }
    }

    fn on_completion(&mut self, qp: u32, wc: Completion) {
        let q = &self.nic.qps[qp as usize];
        let (l, role, qpn) = (q.lane, q.role, q.qpn.get());
        if !self.running(l) {
            return;
        }
        let t = self.fab.lanes[l as usize];
        if !wc.is_ok() {
            let request = match (role, wc.opcode.is_recv()) {
                (Role::Sender, false) => "data write",
                (Role::Receiver, false) => "credit return",
                (Role::Sender, true) => "credit receive",
                (Role::Receiver, true) => "data receive",
            };
            tracing::debug!(rank = t.rank, channel = t.channel, status = ?wc.status, request, "completion error");
            let err = Error::Completion {
                rank: t.rank_id(),
                channel: t.channel_id(),
                request,
                status: wc.status,
                qpn,
            };
            self.fail_lane(l, err);
            return;
        }
        if wc.opcode != WcOpcode::RecvRdmaWithImm {
            return;
        }
        let _ = self.nic.qps[qp as usize].post_recv(wc.wr_id);
        let m = self.lanes.cold[l as usize].mem;
        match role {
            Role::Receiver => {
                let Some(imm) = wc.imm.filter(|_| wc.is_ok()) else {
                    return;
                };
                let sps = self.cfg.geometry.slots_per_slice();
                let mailbox = self.mem.read(t.rank, m.mailbox, CALL_HEADER_LEN);
                let a = arrival(imm, self.lanes.cold[l as usize].recv_tail, sps, mailbox);
                self.lanes.cold[l as usize].recv_tail = a.tail;
                self.deliver_tail(l, a.header, a.tail);
            }
            Role::Sender => {
                let bytes = self.mem.read(t.rank, m.counter, CREDIT_LEN);
                let word: [u8; CREDIT_LEN] = bytes.try_into().unwrap_or([0; CREDIT_LEN]);
                self.on_head(l, decode_credit(word));
            }
        }
    }
}
