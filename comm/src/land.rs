//! Slices that land straight in the output: the running call's steps
//! whose received bytes go to the output unchanged (`recv`, and
//! `recvCopySend`, whose send then leaves from the output), so that an
//! end reading a stream (TCP) reads their payloads there rather than into
//! a slot the executor would copy from — at 1 MiB over TCP that copy was
//! the largest part of a rank's work besides the kernel's own copies.
//!
//! Per channel a cursor walks the call's receiving slices in FIFO-step
//! order (the predecessor sends them in that order, so the cursor only
//! moves forward), cut as the core's `Machine` cuts them; a step whose
//! payload was put in the output is marked, and the executor skips its
//! slot. Safety of the early write: the bytes of such a step are the
//! final values of their output elements, and they exist only after this
//! rank's own contribution to them was sent — so even in place no input
//! byte this rank still reads is overwritten.

use ringcc_core::fifo::{FifoGeometry, STEPS};
use ringcc_core::plan::Steps;
use ringcc_core::prim::{slice_count, slice_range};
use ringcc_core::{CallDesc, ChannelId, Plan, Primitive, Rank};

use crate::buffer::Buffers;
use crate::ring::RingOrderOf;
use crate::transport::Landing;

/// One channel's receiving slices of the running call.
pub(crate) struct ChannelLands {
    steps: Steps<RingOrderOf>,
    /// The current receiving step: its primitive, count and output offset
    /// (elements); the slice being looked at and how many it has.
    prim: Primitive,
    count: u64,
    output_offset: u64,
    slice: u64,
    slices: u64,
    /// FIFO step of the current slice's first slot.
    at: u64,
    /// Per slot, the step whose payload landed (+ 1; 0: none).
    landed: [u64; STEPS as usize],
}

/// The running call's landings, per channel it uses.
pub(crate) struct Lands {
    call: CallDesc,
    elem: u64,
    slice_elems: u64,
    slots_per_slice: u64,
    slot_bytes: u64,
    channels: Vec<ChannelLands>,
    /// Payload bytes put in the output so far.
    bytes: u64,
}

impl Lands {
    /// The landings of `call` (`desc`, planned as `plan`) for `rank` on
    /// the first `channels` channels, whose receives start at FIFO step
    /// `recv_start(c)`; `None` when the plan cannot be walked (the engine
    /// refused it first).
    pub(crate) fn new(
        desc: CallDesc,
        plan: &Plan,
        geometry: FifoGeometry,
        rank: Rank,
        order: &RingOrderOf,
        channels: usize,
        recv_start: impl Fn(ChannelId) -> u64,
    ) -> Option<Lands> {
        let elem = u64::from(desc.dtype.size());
        let chans = (0..channels)
            .map(|c| {
                let c = ChannelId(u8::try_from(c).ok()?);
                Some(ChannelLands {
                    steps: plan.steps(c, rank, order.clone()).ok()?,
                    prim: Primitive::empty(),
                    count: 0,
                    output_offset: 0,
                    slice: 0,
                    slices: 0,
                    at: recv_start(c),
                    landed: [0; STEPS as usize],
                })
            })
            .collect::<Option<Vec<_>>>()?;
        Some(Lands {
            call: desc,
            elem,
            slice_elems: geometry.slice_bytes().checked_div(elem)?,
            slots_per_slice: geometry.slots_per_slice(),
            slot_bytes: geometry.slot_bytes(),
            channels: chans,
            bytes: 0,
        })
    }

    /// Payload bytes put in the output so far.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Whether step `step`'s payload on channel `c` is in the output.
    pub(crate) fn landed(&self, c: ChannelId, step: u64) -> bool {
        self.channels
            .get(usize::from(c.0))
            .is_some_and(|l| l.landed[(step % STEPS) as usize] == step.wrapping_add(1))
    }

    /// Where step `step` (`len` bytes, of call `call`) of channel `c`
    /// goes in the output — a byte offset —, marking it landed; `None`
    /// when its bytes go to the slot.
    fn place(&mut self, c: ChannelId, call: &CallDesc, step: u64, len: usize) -> Option<usize> {
        if *call != self.call || len == 0 {
            return None;
        }
        let (elem, se, sps, sb) = (
            self.elem,
            self.slice_elems.max(1),
            self.slots_per_slice,
            self.slot_bytes,
        );
        let l = self.channels.get_mut(usize::from(c.0))?;
        // Move to the slice that holds `step` (slices end at `at + sps`).
        while l.slice >= l.slices || step >= l.at.saturating_add(sps) {
            if l.slice < l.slices {
                l.slice += 1;
                l.at = l.at.saturating_add(sps);
                continue;
            }
            let s = l.steps.next()?;
            if !s.primitive.contains(Primitive::RECV) {
                continue;
            }
            l.prim = s.primitive;
            l.count = s.count;
            l.output_offset = s.output_offset;
            l.slice = 0;
            l.slices = slice_count(s.count, se);
        }
        if step < l.at || !l.prim.contains(Primitive::COPY) || l.prim.contains(Primitive::REDUCE) {
            return None;
        }
        let (lo, hi) = slice_range(l.count, se, l.slice);
        let part = step - l.at;
        let from = part.checked_mul(sb)?;
        let bytes = (hi - lo).checked_mul(elem)?;
        let want = bytes.saturating_sub(from).min(sb);
        if want != len as u64 {
            return None;
        }
        let at = (l.output_offset + lo)
            .checked_mul(elem)?
            .checked_add(from)?;
        let mark = &mut l.landed[(step % STEPS) as usize];
        if *mark != step.wrapping_add(1) {
            *mark = step.wrapping_add(1);
            self.bytes = self.bytes.saturating_add(want);
        }
        usize::try_from(at).ok()
    }
}

/// [`Landing`] for one channel's end during one poll: the call's
/// landings and its buffers.
pub(crate) struct ChannelLanding<'a, 'b> {
    pub(crate) lands: &'a mut Lands,
    pub(crate) bufs: &'a mut Buffers<'b>,
    pub(crate) channel: ChannelId,
}

impl Landing for ChannelLanding<'_, '_> {
    fn dest(&mut self, call: &CallDesc, step: u64, len: usize) -> Option<&mut [u8]> {
        let at = self.lands.place(self.channel, call, step, len)?;
        self.bufs.output_mut(at, len)
    }
}
