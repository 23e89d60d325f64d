//! Calls on fewer channels than the cluster has (the tuner's channel
//! count, as NCCL drops channels a small call would leave nearly empty):
//! every collective still reduces and places every element exactly, on
//! rings and trees, with the counters the previous call left on the
//! channels it used and skipped; the unused channels' bandwidth is
//! really gone; a count the cluster cannot give is refused.

mod common;

use ringcc_core::{Algorithm, Collective, DataType, ReduceOp};
use ringcc_mock::{Call, Cluster, ClusterConfig, Error};

/// Runs `call` on every rank of `cl` with exact inputs for `salt`; every
/// rank's output must be the reference.
fn run_exact(cl: &mut Cluster, call: Call, in_place: bool, salt: u64) {
    let n = cl.ranks();
    let mut bufs = common::buffers(&call, n, in_place, salt);
    let r = cl
        .run(&vec![call; n as usize], &mut bufs, in_place)
        .unwrap();
    assert!(
        r.ok(),
        "{} channels, {call:?}: {:?}",
        cl.channels(),
        r.first_error()
    );
    common::check(&call, n, &bufs, in_place, salt);
}

/// Payload mode, 2 nodes x 3 GPUs on 4 channels: calls alternate between
/// 1, 3, 4 and 2 channels (so a channel sits out some calls and joins
/// later ones, from the counters it had), every collective, uneven
/// counts, both placements; every rank's output is the reference.
#[test]
fn every_collective_is_exact_on_any_channel_count() {
    let mut cl = Cluster::new(common::small(2, 3, 2, 4)).unwrap();
    let n = cl.ranks();
    let mut salt = 7;
    for (i, used) in [1u32, 3, 4, 2, 1, 4].into_iter().enumerate() {
        cl.set_channels(Some(used)).unwrap();
        assert_eq!(cl.channels(), used);
        for k in 0..5u8 {
            let collective = common::collective(k, (i as u32 + 1) % n);
            for count in [0u64, 1, 97, 1000 + i as u64] {
                let call = Call::new(collective, count, DataType::F32, ReduceOp::Sum);
                let in_place = (i + usize::from(k)) % 2 == 0;
                salt += 1;
                run_exact(&mut cl, call, in_place, salt);
            }
        }
    }
}

/// The simulator sizes its ranks' engines by the cluster's channels (16,
/// 32 or 64 channels inline): clusters on each side of every boundary,
/// and at the limit, reduce exactly on all their channels and on fewer.
#[test]
fn every_engine_capacity_is_exact() {
    for channels in [1u32, 16, 17, 32, 33, 64] {
        let mut cl = Cluster::new(common::small(2, 2, 2, channels)).unwrap();
        assert_eq!(cl.channels(), channels);
        for (i, used) in [channels, channels.div_ceil(2)].into_iter().enumerate() {
            cl.set_channels(Some(used)).unwrap();
            let call = Call::new(
                Collective::AllReduce,
                97 * u64::from(channels) + 3,
                DataType::F32,
                ReduceOp::Sum,
            );
            run_exact(&mut cl, call, i == 1, u64::from(channels) * 2 + i as u64);
        }
    }
}

/// Tree AllReduce on fewer channels is exact too.
#[test]
fn tree_allreduce_is_exact_on_fewer_channels() {
    let mut cl = Cluster::new(common::small(2, 2, 2, 4)).unwrap();
    cl.set_algorithm(Algorithm::Tree).unwrap();
    for (i, used) in [1u32, 4, 2].into_iter().enumerate() {
        cl.set_channels(Some(used)).unwrap();
        for (j, dtype) in [DataType::F32, DataType::I32, DataType::F64]
            .into_iter()
            .enumerate()
        {
            let call = Call::new(Collective::AllReduce, 777, dtype, ReduceOp::Max);
            let salt = (i * 3 + j) as u64;
            run_exact(&mut cl, call, j == 1, salt);
        }
    }
}

/// A large AllReduce on one of four channels (each on its own NIC) takes
/// several times as long as on all four: the channels the call leaves
/// out carry nothing.
#[test]
fn a_call_on_fewer_channels_has_their_bandwidth_only() {
    let cfg = ClusterConfig {
        nodes: 2,
        gpus_per_node: 2,
        nics_per_node: 4,
        channels: 4,
        payload: false,
        ..ClusterConfig::default()
    };
    let mut cl = Cluster::new(cfg).unwrap();
    let n = cl.ranks() as usize;
    let call = Call::new(
        Collective::AllReduce,
        16 << 20,
        DataType::F32,
        ReduceOp::Sum,
    );
    let mut time = |used| {
        cl.set_channels(used).unwrap();
        let r = cl.run(&vec![call; n], &mut [], false).unwrap();
        assert!(r.ok(), "{:?}", r.first_error());
        r.end - r.start
    };
    let (one, all, default) = (time(Some(1)), time(Some(4)), time(None));
    assert!(one > 3.0 * all, "1 channel {one} s, 4 channels {all} s");
    assert_eq!(all, default, "None is every channel");
}

/// Zero channels, or more than the cluster has, is refused and changes
/// nothing.
#[test]
fn a_channel_count_the_cluster_lacks_is_refused() {
    let mut cl = Cluster::new(common::small(1, 2, 1, 2)).unwrap();
    for bad in [0, 3, 64] {
        let e = cl.set_channels(Some(bad)).unwrap_err();
        assert!(matches!(e, Error::BadConfig { .. }), "{bad}: {e}");
        assert_eq!(cl.channels(), 2);
    }
}
