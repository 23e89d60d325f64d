//! RoCEv2 / InfiniBand transport headers: byte fixtures from the IBTA
//! layouts (as Linux's `rxe_hdr.h` and `ib_pack.h` encode them), whole
//! packets, and parse/emit round trips for every representation.

use proptest::prelude::*;
use ringcc_core::wire::roce::{
    Aeth, AethRepr, Bth, BthRepr, EthernetRepr, ImmDt, ImmDtRepr, Ipv4Repr, NakCode, Opcode, Reth,
    RethRepr, RocePacketRepr, Syndrome, UdpRepr, ROCE_V2_PORT,
};
use ringcc_core::wire::{Error, Psn, Qpn, Rkey};

#[test]
fn opcodes_are_ib_pack_h_values() {
    // Linux include/rdma/ib_pack.h: IB_OPCODE_RC = 0x00 plus
    // IB_OPCODE_SEND_FIRST 0x00 … IB_OPCODE_RDMA_WRITE_FIRST 0x06, _MIDDLE
    // 0x07, _LAST 0x08, _LAST_WITH_IMMEDIATE 0x09, _ONLY 0x0a,
    // _ONLY_WITH_IMMEDIATE 0x0b, IB_OPCODE_RDMA_READ_REQUEST 0x0c,
    // IB_OPCODE_ACKNOWLEDGE 0x11.
    let table = [
        (Opcode::SendFirst, 0x00),
        (Opcode::SendOnlyWithImm, 0x05),
        (Opcode::WriteFirst, 0x06),
        (Opcode::WriteMiddle, 0x07),
        (Opcode::WriteLast, 0x08),
        (Opcode::WriteLastWithImm, 0x09),
        (Opcode::WriteOnly, 0x0a),
        (Opcode::WriteOnlyWithImm, 0x0b),
        (Opcode::ReadRequest, 0x0c),
        (Opcode::ReadResponseOnly, 0x10),
        (Opcode::Acknowledge, 0x11),
        (Opcode::SendOnlyWithInv, 0x17),
    ];
    for (op, v) in table {
        assert_eq!(op.code(), v, "{op:?}");
        assert_eq!(Opcode::from_code(v), op);
    }
    // 0x15 is reserved; UC opcodes (0x2_) have no name here.
    assert_eq!(Opcode::from_code(0x15), Opcode::Unknown(0x15));
    assert_eq!(Opcode::from_code(0x2a), Opcode::Unknown(0x2a));
    assert_eq!(ROCE_V2_PORT, 4791);
}

#[test]
fn bth_fixture() {
    // IBTA vol. 1 §9.2; masks from Linux rxe_hdr.h: BTH_SE_MASK 0x80,
    // BTH_MIG_MASK 0x40, BTH_PAD_MASK 0x30, BTH_TVER_MASK 0x0f,
    // BTH_FECN_MASK 0x80000000, BTH_BECN_MASK 0x40000000,
    // BTH_QPN_MASK 0x00ffffff, BTH_ACK_MASK 0x80000000, BTH_PSN_MASK 0x00ffffff.
    #[rustfmt::skip]
    let bytes = [
        0x06,             // RDMA WRITE First
        0x40 | 0x20,      // MigReq, PadCnt 2, TVer 0
        0xff, 0xff,       // default P_Key
        0x80,             // FECN, BECN 0, resv6a 0
        0xab, 0xcd, 0xef, // DestQP
        0x80,             // AckReq
        0xff, 0xff, 0xfe, // PSN
    ];
    let repr = BthRepr {
        opcode: Opcode::WriteFirst,
        solicited: false,
        migreq: true,
        pad_count: 2,
        tver: 0,
        pkey: 0xffff,
        fecn: true,
        becn: false,
        dest_qpn: Qpn::new(0xabcdef),
        ack_req: true,
        psn: Psn::new(0xff_fffe),
    };
    let mut out = [0u8; 12];
    repr.emit(&mut out).unwrap();
    assert_eq!(out, bytes);
    assert_eq!(
        BthRepr::parse(&Bth::new_checked(&bytes[..]).unwrap()),
        Ok(repr)
    );
    // Reserved bits are ignored on parse.
    let mut r = bytes;
    r[4] |= 0x3f;
    r[8] |= 0x7f;
    assert_eq!(BthRepr::parse(&Bth::new_unchecked(&r[..])), Ok(repr));
    assert_eq!(
        Bth::new_checked(&bytes[..11]).map(|_| ()),
        Err(Error::Truncated)
    );
    let bad = BthRepr {
        pad_count: 4,
        ..repr
    };
    assert_eq!(bad.emit(&mut out), Err(Error::Malformed));
}

