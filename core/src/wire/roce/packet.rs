//! A whole RoCEv2 packet: Ethernet, IPv4, UDP, BTH, the extension headers
//! its opcode calls for, payload, pad and ICRC.

use crate::wire::Error;

use super::bth::{Bth, BthRepr, BTH_LEN};
use super::ext::{Aeth, AethRepr, ImmDt, ImmDtRepr, Reth, RethRepr, AETH_LEN, IMMDT_LEN, RETH_LEN};
use super::icrc::{check_icrc_ipv4, fill_icrc_ipv4, ICRC_LEN};
use super::ip::{
    EthernetRepr, Ipv4Repr, UdpRepr, ETHERNET_HEADER_LEN, ETHERTYPE_IPV4, IPV4_HEADER_LEN,
    IP_PROTO_UDP, UDP_HEADER_LEN,
};
use super::ROCE_V2_PORT;

/// A parsed RoCEv2 packet over IPv4, borrowing its payload.
///
/// The lengths (`ip.payload_len`, `udp.payload_len`), the pad count
/// (`bth.pad_count`), the protocol, the UDP destination port and the
/// EtherType are determined by the rest; [`normalize`](Self::normalize)
/// fills them in, and [`emit`](Self::emit) refuses a packet whose values
/// disagree, so that `parse(emit(p)) == p` for every packet `emit`
/// accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct RocePacketRepr<'a> {
    /// Ethernet header.
    pub eth: EthernetRepr,
    /// IPv4 header.
    pub ip: Ipv4Repr,
    /// UDP header.
    pub udp: UdpRepr,
    /// Base transport header.
    pub bth: BthRepr,
    /// RETH, when the opcode has one.
    pub reth: Option<RethRepr>,
    /// AETH, when the opcode has one.
    pub aeth: Option<AethRepr>,
    /// ImmDt, when the opcode has one.
    pub imm: Option<ImmDtRepr>,
    /// The payload, without pad bytes.
    pub payload: &'a [u8],
}

/// Pad bytes after `len` payload bytes (to a multiple of 4).
pub const fn pad_for(len: usize) -> u8 {
    (len.wrapping_neg() & 3) as u8
}

impl<'a> RocePacketRepr<'a> {
    fn transport_len(&self) -> usize {
        BTH_LEN
            .saturating_add(if self.reth.is_some() { RETH_LEN } else { 0 })
            .saturating_add(if self.aeth.is_some() { AETH_LEN } else { 0 })
            .saturating_add(if self.imm.is_some() { IMMDT_LEN } else { 0 })
            .saturating_add(self.payload.len())
            .saturating_add(usize::from(pad_for(self.payload.len())))
            .saturating_add(ICRC_LEN)
    }

    /// Sets the derived fields: lengths, pad count, protocol (UDP), UDP
    /// destination port (4791) and EtherType (IPv4). Lengths saturate;
    /// `emit` then reports an oversized packet.
    #[must_use]
    pub fn normalize(mut self) -> Self {
        let udp_payload = self.transport_len();
        self.udp.payload_len = u16::try_from(udp_payload).unwrap_or(u16::MAX);
        self.udp.dst_port = ROCE_V2_PORT;
        self.ip.payload_len =
            u16::try_from(udp_payload.saturating_add(UDP_HEADER_LEN)).unwrap_or(u16::MAX);
        self.ip.protocol = IP_PROTO_UDP;
        self.eth.ethertype = ETHERTYPE_IPV4;
        self.bth.pad_count = pad_for(self.payload.len());
        self
    }

    /// Bytes of the frame, Ethernet header to ICRC.
    pub fn buffer_len(&self) -> usize {
        ETHERNET_HEADER_LEN
            .saturating_add(IPV4_HEADER_LEN)
            .saturating_add(UDP_HEADER_LEN)
            .saturating_add(self.transport_len())
    }

    fn check(&self) -> Result<(), Error> {
        let layout = self.bth.opcode.layout().ok_or(Error::Unsupported)?;
        if layout.reth != self.reth.is_some()
            || layout.aeth != self.aeth.is_some()
            || layout.immdt != self.imm.is_some()
            || (!layout.payload && !self.payload.is_empty())
        {
            return Err(Error::Malformed);
        }
        if self != &self.normalize() {
            return Err(Error::Malformed);
        }
        let udp_payload = self.transport_len();
        if udp_payload.saturating_add(UDP_HEADER_LEN + IPV4_HEADER_LEN) > usize::from(u16::MAX) {
            return Err(Error::Exhausted);
        }
        Ok(())
    }

