//! One rank's verbs transport around the core's progress engine: its
//! NICs, completion queues and channels, and the loop that runs a call.
//!
//! The [`Engine`] holds everything about the schedule: a machine per
//! channel, sequence numbers, the counters carried from one call to the
//! next, early headers, the deadline and the stall report. This module
//! only translates, in three places:
//!
//! - completions → events ([`poll_all`](Transport::poll_all)): a data
//!   receive is the predecessor's `tail` and, on a call's first slice, its
//!   call header ([`arrival`]); a credit receive is the successor's
//!   `head`, read from the counter it wrote; send completions retire
//!   requests and surface errors (they are no event: they only make room);
//! - actions → work requests ([`exec`](crate::exec)): a slice is reduced or
//!   copied on the host and its writes posted, a credit return is posted.
//!   Either waits, handed out but not yet carried out, while its send
//!   queue is full or (a staged send) its staging slot is still being
//!   read; the loop carries it out once a send completion made room;
//! - and how it waits ([`sleep`](Transport::sleep)): spin for
//!   [`Config::spin`](crate::Config::spin), then arm the completion
//!   channels and sleep on them, never past the engine's deadline
//!   ([`Engine::poll_timeout`]) nor longer than [`SLEEP_SLICE`], with the
//!   abort flag checked at every turn.
//!
//! Time is nanoseconds since the transport was built (the engine's
//! ticks).

use std::sync::Arc;
use std::time::{Duration, Instant};

use ringcc_core::fifo::FifoGeometry;
use ringcc_core::progress::Channel;
use ringcc_core::protocol::post::{decode_credit, widen_step};
use ringcc_core::protocol::{arrival, Kind, WrId};
use ringcc_core::wire::call_header::CALL_HEADER_LEN;
use ringcc_core::wire::Completion;
use ringcc_core::{Action, ChannelId, Engine, EngineError, Event, Rank, RingIndex, RingOrder};
use tracing::{debug, trace};

use crate::abort::AbortState;
use crate::conn::{RecvConn, SendConn};
use crate::error::{Error, Result};
use crate::exec::CallCtx;
use crate::ib::cq::{status_name, wait_any, EventCqs};
use crate::ib::nic::Nic;

/// The longest single sleep on completion events (the abort flag is
/// checked between sleeps).
const SLEEP_SLICE: Duration = Duration::from_millis(10);

/// A channel's ring, owned: the engine keeps each channel's machine, and
/// so its ring, from one call to the next.
#[derive(Clone, Debug)]
pub(crate) struct OwnedRing(Arc<RingTable>);

#[derive(Debug)]
struct RingTable {
    /// Rank at each ring index.
    order: Vec<Rank>,
    /// Ring index of each rank.
    index: Vec<RingIndex>,
}

impl OwnedRing {
    /// The ring that visits `order` (every rank once).
    pub fn new(order: Vec<Rank>) -> OwnedRing {
        let mut index = vec![RingIndex(0); order.len()];
        for (i, r) in order.iter().enumerate() {
            if let Some(slot) = index.get_mut(r.0 as usize) {
                *slot = RingIndex(i as u32);
            }
        }
        OwnedRing(Arc::new(RingTable { order, index }))
    }
}

impl RingOrder for OwnedRing {
    fn ranks(&self) -> u32 {
        self.0.order.len() as u32
    }
    fn rank_at(&self, index: RingIndex) -> Result<Rank, ringcc_core::Error> {
        self.0
            .order
            .get(index.0 as usize)
            .copied()
            .ok_or(ringcc_core::Error::RankOutOfRange {
                rank: index.0,
                ranks: self.ranks(),
            })
    }
    fn index_of(&self, rank: Rank) -> Result<RingIndex, ringcc_core::Error> {
        self.0
            .index
            .get(rank.0 as usize)
            .copied()
            .ok_or(ringcc_core::Error::RankOutOfRange {
                rank: rank.0,
                ranks: self.ranks(),
            })
    }
}

/// The core's engine over this rank's channels.
pub(crate) type RankEngine = Engine<OwnedRing, Box<[Channel<OwnedRing>]>>;

/// An engine for `rank` with `channels` channels, giving up after
/// `timeout` without progress.
pub(crate) fn rank_engine(rank: Rank, channels: usize, timeout: Duration) -> RankEngine {
    let storage: Box<[Channel<OwnedRing>]> = (0..channels).map(|_| Channel::new()).collect();
    Engine::new(rank, storage, ticks(timeout))
}

