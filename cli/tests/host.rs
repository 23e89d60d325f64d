//! `ringcc perf --backend host`: `--np N` starts N rank processes of the
//! command (shared memory between them), rank 0 prints nccl-tests' table
//! with every output element checked; under a launcher's variables it is
//! one rank. A rank that dies fails the job without a hang, and no rank
//! outlives the command. Every run has a deadline.

mod common;

use common::{rows, scratch};

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long one `ringcc` run may take before the test kills it.
const LIMIT: Duration = Duration::from_secs(60);

/// Variables that would make `ringcc` one rank of a launcher's job.
const LAUNCHER_VARS: [&str; 5] = [
    "RINGCC_RANK",
    "OMPI_COMM_WORLD_RANK",
    "PMI_RANK",
    "SLURM_PROCID",
    "RANK",
];

/// What one run printed and how it ended.
struct Run {
    code: Option<i32>,
    out: String,
    err: String,
}

/// Starts `ringcc` with `line`'s words and `env`, its output into files of
/// `dir` (so that nothing blocks on a pipe).
fn start(dir: &std::path::Path, name: &str, line: &str, env: &[(&str, String)]) -> Child {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ringcc"));
    cmd.args(line.split_whitespace())
        .env_remove("RUST_BACKTRACE")
        .env_remove("RUST_LOG")
        .env_remove("RINGCC_NODE")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(dir.join(format!("{name}.out"))).unwrap())
        .stderr(std::fs::File::create(dir.join(format!("{name}.err"))).unwrap());
    for v in LAUNCHER_VARS {
        cmd.env_remove(v);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.spawn().expect("run ringcc")
}

