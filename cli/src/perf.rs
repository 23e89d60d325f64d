//! `ringcc perf`: nccl-tests' measurement loop and table.
//!
//! For every size from `-b` to `-e`: warm-up iterations, timed iterations,
//! then (with `-c`) checked iterations whose outputs are compared element
//! by element with the reference (`#wrong`), out of place then in place.
//! `algbw = size / time`, `busbw = algbw · factor` with nccl-tests'
//! factors; sizes and counts as nccl-tests prints them (for ReduceScatter
//! and AllGather `size` is the whole buffer, `count` one rank's block).

use std::fmt::Write as _;

use std::time::{Duration, Instant};

use ringcc_core::{Collective, DataType, ReduceOp};
use serde_json::json;

use crate::args::{NcclFlag, PerfArgs};
use crate::error::CliError;
use crate::progress::Progress;

/// One collective call, as every rank makes it: the core's.
pub use ringcc_core::Call;

/// What `perf` needs from a backend.
pub trait PerfBackend {
    /// Ranks in the communicator.
    fn ranks(&self) -> u32;
    /// Lines for the header (devices, links), without the leading `# `.
    fn describe(&self) -> Vec<String>;
    /// Whether the time column is simulated cluster time.
    fn simulated(&self) -> bool;
    /// Whether this process prints the table (rank 0 of a multi-process
    /// job; always for the simulator).
    fn prints(&self) -> bool {
        true
    }
    /// Why the backend cannot honour nccl-tests' `flag` (said once in the
    /// header when the flag is given); `None` when it does.
    fn lacks(&self, flag: NcclFlag) -> Option<String>;
    /// Whether one checked run says all there is to say about a call (a
    /// deterministic simulator): `-c N` then checks once.
    fn deterministic(&self) -> bool {
        false
    }
    /// What one size will cost this process, estimated before it runs.
    fn estimate(&self, _call: &Call, _calls: u64, _checked: bool) -> Estimate {
        Estimate::default()
    }
    /// Runs `warmup` untimed then `iters` timed iterations; returns the
    /// mean seconds per iteration (the slowest rank's, for real backends).
    fn time(
        &mut self,
        call: &Call,
        in_place: bool,
        warmup: u32,
        iters: u32,
    ) -> Result<f64, CliError>;
    /// Runs one iteration with reference inputs and returns the number of
    /// wrong output elements over all ranks. `corrupt` elements of rank
    /// 0's output are corrupted first (test-only fault).
    fn check(&mut self, call: &Call, in_place: bool, corrupt: u64) -> Result<u64, CliError>;
}

/// The memory and time one size of a run needs, estimated up front.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Estimate {
    /// Peak bytes held while it runs.
    pub bytes: u64,
    /// Wall-clock seconds on this machine (both placements).
    pub seconds: f64,
    /// Peak bytes without the check (`-c 0`).
    pub unchecked_bytes: u64,
}

/// One measured cell (out of place or in place).
#[derive(Clone, Copy, Debug)]
struct Cell {
    time: f64,
    algbw: f64,
    busbw: f64,
    wrong: Option<u64>,
}

/// The sizes nccl-tests would visit.
pub fn sizes(a: &PerfArgs) -> Result<Vec<u64>, CliError> {
    if a.minbytes > a.maxbytes {
        return Err(CliError::usage(format!(
            "-b {} is larger than -e {}",
            a.minbytes, a.maxbytes
        )));
    }
    let mut v = Vec::new();
    let mut s = a.minbytes;
    loop {
        v.push(s);
        if v.len() > 4096 {
            return Err(CliError::usage(
                "more than 4096 sizes: use a larger -f or -i",
            ));
        }
        let next = match a.stepfactor {
            Some(f) if f < 2 => return Err(CliError::usage("-f must be at least 2")),
            Some(f) => s.saturating_mul(f),
            None if a.stepbytes == 0 => return Err(CliError::usage("-i must be at least 1")),
            None => s.saturating_add(a.stepbytes),
        };
        if next > a.maxbytes || next == s || (s == 0 && a.stepfactor.is_some()) {
            break;
        }
        s = next;
    }
    Ok(v)
}

