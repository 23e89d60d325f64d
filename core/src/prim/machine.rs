//! The per-(channel, rank) state machine that walks a plan.

use crate::error::{Error, ProtocolViolation};
use crate::fifo::{can_recv, can_send, slot_of, FifoGeometry, STEPS};
use crate::id::{ChunkId, SlotIndex};
use crate::log;
use crate::plan::{CallDesc, Plan, Step, Steps};
use crate::prim::Primitive;
use crate::topology::RingOrder;

/// A run of consecutive FIFO steps (one slice) of a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct SlotSpan {
    /// The FIFO step of the first slot.
    pub step: u64,
    /// Number of slots.
    pub slots: u64,
}

impl SlotSpan {
    /// The first slot.
    pub fn slot(&self) -> SlotIndex {
        slot_of(self.step)
    }

    /// Byte offset of the span in the connection's FIFO buffer.
    pub fn byte_offset(&self, geometry: &FifoGeometry) -> u64 {
        u64::from(self.slot().0).saturating_mul(geometry.slot_bytes())
    }

    /// The counter value that publishes this span (`step + slots`).
    pub fn end(&self) -> u64 {
        self.step.saturating_add(self.slots)
    }
}

/// One slice of one step for the backend to carry out.
///
/// The data flow: the incoming slice (RECV: from our FIFO at `recv`) or our
/// input (`input_offset`), reduced with our input when REDUCE
/// (`incoming ⊕ local`; if the primitive [finalizes](Primitive::finalizes)
/// also [`finalize`](crate::reduce::finalize)d), is written to our output at
/// `output_offset` when COPY and into the successor's FIFO at `send` when
/// SEND, with `header` in front when present. Offsets and `count` are in
/// elements.
///
/// When done — result written, and for SEND the successor's `tail` moved to
/// `send.end()` after the data — the backend calls
/// [`Machine::handle_exec_done`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Exec {
    /// What to do.
    pub primitive: Primitive,
    /// The chunk.
    pub chunk: ChunkId,
    /// Loop iteration.
    pub loop_index: u64,
    /// Step within the loop.
    pub step_index: u32,
    /// Slice within the step.
    pub slice: u64,
    /// Offset into the input buffer (elements).
    pub input_offset: u64,
    /// Offset into the output buffer (elements).
    pub output_offset: u64,
    /// Elements in this slice (may be 0: the slots still move).
    pub count: u64,
    /// Where the incoming slice is, for RECV.
    pub recv: Option<SlotSpan>,
    /// Where the outgoing slice goes, for SEND.
    pub send: Option<SlotSpan>,
    /// The call header to deliver with this slice: set on the collective's
    /// first slice to the successor. The backend hands it to the successor
    /// ([`Machine::handle_header`]) no later than the `tail` covering
    /// `send.step`.
    pub header: Option<CallDesc>,
}

/// What the machine asks its backend to do next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Action {
    /// Carry out one slice.
    Exec(Exec),
    /// Tell the predecessor that every step below `head` is consumed: post
    /// our `head` counter.
    ReturnCredit {
        /// The new `head`.
        head: u64,
    },
    /// This (channel, rank) has finished the collective: every step taken,
    /// every slot it sent consumed by the successor, every credit returned.
    Done,
}

/// What [`Machine::poll_next`] hands out: an [`Action`] without the
/// exec's fields, which the machine keeps until the exec is done (read
/// them with [`Machine::pending`]). Small enough to come back in
/// registers, where an `Action` is over a hundred bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Next {
    /// Carry out the slice [`Machine::pending`] describes.
    Exec,
    /// [`Action::ReturnCredit`].
    ReturnCredit {
        /// The new `head`.
        head: u64,
    },
    /// [`Action::Done`].
    Done,
}

