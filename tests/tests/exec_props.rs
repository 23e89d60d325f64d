//! Property: any collective, on any topology, type, op, size, channel count,
//! chunk and FIFO geometry, in or out of place, under any interleaving of
//! events, gives exactly the reference result on every rank — and the same
//! bytes whatever the interleaving.

use proptest::prelude::*;
use ringcc_core::fifo::FifoGeometry;
use ringcc_core::{Collective, DataType, Plan, Rank, ReduceOp};
use ringcc_tests::exec::{run, Call, Config};
use ringcc_tests::reference::{expected, input};

#[derive(Debug, Clone)]
struct Case {
    cfg: Config,
    call: Call,
    salt: u64,
}

fn case() -> impl Strategy<Value = Case> {
    (
        (1..=4u32, 1..=4u32, 1..=3u16, any::<bool>()),
        (0..5u8, 0..16u32),
        prop::sample::select(DataType::ALL.to_vec()),
        prop::sample::select(ReduceOp::ALL.to_vec()),
        prop_oneof![3 => 0..300u64, 1 => 300..3000u64],
        (
            1..=4u32,
            1..=24u64,
            1..=8u64,
            prop::sample::select(vec![1u64, 2, 4]),
        ),
        (any::<bool>(), any::<u64>()),
    )
        .prop_map(
            |(
                (nodes, gpus, nics, cross_nic),
                (k, root),
                dtype,
                op,
                count,
                (channels, chunk_units, slot_units, sps),
                (in_place, seed),
            )| {
                let n = nodes * gpus;
                let root = Rank(root % n);
                let collective = match k {
                    0 => Collective::AllReduce,
                    1 => Collective::ReduceScatter,
                    2 => Collective::AllGather,
                    3 => Collective::Broadcast { root },
                    _ => Collective::Reduce { root },
                };
                let cfg = Config {
                    nodes,
                    gpus_per_node: gpus,
                    nics_per_node: nics,
                    cross_nic,
                    channels,
                    // Chunks must leave a slice of the FIFO free.
                    chunk_bytes: (chunk_units * u64::from(dtype.size())).min(
                        FifoGeometry::new(slot_units * 16, sps)
                            .unwrap()
                            .max_chunk_bytes(),
                    ),
                    geometry: FifoGeometry::new(slot_units * 16, sps).unwrap(),
                    in_place,
                    seed,
                    max_events: 20_000_000,
                };
                Case {
                    cfg,
                    call: Call {
                        collective,
                        count,
                        dtype,
                        op,
                    },
                    salt: seed.rotate_left(17),
                }
            },
        )
}

fn outputs(c: &Case, seed: u64) -> Vec<Option<Vec<u8>>> {
    let n = c.cfg.ranks();
    let plan = Plan::new(
        c.call.collective,
        c.call.count,
        c.call.dtype,
        n,
        c.cfg.channels,
        c.cfg.chunk_bytes,
    )
    .unwrap();
    let inputs: Vec<Vec<u8>> = (0..n).map(|r| input(&plan, c.call.op, r, c.salt)).collect();
    let cfg = Config {
        seed,
        ..c.cfg.clone()
    };
    let report = run(&cfg, &vec![c.call; n as usize], &inputs);
    assert!(
        report.ok(),
        "{:?}: errors {:?} stalled {} {:?}",
        c,
        report.errors,
        report.stalled,
        report.stalls
    );
    report.outputs
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 160, .. ProptestConfig::default() })]

    #[test]
    fn results_equal_the_reference(c in case()) {
        let n = c.cfg.ranks();
        let plan = Plan::new(c.call.collective, c.call.count, c.call.dtype, n, c.cfg.channels, c.cfg.chunk_bytes).unwrap();
        let got = outputs(&c, c.cfg.seed);
        for r in 0..n {
            if let Some(want) = expected(&plan, c.call.op, r, c.salt) {
                prop_assert!(got[r as usize].as_ref() == Some(&want), "rank {} of {:?}", r, c);
            }
        }
    }

    #[test]
    fn results_do_not_depend_on_the_interleaving(c in case(), other in any::<u64>()) {
        // Floats whose sums are inexact: the result still may not depend on
        // which rank or link happened to run first.
        let mut c = c;
        c.cfg.chunk_bytes = (c.cfg.chunk_bytes * (4 / u64::from(c.call.dtype.size()).min(4)))
            .min(c.cfg.geometry.max_chunk_bytes());
        c.call.dtype = DataType::F32;
        c.salt ^= 0x5555;
        let a = outputs(&c, c.cfg.seed);
        let b = outputs(&c, other);
        prop_assert_eq!(a, b);
    }
}

/// Large rings run too (a few hundred ranks, small buffers).
#[test]
fn large_rings() {
    for (nodes, gpus, coll) in [
        (32u32, 8u32, Collective::AllReduce),
        (16, 8, Collective::ReduceScatter),
        (64, 2, Collective::AllGather),
        (100, 3, Collective::Broadcast { root: Rank(123) }),
        (50, 4, Collective::Reduce { root: Rank(7) }),
    ] {
        let cfg = Config {
            nodes,
            gpus_per_node: gpus,
            nics_per_node: 4,
            cross_nic: true,
            channels: 2,
            chunk_bytes: 64,
            geometry: FifoGeometry::new(64, 1).unwrap(),
            in_place: false,
            seed: 99,
            max_events: 200_000_000,
        };
        let call = Call {
            collective: coll,
            count: 600,
            dtype: DataType::I64,
            op: ReduceOp::Sum,
        };
        let n = cfg.ranks();
        let plan = Plan::new(
            call.collective,
            call.count,
            call.dtype,
            n,
            cfg.channels,
            cfg.chunk_bytes,
        )
        .unwrap();
        let inputs: Vec<Vec<u8>> = (0..n).map(|r| input(&plan, call.op, r, 1)).collect();
        let report = run(&cfg, &vec![call; n as usize], &inputs);
        assert!(
            report.ok(),
            "{coll:?}: {:?}",
            report.errors.iter().flatten().next()
        );
        for r in 0..n {
            if let Some(want) = expected(&plan, call.op, r, 1) {
                assert!(
                    report.outputs[r as usize].as_ref() == Some(&want),
                    "rank {r} {coll:?}"
                );
            }
        }
    }
}
