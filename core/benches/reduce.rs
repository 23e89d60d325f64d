//! Reduction kernel bandwidth next to a plain copy of the same bytes,
//! measured in the same run, reported as a ratio.
//!
//! `cargo bench -p ringcc-core --bench reduce`
//!
//! Bytes counted are bytes of memory traffic: an in-place reduce of S bytes
//! reads 2·S and writes S (3·S); a copy reads S and writes S (2·S). The
//! copy's traffic rate is this machine's memory-bound limit, so
//! `reduce GB/s ÷ copy GB/s` is the fraction of that limit the kernel
//! reaches.

use criterion::{Criterion, Throughput};
use ringcc_core::reduce::{reduce, reduce_in_place, DataType, ReduceOp};
use std::hint::black_box;
use std::time::Duration;

const BYTES: usize = 64 << 20;

fn kernels(c: &mut Criterion) {
    let mut acc = vec![1u8; BYTES];
    let src: Vec<u8> = (0..BYTES).map(|i| (i % 251) as u8).collect();
    let mut dst = vec![0u8; BYTES];
    let mut g = c.benchmark_group("reduce_64MiB");
    g.sample_size(20).measurement_time(Duration::from_secs(6));
    g.throughput(Throughput::Bytes(2 * BYTES as u64));
    g.bench_function("copy", |b| {
        b.iter(|| {
            dst.copy_from_slice(black_box(&src));
            black_box(&dst);
        })
    });
    g.throughput(Throughput::Bytes(3 * BYTES as u64));
    g.bench_function("f32_sum_in_place", |b| {
        b.iter(|| {
            reduce_in_place(DataType::F32, ReduceOp::Sum, &mut acc, black_box(&src)).unwrap();
            black_box(&acc);
        })
    });
    g.bench_function("f32_sum_out_of_place", |b| {
        b.iter(|| {
            reduce(
                DataType::F32,
                ReduceOp::Sum,
                &mut dst,
                black_box(&acc),
                black_box(&src),
            )
            .unwrap();
            black_box(&dst);
        })
    });
    for (name, d) in [
        ("bf16_sum_in_place", DataType::Bf16),
        ("i32_sum_in_place", DataType::I32),
        ("f64_max_in_place", DataType::F64),
    ] {
        let op = if d == DataType::F64 {
            ReduceOp::Max
        } else {
            ReduceOp::Sum
        };
        g.bench_function(name, |b| {
            b.iter(|| {
                reduce_in_place(d, op, &mut acc, black_box(&src)).unwrap();
                black_box(&acc);
            })
        });
    }
    g.finish();
}

/// Mean time of a finished benchmark, from criterion's own estimates.
fn mean_ns(id: &str) -> Option<f64> {
    let dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
    let path = dir
        .join("criterion")
        .join("reduce_64MiB")
        .join(id)
        .join("new/estimates.json");
    let text = std::fs::read_to_string(path).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    v["mean"]["point_estimate"].as_f64()
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    kernels(&mut c);
    c.final_summary();
    let (Some(copy), Some(sum)) = (mean_ns("copy"), mean_ns("f32_sum_in_place")) else {
        eprintln!("ratio: estimates not found (run without --test / filters)");
        return;
    };
    let copy_gbs = 2.0 * BYTES as f64 / copy;
    let sum_gbs = 3.0 * BYTES as f64 / sum;
    println!(
        "RATIO f32 sum in place vs copy (memory traffic): {:.2} GB/s / {:.2} GB/s = {:.3}",
        sum_gbs,
        copy_gbs,
        sum_gbs / copy_gbs
    );
    if let Some(oop) = mean_ns("f32_sum_out_of_place") {
        let g = 3.0 * BYTES as f64 / oop;
        println!(
            "RATIO f32 sum out of place vs copy (memory traffic): {:.2} GB/s / {:.2} GB/s = {:.3}",
            g,
            copy_gbs,
            g / copy_gbs
        );
    }
}
