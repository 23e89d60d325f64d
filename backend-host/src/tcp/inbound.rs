//! The receiving side's frame parser, sans-IO: the end reads the socket
//! and hands the bytes over; checked frames come out, payloads go
//! straight into the slots.
//!
//! Every frame header is checked before any of its payload is taken:
//! kind, length within a slot, step in order and within the credit
//! window, call sequence never going back. A payload is written only
//! into the slot of its step, at most `slot_bytes` long, so nothing is
//! written outside a slot whatever the stream holds; a step is written
//! only when it is the next in order (at or above the tail) and below
//! `head + STEPS` for the credit posted, so no step the consumer may read
//! (below the tail, not yet credited) shares its slot.

use std::collections::VecDeque;
use std::ops::Range;

use ringcc_comm::{Error, Result};
use ringcc_core::fifo::{slot_of, STEPS};
use ringcc_core::wire::call_header::{CallHeader, CallHeaderRepr, CALL_HEADER_LEN};
use ringcc_core::CallDesc;

use ringcc_comm::transport::Landing;

use super::frame::{FrameRepr, Kind, FRAME_LEN};
use super::io::{Peer, ReadFail};

/// What the stream owes next.
#[derive(Clone, Copy, Debug)]
enum Want {
    /// A frame header.
    Header,
    /// The payload of this call header frame.
    CallHeader(FrameRepr),
    /// The rest of this data frame's payload, `got` bytes of which are in
    /// its slot — or in the output, where the call took it
    /// (`landed`: see [`Landing`]).
    Data {
        f: FrameRepr,
        got: usize,
        landed: bool,
    },
}

/// Where the rest of a payload may be read straight from the socket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Direct {
    /// Into this range of the slots.
    Slot(Range<usize>),
    /// Into the output the [`Landing`] gives for `step` (`len` bytes of
    /// call `call`), from byte `got`.
    Landed {
        call: CallDesc,
        step: u64,
        len: usize,
        got: usize,
    },
}

/// Where one hop's incoming stream stands.
#[derive(Debug)]
pub(super) struct Inbound {
    peer: Peer,
    slot_bytes: usize,
    want: Want,
    /// The step the next header or data frame must carry.
    next: u64,
    /// Every step below has all its bytes.
    tail: u64,
    /// The highest call sequence number seen.
    last_seq: u64,
    /// The last call header's sequence number.
    header_seq: Option<u64>,
    /// The step of a header not yet followed by data.
    header_at: Option<u64>,
    /// Call headers received and not yet reported, by the step they
    /// precede, in order.
    headers: VecDeque<(u64, CallDesc)>,
    /// The call of the last call header: the data after it is its.
    call: Option<CallDesc>,
    /// The payload length of the last data frame.
    last_data: usize,
    /// The sender closed its end in order, at a slice boundary: nothing
    /// more comes.
    closed: bool,
}

impl Inbound {
    /// A stream from `peer` into slots of `slot_bytes`.
    pub(super) fn new(peer: Peer, slot_bytes: usize) -> Inbound {
        Inbound {
            peer,
            slot_bytes,
            want: Want::Header,
            next: 0,
            tail: 0,
            last_seq: 0,
            header_seq: None,
            header_at: None,
            headers: VecDeque::with_capacity(STEPS as usize + 1),
            call: None,
            last_data: 0,
            closed: false,
        }
    }

    /// Every step below has arrived whole.
    pub(super) fn tail(&self) -> u64 {
        self.tail
    }

    /// The sender said goodbye between slices.
    pub(super) fn closed(&self) -> bool {
        self.closed
    }

    /// Part of a frame has come (a header's payload or a data frame's is
    /// awaited).
    pub(super) fn mid_frame(&self) -> bool {
        !matches!(self.want, Want::Header)
    }

    /// The payload length of the last data frame begun.
    pub(super) fn last_data(&self) -> usize {
        self.last_data
    }

    /// Bytes the stream owes before the frame header, call header or
    /// payload being received is whole.
    pub(super) fn owed(&self) -> usize {
        match self.want {
            Want::Header => FRAME_LEN,
            Want::CallHeader(_) => CALL_HEADER_LEN,
            Want::Data { f, got, .. } => (f.length as usize).saturating_sub(got),
        }
    }

    /// The call headers received and not yet reported.
    pub(super) fn headers(&mut self) -> &mut VecDeque<(u64, CallDesc)> {
        &mut self.headers
    }

