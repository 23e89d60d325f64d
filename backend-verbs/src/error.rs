//! The crate's one error type.

use std::time::Duration;

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
        channel: u8,
        /// The rank at the other end of the queue pair.
        peer: u32,
        /// `ibv_wc_status` value.
        status: u32,
        /// Its rdma-core name (`IBV_WC_REM_ACCESS_ERR`, …).
        status_name: &'static str,
    },
    /// A rendezvous socket operation failed.
    #[error("rendezvous {call} ({addr}) failed: {source}")]
    Rendezvous {
        /// The operation (`connect`, `bind`, `read`, `write`).
        call: &'static str,
        /// The address involved.
        addr: String,
        /// The socket error.
        #[source]
        source: std::io::Error,
    },
    /// The rendezvous server refused this rank (wrong token, rank taken,
    /// different world size).
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
        rank: Option<u32>,
        /// Why.
        reason: String,
    },
    /// A wait ran past its deadline.
    #[error("timed out after {after:?} waiting for {waiting_for}")]
    Timeout {
        /// What was awaited.
        waiting_for: String,
        /// The deadline that passed.
        after: Duration,
    },
    /// The core (plan, state machine, reduction kernels, wire formats)
    /// refused: mismatched calls across ranks, a protocol violation by a
    /// peer, a write beyond an advertised capacity.
    #[error("{call}: {source}")]
    Core {
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
    /// Wraps a core error with the call that produced it.
    pub(crate) fn core<E: Into<ringcc_core::Error>>(call: &'static str) -> impl FnOnce(E) -> Error {
        move |source| Error::Core {
            call,
            source: source.into(),
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

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
