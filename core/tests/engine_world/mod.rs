//! An in-memory world of ranks, each driven by its own [`Engine`], for the
//! engine's property tests: every rank's FIFO per channel as bytes with a
//! "which step of which call is here" tag per slot (a slot overwritten
//! before it was read, read twice, or read at the wrong step panics), and
//! per connection two in-order queues of events (header and tail to the
//! receiver, head to the sender). A seeded [`Rng`] picks every move: poll
//! a rank, start its next call, complete an outstanding exec, deliver (or
//! coalesce, or repeat) a queued event.

#![allow(dead_code, reason = "each test file uses part of the world")]

use std::collections::{HashSet, VecDeque};

use ringcc_core::fifo::{FifoGeometry, STEPS};
use ringcc_core::prim::{slice_result, Action, Blocked, Exec, Next};
use ringcc_core::progress::{ArrayEngine, Driven, Drove, EngineError, Event};
use ringcc_core::rng::Rng;
use ringcc_core::verify::{fill_expected, fill_input};
use ringcc_core::{Call, ChannelId, Error, Plan, Primitive, Rank, RingIndex, RingOrder};

/// Channels an engine of the world has room for.
pub const CAP: usize = 3;
/// Most ranks in a world.
pub const MAX_N: usize = 5;

/// A ring in any order of up to [`MAX_N`] ranks: `order[i]` is the rank
/// at ring index `i`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Perm {
    pub n: u32,
    pub order: [u32; MAX_N],
}

impl Perm {
    pub fn identity(n: u32) -> Perm {
        Perm {
            n,
            order: [0, 1, 2, 3, 4],
        }
    }

    pub fn reversed(n: u32) -> Perm {
        let mut p = Perm::identity(n);
        p.order[..n as usize].reverse();
        p
    }

    pub fn shuffled(n: u32, rng: &mut Rng) -> Perm {
        let mut p = Perm::identity(n);
        for i in (1..n as usize).rev() {
            let j = rng.below(i as u64 + 1) as usize;
            p.order.swap(i, j);
        }
        p
    }

    fn pos(&self, r: u32) -> usize {
        self.order[..self.n as usize]
            .iter()
            .position(|&x| x == r)
            .expect("rank on the ring")
    }

    pub fn next(&self, r: u32) -> u32 {
        self.order[(self.pos(r) + 1) % self.n as usize]
    }

    pub fn prev(&self, r: u32) -> u32 {
        let n = self.n as usize;
        self.order[(self.pos(r) + n - 1) % n]
    }
}

impl RingOrder for Perm {
    fn ranks(&self) -> u32 {
        self.n
    }
    fn rank_at(&self, index: RingIndex) -> Result<Rank, Error> {
        match self.order[..self.n as usize].get(index.0 as usize) {
            Some(&r) => Ok(Rank(r)),
            None => Err(Error::RankOutOfRange {
                rank: index.0,
                ranks: self.n,
            }),
        }
    }
    fn index_of(&self, rank: Rank) -> Result<RingIndex, Error> {
        match self.order[..self.n as usize]
            .iter()
            .position(|&x| x == rank.0)
        {
            Some(i) => Ok(RingIndex(i as u32)),
            None => Err(Error::RankOutOfRange {
                rank: rank.0,
                ranks: self.n,
            }),
        }
    }
}

/// One call as a rank makes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallSpec {
    pub call: Call,
    pub chunk_bytes: u64,
    pub salt: u64,
    /// Channels of the call's plan (at most [`CAP`]).
    pub channels: u32,
}

pub type Eng = ArrayEngine<Perm, CAP>;

/// One slot of a receiver's FIFO.
#[derive(Clone, Debug, Default)]
struct Slot {
    /// `(seq, step)` of the data in it; `None` once read.
    tag: Option<(u64, u64)>,
    bytes: Vec<u8>,
}

/// The connection into rank `r` on channel `c` (from its predecessor on
/// that channel's ring): the FIFO in `r`'s memory and both queues.
#[derive(Debug, Default)]
struct Conn {
    slots: Vec<Slot>,
    /// Header and tail events for the receiver, in order.
    data: VecDeque<Event>,
    /// Head events for the sender, in order.
    credit: VecDeque<Event>,
}

struct Bufs {
    input: Vec<u8>,
    output: Vec<u8>,
    /// How often each output element was written.
    writes: Vec<u32>,
}