/// NCCL's count and nccl-tests' printed size for `bytes` on `ranks`.
pub fn count_and_size(c: Collective, dtype: DataType, bytes: u64, ranks: u32) -> (u64, u64) {
    let elem = u64::from(dtype.size());
    let total = bytes / elem;
    match c {
        Collective::ReduceScatter | Collective::AllGather => {
            let per = total / u64::from(ranks);
            (per, per * u64::from(ranks) * elem)
        }
        _ => (total, total * elem),
    }
}

fn fmt_time(us: f64) -> String {
    if us >= 10_000.0 {
        format!("{us:8.0}")
    } else if us >= 100.0 {
        format!("{us:8.1}")
    } else {
        format!("{us:8.2}")
    }
}

fn fmt_cell(c: &Cell) -> String {
    let wrong = c.wrong.map_or("N/A".to_string(), |w| w.to_string());
    format!(
        " {} {:7.2} {:7.2} {:>6}",
        fmt_time(c.time * 1e6),
        c.algbw / 1e9,
        c.busbw / 1e9,
        wrong
    )
}

/// Bytes as a person reads them.
pub fn human_bytes(b: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", units[u])
    }
}

/// The largest size flag (`16G`, `700M`, `12345`) at most `b`.
fn human_size_flag(b: u64) -> String {
    for (shift, unit) in [(40, "T"), (30, "G"), (20, "M"), (10, "K")] {
        if b >> shift > 0 {
            return format!("{}{unit}", b >> shift);
        }
    }
    b.to_string()
}

/// Seconds as a person reads them.
pub fn human_secs(s: f64) -> String {
    if s < 90.0 {
        format!("{s:.1} s")
    } else if s < 5400.0 {
        format!("{:.0} min", s / 60.0)
    } else if s < 2.0 * 86400.0 {
        format!("{:.1} h", s / 3600.0)
    } else {
        format!("{:.0} days", s / 86400.0)
    }
}

/// The memory this process may use: the kernel's estimate of what can be
/// allocated without swapping (`MemAvailable`), or `None` where unknown.
pub fn available_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// One table row's call for each (type, op) the flags ask for, in
/// nccl-tests' order: types outer, operations inner; a collective that
/// does not reduce runs each type once.
fn variants(a: &PerfArgs, collective: Collective) -> Vec<(DataType, ReduceOp)> {
    let ops: &[ReduceOp] = if collective.reduces() {
        &a.ops.0
    } else {
        a.ops.0.get(..1).unwrap_or(&[ReduceOp::Sum])
    };
    a.dtypes
        .0
        .iter()
        .flat_map(|d| ops.iter().map(move |o| (*d, *o)))
        .collect()
}

/// The run's plan: every size's call, and what the whole run will cost.
struct Sweep {
    /// Each size's call, printed size and estimated seconds.
    cells: Vec<(Call, u64, f64)>,
    estimate: Estimate,
}

