//! The per-(channel, rank) state machine of a tree AllReduce: one
//! connection up, up to three down.
//!
//! The same rules as the ring's [`Machine`](super::Machine), per
//! connection: a slice is taken when every connection it reads has the data
//! (`tail`) and every connection it writes has room (`head`); credit goes
//! back on each connection read; the call header travels on each
//! connection's first message and is checked there; the machine finishes
//! only when everything it sent, on every connection, was consumed.

use core::cmp::Ordering;

use crate::error::{Error, ProtocolViolation};
use crate::fifo::{can_recv, can_send, FifoGeometry, STEPS};
use crate::log;
use crate::math::div_up;
use crate::plan::CallDesc;
use crate::prim::{Blocked, LinkState, Primitive, SlotSpan};
use crate::tree::{TreeDir, TreePlan, TreeStep, TreeSteps, MAX_TREE_ARITY};

/// Connections of a tree channel: up, then the children.
pub const TREE_CONNS: usize = 1 + MAX_TREE_ARITY;

/// One connection of a tree channel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum TreeConn {
    /// To and from the parent.
    Up,
    /// To and from child `i` (`0..3`, [`TreePeers::down`](crate::TreePeers)'s order).
    Down(u8),
}

impl TreeConn {
    /// Index in `0..TREE_CONNS`: 0 for up, `1 + i` for child `i`.
    pub const fn index(self) -> usize {
        match self {
            TreeConn::Up => 0,
            TreeConn::Down(i) => (i as usize % MAX_TREE_ARITY).wrapping_add(1),
        }
    }

    /// The connection at `index` (`0..TREE_CONNS`).
    pub const fn from_index(index: usize) -> Option<TreeConn> {
        match index {
            0 => Some(TreeConn::Up),
            1..TREE_CONNS => Some(TreeConn::Down(index.wrapping_sub(1) as u8)),
            _ => None,
        }
    }

    /// What the event on this connection comes from, in a few words.
    pub const fn what(self) -> &'static str {
        match self {
            TreeConn::Up => "the parent",
            TreeConn::Down(_) => "a child",
        }
    }
}

/// The counters of a tree channel's connections, carried between tree
/// calls, indexed by [`TreeConn::index`]. Each is a [`LinkState`] whose
/// `recv_*` side is what this rank receives on the connection and whose
/// `send_*` side is what it sends.
pub type TreeLinks = [LinkState; TREE_CONNS];

/// One slice of one tree step for the backend to carry out.
///
/// The data flow: the incoming slices (one per connection in `recv`)
/// reduced together with our input when REDUCE (finalized when the
/// primitive [finalizes](Primitive::finalizes)); otherwise the one
/// incoming slice; otherwise our input. The result goes to our output
/// at `output_offset` when COPY and into each connection's peer FIFO in
/// `send` when SEND, preceded by `header` on the connections in
/// `header_to`. When done (results written, each receiver's `tail` moved
/// to its span's end after the data), the backend reports
/// [`TreeMachine::handle_exec_done`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct TreeExec {
    /// What to do.
    pub primitive: Primitive,
    /// Up, at the root, or down.
    pub dir: TreeDir,
    /// The chunk of the channel.
    pub chunk: u64,
    /// Step index on the channel.
    pub step_index: u64,
    /// Slice within the step.
    pub slice: u64,
    /// Offset into the input buffer (elements).
    pub input_offset: u64,
    /// Offset into the output buffer (elements).
    pub output_offset: u64,
    /// Elements in this slice (may be 0: the slots still move).
    pub count: u64,
    /// Per connection ([`TreeConn::index`]): where the incoming slice is.
    pub recv: [Option<SlotSpan>; TREE_CONNS],
    /// Per connection: where the outgoing slice goes.
    pub send: [Option<SlotSpan>; TREE_CONNS],
    /// The call header, for the connections whose bit is set in
    /// `header_to` (bit [`TreeConn::index`]).
    pub header: CallDesc,
    /// Connections whose first message of the call this slice is.
    pub header_to: u8,
}

