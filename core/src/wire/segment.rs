//! Segmentation of a message into packets, and the responder's PSN check.
//!
//! An RDMA WRITE of `L` bytes at path MTU `m` travels as
//! `max(1, ceil(L / m))` packets with consecutive PSNs (mod 2^24): one
//! `WRITE Only` (`Only with Immediate`), or `WRITE First`, `Middle`…,
//! `Last` (`Last with Immediate`) — IBTA vol. 1 §9.4 / §9.5. The RETH
//! (address, rkey, whole length) rides on the first packet only, the
//! immediate on the last only, and the last asks for an acknowledgement.
//! A zero-length write is one `Only` packet. SEND is cut the same way,
//! without a RETH.
//!
//! [`PsnChecker`] is the responder's side: it accepts the expected PSN,
//! tells duplicates (behind, within half the PSN space) from gaps (ahead),
//! and NAKs a gap once until the expected packet comes — what a go-back-N
//! responder needs (IBTA vol. 1 §9.7.5).

use core::iter::FusedIterator;

use super::roce::bth::{BthRepr, Opcode};
use super::roce::ext::RethRepr;
use super::roce::packet::pad_for;
use super::types::{Psn, Qpn, RemoteAddr};
use super::verbs::MAX_MESSAGE;
use super::Error;

/// Path MTU (`enum ibv_mtu`, rdma-core `verbs.h`): payload bytes per
/// packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum PathMtu {
    /// `IBV_MTU_256 = 1`
    Mtu256,
    /// `IBV_MTU_512 = 2`
    Mtu512,
    /// `IBV_MTU_1024 = 3`
    Mtu1024,
    /// `IBV_MTU_2048 = 4`
    Mtu2048,
    /// `IBV_MTU_4096 = 5`
    Mtu4096,
}

impl PathMtu {
    /// All MTUs, smallest first.
    pub const ALL: [PathMtu; 5] = [
        PathMtu::Mtu256,
        PathMtu::Mtu512,
        PathMtu::Mtu1024,
        PathMtu::Mtu2048,
        PathMtu::Mtu4096,
    ];

    /// Payload bytes per packet.
    pub const fn bytes(self) -> u32 {
        match self {
            PathMtu::Mtu256 => 256,
            PathMtu::Mtu512 => 512,
            PathMtu::Mtu1024 => 1024,
            PathMtu::Mtu2048 => 2048,
            PathMtu::Mtu4096 => 4096,
        }
    }

    /// The `ibv_mtu` code.
    pub const fn ibv(self) -> u32 {
        match self {
            PathMtu::Mtu256 => 1,
            PathMtu::Mtu512 => 2,
            PathMtu::Mtu1024 => 3,
            PathMtu::Mtu2048 => 4,
            PathMtu::Mtu4096 => 5,
        }
    }

    /// The MTU of an `ibv_mtu` code.
    pub const fn from_ibv(code: u32) -> Option<PathMtu> {
        Some(match code {
            1 => PathMtu::Mtu256,
            2 => PathMtu::Mtu512,
            3 => PathMtu::Mtu1024,
            4 => PathMtu::Mtu2048,
            5 => PathMtu::Mtu4096,
            _ => return None,
        })
    }
}

/// One packet of a segmented message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct PacketDesc {
    /// First, Middle, Last(+Imm) or Only(+Imm).
    pub opcode: Opcode,
    /// Its PSN.
    pub psn: Psn,
    /// Byte offset of its payload in the message.
    pub offset: u32,
    /// Payload bytes.
    pub len: u32,
    /// RETH, on a write's first (or only) packet.
    pub reth: Option<RethRepr>,
    /// Immediate, on the last (or only) packet of a `*_WITH_IMM`.
    pub imm: Option<u32>,
    /// Acknowledge request: set on the last packet.
    pub ack_req: bool,
    /// Solicited event: set on the last packet when asked for.
    pub solicited: bool,
}

