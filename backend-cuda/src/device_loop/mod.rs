//! # The device loop: the schedule on the GPU
//!
//! The per-slice path ([`progress`](crate::progress)) launches one fused
//! kernel per slice and orders slices with events: several microseconds of
//! launch and event overhead per slice. The device loop does what NCCL
//! does instead: **one kernel launch per rank and call**, one block per
//! channel, each block walking the whole plan of its (channel, rank) on the
//! device and waiting on the FIFO's counters in memory. Nothing on the host
//! takes part once the kernels are launched (one process, peer access: no
//! network to proxy).
//!
//! ## How a block walks the plan
//!
//! The kernel ([`kernel::loop_source`](mod@crate::kernel::loop_source)) is
//! generated per (type, op) like the fused kernels and reuses their slice
//! bodies. Its schedule is the plan's step formula
//! ([`kernel::plan_source`](mod@crate::kernel::plan_source)): per loop the
//! channel range and the loop's chunk (the divisions), per step the chunk
//! `(r − s − 1) mod n` (or `(r − s) mod n`), the primitive from the table
//! and the offsets, in O(1); per step `max(1, ⌈bytes / slice⌉)` slices of
//! `slots_per_slice` FIFO steps each, exactly as the core's `Machine` cuts
//! them. The tests compile that same source as host C++ and compare it,
//! step by step and slice by slice, with the core's `Plan` and `Machine`.
//!
//! Per slice, thread 0 waits for data (`tail ≥ recv_step + slots`) and
//! credit (`head + STEPS ≥ send_step + slots`), the block runs the fused
//! body (incoming slot ⊕ input → output and the successor's slot), and
//! thread 0 publishes the new `tail` to the successor and `head` to the
//! predecessor. A call ends when the successor consumed everything sent;
//! the counters stay in device memory (`state`) for the next call, which is
//! ordered after this one by the rank's stream.
//!
//! ## Memory
//!
//! Per connection (channel, receiver): the FIFO, the `tail` word and the
//! three call words in the receiver's memory, the `head` word in the
//! sender's — each side polls its own memory and writes the other's (as
//! NCCL places them). Ordering: acquire loads to wait, release stores to
//! publish (the core FIFO's `StepCounter`), at system scope; see
//! [`kernel::loop_source`](mod@crate::kernel::loop_source).
//!
//! ## The call check
//!
//! Before its first slice to the successor in a call a block writes the
//! call words (sequence number, count, packed collective/type/op/root);
//! the successor compares them with its own call at its first receive (the
//! core's call header). A sender cannot overwrite them before they are
//! read: it finishes a call only once the receiver consumed every slice of
//! it, and the receiver reads them before consuming the first.
//!
//! ## Bounded waits, failures
//!
//! Every wait checks, each 256 polls, the communicator's abort word (in
//! host memory) and the clock: nothing for [`Config::timeout`](crate::Config::timeout) is a
//! timeout. A block that fails records what it waited for in its status
//! (host memory) and raises the abort word, so every other block — of this
//! call and of calls enqueued after it — stops at once. Failure is sticky:
//! a block whose channel failed before does not run. The host reads the
//! statuses when it synchronizes ([`status_error`]), and raises the abort
//! word itself when its own wait runs out.
//!
//! A persistent kernel needs every rank's blocks resident at once: the
//! ranks' kernels run on their own streams, and a device that cannot run
//! them concurrently (another kernel filling it, MPS limits,
//! `CUDA_LAUNCH_BLOCKING=1`) ends in a timeout error, not a hang.

pub mod abi;
pub mod abort;
pub(crate) mod gpu;
pub mod peers;
pub mod proxy;
pub mod rank;

use std::time::Duration;

use ringcc_core::fifo::FifoGeometry;
use ringcc_core::prim::check_start;
use ringcc_core::{Blocked, Call, ChannelId, InOrderRing, Plan, ProtocolViolation, Rank};