pub struct RankState {
    pub engine: Eng,
    /// The next call to start.
    pub next_call: usize,
    /// The running call.
    pub current: Option<usize>,
    /// Channels of the running call that handed out `Done`.
    done: u32,
    /// Polling may produce an action.
    dirty: bool,
    bufs: Vec<Bufs>,
    /// The first error, in tolerant mode.
    pub failure: Option<EngineError>,
    /// Per channel, what `receives_ahead` said at the running call's last
    /// `ReturnCredit` so far.
    ahead: [Option<bool>; CAP],
}

#[derive(Clone, Copy, Debug)]
struct Outstanding {
    rank: u32,
    channel: u8,
    call: usize,
    exec: Exec,
}

/// How the world treats an engine's error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Every error fails the test; so does getting stuck.
    Strict,
    /// Errors are recorded per rank; the failed rank takes no more moves.
    Tolerant,
}

pub struct World {
    pub n: u32,
    pub geometry: FifoGeometry,
    pub rings: [Perm; CAP],
    /// `calls[r]`: the calls rank `r` makes, in order.
    pub calls: Vec<Vec<CallSpec>>,
    pub ranks: Vec<RankState>,
    conns: Vec<Conn>,
    outstanding: Vec<Outstanding>,
    seen: HashSet<(u32, u8, u64, u64, u32, u64)>,
    pub rng: Rng,
    pub now: u64,
    pub mode: Mode,
    /// Start a rank's next call as soon as it is idle (else: a move).
    pub eager_start: f64,
    /// Poll one channel at a time (`Engine::poll_channel`, from a random
    /// one on) instead of the whole rank (`Engine::poll`).
    pub per_channel: bool,
    /// Moves taken.
    pub moves: u64,
    /// Execs completed.
    pub execs: u64,
}

fn plan_of(n: u32, s: &CallSpec) -> Plan {
    s.call.plan(n, s.channels, s.chunk_bytes).expect("plan")
}

impl World {
    /// A world of `calls.len()` ranks; `rings[c]` is channel `c`'s ring.
    pub fn new(
        geometry: FifoGeometry,
        rings: [Perm; CAP],
        calls: Vec<Vec<CallSpec>>,
        seed: u64,
        mode: Mode,
    ) -> World {
        let n = calls.len() as u32;
        let ranks = calls
            .iter()
            .enumerate()
            .map(|(r, list)| RankState {
                engine: Eng::new(Rank(r as u32), Default::default(), u64::MAX / 4),
                next_call: 0,
                current: None,
                done: 0,
                dirty: false,
                bufs: list
                    .iter()
                    .map(|s| {
                        let plan = plan_of(n, s);
                        let es = s.call.elem();
                        let mut input = vec![0u8; plan.input_len() as usize * es];
                        fill_input(&plan, s.call.op, r as u32, s.salt, &mut input).unwrap();
                        let out = plan.output_len() as usize;
                        Bufs {
                            input,
                            output: vec![0xa5; out * es],
                            writes: vec![0; out],
                        }
                    })
                    .collect(),
                failure: None,
                ahead: [None; CAP],
            })
            .collect();
        let conns = (0..n as usize * CAP)
            .map(|_| Conn {
                slots: vec![Slot::default(); STEPS as usize],
                ..Conn::default()
            })
            .collect();
        World {
            n,
            geometry,
            rings,
            calls,
            ranks,
            conns,
            outstanding: Vec::new(),
            seen: HashSet::new(),
            rng: Rng::new(seed),
            now: 0,
            mode,
            eager_start: 0.5,
            per_channel: false,
            moves: 0,
            execs: 0,
        }
    }

    fn conn(&mut self, r: u32, c: u8) -> &mut Conn {
        &mut self.conns[r as usize * CAP + c as usize]
    }

    fn live(&self, r: u32) -> bool {
        self.ranks[r as usize].failure.is_none()
    }

    fn fail(&mut self, r: u32, what: &str, e: EngineError) {
        match self.mode {
            Mode::Strict => panic!("rank {r}: {what}: {e} ({e:?})"),
            Mode::Tolerant => {
                let st = &mut self.ranks[r as usize];
                if st.failure.is_none() {
                    st.failure = Some(e);
                }
            }
        }
    }

