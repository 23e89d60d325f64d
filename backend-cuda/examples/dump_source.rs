//! Prints the generated CUDA source of one module, e.g.
//! `cargo run -p ringcc-cuda --example dump_source -- bfloat16 avg`;
//! a third argument picks the source: `fused` (default), `loop` (the
//! device loop) or `plan` (the step formula with the tests' entry points).

fn main() {
    let mut args = std::env::args().skip(1);
    let dtype = args
        .next()
        .and_then(|s| ringcc_core::DataType::from_name(&s))
        .unwrap_or(ringcc_core::DataType::F32);
    let op = args
        .next()
        .and_then(|s| ringcc_core::ReduceOp::from_name(&s))
        .unwrap_or(ringcc_core::ReduceOp::Sum);
    let module = ringcc_cuda::kernel::ModuleKey { dtype, op };
    match args.next().as_deref() {
        Some("loop") => print!("{}", ringcc_cuda::kernel::loop_source(module)),
        Some("plan") => print!("{}", ringcc_cuda::kernel::plan_test_source()),
        _ => print!("{}", ringcc_cuda::kernel::module_source(module)),
    }
}
