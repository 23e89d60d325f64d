//! The structures the host shares with the device loop, `#[repr(C)]`
//! mirrors of the generated C++ (`rc_plan`, `rc_step`, `rc_exec`,
//! `rc_chan`, `rc_status`, `rc_loop_args`), and the codes it writes. The
//! host-C++ tests compare every size and offset with the compiler's
//! (`rc_test_abi`), so a field added on one side only fails a test.
//!
//! Every field is a `u64`, a `u32` or a pointer (8 bytes on every target
//! CUDA supports), in an order that leaves no padding.

use ringcc_core::{CallDesc, Collective, DataType, Rank, ReduceOp};

/// A block has not run yet on this channel.
pub const STATUS_IDLE: u64 = 0;
/// The block's last call finished.
pub const STATUS_DONE: u64 = 1;
/// A wait saw nothing for the call's timeout.
pub const STATUS_TIMEOUT: u64 = 2;
/// The host raised the abort word.
pub const STATUS_ABORTED: u64 = 3;
/// Another block failed and raised the abort word.
pub const STATUS_PEER_FAILED: u64 = 4;
/// The predecessor's call words differ from this rank's call.
pub const STATUS_MISMATCH: u64 = 5;
/// A counter moved past what the protocol allows.
pub const STATUS_PROTOCOL: u64 = 6;

/// A failed wait waited for data (the predecessor's `tail`).
pub const WAIT_DATA: u64 = 1;
/// … for credit (the successor's `head`) before a send.
pub const WAIT_CREDIT: u64 = 2;
/// … for the successor to consume everything sent (the call's end).
pub const WAIT_FINISH: u64 = 3;

/// The abort word's value when the host stops the loops.
pub const ABORT_HOST: u64 = 1;
/// The abort word's value when a block failed.
pub const ABORT_PEER: u64 = 2;

/// `rc_plan`: one (call, channel, rank), what the step formula needs.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RcPlan {
    /// The user's element count.
    pub count: u64,
    /// Chunk size in elements.
    pub chunk_elems: u64,
    /// The chunk alignment in elements.
    pub align_elems: u64,
    /// A FIFO slice in elements.
    pub slice_elems: u64,
    /// Rank at each ring index (`nranks` entries), or null: in rank order.
    pub ring: *const u32,
    /// [`Collective::code`].
    pub collective: u32,
    /// Ranks.
    pub nranks: u32,
    /// Channels.
    pub channels: u32,
    /// This channel.
    pub channel: u32,
    /// This rank's ring index.
    pub ring_index: u32,
    /// The root's ring index (rooted collectives).
    pub root_index: u32,
    /// Bytes per element.
    pub elem_bytes: u32,
    /// FIFO slots per slice.
    pub slots_per_slice: u32,
}

/// `rc_step`: one step, as `ringcc_core::plan::Step`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RcStep {
    /// Loop iteration.
    pub loop_index: u64,
    /// Offset into the input (elements).
    pub input_offset: u64,
    /// Offset into the output (elements).
    pub output_offset: u64,
    /// Elements.
    pub count: u64,
    /// Step within the loop.
    pub index: u32,
    /// The chunk.
    pub chunk: u32,
    /// The primitive's bits.
    pub primitive: u32,
    /// Unused.
    pub pad: u32,
}

/// `rc_exec`: one slice, as `ringcc_core::prim::Exec`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RcExec {
    /// Loop iteration.
    pub loop_index: u64,
    /// Slice within the step.
    pub slice: u64,
    /// Offset into the input (elements).
    pub input_offset: u64,
    /// Offset into the output (elements).
    pub output_offset: u64,
    /// Elements.
    pub count: u64,
    /// The FIFO step the slice is received at (RECV).
    pub recv_step: u64,
    /// The FIFO step the slice is sent at (SEND).
    pub send_step: u64,
    /// Step within the loop.
    pub step_index: u32,
    /// The primitive's bits.
    pub primitive: u32,
}

/// `rc_chan`: where one rank's channel finds its counters, call words,
/// FIFOs and state (device addresses; host addresses in the emulation).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RcChan {
    /// Ours: the predecessor's `tail`.
    pub recv_tail: u64,
    /// The predecessor's: our `head`.
    pub recv_head: u64,
    /// Ours: the successor's `head`.
    pub send_head: u64,
    /// The successor's: our `tail`.
    pub send_tail: u64,
    /// Ours: the predecessor's call words (3 × u64).
    pub recv_call: u64,
    /// The successor's: our call words.
    pub send_call: u64,
    /// Ours: `recv_next`, `send_next` from call to call (2 × u64).
    pub state: u64,
    /// Ours: the FIFO (`STEPS` slots).
    pub recv_fifo: u64,
    /// The successor's FIFO.
    pub send_fifo: u64,
    /// Bytes per slot.
    pub slot_bytes: u64,
}

