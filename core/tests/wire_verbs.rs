//! The generic work request and completion: values against rdma-core's
//! `libibverbs/verbs.h`, validation rules, and totality of the code
//! conversions.

use proptest::prelude::*;
use ringcc_core::wire::Error;
use ringcc_core::wire::{
    Completion, Lkey, Payload, RemoteAddr, Rkey, SendFlags, Sge, WcOpcode, WcStatus, WorkRequest,
    WrOpcode,
};

#[test]
fn wr_opcodes_are_verbs_h_values() {
    // rdma-core libibverbs/verbs.h, `enum ibv_wr_opcode` (implicit values
    // from 0 in declaration order).
    let expected = [
        (WrOpcode::RdmaWrite, 0),
        (WrOpcode::RdmaWriteWithImm, 1),
        (WrOpcode::Send, 2),
        (WrOpcode::SendWithImm, 3),
        (WrOpcode::RdmaRead, 4),
        (WrOpcode::AtomicCmpAndSwp, 5),
        (WrOpcode::AtomicFetchAndAdd, 6),
        (WrOpcode::LocalInv, 7),
        (WrOpcode::BindMw, 8),
        (WrOpcode::SendWithInv, 9),
        (WrOpcode::Tso, 10),
        (WrOpcode::Driver1, 11),
    ];
    for (op, code) in expected {
        assert_eq!(op.code(), code, "{op:?}");
        assert_eq!(WrOpcode::from_code(code), op);
    }
    assert_eq!(WrOpcode::from_code(12), WrOpcode::Unknown(12));
}

#[test]
fn send_flags_are_verbs_h_values() {
    // verbs.h `enum ibv_send_flags`: IBV_SEND_FENCE = 1 << 0,
    // IBV_SEND_SIGNALED = 1 << 1, IBV_SEND_SOLICITED = 1 << 2,
    // IBV_SEND_INLINE = 1 << 3.
    assert_eq!(SendFlags::FENCE.bits(), 1);
    assert_eq!(SendFlags::SIGNALED.bits(), 2);
    assert_eq!(SendFlags::SOLICITED.bits(), 4);
    assert_eq!(SendFlags::INLINE.bits(), 8);
}

#[test]
fn wc_values_are_verbs_h_values() {
    // verbs.h `enum ibv_wc_status`: IBV_WC_SUCCESS = 0 … in order,
    // IBV_WC_REM_ACCESS_ERR is the 11th (10), IBV_WC_RETRY_EXC_ERR 12,
    // IBV_WC_TM_RNDV_INCOMPLETE the last (23).
    assert_eq!(WcStatus::Success.code(), 0);
    assert_eq!(WcStatus::WrFlushErr.code(), 5);
    assert_eq!(WcStatus::RemAccessErr.code(), 10);
    assert_eq!(WcStatus::RetryExcErr.code(), 12);
    assert_eq!(WcStatus::RnrRetryExcErr.code(), 13);
    assert_eq!(WcStatus::FatalErr.code(), 19);
    assert_eq!(WcStatus::TmRndvIncomplete.code(), 23);
    // verbs.h `enum ibv_wc_opcode`: IBV_WC_SEND = 0, IBV_WC_RDMA_WRITE,
    // IBV_WC_RDMA_READ, …, IBV_WC_RECV = 1 << 7, IBV_WC_RECV_RDMA_WITH_IMM
    // right after it.
    assert_eq!(WcOpcode::Send.code(), 0);
    assert_eq!(WcOpcode::RdmaWrite.code(), 1);
    assert_eq!(WcOpcode::RdmaRead.code(), 2);
    assert_eq!(WcOpcode::Recv.code(), 128);
    assert_eq!(WcOpcode::RecvRdmaWithImm.code(), 129);
    assert!(WcOpcode::RecvRdmaWithImm.is_recv());
    assert!(!WcOpcode::RdmaWrite.is_recv());
    assert_eq!(
        WcOpcode::of_request(WrOpcode::RdmaWriteWithImm),
        Some(WcOpcode::RdmaWrite)
    );
    assert_eq!(WcOpcode::of_request(WrOpcode::Driver1), None);
}

fn sge(len: u32) -> Sge {
    Sge {
        addr: 0x1000,
        length: len,
        lkey: Lkey(7),
    }
}

const REMOTE: RemoteAddr = RemoteAddr {
    addr: 0x2000,
    rkey: Rkey(9),
};

#[test]
fn constructors_validate() {
    let w = WorkRequest::<2>::rdma_write_imm(1, &[sge(64)], REMOTE, 5)
        .unwrap()
        .signaled();
    assert_eq!(w.len(), 64);
    assert!(w.flags.contains(SendFlags::SIGNALED));
    assert_eq!(w.validate(), Ok(()));

    // Too many SGEs for N.
    assert_eq!(
        WorkRequest::<1>::send(1, &[sge(1), sge(2)]),
        Err(Error::Exhausted)
    );
    // Zero-length gather entries are refused (mlx5 skips them: the WQE
    // would not say what was asked).
    assert_eq!(
        WorkRequest::<1>::rdma_write(1, &[sge(0)], REMOTE),
        Err(Error::Malformed)
    );
    // An empty list is a zero-length message.
    let empty = WorkRequest::<1>::rdma_write_imm(1, &[], REMOTE, 3).unwrap();
    assert!(empty.is_empty());
    // Inline data above MAX_INLINE.
    assert_eq!(
        WorkRequest::<1>::inline_write(1, &[0u8; 65], REMOTE),
        Err(Error::Exhausted)
    );
    let inl = WorkRequest::<1>::inline_write(1, &[1, 2, 3], REMOTE).unwrap();
    assert!(inl.flags.contains(SendFlags::INLINE));
    assert!(matches!(inl.payload, Payload::Inline(ref d) if d.as_slice() == [1, 2, 3]));
}

#[test]
fn validate_rejects_inconsistent_requests() {
    let good = WorkRequest::<1>::send(1, &[sge(8)]).unwrap();
    let mut w = good.clone();
    w.remote = Some(REMOTE); // SEND has no remote address
    assert_eq!(w.validate(), Err(Error::Malformed));
    let mut w = good.clone();
    w.imm = 1; // immediate without *_WITH_IMM
    assert_eq!(w.validate(), Err(Error::Malformed));
    let mut w = good.clone();
    w.flags |= SendFlags::INLINE; // INLINE without inline payload
    assert_eq!(w.validate(), Err(Error::Malformed));
    let mut w = good.clone();
    w.opcode = WrOpcode::AtomicFetchAndAdd;
    assert_eq!(w.validate(), Err(Error::Unsupported));
    let mut w = WorkRequest::<1>::inline_write(1, &[1], REMOTE).unwrap();
    w.opcode = WrOpcode::RdmaRead; // READ cannot be inline
    assert_eq!(w.validate(), Err(Error::Malformed));
}

#[test]
fn completion_is_ok() {
    let c = Completion {
        wr_id: 3,
        status: WcStatus::from_code(0),
        opcode: WcOpcode::RdmaWrite,
        byte_len: 0,
        imm: None,
        qp_num: 1,
    };
    assert!(c.is_ok());
    assert!(!Completion {
        status: WcStatus::RetryExcErr,
        ..c
    }
    .is_ok());
}

proptest! {
    #[test]
    fn code_conversions_are_total_and_lossless(v in any::<u32>()) {
        prop_assert_eq!(WrOpcode::from_code(v).code(), v);
        prop_assert_eq!(WcStatus::from_code(v).code(), v);
        prop_assert_eq!(WcOpcode::from_code(v).code(), v);
    }
}
