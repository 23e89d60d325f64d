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
//! converts to and from the generic
//! [`WorkRequest`](crate::wire::WorkRequest).

use super::bytes;
use super::types::Qpn;
use super::verbs::{SendFlags, WrOpcode};
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

mod repr;
pub use repr::WqeRepr;