/// What a machine waits for ([`Machine::blocked_on`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Blocked {
    /// Nothing: polling may produce an action.
    Ready,
    /// Its own slice, handed to the backend, is not done yet.
    Exec,
    /// Data from the predecessor: its `tail` is `tail`, the next slice
    /// needs `need`.
    Data {
        /// The predecessor's `tail` as last seen.
        tail: u64,
        /// The `tail` the next slice needs.
        need: u64,
    },
    /// Credit from the successor: its `head` is `head`, the next slice (or,
    /// after the last step, finishing) needs `need`.
    Credit {
        /// The successor's `head` as last seen.
        head: u64,
        /// The `head` needed.
        need: u64,
    },
    /// Finished.
    Done,
    /// Failed.
    Failed,
}

impl Blocked {
    /// What is waited for, in a few words ("data from its predecessor").
    pub const fn what(&self) -> &'static str {
        match self {
            Blocked::Ready => "nothing (ready)",
            Blocked::Exec => "its own slice",
            Blocked::Data { .. } => "data from its predecessor",
            Blocked::Credit { .. } => "credit from its successor",
            Blocked::Done => "nothing (done)",
            Blocked::Failed => "nothing (failed)",
        }
    }
}

impl core::fmt::Display for Blocked {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Blocked::Data { tail, need } => {
                write!(f, "{} (tail {tail}, needs {need})", self.what())
            }
            Blocked::Credit { head, need } => {
                write!(f, "{} (head {head}, needs {need})", self.what())
            }
            _ => f.write_str(self.what()),
        }
    }
}

/// The connection counters a machine starts from and leaves behind. They
/// persist across collectives on the same channel: take
/// [`Machine::link`] from a finished machine into the next one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct LinkState {
    /// Latest `tail` seen from the predecessor.
    pub recv_tail: u64,
    /// Steps consumed from the predecessor (= the `head` we return).
    pub recv_next: u64,
    /// Latest `head` seen from the successor.
    pub send_head: u64,
    /// Steps posted to the successor.
    pub send_next: u64,
    /// A header for the next collective that arrived early.
    pub early_header: Option<(u64, CallDesc)>,
}

/// Where a machine stands. The outstanding exec of `Busy` is not stored:
/// it is rebuilt from the current step, the slice and the counters, none
/// of which move while it is outstanding (a smaller machine is fewer cache
/// misses for a backend that drives thousands of them).
///
/// `u32`: the widest niche of the machine, so that `Option<Machine>` (an
/// engine's channel) keeps its tag here, in the first cache line, instead
/// of in the call descriptor at the machine's end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
enum Phase {
    /// Waiting for data / credit, or ready to emit the next exec.
    Idle,
    /// An exec is outstanding.
    Busy,
    /// `Done` emitted.
    Done,
    /// Failed (the error is in `Machine::failure`); accepts nothing more.
    Failed,
}

/// The state machine of one rank on one channel for one collective.
///
/// Sans-IO: it never touches data. Call order:
///
/// 1. Create it with [`Machine::new`] from the plan's steps for this
///    (channel, rank) and the connection counters left by the previous
///    collective ([`LinkState::default`] for the first).
/// 2. Loop: drain [`poll_action`](Machine::poll_action) and carry out each
///    action; feed what happens back: [`handle_exec_done`](Machine::handle_exec_done)
///    when an `Exec` is complete, [`handle_tail`](Machine::handle_tail) and
///    [`handle_header`](Machine::handle_header) when the predecessor posts,
///    [`handle_head`](Machine::handle_head) when the successor returns credit.
/// 3. After [`Action::Done`], take [`link`](Machine::link) into the next
///    collective's machine.
///
/// Every `handle_*` checks the event against the protocol and fails with a
/// typed error — `MismatchedCall` when the predecessor's call header
/// differs, `Protocol(..)` for impossible counters — after which the
/// machine is dead: it emits nothing and returns `Finished`.
///
/// Layout: `repr(C)` keeps what every event touches (counters, flags, the
/// current step: 128 bytes) ahead of the step iterator, whose hot fields
/// come first in turn, and what only a header or a failure touches at the
/// end.
#[derive(Clone, Debug)]
#[repr(C)]
pub struct Machine<M> {
    /// `LinkState`'s counters (its early header is kept apart, below).
    recv_tail: u64,
    recv_next: u64,
    send_head: u64,
    send_next: u64,
    recv_start: u64,
    send_start: u64,
    slice_elems: u64,
    /// Slices of the current step, and the one being (or next) run.
    slices: u32,
    slice: u32,
    slots_per_slice: u32,
    elem: u8,
    phase: Phase,
    /// `current` holds a step not yet fully run.
    has_current: bool,
    header_ok: bool,
    /// A `ReturnCredit` for `recv_next` is due.
    credit_due: bool,
    /// `early_header` is set.
    has_early: bool,
    current: Step,
    steps: Steps<M>,
    call: CallDesc,
    early_header: Option<(u64, CallDesc)>,
    failure: Option<Error>,
}

