//! A lane is one rank on one channel: what the simulated transport knows
//! about its two connections. The rank's core [`Engine`] holds the
//! channel's state machine; the simulator only turns what happens on a
//! lane into engine events, carries out the engine's actions, and
//! schedules the lane's wake-ups.

use std::collections::VecDeque;
use std::ops::{Index, IndexMut};

use ringcc_core::prim::Action;
use ringcc_core::progress::{Channel, Driven, Drove, Engine, EngineError, Event, TreeChannel};
use ringcc_core::protocol::post::widen_step;
use ringcc_core::{CallDesc, ChannelId, Rank};

use crate::error::Error;
use crate::events::{secs, Ev, Events, Ps};
use crate::fabric::{Fabric, Hop, LaneTopo, RingRef};
use crate::huge::HugeSlice;
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
    /// RDMA out-connection: its queue pairs (sender's, receiver's).
    pub qp_tx: u32,
    pub qp_rx: u32,
}

/// Credits on their way to a sender, in arrival order: (arrival, head).
///
/// A credit matters to a machine only when it waits for FIFO room (or,
/// after its last step, for its sends to be consumed). So credits are not
/// events: they wait here and are handed over at the lane's next poll at
/// or after their arrival; only a lane that waits for credit gets a
/// wake-up event at the first arrival. The machine sees exactly what eager
/// delivery would show it whenever its behaviour depends on it, at a third
/// fewer events.
///
/// The oldest [`CREDITS_HOT`] sit in the lane (NCCL's geometry has at most
/// four slices in flight); younger ones wait in order in the lane's cold
/// part ([`LaneCold::credits`]) and move up as the old ones are handed
/// over.
#[derive(Clone, Copy, Debug, Default)]
#[repr(C)]
pub(crate) struct Credits {
    first: u8,
    len: u8,
    /// More credits wait in [`LaneCold::credits`].
    spilled: bool,
    /// Low 32 bits of each `head` (widened against the machine's).
    head: [u32; CREDITS_HOT],
    at: [Ps; CREDITS_HOT],
}

/// Credits kept in the lane itself.
pub(crate) const CREDITS_HOT: usize = 4;

impl Credits {
    /// Adds a credit arriving at `at` (not before the previous one);
    /// false when full (the caller keeps it in order elsewhere).
    #[inline]
    fn push(&mut self, at: Ps, head: u64) -> bool {
        if usize::from(self.len) == CREDITS_HOT || self.spilled {
            self.spilled = true;
            return false;
        }
        let i = (usize::from(self.first) + usize::from(self.len)) % CREDITS_HOT;
        self.at[i] = at;
        self.head[i] = head as u32;
        self.len += 1;
        true
    }

    /// The first credit (arrival, low 32 bits of `head`), if any.
    #[inline]
    pub fn front(&self) -> Option<(Ps, u32)> {
        (self.len > 0).then(|| {
            let i = usize::from(self.first) % CREDITS_HOT;
            (self.at[i], self.head[i])
        })
    }

    #[inline]
    fn pop(&mut self) {
        if self.len > 0 {
            self.first = ((usize::from(self.first) + 1) % CREDITS_HOT) as u8;
            self.len -= 1;
        }
    }
}

/// A rank's progress engine: the core's, with its channels inline (`N`
/// of them, at least the cluster's; see [`Lanes`]).
pub(crate) type RankEngine<const N: usize> =
    Engine<RingRef, [Channel<RingRef>; N], Box<[TreeChannel]>>;

/// The engine capacities a simulation is built with: the smallest that
/// holds the configuration's channels ([`Lanes`] says why it must be
/// tight). `ClusterConfig::validate` keeps the channels at 1 to
/// [`MAX_CHANNELS`](ringcc_core::topology::MAX_CHANNELS), the last of these.
pub(crate) const CAPACITIES: [usize; 3] = [16, 32, 64];

