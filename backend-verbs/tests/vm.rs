//! Multi-process tests on a real verbs device: every rank is a separate
//! `verbs_rank` process (the example: `ringcc_comm::Communicator` with
//! `VerbsTransport`), all on one RDMA device. They need Soft-RoCE, so
//! they are ignored by default; `scripts/verbs-vm-tests.sh` boots a VM
//! with `rxe0` and runs them with `--ignored`.
//!
//! The rank binary is `RINGCC_VERBS_RANK_BIN`, or `examples/verbs_rank`
//! next to this test's `deps/` directory (`cargo build --example
//! verbs_rank` with the same profile).

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

fn rank_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("RINGCC_VERBS_RANK_BIN") {
        return p.into();
    }
    let exe = std::env::current_exe().expect("current_exe");
    let profile_dir = exe.parent().and_then(|d| d.parent()).expect("target dir");
    profile_dir.join("examples").join("verbs_rank")
}

/// The `ringcc` command built with `--features verbs`:
/// `RINGCC_CLI_BIN`, or `ringcc` in the profile directory above `deps/`.
fn cli_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("RINGCC_CLI_BIN") {
        return p.into();
    }
    let exe = std::env::current_exe().expect("current_exe");
    let profile_dir = exe.parent().and_then(|d| d.parent()).expect("target dir");
    profile_dir.join("ringcc")
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// What one rank process did.
#[derive(Debug)]
struct Exit {
    rank: u32,
    code: Option<i32>,
    out: String,
    err: String,
    at: Duration,
}

impl Exit {
    fn result(&self) -> &str {
        self.out
            .lines()
            .rev()
            .find(|l| l.starts_with("RESULT"))
            .unwrap_or("(no RESULT line)")
    }
}

/// A running job of `n` rank processes.
struct Job {
    children: Vec<Option<Child>>,
    lines: mpsc::Receiver<(u32, bool, String)>,
    tx: mpsc::Sender<(u32, bool, String)>,
    /// How to start each rank: the binary, its arguments, its variables.
    cmds: Vec<Command>,
    out: Vec<(String, String)>,
    addr: String,
    t0: Instant,
}

impl Job {
    /// Starts `n` ranks of `verbs_rank args…`; `env(rank)` adds variables.
    fn start(n: u32, args: &[&str], env: impl Fn(u32) -> Vec<(String, String)>) -> Job {
        Job::start_bin(&rank_bin(), n, args, env)
    }

    /// Starts `n` ranks of `bin args…`; `env(rank)` adds variables.
    fn start_bin(
        bin: &std::path::Path,
        n: u32,
        args: &[&str],
        env: impl Fn(u32) -> Vec<(String, String)>,
    ) -> Job {
        let mut job = Job::prepare(bin, n, args, env);
        for r in 0..n {
            job.spawn(r);
        }
        job
    }

