//! One collective call, as every rank makes it: the type every backend,
//! the simulator and the command take (NCCL's `(sendbuff, recvbuff,
//! count, datatype, op, root)` without the buffers), the [`Collective`]
//! it names and the sequence-numbered [`CallDesc`] the ranks compare. They
//! sit below the plan, so that the call header's byte format (`wire`)
//! depends on them and not on the schedule.

use crate::error::Error;
use crate::id::Rank;
use crate::plan::Plan;
use crate::reduce::{DataType, ReduceOp};

/// The collective operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Collective {
    /// Every rank ends with the reduction of all inputs.
    AllReduce,
    /// Rank `b` ends with block `b` of the reduction.
    ReduceScatter,
    /// Every rank ends with every rank's input, block by block.
    AllGather,
    /// Every rank ends with the root's input.
    Broadcast {
        /// The rank whose input is broadcast.
        root: Rank,
    },
    /// The root ends with the reduction of all inputs.
    Reduce {
        /// The rank that receives the result.
        root: Rank,
    },
}

impl Collective {
    /// The lower-case name nccl-tests uses (`allreduce`, …).
    pub const fn name(self) -> &'static str {
        match self {
            Collective::AllReduce => "allreduce",
            Collective::ReduceScatter => "reducescatter",
            Collective::AllGather => "allgather",
            Collective::Broadcast { .. } => "broadcast",
            Collective::Reduce { .. } => "reduce",
        }
    }

    /// The root, for the rooted collectives.
    pub const fn root(self) -> Option<Rank> {
        match self {
            Collective::Broadcast { root } | Collective::Reduce { root } => Some(root),
            _ => None,
        }
    }

    /// Whether the collective combines data with a [`ReduceOp`].
    pub const fn reduces(self) -> bool {
        matches!(
            self,
            Collective::AllReduce | Collective::ReduceScatter | Collective::Reduce { .. }
        )
    }

    /// A code for the wire: 0..=4 in declaration order.
    pub const fn code(self) -> u8 {
        match self {
            Collective::AllReduce => 0,
            Collective::ReduceScatter => 1,
            Collective::AllGather => 2,
            Collective::Broadcast { .. } => 3,
            Collective::Reduce { .. } => 4,
        }
    }

    /// The inverse of [`Collective::code`], with the root for rooted ones.
    pub const fn from_code(code: u8, root: Rank) -> Result<Collective, Error> {
        Ok(match code {
            0 => Collective::AllReduce,
            1 => Collective::ReduceScatter,
            2 => Collective::AllGather,
            3 => Collective::Broadcast { root },
            4 => Collective::Reduce { root },
            c => return Err(Error::UnknownCode(c)),
        })
    }

    /// nccl-tests' bus-bandwidth factor: `busbw = algbw · factor`.
    pub fn bus_factor(self, ranks: u32) -> f64 {
        let n = f64::from(ranks.max(1));
        match self {
            Collective::AllReduce => 2.0 * (n - 1.0) / n,
            Collective::ReduceScatter | Collective::AllGather => (n - 1.0) / n,
            Collective::Broadcast { .. } | Collective::Reduce { .. } => 1.0,
        }
    }
}

impl core::fmt::Display for Collective {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self.root() {
            Some(root) => write!(f, "{}(root {})", self.name(), root),
            None => f.write_str(self.name()),
        }
    }
}

/// How a collective's data travels between ranks (NCCL's `NCCL_ALGO`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Algorithm {
    /// Every channel a ring through all ranks: bandwidth-optimal, latency
    /// linear in the rank count.
    Ring,
    /// NCCL's double binary tree across nodes with a chain inside each
    /// node (AllReduce only): latency logarithmic in the node count.
    Tree,
}

impl Algorithm {
    /// Every algorithm, in code order.
    pub const ALL: [Algorithm; 2] = [Algorithm::Ring, Algorithm::Tree];

    /// NCCL's spelling (`Ring`, `Tree`).
    pub const fn name(self) -> &'static str {
        match self {
            Algorithm::Ring => "Ring",
            Algorithm::Tree => "Tree",
        }
    }

    /// A code for the wire: 0 ring, 1 tree.
    pub const fn code(self) -> u8 {
        match self {
            Algorithm::Ring => 0,
            Algorithm::Tree => 1,
        }
    }

    /// The inverse of [`Algorithm::code`].
    pub const fn from_code(code: u8) -> Result<Algorithm, Error> {
        match code {
            0 => Ok(Algorithm::Ring),
            1 => Ok(Algorithm::Tree),
            c => Err(Error::UnknownCode(c)),
        }
    }

    /// Parses a name, ignoring ASCII case (`ring`, `Tree`); `None` for
    /// anything else.
    pub fn parse(name: &str) -> Option<Algorithm> {
        Algorithm::ALL
            .into_iter()
            .find(|a| a.name().eq_ignore_ascii_case(name.trim()))
    }
}

impl core::fmt::Display for Algorithm {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
    }
}