    /// Every rank made all its calls.
    pub fn finished(&self) -> bool {
        self.ranks
            .iter()
            .zip(&self.calls)
            .all(|(st, list)| st.engine.is_idle() && st.next_call == list.len())
    }

    /// Runs until no move is left (or `limit` moves); returns whether the
    /// world ran out of moves (false: the limit was hit).
    pub fn run(&mut self, limit: u64) -> bool {
        while self.moves < limit {
            if !self.step() {
                return true;
            }
        }
        false
    }

    /// Takes one random move; false when none is left.
    pub fn step(&mut self) -> bool {
        let n = self.n;
        let mut polls = Vec::new();
        let mut starts = Vec::new();
        for r in 0..n {
            let st = &self.ranks[r as usize];
            if !self.live(r) {
                continue;
            }
            if st.dirty {
                polls.push(r);
            }
            if st.engine.is_idle() && st.next_call < self.calls[r as usize].len() {
                starts.push(r);
            }
        }
        let mut data = Vec::new();
        let mut credit = Vec::new();
        for r in 0..n {
            for c in 0..CAP as u8 {
                let conn = &self.conns[r as usize * CAP + c as usize];
                if !conn.data.is_empty() && self.live(r) {
                    data.push((r, c));
                }
                if !conn.credit.is_empty() && self.live(self.rings[c as usize].prev(r)) {
                    credit.push((r, c));
                }
            }
        }
        let live_execs: Vec<usize> = (0..self.outstanding.len())
            .filter(|&i| self.live(self.outstanding[i].rank))
            .collect();
        let kinds = [
            polls.len(),
            starts.len(),
            live_execs.len(),
            data.len(),
            credit.len(),
        ];
        let nonempty: Vec<usize> = (0..kinds.len()).filter(|&k| kinds[k] > 0).collect();
        if nonempty.is_empty() {
            return false;
        }
        self.moves += 1;
        self.now += 1;
        let kind = nonempty[self.rng.below(nonempty.len() as u64) as usize];
        let pick = self.rng.below(kinds[kind] as u64) as usize;
        match kind {
            0 => {
                let one = self.rng.chance(0.5);
                self.poll(polls[pick], one);
            }
            1 => self.start(starts[pick]),
            2 => self.complete(live_execs[pick]),
            3 => {
                let (r, c) = data[pick];
                self.deliver_data(r, c);
            }
            _ => {
                let (r, c) = credit[pick];
                self.deliver_credit(r, c);
            }
        }
        if self.mode == Mode::Strict && self.rng.chance(0.05) {
            let now = self.now;
            for st in &mut self.ranks {
                st.engine.handle_timeout(now).expect("no deadline passes");
            }
        }
        true
    }

    pub fn start(&mut self, r: u32) {
        let n = self.n;
        let now = self.now;
        let rings = self.rings;
        let geometry = self.geometry;
        let st = &mut self.ranks[r as usize];
        let k = st.next_call;
        let spec = self.calls[r as usize][k];
        let plan = plan_of(n, &spec);
        assert_eq!(st.engine.seq(), k as u64, "rank {r}: seq before call {k}");
        assert_eq!(st.engine.rank(), Rank(r));
        assert_eq!(st.engine.channels().len(), CAP);
        match st
            .engine
            .start(now, &spec.call, &plan, geometry, |c| rings[c.0 as usize])
        {
            Ok(desc) => {
                assert_eq!(
                    desc,
                    spec.call.desc(k as u64),
                    "rank {r}: the call's header"
                );
                assert!(!st.engine.is_idle());
                assert_eq!(st.engine.call(), Some(desc));
                st.next_call += 1;
                st.current = Some(k);
                st.done = 0;
                st.dirty = true;
            }
            Err(e) => self.fail(r, "start", e),
        }
    }

    pub fn poll(&mut self, r: u32, one: bool) {
        if self.per_channel {
            self.poll_channels(r, one);
            return;
        }
        for polls in 0.. {
            assert!(polls < 100_000, "rank {r}: actions without end");
            let st = &mut self.ranks[r as usize];
            match st.engine.poll() {
                Ok(Some((c, a))) => {
                    self.carry(r, c, a);
                    if self.ranks[r as usize].engine.is_idle() {
                        self.finish_call(r);
                        return;
                    }
                    if one {
                        return;
                    }
                }
                Ok(None) => {
                    st.dirty = false;
                    if !st.engine.is_idle() {
                        self.check_blocked(r);
                    }
                    return;
                }
                Err(e) => {
                    self.fail(r, "poll", e);
                    return;
                }
            }
        }
    }