/// One (channel, rank): what its events touch.
///
/// `repr(C)` and cache-line aligned so that what every event touches
/// (state, flags, topology, credits) fills two lines; the channel's machine
/// is in its rank's [`RankEngine`]; what events rarely touch is in
/// [`LaneCold`]. With 16 K lanes, cache misses are most of a large run's
/// cost.
#[derive(Debug)]
#[repr(C, align(64))]
pub(crate) struct Lane {
    pub state: LaneState,
    /// A `Wake` event is pending.
    pub wake: bool,
    /// At its last poll the machine waited for credit.
    pub credit_blocked: bool,
    /// Timing-only RDMA out-connection: arrival of the last message, so
    /// that jitter never reorders a reliable connection.
    pub last_arrival: Ps,
    /// Same, for the credits this lane returns.
    pub last_credit: Ps,
    /// The predecessor's `tail` and the successor's `head` as handed to
    /// the engine (the channel's counters there; kept here to widen the
    /// low 32 bits events carry without asking the engine).
    pub recv_tail: u64,
    pub send_head: u64,
    /// Where it sits in the fabric (a copy of the fabric's, kept next to
    /// the machine for the hot path).
    pub t: LaneTopo,
    /// Credits not yet handed to the machine.
    pub credits: Credits,
}

/// The part of a lane its events rarely touch (kept apart: a smaller
/// [`Lane`] is fewer cache misses).
#[derive(Debug, Default)]
pub(crate) struct LaneCold {
    /// A call header the predecessor sent over NVLink (or as a flow),
    /// delivered with the `Tail` that carries `hdr`.
    pub mailbox: Option<(u64, CallDesc)>,
    /// Payload mode, RDMA in-connection: the last `tail` (to widen
    /// immediates).
    pub recv_tail: u64,
    pub mem: LaneMem,
    /// Credits beyond the lane's [`CREDITS_HOT`], in arrival order.
    pub credits: VecDeque<(Ps, u64)>,
}

impl Lane {
    pub fn new(t: LaneTopo) -> Lane {
        Lane {
            t,
            state: LaneState::Idle,
            last_arrival: 0,
            last_credit: 0,
            recv_tail: 0,
            send_head: 0,
            credits: Credits::default(),
            wake: false,
            credit_blocked: false,
        }
    }
}

/// Every lane of the cluster, numbered `channel · ranks + rank` like the
/// fabric's [`LaneTopo`]s, and each rank's engine (its channels'
/// machines). Indexing with a lane number gives its [`Lane`].
///
/// Each engine holds its `N` channels inline, right after its own hot
/// line, so that a channel's address is computed from the rank and channel
/// (the engine finds it with no load from its line either). Storage
/// elsewhere, reached through a pointer in the engine's line, put that
/// line's load before every event's first touch of its machine: 4–6 %
/// slower at 512 and 1024 ranks (`scripts/bench-sim-ab.sh`). `N` is the
/// smallest of [`CAPACITIES`] that holds the cluster's channels: 64 slots
/// for 16 channels ran 3.7 % slower at 1024 ranks than 16 (the ranks'
/// engines four times as far apart).
pub(crate) struct Lanes<const N: usize> {
    /// What every event touches, per lane (on huge pages).
    pub hot: HugeSlice<Lane>,
    /// What events rarely touch, per lane.
    pub cold: Vec<LaneCold>,
    /// Each rank's core progress engine, its channels inline (on huge
    /// pages).
    pub engines: HugeSlice<RankEngine<N>>,
    /// The address of rank 0's channel 0, where rank `r`'s channel `c` is
    /// `r` engines and `c` channels further (for prefetching only: it
    /// never moves; computed, not loaded from the engine, whose line would
    /// miss the cache itself).
    channels: usize,
    /// Channels per rank.
    per_rank: usize,
    /// A lane number's rank and channel, without its lane.
    split: LaneSplit,
}

/// `l / ranks` and `l % ranks` (a lane's channel and rank) by a
/// multiplication, where a lane's rank and channel are wanted before the
/// lane itself is in the cache (a division is tens of cycles).
/// `l · m / 2^32` with `m = ⌈2^32 / ranks⌉` is `⌊l / ranks⌋` whenever
/// `l · ranks ≤ 2^32`: every lane number (below
/// `MAX_RANKS · MAX_CHANNELS`) of every rank count (up to `MAX_RANKS`).
#[derive(Clone, Copy, Debug)]
struct LaneSplit {
    ranks: u64,
    m: u64,
}

impl LaneSplit {
    fn new(ranks: u32) -> LaneSplit {
        let ranks = u64::from(ranks.max(1));
        LaneSplit {
            ranks,
            m: (1u64 << 32).div_ceil(ranks),
        }
    }

