//! The crate's one error type: what the verbs layer itself can fail at.
//! The communicator sees it as the source of
//! [`ringcc_comm::Error::Transport`] (or, for a peer that stopped
//! answering, [`ringcc_comm::Error::PeerGone`]): [`Error::into_comm`] is
//! the one place that decides which.

use ringcc_core::wire::WcStatus;
use ringcc_core::{ChannelId, Rank};

/// A boxed error from a lower layer (sideway, std).
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Everything the verbs transport can fail at. Each variant names what
/// failed; lower-layer errors are kept as the `source`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An environment variable is malformed (`RINGCC_IB_*`).
    #[error("environment variable {var}: {reason}")]
    Env {
        /// The variable.
        var: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A configuration that cannot work.
    #[error("invalid configuration: {0}")]
    BadConfig(String),
    /// A device that cannot be used (named but absent, port down, no
    /// GID).
    #[error("RDMA device {wanted}: {reason}")]
    NoDevice {
        /// The device asked for.
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
        /// What the request was (`data write`, `credit return`, …).
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
    /// The core refused to form a work request (a write beyond the
    /// advertised capacity, a malformed call header).
    #[error("{call}: {source}")]
    Core {
        /// The core call.
        call: &'static str,
        /// The core's error.
        #[source]
        source: ringcc_core::Error,
    },
    /// A broken invariant of this crate (a bug): never the caller's fault.
    #[error("internal error in ringcc-verbs: {0}")]
    Internal(String),
}

impl Error {
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

    /// Wraps a core error with the call that produced it.
    pub(crate) fn core<E: Into<ringcc_core::Error>>(call: &'static str) -> impl FnOnce(E) -> Error {
        move |source| Error::Core {
            call,
            source: source.into(),
        }
    }

    /// Whether this is a completion that says the peer stopped answering
    /// (its queue pair or its process is gone): retries exhausted, or no
    /// response in time.
    pub fn is_peer_gone(&self) -> bool {
        matches!(
            self,
            Error::Completion { status, .. }
                if matches!(
                    WcStatus::from_code(*status),
                    WcStatus::RetryExcErr | WcStatus::RnrRetryExcErr | WcStatus::RespTimeoutErr
                )
        )
    }

    /// This error as the communicator's: a peer that stopped answering is
    /// [`PeerGone`](ringcc_comm::Error::PeerGone), a bad setting is the
    /// communicator's `Env` or `BadConfig`, anything else is
    /// [`Transport`](ringcc_comm::Error::Transport) (`call`: what the
    /// transport was doing) with this error as the source.
    pub fn into_comm(self, call: &'static str) -> ringcc_comm::Error {
        match self {
            Error::Env { var, reason } => ringcc_comm::Error::Env { var, reason },
            Error::BadConfig(s) => ringcc_comm::Error::BadConfig(format!("verbs: {s}")),
            Error::Completion { channel, peer, .. } if self.is_peer_gone() => {
                ringcc_comm::Error::PeerGone {
                    transport: "verbs",
                    peer,
                    channel,
                    reason: self.to_string(),
                }
            }
            other => ringcc_comm::Error::Transport {
                transport: "verbs",
                call,
                source: Box::new(other),
            },
        }
    }
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    fn completion(status: WcStatus) -> Error {
        Error::Completion {
            what: "data write",
            channel: ChannelId(1),
            peer: Rank(2),
            status: status.code(),
            status_name: "IBV_WC_X",
        }
    }

    #[test]
    fn a_silent_peer_is_peer_gone_and_the_rest_a_transport_error_with_its_source() {
        match completion(WcStatus::RetryExcErr).into_comm("poll") {
            ringcc_comm::Error::PeerGone {
                transport: "verbs",
                peer: Rank(2),
                channel: ChannelId(1),
                reason,
            } => assert!(reason.contains("data write"), "{reason}"),
            other => panic!("{other:?}"),
        }
        let e = completion(WcStatus::RemAccessErr).into_comm("poll");
        assert!(
            e.to_string().starts_with("verbs: poll failed: data write"),
            "{e}"
        );
        match e {
            ringcc_comm::Error::Transport { source, .. } => {
                let inner = source.downcast_ref::<Error>().expect("verbs' own error");
                assert!(matches!(inner, Error::Completion { .. }));
            }
            other => panic!("{other:?}"),
        }
        // A bad setting is the communicator's.
        let e = Error::BadConfig("x".into()).into_comm("listen");
        assert!(matches!(e, ringcc_comm::Error::BadConfig(_)));
    }
}
