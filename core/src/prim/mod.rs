//! The primitives a step is made of, and the state machines that walk a
//! plan: [`Machine`] on a ring, [`TreeMachine`] on a tree.

use bitflags::bitflags;

bitflags! {
    /// What one step does, as NCCL's primitive names spell it: `send` =
    /// SEND, `recvReduceSend` = RECV|REDUCE|SEND, `recvReduceCopySend` =
    /// RECV|REDUCE|COPY|SEND, `recvCopySend` = RECV|COPY|SEND, `recv` =
    /// RECV|COPY, `copySend` = COPY|SEND, `recvReduceCopy` =
    /// RECV|REDUCE|COPY, `copy` = COPY.
    ///
    /// - RECV: read the slice the predecessor put in our FIFO slot.
    /// - REDUCE: combine it with our input (incoming ⊕ local, in that order).
    ///   REDUCE together with COPY completes the reduction (for `Avg`, this
    ///   is where the division happens).
    /// - COPY: write the result to our output buffer.
    /// - SEND: write the result into the successor's FIFO slot.
    ///
    /// Without RECV, the data is this rank's own input.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub struct Primitive: u8 {
        /// Receive from the predecessor.
        const RECV = 1 << 0;
        /// Reduce with the local input.
        const REDUCE = 1 << 1;
        /// Copy to the local output.
        const COPY = 1 << 2;
        /// Send to the successor.
        const SEND = 1 << 3;
    }
}

#[cfg(feature = "defmt")]
impl defmt::Format for Primitive {
    fn format(&self, f: defmt::Formatter<'_>) {
        defmt::write!(f, "{=str}", self.name())
    }
}

impl Primitive {
    /// `send`
    pub const SEND_ONLY: Primitive = Primitive::SEND;
    /// `recvReduceSend`
    pub const RECV_REDUCE_SEND: Primitive = Primitive::RECV
        .union(Primitive::REDUCE)
        .union(Primitive::SEND);
    /// `recvReduceCopySend`
    pub const RECV_REDUCE_COPY_SEND: Primitive = Primitive::RECV_REDUCE_SEND.union(Primitive::COPY);
    /// `recvCopySend`
    pub const RECV_COPY_SEND: Primitive = Primitive::RECV
        .union(Primitive::COPY)
        .union(Primitive::SEND);
    /// `recv` (receive into the output: RECV|COPY)
    pub const RECV_ONLY: Primitive = Primitive::RECV.union(Primitive::COPY);
    /// `copySend`
    pub const COPY_SEND: Primitive = Primitive::COPY.union(Primitive::SEND);
    /// `recvReduceCopy`
    pub const RECV_REDUCE_COPY: Primitive = Primitive::RECV
        .union(Primitive::REDUCE)
        .union(Primitive::COPY);
    /// `copy` (a one-rank collective)
    pub const COPY_ONLY: Primitive = Primitive::COPY;

    /// NCCL's name for the primitive (`recvReduceCopySend`, …).
    pub fn name(self) -> &'static str {
        match self {
            p if p == Self::SEND_ONLY => "send",
            p if p == Self::RECV_REDUCE_SEND => "recvReduceSend",
            p if p == Self::RECV_REDUCE_COPY_SEND => "recvReduceCopySend",
            p if p == Self::RECV_COPY_SEND => "recvCopySend",
            p if p == Self::RECV_ONLY => "recv",
            p if p == Self::COPY_SEND => "copySend",
            p if p == Self::RECV_REDUCE_COPY => "recvReduceCopy",
            p if p == Self::COPY_ONLY => "copy",
            _ => "invalid",
        }
    }

    /// Whether this step reads the rank's own input buffer (it sends or
    /// reduces local data).
    #[inline]
    pub fn reads_input(self) -> bool {
        self.contains(Primitive::REDUCE) || !self.contains(Primitive::RECV)
    }

    /// Whether this step completes a reduction (REDUCE and COPY together):
    /// where `Avg` divides.
    #[inline]
    pub fn finalizes(self) -> bool {
        self.contains(Primitive::REDUCE | Primitive::COPY)
    }
}

impl core::fmt::Display for Primitive {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
    }
}

/// The number of FIFO slices a step of `count` elements is cut into, at
/// most `slice_elems` each: one for a step that fits (an empty step sends
/// one empty slice), else `⌈count / slice_elems⌉`. The core's [`Machine`]
/// cuts steps so, and so must every backend that needs a step's slices
/// without running a machine (a network proxy, a receive landing in
/// place).
#[inline(always)]
pub const fn slice_count(count: u64, slice_elems: u64) -> u64 {
    // Most steps fit in one slice: no division for them.
    if count <= slice_elems {
        1
    } else {
        crate::math::div_up(count, slice_elems)
    }
}