impl TreeExec {
    /// The connections this exec receives from.
    pub fn recv_conns(&self) -> impl Iterator<Item = (TreeConn, SlotSpan)> + '_ {
        conns(&self.recv)
    }

    /// The connections this exec sends to.
    pub fn send_conns(&self) -> impl Iterator<Item = (TreeConn, SlotSpan)> + '_ {
        conns(&self.send)
    }

    /// What the peer on `conn` must be told once this exec is done: the
    /// call header (its first message of the call) and the new `tail`, in
    /// that order. Empty when the exec sends nothing there. The peer feeds
    /// them to its engine on its connection back to this rank.
    pub fn peer_events(&self, conn: TreeConn) -> impl Iterator<Item = crate::Event> {
        let i = conn.index();
        let span = self.send.get(i).copied().flatten();
        let header = match span {
            Some(s) if self.header_to & bit(i) != 0 => Some(crate::Event::Header {
                step: s.step,
                desc: self.header,
            }),
            _ => None,
        };
        header
            .into_iter()
            .chain(span.map(|s| crate::Event::Tail(s.end())))
    }
}

fn conns(
    spans: &[Option<SlotSpan>; TREE_CONNS],
) -> impl Iterator<Item = (TreeConn, SlotSpan)> + '_ {
    spans
        .iter()
        .enumerate()
        .filter_map(|(i, s)| Some((TreeConn::from_index(i)?, (*s)?)))
}

/// What a tree machine asks its backend to do next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[expect(
    clippy::large_enum_variant,
    reason = "handed out by value once per slice, like the ring's Action; boxing needs alloc"
)]
pub enum TreeAction {
    /// Carry out one slice.
    Exec(TreeExec),
    /// Tell the peer on `conn` that every step below `head` is consumed.
    ReturnCredit {
        /// The connection.
        conn: TreeConn,
        /// The new `head`.
        head: u64,
    },
    /// This (channel, rank) has finished the call.
    Done,
}

/// What a tree machine waits for, and on which connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct TreeBlocked {
    /// What it waits for ([`Blocked::Data`]: from the peer on `conn`;
    /// [`Blocked::Credit`]: room at the peer on `conn`).
    pub blocked: Blocked,
    /// The connection, for data and credit.
    pub conn: Option<TreeConn>,
}

impl core::fmt::Display for TreeBlocked {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match (self.blocked, self.conn) {
            (Blocked::Data { tail, need }, Some(c)) => {
                write!(
                    f,
                    "data from {} {c:?} (tail {tail}, needs {need})",
                    c.what()
                )
            }
            (Blocked::Credit { head, need }, Some(c)) => {
                write!(
                    f,
                    "credit from {} {c:?} (head {head}, needs {need})",
                    c.what()
                )
            }
            (b, _) => write!(f, "{b}"),
        }
    }
}

const fn bit(i: usize) -> u8 {
    match 1u8.checked_shl(i as u32) {
        Some(b) => b,
        None => 0,
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Running,
    Done,
    Failed,
}

/// One stream of steps: the up stream (or a root's one stream) or the
/// down stream, each with at most one exec outstanding.
#[derive(Clone, Debug)]
struct Lane {
    busy: bool,
    has_current: bool,
    slices: u64,
    slice: u64,
    current: TreeStep,
    steps: Option<TreeSteps>,
}

impl Lane {
    fn new(steps: Option<TreeSteps>) -> Lane {
        Lane {
            busy: false,
            has_current: false,
            slices: 0,
            slice: 0,
            current: TreeStep {
                primitive: Primitive::empty(),
                dir: TreeDir::Turn,
                index: 0,
                chunk: 0,
                offset: 0,
                count: 0,
            },
            steps,
        }
    }

    /// Steps not yet started, or one under way.
    fn has_work(&self) -> bool {
        self.has_current || self.steps.as_ref().is_some_and(|s| s.remaining() > 0)
    }
}

/// The lane of an exec going `dir`: 1 for down, 0 otherwise.
const fn lane_of(dir: TreeDir) -> usize {
    match dir {
        TreeDir::Down => 1,
        TreeDir::Up | TreeDir::Turn => 0,
    }
}

/// One connection's counters and header state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Conn {
    recv_tail: u64,
    recv_next: u64,
    send_head: u64,
    send_next: u64,
    recv_start: u64,
    send_start: u64,
    header_ok: bool,
    early_header: Option<(u64, CallDesc)>,
}

