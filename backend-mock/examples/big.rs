//! One timing-only AllReduce on a large simulated cluster, with the
//! simulator's own speed.
//!
//! `cargo run --release -p ringcc-mock --example big -- [nodes] [gpus] [nics] [channels] [MiB]`

use std::time::Instant;

use ringcc_core::{Collective, DataType, ReduceOp};
use ringcc_mock::{Call, Cluster, ClusterConfig};

fn main() {
    let a: Vec<u64> = std::env::args()
        .skip(1)
        .filter_map(|s| s.parse().ok())
        .collect();
    let get = |i: usize, d: u64| a.get(i).copied().unwrap_or(d);
    let cfg = ClusterConfig {
        nodes: get(0, 128) as u32,
        gpus_per_node: get(1, 8) as u32,
        nics_per_node: get(2, 8) as u16,
        channels: get(3, 16) as u32,
        ..ClusterConfig::default()
    };
    let bytes = get(4, 1024) << 20;
    let t0 = Instant::now();
    let mut c = Cluster::new(cfg).unwrap();
    let built = t0.elapsed();
    let n = c.ranks();
    let call = Call::new(
        Collective::AllReduce,
        bytes / 4,
        DataType::F32,
        ReduceOp::Sum,
    );
    let t1 = Instant::now();
    let r = c.run(&vec![call; n as usize], &mut [], false).unwrap();
    let wall = t1.elapsed().as_secs_f64();
    assert!(r.ok());
    let sim = r.duration();
    let busbw = ringcc_core::cost::busbw(call.collective, bytes as f64, sim, n);
    println!(
        "{n} ranks, {} MiB: simulated {:.3} ms, busbw {:.1} GB/s; build {:.2} s, run {:.2} s wall, {} events, {:.2} M events/s, {} slices",
        bytes >> 20,
        sim * 1e3,
        busbw / 1e9,
        built.as_secs_f64(),
        wall,
        r.events,
        r.events as f64 / wall / 1e6,
        c.stats().execs
    );
}
