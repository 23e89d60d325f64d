//! The communicator's logic end to end on the host fake device: the same
//! progress loop, plans, machines, slot addressing, staging and event
//! ordering as on a GPU, with the core's kernels, in random interleavings.
//! Results must equal the core's reference bit for bit.

use proptest::prelude::*;
use ringcc_core::{Collective, DataType, Rank, ReduceOp};
use ringcc_cuda::engine::fake::FakeDevice;
use ringcc_cuda::engine::{Engine, SliceOp, SlotUse};
use ringcc_cuda::kernel::{KernelKey, ModuleKey};
use ringcc_cuda::layout::{BufId, Layout, MemRef, StreamId};
use ringcc_cuda::reference::{expected, pattern};
use ringcc_cuda::CallBuffers;
use ringcc_cuda::{Call, Config, Error, HostCall, HostComm};

fn inputs_for(
    spec: &Call,
    n: u32,
    config: &Config,
    in_place: bool,
) -> (Vec<Vec<u8>>, Vec<HostCall>) {
    let (ib, _) = spec.bytes(n, config).unwrap();
    let elems = ib / u64::from(spec.dtype.size());
    let mut raw = Vec::new();
    let mut calls = Vec::new();
    for r in 0..n {
        let input = pattern(spec.dtype, spec.op, elems, u64::from(r) * 7919 + spec.count);
        let buffer = if in_place {
            let bp = spec.in_place(n, r, config).unwrap();
            let mut b = vec![0x5Au8; bp.total as usize];
            b[bp.input.0 as usize..(bp.input.0 + bp.input.1) as usize].copy_from_slice(&input);
            b
        } else {
            input.clone()
        };
        raw.push(input);
        calls.push(HostCall {
            spec: *spec,
            input: buffer,
            in_place,
        });
    }
    (raw, calls)
}

fn check(
    comm: &mut HostComm,
    spec: Call,
    config: &Config,
    in_place: bool,
) -> Result<(), TestCaseError> {
    let n = comm.layout().ranks();
    let (raw, calls) = inputs_for(&spec, n, config, in_place);
    let got = comm
        .run(&calls)
        .map_err(|e| TestCaseError::fail(format!("{e}")))?;
    let want = expected(&spec, &raw).unwrap();
    for r in 0..n as usize {
        if let Some(w) = &want[r] {
            prop_assert_eq!(&got[r], w, "rank {} of {:?}", r, spec);
        }
    }
    Ok(())
}

fn collective(kind: u8, root: u32) -> Collective {
    match kind {
        0 => Collective::AllReduce,
        1 => Collective::ReduceScatter,
        2 => Collective::AllGather,
        3 => Collective::Broadcast { root: Rank(root) },
        _ => Collective::Reduce { root: Rank(root) },
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 160, ..ProptestConfig::default() })]

    /// Any collective, type, op, rank count, device placement, peer
    /// access, channel count, size and interleaving: the reference result.
    #[test]
    fn every_collective_matches_the_reference(
        kind in 0u8..5,
        dtype in prop::sample::select(DataType::ALL.to_vec()),
        op in prop::sample::select(ReduceOp::ALL.to_vec()),
        ranks in 1u32..6,
        root_pick in 0u32..6,
        channels in 1u8..4,
        count in 0u64..400,
        devices_seed in any::<u64>(),
        peer in any::<bool>(),
        in_place in any::<bool>(),
        seed in any::<u64>(),
        eagerness in 0u32..6,
    ) {
        let config = Config::small(64, channels).unwrap();
        let devices: Vec<usize> = (0..ranks).map(|r| ((devices_seed >> (2 * r)) & 3) as usize).collect();
        let mut comm = HostComm::new(devices, config, move |_, _| peer, seed, eagerness).unwrap();
        let spec = Call { collective: collective(kind, root_pick % ranks), count, dtype, op };
        check(&mut comm, spec, &config, in_place)?;
    }

    /// Several calls in a row on one communicator: the connection counters
    /// and slot events carry over from call to call.
    #[test]
    fn consecutive_calls_reuse_the_connections(
        kinds in prop::collection::vec(0u8..5, 2..6),
        ranks in 2u32..5,
        counts in prop::collection::vec(0u64..300, 5),
        seed in any::<u64>(),
    ) {
        let config = Config::small(32, 2).unwrap();
        let devices: Vec<usize> = (0..ranks).map(|r| (r % 2) as usize).collect();
        let mut comm = HostComm::new(devices, config, |_, _| false, seed, 3).unwrap();
        for (i, &k) in kinds.iter().enumerate() {
            let spec = Call {
                collective: collective(k, i as u32 % ranks),
                count: counts[i % counts.len()],
                dtype: DataType::F32,
                op: ReduceOp::Sum,
            };
            check(&mut comm, spec, &config, i % 2 == 1)?;
        }
    }
}

