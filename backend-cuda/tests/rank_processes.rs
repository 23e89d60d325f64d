//! A CUDA rank per process on the fake device, with CUDA IPC between the
//! processes: the test binary re-executes itself once per rank
//! (`child_rank`, ignored when run directly); the parent serves the job's
//! TCP store; each child joins with `RankComm::init` (the fake device's
//! FIFOs exported as memfds, their handles exchanged over the store,
//! imported and mapped by the predecessor), runs every collective over
//! several (type, op) pairs in place and out of place, and checks every
//! output element against the core's reference (`verify`). A killed or
//! absent rank must end the others with a typed error within the
//! deadline. Every wait is bounded: children are killed when the parent
//! gives up.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ringcc_comm::store::tcp::{TcpStore, TcpStoreServer};
use ringcc_comm::{Error as CommError, Options};
use ringcc_core::fifo::FifoGeometry;
use ringcc_core::verify;
use ringcc_core::{Call, DataType, Rank, ReduceOp};
use ringcc_cuda::{Error, RankComm, RankDevice};

mod procs;
use procs::Exit;

const ROLE: &str = "RINGCC_CUDA_TEST_RANK";
const RANKS: &str = "RINGCC_CUDA_TEST_RANKS";
const TOKEN: &str = "RINGCC_CUDA_TEST_TOKEN";
const SUITE: &str = "RINGCC_CUDA_TEST_SUITE";
const CHANNELS: &str = "RINGCC_CUDA_TEST_CHANNELS";
const STORE: &str = "RINGCC_CUDA_TEST_STORE";

/// How long a whole job may take before the parent kills it.
const JOB_LIMIT: Duration = Duration::from_secs(180);

/// The deadline of the failure suites' ranks.
const SHORT: Duration = Duration::from_secs(4);

fn token(what: &str) -> String {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    format!("cuda-ranks-{what}-{}-{}", std::process::id(), t ^ (t >> 17))
}

/// Serves the store for `ranks` ranks, starts `started` of them (the rest
/// stay absent), waits for all (up to `JOB_LIMIT`), and returns their
/// exits in rank order. `node` gives rank → `RINGCC_NODE`.
fn job(
    suite: &str,
    ranks: u32,
    started: u32,
    channels: u8,
    node: &dyn Fn(u32) -> String,
) -> Vec<Exit> {
    job_env(suite, ranks, started, channels, node, &|_| Vec::new())
}

/// [`job`] with extra variables per rank.
fn job_env(
    suite: &str,
    ranks: u32,
    started: u32,
    channels: u8,
    node: &dyn Fn(u32) -> String,
    env: &dyn Fn(u32) -> Vec<(&'static str, String)>,
) -> Vec<Exit> {
    let t = token(suite);
    let server = TcpStoreServer::start(
        SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0),
        &t,
        ranks,
    )
    .expect("serve the store");
    let addr = server.local_addr().to_string();
    procs::run("child_rank", started, JOB_LIMIT, &|r| {
        let mut v = vec![
            (ROLE, r.to_string()),
            (RANKS, ranks.to_string()),
            (TOKEN, t.clone()),
            (SUITE, suite.to_owned()),
            (CHANNELS, channels.to_string()),
            (STORE, addr.clone()),
            ("RINGCC_NODE", node(r)),
        ];
        v.extend(env(r));
        v
    })
}

fn one_node(_: u32) -> String {
    "node-a".into()
}

fn assert_all_ok(exits: &[Exit]) {
    for (r, e) in exits.iter().enumerate() {
        assert_eq!(e.code, Some(0), "rank {r} failed: {}", e.out);
        assert!(e.out.contains("RESULT ok"), "rank {r}: {}", e.out);
        for l in e.out.lines().filter(|l| l.starts_with("RESULT")) {
            println!("rank {r}: {l}");
        }
    }
}

/// Every collective over several (type, op) pairs and uneven sizes (0,
/// 1, odd, several slices, several chunks, every FIFO wrapping).
fn suite_calls(ranks: u32) -> Vec<Call> {
    let root = Rank(ranks - 1);
    let types = [
        (DataType::F32, ReduceOp::Sum),
        (DataType::I32, ReduceOp::Max),
        (DataType::F64, ReduceOp::Prod),
        (DataType::U8, ReduceOp::Min),
        (DataType::Bf16, ReduceOp::Sum),
        (DataType::I64, ReduceOp::Avg),
        (DataType::F16, ReduceOp::Max),
    ];
    let mut calls = Vec::new();
    for (i, &count) in [0u64, 1, 1001, 40_003].iter().enumerate() {
        for (j, &(dtype, op)) in types.iter().enumerate() {
            if (i + j) % 2 == 1 && count > 1 {
                continue;
            }
            calls.push(Call::all_reduce(count, dtype, op));
            calls.push(Call::reduce_scatter(count / 3, dtype, op));
            calls.push(Call::all_gather(count / 3 + 1, dtype));
            calls.push(Call::broadcast(count, dtype, root));
            calls.push(Call::reduce(count, dtype, op, Rank(j as u32 % ranks)));
        }
    }
    calls
}