/// Whether a machine for `call` could start on `plan` over a FIFO of
/// `geometry`: the checks [`Machine::new`] makes before anything else,
/// for a backend whose machines run elsewhere (a GPU's device loop) and
/// that must refuse the call on the host first, with the same errors.
pub fn check_start(call: &CallDesc, plan: &Plan, geometry: FifoGeometry) -> Result<(), Error> {
    start_geometry(call, plan, geometry).map(|_| ())
}

/// [`check_start`], returning the elements per slice and the slots per
/// slice.
pub(crate) fn start_geometry(
    call: &CallDesc,
    plan: &Plan,
    geometry: FifoGeometry,
) -> Result<(u64, u32), Error> {
    if call.collective != plan.collective()
        || call.count != plan.count()
        || call.dtype != plan.dtype()
    {
        return Err(Error::PlanMismatch);
    }
    let elem = call.dtype.size();
    let slice_elems = geometry
        .slice_bytes()
        .checked_div(u64::from(elem))
        .unwrap_or(0);
    let slots_per_slice = u32::try_from(geometry.slots_per_slice()).unwrap_or(0);
    if slice_elems == 0 || slots_per_slice == 0 {
        return Err(Error::BadFifoGeometry);
    }
    // A send-only step (a ring's step 0) posts a whole chunk before the
    // rank receives anything. If that fills the successor's FIFO on
    // every rank at once, each rank waits for room that only its
    // successor's send could make: deadlock. One free slice breaks it.
    let chunk_bytes = plan.chunk_elems().saturating_mul(u64::from(elem));
    if geometry.slices_per_chunk(chunk_bytes) > geometry.max_slices_per_chunk() {
        return Err(Error::ChunkTooLargeForFifo {
            chunk_bytes,
            fifo_bytes: geometry.fifo_bytes(),
        });
    }
    Ok((slice_elems, slots_per_slice))
}

impl<M: RingOrder> Machine<M> {
    /// A machine for `call`, walking `steps`.
    ///
    /// `call` must describe the same collective, count and type as the
    /// plan of `steps` (its `seq` and `op` come from the caller).
    pub fn new(
        call: CallDesc,
        steps: Steps<M>,
        geometry: FifoGeometry,
        link: LinkState,
    ) -> Result<Self, Error> {
        let (slice_elems, slots_per_slice) = start_geometry(&call, steps.plan(), geometry)?;
        let mut m = Machine {
            recv_tail: link.recv_tail,
            recv_next: link.recv_next,
            send_head: link.send_head,
            send_next: link.send_next,
            recv_start: link.recv_next,
            send_start: link.send_next,
            slice_elems,
            slices: 0,
            slice: 0,
            slots_per_slice,
            elem: call.dtype.size(),
            phase: Phase::Idle,
            has_current: false,
            header_ok: false,
            credit_due: false,
            has_early: false,
            current: Step {
                primitive: Primitive::empty(),
                loop_index: 0,
                index: 0,
                chunk: ChunkId(0),
                input_offset: 0,
                output_offset: 0,
                count: 0,
            },
            steps,
            call,
            early_header: None,
            failure: None,
        };
        if let Some((step, desc)) = link.early_header {
            m.handle_header(step, desc)?;
        }
        log::debug!(
            "ringcc: machine for call {} starts at recv {} send {}",
            call.seq,
            m.recv_start,
            m.send_start
        );
        Ok(m)
    }

    /// The call this machine runs.
    pub fn call(&self) -> &CallDesc {
        &self.call
    }

