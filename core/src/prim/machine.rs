//! The per-(channel, rank) state machine that walks a plan.

use crate::error::{Error, ProtocolViolation};
use crate::fifo::{can_recv, can_send, slot_of, FifoGeometry, STEPS};
use crate::id::{ChunkId, SlotIndex};
use crate::log;
use crate::math::div_up;
use crate::plan::{CallDesc, Step, Steps};
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

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Waiting for data / credit, or ready to emit the next exec.
    Idle,
    /// An exec is outstanding.
    Busy(Exec),
    /// `Done` emitted.
    Done,
    /// Failed with this error; accepts nothing more.
    Failed(Error),
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
#[derive(Clone, Debug)]
pub struct Machine<M> {
    steps: Steps<M>,
    call: CallDesc,
    elem: u64,
    slice_elems: u64,
    slots_per_slice: u64,
    current: Option<Step>,
    slices: u64,
    slice: u64,
    link: LinkState,
    recv_start: u64,
    send_start: u64,
    header_ok: bool,
    header_sent: bool,
    credit: Option<u64>,
    phase: Phase,
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
        let plan = steps.plan();
        if call.collective != plan.collective()
            || call.count != plan.count()
            || call.dtype != plan.dtype()
        {
            return Err(Error::PlanMismatch);
        }
        let elem = u64::from(call.dtype.size());
        let slice_elems = geometry.slice_bytes().checked_div(elem).unwrap_or(0);
        if slice_elems == 0 {
            return Err(Error::BadFifoGeometry);
        }
        // A send-only step (a ring's step 0) posts a whole chunk before the
        // rank receives anything. If that fills the successor's FIFO on
        // every rank at once, each rank waits for room that only its
        // successor's send could make: deadlock. One free slice breaks it.
        let chunk_bytes = plan.chunk_elems().saturating_mul(elem);
        if geometry.slices_per_chunk(chunk_bytes) > geometry.max_slices_per_chunk() {
            return Err(Error::ChunkTooLargeForFifo {
                chunk_bytes,
                fifo_bytes: geometry.fifo_bytes(),
            });
        }
        let mut m = Machine {
            steps,
            call,
            elem,
            slice_elems,
            slots_per_slice: geometry.slots_per_slice(),
            current: None,
            slices: 0,
            slice: 0,
            link: LinkState {
                early_header: None,
                ..link
            },
            recv_start: link.recv_next,
            send_start: link.send_next,
            header_ok: false,
            header_sent: false,
            credit: None,
            phase: Phase::Idle,
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
        self.link
    }

    /// Whether the machine has emitted [`Action::Done`].
    pub fn is_done(&self) -> bool {
        self.phase == Phase::Done
    }

    /// The error the machine failed with, if it did.
    pub fn error(&self) -> Option<Error> {
        match self.phase {
            Phase::Failed(e) => Some(e),
            _ => None,
        }
    }

    /// The outstanding exec, if any.
    pub fn pending(&self) -> Option<&Exec> {
        match &self.phase {
            Phase::Busy(e) => Some(e),
            _ => None,
        }
    }

    fn live(&self) -> Result<(), Error> {
        match self.phase {
            Phase::Failed(_) => Err(Error::Finished),
            _ => Ok(()),
        }
    }

    fn fail(&mut self, e: Error) -> Error {
        log::warning!("ringcc: machine failed");
        self.phase = Phase::Failed(e);
        e
    }

    /// The predecessor's `tail` counter moved to `tail`.
    pub fn handle_tail(&mut self, tail: u64) -> Result<(), Error> {
        self.live()?;
        if tail < self.link.recv_tail {
            return Err(self.fail(Error::Protocol(ProtocolViolation::TailBackwards)));
        }
        if tail > self.link.recv_next.saturating_add(STEPS) {
            return Err(self.fail(Error::Protocol(ProtocolViolation::Overrun)));
        }
        self.link.recv_tail = tail;
        Ok(())
    }