/// Builds the sweep and refuses what does not fit this machine's memory.
fn sweep(
    a: &PerfArgs,
    backend: &dyn PerfBackend,
    collective: Collective,
    calls_per_cell: u64,
) -> Result<Sweep, CliError> {
    let n = backend.ranks();
    let sizes = sizes(a)?;
    let checked = a.check > 0;
    let mut cells = Vec::new();
    let mut total = Estimate::default();
    let mut worst: Option<(u64, Estimate)> = None;
    for (dtype, op) in variants(a, collective) {
        for &bytes in &sizes {
            let (count, size) = count_and_size(collective, dtype, bytes, n);
            let call = Call {
                collective,
                count,
                dtype,
                op,
            };
            let e = backend.estimate(&call, calls_per_cell, checked);
            total.seconds += e.seconds;
            total.bytes = total.bytes.max(e.bytes);
            total.unchecked_bytes = total.unchecked_bytes.max(e.unchecked_bytes);
            if worst.is_none_or(|(_, w)| e.bytes > w.bytes) {
                worst = Some((size, e));
            }
            cells.push((call, size, e.seconds));
        }
    }
    if let (Some(avail), Some((size, w))) = (available_memory(), worst) {
        if w.bytes > avail / 10 * 9 {
            // The largest size that would fit (the estimate grows with
            // the size).
            let needs = |bytes: u64| {
                variants(a, collective)
                    .iter()
                    .map(|(d, o)| {
                        let (count, _) = count_and_size(collective, *d, bytes, n);
                        let call = Call {
                            collective,
                            count,
                            dtype: *d,
                            op: *o,
                        };
                        backend.estimate(&call, calls_per_cell, checked).bytes
                    })
                    .max()
                    .unwrap_or(0)
            };
            let (mut lo, mut hi) = (0u64, size);
            while hi - lo > 1 {
                let mid = lo + (hi - lo) / 2;
                if needs(mid) <= avail / 10 * 9 {
                    lo = mid;
                } else {
                    hi = mid;
                }
            }
            let fits = match lo {
                0 => String::new(),
                lo if lo >= a.minbytes => format!(", or sizes up to -e {}", human_size_flag(lo)),
                lo => format!(", or sizes up to {0} (-b {0} -e {0})", human_size_flag(lo)),
            };
            let mut msg = format!(
                "this run needs about {} of memory ({} B {} on {n} ranks{}), more than the {} this machine has available",
                human_bytes(w.bytes),
                size,
                collective.name(),
                if checked { ", checked" } else { "" },
                human_bytes(avail),
            );
            if checked && w.unchecked_bytes <= avail / 10 * 9 {
                let _ = write!(
                    msg,
                    ": run it without the check (-c 0: about {}){fits}",
                    human_bytes(w.unchecked_bytes)
                );
            } else {
                let _ = write!(msg, ": run it with smaller sizes{fits}");
            }
            return Err(CliError::usage(msg));
        }
    }
    Ok(Sweep {
        cells,
        estimate: total,
    })
}

