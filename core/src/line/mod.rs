//! The protocols' slot formats and FIFO geometries: how a slot carries
//! its data and, for the low-latency protocols, its own arrival.
//!
//! NCCL has three protocols ([`Protocol`]); they differ in how the
//! receiver learns that a slot's data is there:
//!
//! | protocol | unit in the slot | data per unit | arrival | data per slot (NCCL) |
//! |---|---|---|---|---|
//! | [`Simple`](Protocol::Simple) | the whole slot | all of it | a separate `tail` counter, posted after the data | 512 KiB |
//! | [`Ll`](Protocol::Ll) | 8 B: 4 B data + 4 B flag ([`ll`]) | 4 B | every unit's flag | 32 KiB |
//! | [`Ll128`](Protocol::Ll128) | 128 B line: 120 B data + 8 B flag ([`ll128`]) | 120 B | every line's flag | 576,000 B |
//!
//! Where the numbers come from (NCCL 2.x, `src/include/device.h` and
//! `src/init.cc`): `NCCL_STEPS = 8` slots per connection;
//! `DEFAULT_BUFFSIZE = 4 MiB` for Simple (8 × 512 KiB);
//! `DEFAULT_LL_BUFFSIZE = NCCL_LL_LINES_PER_THREAD (8) ×
//! NCCL_LL_MAX_NTHREADS (512) × NCCL_STEPS × sizeof(ncclLLFifoLine) (16)`
//! = 512 KiB of lines, 64 KiB of lines per slot, half of it data (32 KiB);
//! `DEFAULT_LL128_BUFFSIZE = NCCL_LL128_ELEMS_PER_THREAD (120) ×
//! NCCL_LL128_MAX_NTHREADS (640) × NCCL_STEPS × 8` = 4,915,200 B,
//! 614,400 B of lines per slot, 15/16 of it data (576,000 B), with
//! `NCCL_LL128_LINESIZE = 128` and `NCCL_LL128_DATAELEMS = 15` words.
//! NCCL's `ncclLLFifoLine` packs two of this module's 8-byte LL units into
//! 16 bytes (`data1, flag1, data2, flag2`); a CPU stores each unit with one
//! 8-byte atomic store, which is single-copy atomic, so a reader never
//! sees half of one.
//!
//! **Flags.** The flag of the slot of FIFO step `s` is [`flag_of`]`(s) =
//! s + 1` (NCCL's `step + 1`): never 0, so a zeroed slot has not
//! arrived, and different for every use of the same slot, so a slot is
//! reused without clearing and a unit left from an earlier use is never
//! taken for new data. LL's flag is the low 32 bits: a unit written
//! exactly a multiple of 2³² steps earlier into the same slot (2²⁹ uses of
//! it with nothing else between) would alias — NCCL has the same bound
//! (`NCCL_LL_FLAG`). LL128's flag is all 64 bits.
//!
//! **The slot's length.** A receiver here does not know the plan, so the
//! first unit (LL) or line (LL128) of every slot carries the byte count of
//! the data that follows, under the same flag; the data units follow it.
//! That unit or line is extra to NCCL's geometry:
//! [`Protocol::slot_line_bytes`] counts it.
//!
//! A slice of a low-latency protocol is one slot and a chunk one slice
//! (NCCL: `chunkSteps = sliceSteps = 1` for LL and LL128):
//! [`Protocol::fifo_geometry`].

pub mod ll;
pub mod ll128;

use crate::call::Protocol;
use crate::error::Error;
use crate::fifo::FifoGeometry;
use crate::math::div_up;

/// The flag that marks the data of FIFO step `step` (`step + 1`, wrapping:
/// never 0 but for the step `u64::MAX`, which no connection reaches).
#[inline]
pub const fn flag_of(step: u64) -> u64 {
    step.wrapping_add(1)
}

impl Protocol {
    /// Data bytes per FIFO slot in NCCL's default buffers: LL 32 KiB,
    /// LL128 576,000 B, Simple 512 KiB (see the [module](self)).
    pub const fn slot_data_bytes(self) -> u64 {
        match self {
            Protocol::Ll => 32 << 10,
            Protocol::Ll128 => 576_000,
            Protocol::Simple => 512 << 10,
        }
    }

    /// Bytes of one unit of the slot format: LL 8 (4 B data, 4 B flag),
    /// LL128 128 (a line: 120 B data, 8 B flag), Simple the whole slot
    /// ([`slot_data_bytes`](Self::slot_data_bytes)).
    pub const fn line_bytes(self) -> u64 {
        match self {
            Protocol::Ll => ll::UNIT_BYTES as u64,
            Protocol::Ll128 => ll128::LINE_BYTES as u64,
            Protocol::Simple => self.slot_data_bytes(),
        }
    }

