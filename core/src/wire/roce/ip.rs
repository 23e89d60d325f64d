//! The framing under RoCEv2: Ethernet II (IEEE 802.3), IPv4 (RFC 791,
//! checksum RFC 1071) and UDP (RFC 768) to port 4791.

use crate::wire::bytes;
use crate::wire::Error;

/// Bytes of an Ethernet II header.
pub const ETHERNET_HEADER_LEN: usize = 14;
/// Bytes of an IPv4 header without options.
pub const IPV4_HEADER_LEN: usize = 20;
/// Bytes of an IPv6 header.
pub const IPV6_HEADER_LEN: usize = 40;
/// Bytes of a UDP header.
pub const UDP_HEADER_LEN: usize = 8;
/// EtherType of IPv4.
pub const ETHERTYPE_IPV4: u16 = 0x0800;
/// EtherType of IPv6.
pub const ETHERTYPE_IPV6: u16 = 0x86dd;
/// IP protocol number of UDP.
pub const IP_PROTO_UDP: u8 = 17;

mod field {
    use core::ops::Range;

    // Ethernet II
    pub const DST: Range<usize> = 0..6;
    pub const SRC: Range<usize> = 6..12;
    pub const ETHERTYPE: Range<usize> = 12..14;
    // IPv4
    pub const VER_IHL: usize = 0;
    pub const DSCP_ECN: usize = 1;
    pub const LENGTH: Range<usize> = 2..4;
    pub const IDENT: Range<usize> = 4..6;
    pub const FLG_OFF: Range<usize> = 6..8;
    pub const TTL: usize = 8;
    pub const PROTOCOL: usize = 9;
    pub const CHECKSUM: Range<usize> = 10..12;
    pub const SRC_ADDR: Range<usize> = 12..16;
    pub const DST_ADDR: Range<usize> = 16..20;
    // UDP
    pub const SRC_PORT: Range<usize> = 0..2;
    pub const DST_PORT: Range<usize> = 2..4;
    pub const UDP_LEN: Range<usize> = 4..6;
    pub const UDP_CHECKSUM: Range<usize> = 6..8;
}

const DONT_FRAG: u16 = 0x4000;
const RESERVED_FLAG: u16 = 0x8000;

/// The Internet checksum (RFC 1071) of `data`: the ones' complement of the
/// ones' complement sum of its 16-bit big-endian words.
pub fn internet_checksum(data: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    for pair in data.chunks(2) {
        let hi = bytes::u8_at(pair, 0);
        let lo = bytes::u8_at(pair, 1);
        sum = sum.wrapping_add(u32::from(u16::from_be_bytes([hi, lo])));
        sum = (sum & 0xffff).wrapping_add(sum >> 16);
    }
    !(sum as u16)
}

/// A parsed Ethernet II header.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct EthernetRepr {
    /// Destination MAC.
    pub dst: [u8; 6],
    /// Source MAC.
    pub src: [u8; 6],
    /// EtherType (`0x0800` for IPv4).
    pub ethertype: u16,
}

impl EthernetRepr {
    /// Parses the header at the start of `frame`.
    pub fn parse(frame: &[u8]) -> Result<EthernetRepr, Error> {
        if frame.len() < ETHERNET_HEADER_LEN {
            return Err(Error::Truncated);
        }
        Ok(EthernetRepr {
            dst: bytes::array(frame, field::DST),
            src: bytes::array(frame, field::SRC),
            ethertype: bytes::be_u16(frame, field::ETHERTYPE),
        })
    }

    /// Bytes of the header (14).
    pub const fn buffer_len(&self) -> usize {
        ETHERNET_HEADER_LEN
    }

    /// Writes the header into the first 14 bytes of `buffer`.
    pub fn emit(&self, buffer: &mut [u8]) -> Result<(), Error> {
        let out = buffer
            .get_mut(..ETHERNET_HEADER_LEN)
            .ok_or(Error::Exhausted)?;
        bytes::put(out, field::DST, &self.dst);
        bytes::put(out, field::SRC, &self.src);
        bytes::put_be_u16(out, field::ETHERTYPE, self.ethertype);
        Ok(())
    }
}

/// A parsed IPv4 header (no options, not fragmented).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Ipv4Repr {
    /// Source address.
    pub src: [u8; 4],
    /// Destination address.
    pub dst: [u8; 4],
    /// Differentiated services code point, 0..=63.
    pub dscp: u8,
    /// ECN bits, 0..=3.
    pub ecn: u8,
    /// Identification.
    pub ident: u16,
    /// Don't-fragment flag (RoCEv2 senders set it).
    pub dont_frag: bool,
    /// Time to live.
    pub ttl: u8,
    /// Protocol (17: UDP).
    pub protocol: u8,
    /// Bytes after the header.
    pub payload_len: u16,
}

