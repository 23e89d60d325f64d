//! One rank of a ringcc job over verbs: the process the Soft-RoCE tests
//! and the benchmark start `n` times (rank, world size and address from
//! `RINGCC_RANK`, `RINGCC_WORLD_SIZE`, `RINGCC_ADDR` or a launcher; the
//! communicator's settings from `RINGCC_*` with verbs' FIFO
//! ([`ringcc_verbs::options_from_env`]), plus `RINGCC_SLOTS_PER_SLICE`;
//! the transport's from `RINGCC_IB_*`).
//!
//! ```text
//! verbs_rank suite [--sizes 0,1,1000] [--seed S] [--in-place] [--shm] [--fake-gpu]
//!                                                 every collective, checked (every other
//!                                                 call queued asynchronously; --in-place:
//!                                                 every call in place, NCCL's layout;
//!                                                 --shm: shared memory inside a node,
//!                                                 verbs between nodes; --fake-gpu: a
//!                                                 fake-device GPU rank, CUDA IPC inside
//!                                                 a node, verbs between nodes staged
//!                                                 through host FIFOs)
//! verbs_rank bench --bytes B [--iters N] [--warmup W] [--out FILE]
//! verbs_rank loop --bytes B --seconds S            allreduce until error/time
//! verbs_rank mismatch                              rank 1 calls another count
//! verbs_rank stall [--seconds S]                   rank 1 makes its second call S s late
//! verbs_rank bad-rkey                              rank 1 advertises a bad rkey
//! verbs_rank stranger                              connect with a wrong token
//! ```
//!
//! The last line is `RESULT rank=R ok …` or `RESULT rank=R error: …`.
//! Exit status: 0 success, 2 an error returned by the communicator (what
//! the fault modes expect), 1 a wrong result or bad usage.

use std::io::Write;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ringcc_comm::launch::Launch;
use ringcc_comm::transport::Transport;
use ringcc_comm::{Communicator, Error, Options, Transports};
use ringcc_core::fifo::FifoGeometry;
use ringcc_core::{verify, Call, Collective, DataType, Plan, Rank, ReduceOp};
use ringcc_host::ShmTransport;
use ringcc_verbs::{Fault, VerbsConfig, VerbsTransport};

/// Rank `rank`'s input for `plan` (the core's exact test values: every
/// reduction order gives the same bits).
fn input(plan: &Plan, op: ReduceOp, rank: u32, salt: u64) -> Vec<u8> {
    let mut v = vec![0u8; plan.input_len() as usize * usize::from(plan.dtype().size())];
    verify::fill_input(plan, op, rank, salt, &mut v).expect("input");
    v
}

/// Rank `rank`'s expected output, `None` where it is undefined.
fn expected(plan: &Plan, op: ReduceOp, rank: u32, salt: u64) -> Option<Vec<u8>> {
    let mut v = vec![0u8; plan.output_len() as usize * usize::from(plan.dtype().size())];
    verify::fill_expected(plan, op, rank, 0, salt, &mut v)
        .expect("expected")
        .then_some(v)
}

const COMBOS: [(DataType, ReduceOp); 10] = [
    (DataType::F32, ReduceOp::Sum),
    (DataType::I32, ReduceOp::Prod),
    (DataType::F64, ReduceOp::Avg),
    (DataType::U8, ReduceOp::Max),
    (DataType::I64, ReduceOp::Min),
    (DataType::Bf16, ReduceOp::Sum),
    (DataType::F16, ReduceOp::Avg),
    (DataType::U32, ReduceOp::Sum),
    (DataType::I8, ReduceOp::Prod),
    (DataType::U64, ReduceOp::Max),
];

struct Args(Vec<String>);

impl Args {
    fn value(&self, name: &str) -> Option<&str> {
        let i = self.0.iter().position(|a| a == name)?;
        self.0.get(i + 1).map(String::as_str)
    }
    fn num(&self, name: &str, default: u64) -> u64 {
        self.value(name)
            .map(|v| v.parse().unwrap_or_else(|_| usage(&format!("{name} {v}"))))
            .unwrap_or(default)
    }
    fn flag(&self, name: &str) -> bool {
        self.0.iter().any(|a| a == name)
    }
}

