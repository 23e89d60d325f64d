//! mlx5 WQEs: byte fixtures laid out by rdma-core's
//! `providers/mlx5/mlx5dv.h`, and round trips.

use proptest::prelude::*;
use ringcc_core::wire::mlx5::{CtrlFlags, Opcode, Wqe, WqeRepr, BASIC_BLOCK, MAX_DS};
use ringcc_core::wire::{
    Error, InlineData, Lkey, Payload, Qpn, RemoteAddr, Rkey, SendFlags, Sge, WorkRequest, WrOpcode,
    MAX_INLINE,
};

#[test]
fn constants_are_mlx5dv_h_values() {
    // mlx5dv.h: MLX5_OPCODE_RDMA_WRITE 0x08, _RDMA_WRITE_IMM 0x09,
    // _SEND 0x0a, _SEND_IMM 0x0b, _RDMA_READ 0x10.
    assert_eq!(Opcode::RdmaWrite.code(), 0x08);
    assert_eq!(Opcode::RdmaWriteImm.code(), 0x09);
    assert_eq!(Opcode::Send.code(), 0x0a);
    assert_eq!(Opcode::SendImm.code(), 0x0b);
    assert_eq!(Opcode::RdmaRead.code(), 0x10);
    // mlx5dv.h: MLX5_WQE_CTRL_CQ_UPDATE = 2 << 2, MLX5_WQE_CTRL_SOLICITED
    // = 1 << 1, MLX5_WQE_CTRL_FENCE = 4 << 5; MLX5_SEND_WQE_BB = 64.
    assert_eq!(CtrlFlags::CQ_UPDATE.bits(), 0x08);
    assert_eq!(CtrlFlags::SOLICITED.bits(), 0x02);
    assert_eq!(CtrlFlags::FENCE.bits(), 0x80);
    assert_eq!(BASIC_BLOCK, 64);
    // Linux include/linux/mlx5/qp.h: MLX5_WQE_CTRL_DS_MASK 0x3f.
    assert_eq!(MAX_DS, 0x3f);
}

/// RDMA WRITE WITH IMM, signaled, one SGE, on QP 0x123 at index 0x42.
#[rustfmt::skip]
const WRITE_IMM: [u8; 64] = [
    // struct mlx5_wqe_ctrl_seg
    // opmod_idx_opcode = htobe32(opmod << 24 | pi << 8 | opcode)
    // (mlx5dv_set_ctrl_seg): opmod 0, pi 0x0042, MLX5_OPCODE_RDMA_WRITE_IMM
    0x00, 0x00, 0x42, 0x09,
    // qpn_ds = htobe32(qp_num << 8 | ds): QPN 0x000123, ds 3 (ctrl, raddr,
    // one data segment; "DS - WQE size in octowords (16-byte units)")
    0x00, 0x01, 0x23, 0x03,
    // signature, rsvd[2], fm_ce_se = MLX5_WQE_CTRL_CQ_UPDATE (IBV_SEND_SIGNALED)
    0x00, 0x00, 0x00, 0x08,
    // imm: verbs' imm_data, already big-endian
    0xde, 0xad, 0xbe, 0xef,
    // struct mlx5_wqe_raddr_seg: __be64 raddr, __be32 rkey, __be32 reserved
    0x00, 0x00, 0x7f, 0x00, 0x12, 0x34, 0x50, 0x00,
    0x00, 0xab, 0xcd, 0xef,
    0x00, 0x00, 0x00, 0x00,
    // struct mlx5_wqe_data_seg: __be32 byte_count, __be32 lkey, __be64 addr
    0x00, 0x00, 0x10, 0x00,
    0x00, 0x11, 0x22, 0x33,
    0x00, 0x00, 0x55, 0x55, 0x00, 0x00, 0x10, 0x00,
    // padding to the 64-byte basic block (MLX5_SEND_WQE_BB)
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
];

fn write_imm_request() -> WorkRequest<4> {
    WorkRequest::rdma_write_imm(
        99,
        &[Sge {
            addr: 0x0000_5555_0000_1000,
            length: 4096,
            lkey: Lkey(0x0011_2233),
        }],
        RemoteAddr {
            addr: 0x0000_7f00_1234_5000,
            rkey: Rkey(0x00ab_cdef),
        },
        0xdead_beef,
    )
    .unwrap()
    .signaled()
}