    /// The connection counters (final once `Done`).
    pub fn link(&self) -> LinkState {
        LinkState {
            recv_tail: self.recv_tail,
            recv_next: self.recv_next,
            send_head: self.send_head,
            send_next: self.send_next,
            early_header: self.early_header,
        }
    }

    /// Latest `tail` seen from the predecessor (`link().recv_tail`).
    #[inline]
    pub fn recv_tail(&self) -> u64 {
        self.recv_tail
    }

    /// Latest `head` seen from the successor (`link().send_head`).
    #[inline]
    pub fn send_head(&self) -> u64 {
        self.send_head
    }

    /// Steps posted to the successor (`link().send_next`).
    #[inline]
    pub fn send_next(&self) -> u64 {
        self.send_next
    }

    /// Whether the machine has emitted [`Action::Done`].
    pub fn is_done(&self) -> bool {
        self.phase == Phase::Done
    }

    /// The error the machine failed with, if it did.
    pub fn error(&self) -> Option<Error> {
        self.failure
    }

    /// Whether an exec is outstanding (`pending().is_some()`, cheaper).
    #[inline]
    pub fn is_busy(&self) -> bool {
        self.phase == Phase::Busy
    }

    /// The outstanding exec, if any (the one last emitted, rebuilt).
    #[inline]
    pub fn pending(&self) -> Option<Exec> {
        self.is_busy().then(|| self.exec())
    }

    /// What the machine waits for, as it stands after
    /// [`poll_action`](Machine::poll_action) returned `Ok(None)`: its own
    /// slice, data from the predecessor, or credit from the successor
    /// (FIFO room, or — after its last step — its sends to be consumed).
    /// [`Blocked::Ready`] when a poll may produce an action.
    pub fn blocked_on(&self) -> Blocked {
        match self.phase {
            Phase::Failed => return Blocked::Failed,
            Phase::Done => return Blocked::Done,
            Phase::Busy => return Blocked::Exec,
            Phase::Idle => {}
        }
        if self.credit_due {
            return Blocked::Ready;
        }
        let sps = u64::from(self.slots_per_slice);
        if !self.has_current {
            if self.steps.remaining() > 0 {
                return Blocked::Ready;
            }
            if self.send_head < self.send_next {
                return Blocked::Credit {
                    head: self.send_head,
                    need: self.send_next,
                };
            }
            return Blocked::Ready;
        }
        let p = self.current.primitive;
        if p.contains(Primitive::RECV) && !can_recv(self.recv_tail, self.recv_next, sps) {
            return Blocked::Data {
                tail: self.recv_tail,
                need: self.recv_next.saturating_add(sps),
            };
        }
        if p.contains(Primitive::SEND) && !can_send(self.send_head, self.send_next, sps) {
            return Blocked::Credit {
                head: self.send_head,
                need: self
                    .send_next
                    .saturating_add(sps)
                    .saturating_sub(crate::fifo::STEPS),
            };
        }
        Blocked::Ready
    }

    /// Whether the call has slices still to carry out (of the current
    /// step or of steps to come). After a receiving slice this says that
    /// the call will receive again — a rank that receives at all receives
    /// at its last step (every ring plan's shape; `core/tests/plan_props`
    /// checks it) — so the credit now due will be covered by a later one
    /// of the same call (`head` counts steps), and a transport that pays
    /// per credit message may hold it back until the window needs it.
    /// False once the call's last credit is due.
    #[inline]
    pub fn receives_ahead(&self) -> bool {
        self.has_current || self.steps.remaining() > 0
    }

    /// Whether the machine waits for credit from its successor:
    /// [`blocked_on`](Machine::blocked_on) is [`Blocked::Credit`], without
    /// building the report (what a backend asks after every poll that
    /// returned `Ok(None)`).
    #[inline]
    pub fn waits_for_credit(&self) -> bool {
        if self.phase != Phase::Idle || self.credit_due {
            return false;
        }
        let sps = u64::from(self.slots_per_slice);
        if !self.has_current {
            return self.steps.remaining() == 0 && self.send_head < self.send_next;
        }
        let p = self.current.primitive;
        if p.contains(Primitive::RECV) && !can_recv(self.recv_tail, self.recv_next, sps) {
            return false;
        }
        p.contains(Primitive::SEND) && !can_send(self.send_head, self.send_next, sps)
    }

