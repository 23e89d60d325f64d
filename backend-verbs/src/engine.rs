//! The progress loop: completions in, state-machine events out, actions
//! carried out, until every channel's machine is done.
//!
//! One loop turn: poll every completion queue (a data receive is the
//! predecessor's `tail` and maybe its call header; a credit receive is the
//! successor's `head`; send completions retire requests and surface
//! errors), then drain each channel's [`Machine`] of actions
//! ([`exec`](Engine::exec) a slice, post a credit, note `Done`). When
//! nothing moved, spin for [`Config::spin`](crate::Config::spin), then arm
//! the completion channels and sleep on them; every wait is bounded by
//! [`Config::timeout`](crate::Config::timeout) without progress, and the
//! abort flag is checked at every turn.

use std::time::{Duration, Instant};

use ringcc_core::fifo::FifoGeometry;
use ringcc_core::protocol::post::{decode_credit, widen_step};
use ringcc_core::topology::RingOrder;
use ringcc_core::wire::call_header::CALL_HEADER_LEN;
use ringcc_core::wire::Completion;
use ringcc_core::{Action, CallDesc, LinkState, Machine};
use tracing::{debug, trace};

use crate::conn::{RecvConn, SendConn};
use crate::error::{Error, Result};
use crate::ib::cq::{status_name, wait_any, EventCqs};
use crate::ib::mem::UserMr;
use crate::ib::nic::Nic;
use crate::rendezvous::AbortState;
use ringcc_core::protocol::{arrival, Kind, WrId};

/// The longest single sleep on completion events (the abort flag is
/// checked between sleeps).
const SLEEP_SLICE: Duration = Duration::from_millis(10);

/// One channel of this rank.
pub(crate) struct Chan {
    pub id: u8,
    pub send: Option<SendConn>,
    pub recv: Option<RecvConn>,
    pub link: LinkState,
}

/// One call's buffers and their registrations (per NIC).
pub(crate) struct CallCtx<'a> {
    pub call: CallDesc,
    pub nranks: u32,
    pub input: &'a [u8],
    pub output: &'a mut [u8],
    pub input_mr: Vec<Option<UserMr<'a>>>,
    pub output_mr: Vec<Option<UserMr<'a>>>,
    /// Time spent reducing and copying on the host (for the debug log).
    pub host_time: Duration,
    /// Time spent in `ibv_post_send` for data writes (for the debug log):
    /// on a software device (Soft-RoCE) the kernel moves the bytes in the
    /// poster's context, so this is where its transfer work shows.
    pub post_time: Duration,
}

/// Everything a rank's data path owns.
pub(crate) struct Engine {
    pub nics: Vec<Nic>,
    pub cqs: Vec<EventCqs>,
    pub chans: Vec<Chan>,
    pub geometry: FifoGeometry,
    pub timeout: Duration,
    pub spin: Duration,
    wcs: Vec<Completion>,
}

impl Engine {
    pub fn new(
        nics: Vec<Nic>,
        cqs: Vec<EventCqs>,
        chans: Vec<Chan>,
        geometry: FifoGeometry,
        timeout: Duration,
        spin: Duration,
    ) -> Engine {
        Engine {
            nics,
            cqs,
            chans,
            geometry,
            timeout,
            spin,
            wcs: Vec::with_capacity(64),
        }
    }

    /// Runs one collective: `machines[c]` drives channel `c`.
    pub fn run_call<M: RingOrder>(
        &mut self,
        machines: &mut [Machine<M>],
        ctx: &mut CallCtx<'_>,
        abort: &AbortState,
    ) -> Result<()> {
        let mut done = vec![false; machines.len()];
        let mut last = Instant::now();
        let mut idle_since: Option<Instant> = None;
        loop {
            if let Some(e) = abort.error() {
                return Err(e);
            }
            let mut progressed = self.poll_all(machines)?;
            for (c, m) in machines.iter_mut().enumerate() {
                while !done[c] {
                    let action = m
                        .poll_action()
                        .map_err(Error::core("Machine::poll_action"))?;
                    match action {
                        Some(Action::Exec(e)) => {
                            trace!(channel = c, ?e, "exec");
                            self.exec(c, &e, ctx, abort)?;
                            m.handle_exec_done()
                                .map_err(Error::core("Machine::handle_exec_done"))?;
                        }
                        Some(Action::ReturnCredit { head }) => self.post_credit(c, head, abort)?,
                        Some(Action::Done) => done[c] = true,
                        None => break,
                    }
                    progressed = true;
                }
            }
            if done.iter().all(|d| *d) && self.drained() {
                break;
            }
            let now = Instant::now();
            if progressed {
                last = now;
                idle_since = None;
                continue;
            }
            let stuck = now.duration_since(last);
            if stuck >= self.timeout {
                return Err(self.stalled(machines, &done, stuck));
            }
            let since = *idle_since.get_or_insert(now);
            if now.duration_since(since) < self.spin {
                std::hint::spin_loop();
                continue;
            }
            for c in &self.cqs {
                c.arm()?;
            }
            // A completion may have landed between the last poll and the
            // arming; it raised no event, so look once more.
            if self.poll_all(machines)? {
                last = Instant::now();
                idle_since = None;
                continue;
            }
            wait_any(&self.cqs, (self.timeout - stuck).min(SLEEP_SLICE))?;
        }
        for (chan, m) in self.chans.iter_mut().zip(machines.iter()) {
            chan.link = m.link();
        }
        Ok(())
    }