impl Conn {
    fn new(l: &LinkState) -> Conn {
        Conn {
            recv_tail: l.recv_tail,
            recv_next: l.recv_next,
            send_head: l.send_head,
            send_next: l.send_next,
            recv_start: l.recv_next,
            send_start: l.send_next,
            header_ok: false,
            early_header: None,
        }
    }

    fn link(&self) -> LinkState {
        LinkState {
            recv_tail: self.recv_tail,
            recv_next: self.recv_next,
            send_head: self.send_head,
            send_next: self.send_next,
            early_header: self.early_header,
        }
    }
}

/// The state machine of one rank on one channel for one tree AllReduce.
///
/// Sans-IO, with the ring [`Machine`](super::Machine)'s call order, each
/// event naming its connection:
///
/// 1. [`TreeMachine::new`] from the plan's steps for this (channel, rank),
///    which connections exist, and the counters the previous tree call
///    left ([`TreeLinks`]).
/// 2. Loop: drain [`poll_action`](TreeMachine::poll_action) and carry out
///    each action; feed back [`handle_exec_done`](TreeMachine::handle_exec_done),
///    and per connection [`handle_tail`](TreeMachine::handle_tail) /
///    [`handle_header`](TreeMachine::handle_header) (the peer posted) and
///    [`handle_head`](TreeMachine::handle_head) (the peer returned credit).
/// 3. After [`TreeAction::Done`], take [`links`](TreeMachine::links) into
///    the next tree call.
///
/// A refused event (counters no correct peer produces, a mismatched call
/// header, an event on a connection the rank does not have) fails the
/// machine for good.
#[derive(Clone, Debug)]
pub struct TreeMachine {
    conns: [Conn; TREE_CONNS],
    /// Connections that exist (bit [`TreeConn::index`]).
    present: u8,
    /// Connections owed a credit return.
    credit_due: u8,
    phase: Phase,
    /// The up stream (a root's only stream), then the down stream.
    lanes: [Lane; 2],
    slots_per_slice: u32,
    elem: u32,
    slice_elems: u64,
    call: CallDesc,
    failure: Option<Error>,
}

impl TreeMachine {
    /// A machine for `call` walking `steps` of `plan`, over the connections
    /// in `present` (bit [`TreeConn::index`]: up and the children that
    /// exist), from the counters `links`.
    pub fn new(
        call: CallDesc,
        plan: &TreePlan,
        steps: TreeSteps,
        present: u8,
        geometry: FifoGeometry,
        links: &TreeLinks,
    ) -> Result<TreeMachine, Error> {
        let (slice_elems, slots_per_slice) =
            super::machine::start_geometry(&call, plan.ring_plan(), geometry)?;
        let mut conns = [Conn::new(&LinkState::default()); TREE_CONNS];
        for (c, l) in conns.iter_mut().zip(links.iter()) {
            *c = Conn::new(l);
        }
        let (up, down) = steps.split();
        let mut m = TreeMachine {
            conns,
            present: present & bit(TREE_CONNS).wrapping_sub(1),
            credit_due: 0,
            phase: Phase::Running,
            lanes: [Lane::new(Some(up)), Lane::new(down)],
            slots_per_slice,
            elem: u32::from(call.dtype.size()),
            slice_elems,
            call,
            failure: None,
        };
        for (i, l) in links.iter().enumerate() {
            if let (Some((step, desc)), Some(conn)) = (l.early_header, TreeConn::from_index(i)) {
                m.handle_header(conn, step, desc)?;
            }
        }
        log::debug!("ringcc: tree machine for call {}", call.seq);
        Ok(m)
    }

    /// The call this machine runs.
    pub fn call(&self) -> &CallDesc {
        &self.call
    }

