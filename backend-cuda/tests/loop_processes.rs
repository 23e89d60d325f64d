//! The device loop with one rank per process: the generated persistent
//! kernel compiled once as host C++ (by the parent), each rank a process
//! that re-executes this binary (`child_loop`, ignored when run directly)
//! and runs its rank's blocks (one per channel, host threads for the
//! block's threads) on its own loop memory and its neighbours', exported
//! and imported over the job's store ([`LoopPeers`]: memfds standing in
//! for CUDA IPC). Every collective × several (type, op) pairs, out of
//! place and in place, back to back; every output checked against the
//! core's reference, every block's status, and the connection counters of
//! both ends. A killed rank ends the others with the loop's timeout,
//! within the deadline. Needs `c++`; says it skipped otherwise.

mod common;
mod procs;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ringcc_comm::store::tcp::{TcpStore, TcpStoreServer};
use ringcc_comm::store::Store;
use ringcc_comm::transport::Transport;
use ringcc_core::fifo::FifoGeometry;
use ringcc_core::verify::{count_wrong, fill_input};
use ringcc_core::{Call, ChannelId, Collective, DataType, Rank, ReduceOp};
use ringcc_cuda::device_loop::abi::{self, RcLoopArgs, RcStatus};
use ringcc_cuda::device_loop::abort::JobAbort;
use ringcc_cuda::device_loop::peers::{LoopPeers, NodeNet};
use ringcc_cuda::device_loop::{loop_args, status_error};
use ringcc_cuda::kernel::{loop_source, loop_symbol, ModuleKey};

use procs::Exit;

const ROLE: &str = "RINGCC_LOOP_TEST_RANK";
const RANKS: &str = "RINGCC_LOOP_TEST_RANKS";
const TOKEN: &str = "RINGCC_LOOP_TEST_TOKEN";
const SUITE: &str = "RINGCC_LOOP_TEST_SUITE";
const CHANNELS: &str = "RINGCC_LOOP_TEST_CHANNELS";
const STORE: &str = "RINGCC_LOOP_TEST_STORE";
const LIB: &str = "RINGCC_LOOP_TEST_LIB";

/// How long a whole job may take before the parent kills it.
const JOB_LIMIT: Duration = Duration::from_secs(180);
/// The loop's deadline in the killed suite.
const SHORT: Duration = Duration::from_secs(3);
/// Host threads per block.
const THREADS: u32 = 2;
const SLOT_BYTES: u64 = 64;

/// `struct rc_block_shared` of the host emulation.
#[repr(C)]
#[derive(Default)]
struct BlockShared {
    bar_count: AtomicU32,
    bar_gen: AtomicU32,
    ok: AtomicI32,
    go: AtomicI32,
}

type LoopFn = unsafe extern "C" fn(RcLoopArgs, u32, u32, u32, *mut BlockShared);

/// The (type, op) pairs the suite runs (collectives that do not reduce
/// run them with `Sum`).
const PAIRS: [(DataType, ReduceOp); 4] = [
    (DataType::F32, ReduceOp::Sum),
    (DataType::I32, ReduceOp::Max),
    (DataType::F64, ReduceOp::Prod),
    (DataType::Bf16, ReduceOp::Avg),
];

fn modules() -> Vec<ModuleKey> {
    let mut m = Vec::new();
    for (dtype, op) in PAIRS {
        for op in [op, ReduceOp::Sum] {
            let k = ModuleKey { dtype, op };
            if !m.contains(&k) {
                m.push(k);
            }
        }
    }
    m
}

/// Builds the kernels, serves the store, starts the ranks and waits (up
/// to `JOB_LIMIT`); their exits in rank order. `None` without `c++`.
fn job(suite: &str, ranks: u32, channels: u8) -> Option<Vec<Exit>> {
    let sources: Vec<(String, String)> = modules()
        .into_iter()
        .map(|m| (format!("{}_loop", m.name()), loop_source(m)))
        .collect();
    let (dir, lib) = common::build_to(&format!("loop-processes-{suite}"), &sources)?;
    let t = format!("cuda-loop-{suite}-{}", std::process::id());
    let server = TcpStoreServer::start(
        SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0),
        &t,
        ranks,
    )
    .expect("serve the store");
    let addr = server.local_addr().to_string();
    let exits = procs::run("child_loop", ranks, JOB_LIMIT, &|r| {
        vec![
            (ROLE, r.to_string()),
            (RANKS, ranks.to_string()),
            (TOKEN, t.clone()),
            (SUITE, suite.to_owned()),
            (CHANNELS, channels.to_string()),
            (STORE, addr.clone()),
            (LIB, lib.to_string_lossy().into_owned()),
        ]
    });
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
    Some(exits)
}

