//! Ranks as real processes, each with its own `Communicator`: the test
//! binary re-executes itself once per rank (`child_rank`, ignored when run
//! directly); the parent serves the job's TCP store; each child joins,
//! runs a suite of calls and checks every output element against the
//! core's reference (`verify`). Ranks given different `RINGCC_NODE`s talk
//! TCP between nodes and shared memory inside one. Every wait has a
//! deadline: children are killed when the parent gives up.
//!
//! With `RINGCC_NETNS=nsA,nsB` (set by `scripts/netns-tests.sh`, which
//! makes the namespaces and the veth pair), the `netns_*` tests start
//! half of the ranks in each namespace and serve the store on
//! `RINGCC_NETNS_STORE_IP` (the first namespace's veth address).

mod common;
use common::Reap;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ringcc_comm::store::tcp::{TcpStore, TcpStoreServer};
use ringcc_comm::{Communicator, Error, Options};
use ringcc_core::fifo::FifoGeometry;
use ringcc_core::verify;
use ringcc_core::{Call, DataType, Rank, ReduceOp};

const ROLE: &str = "RINGCC_HOST_TEST_RANK";
const RANKS: &str = "RINGCC_HOST_TEST_RANKS";
const TOKEN: &str = "RINGCC_HOST_TEST_TOKEN";
const SUITE: &str = "RINGCC_HOST_TEST_SUITE";
const CHANNELS: &str = "RINGCC_HOST_TEST_CHANNELS";
const STORE: &str = "RINGCC_HOST_TEST_STORE";

/// How long a whole job may take before the parent kills it.
const JOB_LIMIT: Duration = Duration::from_secs(120);

fn token(what: &str) -> String {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    format!("comm-ranks-{what}-{}-{}", std::process::id(), t ^ (t >> 17))
}

/// What one rank process reported.
#[derive(Debug)]
struct Exit {
    code: Option<i32>,
    out: String,
    at: Duration,
}

/// How to start a job's ranks.
struct Spec<'a> {
    suite: &'a str,
    ranks: u32,
    channels: u8,
    /// Rank → its node name (`RINGCC_NODE`); `None`: all on this host.
    node: &'a dyn Fn(u32) -> Option<String>,
    /// Rank → a network namespace to run it in.
    netns: &'a dyn Fn(u32) -> Option<String>,
    store_ip: IpAddr,
    env: &'a [(&'a str, &'a str)],
}

fn same_host(_: u32) -> Option<String> {
    None
}

fn job_of(suite: &str, ranks: u32, channels: u8) -> Vec<Exit> {
    job(&Spec {
        suite,
        ranks,
        channels,
        node: &same_host,
        netns: &same_host,
        store_ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
        env: &[],
    })
}

