//! What a run takes (calls, buffers) and gives back (reports, statistics).

use crate::error::Error;
use crate::fabric::LinkKind;

pub use ringcc_core::Call;
use ringcc_core::Rank;

/// Where a rank's input and output live, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BufLayout {
    /// Input: in `RankBuffers::input` (out of place) or at this offset of
    /// `RankBuffers::output` (in place).
    pub input_at: usize,
    pub input_len: usize,
    pub output_at: usize,
    pub output_len: usize,
    pub in_place: bool,
}

impl BufLayout {
    pub fn new(call: &Call, ranks: u32, rank: u32, in_place: bool) -> BufLayout {
        let (input_len, output_len) = call.buffer_bytes(ranks);
        let bytes = |e: u64| {
            usize::try_from(e)
                .unwrap_or(usize::MAX)
                .saturating_mul(call.elem())
        };
        let (input_at, output_at) = if in_place {
            let (i, o) = call.in_place_offsets(rank);
            (bytes(i), bytes(o))
        } else {
            (0, 0)
        };
        BufLayout {
            input_at,
            input_len,
            output_at,
            output_len,
            in_place,
        }
    }

    /// Bytes of the single in-place buffer.
    pub fn in_place_len(&self) -> usize {
        self.input_len.max(self.output_len)
    }
}

/// One rank's user buffers.
///
/// Out of place, `input` and `output` have the sizes of
/// [`Call::buffer_bytes`]. In place (NCCL's `sendbuff == recvbuff` forms),
/// `output` is the one buffer, of the larger size, and `input` is unused:
/// ReduceScatter's result lands in block `rank` of it, AllGather's input
/// is read from block `rank`. Timing-only runs ignore buffers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RankBuffers {
    /// The send buffer (out of place).
    pub input: Vec<u8>,
    /// The receive buffer (or the in-place buffer).
    pub output: Vec<u8>,
}

impl RankBuffers {
    /// Zeroed buffers of the right sizes for `call` on rank `rank` of
    /// `ranks`.
    pub fn zeroed(call: &Call, ranks: u32, rank: Rank, in_place: bool) -> RankBuffers {
        let l = BufLayout::new(call, ranks, rank.get(), in_place);
        if in_place {
            RankBuffers {
                input: Vec::new(),
                output: vec![0; l.in_place_len()],
            }
        } else {
            RankBuffers {
                input: vec![0; l.input_len],
                output: vec![0; l.output_len],
            }
        }
    }

    /// Where the call reads this rank's input (to fill it before a run).
    pub fn input_mut(&mut self, call: &Call, ranks: u32, rank: Rank, in_place: bool) -> &mut [u8] {
        let l = BufLayout::new(call, ranks, rank.get(), in_place);
        let buf = if in_place {
            &mut self.output
        } else {
            &mut self.input
        };
        let end = l.input_at.saturating_add(l.input_len).min(buf.len());
        buf.get_mut(l.input_at.min(end)..end).unwrap_or(&mut [])
    }

    /// Where the call wrote this rank's result.
    pub fn output(&self, call: &Call, ranks: u32, rank: Rank, in_place: bool) -> &[u8] {
        let l = BufLayout::new(call, ranks, rank.get(), in_place);
        let end = l
            .output_at
            .saturating_add(l.output_len)
            .min(self.output.len());
        self.output.get(l.output_at.min(end)..end).unwrap_or(&[])
    }
}

/// The outcome of one collective on every rank.
#[derive(Clone, Debug, PartialEq)]
pub struct RunReport {
    /// Per rank: `Ok` only if its result is complete (and, with payload,
    /// exact) and no rank failed before the run ended.
    pub ranks: Vec<Result<(), Error>>,
    /// Virtual time the run started, seconds.
    pub start: f64,
    /// Virtual time the call ended, seconds: its last copy or reduction
    /// on any rank (an NCCL kernel returns then, without waiting for the
    /// final credits), or, if a rank failed, when the run stopped.
    pub end: f64,
    /// Virtual time every lane had finished, final credits included,
    /// seconds: where the next call starts.
    pub settled: f64,
    /// Events processed by the run.
    pub events: u64,
}

impl RunReport {
    /// Whether every rank succeeded.
    pub fn ok(&self) -> bool {
        self.ranks.iter().all(Result::is_ok)
    }

    /// Simulated duration, seconds.
    pub fn duration(&self) -> f64 {
        self.end - self.start
    }

    /// The first error, if any rank failed.
    pub fn first_error(&self) -> Option<&Error> {
        self.ranks.iter().find_map(|r| r.as_ref().err())
    }
}

/// What one link carried (all runs so far).
#[derive(Clone, Debug, PartialEq)]
pub struct LinkStats {
    /// Its name (`nvlink 0->1`, `nic 1.3 tx`).
    pub name: String,
    /// What it is.
    pub kind: LinkKind,
    /// Bytes put on it (wire bytes, headers included, for NICs).
    pub bytes: u64,
    /// Transfers (NVLink copies; NIC messages in timing-only mode, packets
    /// with payload).
    pub messages: u64,
    /// Seconds it was busy transmitting.
    pub busy: f64,
}

/// Counters of the whole simulation so far.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Stats {
    /// Events processed.
    pub events: u64,
    /// FNV-1a hash of the event log (time, kind, ids of every event): same
    /// configuration and seed, same hash.
    pub event_hash: u64,
    /// Slices carried out by GPUs.
    pub execs: u64,
    /// Work requests posted (payload mode).
    pub work_requests: u64,
    /// Completions delivered (payload mode).
    pub completions: u64,
    /// Packets put on the wire, ACKs included (payload mode).
    pub packets: u64,
    /// Data packets sent again (go-back-N).
    pub retransmissions: u64,
    /// ACKs responders put on the wire (as the capture shows them; one
    /// still queued when a run ends is counted when it leaves, in the next
    /// run).
    pub acks: u64,
    /// NAKs responders put on the wire (sequence errors, access errors,
    /// RNR).
    pub naks: u64,
    /// Retransmission timeouts that fired.
    pub timeouts: u64,
    /// Packets the fault injector dropped.
    pub lost: u64,
    /// Packets the fault injector duplicated.
    pub duplicated: u64,
    /// Frames dropped at a receiver: bad checksum, unknown queue pair, dead
    /// port or rank.
    pub dropped: u64,
    /// Credit returns (`head` updates) sent.
    pub credits: u64,
    /// Per link.
    pub links: Vec<LinkStats>,
}
