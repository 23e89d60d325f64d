//! The `ringcc` binary, run as a user runs it.

mod common;

use common::{ringcc, rows, stderr, stdout};

use ringcc_core::wire::roce::RocePacketRepr;

fn close(a: f64, b: f64, tol: f64) -> bool {
    (a - b).abs() <= tol * a.abs().max(b.abs()).max(1e-9) || (a - b).abs() < 0.011
}

#[test]
fn perf_table_follows_nccl_tests() {
    let o = ringcc(&[
        "perf",
        "allreduce",
        "-b",
        "1K",
        "-e",
        "4M",
        "-f",
        "16",
        "-n",
        "2",
        "-w",
        "1",
        "--nodes",
        "2",
        "--gpus-per-node",
        "4",
        "--nics-per-node",
        "2",
    ]);
    let out = stdout(&o);
    assert!(o.status.success(), "{out}\n{}", stderr(&o));
    assert!(out.contains("# time is SIMULATED cluster time"), "{out}");
    assert!(
        out.contains(
            "#       size         count      type   redop    root     time   algbw   busbw #wrong"
        ),
        "{out}"
    );
    assert!(out.contains("# Out of bounds values : 0 OK"), "{out}");
    assert!(out.contains("# Avg bus bandwidth    : "), "{out}");
    let rows = rows(&out);
    assert_eq!(rows.len(), 4, "{out}"); // 1K, 16K, 256K, 4M
    let n = 8.0;
    for r in &rows {
        assert_eq!(r.len(), 13, "{r:?}");
        let size: f64 = r[0].parse().unwrap();
        let count: f64 = r[1].parse().unwrap();
        assert_eq!(
            (r[2].as_str(), r[3].as_str(), r[4].as_str()),
            ("float", "sum", "-1")
        );
        assert_eq!(size, count * 4.0);
        for cell in [&r[5..9], &r[9..13]] {
            let time_us: f64 = cell[0].parse().unwrap();
            let algbw: f64 = cell[1].parse().unwrap();
            let busbw: f64 = cell[2].parse().unwrap();
            assert_eq!(cell[3], "0", "{r:?}");
            assert!(time_us > 0.0);
            // nccl-tests: algbw = size / time (GB/s = 1e9 B/s);
            // busbw = algbw · 2(n−1)/n for AllReduce.
            assert!(close(algbw, size / (time_us * 1e-6) / 1e9, 0.02), "{r:?}");
            assert!(close(busbw, algbw * 2.0 * (n - 1.0) / n, 0.02), "{r:?}");
        }
    }
}