    /// Whether every request has completed: no data write still reads the
    /// caller's buffers, and every credit has reached the predecessor (a
    /// rank that returns and exits must not leave its last credit behind,
    /// or the predecessor would wait for it in vain).
    fn drained(&self) -> bool {
        self.chans.iter().all(|c| {
            c.send.as_ref().is_none_or(|s| s.out.is_empty())
                && c.recv.as_ref().is_none_or(|r| r.out.is_empty())
        })
    }

    /// Polls every queue once; whether anything completed.
    fn poll_all<M: RingOrder>(&mut self, machines: &mut [Machine<M>]) -> Result<bool> {
        let mut any = false;
        for nic in 0..self.cqs.len() {
            any |= self.pump_send(nic)?;
            let mut wcs = std::mem::take(&mut self.wcs);
            wcs.clear();
            let r = self.cqs[nic]
                .poll_recv(&mut wcs)
                .and_then(|()| wcs.iter().try_for_each(|wc| self.on_recv(wc, machines)));
            any |= !wcs.is_empty();
            self.wcs = wcs;
            r?;
        }
        Ok(any)
    }

    /// Polls the send queue of `nic` once; whether anything completed.
    fn pump_send(&mut self, nic: usize) -> Result<bool> {
        let mut wcs = std::mem::take(&mut self.wcs);
        wcs.clear();
        let r = self.cqs[nic]
            .poll_send(&mut wcs)
            .and_then(|()| wcs.iter().try_for_each(|wc| self.on_send(wc)));
        let any = !wcs.is_empty();
        self.wcs = wcs;
        r.map(|()| any)
    }

    fn chan_of(&mut self, wc: &Completion) -> Result<(WrId, &mut Chan)> {
        let id = WrId::decode(wc.wr_id).ok_or_else(|| {
            Error::Internal(format!("completion with a foreign wr_id {:#x}", wc.wr_id))
        })?;
        let chan = self
            .chans
            .get_mut(usize::from(id.channel))
            .ok_or_else(|| Error::Internal(format!("completion for channel {}", id.channel)))?;
        Ok((id, chan))
    }

    fn on_send(&mut self, wc: &Completion) -> Result<()> {
        let (id, chan) = self.chan_of(wc)?;
        let c = chan.id;
        match id.kind {
            Kind::Data => {
                let s = chan.send.as_mut().ok_or_else(|| missing(c, "send"))?;
                check(wc, id.kind, c, s.peer)?;
                s.out.completed(wc.wr_id);
                s.sent_done = widen_step(id.low, s.sent_done);
            }
            Kind::Credit => {
                let r = chan.recv.as_mut().ok_or_else(|| missing(c, "receive"))?;
                check(wc, id.kind, c, r.peer)?;
                r.out.completed(wc.wr_id);
            }
            Kind::TailRecv | Kind::CreditRecv => {
                return Err(Error::Internal(format!(
                    "a receive id on a send queue ({:#x})",
                    wc.wr_id
                )))
            }
        }
        Ok(())
    }

    fn on_recv<M: RingOrder>(
        &mut self,
        wc: &Completion,
        machines: &mut [Machine<M>],
    ) -> Result<()> {
        let sps = self.geometry.slots_per_slice();
        let (id, chan) = self.chan_of(wc)?;
        let c = chan.id;
        let m = machines
            .get_mut(usize::from(c))
            .ok_or_else(|| missing(c, "machine"))?;
        match id.kind {
            Kind::TailRecv => {
                let r = chan.recv.as_mut().ok_or_else(|| missing(c, "receive"))?;
                check(wc, id.kind, c, r.peer)?;
                r.qp.post_recvs([wc.wr_id])?;
                let imm = wc.imm.ok_or_else(|| no_imm(c, r.peer))?;
                let hdr: [u8; CALL_HEADER_LEN] = r.mailbox.read_array(0).unwrap_or([0; 32]);
                let a = arrival(imm, r.tail, sps, &hdr);
                r.tail = a.tail;
                if let Some((step, desc)) = a.header {
                    debug!(channel = c, step, call = %desc, "call header");
                    m.handle_header(step, desc)
                        .map_err(Error::core("Machine::handle_header"))?;
                }
                m.handle_tail(a.tail)
                    .map_err(Error::core("Machine::handle_tail"))?;
            }
            Kind::CreditRecv => {
                let s = chan.send.as_mut().ok_or_else(|| missing(c, "send"))?;
                check(wc, id.kind, c, s.peer)?;
                s.qp.post_recvs([wc.wr_id])?;
                // The counter is the truth: it was written before this
                // completion was raised, and possibly again since (so it
                // may be ahead of this completion's immediate, which only
                // wakes us up).
                let known = m.link().send_head;
                let word = s.counter.read_word(0).unwrap_or([0; 8]);
                let head = decode_credit(word);
                if head > known {
                    m.handle_head(head)
                        .map_err(Error::core("Machine::handle_head"))?;
                }
            }
            Kind::Data | Kind::Credit => {
                return Err(Error::Internal(format!(
                    "a send id on a receive queue ({:#x})",
                    wc.wr_id
                )))
            }
        }
        Ok(())
    }