    /// (channel, rank) of lane `l`.
    #[inline(always)]
    fn split(self, l: u32) -> (u32, u32) {
        let l = u64::from(l);
        let channel = l.wrapping_mul(self.m) >> 32;
        let rank = l.wrapping_sub(channel.wrapping_mul(self.ranks));
        (channel as u32, rank as u32)
    }
}

/// Cache lines of a channel's machine that events touch: its counters and
/// current step, and its step iterator's hot line.
const MACHINE_HOT_LINES: usize = 3;

impl<const N: usize> Lanes<N> {
    /// A lane per (channel, rank) of `fab`, in engines that give up on a
    /// call after `timeout` without progress; `None` when `N` channels
    /// cannot hold the fabric's.
    pub fn new(fab: &Fabric, timeout: Ps) -> Option<Lanes<N>> {
        let per_rank = fab.channels as usize;
        if per_rank > N {
            return None;
        }
        let hot = HugeSlice::from_fn(fab.lanes.len(), |l| Lane::new(fab.lanes[l]));
        let ranks = fab.ranks as usize;
        let engines = HugeSlice::from_fn(ranks, |r| {
            // Tree storage comes with a rank's first tree call
            // (`Lanes::tree_storage`): a kilobyte per channel that ring
            // runs never touch.
            let channels = std::array::from_fn(|_| Channel::new());
            RankEngine::with_trees(Rank(r as u32), channels, Box::new([]), timeout)
        });
        let channels = engines
            .first()
            .map_or(0, |e| e.channels().as_ptr() as usize);
        Some(Lanes {
            hot,
            cold: (0..fab.lanes.len()).map(|_| LaneCold::default()).collect(),
            engines,
            channels,
            per_rank,
            split: LaneSplit::new(fab.ranks),
        })
    }

    /// The number of lanes.
    #[inline]
    pub fn len(&self) -> u32 {
        self.hot.len() as u32
    }

    /// Starts loading what an event of lane `l` touches: the lane and its
    /// channel's machine (addresses computed, not loaded: a load that
    /// missed would hold the prefetch up).
    #[inline(always)]
    pub fn prefetch(&self, l: u32) {
        self.prefetch_lane(l);
        let (c, rank) = self.split.split(l);
        // Never dereferenced: a hint (an address past the end is harmless).
        let offset = (rank as usize)
            .wrapping_mul(size_of::<RankEngine<N>>())
            .wrapping_add((c as usize).wrapping_mul(size_of::<Channel<RingRef>>()));
        crate::cachehint::prefetch_addr(self.channels.wrapping_add(offset), MACHINE_HOT_LINES);
    }

    /// Starts loading lane `l`.
    #[inline(always)]
    fn prefetch_lane(&self, l: u32) {
        if let Some(lane) = self.hot.get(l as usize) {
            crate::cachehint::prefetch(lane, 2);
        }
    }
}

impl<const N: usize> Lanes<N> {
    /// Gives every engine without tree storage its own, one
    /// [`TreeChannel`] per channel, before a tree call (engines are idle
    /// between calls; storage that never ran a call has nothing to lose).
    pub fn tree_storage(&mut self) {
        for engine in self.engines.iter_mut() {
            if engine.tree_channels().len() < self.per_rank {
                let trees = (0..self.per_rank).map(|_| TreeChannel::new()).collect();
                // Refused only while a call runs; the tree call's start
                // is then refused too (`Busy`) and reported, so this
                // answer adds nothing.
                engine.replace_trees(trees).ok();
            }
        }
    }

    /// Lane `l` and its rank's engine.
    #[inline(always)]
    fn with_engine(&mut self, l: u32) -> (&mut Lane, &mut RankEngine<N>) {
        let lane = &mut self.hot[l as usize];
        let rank = lane.t.rank as usize;
        (lane, &mut self.engines[rank])
    }
}

impl<const N: usize> Index<u32> for Lanes<N> {
    type Output = Lane;

    #[inline(always)]
    fn index(&self, l: u32) -> &Lane {
        &self.hot[l as usize]
    }
}

impl<const N: usize> IndexMut<u32> for Lanes<N> {
    #[inline(always)]
    fn index_mut(&mut self, l: u32) -> &mut Lane {
        &mut self.hot[l as usize]
    }
}