fn ticks(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// One channel of this rank.
pub(crate) struct Chan {
    pub id: ChannelId,
    pub send: Option<SendConn>,
    pub recv: Option<RecvConn>,
    /// The exec the engine handed out ([`Engine::pending`]) waits for
    /// room: its send queue is full, or its staging slot still read.
    pub exec_waits: bool,
    /// A credit return waits for room on the predecessor connection's
    /// send queue: the latest `head` (credits are cumulative, so a later
    /// one replaces it).
    pub credit_waits: Option<u64>,
}

impl Chan {
    pub fn new(id: ChannelId, send: Option<SendConn>, recv: Option<RecvConn>) -> Chan {
        Chan {
            id,
            send,
            recv,
            exec_waits: false,
            credit_waits: None,
        }
    }

    /// Nothing waits to be posted and every request has completed.
    fn drained(&self) -> bool {
        !self.exec_waits
            && self.credit_waits.is_none()
            && self.send.as_ref().is_none_or(|s| s.out.is_empty())
            && self.recv.as_ref().is_none_or(|r| r.out.is_empty())
    }
}

/// Everything a rank's data path owns.
pub(crate) struct Transport {
    pub rank: Rank,
    pub nics: Vec<Nic>,
    pub cqs: Vec<EventCqs>,
    pub chans: Vec<Chan>,
    /// Each channel's ring, for the engine's machines.
    pub rings: Vec<OwnedRing>,
    pub geometry: FifoGeometry,
    /// How long the last requests of a finished call may take.
    pub timeout: Duration,
    pub spin: Duration,
    epoch: Instant,
    wcs: Vec<Completion>,
}

impl Transport {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        rank: Rank,
        nics: Vec<Nic>,
        cqs: Vec<EventCqs>,
        chans: Vec<Chan>,
        rings: Vec<OwnedRing>,
        geometry: FifoGeometry,
        timeout: Duration,
        spin: Duration,
    ) -> Transport {
        Transport {
            rank,
            nics,
            cqs,
            chans,
            rings,
            geometry,
            timeout,
            spin,
            epoch: Instant::now(),
            wcs: Vec::with_capacity(64),
        }
    }

    /// The engine's clock: nanoseconds since this transport was built.
    pub fn now(&self) -> u64 {
        ticks(self.epoch.elapsed())
    }

    /// An engine error as this crate's, the stall report naming the
    /// channel's neighbours.
    pub(crate) fn engine_error(&self, e: EngineError) -> Error {
        Error::engine(e, |c| {
            let ch = self.chans.get(usize::from(c.0))?;
            Some((ch.recv.as_ref()?.peer, ch.send.as_ref()?.peer))
        })
    }

    /// Runs the call `engine` has started to its end: every channel done
    /// and every request completed.
    pub fn run_call(
        &mut self,
        engine: &mut RankEngine,
        ctx: &mut CallCtx<'_>,
        abort: &AbortState,
    ) -> Result<()> {
        let mut idle_since: Option<Instant> = None;
        let mut drain_since: Option<u64> = None;
        loop {
            if let Some(e) = abort.error() {
                return Err(e);
            }
            let now = self.now();
            let mut moved = self.poll_all(engine, now)?;
            moved |= self.carry_out_waiting(engine, ctx, now)?;
            while let Some((c, action)) = engine.poll().map_err(|e| self.engine_error(e))? {
                moved = true;
                match action {
                    Action::Exec(e) => {
                        trace!(channel = c.0, ?e, "exec");
                        self.exec_or_wait(engine, c, &e, ctx, now)?;
                    }
                    Action::ReturnCredit { head } => self.credit_or_wait(c, head)?,
                    Action::Done => trace!(channel = c.0, "done"),
                }
            }
            if engine.is_idle() && self.drained() {
                return Ok(());
            }
            if moved {
                idle_since = None;
                drain_since = None;
                continue;
            }
            let now = self.now();
            let deadline = match engine.poll_timeout() {
                Some(d) => {
                    engine
                        .handle_timeout(now)
                        .map_err(|e| self.engine_error(e))?;
                    d
                }
                // Every channel is done; its last requests are completing.
                None => {
                    let d = drain_since
                        .get_or_insert(now)
                        .saturating_add(ticks(self.timeout));
                    if now >= d {
                        return Err(Error::Timeout {
                            waiting_for: self.drain_report(),
                            after: self.timeout,
                        });
                    }
                    d
                }
            };
            let since = *idle_since.get_or_insert_with(Instant::now);
            if since.elapsed() < self.spin {
                std::hint::spin_loop();
                continue;
            }
            self.sleep(engine, deadline)?;
        }
    }

    /// Arms the completion channels and sleeps until a completion, the
    /// engine's `deadline` or [`SLEEP_SLICE`], whichever comes first.
    fn sleep(&mut self, engine: &mut RankEngine, deadline: u64) -> Result<()> {
        for c in &self.cqs {
            c.arm()?;
        }
        // A completion may have landed between the last poll and the
        // arming; it raised no event, so look once more.
        let now = self.now();
        if self.poll_all(engine, now)? {
            return Ok(());
        }
        let left = Duration::from_nanos(deadline.saturating_sub(now));
        wait_any(&self.cqs, left.min(SLEEP_SLICE))
    }

    /// Carries out `e` on channel `c` and tells the engine, or leaves it
    /// waiting for room.
    fn exec_or_wait(
        &mut self,
        engine: &mut RankEngine,
        c: ChannelId,
        e: &ringcc_core::Exec,
        ctx: &mut CallCtx<'_>,
        now: u64,
    ) -> Result<()> {
        let i = usize::from(c.0);
        if !self.has_room(i, e, ctx.bufs.in_place()) {
            if let Some(ch) = self.chans.get_mut(i) {
                ch.exec_waits = true;
            }
            return Ok(());
        }
        self.exec(i, e, ctx)?;
        engine
            .handle(now, c, Event::ExecDone)
            .map_err(|e| self.engine_error(e))
    }

    /// Posts credit `head` on channel `c`, or leaves it waiting for room.
    fn credit_or_wait(&mut self, c: ChannelId, head: u64) -> Result<()> {
        let i = usize::from(c.0);
        let room = self.credit_room(i);
        let Some(ch) = self.chans.get_mut(i) else {
            return Err(missing(c, "channel"));
        };
        if ch.credit_waits.is_some() || !room {
            ch.credit_waits = Some(head);
            return Ok(());
        }
        self.post_credit(i, head)
    }

    /// Carries out what waited for room, where there is room now; whether
    /// anything was.
    fn carry_out_waiting(
        &mut self,
        engine: &mut RankEngine,
        ctx: &mut CallCtx<'_>,
        now: u64,
    ) -> Result<bool> {
        let mut moved = false;
        for i in 0..self.chans.len() {
            let id = self.chans[i].id;
            if self.chans[i].exec_waits {
                let e = engine
                    .pending(id)
                    .ok_or_else(|| missing(id, "outstanding exec"))?;
                if self.has_room(i, &e, ctx.bufs.in_place()) {
                    self.chans[i].exec_waits = false;
                    self.exec(i, &e, ctx)?;
                    engine
                        .handle(now, id, Event::ExecDone)
                        .map_err(|e| self.engine_error(e))?;
                    moved = true;
                }
            }
            if let Some(head) = self.chans[i].credit_waits {
                if self.credit_room(i) {
                    self.chans[i].credit_waits = None;
                    self.post_credit(i, head)?;
                    moved = true;
                }
            }
        }
        Ok(moved)
    }

    /// Whether every request has completed and nothing waits to be
    /// posted: no data write still reads the caller's buffers, and every
    /// credit has reached the predecessor (a rank that returns and exits
    /// must not leave its last credit behind, or the predecessor would
    /// wait for it in vain).
    fn drained(&self) -> bool {
        self.chans.iter().all(Chan::drained)
    }

    /// What a finished call still waits for, per channel.
    fn drain_report(&self) -> String {
        let parts: Vec<String> = self
            .chans
            .iter()
            .filter(|c| !c.drained())
            .map(|c| {
                let data = c.send.as_ref().map_or(0, |s| s.out.in_flight);
                let credit = c.recv.as_ref().map_or(0, |r| r.out.in_flight);
                format!(
                    "channel {}: {data} data request(s) to rank {} and {credit} credit \
                     return(s) to rank {} in flight{}",
                    c.id,
                    opt(c.send.as_ref().map(|s| s.peer)),
                    opt(c.recv.as_ref().map(|r| r.peer)),
                    if c.credit_waits.is_some() {
                        ", a credit return not yet posted"
                    } else {
                        ""
                    }
                )
            })
            .collect();
        format!(
            "rank {}: the call's last requests to complete ({})",
            self.rank,
            parts.join("; ")
        )
    }

    /// Polls every queue once, feeding what arrived to `engine`; whether
    /// anything completed.
    fn poll_all(&mut self, engine: &mut RankEngine, now: u64) -> Result<bool> {
        let mut wcs = std::mem::take(&mut self.wcs);
        let mut r = Ok(false);
        for nic in 0..self.cqs.len() {
            r = self
                .poll_nic(nic, engine, now, &mut wcs)
                .and_then(|any| r.map(|before| before | any));
            if r.is_err() {
                break;
            }
        }
        self.wcs = wcs;
        r
    }

    /// Polls `nic`'s send queue, then its receive queue, once.
    fn poll_nic(
        &mut self,
        nic: usize,
        engine: &mut RankEngine,
        now: u64,
        wcs: &mut Vec<Completion>,
    ) -> Result<bool> {
        let Some(cqs) = self.cqs.get(nic) else {
            return Ok(false);
        };
        wcs.clear();
        cqs.poll_send(wcs)?;
        let sent = wcs.len();
        cqs.poll_recv(wcs)?;
        let (send, recv) = wcs.split_at(sent);
        for wc in send {
            self.on_send(wc)?;
        }
        for wc in recv {
            self.on_recv(wc, engine, now)?;
        }
        Ok(!wcs.is_empty())
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

    /// A send completion: a data write or a credit return retired.
    fn on_send(&mut self, wc: &Completion) -> Result<()> {
        let (id, chan) = self.chan_of(wc)?;
        let c = chan.id;
        match id.kind {
            Kind::Data => {
                let s = chan.send.as_mut().ok_or_else(|| missing(c, "send side"))?;
                check(wc, id.kind, c, s.peer)?;
                s.out.completed(wc.wr_id);
                s.sent_done = widen_step(id.low, s.sent_done);
            }
            Kind::Credit => {
                let r = chan
                    .recv
                    .as_mut()
                    .ok_or_else(|| missing(c, "receive side"))?;
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

    /// A receive completion: the predecessor's tail (and header), or the
    /// successor's head, as events of `engine`.
    fn on_recv(&mut self, wc: &Completion, engine: &mut RankEngine, now: u64) -> Result<()> {
        let sps = self.geometry.slots_per_slice();
        let (id, chan) = self.chan_of(wc)?;
        let c = chan.id;
        let mut events = [None, None];
        match id.kind {
            Kind::TailRecv => {
                let r = chan
                    .recv
                    .as_mut()
                    .ok_or_else(|| missing(c, "receive side"))?;
                check(wc, id.kind, c, r.peer)?;
                r.qp.post_recvs([wc.wr_id])?;
                let imm = wc.imm.ok_or_else(|| no_imm(c, r.peer))?;
                let hdr: [u8; CALL_HEADER_LEN] = r.mailbox.read_array(0).unwrap_or([0; 32]);
                let a = arrival(imm, engine.link(c).recv_tail, sps, &hdr);
                if let Some((step, desc)) = a.header {
                    debug!(channel = c.0, step, call = %desc, "call header");
                    events[0] = Some(Event::Header { step, desc });
                }
                events[1] = Some(Event::Tail(a.tail));
            }
            Kind::CreditRecv => {
                let s = chan.send.as_mut().ok_or_else(|| missing(c, "send side"))?;
                check(wc, id.kind, c, s.peer)?;
                s.qp.post_recvs([wc.wr_id])?;
                // The counter is the truth: it was written before this
                // completion was raised, and possibly again since (so it
                // may be ahead of this completion's immediate, which only
                // wakes us up; a head already known is ignored).
                let word = s.counter.read_word(0).unwrap_or([0; 8]);
                events[1] = Some(Event::Head(decode_credit(word)));
            }
            Kind::Data | Kind::Credit => {
                return Err(Error::Internal(format!(
                    "a send id on a receive queue ({:#x})",
                    wc.wr_id
                )))
            }
        }
        for ev in events.into_iter().flatten() {
            engine
                .handle(now, c, ev)
                .map_err(|e| self.engine_error(e))?;
        }
        Ok(())
    }

    /// Moves every queue pair to ERROR and drains the flushed requests
    /// (bounded), so that no request still reads a caller's buffer.
    pub fn shut_down(&mut self) {
        for chan in &mut self.chans {
            chan.exec_waits = false;
            chan.credit_waits = None;
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

fn opt(v: Option<Rank>) -> String {
    v.map_or_else(|| "-".into(), |r| r.to_string())
}

pub(crate) fn missing(channel: ChannelId, what: &str) -> Error {
    Error::Internal(format!("channel {channel} has no {what}"))
}

fn no_imm(channel: ChannelId, peer: Rank) -> Error {
    Error::Internal(format!(
        "channel {channel}: a receive from rank {peer} without an immediate"
    ))
}

/// The completion's status as a typed error.
fn check(wc: &Completion, kind: Kind, channel: ChannelId, peer: Rank) -> Result<()> {
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
