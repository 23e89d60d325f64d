//! The crate's one error type.

use std::time::Duration;

use ringcc_core::{ChannelId, EngineError, Rank};

/// A boxed error from a lower layer (sideway, std).
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Everything that can go wrong in the verbs backend. Each variant names
/// what failed; lower-layer errors are kept as the `source`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An environment variable is missing or malformed (launcher detection,
    /// configuration).
    #[error("environment variable {var}: {reason}")]
    Env {
        /// The variable.
        var: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A configuration that cannot work, or ranks configured differently.
    #[error("invalid configuration: {0}")]
    BadConfig(String),
    /// No usable RDMA device (rdma-core missing, device absent, port down,
    /// no GID).
    #[error("RDMA device {wanted}: {reason}")]
    NoDevice {
        /// The device asked for (or "any").
        wanted: String,
        /// Why it cannot be used.
        reason: String,
    },
    /// A verbs call failed.
    #[error("{call} on {device} failed: {source}")]
    Verbs {
        /// The rdma-core call (`ibv_create_qp`, `ibv_modify_qp(RTR)`, …).
        call: &'static str,
        /// The device it was made on.
        device: String,
        /// The error sideway or rdma-core returned.
        #[source]
        source: BoxError,
    },
    /// A work request completed with an error status: a bad remote key, a
    /// peer that stopped answering (retry exceeded), a flushed queue pair.
    #[error(
        "{what} on channel {channel} (peer rank {peer}) completed with {status_name} \
         (status {status})"
    )]
    Completion {
        /// What the request was (`data write`, `credit return`, `receive`).
        what: &'static str,
        /// The channel.
        channel: ChannelId,
        /// The rank at the other end of the queue pair.
        peer: Rank,
        /// `ibv_wc_status` value.
        status: u32,
        /// Its rdma-core name (`IBV_WC_REM_ACCESS_ERR`, …).
        status_name: &'static str,
    },
    /// A rendezvous (store) operation failed: its socket, or the store's
    /// answer.
    #[error("rendezvous {call} ({addr}) failed: {source}")]
    Rendezvous {
        /// The operation (`connect`, `bind`, `set`, `get`, …).
        call: &'static str,
        /// The address or store key involved.
        addr: String,
        /// The socket error (or the store's, wrapped).
        #[source]
        source: std::io::Error,
    },
    /// The rendezvous server refused this rank (wrong token, different
    /// world size, rank out of range).
    #[error("rendezvous server rejected this rank: {reason}")]
    Rejected {
        /// The server's reason.
        reason: String,
    },
    /// A rendezvous peer sent something that is not the protocol.
    #[error("rendezvous protocol error: {0}")]
    RendezvousProtocol(String),
    /// The job was aborted: another rank failed, lost its connection or
    /// called `abort`, or this rank's [`AbortHandle`](crate::AbortHandle)
    /// was used.
    #[error("aborted{}: {reason}", rank.map(|r| format!(" by rank {r}")).unwrap_or_default())]
    Aborted {
        /// The rank that aborted, when known.
        rank: Option<Rank>,
        /// Why.
        reason: String,
    },
    /// A wait ran past its deadline: a call made no progress (the core
    /// engine's stall report: rank, call, the channel and what it waits
    /// for, with its neighbours), or setup waited too long.
    #[error("timed out after {after:?} waiting for {waiting_for}")]
    Timeout {
        /// What was awaited.
        waiting_for: String,
        /// How long nothing happened.
        after: Duration,
    },
    /// The core (plan, state machine, reduction kernels, wire formats)
    /// refused: mismatched calls across ranks, a protocol violation by a
    /// peer, a write beyond an advertised capacity.
    #[error("{}{call}: {source}", channel.map(|c| format!("channel {c}: ")).unwrap_or_default())]
    Core {
        /// The channel concerned, when the failure is one channel's (a
        /// machine's).
        channel: Option<ChannelId>,
        /// The core call.
        call: &'static str,
        /// The core's error.
        #[source]
        source: ringcc_core::Error,
    },
    /// A user buffer has the wrong length for the call.
    #[error("{which} buffer holds {got} bytes, the call needs {expected}")]
    BadBuffer {
        /// `input` or `output`.
        which: &'static str,
        /// Bytes the call needs.
        expected: u64,
        /// Bytes given.
        got: u64,
    },
    /// A [`Registered`](crate::Registered) buffer passed to another
    /// communicator than the one that registered it (its registrations
    /// belong to that one's protection domains).
    #[error("the {what} buffer was registered with another communicator")]
    ForeignRegistration {
        /// `input` or `output`.
        what: &'static str,
    },
    /// A broken invariant of this crate (a bug): never the caller's fault.
    #[error("internal error in ringcc-verbs: {0}")]
    Internal(String),
    /// The communicator already failed or was aborted; it accepts no more
    /// calls.
    #[error("the communicator is unusable after an earlier error: {cause}")]
    Poisoned {
        /// The failure that poisoned it.
        cause: String,
    },
}

impl Error {
    /// The core error underneath, if the failure is the core's.
    pub fn core_error(&self) -> Option<ringcc_core::Error> {
        match self {
            Error::Core { source, .. } => Some(*source),
            _ => None,
        }
    }

