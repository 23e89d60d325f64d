//! A small AllReduce on 2 nodes x 2 GPUs with 2 % packet loss, written as a
//! Chrome trace and a pcap.
//!
//! `cargo run -p ringcc-mock --example capture -- trace.json capture.pcap`
//! then open the trace in <https://ui.perfetto.dev> and the capture in
//! Wireshark (RoCEv2 on UDP 4791 is dissected as InfiniBand).

use std::fs::File;

use ringcc_core::fifo::FifoGeometry;
use ringcc_core::{Collective, DataType, Rank, ReduceOp};
use ringcc_mock::{Call, Cluster, ClusterConfig, Faults, RankBuffers, RnicModel};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let trace = args.next().unwrap_or_else(|| "trace.json".into());
    let pcap = args.next().unwrap_or_else(|| "capture.pcap".into());
    let cfg = ClusterConfig {
        nodes: 2,
        gpus_per_node: 2,
        nics_per_node: 2,
        channels: 2,
        chunk_bytes: 16 << 10,
        geometry: FifoGeometry::new(8 << 10, 2)?,
        mtu: 1024,
        payload: true,
        trace: true,
        capture: true,
        faults: Faults {
            seed: Some(1),
            loss: 0.02,
            ..Faults::default()
        },
        rnic: RnicModel {
            timeout: 8,
            ..RnicModel::default()
        },
        ..ClusterConfig::default()
    };
    let mut c = Cluster::new(cfg)?;
    let n = c.ranks();
    let call = Call::new(
        Collective::AllReduce,
        64 << 10,
        DataType::F32,
        ReduceOp::Sum,
    );
    let mut bufs: Vec<RankBuffers> = (0..n)
        .map(|r| RankBuffers::zeroed(&call, n, Rank(r), false))
        .collect();
    let r = c.run(&vec![call; n as usize], &mut bufs, false)?;
    println!(
        "ok {}: {:.1} us simulated, {} packets, {} retransmitted",
        r.ok(),
        r.duration() * 1e6,
        c.stats().packets,
        c.stats().retransmissions
    );
    c.write_chrome_trace(File::create(&trace)?)?;
    c.write_pcap(File::create(&pcap)?)?;
    println!(
        "wrote {trace} ({} spans) and {pcap} ({} frames)",
        c.trace_len(),
        c.captured_frames()
    );
    Ok(())
}