#[test]
fn extension_header_fixtures() {
    // RETH (IBTA vol. 1 §9.3.3; struct rxe_reth): __be64 va, __be32 rkey,
    // __be32 len.
    let reth = RethRepr {
        va: 0x0102_0304_0506_0708,
        rkey: Rkey(0x0a0b_0c0d),
        dma_len: 0x1000,
    };
    let mut b = [0u8; 16];
    reth.emit(&mut b).unwrap();
    assert_eq!(
        b,
        [1, 2, 3, 4, 5, 6, 7, 8, 0x0a, 0x0b, 0x0c, 0x0d, 0, 0, 0x10, 0]
    );
    assert_eq!(
        RethRepr::parse(&Reth::new_checked(&b[..]).unwrap()),
        Ok(reth)
    );

    // ImmDt (§9.3.7; struct rxe_immdt): the immediate, big-endian.
    let mut b = [0u8; 4];
    ImmDtRepr { imm: 0xdead_beef }.emit(&mut b).unwrap();
    assert_eq!(b, [0xde, 0xad, 0xbe, 0xef]);
    assert_eq!(ImmDt::new_checked(&b[..]).unwrap().imm(), 0xdead_beef);

    // AETH (§9.3.5; rxe_hdr.h AETH_SYN_MASK 0xff000000, AETH_MSN_MASK
    // 0x00ffffff; AETH_ACK_UNLIMITED 0x1f, AETH_RNR_NAK 0x20,
    // AETH_NAK_PSN_SEQ_ERROR 0x60, AETH_NAK_REM_ACC_ERR 0x62).
    let cases = [
        (Syndrome::ACK_UNLIMITED, 5, [0x1f, 0, 0, 5]),
        (
            Syndrome::Nak(NakCode::PsnSequenceError),
            0x12_3456,
            [0x60, 0x12, 0x34, 0x56],
        ),
        (
            Syndrome::Nak(NakCode::RemoteAccessError),
            1,
            [0x62, 0, 0, 1],
        ),
        (Syndrome::RnrNak { timer: 0x0e }, 0, [0x2e, 0, 0, 0]),
    ];
    for (syndrome, msn, bytes) in cases {
        let a = AethRepr { syndrome, msn };
        let mut b = [0u8; 4];
        a.emit(&mut b).unwrap();
        assert_eq!(b, bytes);
        assert_eq!(AethRepr::parse(&Aeth::new_checked(&b[..]).unwrap()), Ok(a));
    }
    let too_big = AethRepr {
        syndrome: Syndrome::Ack { credits: 32 },
        msn: 0,
    };
    assert_eq!(too_big.emit(&mut b), Err(Error::Malformed));
}

#[test]
fn syndrome_bytes_roundtrip_exhaustively() {
    for b in 0..=255u8 {
        assert_eq!(Syndrome::from_byte(b).to_byte(), Ok(b), "{b:#x}");
    }
    assert_eq!(Syndrome::Reserved(0x00).to_byte(), Err(Error::Malformed));
}

fn sample_packet(payload: &[u8]) -> RocePacketRepr<'_> {
    RocePacketRepr {
        eth: EthernetRepr {
            dst: [2, 0, 0, 0, 0, 2],
            src: [2, 0, 0, 0, 0, 1],
            ethertype: 0,
        },
        ip: Ipv4Repr {
            src: [10, 0, 0, 1],
            dst: [10, 0, 0, 2],
            dscp: 26,
            ecn: 2,
            ident: 7,
            dont_frag: true,
            ttl: 64,
            protocol: 0,
            payload_len: 0,
        },
        udp: UdpRepr {
            src_port: 0xc123,
            dst_port: 0,
            payload_len: 0,
        },
        bth: BthRepr {
            opcode: Opcode::WriteOnlyWithImm,
            solicited: false,
            migreq: false,
            pad_count: 0,
            tver: 0,
            pkey: 0xffff,
            fecn: false,
            becn: false,
            dest_qpn: Qpn::new(0x11),
            ack_req: true,
            psn: Psn::new(100),
        },
        reth: Some(RethRepr {
            va: 0x1000,
            rkey: Rkey(0x42),
            dma_len: payload.len() as u32,
        }),
        aeth: None,
        imm: Some(ImmDtRepr { imm: 9 }),
        payload,
    }
    .normalize()
}