/// One call of this rank, with its buffers (16-byte aligned).
struct Job {
    call: Call,
    in_place: bool,
    bufs: Vec<Vec<u128>>,
    args: RcLoopArgs,
    seq: u64,
}

fn bytes(v: &[u128]) -> &[u8] {
    // SAFETY: a u128 slice viewed as its bytes.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast(), v.len() * 16) }
}

fn bytes_mut(v: &mut [u128]) -> &mut [u8] {
    // SAFETY: as above, uniquely borrowed.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast(), v.len() * 16) }
}

/// A rank's loop: its memory and neighbours', statuses and abort word.
struct RankLoop {
    rank: u32,
    ranks: u32,
    channels: u8,
    geometry: FifoGeometry,
    timeout: Duration,
    peers: LoopPeers,
    status: Box<[AtomicU64]>,
    abort: Box<AtomicU64>,
    /// The job-wide abort (the "aborted" suite): its word is the loop's.
    job: Option<JobAbort>,
    shared: Vec<BlockShared>,
}

const STATUS_WORDS: usize = std::mem::size_of::<RcStatus>() / 8;

impl RankLoop {
    fn job(&self, call: Call, in_place: bool, seq: u64) -> Job {
        let plan = call
            .plan(self.ranks, u32::from(self.channels), SLOT_BYTES * 4)
            .unwrap();
        let e = usize::from(call.dtype.size());
        let (il, ol) = (
            plan.input_len() as usize * e,
            plan.output_len() as usize * e,
        );
        let words = |b: usize| vec![u128::from_ne_bytes([0xA5; 16]); b.div_ceil(16).max(1)];
        let mut input = vec![0u8; il];
        fill_input(&plan, call.op, self.rank, seq, &mut input).unwrap();
        let mut bufs = if in_place {
            let (io, _) = call.in_place_offsets(self.rank);
            let mut one = words(il.max(ol));
            bytes_mut(&mut one)[io as usize * e..][..il].copy_from_slice(&input);
            vec![one]
        } else {
            let mut i = words(il);
            bytes_mut(&mut i)[..il].copy_from_slice(&input);
            vec![i, words(ol)]
        };
        let (ip, op) = if in_place {
            let (io, oo) = call.in_place_offsets(self.rank);
            let base = bufs[0].as_mut_ptr() as u64;
            (base + io * e as u64, base + oo * e as u64)
        } else {
            (bufs[0].as_mut_ptr() as u64, bufs[1].as_mut_ptr() as u64)
        };
        let args = loop_args(
            &plan,
            &call,
            seq,
            self.geometry,
            Rank(self.rank),
            self.timeout,
            (ip, op),
            (
                self.peers.table().as_ptr() as u64,
                self.status.as_ptr() as u64,
                match (&self.job, self.peers.proxy()) {
                    (Some(j), _) => j.word().as_ptr(),
                    (None, Some(p)) => p.abort_word().as_ptr(),
                    (None, None) => self.abort.as_ptr(),
                } as u64,
            ),
        );
        Job {
            call,
            in_place,
            bufs,
            args,
            seq,
        }
    }

    fn wrong(&self, j: &Job) -> u64 {
        let plan = j
            .call
            .plan(self.ranks, u32::from(self.channels), SLOT_BYTES * 4)
            .unwrap();
        let e = usize::from(j.call.dtype.size());
        let ol = plan.output_len() as usize * e;
        let out = if j.in_place {
            let (_, oo) = j.call.in_place_offsets(self.rank);
            &bytes(&j.bufs[0])[oo as usize * e..][..ol]
        } else {
            &bytes(&j.bufs[1])[..ol]
        };
        count_wrong(&plan, j.call.op, self.rank, j.seq, out).unwrap()
    }

    fn status(&self, c: u8) -> RcStatus {
        let base = usize::from(c) * STATUS_WORDS;
        let w: Vec<u64> = self.status[base..base + STATUS_WORDS]
            .iter()
            .map(|a| a.load(Ordering::Acquire))
            .collect();
        RcStatus {
            code: w[0],
            seq: w[1],
            waiting: w[2],
            seen: w[3],
            need: w[4],
            loop_index: w[5],
            step_index: w[6],
            slice: w[7],
            got_seq: w[8],
            got_count: w[9],
            got_desc: w[10],
            recv_next: w[11],
            send_next: w[12],
            own_count: w[13],
            own_desc: w[14],
            spare: w[15],
        }
    }

