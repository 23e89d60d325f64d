//! The communicator's logic end to end on the host fake device: the same
//! progress loop, core engines, plans, slot addressing, staging and event
//! ordering as on a GPU, with the core's kernels, in random interleavings.
//! Results must equal the core's reference ([`ringcc_core::verify`]) bit
//! for bit: the check is `perf`'s, the one the GPU runs.

use proptest::prelude::*;
use ringcc_core::verify::fill_input;
use ringcc_core::{Collective, DataType, Rank, ReduceOp};
use ringcc_cuda::device::fake::FakeDevice;
use ringcc_cuda::device::{Device, SliceOp, SlotUse};
use ringcc_cuda::kernel::{KernelKey, ModuleKey};
use ringcc_cuda::layout::{BufId, Layout, MemRef, StreamId};
use ringcc_cuda::perf::{self, PerfCase};
use ringcc_cuda::CallBuffers;
use ringcc_cuda::{Call, Config, Error, HostCall, HostComm};

fn case(call: Call, in_place: bool) -> PerfCase {
    PerfCase {
        call,
        in_place,
        warmup: 0,
        iters: 1,
    }
}

/// One call on fresh inputs, checked by `perf::verify` (the core's
/// `fill_input` and `count_wrong`).
fn check(comm: &mut HostComm, spec: Call, in_place: bool) -> Result<(), TestCaseError> {
    let wrong = perf::verify(comm, &case(spec, in_place))
        .map_err(|e| TestCaseError::fail(format!("{spec:?} in place {in_place}: {e}")))?;
    prop_assert_eq!(wrong, 0, "{:?} in place {}", spec, in_place);
    Ok(())
}

/// Every rank's call with inputs from the core's generator.
fn host_calls(spec: &Call, n: u32, config: &Config) -> Vec<HostCall> {
    let plan = spec.plan_with(n, config).unwrap();
    let (ib, _) = spec.bytes(n, config).unwrap();
    (0..n)
        .map(|r| {
            let mut input = vec![0; ib as usize];
            fill_input(&plan, spec.op, r, 1, &mut input).unwrap();
            HostCall {
                spec: *spec,
                input,
                in_place: false,
            }
        })
        .collect()
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
        check(&mut comm, spec, in_place)?;
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
            check(&mut comm, spec, i % 2 == 1)?;
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
    check(&mut comm, spec, false).unwrap();
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
    let mut calls = host_calls(&spec, 3, &config);
    calls[1].spec.op = ReduceOp::Max;
    // Rank 1's successor (rank 2) finds the header of a different call.
    let cause = match comm.run(&calls) {
        Err(
            e @ Error::Core {
                channel: Some(_),
                source: ringcc_core::Error::MismatchedCall { .. },
                ..
            },
        ) => e.to_string(),
        other => panic!("expected MismatchedCall, got {other:?}"),
    };
    let calls = host_calls(&spec, 3, &config);
    match comm.run(&calls) {
        Err(Error::Poisoned { cause: c }) => assert_eq!(c, cause),
        other => panic!("expected Poisoned, got {other:?}"),
    }
    assert_eq!(comm.state().failure(), Some(cause.as_str()));
    assert!(comm.state().engines().iter().all(|e| e.failure().is_some()));
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
    let mut calls = host_calls(&spec, 2, &config);
    calls[0].input.truncate(8 * 19);
    assert!(matches!(
        comm.run(&calls),
        Err(Error::BadBuffer {
            rank: Rank(0),
            expected: 160,
            got: 152,
            ..
        })
    ));
    // Not poisoned: a correct call still works.
    let calls = host_calls(&spec, 2, &config);
    assert!(comm.run(&calls).is_ok());
    assert!(matches!(
        comm.run(&calls[..1]),
        Err(Error::RankCount { .. })
    ));
}

/// The fake device's protocol checker fires when slots are misused, so
/// the tests above would fail if the progress loop forgot an event wait.
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

