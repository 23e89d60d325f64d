//! Plan step → work requests: the requests a SEND slice becomes, the
//! capacity checks that come before them, the credit return and the
//! widening of immediates.

use proptest::prelude::*;
use ringcc_core::fifo::FifoGeometry;
use ringcc_core::prim::SlotSpan;
use ringcc_core::protocol::post::{
    credit_write, decode_credit, tail_from_completion, widen_step, LocalBuf, RemoteCounter,
    RemoteFifo, RemoteHeader, SliceWrites,
};
use ringcc_core::wire::{
    CallHeader, CallHeaderRepr, Completion, Error, Lkey, Payload, RemoteAddr, Rkey, SendFlags,
    WcOpcode, WcStatus, WorkRequest, WrOpcode,
};
use ringcc_core::{CallDesc, ChunkId, Collective, DataType, Exec, Primitive, ReduceOp};

fn exec(step: u64, slots: u64, count: u64, header: Option<CallDesc>) -> Exec {
    Exec {
        primitive: Primitive::SEND,
        chunk: ChunkId(0),
        loop_index: 0,
        step_index: 0,
        slice: 0,
        input_offset: 0,
        output_offset: 0,
        count,
        recv: None,
        send: Some(SlotSpan { step, slots }),
        header,
    }
}

const LOCAL: LocalBuf = LocalBuf {
    addr: 0x30_0000,
    lkey: Lkey(0x77),
};
const FIFO: RemoteFifo = RemoteFifo {
    addr: 0x10_0000,
    rkey: Rkey(0x55),
    capacity: 8 * 512 * 1024,
};
const MAILBOX: RemoteHeader = RemoteHeader {
    addr: 0x20_0000,
    rkey: Rkey(0x66),
    capacity: 64,
};

fn desc() -> CallDesc {
    CallDesc::new(
        3,
        Collective::AllReduce,
        1 << 20,
        DataType::F32,
        ReduceOp::Sum,
    )
}

#[test]
fn first_slice_is_header_then_write_with_imm() {
    // NCCL geometry: 512 KiB slots; step 9 is slot 1, at byte 512 KiB.
    let e = exec(9, 2, 1000, Some(desc()));
    let w = SliceWrites::<2>::new(
        &e,
        &FifoGeometry::NCCL,
        DataType::F32,
        LOCAL,
        &FIFO,
        &MAILBOX,
        42,
    )
    .unwrap();
    assert_eq!(w.len(), 2);
    assert_eq!(w.data_len(), 4000);
    assert_eq!(w.remote_offset(), 512 * 1024);
    assert_eq!(w.imm(), 11);
    let want = CallHeaderRepr {
        desc: desc(),
        step: 9,
    };
    assert_eq!(w.header(), Some(&want), "the header still to be written");
    let mut w = w;
    let first = w.next().expect("the header's write");
    assert_eq!(w.header(), None, "written");
    let wrs: Vec<WorkRequest<2>> = core::iter::once(first).chain(w).collect();

    // 1. Inline RDMA WRITE of the call header into the mailbox, unsignaled.
    let h = &wrs[0];
    assert_eq!(h.opcode, WrOpcode::RdmaWrite);
    assert_eq!(h.flags, SendFlags::INLINE);
    assert_eq!(
        h.remote,
        Some(RemoteAddr {
            addr: 0x20_0000,
            rkey: Rkey(0x66)
        })
    );
    let Payload::Inline(bytes) = &h.payload else {
        panic!("header not inline")
    };
    let parsed = CallHeaderRepr::parse(&CallHeader::new_checked(&bytes[..]).unwrap()).unwrap();
    assert_eq!(
        parsed,
        CallHeaderRepr {
            desc: desc(),
            step: 9
        }
    );

    // 2. The data: one signaled WRITE WITH IMM, imm = span.end() = 11.
    let d = &wrs[1];
    assert_eq!(d.opcode, WrOpcode::RdmaWriteWithImm);
    assert_eq!(d.flags, SendFlags::SIGNALED);
    assert_eq!(d.imm, 11);
    assert_eq!(d.wr_id, 42);
    assert_eq!(
        d.remote,
        Some(RemoteAddr {
            addr: 0x10_0000 + 512 * 1024,
            rkey: Rkey(0x55)
        })
    );
    let Payload::Gather(sgl) = &d.payload else {
        panic!("data inline")
    };
    assert_eq!(sgl.len(), 1);
    assert_eq!(
        (sgl[0].addr, sgl[0].length, sgl[0].lkey),
        (0x30_0000, 4000, Lkey(0x77))
    );
    for wr in &wrs {
        assert_eq!(wr.validate(), Ok(()));
    }
}