    /// Takes every whole frame header and every payload byte of `bytes`
    /// (the stream's next bytes), writing payloads into `slots` (`STEPS`
    /// slots of `slot_bytes`) under the credit `head` posted so far — or
    /// where `landing` takes them: the bytes taken. What is left is the
    /// start of a header, for the next call. Stops at the sender's
    /// goodbye; a frame that breaks the protocol is the error, its payload
    /// untouched.
    pub(super) fn take(
        &mut self,
        bytes: &[u8],
        slots: &mut [u8],
        head: u64,
        landing: &mut dyn Landing,
    ) -> Result<usize> {
        let mut used = 0;
        while !self.closed {
            let rest = bytes.get(used..).unwrap_or_default();
            match self.want {
                Want::Header => {
                    let Some(b) = rest.first_chunk::<FRAME_LEN>() else {
                        break;
                    };
                    self.header(b, head)?;
                    used += FRAME_LEN;
                    // A payload the call takes unchanged goes straight to
                    // the output (asked once it is checked, before a byte).
                    if let (Want::Data { f, got: 0, .. }, Some(call)) = (self.want, self.call) {
                        let len = f.length as usize;
                        let landed = landing.dest(&call, f.step, len).is_some();
                        self.want = Want::Data { f, got: 0, landed };
                    }
                }
                Want::CallHeader(f) => {
                    let Some(h) = rest.first_chunk::<CALL_HEADER_LEN>() else {
                        break;
                    };
                    self.push_header(&f, h)?;
                    self.want = Want::Header;
                    used += CALL_HEADER_LEN;
                }
                Want::Data { f, got, landed } => {
                    let len = f.length as usize;
                    let n = rest.len().min(len - got);
                    if n == 0 && got < len {
                        break;
                    }
                    let dst = if landed {
                        let call = self.call;
                        call.and_then(|call| landing.dest(&call, f.step, len))
                            .and_then(|d| d.get_mut(got..got.checked_add(n)?))
                    } else {
                        self.payload(slots, &f, got, n)
                    };
                    let (Some(src), Some(dst)) = (rest.get(..n), dst) else {
                        return Err(self.peer.protocol(format!("data frame of {len} bytes")));
                    };
                    dst.copy_from_slice(src);
                    self.advance(f, got + n, landed);
                    used += n;
                }
            }
        }
        Ok(used)
    }

    /// Where the rest of the payload being received may be read straight
    /// into the slots (a range of them), when that rest is at least `min`
    /// bytes.
    pub(super) fn direct(&self, min: usize) -> Option<Direct> {
        let Want::Data { f, got, landed } = self.want else {
            return None;
        };
        let len = f.length as usize;
        if len - got < min {
            return None;
        }
        match (landed, self.call) {
            (true, Some(call)) => Some(Direct::Landed {
                call,
                step: f.step,
                len,
                got,
            }),
            _ => {
                let base = usize::from(slot_of(f.step).0) * self.slot_bytes;
                Some(Direct::Slot(base + got..base + len))
            }
        }
    }

    /// `n` bytes were read into the start of the place [`direct`](Self::direct) gave.
    pub(super) fn took_direct(&mut self, n: usize) {
        if let Want::Data { f, got, landed } = self.want {
            self.advance(f, (got + n).min(f.length as usize), landed);
        }
    }

    /// The error of a stream that ended with `buffered` bytes not taken.
    pub(super) fn eof(&self, buffered: usize) -> Error {
        let (got, what, len) = match self.want {
            Want::Header => (buffered, "frame header", FRAME_LEN),
            Want::CallHeader(_) => (buffered, "call header", CALL_HEADER_LEN),
            Want::Data { f, got, .. } => (got, "data frame", f.length as usize),
        };
        self.peer.read_error(ReadFail::Eof { got }, what, len)
    }

