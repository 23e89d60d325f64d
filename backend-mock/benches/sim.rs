//! The simulator's own speed: events per second, and the 1024-rank
//! timing-only AllReduce, each against a reference measured in the same
//! run: walking every lane's plan with the core's `Steps` iterator (the
//! least any simulator of these schedules must do).
//!
//! `cargo bench -p ringcc-mock --bench sim` (all cases), or with a filter
//! argument naming cases: `cargo bench -p ringcc-mock --bench sim -- 128`.

use std::hint::black_box;
use std::time::Instant;

use ringcc_core::fifo::FifoGeometry;
use ringcc_core::{ChannelId, Collective, DataType, Plan, Rank, ReduceOp};
use ringcc_mock::{Call, Cluster, ClusterConfig, RankBuffers};

/// Seconds to walk every (channel, rank)'s steps of `call` (rings in rank
/// order: the cost does not depend on the order).
fn plan_walk(cfg: &ClusterConfig, call: &Call) -> (f64, u64) {
    let n = cfg.nodes * cfg.gpus_per_node;
    let plan = Plan::new(
        call.collective,
        call.count,
        call.dtype,
        n,
        cfg.channels,
        cfg.chunk_bytes,
    )
    .unwrap();
    let t = Instant::now();
    let mut steps = 0u64;
    let mut acc = 0u64;
    for c in 0..cfg.channels {
        for r in 0..n {
            let ring = ringcc_core::InOrderRing { ranks: n };
            for s in plan.steps(ChannelId(c as u8), Rank(r), ring).unwrap() {
                acc = acc.wrapping_add(s.input_offset ^ s.count);
                steps += 1;
            }
        }
    }
    black_box(acc);
    (t.elapsed().as_secs_f64(), steps)
}

fn case(name: &str, cfg: ClusterConfig, call: Call) {
    let n = cfg.nodes * cfg.gpus_per_node;
    let (walk, steps) = plan_walk(&cfg, &call);
    let payload = cfg.payload;
    let t0 = Instant::now();
    let mut c = Cluster::new(cfg).unwrap();
    let build = t0.elapsed().as_secs_f64();
    let mut bufs: Vec<RankBuffers> = if payload {
        (0..n)
            .map(|r| RankBuffers::zeroed(&call, n, Rank(r), false))
            .collect()
    } else {
        Vec::new()
    };
    let t1 = Instant::now();
    let r = c.run(&vec![call; n as usize], &mut bufs, false).unwrap();
    let wall = t1.elapsed().as_secs_f64();
    assert!(r.ok(), "{:?}", r.first_error());
    let s = c.stats();
    println!(
        "{name}: {n} ranks, {} slices, {} events{} in {wall:.3} s (build {build:.3} s): \
         {:.2} M events/s, {:.0} ns/slice; simulated {:.3} ms; \
         reference plan walk {steps} steps in {walk:.3} s: ratio {:.1}",
        s.execs,
        r.events,
        if payload {
            format!(", {} packets", s.packets)
        } else {
            String::new()
        },
        r.events as f64 / wall / 1e6,
        wall / s.execs as f64 * 1e9,
        r.duration() * 1e3,
        wall / walk,
    );
}

fn main() {
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let want = |name: &str| filter.is_empty() || filter.iter().any(|f| name.contains(f.as_str()));
    let gib = Call::new(Collective::AllReduce, 1 << 28, DataType::F32, ReduceOp::Sum);
    let timing = |nodes| ClusterConfig {
        nodes,
        gpus_per_node: 8,
        nics_per_node: 8,
        channels: 16,
        payload: false,
        ..ClusterConfig::default()
    };
    if want("timing-128") {
        case("timing-128", timing(16), gib);
    }
    // Between the two: the cost per slice as the lanes outgrow the caches
    // (the work per slice is the same at every size).
    if want("timing-512") {
        case("timing-512", timing(64), gib);
    }
    if want("timing-1024") {
        case("timing-1024", timing(128), gib);
    }
    if want("packets-4") {
        let cfg = ClusterConfig {
            nodes: 2,
            gpus_per_node: 2,
            nics_per_node: 2,
            channels: 2,
            geometry: FifoGeometry::NCCL,
            payload: true,
            ..ClusterConfig::default()
        };
        let call = Call::new(
            Collective::AllReduce,
            16 << 20,
            DataType::F32,
            ReduceOp::Sum,
        );
        case("packets-4", cfg, call);
    }
}
