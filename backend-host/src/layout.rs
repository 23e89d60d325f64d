//! Where everything lives in a segment: the one place offsets are computed.
//!
//! ```text
//! 0     header      magic (stored last, release) · version · token hash ·
//!                   slot bytes · slots per slice · depth · total size ·
//!                   peer mapped (set by the opener, release)
//! 64    tail        StepCounter (sender → receiver)
//! 128   head        StepCounter (receiver → sender)
//! 192   mailbox     call-header sequence word (release) · CALL_HEADER_LEN bytes
//! 256   slots       STEPS slots, each `slot_stride` bytes (slot bytes rounded
//!                   up to 64): Simple's plain bytes
//! …     LL slots    STEPS slots of LL units (`ringcc_core::line::ll`), each
//!                   `ll_stride` bytes, for the LL call geometry's data
//! …     LL128 slots STEPS slots of LL128 lines (`ringcc_core::line::ll128`),
//!                   each `ll128_stride` bytes
//! ```
//!
//! The line regions start on 128-byte boundaries (an LL128 line never
//! straddles two cache lines). A step's slot is in one region only: the
//! one of the protocol its sender used (the receiver tells them apart by
//! the flags, see `shm.rs`).
//!
//! Every offset is a multiple of [`Layout::LINE`], so each counter has its
//! own cache line and every word is aligned (a mapping starts on a page).

use ringcc_core::fifo::{FifoGeometry, STEPS};
use ringcc_core::wire::call_header::CALL_HEADER_LEN;
use ringcc_core::Protocol;

use crate::error::{Error, Result};

/// Header fields: byte offsets inside the header line. Every field is a
/// native-endian `u64` (both ends run on the same host).
pub(crate) mod field {
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 8;
    pub const TOKEN_HASH: usize = 16;
    pub const SLOT_BYTES: usize = 24;
    pub const SLOTS_PER_SLICE: usize = 32;
    pub const DEPTH: usize = 40;
    pub const TOTAL: usize = 48;
    /// Set (release) by the peer once it has mapped and checked the
    /// segment: the owner may unlink the name.
    pub const PEER_MAPPED: usize = 56;
    pub const END: usize = 64;
}

/// "ringcc\x00\x01" as a little-endian word: never zero, so a segment the
/// owner has not published yet (all zero bytes) is told apart.
pub const MAGIC: u64 = u64::from_le_bytes(*b"ringcc\x00\x01");

/// Bumped whenever the layout changes; both ends must agree.
pub const LAYOUT_VERSION: u64 = 3;

/// The byte layout of one connection's segment for a FIFO geometry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    slot_bytes: u64,
    slot_stride: u64,
    /// Per line protocol (LL, LL128): where its slots start, their
    /// stride, and the data bytes each holds.
    lines: [LineRegion; 2],
    total: u64,
}

/// One line protocol's slots in a segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct LineRegion {
    start: u64,
    stride: u64,
    data: u64,
}

const _: () = assert!(field::END <= Layout::LINE);
const _: () = assert!(8 + CALL_HEADER_LEN <= Layout::LINE);
const _: () = assert!(Layout::MAILBOX == Layout::MAILBOX_SEQ + 8);
const _: () = assert!(Layout::MAILBOX + CALL_HEADER_LEN <= Layout::SLOTS);

impl Layout {
    /// The alignment of every region (a cache line).
    pub const LINE: usize = 64;
    /// The header.
    pub const HEADER: usize = 0;
    /// The `tail` counter.
    pub const TAIL: usize = 64;
    /// The `head` counter.
    pub const HEAD: usize = 128;
    /// The call-header mailbox's sequence word.
    pub const MAILBOX_SEQ: usize = 192;
    /// The call-header mailbox's bytes (`CALL_HEADER_LEN` of them).
    pub const MAILBOX: usize = 200;
    /// The first slot.
    pub const SLOTS: usize = 256;
    /// The alignment of the line regions and their slots.
    pub const LINES_ALIGN: u64 = 128;

