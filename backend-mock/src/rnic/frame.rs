//! RoCEv2 frames as the simulated NICs put them on the wire, built and
//! parsed with `ringcc_core::wire::roce`, and their sizes.

use ringcc_core::wire::roce::{
    AethRepr, BthRepr, EthernetRepr, ImmDtRepr, Ipv4Repr, Opcode, RocePacketRepr, Syndrome, UdpRepr,
};
use ringcc_core::wire::segment::PacketDesc;
use ringcc_core::wire::{Error, Psn, Qpn};

use super::NicPort;

/// The default partition key.
const PKEY: u16 = 0xffff;
/// DSCP 26 (AF31), what RoCE deployments commonly mark.
const DSCP: u8 = 26;

fn ip(src: &NicPort, dst: &NicPort) -> Ipv4Repr {
    Ipv4Repr {
        src: src.ip,
        dst: dst.ip,
        dscp: DSCP,
        ttl: 64,
        dont_frag: true,
        ..Default::default()
    }
}

/// RoCEv2 source ports spread flows by QPN (as Linux rxe does).
fn udp(qpn: Qpn) -> UdpRepr {
    UdpRepr {
        src_port: 0xc000 | (qpn.get() & 0x3fff) as u16,
        ..Default::default()
    }
}

fn emit(p: RocePacketRepr<'_>) -> Result<Vec<u8>, Error> {
    let p = p.normalize();
    let mut buf = vec![0u8; p.buffer_len()];
    p.emit(&mut buf)?;
    Ok(buf)
}

/// A request packet of queue pair `src_qpn` to `dest_qpn`.
pub(crate) fn data_frame(
    src: &NicPort,
    dst: &NicPort,
    src_qpn: Qpn,
    dest_qpn: Qpn,
    d: &PacketDesc,
    payload: &[u8],
) -> Result<Vec<u8>, Error> {
    emit(RocePacketRepr {
        eth: EthernetRepr {
            dst: dst.mac,
            src: src.mac,
            ethertype: 0,
        },
        ip: ip(src, dst),
        udp: udp(src_qpn),
        bth: d.bth(dest_qpn, PKEY),
        reth: d.reth,
        aeth: None,
        imm: d.imm.map(|imm| ImmDtRepr { imm }),
        payload,
    })
}

/// An ACK or NAK for `psn` to queue pair `dest_qpn`.
pub(crate) fn ack_frame(
    src: &NicPort,
    dst: &NicPort,
    src_qpn: Qpn,
    dest_qpn: Qpn,
    psn: Psn,
    syndrome: Syndrome,
    msn: u32,
) -> Result<Vec<u8>, Error> {
    emit(RocePacketRepr {
        eth: EthernetRepr {
            dst: dst.mac,
            src: src.mac,
            ethertype: 0,
        },
        ip: ip(src, dst),
        udp: udp(src_qpn),
        bth: BthRepr {
            opcode: Opcode::Acknowledge,
            solicited: false,
            migreq: false,
            pad_count: 0,
            tver: 0,
            pkey: PKEY,
            fecn: false,
            becn: false,
            dest_qpn,
            ack_req: false,
            psn,
        },
        reth: None,
        aeth: Some(AethRepr {
            syndrome,
            msn: msn & 0x00ff_ffff,
        }),
        imm: None,
        payload: &[],
    })
}

/// Ethernet + IPv4 + UDP + BTH + ICRC: what every RoCEv2 packet carries.
const PACKET_OVERHEAD: u64 = 14 + 20 + 8 + 12 + 4;
/// RETH, on a write's first packet.
const RETH: u64 = 16;
/// ImmDt, on the last packet of a write with immediate.
const IMMDT: u64 = 4;

/// Wire bytes of an RDMA WRITE (with immediate when `imm`) of `len`
/// bytes at path MTU `mtu`: exactly the frames the packet model emits.
pub(crate) fn write_wire_bytes(len: u64, mtu: u32, imm: bool) -> u64 {
    let mtu = u64::from(mtu.max(1));
    let packets = len.div_ceil(mtu).max(1);
    let last = len - (packets - 1) * mtu;
    let pad = (4 - last % 4) % 4;
    len + packets * PACKET_OVERHEAD + RETH + if imm { IMMDT } else { 0 } + pad
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringcc_core::wire::segment::{PathMtu, Segmenter};
    use ringcc_core::wire::{RemoteAddr, Rkey};

    #[test]
    fn wire_bytes_match_emitted_frames() {
        let a = NicPort::new(0, 1);
        let b = NicPort::new(3, 0);
        for mtu in [PathMtu::Mtu256, PathMtu::Mtu4096] {
            for len in [0u32, 1, 3, 4, 255, 256, 257, 1000, 4096, 4097, 10_001] {
                for imm in [None, Some(9)] {
                    let remote = RemoteAddr {
                        addr: 0x1000,
                        rkey: Rkey(5),
                    };
                    let seg = Segmenter::write(remote, len, mtu, Psn::new(0xff_fff0), imm).unwrap();
                    let data = vec![0xabu8; len as usize];
                    let mut total = 0u64;
                    for d in seg {
                        let payload = &data[d.offset as usize..(d.offset + d.len) as usize];
                        let f = data_frame(&a, &b, Qpn::new(0x100), Qpn::new(0x101), &d, payload)
                            .unwrap();
                        let p = RocePacketRepr::parse(&f).unwrap();
                        assert_eq!(p.payload, payload);
                        assert_eq!(p.ip.dst, b.ip);
                        total += f.len() as u64;
                    }
                    assert_eq!(
                        total,
                        write_wire_bytes(u64::from(len), mtu.bytes(), imm.is_some()),
                        "len {len} mtu {mtu:?} imm {imm:?}"
                    );
                }
            }
        }
        let f = ack_frame(
            &a,
            &b,
            Qpn::new(1),
            Qpn::new(2),
            Psn::new(3),
            Syndrome::ACK_UNLIMITED,
            4,
        )
        .unwrap();
        let p = RocePacketRepr::parse(&f).unwrap();
        assert_eq!(p.bth.opcode, Opcode::Acknowledge);
        assert_eq!(p.aeth.unwrap().msn, 4);
        assert_eq!(f.len(), 62);
    }
}