#[test]
fn whole_packet_fixture() {
    let p = sample_packet(b"hello");
    // 14 + 20 + 8 + BTH 12 + RETH 16 + ImmDt 4 + 5 + pad 3 + ICRC 4
    assert_eq!(p.buffer_len(), 86);
    assert_eq!(p.bth.pad_count, 3);
    let mut f = [0u8; 86];
    assert_eq!(p.emit(&mut f), Ok(86));
    assert_eq!(&f[12..14], &[0x08, 0x00]); // EtherType IPv4
    assert_eq!(&f[16..18], &72u16.to_be_bytes()); // IP total length
    assert_eq!(f[23], 17); // UDP
    assert_eq!(&f[36..38], &4791u16.to_be_bytes());
    assert_eq!(&f[38..40], &52u16.to_be_bytes()); // UDP length
    assert_eq!(&f[42..44], &[0x0b, 0x30]); // WRITE Only with Imm, PadCnt 3
    assert_eq!(&f[54..62], &0x1000u64.to_be_bytes()); // RETH va
    assert_eq!(&f[70..74], &9u32.to_be_bytes()); // ImmDt
    assert_eq!(&f[74..82], b"hello\0\0\0");
    assert_eq!(RocePacketRepr::parse(&f), Ok(p));

    // Ethernet padding after the IP packet is ignored.
    let mut padded = f.to_vec();
    padded.extend_from_slice(&[0xee; 10]);
    assert_eq!(RocePacketRepr::parse(&padded), Ok(p));

    // A flipped payload bit breaks the ICRC; a flipped TTL does not, but
    // the IP checksum catches it.
    let mut g = f;
    g[75] ^= 4;
    assert_eq!(RocePacketRepr::parse(&g), Err(Error::Checksum));
    let mut g = f;
    g[22] ^= 1;
    assert_eq!(RocePacketRepr::parse(&g), Err(Error::Checksum));

    // Inconsistent representations are refused.
    let mut q = p;
    q.aeth = Some(AethRepr {
        syndrome: Syndrome::ACK_UNLIMITED,
        msn: 0,
    });
    assert_eq!(q.emit(&mut f), Err(Error::Malformed));
    let mut q = p;
    q.bth.pad_count = 0;
    assert_eq!(q.emit(&mut f), Err(Error::Malformed));
    assert_eq!(p.emit(&mut [0u8; 85]), Err(Error::Exhausted));
}

fn bth() -> impl Strategy<Value = BthRepr> {
    (
        any::<u8>(),
        any::<(bool, bool, bool, bool, bool)>(),
        0..4u8,
        0..16u8,
        any::<(u16, u32, u32)>(),
    )
        .prop_map(
            |(op, (solicited, migreq, fecn, becn, ack_req), pad_count, tver, (pkey, q, psn))| {
                BthRepr {
                    opcode: Opcode::from_code(op),
                    solicited,
                    migreq,
                    pad_count,
                    tver,
                    pkey,
                    fecn,
                    becn,
                    dest_qpn: Qpn::new(q),
                    ack_req,
                    psn: Psn::new(psn),
                }
            },
        )
}

fn packet_parts() -> impl Strategy<Value = (BthRepr, RethRepr, AethRepr, u32, Vec<u8>, [u8; 4], u16)>
{
    (
        bth(),
        any::<(u64, u32, u32)>().prop_map(|(va, rk, dma_len)| RethRepr {
            va,
            rkey: Rkey(rk),
            dma_len,
        }),
        (any::<u8>(), 0..(1u32 << 24)).prop_map(|(s, msn)| AethRepr {
            syndrome: Syndrome::from_byte(s),
            msn,
        }),
        any::<u32>(),
        prop::collection::vec(any::<u8>(), 0..300),
        any::<[u8; 4]>(),
        any::<u16>(),
    )
}

