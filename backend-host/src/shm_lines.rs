//! LL and LL128 over shared memory: the slots' data carries its own
//! arrival (`ringcc_core::line`), so a step costs the receiver no load of
//! a separate `tail` counter's cache line and the sender no store to it.
//!
//! - [`LineSend`] stages the executor's result for a slot in this
//!   process (lines interleave data and flags, so the result cannot be
//!   written in place) and, at `post`, writes it as the step's units or
//!   lines into the receiver's line slot — after the call header, so a
//!   receiver that sees any unit of the step sees the header.
//! - [`LineRecv`] works out the receiver's next `tail` from both ways a
//!   step can come: Simple's counter (the sender posted `tail`), or the
//!   step's slot in the LL or LL128 region carrying the step's flag. The
//!   counter may jump over steps sent as lines (a Simple call after an LL
//!   one), so the steps below it are looked at one by one: a step whose
//!   line slot carries its flag came as lines (all of them visible: the
//!   counter's release came after), the others by Simple. A step's lines
//!   are decoded into a buffer of this process, which the executor
//!   reads as the step's slot.

use ringcc_comm::Error as CommError;
use ringcc_core::fifo::{slot_of, STEPS};
use ringcc_core::line::{flag_of, ll, ll128};
use ringcc_core::prim::SlotSpan;
use ringcc_core::sync::Ordering;
use ringcc_core::{ChannelId, Protocol, SlotIndex};

use crate::{Error, Segment};

type Result<T> = std::result::Result<T, CommError>;

const DEPTH: usize = STEPS as usize;

fn core_err(channel: ChannelId, call: &'static str) -> impl Fn(ringcc_core::Error) -> CommError {
    move |source| CommError::Core {
        channel: Some(channel),
        call,
        source,
    }
}

fn index(slot: SlotIndex) -> usize {
    usize::from(slot.get())
}

/// A sending end's line state: the protocol of the current call and a
/// staging buffer per slot.
#[derive(Debug)]
pub(crate) struct LineSend {
    proto: Protocol,
    staging: Vec<Vec<u8>>,
    staged: [usize; DEPTH],
}

impl LineSend {
    pub(crate) fn new() -> LineSend {
        LineSend {
            proto: Protocol::Simple,
            staging: vec![Vec::new(); DEPTH],
            staged: [0; DEPTH],
        }
    }

    /// The current call's protocol.
    pub(crate) fn set(&mut self, proto: Protocol) {
        self.proto = proto;
    }

    /// Whether the current call goes as lines.
    pub(crate) fn active(&self) -> bool {
        self.proto.flags_in_slot()
    }

    /// The staging buffer of `slot`, `len` bytes (at most what the line
    /// slot carries).
    pub(crate) fn slot_mut(
        &mut self,
        seg: &Segment,
        slot: SlotIndex,
        len: usize,
    ) -> Result<&mut [u8]> {
        let (_, cap) = seg.lines(self.proto, slot)?;
        let i = index(slot);
        if len > cap {
            return Err(Error::SlotOverflow {
                slot: i as u64,
                len,
                capacity: cap as u64,
            }
            .into());
        }
        let (Some(buf), Some(staged)) = (self.staging.get_mut(i), self.staged.get_mut(i)) else {
            return Err(Error::NoSuchSlot { slot: i as u64 }.into());
        };
        buf.resize(len, 0);
        *staged = len;
        Ok(buf)
    }

    /// Writes every slot of `span` as its step's lines (what was staged
    /// for it since the last post; nothing staged is an empty slot, which
    /// still arrives).
    pub(crate) fn post(&mut self, seg: &Segment, span: SlotSpan, channel: ChannelId) -> Result<()> {
        for k in 0..span.slots {
            let step = span.step + k;
            let slot = slot_of(step);
            let i = index(slot);
            let (words, _) = seg.lines(self.proto, slot)?;
            let len = self.staged.get_mut(i).map_or(0, std::mem::take);
            let data = self
                .staging
                .get(i)
                .and_then(|b| b.get(..len))
                .unwrap_or_default();
            match self.proto {
                Protocol::Ll => {
                    ll::write(words, step, data).map_err(core_err(channel, "ll::write"))
                }
                Protocol::Ll128 => {
                    ll128::write(words, step, data).map_err(core_err(channel, "ll128::write"))
                }
                _ => Ok(()),
            }?;
        }
        Ok(())
    }
}

/// A line reader in progress for one step.
#[derive(Debug)]
enum Pending {
    Ll(ll::Reader),
    Ll128(ll128::Reader),
}

impl Pending {
    fn step(&self) -> u64 {
        match self {
            Pending::Ll(r) => r.step(),
            Pending::Ll128(r) => r.step(),
        }
    }
}

