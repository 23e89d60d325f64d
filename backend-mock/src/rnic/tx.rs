//! The requester: doorbell → WQE fetch and parse → DMA read →
//! segmentation; the port's packet scheduler; ACK / NAK handling,
//! go-back-N, the retransmission timer, and failure with flush.

use ringcc_core::wire::mlx5::{Wqe, WqeRepr};
use ringcc_core::wire::roce::{AethRepr, NakCode, Syndrome};
use ringcc_core::wire::segment::Segmenter;
use ringcc_core::wire::{Completion, Payload, Psn, SendFlags, WcOpcode, WcStatus, WrOpcode};

use super::frame::data_frame;
use super::qp::{Msg, QpState};
use super::Frame;
use crate::events::{Ev, Ps};

/// What the trace records of a message whose last packet just left:
/// (first packet's start, bytes, from rank, to rank, channel).
type MsgTrace = (Ps, u64, u32, u32, u32);
use crate::faults::Fate;
use crate::sim::Sim;
use crate::trace::Rec;

/// Why the NIC could not carry out a fetched WQE.
fn fetch_status(e: ringcc_core::wire::Error) -> WcStatus {
    match e {
        ringcc_core::wire::Error::Malformed | ringcc_core::wire::Error::Exhausted => {
            WcStatus::LocLenErr
        }
        _ => WcStatus::LocQpOpErr,
    }
}

impl<const N: usize> Sim<N> {
    /// Rings `qp`'s doorbell: after the doorbell latency the NIC fetches
    /// the WQEs posted so far (every WQE takes the same latency, as the
    /// flow model assumes).
    pub(crate) fn ring_doorbell(&mut self, qp: u32) {
        let upto = self.nic.qps[qp as usize].pi;
        self.events
            .after(self.time.doorbell, Ev::Doorbell { qp, upto });
    }

    fn complete(&mut self, qp: u32, wr_id: u64, status: WcStatus, op: WrOpcode, len: u32) {
        let q = &mut self.nic.qps[qp as usize];
        q.retired = q.retired.wrapping_add(1);
        let wc = Completion {
            wr_id,
            status,
            opcode: WcOpcode::of_request(op).unwrap_or(WcOpcode::RdmaWrite),
            byte_len: len,
            imm: None,
            qp_num: q.qpn.get(),
        };
        self.nic.cq.push_back((qp, wc));
    }

    /// The NIC fetches and parses `qp`'s new WQEs, DMA-reads their data
    /// and cuts them into packets.
    pub(crate) fn on_doorbell(&mut self, qp: u32, upto: u32) {
        let now = self.events.now();
        let q = &self.nic.qps[qp as usize];
        if !self.faults.ranks.alive(q.rank, now) {
            return;
        }
        // Up to `upto`, unless a failure already flushed further.
        while {
            let q = &self.nic.qps[qp as usize];
            q.fetched != upto && upto.wrapping_sub(q.fetched) <= q.sq_depth
        } {
            let q = &mut self.nic.qps[qp as usize];
            let (bytes, wr_id) = q.sq_entry(q.fetched);
            let parsed = Wqe::new_checked(bytes)
                .and_then(|w| WqeRepr::<1>::parse(&w))
                .and_then(|r| r.to_request(wr_id));
            q.fetched = q.fetched.wrapping_add(1);
            if q.state == QpState::Error {
                self.complete(qp, wr_id, WcStatus::WrFlushErr, WrOpcode::RdmaWrite, 0);
                continue;
            }
            let wr = match parsed {
                Ok(wr) => wr,
                Err(e) => {
                    self.complete(qp, wr_id, fetch_status(e), WrOpcode::RdmaWrite, 0);
                    self.fail_qp(qp, None);
                    return;
                }
            };
            // DMA read, every gather entry checked against its region.
            let rank = q.rank;
            let data = match &wr.payload {
                Payload::Inline(d) => Ok(d.to_vec()),
                Payload::Gather(sgl) => {
                    let mut data = Vec::with_capacity(wr.len() as usize);
                    let mut r = Ok(());
                    for s in sgl {
                        match self
                            .mem
                            .check(rank, s.lkey.get(), s.addr, u64::from(s.length), false)
                        {
                            Ok(off) => {
                                data.extend_from_slice(self.mem.read(rank, off, s.length as usize))
                            }
                            Err(_) => {
                                r = Err(WcStatus::LocProtErr);
                                break;
                            }
                        }
                    }
                    r.map(|()| data)
                }
            };
            let q = &mut self.nic.qps[qp as usize];
            let seg = match (&data, wr.remote) {
                (Ok(d), Some(remote)) => Segmenter::write(
                    remote,
                    d.len() as u32,
                    q.mtu,
                    q.next_psn,
                    wr.opcode.has_imm().then_some(wr.imm),
                )
                .map_err(fetch_status),
                (Ok(_), None) => Err(WcStatus::LocQpOpErr),
                (Err(s), _) => Err(*s),
            };
            match (seg, data) {
                (Ok(seg), Ok(data)) => {
                    let first = q.next_psn;
                    q.next_psn = seg.next_psn();
                    let packets = seg.packets();
                    q.msgs.push_back(Msg {
                        seg,
                        first,
                        packets,
                        data,
                        wr_id,
                        opcode: wr.opcode,
                        signaled: wr.flags.contains(SendFlags::SIGNALED),
                        tx_start: now,
                    });
                }
                (Err(status), _) | (_, Err(status)) => {
                    self.complete(qp, wr_id, status, wr.opcode, 0);
                    self.fail_qp(qp, None);
                    return;
                }
            }
        }
        self.enqueue(qp);
    }

