//! `ringcc trace` as a user runs it: the seed reaches the faults, output
//! paths are checked before the run, a failed run still leaves its
//! timeline and capture, errors name each rank once, and the summary
//! counts what the capture holds.

mod common;

use common::{ringcc, stderr, stdout};

use std::path::{Path, PathBuf};
use std::process::Output;

use ringcc_core::wire::roce::{Opcode, RocePacketRepr, Syndrome};

/// A fresh scratch folder for one test.
fn scratch(name: &str) -> PathBuf {
    common::scratch("trace-cli", name)
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A small cluster: 2 nodes of 2 GPUs and 2 NICs.
const SMALL: [&str; 6] = [
    "--nodes",
    "2",
    "--gpus-per-node",
    "2",
    "--nics-per-node",
    "2",
];

/// `trace allreduce` on `topo` with `extra` flags.
fn trace(topo: &[&str], extra: &[&str]) -> Output {
    let mut args = vec!["trace", "allreduce"];
    args.extend_from_slice(topo);
    args.extend_from_slice(extra);
    ringcc(&args)
}

/// The number right before `label` in the summary (`974 ACKs`), or the
/// hex after it (`event-log hash 0123…`).
fn before(text: &str, label: &str) -> u64 {
    let at = text
        .find(label)
        .unwrap_or_else(|| panic!("no {label:?} in {text}"));
    let num = text[..at].trim_end().rsplit([' ', '(']).next().unwrap();
    num.parse()
        .unwrap_or_else(|e| panic!("{num:?} before {label:?}: {e}"))
}

fn hash(text: &str) -> String {
    let at = text.find("event-log hash ").expect("a hash") + "event-log hash ".len();
    text[at..].split_whitespace().next().unwrap().to_owned()
}

/// The frames of a pcap file (records after the 24-byte global header).
fn frames(pcap: &[u8]) -> Vec<&[u8]> {
    assert!(pcap.len() >= 24, "no pcap header");
    let mut out = Vec::new();
    let mut at = 24;
    while at + 16 <= pcap.len() {
        let incl = u32::from_le_bytes(pcap[at + 8..at + 12].try_into().unwrap()) as usize;
        out.push(&pcap[at + 16..at + 16 + incl]);
        at += 16 + incl;
    }
    assert_eq!(at, pcap.len(), "trailing bytes");
    out
}

/// ACK and NAK frames in a capture.
fn acks_and_naks(pcap: &[u8]) -> (u64, u64) {
    let (mut acks, mut naks) = (0, 0);
    for (i, f) in frames(pcap).into_iter().enumerate() {
        let p = RocePacketRepr::parse(f).unwrap_or_else(|e| panic!("frame {i}: {e}"));
        if p.bth.opcode != Opcode::Acknowledge {
            continue;
        }
        match p.aeth.expect("an ACK has an AETH").syndrome {
            Syndrome::Ack { .. } => acks += 1,
            _ => naks += 1,
        }
    }
    (acks, naks)
}

#[test]
fn the_seed_drives_the_faults() {
    let dir = scratch("seed");
    let pcap = dir.join("t.pcap");
    let run = |seed: &str| {
        let o = trace(
            &SMALL,
            &[
                "-b",
                "256K",
                "--loss",
                "0.1",
                "--seed",
                seed,
                "--pcap",
                s(&pcap),
            ],
        );
        assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
        hash(&stdout(&o))
    };
    let (one, two, again) = (run("1"), run("2"), run("1"));
    assert_ne!(one, two, "--seed 1 and --seed 2 injected the same faults");
    assert_eq!(one, again, "the same seed must give the same run");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn output_paths_are_checked_before_the_run() {
    let dir = scratch("paths");
    let good = dir.join("good");
    let bad = dir.join("no-such-dir").join("t");
    for (chrome, pcap, flag) in [(&good, &bad, "--pcap"), (&bad, &good, "--chrome")] {
        let o = trace(&SMALL, &["--chrome", s(chrome), "--pcap", s(pcap)]);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{}{err}", stdout(&o));
        assert!(err.contains(flag) && err.contains(s(&bad)), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert_eq!(stdout(&o), "", "it simulated before failing");
        assert!(
            !good.exists(),
            "{} was written before the check",
            good.display()
        );
    }
    // The same file twice, spelt two ways.
    let same = dir.join("same");
    let spelt = dir.join(".").join("same");
    let o = trace(&SMALL, &["--chrome", s(&same), "--pcap", s(&spelt)]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{}{err}", stdout(&o));
    assert!(err.contains("--chrome and --pcap"), "{err}");
    assert!(!same.exists());
    let _ = std::fs::remove_dir_all(&dir);
}

/// Loss go-back-N cannot beat: the run fails, deterministically.
fn failed_run(dir: &Path) -> (Output, PathBuf, PathBuf) {
    let (chrome, pcap) = (dir.join("t.json"), dir.join("t.pcap"));
    let o = trace(
        &["--nodes", "2"],
        &["--loss", "0.49", "--chrome", s(&chrome), "--pcap", s(&pcap)],
    );
    (o, chrome, pcap)
}

#[test]
fn a_failed_run_still_writes_its_timeline_and_capture() {
    let dir = scratch("failed");
    let (o, chrome, pcap) = failed_run(&dir);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{}{err}", stdout(&o));
    let json = std::fs::read_to_string(&chrome).expect("the timeline was not written");
    let trace: serde_json::Value = serde_json::from_str(&json).expect("the timeline parses");
    let events = trace["traceEvents"].as_array().expect("trace events");
    assert!(!events.is_empty());
    let cap = std::fs::read(&pcap).expect("the capture was not written");
    let (acks, naks) = acks_and_naks(&cap);
    let out = stdout(&o);
    assert_eq!(frames(&cap).len() as u64, before(&out, "packets"), "{out}");
    assert!(naks > 0 && acks > 0, "{acks} ACKs, {naks} NAKs");
    assert_eq!(err.lines().count(), 1, "one clear line: {err}");
    assert!(
        err.contains("failed") && err.contains("RetryExcErr"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every `rank N` a line names, in order.
fn ranks_named(line: &str) -> Vec<u64> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("rank ") {
        rest = &rest[at + "rank ".len()..];
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        if let Ok(n) = digits.parse() {
            out.push(n);
        }
    }
    out
}

#[test]
fn an_error_names_each_rank_once() {
    assert_eq!(ranks_named("rank 0: rank 0: aborted by rank 7"), [0, 0, 7]);
    let dir = scratch("ranks");
    let (o, _, _) = failed_run(&dir);
    let err = stderr(&o);
    assert!(!o.status.success());
    for line in err.lines() {
        let mut seen = ranks_named(line);
        let all = seen.len();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), all, "a rank named twice: {line}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_summary_counts_the_acks_the_capture_holds() {
    let dir = scratch("acks");
    let pcap = dir.join("t.pcap");
    let one_nic = [
        "--nodes",
        "2",
        "--gpus-per-node",
        "1",
        "--nics-per-node",
        "1",
    ];
    for loss in ["0", "0.05"] {
        let o = trace(&one_nic, &["-b", "64K", "--loss", loss, "--pcap", s(&pcap)]);
        let out = stdout(&o);
        assert!(o.status.success(), "{out}{}", stderr(&o));
        let cap = std::fs::read(&pcap).unwrap();
        let (acks, naks) = acks_and_naks(&cap);
        assert_eq!(before(&out, "ACKs"), acks, "loss {loss}: {out}");
        assert_eq!(before(&out, "NAKs"), naks, "loss {loss}: {out}");
        assert_eq!(before(&out, "packets"), frames(&cap).len() as u64, "{out}");
        if loss != "0" {
            assert!(naks > 0, "loss {loss} gave no NAK: {out}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_trace_past_the_machines_memory_is_refused_before_any_file_is_made() {
    // Today: a 1 TiB buffer per rank, allocated, and an abort (rc 134).
    let dir = scratch("too-big");
    let pcap = dir.join("t.pcap");
    let o = ringcc(&[
        "trace",
        "allreduce",
        "-b",
        "1T",
        "--pcap",
        pcap.to_str().unwrap(),
    ]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("of memory") && err.contains("-b"), "{err}");
    assert!(!pcap.exists());
    let o = ringcc(&[
        "trace",
        "allreduce",
        "-b",
        "2T",
        "--pcap",
        pcap.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("1T"), "{}", stderr(&o));
}
