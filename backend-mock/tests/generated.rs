//! Generated inputs and write-time checks (`Cluster::run_generated`)
//! against the check with real buffers: the same runs, the same answers —
//! no wrong element where the buffers are right, every corrupted element
//! counted, the same simulated time — on every collective, in and out of
//! place, with the ring crossing NVLink and RDMA hops.

mod common;

use common::{buffers, check, small};
use proptest::prelude::*;
use ringcc_core::{Collective, DataType, Rank, ReduceOp};
use ringcc_mock::{Call, Cluster, GeneratedData};

fn collectives(root: u32) -> [Collective; 5] {
    [
        Collective::AllReduce,
        Collective::ReduceScatter,
        Collective::AllGather,
        Collective::Broadcast { root: Rank(root) },
        Collective::Reduce { root: Rank(root) },
    ]
}

/// One call both ways; returns the generated run's `#wrong` after
/// checking that both runs took the same simulated time.
fn both_ways(call: Call, in_place: bool, salt: u64, corrupt: u64) -> u64 {
    let cfg = small(2, 3, 2, 2);
    let mut real = Cluster::new(cfg.clone()).unwrap();
    let n = real.ranks();
    let calls = vec![call; n as usize];
    let mut bufs = buffers(&call, n, in_place, salt);
    let a = real.run(&calls, &mut bufs, in_place).unwrap();
    assert!(a.ok(), "{a:?}");
    check(&call, n, &bufs, in_place, salt);

    let mut gen = Cluster::new(cfg).unwrap();
    let mut data = GeneratedData::new(call, n, salt).unwrap();
    let victim = match call.collective {
        Collective::Reduce { root } => root,
        _ => Rank(0),
    };
    data.corrupt_output(victim, corrupt);
    let b = gen.run_generated(&calls, &mut data, in_place).unwrap();
    assert!(b.ok(), "{b:?}");
    assert_eq!((a.end - a.start), (b.end - b.start), "{call:?}");
    assert_eq!(a.events, b.events);
    data.wrong()
}

#[test]
fn every_collective_checks_clean_and_counts_every_corrupted_element() {
    for c in collectives(4) {
        for (dtype, op) in [
            (DataType::F32, ReduceOp::Sum),
            (DataType::Bf16, ReduceOp::Avg),
            (DataType::I8, ReduceOp::Prod),
            (DataType::U64, ReduceOp::Min),
            (DataType::F64, ReduceOp::Max),
        ] {
            for in_place in [false, true] {
                let call = Call::new(c, 777, dtype, op);
                assert_eq!(both_ways(call, in_place, 3, 0), 0, "{call:?} {in_place}");
                assert_eq!(both_ways(call, in_place, 3, 5), 5, "{call:?} {in_place}");
            }
        }
    }
}

#[test]
fn one_generated_data_serves_both_placements_and_repeated_runs() {
    let mut cl = Cluster::new(small(2, 2, 1, 1)).unwrap();
    let n = cl.ranks();
    let call = Call::new(Collective::ReduceScatter, 300, DataType::I32, ReduceOp::Sum);
    let mut data = GeneratedData::new(call, n, 9).unwrap();
    for in_place in [false, true, false] {
        let r = cl
            .run_generated(&vec![call; n as usize], &mut data, in_place)
            .unwrap();
        assert!(r.ok());
        assert_eq!(data.wrong(), 0);
    }
}

#[test]
fn a_call_the_data_was_not_made_for_is_refused() {
    let mut cl = Cluster::new(small(1, 2, 1, 1)).unwrap();
    let call = Call::new(Collective::AllReduce, 64, DataType::F32, ReduceOp::Sum);
    let other = Call::new(Collective::AllReduce, 65, DataType::F32, ReduceOp::Sum);
    let mut data = GeneratedData::new(call, 2, 1).unwrap();
    assert!(cl.run_generated(&[call, other], &mut data, false).is_err());
    let mut empty = GeneratedData::default();
    assert!(cl.run_generated(&[call, call], &mut empty, false).is_err());
    // The refused runs left the cluster usable.
    assert!(cl
        .run_generated(&[call, call], &mut data, false)
        .unwrap()
        .ok());
    assert_eq!(data.wrong(), 0);
}

#[test]
fn what_the_check_holds_is_the_reference_and_a_bit_per_output_element() {
    let call = Call::new(Collective::AllReduce, 1 << 20, DataType::F32, ReduceOp::Sum);
    // 4 MiB of reference, 128 KiB of bits per rank.
    assert_eq!(
        GeneratedData::bytes_needed(&call, 16),
        (4 << 20) + 16 * (128 << 10)
    );
    let ag = Call::new(Collective::AllGather, 1 << 20, DataType::F32, ReduceOp::Sum);
    assert_eq!(GeneratedData::bytes_needed(&ag, 16), 16 * (16 << 20) / 8);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn generated_and_real_buffers_agree(
        c in 0usize..5, count in 0u64..1500, d in 0usize..10, o in 0usize..5,
        in_place: bool, salt: u64, corrupt in 0u64..4,
    ) {
        let call = Call::new(collectives(5)[c], count, DataType::ALL[d], ReduceOp::ALL[o]);
        let out_len = match call.collective {
            Collective::AllGather => count * 6,
            _ => count,
        };
        prop_assert_eq!(both_ways(call, in_place, salt, corrupt), corrupt.min(out_len));
    }
}
