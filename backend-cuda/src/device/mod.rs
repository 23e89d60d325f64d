//! The device operations the progress loop needs, behind one trait
//! ([`Device`]), so the same loop feeds a real GPU (`cuda`) and a host fake
//! ([`fake`]).
//!
//! Everything is enqueued on streams and ordered by events, the CUDA way:
//! a device call returns once the work is *enqueued*; it runs later, in
//! stream order, after the events it waits for.

pub mod fake;

pub(crate) mod cuda;

use ringcc_core::prim::SlotSpan;
use ringcc_core::SlotIndex;

use crate::error::Result;
use crate::kernel::KernelKey;
use crate::layout::{ConnId, EventId, MemRef, StreamId};

/// The FIFO slots an operation reads or writes (bookkeeping the fake
/// device checks; the GPU ignores it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotUse {
    /// The connection.
    pub conn: ConnId,
    /// The span of FIFO steps.
    pub span: SlotSpan,
}

impl SlotUse {
    /// The slots, in order.
    pub fn slots(&self) -> impl Iterator<Item = SlotIndex> {
        crate::layout::Layout::span_slots(self.span)
    }
}

/// One fused-kernel launch: one slice of one step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SliceOp {
    /// Which kernel.
    pub kernel: KernelKey,
    /// Elements (may be 0: nothing runs, but the op still orders).
    pub count: u64,
    /// Incoming slice (RECV).
    pub recv: Option<MemRef>,
    /// Local input (REDUCE, or no RECV).
    pub input: Option<MemRef>,
    /// Local output (COPY).
    pub output: Option<MemRef>,
    /// Outgoing slice (SEND): the successor's FIFO, or our staging copy.
    pub send: Option<MemRef>,
    /// Rank count, for `Avg`.
    pub nranks: u32,
    /// FIFO slots this kernel reads.
    pub reads: Option<SlotUse>,
    /// FIFO slots this kernel writes (`None` when it writes a staging copy:
    /// then the [`CopyOp`] writes them).
    pub writes: Option<SlotUse>,
}

/// A device-to-device copy (staging FIFO → receiver's FIFO).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CopyOp {
    /// Source.
    pub src: MemRef,
    /// Destination.
    pub dst: MemRef,
    /// Bytes.
    pub bytes: u64,
    /// FIFO slots the copy writes.
    pub writes: Option<SlotUse>,
}

/// A device (or a set of devices) the progress loop can drive: what it
/// launches, copies, records and waits for.
pub trait Device {
    /// Enqueues a fused kernel on `stream`.
    fn launch(&mut self, stream: StreamId, op: &SliceOp) -> Result<()>;
    /// Enqueues a copy on `stream`.
    fn copy(&mut self, stream: StreamId, op: &CopyOp) -> Result<()>;
    /// Records `event` on `stream` (replacing its previous record).
    fn record(&mut self, stream: StreamId, event: EventId) -> Result<()>;
    /// Makes `stream` wait for the latest record of `event` (no-op if it
    /// was never recorded). Later records do not affect this wait.
    fn wait(&mut self, stream: StreamId, event: EventId) -> Result<()>;
}
