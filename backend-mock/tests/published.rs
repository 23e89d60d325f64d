//! The calibrated simulator against published `all_reduce_perf` tables
//! (`data/published/*.json`, each with its source URL): for every table
//! with a matching preset, simulate the table's sizes with the tuner's
//! choice (Ring only for `"nccl_algo": "Ring"` tables), print the
//! simulated / published ratio per size and a verdict per table, and
//! assert the targets of issue 18:
//!
//! - **Ring** (`"nccl_algo": "Ring"` tables): busbw within ±15 % at every
//!   published size from 1 MiB to 8 GiB;
//! - **8 B latency** within ±30 % (the default-algorithm target; the 8 B
//!   row of a Ring table is held to it too, since the simulator runs Ring).
//!
//! A table or a row the simulator is known to miss carries
//! `"known_miss": "why"` in its JSON: it is printed and reported, not
//! asserted, so that the assertion covers the rest. Default-algorithm
//! busbw rows (NCCL runs Tree / NVLS there) are printed, never asserted.
//!
//! Beside each simulated time it prints the tuner's own analytic estimate
//! of the same choice (`model us`: NCCL's `latency + bytes / algbw` with
//! the preset's figures) and its ratio, and counts the targets that model
//! alone would meet; the test asserts that the simulator meets at least
//! as many (on the repository's tables: 48 against 39).
//!
//! A table's shape comes from the table, not only from the preset:
//! `gpus_per_node`, and optionally `nics_per_node`, `nic_gbits` (the
//! NIC's line rate in Gb/s), `launches_per_thread` (nccl-tests' `-g`:
//! GPUs one thread launches one after the other; 1 where not given) and
//! `channels` (a run that forced `NCCL_MIN_NCHANNELS`: the channels the
//! tuner may use), override the preset's.
//!
//! Run: `cargo test -p ringcc-mock --release --test published -- --nocapture`.
//!
//! Calibration sweeps: `RINGCC_PUBLISHED_SET` overrides hop latencies
//! and the like on top of each table's preset and shape, as
//! `[preset:]knob=µs` pairs separated by commas (for example
//! `dgx-h100:ll128_nic_us=14,proxy_us=1`; the knobs are the CLI's flags
//! of the same names), and `RINGCC_PUBLISHED_ONLY` keeps the tables whose
//! file name contains it. With either set the run reports and asserts
//! nothing about the targets: the `known_miss` marks are written for the
//! presets as they are.
//!
//! Other tables: `RINGCC_PUBLISHED_DIR=<folder>` reads every `*.json` in
//! that folder instead of `data/published` (same format: `source`,
//! `preset` — `dgx-h100`, `dgx-a100`, `p5-efa` or `p4d-efa` —, `nodes`,
//! `gpus_per_node`, optionally `nccl_algo`, `nics_per_node`, `nic_gbits`,
//! `launches_per_thread`, `channels`, and `rows` of `size`, `time_us`,
//! `algbw`, `busbw`), and reports without asserting, as a sweep does.

use std::path::{Path, PathBuf};

use ringcc_core::{Collective, DataType, ReduceOp};
use ringcc_mock::{Call, Cluster, ClusterConfig, Preset};
use serde_json::Value;

/// Ring busbw target: within ±15 %.
const RING_TOLERANCE: f64 = 0.15;
/// 8 B latency target: within ±30 %.
const LATENCY_TOLERANCE: f64 = 0.30;
/// The sizes the Ring target covers.
const RING_SIZES: std::ops::RangeInclusive<u64> = (1 << 20)..=(8 << 30);

