//! A lane is one rank on one channel: the core's state machine for the
//! current collective, and what the rank's progress loop knows about its
//! two connections. The progress loop polls the machine until it waits,
//! carrying out every action; events feed the machine what happened.

use ringcc_core::prim::{Action, LinkState, Machine};
use ringcc_core::CallDesc;

use crate::engine::{Ev, Ps};
use crate::error::Error;
use crate::fabric::{Hop, RingRef};
use crate::sim::Sim;

/// Where a lane stands in the current run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LaneState {
    /// No run in progress.
    Idle,
    /// Walking its steps.
    Running,
    /// Emitted `Done`.
    Done,
    /// Failed (its rank's result is an error).
    Failed,
    /// Its rank died.
    Dead,
}

/// Byte offsets and keys of a lane's buffers in its rank's memory
/// (payload mode).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct LaneMem {
    /// FIFO slots the predecessor writes.
    pub inbox: usize,
    pub inbox_key: u32,
    /// Call-header mailbox (RDMA in-connection).
    pub mailbox: usize,
    pub mailbox_key: u32,
    /// Staging slots the RNIC sends from (RDMA out-connection).
    pub staging: usize,
    pub staging_key: u32,
    /// Credit counter the successor writes (RDMA out-connection).
    pub counter: usize,
    pub counter_key: u32,
}

/// One (channel, rank).
#[derive(Debug)]
pub(crate) struct Lane {
    pub machine: Option<Machine<RingRef>>,
    /// Connection counters carried from one collective to the next.
    pub link: LinkState,
    pub state: LaneState,
    /// A call header the predecessor sent over NVLink (or as a flow),
    /// delivered with the `Tail` that carries `hdr`.
    pub mailbox: Option<(u64, CallDesc)>,
    /// Last time an event reached the lane (for the deadline).
    pub last_progress: Ps,
    /// Payload mode, RDMA in-connection: the last `tail` (to widen
    /// immediates).
    pub recv_tail: u64,
    /// Timing-only RDMA out-connection: arrival of the last message, so
    /// that jitter never reorders a reliable connection.
    pub last_arrival: Ps,
    /// Same, for the credits this lane returns.
    pub last_credit: Ps,
    pub mem: LaneMem,
}

impl Lane {
    pub fn new() -> Lane {
        Lane {
            machine: None,
            link: LinkState::default(),
            state: LaneState::Idle,
            mailbox: None,
            last_progress: 0,
            recv_tail: 0,
            last_arrival: 0,
            last_credit: 0,
            mem: LaneMem::default(),
        }
    }
}

impl Sim {
    #[inline]
    pub(crate) fn running(&self, l: u32) -> bool {
        self.lanes[l as usize].state == LaneState::Running
    }

    /// Polls lane `l`'s machine until it waits, carrying out its actions.
    pub(crate) fn drive(&mut self, l: u32) {
        loop {
            let lane = &mut self.lanes[l as usize];
            if lane.state != LaneState::Running {
                return;
            }
            let Some(m) = lane.machine.as_mut() else {
                return;
            };
            match m.poll_action() {
                Ok(Some(Action::Exec(e))) => {
                    if let Err(err) = self.start_exec(l, e) {
                        self.fail_lane(l, err);
                    }
                    return;
                }
                Ok(Some(Action::ReturnCredit { head })) => {
                    if let Err(err) = self.return_credit(l, head) {
                        self.fail_lane(l, err);
                        return;
                    }
                }
                Ok(Some(Action::Done)) => {
                    self.lane_done(l);
                    return;
                }
                Ok(None) => return,
                Err(source) => {
                    let err = self.machine_error(l, "poll_action", source);
                    self.fail_lane(l, err);
                    return;
                }
            }
        }
    }

    pub(crate) fn machine_error(
        &self,
        l: u32,
        call: &'static str,
        source: ringcc_core::Error,
    ) -> Error {
        let t = self.fab.lanes[l as usize];
        Error::Machine {
            rank: t.rank,
            channel: t.channel,
            call,
            source,
        }
    }

    /// The lane's outstanding slice is complete.
    pub(crate) fn on_exec_done(&mut self, l: u32) {
        if !self.running(l) {
            return;
        }
        let now = self.eng.now();
        let lane = &mut self.lanes[l as usize];
        lane.last_progress = now;
        let Some(m) = lane.machine.as_mut() else {
            return;
        };
        let exec = m.pending().copied();
        if let Err(source) = m.handle_exec_done() {
            let err = self.machine_error(l, "handle_exec_done", source);
            self.fail_lane(l, err);
            return;
        }
        if let (Some(e), Hop::Net { .. }) = (exec, self.fab.lanes[l as usize].hop) {
            if e.send.is_some() {
                if let Err(err) = self.net_send(l, &e) {
                    self.fail_lane(l, err);
                    return;
                }
            }
        }
        self.drive(l);
    }

    /// The predecessor's `tail` (and maybe call header) became visible.
    pub(crate) fn on_tail(&mut self, l: u32, hdr: bool, xfer: u32, tail: u64) {
        if xfer != crate::engine::NONE {
            self.land(xfer);
        }
        let header = if hdr {
            self.lanes[l as usize].mailbox.take()
        } else {
            None
        };
        self.deliver_tail(l, header, tail);
    }

    /// Feeds lane `l` the predecessor's call header (if any) and `tail`.
    pub(crate) fn deliver_tail(&mut self, l: u32, header: Option<(u64, CallDesc)>, tail: u64) {
        if !self.running(l) {
            return;
        }
        let lane = &mut self.lanes[l as usize];
        lane.last_progress = self.eng.now();
        let Some(m) = lane.machine.as_mut() else {
            return;
        };
        let r = match header {
            Some((step, desc)) => m
                .handle_header(step, desc)
                .map_err(|e| ("handle_header", e)),
            None => Ok(()),
        }
        .and_then(|()| m.handle_tail(tail).map_err(|e| ("handle_tail", e)));
        if let Err((call, source)) = r {
            let err = self.machine_error(l, call, source);
            self.fail_lane(l, err);
            return;
        }
        self.drive(l);
    }

    /// The successor's `head` arrived.
    pub(crate) fn on_head(&mut self, l: u32, head: u64) {
        if !self.running(l) {
            return;
        }
        let lane = &mut self.lanes[l as usize];
        lane.last_progress = self.eng.now();
        let Some(m) = lane.machine.as_mut() else {
            return;
        };
        // A counter read may show a value already handled.
        if head <= m.link().send_head {
            return;
        }
        if let Err(source) = m.handle_head(head) {
            let err = self.machine_error(l, "handle_head", source);
            self.fail_lane(l, err);
            return;
        }
        self.drive(l);
    }

    /// Returns credit `head` from lane `l` to its predecessor.
    pub(crate) fn return_credit(&mut self, l: u32, head: u64) -> Result<(), Error> {
        self.stats.credits += 1;
        let t = self.fab.lanes[l as usize];
        let pred = self.fab.lane(t.channel, t.prev);
        match self.fab.lanes[pred as usize].hop {
            Hop::Loopback => Ok(()),
            Hop::Nvlink { link } => {
                // A flag store over NVLink: latency only.
                let now = self.eng.now();
                if !self.faults.nvlink_dead(t.rank, t.prev, now) {
                    let lat = self.fab.links[link as usize].latency;
                    self.eng.after(lat, Ev::Head { lane: pred, head });
                }
                Ok(())
            }
            Hop::Net { .. } => self.net_credit(l, pred, head),
        }
    }
}