    /// The connections' counters (final once done).
    pub fn links(&self) -> TreeLinks {
        let mut l = [LinkState::default(); TREE_CONNS];
        for (o, c) in l.iter_mut().zip(self.conns.iter()) {
            *o = c.link();
        }
        l
    }

    /// The connections that exist (bit [`TreeConn::index`]).
    pub fn present(&self) -> u8 {
        self.present
    }

    /// Whether the machine has emitted [`TreeAction::Done`].
    pub fn is_done(&self) -> bool {
        self.phase == Phase::Done
    }

    /// The error the machine failed with, if it did.
    pub fn error(&self) -> Option<Error> {
        self.failure
    }

    /// The outstanding exec, if any (the up stream's first when both
    /// streams have one; see [`pending_execs`](TreeMachine::pending_execs)).
    pub fn pending(&self) -> Option<TreeExec> {
        let [a, b] = self.pending_execs();
        a.or(b)
    }

    /// The outstanding execs: the up stream's (a root's only stream) and
    /// the down stream's. A non-root rank runs its two streams
    /// concurrently, each with at most one exec outstanding.
    pub fn pending_execs(&self) -> [Option<TreeExec>; 2] {
        let busy = |l: usize| {
            (self.phase == Phase::Running && self.lanes.get(l).is_some_and(|x| x.busy))
                .then(|| self.exec(l))
        };
        [busy(0), busy(1)]
    }

    fn lane(&self, l: usize) -> Option<&Lane> {
        self.lanes.get(l)
    }

    fn conn(&self, i: usize) -> Conn {
        self.conns
            .get(i)
            .copied()
            .unwrap_or(Conn::new(&LinkState::default()))
    }

    /// Connections lane `l`'s current step reads (`recv`) and writes
    /// (`send`).
    fn masks(&self, l: usize) -> (u8, u8) {
        let Some(lane) = self.lane(l) else {
            return (0, 0);
        };
        let p = lane.current.primitive;
        let downs = self.present & !1;
        let up = self.present & 1;
        let (r, s) = match lane.current.dir {
            TreeDir::Up => (downs, up),
            TreeDir::Turn => (downs, downs),
            TreeDir::Down => (up, downs),
        };
        (
            if p.contains(Primitive::RECV) { r } else { 0 },
            if p.contains(Primitive::SEND) { s } else { 0 },
        )
    }

    /// What the machine waits for, and on which connection.
    pub fn blocked_on(&self) -> TreeBlocked {
        let none = |blocked| TreeBlocked {
            blocked,
            conn: None,
        };
        match self.phase {
            Phase::Failed => return none(Blocked::Failed),
            Phase::Done => return none(Blocked::Done),
            Phase::Running => {}
        }
        if self.credit_due != 0 {
            return none(Blocked::Ready);
        }
        let sps = u64::from(self.slots_per_slice);
        let mut busy = false;
        for (l, lane) in self.lanes.iter().enumerate() {
            if lane.busy {
                busy = true;
                continue;
            }
            if !lane.has_current {
                if lane.has_work() {
                    return none(Blocked::Ready);
                }
                continue;
            }
            let (r, s) = self.masks(l);
            for (i, c) in self.conns.iter().enumerate() {
                if r & bit(i) != 0 && !can_recv(c.recv_tail, c.recv_next, sps) {
                    return TreeBlocked {
                        blocked: Blocked::Data {
                            tail: c.recv_tail,
                            need: c.recv_next.saturating_add(sps),
                        },
                        conn: TreeConn::from_index(i),
                    };
                }
            }
            for (i, c) in self.conns.iter().enumerate() {
                if s & bit(i) != 0 && !can_send(c.send_head, c.send_next, sps) {
                    return TreeBlocked {
                        blocked: Blocked::Credit {
                            head: c.send_head,
                            need: c.send_next.saturating_add(sps).saturating_sub(STEPS),
                        },
                        conn: TreeConn::from_index(i),
                    };
                }
            }
            return none(Blocked::Ready);
        }
        if busy {
            return none(Blocked::Exec);
        }
        for (i, c) in self.conns.iter().enumerate() {
            if self.present & bit(i) != 0 && c.send_head < c.send_next {
                return TreeBlocked {
                    blocked: Blocked::Credit {
                        head: c.send_head,
                        need: c.send_next,
                    },
                    conn: TreeConn::from_index(i),
                };
            }
        }
        none(Blocked::Ready)
    }