/// Lane `l` waits, for credit if `blocked`: then, with a credit on its
/// way, it needs a wake-up at its arrival.
#[inline(always)]
fn wait_for_credit(events: &mut Events, l: u32, lane: &mut Lane, blocked: bool) {
    lane.credit_blocked = blocked;
    if blocked && !lane.wake {
        if let Some((at, _)) = lane.credits.front() {
            lane.wake = true;
            events.at(at, Ev::Wake { lane: l });
        }
    }
}

/// Moves spilled credits up into the lane's free entries, oldest first.
#[cold]
fn refill_credits(hot: &mut Credits, cold: &mut VecDeque<(Ps, u64)>) {
    hot.spilled = false;
    while let Some(&(at, head)) = cold.front() {
        if !hot.push(at, head) {
            return;
        }
        cold.pop_front();
    }
}

impl<const N: usize> Sim<N> {
    #[inline]
    pub(crate) fn running(&self, l: u32) -> bool {
        self.lanes[l].state == LaneState::Running
    }

    /// Polls lane `l`'s rank engine until it waits, carrying out its
    /// actions on any of the rank's channels: how a call begins (a channel
    /// with nothing to do lets the next one act).
    pub(crate) fn drive_rank(&mut self, l: u32) {
        let lane = &self.lanes[l];
        if lane.state != LaneState::Running {
            return;
        }
        let (rank, c) = (lane.t.rank, ChannelId(lane.t.channel as u8));
        if self.run.before_launch(rank, self.events.now()) {
            return;
        }
        loop {
            match self.lanes.engines[rank as usize].poll() {
                Ok(Some((ch, Action::Exec(e)))) => {
                    let at = self.fab.lane(u32::from(ch.0), rank);
                    self.lanes[at].credit_blocked = false;
                    if let Err(err) = self.start_exec(at, &e) {
                        self.fail_lane(at, err);
                    }
                    return;
                }
                Ok(Some((ch, Action::ReturnCredit { head }))) => {
                    let at = self.fab.lane(u32::from(ch.0), rank);
                    if let Err(err) = self.return_credit(at, head) {
                        self.fail_lane(at, err);
                        return;
                    }
                }
                Ok(Some((ch, Action::Done))) => {
                    self.lane_done(self.fab.lane(u32::from(ch.0), rank));
                    return;
                }
                Ok(None) => {
                    self.wait_for_credit(l, rank, c);
                    return;
                }
                Err(e) => {
                    let err = self.engine_error(rank, e);
                    self.fail_lane(l, err);
                    return;
                }
            }
        }
    }

    /// Hands lane `l` the credits that have arrived, then polls its
    /// channel until it waits, carrying out its actions. Once a call runs
    /// only the channel that had an event has any.
    ///
    /// Its loop ([`drive_with`](Sim::drive_with)) is always inlined into
    /// the two events that drive nearly every slice (a finished slice, a
    /// predecessor's tail), which hand the engine their event with its
    /// first poll: a call saves and restores six registers each time.
    /// Rarer events call [`drive_outlined`](Sim::drive_outlined).
    #[inline(always)]
    pub(crate) fn drive(&mut self, l: u32) {
        let lane = &self.lanes.hot[l as usize];
        if lane.state != LaneState::Running {
            return;
        }
        let (rank, c) = (lane.t.rank, ChannelId(lane.t.channel as u8));
        self.drive_with(l, rank, c, None);
    }