#[test]
fn write_imm_fixture() {
    let wr = write_imm_request();
    let repr = WqeRepr::from_request(&wr, Qpn::new(0x123), 0x42).unwrap();
    assert_eq!(repr.ds(), Ok(3));
    assert_eq!(repr.buffer_len(), Ok(64));
    let mut buf = [0xaau8; 64];
    assert_eq!(repr.emit(&mut buf), Ok(64));
    assert_eq!(buf, WRITE_IMM);

    let view = Wqe::new_checked(&WRITE_IMM[..]).unwrap();
    assert_eq!(view.opcode(), Opcode::RdmaWriteImm);
    assert_eq!(view.wqe_index(), 0x42);
    assert_eq!(view.qpn(), Qpn::new(0x123));
    assert_eq!(view.ds(), 3);
    assert_eq!(view.imm(), 0xdead_beef);
    assert_eq!(view.flags(), CtrlFlags::CQ_UPDATE);
    let parsed = WqeRepr::<4>::parse(&view).unwrap();
    assert_eq!(parsed, repr);
    assert_eq!(parsed.to_request(99).unwrap(), wr);
}

/// An inline 8-byte RDMA WRITE (a credit return), unsignaled.
#[rustfmt::skip]
const INLINE_WRITE: [u8; 64] = [
    0x00, 0x00, 0x01, 0x08,             // pi 1, MLX5_OPCODE_RDMA_WRITE
    0x00, 0x00, 0x07, 0x03,             // QPN 7, ds 3: ctrl, raddr, inline (4 + 8 -> 16)
    0x00, 0x00, 0x00, 0x00,             // no completion requested
    0x00, 0x00, 0x00, 0x00,             // no immediate
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x80, 0x00, // raddr 0x8000
    0x00, 0x00, 0x00, 0x05,             // rkey 5
    0x00, 0x00, 0x00, 0x00,
    // struct mlx5_wqe_inl_data_seg: byte_count = 8 | MLX5_INLINE_SEG
    // (0x80000000, mlx5dv.h), big-endian as rdma-core's mlx5 qp.c writes it
    0x80, 0x00, 0x00, 0x08,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x2a, // the data: head = 42
    0x00, 0x00, 0x00, 0x00,             // to the 16-byte segment boundary
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
];

#[test]
fn inline_fixture() {
    let wr = WorkRequest::<1>::inline_write(
        5,
        &42u64.to_be_bytes(),
        RemoteAddr {
            addr: 0x8000,
            rkey: Rkey(5),
        },
    )
    .unwrap();
    let repr = WqeRepr::from_request(&wr, Qpn::new(7), 1).unwrap();
    let mut buf = [0u8; 64];
    assert_eq!(repr.emit(&mut buf), Ok(64));
    assert_eq!(buf, INLINE_WRITE);
    let parsed = WqeRepr::<1>::parse(&Wqe::new_checked(&buf[..]).unwrap()).unwrap();
    assert_eq!(parsed.to_request(5).unwrap(), wr);
}

#[test]
fn send_with_two_sges_and_fence_takes_two_blocks_when_long() {
    // SEND_IMM, FENCE | SOLICITED -> fm_ce_se = 0x80 | 0x02; no raddr.
    let sges: Vec<Sge> = (0..4)
        .map(|i| Sge {
            addr: 0x1000 * (i + 1),
            length: 100,
            lkey: Lkey(1),
        })
        .collect();
    let wr = WorkRequest::<4>::send_imm(1, &sges, 7)
        .unwrap()
        .with_flags(SendFlags::FENCE | SendFlags::SOLICITED);
    let repr = WqeRepr::from_request(&wr, Qpn::new(1), 0xffff).unwrap();
    assert_eq!(repr.ds(), Ok(5));
    assert_eq!(repr.buffer_len(), Ok(128));
    let mut buf = [0u8; 128];
    repr.emit(&mut buf).unwrap();
    assert_eq!(&buf[..4], &[0x00, 0xff, 0xff, 0x0b]);
    assert_eq!(buf[11], 0x82);
    assert_eq!(&buf[16..20], &100u32.to_be_bytes());
    assert!(buf[80..].iter().all(|&b| b == 0));
}

#[test]
fn parse_rejects_bad_wqes() {
    let mut b = WRITE_IMM;
    b[7] = 0; // ds 0
    assert_eq!(Wqe::new_checked(&b[..]).map(|_| ()), Err(Error::Malformed));
    assert_eq!(
        Wqe::new_checked(&WRITE_IMM[..40]).map(|_| ()),
        Err(Error::Truncated)
    );
    let mut b = WRITE_IMM;
    b[3] = 0x11; // atomic: no layout here
    assert_eq!(
        WqeRepr::<4>::parse(&Wqe::new_unchecked(&b[..])),
        Err(Error::Unsupported)
    );
    let mut b = WRITE_IMM;
    b[32..36].copy_from_slice(&[0, 0, 0, 0]); // zero-length data segment
    assert_eq!(
        WqeRepr::<4>::parse(&Wqe::new_unchecked(&b[..])),
        Err(Error::Malformed)
    );
    // More data segments than N.
    assert_eq!(
        WqeRepr::<0>::parse(&Wqe::new_unchecked(&WRITE_IMM[..])),
        Err(Error::Exhausted)
    );
    // Emitting into a short buffer.
    let repr = WqeRepr::<4>::parse(&Wqe::new_unchecked(&WRITE_IMM[..])).unwrap();
    assert_eq!(repr.emit(&mut [0u8; 63]), Err(Error::Exhausted));
}

