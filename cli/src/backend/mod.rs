//! The backends `perf` can run on.
//!
//! `host` and `verbs` are one backend, the communicator with one rank per
//! process ([`host`]), with other transports ([`fabric`]); `--np N`
//! starts the processes ([`np`]). The host buffers in NCCL's layout, the
//! timing loop, the slowest rank's time and the check on the core's
//! reference values are [`RankComm`] and the functions beside it.

pub mod fabric;
pub mod host;
pub mod mock;
pub mod np;
pub use mock::MockBackend;

use std::ops::Range;
use std::time::{Duration, Instant};

use ringcc_core::{verify, Call, Collective, DataType, Plan, Rank, ReduceOp};

use self::fabric::Fabric;
use crate::args::{BackendArg, PerfArgs};
use crate::error::CliError;
use crate::perf::{Estimate, PerfBackend};

/// Runs `perf` as the flags ask; returns the exit status. `--np N` (host
/// and verbs) starts N rank processes of this command instead.
pub fn perf(a: &PerfArgs) -> Result<i32, CliError> {
    if let Some(n) = a.np {
        let fabric = match a.backend {
            BackendArg::Host => Fabric::Host,
            BackendArg::Verbs => Fabric::Verbs,
            BackendArg::Mock | BackendArg::Cuda => return Err(CliError::usage(NP_ONLY)),
        };
        // What every rank would refuse, refused once, before any starts.
        fabric.check(&fabric.options(true)?)?;
        return np::launch(a, n);
    }
    let mut b = open(a)?;
    Ok(if crate::perf::perf(a, b.as_mut())? {
        0
    } else {
        1
    })
}

/// `--np` given to a backend that takes its ranks otherwise.
const NP_ONLY: &str = "--np starts ranks of --backend host or verbs only (the simulator and \
                       CUDA take their ranks from the shape flags)";

/// Opens the backend the flags ask for.
pub fn open(a: &PerfArgs) -> Result<Box<dyn PerfBackend>, CliError> {
    match a.backend {
        BackendArg::Mock => Ok(Box::new(MockBackend::new(&a.topo)?)),
        BackendArg::Cuda => cuda(a),
        BackendArg::Host => ranks(a, Fabric::Host),
        BackendArg::Verbs => ranks(a, Fabric::Verbs),
    }
}

/// This process's rank of a job over `fabric`.
fn ranks(a: &PerfArgs, fabric: Fabric) -> Result<Box<dyn PerfBackend>, CliError> {
    // The launcher fixes the ranks; the shape flags are only checked, so
    // that contradictory ones are refused here as on every other backend.
    crate::topo::resolve(&a.topo)?;
    Ok(Box::new(host::HostBackend::new(&a.topo, fabric)?))
}

/// One rank of a job of processes (host, verbs), as `perf` times and
/// checks it.
pub(crate) trait RankComm {
    /// This rank.
    fn rank(&self) -> Rank;
    /// Ranks in the job.
    fn world_size(&self) -> u32;
    /// `call` out of place.
    fn run(&mut self, call: &Call, input: &[u8], output: &mut [u8]) -> Result<(), CliError>;
    /// `call` in place in one buffer in NCCL's layout.
    fn run_in_place(&mut self, call: &Call, buf: &mut [u8]) -> Result<(), CliError>;

    /// Agrees on one u64 across ranks (an AllReduce of it).
    fn agree(&mut self, v: u64, op: ReduceOp) -> Result<u64, CliError> {
        let mut out = [0u8; 8];
        let call = Call::all_reduce(1, DataType::U64, op);
        self.run(&call, &v.to_ne_bytes(), &mut out)?;
        Ok(u64::from_ne_bytes(out))
    }
}

/// A zeroed host buffer, or a clear error where the host lacks the memory.
pub(crate) fn alloc(bytes: usize) -> Result<Vec<u8>, CliError> {
    let mut v = Vec::new();
    v.try_reserve_exact(bytes).map_err(|_| {
        CliError::failed(format!(
            "cannot allocate a {bytes}-byte buffer on this host"
        ))
    })?;
    v.resize(bytes, 0);
    Ok(v)
}