    /// Runs `jobs` back to back on every block of this rank.
    fn run(&self, lib: &libloading::Library, jobs: &[Job]) {
        if let Some(p) = self.peers.proxy() {
            p.wake();
        }
        let fns: Vec<(LoopFn, RcLoopArgs)> = jobs
            .iter()
            .map(|j| {
                let m = ModuleKey {
                    dtype: j.call.dtype,
                    op: j.call.desc(0).op,
                };
                // SAFETY: `ringcc_loop_<type>_<op>` is the loop kernel,
                // whose host-emulation signature is `LoopFn`.
                let f = *unsafe { lib.get::<LoopFn>(loop_symbol(m).as_bytes()) }.unwrap();
                (f, j.args)
            })
            .collect();
        std::thread::scope(|s| {
            for c in 0..self.channels {
                let sp = &self.shared[usize::from(c)] as *const BlockShared as usize;
                for t in 0..THREADS {
                    let fns = fns.clone();
                    s.spawn(move || {
                        for (f, a) in fns {
                            // SAFETY: the arguments point into this rank's
                            // loop memory, its neighbours' mappings and the
                            // jobs' buffers, which outlive the scope; the
                            // block's threads run the same calls in order
                            // with their own shared words.
                            unsafe { f(a, u32::from(c), t, THREADS, sp as *mut BlockShared) };
                        }
                    });
                }
            }
        });
    }
}

fn collectives(n: u32) -> Vec<Collective> {
    vec![
        Collective::AllReduce,
        Collective::ReduceScatter,
        Collective::AllGather,
        Collective::Broadcast { root: Rank(n - 1) },
        Collective::Reduce { root: Rank(1 % n) },
    ]
}

