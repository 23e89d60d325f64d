//! The per-call launch latency and the per-message network-proxy latency
//! ([`Calibration::launch_latency`], [`Calibration::launches_per_thread`],
//! [`Calibration::proxy_latency`]): a rank's engine acts only from its
//! launch on (what arrives earlier waits in its FIFO), one thread's
//! launches are serial, the proxy is paid between nodes only, and the
//! bytes stay exact however the launches are staggered.

mod common;

use proptest::prelude::*;
use ringcc_core::{Algorithm, Collective, DataType, ReduceOp};
use ringcc_mock::{Calibration, Call, Cluster, ClusterConfig, Error};

fn timing(nodes: u32, gpus: u32, k: Calibration) -> ClusterConfig {
    ClusterConfig {
        nodes,
        gpus_per_node: gpus,
        nics_per_node: 2,
        channels: 2,
        payload: false,
        calibration: k,
        ..ClusterConfig::default()
    }
}

fn with(launch_us: f64, per_thread: u32, proxy_us: f64) -> Calibration {
    Calibration {
        launch_latency: launch_us * 1e-6,
        launches_per_thread: per_thread,
        proxy_latency: proxy_us * 1e-6,
        ..Calibration::default()
    }
}

/// Simulated seconds of one call on every rank.
fn time(cfg: ClusterConfig, algo: Algorithm, call: Call) -> f64 {
    let mut c = Cluster::new(cfg).unwrap();
    c.set_algorithm(algo).unwrap();
    let n = c.ranks() as usize;
    let t0 = c.now();
    let r = c.run(&vec![call; n], &mut [], false).unwrap();
    assert!(r.ok(), "{:?}", r.first_error());
    c.now() - t0
}

fn allreduce(bytes: u64) -> Call {
    Call::new(
        Collective::AllReduce,
        bytes / 4,
        DataType::F32,
        ReduceOp::Sum,
    )
}

#[test]
fn one_launch_per_thread_shifts_the_call_by_the_launch() {
    for (nodes, gpus, bytes) in [(1, 4, 8), (2, 2, 8), (2, 4, 1 << 20)] {
        for algo in [Algorithm::Ring, Algorithm::Tree] {
            let base = time(
                timing(nodes, gpus, with(0.0, 1, 0.0)),
                algo,
                allreduce(bytes),
            );
            let late = time(
                timing(nodes, gpus, with(7.0, 1, 0.0)),
                algo,
                allreduce(bytes),
            );
            assert!(
                (late - base - 7e-6).abs() < 1e-11,
                "{nodes}x{gpus} {algo:?} {bytes} B: {base} -> {late}"
            );
        }
    }
}

#[test]
fn a_threads_launches_are_serial() {
    let call = allreduce(8);
    let base = time(timing(1, 8, with(0.0, 1, 0.0)), Algorithm::Ring, call);
    let one = time(timing(1, 8, with(4.0, 1, 0.0)), Algorithm::Ring, call);
    let eight = time(timing(1, 8, with(4.0, 8, 0.0)), Algorithm::Ring, call);
    let four = time(timing(1, 8, with(4.0, 4, 0.0)), Algorithm::Ring, call);
    // The last rank starts after 8 (4) launches and must take part.
    assert!(eight > 32e-6 && eight <= 32e-6 + base + 1e-11, "{eight}");
    assert!(four > 16e-6 && four <= 16e-6 + base + 1e-11, "{four}");
    assert!(one < four && four < eight, "{one} {four} {eight}");
}

#[test]
fn the_proxy_is_paid_between_nodes_only() {
    let call = allreduce(8);
    let one_node = |p| time(timing(1, 4, with(0.0, 1, p)), Algorithm::Ring, call);
    assert_eq!(one_node(0.0), one_node(3.0));
    for algo in [Algorithm::Ring, Algorithm::Tree] {
        let two = |p| time(timing(2, 2, with(0.0, 1, p)), algo, call);
        // At least one message between nodes lies on the critical path.
        assert!(two(3.0) >= two(0.0) + 3e-6 - 1e-11, "{algo:?}");
    }
}

#[test]
fn bad_values_are_refused() {
    for k in [
        with(0.0, 0, 0.0),
        with(-1.0, 1, 0.0),
        with(f64::NAN, 1, 0.0),
        with(0.0, 1, -1.0),
        with(0.0, 1, f64::INFINITY),
    ] {
        let cfg = timing(1, 2, k);
        assert!(
            matches!(Cluster::new(cfg), Err(Error::BadConfig { .. })),
            "{k:?}"
        );
    }
    // A launch past the watchdog's deadline would read as a hang.
    for (per_thread, ok) in [(1, true), (2, false)] {
        let cfg = ClusterConfig {
            deadline: 1.5,
            ..timing(1, 2, with(1e6, per_thread, 0.0))
        };
        assert_eq!(Cluster::new(cfg).is_ok(), ok, "{per_thread}");
    }
}

#[test]
fn no_launch_latency_keeps_the_event_log() {
    // Zero launch and proxy latencies take the old path: the same events.
    let call = allreduce(1 << 16);
    let hash = |k: Calibration| {
        let mut c = Cluster::new(timing(2, 2, k)).unwrap();
        let r = c.run(&[call; 4], &mut [], false).unwrap();
        assert!(r.ok());
        c.stats().event_hash
    };
    assert_eq!(hash(Calibration::default()), hash(with(0.0, 8, 0.0)));
    assert_ne!(hash(Calibration::default()), hash(with(1.0, 1, 0.0)));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Whatever the launches and the proxy, every collective's bytes are
    /// exact (ring, and tree for AllReduce), and no call ends before its
    /// last rank has launched.
    #[test]
    fn staggered_launches_keep_the_bytes_exact(
        nodes in 1u32..=2,
        gpus in 1u32..=4,
        kind in 0u8..5,
        count in 0u64..300,
        launch_ns in 0u64..20_000,
        per_thread in 1u32..=5,
        proxy_ns in 0u64..5_000,
        tree in any::<bool>(),
        salt in any::<u64>(),
    ) {
        let mut cfg = common::small(nodes, gpus, 1, 2);
        cfg.calibration = with(launch_ns as f64 / 1e3, per_thread, proxy_ns as f64 / 1e3);
        let ranks = nodes * gpus;
        let collective = common::collective(kind, salt as u32 % ranks);
        let tree = tree && collective == Collective::AllReduce;
        let call = Call::new(collective, count, DataType::F32, ReduceOp::Sum);
        let mut c = Cluster::new(cfg).unwrap();
        if tree {
            c.set_algorithm(Algorithm::Tree).unwrap();
        }
        let mut bufs = common::buffers(&call, ranks, false, salt);
        let t0 = c.now();
        let report = c.run(&vec![call; ranks as usize], &mut bufs, false).unwrap();
        prop_assert!(report.ok(), "{:?}", report.first_error());
        common::check(&call, ranks, &bufs, false, salt);
        let last = (gpus.min(per_thread)) as f64 * launch_ns as f64 * 1e-9;
        prop_assert!(c.now() - t0 >= last - 1e-11, "{} < {last}", c.now() - t0);
    }
}