    #[cold]
    fn fail(&mut self, e: Error) -> Error {
        log::warning!("ringcc: tree machine failed");
        self.phase = Phase::Failed;
        self.failure = Some(e);
        e
    }

    /// The live connection `conn`'s index, or the machine's failure.
    fn live_conn(&mut self, conn: TreeConn) -> Result<usize, Error> {
        if self.phase == Phase::Failed {
            return Err(Error::Finished);
        }
        let i = conn.index();
        if self.present & bit(i) == 0 {
            return Err(self.fail(Error::BadTopology));
        }
        Ok(i)
    }

    /// The peer on `conn` moved its `tail` (what we may receive) to `tail`.
    pub fn handle_tail(&mut self, conn: TreeConn, tail: u64) -> Result<(), Error> {
        let i = self.live_conn(conn)?;
        let c = self.conn(i);
        if tail < c.recv_tail {
            return Err(self.fail(Error::Protocol(ProtocolViolation::TailBackwards)));
        }
        if tail > c.recv_next.saturating_add(STEPS) {
            return Err(self.fail(Error::Protocol(ProtocolViolation::Overrun)));
        }
        if let Some(c) = self.conns.get_mut(i) {
            c.recv_tail = tail;
        }
        Ok(())
    }

    /// The peer on `conn` sent its call header for the message at FIFO
    /// step `step`: this call's must come first on the connection and
    /// equal ours (else `MismatchedCall`); the next call's may come early
    /// and is kept.
    pub fn handle_header(
        &mut self,
        conn: TreeConn,
        step: u64,
        desc: CallDesc,
    ) -> Result<(), Error> {
        let i = self.live_conn(conn)?;
        let c = self.conn(i);
        let call = self.call;
        let r = match desc.seq.cmp(&call.seq) {
            Ordering::Equal if c.header_ok || step != c.recv_start => {
                Err(Error::Protocol(ProtocolViolation::UnexpectedHeader))
            }
            Ordering::Equal if desc != call => Err(Error::MismatchedCall {
                expected: call,
                got: desc,
            }),
            Ordering::Equal => Ok((true, None)),
            Ordering::Greater if c.early_header.is_some() || step != c.recv_next => {
                Err(Error::Protocol(ProtocolViolation::UnexpectedHeader))
            }
            Ordering::Greater => Ok((c.header_ok, Some((step, desc)))),
            Ordering::Less => Err(Error::MismatchedCall {
                expected: call,
                got: desc,
            }),
        };
        match r {
            Ok((ok, early)) => {
                if let Some(c) = self.conns.get_mut(i) {
                    c.header_ok = ok;
                    if early.is_some() {
                        c.early_header = early;
                    }
                }
                Ok(())
            }
            Err(e) => Err(self.fail(e)),
        }
    }

    /// The peer on `conn` returned credit: its `head` moved to `head`.
    pub fn handle_head(&mut self, conn: TreeConn, head: u64) -> Result<(), Error> {
        let i = self.live_conn(conn)?;
        let c = self.conn(i);
        if head <= c.send_head {
            return if head < c.send_head {
                Err(self.fail(Error::Protocol(ProtocolViolation::HeadBackwards)))
            } else {
                Ok(())
            };
        }
        let in_flight = self.phase == Phase::Running
            && (0..self.lanes.len())
                .any(|l| self.lane(l).is_some_and(|x| x.busy) && self.masks(l).1 & bit(i) != 0);
        let limit = if in_flight {
            c.send_next.saturating_add(u64::from(self.slots_per_slice))
        } else {
            c.send_next
        };
        if head > limit {
            return Err(self.fail(Error::Protocol(ProtocolViolation::HeadAhead)));
        }
        if let Some(c) = self.conns.get_mut(i) {
            c.send_head = head;
        }
        Ok(())
    }

