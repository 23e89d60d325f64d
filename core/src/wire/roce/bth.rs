//! The Base Transport Header (IBTA vol. 1 §9.2), 12 bytes:
//!
//! ```text
//! byte 0      OpCode
//! byte 1      SE(7) M(6) PadCnt(5..4) TVer(3..0)
//! bytes 2..4  P_Key
//! byte 4      FECN(7) BECN(6) Resv6a(5..0)        (RoCEv2: "resv8a")
//! bytes 5..8  DestQP (24 bits)
//! byte 8      AckReq(7) Resv7(6..0)
//! bytes 9..12 PSN (24 bits)
//! ```

use crate::wire::bytes;
use crate::wire::types::{Psn, Qpn};
use crate::wire::Error;

mod field {
    use core::ops::Range;

    pub const OPCODE: usize = 0;
    pub const FLAGS: usize = 1;
    pub const PKEY: Range<usize> = 2..4;
    pub const QPN: Range<usize> = 4..8;
    pub const APSN: Range<usize> = 8..12;
    pub const PAYLOAD: usize = 12;
}

/// Bytes of a BTH.
pub const BTH_LEN: usize = field::PAYLOAD;

const SE: u8 = 0x80;
const MIG: u8 = 0x40;
const PAD: u8 = 0x30;
const TVER: u8 = 0x0f;
const FECN: u32 = 0x8000_0000;
const BECN: u32 = 0x4000_0000;
const ACK_REQ: u32 = 0x8000_0000;

code_enum! {
    /// BTH opcodes of the reliable-connected transport (transport bits
    /// `000`, IBTA vol. 1 §9.2 Table 38; the same values as Linux's
    /// `IB_OPCODE_RC_*` in `include/rdma/ib_pack.h`), and the RoCEv2
    /// congestion notification packet.
    pub enum Opcode: u8 {
        /// `SEND First`
        SendFirst = 0x00,
        /// `SEND Middle`
        SendMiddle = 0x01,
        /// `SEND Last`
        SendLast = 0x02,
        /// `SEND Last with Immediate`
        SendLastWithImm = 0x03,
        /// `SEND Only`
        SendOnly = 0x04,
        /// `SEND Only with Immediate`
        SendOnlyWithImm = 0x05,
        /// `RDMA WRITE First`
        WriteFirst = 0x06,
        /// `RDMA WRITE Middle`
        WriteMiddle = 0x07,
        /// `RDMA WRITE Last`
        WriteLast = 0x08,
        /// `RDMA WRITE Last with Immediate`
        WriteLastWithImm = 0x09,
        /// `RDMA WRITE Only`
        WriteOnly = 0x0a,
        /// `RDMA WRITE Only with Immediate`
        WriteOnlyWithImm = 0x0b,
        /// `RDMA READ Request`
        ReadRequest = 0x0c,
        /// `RDMA READ Response First`
        ReadResponseFirst = 0x0d,
        /// `RDMA READ Response Middle`
        ReadResponseMiddle = 0x0e,
        /// `RDMA READ Response Last`
        ReadResponseLast = 0x0f,
        /// `RDMA READ Response Only`
        ReadResponseOnly = 0x10,
        /// `Acknowledge`
        Acknowledge = 0x11,
        /// `ATOMIC Acknowledge`
        AtomicAcknowledge = 0x12,
        /// `CmpSwap`
        CompareSwap = 0x13,
        /// `FetchAdd`
        FetchAdd = 0x14,
        /// `SEND Last with Invalidate`
        SendLastWithInv = 0x16,
        /// `SEND Only with Invalidate`
        SendOnlyWithInv = 0x17,
        /// RoCEv2 congestion notification packet: transport `IB_OPCODE_CNP`
        /// (0x80, "IBTA 1.3 vol 1 Table 38, A10.3.2" per Linux `ib_pack.h`)
        /// with operation 1, as ConnectX NICs send it.
        Cnp = 0x81,
    }
}