    /// [`poll`](World::poll) one channel at a time: each channel, from a
    /// random one on, until it has nothing (the exec of a `Next::Exec`
    /// read back with `pending`).
    fn poll_channels(&mut self, r: u32, one: bool) {
        let first = self.rng.below(CAP as u64) as u8;
        let mut polls = 0;
        for k in 0..CAP as u8 {
            let c = ChannelId((first + k) % CAP as u8);
            loop {
                polls += 1;
                assert!(polls < 100_000, "rank {r}: actions without end");
                let st = &mut self.ranks[r as usize];
                let a = match st.engine.poll_channel(c) {
                    Ok(Some(Next::Exec)) => {
                        Action::Exec(st.engine.pending(c).expect("the exec is pending"))
                    }
                    Ok(Some(Next::ReturnCredit { head })) => Action::ReturnCredit { head },
                    Ok(Some(Next::Done)) => Action::Done,
                    Ok(None) => break,
                    Err(e) => {
                        self.fail(r, "poll_channel", e);
                        return;
                    }
                };
                self.carry(r, c, a);
                if self.ranks[r as usize].engine.is_idle() {
                    self.finish_call(r);
                    return;
                }
                if one {
                    return;
                }
            }
        }
        let st = &mut self.ranks[r as usize];
        assert_eq!(st.engine.poll(), Ok(None), "rank {r}: every channel polled");
        st.dirty = false;
        if !st.engine.is_idle() {
            self.check_blocked(r);
        }
    }

    /// After `poll` said `None`: every open channel waits for something
    /// this world can name, and the stall report agrees.
    fn check_blocked(&self, r: u32) {
        let st = &self.ranks[r as usize];
        let k = st.current.expect("a running call");
        let used = self.calls[r as usize][k].channels;
        let mut first = None;
        for c in 0..used as u8 {
            let id = ChannelId(c);
            let b = st.engine.blocked_on(id);
            // The cheap question a simulator asks after every poll agrees
            // with the full report.
            assert_eq!(
                st.engine.waits_for_credit(id),
                matches!(b, Blocked::Credit { .. }),
                "rank {r} ch {c}: waits_for_credit vs {b:?}"
            );
            let busy = self
                .outstanding
                .iter()
                .any(|o| o.rank == r && o.channel == c);
            let link = st.engine.link(id);
            match b {
                Blocked::Exec => assert!(busy, "rank {r} ch {c}: Exec without an exec out"),
                Blocked::Data { tail, need } => {
                    assert!(
                        !busy && tail < need && tail == link.recv_tail,
                        "{b:?} {link:?}"
                    )
                }
                Blocked::Credit { head, need } => {
                    assert!(
                        !busy && head < need && head == link.send_head,
                        "{b:?} {link:?}"
                    )
                }
                Blocked::Done => assert!(st.done & (1 << c) != 0, "rank {r} ch {c}: Done"),
                Blocked::Ready | Blocked::Failed => {
                    panic!("rank {r} ch {c}: {b:?} after poll gave nothing")
                }
            }
            let credit = matches!(b, Blocked::Credit { .. });
            assert_eq!(
                st.engine.waits_for_credit(id),
                credit,
                "rank {r} ch {c}: {b:?}"
            );
            let m = st.engine.machine(id).expect("a machine");
            assert_eq!(m.waits_for_credit(), credit, "rank {r} ch {c}: {b:?}");
            let done = st.engine.machine(id).is_some_and(|m| m.is_done());
            assert_eq!(done, b == Blocked::Done, "rank {r} ch {c}: is_done");
            if b != Blocked::Done && first.is_none() {
                first = Some((id, b));
            }
        }
        let stall = st.engine.stall(self.now);
        let (channel, blocked) = first.expect("an open channel");
        assert_eq!(stall.rank, Rank(r));
        assert_eq!(stall.seq, k as u64);
        assert_eq!((stall.channel, stall.blocked), (channel, blocked));
        assert_eq!(stall.open, used - st.done.count_ones());
        assert!(st.engine.poll_timeout().is_some());
    }

