//! Ranks as real threads over shared-memory FIFOs, driven by the core's
//! firmware driver: results equal the reference; an absent rank makes the
//! others time out instead of hanging; a mismatched call is detected.

use std::time::{Duration, Instant};

use ringcc_core::driver::DriverError;
use ringcc_core::{Collective, DataType, EngineError, Error, Plan, Rank, ReduceOp};
use ringcc_tests::exec::Call;
use ringcc_tests::reference::{expected, input};
use ringcc_tests::shm::run_threads;

fn inputs(n: u32, channels: u32, call: Call) -> (Plan, Vec<Vec<u8>>) {
    let plan = Plan::new(call.collective, call.count, call.dtype, n, channels, 64).unwrap();
    let inputs = (0..n).map(|r| input(&plan, call.op, r, 9)).collect();
    (plan, inputs)
}

#[test]
fn every_collective_on_threads() {
    for (nodes, gpus, channels) in [(1u32, 2u32, 1u32), (1, 3, 2), (2, 2, 3), (5, 1, 1)] {
        let n = nodes * gpus;
        for collective in [
            Collective::AllReduce,
            Collective::ReduceScatter,
            Collective::AllGather,
            Collective::Broadcast { root: Rank(n - 1) },
            Collective::Reduce { root: Rank(1) },
        ] {
            for (dtype, op) in [
                (DataType::F32, ReduceOp::Sum),
                (DataType::I64, ReduceOp::Max),
                (DataType::Bf16, ReduceOp::Avg),
            ] {
                let call = Call {
                    collective,
                    count: 301,
                    dtype,
                    op,
                };
                let (plan, inputs) = inputs(n, channels, call);
                let results = run_threads(
                    nodes,
                    gpus,
                    channels,
                    &vec![call; n as usize],
                    &inputs,
                    Duration::from_secs(20),
                    &[],
                );
                for r in 0..n {
                    let got = results[r as usize]
                        .as_ref()
                        .unwrap()
                        .as_ref()
                        .unwrap_or_else(|e| panic!("rank {r}: {e:?}"));
                    if let Some(want) = expected(&plan, op, r, 9) {
                        assert!(got == &want, "rank {r} {call:?} on {nodes}x{gpus}");
                    }
                }
            }
        }
    }
}

#[test]
fn an_absent_rank_makes_the_others_time_out() {
    let call = Call {
        collective: Collective::AllReduce,
        count: 1000,
        dtype: DataType::F32,
        op: ReduceOp::Sum,
    };
    let (_, inputs) = inputs(4, 1, call);
    let t0 = Instant::now();
    let results = run_threads(
        1,
        4,
        1,
        &[call; 4],
        &inputs,
        Duration::from_millis(300),
        &[2],
    );
    assert!(
        t0.elapsed() < Duration::from_secs(20),
        "waits must be bounded"
    );
    for r in [0, 1, 3] {
        let res = results[r].as_ref().unwrap();
        assert!(
            matches!(res, Err(DriverError::Engine(EngineError::Timeout(_)))),
            "rank {r}: {res:?}"
        );
    }
}

#[test]
fn a_mismatched_call_is_detected() {
    let call = Call {
        collective: Collective::AllReduce,
        count: 1000,
        dtype: DataType::F32,
        op: ReduceOp::Sum,
    };
    let mut calls = [call; 3];
    calls[1].count = 999;
    let inputs: Vec<Vec<u8>> = calls
        .iter()
        .map(|c| vec![0u8; c.count as usize * 4])
        .collect();
    let results = run_threads(1, 3, 1, &calls, &inputs, Duration::from_millis(300), &[]);
    let mismatches = results
        .iter()
        .filter(|r| {
            matches!(
                r,
                Some(Err(DriverError::Engine(EngineError::Machine {
                    source: Error::MismatchedCall { .. },
                    ..
                })))
            )
        })
        .count();
    assert!(mismatches >= 1, "{results:?}");
    assert!(
        results.iter().all(|r| r.as_ref().unwrap().is_err()),
        "nobody may succeed"
    );
}
