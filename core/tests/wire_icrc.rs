//! The RoCEv2 invariant CRC against packets computed elsewhere, and its
//! coverage: every covered bit counts, no masked field does.

use proptest::prelude::*;
use ringcc_core::wire::roce::icrc::{icrc_field, icrc_ipv6};
use ringcc_core::wire::roce::{
    check_icrc_ipv4, fill_icrc_ipv4, icrc_ipv4, internet_checksum, Bth, BthRepr, EthernetRepr,
    Ipv4Repr, Opcode, RocePacketRepr, UdpRepr, ROCE_V2_PORT,
};
use ringcc_core::wire::{Error, Psn, Qpn};

/// A RoCEv2 CNP captured on a ConnectX-4 Lx, as published in scapy's
/// `test/contrib/roce.uts` ("RoCE CNP captured on ConnectX-4 Lx"): the
/// ICRC bytes `82 fd 00 2a` were computed by the NIC.
#[rustfmt::skip]
const CX4_CNP: [u8; 74] = [
    0xe4, 0x1d, 0x2d, 0xab, 0x2b, 0xc2, 0x7c, 0xfe, 0x90, 0x64, 0x3b, 0x32, 0x08, 0x00,
    // IPv4: ToS 0xc2, length 60, id 0x718c, DF, TTL 64, UDP, checksum 0x9161
    0x45, 0xc2, 0x00, 0x3c, 0x71, 0x8c, 0x40, 0x00, 0x40, 0x11, 0x91, 0x61,
    0x0a, 0x00, 0x11, 0x01, 0x0a, 0x00, 0x12, 0x01,
    // UDP: 0 -> 4791, length 40, no checksum
    0x00, 0x00, 0x12, 0xb7, 0x00, 0x28, 0x00, 0x00,
    // BTH: CNP opcode 0x81, P_Key 0xffff, BECN, DestQP 0x000118, PSN 0
    0x81, 0x00, 0xff, 0xff, 0x40, 0x00, 0x01, 0x18, 0x00, 0x00, 0x00, 0x00,
    // 16 reserved bytes
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    // ICRC
    0x82, 0xfd, 0x00, 0x2a,
];

#[test]
fn connectx_cnp_capture() {
    let ip = &CX4_CNP[14..];
    assert_eq!(
        icrc_ipv4(ip),
        Ok(u32::from_le_bytes([0x82, 0xfd, 0x00, 0x2a]))
    );
    assert_eq!(icrc_field(ip), icrc_ipv4(ip));
    assert_eq!(check_icrc_ipv4(ip), Ok(()));

    let eth = EthernetRepr::parse(&CX4_CNP).unwrap();
    assert_eq!(eth.ethertype, 0x0800);
    // The IPv4 header checksum of the capture verifies (RFC 1071).
    let ipr = Ipv4Repr::parse(ip).unwrap();
    assert_eq!(
        (ipr.dscp, ipr.ecn, ipr.ttl, ipr.payload_len),
        (0x30, 2, 64, 40)
    );
    assert!(ipr.dont_frag);
    let udp = UdpRepr::parse(&ip[20..]).unwrap();
    assert_eq!((udp.dst_port, udp.payload_len), (ROCE_V2_PORT, 32));
    let bth = BthRepr::parse(&Bth::new_checked(&ip[28..]).unwrap()).unwrap();
    assert_eq!(bth.opcode, Opcode::Cnp);
    assert!(bth.becn && !bth.fecn);
    assert_eq!(
        (bth.pkey, bth.dest_qpn, bth.psn),
        (0xffff, Qpn::new(0x118), Psn::new(0))
    );
    // CNP has no layout in the packet builder.
    assert_eq!(RocePacketRepr::parse(&CX4_CNP), Err(Error::Unsupported));
}

/// scapy's example UC packet (`test/contrib/roce.uts`, "RoCE layer"):
/// IPv4 checksum 0xb4d5 and ICRC bytes `78 f3 53 f3` computed by scapy's
/// own implementation (`compute_icrc` in `scapy/contrib/roce.py`).
#[rustfmt::skip]
fn scapy_uc_packet() -> Vec<u8> {
    let mut p = vec![
        // IPv4: ToS 1, length 64, id 1144, DF, TTL 64, UDP, 192.168.0.7 twice
        0x45, 0x01, 0x00, 0x40, 0x04, 0x78, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00,
        0xc0, 0xa8, 0x00, 0x07, 0xc0, 0xa8, 0x00, 0x07,
        // UDP: 49152 -> 4791, length 44, checksum 0xaca2
        0xc0, 0x00, 0x12, 0xb7, 0x00, 0x2c, 0xac, 0xa2,
        // BTH: UC_SEND_ONLY 0x24, MigReq, PadCnt 2, P_Key 0xffff,
        // DestQP 211, PSN 13571856
        0x24, 0x60, 0xff, 0xff, 0x00, 0x00, 0x00, 0xd3, 0x00, 0xcf, 0x17, 0x10,
    ];
    p.extend_from_slice(b"F0\x81\x8b\xe2\x895\xd9\x0e\x9a\x95PT\x01\xbe\x88^P\x00\x00");
    p.extend_from_slice(&[0x78, 0xf3, 0x53, 0xf3]);
    p
}