/// How a connection's slots carry data and say it has arrived (NCCL's
/// `NCCL_PROTO`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Protocol {
    /// 8-byte lines of 4 bytes of data and a 4-byte flag: the receiver
    /// polls the flags, no separate tail; lowest latency, half the
    /// bandwidth.
    Ll,
    /// 128-byte lines of 120 bytes of data and an 8-byte flag.
    Ll128,
    /// Whole slices followed by a tail counter: full bandwidth.
    Simple,
}

impl Protocol {
    /// Every protocol, in code order.
    pub const ALL: [Protocol; 3] = [Protocol::Ll, Protocol::Ll128, Protocol::Simple];

    /// NCCL's spelling (`LL`, `LL128`, `Simple`).
    pub const fn name(self) -> &'static str {
        match self {
            Protocol::Ll => "LL",
            Protocol::Ll128 => "LL128",
            Protocol::Simple => "Simple",
        }
    }

    /// A code for the wire: 0 LL, 1 LL128, 2 Simple.
    pub const fn code(self) -> u8 {
        match self {
            Protocol::Ll => 0,
            Protocol::Ll128 => 1,
            Protocol::Simple => 2,
        }
    }

    /// The inverse of [`Protocol::code`].
    pub const fn from_code(code: u8) -> Result<Protocol, Error> {
        match code {
            0 => Ok(Protocol::Ll),
            1 => Ok(Protocol::Ll128),
            2 => Ok(Protocol::Simple),
            c => Err(Error::UnknownCode(c)),
        }
    }

    /// Parses a name, ignoring ASCII case (`ll`, `LL128`, `simple`);
    /// `None` for anything else.
    pub fn parse(name: &str) -> Option<Protocol> {
        Protocol::ALL
            .into_iter()
            .find(|p| p.name().eq_ignore_ascii_case(name.trim()))
    }
}

impl core::fmt::Display for Protocol {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
    }
}

/// Everything that must agree across ranks for one collective call: the
/// fingerprint that travels at the head of every connection's first message
/// and is compared by the receiver.
///
/// The operation of a collective that does not reduce (AllGather,
/// Broadcast) is normalized to `Sum`, since a different one is harmless.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct CallDesc {
    /// The communicator's call sequence number (0 for the first call).
    pub seq: u64,
    /// The collective and its root.
    pub collective: Collective,
    /// Element count, as passed by the user.
    pub count: u64,
    /// Element type.
    pub dtype: DataType,
    /// Reduction operation.
    pub op: ReduceOp,
}

impl CallDesc {
    /// Describes a call, normalizing what does not matter.
    pub const fn new(
        seq: u64,
        collective: Collective,
        count: u64,
        dtype: DataType,
        op: ReduceOp,
    ) -> CallDesc {
        let op = if collective.reduces() {
            op
        } else {
            ReduceOp::Sum
        };
        CallDesc {
            seq,
            collective,
            count,
            dtype,
            op,
        }
    }
}

impl core::fmt::Display for CallDesc {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "#{} {} count={} {}",
            self.seq, self.collective, self.count, self.dtype
        )?;
        if self.collective.reduces() {
            write!(f, " {}", self.op)?;
        }
        Ok(())
    }
}

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
    pub const fn broadcast(count: u64, dtype: DataType, root: Rank) -> Call {
        Call::new(Collective::Broadcast { root }, count, dtype, ReduceOp::Sum)
    }

    /// A Reduce to `root`.
    pub const fn reduce(count: u64, dtype: DataType, op: ReduceOp, root: Rank) -> Call {
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

    /// Where rank `rank`'s input and output start, in elements, in the one
    /// buffer of an in-place call, as NCCL defines it: the same place for
    /// AllReduce, Broadcast and Reduce; the output is block `rank` of the
    /// input for ReduceScatter; the input is block `rank` of the output
    /// for AllGather (saturating). The buffer holds
    /// `max(input, output)` elements of [`buffer_elems`](Call::buffer_elems).
    pub const fn in_place_offsets(&self, rank: u32) -> (u64, u64) {
        let block = self.count.saturating_mul(rank as u64);
        match self.collective {
            Collective::ReduceScatter => (0, block),
            Collective::AllGather => (block, 0),
            _ => (0, 0),
        }
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
        assert_eq!(rs.in_place_offsets(3), (0, 30));
        assert_eq!(ag.in_place_offsets(2), (20, 0));
        assert_eq!(r.in_place_offsets(3), (0, 0));
    }

    #[test]
    fn algorithm_and_protocol_names_and_codes_round_trip() {
        for a in Algorithm::ALL {
            assert_eq!(Algorithm::from_code(a.code()), Ok(a));
            assert_eq!(Algorithm::parse(&a.name().to_ascii_lowercase()), Some(a));
        }
        for p in Protocol::ALL {
            assert_eq!(Protocol::from_code(p.code()), Ok(p));
            assert_eq!(Protocol::parse(&p.name().to_ascii_uppercase()), Some(p));
        }
        assert_eq!(Algorithm::from_code(2), Err(Error::UnknownCode(2)));
        assert_eq!(Protocol::from_code(3), Err(Error::UnknownCode(3)));
        assert_eq!(Protocol::parse("LL12"), None);
        assert_eq!(Algorithm::parse(""), None);
    }
}
