//! The backends `perf` can run on.

pub mod mock;
pub use mock::MockBackend;

use crate::args::{BackendArg, PerfArgs};
use crate::error::CliError;
use crate::perf::PerfBackend;

/// Opens the backend the flags ask for.
pub fn open(a: &PerfArgs) -> Result<Box<dyn PerfBackend>, CliError> {
    match a.backend {
        BackendArg::Mock => Ok(Box::new(MockBackend::new(&a.topo)?)),
        BackendArg::Verbs => verbs(a),
        BackendArg::Cuda => cuda(a),
    }
}

#[cfg(feature = "verbs")]
fn verbs(a: &PerfArgs) -> Result<Box<dyn PerfBackend>, CliError> {
    // The launcher fixes the ranks; the shape flags are only checked, so
    // that contradictory ones are refused here as on every other backend.
    crate::topo::resolve(&a.topo)?;
    Ok(Box::new(verbs::VerbsBackend::new(
        &a.topo,
        a.local_register != 0,
    )?))
}

#[cfg(not(feature = "verbs"))]
fn verbs(_: &PerfArgs) -> Result<Box<dyn PerfBackend>, CliError> {
    Err(CliError::usage(
        "this ringcc was built without the verbs backend: cargo build --release -p ringcc --features verbs",
    ))
}

#[cfg(feature = "cuda")]
fn cuda(a: &PerfArgs) -> Result<Box<dyn PerfBackend>, CliError> {
    Ok(Box::new(cuda::CudaBackend::new(&crate::topo::resolve(
        &a.topo,
    )?)?))
}

#[cfg(not(feature = "cuda"))]
fn cuda(_: &PerfArgs) -> Result<Box<dyn PerfBackend>, CliError> {
    Err(CliError::usage(
        "this ringcc was built without the CUDA backend: cargo build --release -p ringcc --features cuda",
    ))
}

#[cfg(feature = "cuda")]
mod cuda;
#[cfg(feature = "verbs")]
mod verbs;
