//! What `ringcc perf --backend cuda` runs: one collective, timed over
//! several iterations, then checked against the host reference
//! (nccl-tests' `time algbw busbw #wrong`).

use crate::state::CallBuffers;
use std::time::Instant;

use cudarc::driver::CudaSlice;
use ringcc_core::{Rank, ReduceOp};

use crate::comm::Comm;
use crate::error::{Error, Result};
use crate::reference::{expected, pattern, wrong};
use crate::state::Call;

/// One measurement to make.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PerfCase {
    /// The call (count as nccl-tests counts it).
    pub call: Call,
    /// In place (one buffer per rank) or out of place.
    pub in_place: bool,
    /// Untimed iterations first.
    pub warmup: u32,
    /// Timed iterations.
    pub iters: u32,
}

/// The result of a [`PerfCase`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PerfResult {
    /// Mean time of one collective, microseconds.
    pub time_us: f64,
    /// Bytes of the collective as nccl-tests counts them (the larger
    /// buffer of a rank).
    pub bytes: u64,
    /// `bytes / time`, GB/s.
    pub algbw: f64,
    /// `algbw × bus factor`, GB/s.
    pub busbw: f64,
    /// Elements that differ from the host reference, over all ranks.
    pub wrong: u64,
}

struct Buffers {
    send: Vec<CudaSlice<u8>>,
    recv: Vec<CudaSlice<u8>>,
    inputs: Vec<Vec<u8>>,
}

fn alloc(comm: &Comm, case: &PerfCase, spec: &Call) -> Result<Buffers> {
    let n = comm.ranks();
    let config = *comm.config();
    let (ib, ob) = spec.bytes(n, &config)?;
    let mut b = Buffers {
        send: Vec::new(),
        recv: Vec::new(),
        inputs: Vec::new(),
    };
    for r in 0..n {
        let s = comm.stream(Rank(r))?;
        let input = pattern(
            spec.dtype,
            spec.op,
            ib / u64::from(spec.dtype.size()),
            u64::from(r) + 1,
        );
        if case.in_place {
            let bp = spec.in_place(n, r, &config)?;
            let mut host = vec![0u8; bp.total as usize];
            host[bp.input.0 as usize..(bp.input.0 + bp.input.1) as usize].copy_from_slice(&input);
            b.recv
                .push(s.clone_htod(&host).map_err(Error::driver("cuMemcpyHtoD"))?);
        } else {
            b.send.push(
                s.clone_htod(&input)
                    .map_err(Error::driver("cuMemcpyHtoD"))?,
            );
            b.recv.push(
                s.alloc_zeros::<u8>(ob.max(1) as usize)
                    .map_err(Error::driver("cuMemAlloc"))?,
            );
        }
        b.inputs.push(input);
    }
    Ok(b)
}

fn launch(comm: &mut Comm, case: &PerfCase, spec: Call, b: &mut Buffers) -> Result<()> {
    let mut g = comm.group();
    if case.in_place {
        for (r, buf) in b.recv.iter_mut().enumerate() {
            g.raw_in_place(Rank(r as u32), spec, buf)?;
        }
    } else {
        for (r, (s, d)) in b.send.iter().zip(b.recv.iter_mut()).enumerate() {
            g.raw(Rank(r as u32), spec, s, d)?;
        }
    }
    g.launch()
}

/// Runs `case` once on fresh inputs and counts the elements that differ
/// from the host reference, over all ranks (nccl-tests' `#wrong`).
pub fn verify(comm: &mut Comm, case: &PerfCase) -> Result<u64> {
    verify_corrupted(comm, case, 0)
}

/// [`verify`], with a test-only fault: the first `corrupt` elements of
/// one rank's output (the root's for Reduce, else rank 0's) get a byte
/// flipped in the host copy before the comparison, which must count them.
pub fn verify_corrupted(comm: &mut Comm, case: &PerfCase, corrupt: u64) -> Result<u64> {
    let spec = spec_of(case);
    let n = comm.ranks();
    let config = *comm.config();
    let mut b = alloc(comm, case, &spec)?;
    launch(comm, case, spec, &mut b)?;
    comm.synchronize()?;
    let want = expected(&spec, &b.inputs)?;
    let mut bad = 0;
    for r in 0..n {
        let Some(w) = &want[r as usize] else { continue };
        let s = comm.stream(Rank(r))?;
        let host = s
            .clone_dtoh(&b.recv[r as usize])
            .map_err(Error::driver("cuMemcpyDtoH"))?;
        let (off, len) = if case.in_place {
            spec.in_place(n, r, &config)?.output
        } else {
            (0, spec.bytes(n, &config)?.1)
        };
        let mut got = host
            .get(off as usize..(off + len) as usize)
            .unwrap_or_default()
            .to_vec();
        let victim = match spec.collective {
            ringcc_core::Collective::Reduce { root } => root.0,
            _ => 0,
        };
        if r == victim {
            let elem = usize::from(spec.dtype.size());
            for e in got.chunks_exact_mut(elem).take(corrupt as usize) {
                e[0] ^= 0x5a;
            }
        }
        bad += wrong(spec.dtype, &got, w);
    }
    Ok(bad)
}

fn spec_of(case: &PerfCase) -> Call {
    case.call
}

/// Runs `case` on `comm`: warm-up, timed iterations (host clock around
/// enqueue and synchronize, as nccl-tests), then one checked run on fresh
/// inputs ([`verify`]).
pub fn run(comm: &mut Comm, case: &PerfCase) -> Result<PerfResult> {
    let spec = spec_of(case);
    let n = comm.ranks();
    let op = if spec.collective.reduces() {
        spec.op
    } else {
        ReduceOp::Sum
    };
    comm.prepare(spec.dtype, op)?;
    let mut b = alloc(comm, case, &spec)?;
    for _ in 0..case.warmup {
        launch(comm, case, spec, &mut b)?;
    }
    comm.synchronize()?;
    let started = Instant::now();
    for _ in 0..case.iters {
        launch(comm, case, spec, &mut b)?;
    }
    comm.synchronize()?;
    let secs = started.elapsed().as_secs_f64() / f64::from(case.iters.max(1));
    drop(b);
    let bad = verify(comm, case)?;
    let config = *comm.config();
    let (ib, ob) = spec.bytes(n, &config)?;
    let bytes = ib.max(ob);
    let algbw = bytes as f64 / secs / 1e9;
    Ok(PerfResult {
        time_us: secs * 1e6,
        bytes,
        algbw,
        busbw: algbw * spec.collective.bus_factor(n),
        wrong: bad,
    })
}
