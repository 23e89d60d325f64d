//! Bandwidth of the fused kernels on GPU 0, next to a device-to-device
//! copy of the same bytes measured in the same run, as ratios; then
//! AllReduce on 2, 4 and 8 ranks sharing the GPU (nccl-tests' busbw);
//! then AllReduce with the device loop (one launch per rank and call) and
//! with one launch per slice, side by side (`launch_*` lines, `mode=`).
//!
//! `cargo bench -p ringcc-cuda --bench fused_bw`. Prints `SKIPPED` and
//! exits 0 without a GPU. Each result is one line starting `RESULT` (and
//! a JSON line in `$RINGCC_BW_OUT` when set). Size per buffer:
//! `$RINGCC_BW_BYTES` (default 256 MiB).

use std::io::Write;
use std::sync::Arc;

use cudarc::driver::{sys, CudaContext, CudaSlice, CudaStream};
use ringcc_core::{DataType, Primitive, ReduceOp};
use ringcc_cuda::fused::FusedModule;
use ringcc_cuda::kernel::ModuleKey;
use ringcc_cuda::perf::{run, PerfCase};
use ringcc_cuda::{driver, Call, Comm, Config, Error, LaunchMode};

const WARMUP: usize = 3;
const ITERS: usize = 20;

struct Out(Option<std::fs::File>);

impl Out {
    fn json(&mut self, line: &str) {
        if let Some(f) = &mut self.0 {
            let _ = writeln!(f, "{line}");
        }
    }

    fn result(&mut self, name: &str, bytes: u64, traffic: u64, secs: f64, ratio: Option<f64>) {
        let gbps = traffic as f64 / secs / 1e9;
        let ratio_s = ratio
            .map(|r| format!(" ratio_to_copy={r:.3}"))
            .unwrap_or_default();
        println!(
            "RESULT name={name} bytes={bytes} traffic_bytes={traffic} time_us={:.2} gbps={gbps:.1}{ratio_s}",
            secs * 1e6
        );
        if let Some(f) = &mut self.0 {
            let ratio_j = ratio
                .map(|r| format!(",\"ratio_to_copy\":{r:.4}"))
                .unwrap_or_default();
            let _ = writeln!(
                f,
                "{{\"name\":\"{name}\",\"bytes\":{bytes},\"traffic_bytes\":{traffic},\"time_us\":{:.3},\"gbps\":{gbps:.2}{ratio_j}}}",
                secs * 1e6
            );
        }
    }
}

/// Mean seconds of `f` over `ITERS` runs, timed with events on `stream`.
fn time(
    ctx: &Arc<CudaContext>,
    stream: &Arc<CudaStream>,
    mut f: impl FnMut() -> Result<(), Error>,
) -> Result<f64, Error> {
    for _ in 0..WARMUP {
        f()?;
    }
    let flags = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
    let start = ctx.new_event(flags).map_err(|e| Error::Driver {
        call: "cuEventCreate",
        source: e,
    })?;
    let end = ctx.new_event(flags).map_err(|e| Error::Driver {
        call: "cuEventCreate",
        source: e,
    })?;
    start.record(stream).map_err(|e| Error::Driver {
        call: "cuEventRecord",
        source: e,
    })?;
    for _ in 0..ITERS {
        f()?;
    }
    end.record(stream).map_err(|e| Error::Driver {
        call: "cuEventRecord",
        source: e,
    })?;
    let ms = start.elapsed_ms(&end).map_err(|e| Error::Driver {
        call: "cuEventElapsedTime",
        source: e,
    })?;
    Ok(f64::from(ms) / 1e3 / ITERS as f64)
}

fn kernels(out: &mut Out, bytes: u64) -> Result<(), Error> {
    let ctx = driver::context(0)?;
    let stream = ctx.new_stream().map_err(|e| Error::Driver {
        call: "cuStreamCreate",
        source: e,
    })?;
    println!("device 0: {}", ctx.name().unwrap_or_default());
    let n = bytes as usize;
    let alloc = |s: &Arc<CudaStream>| -> Result<CudaSlice<u8>, Error> {
        s.alloc_zeros::<u8>(n).map_err(|e| Error::Driver {
            call: "cuMemAlloc",
            source: e,
        })
    };
    let (a, b) = (alloc(&stream)?, alloc(&stream)?);
    let (mut c, mut d) = (alloc(&stream)?, alloc(&stream)?);
    for size in [bytes, 1 << 20] {
        let copy = time(&ctx, &stream, || {
            stream
                .memcpy_dtod(&a.slice(..size as usize), &mut c.slice_mut(..size as usize))
                .map_err(|e| Error::Driver {
                    call: "cuMemcpyDtoDAsync",
                    source: e,
                })
        })?;
        let copy_bw = 2.0 * size as f64 / copy;
        out.result(
            &format!("memcpy_dtod_{size}"),
            size,
            2 * size,
            copy,
            Some(1.0),
        );
        for dtype in [DataType::F32, DataType::Bf16] {
            let m = FusedModule::load(
                &ctx,
                ModuleKey {
                    dtype,
                    op: ReduceOp::Sum,
                },
                8,
            )?;
            let count = size / u64::from(dtype.size());
            for p in [
                Primitive::RECV_REDUCE_SEND,
                Primitive::RECV_REDUCE_COPY_SEND,
                Primitive::RECV_COPY_SEND,
                Primitive::COPY_SEND,
            ] {
                let secs = time(&ctx, &stream, || {
                    m.launch(
                        &stream,
                        p,
                        p.contains(Primitive::RECV).then_some(&a),
                        p.reads_input().then_some(&b),
                        if p.contains(Primitive::COPY) {
                            Some(&mut c)
                        } else {
                            None
                        },
                        if p.contains(Primitive::SEND) {
                            Some(&mut d)
                        } else {
                            None
                        },
                        count,
                        2,
                    )
                })?;
                let reads = u64::from(p.contains(Primitive::RECV)) + u64::from(p.reads_input());
                let writes =
                    u64::from(p.contains(Primitive::COPY)) + u64::from(p.contains(Primitive::SEND));
                let traffic = (reads + writes) * size;
                let bw = traffic as f64 / secs;
                out.result(
                    &format!("{}_{}_{size}", p.name(), dtype.name()),
                    size,
                    traffic,
                    secs,
                    Some(bw / copy_bw),
                );
            }
        }
    }
    Ok(())
}

