//! The mlx5 send-queue entry (WQE), as rdma-core's
//! `providers/mlx5/mlx5dv.h` defines it.
//!
//! A WQE is a run of 16-byte segments (`MLX5_SEND_WQE_DS`) that occupies
//! whole 64-byte basic blocks (`MLX5_SEND_WQE_BB`), all fields big-endian:
//!
//! ```text
//! control   (struct mlx5_wqe_ctrl_seg)   opmod | wqe_index | opcode, qpn | ds,
//!                                         signature, fm_ce_se, imm
//! raddr     (struct mlx5_wqe_raddr_seg)  remote address, rkey        RDMA only
//! data × n  (struct mlx5_wqe_data_seg)   byte_count, lkey, address
//!   or inline (struct mlx5_wqe_inl_data_seg) byte_count | 0x8000_0000, bytes…
//! ```
//!
//! `ds` counts the 16-byte segments, the control segment included. The
//! layout of a WQE depends on its opcode; [`WqeRepr`] handles RDMA WRITE,
//! WRITE_WITH_IMM, READ, SEND and SEND_WITH_IMM on an RC queue pair, and
//! converts to and from the generic [`WorkRequest`].

use core::ops::Range;

use super::bytes::{self, align_up};
use super::types::{Lkey, Qpn, RemoteAddr, Rkey, Sge};
use super::verbs::{InlineData, Payload, SendFlags, WorkRequest, WrOpcode, MAX_INLINE};
use super::Error;

mod field {
    use core::ops::Range;

    // struct mlx5_wqe_ctrl_seg
    pub const OPMOD_IDX_OPCODE: Range<usize> = 0..4;
    pub const QPN_DS: Range<usize> = 4..8;
    pub const SIGNATURE: usize = 8;
    #[allow(dead_code)] // reserved, zero
    pub const CTRL_RSVD: Range<usize> = 9..11;
    pub const FM_CE_SE: usize = 11;
    pub const IMM: Range<usize> = 12..16;

    // struct mlx5_wqe_raddr_seg, relative to the segment
    pub const RADDR: Range<usize> = 0..8;
    pub const RKEY: Range<usize> = 8..12;

    // struct mlx5_wqe_data_seg, relative to the segment
    pub const BYTE_COUNT: Range<usize> = 0..4;
    pub const LKEY: Range<usize> = 4..8;
    pub const ADDR: Range<usize> = 8..16;
}

/// Bytes per segment: `MLX5_SEND_WQE_DS` (16).
pub const SEG_BYTES: usize = 16;
/// Bytes per basic block: `MLX5_SEND_WQE_BB` (64, `mlx5dv.h`).
pub const BASIC_BLOCK: usize = 64;
/// The inline flag in an inline segment's byte count: `MLX5_INLINE_SEG`
/// (`0x80000000`, `mlx5dv.h`).
pub const INLINE_SEG: u32 = 0x8000_0000;
/// Largest `ds`: `MLX5_WQE_CTRL_DS_MASK` (`0x3f`, Linux
/// `include/linux/mlx5/qp.h`).
pub const MAX_DS: u8 = 0x3f;

code_enum! {
    /// `MLX5_OPCODE_*` (rdma-core `mlx5dv.h`).
    pub enum Opcode: u8 {
        /// `MLX5_OPCODE_NOP`
        Nop = 0x00,
        /// `MLX5_OPCODE_SEND_INVAL`
        SendInval = 0x01,
        /// `MLX5_OPCODE_RDMA_WRITE`
        RdmaWrite = 0x08,
        /// `MLX5_OPCODE_RDMA_WRITE_IMM`
        RdmaWriteImm = 0x09,
        /// `MLX5_OPCODE_SEND`
        Send = 0x0a,
        /// `MLX5_OPCODE_SEND_IMM`
        SendImm = 0x0b,
        /// `MLX5_OPCODE_TSO`
        Tso = 0x0e,
        /// `MLX5_OPCODE_RDMA_READ`
        RdmaRead = 0x10,
        /// `MLX5_OPCODE_ATOMIC_CS`
        AtomicCs = 0x11,
        /// `MLX5_OPCODE_ATOMIC_FA`
        AtomicFa = 0x12,
        /// `MLX5_OPCODE_ATOMIC_MASKED_CS`
        AtomicMaskedCs = 0x14,
        /// `MLX5_OPCODE_ATOMIC_MASKED_FA`
        AtomicMaskedFa = 0x15,
        /// `MLX5_OPCODE_LOCAL_INVAL`
        LocalInval = 0x1b,
        /// `MLX5_OPCODE_UMR`
        Umr = 0x25,
    }
}