    fn carry(&mut self, r: u32, c: ChannelId, a: Action) {
        let st = &mut self.ranks[r as usize];
        let k = st.current.expect("a running call");
        let seq = k as u64;
        match a {
            Action::Exec(e) => {
                let key = (r, c.0, seq, e.loop_index, e.step_index, e.slice);
                assert!(self.seen.insert(key), "exec handed out twice: {key:?}");
                assert_eq!(st.engine.pending(c), Some(e), "pending is the exec");
                assert_eq!(st.engine.blocked_on(c), Blocked::Exec);
                assert!(
                    !self
                        .outstanding
                        .iter()
                        .any(|o| o.rank == r && o.channel == c.0),
                    "two execs out on rank {r} channel {}",
                    c.0
                );
                if let Some(h) = e.header {
                    assert!(e.send.is_some(), "a header without a send");
                    assert_eq!(Some(h), st.engine.call());
                }
                self.outstanding.push(Outstanding {
                    rank: r,
                    channel: c.0,
                    call: k,
                    exec: e,
                });
            }
            Action::ReturnCredit { head } => {
                assert_eq!(st.engine.link(c).recv_next, head);
                // Only the call's last credit on the channel says that no
                // more will come.
                let ahead = st.engine.receives_ahead(c);
                let slot = &mut st.ahead[usize::from(c.0)];
                assert_ne!(
                    *slot,
                    Some(false),
                    "rank {r} channel {}: a credit after the call's last",
                    c.0
                );
                *slot = Some(ahead);
                self.conn(r, c.0).credit.push_back(Event::Head(head));
            }
            Action::Done => {
                let bit = 1u32 << c.0;
                assert!(st.done & bit == 0, "Done twice on rank {r} channel {}", c.0);
                st.done |= bit;
                assert_eq!(st.engine.blocked_on(c), Blocked::Done);
                assert_eq!(st.engine.pending(c), None);
            }
        }
    }

    /// Rank `r`'s call ended: its output is the reference, every element
    /// written once; its sequence number moved on.
    fn finish_call(&mut self, r: u32) {
        let n = self.n;
        let st = &mut self.ranks[r as usize];
        let k = st.current.take().expect("a running call");
        let spec = self.calls[r as usize][k];
        assert_eq!(st.done, (1u32 << spec.channels) - 1, "every channel Done");
        assert_eq!(st.engine.seq(), k as u64 + 1, "seq advances per call");
        assert_eq!(st.engine.poll_timeout(), None);
        assert!(!self.outstanding.iter().any(|o| o.rank == r));
        for (c, ahead) in st.ahead.iter_mut().enumerate() {
            assert_ne!(
                ahead.take(),
                Some(true),
                "rank {r} channel {c}: the call's last credit said more would come"
            );
            assert!(!st.engine.receives_ahead(ChannelId(c as u8)), "idle");
        }
        st.dirty = false;
        let plan = plan_of(n, &spec);
        let b = &st.bufs[k];
        let mut want = vec![0u8; b.output.len()];
        let defined = fill_expected(&plan, spec.call.op, r, 0, spec.salt, &mut want).unwrap();
        let es = spec.call.elem();
        if defined {
            for (i, (w, g)) in want.chunks(es).zip(b.output.chunks(es)).enumerate() {
                assert_eq!(
                    w,
                    g,
                    "rank {r} call {k} ({:?}, n={n}): element {i} of {}",
                    spec.call,
                    b.writes.len()
                );
            }
            assert!(
                b.writes.iter().all(|&w| w == 1),
                "each element written once"
            );
        } else {
            assert!(
                b.writes.iter().all(|&w| w == 0),
                "undefined output untouched"
            );
        }
        if self.rng.chance(self.eager_start) && st.next_call < self.calls[r as usize].len() {
            self.start(r);
        }
    }

