//! AllReduce bandwidth over shared memory between processes.
//!
//! `shm_bench --np N [--bytes B[,B...]] [--iters K] [--channels C]`
//! starts N rank processes of itself (as `mpirun -np N` would) and prints,
//! from rank 0, one line per size: time per call and nccl-tests' algbw
//! and busbw (float sum, out of place).

use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use ringcc_core::{Call, DataType, Rank, ReduceOp};
use ringcc_host::{ShmConfig, ShmRank};

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let sizes: Vec<usize> = arg(&args, "--bytes")
        .unwrap_or_else(|| "1048576,16777216,67108864".into())
        .split(',')
        .filter_map(|s| s.parse().ok())
        .collect();
    let iters: u32 = arg(&args, "--iters")
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let channels: u8 = arg(&args, "--channels")
        .and_then(|s| s.parse().ok())
        .unwrap_or(2);
    if let Ok(rank) = std::env::var("SHM_BENCH_RANK") {
        let ranks: u32 = std::env::var("SHM_BENCH_RANKS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let token = std::env::var("SHM_BENCH_TOKEN").unwrap_or_default();
        let rank: u32 = rank.parse().unwrap_or(u32::MAX);
        return match run_rank(&token, rank, ranks, channels, &sizes, iters) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("rank {rank}: {e}");
                ExitCode::from(2)
            }
        };
    }
    let np: u32 = arg(&args, "--np").and_then(|s| s.parse().ok()).unwrap_or(2);
    let token = format!("shm-bench-{}", std::process::id());
    let exe = std::env::current_exe().expect("own path");
    let mut children: Vec<_> = (0..np)
        .map(|r| {
            Command::new(&exe)
                .args(&args[1..])
                .env("SHM_BENCH_RANK", r.to_string())
                .env("SHM_BENCH_RANKS", np.to_string())
                .env("SHM_BENCH_TOKEN", &token)
                .spawn()
                .expect("start a rank")
        })
        .collect();
    let mut ok = true;
    for c in &mut children {
        ok &= c.wait().map(|s| s.success()).unwrap_or(false);
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

fn run_rank(
    token: &str,
    rank: u32,
    ranks: u32,
    channels: u8,
    sizes: &[usize],
    iters: u32,
) -> Result<(), ringcc_host::Error> {
    let config = ShmConfig {
        channels,
        timeout: Duration::from_secs(60),
        ..ShmConfig::default()
    };
    let mut comm = ShmRank::connect(token, Rank(rank), ranks, config)?;
    if rank == 0 {
        println!("# ringcc-host shm AllReduce, float sum, {ranks} processes, {channels} channel(s), out of place");
        println!(
            "# {:>12} {:>10} {:>10} {:>10}",
            "bytes", "time us", "algbw GB/s", "busbw GB/s"
        );
    }
    for &bytes in sizes {
        let call = Call::all_reduce((bytes / 4) as u64, DataType::F32, ReduceOp::Sum);
        let input = vec![1u8; bytes / 4 * 4];
        let mut output = vec![0u8; bytes / 4 * 4];
        comm.run(&call, &input, &mut output)?; // warm-up
        let t = Instant::now();
        for _ in 0..iters {
            comm.run(&call, &input, &mut output)?;
        }
        let secs = t.elapsed().as_secs_f64() / f64::from(iters);
        let algbw = bytes as f64 / secs / 1e9;
        let busbw = algbw * 2.0 * f64::from(ranks - 1) / f64::from(ranks);
        if rank == 0 {
            println!(
                "  {bytes:>12} {:>10.1} {algbw:>10.3} {busbw:>10.3}",
                secs * 1e6
            );
        }
    }
    Ok(())
}
