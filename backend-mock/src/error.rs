//! The simulator's error type.

use std::fmt;

use ringcc_core::wire::WcStatus;
use ringcc_core::{ChannelId, Rank};

/// Everything that can go wrong in a simulated cluster: a bad
/// configuration or call (returned by [`Cluster::new`](crate::Cluster::new)
/// / [`Cluster::run`](crate::Cluster::run)), and what a rank's collective
/// fails with (in [`RunReport::ranks`](crate::RunReport::ranks)).
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Error {
    /// `Cluster::new`: the configuration is inconsistent.
    BadConfig {
        /// What is wrong.
        what: String,
    },
    /// `Topology::uniform` / `Topology::ring`: the core refused the shape.
    Topology {
        /// The core's error.
        source: ringcc_core::Error,
    },
    /// `Cluster::run`: one call per rank is needed.
    CallCount {
        /// Ranks of the cluster.
        ranks: u32,
        /// Calls given.
        calls: usize,
    },
    /// `Plan::new`: a rank's call is invalid (bad root,
    /// chunk not a multiple of the element size, size overflow).
    InvalidCall {
        /// The rank.
        rank: Rank,
        /// The core's error.
        source: ringcc_core::Error,
    },
    /// `Cluster::run` in payload mode: one buffer pair per rank is needed.
    BufferCount {
        /// Ranks of the cluster.
        ranks: u32,
        /// Buffer pairs given.
        buffers: usize,
    },
    /// `Cluster::run` in payload mode: a rank's buffer has the wrong size.
    BadBuffer {
        /// The rank.
        rank: Rank,
        /// `input` or `output`.
        which: &'static str,
        /// Bytes the call needs.
        expected: usize,
        /// Bytes given.
        got: usize,
    },
    /// The rank's core engine failed (`call`: what it was doing): most often
    /// `MismatchedCall` (ranks called with different count / type / op /
    /// root), or a flow-control protocol violation.
    Core {
        /// The rank.
        rank: Rank,
        /// The channel.
        channel: ChannelId,
        /// The machine call that failed.
        call: &'static str,
        /// The core's error.
        source: ringcc_core::Error,
    },
    /// A reduction kernel (`reduce`, `finalize`) refused its buffers.
    Reduce {
        /// The rank.
        rank: Rank,
        /// The kernel.
        call: &'static str,
        /// The core's error.
        source: ringcc_core::Error,
    },
    /// Formatting a work request or WQE (`SliceWrites::new`,
    /// `credit_write`, `WqeRepr::from_request`) failed.
    Wire {
        /// The rank.
        rank: Rank,
        /// The channel.
        channel: ChannelId,
        /// The call that failed.
        call: &'static str,
        /// The wire error.
        source: ringcc_core::wire::Error,
    },
    /// `post_send` on the simulated RNIC failed (queue pair not ready to
    /// send, send queue full).
    Post {
        /// The rank.
        rank: Rank,
        /// The channel.
        channel: ChannelId,
        /// Why.
        what: &'static str,
    },
    /// A work request completed with an error status (`REM_ACCESS_ERR` for
    /// a bad key or an out-of-bounds write, `RETRY_EXC_ERR` when the peer
    /// is gone, `WR_FLUSH_ERR` after an earlier failure).
    Completion {
        /// The rank whose queue pair reported it.
        rank: Rank,
        /// The channel.
        channel: ChannelId,
        /// What the request was (`data write`, `credit return`).
        request: &'static str,
        /// The completion status.
        status: WcStatus,
        /// The local queue pair number.
        qpn: u32,
    },
    /// A channel of a rank made no progress for the deadline.
    Timeout {
        /// The rank.
        rank: Rank,
        /// The channel.
        channel: ChannelId,
        /// Virtual seconds it waited.
        waited: f64,
        /// What it waited for.
        waiting_for: &'static str,
    },
    /// The rank was killed by a fault.
    RankDied {
        /// The rank.
        rank: Rank,
        /// When it died (virtual seconds).
        at: f64,
    },
    /// Another rank failed and aborted the communicator; this rank's
    /// collective was cut short (or, if it had finished, its success was
    /// not confirmed before the abort arrived).
    Aborted {
        /// This rank.
        rank: Rank,
        /// The rank that failed first and broadcast the abort.
        origin: Rank,
        /// Why `origin` failed.
        cause: Box<Error>,
    },
    /// `Cluster::run` after a failed run: the communicator is aborted
    /// (build a new cluster).
    Poisoned {
        /// The first failure.
        cause: Box<Error>,
    },
    /// The run processed `max_events` events without finishing (a
    /// livelock).
    EventLimit {
        /// The rank.
        rank: Rank,
        /// Events processed.
        events: u64,
    },
}

impl Error {
    /// Whether this is (or was aborted because of) a call mismatch across
    /// ranks, and this rank saw it itself.
    pub fn is_mismatched_call(&self) -> bool {
        matches!(
            self,
            Error::Core {
                source: ringcc_core::Error::MismatchedCall { .. },
                ..
            }
        )
    }

    /// The completion status behind this error, if a work request failed
    /// (directly, or as the cause of an abort).
    pub fn wc_status(&self) -> Option<WcStatus> {
        match self {
            Error::Completion { status, .. } => Some(*status),
            Error::Aborted { cause, .. } | Error::Poisoned { cause } => cause.wc_status(),
            _ => None,
        }
    }