    /// A job of `n` ranks of `bin args…` none of which runs yet
    /// ([`Job::spawn`] starts each).
    fn prepare(
        bin: &std::path::Path,
        n: u32,
        args: &[&str],
        env: impl Fn(u32) -> Vec<(String, String)>,
    ) -> Job {
        let port = free_port();
        let token = format!("vm-test-{port}");
        let (tx, rx) = mpsc::channel();
        let cmds = (0..n)
            .map(|r| {
                let mut cmd = Command::new(bin);
                cmd.args(args)
                    .env("RINGCC_RANK", r.to_string())
                    .env("RINGCC_WORLD_SIZE", n.to_string())
                    .env("RINGCC_ADDR", format!("127.0.0.1:{port}"))
                    .env("RINGCC_TOKEN", &token)
                    .env("RINGCC_TIMEOUT_MS", "60000")
                    // Every channel in use from 1 KiB on (the
                    // communicator's default spreads only calls of MiBs).
                    .env("RINGCC_CHANNEL_BYTES", "1024")
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped());
                for (k, v) in env(r) {
                    cmd.env(k, v);
                }
                cmd
            })
            .collect();
        Job {
            children: (0..n).map(|_| None).collect(),
            lines: rx,
            tx,
            cmds,
            out: vec![(String::new(), String::new()); n as usize],
            addr: format!("127.0.0.1:{port}"),
            t0: Instant::now(),
        }
    }

    /// Starts rank `r`, its output lines collected.
    fn spawn(&mut self, r: u32) {
        let cmd = &mut self.cmds[r as usize];
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {:?}: {e}", cmd.get_program()));
        for (is_err, pipe) in [
            (
                false,
                child
                    .stdout
                    .take()
                    .map(|p| Box::new(p) as Box<dyn std::io::Read + Send>),
            ),
            (
                true,
                child
                    .stderr
                    .take()
                    .map(|p| Box::new(p) as Box<dyn std::io::Read + Send>),
            ),
        ] {
            let tx = self.tx.clone();
            let pipe = pipe.expect("pipe");
            thread::spawn(move || {
                for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                    let _ = tx.send((r, is_err, line));
                }
            });
        }
        self.children[r as usize] = Some(child);
    }

    /// Files one line of output, waiting up to `wait`; whether one came.
    fn take_lines(&mut self, wait: Duration) -> bool {
        let Ok((r, is_err, line)) = self.lines.recv_timeout(wait) else {
            return false;
        };
        let slot = &mut self.out[r as usize];
        let buf = if is_err { &mut slot.1 } else { &mut slot.0 };
        buf.push_str(&line);
        buf.push('\n');
        true
    }

    /// Waits until rank `r` prints a line starting with `prefix`.
    fn wait_for(&mut self, r: u32, prefix: &str, limit: Duration) {
        let t0 = Instant::now();
        while t0.elapsed() < limit {
            if self.out[r as usize]
                .0
                .lines()
                .any(|l| l.starts_with(prefix))
            {
                return;
            }
            self.take_lines(Duration::from_millis(100));
        }
        let dump = self.finish(Duration::from_secs(1));
        panic!("rank {r} did not print {prefix:?} in {limit:?}: {dump:#?}");
    }

    fn kill(&mut self, r: u32) {
        if let Some(c) = self.children[r as usize].as_mut() {
            c.kill().expect("kill");
        }
    }

    /// Waits for every rank (killing what is left after `limit`).
    fn finish(&mut self, limit: Duration) -> Vec<Exit> {
        let n = self.children.len();
        let mut exits: Vec<Option<(Option<i32>, Duration)>> = vec![None; n];
        let deadline = Instant::now() + limit;
        while exits.iter().any(Option::is_none) && Instant::now() < deadline {
            for (r, c) in self.children.iter_mut().enumerate() {
                if exits[r].is_some() {
                    continue;
                }
                if let Some(child) = c.as_mut() {
                    if let Ok(Some(st)) = child.try_wait() {
                        exits[r] = Some((st.code(), self.t0.elapsed()));
                    }
                }
            }
            self.take_lines(Duration::from_millis(20));
        }
        for (r, c) in self.children.iter_mut().enumerate() {
            if let Some(mut child) = c.take() {
                if exits[r].is_none() {
                    let _ = child.kill();
                }
                let _ = child.wait();
            }
        }
        // Collect the rest of the output.
        while self.take_lines(Duration::from_millis(200)) {}
        exits
            .into_iter()
            .enumerate()
            .map(|(r, e)| Exit {
                rank: r as u32,
                code: e.and_then(|(c, _)| c),
                out: self.out[r].0.clone(),
                err: self.out[r].1.clone(),
                at: e.map_or(limit, |(_, t)| t),
            })
            .collect()
    }
}

