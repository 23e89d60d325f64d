//! Ranks as real processes on shared memory: the test binary re-executes
//! itself once per rank (`child_rank`, ignored when run directly), each
//! child joins the job over `ShmRank`, runs a suite of calls and checks
//! every output element against the core's reference (`verify`). Every
//! wait has a deadline: children are killed when the parent gives up.

mod common;
use common::Reap;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ringcc_core::fifo::FifoGeometry;
use ringcc_core::verify;
use ringcc_core::{Call, DataType, Rank, ReduceOp};
use ringcc_host::{Error, ShmConfig, ShmRank};

const ROLE: &str = "RINGCC_HOST_TEST_RANK";
const RANKS: &str = "RINGCC_HOST_TEST_RANKS";
const TOKEN: &str = "RINGCC_HOST_TEST_TOKEN";
const SUITE: &str = "RINGCC_HOST_TEST_SUITE";
const CHANNELS: &str = "RINGCC_HOST_TEST_CHANNELS";

/// How long a whole job may take before the parent kills it.
const JOB_LIMIT: Duration = Duration::from_secs(120);

fn token(what: &str) -> String {
    format!("shm-ranks-{what}-{}-{}", std::process::id(), rand_suffix())
}

fn rand_suffix() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    t ^ (t >> 17)
}

/// What one rank process reported.
#[derive(Debug)]
struct Exit {
    code: Option<i32>,
    out: String,
    at: Duration,
}

/// Starts `ranks` children running `suite`, waits for all (up to
/// `JOB_LIMIT`), and returns their exits in rank order.
fn job(suite: &str, ranks: u32, channels: u8) -> Vec<Exit> {
    let t = token(suite);
    let t0 = Instant::now();
    let mut children: Vec<Reap> = (0..ranks)
        .map(|r| {
            Reap(
                Command::new(std::env::current_exe().unwrap())
                    .args(["--exact", "child_rank", "--ignored", "--nocapture"])
                    .env(ROLE, r.to_string())
                    .env(RANKS, ranks.to_string())
                    .env(TOKEN, &t)
                    .env(SUITE, suite)
                    .env(CHANNELS, channels.to_string())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::null())
                    .spawn()
                    .expect("spawn a rank"),
            )
        })
        .collect();
    let mut done: Vec<Option<(Option<i32>, Duration)>> = (0..ranks).map(|_| None).collect();
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

/// One rank's run of the suite `suite`; prints `RESULT ok` or
/// `RESULT error <e>`.
fn rank_main(
    suite: &str,
    rank: u32,
    ranks: u32,
    channels: u8,
    token: &str,
) -> Result<String, String> {
    let config = ShmConfig {
        channels,
        // Small slots: many slices, every FIFO wraps many times.
        geometry: FifoGeometry::new(16 << 10, 2).unwrap(),
        chunk_bytes: 64 << 10,
        timeout: match suite {
            "killed" | "mismatch" => Duration::from_secs(2),
            _ => Duration::from_secs(30),
        },
        ..ShmConfig::default()
    };
    let mut comm = ShmRank::connect(token, Rank(rank), ranks, config).map_err(|e| e.to_string())?;
    let calls = match suite {
        "mismatch" => {
            let count = if rank == 1 { 1001 } else { 1000 };
            vec![Call::all_reduce(count, DataType::F32, ReduceOp::Sum)]
        }
        _ => suite_calls(ranks),
    };
    if suite == "killed" && rank == 1 {
        // Gone without a word, as a `kill -9` leaves its peers.
        std::process::exit(9);
    }
    for (k, call) in calls.iter().enumerate() {
        let salt = k as u64 * 7 + 1;
        let plan = call.plan(ranks, 1, 1 << 20).map_err(|e| e.to_string())?;
        let (ib, ob) = call.buffer_bytes(ranks);
        let in_place = k % 2 == 1;
        let mut input = vec![0u8; ib];
        verify::fill_input(&plan, call.op, rank, salt, &mut input).map_err(|e| e.to_string())?;
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
        let mut want = vec![0u8; ob];
        let checked = verify::fill_expected(&plan, call.op, rank, 0, salt, &mut want)
            .map_err(|e| e.to_string())?;
        if checked {
            let wrong = verify::count_diff(&want, &got, call.elem());
            if wrong != 0 {
                return Err(format!(
                    "call {k} ({call:?}, in place {in_place}): {wrong} wrong elements"
                ));
            }
        }
    }
    Ok(format!("{} calls", calls.len()))
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
    match rank_main(&var(SUITE), rank, ranks, channels, &var(TOKEN)) {
        Ok(s) => println!("RESULT ok {s}"),
        Err(e) => {
            println!("RESULT error {e}");
            std::process::exit(2);
        }
    }
}