/// A receiving end's line state.
#[derive(Debug)]
pub(crate) struct LineRecv {
    /// Per slot: the decoded data of the step it holds, when it came as
    /// lines (`Some(len)`), else `None` (Simple's slot in the segment).
    decoded: Vec<Vec<u8>>,
    by_lines: [Option<usize>; DEPTH],
    pending: Option<Pending>,
    /// A `tail` found by lines, not reported yet.
    ready: Option<u64>,
}

impl LineRecv {
    pub(crate) fn new() -> LineRecv {
        LineRecv {
            decoded: vec![Vec::new(); DEPTH],
            by_lines: [None; DEPTH],
            pending: None,
            ready: None,
        }
    }

    /// Which line protocol, if any, step `step` came as (its slot's first
    /// unit or line carries the step's flag).
    fn started(seg: &Segment, step: u64) -> Result<Option<Protocol>> {
        let slot = slot_of(step);
        let (units, _) = seg.lines(Protocol::Ll, slot)?;
        if units
            .first()
            .is_some_and(|u| ll::unpack(u.load(Ordering::Acquire)).1 == ll::flag(step))
        {
            return Ok(Some(Protocol::Ll));
        }
        let (words, _) = seg.lines(Protocol::Ll128, slot)?;
        if words
            .get(ll128::LINE_WORDS - 1)
            .is_some_and(|w| w.load(Ordering::Acquire) == flag_of(step))
        {
            return Ok(Some(Protocol::Ll128));
        }
        Ok(None)
    }

    /// The `tail` to report, the receiver having reported `next`: past
    /// the steps Simple's counter covers up to the first that came as
    /// lines, else past `next` once all its lines are in.
    pub(crate) fn arrived(&mut self, seg: &Segment, next: u64, channel: ChannelId) -> Result<u64> {
        if let Some(r) = self.ready {
            return Ok(r);
        }
        let counter = seg.tail().load();
        let mut t = next;
        while t < counter && Self::started(seg, t)?.is_none() {
            if let Some(b) = self.by_lines.get_mut(index(slot_of(t))) {
                *b = None;
            }
            t += 1;
        }
        if t > next {
            return Ok(t);
        }
        if self.take(seg, next, channel)? {
            self.ready = Some(next + 1);
            return Ok(next + 1);
        }
        Ok(next)
    }

    /// The `tail` found was reported.
    pub(crate) fn reported(&mut self) {
        self.ready = None;
    }

    /// Takes what arrived of step `step`'s lines: whether all did.
    fn take(&mut self, seg: &Segment, step: u64, channel: ChannelId) -> Result<bool> {
        if self.pending.as_ref().is_some_and(|p| p.step() != step) {
            self.pending = None;
        }
        let pending = match self.pending.take() {
            Some(p) => p,
            None => match Self::started(seg, step)? {
                Some(Protocol::Ll) => Pending::Ll(ll::Reader::new(step)),
                Some(_) => Pending::Ll128(ll128::Reader::new(step)),
                None => return Ok(false),
            },
        };
        let slot = slot_of(step);
        let i = index(slot);
        let Some(buf) = self.decoded.get_mut(i) else {
            return Err(Error::NoSuchSlot { slot: i as u64 }.into());
        };
        let (pending, got) = match pending {
            Pending::Ll(mut r) => {
                let (units, cap) = seg.lines(Protocol::Ll, slot)?;
                if buf.len() < cap {
                    buf.resize(cap, 0);
                }
                let got = r
                    .poll(units, buf)
                    .map_err(core_err(channel, "ll::Reader::poll"))?;
                (Pending::Ll(r), got)
            }
            Pending::Ll128(mut r) => {
                let (words, cap) = seg.lines(Protocol::Ll128, slot)?;
                if buf.len() < cap {
                    buf.resize(cap, 0);
                }
                let got = r
                    .poll(words, buf)
                    .map_err(core_err(channel, "ll128::Reader::poll"))?;
                (Pending::Ll128(r), got)
            }
        };
        match got {
            Some(len) => {
                if let Some(b) = self.by_lines.get_mut(i) {
                    *b = Some(len);
                }
                Ok(true)
            }
            None => {
                self.pending = Some(pending);
                Ok(false)
            }
        }
    }

    /// The first `len` bytes of `slot` when its step came as lines; `None`
    /// when it came by Simple (the segment's slot holds it). More than the
    /// sender wrote is [`Error::SlotOverflow`].
    pub(crate) fn slot(&self, slot: SlotIndex, len: usize) -> Option<Result<&[u8]>> {
        let i = index(slot);
        let have = (*self.by_lines.get(i)?)?;
        Some(
            self.decoded
                .get(i)
                .and_then(|b| b.get(..len))
                .filter(|_| len <= have)
                .ok_or_else(|| {
                    Error::SlotOverflow {
                        slot: i as u64,
                        len,
                        capacity: have as u64,
                    }
                    .into()
                }),
        )
    }
}