/// Waits for `child` up to `limit`, killing it (and failing the test)
/// past it.
fn finish(dir: &std::path::Path, name: &str, mut child: Child, limit: Duration) -> Run {
    let t0 = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            let err = std::fs::read_to_string(dir.join(format!("{name}.err"))).unwrap_or_default();
            panic!("ringcc {name} ran past {limit:?}:\n{err}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let read = |ext: &str| std::fs::read_to_string(dir.join(format!("{name}.{ext}"))).unwrap();
    Run {
        code: status.code(),
        out: read("out"),
        err: read("err"),
    }
}

/// `ringcc line` with a deadline.
fn host(test: &str, line: &str) -> Run {
    let dir = scratch("host", test);
    let child = start(&dir, "run", line, &[]);
    let r = finish(&dir, "run", child, LIMIT);
    let _ = std::fs::remove_dir_all(&dir);
    r
}

/// Every data row's two `#wrong` cells.
fn wrong(out: &str) -> Vec<(String, String)> {
    rows(out)
        .into_iter()
        .map(|r| (r[8].clone(), r[12].clone()))
        .collect()
}

/// Asserts that `r` succeeded with `rows` table rows, every `#wrong` 0
/// (out of place and in place).
fn assert_clean(what: &str, r: &Run, rows: usize) {
    assert_eq!(r.code, Some(0), "{what}: {}{}", r.out, r.err);
    let w = wrong(&r.out);
    assert_eq!(w.len(), rows, "{what}: {}", r.out);
    assert!(
        w.iter().all(|(o, i)| o == "0" && i == "0"),
        "{what}: {}",
        r.out
    );
    assert!(r.out.contains("# Out of bounds values : 0 OK"), "{}", r.out);
}

#[test]
fn two_ranks_check_clean_out_of_place_and_in_place() {
    let r = host(
        "two",
        "perf allreduce --backend host --np 2 -b 8 -e 1M -f 32 -n 2 -w 1",
    );
    // 8, 256, 8K, 256K (8M > 1M)
    assert_clean("2 ranks", &r, 4);
    assert!(r.out.contains("nRanks 2 "), "{}", r.out);
    assert!(
        r.out.contains("# Backend: host — 2 rank(s) on 1 node(s)"),
        "{}",
        r.out
    );
    assert!(r.out.contains("out shm, in shm"), "{}", r.out);
}

/// `RINGCC_SHM_DISABLE=1` reaches the ranks `--np` starts: TCP between
/// them, checked as clean.
#[test]
fn np_ranks_over_tcp() {
    let dir = scratch("host", "tcp");
    let line = "perf allreduce --backend host --np 3 -b 8 -e 1M -f 256 -n 2 -w 1";
    let env = [("RINGCC_SHM_DISABLE", "1".to_string())];
    let r = finish(&dir, "run", start(&dir, "run", line, &env), LIMIT);
    assert_clean("tcp", &r, 3); // 8, 2K, 512K
    assert!(r.out.contains("out tcp, in tcp"), "{}", r.out);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--proto` reaches every rank: each protocol forced runs clean (in
/// place and out of place, sizes either side of LL's crossover); a list
/// the tuner cannot use is a usage error, Tree alone a clear refusal.
#[test]
fn every_forced_protocol_checks_clean_and_bad_lists_are_refused() {
    for proto in ["LL", "LL128", "Simple", "^LL"] {
        let r = host(
            &format!("proto-{}", proto.replace('^', "no")),
            &format!(
                "perf allreduce --backend host --np 2 -b 8 -e 256K -f 64 -n 2 -w 1 --proto {proto}"
            ),
        );
        assert_clean(proto, &r, 3); // 8, 512, 32K
    }
    let r = host(
        "proto-bad",
        "perf allreduce --backend host --np 2 -b 8 -e 8 -n 1 --proto LL9",
    );
    assert_eq!(r.code, Some(2), "{}{}", r.out, r.err);
    assert!(r.err.contains("--proto"), "{}", r.err);
    let r = host(
        "algo-tree",
        "perf allreduce --backend host --np 2 -b 8 -e 8 -n 1 --algo tree",
    );
    assert_ne!(r.code, Some(0), "{}{}", r.out, r.err);
    assert!(
        r.err.contains("no algorithm and protocol left"),
        "{}",
        r.err
    );
}

/// `-T` past what the clock counts is no limit (it panicked adding it to
/// the start time).
#[test]
fn a_huge_timeout_is_no_limit() {
    let r = host(
        "huge-t",
        "perf allreduce --backend host --np 2 -b 8 -e 8 -n 1 -w 0 -T 18446744073709551615",
    );
    assert_clean("-T", &r, 1);
}

#[test]
fn three_ranks_every_type_op_and_collective_check_clean() {
    let r = host(
        "all",
        "perf allreduce --backend host --np 3 -b 4K -e 4K -n 1 -w 1 -o all -d all",
    );
    assert_clean("allreduce", &r, 50); // 10 types x 5 ops
    for coll in ["reducescatter", "allgather", "broadcast", "reduce"] {
        let r = host(
            coll,
            &format!("perf {coll} --backend host --np 3 -b 96K -e 3M -f 32 -n 2 -w 1 -r 2 -o all"),
        );
        // 96K, 3M; reductions: x 5 ops
        let rows = if coll.starts_with("reduce") { 10 } else { 2 };
        assert_clean(coll, &r, rows);
    }
}

#[test]
fn injected_corruption_is_counted_and_fails_the_run() {
    for (coll, np) in [("allreduce", 2), ("reduce", 3), ("allgather", 3)] {
        let r = host(
            coll,
            &format!(
                "perf {coll} --backend host --np {np} -b 96K -e 96K -n 1 -w 0 -r 1 --inject-corruption 3"
            ),
        );
        assert_eq!(r.code, Some(1), "{coll}: {}{}", r.out, r.err);
        assert_eq!(
            wrong(&r.out),
            [("3".to_string(), "3".to_string())],
            "{coll}: {}",
            r.out
        );
        assert!(
            r.out.contains("# Out of bounds values : 6 FAILED"),
            "{}",
            r.out
        );
        // Wrong results are rank 0's to report: no other rank's lines.
        assert!(!r.err.contains("[rank"), "{coll}: {}", r.err);
    }
}

#[test]
fn np_mistakes_are_usage_errors() {
    let dir = scratch("host", "usage");
    for (line, env, want) in [
        ("perf allreduce --backend host --np 0", None, "--np 0"),
        (
            "perf allreduce --np 2",
            None,
            "--backend host or verbs only",
        ),
        (
            "perf allreduce --backend mock --np 2",
            None,
            "--backend host or verbs only",
        ),
        (
            "perf allreduce --backend cuda --np 2",
            None,
            "--backend host or verbs only",
        ),
        ("perf allreduce --backend host --np=-1", None, "--np"),
        ("perf allreduce --backend host", None, "--np N"),
        (
            "perf allreduce --backend host --np 2",
            Some(("RINGCC_RANK", "0")),
            "RINGCC_RANK is set",
        ),
        (
            "perf allreduce --backend host --np 2",
            Some(("OMPI_COMM_WORLD_RANK", "0")),
            "OMPI_COMM_WORLD_RANK is set",
        ),
        (
            "perf broadcast --backend host --np 2 -r 5",
            None,
            "-r 5 is out of range for 2 ranks",
        ),
        (
            "perf allreduce --backend host --np 2 --chunk-bytes 64M",
            None,
            "chunk",
        ),
    ] {
        let env: Vec<(&str, String)> = env.iter().map(|(k, v)| (*k, v.to_string())).collect();
        let r = finish(&dir, "run", start(&dir, "run", line, &env), LIMIT);
        assert_eq!(r.code, Some(2), "{line}: {}{}", r.out, r.err);
        assert!(r.err.contains(want), "{line}: {}", r.err);
        assert!(!r.err.contains("panicked"), "{line}: {}", r.err);
        // One clear line: the same mistake of every rank is said once.
        let lines = r.err.lines().filter(|l| !l.trim().is_empty()).count();
        assert!(lines <= 3, "{line}: {}", r.err);
        assert_eq!(r.err.matches(want).count(), 1, "{line}: {}", r.err);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--backend verbs --np 2` where it cannot run (a build without verbs,
/// a host without an RDMA device, verbs turned off) is refused once, by
/// the command, before it starts a rank: one line, no wait.
#[test]
fn verbs_np_without_verbs_is_refused_before_any_rank_starts() {
    let dir = scratch("host", "verbs-np");
    #[cfg(feature = "verbs")]
    let has_device = !ringcc_verbs::devices().is_empty();
    #[cfg(not(feature = "verbs"))]
    let has_device = false;
    let mut cases = vec![(
        "perf allreduce --backend verbs --np 2",
        vec![("RINGCC_IB_DISABLE", "1".to_string())],
        2,
        if cfg!(feature = "verbs") {
            "RINGCC_IB_DISABLE=1 or RINGCC_NET=tcp turns off"
        } else {
            "built without the verbs backend"
        },
    )];
    if !has_device {
        cases.push((
            "perf allreduce --backend verbs --np 2",
            vec![],
            if cfg!(feature = "verbs") { 1 } else { 2 },
            if cfg!(feature = "verbs") {
                "verbs: no RDMA device on this host"
            } else {
                "built without the verbs backend"
            },
        ));
    }
    for (line, env, code, want) in cases {
        let env: Vec<(&str, String)> = env.into_iter().collect();
        let t0 = Instant::now();
        let r = finish(&dir, "run", start(&dir, "run", line, &env), LIMIT);
        assert_eq!(r.code, Some(code), "{line} {env:?}: {}{}", r.out, r.err);
        assert!(r.err.contains(want), "{line} {env:?}: {}", r.err);
        assert_eq!(r.err.lines().count(), 1, "{line} {env:?}: {}", r.err);
        assert!(!r.err.contains("[rank"), "a rank ran: {}", r.err);
        assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Ranks as one launcher starts them: every process its own
/// `RINGCC_RANK`, one address and token; rank 0 alone prints the table.
/// On one node they talk shared memory; given two `RINGCC_NODE`s, TCP
/// between the nodes (loopback here; two network namespaces in
/// `scripts/netns-tests.sh`).
#[test]
fn under_a_launcher_each_process_is_one_rank() {
    for (test, nodes, ring) in [
        ("launcher", [None, None, None], "ring 0[host-test] -shm-> 1"),
        (
            "launcher-nodes",
            [Some("a"), Some("a"), Some("b")],
            "ring 0[a] -shm-> 1[a] -tcp-> 2[b] -tcp-> 0",
        ),
    ] {
        let dir = scratch("host", test);
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .unwrap()
            .port();
        let children: Vec<Child> = (0..3)
            .map(|r| {
                let env = [
                    ("RINGCC_RANK", r.to_string()),
                    ("RINGCC_WORLD_SIZE", "3".to_string()),
                    ("RINGCC_ADDR", format!("127.0.0.1:{port}")),
                    ("RINGCC_TOKEN", format!("{test}-{}", std::process::id())),
                    ("RINGCC_DEBUG", "INFO".to_string()),
                    ("RINGCC_NODE", nodes[r].unwrap_or("host-test").to_string()),
                ];
                start(
                    &dir,
                    &format!("rank{r}"),
                    "perf allgather --backend host -b 3K -e 3M -f 32 -n 2 -w 1",
                    &env,
                )
            })
            .collect();
        let runs: Vec<Run> = children
            .into_iter()
            .enumerate()
            .map(|(r, c)| finish(&dir, &format!("rank{r}"), c, LIMIT))
            .collect();
        for (r, run) in runs.iter().enumerate().skip(1) {
            assert_eq!(run.code, Some(0), "{test} rank {r}: {}{}", run.out, run.err);
        }
        assert_clean(test, &runs[0], 3);
        assert!(runs[1].out.is_empty() && runs[2].out.is_empty(), "{test}");
        // The banner of RINGCC_DEBUG=INFO, on rank 0's stderr.
        assert!(runs[0].err.contains(ring), "{test}: {}", runs[0].err);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// The processes `pid` started (Linux: `/proc/PID/task/*/children`).
fn children_of(pid: u32) -> Vec<u32> {
    let mut v = Vec::new();
    for t in std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let text = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
        v.extend(
            text.split_whitespace()
                .filter_map(|s| s.parse::<u32>().ok()),
        );
    }
    v
}

/// Whether `pid` still runs (a zombie has exited).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().to_owned())
        })
        .is_some_and(|rest| !rest.starts_with('Z') && !rest.starts_with('X'))
}

/// Waits until `pid` has started `n` ranks.
fn ranks_of(pid: u32, n: usize) -> Vec<u32> {
    let t0 = Instant::now();
    loop {
        let kids = children_of(pid);
        if kids.len() == n {
            return kids;
        }
        assert!(t0.elapsed() < LIMIT, "{pid} started {kids:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn assert_gone(pids: &[u32], within: Duration) {
    let t0 = Instant::now();
    while pids.iter().any(|&p| alive(p)) {
        assert!(t0.elapsed() < within, "ranks still running: {pids:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A long run whose rank 1 is killed: the command fails within seconds,
/// saying which rank, and leaves no rank behind.
#[test]
fn a_killed_rank_fails_the_job_without_a_hang_or_an_orphan() {
    let dir = scratch("host", "killed");
    let line = "perf allreduce --backend host --np 3 -b 4M -e 4M -n 100000 -w 0";
    let child = start(&dir, "run", line, &[]);
    let kids = ranks_of(child.id(), 3);
    std::thread::sleep(Duration::from_millis(500));
    let victim = kids
        .iter()
        .copied()
        .find(|k| {
            std::fs::read(format!("/proc/{k}/environ"))
                .unwrap_or_default()
                .split(|b| *b == 0)
                .any(|v| v == b"RINGCC_RANK=1")
        })
        .expect("rank 1's process");
    let t0 = Instant::now();
    Command::new("kill")
        .args(["-9", &victim.to_string()])
        .status()
        .unwrap();
    let r = finish(&dir, "run", child, Duration::from_secs(40));
    assert!(t0.elapsed() < Duration::from_secs(30), "{:?}", t0.elapsed());
    assert_ne!(r.code, Some(0), "{}{}", r.out, r.err);
    assert!(r.err.contains("rank 1"), "{}", r.err);
    assert!(!r.err.contains("panicked"), "{}", r.err);
    assert_gone(&kids, Duration::from_secs(5));
    let _ = std::fs::remove_dir_all(&dir);
}

/// The command itself killed: its ranks notice (their stdin closes) and
/// exit.
#[test]
fn killing_the_command_ends_its_ranks() {
    let dir = scratch("host", "parent");
    let line = "perf allreduce --backend host --np 2 -b 4M -e 4M -n 100000 -w 0";
    let mut child = start(&dir, "run", line, &[]);
    let kids = ranks_of(child.id(), 2);
    std::thread::sleep(Duration::from_millis(300));
    child.kill().unwrap();
    child.wait().unwrap();
    assert_gone(&kids, Duration::from_secs(10));
    let _ = std::fs::remove_dir_all(&dir);
}