impl Opcode {
    /// The mlx5 opcode of a verbs opcode (rdma-core's `mlx5_ib_opcode[]`
    /// table in `providers/mlx5/qp.c`), for the opcodes [`WqeRepr`] lays
    /// out.
    pub const fn of_request(op: WrOpcode) -> Option<Opcode> {
        Some(match op {
            WrOpcode::RdmaWrite => Opcode::RdmaWrite,
            WrOpcode::RdmaWriteWithImm => Opcode::RdmaWriteImm,
            WrOpcode::Send => Opcode::Send,
            WrOpcode::SendWithImm => Opcode::SendImm,
            WrOpcode::RdmaRead => Opcode::RdmaRead,
            _ => return None,
        })
    }

    /// The inverse of [`Opcode::of_request`].
    pub const fn request(self) -> Option<WrOpcode> {
        Some(match self {
            Opcode::RdmaWrite => WrOpcode::RdmaWrite,
            Opcode::RdmaWriteImm => WrOpcode::RdmaWriteWithImm,
            Opcode::Send => WrOpcode::Send,
            Opcode::SendImm => WrOpcode::SendWithImm,
            Opcode::RdmaRead => WrOpcode::RdmaRead,
            _ => return None,
        })
    }
}

bitflags::bitflags! {
    /// The control segment's `fm_ce_se` byte (`MLX5_WQE_CTRL_*`,
    /// `mlx5dv.h`): fence mode in bits 7..5, completion mode in bits 3..2,
    /// solicited event in bit 1. Unnamed bits are kept.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
    pub struct CtrlFlags: u8 {
        /// `MLX5_WQE_CTRL_SOLICITED = 1 << 1`
        const SOLICITED = 1 << 1;
        /// `MLX5_WQE_CTRL_CQ_UPDATE = 2 << 2`: always generate a CQE.
        const CQ_UPDATE = 2 << 2;
        /// `MLX5_WQE_CTRL_INITIATOR_SMALL_FENCE = 1 << 5`
        const INITIATOR_SMALL_FENCE = 1 << 5;
        /// `MLX5_WQE_CTRL_FENCE = 4 << 5`
        const FENCE = 4 << 5;
        const _ = !0;
    }
}

#[cfg(feature = "defmt")]
impl defmt::Format for CtrlFlags {
    fn format(&self, f: defmt::Formatter) {
        defmt::write!(f, "CtrlFlags({=u8:#x})", self.bits())
    }
}

impl CtrlFlags {
    /// What rdma-core's `mlx5_post_send` puts in `fm_ce_se` for `flags`.
    pub const fn of_send_flags(flags: SendFlags) -> CtrlFlags {
        let mut bits = 0;
        if flags.contains(SendFlags::SIGNALED) {
            bits |= CtrlFlags::CQ_UPDATE.bits();
        }
        if flags.contains(SendFlags::SOLICITED) {
            bits |= CtrlFlags::SOLICITED.bits();
        }
        if flags.contains(SendFlags::FENCE) {
            bits |= CtrlFlags::FENCE.bits();
        }
        CtrlFlags::from_bits_retain(bits)
    }

    /// The verbs flags these control bits express (not `INLINE`, which the
    /// payload tells).
    pub const fn send_flags(self) -> SendFlags {
        let mut f = 0;
        if self.contains(CtrlFlags::CQ_UPDATE) {
            f |= SendFlags::SIGNALED.bits();
        }
        if self.contains(CtrlFlags::SOLICITED) {
            f |= SendFlags::SOLICITED.bits();
        }
        if self.contains(CtrlFlags::FENCE) {
            f |= SendFlags::FENCE.bits();
        }
        SendFlags::from_bits_retain(f)
    }
}

/// A read/write view of a WQE.
#[derive(Debug, Clone)]
pub struct Wqe<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Wqe<T> {
    /// A view without checks; accessors read zeros beyond the buffer.
    pub const fn new_unchecked(buffer: T) -> Wqe<T> {
        Wqe { buffer }
    }

    /// A view, checked to hold its control segment and the `ds` segments
    /// it announces (`ds` ≥ 1).
    pub fn new_checked(buffer: T) -> Result<Wqe<T>, Error> {
        let w = Wqe::new_unchecked(buffer);
        w.check_len()?;
        Ok(w)
    }