    /// The `n` bytes of `f`'s payload from `got` on, in its slot.
    fn payload<'s>(
        &self,
        slots: &'s mut [u8],
        f: &FrameRepr,
        got: usize,
        n: usize,
    ) -> Option<&'s mut [u8]> {
        let base = usize::from(slot_of(f.step).0).checked_mul(self.slot_bytes)?;
        let end = got.checked_add(n).filter(|&e| e <= self.slot_bytes)?;
        slots.get_mut(base + got..base + end)
    }

    /// `got` bytes of data frame `f` are in: the next frame once all are.
    fn advance(&mut self, f: FrameRepr, got: usize, landed: bool) {
        if got < f.length as usize {
            self.want = Want::Data { f, got, landed };
            return;
        }
        self.want = Want::Header;
        self.next = self.next.saturating_add(1);
        self.header_at = None;
        if f.last {
            self.tail = self.next;
        }
    }

    /// A frame header: checked, then what it announces is expected.
    fn header(&mut self, b: &[u8; FRAME_LEN], head: u64) -> Result<()> {
        let f =
            FrameRepr::parse(b).map_err(|e| self.peer.protocol(format!("frame header: {e}")))?;
        if f.kind == Kind::Goodbye {
            return self.goodbye(&f);
        }
        self.check(&f, head)?;
        self.last_seq = f.seq;
        self.want = match f.kind {
            Kind::CallHeader => Want::CallHeader(f),
            _ => {
                self.last_data = f.length as usize;
                Want::Data {
                    f,
                    got: 0,
                    landed: false,
                }
            }
        };
        if let Want::Data { f, got, landed } = self.want {
            // A zero-length data frame is whole at once.
            self.advance(f, got, landed);
        }
        Ok(())
    }

    /// The sender's goodbye: fine at a slice boundary (nothing more is
    /// read), a lost peer in the middle of one.
    fn goodbye(&mut self, f: &FrameRepr) -> Result<()> {
        if f.length != 0 || f.last || f.step != self.next {
            return Err(self.peer.protocol(format!(
                "a goodbye at step {} of {} bytes (next step {})",
                f.step, f.length, self.next
            )));
        }
        if self.header_at.is_some() || self.tail != self.next {
            return Err(self.peer.gone(format!(
                "it closed its end in the middle of a slice (step {}, tail {})",
                self.next, self.tail
            )));
        }
        tracing::debug!(peer = %self.peer.rank, channel = %self.peer.channel, step = f.step,
            "tcp: the sender closed its end");
        self.closed = true;
        Ok(())
    }

    /// Whether a frame may be taken, before any of its payload is read.
    fn check(&self, f: &FrameRepr, head: u64) -> Result<()> {
        let p = &self.peer;
        match f.kind {
            Kind::CallHeader if f.length as usize != CALL_HEADER_LEN => {
                return Err(p.protocol(format!(
                    "a call header frame of {} bytes (not {CALL_HEADER_LEN})",
                    f.length
                )))
            }
            Kind::CallHeader if f.last => {
                return Err(p.protocol("a call header frame flagged as a slice's last"))
            }
            Kind::CallHeader if self.header_at == Some(f.step) => {
                return Err(p.protocol(format!("a second call header for step {}", f.step)))
            }
            Kind::CallHeader if self.header_seq.is_some_and(|s| f.seq <= s) => {
                return Err(p.protocol(format!(
                    "call header of call {} after one of call {}",
                    f.seq,
                    self.header_seq.unwrap_or(0)
                )))
            }
            Kind::CallHeader => {}
            Kind::Data if f.length as usize > self.slot_bytes => {
                return Err(p.protocol(format!(
                    "a data frame of {} bytes for {}-byte slots",
                    f.length, self.slot_bytes
                )))
            }
            Kind::Data => {}
            Kind::Credit => return Err(p.protocol("a credit frame from the sender")),
            Kind::Goodbye => return Err(p.protocol("a goodbye with a payload")),
            Kind::Unknown(c) => return Err(p.protocol(format!("unknown frame kind {c}"))),
        }
        if f.step != self.next {
            return Err(p.protocol(format!(
                "step {} out of order (expected step {})",
                f.step, self.next
            )));
        }
        if head.checked_add(STEPS).is_none_or(|end| f.step >= end) {
            return Err(p.protocol(format!(
                "step {} outside the window (head {head}, {STEPS} slots)",
                f.step
            )));
        }
        if f.seq < self.last_seq {
            return Err(p.protocol(format!(
                "call sequence went back from {} to {}",
                self.last_seq, f.seq
            )));
        }
        Ok(())
    }

    /// Parses a call header and queues it for the end's `poll`.
    fn push_header(&mut self, f: &FrameRepr, h: &[u8; CALL_HEADER_LEN]) -> Result<()> {
        let repr =
            CallHeaderRepr::parse(&CallHeader::new_unchecked(&h[..])).map_err(|e| Error::Core {
                channel: Some(self.peer.channel),
                call: "CallHeaderRepr::parse",
                source: ringcc_core::Error::Wire(e),
            })?;
        if repr.desc.seq != f.seq || u64::from(repr.step) != f.step & 0xffff_ffff {
            return Err(self.peer.protocol(format!(
                "call header of call {} at step {} in a frame of call {} at step {}",
                repr.desc.seq, repr.step, f.seq, f.step
            )));
        }
        self.headers.push_back((f.step, repr.desc));
        self.call = Some(repr.desc);
        self.header_seq = Some(f.seq);
        self.header_at = Some(f.step);
        Ok(())
    }
}
