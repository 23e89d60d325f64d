//! The crate's one error type.

use std::time::Duration;

use ringcc_core::fifo::FifoGeometry;

/// Everything that can go wrong in the host backend. Each variant names
/// what failed; lower-layer errors are kept as the `source`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A configuration that cannot work, or two sides configured
    /// differently (a segment whose FIFO geometry is not the expected one).
    #[error("invalid configuration: {0}")]
    BadConfig(String),
    /// A wait ran past its deadline.
    #[error("timed out after {after:?} waiting for {waiting_for}")]
    Timeout {
        /// What was awaited.
        waiting_for: String,
        /// How long it was awaited.
        after: Duration,
    },
    /// A shared-memory system call failed.
    #[error("{call} on shared-memory segment {segment} failed: {source}")]
    Shm {
        /// The call (`shm_open`, `ftruncate`, `mmap`, `fstat`, `shm_unlink`).
        call: &'static str,
        /// The segment's name.
        segment: String,
        /// The error the system returned.
        #[source]
        source: std::io::Error,
    },
    /// A segment that is not a ringcc segment of this layout version, or
    /// whose size, owner or mode is wrong.
    #[error("shared-memory segment {segment} is unusable: {reason}")]
    BadSegment {
        /// The segment's name.
        segment: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A segment created for another job (its token hash differs).
    #[error(
        "shared-memory segment {segment} belongs to another job \
         (token hash {found:016x}, ours {ours:016x})"
    )]
    Stranger {
        /// The segment's name.
        segment: String,
        /// Our token's hash.
        ours: u64,
        /// The hash the segment carries.
        found: u64,
    },
    /// A copy into or out of a slot longer than the slot. Nothing was
    /// copied.
    #[error("slot {slot}: {len} bytes do not fit its {capacity}-byte capacity")]
    SlotOverflow {
        /// The slot (`0..STEPS`).
        slot: u64,
        /// Bytes asked for.
        len: usize,
        /// Bytes the slot holds.
        capacity: u64,
    },
    /// A slot index beyond the FIFO's `STEPS` slots.
    #[error("slot {slot} does not exist (a FIFO has {steps})", steps = ringcc_core::fifo::STEPS)]
    NoSuchSlot {
        /// The index asked for.
        slot: u64,
    },
    /// A buffer whose size is not what the call needs.
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
        channel: Option<ringcc_core::ChannelId>,
        /// What the core was doing.
        call: &'static str,
        /// The core's error.
        #[source]
        source: ringcc_core::Error,
    },
    /// The rank failed earlier; it takes no more calls.
    #[error("the rank failed earlier and takes no more calls: {cause}")]
    Poisoned {
        /// The first failure.
        cause: String,
    },
    /// A broken invariant of this crate (a bug): never the caller's fault.
    #[error("internal error in ringcc-host: {0}")]
    Internal(String),
}

impl Error {
    pub(crate) fn shm<'a>(
        call: &'static str,
        segment: &'a str,
    ) -> impl FnOnce(rustix::io::Errno) -> Error + 'a {
        move |e| Error::Shm {
            call,
            segment: segment.to_owned(),
            source: e.into(),
        }
    }

    pub(crate) fn geometry_mismatch(
        segment: &str,
        ours: FifoGeometry,
        found: FifoGeometry,
    ) -> Error {
        Error::BadConfig(format!(
            "shared-memory segment {segment} has FIFO geometry {} B x {} slot(s) per slice, \
             expected {} B x {}",
            found.slot_bytes(),
            found.slots_per_slice(),
            ours.slot_bytes(),
            ours.slots_per_slice()
        ))
    }
}

impl Error {
    /// The core's error inside, if this is one.
    pub fn core_error(&self) -> Option<&ringcc_core::Error> {
        match self {
            Error::Core { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// This crate's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<Error> for ringcc_comm::Error {
    /// The communicator's error for a shared-memory failure: the shared
    /// variant where one exists, else [`ringcc_comm::Error::Transport`]
    /// with this crate's error as the source (downcast to get it back).
    fn from(e: Error) -> Self {
        use ringcc_comm::Error as C;
        match e {
            Error::BadConfig(s) => C::BadConfig(s),
            Error::Timeout { waiting_for, after } => C::Timeout { waiting_for, after },
            Error::Stranger {
                segment,
                ours,
                found,
            } => C::Stranger {
                at: segment,
                reason: format!(
                    "the segment belongs to another job (token hash {found:016x}, ours {ours:016x})"
                ),
            },
            Error::Core {
                channel,
                call,
                source,
            } => C::Core {
                channel,
                call,
                source,
            },
            Error::BadBuffer {
                which,
                expected,
                got,
            } => C::BadBuffer {
                which,
                expected,
                got,
            },
            Error::Poisoned { cause } => C::Poisoned { cause },
            other => C::Transport {
                transport: "shm",
                call: match &other {
                    Error::Shm { call, .. } => call,
                    Error::BadSegment { .. } => "segment check",
                    Error::SlotOverflow { .. } | Error::NoSuchSlot { .. } => "slot access",
                    _ => "shared memory",
                },
                source: Box::new(other),
            },
        }
    }
}
