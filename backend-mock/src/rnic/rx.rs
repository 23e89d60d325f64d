//! The responder: frame arrival, parse (ICRC), PSN check, key / bounds /
//! access check, DMA write, receive consumption, ACK / NAK.

use ringcc_core::wire::roce::{NakCode, Opcode, RocePacketRepr, Syndrome};
use ringcc_core::wire::segment::{PsnChecker, PsnVerdict};
use ringcc_core::wire::{Completion, Psn, WcOpcode, WcStatus};

use super::frame::ack_frame;
use super::qp::{QpState, WriteCtx};
use super::CtrlFrame;
use crate::sim::Sim;

fn is_write(op: Opcode) -> bool {
    matches!(
        op,
        Opcode::WriteFirst
            | Opcode::WriteMiddle
            | Opcode::WriteLast
            | Opcode::WriteLastWithImm
            | Opcode::WriteOnly
            | Opcode::WriteOnlyWithImm
    )
}

impl<const N: usize> Sim<N> {
    /// A frame reaches its destination port.
    pub(crate) fn on_packet(&mut self, frame: u32) {
        let now = self.events.now();
        let Some(f) = self.nic.frames.take(frame) else {
            return;
        };
        let port = f.to_port;
        if !self.faults.nics.up(port, now) {
            self.stats.dropped += 1;
            return;
        }
        let Ok(p) = RocePacketRepr::parse(&f.bytes) else {
            self.stats.dropped += 1;
            return;
        };
        let qp = self.nic.by_qpn(p.bth.dest_qpn.get()).filter(|&q| {
            let q = &self.nic.qps[q as usize];
            q.port == port && self.faults.ranks.alive(q.rank, now)
        });
        let (Some(qp), true) = (qp, p.ip.dst == self.nic.ports[port as usize].ip) else {
            self.stats.dropped += 1;
            return;
        };
        if p.bth.opcode == Opcode::Acknowledge {
            if let Some(aeth) = p.aeth {
                self.on_ack(qp, p.bth.psn, aeth);
            }
        } else {
            self.on_request(qp, &p);
        }
    }

    fn on_request(&mut self, qp: u32, p: &RocePacketRepr<'_>) {
        let q = &mut self.nic.qps[qp as usize];
        if !matches!(q.state, QpState::Rtr | QpState::Rts) {
            self.stats.dropped += 1;
            return;
        }
        match q.checker.receive(p.bth.psn) {
            PsnVerdict::Accept => self.accept(qp, p),
            PsnVerdict::Duplicate => {
                if p.bth.ack_req {
                    let last = q.checker.expected().sub(1);
                    self.send_ack(qp, last, Syndrome::ACK_UNLIMITED);
                }
            }
            PsnVerdict::Nak { expected } => {
                self.send_ack(qp, expected, Syndrome::Nak(NakCode::PsnSequenceError));
            }
            PsnVerdict::Drop => {}
        }
    }

    /// The expected packet: carry it out.
    fn accept(&mut self, qp: u32, p: &RocePacketRepr<'_>) {
        let op = p.bth.opcode;
        let psn = p.bth.psn;
        let q = &mut self.nic.qps[qp as usize];
        let rank = q.rank;
        if !is_write(op) {
            return self.nak_fatal(qp, psn, NakCode::InvalidRequest);
        }
        let imm = p.imm.map(|i| i.imm);
        if op.ends_message() && imm.is_some() && q.rq.is_empty() {
            // Receiver not ready: expect this packet again after the
            // requester's back-off.
            q.checker = PsnChecker::new(psn);
            return self.send_ack(qp, psn, Syndrome::RnrNak { timer: 1 });
        }
        if op.starts_message() {
            let Some(reth) = p.reth else {
                return self.nak_fatal(qp, psn, NakCode::InvalidRequest);
            };
            let len = u64::from(reth.dma_len);
            // IBTA: a zero-length RDMA WRITE checks no key.
            let offset = if len == 0 {
                Ok(0)
            } else {
                self.mem.check(rank, reth.rkey.get(), reth.va, len, true)
            };
            let Ok(offset) = offset else {
                tracing::debug!(rank, rkey = reth.rkey.get(), "remote access error");
                return self.nak_fatal(qp, psn, NakCode::RemoteAccessError);
            };
            self.nic.qps[qp as usize].write = Some(WriteCtx {
                offset,
                remaining: len,
                total: reth.dma_len,
            });
        }
        let q = &mut self.nic.qps[qp as usize];
        let Some(mut w) = q.write else {
            return self.nak_fatal(qp, psn, NakCode::InvalidRequest);
        };
        let len = p.payload.len() as u64;
        let last = op.ends_message();
        if len > w.remaining || (last && len != w.remaining) {
            return self.nak_fatal(qp, psn, NakCode::InvalidRequest);
        }
        self.mem.write(rank, w.offset, p.payload);
        w.offset += len as usize;
        w.remaining -= len;
        let q = &mut self.nic.qps[qp as usize];
        if last {
            q.write = None;
            q.msn = q.msn.wrapping_add(1) & 0x00ff_ffff;
            if let Some(imm) = imm {
                let wr_id = q.rq.pop_front().unwrap_or(0);
                let wc = Completion {
                    wr_id,
                    status: WcStatus::Success,
                    opcode: WcOpcode::RecvRdmaWithImm,
                    byte_len: w.total,
                    imm: Some(imm),
                    qp_num: q.qpn.get(),
                };
                self.nic.cq.push_back((qp, wc));
            }
        } else {
            q.write = Some(w);
        }
        if p.bth.ack_req {
            self.send_ack(qp, psn, Syndrome::ACK_UNLIMITED);
        }
    }

    /// NAKs `psn` with a fatal code; the responder's queue pair fails.
    fn nak_fatal(&mut self, qp: u32, psn: Psn, code: NakCode) {
        self.send_ack(qp, psn, Syndrome::Nak(code));
        self.nic.qps[qp as usize].state = QpState::Error;
    }

    /// Queues an ACK / NAK on the responder's port, ahead of data.
    fn send_ack(&mut self, qp: u32, psn: Psn, syndrome: Syndrome) {
        let q = &self.nic.qps[qp as usize];
        let nak = !matches!(syndrome, Syndrome::Ack { .. });
        let ports = &self.nic.ports;
        let frame = ack_frame(
            &ports[q.port as usize],
            &ports[q.peer_port as usize],
            q.qpn,
            q.dest_qpn,
            psn,
            syndrome,
            q.msn,
        );
        let (port, to) = (q.port, q.peer_port);
        if let Ok(bytes) = frame {
            let c = CtrlFrame { bytes, to, nak };
            self.nic.ports[port as usize].ctrl.push_back(c);
            self.kick(port);
        } else {
            // Cannot happen for the fields an ACK carries; counted like an
            // unformattable data packet.
            self.stats.dropped += 1;
        }
    }
}