    /// Hands rank `r` `ev` on channel `c`. In per-channel mode, half the
    /// time with its first poll (`Engine::handle_poll`), whose action is
    /// carried out at once, as a backend driving one channel does.
    fn handle(&mut self, r: u32, c: u8, ev: Event) {
        let now = self.now;
        if self.per_channel && self.rng.chance(0.4) {
            self.drive(r, c, ev);
            return;
        }
        let with_poll = self.per_channel && self.rng.chance(0.5);
        let st = &mut self.ranks[r as usize];
        let first = if with_poll {
            match st.engine.handle_poll(now, ChannelId(c), ev) {
                Ok(next) => next,
                Err(e) => return self.fail(r, "handle_poll", e),
            }
        } else {
            match st.engine.handle(now, ChannelId(c), ev) {
                Ok(()) => None,
                Err(e) => return self.fail(r, "handle", e),
            }
        };
        let st = &mut self.ranks[r as usize];
        st.dirty = true;
        // The machine's counters, as its accessors and its link state say.
        if let Some(m) = st.engine.machine(ChannelId(c)) {
            let link = st.engine.link(ChannelId(c));
            assert_eq!(
                (m.recv_tail(), m.send_head()),
                (link.recv_tail, link.send_head)
            );
            if let Event::Tail(t) = ev {
                assert!(m.recv_tail() >= t, "rank {r} ch {c}: tail {t} not seen");
            }
        }
        if let Some(next) = first {
            let c = ChannelId(c);
            let a = match next {
                Next::Exec => Action::Exec(st.engine.pending(c).expect("the exec is pending")),
                Next::ReturnCredit { head } => Action::ReturnCredit { head },
                Next::Done => Action::Done,
            };
            self.carry(r, c, a);
            if self.ranks[r as usize].engine.is_idle() {
                self.finish_call(r);
            }
        }
    }

    /// Hands rank `r` `ev` on channel `c` through `Engine::drive`: the
    /// event's whole loop on the channel in one call (a credit as its
    /// `head` argument half the time), every credit and exec carried out
    /// as it comes, until the channel waits — as the simulator drives.
    fn drive(&mut self, r: u32, c: u8, ev: Event) {
        let now = self.now;
        let ch = ChannelId(c);
        let (mut head, mut event) = match ev {
            Event::Head(h) if self.rng.chance(0.5) => (Some(h), None),
            ev => (None, Some(ev)),
        };
        self.ranks[r as usize].dirty = true;
        for rounds in 0.. {
            assert!(rounds < 100_000, "rank {r} ch {c}: credits without end");
            let st = &mut self.ranks[r as usize];
            let Driven { credit, then } = match st.engine.drive(now, ch, head.take(), event.take())
            {
                Ok(d) => d,
                Err(e) => return self.fail(r, "drive", e),
            };
            if let Some(head) = credit {
                self.carry(r, ch, Action::ReturnCredit { head });
            }
            let st = &mut self.ranks[r as usize];
            match then {
                Drove::Exec => {
                    let e = st.engine.pending(ch).expect("the exec is pending");
                    self.carry(r, ch, Action::Exec(e));
                }
                Drove::Credit { head } => {
                    self.carry(r, ch, Action::ReturnCredit { head });
                    continue;
                }
                Drove::Done => {
                    self.carry(r, ch, Action::Done);
                    if self.ranks[r as usize].engine.is_idle() {
                        self.finish_call(r);
                    }
                }
                Drove::Wait { credit } => {
                    assert_eq!(credit, st.engine.waits_for_credit(ch), "rank {r} ch {c}");
                }
                Drove::Failed => {
                    let e = st.engine.failure().expect("a failed drive poisons");
                    return self.fail(r, "drive", e);
                }
            }
            return;
        }
    }

