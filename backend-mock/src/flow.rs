//! Messages between nodes: in payload mode through the simulated RNIC,
//! packet by packet; in timing-only mode as flows.
//!
//! A flow is one RDMA message occupying its sender's NIC port for its wire
//! bytes (exactly the frames the packet model would emit: headers, pad and
//! ICRC included) over the port bandwidth, after the doorbell latency, and
//! arriving one link latency after its last byte left. That is the packet
//! model's time for a message on a lossless port of its own (tested), at
//! the cost of O(1) per message. Credits are 8-byte writes: they take the
//! doorbell latency, their own serialization and the link latency but do
//! not queue behind data (the packet model interleaves them between data
//! packets, which delays them by at most one MTU).
//!
//! A flow that meets a dead NIC or rank is lost for good: its requester
//! fails with `RETRY_EXC_ERR` after `(retry_cnt + 1)` retransmission
//! timeouts, as the packet model's would.

use ringcc_core::prim::Exec;
use ringcc_core::protocol::post::CREDIT_LEN;
use ringcc_core::wire::call_header::CALL_HEADER_LEN;
use ringcc_core::wire::WcStatus;

use crate::error::Error;
use crate::events::{ps, Ev, Ps, NONE};
use crate::fabric::Hop;
use crate::rnic::frame::write_wire_bytes;
use crate::sim::Sim;
use crate::trace::Rec;

impl<const N: usize> Sim<N> {
    /// Sends lane `l`'s finished slice `e` to its successor over RDMA.
    pub(crate) fn net_send(&mut self, l: u32, e: &Exec) -> Result<(), Error> {
        if self.cfg.payload {
            return self.post_slice(l, e);
        }
        let Some(span) = e.send else {
            return Ok(());
        };
        let t = self.lanes[l].t;
        let Hop::Net { tx, rx, .. } = t.hop else {
            return Ok(());
        };
        let now = self.events.now();
        let elem = self.run.elem[t.rank as usize];
        let bytes = e.count.saturating_mul(elem);
        let mtu = self.cfg.mtu;
        let mut wire = write_wire_bytes(self.time.wire_bytes(bytes), mtu, true)
            .saturating_add(self.time.nic_overhead_bytes);
        if e.header.is_some() {
            wire += write_wire_bytes(CALL_HEADER_LEN as u64, mtu, false);
        }
        let ready = now.saturating_add(self.time.doorbell);
        let link = self.fab.ports[tx as usize].link;
        let res = &mut self.fab.links[link as usize];
        let (start, end) = res.reserve(ready, wire);
        let latency = res.latency;
        if self.trace.on {
            self.trace.push(Rec::Xfer {
                link,
                start,
                end,
                bytes: wire,
                from: t.rank,
                to: t.next,
                channel: t.channel,
            });
        }
        let arrive = end.saturating_add(latency);
        if self.faults.message_lost(tx, rx, t.next, start, arrive) {
            self.events.at(
                start.saturating_add(self.time.give_up),
                Ev::FlowFail {
                    lane: l,
                    credit: false,
                },
            );
            return Ok(());
        }
        let jitter = self.faults.nics.jitter();
        let lane = &mut self.lanes[l];
        let arrive = arrive.saturating_add(jitter).max(lane.last_arrival);
        lane.last_arrival = arrive;
        let succ = self.fab.lane(t.channel, t.next);
        if let Some(h) = e.header {
            self.lanes.cold[succ as usize].mailbox = Some((span.step, h));
        }
        self.events.at(
            arrive,
            Ev::Tail {
                lane: succ,
                hdr: e.header.is_some(),
                xfer: NONE,
                tail: span.end() as u32,
            },
        );
        Ok(())
    }

    /// Returns credit `head` from lane `l` to its predecessor lane `pred`
    /// over RDMA.
    pub(crate) fn net_credit(&mut self, l: u32, pred: u32, head: u64) -> Result<(), Error> {
        if self.cfg.payload {
            return self.post_credit(l, pred, head);
        }
        let Hop::Net { tx, rx, .. } = self.lanes[pred].t.hop else {
            return Ok(());
        };
        let now = self.events.now();
        let t = self.lanes[l].t;
        // The credit leaves from this lane's port (`rx` of the
        // predecessor's connection) towards the predecessor's (`tx`).
        let res = &self.fab.links[self.fab.ports[rx as usize].link as usize];
        let wire = write_wire_bytes(CREDIT_LEN as u64, self.cfg.mtu, true);
        let sent = now
            .saturating_add(self.time.doorbell)
            .saturating_add(res.rate.time(wire));
        let arrive = sent.saturating_add(res.latency);
        if self.faults.message_lost(rx, tx, t.prev, sent, arrive) {
            self.events.at(
                now.saturating_add(self.time.give_up),
                Ev::FlowFail {
                    lane: l,
                    credit: true,
                },
            );
            return Ok(());
        }
        let jitter = self.faults.nics.jitter();
        let lane = &mut self.lanes[l];
        let arrive = arrive.saturating_add(jitter).max(lane.last_credit);
        lane.last_credit = arrive;
        self.push_credit(pred, arrive, head);
        Ok(())
    }

    /// A lost flow's requester gives up.
    pub(crate) fn on_flow_fail(&mut self, l: u32, credit: bool) {
        if !self.running(l) {
            return;
        }
        let t = self.lanes[l].t;
        self.fail_lane(
            l,
            Error::Completion {
                rank: t.rank_id(),
                channel: t.channel_id(),
                request: if credit {
                    "credit return"
                } else {
                    "data write"
                },
                status: WcStatus::RetryExcErr,
                qpn: 0,
            },
        );
    }
}

/// `(retry_cnt + 1)` retransmission timeouts.
pub(crate) fn give_up_after(cfg: &crate::config::ClusterConfig) -> Ps {
    ps(cfg.rnic.rto() * (f64::from(cfg.rnic.retry_cnt) + 1.0))
}
