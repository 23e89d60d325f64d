//! The call header: the 32-byte fingerprint of a collective call that a
//! sender writes into its successor's header mailbox ahead of the
//! collective's first slice, so that ranks called inconsistently fail with
//! `MismatchedCall` instead of exchanging garbage.
//!
//! ```text
//! bytes 0..4    magic "RCCH"
//! byte  4       version (1)
//! byte  5       collective  (Collective::code)
//! byte  6       data type   (DataType::code)
//! byte  7       reduce op   (ReduceOp::code)
//! bytes 8..16   call sequence number
//! bytes 16..24  element count
//! bytes 24..28  root rank (0 for collectives without a root)
//! bytes 28..32  low 32 bits of the FIFO step the header precedes
//! ```
//!
//! All integers are big-endian.

use crate::call::{CallDesc, Collective};
use crate::id::Rank;
use crate::reduce::{DataType, ReduceOp};

use super::bytes;
use super::Error;

mod field {
    use core::ops::Range;

    pub const MAGIC: Range<usize> = 0..4;
    pub const VERSION: usize = 4;
    pub const COLLECTIVE: usize = 5;
    pub const DTYPE: usize = 6;
    pub const OP: usize = 7;
    pub const SEQ: Range<usize> = 8..16;
    pub const COUNT: Range<usize> = 16..24;
    pub const ROOT: Range<usize> = 24..28;
    pub const STEP: Range<usize> = 28..32;
}

/// Bytes of a call header.
pub const CALL_HEADER_LEN: usize = 32;
/// The magic number, `"RCCH"`.
pub const MAGIC: [u8; 4] = *b"RCCH";
/// The format version this crate writes and reads.
pub const VERSION: u8 = 1;

/// A read/write view of a call header.
#[derive(Debug, Clone)]
pub struct CallHeader<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> CallHeader<T> {
    /// A view without checks; accessors read zeros beyond the buffer.
    pub const fn new_unchecked(buffer: T) -> Self {
        CallHeader { buffer }
    }

    /// A view, checked to hold 32 bytes.
    pub fn new_checked(buffer: T) -> Result<Self, Error> {
        let h = Self::new_unchecked(buffer);
        h.check_len()?;
        Ok(h)
    }

    /// See [`CallHeader::new_checked`].
    pub fn check_len(&self) -> Result<(), Error> {
        if self.buffer.as_ref().len() < CALL_HEADER_LEN {
            Err(Error::Truncated)
        } else {
            Ok(())
        }
    }

    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn d(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// Magic number.
    pub fn magic(&self) -> [u8; 4] {
        bytes::array(self.d(), field::MAGIC)
    }

    /// Format version.
    pub fn version(&self) -> u8 {
        bytes::u8_at(self.d(), field::VERSION)
    }

    /// Collective code.
    pub fn collective_code(&self) -> u8 {
        bytes::u8_at(self.d(), field::COLLECTIVE)
    }

    /// Data type code.
    pub fn dtype_code(&self) -> u8 {
        bytes::u8_at(self.d(), field::DTYPE)
    }

    /// Reduce operation code.
    pub fn op_code(&self) -> u8 {
        bytes::u8_at(self.d(), field::OP)
    }

    /// Call sequence number.
    pub fn seq(&self) -> u64 {
        bytes::be_u64(self.d(), field::SEQ)
    }

    /// Element count.
    pub fn count(&self) -> u64 {
        bytes::be_u64(self.d(), field::COUNT)
    }

    /// Root rank.
    pub fn root(&self) -> u32 {
        bytes::be_u32(self.d(), field::ROOT)
    }

    /// Low 32 bits of the FIFO step.
    pub fn step(&self) -> u32 {
        bytes::be_u32(self.d(), field::STEP)
    }
}

/// A parsed call header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct CallHeaderRepr {
    /// The call.
    pub desc: CallDesc,
    /// Low 32 bits of the FIFO step whose data the header precedes (widen
    /// it with [`widen_step`](crate::protocol::post::widen_step)).
    pub step: u32,
}

impl CallHeaderRepr {
    /// Parses a call header: `Malformed` for a wrong magic number, an
    /// unknown code or a root on a collective without one; `Unsupported`
    /// for another version.
    pub fn parse<T: AsRef<[u8]>>(h: &CallHeader<T>) -> Result<Self, Error> {
        h.check_len()?;
        if h.magic() != MAGIC {
            return Err(Error::Malformed);
        }
        if h.version() != VERSION {
            return Err(Error::Unsupported);
        }
        let collective = Collective::from_code(h.collective_code(), Rank(h.root()))
            .map_err(|_| Error::Malformed)?;
        if collective.root().is_none() && h.root() != 0 {
            return Err(Error::Malformed);
        }
        let dtype = DataType::from_code(h.dtype_code()).map_err(|_| Error::Malformed)?;
        let op = ReduceOp::from_code(h.op_code()).map_err(|_| Error::Malformed)?;
        Ok(CallHeaderRepr {
            desc: CallDesc {
                seq: h.seq(),
                collective,
                count: h.count(),
                dtype,
                op,
            },
            step: h.step(),
        })
    }

    /// Bytes of the header (32).
    pub const fn buffer_len(&self) -> usize {
        CALL_HEADER_LEN
    }

    /// Writes the header into the first 32 bytes of `buffer`.
    pub fn emit(&self, buffer: &mut [u8]) -> Result<(), Error> {
        let out = buffer.get_mut(..CALL_HEADER_LEN).ok_or(Error::Exhausted)?;
        let d = &self.desc;
        bytes::put(out, field::MAGIC, &MAGIC);
        bytes::put_u8(out, field::VERSION, VERSION);
        bytes::put_u8(out, field::COLLECTIVE, d.collective.code());
        bytes::put_u8(out, field::DTYPE, d.dtype.code());
        bytes::put_u8(out, field::OP, d.op.code());
        bytes::put_be_u64(out, field::SEQ, d.seq);
        bytes::put_be_u64(out, field::COUNT, d.count);
        let root = d.collective.root().map_or(0, Rank::get);
        bytes::put_be_u32(out, field::ROOT, root);
        bytes::put_be_u32(out, field::STEP, self.step);
        Ok(())
    }

    /// The header as bytes.
    pub fn to_bytes(&self) -> [u8; CALL_HEADER_LEN] {
        let mut b = [0u8; CALL_HEADER_LEN];
        // 32 bytes always hold the header.
        let _ = self.emit(&mut b);
        b
    }
}