    /// The predecessor's call header for the message at FIFO step `step`.
    ///
    /// The header of this call must come at the collective's first step and
    /// equal this rank's call, or the machine fails with `MismatchedCall`.
    /// The next call's header (sequence number one higher) may arrive while
    /// this machine finishes; it is kept in [`LinkState::early_header`].
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
        if desc.seq == self.call.seq.wrapping_add(1) {
            if self.link.early_header.is_some() || step != self.link.recv_next {
                return Err(self.fail(Error::Protocol(ProtocolViolation::UnexpectedHeader)));
            }
            self.link.early_header = Some((step, desc));
            return Ok(());
        }
        Err(self.fail(Error::MismatchedCall {
            expected: self.call,
            got: desc,
        }))
    }

    /// The successor's `head` counter moved to `head`.
    pub fn handle_head(&mut self, head: u64) -> Result<(), Error> {
        self.live()?;
        if head < self.link.send_head {
            return Err(self.fail(Error::Protocol(ProtocolViolation::HeadBackwards)));
        }
        if head > self.link.send_next {
            return Err(self.fail(Error::Protocol(ProtocolViolation::HeadAhead)));
        }
        self.link.send_head = head;
        Ok(())
    }

    /// The outstanding exec is complete.
    pub fn handle_exec_done(&mut self) -> Result<(), Error> {
        self.live()?;
        let Phase::Busy(exec) = self.phase else {
            return Err(Error::NoExecPending);
        };
        if let Some(r) = exec.recv {
            self.link.recv_next = r.end();
            self.credit = Some(r.end());
        }
        if let Some(s) = exec.send {
            self.link.send_next = s.end();
            if exec.header.is_some() {
                self.header_sent = true;
            }
        }
        self.slice = self.slice.saturating_add(1);
        if self.slice >= self.slices {
            self.current = None;
        }
        self.phase = Phase::Idle;
        Ok(())
    }

    /// The next action, if any is possible now; `Ok(None)` when the machine
    /// waits for an event (or is done). Fails with the machine's error once
    /// it has failed.
    #[must_use = "actions must be carried out"]
    #[inline]
    pub fn poll_action(&mut self) -> Result<Option<Action>, Error> {
        match self.phase {
            Phase::Failed(e) => return Err(e),
            Phase::Done => return Ok(None),
            Phase::Idle | Phase::Busy(_) => {}
        }
        self.next_action().map_err(|e| self.fail(e))
    }

    #[inline]
    fn next_action(&mut self) -> Result<Option<Action>, Error> {
        if let Some(head) = self.credit.take() {
            return Ok(Some(Action::ReturnCredit { head }));
        }
        if matches!(self.phase, Phase::Busy(_)) {
            return Ok(None);
        }
        if self.current.is_none() {
            match self.steps.next() {
                Some(step) => {
                    let bytes = step.count.saturating_mul(self.elem);
                    let slice_bytes = self.slice_elems.saturating_mul(self.elem);
                    // Most steps fit in one slice: no division for them.
                    self.slices = if bytes <= slice_bytes {
                        1
                    } else {
                        div_up(bytes, slice_bytes).max(1)
                    };
                    self.slice = 0;
                    self.current = Some(step);
                }
                None => {
                    if self.link.send_head >= self.link.send_next {
                        self.phase = Phase::Done;
                        return Ok(Some(Action::Done));
                    }
                    return Ok(None);
                }
            }
        }
        let Some(step) = self.current else {
            return Ok(None);
        };
        let p = step.primitive;
        let sps = self.slots_per_slice;
        let recv = if p.contains(Primitive::RECV) {
            let span = SlotSpan {
                step: self.link.recv_next,
                slots: sps,
            };
            if !can_recv(self.link.recv_tail, span.step, sps) {
                return Ok(None);
            }
            if span.step == self.recv_start && !self.header_ok {
                return Err(Error::Protocol(ProtocolViolation::MissingHeader));
            }
            if matches!(self.link.early_header, Some((s, _)) if s == span.step) {
                // The predecessor began the next call while we expect data
                // of this one.
                return Err(Error::Protocol(ProtocolViolation::UnexpectedHeader));
            }
            Some(span)
        } else {
            None
        };
        let send = if p.contains(Primitive::SEND) {
            let span = SlotSpan {
                step: self.link.send_next,
                slots: sps,
            };
            if !can_send(self.link.send_head, span.step, sps) {
                return Ok(None);
            }
            Some(span)
        } else {
            None
        };
        let header = match send {
            Some(s) if !self.header_sent && s.step == self.send_start => Some(self.call),
            _ => None,
        };
        let lo = self.slice.saturating_mul(self.slice_elems).min(step.count);
        let hi = lo.saturating_add(self.slice_elems).min(step.count);
        let exec = Exec {
            primitive: p,
            chunk: step.chunk,
            loop_index: step.loop_index,
            step_index: step.index,
            slice: self.slice,
            input_offset: step.input_offset.saturating_add(lo),
            output_offset: step.output_offset.saturating_add(lo),
            count: hi.saturating_sub(lo),
            recv,
            send,
            header,
        };
        self.phase = Phase::Busy(exec);
        Ok(Some(Action::Exec(exec)))
    }
}