fn vars(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn assert_all_ok(exits: &[Exit]) {
    for e in exits {
        println!("rank {}: {} [{:?}]", e.rank, e.result(), e.at);
    }
    for e in exits {
        assert_eq!(
            e.code,
            Some(0),
            "rank {} failed: {}\n{}",
            e.rank,
            e.result(),
            e.err
        );
    }
}

/// Small slots, so that small buffers still take many steps, slices and
/// loops (and wrap the FIFO many times).
const SMALL: [(&str, &str); 3] = [
    ("RINGCC_SLOT_BYTES", "4096"),
    ("RINGCC_SLOTS_PER_SLICE", "2"),
    ("RINGCC_CHUNK_BYTES", "16384"),
];

fn suite(n: u32, channels: u32, extra: &[(&str, &str)], node_of: impl Fn(u32) -> Option<String>) {
    suite_with(&["suite"], n, channels, extra, node_of);
}

fn suite_with(
    args: &[&str],
    n: u32,
    channels: u32,
    extra: &[(&str, &str)],
    node_of: impl Fn(u32) -> Option<String>,
) {
    let ch = channels.to_string();
    let mut job = Job::start(n, args, |r| {
        let mut v = vars(&SMALL);
        v.extend(vars(extra));
        v.push(("RINGCC_NCHANNELS".into(), ch.clone()));
        if let Some(node) = node_of(r) {
            v.push(("RINGCC_NODE".into(), node));
        }
        v
    });
    assert_all_ok(&job.finish(Duration::from_secs(400)));
}

#[test]
#[ignore = "needs an RDMA device (run scripts/verbs-vm-tests.sh)"]
fn suite_2_ranks_1_channel() {
    suite(2, 1, &[], |_| None);
}

#[test]
#[ignore = "needs an RDMA device (run scripts/verbs-vm-tests.sh)"]
fn suite_2_ranks_4_channels_default_geometry() {
    let mut job = Job::start(2, &["suite", "--sizes", "0,5,70001,300007"], |_| {
        vars(&[("RINGCC_NCHANNELS", "4")])
    });
    assert_all_ok(&job.finish(Duration::from_secs(400)));
}

#[test]
#[ignore = "needs an RDMA device (run scripts/verbs-vm-tests.sh)"]
fn suite_3_ranks_2_channels() {
    suite(3, 2, &[("RINGCC_SLOTS_PER_SLICE", "1")], |_| None);
}

#[test]
#[ignore = "needs an RDMA device (run scripts/verbs-vm-tests.sh)"]
fn suite_4_ranks_2_nodes_2_nics_3_channels() {
    // Two fake nodes of two ranks and two "NICs" (both rxe0): the rings
    // cross nodes through NIC channel mod 2, as on a real cluster.
    suite(4, 3, &[("RINGCC_IB_HCA", "rxe0,rxe0")], |r| {
        Some(format!("node{}", r / 2))
    });
}

#[test]
#[ignore = "needs an RDMA device (run scripts/verbs-vm-tests.sh)"]
fn suite_8_ranks_2_channels() {
    suite(8, 2, &[], |_| None);
}

/// Every collective in place (one buffer, NCCL's layout), half of them
/// queued (`submit_in_place`): 3 ranks, so that ReduceScatter's output
/// and AllGather's input sit inside the buffer at a rank's block.
#[test]
#[ignore = "needs an RDMA device (run scripts/verbs-vm-tests.sh)"]
fn suite_in_place_3_ranks_2_channels() {
    suite_with(&["suite", "--in-place"], 3, 2, &[], |_| None);
}

/// Calls of a MiB and more, whose buffers the send ends borrow
/// (registered for the call) and send from, out of place and in place
/// (where the output overwrites bytes sent from the input), on the
/// default FIFO: both channels' ends share one registration per buffer
/// on one NIC, and on two NICs each has its own.
#[test]
#[ignore = "needs an RDMA device (run scripts/verbs-vm-tests.sh)"]
fn suite_lent_buffers_3_ranks_2_channels() {
    for (args, hca) in [
        (&["suite", "--sizes", "300007,1000003"][..], "rxe0"),
        (
            &["suite", "--in-place", "--sizes", "300007,1000003"][..],
            "rxe0,rxe0",
        ),
    ] {
        let mut job = Job::start(3, args, |_| {
            vars(&[("RINGCC_NCHANNELS", "2"), ("RINGCC_IB_HCA", hca)])
        });
        assert_all_ok(&job.finish(Duration::from_secs(400)));
    }
}

/// In place across two fake nodes of two NICs, rings crossing them.
#[test]
#[ignore = "needs an RDMA device (run scripts/verbs-vm-tests.sh)"]
fn suite_in_place_4_ranks_2_nodes_2_nics_3_channels() {
    suite_with(
        &["suite", "--in-place", "--sizes", "0,1,1000,40000"],
        4,
        3,
        &[("RINGCC_IB_HCA", "rxe0,rxe0")],
        |r| Some(format!("node{}", r / 2)),
    );
}

/// Two "nodes" (`RINGCC_NODE=a`, `b`) of two ranks each, with shared
/// memory (`ringcc_host::ShmTransport`, a dev-dependency) preferred over
/// verbs: the ranks of a node talk shared memory, the nodes talk verbs.
/// The ring is 0 → 1 → 2 → 3 → 0: each rank's hops are checked (the
/// example prints them), and every collective checks clean, out of place
/// and in place.
#[test]
#[ignore = "needs an RDMA device (run scripts/verbs-vm-tests.sh)"]
fn two_nodes_shm_inside_verbs_between() {
    two_nodes("--shm", "shm");
}

/// Fake-device GPU ranks (`ringcc_cuda`'s CUDA IPC transport over
/// memfds) on two "nodes" of two ranks: CUDA IPC inside a node, verbs
/// between the nodes, the bytes staged through the host's FIFOs. Every
/// collective checks clean, out of place and in place.
#[test]
#[ignore = "needs an RDMA device (run scripts/verbs-vm-tests.sh)"]
fn two_nodes_fake_gpu_ranks_ipc_inside_verbs_between() {
    two_nodes("--fake-gpu", "cuda-ipc");
}

/// Four ranks of `verbs_rank suite <flag>` on two nodes: the hops inside
/// a node over `inside`, between the nodes over verbs.
fn two_nodes(flag: &str, inside: &str) {
    for args in [&["suite", flag][..], &["suite", flag, "--in-place"][..]] {
        let mut job = Job::start(4, args, |r| {
            let mut v = vars(&SMALL);
            v.push(("RINGCC_NCHANNELS".into(), "2".into()));
            v.push(("RINGCC_NODE".into(), if r < 2 { "a" } else { "b" }.into()));
            v
        });
        let exits = job.finish(Duration::from_secs(400));
        assert_all_ok(&exits);
        let outward = format!("hops out={inside} in=verbs");
        let inward = format!("hops out=verbs in={inside}");
        for (r, want) in [&outward, &inward, &outward, &inward].iter().enumerate() {
            assert!(
                exits[r].result().contains(want.as_str()),
                "rank {r}: {}",
                exits[r].result()
            );
        }
    }
}

fn expect_all_failed(exits: &[Exit], limit: Duration) {
    for e in exits {
        println!("rank {}: {} [{:?}]", e.rank, e.result(), e.at);
    }
    for e in exits {
        assert_eq!(
            e.code,
            Some(2),
            "rank {} did not fail cleanly: {}\n{}",
            e.rank,
            e.result(),
            e.err
        );
        assert!(e.at < limit, "rank {} took {:?}", e.rank, e.at);
    }
}

#[test]
#[ignore = "needs an RDMA device (run scripts/verbs-vm-tests.sh)"]
fn fault_wrong_rkey_is_a_remote_access_error_and_aborts_everyone() {
    let mut job = Job::start(3, &["bad-rkey"], |_| {
        vars(&[("RINGCC_TIMEOUT_MS", "20000")])
    });
    let exits = job.finish(Duration::from_secs(120));
    expect_all_failed(&exits, Duration::from_secs(60));
    // Rank 0 writes into rank 1's FIFO with the corrupted key.
    assert!(
        exits[0].result().contains("IBV_WC_REM_ACCESS_ERR"),
        "rank 0: {}",
        exits[0].result()
    );
}

#[test]
#[ignore = "needs an RDMA device (run scripts/verbs-vm-tests.sh)"]
fn fault_mismatched_counts_are_detected() {
    let mut job = Job::start(3, &["mismatch"], |_| {
        vars(&[("RINGCC_TIMEOUT_MS", "20000")])
    });
    let exits = job.finish(Duration::from_secs(120));
    expect_all_failed(&exits, Duration::from_secs(60));
    // Rank 2 receives from rank 1, which called with another count.
    assert!(
        exits[2].result().contains("mismatched call"),
        "rank 2: {}",
        exits[2].result()
    );
}

/// A rank that stays away (alive, not calling): its neighbours' engines
/// time out, and the error is the engine's stall report — the rank, the
/// call, a channel and what it waits for. (The first to time out aborts
/// the job, so the other may fail with that abort, whose reason is the
/// first one's report.) The absent rank then finds the job aborted.
/// (The communicator has one timeout for connecting and for calls: 8 s,
/// so that connecting under emulation fits in it.)
#[test]
#[ignore = "needs an RDMA device (run scripts/verbs-vm-tests.sh)"]
fn fault_an_absent_rank_times_out_its_neighbours_with_the_engines_stall_report() {
    let mut job = Job::start(3, &["stall", "--seconds", "20"], |_| {
        vars(&[("RINGCC_TIMEOUT_MS", "8000")])
    });
    let exits = job.finish(Duration::from_secs(120));
    expect_all_failed(&exits, Duration::from_secs(60));
    let mut own = 0;
    for r in [0, 2] {
        let res = exits[r].result();
        assert!(
            res.contains("timed out after")
                && res.contains(" call 1: channel ")
                && res.contains(" waits for "),
            "rank {r}: {res}"
        );
        if res.contains(&format!("waiting for rank {r} call 1: channel ")) {
            own += 1;
        }
    }
    assert!(own >= 1, "no rank reported its own stall");
    assert!(
        exits[1].result().contains("aborted"),
        "rank 1: {}",
        exits[1].result()
    );
}

/// 1 MiB calls: their buffers are lent to the send ends
/// ([`ringcc_verbs::LEND_MIN`]), so the survivors' failed calls end
/// their loans with writes still in flight.
fn killed(victim: u32) {
    let n = 4;
    let mut job = Job::start(
        n,
        &["loop", "--bytes", "1048576", "--seconds", "300"],
        |_| vars(&[("RINGCC_TIMEOUT_MS", "15000")]),
    );
    for r in 0..n {
        job.wait_for(r, "READY", Duration::from_secs(120));
    }
    thread::sleep(Duration::from_millis(300));
    let t_kill = job.t0.elapsed();
    job.kill(victim);
    let exits = job.finish(Duration::from_secs(90));
    for e in &exits {
        println!(
            "rank {}: {} [{:?} after the kill]",
            e.rank,
            e.result(),
            e.at.saturating_sub(t_kill)
        );
    }
    for e in exits.iter().filter(|e| e.rank != victim) {
        assert_eq!(
            e.code,
            Some(2),
            "rank {} did not fail cleanly: {}\n{}",
            e.rank,
            e.result(),
            e.err
        );
        let after = e.at.saturating_sub(t_kill);
        assert!(
            after < Duration::from_secs(20),
            "rank {} took {after:?} after the kill",
            e.rank
        );
    }
}

#[test]
#[ignore = "needs an RDMA device (run scripts/verbs-vm-tests.sh)"]
fn fault_a_killed_rank_fails_the_others_within_the_deadline() {
    killed(2);
}

#[test]
#[ignore = "needs an RDMA device (run scripts/verbs-vm-tests.sh)"]
fn fault_killing_rank_0_and_its_store_fails_the_others() {
    killed(0);
}

/// Knocks on `job`'s store with the wrong token, as rank 1, while only
/// rank 0 runs (its store waits for rank 1, so it serves until the real
/// rank 1 is started after the knock: no race with a fast job); the
/// stranger must be told why it is turned away.
fn knock_as_stranger(job: &Job) {
    assert!(
        job.children.iter().skip(1).all(Option::is_none),
        "the stranger knocks before rank 1 starts"
    );
    let addr = job.addr.clone();
    let stranger = Command::new(rank_bin())
        .arg("stranger")
        .env("RINGCC_RANK", "1")
        .env("RINGCC_WORLD_SIZE", "2")
        .env("RINGCC_ADDR", &addr)
        .env("RINGCC_TIMEOUT_MS", "30000")
        .output()
        .expect("stranger");
    let s_out = String::from_utf8_lossy(&stranger.stdout);
    println!("stranger: {s_out}");
    assert_eq!(stranger.status.code(), Some(0), "stranger: {s_out}");
    assert!(s_out.contains("token"), "{s_out}");
}

#[test]
#[ignore = "needs an RDMA device (run scripts/verbs-vm-tests.sh)"]
fn fault_a_stranger_with_the_wrong_token_is_rejected_and_the_job_runs() {
    let mut job = Job::prepare(&rank_bin(), 2, &["suite", "--sizes", "1,1000"], |_| {
        vars(&SMALL)
    });
    job.spawn(0);
    knock_as_stranger(&job);
    job.spawn(1);
    let exits = job.finish(Duration::from_secs(300));
    assert_all_ok(&exits);
    assert!(
        exits[0].err.contains("rejected connection"),
        "rank 0 did not log the rejection: {}",
        exits[0].err
    );
}

/// Runs a 2-rank `ringcc perf allreduce --backend verbs -R <register>`
/// (4 B to 128 KiB), optionally with a stranger knocking on rank 0's
/// store, and checks that every rank succeeds and every size checks clean.
fn cli_perf(register: &str, stranger: bool) -> Vec<Exit> {
    let args = [
        "perf",
        "allreduce",
        "--backend",
        "verbs",
        "-b",
        "4",
        "-e",
        "128K",
        "-f",
        "8",
        "-n",
        "2",
        "-w",
        "1",
        "-R",
        register,
    ];
    let mut job = Job::prepare(&cli_bin(), 2, &args, |_| {
        let mut v = vars(&SMALL);
        v.push(("RINGCC_NCHANNELS".into(), "2".into()));
        v
    });
    job.spawn(0);
    if stranger {
        knock_as_stranger(&job);
    }
    job.spawn(1);
    let exits = job.finish(Duration::from_secs(300));
    for e in &exits {
        assert_eq!(
            e.code,
            Some(0),
            "rank {} failed:\n{}\n{}",
            e.rank,
            e.out,
            e.err
        );
    }
    // Rank 0 prints the table (as nccl-tests' first rank does): 4 B to
    // 128 KiB by 8x is 6 sizes, each with 0 wrong out of place and in
    // place (every rank's result is checked and the counts summed).
    let out = &exits[0].out;
    let rows: Vec<Vec<&str>> = out
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows.len(), 6, "{out}");
    for r in &rows {
        assert_eq!(r.len(), 13, "{r:?}");
        assert_eq!((r[8], r[12]), ("0", "0"), "wrong values in {r:?}");
    }
    assert!(out.contains("Out of bounds values : 0 OK"), "{out}");
    assert!(
        out.contains("# Backend: verbs — 2 rank(s) on 1 node(s)"),
        "{out}"
    );
    assert!(out.contains("rank 0's hops: out verbs, in verbs"), "{out}");
    // -R 1 is nccl-tests' flag: accepted, and the header says why it
    // changes nothing.
    assert_eq!(
        out.contains("# -R 1: a call of a MiB or more registers its buffers"),
        register == "1",
        "{out}"
    );
    exits
}

