//! [`WqeRepr`]: a parsed WQE, and its conversion to and from the generic
//! work request.

use core::ops::Range;

use super::{field, CtrlFlags, Opcode, Wqe, BASIC_BLOCK, INLINE_SEG, MAX_DS, SEG_BYTES};
use crate::wire::bytes::{self, align_up};
use crate::wire::types::{Lkey, Qpn, RemoteAddr, Rkey, Sge};
use crate::wire::verbs::{InlineData, Payload, SendFlags, WorkRequest, MAX_INLINE};
use crate::wire::Error;

fn seg_range(i: usize) -> Option<Range<usize>> {
    let start = i.checked_mul(SEG_BYTES)?;
    Some(start..start.checked_add(SEG_BYTES)?)
}

fn sub(r: &Range<usize>, f: Range<usize>) -> Range<usize> {
    r.start.saturating_add(f.start)..r.start.saturating_add(f.end)
}

/// A parsed mlx5 WQE of an RC queue pair.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct WqeRepr<const N: usize> {
    /// Producer index modulo 2^16.
    pub wqe_index: u16,
    /// Opcode modifier (0 for these opcodes).
    pub opmod: u8,
    /// Opcode: RDMA WRITE (±IMM), READ or SEND (±IMM).
    pub opcode: Opcode,
    /// The send queue's QP number.
    pub qpn: Qpn,
    /// Signature byte (0 unless WQE signatures are on).
    pub signature: u8,
    /// Fence, completion and solicited bits.
    pub flags: CtrlFlags,
    /// The immediate (host order).
    pub imm: u32,
    /// Remote-address segment, exactly for RDMA opcodes.
    pub remote: Option<RemoteAddr>,
    /// Data segments or inline data.
    pub payload: Payload<N>,
}

impl<const N: usize> WqeRepr<N> {
    /// The WQE rdma-core's mlx5 provider formats for `wr` on queue pair
    /// `qpn` at producer index `wqe_index`.
    pub fn from_request(wr: &WorkRequest<N>, qpn: Qpn, wqe_index: u16) -> Result<Self, Error> {
        wr.validate()?;
        let opcode = Opcode::of_request(wr.opcode).ok_or(Error::Unsupported)?;
        let repr = WqeRepr {
            wqe_index,
            opmod: 0,
            opcode,
            qpn,
            signature: 0,
            flags: CtrlFlags::of_send_flags(wr.flags),
            imm: wr.imm,
            remote: wr.remote,
            payload: wr.payload.clone(),
        };
        repr.ds()?;
        Ok(repr)
    }

    /// The work request this WQE carries, tagged `wr_id` (a WQE has no
    /// `wr_id`: drivers keep it per WQE index).
    pub fn to_request(&self, wr_id: u64) -> Result<WorkRequest<N>, Error> {
        let opcode = self.opcode.request().ok_or(Error::Unsupported)?;
        let mut flags = self.flags.send_flags();
        if matches!(self.payload, Payload::Inline(_)) {
            flags |= SendFlags::INLINE;
        }
        let wr = WorkRequest {
            wr_id,
            opcode,
            flags,
            payload: self.payload.clone(),
            remote: self.remote,
            imm: if opcode.has_imm() { self.imm } else { 0 },
        };
        wr.validate()?;
        Ok(wr)
    }

    fn has_raddr(opcode: Opcode) -> Result<bool, Error> {
        match opcode {
            Opcode::RdmaWrite | Opcode::RdmaWriteImm | Opcode::RdmaRead => Ok(true),
            Opcode::Send | Opcode::SendImm => Ok(false),
            _ => Err(Error::Unsupported),
        }
    }

    /// The WQE's size in 16-byte segments, checked against
    /// [`MAX_DS`] and the segment rules.
    pub fn ds(&self) -> Result<u8, Error> {
        let raddr = Self::has_raddr(self.opcode)?;
        if raddr != self.remote.is_some() {
            return Err(Error::Malformed);
        }
        let payload_segs = match &self.payload {
            Payload::Gather(sgl) => {
                if sgl
                    .iter()
                    .any(|s| s.length == 0 || s.length & INLINE_SEG != 0)
                {
                    return Err(Error::Malformed);
                }
                sgl.len()
            }
            Payload::Inline(data) => {
                if self.opcode == Opcode::RdmaRead {
                    return Err(Error::Malformed);
                }
                align_up(data.len().saturating_add(4), SEG_BYTES).unwrap_or(usize::MAX) / SEG_BYTES
            }
        };
        let ds = payload_segs
            .saturating_add(1)
            .saturating_add(usize::from(raddr));
        match u8::try_from(ds) {
            Ok(ds) if ds <= MAX_DS => Ok(ds),
            _ => Err(Error::Exhausted),
        }
    }