/// `rc_status`: what a block says when it ends.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RcStatus {
    /// `STATUS_*`.
    pub code: u64,
    /// The call it ran.
    pub seq: u64,
    /// `WAIT_*`, for a failed wait.
    pub waiting: u64,
    /// The counter's value last seen.
    pub seen: u64,
    /// The value needed.
    pub need: u64,
    /// Loop of the slice it failed at.
    pub loop_index: u64,
    /// Step of the slice it failed at.
    pub step_index: u64,
    /// The slice it failed at.
    pub slice: u64,
    /// The predecessor's call words (mismatch).
    pub got_seq: u64,
    /// … its count.
    pub got_count: u64,
    /// … its packed descriptor ([`pack_desc`]).
    pub got_desc: u64,
    /// `recv_next` at the end.
    pub recv_next: u64,
    /// `send_next` at the end.
    pub send_next: u64,
    /// This rank's count (mismatch).
    pub own_count: u64,
    /// This rank's packed descriptor (mismatch).
    pub own_desc: u64,
    /// Unused (the record is 128 bytes).
    pub spare: u64,
}

impl RcStatus {
    /// The record from its 16 words in order, `w(i)` being word `i` (as
    /// the device writes them: the fields' order above).
    pub fn from_words(w: impl Fn(usize) -> u64) -> RcStatus {
        RcStatus {
            code: w(0),
            seq: w(1),
            waiting: w(2),
            seen: w(3),
            need: w(4),
            loop_index: w(5),
            step_index: w(6),
            slice: w(7),
            got_seq: w(8),
            got_count: w(9),
            got_desc: w(10),
            recv_next: w(11),
            send_next: w(12),
            own_count: w(13),
            own_desc: w(14),
            spare: w(15),
        }
    }
}

/// `rc_loop_args`: one rank's launch.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RcLoopArgs {
    /// The rank's input.
    pub input: u64,
    /// The rank's output.
    pub output: u64,
    /// `channels` [`RcChan`]s.
    pub chans: u64,
    /// `channels` [`RcStatus`]es.
    pub status: u64,
    /// The abort word.
    pub abort_flag: u64,
    /// Rank at each ring index, or 0: in rank order.
    pub ring: u64,
    /// The call's sequence number.
    pub seq: u64,
    /// The call's count.
    pub count: u64,
    /// Chunk size in elements.
    pub chunk_elems: u64,
    /// A FIFO slice in elements.
    pub slice_elems: u64,
    /// The longest a wait may see nothing, in nanoseconds.
    pub timeout_ns: u64,
    /// [`pack_desc`] of the call.
    pub desc: u64,
    /// [`Collective::code`].
    pub collective: u32,
    /// Ranks.
    pub nranks: u32,
    /// Channels (the grid).
    pub channels: u32,
    /// This rank's ring index.
    pub ring_index: u32,
    /// The root's ring index.
    pub root_index: u32,
    /// FIFO slots per slice.
    pub slots_per_slice: u32,
}

/// The call words' descriptor: collective, type, op and root in one word
/// (the count and the sequence number travel in their own words).
pub fn pack_desc(d: &CallDesc) -> u64 {
    let root = d.collective.root().map_or(0, |r| u64::from(r.0));
    u64::from(d.collective.code())
        | u64::from(d.dtype.code()) << 8
        | u64::from(d.op.code()) << 16
        | root << 32
}

/// The call words back as a descriptor; `None` when they cannot be one.
pub fn unpack_desc(seq: u64, count: u64, desc: u64) -> Option<CallDesc> {
    let collective = Collective::from_code(desc as u8, Rank((desc >> 32) as u32)).ok()?;
    let dtype = DataType::from_code((desc >> 8) as u8).ok()?;
    let op = ReduceOp::from_code((desc >> 16) as u8).ok()?;
    Some(CallDesc::new(seq, collective, count, dtype, op))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringcc_core::Call;

    #[test]
    fn descriptors_round_trip() {
        for c in [
            Call::all_reduce(7, DataType::Bf16, ReduceOp::Avg),
            Call::broadcast(1 << 40, DataType::I8, Rank(4095)),
            Call::reduce(0, DataType::F64, ReduceOp::Min, Rank(3)),
            Call::all_gather(9, DataType::U64),
        ] {
            let d = c.desc(12);
            assert_eq!(unpack_desc(12, d.count, pack_desc(&d)), Some(d));
        }
        assert_eq!(unpack_desc(0, 0, 0xff), None);
        assert_eq!(unpack_desc(0, 0, 0xff << 8), None);
    }

    #[test]
    fn no_padding() {
        assert_eq!(std::mem::size_of::<RcPlan>(), 5 * 8 + 8 * 4);
        assert_eq!(std::mem::size_of::<RcStep>(), 48);
        assert_eq!(std::mem::size_of::<RcExec>(), 64);
        assert_eq!(std::mem::size_of::<RcChan>(), 80);
        assert_eq!(std::mem::size_of::<RcStatus>(), 128);
        assert_eq!(std::mem::size_of::<RcLoopArgs>(), 12 * 8 + 6 * 4);
    }
}