    /// Puts `qp` on its port's round robin if it has packets to send.
    pub(crate) fn enqueue(&mut self, qp: u32) {
        let now = self.events.now();
        let q = &mut self.nic.qps[qp as usize];
        if q.queued || !q.has_packet(now) {
            return;
        }
        q.queued = true;
        let port = q.port;
        self.nic.ports[port as usize].rr.push_back(qp);
        self.kick(port);
    }

    /// Makes sure `port` transmits when it has something to send.
    pub(crate) fn kick(&mut self, port: u32) {
        let p = &mut self.nic.ports[port as usize];
        if p.tx_scheduled || (p.ctrl.is_empty() && p.rr.is_empty()) {
            return;
        }
        p.tx_scheduled = true;
        let free = self.fab.links[self.fab.ports[port as usize].link as usize].free_at;
        self.events.at(free, Ev::PortTx { port });
    }

    /// The next data packet of the round robin: (frame, destination port,
    /// queue pair, trace of the message it completes).
    fn next_data_packet(&mut self, port: u32) -> Option<(Vec<u8>, u32, u32, Option<MsgTrace>)> {
        let now = self.events.now();
        loop {
            let qp = self.nic.ports[port as usize].rr.pop_front()?;
            let q = &self.nic.qps[qp as usize];
            let found = if q.has_packet(now) && self.faults.ranks.alive(q.rank, now) {
                q.msg_of(q.tx)
            } else {
                None
            };
            let Some((mi, i)) = found else {
                self.nic.qps[qp as usize].queued = false;
                continue;
            };
            let m = &q.msgs[mi];
            let frame = m
                .seg
                .packet(i)
                .ok_or(ringcc_core::wire::Error::Malformed)
                .and_then(|d| {
                    let payload = m
                        .data
                        .get(d.offset as usize..(d.offset + d.len) as usize)
                        .unwrap_or(&[]);
                    let ports = &self.nic.ports;
                    data_frame(
                        &ports[q.port as usize],
                        &ports[q.peer_port as usize],
                        q.qpn,
                        q.dest_qpn,
                        &d,
                        payload,
                    )
                });
            let (to, peer_rank) = (q.peer_port, self.nic.qps[q.peer as usize].rank);
            let channel = self.fab.lanes[q.lane as usize].channel;
            let q = &mut self.nic.qps[qp as usize];
            let fresh = q.tx == q.high;
            q.tx = q.tx.next();
            if fresh {
                q.high = q.tx;
            } else {
                self.stats.retransmissions += 1;
            }
            if q.has_packet(now) {
                self.nic.ports[port as usize].rr.push_back(qp);
            } else {
                q.queued = false;
            }
            let m = &mut q.msgs[mi];
            if fresh && i == 0 {
                m.tx_start = now;
            }
            let trace = (fresh && i + 1 == m.packets).then_some((
                m.tx_start,
                m.data.len() as u64,
                q.rank,
                peer_rank,
                channel,
            ));
            match frame {
                Ok(f) => return Some((f, to, qp, trace)),
                // Cannot happen for packets the segmenter describes; the
                // timer resends it.
                Err(_) => self.stats.dropped += 1,
            }
        }
    }