proptest! {
    #[test]
    fn bth_roundtrip(repr in bth()) {
        let mut b = [0u8; 12];
        repr.emit(&mut b).unwrap();
        prop_assert_eq!(BthRepr::parse(&Bth::new_checked(&b[..]).unwrap()), Ok(repr));
    }

    #[test]
    fn ext_roundtrips(va in any::<u64>(), rk in any::<u32>(), len in any::<u32>(), s in any::<u8>(), msn in 0..(1u32 << 24), imm in any::<u32>()) {
        let reth = RethRepr { va, rkey: Rkey(rk), dma_len: len };
        let mut b = [0u8; 16];
        reth.emit(&mut b).unwrap();
        prop_assert_eq!(RethRepr::parse(&Reth::new_checked(&b[..]).unwrap()), Ok(reth));
        let aeth = AethRepr { syndrome: Syndrome::from_byte(s), msn };
        let mut b = [0u8; 4];
        aeth.emit(&mut b).unwrap();
        prop_assert_eq!(AethRepr::parse(&Aeth::new_checked(&b[..]).unwrap()), Ok(aeth));
        let i = ImmDtRepr { imm };
        i.emit(&mut b).unwrap();
        prop_assert_eq!(ImmDtRepr::parse(&ImmDt::new_checked(&b[..]).unwrap()), Ok(i));
    }

    #[test]
    fn ip_udp_eth_roundtrip(src in any::<[u8; 4]>(), dst in any::<[u8; 4]>(), dscp in 0..64u8, ecn in 0..4u8,
                            ident in any::<u16>(), df in any::<bool>(), ttl in any::<u8>(), proto in any::<u8>(),
                            plen in 8..2000u16, ports in any::<(u16, u16)>(), macs in any::<([u8; 6], [u8; 6], u16)>()) {
        let ip = Ipv4Repr { src, dst, dscp, ecn, ident, dont_frag: df, ttl, protocol: proto, payload_len: plen };
        let mut b = vec![0u8; 20 + usize::from(plen)];
        ip.emit(&mut b).unwrap();
        prop_assert_eq!(Ipv4Repr::parse(&b), Ok(ip));
        let udp = UdpRepr { src_port: ports.0, dst_port: ports.1, payload_len: plen.saturating_sub(8) };
        udp.emit(&mut b[20..]).unwrap();
        prop_assert_eq!(UdpRepr::parse(&b[20..]), Ok(udp));
        let eth = EthernetRepr { dst: macs.0, src: macs.1, ethertype: macs.2 };
        eth.emit(&mut b).unwrap();
        prop_assert_eq!(EthernetRepr::parse(&b), Ok(eth));
    }

    #[test]
    fn packet_roundtrip(parts in packet_parts()) {
        let (mut bth, reth, aeth, imm, payload, src, sport) = parts;
        let layout = match bth.opcode.layout() {
            Some(l) => l,
            None => { bth.opcode = Opcode::WriteMiddle; bth.opcode.layout().unwrap() }
        };
        let payload: &[u8] = if layout.payload { &payload } else { &[] };
        let mut p = sample_packet(payload);
        p.ip.src = src;
        p.udp.src_port = sport;
        p.bth = bth;
        p.reth = layout.reth.then_some(reth);
        p.aeth = layout.aeth.then_some(aeth);
        p.imm = layout.immdt.then_some(ImmDtRepr { imm });
        let p = p.normalize();
        let mut f = vec![0u8; p.buffer_len()];
        prop_assert_eq!(p.emit(&mut f), Ok(f.len()));
        prop_assert_eq!(RocePacketRepr::parse(&f), Ok(p));
    }

    #[test]
    fn packet_parse_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        if let Ok(p) = RocePacketRepr::parse(&bytes) {
            let mut f = vec![0u8; p.buffer_len()];
            p.emit(&mut f).unwrap();
            prop_assert_eq!(RocePacketRepr::parse(&f), Ok(p));
        }
    }
}