/// Elements `[lo, hi)` of slice `k` of a step of `count` elements cut as
/// [`slice_count`] cuts it (empty past the step's end).
#[inline(always)]
pub const fn slice_range(count: u64, slice_elems: u64, k: u64) -> (u64, u64) {
    let lo = k.saturating_mul(slice_elems);
    let lo = if lo < count { lo } else { count };
    let hi = lo.saturating_add(slice_elems);
    (lo, if hi < count { hi } else { count })
}

mod machine;
mod tree;

pub use machine::{check_start, Action, Blocked, Exec, LinkState, Machine, Next, SlotSpan};
pub use tree::{
    tree_slice_result, TreeAction, TreeBlocked, TreeConn, TreeExec, TreeLinks, TreeMachine,
    TREE_CONNS,
};

/// What a primitive produces for one slice, into `out`: `incoming ⊕ local`
/// when it reduces (then [`finalize`](crate::reduce::finalize)d where the
/// primitive completes the reduction: `Avg` divides by `nranks` there),
/// otherwise the incoming slice, otherwise the local input. Every backend
/// computes exactly this — on the host with these kernels, on a GPU with
/// kernels checked against them.
///
/// `incoming` must be given when the primitive receives, `local` when it
/// [reads its input](Primitive::reads_input); all slices have `out`'s
/// length.
pub fn slice_result(
    p: Primitive,
    dtype: crate::reduce::DataType,
    op: crate::reduce::ReduceOp,
    nranks: u32,
    incoming: Option<&[u8]>,
    local: Option<&[u8]>,
    out: &mut [u8],
) -> Result<(), crate::Error> {
    match (incoming, local) {
        (Some(inc), Some(loc)) if p.contains(Primitive::REDUCE) => {
            crate::reduce::reduce(dtype, op, out, inc, loc)?;
            if p.finalizes() {
                crate::reduce::finalize(dtype, op, out, nranks)?;
            }
            Ok(())
        }
        (Some(src), _) | (None, Some(src)) => {
            if src.len() != out.len() {
                return Err(crate::Error::BadLength {
                    dst: out.len(),
                    src: src.len(),
                });
            }
            out.copy_from_slice(src);
            Ok(())
        }
        (None, None) => Err(crate::Error::BadLength {
            dst: out.len(),
            src: 0,
        }),
    }
}

#[cfg(test)]
mod finalize_tests {
    use super::*;
    use crate::reduce::{DataType, ReduceOp};

    /// Only the step that completes a reduction (REDUCE with COPY)
    /// finalizes it: `Avg` divides there and nowhere else.
    #[test]
    fn only_the_completing_step_divides() {
        for p in [
            Primitive::SEND_ONLY,
            Primitive::RECV_REDUCE_SEND,
            Primitive::RECV_COPY_SEND,
            Primitive::RECV_ONLY,
            Primitive::COPY_ONLY,
        ] {
            assert!(!p.finalizes(), "{p}");
        }
        assert!(Primitive::RECV_REDUCE_COPY_SEND.finalizes());
        let (a, b) = (6i32.to_ne_bytes(), 2i32.to_ne_bytes());
        let mut out = [0u8; 4];
        let run = |p, out: &mut [u8; 4]| {
            slice_result(p, DataType::I32, ReduceOp::Avg, 4, Some(&a), Some(&b), out).unwrap();
            i32::from_ne_bytes(*out)
        };
        assert_eq!(run(Primitive::RECV_REDUCE_SEND, &mut out), 8);
        assert_eq!(run(Primitive::RECV_REDUCE_COPY_SEND, &mut out), 2);
    }

    /// A step that receives without reducing copies the incoming slice,
    /// whatever local slice it is also given: only REDUCE combines them.
    #[test]
    fn only_a_reducing_step_combines_incoming_and_local() {
        let (inc, loc) = (6i32.to_ne_bytes(), 2i32.to_ne_bytes());
        for (p, want) in [
            (Primitive::RECV_COPY_SEND, 6),
            (Primitive::RECV_ONLY, 6),
            (Primitive::RECV.union(Primitive::SEND), 6),
            (Primitive::RECV_REDUCE_SEND, 8),
        ] {
            let mut out = [0u8; 4];
            let (dt, op) = (DataType::I32, ReduceOp::Sum);
            slice_result(p, dt, op, 4, Some(&inc), Some(&loc), &mut out).unwrap();
            assert_eq!(i32::from_ne_bytes(out), want, "{p}");
        }
    }
}
