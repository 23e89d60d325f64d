//! Prints the event-log hash, event count and end time of a fixed set of
//! runs (timing, payload over simulated RDMA, faults, mismatched calls):
//! `cargo run --release -p ringcc-mock --example hashes` before and after a
//! change to the simulator shows whether its behaviour moved.

use ringcc_core::fifo::FifoGeometry;
use ringcc_core::{Collective, DataType, Rank, ReduceOp};
use ringcc_mock::{Call, Cluster, ClusterConfig, Component, Failure, Faults, RankBuffers};

fn show(name: &str, cfg: ClusterConfig, calls: &[Call], runs: usize) {
    let n = cfg.nodes * cfg.gpus_per_node;
    let payload = cfg.payload;
    let mut c = Cluster::new(cfg).unwrap();
    let mut out = Vec::new();
    for _ in 0..runs {
        let calls: Vec<Call> = (0..n as usize).map(|r| calls[r % calls.len()]).collect();
        let mut bufs: Vec<RankBuffers> = if payload {
            (0..n)
                .map(|r| RankBuffers::zeroed(&calls[r as usize], n, Rank(r), false))
                .collect()
        } else {
            Vec::new()
        };
        match c.run(&calls, &mut bufs, false) {
            Ok(r) => out.push(format!(
                "end {:.9} ok {} first {:?}",
                r.end,
                r.ok(),
                r.first_error().map(|e| e.to_string())
            )),
            Err(e) => out.push(format!("refused: {e}")),
        }
    }
    let s = c.stats();
    println!(
        "{name}: hash {:#018x} events {} | {}",
        s.event_hash,
        s.events,
        out.join(" | ")
    );
}

fn main() {
    let ar = |count| Call::new(Collective::AllReduce, count, DataType::F32, ReduceOp::Sum);
    let timing = |nodes, gpus, nics, channels| ClusterConfig {
        nodes,
        gpus_per_node: gpus,
        nics_per_node: nics,
        channels,
        payload: false,
        ..ClusterConfig::default()
    };
    show("timing-4x4", timing(4, 4, 2, 4), &[ar(64 << 20)], 3);
    show("timing-16x8", timing(16, 8, 8, 16), &[ar(1 << 24)], 1);
    for k in 0..5u8 {
        let coll = match k {
            0 => Collective::AllReduce,
            1 => Collective::ReduceScatter,
            2 => Collective::AllGather,
            3 => Collective::Broadcast { root: Rank(1) },
            _ => Collective::Reduce { root: Rank(2) },
        };
        let call = Call::new(coll, 100_003, DataType::F32, ReduceOp::Sum);
        show(&format!("timing-coll{k}"), timing(2, 2, 2, 3), &[call], 2);
    }
    let payload = |nodes, gpus| ClusterConfig {
        nodes,
        gpus_per_node: gpus,
        nics_per_node: 2,
        channels: 2,
        geometry: FifoGeometry::new(16 << 10, 2).unwrap(),
        chunk_bytes: 64 << 10,
        payload: true,
        ..ClusterConfig::default()
    };
    show("payload-2x2", payload(2, 2), &[ar(1 << 18)], 2);
    show("payload-3x2", payload(3, 2), &[ar(77_777)], 1);
    let mut lossy = payload(2, 2);
    lossy.faults = Faults {
        loss: 0.01,
        duplicate: 0.01,
        reorder: 0.01,
        seed: Some(7),
        ..Faults::default()
    };
    show("payload-lossy", lossy, &[ar(1 << 17)], 1);
    let mut dead = payload(2, 2);
    dead.deadline = 0.01;
    dead.faults.failures = vec![Failure {
        what: Component::Rank(Rank(3)),
        at: 1e-5,
    }];
    show("payload-dead-rank", dead, &[ar(1 << 17)], 1);
    show(
        "payload-mismatch",
        payload(2, 2),
        &[ar(1000), ar(1000), ar(999), ar(1000)],
        1,
    );
    let mut t = timing(2, 4, 2, 2);
    t.faults.failures = vec![Failure {
        what: Component::Rank(Rank(5)),
        at: 1e-5,
    }];
    t.deadline = 0.01;
    show("timing-dead-rank", t, &[ar(1 << 20)], 1);
    let mut j = timing(2, 4, 2, 2);
    j.faults.jitter = 1e-6;
    show("timing-jitter", j, &[ar(1 << 20)], 1);
}