    /// Wraps a core error with the call that produced it.
    pub(crate) fn core<E: Into<ringcc_core::Error>>(call: &'static str) -> impl FnOnce(E) -> Error {
        move |source| Error::Core {
            channel: None,
            call,
            source: source.into(),
        }
    }

    /// The core engine's error as this crate's: the one place they are
    /// mapped. `neighbours(channel)` gives the channel's predecessor and
    /// successor, for the stall report.
    pub(crate) fn engine(
        e: EngineError,
        neighbours: impl FnOnce(ChannelId) -> Option<(Rank, Rank)>,
    ) -> Error {
        match e {
            EngineError::Machine {
                channel,
                during,
                source,
            } => Error::Core {
                channel: Some(channel),
                call: during,
                source,
            },
            EngineError::Timeout(s) => {
                let around = neighbours(s.channel)
                    .map(|(prev, next)| format!(" (from rank {prev}, to rank {next})"))
                    .unwrap_or_default();
                Error::Timeout {
                    waiting_for: format!(
                        "rank {} call {}: channel {}{around} waits for {} ({} channel(s) open)",
                        s.rank, s.seq, s.channel, s.blocked, s.open
                    ),
                    after: Duration::from_nanos(s.waited),
                }
            }
            EngineError::Aborted | EngineError::Poisoned => Error::Poisoned {
                cause: format!("the progress engine stopped earlier ({e})"),
            },
            other => Error::Internal(format!("progress engine: {other}")),
        }
    }

    /// Wraps a lower-layer error of a verbs call.
    pub(crate) fn verbs<E: Into<BoxError>>(
        call: &'static str,
        device: &str,
    ) -> impl FnOnce(E) -> Error {
        let device = device.to_owned();
        move |e| Error::Verbs {
            call,
            device,
            source: e.into(),
        }
    }

    /// Whether this error came from another rank (an abort notice) rather
    /// than from this rank's own operations.
    pub fn is_remote_abort(&self) -> bool {
        matches!(self, Error::Aborted { rank: Some(_), .. })
    }
}

/// The launcher detection's and the store's errors (ringcc-comm's) as
/// this crate's: a refused hello is [`Error::Rejected`], a store that
/// fails is [`Error::Rendezvous`], an abort notice [`Error::Aborted`].
impl From<ringcc_comm::Error> for Error {
    fn from(e: ringcc_comm::Error) -> Error {
        use ringcc_comm::Error as C;
        match e {
            C::Env { var, reason } => Error::Env { var, reason },
            C::BadConfig(s) => Error::BadConfig(s),
            C::Timeout { waiting_for, after } => Error::Timeout { waiting_for, after },
            C::Aborted { rank, reason } => Error::Aborted { rank, reason },
            C::Stranger { reason, .. } => Error::Rejected { reason },
            C::Store { call, key, source } => Error::Rendezvous {
                call,
                addr: key,
                source: match source.downcast::<std::io::Error>() {
                    Ok(io) => *io,
                    Err(other) => std::io::Error::other(other),
                },
            },
            C::Io { call, source } => Error::Rendezvous {
                call,
                addr: String::new(),
                source,
            },
            C::Poisoned { cause } => Error::Poisoned { cause },
            C::Internal(s) => Error::Internal(format!("ringcc-comm: {s}")),
            other => Error::RendezvousProtocol(other.to_string()),
        }
    }
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;
    use ringcc_core::{Blocked, Stall};

    #[test]
    fn engine_errors_keep_the_channel_and_the_stall_report() {
        let source = ringcc_core::Error::NoExecPending;
        let e = Error::engine(
            EngineError::Machine {
                channel: ChannelId(3),
                during: "handle_exec_done",
                source,
            },
            |_| None,
        );
        assert!(matches!(
            e,
            Error::Core {
                channel: Some(ChannelId(3)),
                call: "handle_exec_done",
                ..
            }
        ));
        assert_eq!(e.core_error(), Some(source));
        assert!(
            e.to_string().starts_with("channel 3: handle_exec_done: "),
            "{e}"
        );

        let stall = Stall {
            rank: Rank(2),
            seq: 7,
            channel: ChannelId(1),
            blocked: Blocked::Credit { head: 4, need: 6 },
            open: 2,
            waited: 1_500_000_000,
        };
        let e = Error::engine(EngineError::Timeout(stall), |c| {
            (c == ChannelId(1)).then_some((Rank(1), Rank(3)))
        });
        match &e {
            Error::Timeout { waiting_for, after } => {
                assert_eq!(*after, Duration::from_millis(1500));
                assert_eq!(
                    waiting_for,
                    "rank 2 call 7: channel 1 (from rank 1, to rank 3) waits for credit from its \
                     successor (head 4, needs 6) (2 channel(s) open)"
                );
            }
            other => panic!("expected a timeout, got {other:?}"),
        }
        assert_eq!(e.core_error(), None);
        assert!(matches!(
            Error::engine(EngineError::Poisoned, |_| None),
            Error::Poisoned { .. }
        ));
    }
}