/// The `ringcc perf --backend verbs` command itself, as users run it (one
/// rank per process, the launcher's variables): every size checks clean,
/// and a stranger knocking on rank 0's store is turned away with a log
/// line on rank 0's stderr while the job runs on.
#[test]
#[ignore = "needs an RDMA device (run scripts/verbs-vm-tests.sh)"]
fn cli_perf_runs_and_rank_0_logs_the_stranger_it_rejects() {
    let exits = cli_perf("0", true);
    assert!(
        exits[0].err.contains("rendezvous: rejected connection"),
        "rank 0 did not log the rejection: {}",
        exits[0].err
    );
    assert!(
        !exits[0].err.contains('\u{1b}'),
        "colour codes in a log that is not a terminal: {}",
        exits[0].err
    );
}

/// `ringcc perf -R 1`: nccl-tests' flag is accepted; a large call
/// registers its buffers for its own length anyway and none is kept
/// across calls, and the header says so.
#[test]
#[ignore = "needs an RDMA device (run scripts/verbs-vm-tests.sh)"]
fn cli_perf_with_buffers_registered_once_checks_clean() {
    cli_perf("1", false);
}

/// `ringcc perf <collective> --backend verbs` on 3 ranks with the
/// test-only corruption of 3 output elements: every collective's
/// out-of-place and in-place columns count exactly those 3 (so the
/// in-place column really ran in place, NCCL's layout, and checked clean
/// apart from them), and the command fails as nccl-tests does.
#[test]
#[ignore = "needs an RDMA device (run scripts/verbs-vm-tests.sh)"]
fn cli_perf_checks_every_collective_in_place_and_counts_injected_corruption() {
    for (coll, root) in [
        ("allreduce", "0"),
        ("reducescatter", "0"),
        ("allgather", "0"),
        ("broadcast", "1"),
        ("reduce", "2"),
    ] {
        let args = [
            "perf",
            coll,
            "--backend",
            "verbs",
            "-b",
            "12K",
            "-e",
            "12K",
            "-n",
            "1",
            "-w",
            "0",
            "-r",
            root,
            "--inject-corruption",
            "3",
        ];
        let mut job = Job::start_bin(&cli_bin(), 3, &args, |_| vars(&SMALL));
        let exits = job.finish(Duration::from_secs(300));
        for e in &exits {
            assert_eq!(
                e.code,
                Some(1),
                "{coll}: rank {} did not report the wrong values:\n{}\n{}",
                e.rank,
                e.out,
                e.err
            );
        }
        let out = &exits[0].out;
        let rows: Vec<Vec<&str>> = out
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(rows.len(), 1, "{coll}: {out}");
        assert_eq!((rows[0][8], rows[0][12]), ("3", "3"), "{coll}: {out}");
        assert!(
            out.contains("Out of bounds values : 6 FAILED"),
            "{coll}: {out}"
        );
        assert!(out.contains("in place: one buffer"), "{coll}: {out}");
    }
}