    /// The outstanding exec is complete: the only one outstanding (with
    /// both streams' execs outstanding, which one is ambiguous: use
    /// [`handle_exec_done_dir`](TreeMachine::handle_exec_done_dir)).
    pub fn handle_exec_done(&mut self) -> Result<(), Error> {
        if self.phase == Phase::Failed {
            return Err(Error::Finished);
        }
        let [a, b] = &self.lanes;
        match (a.busy, b.busy) {
            (true, false) => self.finish_exec(0),
            (false, true) => self.finish_exec(1),
            (true, true) => Err(self.fail(Error::AmbiguousExecDone)),
            (false, false) => Err(Error::NoExecPending),
        }
    }

    /// The outstanding exec going `dir` ([`TreeExec::dir`]) is complete.
    pub fn handle_exec_done_dir(&mut self, dir: TreeDir) -> Result<(), Error> {
        if self.phase == Phase::Failed {
            return Err(Error::Finished);
        }
        let l = lane_of(dir);
        if !self.lane(l).is_some_and(|x| x.busy && x.current.dir == dir) {
            return Err(Error::NoExecPending);
        }
        self.finish_exec(l)
    }

    fn finish_exec(&mut self, l: usize) -> Result<(), Error> {
        if self.phase != Phase::Running {
            return Err(Error::NoExecPending);
        }
        let (r, s) = self.masks(l);
        let sps = u64::from(self.slots_per_slice);
        for (i, c) in self.conns.iter_mut().enumerate() {
            if r & bit(i) != 0 {
                c.recv_next = c.recv_next.saturating_add(sps);
            }
            if s & bit(i) != 0 {
                c.send_next = c.send_next.saturating_add(sps);
            }
        }
        self.credit_due |= r;
        if let Some(lane) = self.lanes.get_mut(l) {
            lane.slice = lane.slice.saturating_add(1);
            if lane.slice >= lane.slices {
                lane.has_current = false;
            }
            lane.busy = false;
        }
        Ok(())
    }

    /// The next action, if one is possible now.
    #[must_use = "actions must be carried out"]
    pub fn poll_action(&mut self) -> Result<Option<TreeAction>, Error> {
        match self.phase {
            Phase::Failed => return Err(self.failure.unwrap_or(Error::Finished)),
            Phase::Done => return Ok(None),
            Phase::Running => {}
        }
        self.next_action().map_err(|e| self.fail(e))
    }

    fn exec(&self, l: usize) -> TreeExec {
        let lane = self.lane(l).cloned().unwrap_or(Lane::new(None));
        let step = &lane.current;
        let (r, s) = self.masks(l);
        let sps = u64::from(self.slots_per_slice);
        let mut recv = [None; TREE_CONNS];
        let mut send = [None; TREE_CONNS];
        let mut header_to = 0u8;
        for (i, c) in self.conns.iter().enumerate() {
            if r & bit(i) != 0 {
                if let Some(o) = recv.get_mut(i) {
                    *o = Some(SlotSpan {
                        step: c.recv_next,
                        slots: sps,
                    });
                }
            }
            if s & bit(i) != 0 {
                if let Some(o) = send.get_mut(i) {
                    *o = Some(SlotSpan {
                        step: c.send_next,
                        slots: sps,
                    });
                }
                // The call's first send on a connection carries its
                // header (every send moves `send_next` on).
                if c.send_next == c.send_start {
                    header_to |= bit(i);
                }
            }
        }
        let lo = lane.slice.saturating_mul(self.slice_elems).min(step.count);
        let hi = lo.saturating_add(self.slice_elems).min(step.count);
        TreeExec {
            primitive: step.primitive,
            dir: step.dir,
            chunk: step.chunk,
            step_index: step.index,
            slice: lane.slice,
            input_offset: step.offset.saturating_add(lo),
            output_offset: step.offset.saturating_add(lo),
            count: hi.saturating_sub(lo),
            recv,
            send,
            header: self.call,
            header_to,
        }
    }

