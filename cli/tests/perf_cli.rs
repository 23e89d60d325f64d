//! `ringcc perf` as a newcomer and an adversary run it: nccl-tests' whole
//! flag set, the check at the speed of the data, bounded memory, clear
//! refusals instead of aborts, progress only on a terminal.

mod common;

use common::{rows, run, stderr, stdout};

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A usage error: exit 2, one clear line, no panic, no abort.
fn refused(line: &str, want: &str) -> String {
    let o = run(line);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{line}: {err}{}", stdout(&o));
    assert!(err.contains(want), "{line}: {err}");
    assert!(
        !err.contains("panicked") && !err.contains("memory allocation"),
        "{err}"
    );
    err
}

#[test]
fn sizes_past_the_bound_are_refused_at_once() {
    let t = Instant::now();
    refused("perf allreduce -b 18446744073709551615 -c 0", "1T");
    refused("perf allreduce -e 2T -c 0", "1T");
    refused("perf allreduce -b 1025G -e 1025G", "1T");
    assert!(t.elapsed() < Duration::from_secs(10));
}

#[test]
fn iteration_counts_are_checked_arithmetic() {
    // Today: wraps to 0 calls, prints time 0.00, OK, rc 0.
    refused("perf allreduce -w 4294967295 -n 1", "calls per size");
    refused("perf allreduce -n 2147483648 -m 2", "calls per size");
    refused("perf allreduce -m 0", "-m must be at least 1");
}

#[test]
fn a_run_beyond_the_machines_memory_is_refused_with_what_it_needs() {
    // Today: `-b 100G -e 100G -n 1 -w 0` dies with SIGABRT (rc 134). 1T
    // is past any CI machine's memory, whatever its size.
    let err = refused(
        "perf allreduce -b 1T -e 1T -n 1 -w 0 --gpus-per-node 4",
        "of memory",
    );
    assert!(err.contains("-c 0"), "{err}");
    assert!(err.contains("available"), "{err}");
    // What it suggests runs: the timing table alone, at 100G.
    let o = run("perf allreduce -b 100G -e 100G -n 1 -w 0 -c 0");
    assert!(o.status.success(), "{}", stderr(&o));
    let r = &rows(&stdout(&o))[0];
    assert_eq!((r[0].as_str(), r[8].as_str()), ("107374182400", "N/A"));
}