/// Runs the measurement and prints the table to stdout; returns whether
/// every result was correct.
pub fn perf(a: &PerfArgs, backend: &mut dyn PerfBackend) -> Result<bool, CliError> {
    let started = Instant::now();
    let n = backend.ranks();
    let collective = a.collective.collective(a.root);
    if a.root >= n {
        return Err(CliError::usage(format!(
            "-r {} is out of range for {n} ranks",
            a.root
        )));
    }
    if a.iters == 0 {
        return Err(CliError::usage("-n must be at least 1"));
    }
    if a.agg_iters == 0 {
        return Err(CliError::usage("-m must be at least 1"));
    }
    // Calls per size and placement, in checked arithmetic: the backends
    // count iterations in u32.
    let timed = a.iters.checked_mul(a.agg_iters);
    let calls = timed.and_then(|t| t.checked_add(a.warmup));
    let (Some(timed), Some(calls)) = (timed, calls) else {
        return Err(CliError::usage(format!(
            "-w {} -n {} -m {}: more than {} calls per size",
            a.warmup,
            a.iters,
            a.agg_iters,
            u32::MAX
        )));
    };
    let plan = sweep(a, backend, collective, u64::from(calls))?;
    let checks = if a.check == 0 {
        0
    } else if backend.deterministic() {
        1
    } else {
        a.check
    };
    let prints = backend.prints();
    let mut out = String::new();
    let root = collective.root().map_or(-1, |r| i64::from(r.0));
    let _ = writeln!(
        out,
        "# ringcc perf {}: nRanks {n} minBytes {} maxBytes {} step: {} warmup iters: {} iters: {} agg iters: {} validation: {} graph: {}",
        collective.name(),
        a.minbytes,
        a.maxbytes,
        a.stepfactor.map_or(format!("{}(bytes)", a.stepbytes), |f| format!("{f}(factor)")),
        a.warmup,
        a.iters,
        a.agg_iters,
        a.check.min(1),
        a.cudagraph.unwrap_or(0),
    );
    let _ = writeln!(out, "#");
    for line in backend.describe() {
        let _ = writeln!(out, "# {line}");
    }
    if backend.simulated() {
        let _ = writeln!(out, "# time is SIMULATED cluster time (virtual clock of the simulator), not wall-clock time");
    }
    // Flags with the same reason share a line (`-g 1 -t 1: …`).
    let mut notes: Vec<(String, String)> = Vec::new();
    for (flag, given) in a.given() {
        if let Some(why) = backend.lacks(flag) {
            match notes.iter_mut().find(|(_, w)| *w == why) {
                Some((g, _)) => {
                    g.push(' ');
                    g.push_str(&given);
                }
                None => notes.push((given, why)),
            }
        }
    }
    for (given, why) in notes {
        let _ = writeln!(out, "# {given}: {why}");
    }
    let _ = writeln!(out, "#");
    let _ = writeln!(out, "#{:>73}{:>31}", "out-of-place", "in-place");
    let _ = writeln!(
        out,
        "#{:>11} {:>13} {:>9} {:>7} {:>7} {:>8} {:>7} {:>7} {:>6} {:>8} {:>7} {:>7} {:>6}",
        "size",
        "count",
        "type",
        "redop",
        "root",
        "time",
        "algbw",
        "busbw",
        "#wrong",
        "time",
        "algbw",
        "busbw",
        "#wrong"
    );
    let _ = writeln!(
        out,
        "#{:>11} {:>13} {:>9} {:>7} {:>7} {:>8} {:>7} {:>7} {:>6} {:>8} {:>7} {:>7} {:>6}",
        "(B)",
        "(elements)",
        "",
        "",
        "",
        "(us)",
        "(GB/s)",
        "(GB/s)",
        "",
        "(us)",
        "(GB/s)",
        "(GB/s)",
        ""
    );
    if prints {
        crate::stdout::print(&out)?;
    }
    out.clear();
    let cycles = a.run_cycles;
    let per_cycle = plan.estimate.seconds;
    tracing::info!(
        seconds = per_cycle,
        bytes = plan.estimate.bytes,
        unchecked_bytes = plan.estimate.unchecked_bytes,
        "estimated per cycle"
    );
    if prints && per_cycle > 60.0 {
        eprintln!(
            "ringcc perf: this run will take about {} on this machine{}; fewer sizes (-e), iterations (-n, -w) or -c 0 make it shorter",
            human_secs(per_cycle * f64::from(cycles.max(1))),
            if cycles == 0 { " per cycle (-N 0 repeats until interrupted)" } else { "" }
        );
    }
    let progress = Progress::new(prints, per_cycle * f64::from(cycles.max(1)));
    // A -T past what the clock can count is no limit.
    let deadline = (a.timeout > 0)
        .then(|| started.checked_add(Duration::from_secs(a.timeout)))
        .flatten();
    let mut rows = Vec::new();
    let mut wrong_total = 0u64;
    let mut bus_sum = 0.0;
    let mut bus_n = 0u32;
    let mut cycle = 0u32;
    while cycles == 0 || cycle < cycles {
        cycle = cycle.saturating_add(1);
        for (call, size, seconds) in &plan.cells {
            let mut cells = Vec::new();
            let cost = seconds / 2.0;
            for in_place in [false, true] {
                if let Some(d) = deadline {
                    if Instant::now() > d {
                        progress.finish();
                        return Err(CliError::failed(format!(
                            "timed out: the run took longer than -T {} s",
                            a.timeout
                        )));
                    }
                }
                let place = if in_place { "in-place" } else { "out-of-place" };
                progress.show(&format!(
                    "{} {} {} {place}: {} + {} calls",
                    human_bytes(*size),
                    call.dtype.name(),
                    if collective.reduces() {
                        call.op.name()
                    } else {
                        ""
                    },
                    a.warmup,
                    timed
                ));
                let time = backend.time(call, in_place, a.warmup, timed)?;
                let algbw = ringcc_core::cost::algbw(*size as f64, time);
                let busbw = algbw * collective.bus_factor(n);
                let wrong = if checks > 0 {
                    progress.show(&format!("{} {place}: checking", human_bytes(*size)));
                    let mut w = 0u64;
                    for _ in 0..checks {
                        w = w.saturating_add(backend.check(call, in_place, a.inject_corruption)?);
                    }
                    Some(w)
                } else {
                    None
                };
                progress.advance(cost);
                wrong_total = wrong_total.saturating_add(wrong.unwrap_or(0));
                bus_sum += busbw;
                bus_n += 1;
                cells.push(Cell {
                    time,
                    algbw,
                    busbw,
                    wrong,
                });
            }
            let op_name = if collective.reduces() {
                call.op.name()
            } else {
                "none"
            };
            let line = format!(
                "{:>12} {:>13} {:>9} {:>7} {:>7}{}{}\n",
                size,
                call.count,
                call.dtype.name(),
                op_name,
                root,
                fmt_cell(&cells[0]),
                fmt_cell(&cells[1])
            );
            if prints {
                progress.suspend(|| crate::stdout::print(&line))?;
            }
            rows.push(json!({
                "cycle": cycle,
                "size": size, "count": call.count, "type": call.dtype.name(), "redop": op_name, "root": root,
                "out_of_place": cell_json(&cells[0]), "in_place": cell_json(&cells[1]),
            }));
        }
    }
    progress.finish();
    let avg = if bus_n > 0 {
        bus_sum / f64::from(bus_n) / 1e9
    } else {
        0.0
    };
    let ok = wrong_total == 0;
    let _ = writeln!(
        out,
        "# Out of bounds values : {wrong_total} {}",
        if ok { "OK" } else { "FAILED" }
    );
    let _ = writeln!(out, "# Avg bus bandwidth    : {avg:.4} ");
    let _ = writeln!(out, "#");
    if prints {
        crate::stdout::print(&out)?;
        if let Some(path) = &a.json {
            let names = |v: Vec<&str>| v.into_iter().map(String::from).collect::<Vec<_>>();
            let doc = json!({
                "tool": "ringcc perf",
                "collective": collective.name(),
                "ranks": n,
                "datatypes": names(a.dtypes.0.iter().map(|d| d.name()).collect()),
                "ops": names(if collective.reduces() { a.ops.0.iter().map(|o| o.name()).collect() } else { vec!["none"] }),
                "root": root,
                "simulated_time": backend.simulated(),
                "warmup_iters": a.warmup,
                "iters": a.iters,
                "agg_iters": a.agg_iters,
                "check": a.check,
                "run_cycles": a.run_cycles,
                "rows": rows,
                "out_of_bounds": wrong_total,
                "avg_busbw_gbps": avg,
            });
            let text = serde_json::to_string_pretty(&doc)
                .map_err(|e| CliError::internal(e.to_string()))?;
            std::fs::write(path, text + "\n")
                .map_err(|e| CliError::failed(format!("cannot write {}: {e}", path.display())))?;
        }
    }
    Ok(ok)
}