fn collectives(out: &mut Out) -> Result<(), Error> {
    for n in [2usize, 4, 8] {
        let mut comm = Comm::init_all(&vec![0; n], Config::default())?;
        let case = PerfCase {
            call: Call::all_reduce(16 << 20, DataType::F32, ReduceOp::Sum),
            in_place: false,
            warmup: 2,
            iters: 5,
        };
        let r = run(&mut comm, &case)?;
        println!(
            "RESULT name=allreduce_f32_{n}ranks_1gpu bytes={} time_us={:.1} algbw={:.1} busbw={:.1} wrong={} mode={}",
            r.bytes, r.time_us, r.algbw, r.busbw, r.wrong, comm.launch_mode()
        );
        out.json(&format!(
            "{{\"name\":\"allreduce_f32_{n}ranks_1gpu\",\"bytes\":{},\"time_us\":{:.2},\"algbw\":{:.2},\"busbw\":{:.2},\"wrong\":{}}}",
            r.bytes, r.time_us, r.algbw, r.busbw, r.wrong
        ));
        if r.wrong != 0 {
            return Err(Error::BadConfig {
                what: "allreduce produced wrong results",
            });
        }
    }
    Ok(())
}

/// AllReduce f32 on ranks sharing GPU 0, the device loop next to one
/// launch per slice: same sizes, channels and geometry, one run.
fn launch_modes(out: &mut Out) -> Result<(), Error> {
    for n in [2usize, 4] {
        for channels in [2u8, 16] {
            for bytes in [1u64 << 20, 64 << 20] {
                for mode in [LaunchMode::Persistent, LaunchMode::Slice] {
                    let config = Config {
                        channels,
                        launch: mode,
                        ..Config::default()
                    };
                    let mut comm = Comm::init_all(&vec![0; n], config)?;
                    let case = PerfCase {
                        call: Call::all_reduce(bytes / 4, DataType::F32, ReduceOp::Sum),
                        in_place: false,
                        warmup: 3,
                        iters: 10,
                    };
                    let r = run(&mut comm, &case)?;
                    let name = format!("launch_allreduce_f32_{n}r_{channels}ch_{bytes}_{mode}");
                    println!(
                        "RESULT name={name} bytes={} time_us={:.1} algbw={:.1} busbw={:.1} wrong={} mode={}",
                        r.bytes, r.time_us, r.algbw, r.busbw, r.wrong, comm.launch_mode()
                    );
                    out.json(&format!(
                        "{{\"name\":\"{name}\",\"bytes\":{},\"time_us\":{:.2},\"algbw\":{:.2},\"busbw\":{:.2},\"wrong\":{},\"mode\":\"{}\"}}",
                        r.bytes, r.time_us, r.algbw, r.busbw, r.wrong, comm.launch_mode()
                    ));
                    if r.wrong != 0 {
                        return Err(Error::BadConfig {
                            what: "allreduce produced wrong results",
                        });
                    }
                }
            }
        }
    }
    Ok(())
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    match driver::device_count() {
        Ok(n) if n > 0 => {}
        Ok(_) | Err(Error::NoDriver) => {
            println!("SKIPPED: no CUDA GPU (no driver or no device)");
            return;
        }
        Err(e) => {
            println!("SKIPPED: CUDA driver unusable: {e}");
            return;
        }
    }
    let bytes = std::env::var("RINGCC_BW_BYTES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256u64 << 20);
    let mut out =
        Out(std::env::var_os("RINGCC_BW_OUT").and_then(|p| std::fs::File::create(p).ok()));
    if let Err(e) = kernels(&mut out, bytes)
        .and_then(|()| collectives(&mut out))
        .and_then(|()| launch_modes(&mut out))
    {
        eprintln!("fused_bw failed: {e}");
        std::process::exit(1);
    }
}