    /// Data bytes of one unit: LL 4, LL128 120, Simple the whole slot.
    pub const fn line_data_bytes(self) -> u64 {
        match self {
            Protocol::Ll => ll::UNIT_DATA as u64,
            Protocol::Ll128 => ll128::LINE_DATA as u64,
            Protocol::Simple => self.slot_data_bytes(),
        }
    }

    /// The share of the bytes moved that is data: LL 0.5, LL128 0.9375
    /// (120/128), Simple 1.0 — what a link's bandwidth is multiplied by
    /// (NCCL's tuning model uses these ratios for LL and LL128 too, on
    /// top of per-protocol caps).
    pub fn efficiency(self) -> f64 {
        match self {
            Protocol::Simple => 1.0,
            p => p.line_data_bytes() as f64 / p.line_bytes() as f64,
        }
    }

    /// Whether the receiver learns of data from flags inside the slot
    /// (LL, LL128) rather than from a separate `tail` counter (Simple).
    pub const fn flags_in_slot(self) -> bool {
        !matches!(self, Protocol::Simple)
    }

    /// The FIFO geometry of a call under this protocol on a connection
    /// whose slots hold `slot_cap` bytes: Simple keeps the connection's
    /// own `geometry`; LL and LL128 use one slot per slice and their
    /// [`slot_data_bytes`](Self::slot_data_bytes), capped at `slot_cap`
    /// rounded down to 16 (a hop that cannot carry lines carries the call
    /// the Simple way, in its `slot_cap`-byte slots).
    pub const fn fifo_geometry(self, geometry: FifoGeometry) -> Result<FifoGeometry, Error> {
        match self {
            Protocol::Simple => Ok(geometry),
            p => {
                let cap = geometry.slot_bytes() & !15;
                let data = p.slot_data_bytes();
                FifoGeometry::new(if data < cap { data } else { cap }, 1)
            }
        }
    }

    /// The chunk (bytes per rank and step of the plan) a call under this
    /// protocol uses with its [`fifo_geometry`](Self::fifo_geometry) `g`:
    /// Simple the connection's `chunk_bytes`, LL and LL128 one slice (as
    /// NCCL).
    pub const fn chunk_bytes(self, g: FifoGeometry, chunk_bytes: u64) -> u64 {
        match self {
            Protocol::Simple => chunk_bytes,
            _ => g.slice_bytes(),
        }
    }

    /// Bytes of the line storage a slot holding up to `data_bytes` of data
    /// needs under this protocol, the length unit (LL) or line (LL128)
    /// included; Simple: `data_bytes`. Saturating.
    pub const fn slot_line_bytes(self, data_bytes: u64) -> u64 {
        match self {
            Protocol::Ll => ll::units_for(data_bytes).saturating_mul(ll::UNIT_BYTES as u64),
            Protocol::Ll128 => {
                ll128::lines_for(data_bytes).saturating_mul(ll128::LINE_BYTES as u64)
            }
            Protocol::Simple => data_bytes,
        }
    }
}

/// `div_up` for the formats' unit counts (1 + the data units).
const fn units(data_bytes: u64, per_unit: u64) -> u64 {
    div_up(data_bytes, per_unit).saturating_add(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nccl_geometries() {
        // 8 lines x 512 threads x 16 B per slot, half data.
        assert_eq!(Protocol::Ll.slot_data_bytes(), 8 * 512 * 16 / 2);
        // 120 x 640 x 8 B per slot, 15/16 data.
        assert_eq!(Protocol::Ll128.slot_data_bytes(), 120 * 640 * 8 / 16 * 15);
        assert_eq!(Protocol::Simple.slot_data_bytes() * 8, 4 << 20);
        assert_eq!(Protocol::Ll.efficiency(), 0.5);
        assert_eq!(Protocol::Ll128.efficiency(), 0.9375);
        assert_eq!(Protocol::Simple.efficiency(), 1.0);
        assert_eq!(Protocol::Ll.slot_line_bytes(32 << 10), (8192 + 1) * 8);
        assert_eq!(Protocol::Ll128.slot_line_bytes(576_000), (4800 + 1) * 128);
        assert!(Protocol::Ll.flags_in_slot() && !Protocol::Simple.flags_in_slot());
    }

    #[test]
    fn call_geometry_is_capped_by_the_connection() {
        let big = FifoGeometry::NCCL;
        let ll = Protocol::Ll.fifo_geometry(big).unwrap();
        assert_eq!((ll.slot_bytes(), ll.slots_per_slice()), (32 << 10, 1));
        assert_eq!(Protocol::Ll.chunk_bytes(ll, 1 << 20), 32 << 10);
        let small = FifoGeometry::new(16 << 10, 2).unwrap();
        let ll128 = Protocol::Ll128.fifo_geometry(small).unwrap();
        assert_eq!(ll128.slot_bytes(), 16 << 10);
        assert_eq!(Protocol::Simple.fifo_geometry(small), Ok(small));
        assert_eq!(Protocol::Simple.chunk_bytes(small, 4096), 4096);
        assert_eq!(flag_of(0), 1);
    }
}
