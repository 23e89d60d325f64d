//! The topology flags every subcommand shares, a closed stdout, and link
//! rates the simulator cannot time: the `ringcc` binary as a user runs it.

mod common;

use common::{ringcc, stderr, stdout};

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

/// A fresh scratch folder for one test.
fn scratch(test: &str) -> PathBuf {
    common::scratch("topo", test)
}

/// A small, fast perf run, with `extra` flags.
fn perf(extra: &[&str]) -> Output {
    let mut args = vec![
        "perf",
        "allreduce",
        "-b",
        "1K",
        "-e",
        "1K",
        "-n",
        "1",
        "-w",
        "0",
    ];
    args.extend_from_slice(extra);
    ringcc(&args)
}

/// The first data row's out-of-place time (us) of a perf table.
fn first_time(out: &str) -> f64 {
    let row = out
        .lines()
        .find(|l| !l.starts_with('#') && !l.trim().is_empty())
        .unwrap_or_else(|| panic!("no data row in\n{out}"));
    let fields: Vec<&str> = row.split_whitespace().collect();
    fields
        .get(5)
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("no time in {row:?}"))
}

#[test]
fn every_subcommand_takes_ranks() {
    let o = perf(&["--ranks", "4"]);
    let out = stdout(&o);
    assert!(o.status.success(), "{out}\n{}", stderr(&o));
    assert!(out.contains("nRanks 4 "), "{out}");
    assert!(out.contains("1 node(s) x 4 GPU(s)"), "{out}");

    let o = perf(&["--ranks", "6", "--nodes", "2"]);
    let out = stdout(&o);
    assert!(o.status.success(), "{out}\n{}", stderr(&o));
    assert!(out.contains("nRanks 6 "), "{out}");
    assert!(out.contains("2 node(s) x 3 GPU(s)"), "{out}");

    let dir = scratch("ranks");
    let chrome = dir.join("t.json");
    let chrome = chrome.to_str().expect("utf-8 temp path");
    let o = ringcc(&[
        "trace",
        "allgather",
        "-b",
        "4K",
        "--ranks",
        "3",
        "--chrome",
        chrome,
    ]);
    let out = stdout(&o);
    assert!(o.status.success(), "{out}\n{}", stderr(&o));
    assert!(out.contains("on 3 ranks"), "{out}");

    let o = ringcc(&["explain", "allreduce", "--ranks", "4", "--nodes", "2"]);
    let out = stdout(&o);
    assert!(o.status.success(), "{out}\n{}", stderr(&o));
    assert!(out.contains("on 4 ranks: 2 node(s) x 2 GPU(s)"), "{out}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn ranks_that_disagree_with_gpus_per_node_are_a_usage_error() {
    let dir = scratch("disagree");
    let chrome = dir.join("t.json");
    let chrome = chrome.to_str().expect("utf-8 temp path");
    for args in [
        vec![
            "explain",
            "allreduce",
            "--ranks",
            "4",
            "--gpus-per-node",
            "3",
        ],
        vec!["perf", "allreduce", "--ranks", "4", "--gpus-per-node", "3"],
        vec![
            "trace",
            "allreduce",
            "--ranks",
            "4",
            "--gpus-per-node",
            "3",
            "--chrome",
            chrome,
        ],
        // --gpus-per-node given as its default is still given.
        vec![
            "explain",
            "allreduce",
            "--ranks",
            "4",
            "--gpus-per-node",
            "8",
        ],
        // Without --nodes the ranks are on one node.
        vec![
            "explain",
            "allreduce",
            "--ranks",
            "16",
            "--gpus-per-node",
            "8",
        ],
    ] {
        let o = ringcc(&args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains("--ranks") && err.contains("--gpus-per-node") && err.contains("disagree"),
            "{args:?}: {err}"
        );
        assert!(stdout(&o).is_empty(), "{args:?}: {}", stdout(&o));
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// Runs `ringcc args` with stdout a pipe that is closed after
/// `lines_first` lines were read; returns its exit status and stderr.
fn with_closed_stdout(args: &[&str], lines_first: usize) -> (Option<i32>, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ringcc"))
        .args(args)
        .env_remove("RUST_BACKTRACE")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn ringcc");
    let out = child.stdout.take().expect("stdout pipe");
    let mut reader = BufReader::new(out);
    for _ in 0..lines_first {
        let mut line = String::new();
        let n = reader.read_line(&mut line).expect("read a line");
        assert!(n > 0, "{args:?}: stdout ended early");
    }
    drop(reader);
    let o = child.wait_with_output().expect("wait for ringcc");
    (o.status.code(), stderr(&o))
}

#[test]
fn a_closed_stdout_ends_every_subcommand_quietly() {
    let dir = scratch("pipe");
    let chrome = dir.join("t.json");
    let chrome = chrome.to_str().expect("utf-8 temp path");
    let cases: [(&[&str], usize); 4] = [
        // Far more than a pipe's buffer: the write blocks, then fails.
        (&["explain", "allreduce", "--ranks", "1024"], 1),
        (&["explain", "allreduce", "--ranks", "1024"], 0),
        (
            &[
                "perf",
                "allreduce",
                "-b",
                "1K",
                "-e",
                "1M",
                "-f",
                "2",
                "-n",
                "1",
                "-w",
                "0",
            ],
            0,
        ),
        (
            &[
                "trace",
                "allreduce",
                "-b",
                "4K",
                "--ranks",
                "2",
                "--chrome",
                chrome,
            ],
            0,
        ),
    ];
    for (args, lines) in cases {
        let (code, err) = with_closed_stdout(args, lines);
        assert_ne!(code, Some(101), "{args:?} panicked: {err}");
        assert!(
            matches!(code, Some(0) | Some(141)),
            "{args:?}: exit {code:?}: {err}"
        );
        assert!(err.is_empty(), "{args:?}: not quiet: {err}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn link_rates_the_simulator_cannot_time_are_refused() {
    let fast = ["-c", "0", "-n", "1", "-w", "0"];
    // 1e-9 GB/s is 1 B/s: its picoseconds per byte overflow the rate.
    let o = ringcc(&[
        "perf",
        "allreduce",
        "--nvlink-gbps",
        "1e-9",
        "-c",
        "0",
        "-n",
        "1",
        "-w",
        "0",
    ]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{}\n{err}", stdout(&o));
    assert!(
        err.contains("NVLink bandwidth") && err.contains("at least 233 B/s"),
        "{err}"
    );
    let mut args = vec![
        "perf",
        "allreduce",
        "--nodes",
        "2",
        "--gpus-per-node",
        "1",
        "--nic-gbits",
        "1e-9",
    ];
    args.extend_from_slice(&fast);
    let o = ringcc(&args);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{}\n{err}", stdout(&o));
    assert!(err.contains("NIC bandwidth"), "{err}");

    // Slow accepted rates are timed, not saturated: ten times the
    // bandwidth, a tenth of the time (4 KiB at 1 KB/s: about 4 s, under
    // the simulator's 60 s no-progress deadline).
    let time = |gbps: &str| {
        let mut args = vec![
            "perf",
            "allreduce",
            "-b",
            "4K",
            "-e",
            "4K",
            "--ranks",
            "2",
            "--nvlink-gbps",
            gbps,
        ];
        args.extend_from_slice(&fast);
        let o = ringcc(&args);
        let out = stdout(&o);
        assert!(o.status.success(), "{gbps}: {out}\n{}", stderr(&o));
        first_time(&out)
    };
    let (t6, t5) = (time("1e-6"), time("1e-5"));
    let ratio = t6 / t5;
    assert!(
        (9.0..=11.0).contains(&ratio),
        "1e-6: {t6} us, 1e-5: {t5} us"
    );
}
