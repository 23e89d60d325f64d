//! The crate's one error type.

use std::time::Duration;

use cudarc::driver::DriverError;
use ringcc_core::{ChannelId, EngineError, Rank};

/// Everything that can go wrong in the CUDA backend. Each variant names the
/// call or check that failed and carries its cause.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The CUDA driver library (`libcuda.so.1`) could not be loaded: there is
    /// no NVIDIA driver on this machine. Checked before the first driver
    /// call, which would otherwise abort the process.
    NoDriver,
    /// No NVRTC library was found at any of the places searched.
    NoNvrtc {
        /// Every path or library name tried, in order.
        searched: Vec<String>,
    },
    /// The NVRTC library was found but lacks a function we need.
    NvrtcSymbol {
        /// The missing symbol.
        symbol: &'static str,
        /// The loader's error.
        source: libloading::Error,
    },
    /// An NVRTC call returned an error code.
    Nvrtc {
        /// The NVRTC function.
        call: &'static str,
        /// Its `nvrtcResult`.
        code: i32,
    },
    /// NVRTC rejected a generated kernel source.
    Compile {
        /// The module (data type and operation) being compiled.
        module: String,
        /// The compiler's log.
        log: String,
    },
    /// A CUDA driver call failed.
    Driver {
        /// The driver function (or cudarc method) that failed.
        call: &'static str,
        /// The driver's error.
        source: DriverError,
    },
    /// A device ordinal that does not exist.
    NoDevice {
        /// The ordinal asked for.
        ordinal: usize,
        /// Devices present.
        count: usize,
    },
    /// The core rejected a call or a protocol event (plan, a channel's
    /// state machine in a rank's engine).
    Core {
        /// The channel whose machine failed, when one did.
        channel: Option<ChannelId>,
        /// The core function (or engine operation) that failed.
        call: &'static str,
        /// The core's error.
        source: ringcc_core::Error,
    },
    /// A configuration value that cannot work.
    BadConfig {
        /// What is wrong.
        what: &'static str,
    },
    /// A call gave a number of per-rank buffers other than the
    /// communicator's rank count.
    RankCount {
        /// The communicator's ranks.
        expected: usize,
        /// Buffers given.
        got: usize,
    },
    /// A rank of a group call was given twice.
    DuplicateRank {
        /// The rank.
        rank: Rank,
    },
    /// A group was launched before every rank made its call.
    MissingRank {
        /// The first rank without a call.
        rank: Rank,
    },
    /// A rank outside the communicator.
    RankOutOfRange {
        /// The rank.
        rank: Rank,
        /// The communicator's ranks.
        ranks: u32,
    },
    /// A user buffer is shorter than the collective needs.
    BadBuffer {
        /// The rank the buffer belongs to.
        rank: Rank,
        /// `"send"` or `"recv"`.
        which: &'static str,
        /// Bytes the call needs.
        expected: u64,
        /// Bytes given.
        got: u64,
    },
    /// A user buffer lives on another device than its rank.
    WrongDevice {
        /// The rank.
        rank: Rank,
        /// The rank's device ordinal.
        expected: usize,
        /// The buffer's device ordinal.
        got: usize,
    },
    /// A device access that would leave its buffer (a bug caught by the
    /// checked layer before any kernel runs).
    OutOfBounds {
        /// The buffer, as `Debug` of its id.
        buffer: String,
        /// Byte offset.
        offset: u64,
        /// Bytes accessed.
        len: u64,
        /// Bytes in the buffer.
        capacity: u64,
    },
    /// A wait ran past its deadline: a rank's engine saw nothing happen
    /// for the configured timeout, or the device did not finish in time.
    Timeout {
        /// What was waited for: the engine's stall report (rank, call,
        /// channel and what it waits for), or the device.
        waiting_for: String,
        /// How long nothing happened.
        after: Duration,
    },
    /// Nothing can happen any more although a call is not done: every
    /// rank of this process waits for another (the progress loop sees
    /// them all), or a fake-device stream waits for an event never
    /// recorded.
    Stalled {
        /// The engines' stall reports (rank, channel, what it waits for).
        detail: String,
    },
    /// The fake device saw FIFO slots used out of order (written before
    /// being read, or read before being written).
    Hazard {
        /// What happened.
        detail: String,
    },
    /// An earlier collective failed on this communicator; its connection
    /// state is unknown, so it accepts no more calls.
    Poisoned {
        /// The failure that poisoned it.
        cause: String,
    },
    /// The per-rank communicator (`ringcc-comm`) a CUDA rank per process
    /// runs on failed: bootstrap, a transport, a call.
    Comm {
        /// What this crate asked it to do.
        call: &'static str,
        /// Its error.
        source: ringcc_comm::Error,
    },
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::NoDriver => f.write_str(
                "no CUDA driver: libcuda.so.1 could not be loaded (no NVIDIA driver installed?)",
            ),
            Error::NoNvrtc { searched } => {
                write!(
                    f,
                    "no NVRTC library found; searched: {}",
                    searched.join(", ")
                )
            }
            Error::NvrtcSymbol { symbol, source } => {
                write!(f, "NVRTC library lacks {symbol}: {source}")
            }
            Error::Nvrtc { call, code } => write!(f, "{call} failed with nvrtcResult {code}"),
            Error::Compile { module, log } => {
                write!(f, "NVRTC could not compile module {module}:\n{log}")
            }
            Error::Driver { call, source } => write!(f, "{call} failed: {source}"),
            Error::NoDevice { ordinal, count } => {
                write!(f, "no CUDA device {ordinal} ({count} present)")
            }
            Error::Core {
                channel: Some(c),
                call,
                source,
            } => write!(f, "channel {} ({call}): {source}", c.0),
            Error::Core {
                channel: None,
                call,
                source,
            } => write!(f, "{call}: {source}"),
            Error::BadConfig { what } => write!(f, "bad configuration: {what}"),
            Error::RankCount { expected, got } => {
                write!(f, "expected one buffer per rank ({expected}), got {got}")
            }
            Error::DuplicateRank { rank } => {
                write!(f, "rank {} called twice in one group", rank.0)
            }
            Error::MissingRank { rank } => {
                write!(f, "group launched without a call from rank {}", rank.0)
            }
            Error::RankOutOfRange { rank, ranks } => {
                write!(f, "rank {} out of range for {ranks} ranks", rank.0)
            }
            Error::BadBuffer {
                rank,
                which,
                expected,
                got,
            } => write!(
                f,
                "rank {}'s {which} buffer has {got} B, the collective needs {expected} B",
                rank.0
            ),
            Error::WrongDevice {
                rank,
                expected,
                got,
            } => write!(
                f,
                "rank {}'s buffer is on device {got}, the rank runs on device {expected}",
                rank.0
            ),
            Error::OutOfBounds {
                buffer,
                offset,
                len,
                capacity,
            } => write!(
                f,
                "access of {len} B at {offset} leaves {buffer} ({capacity} B)"
            ),
            Error::Timeout { waiting_for, after } => {
                write!(f, "timed out after {after:?} waiting for {waiting_for}")
            }
            Error::Stalled { detail } => write!(f, "stalled: {detail}"),
            Error::Hazard { detail } => write!(f, "FIFO hazard on the fake device: {detail}"),
            Error::Poisoned { cause } => write!(
                f,
                "an earlier collective failed on this communicator ({cause}); create a new one"
            ),
            Error::Comm { call, source } => write!(f, "{call}: {source}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::NvrtcSymbol { source, .. } => Some(source),
            Error::Driver { source, .. } => Some(source),
            Error::Core { source, .. } => Some(source),
            Error::Comm { source, .. } => Some(source),
            _ => None,
        }
    }
}