/// Which extension headers follow the BTH, and whether a payload may.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Layout {
    /// RETH (16 bytes).
    pub reth: bool,
    /// AETH (4 bytes).
    pub aeth: bool,
    /// ImmDt (4 bytes).
    pub immdt: bool,
    /// Whether the packet carries data.
    pub payload: bool,
}

impl Opcode {
    /// The headers that follow the BTH (IBTA vol. 1 §9.2 / Linux
    /// `rxe_opcode.c`), for the opcodes the packet builder handles; `None`
    /// for atomics, invalidates, CNP and unknown opcodes.
    pub const fn layout(self) -> Option<Layout> {
        const fn l(reth: bool, aeth: bool, immdt: bool, payload: bool) -> Option<Layout> {
            Some(Layout {
                reth,
                aeth,
                immdt,
                payload,
            })
        }
        match self {
            Opcode::SendFirst | Opcode::SendMiddle | Opcode::SendLast | Opcode::SendOnly => {
                l(false, false, false, true)
            }
            Opcode::SendLastWithImm | Opcode::SendOnlyWithImm => l(false, false, true, true),
            Opcode::WriteFirst | Opcode::WriteOnly => l(true, false, false, true),
            Opcode::WriteMiddle | Opcode::WriteLast => l(false, false, false, true),
            Opcode::WriteLastWithImm => l(false, false, true, true),
            Opcode::WriteOnlyWithImm => l(true, false, true, true),
            Opcode::ReadRequest => l(true, false, false, false),
            Opcode::ReadResponseFirst | Opcode::ReadResponseLast | Opcode::ReadResponseOnly => {
                l(false, true, false, true)
            }
            Opcode::ReadResponseMiddle => l(false, false, false, true),
            Opcode::Acknowledge => l(false, true, false, false),
            _ => None,
        }
    }

    /// Whether the packet starts a message (First or Only).
    pub const fn starts_message(self) -> bool {
        matches!(
            self,
            Opcode::SendFirst
                | Opcode::SendOnly
                | Opcode::SendOnlyWithImm
                | Opcode::WriteFirst
                | Opcode::WriteOnly
                | Opcode::WriteOnlyWithImm
                | Opcode::ReadResponseFirst
                | Opcode::ReadResponseOnly
        )
    }

    /// Whether the packet ends a message (Last or Only).
    pub const fn ends_message(self) -> bool {
        matches!(
            self,
            Opcode::SendLast
                | Opcode::SendLastWithImm
                | Opcode::SendOnly
                | Opcode::SendOnlyWithImm
                | Opcode::WriteLast
                | Opcode::WriteLastWithImm
                | Opcode::WriteOnly
                | Opcode::WriteOnlyWithImm
                | Opcode::ReadResponseLast
                | Opcode::ReadResponseOnly
        )
    }
}

/// A read/write view of a BTH and what follows it.
#[derive(Debug, Clone)]
pub struct Bth<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Bth<T> {
    /// A view without checks; accessors read zeros beyond the buffer.
    pub const fn new_unchecked(buffer: T) -> Bth<T> {
        Bth { buffer }
    }

    /// A view, checked to hold the 12-byte header.
    pub fn new_checked(buffer: T) -> Result<Bth<T>, Error> {
        let b = Bth::new_unchecked(buffer);
        b.check_len()?;
        Ok(b)
    }