fn payload() -> impl Strategy<Value = Payload<4>> {
    prop_oneof![
        prop::collection::vec((any::<u64>(), 1..0x8000_0000u32, any::<u32>()), 0..=4).prop_map(
            |v| Payload::Gather(
                v.into_iter()
                    .map(|(addr, length, lkey)| Sge {
                        addr,
                        length,
                        lkey: Lkey(lkey),
                    })
                    .collect()
            )
        ),
        prop::collection::vec(any::<u8>(), 0..=MAX_INLINE)
            .prop_map(|v| Payload::Inline(InlineData::from_slice(&v).unwrap())),
    ]
}

fn wqe_repr() -> impl Strategy<Value = WqeRepr<4>> {
    (
        prop::sample::select(vec![
            Opcode::RdmaWrite,
            Opcode::RdmaWriteImm,
            Opcode::Send,
            Opcode::SendImm,
            Opcode::RdmaRead,
        ]),
        any::<(u16, u8, u32, u8, u8, u32)>(),
        (any::<u64>(), any::<u32>()),
        payload(),
    )
        .prop_filter_map(
            "READ is never inline",
            |(opcode, (wqe_index, opmod, qpn, signature, flags, imm), (ra, rk), payload)| {
                let rdma = matches!(
                    opcode,
                    Opcode::RdmaWrite | Opcode::RdmaWriteImm | Opcode::RdmaRead
                );
                if opcode == Opcode::RdmaRead && matches!(payload, Payload::Inline(_)) {
                    return None;
                }
                Some(WqeRepr {
                    wqe_index,
                    opmod,
                    opcode,
                    qpn: Qpn::new(qpn),
                    signature,
                    flags: CtrlFlags::from_bits_retain(flags),
                    imm,
                    remote: rdma.then_some(RemoteAddr {
                        addr: ra,
                        rkey: Rkey(rk),
                    }),
                    payload,
                })
            },
        )
}

proptest! {
    #[test]
    fn parse_emit_roundtrip(repr in wqe_repr()) {
        let len = repr.buffer_len().unwrap();
        prop_assert_eq!(len % BASIC_BLOCK, 0);
        let mut buf = vec![0xa5u8; len];
        prop_assert_eq!(repr.emit(&mut buf), Ok(len));
        let view = Wqe::new_checked(&buf[..]).unwrap();
        prop_assert_eq!(view.byte_len(), usize::from(repr.ds().unwrap()) * 16);
        prop_assert!(buf[view.byte_len()..].iter().all(|&b| b == 0));
        prop_assert_eq!(WqeRepr::<4>::parse(&view), Ok(repr));
    }

    #[test]
    fn request_roundtrip(repr in wqe_repr(), wr_id in any::<u64>()) {
        // Through the generic request and back: same WQE up to the bits a
        // request does not express.
        let wr = match repr.to_request(wr_id) {
            Ok(wr) => wr,
            Err(_) => return Ok(()),
        };
        prop_assert_eq!(wr.wr_id, wr_id);
        let back = WqeRepr::from_request(&wr, repr.qpn, repr.wqe_index).unwrap();
        prop_assert_eq!(back.to_request(wr_id), Ok(wr.clone()));
        prop_assert_eq!(back.opcode, repr.opcode);
        prop_assert_eq!(back.payload, repr.payload);
        prop_assert_eq!(back.remote, repr.remote);
        prop_assert_eq!(wr.opcode.has_imm(), matches!(wr.opcode, WrOpcode::RdmaWriteWithImm | WrOpcode::SendWithImm));
    }

    #[test]
    fn parse_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        if let Ok(view) = Wqe::new_checked(&bytes[..]) {
            if let Ok(repr) = WqeRepr::<4>::parse(&view) {
                let mut out = vec![0u8; repr.buffer_len().unwrap()];
                repr.emit(&mut out).unwrap();
                prop_assert_eq!(WqeRepr::<4>::parse(&Wqe::new_checked(&out[..]).unwrap()), Ok(repr));
            }
        }
    }
}