/// The call's buffers on `world` ranks: an input and an output, or (in
/// place) one buffer, empty beside it.
pub(crate) fn buffers(
    c: &Call,
    world: u32,
    in_place: bool,
) -> Result<(Vec<u8>, Vec<u8>), CliError> {
    let (input, output) = c.buffer_bytes(world);
    if input == usize::MAX || output == usize::MAX {
        return Err(CliError::usage(
            "buffer size overflows this machine's addresses",
        ));
    }
    if in_place {
        return Ok((alloc(input.max(output))?, Vec::new()));
    }
    Ok((alloc(input)?, alloc(output)?))
}

/// Where `rank`'s input and output are in an in-place buffer: byte ranges
/// of NCCL's layout.
fn in_place_ranges(c: &Call, world: u32, rank: Rank) -> (Range<usize>, Range<usize>) {
    let (input, output) = c.buffer_bytes(world);
    let (i, o) = c.in_place_offsets(rank.0);
    let at = |elems: u64| {
        usize::try_from(elems)
            .unwrap_or(usize::MAX)
            .saturating_mul(c.elem())
    };
    let (i, o) = (at(i), at(o));
    (i..i.saturating_add(input), o..o.saturating_add(output))
}

/// `warmup` untimed calls of `one`, then the time of `iters` more.
pub(crate) fn timed(
    warmup: u32,
    iters: u32,
    mut one: impl FnMut() -> Result<(), CliError>,
) -> Result<Duration, CliError> {
    for _ in 0..warmup {
        one()?;
    }
    let t0 = Instant::now();
    for _ in 0..iters {
        one()?;
    }
    Ok(t0.elapsed())
}

/// Seconds per iteration of the slowest rank, from this rank's `elapsed`
/// over `iters` iterations.
pub(crate) fn slowest(
    comm: &mut dyn RankComm,
    elapsed: Duration,
    iters: u32,
) -> Result<f64, CliError> {
    let local = elapsed.as_nanos() as u64 / u64::from(iters.max(1));
    Ok(comm.agree(local, ReduceOp::Max)? as f64 * 1e-9)
}

/// One call on the core's reference inputs ([`verify::fill_input`]);
/// `corrupt` elements of the victim's output (the root's for Reduce, else
/// rank 0's) get a byte flipped before [`verify::count_wrong`] compares
/// every element with the reference, which must count them. Returns the
/// wrong elements of every rank.
pub(crate) fn check(
    comm: &mut dyn RankComm,
    plan: &Plan,
    c: &Call,
    in_place: bool,
    corrupt: u64,
    salt: u64,
) -> Result<u64, CliError> {
    let (rank, world) = (comm.rank(), comm.world_size());
    let (mut input, mut output) = buffers(c, world, in_place)?;
    let internal = |e: ringcc_core::Error| CliError::internal(e.to_string());
    let (in_range, out_range) = in_place_ranges(c, world, rank);
    if in_place {
        let inp = input
            .get_mut(in_range)
            .ok_or_else(|| CliError::internal("in-place input outside the buffer"))?;
        verify::fill_input(plan, c.op, rank.0, salt, inp).map_err(internal)?;
        comm.run_in_place(c, &mut input)?;
    } else {
        verify::fill_input(plan, c.op, rank.0, salt, &mut input).map_err(internal)?;
        comm.run(c, &input, &mut output)?;
    }
    let out = if in_place {
        input
            .get_mut(out_range)
            .ok_or_else(|| CliError::internal("in-place output outside the buffer"))?
    } else {
        &mut output[..]
    };
    let victim = match c.collective {
        Collective::Reduce { root } => root,
        _ => Rank(0),
    };
    if rank == victim {
        let e = usize::from(c.dtype.size());
        for el in out.chunks_exact_mut(e).take(corrupt as usize) {
            el[0] ^= 0x5a;
        }
    }
    let wrong = verify::count_wrong(plan, c.op, rank.0, salt, out).map_err(internal)?;
    comm.agree(wrong, ReduceOp::Sum)
}

/// What one size costs a rank process: its host buffers, input and output
/// out of place (the timed calls and the check each hold one pair, one
/// after the other; in place holds less).
pub(crate) fn estimate(c: &Call, world: u32) -> Estimate {
    let (input, output) = c.buffer_bytes(world);
    let bytes = (input as u64).saturating_add(output as u64);
    Estimate {
        bytes,
        seconds: 0.0,
        unchecked_bytes: bytes,
    }
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