    pub fn complete(&mut self, i: usize) {
        let o = self.outstanding.swap_remove(i);
        let (r, c, e) = (o.rank, o.channel, o.exec);
        let spec = self.calls[r as usize][o.call];
        let (dtype, op) = (spec.call.dtype, spec.call.op);
        let es = spec.call.elem();
        let bytes = e.count as usize * es;
        let seq = o.call as u64;
        let sb = self.geometry.slot_bytes() as usize;
        let incoming = e.recv.map(|span| {
            let conn = self.conn(r, c);
            let mut data = Vec::new();
            for k in 0..span.slots {
                let step = span.step + k;
                let slot = &mut conn.slots[(step % STEPS) as usize];
                assert_eq!(
                    slot.tag,
                    Some((seq, step)),
                    "rank {r} ch {c}: slot of step {step} (call {seq}) lost or overwritten"
                );
                slot.tag = None;
                data.extend_from_slice(&slot.bytes);
            }
            assert_eq!(data.len(), bytes, "rank {r} ch {c}: slice length");
            data
        });
        let p = e.primitive;
        let b = &self.ranks[r as usize].bufs[o.call];
        let local = p.reads_input().then(|| {
            let at = e.input_offset as usize * es;
            b.input[at..at + bytes].to_vec()
        });
        let mut out = vec![0u8; bytes];
        slice_result(
            p,
            dtype,
            op,
            self.n,
            incoming.as_deref(),
            local.as_deref(),
            &mut out,
        )
        .expect("slice_result");
        if p.contains(Primitive::COPY) {
            let b = &mut self.ranks[r as usize].bufs[o.call];
            let at = e.output_offset as usize;
            b.output[at * es..at * es + bytes].copy_from_slice(&out);
            for w in &mut b.writes[at..at + e.count as usize] {
                *w += 1;
            }
        }
        if let Some(span) = e.send {
            let succ = self.rings[c as usize].next(r);
            let conn = self.conn(succ, c);
            for k in 0..span.slots {
                let step = span.step + k;
                let slot = &mut conn.slots[(step % STEPS) as usize];
                assert_eq!(
                    slot.tag, None,
                    "rank {r} ch {c}: step {step} overwrites a slot not yet read"
                );
                let lo = (k as usize * sb).min(bytes);
                let hi = ((k as usize + 1) * sb).min(bytes);
                slot.tag = Some((seq, step));
                slot.bytes = out[lo..hi].to_vec();
            }
            conn.data.extend(e.successor_events());
        } else {
            assert_eq!(e.successor_events().count(), 0);
        }
        self.execs += 1;
        self.handle(r, c, Event::ExecDone);
    }

    /// The front of a queue, sometimes dropped in favour of the next
    /// counter value (a counter read that skipped one) or delivered and
    /// kept (a counter read twice).
    fn front(rng: &mut Rng, q: &mut VecDeque<Event>) -> Event {
        let counter = |e: Option<&Event>| matches!(e, Some(Event::Tail(_) | Event::Head(_)));
        if counter(q.front()) && counter(q.get(1)) && rng.chance(0.3) {
            q.pop_front();
        }
        if counter(q.front()) && rng.chance(0.1) {
            return *q.front().expect("an event");
        }
        q.pop_front().expect("an event")
    }

    pub fn deliver_data(&mut self, r: u32, c: u8) {
        let i = r as usize * CAP + c as usize;
        let ev = Self::front(&mut self.rng, &mut self.conns[i].data);
        self.handle(r, c, ev);
    }

    pub fn deliver_credit(&mut self, r: u32, c: u8) {
        let i = r as usize * CAP + c as usize;
        let ev = Self::front(&mut self.rng, &mut self.conns[i].credit);
        let pred = self.rings[c as usize].prev(r);
        self.handle(pred, c, ev);
    }

    /// After a strict run: nothing left anywhere, and both ends of every
    /// connection agree on its counters.
    pub fn check_quiet(&self) {
        assert!(self.outstanding.is_empty());
        for r in 0..self.n {
            let st = &self.ranks[r as usize];
            assert_eq!(st.engine.seq(), self.calls[r as usize].len() as u64);
            for c in 0..CAP as u8 {
                let conn = &self.conns[r as usize * CAP + c as usize];
                assert!(conn.data.is_empty() && conn.credit.is_empty());
                assert!(conn.slots.iter().all(|s| s.tag.is_none()), "unread slot");
                let pred = self.rings[c as usize].prev(r);
                let rx = st.engine.link(ChannelId(c));
                let tx = self.ranks[pred as usize].engine.link(ChannelId(c));
                assert_eq!(rx.recv_next, tx.send_next, "rank {r} ch {c}");
                assert_eq!(rx.recv_tail, tx.send_next, "rank {r} ch {c}");
                assert_eq!(tx.send_head, tx.send_next, "rank {pred} ch {c}");
                assert_eq!(rx.early_header, None);
            }
        }
    }

    /// What every rank waits for (for a failure message).
    pub fn report(&self) -> String {
        let mut s = String::new();
        for st in &self.ranks {
            let e = &st.engine;
            s.push_str(&format!(
                "rank {}: idle {} next_call {} failure {:?}\n  {}\n",
                e.rank().0,
                e.is_idle(),
                st.next_call,
                st.failure,
                e.stall(self.now)
            ));
            for c in 0..CAP as u8 {
                s.push_str(&format!(
                    "  ch {c}: {:?} {:?}\n",
                    e.blocked_on(ChannelId(c)),
                    e.link(ChannelId(c))
                ));
            }
        }
        s
    }
}