    /// The layout for `geometry`; [`Error::BadConfig`] when its size does
    /// not fit in this address space.
    pub fn new(geometry: FifoGeometry) -> Result<Layout> {
        let line = Self::LINE as u64;
        let too_big = || {
            Error::BadConfig(format!(
                "a FIFO of {STEPS} slots of {} bytes does not fit in memory",
                geometry.slot_bytes()
            ))
        };
        let slot_bytes = geometry.slot_bytes();
        let slot_stride = slot_bytes
            .checked_next_multiple_of(line)
            .ok_or_else(too_big)?;
        let mut end = slot_stride
            .checked_mul(STEPS)
            .and_then(|s| s.checked_add(Self::SLOTS as u64))
            .ok_or_else(too_big)?;
        let mut lines = [LineRegion {
            start: 0,
            stride: 0,
            data: 0,
        }; 2];
        for (region, p) in lines.iter_mut().zip([Protocol::Ll, Protocol::Ll128]) {
            let data = p
                .fifo_geometry(geometry)
                .map_err(|e| Error::BadConfig(format!("{p} geometry: {e}")))?
                .slot_bytes();
            let stride = p
                .slot_line_bytes(data)
                .checked_next_multiple_of(Self::LINES_ALIGN)
                .ok_or_else(too_big)?;
            let start = end
                .checked_next_multiple_of(Self::LINES_ALIGN)
                .ok_or_else(too_big)?;
            end = stride
                .checked_mul(STEPS)
                .and_then(|s| s.checked_add(start))
                .ok_or_else(too_big)?;
            *region = LineRegion {
                start,
                stride,
                data,
            };
        }
        let total = Some(end)
            .filter(|&t| usize::try_from(t).is_ok() && isize::try_from(t).is_ok())
            .ok_or_else(too_big)?;
        Ok(Layout {
            slot_bytes,
            slot_stride,
            lines,
            total,
        })
    }

    /// Bytes a slot holds.
    pub const fn slot_bytes(&self) -> u64 {
        self.slot_bytes
    }

    /// Distance between two slots (slot bytes rounded up to a line).
    pub const fn slot_stride(&self) -> u64 {
        self.slot_stride
    }

    /// Bytes of the whole segment.
    pub const fn total(&self) -> u64 {
        self.total
    }

    /// Offset of slot `index` (`0..STEPS`), `None` beyond.
    pub fn slot_offset(&self, index: u64) -> Option<u64> {
        if index >= STEPS {
            return None;
        }
        index
            .checked_mul(self.slot_stride)
            .and_then(|o| o.checked_add(Self::SLOTS as u64))
    }
}

impl Layout {
    /// The line slot `index` (`0..STEPS`) of `protocol` (LL or LL128):
    /// its offset, its bytes (a multiple of 8) and the data bytes it
    /// carries; `None` beyond `STEPS` or for Simple.
    pub fn line_slot(&self, protocol: Protocol, index: u64) -> Option<(u64, u64, u64)> {
        let r = match protocol {
            Protocol::Ll => self.lines.first()?,
            Protocol::Ll128 => self.lines.get(1)?,
            Protocol::Simple => return None,
        };
        if index >= STEPS {
            return None;
        }
        let off = index.checked_mul(r.stride)?.checked_add(r.start)?;
        Some((off, protocol.slot_line_bytes(r.data), r.data))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_are_line_aligned_and_slots_fit() {
        for bytes in [16, 48, 64, 4096, 512 * 1024] {
            let g = FifoGeometry::new(bytes, 2).unwrap();
            let l = Layout::new(g).unwrap();
            for i in 0..STEPS {
                let o = l.slot_offset(i).unwrap();
                assert_eq!(o % Layout::LINE as u64, 0);
                assert!(o + l.slot_bytes() <= l.total());
            }
            assert_eq!(l.slot_offset(STEPS), None);
            let simple_end = l.slot_offset(STEPS - 1).unwrap() + l.slot_stride();
            let mut prev_end = simple_end;
            for p in [Protocol::Ll, Protocol::Ll128] {
                for i in 0..STEPS {
                    let (o, b, d) = l.line_slot(p, i).unwrap();
                    assert_eq!(o % Layout::LINES_ALIGN, 0);
                    assert!(o >= prev_end && o + b <= l.total());
                    assert_eq!(b, p.slot_line_bytes(d));
                    assert!(d <= bytes);
                    prev_end = o + b;
                }
                assert_eq!(l.line_slot(p, STEPS), None);
            }
            assert_eq!(l.line_slot(Protocol::Simple, 0), None);
        }
        for o in [
            Layout::TAIL,
            Layout::HEAD,
            Layout::MAILBOX_SEQ,
            Layout::SLOTS,
        ] {
            assert_eq!(o % Layout::LINE, 0);
        }
    }

    #[test]
    fn oversized_geometry_is_bad_config() {
        let g = FifoGeometry::new(u64::MAX - 15, 2).unwrap();
        assert!(matches!(Layout::new(g), Err(Error::BadConfig(_))));
    }
}
