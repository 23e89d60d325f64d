//! Tree AllReduce on the simulator: every shape runs to completion, tree
//! beats ring latency for small messages on large clusters, and the
//! simulator's ordering of the tuner's candidates agrees with the model's
//! where the model sees a clear gap.

use ringcc_core::{Algorithm, Collective, DataType, Protocol, ReduceOp};
use ringcc_mock::{Call, Cluster, ClusterConfig, Error};

fn cfg(nodes: u32, gpus: u32) -> ClusterConfig {
    ClusterConfig {
        nodes,
        gpus_per_node: gpus,
        nics_per_node: gpus.min(8) as u16,
        channels: 2,
        payload: false,
        ..ClusterConfig::default()
    }
}

/// Simulated seconds of one AllReduce of `bytes` under `algo` / `proto`.
fn time(c: ClusterConfig, algo: Algorithm, proto: Protocol, bytes: u64) -> f64 {
    let mut cl = Cluster::new(c).unwrap();
    cl.set_protocol(proto).unwrap();
    cl.set_algorithm(algo).unwrap();
    let n = cl.ranks() as usize;
    let call = Call::new(
        Collective::AllReduce,
        (bytes / 4).max(1),
        DataType::F32,
        ReduceOp::Sum,
    );
    // Twice: the second starts from the counters the first left.
    let mut last = 0.0;
    for _ in 0..2 {
        let r = cl.run(&vec![call; n], &mut [], false).unwrap();
        assert!(r.ok(), "{:?}", r.first_error());
        last = r.end - r.start;
    }
    last
}

/// Every shape of 1-8 nodes x 1-8 ranks finishes a tree AllReduce on
/// every protocol, small and pipelined (several chunks) sizes.
#[test]
fn tree_allreduce_runs_on_every_shape() {
    for nodes in 1..=8 {
        for gpus in 1..=8 {
            for proto in [Protocol::Simple, Protocol::Ll, Protocol::Ll128] {
                for bytes in [8u64, 3 << 20] {
                    let t = time(cfg(nodes, gpus), Algorithm::Tree, proto, bytes);
                    assert!(t > 0.0 && t < 1.0, "{nodes}x{gpus} {proto} {bytes}: {t}");
                }
            }
        }
    }
}

/// Tree beats ring at 8 B on 64 ranks and more (as NCCL's model says).
#[test]
fn tree_beats_ring_latency_at_64_ranks() {
    for (nodes, gpus) in [(8, 8), (16, 8), (32, 8)] {
        for proto in [Protocol::Ll, Protocol::Simple] {
            let ring = time(cfg(nodes, gpus), Algorithm::Ring, proto, 8);
            let tree = time(cfg(nodes, gpus), Algorithm::Tree, proto, 8);
            println!(
                "{nodes}x{gpus} {proto}: ring {:.1} us, tree {:.1} us",
                ring * 1e6,
                tree * 1e6
            );
            assert!(
                tree < ring,
                "{nodes}x{gpus} {proto}: tree {tree} ring {ring}"
            );
        }
    }
}

/// Payload mode refuses a tree call with a clear error.
#[test]
fn tree_in_payload_mode_is_refused() {
    let mut c = cfg(2, 2);
    c.payload = true;
    let mut cl = Cluster::new(c).unwrap();
    match cl.set_algorithm(Algorithm::Tree) {
        Err(Error::BadConfig { what }) => assert!(what.contains("timing-only"), "{what}"),
        other => panic!("{other:?}"),
    }
}

/// Where the tuner's model (with the simulator's capabilities) rates one
/// algorithm more than 2× faster than the other under the same protocol,
/// the simulator orders them the same way — the model the tuner chooses
/// by and the cluster it chooses for do not disagree on clear cases.
/// Shapes 1, 2, 4, 8 nodes × 8 GPUs of the dgx-h100 preset, 8 B to 16 MiB,
/// LL and LL128 (the protocols the simulator's tuner may run a tree with).
#[test]
fn the_simulator_agrees_with_the_tuner_on_clear_cases() {
    let mut clear = 0;
    for nodes in [1u32, 2, 4, 8] {
        let c = ringcc_mock::Preset::parse("dgx-h100")
            .unwrap()
            .config(nodes);
        let tuner = c.tuner();
        for proto in [Protocol::Ll, Protocol::Ll128] {
            for bytes in [8u64, 64 << 10, 1 << 20, 16 << 20] {
                let est = |a| {
                    tuner
                        .estimate(Collective::AllReduce, bytes, a, proto)
                        .unwrap()
                        .time_us
                };
                let (ring, tree) = (est(Algorithm::Ring), est(Algorithm::Tree));
                if ring.max(tree) < 2.0 * ring.min(tree) {
                    continue;
                }
                clear += 1;
                let sim = |a| time(c.clone(), a, proto, bytes);
                let (s_ring, s_tree) = (sim(Algorithm::Ring), sim(Algorithm::Tree));
                assert_eq!(
                    ring < tree,
                    s_ring < s_tree,
                    "{nodes} x 8, {proto}, {bytes} B: model ring {ring:.1} us / tree {tree:.1} us, \
                     simulated ring {:.1} us / tree {:.1} us",
                    s_ring * 1e6,
                    s_tree * 1e6
                );
            }
        }
    }
    assert!(
        clear >= 4,
        "only {clear} clear cases: the test checks too little"
    );
}
