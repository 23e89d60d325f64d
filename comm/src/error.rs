//! The crate's one error type, with the variant names every ringcc crate
//! shares (`BadBuffer`, `BadConfig`, `Core`, `Timeout`, `Poisoned`,
//! `Aborted`, `Stranger`, …).

use std::time::Duration;

use ringcc_core::{ChannelId, Rank};

/// A boxed lower-layer error (a transport's own error type).
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Everything that can go wrong in a communicator. Each variant names
/// what failed; lower-layer errors are kept as the `source`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A launcher variable that is missing or malformed.
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
    /// A buffer whose size (or element type) is not what the call needs.
    #[error("{which} buffer has {got} B, the call needs {expected} B")]
    BadBuffer {
        /// `input`, `output` or `in-place`.
        which: &'static str,
        /// Bytes the call needs.
        expected: usize,
        /// Bytes given.
        got: usize,
    },
    /// The core refused a call or a peer's message (a mismatched call
    /// across ranks, a protocol violation), on `channel` where one is
    /// named.
    #[error("{}{call}: {source}", channel.map(|c| format!("channel {c}: ")).unwrap_or_default())]
    Core {
        /// The channel, when the failure is one channel's.
        channel: Option<ChannelId>,
        /// What the core was doing.
        call: &'static str,
        /// The core's error.
        #[source]
        source: ringcc_core::Error,
    },
    /// A wait ran past its deadline.
    #[error("timed out after {after:?} waiting for {waiting_for}")]
    Timeout {
        /// What was awaited (for a call: the engine's stall report, naming
        /// rank, channel and what the channel waits for).
        waiting_for: String,
        /// How long it was awaited.
        after: Duration,
    },
    /// The job was aborted: by `rank` (when known), by this rank's
    /// [`abort`](crate::Communicator::abort), or because a rank vanished.
    #[error("the job was aborted{}: {reason}", rank.map(|r| format!(" by rank {r}")).unwrap_or_default())]
    Aborted {
        /// The rank that aborted or vanished, when known.
        rank: Option<Rank>,
        /// Why.
        reason: String,
    },
    /// The communicator failed earlier (or was closed); it takes no more
    /// calls.
    #[error("the communicator failed earlier and takes no more calls: {cause}")]
    Poisoned {
        /// The first failure.
        cause: String,
    },
    /// Somebody who is not a rank of this job (another job's token, a
    /// wrong rank, garbage) tried to join, or its resource was found.
    #[error("refused a stranger at {at}: {reason}")]
    Stranger {
        /// Where (an address, a segment name).
        at: String,
        /// What gave it away.
        reason: String,
    },
    /// The store (bootstrap) failed: a connection, a refused hello, a
    /// malformed reply.
    #[error("store: {call} ({key}) failed: {source}")]
    Store {
        /// The store call.
        call: &'static str,
        /// The key or address involved.
        key: String,
        /// What failed.
        #[source]
        source: BoxError,
    },
    /// A peer sent something the protocol forbids (a malformed, truncated
    /// or oversized frame, a write outside the advertised slots). Nothing
    /// was written outside the slot.
    #[error("{transport}: malformed message from rank {peer} on channel {channel}: {reason}")]
    Protocol {
        /// The transport (`tcp`, `shm`, …).
        transport: &'static str,
        /// The peer.
        peer: Rank,
        /// The channel.
        channel: ChannelId,
        /// What was wrong.
        reason: String,
    },
    /// A peer's connection closed or its process is gone.
    #[error("{transport}: rank {peer} on channel {channel} is gone: {reason}")]
    PeerGone {
        /// The transport.
        transport: &'static str,
        /// The peer.
        peer: Rank,
        /// The channel.
        channel: ChannelId,
        /// What was seen (EOF, reset, …).
        reason: String,
    },
    /// A transport's own failure (a system call, a device), with its
    /// typed error as the source (downcast to the transport crate's
    /// `Error`).
    #[error("{transport}: {call} failed: {source}")]
    Transport {
        /// The transport.
        transport: &'static str,
        /// What it was doing.
        call: &'static str,
        /// Its error.
        #[source]
        source: BoxError,
    },
    /// A system call of the communicator itself failed.
    #[error("{call} failed: {source}")]
    Io {
        /// The call.
        call: &'static str,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// A broken invariant of this crate (a bug): never the caller's fault.
    #[error("internal error in ringcc-comm: {0}")]
    Internal(String),
}

impl Error {
    /// The core's error inside, if this is one.
    pub fn core_error(&self) -> Option<&ringcc_core::Error> {
        match self {
            Error::Core { source, .. } => Some(source),
            _ => None,
        }
    }

    /// A short, stable name of the variant (`"timeout"`, `"aborted"`, …),
    /// for bindings that map errors to exception classes.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Env { .. } => "env",
            Error::BadConfig(_) => "bad_config",
            Error::BadBuffer { .. } => "bad_buffer",
            Error::Core { .. } => "core",
            Error::Timeout { .. } => "timeout",
            Error::Aborted { .. } => "aborted",
            Error::Poisoned { .. } => "poisoned",
            Error::Stranger { .. } => "stranger",
            Error::Store { .. } => "store",
            Error::Protocol { .. } => "protocol",
            Error::PeerGone { .. } => "peer_gone",
            Error::Transport { .. } => "transport",
            Error::Io { .. } => "io",
            Error::Internal(_) => "internal",
        }
    }

    /// The core engine's error as this crate's (the one place they are
    /// mapped); the engine's ticks are nanoseconds.
    pub fn engine(e: ringcc_core::progress::EngineError) -> Error {
        use ringcc_core::progress::EngineError;
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
            EngineError::Timeout(s) => Error::Timeout {
                waiting_for: format!(
                    "rank {} call {}: channel {} waits for {} ({} channel(s) open)",
                    s.rank, s.seq, s.channel, s.blocked, s.open
                ),
                after: Duration::from_nanos(s.waited),
            },
            EngineError::Aborted | EngineError::Poisoned => Error::Poisoned {
                cause: format!("the progress engine stopped earlier ({e})"),
            },
            other => Error::Internal(format!("progress engine: {other}")),
        }
    }

    /// A copy for a second reader (the error of a failed call is reported
    /// to its `Work` and poisons the communicator): the same variant where
    /// the source can be copied, else [`Error::Poisoned`] with the text.
    pub fn duplicate(&self) -> Error {
        match self {
            Error::BadConfig(s) => Error::BadConfig(s.clone()),
            Error::BadBuffer {
                which,
                expected,
                got,
            } => Error::BadBuffer {
                which,
                expected: *expected,
                got: *got,
            },
            Error::Core {
                channel,
                call,
                source,
            } => Error::Core {
                channel: *channel,
                call,
                source: *source,
            },
            Error::Timeout { waiting_for, after } => Error::Timeout {
                waiting_for: waiting_for.clone(),
                after: *after,
            },
            Error::Aborted { rank, reason } => Error::Aborted {
                rank: *rank,
                reason: reason.clone(),
            },
            Error::Poisoned { cause } => Error::Poisoned {
                cause: cause.clone(),
            },
            Error::Protocol {
                transport,
                peer,
                channel,
                reason,
            } => Error::Protocol {
                transport,
                peer: *peer,
                channel: *channel,
                reason: reason.clone(),
            },
            Error::PeerGone {
                transport,
                peer,
                channel,
                reason,
            } => Error::PeerGone {
                transport,
                peer: *peer,
                channel: *channel,
                reason: reason.clone(),
            },
            other => Error::Poisoned {
                cause: other.to_string(),
            },
        }
    }
}

/// This crate's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;