    /// Writes the frame into `buffer` (at least [`buffer_len`] bytes),
    /// computing the IPv4 checksum and the ICRC. Returns the bytes written.
    ///
    /// [`buffer_len`]: Self::buffer_len
    pub fn emit(&self, buffer: &mut [u8]) -> Result<usize, Error> {
        self.check()?;
        let total = self.buffer_len();
        let frame = buffer.get_mut(..total).ok_or(Error::Exhausted)?;
        self.eth.emit(frame)?;
        let ip = frame
            .get_mut(ETHERNET_HEADER_LEN..)
            .ok_or(Error::Exhausted)?;
        self.ip.emit(ip)?;
        let mut at = IPV4_HEADER_LEN;
        self.udp.emit(tail(ip, at)?)?;
        at = at.saturating_add(UDP_HEADER_LEN);
        self.bth.emit(tail(ip, at)?)?;
        at = at.saturating_add(BTH_LEN);
        if let Some(r) = &self.reth {
            r.emit(tail(ip, at)?)?;
            at = at.saturating_add(RETH_LEN);
        }
        if let Some(a) = &self.aeth {
            a.emit(tail(ip, at)?)?;
            at = at.saturating_add(AETH_LEN);
        }
        if let Some(i) = &self.imm {
            i.emit(tail(ip, at)?)?;
            at = at.saturating_add(IMMDT_LEN);
        }
        let end = at.checked_add(self.payload.len()).ok_or(Error::Exhausted)?;
        ip.get_mut(at..end)
            .ok_or(Error::Exhausted)?
            .copy_from_slice(self.payload);
        let pad_end = end.saturating_add(usize::from(pad_for(self.payload.len())));
        ip.get_mut(end..pad_end).ok_or(Error::Exhausted)?.fill(0);
        fill_icrc_ipv4(ip)?;
        Ok(total)
    }

    /// Parses an Ethernet frame holding a RoCEv2 packet over IPv4,
    /// checking the IPv4 checksum and the ICRC. Bytes after the IP total
    /// length (Ethernet padding) are ignored.
    pub fn parse(frame: &'a [u8]) -> Result<RocePacketRepr<'a>, Error> {
        let eth = EthernetRepr::parse(frame)?;
        if eth.ethertype != ETHERTYPE_IPV4 {
            return Err(Error::Unsupported);
        }
        let ip_bytes = frame.get(ETHERNET_HEADER_LEN..).ok_or(Error::Truncated)?;
        let ip = Ipv4Repr::parse(ip_bytes)?;
        if ip.protocol != IP_PROTO_UDP {
            return Err(Error::Unsupported);
        }
        let ip_end = IPV4_HEADER_LEN.saturating_add(usize::from(ip.payload_len));
        let packet = ip_bytes.get(..ip_end).ok_or(Error::Truncated)?;
        let datagram = packet.get(IPV4_HEADER_LEN..).ok_or(Error::Truncated)?;
        let udp = UdpRepr::parse(datagram)?;
        if udp.dst_port != ROCE_V2_PORT {
            return Err(Error::Unsupported);
        }
        if usize::from(udp.payload_len).saturating_add(UDP_HEADER_LEN) != datagram.len() {
            return Err(Error::Malformed);
        }
        let transport = datagram.get(UDP_HEADER_LEN..).ok_or(Error::Truncated)?;
        let bth = BthRepr::parse(&Bth::new_checked(transport)?)?;
        let layout = bth.opcode.layout().ok_or(Error::Unsupported)?;
        let body_end = transport
            .len()
            .checked_sub(ICRC_LEN)
            .ok_or(Error::Truncated)?;
        let body = transport.get(..body_end).ok_or(Error::Truncated)?;
        let mut rest = body.get(BTH_LEN..).ok_or(Error::Truncated)?;
        let reth = if layout.reth {
            let v = Reth::new_checked(rest)?;
            rest = rest.get(RETH_LEN..).unwrap_or(&[]);
            Some(RethRepr::parse(&v)?)
        } else {
            None
        };
        let aeth = if layout.aeth {
            let v = Aeth::new_checked(rest)?;
            rest = rest.get(AETH_LEN..).unwrap_or(&[]);
            Some(AethRepr::parse(&v)?)
        } else {
            None
        };
        let imm = if layout.immdt {
            let v = ImmDt::new_checked(rest)?;
            rest = rest.get(IMMDT_LEN..).unwrap_or(&[]);
            Some(ImmDtRepr::parse(&v)?)
        } else {
            None
        };
        let pad = usize::from(bth.pad_count);
        let payload_len = rest.len().checked_sub(pad).ok_or(Error::Malformed)?;
        if pad_for(payload_len) != bth.pad_count || (!layout.payload && payload_len != 0) {
            return Err(Error::Malformed);
        }
        let payload = rest.get(..payload_len).ok_or(Error::Malformed)?;
        check_icrc_ipv4(packet)?;
        Ok(RocePacketRepr {
            eth,
            ip,
            udp,
            bth,
            reth,
            aeth,
            imm,
            payload,
        })
    }
}

fn tail(buf: &mut [u8], at: usize) -> Result<&mut [u8], Error> {
    buf.get_mut(at..).ok_or(Error::Exhausted)
}
