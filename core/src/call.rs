//! One collective call, as every rank makes it: the type every backend,
//! the simulator and the command take (NCCL's `(sendbuff, recvbuff,
//! count, datatype, op, root)` without the buffers).

use crate::error::Error;
use crate::plan::{CallDesc, Collective, Plan};
use crate::reduce::{DataType, ReduceOp};

/// One rank's collective call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Call {
    /// The collective (and its root).
    pub collective: Collective,
    /// Element count (per block for ReduceScatter and AllGather, as NCCL).
    pub count: u64,
    /// Element type.
    pub dtype: DataType,
    /// Reduction (ignored by AllGather and Broadcast).
    pub op: ReduceOp,
}

impl Call {
    /// A call.
    pub const fn new(collective: Collective, count: u64, dtype: DataType, op: ReduceOp) -> Call {
        Call {
            collective,
            count,
            dtype,
            op,
        }
    }

    /// An AllReduce.
    pub const fn all_reduce(count: u64, dtype: DataType, op: ReduceOp) -> Call {
        Call::new(Collective::AllReduce, count, dtype, op)
    }

    /// A ReduceScatter of `count` elements per rank.
    pub const fn reduce_scatter(count: u64, dtype: DataType, op: ReduceOp) -> Call {
        Call::new(Collective::ReduceScatter, count, dtype, op)
    }

    /// An AllGather of `count` elements per rank.
    pub const fn all_gather(count: u64, dtype: DataType) -> Call {
        Call::new(Collective::AllGather, count, dtype, ReduceOp::Sum)
    }

    /// A Broadcast from `root`.
    pub const fn broadcast(count: u64, dtype: DataType, root: crate::Rank) -> Call {
        Call::new(Collective::Broadcast { root }, count, dtype, ReduceOp::Sum)
    }

    /// A Reduce to `root`.
    pub const fn reduce(count: u64, dtype: DataType, op: ReduceOp, root: crate::Rank) -> Call {
        Call::new(Collective::Reduce { root }, count, dtype, op)
    }

    /// Bytes of one element.
    pub const fn elem(&self) -> usize {
        self.dtype.size() as usize
    }

    /// Elements of the input and the output buffers (out of place),
    /// NCCL's layout: ReduceScatter's input and AllGather's output hold
    /// `ranks` blocks of `count` elements (saturating).
    pub const fn buffer_elems(&self, ranks: u32) -> (u64, u64) {
        let all = self.count.saturating_mul(ranks as u64);
        match self.collective {
            Collective::ReduceScatter => (all, self.count),
            Collective::AllGather => (self.count, all),
            _ => (self.count, self.count),
        }
    }

    /// Bytes of the input and the output buffers (out of place),
    /// saturating at `usize::MAX`.
    pub fn buffer_bytes(&self, ranks: u32) -> (usize, usize) {
        let (i, o) = self.buffer_elems(ranks);
        let bytes = |e: u64| {
            usize::try_from(e)
                .unwrap_or(usize::MAX)
                .saturating_mul(self.elem())
        };
        (bytes(i), bytes(o))
    }

    /// The descriptor of this call as the communicator's call `seq`: what
    /// the call header carries and the ranks compare.
    pub const fn desc(&self, seq: u64) -> CallDesc {
        CallDesc::new(seq, self.collective, self.count, self.dtype, self.op)
    }

    /// This call's plan on `ranks` ranks and `channels` channels.
    pub fn plan(&self, ranks: u32, channels: u32, chunk_bytes: u64) -> Result<Plan, Error> {
        Plan::new(
            self.collective,
            self.count,
            self.dtype,
            ranks,
            channels,
            chunk_bytes,
        )
    }
}

impl From<CallDesc> for Call {
    fn from(d: CallDesc) -> Call {
        Call::new(d.collective, d.count, d.dtype, d.op)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Rank;

    #[test]
    fn buffers_follow_nccl_layouts_and_saturate() {
        let rs = Call::reduce_scatter(10, DataType::F32, ReduceOp::Sum);
        assert_eq!(rs.buffer_elems(4), (40, 10));
        assert_eq!(rs.buffer_bytes(4), (160, 40));
        let ag = Call::all_gather(10, DataType::F64);
        assert_eq!(ag.buffer_bytes(3), (80, 240));
        let b = Call::broadcast(u64::MAX, DataType::I8, Rank(1));
        assert_eq!(b.buffer_elems(8), (u64::MAX, u64::MAX));
        let huge = Call::reduce_scatter(u64::MAX, DataType::U64, ReduceOp::Max);
        assert_eq!(huge.buffer_bytes(2).0, usize::MAX);
        let r = Call::reduce(7, DataType::I32, ReduceOp::Min, Rank(2));
        assert_eq!(Call::from(r.desc(5)), r);
        assert_eq!(r.desc(5).seq, 5);
        assert!(r.plan(4, 1, 4096).is_ok());
        assert!(r.plan(0, 1, 4096).is_err());
    }
}