    /// [`drive`](Sim::drive) of a lane known to run, on `rank`'s channel
    /// `c` (what the event that called it has read already), handing the
    /// engine `event` on the channel first (after the credits that have
    /// arrived), with its first poll.
    #[inline(always)]
    fn drive_with(&mut self, l: u32, rank: u32, c: ChannelId, event: Option<Event>) {
        let now = self.events.now();
        // Before its launch a rank's engine holds what arrived and waits.
        if self.run.before_launch(rank, now) {
            if let Some(ev) = event {
                if let Err(e) = self.lanes.engines[rank as usize].handle(now, c, ev) {
                    let err = self.engine_error(rank, e);
                    self.fail_lane(l, err);
                }
            }
            return;
        }
        // The credits that have arrived: the newest is what the machine
        // needs (heads only grow; an older one would be ignored after it).
        let lanes = &mut self.lanes;
        let lane = &mut lanes.hot[l as usize];
        let mut head = None;
        while let Some((at, h)) = lane.credits.front() {
            if at > now {
                break;
            }
            lane.credits.pop();
            if lane.credits.spilled {
                refill_credits(&mut lane.credits, &mut lanes.cold[l as usize].credits);
            }
            let h = widen_step(h, lane.send_head);
            if h > lane.send_head {
                lane.send_head = h;
                head = Some(h);
            }
        }
        let mut event = event;
        loop {
            let driven = self.lanes.engines[rank as usize].drive(now, c, head.take(), event.take());
            let Driven { credit, then } = match driven {
                Ok(d) => d,
                Err(e) => {
                    let err = self.engine_error(rank, e);
                    self.fail_lane(l, err);
                    return;
                }
            };
            if let Some(h) = credit {
                if let Err(err) = self.return_credit(l, h) {
                    self.fail_lane(l, err);
                    return;
                }
            }
            match then {
                Drove::Exec => {
                    let lanes = &mut self.lanes;
                    let Some(e) = lanes.engines[rank as usize].pending(c) else {
                        return;
                    };
                    lanes.hot[l as usize].credit_blocked = false;
                    if let Err(err) = self.start_exec(l, &e) {
                        self.fail_lane(l, err);
                    }
                    return;
                }
                Drove::Credit { head } => {
                    if let Err(err) = self.return_credit(l, head) {
                        self.fail_lane(l, err);
                        return;
                    }
                }
                Drove::Done => {
                    self.lane_done(l);
                    return;
                }
                Drove::Wait { credit } => {
                    wait_for_credit(&mut self.events, l, &mut self.lanes.hot[l as usize], credit);
                    return;
                }
                Drove::Failed => {
                    let engine = &self.lanes.engines[rank as usize];
                    if let Some(e) = engine.failure() {
                        let err = self.engine_error(rank, e);
                        self.fail_lane(l, err);
                    }
                    return;
                }
            }
        }
    }

    /// [`drive`](Sim::drive) as a call: one more copy of the loop for
    /// the rarer events (credit wake-ups, counter reads) is not worth it.
    #[inline(never)]
    fn drive_outlined(&mut self, l: u32) {
        self.drive(l);
    }

    /// Lane `l` waits. Only a lane waiting for credit (FIFO room, or its
    /// sends consumed after its last step) needs a wake-up at the next
    /// credit's arrival.
    fn wait_for_credit(&mut self, l: u32, rank: u32, c: ChannelId) {
        let blocked = self.lanes.engines[rank as usize].waits_for_credit(c);
        wait_for_credit(
            &mut self.events,
            l,
            &mut self.lanes.hot[l as usize],
            blocked,
        );
    }

    /// A credit for lane `l` (a sender) that arrives at `at`. Always
    /// inlined: nearly every credit only joins the lane's hot queue (a
    /// call would cost as much again in saved registers); a spill or a
    /// wake-up is [`push_credit_rare`](Sim::push_credit_rare).
    #[inline(always)]
    pub(crate) fn push_credit(&mut self, l: u32, at: Ps, head: u64) {
        let lane = &mut self.lanes[l];
        let kept = lane.credits.push(at, head);
        if !kept || (lane.credit_blocked && !lane.wake) {
            self.push_credit_rare(l, at, head, kept);
        }
    }

    /// The rest of [`push_credit`](Sim::push_credit): a credit the hot
    /// queue did not keep waits in the cold one, and a lane that waits
    /// for credit gets a wake-up at the first arrival.
    #[cold]
    #[inline(never)]
    fn push_credit_rare(&mut self, l: u32, at: Ps, head: u64, kept: bool) {
        let lanes = &mut self.lanes;
        let lane = &mut lanes.hot[l as usize];
        if !kept {
            lanes.cold[l as usize].credits.push_back((at, head));
        }
        if lane.credit_blocked && !lane.wake {
            lane.wake = true;
            let first = lane.credits.front().map_or(at, |(t, _)| t);
            self.events.at(first, Ev::Wake { lane: l });
        }
    }

    /// A credit wake-up.
    pub(crate) fn on_wake(&mut self, l: u32) {
        self.lanes[l].wake = false;
        self.drive_outlined(l);
    }