    fn next_action(&mut self) -> Result<Option<TreeAction>, Error> {
        if self.credit_due != 0 {
            let i = self.credit_due.trailing_zeros() as usize;
            self.credit_due &= !bit(i);
            let conn = TreeConn::from_index(i).ok_or(Error::BadTopology)?;
            return Ok(Some(TreeAction::ReturnCredit {
                conn,
                head: self.conn(i).recv_next,
            }));
        }
        for l in 0..self.lanes.len() {
            if let Some(exec) = self.try_lane(l)? {
                return Ok(Some(TreeAction::Exec(exec)));
            }
        }
        if self.lanes.iter().any(|x| x.busy || x.has_work()) {
            return Ok(None);
        }
        let owed = self
            .conns
            .iter()
            .enumerate()
            .any(|(i, c)| self.present & bit(i) != 0 && c.send_head < c.send_next);
        if owed {
            return Ok(None);
        }
        self.phase = Phase::Done;
        Ok(Some(TreeAction::Done))
    }

    /// Lane `l`'s next exec, if it is idle and its next slice can go.
    fn try_lane(&mut self, l: usize) -> Result<Option<TreeExec>, Error> {
        let elem = u64::from(self.elem);
        let slice_elems = self.slice_elems;
        let Some(lane) = self.lanes.get_mut(l) else {
            return Ok(None);
        };
        if lane.busy {
            return Ok(None);
        }
        if !lane.has_current {
            match lane.steps.as_mut().and_then(Iterator::next) {
                Some(step) => {
                    let bytes = step.count.saturating_mul(elem);
                    let slice_bytes = slice_elems.saturating_mul(elem);
                    lane.slices = div_up(bytes, slice_bytes).max(1);
                    lane.slice = 0;
                    lane.current = step;
                    lane.has_current = true;
                }
                None => return Ok(None),
            }
        }
        let (r, s) = self.masks(l);
        let sps = u64::from(self.slots_per_slice);
        for (i, c) in self.conns.iter().enumerate() {
            if r & bit(i) != 0 && !can_recv(c.recv_tail, c.recv_next, sps) {
                return Ok(None);
            }
            if s & bit(i) != 0 && !can_send(c.send_head, c.send_next, sps) {
                return Ok(None);
            }
        }
        for (i, c) in self.conns.iter().enumerate() {
            if r & bit(i) == 0 {
                continue;
            }
            if c.recv_next == c.recv_start && !c.header_ok {
                return Err(Error::Protocol(ProtocolViolation::MissingHeader));
            }
            if matches!(c.early_header, Some((st, _)) if st == c.recv_next) {
                return Err(Error::Protocol(ProtocolViolation::UnexpectedHeader));
            }
        }
        if let Some(lane) = self.lanes.get_mut(l) {
            lane.busy = true;
        }
        Ok(Some(self.exec(l)))
    }
}

/// What a tree primitive produces for one slice, into `out`: every
/// incoming slice reduced with the local input when REDUCE (then
/// finalized where the primitive completes the reduction), otherwise the
/// one incoming slice, otherwise the local input — the tree's
/// [`slice_result`](super::slice_result).
pub fn tree_slice_result<'a>(
    p: Primitive,
    dtype: crate::reduce::DataType,
    op: crate::reduce::ReduceOp,
    nranks: u32,
    incoming: impl IntoIterator<Item = &'a [u8]>,
    local: Option<&[u8]>,
    out: &mut [u8],
) -> Result<(), Error> {
    let mut incoming = incoming.into_iter();
    let first = match (p.contains(Primitive::REDUCE), local) {
        (true, Some(l)) => Some(l),
        _ => incoming.next().or(local),
    };
    let Some(src) = first else {
        return Err(Error::BadLength {
            dst: out.len(),
            src: 0,
        });
    };
    if src.len() != out.len() {
        return Err(Error::BadLength {
            dst: out.len(),
            src: src.len(),
        });
    }
    out.copy_from_slice(src);
    if p.contains(Primitive::REDUCE) {
        for inc in incoming {
            crate::reduce::reduce_in_place(dtype, op, out, inc)?;
        }
        if p.finalizes() {
            crate::reduce::finalize(dtype, op, out, nranks)?;
        }
    }
    Ok(())
}