impl Ipv4Repr {
    /// Parses the header at the start of `packet`, checking version,
    /// length, fragmentation and the header checksum. Bytes beyond the
    /// total length (Ethernet padding) are ignored.
    pub fn parse(packet: &[u8]) -> Result<Ipv4Repr, Error> {
        if packet.len() < IPV4_HEADER_LEN {
            return Err(Error::Truncated);
        }
        let ver_ihl = bytes::u8_at(packet, field::VER_IHL);
        if ver_ihl >> 4 != 4 {
            return Err(Error::Malformed);
        }
        if ver_ihl & 0x0f != 5 {
            return Err(Error::Unsupported);
        }
        let total = usize::from(bytes::be_u16(packet, field::LENGTH));
        if total < IPV4_HEADER_LEN {
            return Err(Error::Malformed);
        }
        if total > packet.len() {
            return Err(Error::Truncated);
        }
        let flg_off = bytes::be_u16(packet, field::FLG_OFF);
        if flg_off & RESERVED_FLAG != 0 {
            return Err(Error::Malformed);
        }
        if flg_off & !DONT_FRAG != 0 {
            return Err(Error::Unsupported);
        }
        let header = packet.get(..IPV4_HEADER_LEN).ok_or(Error::Truncated)?;
        if internet_checksum(header) != 0 {
            return Err(Error::Checksum);
        }
        let dscp_ecn = bytes::u8_at(packet, field::DSCP_ECN);
        Ok(Ipv4Repr {
            src: bytes::array(packet, field::SRC_ADDR),
            dst: bytes::array(packet, field::DST_ADDR),
            dscp: dscp_ecn >> 2,
            ecn: dscp_ecn & 3,
            ident: bytes::be_u16(packet, field::IDENT),
            dont_frag: flg_off & DONT_FRAG != 0,
            ttl: bytes::u8_at(packet, field::TTL),
            protocol: bytes::u8_at(packet, field::PROTOCOL),
            payload_len: total.saturating_sub(IPV4_HEADER_LEN) as u16,
        })
    }

    /// Bytes of the header (20).
    pub const fn buffer_len(&self) -> usize {
        IPV4_HEADER_LEN
    }

    /// Writes the header, checksum included, into the first 20 bytes of
    /// `buffer`.
    pub fn emit(&self, buffer: &mut [u8]) -> Result<(), Error> {
        if self.dscp > 63 || self.ecn > 3 {
            return Err(Error::Malformed);
        }
        let total = self
            .payload_len
            .checked_add(IPV4_HEADER_LEN as u16)
            .ok_or(Error::Malformed)?;
        let out = buffer.get_mut(..IPV4_HEADER_LEN).ok_or(Error::Exhausted)?;
        bytes::put_u8(out, field::VER_IHL, 0x45);
        bytes::put_u8(out, field::DSCP_ECN, (self.dscp << 2) | self.ecn);
        bytes::put_be_u16(out, field::LENGTH, total);
        bytes::put_be_u16(out, field::IDENT, self.ident);
        let flags = if self.dont_frag { DONT_FRAG } else { 0 };
        bytes::put_be_u16(out, field::FLG_OFF, flags);
        bytes::put_u8(out, field::TTL, self.ttl);
        bytes::put_u8(out, field::PROTOCOL, self.protocol);
        bytes::put_be_u16(out, field::CHECKSUM, 0);
        bytes::put(out, field::SRC_ADDR, &self.src);
        bytes::put(out, field::DST_ADDR, &self.dst);
        let sum = internet_checksum(out);
        bytes::put_be_u16(out, field::CHECKSUM, sum);
        Ok(())
    }
}

/// A parsed UDP header. The checksum is not kept: RoCEv2 senders commonly
/// send 0 ("no checksum"), the ICRC masks it, and [`emit`](Self::emit)
/// writes 0.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct UdpRepr {
    /// Source port (RoCEv2: flow entropy).
    pub src_port: u16,
    /// Destination port ([`ROCE_V2_PORT`](super::ROCE_V2_PORT)).
    pub dst_port: u16,
    /// Bytes after the header.
    pub payload_len: u16,
}

impl UdpRepr {
    /// Parses the header at the start of `datagram` (the IP payload).
    pub fn parse(datagram: &[u8]) -> Result<UdpRepr, Error> {
        if datagram.len() < UDP_HEADER_LEN {
            return Err(Error::Truncated);
        }
        let len = usize::from(bytes::be_u16(datagram, field::UDP_LEN));
        if len < UDP_HEADER_LEN {
            return Err(Error::Malformed);
        }
        if len > datagram.len() {
            return Err(Error::Truncated);
        }
        Ok(UdpRepr {
            src_port: bytes::be_u16(datagram, field::SRC_PORT),
            dst_port: bytes::be_u16(datagram, field::DST_PORT),
            payload_len: len.saturating_sub(UDP_HEADER_LEN) as u16,
        })
    }

    /// Bytes of the header (8).
    pub const fn buffer_len(&self) -> usize {
        UDP_HEADER_LEN
    }

    /// Writes the header (checksum 0) into the first 8 bytes of `buffer`.
    pub fn emit(&self, buffer: &mut [u8]) -> Result<(), Error> {
        let len = self
            .payload_len
            .checked_add(UDP_HEADER_LEN as u16)
            .ok_or(Error::Malformed)?;
        let out = buffer.get_mut(..UDP_HEADER_LEN).ok_or(Error::Exhausted)?;
        bytes::put_be_u16(out, field::SRC_PORT, self.src_port);
        bytes::put_be_u16(out, field::DST_PORT, self.dst_port);
        bytes::put_be_u16(out, field::UDP_LEN, len);
        bytes::put_be_u16(out, field::UDP_CHECKSUM, 0);
        Ok(())
    }
}