fn child(suite: &str, rank: u32, ranks: u32, channels: u8) -> Result<String, String> {
    let var = |k: &str| std::env::var(k).unwrap();
    let timeout = if suite.ends_with("killed") || suite == "aborted" {
        SHORT
    } else {
        Duration::from_secs(60)
    };
    let store = TcpStore::connect(&var(STORE), &var(TOKEN), Rank(rank), ranks, timeout)
        .map_err(|e| format!("store: {e}"))?;
    let geometry = FifoGeometry::new(SLOT_BYTES, 2).unwrap();
    // The "nodes" suites: the first half of the ranks on node a, the rest
    // on node b; TCP between them, staged by each rank's proxy.
    let nodes = suite.starts_with("nodes");
    let net = nodes.then(|| NodeNet {
        token: var(TOKEN),
        node: if rank < ranks / 2 { "a" } else { "b" }.to_owned(),
        transports: if suite == "nodes-verbs" {
            let config = ringcc_verbs::VerbsConfig::from_env().unwrap_or_default();
            vec![Box::new(ringcc_verbs::VerbsTransport::new(config)) as Box<dyn Transport>]
        } else {
            ringcc_host::transports(IpAddr::V4(Ipv4Addr::LOCALHOST), timeout)()
                .into_iter()
                .filter(|t| t.name() == "tcp")
                .collect()
        },
        chunk_bytes: SLOT_BYTES * 4,
        banner: true,
        // GPUDirect RDMA's layout (each staged hop's FIFOs apart from its
        // counters) on every rank of "nodes-apart", and over verbs on
        // node b's ranks (node a's keep them together: the two layouts
        // meet on every hop between the nodes).
        fifos_apart: suite == "nodes-apart" || suite == "nodes-verbs" && rank >= ranks / 2,
    });
    let peers = LoopPeers::connect_nodes(
        &store,
        Rank(rank),
        ranks,
        channels,
        geometry,
        Instant::now() + timeout,
        net,
    )
    .map_err(|e| format!("connect: {e}"))?;
    if nodes && peers.proxy().is_none() {
        return Err("no proxy on a job of two nodes".into());
    }
    // SAFETY: the parent built it from our generated sources; its
    // initializers do nothing.
    let lib = unsafe { libloading::Library::new(var(LIB)) }.map_err(|e| e.to_string())?;
    let me = RankLoop {
        rank,
        ranks,
        channels,
        geometry,
        timeout,
        peers,
        status: (0..usize::from(channels) * STATUS_WORDS)
            .map(|_| AtomicU64::new(0))
            .collect(),
        abort: Box::new(AtomicU64::new(0)),
        job: if suite == "aborted" {
            // The watcher's own connection to the job's store.
            let s = TcpStore::connect(&var(STORE), &var(TOKEN), Rank(rank), ranks, timeout)
                .map_err(|e| format!("store: {e}"))?;
            Some(JobAbort::watch(Arc::new(s), Rank(rank)).map_err(|e| e.to_string())?)
        } else {
            None
        },
        shared: (0..channels).map(|_| BlockShared::default()).collect(),
    };
    let statuses = |me: &RankLoop| {
        (0..channels)
            .map(|c| (Rank(rank), ChannelId(c), me.status(c)))
            .collect::<Vec<_>>()
    };
    match suite {
        "suite" | "nodes" | "nodes-apart" | "nodes-verbs" => {
            let mut jobs = Vec::new();
            let mut seq = 0;
            for c in collectives(ranks) {
                for (dtype, op) in PAIRS {
                    let op = if c.reduces() { op } else { ReduceOp::Sum };
                    for (count, in_place) in [(1000, false), (333, true)] {
                        jobs.push(me.job(Call::new(c, count, dtype, op), in_place, seq));
                        seq += 1;
                    }
                }
            }
            for count in [0, 1] {
                jobs.push(me.job(
                    Call::all_reduce(count, DataType::F32, ReduceOp::Sum),
                    false,
                    seq,
                ));
                seq += 1;
            }
            if nodes {
                // Half, a pause long enough for the proxy to doze off, the
                // rest: a woken proxy serves calls as before.
                let (a, b) = jobs.split_at(jobs.len() / 2);
                me.run(&lib, a);
                std::thread::sleep(Duration::from_millis(400));
                me.run(&lib, b);
            } else {
                me.run(&lib, &jobs);
            }
            if let Some(e) = status_error(statuses(&me), timeout) {
                return Err(format!("a block failed: {e}"));
            }
            for c in 0..channels {
                let s = me.status(c);
                if (s.code, s.seq) != (abi::STATUS_DONE, seq - 1) {
                    return Err(format!("channel {c}: {s:?}"));
                }
            }
            for j in &jobs {
                let w = me.wrong(j);
                if w != 0 {
                    return Err(format!(
                        "{} in place {}: {w} wrong",
                        j.call.desc(j.seq),
                        j.in_place
                    ));
                }
            }
            // Every rank done: the counters of both ends of each of our
            // outgoing connections agree.
            store.add("done", 1).map_err(|e| e.to_string())?;
            let t0 = Instant::now();
            while store.add("done", 0).map_err(|e| e.to_string())? < i64::from(ranks) {
                if t0.elapsed() > timeout {
                    return Err("the others never finished".into());
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            // (Through the store: a successor on another node is not
            // mapped here.)
            for c in 0..channels {
                let (recv_next, _) = me.peers.state(c, false);
                store
                    .set(&format!("recv_next/{rank}/{c}"), &recv_next.to_le_bytes())
                    .map_err(|e| e.to_string())?;
            }
            for c in 0..channels {
                let (_, send_next) = me.peers.state(c, false);
                let key = format!("recv_next/{}/{c}", (rank + 1) % ranks);
                let v = store.get(&key, timeout).map_err(|e| e.to_string())?;
                let recv_next = u64::from_le_bytes(v.try_into().map_err(|_| "a bad counter")?);
                if send_next != recv_next || send_next == 0 {
                    return Err(format!(
                        "channel {c}: send_next {send_next}, the successor's recv_next {recv_next}"
                    ));
                }
            }
            // Between nodes the proxy copies nothing: the transport reads
            // payloads straight into the incoming region's slots and sends
            // from the outgoing one's (TCP), or the NIC reads and writes
            // the regions registered in place (verbs).
            let copied = me.peers.proxy().map_or(0, |p| p.copied_bytes());
            if copied != 0 {
                return Err(format!("the proxy copied {copied} B"));
            }
            Ok(format!("{} calls", jobs.len()))
        }
        "aborted" => {
            // Rank 1 aborts the job mid-call; every rank's loop stops
            // with the abort, well before its timeout.
            let job = me.job.as_ref().ok_or("no job abort")?;
            std::thread::scope(|sc| {
                if rank == 1 {
                    sc.spawn(|| {
                        std::thread::sleep(Duration::from_millis(300));
                        job.abort("the test says so").unwrap();
                    });
                }
                let (ms, e) = until_failure(&me, &lib, timeout);
                let why = job.aborted().map(|a| a.to_string()).unwrap_or_default();
                println!("FAILED after {ms} ms: {e}; {why}");
                Err(e.to_string())
            })
        }
        "killed" | "nodes-killed" => {
            if rank == 1 {
                std::thread::spawn(|| {
                    std::thread::sleep(Duration::from_millis(300));
                    let me = rustix::process::getpid();
                    let _ = rustix::process::kill_process(me, rustix::process::Signal::KILL);
                });
            }
            let (ms, e) = until_failure(&me, &lib, timeout);
            let kind = match e {
                ringcc_cuda::Error::Timeout { .. } => "Timeout",
                ringcc_cuda::Error::Poisoned { .. } => "Poisoned",
                _ => "other",
            };
            println!("FAILED {kind} after {ms} ms: {e}");
            Err(e.to_string())
        }
        _ => Err("unknown suite".into()),
    }
}

/// Runs AllReduces, four at a time, until a block fails: how long the
/// failing batch ran (ms) and the failure.
fn until_failure(
    me: &RankLoop,
    lib: &libloading::Library,
    timeout: Duration,
) -> (u128, ringcc_cuda::Error) {
    let mut seq = 0;
    loop {
        let jobs: Vec<Job> = (0..4)
            .map(|k| {
                me.job(
                    Call::all_reduce(20_000, DataType::F32, ReduceOp::Sum),
                    false,
                    seq + k,
                )
            })
            .collect();
        seq += 4;
        let t = Instant::now();
        me.run(lib, &jobs);
        let statuses = (0..me.channels).map(|c| (Rank(me.rank), ChannelId(c), me.status(c)));
        if let Some(e) = status_error(statuses, timeout) {
            return (t.elapsed().as_millis(), e);
        }
    }
}

/// A rank process (started by the tests below; does nothing otherwise).
#[test]
#[ignore = "a rank process of the tests below"]
fn child_loop() {
    let Ok(rank) = std::env::var(ROLE) else {
        return;
    };
    let var = |k: &str| std::env::var(k).unwrap();
    let (rank, ranks): (u32, u32) = (rank.parse().unwrap(), var(RANKS).parse().unwrap());
    match child(&var(SUITE), rank, ranks, var(CHANNELS).parse().unwrap()) {
        Ok(s) => println!("RESULT ok {s}"),
        Err(e) => {
            println!("RESULT error {e}");
            std::process::exit(2);
        }
    }
}

fn all_ok(exits: Option<Vec<Exit>>) {
    let Some(exits) = exits else { return };
    for (r, e) in exits.iter().enumerate() {
        assert_eq!(e.code, Some(0), "rank {r}: {}", e.out);
        assert!(e.out.contains("RESULT ok"), "rank {r}: {}", e.out);
    }
}

#[test]
fn two_processes_every_collective_on_the_device_loop() {
    all_ok(job("suite", 2, 2));
}

#[test]
fn four_processes_one_channel_on_the_device_loop() {
    all_ok(job("suite", 4, 1));
}

/// Two "nodes" of two processes each: CUDA IPC (memfds) inside each, the
/// hops between them staged through host memory by each rank's proxy
/// over TCP — every collective, type pairs, in place, back to back.
#[test]
fn two_nodes_every_collective_on_the_device_loop_through_the_proxy() {
    let exits = job("nodes", 4, 2);
    // Rank 0's init banner says how every hop travels.
    if let Some(e) = exits.as_ref().and_then(|e| e.first()) {
        assert!(
            e.out
                .contains("ringcc INFO: 4 ranks on 2 node(s), 2 channel(s), the device loop")
                && e.out.contains(
                    "tcp between nodes staged through host memory by each rank's proxy \
                     (GPUDirect RDMA: not used: the fake device has no device memory)"
                )
                && e.out
                    .contains("ring 0[a] -cuda-ipc-> 1[a] -tcp-> 2[b] -cuda-ipc-> 3[b] -tcp-> 0"),
            "rank 0: {}",
            e.out
        );
    }
    all_ok(exits);
}

/// The same over RDMA verbs between the nodes (the proxy on the verbs
/// transport, unpatched): run in the Soft-RoCE VM by
/// `scripts/verbs-vm-tests.sh`.
#[test]
#[ignore = "needs an RDMA device (run scripts/verbs-vm-tests.sh)"]
fn two_nodes_over_verbs_on_the_device_loop_through_the_proxy() {
    let exits = job("nodes-verbs", 4, 2);
    // Both ends of every hop between the nodes took the staging region
    // lent to them (and each rank's proxy copied nothing: `child`); node
    // b's ranks keep their FIFOs apart from the counters (GPUDirect
    // RDMA's layout), registered on their own.
    if let Some(e) = exits.as_ref().and_then(|e| e.first()) {
        assert!(
            e.out.contains(
                "verbs between nodes staged through host memory, registered with the NIC (no \
                 copies)"
            ),
            "rank 0: {}",
            e.out
        );
    }
    all_ok(exits);
}

/// The same over TCP with GPUDirect RDMA's layout: each staged hop's
/// FIFOs in memory of their own, apart from its counters (a GPU rank's
/// FIFOs in device memory, registered with the NIC), which the loop's
/// table points at and TCP lands payloads in (no copy: `child`).
#[test]
fn two_nodes_with_the_fifos_apart_on_the_device_loop_through_the_proxy() {
    let exits = job("nodes-apart", 4, 2);
    if let Some(e) = exits.as_ref().and_then(|e| e.first()) {
        assert!(
            e.out.contains(
                "tcp between nodes staged through host memory, the FIFOs apart from the \
                 counters by each rank's proxy (GPUDirect RDMA: not used: the FIFOs are in host \
                 memory)"
            ),
            "rank 0: {}",
            e.out
        );
    }
    all_ok(exits);
}

/// Two nodes of one process each: both of a rank's hops go through its
/// proxy (both neighbours are the other rank, on the other node).
#[test]
fn two_nodes_of_one_rank_on_the_device_loop_through_the_proxy() {
    all_ok(job("nodes", 2, 3));
}

/// Rank 1 is killed mid-call: the other ranks' blocks time out (the
/// loop's bounded wait) and say so, within the deadline and a margin.
#[test]
fn a_killed_rank_is_a_timeout_on_the_device_loop() {
    killed("killed", 3);
}

/// The same across two nodes of two ranks: rank 1's node-mate stops at
/// its loop's timeout, the ranks of the other node too (their proxy sees
/// the connection go and raises the abort word, or the loop times out).
#[test]
fn a_killed_rank_on_another_node_ends_the_others_on_the_device_loop() {
    killed("nodes-killed", 4);
}

/// Rank 1 aborts the job (`JobAbort::abort`) mid-call: every rank's loop
/// stops with the abort named (rank 1, its reason) within a fraction of
/// the loop's timeout.
#[test]
fn an_abort_reaches_every_rank_on_the_device_loop() {
    let Some(exits) = job("aborted", 3, 2) else {
        return;
    };
    for (r, e) in exits.iter().enumerate() {
        let line = failed_line(r, e);
        assert!(
            line.contains("aborted by the host")
                && line.contains("rank 1 aborted: the test says so"),
            "rank {r}: {line}"
        );
        let ms: u64 = line.split_whitespace().nth(2).unwrap().parse().unwrap();
        assert!(
            ms < SHORT.as_millis() as u64,
            "rank {r} took the timeout: {line}"
        );
    }
}

/// Rank `r`'s `FAILED …` line; it must have exited with the failure.
fn failed_line(r: usize, e: &Exit) -> &str {
    assert_eq!(e.code, Some(2), "rank {r}: {}", e.out);
    e.out
        .lines()
        .find(|l| l.starts_with("FAILED "))
        .unwrap_or_else(|| panic!("rank {r}: {}", e.out))
}

fn killed(suite: &str, ranks: u32) {
    let Some(exits) = job(suite, ranks, 2) else {
        return;
    };
    assert_eq!(exits[1].code, None, "rank 1 was killed: {}", exits[1].out);
    for r in (0..ranks as usize).filter(|&r| r != 1) {
        let line = failed_line(r, &exits[r]);
        let w: Vec<&str> = line.split_whitespace().collect();
        assert!(matches!(w[1], "Timeout" | "Poisoned"), "rank {r}: {line}");
        let ms: u64 = w[3].parse().unwrap();
        assert!(
            ms <= (SHORT + Duration::from_secs(3)).as_millis() as u64,
            "rank {r}: {line}"
        );
    }
}
