//! From a plan step to the work requests that carry it.
//!
//! Over RDMA a connection's FIFO is 8 slots of the receiver's memory,
//! registered for remote write and advertised to the sender as a
//! [`RemoteFifo`] (address, rkey, capacity), next to a [`RemoteHeader`]
//! mailbox for call headers. For each SEND slice the state machine emits
//! ([`Exec`] with `send: Some(span)`), the sender posts:
//!
//! 1. when `exec.header` is set (the collective's first slice), an inline
//!    RDMA WRITE of the 32-byte [`CallHeaderRepr`] into the mailbox;
//! 2. the slice's bytes as RDMA WRITE(s) into the slot of `span.step`
//!    (byte offset `slot × slot_bytes`), the last one
//!    RDMA WRITE WITH IMMEDIATE, signaled, whose immediate is the low 32
//!    bits of `span.end()`: the receiver's new `tail`. An empty slice is a
//!    zero-length WRITE WITH IMMEDIATE: the slots still move.
//!
//! RC delivers in order, so the receiver sees the header and the data
//! before the immediate that publishes them. It widens the immediate back
//! to 64 bits with [`widen_step`] and, when it has consumed the slots,
//! returns credit: its `head` counter as an inline 8-byte RDMA WRITE into
//! the sender's [`RemoteCounter`] ([`credit_write`]).
//!
//! Every bound is checked when [`SliceWrites::new`] is called, before a
//! single request is formed: a write past the advertised capacity is
//! [`Error::RemoteOverrun`], never a request.

use core::iter::FusedIterator;

use heapless::Vec;

use crate::fifo::{FifoGeometry, STEPS};
use crate::prim::Exec;
use crate::reduce::DataType;

use crate::wire::call_header::{CallHeaderRepr, CALL_HEADER_LEN};
use crate::wire::verbs::{
    InlineData, Payload, SendFlags, WcOpcode, WorkRequest, WrOpcode, MAX_MESSAGE,
};
use crate::wire::{Completion, Error};
use crate::wire::{Lkey, RemoteAddr, Rkey, Sge};

/// Where the slice's bytes are in local, registered memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct LocalBuf {
    /// Address of the slice's first byte.
    pub addr: u64,
    /// Local key of the region.
    pub lkey: Lkey,
}

/// The receiver's FIFO slots, as advertised to the sender.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct RemoteFifo {
    /// Address of slot 0.
    pub addr: u64,
    /// Remote key (registered with remote-write access).
    pub rkey: Rkey,
    /// Bytes registered from `addr` on.
    pub capacity: u64,
}

/// The receiver's call-header mailbox.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct RemoteHeader {
    /// Address of the mailbox.
    pub addr: u64,
    /// Remote key.
    pub rkey: Rkey,
    /// Bytes registered (at least 32).
    pub capacity: u64,
}

/// The sender's credit counter, written by the receiver.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct RemoteCounter {
    /// Address of the 8-byte counter.
    pub addr: u64,
    /// Remote key.
    pub rkey: Rkey,
}

/// Bytes of a credit write: the `head` counter, big-endian.
pub const CREDIT_LEN: usize = 8;

/// The work requests of one SEND slice, in posting order (an iterator; no
/// allocation). All carry the caller's `wr_id`.
#[derive(Clone, Debug)]
pub struct SliceWrites<const N: usize> {
    wr_id: u64,
    header: Option<(CallHeaderRepr, RemoteAddr)>,
    local: LocalBuf,
    remote: RemoteAddr,
    offset: u64,
    len: u64,
    sent: u64,
    max_write: u64,
    imm: u32,
    done: bool,
}

