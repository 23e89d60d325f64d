//! Prints the generated CUDA source of one module, e.g.
//! `cargo run -p ringcc-cuda --example dump_source -- bfloat16 avg`.

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
    print!("{}", ringcc_cuda::kernel::module_source(module));
}