#[test]
fn empty_slice_is_a_zero_length_write_with_imm() {
    let e = exec(16, 4, 0, None);
    let wrs: Vec<WorkRequest<1>> = SliceWrites::new(
        &e,
        &FifoGeometry::NCCL,
        DataType::U8,
        LOCAL,
        &FIFO,
        &MAILBOX,
        1,
    )
    .unwrap()
    .collect();
    assert_eq!(wrs.len(), 1);
    assert_eq!(wrs[0].opcode, WrOpcode::RdmaWriteWithImm);
    assert!(wrs[0].is_empty());
    assert_eq!(wrs[0].imm, 20);
    assert_eq!(wrs[0].remote.unwrap().addr, 0x10_0000);
    assert_eq!(wrs[0].validate(), Ok(()));
}

/// The writes of data slice `e` (F32, NCCL geometry) into [`FIFO`].
fn data_writes(e: &Exec) -> SliceWrites<1> {
    SliceWrites::new(
        e,
        &FifoGeometry::NCCL,
        DataType::F32,
        LOCAL,
        &FIFO,
        &MAILBOX,
        1,
    )
    .unwrap()
}

#[test]
fn a_write_size_outside_1_to_2_pow_31_is_malformed() {
    let e = exec(0, 1, 1000, None);
    let writes = || data_writes(&e);
    assert_eq!(writes().with_max_write(0).err(), Some(Error::Malformed));
    assert_eq!(
        writes().with_max_write((1 << 31) + 1).err(),
        Some(Error::Malformed)
    );
    assert!(writes().with_max_write(1 << 31).is_ok());
    assert!(writes().with_max_write(1).is_ok());
}

#[test]
fn long_slices_split_at_max_write() {
    let e = exec(0, 1, 1000, None);
    let wrs: Vec<WorkRequest<1>> = data_writes(&e).with_max_write(1500).unwrap().collect();
    let shape: Vec<_> = wrs
        .iter()
        .map(|w| (w.opcode, w.len(), w.remote.unwrap().addr, w.flags))
        .collect();
    assert_eq!(
        shape,
        [
            (WrOpcode::RdmaWrite, 1500, 0x10_0000, SendFlags::empty()),
            (
                WrOpcode::RdmaWrite,
                1500,
                0x10_0000 + 1500,
                SendFlags::empty()
            ),
            (
                WrOpcode::RdmaWriteWithImm,
                1000,
                0x10_0000 + 3000,
                SendFlags::SIGNALED
            ),
        ]
    );
}