/// Rank `rank`'s input of call `k` and the output it must end with
/// (`None` where the reference has no exact answer).
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

/// Runs call `k` on `rc` (in place or not), asynchronously (queued, then
/// waited for), and checks every element against the reference.
fn run_checked(rc: &RankComm, call: &Call, k: usize, in_place: bool) -> Result<bool, CommError> {
    let comm = rc.comm();
    let (ranks, rank) = (comm.world_size(), comm.rank().0);
    let (input, want) = data(call, ranks, rank, k);
    let (ib, ob) = call.buffer_bytes(ranks);
    let got = if in_place {
        let (ie, oe) = call.in_place_offsets(rank);
        let mut buf = vec![0u8; ib.max(ob)];
        let at = |e: u64| e as usize * call.elem();
        buf[at(ie)..at(ie) + ib].copy_from_slice(&input);
        let buf = comm.submit_in_place(*call, buf)?.wait()?;
        buf[at(oe)..at(oe) + ob].to_vec()
    } else {
        comm.submit(*call, input, vec![0u8; ob])?.wait()?.1
    };
    Ok(match want {
        Some(want) => verify::count_diff(&want, &got, call.elem()) == 0,
        None => true,
    })
}

fn options(suite: &str, channels: u8) -> Options {
    let mut o = Options::from_env().unwrap();
    o.channels = channels;
    // Small slots: many slices, every FIFO wraps many times.
    o.geometry = Some(FifoGeometry::new(4 << 10, 2).unwrap());
    o.chunk_bytes = 16 << 10;
    // Every channel in use from 16 KiB on.
    o.channel_bytes = Some(8 << 10);
    o.timeout = match suite {
        "suite" => Duration::from_secs(60),
        _ => SHORT,
    };
    o
}

fn init(suite: &str, rank: u32, ranks: u32, channels: u8) -> Result<RankComm, Error> {
    let var = |k: &str| std::env::var(k).unwrap();
    let (token, addr) = (var(TOKEN), var(STORE));
    let o = options(suite, channels);
    if suite == "launcher" {
        // Rank, world size, address and token from RINGCC_*; rank 0
        // serves the store there.
        return RankComm::from_env(RankDevice::Fake, o, Arc::new(Vec::new));
    }
    // Two "nodes": the host's transports carry the hops between them.
    let extra: ringcc_comm::Transports = if suite == "two-nodes" {
        ringcc_host::transports(IpAddr::V4(Ipv4Addr::LOCALHOST), o.timeout)
    } else {
        Arc::new(Vec::new)
    };
    let store =
        TcpStore::connect(&addr, &token, Rank(rank), ranks, o.timeout).map_err(|source| {
            Error::Comm {
                call: "TcpStore::connect",
                source,
            }
        })?;
    RankComm::init(
        Rank(rank),
        ranks,
        Arc::new(store),
        &token,
        RankDevice::Fake,
        o,
        extra,
    )
}

/// The variant of a communicator error, for the parent to check.
fn kind(e: &Error) -> &'static str {
    match e {
        Error::Comm { source, .. } => match source {
            CommError::Timeout { .. } => "Timeout",
            CommError::Aborted { .. } => "Aborted",
            CommError::PeerGone { .. } => "PeerGone",
            CommError::Poisoned { .. } => "Poisoned",
            CommError::BadConfig(_) => "BadConfig",
            _ => "other",
        },
        _ => "other",
    }
}