    /// The rank this error happened on, where it names one.
    pub fn rank(&self) -> Option<Rank> {
        match self {
            Error::InvalidCall { rank, .. }
            | Error::BadBuffer { rank, .. }
            | Error::Core { rank, .. }
            | Error::Reduce { rank, .. }
            | Error::Wire { rank, .. }
            | Error::Post { rank, .. }
            | Error::Completion { rank, .. }
            | Error::Timeout { rank, .. }
            | Error::RankDied { rank, .. }
            | Error::Aborted { rank, .. }
            | Error::EventLimit { rank, .. } => Some(*rank),
            Error::BadConfig { .. }
            | Error::Topology { .. }
            | Error::CallCount { .. }
            | Error::BufferCount { .. }
            | Error::Poisoned { .. } => None,
        }
    }

    /// The core's error underneath, if this is one (a rank's engine failed,
    /// its call was invalid, or the topology was).
    pub fn core_error(&self) -> Option<ringcc_core::Error> {
        match self {
            Error::Core { source, .. }
            | Error::InvalidCall { source, .. }
            | Error::Topology { source } => Some(*source),
            Error::Aborted { cause, .. } | Error::Poisoned { cause } => cause.core_error(),
            _ => None,
        }
    }

    /// The error at the root of an abort (the error itself otherwise).
    pub fn root_cause(&self) -> &Error {
        match self {
            Error::Aborted { cause, .. } | Error::Poisoned { cause } => cause.root_cause(),
            e => e,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::BadConfig { what } => write!(f, "invalid cluster configuration: {what}"),
            Error::Topology { source } => write!(f, "topology: {source}"),
            Error::CallCount { ranks, calls } => {
                write!(f, "{calls} calls given for {ranks} ranks (one per rank)")
            }
            Error::BufferCount { ranks, buffers } => {
                write!(f, "{buffers} buffer pairs given for {ranks} ranks (one per rank)")
            }
            Error::InvalidCall { rank, source } => write!(f, "rank {rank}: invalid call: {source}"),
            Error::BadBuffer {
                rank,
                which,
                expected,
                got,
            } => write!(
                f,
                "rank {rank}: {which} buffer has {got} B, the call needs {expected} B"
            ),
            Error::Core {
                rank,
                channel,
                call,
                source,
            } => write!(f, "rank {rank} channel {channel}: Machine::{call}: {source}"),
            Error::Reduce { rank, call, source } => write!(f, "rank {rank}: {call}: {source}"),
            Error::Wire {
                rank,
                channel,
                call,
                source,
            } => write!(f, "rank {rank} channel {channel}: {call}: {source}"),
            Error::Post {
                rank,
                channel,
                what,
            } => write!(f, "rank {rank} channel {channel}: post_send: {what}"),
            Error::Completion {
                rank,
                channel,
                request,
                status,
                qpn,
            } => write!(
                f,
                "rank {rank} channel {channel}: {request} on QP {qpn:#x} completed with {status:?}"
            ),
            Error::Timeout {
                rank,
                channel,
                waited,
                waiting_for,
            } => write!(
                f,
                "rank {rank} channel {channel}: no progress for {waited:.6} s (waiting for {waiting_for})"
            ),
            Error::RankDied { rank, at } => write!(f, "rank {rank} died at {at:.6} s"),
            Error::Aborted {
                rank,
                origin,
                cause,
            } => {
                // The cause names its rank (the origin) itself: saying
                // "by rank 7: rank 7 ..." would name it twice.
                if cause.rank() == Some(*origin) {
                    write!(f, "rank {rank}: aborted after {cause}")
                } else {
                    write!(f, "rank {rank}: aborted by rank {origin}: {cause}")
                }
            }
            Error::Poisoned { cause } => {
                write!(f, "the communicator was aborted by an earlier failure: {cause}")
            }
            Error::EventLimit { rank, events } => write!(
                f,
                "rank {rank}: the run processed {events} events without finishing (livelock?)"
            ),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Topology { source }
            | Error::InvalidCall { source, .. }
            | Error::Core { source, .. }
            | Error::Reduce { source, .. } => Some(source),
            Error::Wire { source, .. } => Some(source),
            Error::Aborted { cause, .. } | Error::Poisoned { cause } => Some(cause.as_ref()),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_core_error_is_found_through_aborts() {
        let core = Error::Core {
            rank: Rank(3),
            channel: ChannelId(1),
            call: "handle_header",
            source: ringcc_core::Error::NoExecPending,
        };
        assert_eq!(core.core_error(), Some(ringcc_core::Error::NoExecPending));
        let aborted = Error::Aborted {
            rank: Rank(0),
            origin: Rank(3),
            cause: Box::new(core),
        };
        assert_eq!(
            aborted.core_error(),
            Some(ringcc_core::Error::NoExecPending)
        );
        assert_eq!(
            Error::RankDied {
                rank: Rank(1),
                at: 0.0
            }
            .core_error(),
            None
        );
    }

    #[test]
    fn an_abort_names_the_failed_rank_once() {
        let died = Error::Aborted {
            rank: Rank(0),
            origin: Rank(7),
            cause: Box::new(Error::RankDied {
                rank: Rank(7),
                at: 1e-3,
            }),
        };
        assert_eq!(
            died.to_string(),
            "rank 0: aborted after rank 7 died at 0.001000 s"
        );
        let livelock = Error::Aborted {
            rank: Rank(0),
            origin: Rank(7),
            cause: Box::new(Error::EventLimit {
                rank: Rank(7),
                events: 9,
            }),
        };
        assert!(
            !livelock.to_string().contains("rank 7: rank 7"),
            "{livelock}"
        );
        let unnamed = Error::Aborted {
            rank: Rank(0),
            origin: Rank(7),
            cause: Box::new(Error::BadConfig { what: "x".into() }),
        };
        assert_eq!(
            unnamed.to_string(),
            "rank 0: aborted by rank 7: invalid cluster configuration: x"
        );
    }
}