impl<const N: usize> SliceWrites<N> {
    /// The requests for `exec`'s send span: its `count` elements of
    /// `dtype` at `local`, into `fifo` (FIFO shape `geometry`), with the
    /// call header into `mailbox` when `exec.header` is set.
    ///
    /// Fails, before forming anything, with `NoSendSpan` (no send span),
    /// `SliceOverflow` (more bytes than the span's slots, or slots past
    /// the end of the FIFO), `RemoteOverrun` (a write beyond `fifo` or
    /// `mailbox` capacity), `Malformed` (addresses overflow) or
    /// `Exhausted` (`N == 0`).
    pub fn new(
        exec: &Exec,
        geometry: &FifoGeometry,
        dtype: DataType,
        local: LocalBuf,
        fifo: &RemoteFifo,
        mailbox: &RemoteHeader,
        wr_id: u64,
    ) -> Result<Self, Error> {
        if N == 0 {
            return Err(Error::Exhausted);
        }
        let span = exec.send.ok_or(Error::NoSendSpan)?;
        let len = exec
            .count
            .checked_mul(u64::from(dtype.size()))
            .ok_or(Error::SliceOverflow {
                len: u64::MAX,
                room: 0,
            })?;
        let slot = u64::from(span.slot().get());
        let slots_left = STEPS.saturating_sub(slot);
        let room = span
            .slots
            .min(slots_left)
            .saturating_mul(geometry.slot_bytes());
        if span.slots == 0 || span.slots > slots_left || len > room {
            return Err(Error::SliceOverflow { len, room });
        }
        let offset = span.byte_offset(geometry);
        let overrun = Error::RemoteOverrun {
            offset,
            len,
            capacity: fifo.capacity,
        };
        let end = offset.checked_add(len).ok_or(overrun)?;
        if end > fifo.capacity {
            return Err(overrun);
        }
        let remote_addr = fifo.addr.checked_add(offset).ok_or(Error::Malformed)?;
        remote_addr.checked_add(len).ok_or(Error::Malformed)?;
        local.addr.checked_add(len).ok_or(Error::Malformed)?;
        let header = match exec.header {
            Some(desc) => {
                let hdr_len = CALL_HEADER_LEN as u64;
                if hdr_len > mailbox.capacity {
                    return Err(Error::RemoteOverrun {
                        offset: 0,
                        len: hdr_len,
                        capacity: mailbox.capacity,
                    });
                }
                mailbox.addr.checked_add(hdr_len).ok_or(Error::Malformed)?;
                let repr = CallHeaderRepr {
                    desc,
                    step: span.step as u32,
                };
                let at = RemoteAddr {
                    addr: mailbox.addr,
                    rkey: mailbox.rkey,
                };
                Some((repr, at))
            }
            None => None,
        };
        Ok(SliceWrites {
            wr_id,
            header,
            local,
            remote: RemoteAddr {
                addr: remote_addr,
                rkey: fifo.rkey,
            },
            offset,
            len,
            sent: 0,
            max_write: u64::from(MAX_MESSAGE),
            imm: span.end() as u32,
            done: false,
        })
    }

    /// Splits the data into writes of at most `bytes` (1..=2^31; the
    /// default is 2^31, the largest RC message).
    pub fn with_max_write(mut self, bytes: u32) -> Result<Self, Error> {
        if bytes == 0 || bytes > MAX_MESSAGE {
            return Err(Error::Malformed);
        }
        self.max_write = u64::from(bytes);
        Ok(self)
    }

    /// Bytes of data the slice moves.
    pub fn data_len(&self) -> u64 {
        self.len
    }

    /// Byte offset of the slice in the remote FIFO.
    pub fn remote_offset(&self) -> u64 {
        self.offset
    }

    /// The immediate of the last write: the low 32 bits of the new `tail`.
    pub fn imm(&self) -> u32 {
        self.imm
    }

    /// The call header still to be written, if any.
    pub fn header(&self) -> Option<&CallHeaderRepr> {
        self.header.as_ref().map(|(h, _)| h)
    }

    fn header_request(&self, h: &CallHeaderRepr, at: RemoteAddr) -> WorkRequest<N> {
        let mut data = InlineData::new();
        // 32 bytes fit MAX_INLINE (64) by construction.
        let _ = data.extend_from_slice(&h.to_bytes());
        WorkRequest {
            wr_id: self.wr_id,
            opcode: WrOpcode::RdmaWrite,
            flags: SendFlags::INLINE,
            payload: Payload::Inline(data),
            remote: Some(at),
            imm: 0,
        }
    }