    /// Hands lane `l`'s engine `event` on the lane's channel; false (the
    /// lane failed) when the engine refuses it.
    #[inline(always)]
    fn feed(&mut self, l: u32, event: Event) -> bool {
        let now = self.events.now();
        let t = self.lanes[l].t;
        match self.lanes.engines[t.rank as usize].handle(now, ChannelId(t.channel as u8), event) {
            Ok(()) => true,
            Err(e) => {
                let err = self.engine_error(t.rank, e);
                self.fail_lane(l, err);
                false
            }
        }
    }

    /// A rank engine's failure as the simulator's error.
    #[cold]
    pub(crate) fn engine_error(&self, rank: u32, e: EngineError) -> Error {
        match e {
            EngineError::Machine {
                channel,
                during,
                source,
            } => Error::Core {
                rank: Rank(rank),
                channel,
                call: during,
                source,
            },
            EngineError::Timeout(stall) => Error::Timeout {
                rank: Rank(rank),
                channel: stall.channel,
                waited: secs(stall.waited),
                waiting_for: stall.blocked.what(),
            },
            other => Error::BadConfig {
                what: format!("rank {rank}'s engine: {other}"),
            },
        }
    }

    /// The lane's outstanding slice is complete.
    pub(crate) fn on_exec_done(&mut self, l: u32) {
        let (lane, engine) = self.lanes.with_engine(l);
        if lane.state != LaneState::Running {
            return;
        }
        let t = lane.t;
        self.run.last_exec = self.run.last_exec.max(self.events.now());
        // Only a slice sent over RDMA needs its exec after it is done.
        let exec = match t.hop {
            Hop::Net { .. } => engine.pending(t.channel_id()).filter(|e| e.send.is_some()),
            _ => None,
        };
        // The slice leaves before the engine hears it is done (the send
        // does not look at the engine): the engine's first poll comes with
        // the event.
        if let Some(e) = exec {
            if let Err(err) = self.net_send(l, &e) {
                self.fail_lane(l, err);
                return;
            }
        }
        self.drive_with(l, t.rank, t.channel_id(), Some(Event::ExecDone));
    }

    /// The predecessor's `tail` (and maybe call header) became visible.
    pub(crate) fn on_tail(&mut self, l: u32, hdr: bool, xfer: u32, tail: u32) {
        if xfer != crate::events::NONE {
            self.land(xfer);
        }
        let header = if hdr {
            self.lanes.cold[l as usize].mailbox.take()
        } else {
            None
        };
        // Events carry the low 32 bits of the step counter; a connection's
        // tails arrive in order and never move by 2^32 at once.
        let known = self.lanes[l].recv_tail;
        self.deliver_tail(l, header, widen_step(tail, known));
    }

    /// Feeds lane `l` the predecessor's call header (if any) and `tail`.
    /// Always inlined into the run loop's `Tail` dispatch (a call per
    /// event, saving and restoring six registers, otherwise).
    #[inline(always)]
    pub(crate) fn deliver_tail(&mut self, l: u32, header: Option<(u64, CallDesc)>, tail: u64) {
        let now = self.events.now();
        let (lane, engine) = self.lanes.with_engine(l);
        if lane.state != LaneState::Running {
            return;
        }
        let (rank, c) = (lane.t.rank, lane.t.channel_id());
        if let Some((step, desc)) = header {
            if let Err(e) = engine.handle(now, c, Event::Header { step, desc }) {
                let err = self.engine_error(rank, e);
                self.fail_lane(l, err);
                return;
            }
        }
        lane.recv_tail = tail;
        self.drive_with(l, rank, c, Some(Event::Tail(tail)));
    }

    /// The successor's `head` arrived.
    pub(crate) fn on_head(&mut self, l: u32, head: u64) {
        if !self.running(l) {
            return;
        }
        // A counter read may show a value already handled.
        if head > self.lanes[l].send_head && self.feed(l, Event::Head(head)) {
            self.lanes[l].send_head = head;
            self.drive_outlined(l);
        }
    }