#[test]
fn nccl_tests_readme_command_lines_run_as_written() {
    // all_reduce_perf -b 8 -e 128M -f 2 -g 1, with the check: the README's
    // first job on one node.
    let o = run("perf allreduce -b 8 -e 128M -f 2 -g 1");
    let out = stdout(&o);
    assert!(o.status.success(), "{out}{}", stderr(&o));
    let rows = rows(&out);
    assert_eq!(rows.len(), 25, "{out}");
    assert!(rows.iter().all(|r| r[8] == "0" && r[12] == "0"), "{out}");
    assert!(out.contains("# -g 1: "), "{out}");
    assert!(out.contains("# Out of bounds values : 0 OK"), "{out}");
    // all_reduce_perf -b 8 -e 128M -f 2 -g 8 (its quick example), briefly.
    let o = run("perf allreduce -b 8 -e 1M -f 2 -g 8 -n 1 -w 0");
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn every_nccl_tests_flag_is_accepted_and_said_once_in_the_header() {
    let dir = std::env::temp_dir().join(format!("ringcc-perf-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("perf.json");
    let o = run(&format!("perf allreduce -b 1K -e 4K -f 4 -t 1 -g 1 -c 2 -z 0 -a 1 -m 2 -G 1 -C 0 -N 2 -p 0 -T 600 -R 1 --gpus-per-node 4 -J {}", json.to_str().unwrap()));
    let out = stdout(&o);
    assert!(o.status.success(), "{out}{}", stderr(&o));
    assert!(out.contains("agg iters: 2 validation: 1 graph: 1"), "{out}");
    for flag in [
        "-g 1 -t 1: ",
        "-z 0: ",
        "-a 1: ",
        "-G 1: ",
        "-C 0: ",
        "-p 0: ",
        "-R 1: ",
        "-m 2: ",
        "-c 2: ",
    ] {
        let lines = out
            .lines()
            .filter(|l| l.starts_with(&format!("# {flag}")))
            .count();
        assert_eq!(lines, 1, "{flag}: {out}");
    }
    // -N 2: the sweep twice, the same numbers both times.
    let rows = rows(&out);
    assert_eq!(rows.len(), 4, "{out}");
    assert_eq!(rows[0], rows[2]);
    assert_eq!(rows[1], rows[3]);
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(doc["rows"][3]["cycle"], 2);
    assert_eq!(doc["agg_iters"], 2);
    let _ = std::fs::remove_dir_all(&dir);
    // Not given, not said.
    let o = run("perf allreduce -b 1K -e 1K --gpus-per-node 2");
    assert!(
        !stdout(&o).lines().any(|l| l.starts_with("# -")),
        "{}",
        stdout(&o)
    );
}

#[test]
fn every_type_and_every_op() {
    let o = run("perf allreduce -b 4K -e 4K -d all -o all -n 1 -w 0 --gpus-per-node 3");
    let out = stdout(&o);
    assert!(o.status.success(), "{out}{}", stderr(&o));
    let rows = rows(&out);
    assert_eq!(rows.len(), 50, "{out}");
    let mut seen: Vec<(String, String)> =
        rows.iter().map(|r| (r[2].clone(), r[3].clone())).collect();
    seen.dedup();
    assert_eq!(seen.len(), 50);
    assert_eq!((rows[0][2].as_str(), rows[0][3].as_str()), ("int8", "sum"));
    assert_eq!(
        (rows[49][2].as_str(), rows[49][3].as_str()),
        ("bfloat16", "avg")
    );
    assert!(rows.iter().all(|r| r[8] == "0" && r[12] == "0"), "{out}");
    // A collective that does not reduce runs each type once.
    let o = run("perf broadcast -b 4K -e 4K -d all -o all --gpus-per-node 3");
    let rows = self::rows(&stdout(&o));
    assert_eq!(rows.len(), 10);
    assert!(rows.iter().all(|r| r[3] == "none"));
}

#[test]
fn aggregated_calls_report_the_time_per_call() {
    let cols = |m: &str| -> Vec<String> {
        let o = run(&format!(
            "perf allreduce -b 1K -e 16M -f 16 --nodes 2 -c 0 -m {}",
            m
        ));
        assert!(o.status.success(), "{}", stderr(&o));
        rows(&stdout(&o))
            .iter()
            .flat_map(|r| [r[5].clone(), r[9].clone()])
            .collect()
    };
    assert_eq!(cols("1"), cols("4"));
}

#[test]
fn the_timeout_ends_an_endless_run() {
    // -N 0 repeats the sweep until interrupted; -T 1 interrupts it.
    let t = Instant::now();
    let o = run("perf broadcast -b 1K -e 1K --gpus-per-node 2 -N 0 -T 1");
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("-T 1"), "{}", stderr(&o));
    assert!(rows(&stdout(&o)).len() > 1);
    assert!(t.elapsed() < Duration::from_secs(30));
}

#[test]
fn the_check_does_not_change_the_timing_table() {
    for coll in [
        "allreduce",
        "reducescatter",
        "allgather",
        "broadcast",
        "reduce",
    ] {
        let table = |check: &str| -> Vec<Vec<String>> {
            let o = run(&format!("perf {} -b 64K -e 16M -f 16 --nodes 2 --gpus-per-node 2 --nics-per-node 2 -n 2 -w 1 -c {} -r 1", coll, check));
            assert!(o.status.success(), "{coll}: {}", stderr(&o));
            rows(&stdout(&o))
                .into_iter()
                .map(|r| [&r[..8], &r[9..12]].concat())
                .collect()
        };
        assert_eq!(table("1"), table("0"), "{coll}");
    }
}

#[test]
fn injected_corruption_is_counted_on_every_collective() {
    for coll in [
        "allreduce",
        "reducescatter",
        "allgather",
        "broadcast",
        "reduce",
    ] {
        let o = run(&format!(
            "perf {} -b 8M -e 8M -n 1 -w 0 --nodes 2 --gpus-per-node 4 --inject-corruption 3 -r 2",
            coll
        ));
        let out = stdout(&o);
        assert_eq!(o.status.code(), Some(1), "{coll}: {out}{}", stderr(&o));
        let r = &rows(&out)[0];
        assert_eq!((r[8].as_str(), r[12].as_str()), ("3", "3"), "{coll}: {out}");
        assert!(out.contains("# Out of bounds values : 6 FAILED"), "{out}");
    }
}

/// Runs `ringcc` under a pseudo-terminal (util-linux `script`), stdout
/// and stderr both to it; returns what the terminal showed.
fn on_a_terminal(args: &[&str], delay_ms: Option<u64>) -> String {
    let cmd = std::iter::once(env!("CARGO_BIN_EXE_ringcc"))
        .chain(args.iter().copied())
        .collect::<Vec<_>>()
        .join(" ");
    let mut c = Command::new("script");
    c.args(["-qefc", &cmd, "/dev/null"])
        .stdin(Stdio::null())
        .env_remove("RUST_LOG");
    if let Some(d) = delay_ms {
        c.env("RINGCC_PROGRESS_DELAY_MS", d.to_string());
    }
    let o = c
        .output()
        .expect("util-linux `script` runs the command on a pseudo-terminal");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// `s` without ANSI escape sequences (`ESC [ … letter`).
fn strip_escapes(s: &str) -> String {
    let mut out = String::new();
    let mut it = s.chars();
    while let Some(c) = it.next() {
        if c == '\x1b' {
            for d in it.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[test]
fn progress_shows_on_a_terminal_after_a_delay_and_never_on_a_pipe() {
    let args = [
        "perf",
        "allreduce",
        "-b",
        "1M",
        "-e",
        "16M",
        "-f",
        "2",
        "--nodes",
        "2",
    ];
    // A terminal and a run longer than the delay (0 here): a progress
    // line, and the table as on a pipe.
    let tty = on_a_terminal(&args, Some(0));
    assert!(tty.contains("[ringcc perf]"), "{tty}");
    assert!(tty.contains("# Out of bounds values : 0 OK"), "{tty}");
    // A run shorter than the delay: no line.
    let quick = on_a_terminal(
        &[
            "perf",
            "allreduce",
            "-b",
            "1K",
            "-e",
            "1K",
            "--gpus-per-node",
            "2",
        ],
        None,
    );
    assert!(!quick.contains("[ringcc perf]"), "{quick}");
    // A pipe: nothing on stderr, whatever the delay.
    let o = Command::new(env!("CARGO_BIN_EXE_ringcc"))
        .args(args)
        .env("RINGCC_PROGRESS_DELAY_MS", "0")
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    assert!(o.status.success());
    assert_eq!(stderr(&o), "");
    let piped = rows(&stdout(&o));
    let shown = rows(&strip_escapes(&tty).replace('\r', "\n"));
    let shown: Vec<_> = shown
        .into_iter()
        .filter(|r| r.len() == 13 && r[0].chars().all(|c| c.is_ascii_digit()))
        .collect();
    assert_eq!(shown, piped, "the table is the same on a terminal");
}