impl PacketDesc {
    /// The packet's BTH for queue pair `dest_qpn` in partition `pkey`.
    pub fn bth(&self, dest_qpn: Qpn, pkey: u16) -> BthRepr {
        BthRepr {
            opcode: self.opcode,
            solicited: self.solicited,
            migreq: false,
            pad_count: pad_for(self.len as usize),
            tver: 0,
            pkey,
            fecn: false,
            becn: false,
            dest_qpn,
            ack_req: self.ack_req,
            psn: self.psn,
        }
    }

    /// Whether this is the message's last packet.
    pub fn is_last(&self) -> bool {
        self.opcode.ends_message()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Write(RemoteAddr),
    Send,
}

/// The packets of one message, in order (an iterator; no allocation).
#[derive(Clone, Debug)]
pub struct Segmenter {
    kind: Kind,
    len: u32,
    mtu: u32,
    first_psn: Psn,
    imm: Option<u32>,
    solicited: bool,
    packets: u32,
    next: u32,
}

impl Segmenter {
    /// The packets of an RDMA WRITE (WITH_IMM when `imm` is `Some`) of
    /// `len` bytes to `remote`, starting at `first_psn`.
    pub fn write(
        remote: RemoteAddr,
        len: u32,
        mtu: PathMtu,
        first_psn: Psn,
        imm: Option<u32>,
    ) -> Result<Segmenter, Error> {
        Self::new(Kind::Write(remote), len, mtu, first_psn, imm)
    }

    /// The packets of a SEND (WITH_IMM when `imm` is `Some`) of `len`
    /// bytes, starting at `first_psn`.
    pub fn send(
        len: u32,
        mtu: PathMtu,
        first_psn: Psn,
        imm: Option<u32>,
    ) -> Result<Segmenter, Error> {
        Self::new(Kind::Send, len, mtu, first_psn, imm)
    }

    fn new(
        kind: Kind,
        len: u32,
        mtu: PathMtu,
        first_psn: Psn,
        imm: Option<u32>,
    ) -> Result<Segmenter, Error> {
        if len > MAX_MESSAGE {
            return Err(Error::Malformed);
        }
        let m = mtu.bytes();
        let packets = len.div_ceil(m).max(1);
        Ok(Segmenter {
            kind,
            len,
            mtu: m,
            first_psn,
            imm,
            solicited: false,
            packets,
            next: 0,
        })
    }

    /// Sets the solicited-event bit on the last packet.
    #[must_use]
    pub fn solicited(mut self, solicited: bool) -> Self {
        self.solicited = solicited;
        self
    }

    /// Number of packets of the message.
    pub fn packets(&self) -> u32 {
        self.packets
    }

    /// The PSN after the message's last packet.
    pub fn next_psn(&self) -> Psn {
        self.first_psn.add(self.packets)
    }

    /// Packet `i` of the message (`0..packets()`), wherever the iterator
    /// stands: what a go-back-N requester resends from a NAK's PSN.
    pub fn packet(&self, i: u32) -> Option<PacketDesc> {
        if i >= self.packets {
            return None;
        }
        let offset = i.saturating_mul(self.mtu);
        let len = self.len.saturating_sub(offset).min(self.mtu);
        let first = i == 0;
        let last = i.saturating_add(1) == self.packets;
        let reth = match self.kind {
            Kind::Write(r) if first => Some(RethRepr {
                va: r.addr,
                rkey: r.rkey,
                dma_len: self.len,
            }),
            _ => None,
        };
        Some(PacketDesc {
            opcode: self.opcode(i),
            psn: self.first_psn.add(i),
            offset,
            len,
            reth,
            imm: if last { self.imm } else { None },
            ack_req: last,
            solicited: last && self.solicited,
        })
    }

    /// The packet with PSN `psn`, if it belongs to the message.
    pub fn packet_at(&self, psn: Psn) -> Option<PacketDesc> {
        self.packet(self.first_psn.distance_to(psn))
    }