#[test]
fn scapy_uc_packet_icrc_and_ip_checksum() {
    let mut p = scapy_uc_packet();
    assert_eq!(p.len(), 64);
    // Our IPv4 emitter produces scapy's checksum for the same header.
    let ip = Ipv4Repr {
        src: [192, 168, 0, 7],
        dst: [192, 168, 0, 7],
        dscp: 0,
        ecn: 1,
        ident: 1144,
        dont_frag: true,
        ttl: 64,
        protocol: 17,
        payload_len: 44,
    };
    ip.emit(&mut p[..20]).unwrap();
    assert_eq!(&p[10..12], &[0xb4, 0xd5]);
    assert_eq!(internet_checksum(&p[..20]), 0);
    assert_eq!(
        icrc_ipv4(&p),
        Ok(u32::from_le_bytes([0x78, 0xf3, 0x53, 0xf3]))
    );
    // Refilling writes the same bytes.
    let before = p.clone();
    fill_icrc_ipv4(&mut p).unwrap();
    assert_eq!(p, before);
}

#[test]
fn short_or_optioned_packets_are_errors() {
    assert_eq!(icrc_ipv4(&[0x45; 43]), Err(Error::Truncated));
    let mut p = scapy_uc_packet();
    p[0] = 0x46; // IHL 6: options
    assert_eq!(icrc_ipv4(&p), Err(Error::Unsupported));
    let mut p = scapy_uc_packet();
    p[40] ^= 1;
    assert_eq!(check_icrc_ipv4(&p), Err(Error::Checksum));
}

/// Offsets (from the IPv4 header) the ICRC masks: ToS, TTL, IPv4 checksum,
/// UDP checksum, BTH byte 4 (FECN, BECN, resv6a).
const MASKED_V4: [usize; 7] = [1, 8, 10, 11, 26, 27, 32];

fn packet() -> impl Strategy<Value = Vec<u8>> {
    (
        prop::collection::vec(any::<u8>(), 44..200),
        any::<[u8; 4]>(),
        any::<u16>(),
    )
        .prop_map(|(mut p, src, ident)| {
            // A syntactically plausible IPv4 + UDP + BTH prefix; the rest is
            // random payload, the last 4 bytes the ICRC field.
            p[0] = 0x45;
            p[12..16].copy_from_slice(&src);
            p[4..6].copy_from_slice(&ident.to_be_bytes());
            p
        })
}

proptest! {
    #[test]
    fn every_covered_bit_changes_the_icrc(p in packet(), at in any::<prop::sample::Index>(), bit in 0..8u8) {
        let covered: Vec<usize> = (1..p.len() - 4).filter(|i| !MASKED_V4.contains(i)).collect();
        let i = covered[at.index(covered.len())];
        let mut q = p.clone();
        q[i] ^= 1 << bit;
        prop_assert_ne!(icrc_ipv4(&q).unwrap(), icrc_ipv4(&p).unwrap());
    }

    #[test]
    fn masked_fields_and_icrc_field_do_not_count(p in packet(), vals in any::<[u8; 7]>(), tail in any::<[u8; 4]>()) {
        let mut q = p.clone();
        for (i, v) in MASKED_V4.iter().zip(vals) {
            q[*i] = v;
        }
        let n = q.len();
        q[n - 4..].copy_from_slice(&tail);
        prop_assert_eq!(icrc_ipv4(&q), icrc_ipv4(&p));
    }

    #[test]
    fn ipv6_masks_traffic_class_flow_label_hop_limit(
        p in prop::collection::vec(any::<u8>(), 64..160),
        tc in any::<u8>(), fl in any::<[u8; 3]>(), hop in any::<u8>(), ck in any::<u16>(), b4 in any::<u8>(),
        at in 0usize..60, bit in 0..8u8,
    ) {
        let base = icrc_ipv6(&p).unwrap();
        let mut q = p.clone();
        // Version nibble stays; traffic class spans bytes 0..2.
        q[0] = (q[0] & 0xf0) | (tc >> 4);
        q[1] = (tc << 4) | (fl[0] & 0x0f);
        q[2] = fl[1];
        q[3] = fl[2];
        q[7] = hop;
        q[46..48].copy_from_slice(&ck.to_be_bytes());
        q[52] = b4;
        prop_assert_eq!(icrc_ipv6(&q).unwrap(), base);
        let masked = |i: usize| matches!(i, 1 | 2 | 3 | 7 | 46 | 47 | 52);
        let masked_bit = masked(at) || (at == 0 && bit < 4);
        if !masked_bit {
            let mut r = p.clone();
            r[at] ^= 1 << bit;
            prop_assert_ne!(icrc_ipv6(&r).unwrap(), base);
        }
    }
}

/// The table-driven (slicing-by-8) CRC equals the bit-at-a-time definition
/// for any data fed in any pieces.
#[test]
fn crc32_matches_the_bitwise_definition() {
    fn bitwise(data: &[u8]) -> u32 {
        let mut c = !0u32;
        for &b in data {
            c ^= u32::from(b);
            for _ in 0..8 {
                c = if c & 1 != 0 {
                    (c >> 1) ^ 0xedb8_8320
                } else {
                    c >> 1
                };
            }
        }
        c
    }
    let mut x = 0x1234_5678u32;
    let data: Vec<u8> = (0..4099)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect();
    for len in [0usize, 1, 7, 8, 9, 63, 64, 65, 1000, 4099] {
        for split in [0usize, 1, 3, 8, len / 2] {
            let split = split.min(len);
            let mut c = ringcc_core::wire::roce::Crc32::new();
            c.update(&data[..split]);
            c.update(&data[split..len]);
            assert_eq!(c.state(), bitwise(&data[..len]), "len {len} split {split}");
        }
    }
}