/// `perf`'s test-only fault corrupts elements of the victim's output in
/// the device's memory after the call ran; the core's `count_wrong` finds
/// each of them, on every collective, in place and out of place, and no
/// more than them. As many as the output has when asked for more.
#[test]
fn corrupted_outputs_are_found_by_the_cores_check() {
    let config = Config::small(64, 2).unwrap();
    let n = 3;
    for collective in (0..5).map(|k| collective(k, 1)) {
        for in_place in [false, true] {
            for dtype in [DataType::F32, DataType::Bf16, DataType::I8] {
                let mut comm = HostComm::new(vec![0, 1, 1], config, |_, _| false, 7, 3).unwrap();
                let spec = Call::new(collective, 301, dtype, ReduceOp::Sum);
                let c = case(spec, in_place);
                assert_eq!(perf::verify(&mut comm, &c).unwrap(), 0, "{spec:?}");
                assert_eq!(
                    perf::verify_corrupted(&mut comm, &c, 3).unwrap(),
                    3,
                    "{spec:?} in place {in_place}"
                );
                // The corruption is in the device's memory: the victim's
                // output as it stands now differs from the reference.
                let v = perf::victim(&spec);
                let salt = comm.state().seq() - 1;
                let plan = spec.plan_with(n, &config).unwrap();
                let out = comm.device().output(v).unwrap();
                assert_eq!(
                    ringcc_core::verify::count_wrong(&plan, spec.op, v.0, salt, out).unwrap(),
                    3
                );
                let elems = spec.bytes(n, &config).unwrap().1 / u64::from(dtype.size());
                assert_eq!(
                    perf::verify_corrupted(&mut comm, &c, u64::MAX).unwrap(),
                    elems,
                    "{spec:?} all corrupted"
                );
                comm.close().unwrap();
            }
        }
    }
}

/// `perf::run` times and checks on the fake device as on a GPU.
#[test]
fn perf_runs_on_the_fake_device() {
    let config = Config::small(256, 2).unwrap();
    let mut comm = HostComm::new(vec![0, 0, 0, 0], config, |_, _| true, 1, 2).unwrap();
    let call = Call::new(
        Collective::ReduceScatter,
        1000,
        DataType::F16,
        ReduceOp::Avg,
    );
    let r = perf::run(
        &mut comm,
        &PerfCase {
            call,
            in_place: true,
            warmup: 1,
            iters: 2,
        },
    )
    .unwrap();
    assert_eq!(r.wrong, 0);
    assert_eq!(r.bytes, 4 * 1000 * 2);
    assert!(r.time_us > 0.0 && r.busbw > 0.0, "{r:?}");
    // Warm-up, timed calls and the check: one engine sequence number each.
    assert_eq!(comm.state().seq(), 4);
    assert!(comm.close().is_ok());
}

/// `close` reports what dropping would lose: a communicator an earlier
/// failure poisoned, with that failure as the cause.
#[test]
fn close_reports_a_poisoned_communicator() {
    let config = Config::small(64, 1).unwrap();
    let mut comm = HostComm::new(vec![0, 0], config, |_, _| true, 5, 1).unwrap();
    let spec = Call::all_reduce(64, DataType::U32, ReduceOp::Min);
    let mut calls = host_calls(&spec, 2, &config);
    calls[0].spec.op = ReduceOp::Max;
    let e = comm.run(&calls).unwrap_err();
    assert!(
        matches!(
            e.core_error(),
            Some(ringcc_core::Error::MismatchedCall { .. })
        ),
        "{e:?}"
    );
    match comm.close() {
        Err(Error::Poisoned { cause }) => {
            assert_eq!(cause, e.to_string());
            assert!(cause.contains("channel 0"), "{cause}");
        }
        other => panic!("expected Poisoned from close, got {other:?}"),
    }
    // A healthy communicator closes cleanly.
    let mut comm = HostComm::new(vec![0, 0], config, |_, _| true, 5, 1).unwrap();
    comm.run(&host_calls(&spec, 2, &config)).unwrap();
    assert!(comm.close().is_ok());
}