    /// `port` may transmit: ACKs first, then one data packet.
    pub(crate) fn on_port_tx(&mut self, port: u32) {
        let now = self.events.now();
        self.nic.ports[port as usize].tx_scheduled = false;
        let link = self.fab.ports[port as usize].link;
        if self.fab.links[link as usize].free_at > now {
            self.kick(port);
            return;
        }
        let (bytes, to, qp, trace) = match self.nic.ports[port as usize].ctrl.pop_front() {
            Some(c) => {
                // Counted here, where the capture sees it (see `CtrlFrame`).
                if c.nak {
                    self.stats.naks += 1;
                } else {
                    self.stats.acks += 1;
                }
                (c.bytes, c.to, None, None)
            }
            None => match self.next_data_packet(port) {
                Some((f, to, qp, trace)) => (f, to, Some(qp), trace),
                None => return,
            },
        };
        let res = &mut self.fab.links[link as usize];
        let (start, end) = res.reserve(now, bytes.len() as u64);
        let latency = res.latency;
        self.stats.packets += 1;
        if let (true, Some((first, len, from, to_rank, channel))) = (self.trace.on, trace) {
            self.trace.push(Rec::Xfer {
                link,
                start: first,
                end,
                bytes: len,
                from,
                to: to_rank,
                channel,
            });
        }
        if self.capture.on {
            self.capture.frames.push((start, bytes.clone()));
        }
        if let Some(qp) = qp {
            self.arm_timer(qp);
        }
        let fate = self.faults.nics.transmit(port, start, end, latency);
        match fate {
            Fate::Lost => self.stats.lost += 1,
            Fate::Arrives(at, dup) => {
                if let Some(at2) = dup {
                    self.stats.duplicated += 1;
                    let f = self.nic.frames.insert(Frame {
                        to_port: to,
                        bytes: bytes.clone(),
                    });
                    self.events.at(at2, Ev::Packet { frame: f });
                }
                let f = self.nic.frames.insert(Frame { to_port: to, bytes });
                self.events.at(at, Ev::Packet { frame: f });
            }
        }
        self.kick(port);
    }

    /// Starts `qp`'s retransmission timer if it is not running.
    fn arm_timer(&mut self, qp: u32) {
        let now = self.events.now();
        let rto = self.time.rto;
        let q = &mut self.nic.qps[qp as usize];
        if q.timer.is_none() {
            q.timer = Some(now.saturating_add(rto));
            if !q.timer_event {
                q.timer_event = true;
                self.events.after(rto, Ev::QpTimer { qp, rnr: false });
            }
        }
    }

    /// The retransmission timer or the RNR back-off of `qp`.
    pub(crate) fn on_qp_timer(&mut self, qp: u32, rnr: bool) {
        let now = self.events.now();
        let q = &mut self.nic.qps[qp as usize];
        if q.state != QpState::Rts {
            if !rnr {
                q.timer_event = false;
            }
            return;
        }
        if rnr {
            if q.rnr_until.is_some_and(|t| t <= now) {
                q.rnr_until = None;
                self.enqueue(qp);
            }
            return;
        }
        q.timer_event = false;
        let Some(deadline) = q.timer else {
            return;
        };
        if deadline > now {
            q.timer_event = true;
            self.events.at(deadline, Ev::QpTimer { qp, rnr: false });
            return;
        }
        self.stats.timeouts += 1;
        q.retries = q.retries.saturating_add(1);
        if q.retries > self.cfg.rnic.retry_cnt {
            tracing::debug!(qpn = q.qpn.get(), "retry count exceeded");
            self.fail_qp(qp, Some(WcStatus::RetryExcErr));
            return;
        }
        q.tx = q.una;
        q.timer = Some(now.saturating_add(self.time.rto));
        q.timer_event = true;
        self.events
            .after(self.time.rto, Ev::QpTimer { qp, rnr: false });
        self.enqueue(qp);
    }