    /// Waits, pumping `nic`'s send queue, until `ready(self)` holds.
    pub(crate) fn wait_until(
        &mut self,
        nic: usize,
        abort: &AbortState,
        what: &str,
        ready: impl Fn(&Engine) -> bool,
    ) -> Result<()> {
        let t0 = Instant::now();
        while !ready(self) {
            if let Some(e) = abort.error() {
                return Err(e);
            }
            if self.pump_send(nic)? {
                continue;
            }
            let waited = t0.elapsed();
            if waited >= self.timeout {
                return Err(Error::Timeout {
                    waiting_for: what.to_owned(),
                    after: waited,
                });
            }
            if let Some(cq) = self.cqs.get(nic) {
                cq.arm()?;
            }
            if self.pump_send(nic)? {
                continue;
            }
            wait_any(
                self.cqs.get(nic..=nic).unwrap_or_default(),
                Duration::from_millis(1),
            )?;
        }
        Ok(())
    }

    fn stalled<M: RingOrder>(
        &self,
        machines: &[Machine<M>],
        done: &[bool],
        after: Duration,
    ) -> Error {
        let mut parts = Vec::new();
        for (c, m) in machines.iter().enumerate() {
            if done.get(c).copied().unwrap_or(true) {
                continue;
            }
            let l = m.link();
            let chan = self.chans.get(c);
            let prev = chan.and_then(|ch| ch.recv.as_ref()).map(|r| r.peer);
            let next = chan.and_then(|ch| ch.send.as_ref()).map(|s| s.peer);
            parts.push(format!(
                "channel {c}: data from rank {} up to step {} (consumed {}), credit from rank {} \
                 up to step {} (sent {})",
                opt(prev),
                l.recv_tail,
                l.recv_next,
                opt(next),
                l.send_head,
                l.send_next
            ));
        }
        if parts.is_empty() {
            parts.push("the last writes and credits to complete".into());
        }
        Error::Timeout {
            waiting_for: parts.join("; "),
            after,
        }
    }

    /// Moves every queue pair to ERROR and drains the flushed requests
    /// (bounded), so that no request still reads a caller's buffer.
    pub fn shut_down(&mut self) {
        for chan in &mut self.chans {
            if let Some(s) = chan.send.as_mut() {
                let _ = s.qp.set_error();
            }
            if let Some(r) = chan.recv.as_mut() {
                let _ = r.qp.set_error();
            }
        }
        let t0 = Instant::now();
        let mut quiet_since = Instant::now();
        let mut wcs = Vec::new();
        while t0.elapsed() < Duration::from_secs(2)
            && quiet_since.elapsed() < Duration::from_millis(100)
        {
            let mut any = false;
            for cq in &self.cqs {
                wcs.clear();
                let _ = cq.poll_send(&mut wcs);
                let _ = cq.poll_recv(&mut wcs);
                any |= !wcs.is_empty();
            }
            if any {
                quiet_since = Instant::now();
            } else {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
}

fn opt(v: Option<u32>) -> String {
    v.map_or_else(|| "-".into(), |r| r.to_string())
}

fn missing(channel: u8, what: &str) -> Error {
    Error::Internal(format!(
        "completion for channel {channel}, which has no {what} side"
    ))
}

fn no_imm(channel: u8, peer: u32) -> Error {
    Error::Internal(format!(
        "channel {channel}: a receive from rank {peer} without an immediate"
    ))
}

/// The completion's status as a typed error.
fn check(wc: &Completion, kind: Kind, channel: u8, peer: u32) -> Result<()> {
    if wc.is_ok() {
        return Ok(());
    }
    Err(Error::Completion {
        what: kind.what(),
        channel,
        peer,
        status: wc.status.code(),
        status_name: status_name(wc.status),
    })
}
