//! GPU tests: every collective, type and op on 2, 4 and 8 ranks sharing
//! GPU 0 (and across GPUs where there are several), checked against the
//! core's reference (`ringcc_core::verify`, through `perf::verify`), in
//! both launch modes — the device loop and one launch per slice — whose
//! outputs must also be equal byte for byte. Run with `cargo test -p
//! ringcc-cuda --test gpu -- --ignored` where `nvidia-smi` finds a GPU
//! (`scripts/gpu-tests.sh`).

use cudarc::driver::CudaSlice;
use half::bf16;
use ringcc_core::{Collective, DataType, Rank, ReduceOp};
use ringcc_cuda::perf::{verify, verify_corrupted, PerfCase};
use ringcc_cuda::{driver, Call, Comm, Config, Error, LaunchMode};

fn case(
    collective: Collective,
    dtype: DataType,
    op: ReduceOp,
    count: u64,
    in_place: bool,
) -> PerfCase {
    PerfCase {
        call: Call::new(collective, count, dtype, op),
        in_place,
        warmup: 0,
        iters: 1,
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

/// Every collective × type × op, out of place, plus in place for each
/// collective, on `ordinals`.
fn sweep(ordinals: &[usize], config: Config) {
    let n = ordinals.len() as u32;
    let mut comm = Comm::init_all(ordinals, config).unwrap();
    // The device loop runs wherever it was asked for on one GPU.
    if ordinals.iter().all(|&o| o == ordinals[0]) {
        assert_eq!(comm.launch_mode(), config.launch, "{ordinals:?}");
    }
    let mut runs = 0;
    for c in collectives(n) {
        for dtype in DataType::ALL {
            let ops: &[ReduceOp] = if c.reduces() {
                &ReduceOp::ALL
            } else {
                &[ReduceOp::Sum]
            };
            for &op in ops {
                // An odd count: vector loop, scalar tail, uneven chunks.
                let wrong = verify(&mut comm, &case(c, dtype, op, 2053, false)).unwrap();
                assert_eq!(wrong, 0, "{c} {dtype} {op} on {ordinals:?}");
                runs += 1;
            }
        }
        let wrong = verify(
            &mut comm,
            &case(c, DataType::F32, ReduceOp::Sum, 3001, true),
        )
        .unwrap();
        assert_eq!(wrong, 0, "{c} in place on {ordinals:?}");
        // The check can fail: corrupted elements are each counted.
        for in_place in [false, true] {
            let wrong = verify_corrupted(
                &mut comm,
                &case(c, DataType::F32, ReduceOp::Sum, 3001, in_place),
                3,
            )
            .unwrap();
            assert_eq!(
                wrong, 3,
                "{c} corrupted, in place {in_place}, on {ordinals:?}"
            );
        }
    }
    assert_eq!(runs, 3 * 50 + 2 * 10);
}

fn with_launch(config: Config, launch: LaunchMode) -> Config {
    Config { launch, ..config }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn all_collectives_types_ops_2_4_8_ranks_on_one_gpu() {
    for launch in [LaunchMode::Persistent, LaunchMode::Slice] {
        for n in [2usize, 4, 8] {
            sweep(
                &vec![0; n],
                with_launch(Config::small(2048, 2).unwrap(), launch),
            );
        }
    }
}

/// Every rank's output of one call, read back, on a fresh communicator
/// in `launch` mode.
fn outputs(n: usize, config: Config, call: Call) -> Vec<Vec<u8>> {
    let mut comm = Comm::init_all(&vec![0; n], config).unwrap();
    assert_eq!(comm.launch_mode(), config.launch);
    let plan = call
        .plan(n as u32, u32::from(config.channels), config.chunk_bytes)
        .unwrap();
    let e = usize::from(call.dtype.size());
    let mut send = Vec::new();
    let mut recv = Vec::new();
    for r in 0..n {
        let s = comm.stream(Rank(r as u32)).unwrap().clone();
        let mut input = vec![0u8; plan.input_len() as usize * e];
        ringcc_core::verify::fill_input(&plan, call.op, r as u32, 77, &mut input).unwrap();
        send.push(s.clone_htod(&input).unwrap());
        recv.push(s.alloc_zeros::<u8>(plan.output_len() as usize * e).unwrap());
    }
    {
        let mut g = comm.group();
        for (r, (s, d)) in send.iter().zip(recv.iter_mut()).enumerate() {
            g.raw(Rank(r as u32), call, s, d).unwrap();
        }
        g.launch().unwrap();
    }
    comm.synchronize().unwrap();
    let out = (0..n)
        .map(|r| {
            comm.stream(Rank(r as u32))
                .unwrap()
                .clone_dtoh(&recv[r])
                .unwrap()
        })
        .collect();
    comm.close().unwrap();
    out
}

/// The device loop and one launch per slice run the same schedule with
/// the same kernels: their outputs are equal byte for byte (floats too:
/// the reduction order is the plan's in both).
#[test]
#[ignore = "needs a CUDA GPU"]
fn both_launch_modes_give_the_same_bytes() {
    for n in [2usize, 3, 4] {
        for (c, dtype, op) in [
            (Collective::AllReduce, DataType::F32, ReduceOp::Sum),
            (Collective::AllReduce, DataType::Bf16, ReduceOp::Avg),
            (Collective::ReduceScatter, DataType::F16, ReduceOp::Sum),
            (Collective::AllGather, DataType::I8, ReduceOp::Sum),
            (
                Collective::Broadcast { root: Rank(1) },
                DataType::F64,
                ReduceOp::Sum,
            ),
            (
                Collective::Reduce { root: Rank(0) },
                DataType::F32,
                ReduceOp::Prod,
            ),
        ] {
            let call = Call::new(c, 100_003, dtype, op);
            for config in [Config::small(4096, 3).unwrap(), Config::default()] {
                let a = outputs(n, with_launch(config, LaunchMode::Persistent), call);
                let b = outputs(n, with_launch(config, LaunchMode::Slice), call);
                for r in 0..n {
                    if matches!(c, Collective::Reduce { root } if root.0 != r as u32) {
                        continue;
                    }
                    assert!(
                        a[r] == b[r],
                        "{c} {dtype} {op} rank {r} of {n}: modes differ"
                    );
                }
            }
        }
    }
}

/// Many small calls in a row on the device loop (counters carried from
/// call to call on the device), then a short synchronize deadline on a
/// large call: the host aborts the loops, reports a timeout, and the
/// communicator is refused afterwards — no hang, no fault.
#[test]
#[ignore = "needs a CUDA GPU"]
fn device_loop_many_calls_then_abort() {
    let config = with_launch(Config::small(1024, 4).unwrap(), LaunchMode::Persistent);
    let mut comm = Comm::init_all(&[0; 4], config).unwrap();
    assert_eq!(comm.launch_mode(), LaunchMode::Persistent);
    for i in 0..200u64 {
        let wrong = verify(
            &mut comm,
            &case(
                Collective::AllReduce,
                DataType::F32,
                ReduceOp::Sum,
                1 + i * 37,
                false,
            ),
        )
        .unwrap();
        assert_eq!(wrong, 0, "call {i}");
    }
    let config = Config {
        timeout: std::time::Duration::from_micros(1),
        ..with_launch(Config::default(), LaunchMode::Persistent)
    };
    let mut comm = Comm::init_all(&[0; 2], config).unwrap();
    match verify(
        &mut comm,
        &case(
            Collective::AllReduce,
            DataType::F32,
            ReduceOp::Sum,
            16 << 20,
            false,
        ),
    ) {
        Err(Error::Timeout { .. }) => {}
        other => eprintln!("a 1 us deadline on 64 MiB did not time out: {other:?}"),
    }
    drop(comm);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn nccl_geometry_large_buffers() {
    let mut comm = Comm::init_all(&[0; 4], Config::default()).unwrap();
    for (c, dtype) in [
        (Collective::AllReduce, DataType::Bf16),
        (Collective::AllReduce, DataType::F32),
        (Collective::ReduceScatter, DataType::F16),
        (Collective::AllGather, DataType::I8),
    ] {
        let wrong = verify(&mut comm, &case(c, dtype, ReduceOp::Sum, 5 << 20, false)).unwrap();
        assert_eq!(wrong, 0, "{c} {dtype}");
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn typed_api_and_many_calls_in_a_row() {
    let n = 3;
    let mut comm = Comm::init_all(&[0; 3], Config::small(1024, 3).unwrap()).unwrap();
    let count = 10_000;
    for iter in 0..5 {
        let mut send = Vec::new();
        let mut recv: Vec<CudaSlice<f32>> = Vec::new();
        for r in 0..n {
            let s = comm.stream(Rank(r)).unwrap().clone();
            let host: Vec<f32> = (0..count)
                .map(|i| ((i * (r as usize + 1) + iter) % 7) as f32)
                .collect();
            send.push(s.clone_htod(&host).unwrap());
            recv.push(s.alloc_zeros::<f32>(count).unwrap());
        }
        comm.all_reduce(&send, &mut recv, ReduceOp::Sum).unwrap();
        comm.synchronize().unwrap();
        for r in 0..n {
            let got = comm
                .stream(Rank(r))
                .unwrap()
                .clone_dtoh(&recv[r as usize])
                .unwrap();
            for (i, g) in got.iter().enumerate() {
                let want: f32 = (0..n)
                    .map(|q| ((i * (q as usize + 1) + iter) % 7) as f32)
                    .sum();
                assert_eq!(*g, want, "iter {iter} rank {r} elem {i}");
            }
        }
    }
    // bf16 in place, through the group API.
    let mut bufs: Vec<CudaSlice<bf16>> = (0..n)
        .map(|r| {
            let s = comm.stream(Rank(r)).unwrap().clone();
            s.clone_htod(&vec![bf16::from_f32(r as f32 + 1.0); 777])
                .unwrap()
        })
        .collect();
    comm.in_place(&mut bufs, Collective::AllReduce, 777, ReduceOp::Avg)
        .unwrap();
    comm.synchronize().unwrap();
    let got = comm.stream(Rank(2)).unwrap().clone_dtoh(&bufs[2]).unwrap();
    assert!(got.iter().all(|&v| v == bf16::from_f32(2.0)));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn mismatched_calls_and_bad_buffers_are_typed_errors() {
    let mut comm = Comm::init_all(&[0, 0], Config::small(1024, 1).unwrap()).unwrap();
    let s0 = comm.stream(Rank(0)).unwrap().clone();
    let s1 = comm.stream(Rank(1)).unwrap().clone();
    let a = s0.alloc_zeros::<f32>(100).unwrap();
    let b = s1.alloc_zeros::<f32>(100).unwrap();
    let mut ra = s0.alloc_zeros::<f32>(100).unwrap();
    let mut rb = s1.alloc_zeros::<f32>(50).unwrap();
    {
        let mut g = comm.group();
        g.all_reduce(Rank(0), &a, &mut ra, ReduceOp::Sum).unwrap();
        assert!(matches!(
            g.all_reduce(Rank(1), &b, &mut rb, ReduceOp::Sum),
            Err(Error::BadBuffer { rank: Rank(1), .. })
        ));
        assert!(matches!(
            g.launch(),
            Err(Error::MissingRank { rank: Rank(1) })
        ));
    }
    let mut rb = s1.alloc_zeros::<f32>(100).unwrap();
    let mut g = comm.group();
    g.all_reduce(Rank(0), &a, &mut ra, ReduceOp::Sum).unwrap();
    g.all_reduce(Rank(1), &b, &mut rb, ReduceOp::Max).unwrap();
    let cause = match g.launch() {
        Err(
            e @ Error::Core {
                channel: Some(_),
                source: ringcc_core::Error::MismatchedCall { .. },
                ..
            },
        ) => e.to_string(),
        other => panic!("expected MismatchedCall, got {other:?}"),
    };
    comm.synchronize().unwrap();
    // Closing reports the poisoned communicator (a drop could only log).
    match comm.close() {
        Err(Error::Poisoned { cause: c }) => assert_eq!(c, cause),
        other => panic!("expected Poisoned from close, got {other:?}"),
    }
    let comm = Comm::init_all(&[0, 0], Config::small(1024, 1).unwrap()).unwrap();
    comm.close().unwrap();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn several_gpus_peer_and_staged() {
    let count = driver::device_count().unwrap();
    if count < 2 {
        eprintln!("only {count} GPU: the multi-GPU test needs 2 or more (skipped)");
        return;
    }
    let ordinals: Vec<usize> = (0..count.min(8)).collect();
    sweep(&ordinals, Config::small(4096, 2).unwrap());
    let staged = Config {
        peer_access: false,
        ..Config::small(4096, 2).unwrap()
    };
    let mut comm = Comm::init_all(&ordinals, staged).unwrap();
    for c in collectives(ordinals.len() as u32) {
        assert_eq!(
            verify(
                &mut comm,
                &case(c, DataType::F16, ReduceOp::Sum, 70_001, false)
            )
            .unwrap(),
            0
        );
    }
}

// ---------------------------------------------------------------------
// One rank per process (GpuRank: the device loop, CUDA IPC between the
// processes), all on GPU 0: the test binary re-executes itself once per
// rank (`gpu_rank_child`, which does nothing when run directly); the
// parent serves the job's TCP store.

mod processes {
    use std::net::{IpAddr, Ipv4Addr, SocketAddr};
    use std::process::{Command, Stdio};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use ringcc_comm::store::tcp::{TcpStore, TcpStoreServer};
    use ringcc_comm::store::{PrefixStore, Store};
    use ringcc_core::verify;
    use ringcc_core::{Call, Collective, DataType, Rank, ReduceOp};
    use ringcc_cuda::device_loop::peers::NodeNet;
    use ringcc_cuda::{Config, GpuRank};

    const ROLE: &str = "RINGCC_GPU_TEST_RANK";
    const RANKS: &str = "RINGCC_GPU_TEST_RANKS";
    const TOKEN: &str = "RINGCC_GPU_TEST_TOKEN";
    const STORE: &str = "RINGCC_GPU_TEST_STORE";
    const BW: &str = "RINGCC_GPU_TEST_BW";
    const NODES: &str = "RINGCC_GPU_TEST_NODES";

    /// Starts `ranks` processes on GPU 0 and waits (at most 4 minutes);
    /// every one must print `RESULT ok`. Their `RESULT name=` lines (the
    /// bandwidth) are printed for scripts/gpu-check.sh.
    pub fn job(ranks: u32, bandwidth: bool) {
        job_on(ranks, bandwidth, false)
    }

    /// [`job`] with the ranks on two "nodes" (the first half on one) when
    /// `nodes`: CUDA IPC inside each, TCP between them through each
    /// rank's proxy and pinned host staging.
    pub fn job_on(ranks: u32, bandwidth: bool, nodes: bool) {
        let t = format!("gpu-ranks-{}", std::process::id());
        let server = TcpStoreServer::start(
            SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0),
            &t,
            ranks,
        )
        .expect("serve the store");
        let addr = server.local_addr().to_string();
        let exe = std::env::current_exe().unwrap();
        let mut children: Vec<_> = (0..ranks)
            .map(|r| {
                Command::new(&exe)
                    .args([
                        "--exact",
                        "processes::gpu_rank_child",
                        "--ignored",
                        "--nocapture",
                    ])
                    .env(ROLE, r.to_string())
                    .env(RANKS, ranks.to_string())
                    .env(TOKEN, &t)
                    .env(STORE, &addr)
                    .env(BW, if bandwidth { "1" } else { "0" })
                    .env(NODES, if nodes { "1" } else { "0" })
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .expect("spawn a rank")
            })
            .collect();
        let t0 = Instant::now();
        while children
            .iter_mut()
            .any(|c| matches!(c.try_wait(), Ok(None)))
            && t0.elapsed() < Duration::from_secs(240)
        {
            std::thread::sleep(Duration::from_millis(20));
        }
        let mut failed = Vec::new();
        for (r, c) in children.iter_mut().enumerate() {
            let _ = c.kill();
            let st = c.wait().unwrap();
            let mut out = String::new();
            if let Some(mut s) = c.stdout.take() {
                let _ = std::io::Read::read_to_string(&mut s, &mut out);
            }
            if let Some(mut s) = c.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut s, &mut out);
            }
            for l in out.lines().filter(|l| l.starts_with("RESULT name=")) {
                println!("{l}");
            }
            if st.code() != Some(0) || !out.contains("RESULT ok") {
                failed.push(format!("rank {r} ({st}): {out}"));
            }
        }
        drop(server);
        assert!(failed.is_empty(), "{}", failed.join("\n"));
    }

    fn collectives(n: u32) -> Vec<Collective> {
        super::collectives(n)
    }

    /// Every collective × type × op (odd counts) on this rank, checked
    /// against the core's reference.
    fn sweep(store: Arc<dyn Store>, rank: u32, ranks: u32) -> Result<usize, String> {
        let config = Config::small(1024, 2).map_err(|e| e.to_string())?;
        let net = (std::env::var(NODES).as_deref() == Ok("1")).then(|| NodeNet {
            token: std::env::var(TOKEN).unwrap_or_default(),
            node: if rank < ranks / 2 { "a" } else { "b" }.to_owned(),
            transports: ringcc_host::transports(IpAddr::V4(Ipv4Addr::LOCALHOST), config.timeout)()
                .into_iter()
                .filter(|t| t.name() == "tcp")
                .collect(),
            chunk_bytes: config.chunk_bytes,
            banner: true,
            fifos_apart: false,
        });
        let mut g = GpuRank::init_on_nodes(0, Rank(rank), ranks, store, config, net)
            .map_err(|e| e.to_string())?;
        let s = g.stream().clone();
        let mut runs = 0;
        for c in collectives(ranks) {
            for dtype in DataType::ALL {
                let ops: &[ReduceOp] = if c.reduces() {
                    &ReduceOp::ALL
                } else {
                    &[ReduceOp::Sum]
                };
                for &op in ops {
                    let call = Call::new(c, 2053, dtype, op);
                    let salt = runs as u64 + 1;
                    let plan = call.plan(ranks, 1, 1 << 20).unwrap();
                    let (ib, ob) = call.buffer_bytes(ranks);
                    let mut input = vec![0u8; ib];
                    verify::fill_input(&plan, op, rank, salt, &mut input).unwrap();
                    let mut want = vec![0u8; ob];
                    let exact = verify::fill_expected(&plan, op, rank, 0, salt, &mut want).unwrap();
                    let send = s.clone_htod(&input).map_err(|e| e.to_string())?;
                    let mut recv = s.alloc_zeros::<u8>(ob.max(1)).map_err(|e| e.to_string())?;
                    g.raw(call, &send, &mut recv)
                        .map_err(|e| format!("{call:?}: {e}"))?;
                    g.synchronize().map_err(|e| format!("{call:?}: {e}"))?;
                    let got = s.clone_dtoh(&recv).map_err(|e| e.to_string())?;
                    if exact {
                        let wrong = verify::count_diff(&want, &got[..ob], call.elem());
                        if wrong != 0 {
                            return Err(format!("{call:?}: {wrong} wrong"));
                        }
                    }
                    runs += 1;
                }
            }
        }
        // In place (NCCL's layout), one odd count per collective.
        for c in collectives(ranks) {
            let call = Call::new(c, 3001, DataType::F32, ReduceOp::Sum);
            let salt = runs as u64 + 1;
            let plan = call.plan(ranks, 1, 1 << 20).unwrap();
            let (ib, ob) = call.buffer_bytes(ranks);
            let e = call.elem();
            let (io, oo) = call.in_place_offsets(rank);
            let mut host = vec![
                0u8;
                ib.max(ob)
                    .max(io as usize * e + ib)
                    .max(oo as usize * e + ob)
            ];
            verify::fill_input(
                &plan,
                call.op,
                rank,
                salt,
                &mut host[io as usize * e..][..ib],
            )
            .unwrap();
            let mut want = vec![0u8; ob];
            let exact = verify::fill_expected(&plan, call.op, rank, 0, salt, &mut want).unwrap();
            let mut buf = s.clone_htod(&host).map_err(|e| e.to_string())?;
            g.raw_in_place(call, &mut buf)
                .map_err(|e| format!("{call:?} in place: {e}"))?;
            g.synchronize()
                .map_err(|e| format!("{call:?} in place: {e}"))?;
            let got = s.clone_dtoh(&buf).map_err(|e| e.to_string())?;
            if exact {
                let wrong = verify::count_diff(&want, &got[oo as usize * e..][..ob], e);
                if wrong != 0 {
                    return Err(format!("{call:?} in place: {wrong} wrong"));
                }
            }
            runs += 1;
        }
        let (recv_next, send_next) = g.link_state(0).map_err(|e| e.to_string())?;
        if recv_next == 0 || send_next == 0 {
            return Err(format!(
                "link state ({recv_next}, {send_next}) after {runs} calls"
            ));
        }
        g.close().map_err(|e| e.to_string())?;
        Ok(runs)
    }

    /// `GpuRank::split` by parity (key: reversed rank, so the halves'
    /// ranks are reversed too) and an AllReduce in each half, checked.
    fn split(store: Arc<dyn Store>, rank: u32) -> Result<(), String> {
        let config = Config::small(1024, 2).map_err(|e| e.to_string())?;
        let mut g = GpuRank::init(0, Rank(rank), 4, store, config).map_err(|e| e.to_string())?;
        let mut half = g
            .split(Some(rank % 2), 10 - rank)
            .map_err(|e| e.to_string())?
            .ok_or("no group")?;
        if (half.rank().0, half.world_size()) != (1 - rank / 2, 2) {
            return Err(format!("rank {rank}: split rank {:?}", half.rank()));
        }
        let s = half.stream().clone();
        let x = s
            .clone_htod(&vec![rank as f32 + 1.0; 1000])
            .map_err(|e| e.to_string())?;
        let mut y = s.alloc_zeros::<f32>(1000).map_err(|e| e.to_string())?;
        half.all_reduce(&x, &mut y, ReduceOp::Sum)
            .map_err(|e| e.to_string())?;
        half.synchronize().map_err(|e| e.to_string())?;
        let got = s.clone_dtoh(&y).map_err(|e| e.to_string())?;
        let want = if rank.is_multiple_of(2) {
            1.0 + 3.0
        } else {
            2.0 + 4.0
        };
        if got.iter().any(|&v| v != want) {
            return Err(format!("rank {rank}: split all_reduce gave {}", got[0]));
        }
        half.close().map_err(|e| e.to_string())?;
        g.close().map_err(|e| e.to_string())
    }

    /// AllReduce f32 busbw at 64 MiB … 1 GiB with NCCL's geometry.
    fn bandwidth(store: Arc<dyn Store>, rank: u32, ranks: u32) -> Result<(), String> {
        let config = Config::default();
        let mut g =
            GpuRank::init(0, Rank(rank), ranks, store, config).map_err(|e| e.to_string())?;
        let s = g.stream().clone();
        for mib in [64usize, 256, 1024] {
            let count = mib << 18;
            let send = s.alloc_zeros::<f32>(count).map_err(|e| e.to_string())?;
            let mut recv = s.alloc_zeros::<f32>(count).map_err(|e| e.to_string())?;
            g.all_reduce(&send, &mut recv, ReduceOp::Sum)
                .map_err(|e| e.to_string())?;
            g.synchronize().map_err(|e| e.to_string())?;
            let iters = 5;
            let t0 = Instant::now();
            for _ in 0..iters {
                g.all_reduce(&send, &mut recv, ReduceOp::Sum)
                    .map_err(|e| e.to_string())?;
            }
            g.synchronize().map_err(|e| e.to_string())?;
            let secs = t0.elapsed().as_secs_f64() / f64::from(iters);
            let bytes = (count * 4) as f64;
            let busbw = bytes * 2.0 * f64::from(ranks - 1) / f64::from(ranks) / secs / 1e9;
            if rank == 0 {
                println!(
                    "RESULT name=ipc_allreduce_{ranks}p_{mib}MiB time_us={:.1} busbw={busbw:.1}",
                    secs * 1e6
                );
            }
        }
        g.close().map_err(|e| e.to_string())
    }

    /// A rank process of `job` (does nothing when run directly).
    #[test]
    #[ignore = "a rank process of the multi-process GPU tests"]
    fn gpu_rank_child() {
        let Ok(rank) = std::env::var(ROLE) else {
            return;
        };
        let var = |k: &str| std::env::var(k).unwrap();
        let (rank, ranks): (u32, u32) = (rank.parse().unwrap(), var(RANKS).parse().unwrap());
        let store: Arc<dyn Store> = Arc::new(
            TcpStore::connect(
                &var(STORE),
                &var(TOKEN),
                Rank(rank),
                ranks,
                Duration::from_secs(60),
            )
            .unwrap(),
        );
        let r = sweep(
            Arc::new(PrefixStore::new(store.clone(), "sweep/")),
            rank,
            ranks,
        )
        .and_then(|runs| {
            if ranks == 4 && var(NODES) != "1" {
                split(Arc::new(PrefixStore::new(store.clone(), "split/")), rank)?;
            }
            if var(BW) == "1" {
                bandwidth(
                    Arc::new(PrefixStore::new(store.clone(), "bw/")),
                    rank,
                    ranks,
                )?;
            }
            Ok(runs)
        });
        match r {
            Ok(runs) => println!("RESULT ok {runs} calls checked"),
            Err(e) => {
                println!("RESULT error {e}");
                std::process::exit(2);
            }
        }
    }

    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn two_processes_share_gpu0_over_ipc_with_busbw() {
        job(2, true);
    }

    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn four_processes_share_gpu0_over_ipc() {
        job(4, false);
    }

    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn four_processes_on_two_nodes_share_gpu0_ipc_inside_tcp_between() {
        job_on(4, false, true);
    }
}