#[test]
fn allgather_sizes_and_counts_and_json() {
    let dir = std::env::temp_dir().join(format!("ringcc-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("perf.json");
    let o = ringcc(&[
        "perf",
        "allgather",
        "-b",
        "1000",
        "-e",
        "1000",
        "-n",
        "1",
        "-w",
        "0",
        "--gpus-per-node",
        "8",
        "-d",
        "int32",
        "-J",
        json.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let r = &rows(&stdout(&o))[0];
    // Size is the whole output (aligned to ranks), count one rank's block.
    assert_eq!(
        (r[0].as_str(), r[1].as_str(), r[3].as_str()),
        ("992", "31", "none")
    );
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(doc["collective"], "allgather");
    assert_eq!(doc["rows"][0]["size"], 992);
    assert_eq!(doc["rows"][0]["out_of_place"]["wrong"], 0);
    assert_eq!(doc["out_of_bounds"], 0);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn every_collective_type_and_op_checks_clean() {
    for (coll, d, op) in [
        ("reducescatter", "bfloat16", "max"),
        ("broadcast", "int8", "sum"),
        ("reduce", "double", "avg"),
        ("allreduce", "half", "prod"),
        ("allreduce", "uint64", "min"),
    ] {
        let o = ringcc(&[
            "perf",
            coll,
            "-b",
            "4K",
            "-e",
            "4K",
            "-n",
            "1",
            "-w",
            "0",
            "--gpus-per-node",
            "4",
            "-d",
            d,
            "-o",
            op,
            "-r",
            "3",
        ]);
        let out = stdout(&o);
        assert!(o.status.success(), "{coll} {d} {op}: {out}{}", stderr(&o));
        let r = &rows(&out)[0];
        assert_eq!((r[8].as_str(), r[12].as_str()), ("0", "0"), "{out}");
    }
}

#[test]
fn a_corrupted_result_is_counted_and_fails_the_run() {
    let o = ringcc(&[
        "perf",
        "allreduce",
        "-b",
        "64K",
        "-e",
        "64K",
        "-n",
        "1",
        "-w",
        "0",
        "--gpus-per-node",
        "4",
        "--inject-corruption",
        "3",
    ]);
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    let r = &rows(&out)[0];
    assert_eq!((r[8].as_str(), r[12].as_str()), ("3", "3"), "{out}");
    assert!(out.contains("# Out of bounds values : 6 FAILED"), "{out}");
}

#[test]
fn explain_four_ranks_matches_the_primitive_table() {
    let o = ringcc(&[
        "explain",
        "allreduce",
        "--ranks",
        "4",
        "--channels",
        "1",
        "--values",
    ]);
    let out = stdout(&o);
    assert!(o.status.success(), "{}", stderr(&o));
    let table = [
        "send",
        "recvReduceSend",
        "recvReduceSend",
        "recvReduceCopySend",
        "recvCopySend",
        "recvCopySend",
        "recv",
    ];
    for (s, prim) in table.iter().enumerate() {
        let block = out
            .split(&format!("  step {s}:\n"))
            .nth(1)
            .unwrap_or_else(|| panic!("no step {s}:\n{out}"));
        for r in 0..4 {
            let line = block
                .lines()
                .find(|l| l.trim_start().starts_with(&format!("GPU{r} ")))
                .unwrap();
            assert_eq!(
                line.split_whitespace().nth(1),
                Some(*prim),
                "step {s} rank {r}: {line}"
            );
            // Chunk (r − s − 1) mod 4.
            let chunk = (r + 8 - s - 1) % 4;
            assert!(
                line.contains(&format!("chunk {chunk} ")),
                "step {s} rank {r}: {line}"
            );
        }
    }
    assert!(!out.contains("  step 7:"), "{out}");
    assert!(out.contains("GPU0 owns S0 = b0+c0+d0+a0"), "{out}");
    assert!(out.contains("GPU2: S0 S1 S2 S3 ✓"), "{out}");
    assert!(
        out.contains("steps per rank per loop: 7   communication rounds: 6"),
        "{out}"
    );
    assert!(out.contains("bytes sent per rank: 2·S·(N−1)/N"), "{out}");
}

#[test]
fn explain_shows_nvlink_and_nic_hops() {
    let o = ringcc(&[
        "explain",
        "reducescatter",
        "--ranks",
        "6",
        "--nodes",
        "3",
        "--nics-per-node",
        "1",
    ]);
    let out = stdout(&o);
    assert!(out.contains("channel  0: GPU0 → GPU1 ⇒NIC0→NIC0⇒ GPU2 → GPU3 ⇒NIC0→NIC0⇒ GPU4 → GPU5 ⇒NIC0→NIC0⇒ GPU0"), "{out}");
}

#[test]
fn trace_writes_valid_json_and_a_pcap_that_parses() {
    let dir = std::env::temp_dir().join(format!("ringcc-trace-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (chrome, pcap) = (dir.join("t.json"), dir.join("t.pcap"));
    let o = ringcc(&[
        "trace",
        "allreduce",
        "-b",
        "256K",
        "--nodes",
        "2",
        "--gpus-per-node",
        "2",
        "--nics-per-node",
        "2",
        "--chrome",
        chrome.to_str().unwrap(),
        "--pcap",
        pcap.to_str().unwrap(),
        "--loss",
        "0.02",
    ]);
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    let trace: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&chrome).unwrap()).unwrap();
    let events = trace
        .get("traceEvents")
        .or(Some(&trace))
        .and_then(|v| v.as_array())
        .expect("trace events");
    assert!(
        events.iter().any(|e| e["name"] == "recvReduceCopySend"),
        "no primitive events"
    );
    // pcap: global header, then records of RoCEv2 frames.
    let b = std::fs::read(&pcap).unwrap();
    assert!(b.len() > 24);
    let magic = u32::from_le_bytes(b[0..4].try_into().unwrap());
    assert!(
        magic == 0xa1b2_c3d4 || magic == 0xa1b2_3c4d,
        "magic {magic:x}"
    );
    assert_eq!(
        u32::from_le_bytes(b[20..24].try_into().unwrap()),
        1,
        "LINKTYPE_ETHERNET"
    );
    let mut at = 24;
    let mut frames = 0;
    while at + 16 <= b.len() {
        let incl = u32::from_le_bytes(b[at + 8..at + 12].try_into().unwrap()) as usize;
        let frame = &b[at + 16..at + 16 + incl];
        RocePacketRepr::parse(frame)
            .unwrap_or_else(|e| panic!("frame {frames} does not parse: {e}"));
        frames += 1;
        at += 16 + incl;
    }
    assert_eq!(at, b.len());
    assert!(frames > 10, "{frames} frames");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn mistakes_get_one_clear_line_and_a_nonzero_exit() {
    for (args, want) in [
        (vec!["perf", "allreduce", "-b", "8X"], "is not a size"),
        (
            vec!["perf", "allreduce", "-d", "float7"],
            "unknown data type",
        ),
        (vec!["perf", "allreduce", "-o", "xor"], "unknown operation"),
        (
            vec!["perf", "allreduce", "-b", "8", "-e", "4"],
            "is larger than -e",
        ),
        (
            vec!["perf", "broadcast", "-r", "9", "--gpus-per-node", "4"],
            "out of range",
        ),
        (
            vec!["perf", "allreduce", "--nodes", "2", "--nics-per-node", "0"],
            "nics-per-node",
        ),
        (vec!["perf", "allreduce", "--channels", "65"], "1..=64"),
        (vec!["perf", "allreduce", "--chunk-bytes", "64M"], "chunk"),
        (
            vec!["explain", "allreduce", "--ranks", "6", "--nodes", "4"],
            "does not divide",
        ),
        (
            vec!["explain", "allreduce", "--ranks", "40", "--values"],
            "at most",
        ),
        (vec!["trace", "allreduce"], "nothing to write"),
        (vec!["perf", "allreduce", "-R", "2"], "local_register"),
    ] {
        let o = ringcc(&args);
        let err = stderr(&o);
        assert!(!o.status.success(), "{args:?} succeeded");
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(
            !err.contains("panicked") && !err.contains("backtrace"),
            "{args:?}: {err}"
        );
        let lines = err.lines().filter(|l| !l.trim().is_empty()).count();
        assert!(lines <= 3, "{args:?}: more than a clear line: {err}");
    }
}

/// `ringcc perf --backend verbs` as rank 0 of a 2-rank job whose rank 1
/// never comes. On a host without an RDMA device it refuses at once, in
/// one line, before it serves the store. With one, rank 0 serves the
/// store, finds no rank 1 within the connect deadline and gives up by
/// itself, and the backend's log reaches stderr, without colour codes
/// when stderr is not a terminal: the store's line saying that rank 0
/// aborted, then the command's one-line error.
#[cfg(feature = "verbs")]
#[test]
fn verbs_rank_without_its_peer_fails_with_the_backends_log_on_stderr() {
    use std::process::Stdio;
    use std::time::{Duration, Instant};

    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let t0 = Instant::now();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_ringcc"))
        .args([
            "perf",
            "allreduce",
            "--backend",
            "verbs",
            "-b",
            "1K",
            "-e",
            "1K",
        ])
        .env("RINGCC_RANK", "0")
        .env("RINGCC_WORLD_SIZE", "2")
        .env("RINGCC_ADDR", format!("127.0.0.1:{port}"))
        .env("RINGCC_TOKEN", "the-job")
        .env("RINGCC_TIMEOUT_MS", "4000")
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn ringcc");
    let deadline = t0 + Duration::from_secs(30);
    while child.try_wait().expect("wait ringcc").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("rank 0 still waits for rank 1 after 30 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let o = child.wait_with_output().expect("ringcc output");
    let err = stderr(&o);
    assert!(
        !o.status.success(),
        "rank 0 without rank 1 succeeded:\n{err}"
    );
    if ringcc_verbs::devices().is_empty() {
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert_eq!(
            err.trim(),
            "ringcc: verbs: no RDMA device on this host (rdma-core lists none, or is not \
             installed): --backend verbs needs one; --backend host runs over shared memory \
             and TCP"
        );
        assert!(
            t0.elapsed() < Duration::from_secs(4),
            "it waited for a device it does not have: {:?}",
            t0.elapsed()
        );
        return;
    }
    assert!(
        err.contains("WARN") && err.contains("rendezvous: rank aborts: rank 0 failed to connect"),
        "the store's log line is not on stderr:\n{err}"
    );
    assert!(!err.contains('\u{1b}'), "colour codes on a pipe:\n{err}");
    let last = err.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("ringcc: verbs: "),
        "the last line is not ringcc's error:\n{err}"
    );
}
