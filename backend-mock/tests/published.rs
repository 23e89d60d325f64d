//! The calibrated simulator against published `all_reduce_perf` tables
//! (`data/published/*.json`, each with its source): for every table with
//! a matching preset, simulate the table's sizes with the tuner's choice
//! (Ring only: the simulator cannot run Tree yet) and print simulated /
//! published busbw per size and the 8 B latency ratio.
//!
//! The targets (issue 18): Ring (`NCCL_ALGO=Ring` tables) within ±15 % of
//! busbw at every size from 1 MiB to 8 GiB; default-algorithm 8 B latency
//! within ±30 %. What is asserted here is only what the data and the
//! simulator can honestly be held to today (see the README's "Tuning and
//! the calibrated simulator"): every table parses and every run finishes;
//! the ratios are printed (`--nocapture`) for the record.

use std::path::PathBuf;

use ringcc_core::{Collective, DataType, ReduceOp};
use ringcc_mock::{Call, Cluster, Preset};

fn tables() -> Vec<(String, serde_json::Value)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../data/published");
    let mut out: Vec<_> = std::fs::read_dir(&dir)
        .expect("data/published")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .map(|p| {
            let v: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
            (p.file_name().unwrap().to_string_lossy().into_owned(), v)
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// Simulated seconds of one AllReduce of `bytes` (float, sum), with the
/// protocol the tuner picks; the protocol too.
fn simulate(cluster: &mut Cluster, bytes: u64) -> (f64, ringcc_core::Protocol) {
    let n = cluster.ranks();
    let count = (bytes / 4).max(1);
    let choice = cluster
        .config()
        .tuner()
        .choose(Collective::AllReduce, count * 4)
        .unwrap()
        .chosen;
    cluster.set_protocol(choice.protocol).unwrap();
    let call = Call::new(Collective::AllReduce, count, DataType::F32, ReduceOp::Sum);
    let t0 = cluster.now();
    let report = cluster
        .run(&vec![call; n as usize], &mut [], false)
        .unwrap();
    assert!(report.ok(), "{report:?}");
    (cluster.now() - t0, choice.protocol)
}

#[test]
fn published_tables() {
    let tables = tables();
    assert!(tables.len() >= 3, "data/published holds {}", tables.len());
    for (name, t) in tables {
        let rows = t["rows"].as_array().expect("rows");
        assert!(!rows.is_empty(), "{name}: no rows");
        assert!(t["source"].as_str().unwrap().starts_with("https://"));
        let Some(preset) = t["preset"].as_str().and_then(Preset::parse) else {
            println!("{name}: no matching preset, not simulated");
            continue;
        };
        let nodes = t["nodes"].as_u64().unwrap() as u32;
        let mut cfg = preset.config(nodes);
        if let Some(g) = t["nic_gbits"].as_f64() {
            cfg.nic.bandwidth = g * 1e9 / 8.0;
        }
        let ranks = cfg.ranks() as u32;
        let ring = t["nccl_algo"].as_str() == Some("Ring");
        println!(
            "{name}: preset {}, {} ranks, NCCL_ALGO={}",
            preset.name(),
            ranks,
            t["nccl_algo"].as_str().unwrap_or("(default)")
        );
        println!(
            "{:>12} {:>6} {:>10} {:>10} {:>9} {:>9} {:>7}",
            "size", "proto", "pub us", "sim us", "pub busbw", "sim busbw", "ratio"
        );
        let mut cluster = Cluster::new(cfg).unwrap();
        for r in rows {
            let size = r["size"].as_u64().unwrap();
            let in_range = size == 8 || (1 << 20..=8 << 30).contains(&size);
            if !in_range {
                continue;
            }
            let (secs, proto) = simulate(&mut cluster, size);
            let factor = Collective::AllReduce.bus_factor(ranks);
            let sim_busbw = size as f64 / secs / 1e9 * factor;
            let pub_us = r["time_us"].as_f64().unwrap();
            let pub_busbw = r["busbw"].as_f64().unwrap();
            let ratio = if size == 8 {
                secs * 1e6 / pub_us
            } else {
                sim_busbw / pub_busbw
            };
            let target = match (size, ring) {
                (8, _) => (ratio - 1.0).abs() <= 0.30,
                (_, true) => (ratio - 1.0).abs() <= 0.15,
                (_, false) => true,
            };
            println!(
                "{size:>12} {:>6} {pub_us:>10.1} {:>10.1} {pub_busbw:>9.2} {sim_busbw:>9.2} {ratio:>7.3}{}",
                proto.name(),
                secs * 1e6,
                match (size, ring, target) {
                    (8, _, true) => "  (latency, within 30 %)",
                    (8, _, false) => "  (latency, OUTSIDE 30 %)",
                    (_, false, _) => "  (default algorithm: not a Ring target)",
                    (_, true, true) => "  (Ring, within 15 %)",
                    (_, true, false) => "  (Ring, OUTSIDE 15 %)",
                }
            );
        }
    }
}
