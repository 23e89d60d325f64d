//! `ringcc perf`: nccl-tests' measurement loop and table.
//!
//! For every size from `-b` to `-e`: warm-up iterations, timed iterations,
//! then (with `-c`) checked iterations whose outputs are compared element
//! by element with the reference (`#wrong`), out of place then in place.
//! `algbw = size / time`, `busbw = algbw · factor` with nccl-tests'
//! factors; sizes and counts as nccl-tests prints them (for ReduceScatter
//! and AllGather `size` is the whole buffer, `count` one rank's block).

use std::fmt::Write as _;
use std::io::{IsTerminal, Write as _};

use ringcc_core::{Collective, DataType, ReduceOp};
use serde_json::json;

use crate::args::PerfArgs;
use crate::error::CliError;

/// One collective call, as every rank makes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PerfCall {
    /// The collective and root.
    pub collective: Collective,
    /// NCCL's count (per block for ReduceScatter / AllGather).
    pub count: u64,
    /// Element type.
    pub dtype: DataType,
    /// Reduction.
    pub op: ReduceOp,
}

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
    /// Runs `warmup` untimed then `iters` timed iterations; returns the
    /// mean seconds per iteration (the slowest rank's, for real backends).
    fn time(
        &mut self,
        call: &PerfCall,
        in_place: bool,
        warmup: u32,
        iters: u32,
    ) -> Result<f64, CliError>;
    /// Runs one iteration with reference inputs and returns the number of
    /// wrong output elements over all ranks. `corrupt` elements of rank
    /// 0's output are corrupted first (test-only fault).
    fn check(&mut self, call: &PerfCall, in_place: bool, corrupt: u64) -> Result<u64, CliError>;
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

/// Progress on stderr, only when stderr is a terminal (it never mixes
/// into a piped table).
struct Progress {
    on: bool,
}

impl Progress {
    fn new() -> Progress {
        Progress {
            on: std::io::stderr().is_terminal(),
        }
    }
    fn show(&self, msg: &str) {
        if self.on {
            let mut e = std::io::stderr();
            let _ = write!(e, "\r\x1b[2K[ringcc perf] {msg}");
            let _ = e.flush();
        }
    }
    fn clear(&self) {
        if self.on {
            let _ = write!(std::io::stderr(), "\r\x1b[2K");
        }
    }
}

/// Runs the measurement and prints the table to stdout; returns whether
/// every result was correct.
pub fn perf(a: &PerfArgs, backend: &mut dyn PerfBackend) -> Result<bool, CliError> {
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
    let sizes = sizes(a)?;
    let prints = backend.prints();
    let mut out = String::new();
    let op_name = if collective.reduces() {
        a.op.name()
    } else {
        "none"
    };
    let root = collective.root().map_or(-1, |r| i64::from(r.0));
    let _ = writeln!(
        out,
        "# ringcc perf {}: nRanks {n} minBytes {} maxBytes {} step: {} warmup iters: {} iters: {} validation: {}",
        collective.name(),
        a.minbytes,
        a.maxbytes,
        a.stepfactor.map_or(format!("{}(bytes)", a.stepbytes), |f| format!("{f}(factor)")),
        a.warmup,
        a.iters,
        a.check.min(1)
    );
    let _ = writeln!(out, "#");
    for line in backend.describe() {
        let _ = writeln!(out, "# {line}");
    }
    if backend.simulated() {
        let _ = writeln!(out, "# time is SIMULATED cluster time (virtual clock of the simulator), not wall-clock time");
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
    let progress = Progress::new();
    let mut rows = Vec::new();
    let mut wrong_total = 0u64;
    let mut bus_sum = 0.0;
    let mut bus_n = 0u32;
    for &bytes in &sizes {
        let (count, size) = count_and_size(collective, a.dtype, bytes, n);
        let call = PerfCall {
            collective,
            count,
            dtype: a.dtype,
            op: a.op,
        };
        let mut cells = Vec::new();
        for in_place in [false, true] {
            let place = if in_place { "in-place" } else { "out-of-place" };
            progress.show(&format!(
                "{size} B {place}: {} + {} iterations",
                a.warmup, a.iters
            ));
            let time = backend.time(&call, in_place, a.warmup, a.iters)?;
            let algbw = ringcc_core::cost::algbw(size as f64, time);
            let busbw = algbw * collective.bus_factor(n);
            let wrong = if a.check > 0 {
                progress.show(&format!("{size} B {place}: checking"));
                let mut w = 0;
                for _ in 0..a.check {
                    w += backend.check(&call, in_place, a.inject_corruption)?;
                }
                Some(w)
            } else {
                None
            };
            wrong_total += wrong.unwrap_or(0);
            bus_sum += busbw;
            bus_n += 1;
            cells.push(Cell {
                time,
                algbw,
                busbw,
                wrong,
            });
        }
        progress.clear();
        let line = format!(
            "{:>12} {:>13} {:>9} {:>7} {:>7}{}{}",
            size,
            count,
            a.dtype.name(),
            op_name,
            root,
            fmt_cell(&cells[0]),
            fmt_cell(&cells[1])
        );
        if prints {
            crate::stdout::println(&line)?;
        }
        rows.push(json!({
            "size": size, "count": count, "type": a.dtype.name(), "redop": op_name, "root": root,
            "out_of_place": cell_json(&cells[0]), "in_place": cell_json(&cells[1]),
        }));
    }
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
            let doc = json!({
                "tool": "ringcc perf",
                "collective": collective.name(),
                "ranks": n,
                "datatype": a.dtype.name(),
                "op": op_name,
                "root": root,
                "simulated_time": backend.simulated(),
                "warmup_iters": a.warmup,
                "iters": a.iters,
                "check": a.check,
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