/// [`suite_calls`], each out of place and every `in_place_every`-th in
/// place too, checked; the number of calls, or `BadConfig` naming none
/// but printing the wrong ones.
fn checked_suite(rc: &RankComm, ranks: u32, in_place_every: usize) -> Result<usize, Error> {
    let calls = suite_calls(ranks);
    let mut wrong = Vec::new();
    for (k, call) in calls.iter().enumerate() {
        for in_place in [false, true] {
            if in_place && k % in_place_every != 0 {
                continue;
            }
            let ok = run_checked(rc, call, k, in_place).map_err(|source| Error::Comm {
                call: "collective",
                source,
            })?;
            if !ok {
                wrong.push(format!("{call:?} in place {in_place}"));
            }
        }
    }
    if !wrong.is_empty() {
        println!("WRONG {wrong:?}");
        return Err(Error::BadConfig {
            what: "wrong results",
        });
    }
    Ok(calls.len())
}

/// One rank's run of `suite`; `Ok` with a summary line.
fn rank_main(suite: &str, rank: u32, ranks: u32, channels: u8) -> Result<String, Error> {
    let t0 = Instant::now();
    let rc = match init(suite, rank, ranks, channels) {
        Ok(rc) => rc,
        Err(e) => {
            println!(
                "FAILED {} after {} ms: {e}",
                kind(&e),
                t0.elapsed().as_millis()
            );
            return Err(e);
        }
    };
    let comm_err = |source| Error::Comm {
        call: "collective",
        source,
    };
    let hops = format!("{:?}", rc.comm().hops());
    match suite {
        "launcher" => {
            if (rc.rank().0, rc.world_size()) != (rank, ranks) {
                return Err(Error::BadConfig {
                    what: "rank or world size not the launcher's",
                });
            }
            let calls = [
                Call::all_reduce(5000, DataType::F32, ReduceOp::Sum),
                Call::all_gather(777, DataType::I64),
                Call::broadcast(3001, DataType::U8, Rank(ranks - 1)),
            ];
            for (k, call) in calls.iter().enumerate() {
                if !run_checked(&rc, call, k, false).map_err(comm_err)? {
                    return Err(Error::BadConfig {
                        what: "wrong results",
                    });
                }
            }
            rc.close()?;
            Ok(format!("launcher ok, hops {hops}"))
        }
        "suite" => {
            if rc
                .comm()
                .hops()
                .iter()
                .any(|&(o, i)| o != "cuda-ipc" || i != "cuda-ipc")
            {
                return Err(Error::BadConfig {
                    what: "a hop of one node not on cuda-ipc",
                });
            }
            let n = checked_suite(&rc, ranks, 1)?;
            rc.close()?;
            Ok(format!("{n} calls twice, hops {hops}"))
        }
        "two-nodes" => {
            // Inside a node CUDA IPC, between the nodes TCP (the fake
            // device's memory is host memory: the bytes go through the
            // host's FIFOs, as a GPU's would be staged).
            let hops = rc.comm().hops().to_vec();
            let kinds: Vec<&str> = hops.iter().flat_map(|&(o, i)| [o, i]).collect();
            if kinds.iter().any(|k| *k != "cuda-ipc" && *k != "tcp")
                || !kinds.contains(&"cuda-ipc")
                || !kinds.contains(&"tcp")
            {
                println!("HOPS {hops:?}");
                return Err(Error::BadConfig {
                    what: "two nodes' hops not cuda-ipc inside and tcp between",
                });
            }
            let n = checked_suite(&rc, ranks, 3)?;
            rc.close()?;
            Ok(format!("{n} calls, hops {hops:?}"))
        }
        "killed" => {
            let call = Call::all_reduce(1 << 18, DataType::F32, ReduceOp::Sum);
            if rank == 1 {
                // SIGKILL while its peers are mid-call.
                std::thread::spawn(|| {
                    std::thread::sleep(Duration::from_millis(300));
                    let me = rustix::process::getpid();
                    let _ = rustix::process::kill_process(me, rustix::process::Signal::KILL);
                });
            }
            for k in 0.. {
                let t = Instant::now();
                if let Err(e) = run_checked(&rc, &call, k, false).map_err(comm_err) {
                    println!(
                        "FAILED {} after {} ms: {e}",
                        kind(&e),
                        t.elapsed().as_millis()
                    );
                    return Err(e);
                }
            }
            Ok("unreachable".into())
        }
        other => Err(Error::BadConfig {
            what: if other.is_empty() {
                "no suite"
            } else {
                "unknown suite"
            },
        }),
    }
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
fn two_processes_every_collective_over_ipc_checked() {
    assert_all_ok(&job("suite", 2, 2, 2, &one_node));
}

#[test]
fn three_processes_one_channel_checked() {
    assert_all_ok(&job("suite", 3, 3, 1, &one_node));
}

#[test]
fn four_processes_two_channels_checked() {
    assert_all_ok(&job("suite", 4, 4, 2, &one_node));
}

/// The `FAILED <kind> after <ms> ms` line of a rank's output.
fn failure(e: &Exit) -> Option<(String, u64)> {
    let line = e.out.lines().find(|l| l.starts_with("FAILED "))?;
    let mut w = line.split_whitespace().skip(1);
    let kind = w.next()?.to_owned();
    let ms = w.nth(1)?.parse().ok()?;
    Some((kind, ms))
}

/// Rank 1 is killed mid-call: ranks 0 and 2 fail with a typed error
/// (the peer is gone, the job aborted, or the deadline) — within the
/// deadline and a margin, not at the job's limit.
#[test]
fn a_killed_rank_ends_the_others_with_a_typed_error_in_time() {
    let exits = job("killed", 3, 3, 2, &one_node);
    assert_eq!(exits[1].code, None, "rank 1 was killed: {}", exits[1].out);
    for r in [0, 2] {
        let e = &exits[r];
        assert_eq!(e.code, Some(2), "rank {r}: {}", e.out);
        let (kind, ms) = failure(e).unwrap_or_else(|| panic!("rank {r}: {}", e.out));
        println!("rank {r}: {kind} after {ms} ms");
        assert!(
            ["PeerGone", "Aborted", "Timeout", "Poisoned"].contains(&kind.as_str()),
            "rank {r}: {kind}: {}",
            e.out
        );
        assert!(
            ms <= (SHORT + Duration::from_secs(3)).as_millis() as u64,
            "rank {r} took {ms} ms: {}",
            e.out
        );
    }
}

/// Rank 2 of 3 never starts: the two that did fail to connect with a
/// timeout within the deadline (and a margin).
#[test]
fn an_absent_rank_is_a_timeout_at_init() {
    let exits = job("killed", 3, 2, 1, &one_node);
    for (r, e) in exits.iter().enumerate() {
        assert_eq!(e.code, Some(2), "rank {r}: {}", e.out);
        let (kind, ms) = failure(e).unwrap_or_else(|| panic!("rank {r}: {}", e.out));
        assert_eq!(kind, "Timeout", "rank {r}: {}", e.out);
        assert!(
            ms <= (SHORT + Duration::from_secs(3)).as_millis() as u64,
            "rank {r} took {ms} ms: {}",
            e.out
        );
    }
}

/// The topology chooses the transport per hop: ranks on two nodes cannot
/// share device memory, and with no other transport given, init says no
/// transport reaches (a typed error, at once).
#[test]
fn ranks_on_two_nodes_are_not_joined_by_ipc() {
    let exits = job("suite", 2, 2, 1, &|r| format!("node-{r}"));
    for (r, e) in exits.iter().enumerate() {
        assert_eq!(e.code, Some(2), "rank {r}: {}", e.out);
        let (kind, _) = failure(e).unwrap_or_else(|| panic!("rank {r}: {}", e.out));
        assert_eq!(kind, "BadConfig", "rank {r}: {}", e.out);
        assert!(
            e.out.contains("no transport reaches"),
            "rank {r}: {}",
            e.out
        );
    }
}

/// Four ranks on two "nodes" (`RINGCC_NODE`), the host's transports
/// given beside CUDA IPC: each hop inside a node goes over `cuda-ipc`,
/// each hop between the nodes over TCP; every collective checked.
#[test]
fn four_processes_on_two_nodes_ipc_inside_tcp_between() {
    let exits = job("two-nodes", 4, 4, 2, &|r| format!("node-{}", r / 2));
    assert_all_ok(&exits);
    for (r, e) in exits.iter().enumerate() {
        assert!(
            e.out.contains("cuda-ipc") && e.out.contains("tcp"),
            "rank {r}: {}",
            e.out
        );
    }
}

/// `RankComm::from_env`: rank, world size, address and token from the
/// launcher's variables (`RINGCC_*`); rank 0 serves the store at the
/// address, every rank joins there — no store handed in.
#[test]
fn three_processes_from_the_launcher_environment() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port");
    let t = token("launcher");
    let exits = job_env("launcher", 3, 3, 2, &one_node, &|r| {
        vec![
            ("RINGCC_RANK", r.to_string()),
            ("RINGCC_WORLD_SIZE", "3".to_owned()),
            ("RINGCC_ADDR", format!("127.0.0.1:{port}")),
            ("RINGCC_TOKEN", t.clone()),
        ]
    });
    assert_all_ok(&exits);
}