use crate::error::{Error, Result};
use crate::layout::Layout;
use abi::{RcPlan, RcStatus};

pub use crate::config::LaunchMode;

/// What carries out a call on the device loop: one launch per rank.
pub trait LoopLauncher {
    /// Enqueues every rank's device loop for call `seq`: `calls[r]` with
    /// `plans[r]` is rank `r`'s (checked by [`check_calls`]).
    fn launch_loops(&mut self, seq: u64, calls: &[Call], plans: &[Plan]) -> Result<()>;
}

/// What the engines check when a call starts, checked on the host before
/// anything is launched: every rank's plan fits the FIFO (the core's
/// `Machine::new`), and the ranks made the same call — the first rank
/// whose call differs from its predecessor's fails with the core's
/// `MismatchedCall`, as its machine would on the call header.
pub fn check_calls(layout: &Layout, calls: &[Call], plans: &[Plan], seq: u64) -> Result<()> {
    let n = layout.ranks();
    if calls.len() != n as usize || plans.len() != calls.len() {
        return Err(Error::RankCount {
            expected: n as usize,
            got: calls.len().min(plans.len()),
        });
    }
    let ring = InOrderRing { ranks: n };
    let machine_error = |source| Error::Core {
        channel: Some(ChannelId(0)),
        call: "start",
        source,
    };
    for (r, (call, plan)) in calls.iter().zip(plans).enumerate() {
        plan.steps(ChannelId(0), Rank(r as u32), ring)
            .map_err(machine_error)?;
        check_start(&call.desc(seq), plan, layout.geometry()).map_err(machine_error)?;
    }
    for r in (0..n).map(Rank) {
        let (Some(own), Some(prev)) = (
            calls.get(r.0 as usize),
            calls.get(layout.prev(r).0 as usize),
        ) else {
            continue;
        };
        let (expected, got) = (own.desc(seq), prev.desc(seq));
        if expected != got {
            return Err(Error::Core {
                channel: Some(ChannelId(0)),
                call: "handle_header",
                source: ringcc_core::Error::MismatchedCall { expected, got },
            });
        }
    }
    Ok(())
}

/// The formula's input for rank `rank` (ring index = rank: the backend's
/// rings are in rank order) on `channel`.
pub fn rc_plan(plan: &Plan, geometry: FifoGeometry, channel: ChannelId, rank: Rank) -> RcPlan {
    let elem = u64::from(plan.dtype().size());
    let root = plan.collective().root().map_or(0, |r| r.0);
    RcPlan {
        count: plan.count(),
        chunk_elems: plan.chunk_elems(),
        align_elems: ringcc_core::plan::CHUNK_ALIGN
            .checked_div(elem)
            .unwrap_or(1),
        slice_elems: geometry.slice_bytes().checked_div(elem).unwrap_or(0),
        ring: std::ptr::null(),
        collective: u32::from(plan.collective().code()),
        nranks: plan.ranks(),
        channels: plan.channels(),
        channel: u32::from(channel.0),
        ring_index: rank.0,
        root_index: root,
        elem_bytes: u32::from(plan.dtype().size()),
        slots_per_slice: u32::try_from(geometry.slots_per_slice()).unwrap_or(0),
    }
}

/// Rank `rank`'s launch arguments for call `seq`, with the addresses of
/// its buffers, its channel table, its statuses and the abort word.
#[expect(
    clippy::too_many_arguments,
    reason = "the launch's inputs, each from a different owner"
)]
pub fn loop_args(
    plan: &Plan,
    call: &Call,
    seq: u64,
    geometry: FifoGeometry,
    rank: Rank,
    timeout: Duration,
    buffers: (u64, u64),
    tables: (u64, u64, u64),
) -> abi::RcLoopArgs {
    let p = rc_plan(plan, geometry, ChannelId(0), rank);
    let (chans, status, abort_flag) = tables;
    abi::RcLoopArgs {
        input: buffers.0,
        output: buffers.1,
        chans,
        status,
        abort_flag,
        ring: 0,
        seq,
        count: p.count,
        chunk_elems: p.chunk_elems,
        slice_elems: p.slice_elems,
        timeout_ns: u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX),
        desc: abi::pack_desc(&call.desc(seq)),
        collective: p.collective,
        nranks: p.nranks,
        channels: p.channels,
        ring_index: p.ring_index,
        root_index: p.root_index,
        slots_per_slice: p.slots_per_slice,
    }
}

