//! Shared helpers: exact inputs and references from `ringcc-tests`, and a
//! runner that checks every rank's output.

#![allow(dead_code)]

use ringcc_core::fifo::FifoGeometry;
use ringcc_core::{Collective, Plan, Rank};
use ringcc_mock::{Call, Cluster, ClusterConfig, RankBuffers, RunReport};
use ringcc_tests::reference::{expected, input};

/// A small payload-mode cluster.
pub fn small(nodes: u32, gpus: u32, nics: u16, channels: u32) -> ClusterConfig {
    ClusterConfig {
        nodes,
        gpus_per_node: gpus,
        nics_per_node: nics,
        channels,
        chunk_bytes: 256,
        geometry: FifoGeometry::new(64, 2).unwrap(),
        mtu: 256,
        payload: true,
        ..ClusterConfig::default()
    }
}

/// The plan the reference functions need (its channel count and chunk do
/// not matter to them).
pub fn ref_plan(call: &Call, ranks: u32) -> Plan {
    Plan::new(call.collective, call.count, call.dtype, ranks, 1, 16).unwrap()
}

/// Buffers of every rank with exact inputs for `salt`.
pub fn buffers(call: &Call, ranks: u32, in_place: bool, salt: u64) -> Vec<RankBuffers> {
    let plan = ref_plan(call, ranks);
    (0..ranks)
        .map(|r| {
            let mut b = RankBuffers::zeroed(call, ranks, Rank(r), in_place);
            // Fill everything else with a marker, to catch stray writes.
            b.output.fill(0xEE);
            b.input_mut(call, ranks, Rank(r), in_place)
                .copy_from_slice(&input(&plan, call.op, r, salt));
            b
        })
        .collect()
}

/// Checks every rank's output against the reference; returns the
/// outputs.
pub fn check(
    call: &Call,
    ranks: u32,
    bufs: &[RankBuffers],
    in_place: bool,
    salt: u64,
) -> Vec<Vec<u8>> {
    let plan = ref_plan(call, ranks);
    (0..ranks)
        .map(|r| {
            let got = bufs[r as usize]
                .output(call, ranks, Rank(r), in_place)
                .to_vec();
            if let Some(want) = expected(&plan, call.op, r, salt) {
                assert!(
                    got == want,
                    "rank {r}: output differs from the reference ({call:?}, in place {in_place})"
                );
            }
            got
        })
        .collect()
}

/// Runs `call` on every rank of a new cluster and checks the results.
pub fn run_checked(
    cfg: ClusterConfig,
    call: Call,
    in_place: bool,
    salt: u64,
) -> (Cluster, RunReport, Vec<Vec<u8>>) {
    let mut c = Cluster::new(cfg).unwrap();
    let n = c.ranks();
    let mut bufs = buffers(&call, n, in_place, salt);
    let report = c.run(&vec![call; n as usize], &mut bufs, in_place).unwrap();
    assert!(report.ok(), "{:?}", report.first_error());
    let outs = check(&call, n, &bufs, in_place, salt);
    (c, report, outs)
}

/// `Collective` from a code and a root.
pub fn collective(k: u8, root: u32) -> Collective {
    Collective::from_code(k, ringcc_core::Rank(root)).unwrap()
}