    /// An ACK / NAK for `qp` carrying `psn`.
    pub(crate) fn on_ack(&mut self, qp: u32, psn: Psn, aeth: AethRepr) {
        if self.nic.qps[qp as usize].state != QpState::Rts {
            return;
        }
        match aeth.syndrome {
            Syndrome::Ack { .. } => self.acked(qp, psn),
            Syndrome::Nak(NakCode::PsnSequenceError) => {
                self.acked(qp, psn.sub(1));
                let q = &mut self.nic.qps[qp as usize];
                if q.in_window(psn) {
                    q.tx = psn;
                    self.enqueue(qp);
                }
            }
            Syndrome::Nak(code) => {
                self.acked(qp, psn.sub(1));
                let status = match code {
                    NakCode::RemoteAccessError => WcStatus::RemAccessErr,
                    NakCode::InvalidRequest => WcStatus::RemInvReqErr,
                    _ => WcStatus::RemOpErr,
                };
                self.fail_qp(qp, Some(status));
            }
            Syndrome::RnrNak { .. } => {
                self.acked(qp, psn.sub(1));
                let now = self.events.now();
                let delay = self.time.rnr_delay;
                let q = &mut self.nic.qps[qp as usize];
                if q.in_window(psn) {
                    q.tx = psn;
                }
                q.rnr_until = Some(now.saturating_add(delay));
                self.events.after(delay, Ev::QpTimer { qp, rnr: true });
            }
            Syndrome::Reserved(_) => {}
        }
    }

    /// Everything up to and including `a` is acknowledged.
    fn acked(&mut self, qp: u32, a: Psn) {
        let now = self.events.now();
        let rto = self.time.rto;
        let q = &mut self.nic.qps[qp as usize];
        let old = q.una;
        let d = old.distance_to(a);
        if d >= old.distance_to(q.next_psn) {
            return;
        }
        let mut done = Vec::new();
        while let Some(m) = q.msgs.front() {
            if old.distance_to(m.last()) > d {
                break;
            }
            if let Some(m) = q.msgs.pop_front() {
                done.push((m.wr_id, m.signaled, m.opcode, m.data.len() as u32));
            }
        }
        q.una = a.next();
        let span = q.una.distance_to(q.next_psn);
        if q.una.distance_to(q.tx) > span {
            q.tx = q.una;
        }
        if q.una.distance_to(q.high) > span {
            q.high = q.una;
        }
        q.retries = 0;
        q.timer = if q.una == q.high {
            None
        } else {
            Some(now.saturating_add(rto))
        };
        for (wr_id, signaled, op, len) in done {
            if signaled {
                self.complete(qp, wr_id, WcStatus::Success, op, len);
            } else {
                let q = &mut self.nic.qps[qp as usize];
                q.retired = q.retired.wrapping_add(1);
            }
        }
    }

    /// Moves `qp` to ERROR: its oldest message completes with `status`
    /// (when given), everything else is flushed.
    pub(crate) fn fail_qp(&mut self, qp: u32, status: Option<WcStatus>) {
        let q = &mut self.nic.qps[qp as usize];
        q.state = QpState::Error;
        q.timer = None;
        let msgs: Vec<Msg> = q.msgs.drain(..).collect();
        let unfetched: Vec<u64> = (q.fetched..q.pi).map(|i| q.sq_entry(i).1).collect();
        q.fetched = q.pi;
        let mut first = status;
        for m in msgs {
            let s = first.take().unwrap_or(WcStatus::WrFlushErr);
            self.complete(qp, m.wr_id, s, m.opcode, 0);
        }
        if let Some(s) = first {
            // Nothing was in flight: report the status anyway.
            self.complete(qp, 0, s, WrOpcode::RdmaWrite, 0);
        }
        for wr_id in unfetched {
            self.complete(qp, wr_id, WcStatus::WrFlushErr, WrOpcode::RdmaWrite, 0);
        }
    }
}