fn usage(why: &str) -> ! {
    eprintln!("verbs_rank: {why}\nusage: verbs_rank suite|bench|loop|mismatch|bad-rkey|stall|stranger [options]");
    std::process::exit(1)
}

/// The communicator's settings: the environment's over verbs' FIFO, with
/// `RINGCC_SLOTS_PER_SLICE` (which [`Options::from_env`] does not read).
fn options() -> Options {
    let mut o = ringcc_verbs::options_from_env().unwrap_or_else(|e| usage(&e.to_string()));
    if let Some(v) = std::env::var("RINGCC_SLOTS_PER_SLICE")
        .ok()
        .filter(|v| !v.trim().is_empty())
    {
        let sps = v
            .trim()
            .parse()
            .unwrap_or_else(|_| usage("RINGCC_SLOTS_PER_SLICE"));
        let slot = o
            .geometry
            .map_or(ringcc_comm::transport::SLOT_BYTES, |g| g.slot_bytes());
        o.geometry = Some(
            FifoGeometry::new(slot, sps)
                .unwrap_or_else(|e| usage(&format!("RINGCC_SLOTS_PER_SLICE={sps}: {e}"))),
        );
        o.validate().unwrap_or_else(|e| usage(&e.to_string()));
    }
    o
}

/// Verbs alone, or (`shm`) shared memory first, then verbs; with
/// `fake_gpu`, a fake-device GPU rank's CUDA IPC before them all.
fn transports(config: VerbsConfig, shm: bool, fake_gpu: bool) -> Transports {
    let host: Transports = Arc::new(move || {
        let mut ts: Vec<Box<dyn Transport>> = Vec::new();
        if shm {
            ts.push(Box::new(ShmTransport::new()));
        }
        ts.push(Box::new(VerbsTransport::new(config.clone())));
        ts
    });
    if fake_gpu {
        ringcc_cuda::rank::transports(ringcc_cuda::rank::RankDevice::Fake, host)
    } else {
        host
    }
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let args = Args(std::env::args().skip(1).collect());
    let mode = args.0.first().cloned().unwrap_or_else(|| usage("no mode"));
    let mut launch = Launch::from_env().unwrap_or_else(|e| usage(&e.to_string()));
    let rank = launch.rank;
    let mut config = VerbsConfig::from_env().unwrap_or_else(|e| usage(&e.to_string()));
    if mode == "bad-rkey" && rank == Rank(1) {
        config.fault = Some(Fault::CorruptFifoRkey);
    }
    if mode == "stranger" {
        launch.token = "not-the-job-token".into();
    }
    let t0 = Instant::now();
    let comm = Communicator::from_launch(
        launch,
        options(),
        transports(config, args.flag("--shm"), args.flag("--fake-gpu")),
    );
    if mode == "stranger" {
        return stranger(comm);
    }
    let outcome = comm.and_then(|comm| {
        let r = match mode.as_str() {
            "suite" => suite(&comm, &args),
            "bench" => bench(&comm, &args),
            "loop" => run_loop(&comm, &args),
            "mismatch" | "bad-rkey" => fault(&comm, &mode),
            "stall" => stall(&comm, &args),
            other => usage(&format!("unknown mode {other}")),
        };
        // A clean close is part of the run (it sees the last credits
        // out); after a failure the failure is what counts.
        match r {
            Ok(done) => comm.close().map(|()| done),
            Err(e) => Err(e),
        }
    });
    let secs = t0.elapsed().as_secs_f64();
    match outcome {
        Ok(Ok(summary)) => {
            println!("RESULT rank={rank} ok {summary} ({secs:.2}s)");
            ExitCode::SUCCESS
        }
        Ok(Err(wrong)) => {
            println!("RESULT rank={rank} wrong: {wrong}");
            ExitCode::from(1)
        }
        Err(e) => {
            println!("RESULT rank={rank} error after {secs:.2}s: {e}");
            ExitCode::from(2)
        }
    }
}

/// Ok(Ok(summary)) success; Ok(Err(why)) a wrong result; Err a ringcc error.
type Outcome = Result<Result<String, String>, Error>;

/// This rank's hops, as the tests read them: `hops out=verbs in=shm`.
fn hops(comm: &Communicator) -> String {
    match comm.hops().first() {
        Some((out, inc)) => format!("hops out={out} in={inc}"),
        None => "hops none".into(),
    }
}

