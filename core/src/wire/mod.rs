//! Wire formats: what a NIC is asked to do and what goes on the wire.
//!
//! (Filled in by the wire-format work: RDMA work requests and completions,
//! mlx5 WQEs, RoCEv2 / InfiniBand transport headers, segmentation.)

/// Why a wire format could not be parsed or emitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum Error {
    /// The buffer is shorter than the format needs.
    Truncated,
    /// A field holds a value the format does not allow.
    Malformed,
    /// The buffer given to `emit` is too small, or a list exceeds its
    /// capacity.
    Exhausted,
}

impl core::fmt::Display for Error {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            Error::Truncated => "buffer too short",
            Error::Malformed => "malformed field",
            Error::Exhausted => "buffer or capacity exhausted",
        })
    }
}

impl core::error::Error for Error {}