fn cell_json(c: &Cell) -> serde_json::Value {
    json!({
        "time_us": c.time * 1e6,
        "algbw_gbps": c.algbw / 1e9,
        "busbw_gbps": c.busbw / 1e9,
        "wrong": c.wrong,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::{Cli, Command};
    use clap::Parser;

    fn args(v: &[&str]) -> PerfArgs {
        let mut full = vec!["ringcc", "perf"];
        full.extend_from_slice(v);
        match Cli::try_parse_from(full).unwrap().command {
            Command::Perf(p) => p,
            _ => unreachable!(),
        }
    }

    #[test]
    fn size_sequences_follow_nccl_tests() {
        assert_eq!(
            sizes(&args(&["allreduce", "-b", "8", "-e", "64", "-f", "2"])).unwrap(),
            [8, 16, 32, 64]
        );
        assert_eq!(
            sizes(&args(&["allreduce", "-b", "1K", "-e", "3K", "-i", "1K"])).unwrap(),
            [1024, 2048, 3072]
        );
        assert_eq!(sizes(&args(&["allreduce"])).unwrap(), [32 << 20]);
        assert!(sizes(&args(&["allreduce", "-b", "8", "-e", "4"])).is_err());
        assert!(sizes(&args(&["allreduce", "-f", "1"])).is_err());
        assert!(sizes(&args(&["allreduce", "-b", "1", "-e", "1G", "-i", "1"])).is_err());
    }

    #[test]
    fn counts_and_sizes_as_nccl_tests_prints_them() {
        assert_eq!(
            count_and_size(Collective::AllReduce, DataType::F32, 1024, 8),
            (256, 1024)
        );
        // AllGather: count is one rank's block; size the whole (aligned).
        assert_eq!(
            count_and_size(Collective::AllGather, DataType::F32, 1000, 8),
            (31, 992)
        );
        assert_eq!(
            count_and_size(Collective::ReduceScatter, DataType::F64, 8, 4),
            (0, 0)
        );
    }
}
