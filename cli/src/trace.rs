//! `ringcc trace`: one collective on the simulator, with payload, written
//! out as a Chrome / Perfetto timeline and a pcap of the RoCEv2 traffic.

use std::fs::File;
use std::io::BufWriter;

use ringcc_core::{verify, Plan};
use ringcc_mock::{Call, Cluster, ClusterConfig, RankBuffers};

use crate::args::TraceArgs;
use crate::backend::mock::config;
use crate::error::CliError;
use crate::perf::count_and_size;
use crate::stdout;

fn create(path: &std::path::Path) -> Result<BufWriter<File>, CliError> {
    File::create(path)
        .map(BufWriter::new)
        .map_err(|e| CliError::failed(format!("cannot create {}: {e}", path.display())))
}

/// Runs `ringcc trace`.
pub fn trace(a: &TraceArgs) -> Result<(), CliError> {
    if a.chrome.is_none() && a.pcap.is_none() {
        return Err(CliError::usage(
            "nothing to write: give --chrome FILE and/or --pcap FILE",
        ));
    }
    if !(0.0..0.5).contains(&a.loss) {
        return Err(CliError::usage(format!(
            "--loss {} must be in [0, 0.5)",
            a.loss
        )));
    }
    let base = config(&a.topo)?;
    let n = base.ranks() as u32;
    let collective = a.collective.collective(a.root);
    if a.root >= n {
        return Err(CliError::usage(format!(
            "-r {} is out of range for {n} ranks",
            a.root
        )));
    }
    let mut cfg = ClusterConfig {
        payload: true,
        trace: a.chrome.is_some(),
        capture: a.pcap.is_some(),
        seed: a.seed,
        ..base
    };
    cfg.faults.loss = a.loss;
    let mut cluster = Cluster::new(cfg.clone()).map_err(|e| CliError::usage(e.to_string()))?;
    let (count, size) = count_and_size(collective, a.dtype, a.bytes, n);
    let call = Call::new(collective, count, a.dtype, a.op);
    let plan = Plan::new(collective, count, a.dtype, n, cfg.channels, cfg.chunk_bytes)
        .map_err(CliError::core)?;
    let mut bufs: Vec<RankBuffers> = (0..n)
        .map(|r| RankBuffers::zeroed(&call, n, r, false))
        .collect();
    for (r, b) in bufs.iter_mut().enumerate() {
        verify::fill_input(&plan, a.op, r as u32, 7, &mut b.input)
            .map_err(|e| CliError::internal(e.to_string()))?;
    }
    let report = cluster
        .run(&vec![call; n as usize], &mut bufs, false)
        .map_err(|e| CliError::failed(e.to_string()))?;
    let mut wrong = 0;
    for (r, res) in report.ranks.iter().enumerate() {
        if let Err(e) = res {
            return Err(CliError::failed(format!("rank {r}: {e}")));
        }
        wrong += verify::count_wrong(&plan, a.op, r as u32, 7, &bufs[r].output)
            .map_err(|e| CliError::internal(e.to_string()))?;
    }
    if let Some(p) = &a.chrome {
        cluster
            .write_chrome_trace(create(p)?)
            .map_err(|e| CliError::failed(format!("writing {}: {e}", p.display())))?;
    }
    if let Some(p) = &a.pcap {
        cluster
            .write_pcap(create(p)?)
            .map_err(|e| CliError::failed(format!("writing {}: {e}", p.display())))?;
    }
    let st = cluster.stats();
    stdout::println(&format!(
        "{} of {size} B on {n} ranks: {:.3} us simulated, {} events, #wrong {wrong}",
        collective,
        (report.end - report.start) * 1e6,
        report.events
    ))?;
    stdout::println(&format!(
        "  {} execs, {} work requests, {} packets ({} retransmitted, {} lost, {} ACKs, {} NAKs), {} credits, event-log hash {:016x}",
        st.execs, st.work_requests, st.packets, st.retransmissions, st.lost, st.acks, st.naks, st.credits, st.event_hash
    ))?;
    for (p, what) in [
        (
            &a.chrome,
            "timeline (open in ui.perfetto.dev or chrome://tracing)",
        ),
        (&a.pcap, "RoCEv2 capture (open in Wireshark)"),
    ] {
        if let Some(p) = p {
            stdout::println(&format!("wrote {}: {what}", p.display()))?;
        }
    }
    if wrong > 0 {
        return Err(CliError::failed(format!("{wrong} wrong elements")));
    }
    Ok(())
}