/// Every `*.json` table in `dir`, by file name.
fn tables(dir: &Path) -> Vec<(String, Value)> {
    let mut out: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            let v: Value =
                serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            (p.file_name().unwrap().to_string_lossy().into_owned(), v)
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// Simulated seconds of one AllReduce of `bytes` (float, sum), with the
/// algorithm and protocol the tuner picks (Ring only for `ring` tables,
/// as `NCCL_ALGO=Ring`); the choice too.
fn simulate(cluster: &mut Cluster, bytes: u64, ring: bool) -> (f64, ringcc_core::tune::Estimate) {
    let n = cluster.ranks();
    let count = (bytes / 4).max(1);
    let mut tuner = cluster.config().tuner();
    if ring {
        tuner.algos = ringcc_core::tune::AlgoSet::only(ringcc_core::Algorithm::Ring);
    }
    let choice = tuner
        .choose(Collective::AllReduce, count * 4)
        .unwrap()
        .chosen;
    cluster.set_algorithm(choice.algorithm).unwrap();
    cluster.set_protocol(choice.protocol).unwrap();
    cluster.set_channels(Some(choice.channels)).unwrap();
    let call = Call::new(Collective::AllReduce, count, DataType::F32, ReduceOp::Sum);
    let report = cluster
        .run(&vec![call; n as usize], &mut [], false)
        .unwrap();
    assert!(report.ok(), "{report:?}");
    (report.duration(), choice)
}

/// The preset's configuration with the table's shape.
fn config(preset: Preset, t: &Value) -> ClusterConfig {
    let nodes = t["nodes"].as_u64().expect("nodes") as u32;
    let mut cfg = preset.config(nodes);
    cfg.gpus_per_node = t["gpus_per_node"].as_u64().expect("gpus_per_node") as u32;
    if let Some(n) = t["nics_per_node"].as_u64() {
        cfg.nics_per_node = n as u16;
    }
    if let Some(g) = t["nic_gbits"].as_f64() {
        cfg.nic.bandwidth = g * 1e9 / 8.0;
    }
    if let Some(g) = t["launches_per_thread"].as_u64() {
        cfg.calibration.launches_per_thread = g as u32;
    }
    if let Some(c) = t["channels"].as_u64() {
        cfg.channels = c as u32;
    }
    cfg
}

/// One `RINGCC_PUBLISHED_SET` override: the preset it is limited to (if
/// any), the knob and its value in µs.
type Override = (Option<Preset>, String, f64);

/// `RINGCC_PUBLISHED_SET`, parsed (a malformed entry stops the run).
fn overrides() -> Vec<Override> {
    let Ok(set) = std::env::var("RINGCC_PUBLISHED_SET") else {
        return Vec::new();
    };
    set.split(',')
        .filter(|e| !e.trim().is_empty())
        .map(|e| {
            let (scope, kv) = match e.split_once(':') {
                Some((p, kv)) => (
                    Some(
                        Preset::parse(p.trim())
                            .unwrap_or_else(|| panic!("unknown preset in {e:?}")),
                    ),
                    kv,
                ),
                None => (None, e),
            };
            let (k, v) = kv
                .split_once('=')
                .unwrap_or_else(|| panic!("{e:?}: want [preset:]knob=us"));
            let v: f64 = v
                .trim()
                .parse()
                .unwrap_or_else(|_| panic!("{e:?}: not a number"));
            assert!(v.is_finite() && v >= 0.0, "{e:?}: want a latency >= 0");
            (scope, k.trim().to_string(), v)
        })
        .collect()
}

/// Applies the overrides meant for `preset` to `cfg`.
fn apply(cfg: &mut ClusterConfig, preset: Preset, set: &[Override]) {
    for (scope, knob, us) in set {
        if scope.is_some_and(|p| p != preset) {
            continue;
        }
        let s = us * 1e-6;
        let k = &mut cfg.calibration;
        match knob.as_str() {
            "nvlink_us" => cfg.nvlink.latency = s,
            "nic_us" => cfg.nic.latency = s,
            "ll_nvlink_us" => k.ll.nvlink = s,
            "ll_nic_us" => k.ll.nic = s,
            "ll128_nvlink_us" => k.ll128.nvlink = s,
            "ll128_nic_us" => k.ll128.nic = s,
            "proxy_us" => k.proxy_latency = s,
            "launch_us" => k.launch_latency = s,
            other => panic!(
                "unknown knob {other:?}: nvlink_us, nic_us, ll_nvlink_us, ll_nic_us, \
                 ll128_nvlink_us, ll128_nic_us, proxy_us, launch_us"
            ),
        }
    }
}

/// What a row is held to.
#[derive(Clone, Copy, PartialEq)]
enum Target {
    /// 8 B latency, ±30 %.
    Latency,
    /// Ring busbw, ±15 %.
    RingBusbw,
    /// Printed only (default-algorithm busbw).
    None,
}

#[test]
fn published_tables() {
    let elsewhere = std::env::var_os("RINGCC_PUBLISHED_DIR").map(PathBuf::from);
    let dir = elsewhere
        .clone()
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../data/published"));
    let tables = tables(&dir);
    let elsewhere = elsewhere.is_some();
    assert!(
        elsewhere || tables.len() >= 4,
        "data/published holds {}",
        tables.len()
    );
    let set = overrides();
    let only = std::env::var("RINGCC_PUBLISHED_ONLY").ok();
    let sweep = !set.is_empty() || only.is_some() || elsewhere;
    if sweep {
        println!(
            "sweep: overrides {set:?}, tables matching {only:?}; targets reported, not asserted"
        );
    }
    let mut failures = Vec::new();
    let mut known = Vec::new();
    let mut stale = Vec::new();
    // `model_met`: targets the tuner's analytic estimate of the same
    // choices meets (see the module documentation).
    let (mut met, mut held, mut model_met) = (0, 0, 0);
    for (name, t) in &tables {
        let rows = t["rows"].as_array().expect("rows");
        assert!(!rows.is_empty(), "{name}: no rows");
        assert!(
            t["source"].as_str().unwrap().starts_with("https://"),
            "{name}: source"
        );
        for r in rows {
            for k in ["size", "time_us", "algbw", "busbw"] {
                assert!(r[k].is_number(), "{name}: row without {k}: {r}");
            }
        }
        let Some(preset) = t["preset"].as_str().and_then(Preset::parse) else {
            println!("\n{name}: no matching preset, not simulated");
            continue;
        };
        if only.as_deref().is_some_and(|o| !name.contains(o)) {
            continue;
        }
        let mut cfg = config(preset, t);
        apply(&mut cfg, preset, &set);
        let ranks = cfg.ranks() as u32;
        let ring = t["nccl_algo"].as_str() == Some("Ring");
        let table_miss = t["known_miss"].as_str();
        println!(
            "\n{name}: preset {}, {} nodes x {} GPUs, {} NICs of {:.0} Gb/s, NCCL_ALGO={}",
            preset.name(),
            cfg.nodes,
            cfg.gpus_per_node,
            cfg.nics_per_node,
            cfg.nic.bandwidth * 8.0 / 1e9,
            t["nccl_algo"].as_str().unwrap_or("(default)")
        );
        println!(
            "{:>12} {:>16} {:>10} {:>10} {:>9} {:>9} {:>7} {:>9} {:>7}",
            "size",
            "algo/proto/ch",
            "pub us",
            "sim us",
            "pub busbw",
            "sim busbw",
            "ratio",
            "model us",
            "m.ratio"
        );
        let mut cluster = Cluster::new(cfg).unwrap();
        let (mut t_met, mut t_held, mut t_known, mut t_fail, mut t_model) = (0, 0, 0, 0, 0);
        for r in rows {
            let size = r["size"].as_u64().unwrap();
            let target = if size == 8 {
                Target::Latency
            } else if ring && RING_SIZES.contains(&size) {
                Target::RingBusbw
            } else if RING_SIZES.contains(&size) {
                Target::None
            } else {
                continue;
            };
            let (secs, choice) = simulate(&mut cluster, size, ring);
            let factor = Collective::AllReduce.bus_factor(ranks);
            let sim_busbw = size as f64 / secs / 1e9 * factor;
            let pub_us = r["time_us"].as_f64().unwrap();
            let pub_busbw = r["busbw"].as_f64().unwrap();
            // Latency rows compare times, busbw rows bandwidths (the
            // inverse ratio of times).
            let ratio_of = |us: f64| {
                if target == Target::Latency {
                    us / pub_us
                } else {
                    size as f64 / us / 1e3 * factor / pub_busbw
                }
            };
            let ratio = ratio_of(secs * 1e6);
            let model_ratio = ratio_of(choice.time_us);
            let (what, tol) = match target {
                Target::Latency => ("latency", LATENCY_TOLERANCE),
                Target::RingBusbw => ("Ring busbw", RING_TOLERANCE),
                Target::None => ("", f64::INFINITY),
            };
            let meets = |r: f64| (r - 1.0).abs() <= tol;
            let within = meets(ratio);
            let miss = r["known_miss"].as_str().or(table_miss);
            let verdict = match (target, within, miss) {
                (Target::None, ..) => "  (default algorithm: not a Ring target)".to_string(),
                (_, true, _) => format!("  ({what}, within {:.0} %)", tol * 100.0),
                (_, false, Some(why)) => {
                    format!(
                        "  ({what}, OUTSIDE {:.0} %: KNOWN MISS: {why})",
                        tol * 100.0
                    )
                }
                (_, false, None) => format!("  ({what}, OUTSIDE {:.0} %: FAILS)", tol * 100.0),
            };
            println!(
                "{size:>12} {:>16} {pub_us:>10.1} {:>10.1} {pub_busbw:>9.2} {sim_busbw:>9.2} {ratio:>7.3} {:>9.1} {model_ratio:>7.3}{verdict}",
                format!(
                    "{}/{}/{}",
                    choice.algorithm.name(),
                    choice.protocol.name(),
                    choice.channels
                ),
                secs * 1e6,
                choice.time_us,
            );
            if target == Target::None {
                continue;
            }
            t_held += 1;
            if meets(model_ratio) {
                t_model += 1;
            }
            let line = format!(
                "{name} {size} B: {what} ratio {ratio:.3} (±{:.0} %)",
                tol * 100.0
            );
            match (within, miss) {
                (true, Some(_)) if r["known_miss"].is_string() => {
                    t_met += 1;
                    stale.push(line);
                }
                (true, _) => t_met += 1,
                (false, Some(why)) => {
                    t_known += 1;
                    known.push(format!("{line}: {why}"));
                }
                (false, None) => {
                    t_fail += 1;
                    failures.push(line);
                }
            }
        }
        println!(
            "verdict: {t_met} of {t_held} targets met, {t_known} known misses, {t_fail} failures{} \
             (the tuner's model alone: {t_model})",
            if t_held == 0 {
                " (no target applies)"
            } else {
                ""
            }
        );
        met += t_met;
        held += t_held;
        model_met += t_model;
    }
    println!(
        "\nall tables: {met} of {held} targets met (the tuner's analytic model of the same \
         choices alone: {model_met})"
    );
    for k in &known {
        println!("known miss: {k}");
    }
    if sweep {
        for f in &failures {
            println!("missed: {f}");
        }
        return;
    }
    assert!(
        failures.is_empty(),
        "targets missed (not marked known_miss):\n{}",
        failures.join("\n")
    );
    // The simulator is worth running only where it predicts better than
    // the analytic model it is tuned by.
    assert!(
        met >= model_met,
        "the simulator meets {met} targets, the tuner's analytic model alone {model_met}"
    );
    assert!(
        stale.is_empty(),
        "rows marked known_miss that meet their target now (remove the mark):\n{}",
        stale.join("\n")
    );
}