    fn live(&self) -> Result<(), Error> {
        match self.phase {
            Phase::Failed => Err(Error::Finished),
            _ => Ok(()),
        }
    }

    #[cold]
    fn fail(&mut self, e: Error) -> Error {
        log::warning!("ringcc: machine failed");
        self.phase = Phase::Failed;
        self.failure = Some(e);
        e
    }

    /// The predecessor's `tail` counter moved to `tail`.
    #[inline]
    pub fn handle_tail(&mut self, tail: u64) -> Result<(), Error> {
        self.live()?;
        if tail < self.recv_tail {
            return Err(self.fail(Error::Protocol(ProtocolViolation::TailBackwards)));
        }
        if tail > self.recv_next.saturating_add(STEPS) {
            return Err(self.fail(Error::Protocol(ProtocolViolation::Overrun)));
        }
        self.recv_tail = tail;
        Ok(())
    }

    /// The predecessor's call header for the message at FIFO step `step`.
    ///
    /// The header of this call must come at the collective's first step and
    /// equal this rank's call, or the machine fails with `MismatchedCall`.
    /// The header of the next call on this channel may arrive while this
    /// machine finishes; it is kept in [`LinkState::early_header`]. Its
    /// sequence number is higher, by one or — when the calls in between
    /// leave the channel out — by more; the machine of the call it names
    /// checks it.
    pub fn handle_header(&mut self, step: u64, desc: CallDesc) -> Result<(), Error> {
        self.live()?;
        if desc.seq == self.call.seq {
            if self.header_ok || step != self.recv_start {
                return Err(self.fail(Error::Protocol(ProtocolViolation::UnexpectedHeader)));
            }
            if desc != self.call {
                log::warning!("ringcc: mismatched call across ranks");
                return Err(self.fail(Error::MismatchedCall {
                    expected: self.call,
                    got: desc,
                }));
            }
            self.header_ok = true;
            return Ok(());
        }
        if desc.seq > self.call.seq {
            if self.has_early || step != self.recv_next {
                return Err(self.fail(Error::Protocol(ProtocolViolation::UnexpectedHeader)));
            }
            self.early_header = Some((step, desc));
            self.has_early = true;
            return Ok(());
        }
        Err(self.fail(Error::MismatchedCall {
            expected: self.call,
            got: desc,
        }))
    }

    /// The successor's `head` counter moved to `head`.
    ///
    /// The credit for the slice outstanding may come before its own
    /// completion (a transport that raises the send's completion and the
    /// peer's credit on different queues cannot order them): a `head` up to
    /// the end of that slice is accepted.
    #[inline]
    pub fn handle_head(&mut self, head: u64) -> Result<(), Error> {
        self.live()?;
        if head < self.send_head {
            return Err(self.fail(Error::Protocol(ProtocolViolation::HeadBackwards)));
        }
        let in_flight =
            self.phase == Phase::Busy && self.current.primitive.contains(Primitive::SEND);
        let limit = if in_flight {
            self.send_next
                .saturating_add(u64::from(self.slots_per_slice))
        } else {
            self.send_next
        };
        if head > limit {
            return Err(self.fail(Error::Protocol(ProtocolViolation::HeadAhead)));
        }
        self.send_head = head;
        Ok(())
    }

    /// The outstanding exec is complete.
    #[inline(always)]
    pub fn handle_exec_done(&mut self) -> Result<(), Error> {
        self.live()?;
        if self.phase != Phase::Busy {
            return Err(Error::NoExecPending);
        }
        let p = self.current.primitive;
        let sps = u64::from(self.slots_per_slice);
        if p.contains(Primitive::RECV) {
            self.recv_next = self.recv_next.saturating_add(sps);
            self.credit_due = true;
        }
        if p.contains(Primitive::SEND) {
            self.send_next = self.send_next.saturating_add(sps);
        }
        self.slice = self.slice.saturating_add(1);
        if self.slice >= self.slices {
            self.has_current = false;
        }
        self.phase = Phase::Idle;
        Ok(())
    }