    fn data_request(&self, at: u64, chunk: u64, last: bool) -> WorkRequest<N> {
        let mut sgl = Vec::new();
        if chunk > 0 {
            // `N >= 1` was checked in `new`, and `chunk <= 2^31` fits u32.
            let _ = sgl.push(Sge {
                addr: self.local.addr.wrapping_add(at),
                length: chunk as u32,
                lkey: self.local.lkey,
            });
        }
        let (opcode, flags, imm) = if last {
            (WrOpcode::RdmaWriteWithImm, SendFlags::SIGNALED, self.imm)
        } else {
            (WrOpcode::RdmaWrite, SendFlags::empty(), 0)
        };
        WorkRequest {
            wr_id: self.wr_id,
            opcode,
            flags,
            payload: Payload::Gather(sgl),
            remote: Some(RemoteAddr {
                addr: self.remote.addr.wrapping_add(at),
                rkey: self.remote.rkey,
            }),
            imm,
        }
    }
}

impl<const N: usize> Iterator for SliceWrites<N> {
    type Item = WorkRequest<N>;

    fn next(&mut self) -> Option<WorkRequest<N>> {
        if let Some((h, at)) = self.header.take() {
            return Some(self.header_request(&h, at));
        }
        if self.done {
            return None;
        }
        let at = self.sent;
        let chunk = self.len.saturating_sub(at).min(self.max_write);
        self.sent = at.saturating_add(chunk);
        let last = self.sent >= self.len;
        self.done = last;
        Some(self.data_request(at, chunk, last))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let data = if self.done {
            0
        } else {
            let left = self.len.saturating_sub(self.sent);
            left.div_ceil(self.max_write).max(1)
        };
        let n = usize::try_from(data)
            .unwrap_or(usize::MAX)
            .saturating_add(usize::from(self.header.is_some()));
        (n, Some(n))
    }
}

impl<const N: usize> ExactSizeIterator for SliceWrites<N> {}
impl<const N: usize> FusedIterator for SliceWrites<N> {}

/// The credit return: `head` as an inline 8-byte RDMA WRITE WITH
/// IMMEDIATE (big-endian) into the sender's counter, the immediate the low
/// 32 bits of `head`, signaled. The immediate is what wakes the sender (a
/// receive completion, as for a slice's tail; the counter's 8 bytes stay
/// the authoritative value), and the completion is what lets the
/// receiver's send queue retire the request. The simulator and the verbs
/// backend post it as it is.
pub fn credit_write<const N: usize>(
    head: u64,
    counter: &RemoteCounter,
    wr_id: u64,
) -> Result<WorkRequest<N>, Error> {
    counter
        .addr
        .checked_add(CREDIT_LEN as u64)
        .ok_or(Error::Malformed)?;
    let mut wr = WorkRequest::inline_write(
        wr_id,
        &head.to_be_bytes(),
        RemoteAddr {
            addr: counter.addr,
            rkey: counter.rkey,
        },
    )?;
    wr.opcode = WrOpcode::RdmaWriteWithImm;
    // The low half: the sender widens it against the head it knew.
    wr.imm = head as u32;
    wr.flags |= SendFlags::SIGNALED;
    Ok(wr)
}

/// The `head` value in a credit counter's 8 bytes.
pub const fn decode_credit(word: [u8; CREDIT_LEN]) -> u64 {
    u64::from_be_bytes(word)
}

/// The 64-bit step whose low 32 bits are `low`, at or after `last`: the
/// receiver's new `tail` from an immediate (or a call header's step), given
/// the last tail it knew. Steps only move forward and never by 2^32 at
/// once, so this is exact; it saturates at `u64::MAX`.
pub const fn widen_step(low: u32, last: u64) -> u64 {
    let candidate = (last & !0xffff_ffff) | low as u64;
    if candidate >= last {
        candidate
    } else {
        candidate.saturating_add(1 << 32)
    }
}

/// The new `tail` a receive completion publishes: for a successful
/// `RECV_RDMA_WITH_IMM`, its immediate widened against `last_tail`.
pub fn tail_from_completion(c: &Completion, last_tail: u64) -> Option<u64> {
    match (c.is_ok(), c.opcode, c.imm) {
        (true, WcOpcode::RecvRdmaWithImm, Some(imm)) => Some(widen_step(imm, last_tail)),
        _ => None,
    }
}