#[test]
fn bounds_are_checked_before_anything_is_formed() {
    let g = FifoGeometry::new(1024, 1).unwrap();
    let mk = |e: &Exec, fifo: &RemoteFifo, mailbox: &RemoteHeader| {
        SliceWrites::<1>::new(e, &g, DataType::U32, LOCAL, fifo, mailbox, 0).map(|_| ())
    };
    // Step 3 → slot 3 at 3072; 256 u32 = 1024 bytes → ends at 4096.
    let e = exec(3, 1, 256, None);
    let tight = RemoteFifo {
        capacity: 4096,
        ..FIFO
    };
    assert_eq!(mk(&e, &tight, &MAILBOX), Ok(()));
    let short = RemoteFifo {
        capacity: 4095,
        ..FIFO
    };
    assert_eq!(
        mk(&e, &short, &MAILBOX),
        Err(Error::RemoteOverrun {
            offset: 3072,
            len: 1024,
            capacity: 4095
        })
    );
    // More bytes than the slot holds.
    assert_eq!(
        mk(&exec(3, 1, 257, None), &FIFO, &MAILBOX),
        Err(Error::SliceOverflow {
            len: 1028,
            room: 1024
        })
    );
    // A span running past the last slot.
    assert_eq!(
        mk(&exec(7, 2, 1, None), &FIFO, &MAILBOX),
        Err(Error::SliceOverflow { len: 4, room: 1024 })
    );
    // A mailbox too small for the header.
    let small = RemoteHeader {
        capacity: 31,
        ..MAILBOX
    };
    assert_eq!(
        mk(&exec(0, 1, 1, Some(desc())), &FIFO, &small),
        Err(Error::RemoteOverrun {
            offset: 0,
            len: 32,
            capacity: 31
        })
    );
    // No send span.
    let mut e = exec(0, 1, 1, None);
    e.send = None;
    assert_eq!(mk(&e, &FIFO, &MAILBOX), Err(Error::NoSendSpan));
    // N = 0 cannot hold the data's SGE.
    assert_eq!(
        SliceWrites::<0>::new(
            &exec(0, 1, 1, None),
            &g,
            DataType::U8,
            LOCAL,
            &FIFO,
            &MAILBOX,
            0
        )
        .map(|_| ()),
        Err(Error::Exhausted)
    );
}

#[test]
fn credit_return_and_widening() {
    let c = RemoteCounter {
        addr: 0x9000,
        rkey: Rkey(3),
    };
    let w = credit_write::<1>(0x0102_0304_0506_0708, &c, 5).unwrap();
    // As both its callers post it: the immediate wakes the sender, the
    // completion retires the request.
    assert_eq!(w.opcode, WrOpcode::RdmaWriteWithImm);
    assert_eq!(w.imm, 0x0506_0708);
    assert!(w.flags.contains(SendFlags::INLINE | SendFlags::SIGNALED));
    assert_eq!(w.wr_id, 5);
    let Payload::Inline(b) = &w.payload else {
        panic!()
    };
    assert_eq!(&b[..], &[1, 2, 3, 4, 5, 6, 7, 8]);
    assert_eq!(
        decode_credit([1, 2, 3, 4, 5, 6, 7, 8]),
        0x0102_0304_0506_0708
    );

    assert_eq!(widen_step(5, 0), 5);
    assert_eq!(widen_step(5, 5), 5);
    assert_eq!(widen_step(3, 0x1_0000_0001), 0x1_0000_0003);
    assert_eq!(widen_step(3, 0x1_0000_0005), 0x2_0000_0003);
    assert_eq!(widen_step(0, 0xffff_fffc), 0x1_0000_0000);
    assert_eq!(widen_step(0, u64::MAX), u64::MAX);

    let done = Completion {
        wr_id: 0,
        status: WcStatus::Success,
        opcode: WcOpcode::RecvRdmaWithImm,
        byte_len: 0,
        imm: Some(2),
        qp_num: 1,
    };
    assert_eq!(
        tail_from_completion(&done, 0xffff_fffe),
        Some(0x1_0000_0002)
    );
    let failed = Completion {
        status: WcStatus::WrFlushErr,
        ..done
    };
    assert_eq!(tail_from_completion(&failed, 0), None);
    let send = Completion {
        opcode: WcOpcode::RdmaWrite,
        ..done
    };
    assert_eq!(tail_from_completion(&send, 0), None);
}

fn geometry() -> impl Strategy<Value = FifoGeometry> {
    (1..=64u64, prop::sample::select(vec![1u64, 2, 4]))
        .prop_map(|(units, sps)| FifoGeometry::new(units * 16, sps).unwrap())
}

