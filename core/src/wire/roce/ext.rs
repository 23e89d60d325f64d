//! Extended transport headers (IBTA vol. 1 §9.3): RETH (§9.3.3), AETH
//! (§9.3.5) and ImmDt (§9.3.7). Layouts as in Linux
//! `drivers/infiniband/sw/rxe/rxe_hdr.h` (`struct rxe_reth`,
//! `struct rxe_aeth`, `struct rxe_immdt`).

use crate::wire::bytes;
use crate::wire::types::{Rkey, MASK_24};
use crate::wire::Error;

mod field {
    use core::ops::Range;

    // RETH
    pub const VA: Range<usize> = 0..8;
    pub const RKEY: Range<usize> = 8..12;
    pub const DMA_LEN: Range<usize> = 12..16;
    // AETH
    pub const SYNDROME: usize = 0;
    pub const SMSN: Range<usize> = 0..4;
    // ImmDt
    pub const IMM: Range<usize> = 0..4;
}

/// Bytes of a RETH.
pub const RETH_LEN: usize = 16;
/// Bytes of an AETH.
pub const AETH_LEN: usize = 4;
/// Bytes of an ImmDt.
pub const IMMDT_LEN: usize = 4;

macro_rules! view {
    ($(#[$doc:meta])* $name:ident, $len:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone)]
        pub struct $name<T: AsRef<[u8]>> {
            buffer: T,
        }

        impl<T: AsRef<[u8]>> $name<T> {
            /// A view without checks; accessors read zeros beyond the buffer.
            pub const fn new_unchecked(buffer: T) -> Self {
                Self { buffer }
            }

            /// A view, checked to hold the header.
            pub fn new_checked(buffer: T) -> Result<Self, Error> {
                let v = Self::new_unchecked(buffer);
                v.check_len()?;
                Ok(v)
            }

            /// Whether the buffer holds the header.
            pub fn check_len(&self) -> Result<(), Error> {
                if self.buffer.as_ref().len() < $len {
                    Err(Error::Truncated)
                } else {
                    Ok(())
                }
            }

            /// The underlying buffer.
            pub fn into_inner(self) -> T {
                self.buffer
            }

            /// What follows the header.
            pub fn payload(&self) -> &[u8] {
                self.buffer.as_ref().get($len..).unwrap_or(&[])
            }
        }
    };
}

view!(
    /// A view of an RDMA extended transport header.
    Reth,
    RETH_LEN
);
view!(
    /// A view of an ACK extended transport header.
    Aeth,
    AETH_LEN
);
view!(
    /// A view of an immediate-data header.
    ImmDt,
    IMMDT_LEN
);

impl<T: AsRef<[u8]>> Reth<T> {
    /// Remote virtual address.
    pub fn va(&self) -> u64 {
        bytes::be_u64(self.buffer.as_ref(), field::VA)
    }

    /// Remote key.
    pub fn rkey(&self) -> Rkey {
        Rkey(bytes::be_u32(self.buffer.as_ref(), field::RKEY))
    }

    /// Length of the whole message.
    pub fn dma_len(&self) -> u32 {
        bytes::be_u32(self.buffer.as_ref(), field::DMA_LEN)
    }
}

impl<T: AsRef<[u8]>> Aeth<T> {
    /// The syndrome byte.
    pub fn syndrome(&self) -> Syndrome {
        Syndrome::from_byte(bytes::u8_at(self.buffer.as_ref(), field::SYNDROME))
    }

    /// Message sequence number (24 bits).
    pub fn msn(&self) -> u32 {
        bytes::be_u32(self.buffer.as_ref(), field::SMSN) & MASK_24
    }
}

impl<T: AsRef<[u8]>> ImmDt<T> {
    /// The immediate (host order).
    pub fn imm(&self) -> u32 {
        bytes::be_u32(self.buffer.as_ref(), field::IMM)
    }
}

/// A parsed RETH.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct RethRepr {
    /// Remote virtual address of the message's first byte.
    pub va: u64,
    /// Remote key.
    pub rkey: Rkey,
    /// Length of the whole message in bytes.
    pub dma_len: u32,
}

impl RethRepr {
    /// Parses a RETH.
    pub fn parse<T: AsRef<[u8]>>(v: &Reth<T>) -> Result<RethRepr, Error> {
        v.check_len()?;
        Ok(RethRepr {
            va: v.va(),
            rkey: v.rkey(),
            dma_len: v.dma_len(),
        })
    }

    /// Bytes of the header (16).
    pub const fn buffer_len(&self) -> usize {
        RETH_LEN
    }

    /// Writes the header into the first 16 bytes of `buffer`.
    pub fn emit(&self, buffer: &mut [u8]) -> Result<(), Error> {
        let out = buffer.get_mut(..RETH_LEN).ok_or(Error::Exhausted)?;
        bytes::put_be_u64(out, field::VA, self.va);
        bytes::put_be_u32(out, field::RKEY, self.rkey.get());
        bytes::put_be_u32(out, field::DMA_LEN, self.dma_len);
        Ok(())
    }
}

/// A parsed ImmDt.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct ImmDtRepr {
    /// The immediate (host order; big-endian on the wire).
    pub imm: u32,
}