/// Rank 0's table rows of a `ringcc perf` run, each checked clean out of
/// place and in place.
fn assert_rows_clean(out: &str, rows: usize) {
    let got: Vec<Vec<&str>> = out
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(got.len(), rows, "{out}");
    for r in &got {
        assert_eq!(r.len(), 13, "{r:?}");
        assert_eq!((r[8], r[12]), ("0", "0"), "wrong values in {r:?}");
    }
    assert!(out.contains("Out of bounds values : 0 OK"), "{out}");
}

/// `ringcc perf --backend host` (built with verbs) on two "nodes"
/// (`RINGCC_NODE=a`, `b`) of two ranks: shared memory inside a node,
/// verbs between them — the communicator's choice per hop, shown by rank
/// 0's init banner (`RINGCC_DEBUG=INFO`) and the table's header — with
/// verbs' FIFO (a host with an RDMA device takes it), every size checked
/// clean out of place and in place.
#[test]
#[ignore = "needs an RDMA device (run scripts/verbs-vm-tests.sh)"]
fn cli_perf_host_two_nodes_shm_inside_verbs_between() {
    let args = [
        "perf",
        "allreduce",
        "--backend",
        "host",
        "-b",
        "4",
        "-e",
        "4M",
        "-f",
        "32",
        "-n",
        "2",
        "-w",
        "1",
    ];
    let mut job = Job::start_bin(&cli_bin(), 4, &args, |r| {
        vars(&[
            ("RINGCC_NODE", if r < 2 { "a" } else { "b" }),
            ("RINGCC_DEBUG", "INFO"),
        ])
    });
    let exits = job.finish(Duration::from_secs(300));
    for e in &exits {
        assert_eq!(e.code, Some(0), "rank {}:\n{}\n{}", e.rank, e.out, e.err);
    }
    let (out, err) = (&exits[0].out, &exits[0].err);
    assert_rows_clean(out, 5);
    assert!(
        out.contains("# Backend: host — 4 rank(s) on 2 node(s)"),
        "{out}"
    );
    assert!(out.contains("rank 0's hops: out shm, in verbs"), "{out}");
    let g = ringcc_verbs::GEOMETRY;
    assert!(
        out.contains(&format!(
            "{} B FIFO slots ({} per slice), {} B chunks",
            g.slot_bytes(),
            g.slots_per_slice(),
            ringcc_verbs::CHUNK_BYTES
        )),
        "{out}"
    );
    assert!(
        err.contains("ring 0[a] -shm-> 1[a] -verbs-> 2[b] -shm-> 3[b] -verbs-> 0"),
        "{err}"
    );
}