#[test]
fn nccl_sized_fifo_large_buffer() {
    // The default geometry (512 KiB slots) over a buffer of several loops.
    let config = Config::default();
    let mut comm = HostComm::new(vec![0, 0, 1, 1], config, |_, _| true, 1, 4).unwrap();
    let spec = Call {
        collective: Collective::AllReduce,
        count: 3 << 20,
        dtype: DataType::Bf16,
        op: ReduceOp::Avg,
    };
    check(&mut comm, spec, &config, false).unwrap();
}

#[test]
fn mismatched_calls_fail_and_poison_the_communicator() {
    let config = Config::small(64, 2).unwrap();
    let mut comm = HostComm::new(vec![0, 0, 0], config, |_, _| true, 3, 2).unwrap();
    let spec = Call {
        collective: Collective::AllReduce,
        count: 100,
        dtype: DataType::I32,
        op: ReduceOp::Sum,
    };
    let (_, mut calls) = inputs_for(&spec, 3, &config, false);
    calls[1].spec.op = ReduceOp::Max;
    match comm.run(&calls) {
        Err(Error::Core {
            source: ringcc_core::Error::MismatchedCall { .. },
            ..
        }) => {}
        other => panic!("expected MismatchedCall, got {other:?}"),
    }
    let (_, calls) = inputs_for(&spec, 3, &config, false);
    assert!(matches!(comm.run(&calls), Err(Error::Poisoned { .. })));
}

#[test]
fn short_buffers_are_rejected_before_anything_runs() {
    let config = Config::small(64, 1).unwrap();
    let mut comm = HostComm::new(vec![0, 0], config, |_, _| true, 3, 2).unwrap();
    let spec = Call {
        collective: Collective::ReduceScatter,
        count: 10,
        dtype: DataType::F64,
        op: ReduceOp::Sum,
    };
    let (_, mut calls) = inputs_for(&spec, 2, &config, false);
    calls[0].input.truncate(8 * 19);
    assert!(matches!(
        comm.run(&calls),
        Err(Error::BadBuffer {
            rank: 0,
            expected: 160,
            got: 152,
            ..
        })
    ));
    // Not poisoned: a correct call still works.
    let (_, calls) = inputs_for(&spec, 2, &config, false);
    assert!(comm.run(&calls).is_ok());
    assert!(matches!(
        comm.run(&calls[..1]),
        Err(Error::RankCount { .. })
    ));
}

/// The fake device's protocol checker fires when slots are misused, so
/// the tests above could fail if the progress loop forgot an event wait.
#[test]
fn fake_device_detects_slot_hazards() {
    let config = Config::small(64, 1).unwrap();
    let layout = Layout::new(vec![0, 0], 1, config.geometry, |_, _| true).unwrap();
    let mut dev = FakeDevice::new(layout.clone(), 0, 0);
    dev.bind(Rank(0), vec![1; 64], (0, 64), (0, 64), Some(vec![0; 64]));
    let conn = layout.outgoing(ringcc_core::ChannelId(0), Rank(0));
    let span = ringcc_core::prim::SlotSpan { step: 0, slots: 1 };
    let op = SliceOp {
        kernel: KernelKey {
            primitive: ringcc_core::Primitive::SEND_ONLY,
            module: ModuleKey {
                dtype: DataType::U8,
                op: ReduceOp::Sum,
            },
        },
        count: 64,
        recv: None,
        input: Some(MemRef {
            buf: BufId::Input(Rank(0)),
            offset: 0,
        }),
        output: None,
        send: Some(layout.slot_ref(BufId::Fifo(conn), span)),
        nranks: 2,
        reads: None,
        writes: Some(SlotUse { conn, span }),
    };
    let s = StreamId::Channel(ringcc_core::ChannelId(0), Rank(0));
    dev.launch(s, &op).unwrap();
    dev.launch(s, &op).unwrap();
    assert!(matches!(dev.synchronize(), Err(Error::Hazard { .. })));
    // Out-of-bounds accesses are caught too.
    let mut dev = FakeDevice::new(layout, 0, 0);
    dev.bind(Rank(0), vec![1; 32], (0, 32), (0, 32), Some(vec![0; 32]));
    dev.launch(s, &op).unwrap();
    assert!(matches!(dev.synchronize(), Err(Error::OutOfBounds { .. })));
}