impl ImmDtRepr {
    /// Parses an ImmDt.
    pub fn parse<T: AsRef<[u8]>>(v: &ImmDt<T>) -> Result<ImmDtRepr, Error> {
        v.check_len()?;
        Ok(ImmDtRepr { imm: v.imm() })
    }

    /// Bytes of the header (4).
    pub const fn buffer_len(&self) -> usize {
        IMMDT_LEN
    }

    /// Writes the header into the first 4 bytes of `buffer`.
    pub fn emit(&self, buffer: &mut [u8]) -> Result<(), Error> {
        let out = buffer.get_mut(..IMMDT_LEN).ok_or(Error::Exhausted)?;
        bytes::put_be_u32(out, field::IMM, self.imm);
        Ok(())
    }
}

code_enum! {
    /// NAK codes of the AETH syndrome (IBTA vol. 1 §9.3.5; Linux
    /// `rxe_hdr.h` `AETH_NAK_*` minus `AETH_NAK`).
    pub enum NakCode: u8 {
        /// PSN sequence error: the responder saw a gap; the requester
        /// retransmits from the MSN's PSN (go-back-N).
        PsnSequenceError = 0,
        /// Invalid request.
        InvalidRequest = 1,
        /// Remote access error (bad rkey, bounds or permissions).
        RemoteAccessError = 2,
        /// Remote operational error.
        RemoteOperationalError = 3,
        /// Invalid RD request.
        InvalidRdRequest = 4,
    }
}

/// The AETH syndrome byte: bit 7 reserved, bits 6..5 the type
/// (`00` ACK, `01` RNR NAK, `10` reserved, `11` NAK), bits 4..0 a value
/// (Linux `rxe_hdr.h`: `AETH_TYPE_MASK = 0xe0`, `AETH_ACK = 0x00`,
/// `AETH_RNR_NAK = 0x20`, `AETH_NAK = 0x60`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Syndrome {
    /// ACK with the 5-bit end-to-end credit code (`0x1f`: unlimited,
    /// `AETH_ACK_UNLIMITED`).
    Ack {
        /// Credit count code, 0..=31.
        credits: u8,
    },
    /// Receiver not ready, retry after the 5-bit timer code.
    RnrNak {
        /// RNR timer code, 0..=31.
        timer: u8,
    },
    /// Negative acknowledgement.
    Nak(NakCode),
    /// A byte of the reserved type `10` or with bit 7 set, kept as is.
    Reserved(u8),
}

const SYN_TYPE: u8 = 0x60;
const SYN_VALUE: u8 = 0x1f;

impl Syndrome {
    /// Unlimited credits (`AETH_ACK_UNLIMITED`).
    pub const ACK_UNLIMITED: Syndrome = Syndrome::Ack { credits: 0x1f };

    /// Decodes a syndrome byte (total).
    pub const fn from_byte(b: u8) -> Syndrome {
        if b & 0x80 != 0 {
            return Syndrome::Reserved(b);
        }
        let v = b & SYN_VALUE;
        match b & SYN_TYPE {
            0x00 => Syndrome::Ack { credits: v },
            0x20 => Syndrome::RnrNak { timer: v },
            0x60 => Syndrome::Nak(NakCode::from_code(v)),
            _ => Syndrome::Reserved(b),
        }
    }

    /// Encodes the syndrome; `Malformed` when a value does not fit its 5
    /// bits or a `Reserved` byte would decode as another variant.
    pub const fn to_byte(self) -> Result<u8, Error> {
        let (ty, v) = match self {
            Syndrome::Ack { credits } => (0x00, credits),
            Syndrome::RnrNak { timer } => (0x20, timer),
            Syndrome::Nak(code) => (0x60, code.code()),
            Syndrome::Reserved(b) => {
                return if b & 0x80 != 0 || b & SYN_TYPE == 0x40 {
                    Ok(b)
                } else {
                    Err(Error::Malformed)
                };
            }
        };
        if v > SYN_VALUE {
            return Err(Error::Malformed);
        }
        Ok(ty | v)
    }
}

/// A parsed AETH.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct AethRepr {
    /// ACK / NAK and its value.
    pub syndrome: Syndrome,
    /// Message sequence number, 24 bits.
    pub msn: u32,
}

impl AethRepr {
    /// Parses an AETH.
    pub fn parse<T: AsRef<[u8]>>(v: &Aeth<T>) -> Result<AethRepr, Error> {
        v.check_len()?;
        Ok(AethRepr {
            syndrome: v.syndrome(),
            msn: v.msn(),
        })
    }

    /// Bytes of the header (4).
    pub const fn buffer_len(&self) -> usize {
        AETH_LEN
    }

    /// Writes the header into the first 4 bytes of `buffer`.
    pub fn emit(&self, buffer: &mut [u8]) -> Result<(), Error> {
        let syn = self.syndrome.to_byte()?;
        if self.msn > MASK_24 {
            return Err(Error::Malformed);
        }
        let out = buffer.get_mut(..AETH_LEN).ok_or(Error::Exhausted)?;
        bytes::put_be_u32(out, field::SMSN, (u32::from(syn) << 24) | self.msn);
        Ok(())
    }
}