    /// Bytes the WQE occupies: `ds × 16` rounded up to whole 64-byte basic
    /// blocks.
    pub fn buffer_len(&self) -> Result<usize, Error> {
        let bytes = usize::from(self.ds()?).saturating_mul(SEG_BYTES);
        align_up(bytes, BASIC_BLOCK).ok_or(Error::Exhausted)
    }

    /// Parses the WQE at the start of `buffer`.
    pub fn parse<T: AsRef<[u8]>>(wqe: &Wqe<T>) -> Result<Self, Error> {
        wqe.check_len()?;
        if wqe.ds_reserved() != 0 {
            return Err(Error::Malformed);
        }
        let opcode = wqe.opcode();
        let raddr = Self::has_raddr(opcode)?;
        let data = wqe.data();
        let mut next = 1usize;
        let remote = if raddr {
            let seg = wqe.segment(next).ok_or(Error::Malformed)?;
            next = next.saturating_add(1);
            Some(RemoteAddr {
                addr: bytes::be_u64(seg, field::RADDR),
                rkey: Rkey(bytes::be_u32(seg, field::RKEY)),
            })
        } else {
            None
        };
        let start = next.saturating_mul(SEG_BYTES);
        let rest = data.get(start..wqe.byte_len()).unwrap_or(&[]);
        let first = bytes::be_u32(rest, field::BYTE_COUNT);
        let payload = if !rest.is_empty() && first & INLINE_SEG != 0 {
            let len = (first & !INLINE_SEG) as usize;
            if align_up(len.saturating_add(4), SEG_BYTES) != Some(rest.len()) {
                return Err(Error::Malformed);
            }
            if len > MAX_INLINE {
                return Err(Error::Exhausted);
            }
            let bytes = rest.get(4..len.saturating_add(4)).ok_or(Error::Truncated)?;
            Payload::Inline(InlineData::from_slice(bytes).map_err(|_| Error::Exhausted)?)
        } else {
            let mut sgl = heapless::Vec::new();
            for seg in rest.chunks(SEG_BYTES) {
                let length = bytes::be_u32(seg, field::BYTE_COUNT);
                if length == 0 || length & INLINE_SEG != 0 || seg.len() != SEG_BYTES {
                    return Err(Error::Malformed);
                }
                let sge = Sge {
                    addr: bytes::be_u64(seg, field::ADDR),
                    length,
                    lkey: Lkey(bytes::be_u32(seg, field::LKEY)),
                };
                sgl.push(sge).map_err(|_| Error::Exhausted)?;
            }
            Payload::Gather(sgl)
        };
        let repr = WqeRepr {
            wqe_index: wqe.wqe_index(),
            opmod: wqe.opmod(),
            opcode,
            qpn: wqe.qpn(),
            signature: wqe.signature(),
            flags: wqe.flags(),
            imm: wqe.imm(),
            remote,
            payload,
        };
        repr.ds()?;
        Ok(repr)
    }

    /// Writes the WQE into `buffer` (which must hold
    /// [`buffer_len`](Self::buffer_len) bytes; the padding up to the basic
    /// block is zeroed). Returns the bytes written.
    pub fn emit(&self, buffer: &mut [u8]) -> Result<usize, Error> {
        let ds = self.ds()?;
        let total = self.buffer_len()?;
        let out = buffer.get_mut(..total).ok_or(Error::Exhausted)?;
        out.fill(0);
        let mut wqe = Wqe::new_unchecked(&mut *out);
        wqe.set_opmod_idx_opcode(self.opmod, self.wqe_index, self.opcode);
        wqe.set_qpn_ds(self.qpn, ds);
        wqe.set_signature(self.signature);
        wqe.set_flags(self.flags);
        wqe.set_imm(self.imm);
        let mut next = 1usize;
        if let Some(r) = self.remote {
            let seg = seg_range(next).ok_or(Error::Exhausted)?;
            bytes::put_be_u64(out, sub(&seg, field::RADDR), r.addr);
            bytes::put_be_u32(out, sub(&seg, field::RKEY), r.rkey.get());
            next = next.saturating_add(1);
        }
        match &self.payload {
            Payload::Gather(sgl) => {
                for s in sgl {
                    let seg = seg_range(next).ok_or(Error::Exhausted)?;
                    bytes::put_be_u32(out, sub(&seg, field::BYTE_COUNT), s.length);
                    bytes::put_be_u32(out, sub(&seg, field::LKEY), s.lkey.get());
                    bytes::put_be_u64(out, sub(&seg, field::ADDR), s.addr);
                    next = next.saturating_add(1);
                }
            }
            Payload::Inline(data) => {
                let start = next.saturating_mul(SEG_BYTES);
                let count = (data.len() as u32) | INLINE_SEG;
                bytes::put_be_u32(out, start..start.saturating_add(4), count);
                let body = start.saturating_add(4);
                bytes::put(out, body..body.saturating_add(data.len()), data);
            }
        }
        Ok(total)
    }
}