    /// See [`Bth::new_checked`].
    pub fn check_len(&self) -> Result<(), Error> {
        if self.buffer.as_ref().len() < BTH_LEN {
            Err(Error::Truncated)
        } else {
            Ok(())
        }
    }

    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn d(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// OpCode.
    pub fn opcode(&self) -> Opcode {
        Opcode::from_code(bytes::u8_at(self.d(), field::OPCODE))
    }

    /// Solicited event.
    pub fn solicited(&self) -> bool {
        bytes::u8_at(self.d(), field::FLAGS) & SE != 0
    }

    /// MigReq.
    pub fn migreq(&self) -> bool {
        bytes::u8_at(self.d(), field::FLAGS) & MIG != 0
    }

    /// Pad count: bytes (0..=3) after the payload that make it a multiple
    /// of 4.
    pub fn pad_count(&self) -> u8 {
        (bytes::u8_at(self.d(), field::FLAGS) & PAD) >> 4
    }

    /// Transport header version (0).
    pub fn tver(&self) -> u8 {
        bytes::u8_at(self.d(), field::FLAGS) & TVER
    }

    /// Partition key.
    pub fn pkey(&self) -> u16 {
        bytes::be_u16(self.d(), field::PKEY)
    }

    /// Forward explicit congestion notification.
    pub fn fecn(&self) -> bool {
        bytes::be_u32(self.d(), field::QPN) & FECN != 0
    }

    /// Backward explicit congestion notification.
    pub fn becn(&self) -> bool {
        bytes::be_u32(self.d(), field::QPN) & BECN != 0
    }

    /// Destination queue pair.
    pub fn dest_qpn(&self) -> Qpn {
        Qpn::new(bytes::be_u32(self.d(), field::QPN))
    }

    /// Acknowledge request.
    pub fn ack_req(&self) -> bool {
        bytes::be_u32(self.d(), field::APSN) & ACK_REQ != 0
    }

    /// Packet sequence number.
    pub fn psn(&self) -> Psn {
        Psn::new(bytes::be_u32(self.d(), field::APSN))
    }

    /// What follows the header.
    pub fn payload(&self) -> &[u8] {
        self.d().get(field::PAYLOAD..).unwrap_or(&[])
    }
}

/// A parsed BTH. Reserved bits are written as zeros and ignored on parse.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct BthRepr {
    /// OpCode.
    pub opcode: Opcode,
    /// Solicited event.
    pub solicited: bool,
    /// MigReq.
    pub migreq: bool,
    /// Pad count, 0..=3.
    pub pad_count: u8,
    /// Transport version, 0..=15 (IBTA: 0).
    pub tver: u8,
    /// Partition key (`0xffff`: the default partition).
    pub pkey: u16,
    /// FECN.
    pub fecn: bool,
    /// BECN.
    pub becn: bool,
    /// Destination QP.
    pub dest_qpn: Qpn,
    /// AckReq.
    pub ack_req: bool,
    /// PSN.
    pub psn: Psn,
}

impl BthRepr {
    /// Parses a BTH.
    pub fn parse<T: AsRef<[u8]>>(bth: &Bth<T>) -> Result<BthRepr, Error> {
        bth.check_len()?;
        Ok(BthRepr {
            opcode: bth.opcode(),
            solicited: bth.solicited(),
            migreq: bth.migreq(),
            pad_count: bth.pad_count(),
            tver: bth.tver(),
            pkey: bth.pkey(),
            fecn: bth.fecn(),
            becn: bth.becn(),
            dest_qpn: bth.dest_qpn(),
            ack_req: bth.ack_req(),
            psn: bth.psn(),
        })
    }

    /// Bytes of the header (12).
    pub const fn buffer_len(&self) -> usize {
        BTH_LEN
    }

    /// Writes the header into the first 12 bytes of `buffer`.
    pub fn emit(&self, buffer: &mut [u8]) -> Result<(), Error> {
        if self.pad_count > 3 || self.tver > TVER {
            return Err(Error::Malformed);
        }
        let out = buffer.get_mut(..BTH_LEN).ok_or(Error::Exhausted)?;
        let mut flags = (self.pad_count << 4) | self.tver;
        if self.solicited {
            flags |= SE;
        }
        if self.migreq {
            flags |= MIG;
        }
        let mut qpn = self.dest_qpn.get();
        if self.fecn {
            qpn |= FECN;
        }
        if self.becn {
            qpn |= BECN;
        }
        let mut apsn = self.psn.get();
        if self.ack_req {
            apsn |= ACK_REQ;
        }
        bytes::put_u8(out, field::OPCODE, self.opcode.code());
        bytes::put_u8(out, field::FLAGS, flags);
        bytes::put_be_u16(out, field::PKEY, self.pkey);
        bytes::put_be_u32(out, field::QPN, qpn);
        bytes::put_be_u32(out, field::APSN, apsn);
        Ok(())
    }
}
