//! Wire formats: what a NIC is asked to do and what goes on the wire.
//!
//! Everything here is described byte for byte, in the shape of smoltcp's
//! `wire` module: a zero-copy *view* `Foo<T: AsRef<[u8]>>` with
//! `new_checked` and field accessors (offsets in a private `field` module,
//! big-endian throughout), and a plain *representation* `FooRepr` with
//! `parse` / `buffer_len` / `emit`. Parsing is total: any input gives a
//! value or an [`Error`], never a panic; opcodes are enums with an
//! `Unknown` variant so that a view reads whatever is there.
//!
//! - [`verbs`]: the generic work request and completion, with rdma-core's
//!   `verbs.h` values ([`WorkRequest`], [`Completion`]).
//! - [`mlx5`]: the mlx5 send-queue entry (control, remote-address, data and
//!   inline segments in 64-byte basic blocks), as rdma-core's `mlx5dv.h`
//!   lays it out.
//! - [`roce`]: the InfiniBand transport headers (BTH, RETH, ImmDt, AETH),
//!   Ethernet / IPv4 / UDP framing on port 4791, the invariant CRC, and a
//!   whole-packet builder/parser.
//! - [`segment`]: an RDMA WRITE (or SEND) cut into MTU-sized packets with
//!   consecutive PSNs, and the responder's PSN check for go-back-N.
//!
//! These are byte formats only: turning a plan step into the work
//! requests that carry it is the connection protocol's
//! ([`crate::protocol::post`]), which imports from here, never the other
//! way round.
//!
//! Small values with a meaning ([`Psn`], [`Qpn`], [`Lkey`], [`Rkey`]) are
//! newtypes.

/// A `Copy` enum over wire codes with an `Unknown` catch-all, so that
/// `from_code` is total and `code(from_code(x)) == x` for every `x`.
macro_rules! code_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident: $ty:ty {
            $( $(#[$vmeta:meta])* $variant:ident = $value:literal, )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[cfg_attr(feature = "defmt", derive(defmt::Format))]
        pub enum $name {
            $( $(#[$vmeta])* $variant, )*
            /// A value without a name here, kept as it was read. (Produced
            /// by `from_code` only for values no named variant has.)
            Unknown($ty),
        }

        impl $name {
            /// The value for `code` (total: unnamed codes are `Unknown`).
            #[inline]
            pub const fn from_code(code: $ty) -> $name {
                match code {
                    $( $value => $name::$variant, )*
                    other => $name::Unknown(other),
                }
            }

            /// The code on the wire.
            #[inline]
            pub const fn code(self) -> $ty {
                match self {
                    $( $name::$variant => $value, )*
                    $name::Unknown(other) => other,
                }
            }
        }

        impl From<$ty> for $name {
            #[inline]
            fn from(code: $ty) -> Self {
                $name::from_code(code)
            }
        }

        impl From<$name> for $ty {
            #[inline]
            fn from(v: $name) -> Self {
                v.code()
            }
        }
    };
}

mod bytes;
pub mod call_header;
pub mod mlx5;
pub mod roce;
pub mod segment;
mod types;
pub mod verbs;

pub use call_header::{CallHeader, CallHeaderRepr};
pub use types::{Lkey, Psn, Qpn, RemoteAddr, Rkey, Sge};
pub use verbs::{
    Completion, InlineData, Payload, SendFlags, WcOpcode, WcStatus, WorkRequest, WrOpcode,
    MAX_INLINE, MAX_MESSAGE,
};

/// Why a wire format could not be parsed or emitted, or a work request not
/// formed.
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
    /// A well-formed value this crate does not handle (an opcode without a
    /// layout here, IP options, a newer header version).
    Unsupported,
    /// A checksum (IPv4 header checksum, RoCEv2 ICRC) does not match.
    Checksum,
    /// A write would land outside the memory the receiver advertised:
    /// `offset + len > capacity`. Nothing was formatted.
    RemoteOverrun {
        /// Byte offset of the write in the remote region.
        offset: u64,
        /// Bytes to write.
        len: u64,
        /// Bytes the receiver registered and advertised.
        capacity: u64,
    },
    /// The slice does not fit its FIFO slots: more bytes than its slots
    /// hold, or slots running past the end of the FIFO.
    SliceOverflow {
        /// Bytes of the slice.
        len: u64,
        /// Bytes its slots hold before the end of the FIFO.
        room: u64,
    },
    /// An `Exec` without a send span was given to the send path.
    NoSendSpan,
}

impl core::fmt::Display for Error {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match *self {
            Error::Truncated => f.write_str("buffer too short"),
            Error::Malformed => f.write_str("malformed field"),
            Error::Exhausted => f.write_str("buffer or capacity exhausted"),
            Error::Unsupported => f.write_str("unsupported opcode, option or version"),
            Error::Checksum => f.write_str("checksum mismatch"),
            Error::RemoteOverrun {
                offset,
                len,
                capacity,
            } => write!(
                f,
                "write of {len} B at offset {offset} exceeds the advertised {capacity} B"
            ),
            Error::SliceOverflow { len, room } => {
                write!(f, "slice of {len} B does not fit its slots ({room} B)")
            }
            Error::NoSendSpan => f.write_str("exec has no send span"),
        }
    }
}

impl core::error::Error for Error {}