/// `ringcc perf ARGS…` with the command's own `--np` ranks (no launcher
/// variables) and `env`: its exit status, stdout and stderr, within 300 s.
fn run_np(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let mut child = Command::new(cli_bin())
        .args(args)
        .envs(env.iter().copied())
        .env("RINGCC_TIMEOUT_MS", "60000")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start ringcc");
    let t0 = Instant::now();
    while child.try_wait().expect("wait").is_none() {
        if t0.elapsed() > Duration::from_secs(300) {
            let _ = child.kill();
            panic!("ringcc perf --backend verbs --np 3 ran past 300 s");
        }
        thread::sleep(Duration::from_millis(100));
    }
    let o = child.wait_with_output().expect("output");
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// `ringcc perf --backend verbs --np 3`: the command starts its own three
/// ranks on this host, and every hop goes over verbs (through the
/// device's loopback), on verbs' FIFO; every size checks clean.
#[test]
#[ignore = "needs an RDMA device (run scripts/verbs-vm-tests.sh)"]
fn cli_perf_verbs_np_runs_every_hop_over_verbs() {
    let (code, out, err) = run_np(
        &[
            "perf",
            "reducescatter",
            "--backend",
            "verbs",
            "--np",
            "3",
            "-b",
            "12",
            "-e",
            "12M",
            "-f",
            "32",
            "-n",
            "2",
            "-w",
            "1",
        ],
        &[],
    );
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert_rows_clean(&out, 5);
    assert!(
        out.contains("# Backend: verbs — 3 rank(s) on 1 node(s)"),
        "{out}"
    );
    assert!(out.contains("rank 0's hops: out verbs, in verbs"), "{out}");
    let g = ringcc_verbs::GEOMETRY;
    assert!(
        out.contains(&format!("{} B FIFO slots", g.slot_bytes())),
        "{out}"
    );
}

/// `ringcc perf --backend host --np 2` on a host with an RDMA device: the
/// ranks `--np` starts share this host, so every hop is shared memory
/// and the job keeps the communicator's FIFO (sized for it); with shared
/// memory turned off, the hops go over verbs, on verbs' FIFO.
#[test]
#[ignore = "needs an RDMA device (run scripts/verbs-vm-tests.sh)"]
fn cli_perf_host_np_takes_verbs_fifo_only_for_verbs_hops() {
    let args = [
        "perf",
        "allreduce",
        "--backend",
        "host",
        "--np",
        "2",
        "-b",
        "1M",
        "-e",
        "1M",
        "-n",
        "2",
        "-w",
        "1",
    ];
    let comm_slot = ringcc_comm::transport::SLOT_BYTES;
    let (code, out, err) = run_np(&args, &[]);
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert_rows_clean(&out, 1);
    assert!(out.contains("rank 0's hops: out shm, in shm"), "{out}");
    assert!(out.contains(&format!("{comm_slot} B FIFO slots")), "{out}");

    let (code, out, err) = run_np(&args, &[("RINGCC_SHM_DISABLE", "1")]);
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert_rows_clean(&out, 1);
    assert!(out.contains("rank 0's hops: out verbs, in verbs"), "{out}");
    let g = ringcc_verbs::GEOMETRY;
    assert!(
        out.contains(&format!("{} B FIFO slots", g.slot_bytes())),
        "{out}"
    );
}

/// GPUDirect RDMA on Soft-RoCE: the device is asked at `publish` as NCCL
/// asks it (a dma-buf registration of nothing) and says no, with the
/// reason; device memory lent anyway reaches `ibv_reg_dmabuf_mr`, which
/// refuses it with a typed error naming the call (`/dev/null` is no dma-buf,
/// and rxe registers none) — no panic, nothing made.
#[test]
#[ignore = "needs an RDMA device (run scripts/verbs-vm-tests.sh)"]
fn dma_buf_memory_is_probed_and_refused_on_soft_roce() {
    use ringcc_comm::transport::{FifoMemory, Hop, Transport};
    use ringcc_core::fifo::FifoGeometry;
    use ringcc_core::{ChannelId, Rank};
    use std::os::fd::AsRawFd;

    let mut t = ringcc_verbs::VerbsTransport::new(ringcc_verbs::VerbsConfig::default());
    assert!(t.publish("dma-buf-probe", Rank(0)).unwrap().is_some());
    let why = t.device_memory().unwrap_err();
    assert!(why.contains("cannot register dma-buf memory"), "{why}");
    let store = ringcc_comm::store::MemStore::new();
    let bell: std::sync::Arc<dyn ringcc_comm::transport::Bell> =
        std::sync::Arc::new(ringcc_comm::LocalBell::new());
    let geometry = FifoGeometry::new(4096, 2).unwrap();
    let job = ringcc_comm::transport::Job {
        token: "dma-buf-probe",
        rank: Rank(0),
        world: 2,
        geometry,
        deadline: Instant::now() + Duration::from_secs(10),
        peers: &[],
        bell: &bell,
        store: &store,
    };
    let len = geometry.fifo_bytes() as usize;
    // Any descriptor that is no dma-buf.
    let not_dma_buf = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
        .unwrap();
    // SAFETY: `ibv_reg_dmabuf_mr` refuses it (checked below): nothing
    // ever reaches the "device" address.
    let fifo = unsafe { FifoMemory::dma_buf(not_dma_buf.as_raw_fd(), 0, 0x10_0000_0000, len) };
    let hop = Hop {
        channel: ChannelId(0),
        sender: Rank(1),
        receiver: Rank(0),
    };
    let err = t.listen_in(&job, hop, fifo).unwrap_err();
    assert!(err.to_string().contains("ibv_reg_dmabuf_mr"), "{err}");
}
