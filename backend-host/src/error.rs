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

/// This crate's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;