fn suite(comm: &Communicator, args: &Args) -> Outcome {
    let n = comm.world_size();
    let rank = comm.rank();
    let seed = args.num("--seed", 1);
    let sizes: Vec<u64> = args
        .value("--sizes")
        .unwrap_or("0,1,3,1000,4097,40000")
        .split(',')
        .map(|s| s.parse().unwrap_or_else(|_| usage("--sizes")))
        .collect();
    let mut calls = Vec::new();
    for (ci, coll) in (0..5u32).enumerate() {
        for (k, &count) in sizes.iter().enumerate() {
            let root = Rank((k as u32 + ci as u32) % n);
            let collective = match coll {
                0 => Collective::AllReduce,
                1 => Collective::ReduceScatter,
                2 => Collective::AllGather,
                3 => Collective::Broadcast { root },
                _ => Collective::Reduce { root },
            };
            let (dtype, op) = COMBOS[(k + 3 * ci) % COMBOS.len()];
            calls.push((collective, count, dtype, op));
        }
    }
    // Every type and operation once more through AllReduce.
    let mid = sizes.get(sizes.len() / 2).copied().unwrap_or(100);
    for (dtype, op) in COMBOS {
        calls.push((Collective::AllReduce, mid, dtype, op));
    }
    let in_place = args.flag("--in-place");
    for (i, &(collective, count, dtype, op)) in calls.iter().enumerate() {
        let salt = seed.wrapping_mul(1000).wrapping_add(i as u64);
        let plan = Plan::new(collective, count, dtype, n, 1, 64).expect("reference plan");
        let inp = input(&plan, op, rank.0, salt);
        let call = Call::new(collective, count, dtype, op);
        let what = format!("call {i}: {collective} count {count} {dtype} {op}");
        // Every other call goes through the queue (`submit`: the
        // progress thread runs it), the others block in this thread.
        let queued = i % 2 == 1;
        let (ib, ob) = call.buffer_bytes(n);
        let out = if in_place {
            // One buffer, NCCL's in-place layout.
            let size = usize::from(dtype.size());
            let (io, oo) = call.in_place_offsets(rank.0);
            let (ia, oa) = (io as usize * size, oo as usize * size);
            let mut buf = vec![0xEEu8; ib.max(ob)];
            buf[ia..ia + ib].copy_from_slice(&inp);
            if queued {
                buf = comm.submit_in_place(call, buf)?.wait()?;
            } else {
                comm.run_in_place(&call, &mut buf)?;
            }
            buf[oa..oa + ob].to_vec()
        } else {
            let out = vec![0xEEu8; ob];
            if queued {
                comm.submit(call, inp.clone(), out)?.wait()?.1
            } else {
                let mut out = out;
                comm.run(&call, &inp, &mut out)?;
                out
            }
        };
        match expected(&plan, op, rank.0, salt) {
            Some(want) => {
                if let Some(at) = out.iter().zip(&want).position(|(a, b)| a != b) {
                    return Ok(Err(format!(
                        "{what}: byte {at} is {:#04x}, expected {:#04x}",
                        out[at], want[at]
                    )));
                }
            }
            // Out of place a non-root output is left alone; in place it
            // still holds the input.
            None if in_place => {}
            None => {
                if out.iter().any(|&b| b != 0xEE) {
                    return Ok(Err(format!("{what}: a non-root output was written")));
                }
            }
        }
    }
    Ok(Ok(format!(
        "{} calls{} on {n} ranks, {} channels, {}",
        calls.len(),
        if in_place { " in place" } else { "" },
        comm.options().channels,
        hops(comm)
    )))
}

fn allreduce_buffers(comm: &Communicator, bytes: u64) -> (Vec<f32>, Vec<f32>) {
    let count = (bytes / 4) as usize;
    let v = (comm.rank().0 + 1) as f32;
    (vec![v; count], vec![0.0; count])
}

fn check_sum(comm: &Communicator, out: &[f32]) -> Result<(), String> {
    let n = comm.world_size() as f32;
    let want = n * (n + 1.0) / 2.0;
    match out.iter().position(|&got| got != want) {
        Some(i) => Err(format!("element {i} is {}, expected {want}", out[i])),
        None => Ok(()),
    }
}