impl Error {
    /// Wraps a driver error with the call that produced it.
    pub(crate) fn driver(call: &'static str) -> impl FnOnce(DriverError) -> Error {
        move |source| Error::Driver { call, source }
    }

    /// Wraps a core error with the call that produced it (no channel).
    pub(crate) fn core(call: &'static str) -> impl FnOnce(ringcc_core::Error) -> Error {
        move |source| Error::Core {
            channel: None,
            call,
            source,
        }
    }

    /// Wraps a communicator error with the call that produced it.
    pub(crate) fn comm(call: &'static str) -> impl FnOnce(ringcc_comm::Error) -> Error {
        move |source| Error::Comm { call, source }
    }

    /// The core's error underneath, if this is one ([`Error::Core`]).
    pub fn core_error(&self) -> Option<ringcc_core::Error> {
        match self {
            Error::Core { source, .. } => Some(*source),
            _ => None,
        }
    }

    /// A rank's engine failed or refused: the one place an
    /// [`EngineError`] becomes this crate's error. `failure` is the
    /// engine's first failure ([`Engine::failure`](ringcc_core::Engine::failure)),
    /// named as the cause when the engine answers `Poisoned`. The engines
    /// of this crate count time in nanoseconds, so a stall's ticks are a
    /// [`Duration`].
    pub(crate) fn from_engine(e: EngineError, failure: Option<EngineError>) -> Error {
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
            EngineError::Timeout(stall) => Error::Timeout {
                waiting_for: stall.to_string(),
                after: Duration::from_nanos(stall.waited),
            },
            EngineError::Poisoned => Error::Poisoned {
                cause: match failure {
                    Some(f) if f != EngineError::Poisoned => f.to_string(),
                    _ => e.to_string(),
                },
            },
            EngineError::Busy => Error::BadConfig {
                what: "a rank's engine still runs the previous call",
            },
            EngineError::BadChannel { .. } => Error::BadConfig {
                what: "a plan with more channels than the rank's engine holds",
            },
            EngineError::Aborted => Error::Poisoned {
                cause: "the engine was stopped after an earlier failure".into(),
            },
            // Whatever later versions of the core add.
            _ => Error::Poisoned {
                cause: e.to_string(),
            },
        }
    }
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
