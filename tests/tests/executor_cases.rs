//! Fixed cases of the in-memory executor: every collective on small rings,
//! edge cases of the plan, and mismatched calls.

use ringcc_core::fifo::FifoGeometry;
use ringcc_core::{Collective, DataType, EngineError, Error, Plan, Rank, ReduceOp};
use ringcc_tests::exec::{run, Call, Config};
use ringcc_tests::reference::{expected, input};

fn check(cfg: &Config, call: Call, salt: u64) {
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
    let inputs: Vec<Vec<u8>> = (0..n).map(|r| input(&plan, call.op, r, salt)).collect();
    let report = run(cfg, &vec![call; n as usize], &inputs);
    assert!(
        report.ok(),
        "{call:?} on {cfg:?}: {:?} stalled={} {:?}",
        report.errors,
        report.stalled,
        report.stalls
    );
    for r in 0..n {
        if let Some(want) = expected(&plan, call.op, r, salt) {
            let got = report.outputs[r as usize].as_ref().unwrap();
            assert!(
                got == &want,
                "rank {r} wrong result for {call:?} on {cfg:?}"
            );
        }
    }
}

const COLLECTIVES: [Collective; 5] = [
    Collective::AllReduce,
    Collective::ReduceScatter,
    Collective::AllGather,
    Collective::Broadcast { root: Rank(1) },
    Collective::Reduce { root: Rank(2) },
];

#[test]
fn seed_example_four_ranks_allreduce() {
    let cfg = Config::single_node(4);
    check(
        &cfg,
        Call {
            collective: Collective::AllReduce,
            count: 4,
            dtype: DataType::F32,
            op: ReduceOp::Sum,
        },
        7,
    );
}

#[test]
fn every_collective_type_and_op_on_small_rings() {
    for n in [1u32, 2, 3, 4, 5] {
        for coll in COLLECTIVES {
            let coll = match coll {
                Collective::Broadcast { root } => Collective::Broadcast {
                    root: Rank(root.0 % n),
                },
                Collective::Reduce { root } => Collective::Reduce {
                    root: Rank(root.0 % n),
                },
                c => c,
            };
            for dtype in DataType::ALL {
                for op in ReduceOp::ALL {
                    let mut cfg = Config::single_node(n);
                    cfg.seed = u64::from(n) * 31 + dtype.code() as u64;
                    check(
                        &cfg,
                        Call {
                            collective: coll,
                            count: 37,
                            dtype,
                            op,
                        },
                        3,
                    );
                }
            }
        }
    }
}

#[test]
fn multi_node_multi_channel_cross_nic_in_place() {
    for (nodes, gpus) in [(2u32, 2u32), (3, 2), (2, 4), (4, 1)] {
        for coll in COLLECTIVES {
            for in_place in [false, true] {
                let cfg = Config {
                    nodes,
                    gpus_per_node: gpus,
                    nics_per_node: 2,
                    cross_nic: true,
                    channels: 3,
                    chunk_bytes: 48,
                    geometry: FifoGeometry::new(16, 2).unwrap(),
                    in_place,
                    seed: 11,
                    max_events: 10_000_000,
                };
                check(
                    &cfg,
                    Call {
                        collective: coll,
                        count: 301,
                        dtype: DataType::I32,
                        op: ReduceOp::Sum,
                    },
                    5,
                );
            }
        }
    }
}

#[test]
fn empty_and_tiny_counts_still_complete() {
    for count in [0u64, 1, 2, 3, 15, 16, 17] {
        for coll in COLLECTIVES {
            let mut cfg = Config::single_node(4);
            cfg.channels = 4;
            check(
                &cfg,
                Call {
                    collective: coll,
                    count,
                    dtype: DataType::U8,
                    op: ReduceOp::Max,
                },
                count,
            );
        }
    }
}

#[test]
fn mismatched_count_is_detected_and_nobody_reports_success() {
    let cfg = Config::single_node(4);
    let good = Call {
        collective: Collective::AllReduce,
        count: 64,
        dtype: DataType::F32,
        op: ReduceOp::Sum,
    };
    for (bad_rank, bad) in [
        (2usize, Call { count: 65, ..good }),
        (
            0,
            Call {
                dtype: DataType::I32,
                ..good
            },
        ),
        (
            3,
            Call {
                op: ReduceOp::Max,
                ..good
            },
        ),
    ] {
        let mut calls = vec![good; 4];
        calls[bad_rank] = bad;
        let inputs: Vec<Vec<u8>> = calls
            .iter()
            .map(|c| vec![0u8; (c.count * u64::from(c.dtype.size())) as usize])
            .collect();
        let report = run(&cfg, &calls, &inputs);
        // The odd rank sees its predecessor's header, or its successor sees
        // the odd rank's (whichever happens first: a failed rank stops
        // sending); at least one of them fails with MismatchedCall, and
        // nobody else fails with anything but that.
        let succ = (bad_rank + 1) % 4;
        let mismatch = |r: usize| {
            matches!(
                report.errors[r],
                Some(EngineError::Machine {
                    source: Error::MismatchedCall { .. },
                    ..
                })
            )
        };
        assert!(mismatch(bad_rank) || mismatch(succ), "{:?}", report.errors);
        assert!(
            report
                .errors
                .iter()
                .flatten()
                .all(|e| matches!(e.core(), Some(Error::MismatchedCall { .. }))),
            "{:?}",
            report.errors
        );
        // AllReduce: every rank's result depends on every other, so none
        // may finish.
        assert!(report.outputs.iter().all(Option::is_none));
    }
}
