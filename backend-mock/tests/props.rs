//! Properties: every collective, type and op on random topologies, channel
//! counts, FIFO geometries, MTUs and sizes, in and out of place, with and
//! without packet faults, gives exactly the reference result on every rank;
//! the same configuration gives the same event log; other fault seeds give
//! the same results.

mod common;

use proptest::prelude::*;
use ringcc_core::fifo::FifoGeometry;
use ringcc_core::{DataType, ReduceOp};
use ringcc_mock::{Call, Cluster, ClusterConfig, Faults, RnicModel};

#[derive(Clone, Debug)]
struct Case {
    cfg: ClusterConfig,
    call: Call,
    in_place: bool,
    salt: u64,
}

fn faults() -> impl Strategy<Value = Faults> {
    (
        0.0..0.1f64,
        0.0..0.05f64,
        0.0..0.05f64,
        0.0..2e-6f64,
        any::<u64>(),
    )
        .prop_map(|(loss, duplicate, reorder, jitter, seed)| Faults {
            seed: Some(seed),
            loss,
            duplicate,
            reorder,
            jitter,
            reorder_delay: 3e-6,
            ..Faults::default()
        })
}

fn case(with_faults: bool) -> impl Strategy<Value = Case> {
    (
        (1..=3u32, 1..=3u32, 1..=2u16, any::<bool>(), 1..=3u32),
        (0..5u8, 0..9u32),
        prop::sample::select(DataType::ALL.to_vec()),
        prop::sample::select(ReduceOp::ALL.to_vec()),
        prop_oneof![3 => 0..200u64, 2 => 200..2000u64, 1 => 2000..20_000u64],
        (1..=12u64, 1..=8u64, prop::sample::select(vec![1u64, 2, 4])),
        (
            prop::sample::select(vec![256u32, 512, 1024]),
            any::<bool>(),
            any::<u64>(),
        ),
        faults(),
    )
        .prop_map(
            move |(
                (nodes, gpus, nics, cross_nic, channels),
                (k, root),
                dtype,
                op,
                count,
                (chunk_units, slot_units, sps),
                (mtu, in_place, seed),
                f,
            )| {
                let n = nodes * gpus;
                let geometry = FifoGeometry::new(slot_units * 16, sps).unwrap();
                let chunk_bytes = (chunk_units * 16).min(geometry.max_chunk_bytes());
                let cfg = ClusterConfig {
                    nodes,
                    gpus_per_node: gpus,
                    nics_per_node: nics,
                    cross_nic,
                    channels,
                    chunk_bytes,
                    geometry,
                    mtu,
                    payload: true,
                    seed,
                    // Tail losses wait for a 1 ms timeout.
                    rnic: RnicModel {
                        timeout: 8,
                        ..RnicModel::default()
                    },
                    deadline: 1.0,
                    faults: if with_faults { f } else { Faults::default() },
                    ..ClusterConfig::default()
                };
                Case {
                    cfg,
                    call: Call::new(common::collective(k, root % n), count, dtype, op),
                    in_place,
                    salt: seed.rotate_left(29),
                }
            },
        )
}

proptest! {
    // Fewer cases in debug builds; `cargo test --release` runs them all.
    #![proptest_config(ProptestConfig {
        cases: if cfg!(debug_assertions) { 40 } else { 256 },
        .. ProptestConfig::default()
    })]

    #[test]
    fn exact_results_lossless(c in case(false)) {
        let (cluster, report, _) = common::run_checked(c.cfg, c.call, c.in_place, c.salt);
        prop_assert_eq!(cluster.stats().retransmissions, 0);
        prop_assert!(report.end > report.start || c.call.count == 0 || cluster.ranks() == 1);
    }

    #[test]
    fn exact_results_with_packet_faults(c in case(true)) {
        common::run_checked(c.cfg, c.call, c.in_place, c.salt);
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: if cfg!(debug_assertions) { 8 } else { 48 },
        .. ProptestConfig::default()
    })]

    /// Same configuration, same seeds: the same event log, bit for bit;
    /// another fault seed: the same results (and another log).
    #[test]
    fn deterministic_and_fault_seed_independent(c in case(true), other in any::<u64>()) {
        let (a, ra, outs_a) = common::run_checked(c.cfg.clone(), c.call, c.in_place, c.salt);
        let (b, rb, outs_b) = common::run_checked(c.cfg.clone(), c.call, c.in_place, c.salt);
        prop_assert_eq!(a.stats(), b.stats());
        prop_assert_eq!(ra, rb);
        prop_assert_eq!(&outs_a, &outs_b);
        let mut cfg = c.cfg.clone();
        cfg.faults.seed = Some(other);
        let (_, _, outs_c) = common::run_checked(cfg, c.call, c.in_place, c.salt);
        prop_assert_eq!(&outs_a, &outs_c);
    }
}

/// Several collectives in a row on one cluster, under loss: the sequence
/// number, the connection counters and the clock carry over.
#[test]
fn sequences_of_collectives_under_loss() {
    let mut cfg = common::small(2, 2, 2, 2);
    cfg.faults = Faults {
        seed: Some(3),
        loss: 0.05,
        ..Faults::default()
    };
    cfg.rnic.timeout = 8;
    let mut c = Cluster::new(cfg).unwrap();
    let n = c.ranks();
    let mut last = c.now();
    for (i, k) in [0u8, 1, 2, 3, 4, 0, 0].into_iter().enumerate() {
        let call = Call::new(
            common::collective(k, i as u32 % n),
            300 + i as u64 * 7,
            DataType::I32,
            ReduceOp::Sum,
        );
        let mut bufs = common::buffers(&call, n, i % 2 == 1, i as u64);
        let r = c
            .run(&vec![call; n as usize], &mut bufs, i % 2 == 1)
            .unwrap();
        assert!(r.ok(), "{:?}", r.first_error());
        common::check(&call, n, &bufs, i % 2 == 1, i as u64);
        // The call ends at its last copy or reduction; the run goes on
        // until the final credits are back, and the next call starts there.
        assert!(r.start >= last && r.end > r.start && r.settled >= r.end);
        last = r.settled;
        assert_eq!(c.now(), r.settled);
    }
    assert!(c.stats().retransmissions > 0);
}
