//! `ringcc trace`: one collective on the simulator, with payload, written
//! out as a Chrome / Perfetto timeline and a pcap of the RoCEv2 traffic.
//!
//! The order matters to a user: the output files are created before the
//! run, so that a path that cannot be written fails at once rather than
//! after the simulation; they are written after it whether it succeeded or
//! not, since a failed run is when the timeline and the capture are needed
//! most; only then is the failure reported.

use std::fs::File;
use std::path::{Path, PathBuf};

use ringcc_mock::{Call, Cluster, ClusterConfig, GeneratedData, RunReport};

use crate::args::TraceArgs;
use crate::backend::mock::config;
use crate::error::CliError;
use crate::perf::{available_memory, count_and_size, human_bytes};
use crate::stdout;

/// Salt of the inputs `verify` fills and checks.
const SALT: u64 = 7;

/// One output file, created and waiting for its contents (the
/// simulator's writers buffer and flush themselves).
struct Output {
    path: PathBuf,
    file: File,
}

/// `p` made absolute without requiring it to exist: the file itself if it
/// exists, else its directory joined with its name.
fn resolved(p: &Path) -> Option<PathBuf> {
    if let Ok(c) = std::fs::canonicalize(p) {
        return Some(c);
    }
    let dir = match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    Some(std::fs::canonicalize(dir).ok()?.join(p.file_name()?))
}

/// Whether two output paths name the same file.
fn same_file(a: &Path, b: &Path) -> bool {
    a == b || matches!((resolved(a), resolved(b)), (Some(x), Some(y)) if x == y)
}

fn create(flag: &str, path: &Path) -> Result<Output, CliError> {
    let file = File::create(path)
        .map_err(|e| CliError::usage(format!("cannot create {flag} {}: {e}", path.display())))?;
    Ok(Output {
        path: path.to_path_buf(),
        file,
    })
}

/// Creates the `--chrome` and `--pcap` files, or neither.
fn open_outputs(a: &TraceArgs) -> Result<(Option<Output>, Option<Output>), CliError> {
    if let (Some(c), Some(p)) = (&a.chrome, &a.pcap) {
        if same_file(c, p) {
            return Err(CliError::usage(format!(
                "--chrome and --pcap both name {}: give two files",
                c.display()
            )));
        }
    }
    let chrome = a
        .chrome
        .as_deref()
        .map(|p| create("--chrome", p))
        .transpose()?;
    let pcap = match a.pcap.as_deref().map(|p| create("--pcap", p)).transpose() {
        Ok(p) => p,
        Err(e) => {
            if let Some(c) = chrome {
                drop(c.file);
                // Best effort: the file was created empty a moment ago.
                let _ = std::fs::remove_file(&c.path);
            }
            return Err(e);
        }
    };
    Ok((chrome, pcap))
}

/// Writes what the cluster recorded into the files; the first failure.
fn write_outputs(
    cluster: &Cluster,
    chrome: Option<Output>,
    pcap: Option<Output>,
) -> Result<(), CliError> {
    let failed = |o: &Output, e: std::io::Error| {
        CliError::failed(format!("writing {}: {e}", o.path.display()))
    };
    let mut first = Ok(());
    if let Some(o) = chrome {
        if let Err(e) = cluster.write_chrome_trace(&o.file) {
            first = first.and(Err(failed(&o, e)));
        }
    }
    if let Some(o) = pcap {
        if let Err(e) = cluster.write_pcap(&o.file) {
            first = first.and(Err(failed(&o, e)));
        }
    }
    first
}

/// The failure of a run whose ranks did not all succeed: how many failed,
/// and the root cause of the first one's failure, which names its rank
/// itself.
fn run_failure(what: impl std::fmt::Display, report: &RunReport) -> Option<CliError> {
    let mut failed = report.ranks.iter().filter_map(|r| r.as_ref().err());
    let first = failed.next()?;
    Some(CliError::failed(format!(
        "simulated {what} failed on {} of {} ranks: {}",
        1 + failed.count(),
        report.ranks.len(),
        first.root_cause()
    )))
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
    // One seed for the run: `faults.seed` stays unset, so the simulator
    // derives the fault generator's seed from the cluster's.
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
    // Inputs generated where they are read, outputs checked where they
    // are written: the check at the speed of the data, in the memory of
    // one rank's output (as `perf`'s), and refused up front where even
    // that is more than the machine has.
    // The capture keeps every frame: about the bytes that cross the
    // nodes' NICs, twice the size per node for a ring AllReduce.
    let frames = if a.pcap.is_some() && cfg.nodes > 1 {
        size.saturating_mul(2).saturating_mul(u64::from(cfg.nodes))
    } else {
        0
    };
    let need = GeneratedData::bytes_needed(&call, n).saturating_add(frames);
    if let Some(avail) = available_memory() {
        if need > avail / 10 * 9 {
            return Err(CliError::usage(format!(
                "checking {size} B {collective} on {n} ranks needs about {} of memory, more than the {} this machine has available: trace a smaller size (-b)",
                human_bytes(need),
                human_bytes(avail)
            )));
        }
    }
    let mut data = GeneratedData::new(call, n, SALT).map_err(|e| CliError::usage(e.to_string()))?;
    let (chrome, pcap) = open_outputs(a)?;
    let run = cluster.run_generated(&vec![call; n as usize], &mut data, false);
    let written = write_outputs(&cluster, chrome, pcap);
    let report = match run {
        Ok(r) => r,
        Err(e) => return Err(CliError::failed(format!("simulated {collective}: {e}"))),
    };
    let failure = run_failure(collective, &report);
    let wrong = if failure.is_none() { data.wrong() } else { 0 };
    let st = cluster.stats();
    let outcome = match &failure {
        Some(_) => "FAILED".to_string(),
        None => format!("#wrong {wrong}"),
    };
    stdout::println(&format!(
        "{} of {size} B on {n} ranks: {:.3} us simulated, {} events, {outcome}",
        collective,
        (report.end - report.start) * 1e6,
        report.events
    ))?;
    stdout::println(&format!(
        "  {} execs, {} work requests, {} packets ({} retransmitted, {} lost, {} ACKs, {} NAKs), {} credits, event-log hash {:016x}",
        st.execs, st.work_requests, st.packets, st.retransmissions, st.lost, st.acks, st.naks, st.credits, st.event_hash
    ))?;
    match (written, &failure) {
        (Err(w), Some(f)) => return Err(CliError::failed(format!("{f}; {w}"))),
        (Err(w), None) => return Err(w),
        (Ok(()), _) => {}
    }
    let upto = if failure.is_some() {
        ", up to the failure"
    } else {
        ""
    };
    for (p, what) in [
        (
            &a.chrome,
            "timeline (open in ui.perfetto.dev or chrome://tracing)",
        ),
        (&a.pcap, "RoCEv2 capture (open in Wireshark)"),
    ] {
        if let Some(p) = p {
            stdout::println(&format!("wrote {}: {what}{upto}", p.display()))?;
        }
    }
    if let Some(f) = failure {
        return Err(f);
    }
    if wrong > 0 {
        return Err(CliError::failed(format!("{wrong} wrong elements")));
    }
    Ok(())
}