    /// See [`Wqe::new_checked`].
    pub fn check_len(&self) -> Result<(), Error> {
        let len = self.buffer.as_ref().len();
        if len < SEG_BYTES {
            return Err(Error::Truncated);
        }
        if self.ds() == 0 {
            return Err(Error::Malformed);
        }
        if len < self.byte_len() {
            return Err(Error::Truncated);
        }
        Ok(())
    }

    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn data(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// Opcode modifier (bits 31..24 of `opmod_idx_opcode`).
    pub fn opmod(&self) -> u8 {
        bytes::u8_at(self.data(), field::OPMOD_IDX_OPCODE.start)
    }

    /// WQE index, the producer counter modulo 2^16 (bits 23..8).
    pub fn wqe_index(&self) -> u16 {
        (bytes::be_u32(self.data(), field::OPMOD_IDX_OPCODE) >> 8) as u16
    }

    /// Opcode (bits 7..0).
    pub fn opcode(&self) -> Opcode {
        Opcode::from_code(bytes::u8_at(self.data(), field::OPMOD_IDX_OPCODE.end - 1))
    }

    /// Queue pair number (bits 31..8 of `qpn_ds`).
    pub fn qpn(&self) -> Qpn {
        Qpn::new(bytes::be_u32(self.data(), field::QPN_DS) >> 8)
    }

    /// Size in 16-byte segments (bits 5..0 of `qpn_ds`).
    pub fn ds(&self) -> u8 {
        bytes::u8_at(self.data(), field::QPN_DS.end - 1) & MAX_DS
    }

    /// Bits 7..6 of `qpn_ds` (reserved, zero).
    fn ds_reserved(&self) -> u8 {
        bytes::u8_at(self.data(), field::QPN_DS.end - 1) & !MAX_DS
    }

    /// Bytes the segments cover (`ds × 16`).
    pub fn byte_len(&self) -> usize {
        usize::from(self.ds()).saturating_mul(SEG_BYTES)
    }

    /// WQE signature byte.
    pub fn signature(&self) -> u8 {
        bytes::u8_at(self.data(), field::SIGNATURE)
    }

    /// Fence / completion / solicited bits.
    pub fn flags(&self) -> CtrlFlags {
        CtrlFlags::from_bits_retain(bytes::u8_at(self.data(), field::FM_CE_SE))
    }

    /// Immediate (host order; big-endian in the segment).
    pub fn imm(&self) -> u32 {
        bytes::be_u32(self.data(), field::IMM)
    }

    /// Segment `i` (0 is the control segment), if inside the WQE and the
    /// buffer.
    pub fn segment(&self, i: usize) -> Option<&[u8]> {
        if i >= usize::from(self.ds()) {
            return None;
        }
        let start = i.checked_mul(SEG_BYTES)?;
        self.data().get(start..start.checked_add(SEG_BYTES)?)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Wqe<T> {
    fn data_mut(&mut self) -> &mut [u8] {
        self.buffer.as_mut()
    }

    /// Sets opcode modifier, WQE index and opcode.
    pub fn set_opmod_idx_opcode(&mut self, opmod: u8, wqe_index: u16, opcode: Opcode) {
        let v = (u32::from(opmod) << 24) | (u32::from(wqe_index) << 8) | u32::from(opcode.code());
        bytes::put_be_u32(self.data_mut(), field::OPMOD_IDX_OPCODE, v);
    }

    /// Sets QPN and `ds` (`ds` is cut to 6 bits).
    pub fn set_qpn_ds(&mut self, qpn: Qpn, ds: u8) {
        let v = (qpn.get() << 8) | u32::from(ds & MAX_DS);
        bytes::put_be_u32(self.data_mut(), field::QPN_DS, v);
    }

    /// Sets the signature byte.
    pub fn set_signature(&mut self, v: u8) {
        bytes::put_u8(self.data_mut(), field::SIGNATURE, v);
    }

    /// Sets the fence / completion / solicited bits.
    pub fn set_flags(&mut self, v: CtrlFlags) {
        bytes::put_u8(self.data_mut(), field::FM_CE_SE, v.bits());
    }

    /// Sets the immediate.
    pub fn set_imm(&mut self, v: u32) {
        bytes::put_be_u32(self.data_mut(), field::IMM, v);
    }
}

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