    /// Returns credit `head` from lane `l` to its predecessor.
    #[inline(always)]
    pub(crate) fn return_credit(&mut self, l: u32, head: u64) -> Result<(), Error> {
        self.stats.credits += 1;
        let t = self.lanes[l].t;
        let pred = self.fab.lane(t.channel, t.prev);
        match self.lanes[pred].t.hop {
            Hop::Loopback => Ok(()),
            Hop::Nvlink { link } => {
                // A flag store over NVLink: latency only.
                let now = self.events.now();
                if self.faults.nvlinks.delivers(t.rank, t.prev, now) {
                    debug_assert_eq!(
                        self.fab.links[link as usize].latency,
                        self.time.nvlink_latency
                    );
                    let at = now.saturating_add(self.time.nvlink_latency);
                    self.push_credit(pred, at, head);
                }
                Ok(())
            }
            Hop::Net { .. } => self.net_credit(l, pred, head),
        }
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{align_of, offset_of};

    /// The lane fills two cache lines (what the run loop prefetches, with
    /// the machine's lines in the rank's engine).
    #[test]
    fn a_lane_is_two_cache_lines() {
        assert_eq!(align_of::<Lane>(), 64);
        assert!(offset_of!(Lane, credits) + std::mem::size_of::<Credits>() <= 128);
        assert_eq!(std::mem::size_of::<Lane>(), 128);
    }

    /// Engines of `N` channels take a fabric of up to `N` channels and
    /// refuse a larger one (the simulation then fails to build with a
    /// configuration error, not a panic); the prefetch address of every
    /// rank's channels is where the engine keeps them.
    #[test]
    fn lanes_hold_up_to_their_capacity() {
        use crate::config::ClusterConfig;
        let fab = |channels| {
            let cfg = ClusterConfig {
                nodes: 2,
                gpus_per_node: 2,
                channels,
                ..ClusterConfig::default()
            };
            Fabric::build(&cfg).unwrap()
        };
        let lanes = Lanes::<16>::new(&fab(16), 1).unwrap();
        let stride = std::mem::size_of::<RankEngine<16>>();
        let slot = std::mem::size_of::<Channel<RingRef>>();
        for (r, engine) in lanes.engines.iter().enumerate() {
            for (c, ch) in engine.channels().iter().enumerate() {
                assert_eq!(
                    ch as *const _ as usize,
                    lanes.channels + r * stride + c * slot
                );
            }
        }
        assert!(Lanes::<16>::new(&fab(17), 1).is_none());
        assert!(Lanes::<32>::new(&fab(17), 1).is_some());
        let cfg = ClusterConfig {
            channels: 17,
            ..ClusterConfig::default()
        };
        assert!(matches!(Sim::<16>::new(cfg), Err(Error::BadConfig { .. })));
    }

    /// The multiplications give a lane's channel and rank exactly.
    #[test]
    fn lane_split_is_division() {
        use ringcc_core::topology::{MAX_CHANNELS, MAX_RANKS};
        let max_ranks = MAX_RANKS as u32;
        for ranks in [1u32, 2, 3, 7, 8, 100, 128, 1000, 1024, 4095, max_ranks] {
            let sp = LaneSplit::new(ranks);
            let lanes = ranks * MAX_CHANNELS;
            let mut rng = crate::faults::Rng::new(u64::from(ranks));
            let probes = (0..lanes.min(70_000))
                .chain([lanes - 1, lanes - ranks, ranks - 1, ranks])
                .chain((0..5000).map(|_| (rng.next_u64() % u64::from(lanes)) as u32));
            for l in probes {
                assert_eq!(sp.split(l), (l / ranks, l % ranks), "{l} / {ranks}");
            }
        }
    }

    /// Credits beyond the hot four wait in order in the cold part and come
    /// back in arrival order.
    #[test]
    fn credits_spill_and_refill_in_order() {
        let mut hot = Credits::default();
        let mut cold = VecDeque::new();
        for k in 0..10u64 {
            if !hot.push(100 + k, 8 * k) {
                cold.push_back((100 + k, 8 * k));
            }
        }
        assert_eq!(cold.len(), 10 - CREDITS_HOT);
        let mut got = Vec::new();
        while let Some((at, head)) = hot.front() {
            got.push((at, u64::from(head)));
            hot.pop();
            if hot.spilled {
                refill_credits(&mut hot, &mut cold);
            }
            // A credit arriving meanwhile queues behind the spilled ones.
            if got.len() == 2 && !hot.push(200, 80) {
                cold.push_back((200, 80));
            }
        }
        let mut want: Vec<(Ps, u64)> = (0..10u64).map(|k| (100 + k, 8 * k)).collect();
        want.push((200, 80));
        assert_eq!(got, want);
        assert!(cold.is_empty());
    }
}