proptest! {
    #[test]
    fn writes_never_exceed_the_advertised_capacity(
        g in geometry(),
        step in prop_oneof![0..64u64, any::<u64>()],
        slots in 0..10u64,
        count in prop_oneof![0..600u64, any::<u64>()],
        dtype in prop::sample::select(DataType::ALL.to_vec()),
        capacity in prop_oneof![0..9000u64, any::<u64>()],
        fifo_addr in prop_oneof![0..1_000_000u64, any::<u64>()],
        mailbox_cap in 0..64u64,
        header in any::<bool>(),
        max_write in 1..5000u32,
    ) {
        let fifo = RemoteFifo { addr: fifo_addr, rkey: Rkey(1), capacity };
        let mailbox = RemoteHeader { addr: 0x5000, rkey: Rkey(2), capacity: mailbox_cap };
        let e = exec(step, slots, count, header.then(desc));
        let r = SliceWrites::<1>::new(&e, &g, dtype, LOCAL, &fifo, &mailbox, 9);
        let len = count.checked_mul(u64::from(dtype.size()));
        let slot = step % 8;
        let offset = slot * g.slot_bytes();
        match r {
            Err(Error::RemoteOverrun { offset: o, len: l, capacity: c }) => {
                if o == 0 && l == 32 && header && c == mailbox_cap {
                    prop_assert!(mailbox_cap < 32);
                } else {
                    prop_assert_eq!((o, Some(l), c), (offset, len, capacity));
                    prop_assert!(offset.checked_add(l).is_none_or(|end| end > capacity));
                }
            }
            Err(Error::SliceOverflow { .. }) => {
                let room = slots.min(8 - slot) * g.slot_bytes();
                prop_assert!(slots == 0 || slot + slots > 8 || len.is_none_or(|l| l > room));
            }
            Err(Error::Malformed) => {
                prop_assert!(fifo_addr.checked_add(offset).and_then(|a| a.checked_add(len.unwrap())).is_none());
            }
            Err(other) => prop_assert!(false, "unexpected {:?}", other),
            Ok(w) => {
                let len = len.unwrap();
                prop_assert!(slots >= 1 && slot + slots <= 8);
                prop_assert!(len <= slots * g.slot_bytes());
                prop_assert!(offset + len <= capacity);
                prop_assert!(!header || mailbox_cap >= 32);
                let w = w.with_max_write(max_write).unwrap();
                let n = w.len();
                let wrs: Vec<_> = w.collect();
                prop_assert_eq!(wrs.len(), n);
                // Data requests tile [offset, offset + len) in order, each
                // inside the capacity; only the last carries the immediate.
                let data: Vec<_> = wrs.iter().filter(|w| !w.flags.contains(SendFlags::INLINE)).collect();
                prop_assert_eq!(wrs.len() - data.len(), usize::from(header));
                let mut at = fifo_addr + offset;
                for (i, d) in data.iter().enumerate() {
                    prop_assert_eq!(d.validate(), Ok(()));
                    let remote = d.remote.unwrap();
                    prop_assert_eq!(remote.addr, at);
                    prop_assert!(remote.addr - fifo_addr + d.len() <= capacity);
                    prop_assert!(d.len() <= u64::from(max_write));
                    at += d.len();
                    let last = i + 1 == data.len();
                    prop_assert_eq!(d.opcode == WrOpcode::RdmaWriteWithImm, last);
                    prop_assert_eq!(d.flags.contains(SendFlags::SIGNALED), last);
                    if last {
                        prop_assert_eq!(d.imm, step.saturating_add(slots) as u32);
                    }
                }
                prop_assert_eq!(at, fifo_addr + offset + len);
            }
        }
    }

    #[test]
    fn widen_step_inverts_truncation(last in any::<u64>(), ahead in 0..(1u64 << 32)) {
        if let Some(step) = last.checked_add(ahead) {
            prop_assert_eq!(widen_step(step as u32, last), step);
        }
    }
}

/// Each kind of work request names itself in error messages.
#[test]
fn kinds_name_themselves_for_error_messages() {
    use ringcc_core::protocol::Kind;
    let names = [
        (Kind::Data, "data write"),
        (Kind::Credit, "credit return"),
        (Kind::TailRecv, "data receive"),
        (Kind::CreditRecv, "credit receive"),
    ];
    for (k, name) in names {
        assert_eq!(k.what(), name);
    }
}