    fn opcode(&self, i: u32) -> Opcode {
        let imm = self.imm.is_some();
        let first = i == 0;
        let last = i.saturating_add(1) == self.packets;
        match (self.kind, first, last, imm) {
            (Kind::Write(_), true, true, false) => Opcode::WriteOnly,
            (Kind::Write(_), true, true, true) => Opcode::WriteOnlyWithImm,
            (Kind::Write(_), true, false, _) => Opcode::WriteFirst,
            (Kind::Write(_), false, false, _) => Opcode::WriteMiddle,
            (Kind::Write(_), false, true, false) => Opcode::WriteLast,
            (Kind::Write(_), false, true, true) => Opcode::WriteLastWithImm,
            (Kind::Send, true, true, false) => Opcode::SendOnly,
            (Kind::Send, true, true, true) => Opcode::SendOnlyWithImm,
            (Kind::Send, true, false, _) => Opcode::SendFirst,
            (Kind::Send, false, false, _) => Opcode::SendMiddle,
            (Kind::Send, false, true, false) => Opcode::SendLast,
            (Kind::Send, false, true, true) => Opcode::SendLastWithImm,
        }
    }
}

impl Iterator for Segmenter {
    type Item = PacketDesc;

    fn next(&mut self) -> Option<PacketDesc> {
        let d = self.packet(self.next)?;
        self.next = self.next.saturating_add(1);
        Some(d)
    }

    fn nth(&mut self, n: usize) -> Option<PacketDesc> {
        let skip = u32::try_from(n).unwrap_or(u32::MAX);
        self.next = self.next.saturating_add(skip).min(self.packets);
        self.next()
    }

    fn last(self) -> Option<PacketDesc> {
        if self.next < self.packets {
            self.packet(self.packets.saturating_sub(1))
        } else {
            None
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.packets.saturating_sub(self.next) as usize;
        (n, Some(n))
    }
}

impl ExactSizeIterator for Segmenter {}
impl FusedIterator for Segmenter {}

/// Where a PSN stands against the one a responder expects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum PsnClass {
    /// The expected PSN.
    Expected,
    /// Already received: 1..=2^23 behind the expected PSN.
    Duplicate,
    /// Ahead of the expected PSN (1..2^23): packets were lost.
    OutOfSequence,
}

/// What a go-back-N responder does with a packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum PsnVerdict {
    /// Process it; the expected PSN moved on.
    Accept,
    /// A retransmission of a packet already processed: do not process it
    /// again, but acknowledge (IBTA: re-ACK duplicates).
    Duplicate,
    /// The first packet past a gap: send a NAK (PSN sequence error)
    /// carrying `expected`, drop the packet.
    Nak {
        /// The PSN the responder waits for.
        expected: Psn,
    },
    /// Another packet past the same gap: a NAK is already out; drop it.
    Drop,
}

/// The responder's PSN state for one queue pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct PsnChecker {
    expected: Psn,
    nak_sent: bool,
}

impl PsnChecker {
    /// A checker expecting `first` (the QP's `rq_psn`).
    pub const fn new(first: Psn) -> PsnChecker {
        PsnChecker {
            expected: first,
            nak_sent: false,
        }
    }

    /// The PSN expected next.
    pub const fn expected(&self) -> Psn {
        self.expected
    }

    /// Classifies `psn` without changing state.
    pub const fn classify(&self, psn: Psn) -> PsnClass {
        let d = self.expected.distance_to(psn);
        if d == 0 {
            PsnClass::Expected
        } else if d < Psn::HALF {
            PsnClass::OutOfSequence
        } else {
            PsnClass::Duplicate
        }
    }

    /// Handles a packet with `psn`: accepts and advances on the expected
    /// PSN, reports duplicates, NAKs the first packet past a gap and drops
    /// the rest until the expected one arrives.
    pub fn receive(&mut self, psn: Psn) -> PsnVerdict {
        match self.classify(psn) {
            PsnClass::Expected => {
                self.expected = self.expected.next();
                self.nak_sent = false;
                PsnVerdict::Accept
            }
            PsnClass::Duplicate => PsnVerdict::Duplicate,
            PsnClass::OutOfSequence if self.nak_sent => PsnVerdict::Drop,
            PsnClass::OutOfSequence => {
                self.nak_sent = true;
                PsnVerdict::Nak {
                    expected: self.expected,
                }
            }
        }
    }
}
