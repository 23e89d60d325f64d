//! The core's error type.

use crate::plan::CallDesc;

/// Everything that can go wrong in the core. Small and `Copy`, so it can be
/// returned from firmware interrupt handlers and stored in state machines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum Error {
    /// A topology or plan with zero ranks.
    NoRanks,
    /// More ranks than the const-generic capacity `capacity` allows.
    TooManyRanks {
        /// Ranks asked for.
        ranks: u64,
        /// The type's capacity.
        capacity: u64,
    },
    /// A rank number outside `0..ranks`.
    RankOutOfRange {
        /// The offending rank.
        rank: u32,
        /// Number of ranks.
        ranks: u32,
    },
    /// A node with no GPU, or a topology description that is inconsistent.
    BadTopology,
    /// More than one node but no NIC to cross between nodes.
    NoNic,
    /// Channel count outside `1..=64`, or a channel id out of range.
    BadChannel {
        /// The channel count or id given.
        channel: u32,
    },
    /// The chunk size is zero or not a multiple of the element size.
    BadChunk {
        /// Chunk size in bytes.
        chunk_bytes: u64,
        /// Element size in bytes.
        elem_size: u8,
    },
    /// FIFO geometry that cannot work: zero-sized slots, slot size not a
    /// multiple of 16 bytes, or slices of a slot count that does not divide
    /// the FIFO depth or leaves room for fewer than two slices.
    BadFifoGeometry,
    /// A chunk takes as many slices as the FIFO holds (or more): the ring
    /// would deadlock. Chunks must leave one slice free.
    ChunkTooLargeForFifo {
        /// Chunk size in bytes.
        chunk_bytes: u64,
        /// Bytes of one connection's FIFO.
        fifo_bytes: u64,
    },
    /// The buffer's size in bytes does not fit in a `u64`.
    CountOverflow,
    /// Two byte slices given to a reduction kernel differ in length, or a
    /// length is not a multiple of the element size.
    BadLength {
        /// Length of the destination (bytes).
        dst: usize,
        /// Length of the source (bytes).
        src: usize,
    },
    /// An unknown data type or reduction operation code.
    UnknownCode(u8),
    /// An `RINGCC_ALGO` / `RINGCC_PROTO` list (NCCL_ALGO / NCCL_PROTO
    /// syntax) names something that is not an algorithm or protocol, or
    /// is empty.
    BadTuningList,
    /// No algorithm x protocol is left to run a call: the overrides and
    /// what the backend can run exclude every candidate.
    NoTuningCandidate,
    /// The predecessor's first message of the collective describes a
    /// different call than ours (different sequence number, collective,
    /// count, data type, op or root): the ranks were called inconsistently.
    MismatchedCall {
        /// The call this rank made.
        expected: CallDesc,
        /// The call its predecessor made.
        got: CallDesc,
    },
    /// The flow-control counters or the call header arrived in an order no
    /// correct peer produces (see [`ProtocolViolation`]).
    Protocol(ProtocolViolation),
    /// A state machine was given a call that does not match its plan
    /// (collective, count or data type).
    PlanMismatch,
    /// `handle_exec_done` without an outstanding `Exec`.
    NoExecPending,
    /// `handle_exec_done` on a tree machine with both streams' execs
    /// outstanding: the completion must say which (its direction).
    AmbiguousExecDone,
    /// The state machine already failed or finished; it accepts nothing.
    Finished,
    /// A capacity (const generic or caller storage) is exhausted.
    Capacity,
    /// A wire format could not be parsed or emitted.
    Wire(crate::wire::Error),
}

/// How a peer broke the slot protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum ProtocolViolation {
    /// A `tail` lower than one seen before.
    TailBackwards,
    /// A `tail` beyond the slots this receiver has freed (the sender wrote
    /// into slots that were still in use).
    Overrun,
    /// A `head` lower than one seen before.
    HeadBackwards,
    /// A `head` beyond the steps this sender has posted.
    HeadAhead,
    /// Data of the collective's first message arrived without the call
    /// header.
    MissingHeader,
    /// A call header arrived when none was expected.
    UnexpectedHeader,
}

impl core::fmt::Display for Error {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match *self {
            Error::NoRanks => f.write_str("a communicator needs at least one rank"),
            Error::TooManyRanks { ranks, capacity } => {
                write!(f, "{ranks} ranks exceed this build's capacity of {capacity}")
            }
            Error::RankOutOfRange { rank, ranks } => {
                write!(f, "rank {rank} is out of range for {ranks} ranks")
            }
            Error::BadTopology => f.write_str("inconsistent topology description"),
            Error::NoNic => f.write_str("more than one node but no NIC per node"),
            Error::BadChannel { channel } => {
                write!(f, "channel {channel} is out of range (1..=64 channels)")
            }
            Error::BadChunk { chunk_bytes, elem_size } => write!(
                f,
                "chunk size {chunk_bytes} B is zero or not a multiple of the element size {elem_size} B"
            ),
            Error::BadFifoGeometry => f.write_str(
                "bad FIFO geometry (slot size must be a non-zero multiple of 16 B, slots per slice 1, 2 or 4)",
            ),
            Error::ChunkTooLargeForFifo { chunk_bytes, fifo_bytes } => write!(
                f,
                "chunk of {chunk_bytes} B does not leave one slice free in a {fifo_bytes} B FIFO (the ring would deadlock)"
            ),
            Error::CountOverflow => f.write_str("buffer size in bytes overflows u64"),
            Error::BadLength { dst, src } => write!(
                f,
                "reduction buffers differ in length or are not whole elements ({dst} B vs {src} B)"
            ),
            Error::UnknownCode(c) => write!(f, "unknown data type or operation code {c}"),
            Error::BadTuningList => f.write_str(
                "bad algorithm/protocol list: expected names like `Ring,Tree` or `^LL` (NCCL_ALGO / NCCL_PROTO syntax)",
            ),
            Error::NoTuningCandidate => f.write_str(
                "no algorithm x protocol left: the overrides exclude everything this backend can run",
            ),
            Error::MismatchedCall { expected, got } => write!(
                f,
                "mismatched call across ranks: this rank called {expected}, its predecessor called {got}"
            ),
            Error::Protocol(p) => write!(f, "slot protocol violation: {p}"),
            Error::PlanMismatch => f.write_str("the call does not match the plan"),
            Error::NoExecPending => f.write_str("exec completion reported with no exec outstanding"),
            Error::AmbiguousExecDone => f.write_str(
                "exec completion without its direction while both tree streams have an exec outstanding",
            ),
            Error::Finished => f.write_str("the state machine has already finished or failed"),
            Error::Capacity => f.write_str("capacity exhausted"),
            Error::Wire(e) => write!(f, "wire format: {e}"),
        }
    }
}

impl core::fmt::Display for ProtocolViolation {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            ProtocolViolation::TailBackwards => "tail counter went backwards",
            ProtocolViolation::Overrun => "sender overran the slots the receiver freed",
            ProtocolViolation::HeadBackwards => "head counter went backwards",
            ProtocolViolation::HeadAhead => "head counter ahead of the steps posted",
            ProtocolViolation::MissingHeader => {
                "first message of the collective had no call header"
            }
            ProtocolViolation::UnexpectedHeader => "call header where none was expected",
        })
    }
}

impl core::error::Error for Error {}

impl From<crate::wire::Error> for Error {
    fn from(e: crate::wire::Error) -> Self {
        Error::Wire(e)
    }
}

/// The core's result type.
pub type Result<T, E = Error> = core::result::Result<T, E>;