/// How bad a status is: the one to report first (0 = fine).
fn severity(code: u64) -> u8 {
    match code {
        abi::STATUS_MISMATCH => 5,
        abi::STATUS_PROTOCOL => 4,
        abi::STATUS_TIMEOUT => 3,
        abi::STATUS_ABORTED => 2,
        abi::STATUS_PEER_FAILED => 1,
        abi::STATUS_IDLE | abi::STATUS_DONE => 0,
        // A code no loop writes: memory was overwritten.
        _ => 4,
    }
}

/// The error the blocks' statuses report, `None` when every block is idle
/// or done: the worst failure (a mismatch, a protocol violation, a
/// timeout, then aborts), the first in (rank, channel) order. `timeout` is
/// the deadline the loops ran with.
pub fn status_error(
    records: impl IntoIterator<Item = (Rank, ChannelId, RcStatus)>,
    timeout: Duration,
) -> Option<Error> {
    let mut worst: Option<(u8, Rank, ChannelId, RcStatus)> = None;
    for (r, c, s) in records {
        let sev = severity(s.code);
        if sev > 0 && worst.as_ref().is_none_or(|w| sev > w.0) {
            worst = Some((sev, r, c, s));
        }
    }
    let (_, rank, channel, s) = worst?;
    let blocked = match s.waiting {
        abi::WAIT_DATA => Blocked::Data {
            tail: s.seen,
            need: s.need,
        },
        _ => Blocked::Credit {
            head: s.seen,
            need: s.need,
        },
    };
    let at = format!(
        "rank {} call {}: channel {} (device loop, loop {} step {} slice {})",
        rank.0, s.seq, channel.0, s.loop_index, s.step_index, s.slice
    );
    Some(match s.code {
        abi::STATUS_MISMATCH => {
            let got = abi::unpack_desc(s.got_seq, s.got_count, s.got_desc);
            let expected = abi::unpack_desc(s.seq, s.own_count, s.own_desc);
            let source = match (expected, got) {
                (Some(expected), Some(got)) => ringcc_core::Error::MismatchedCall { expected, got },
                _ => ringcc_core::Error::Protocol(ProtocolViolation::UnexpectedHeader),
            };
            Error::Core {
                channel: Some(channel),
                call: "device loop: call check",
                source,
            }
        }
        abi::STATUS_TIMEOUT => Error::Timeout {
            waiting_for: match s.waiting {
                abi::WAIT_FINISH => format!("{at} waits for {blocked} to finish the call"),
                _ => format!("{at} waits for {blocked}"),
            },
            after: timeout,
        },
        abi::STATUS_ABORTED => Error::Poisoned {
            cause: format!("{at}: aborted by the host"),
        },
        abi::STATUS_PEER_FAILED => Error::Poisoned {
            cause: format!("{at}: stopped because another block failed"),
        },
        abi::STATUS_PROTOCOL => Error::Core {
            channel: Some(channel),
            call: "device loop",
            source: ringcc_core::Error::Protocol(match s.waiting {
                abi::WAIT_DATA => ProtocolViolation::Overrun,
                abi::WAIT_CREDIT | abi::WAIT_FINISH => ProtocolViolation::HeadAhead,
                _ => ProtocolViolation::UnexpectedHeader,
            }),
        },
        _ => Error::Poisoned {
            cause: format!("{at}: unknown status code {}", s.code),
        },
    })
}

#[cfg(test)]
mod tests;