    /// The next action, if any is possible now; `Ok(None)` when the machine
    /// waits for an event (or is done). Fails with the machine's error once
    /// it has failed.
    #[must_use = "actions must be carried out"]
    #[inline(always)]
    pub fn poll_action(&mut self) -> Result<Option<Action>, Error> {
        Ok(match self.poll_next()? {
            Some(Next::Exec) => Some(Action::Exec(self.exec())),
            Some(Next::ReturnCredit { head }) => Some(Action::ReturnCredit { head }),
            Some(Next::Done) => Some(Action::Done),
            None => None,
        })
    }

    /// [`poll_action`](Machine::poll_action) without building the exec:
    /// after [`Next::Exec`], [`pending`](Machine::pending) has it.
    #[must_use = "actions must be carried out"]
    #[inline(always)]
    pub fn poll_next(&mut self) -> Result<Option<Next>, Error> {
        match self.phase {
            Phase::Failed => return Err(self.failure.unwrap_or(Error::Finished)),
            Phase::Done => return Ok(None),
            Phase::Idle | Phase::Busy => {}
        }
        self.next_action().map_err(|e| self.fail(e))
    }

    /// The exec for the current slice of the current step, with the
    /// counters as they stand (they do not move while it is outstanding).
    #[inline]
    fn exec(&self) -> Exec {
        let step = &self.current;
        let p = step.primitive;
        let sps = u64::from(self.slots_per_slice);
        let recv = p.contains(Primitive::RECV).then_some(SlotSpan {
            step: self.recv_next,
            slots: sps,
        });
        let send = p.contains(Primitive::SEND).then_some(SlotSpan {
            step: self.send_next,
            slots: sps,
        });
        // The call's first send carries its header (later sends start
        // past `send_start`: `send_next` only grows).
        let header = match send {
            Some(s) if s.step == self.send_start => Some(self.call),
            _ => None,
        };
        let (lo, hi) = super::slice_range(step.count, self.slice_elems, u64::from(self.slice));
        let slice = u64::from(self.slice);
        Exec {
            primitive: p,
            chunk: step.chunk,
            loop_index: step.loop_index,
            step_index: step.index,
            slice,
            input_offset: step.input_offset.saturating_add(lo),
            output_offset: step.output_offset.saturating_add(lo),
            count: hi.saturating_sub(lo),
            recv,
            send,
            header,
        }
    }

    #[inline(always)]
    fn next_action(&mut self) -> Result<Option<Next>, Error> {
        if self.credit_due {
            self.credit_due = false;
            return Ok(Some(Next::ReturnCredit {
                head: self.recv_next,
            }));
        }
        if self.phase == Phase::Busy {
            return Ok(None);
        }
        if !self.has_current {
            match self.steps.next() {
                Some(step) => {
                    self.slices = u32::try_from(super::slice_count(step.count, self.slice_elems))
                        .unwrap_or(u32::MAX);
                    self.slice = 0;
                    self.current = step;
                    self.has_current = true;
                }
                None => {
                    if self.send_head >= self.send_next {
                        self.phase = Phase::Done;
                        return Ok(Some(Next::Done));
                    }
                    return Ok(None);
                }
            }
        }
        let p = self.current.primitive;
        let sps = u64::from(self.slots_per_slice);
        if p.contains(Primitive::RECV) {
            let step = self.recv_next;
            if !can_recv(self.recv_tail, step, sps) {
                return Ok(None);
            }
            if step == self.recv_start && !self.header_ok {
                return Err(Error::Protocol(ProtocolViolation::MissingHeader));
            }
            if self.has_early && matches!(self.early_header, Some((s, _)) if s == step) {
                // The predecessor began the next call while we expect data
                // of this one.
                return Err(Error::Protocol(ProtocolViolation::UnexpectedHeader));
            }
        }
        if p.contains(Primitive::SEND) && !can_send(self.send_head, self.send_next, sps) {
            return Ok(None);
        }
        self.phase = Phase::Busy;
        Ok(Some(Next::Exec))
    }
}