fn bench(comm: &Communicator, args: &Args) -> Outcome {
    let bytes = args.num("--bytes", 16 << 20);
    let iters = args.num("--iters", 5).max(1);
    let warmup = args.num("--warmup", 1);
    let (inp, mut out) = allreduce_buffers(comm, bytes);
    for _ in 0..warmup {
        comm.all_reduce(&inp, &mut out, ReduceOp::Sum)?;
    }
    let t0 = Instant::now();
    for _ in 0..iters {
        comm.all_reduce(&inp, &mut out, ReduceOp::Sum)?;
    }
    let t = t0.elapsed().as_secs_f64() / iters as f64;
    if let Err(e) = check_sum(comm, &out) {
        return Ok(Err(e));
    }
    let n = comm.world_size();
    let channels = comm.options().channels;
    let algbw = bytes as f64 / t / 1e6;
    let busbw = algbw * Collective::AllReduce.bus_factor(n);
    let line = format!(
        "bytes={bytes} ranks={n} channels={channels} iters={iters} time_us={:.0} algbw_MBps={algbw:.2} busbw_MBps={busbw:.2}",
        t * 1e6
    );
    if comm.rank() == Rank(0) {
        println!("BENCH allreduce {line}");
        if let Some(path) = args.value("--out") {
            let json = format!(
                "{{\"collective\":\"allreduce\",\"bytes\":{bytes},\"ranks\":{n},\"channels\":{channels},\"iters\":{iters},\"time_us\":{:.1},\"algbw_MBps\":{algbw:.3},\"busbw_MBps\":{busbw:.3}}}\n",
                t * 1e6
            );
            if let Err(e) = std::fs::write(path, json) {
                return Ok(Err(format!("cannot write {path}: {e}")));
            }
        }
    }
    Ok(Ok(line))
}

fn run_loop(comm: &Communicator, args: &Args) -> Outcome {
    let bytes = args.num("--bytes", 1 << 20);
    let limit = Duration::from_secs(args.num("--seconds", 60));
    let (inp, mut out) = allreduce_buffers(comm, bytes);
    let t0 = Instant::now();
    let mut iters = 0u64;
    while t0.elapsed() < limit {
        comm.all_reduce(&inp, &mut out, ReduceOp::Sum)?;
        iters += 1;
        if iters == 1 {
            println!("READY rank={}", comm.rank());
            let _ = std::io::stdout().flush();
        }
    }
    Ok(Ok(format!("{iters} iterations")))
}

fn fault(comm: &Communicator, mode: &str) -> Outcome {
    let count = if mode == "mismatch" && comm.rank() == Rank(1) {
        1030
    } else {
        1024
    };
    let inp = vec![1u32; count];
    let mut out = vec![0u32; count];
    // A healthy call first, then the faulty one.
    if mode == "mismatch" {
        let (i, mut o) = (vec![0u32; 16], vec![0u32; 16]);
        comm.all_reduce(&i, &mut o, ReduceOp::Sum)?;
    }
    comm.all_reduce(&inp, &mut out, ReduceOp::Sum)?;
    Ok(Err(format!("{mode}: the faulty call succeeded")))
}

/// A healthy call, then rank 1 stays away for `--seconds` (default 8)
/// before the second: the others' engines time out and report what their
/// channels wait for; rank 1 then finds the job aborted.
fn stall(comm: &Communicator, args: &Args) -> Outcome {
    let inp = vec![1u32; 1024];
    let mut out = vec![0u32; 1024];
    comm.all_reduce(&inp, &mut out, ReduceOp::Sum)?;
    if comm.rank() == Rank(1) {
        std::thread::sleep(Duration::from_secs(args.num("--seconds", 8)));
    }
    comm.all_reduce(&inp, &mut out, ReduceOp::Sum)?;
    Ok(Err("stall: the late call succeeded".into()))
}

fn stranger(comm: Result<Communicator, Error>) -> ExitCode {
    match comm {
        Err(Error::Stranger { reason, .. }) => {
            println!("RESULT rank=stranger ok rejected: {reason}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            println!("RESULT rank=stranger wrong: unexpected error {e}");
            ExitCode::from(1)
        }
        Ok(_) => {
            println!("RESULT rank=stranger wrong: a wrong token was accepted");
            ExitCode::from(1)
        }
    }
}