#[test]
fn two_ranks_every_collective_checked() {
    assert_all_ok(&job("suite", 2, 2));
}

#[test]
fn three_ranks_one_channel_checked() {
    assert_all_ok(&job("suite", 3, 1));
}

#[test]
fn four_ranks_three_channels_checked() {
    assert_all_ok(&job("suite", 4, 3));
}

#[test]
fn eight_ranks_checked() {
    assert_all_ok(&job("suite", 8, 2));
}

#[test]
fn one_rank_is_a_copy() {
    assert_all_ok(&job("suite", 1, 2));
}

/// A rank that vanishes after connecting: every survivor fails within its
/// 2 s deadline (plus start-up), none hangs.
#[test]
fn a_vanished_rank_fails_the_others_within_the_deadline() {
    let exits = job("killed", 3, 2);
    assert_eq!(exits[1].code, Some(9));
    for r in [0, 2] {
        let e = &exits[r];
        assert_eq!(e.code, Some(2), "rank {r}: {}", e.out);
        assert!(e.out.contains("timed out"), "rank {r}: {}", e.out);
        assert!(e.at < Duration::from_secs(20), "rank {r} took {:?}", e.at);
    }
}

/// Ranks that call with different counts: an error on every rank, within
/// the deadline (the one that sees the mismatched header names it).
#[test]
fn mismatched_calls_fail_every_rank() {
    let exits = job("mismatch", 3, 1);
    for (r, e) in exits.iter().enumerate() {
        assert_eq!(e.code, Some(2), "rank {r}: {}", e.out);
        assert!(e.at < Duration::from_secs(20), "rank {r} took {:?}", e.at);
    }
    assert!(
        exits.iter().any(|e| e.out.contains("mismatched call")),
        "{exits:#?}"
    );
}

/// Bad buffers are refused before anything moves.
#[test]
fn a_wrong_buffer_size_is_refused() {
    let t = token("buffer");
    let mut comm = ShmRank::connect(&t, Rank(0), 1, ShmConfig::default()).unwrap();
    let call = Call::all_reduce(10, DataType::F32, ReduceOp::Sum);
    let mut out = vec![0u8; 40];
    let e = comm.run(&call, &[0u8; 39], &mut out).unwrap_err();
    assert!(
        matches!(
            e,
            Error::BadBuffer {
                which: "input",
                expected: 40,
                got: 39
            }
        ),
        "{e}"
    );
    let mut small = vec![0u8; 8];
    let e = comm.run_in_place(&call, &mut small).unwrap_err();
    assert!(
        matches!(
            e,
            Error::BadBuffer {
                which: "in-place",
                ..
            }
        ),
        "{e}"
    );
    // A chunk the FIFO cannot hold is refused at connect.
    let huge = ShmConfig {
        chunk_bytes: 64 << 20,
        ..ShmConfig::default()
    };
    let e = ShmRank::connect(&token("chunk"), Rank(0), 1, huge).unwrap_err();
    assert!(matches!(e, Error::BadConfig(_)), "{e}");
    // The rank still works.
    comm.run(&call, &[0u8; 40], &mut out).unwrap();
}
