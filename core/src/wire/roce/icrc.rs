//! The invariant CRC of a RoCEv2 packet (IBTA vol. 1 Annex A17, "ICRC").
//!
//! The ICRC is the CRC-32 of Ethernet (IEEE 802.3: reflected polynomial
//! `0xEDB88320`, initial value and final XOR `0xFFFFFFFF`) over
//!
//! 1. eight bytes of `0xFF`, standing in for InfiniBand's masked LRH;
//! 2. the IP header with the fields routers change masked to ones —
//!    IPv4: ToS (DSCP + ECN), TTL and header checksum; IPv6: traffic class,
//!    flow label and hop limit;
//! 3. the UDP header with its checksum masked to ones;
//! 4. the BTH with its byte 4 (FECN, BECN, reserved: "resv8a") masked to
//!    ones;
//! 5. the rest of the transport headers, the payload and its pad bytes.
//!
//! It follows the packet as a 32-bit value in little-endian byte order:
//! Linux's Soft-RoCE stores the CPU-order value (`rxe_icrc_generate` in
//! `drivers/infiniband/sw/rxe/rxe_icrc.c`, whose CRC seed `0xdebb20e3` is
//! the CRC state after the eight `0xFF` bytes), and ConnectX captures agree
//! (see the fixtures in `core/tests/wire_icrc.rs`).

use crate::wire::Error;

use super::bth::BTH_LEN;
use super::ip::{IPV4_HEADER_LEN, IPV6_HEADER_LEN, UDP_HEADER_LEN};

/// Bytes of the ICRC trailer.
pub const ICRC_LEN: usize = 4;

/// An incremental CRC-32 (IEEE 802.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Crc32 {
    state: u32,
}

impl Default for Crc32 {
    fn default() -> Self {
        Crc32::new()
    }
}

impl Crc32 {
    /// A fresh CRC (state `0xFFFFFFFF`).
    pub const fn new() -> Crc32 {
        Crc32 { state: !0 }
    }

    /// The raw register (no final XOR), as Linux's `crc32_le` keeps it.
    pub const fn state(&self) -> u32 {
        self.state
    }

    /// Feeds `data`.
    pub fn update(&mut self, data: &[u8]) {
        // crc32fast continues from a finished CRC: the register inverted.
        let mut h = crc32fast::Hasher::new_with_initial(!self.state);
        h.update(data);
        self.state = !h.finalize();
    }

    /// The CRC of everything fed so far.
    pub const fn finish(&self) -> u32 {
        !self.state
    }
}

/// The CRC-32 of `data`.
pub fn crc32(data: &[u8]) -> u32 {
    let mut c = Crc32::new();
    c.update(data);
    c.finish()
}

const LRH_MASK: [u8; 8] = [0xff; 8];

/// The ICRC of a RoCEv2 packet over IPv4. `packet` starts at the IPv4
/// header (20 bytes, no options) and ends with the 4-byte ICRC field,
/// whose content is ignored.
pub fn icrc_ipv4(packet: &[u8]) -> Result<u32, Error> {
    const HDR: usize = IPV4_HEADER_LEN + UDP_HEADER_LEN + BTH_LEN;
    let (head, rest) = split(packet, HDR)?;
    if head.first().map(|b| b & 0x0f) != Some(5) {
        return Err(Error::Unsupported);
    }
    let mut masked: [u8; HDR] = head.try_into().map_err(|_| Error::Truncated)?;
    for i in [1usize, 8, 10, 11, IPV4_HEADER_LEN + 6, IPV4_HEADER_LEN + 7] {
        if let Some(b) = masked.get_mut(i) {
            *b = 0xff; // ToS, TTL, header checksum, UDP checksum
        }
    }
    Ok(finish(&mut masked, IPV4_HEADER_LEN + UDP_HEADER_LEN, rest))
}

/// The ICRC of a RoCEv2 packet over IPv6. `packet` starts at the IPv6
/// header (40 bytes, UDP next) and ends with the 4-byte ICRC field.
pub fn icrc_ipv6(packet: &[u8]) -> Result<u32, Error> {
    const HDR: usize = IPV6_HEADER_LEN + UDP_HEADER_LEN + BTH_LEN;
    let (head, rest) = split(packet, HDR)?;
    let mut masked: [u8; HDR] = head.try_into().map_err(|_| Error::Truncated)?;
    if let Some(b) = masked.get_mut(0) {
        *b |= 0x0f; // traffic class, high nibble
    }
    for i in [1usize, 2, 3, 7, IPV6_HEADER_LEN + 6, IPV6_HEADER_LEN + 7] {
        if let Some(b) = masked.get_mut(i) {
            *b = 0xff; // traffic class, flow label, hop limit, UDP checksum
        }
    }
    Ok(finish(&mut masked, IPV6_HEADER_LEN + UDP_HEADER_LEN, rest))
}

/// Splits `packet` into the first `hdr` bytes and what follows up to the
/// ICRC field.
fn split(packet: &[u8], hdr: usize) -> Result<(&[u8], &[u8]), Error> {
    let body = packet
        .len()
        .checked_sub(ICRC_LEN)
        .and_then(|end| packet.get(..end))
        .ok_or(Error::Truncated)?;
    let head = body.get(..hdr).ok_or(Error::Truncated)?;
    let rest = body.get(hdr..).unwrap_or(&[]);
    Ok((head, rest))
}

fn finish(masked: &mut [u8], bth_at: usize, rest: &[u8]) -> u32 {
    if let Some(b) = masked.get_mut(bth_at.saturating_add(4)) {
        *b = 0xff; // FECN, BECN, resv6a
    }
    let mut c = Crc32::new();
    c.update(&LRH_MASK);
    c.update(masked);
    c.update(rest);
    c.finish()
}

/// The ICRC field as it is in `packet` (the last 4 bytes, little-endian).
pub fn icrc_field(packet: &[u8]) -> Result<u32, Error> {
    let at = packet.len().checked_sub(ICRC_LEN).ok_or(Error::Truncated)?;
    let b = packet.get(at..).ok_or(Error::Truncated)?;
    let arr: [u8; ICRC_LEN] = b.try_into().map_err(|_| Error::Truncated)?;
    Ok(u32::from_le_bytes(arr))
}

/// Computes the ICRC of an IPv4 RoCEv2 packet and writes it into its last
/// 4 bytes.
pub fn fill_icrc_ipv4(packet: &mut [u8]) -> Result<(), Error> {
    let icrc = icrc_ipv4(packet)?;
    let at = packet.len().checked_sub(ICRC_LEN).ok_or(Error::Truncated)?;
    let dst: &mut [u8; ICRC_LEN] = packet
        .get_mut(at..)
        .and_then(|d| d.try_into().ok())
        .ok_or(Error::Truncated)?;
    *dst = icrc.to_le_bytes();
    Ok(())
}

/// Checks the ICRC of an IPv4 RoCEv2 packet (`Checksum` on mismatch).
pub fn check_icrc_ipv4(packet: &[u8]) -> Result<(), Error> {
    if icrc_ipv4(packet)? == icrc_field(packet)? {
        Ok(())
    } else {
        Err(Error::Checksum)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32_check_value_and_rxe_seed() {
        // The CRC-32/ISO-HDLC check value of "123456789".
        assert_eq!(crc32(b"123456789"), 0xcbf4_3926);
        // rxe_icrc.c: "This seed is the result of computing a CRC with a
        // seed of 0xfffffff and 8 bytes of 0xff representing a masked LRH."
        let mut c = Crc32::new();
        c.update(&[0xff; 8]);
        assert_eq!(c.state(), 0xdebb_20e3);
    }
}