/// Serves the store, starts the ranks, waits for all (up to
/// `JOB_LIMIT`), and returns their exits in rank order.
fn job(spec: &Spec<'_>) -> Vec<Exit> {
    let t = token(spec.suite);
    let server = TcpStoreServer::start(SocketAddr::new(spec.store_ip, 0), &t, spec.ranks)
        .expect("serve the store");
    let addr = server.local_addr().to_string();
    let t0 = Instant::now();
    let exe = std::env::current_exe().unwrap();
    let mut children: Vec<Reap> = (0..spec.ranks)
        .map(|r| {
            let mut cmd = match (spec.netns)(r) {
                Some(ns) => {
                    let mut c = Command::new("ip");
                    c.args(["netns", "exec", &ns]).arg(&exe);
                    c
                }
                None => Command::new(&exe),
            };
            cmd.args(["--exact", "child_rank", "--ignored", "--nocapture"])
                .env(ROLE, r.to_string())
                .env(RANKS, spec.ranks.to_string())
                .env(TOKEN, &t)
                .env(SUITE, spec.suite)
                .env(CHANNELS, spec.channels.to_string())
                .env(STORE, &addr)
                .env_remove("RINGCC_NODE")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            if let Some(n) = (spec.node)(r) {
                cmd.env("RINGCC_NODE", n);
            }
            for (k, v) in spec.env {
                cmd.env(k, v);
            }
            Reap(cmd.spawn().expect("spawn a rank"))
        })
        .collect();
    let mut done: Vec<Option<(Option<i32>, Duration)>> = (0..spec.ranks).map(|_| None).collect();
    while done.iter().any(Option::is_none) && t0.elapsed() < JOB_LIMIT {
        for (r, c) in children.iter_mut().enumerate() {
            if done[r].is_none() {
                if let Ok(Some(st)) = c.0.try_wait() {
                    done[r] = Some((st.code(), t0.elapsed()));
                }
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(server);
    children
        .iter_mut()
        .zip(done)
        .map(|(c, d)| {
            if d.is_none() {
                let _ = c.0.kill();
            }
            let _ = c.0.wait();
            let mut out = String::new();
            if let Some(mut s) = c.0.stdout.take() {
                let _ = std::io::Read::read_to_string(&mut s, &mut out);
            }
            if let Some(mut s) = c.0.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut s, &mut out);
            }
            let (code, at) = d.unwrap_or((None, JOB_LIMIT));
            Exit { code, out, at }
        })
        .collect()
}

fn assert_all_ok(exits: &[Exit]) {
    for (r, e) in exits.iter().enumerate() {
        assert_eq!(e.code, Some(0), "rank {r} failed: {}", e.out);
        assert!(e.out.contains("RESULT ok"), "rank {r}: {}", e.out);
    }
}

/// The calls of the full suite: every collective, several types and
/// ops, uneven sizes (0, 1, odd, several slices, several chunks).
fn suite_calls(ranks: u32) -> Vec<Call> {
    let mut calls = Vec::new();
    let root = Rank(ranks.saturating_sub(1));
    let types = [
        (DataType::F32, ReduceOp::Sum),
        (DataType::I32, ReduceOp::Max),
        (DataType::F64, ReduceOp::Prod),
        (DataType::U8, ReduceOp::Min),
        (DataType::Bf16, ReduceOp::Sum),
        (DataType::I64, ReduceOp::Avg),
    ];
    for (i, &count) in [0u64, 1, 1001, 70_001, 400_003].iter().enumerate() {
        let (dtype, op) = types[i % types.len()];
        calls.push(Call::all_reduce(count, dtype, op));
        calls.push(Call::reduce_scatter(count / 3, dtype, op));
        calls.push(Call::all_gather(count / 3 + 1, dtype));
        calls.push(Call::broadcast(count, dtype, root));
        calls.push(Call::reduce(count, dtype, op, Rank(0)));
    }
    for &(dtype, op) in &types {
        calls.push(Call::all_reduce(12_345, dtype, op));
    }
    calls
}

/// Rank `rank`'s input of call `k` and the output it must end with
/// (`None` when the reference has no exact answer).
fn data(call: &Call, ranks: u32, rank: u32, k: usize) -> (Vec<u8>, Option<Vec<u8>>) {
    let salt = k as u64 * 7 + 1;
    let plan = call.plan(ranks, 1, 1 << 20).unwrap();
    let (ib, ob) = call.buffer_bytes(ranks);
    let mut input = vec![0u8; ib];
    verify::fill_input(&plan, call.op, rank, salt, &mut input).unwrap();
    let mut want = vec![0u8; ob];
    let checked = verify::fill_expected(&plan, call.op, rank, 0, salt, &mut want).unwrap();
    (input, checked.then_some(want))
}

fn check(call: &Call, k: usize, got: &[u8], want: Option<&Vec<u8>>) -> Result<(), String> {
    if let Some(want) = want {
        let wrong = verify::count_diff(want, got, call.elem());
        if wrong != 0 {
            return Err(format!("call {k} ({call:?}): {wrong} wrong elements"));
        }
    }
    Ok(())
}

/// Runs `call` (number `k`) on `comm`, in place or not, and checks it.
fn run_checked(comm: &Communicator, call: &Call, k: usize, in_place: bool) -> Result<(), String> {
    let (ranks, rank) = (comm.world_size(), comm.rank().0);
    let (input, want) = data(call, ranks, rank, k);
    let (ib, ob) = call.buffer_bytes(ranks);
    let got = if in_place {
        let (ie, oe) = call.in_place_offsets(rank);
        let mut buf = vec![0u8; ib.max(ob)];
        let at = |e: u64| e as usize * call.elem();
        buf[at(ie)..at(ie) + ib].copy_from_slice(&input);
        comm.run_in_place(call, &mut buf)
            .map_err(|e| format!("call {k} ({call:?}, in place): {e}"))?;
        buf[at(oe)..at(oe) + ob].to_vec()
    } else {
        let mut out = vec![0u8; ob];
        comm.run(call, &input, &mut out)
            .map_err(|e| format!("call {k} ({call:?}): {e}"))?;
        out
    };
    check(call, k, &got, want.as_ref())
}

fn options(suite: &str, channels: u8) -> Options {
    let mut o = Options::from_env().unwrap();
    // A per-rank protocol (`LL,Simple`: rank 0 LL, rank 1 Simple), to
    // test that ranks that disagree are refused.
    if let Ok(by_rank) = std::env::var("RINGCC_HOST_TEST_PROTO_BY_RANK") {
        let rank: usize = std::env::var(ROLE).unwrap().parse().unwrap();
        if let Some(p) = by_rank
            .split(',')
            .nth(rank)
            .and_then(ringcc_core::Protocol::parse)
        {
            o.protos = ringcc_core::tune::ProtoSet::only(p);
        }
    }
    o.channels = channels;
    // Small slots: many slices, every FIFO wraps many times.
    o.geometry = Some(FifoGeometry::new(16 << 10, 2).unwrap());
    o.chunk_bytes = 64 << 10;
    // Every channel in use from 64 KiB on.
    o.channel_bytes = Some(32 << 10);
    o.timeout = match suite {
        "killed" | "mismatch" | "abort" => Duration::from_secs(5),
        _ => Duration::from_secs(30),
    };
    o
}

fn connect(suite: &str, rank: u32, ranks: u32, channels: u8) -> Result<Communicator, String> {
    let var = |k: &str| std::env::var(k).unwrap();
    let (token, addr) = (var(TOKEN), var(STORE));
    let o = options(suite, channels);
    let store = TcpStore::connect(&addr, &token, Rank(rank), ranks, o.timeout)
        .map_err(|e| format!("store: {e}"))?;
    let toward: SocketAddr = addr.parse().map_err(|e| format!("{addr}: {e}"))?;
    let ip = ringcc_comm::net::bind_ip(Some(toward)).map_err(|e| e.to_string())?;
    Communicator::new(
        Rank(rank),
        ranks,
        Arc::new(store),
        &token,
        o.clone(),
        ringcc_host::transports(ip, o.timeout),
    )
    .map_err(|e| format!("connect: {e}"))
}

/// One rank's run of the suite `suite`; `Ok` with a summary.
fn rank_main(suite: &str, rank: u32, ranks: u32, channels: u8) -> Result<String, String> {
    let comm = connect(suite, rank, ranks, channels)?;
    let hops = format!("{:?}", comm.hops());
    match suite {
        "suite" => {
            let calls = suite_calls(ranks);
            for (k, call) in calls.iter().enumerate() {
                run_checked(&comm, call, k, k % 2 == 1)?;
            }
            comm.close().map_err(|e| e.to_string())?;
            Ok(format!("{} calls, hops {hops}", calls.len()))
        }
        "async" => async_suite(comm, hops),
        "mismatch" => {
            let count = if rank == 1 { 1001 } else { 1000 };
            let call = Call::all_reduce(count, DataType::F32, ReduceOp::Sum);
            run_checked(&comm, &call, 0, false)?;
            Ok("no error".into())
        }
        "killed" => {
            let call = Call::all_reduce(1 << 20, DataType::F32, ReduceOp::Sum);
            if rank == 1 {
                // Killed by SIGKILL while its peers are mid-call.
                std::thread::spawn(|| {
                    std::thread::sleep(Duration::from_millis(300));
                    let me = rustix::process::getpid();
                    let _ = rustix::process::kill_process(me, rustix::process::Signal::KILL);
                });
            }
            for k in 0.. {
                run_checked(&comm, &call, k, false)?;
            }
            Ok("unreachable".into())
        }
        "abort" => {
            let call = Call::all_reduce(1 << 18, DataType::F32, ReduceOp::Sum);
            for k in 0..3 {
                run_checked(&comm, &call, k, false)?;
            }
            if rank == 0 {
                comm.abort("the test says so");
            }
            for k in 3.. {
                run_checked(&comm, &call, k, false)?;
            }
            Ok("unreachable".into())
        }
        other => Err(format!("no suite {other}")),
    }
}

/// Asynchronous calls (issue order), a group, a barrier and a split.
fn async_suite(comm: Communicator, hops: String) -> Result<String, String> {
    let (ranks, rank) = (comm.world_size(), comm.rank().0);
    let e = |e: Error| e.to_string();
    // Several calls in flight, waited for in reverse: they still complete
    // in issue order, each correct.
    let mut works = Vec::new();
    for k in 0..4usize {
        let call = Call::all_reduce(10_000 + k as u64 * 977, DataType::F32, ReduceOp::Sum);
        let (input, want) = data(&call, ranks, rank, k);
        let buf: Vec<f32> = bytemuck::cast_slice(&input).to_vec();
        works.push((k, call, want, comm.submit_in_place(call, buf).map_err(e)?));
    }
    for (k, call, want, w) in works.into_iter().rev() {
        let got = w.wait().map_err(e)?;
        check(&call, k, bytemuck::cast_slice(&got), want.as_ref())?;
    }
    // is_completed / wait_timeout.
    let w = comm
        .all_reduce_async(vec![1.0f64; 5000], ReduceOp::Sum)
        .map_err(e)?;
    while !w.wait_timeout(Duration::from_millis(1)).map_err(e)? {}
    assert!(w.is_completed());
    let got = w.wait().map_err(e)?;
    if got.iter().any(|&x| x != f64::from(ranks)) {
        return Err("async f64 sum wrong".into());
    }
    // A group: two calls started together.
    let mut a = vec![rank as i32 + 1; 3000];
    let mut b = vec![0u64; 777];
    if rank == 0 {
        b.iter_mut()
            .enumerate()
            .for_each(|(i, x)| *x = i as u64 * 3);
    }
    comm.group(|g| {
        g.all_reduce_in_place(&mut a, ReduceOp::Max)?;
        g.broadcast_in_place(&mut b, Rank(0))
    })
    .map_err(e)?;
    if a.iter().any(|&x| x != ranks as i32) || b.iter().enumerate().any(|(i, &x)| x != i as u64 * 3)
    {
        return Err("group results wrong".into());
    }
    comm.barrier().map_err(e)?;
    // Split by parity, ranked by descending old rank.
    let sub = comm
        .split(Some(rank % 2), u32::MAX - rank)
        .map_err(e)?
        .ok_or("split gave no communicator")?;
    let members: Vec<u32> = (0..ranks).filter(|r| r % 2 == rank % 2).collect();
    let want_rank = members.iter().rev().position(|&r| r == rank).unwrap() as u32;
    if sub.rank().0 != want_rank || sub.world_size() != members.len() as u32 {
        return Err(format!(
            "split: rank {} of {}, want {want_rank} of {}",
            sub.rank(),
            sub.world_size(),
            members.len()
        ));
    }
    let mut x = vec![rank as u64; 1000];
    sub.all_reduce_in_place(&mut x, ReduceOp::Sum).map_err(e)?;
    let want: u64 = members.iter().map(|&r| u64::from(r)).sum();
    if x.iter().any(|&v| v != want) {
        return Err("split all-reduce wrong".into());
    }
    // The parent still works after the split.
    let mut y = vec![1u8; 100];
    comm.all_reduce_in_place(&mut y, ReduceOp::Sum).map_err(e)?;
    if y.iter().any(|&v| u32::from(v) != ranks) {
        return Err("parent after split wrong".into());
    }
    sub.close().map_err(e)?;
    comm.close().map_err(e)?;
    Ok(format!("async ok, hops {hops}"))
}

/// A rank process (started by the tests below; does nothing otherwise).
#[test]
#[ignore = "a rank process of the tests below"]
fn child_rank() {
    let Ok(rank) = std::env::var(ROLE) else {
        return;
    };
    let var = |k: &str| std::env::var(k).unwrap();
    let (rank, ranks): (u32, u32) = (rank.parse().unwrap(), var(RANKS).parse().unwrap());
    let channels: u8 = var(CHANNELS).parse().unwrap();
    match rank_main(&var(SUITE), rank, ranks, channels) {
        Ok(s) => println!("RESULT ok {s}"),
        Err(e) => {
            println!("RESULT error {e}");
            std::process::exit(2);
        }
    }
}

#[test]
fn two_ranks_every_collective_checked() {
    assert_all_ok(&job_of("suite", 2, 2));
}

#[test]
fn three_ranks_one_channel_checked() {
    assert_all_ok(&job_of("suite", 3, 1));
}

#[test]
fn four_ranks_three_channels_checked() {
    assert_all_ok(&job_of("suite", 4, 3));
}

#[test]
fn eight_ranks_checked() {
    assert_all_ok(&job_of("suite", 8, 2));
}

#[test]
fn one_rank_is_a_copy() {
    assert_all_ok(&job_of("suite", 1, 2));
}

#[test]
fn async_group_barrier_and_split() {
    let exits = job_of("async", 4, 2);
    assert_all_ok(&exits);
}

/// A job of `ranks` ranks on this host with `env` set in every rank.
fn job_with(suite: &str, ranks: u32, channels: u8, env: &[(&str, &str)]) -> Vec<Exit> {
    job(&Spec {
        suite,
        ranks,
        channels,
        node: &same_host,
        netns: &same_host,
        store_ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
        env,
    })
}

/// Every collective, uneven sizes, several types, in place every other
/// call, forced to LL (`RINGCC_PROTO`): every slice goes as 8-byte units
/// with flags over shared memory, no `tail`.
#[test]
fn ll_every_collective_on_2_3_4_ranks_checked() {
    for (ranks, channels) in [(2, 2), (3, 1), (4, 3)] {
        assert_all_ok(&job_with(
            "suite",
            ranks,
            channels,
            &[("RINGCC_PROTO", "LL")],
        ));
    }
}

/// The same under LL128 (128-byte lines, spelled in lower case).
#[test]
fn ll128_every_collective_on_2_3_4_ranks_checked() {
    for (ranks, channels) in [(2, 2), (3, 1), (4, 3)] {
        assert_all_ok(&job_with(
            "suite",
            ranks,
            channels,
            &[("RINGCC_PROTO", "ll128")],
        ));
    }
}

/// Under LL, ranks that call with different counts fail, within the
/// deadline, one naming the mismatched call.
#[test]
fn ll_mismatched_calls_fail_every_rank() {
    let exits = job_with("mismatch", 3, 1, &[("RINGCC_PROTO", "LL")]);
    for (r, e) in exits.iter().enumerate() {
        assert_eq!(e.code, Some(2), "rank {r}: {}", e.out);
        assert!(e.at < Duration::from_secs(20), "rank {r} took {:?}", e.at);
    }
    assert!(
        exits.iter().any(|e| e.out.contains("mismatched call")),
        "{exits:#?}"
    );
}

/// Under LL, a rank killed mid-call fails the others within the deadline.
#[test]
fn ll_killed_rank_fails_the_others() {
    let exits = job_with("killed", 3, 2, &[("RINGCC_PROTO", "LL")]);
    assert_eq!(
        exits[1].code, None,
        "rank 1 was not killed: {}",
        exits[1].out
    );
    assert_survivors_fail(&exits, 1, "RESULT error");
}

/// Ranks forced to different protocols do not connect: a typed error
/// on every rank (the settings differ), never a hang.
#[test]
fn different_protocols_across_ranks_fail_to_connect() {
    let exits = job(&Spec {
        suite: "suite",
        ranks: 2,
        channels: 1,
        node: &same_host,
        netns: &same_host,
        store_ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
        env: &[("RINGCC_HOST_TEST_PROTO_BY_RANK", "LL,Simple")],
    });
    for (r, e) in exits.iter().enumerate() {
        assert_eq!(e.code, Some(2), "rank {r}: {}", e.out);
        assert!(e.out.contains("protos="), "rank {r}: {}", e.out);
    }
}

fn two_nodes(r: u32) -> Option<String> {
    Some(format!("node{}", r % 2))
}

/// Two "nodes" on this host (`RINGCC_NODE`): shared memory inside each,
/// TCP between them.
#[test]
fn two_nodes_shm_inside_tcp_between() {
    for suite in ["suite", "async"] {
        let exits = job(&Spec {
            suite,
            ranks: 4,
            channels: 2,
            node: &two_nodes,
            netns: &same_host,
            store_ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
            env: &[],
        });
        assert_all_ok(&exits);
        for e in &exits {
            assert!(e.out.contains("tcp") && e.out.contains("shm"), "{}", e.out);
        }
    }
}

/// Everything over TCP (`RINGCC_SHM_DISABLE=1`).
#[test]
fn shm_disabled_runs_on_tcp() {
    let exits = job(&Spec {
        suite: "suite",
        ranks: 3,
        channels: 2,
        node: &same_host,
        netns: &same_host,
        store_ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
        env: &[("RINGCC_SHM_DISABLE", "1")],
    });
    assert_all_ok(&exits);
    for e in &exits {
        assert!(
            e.out.contains("(\"tcp\", \"tcp\")") && !e.out.contains("shm"),
            "{}",
            e.out
        );
    }
}

fn assert_survivors_fail(exits: &[Exit], dead: usize, what: &str) {
    for (r, e) in exits.iter().enumerate() {
        if r == dead {
            continue;
        }
        assert_eq!(e.code, Some(2), "rank {r}: {}", e.out);
        assert!(e.out.contains(what), "rank {r}: {}", e.out);
        assert!(e.at < Duration::from_secs(20), "rank {r} took {:?}", e.at);
    }
}

/// A rank killed with SIGKILL mid-call: every survivor fails (through
/// the store's notice, the process table or its deadline), none hangs.
#[test]
fn a_killed_rank_fails_the_others_shm() {
    let exits = job_of("killed", 3, 2);
    assert_eq!(
        exits[1].code, None,
        "rank 1 was not killed: {}",
        exits[1].out
    );
    assert_survivors_fail(&exits, 1, "RESULT error");
}

#[test]
fn a_killed_rank_fails_the_others_tcp() {
    let exits = job(&Spec {
        suite: "killed",
        ranks: 4,
        channels: 2,
        node: &two_nodes,
        netns: &same_host,
        store_ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
        env: &[],
    });
    assert_eq!(
        exits[1].code, None,
        "rank 1 was not killed: {}",
        exits[1].out
    );
    assert_survivors_fail(&exits, 1, "RESULT error");
}

/// `abort` on one rank reaches every rank, naming it.
#[test]
fn abort_reaches_every_rank() {
    let exits = job_of("abort", 3, 2);
    for (r, e) in exits.iter().enumerate() {
        assert_eq!(e.code, Some(2), "rank {r}: {}", e.out);
        assert!(e.out.contains("aborted by rank 0"), "rank {r}: {}", e.out);
        assert!(e.at < Duration::from_secs(20), "rank {r} took {:?}", e.at);
    }
}

/// Ranks that call with different counts: an error on every rank, within
/// the deadline (the one that sees the mismatched header names it).
#[test]
fn mismatched_calls_fail_every_rank() {
    let exits = job_of("mismatch", 3, 1);
    for (r, e) in exits.iter().enumerate() {
        assert_eq!(e.code, Some(2), "rank {r}: {}", e.out);
        assert!(e.at < Duration::from_secs(20), "rank {r} took {:?}", e.at);
    }
    assert!(
        exits.iter().any(|e| e.out.contains("mismatched call")),
        "{exits:#?}"
    );
}

fn netns() -> Option<(String, String, IpAddr)> {
    let v = std::env::var("RINGCC_NETNS").ok()?;
    let (a, b) = v.split_once(',')?;
    let ip = std::env::var("RINGCC_NETNS_STORE_IP").ok()?.parse().ok()?;
    Some((a.to_owned(), b.to_owned(), ip))
}

/// Two network namespaces joined by a veth pair, two ranks in each:
/// shared memory inside a namespace, TCP over the veth between them.
#[test]
#[ignore = "needs the namespaces of scripts/netns-tests.sh"]
fn netns_two_hosts_two_ranks_each() {
    let (a, b, ip) = netns().expect("RINGCC_NETNS=nsA,nsB and RINGCC_NETNS_STORE_IP");
    let ns = move |r: u32| Some(if r < 2 { a.clone() } else { b.clone() });
    let node = |r: u32| Some(format!("host{}", r / 2));
    for suite in ["suite", "async"] {
        let exits = job(&Spec {
            suite,
            ranks: 4,
            channels: 2,
            node: &node,
            netns: &ns,
            store_ip: ip,
            env: &[],
        });
        assert_all_ok(&exits);
        for e in &exits {
            assert!(e.out.contains("tcp") && e.out.contains("shm"), "{}", e.out);
        }
    }
}

#[test]
#[ignore = "needs the namespaces of scripts/netns-tests.sh"]
fn netns_a_killed_rank_fails_the_others() {
    let (a, b, ip) = netns().expect("RINGCC_NETNS=nsA,nsB and RINGCC_NETNS_STORE_IP");
    let ns = move |r: u32| Some(if r < 2 { a.clone() } else { b.clone() });
    let node = |r: u32| Some(format!("host{}", r / 2));
    let exits = job(&Spec {
        suite: "killed",
        ranks: 4,
        channels: 2,
        node: &node,
        netns: &ns,
        store_ip: ip,
        env: &[],
    });
    assert_survivors_fail(&exits, 1, "RESULT error");
}
