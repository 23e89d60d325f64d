//! `perf` over RDMA verbs: one rank per process, launched by mpirun, srun
//! or torchrun (or RINGCC_RANK / RINGCC_WORLD_SIZE / RINGCC_ADDR). Rank 0
//! prints the table; times are the slowest rank's wall-clock time, and
//! `#wrong` is summed over every rank — both agreed on with the
//! communicator itself. The in-place columns run in place: one buffer in
//! NCCL's layout ([`Call::in_place_offsets`]), the communicator's
//! `run_in_place`.

use std::ops::Range;
use std::time::Instant;

use ringcc_core::{verify, Collective, DataType, Plan, Rank, ReduceOp};
use ringcc_verbs::{Call, Communicator, Config};

use crate::args::{NcclFlag, TopoArgs};
use crate::error::CliError;
use crate::perf::{Estimate, PerfBackend};

/// RDMA verbs as a `perf` backend.
pub struct VerbsBackend {
    comm: Communicator,
    /// Register each size's buffers once (`-R 1`).
    register: bool,
    channels: u32,
    chunk_bytes: u64,
    salt: u64,
}

fn failed(e: ringcc_verbs::Error) -> CliError {
    CliError::failed(format!("verbs: {e}"))
}

/// `warmup` untimed calls of `one`, then the time of `iters` more.
fn timed(
    comm: &mut Communicator,
    warmup: u32,
    iters: u32,
    mut one: impl FnMut(&mut Communicator) -> ringcc_verbs::Result<()>,
) -> Result<std::time::Duration, CliError> {
    for _ in 0..warmup {
        one(comm).map_err(failed)?;
    }
    let t0 = Instant::now();
    for _ in 0..iters {
        one(comm).map_err(failed)?;
    }
    Ok(t0.elapsed())
}

impl VerbsBackend {
    /// Joins the job this process was launched into.
    pub fn new(t: &TopoArgs, register: bool) -> Result<VerbsBackend, CliError> {
        let mut config = Config::from_env().map_err(failed)?;
        if let Some(c) = t.channels {
            config.channels = c;
        }
        // Without --chunk-bytes, the chunk follows the FIFO geometry the
        // environment chose (`Config::from_env`).
        if let Some(c) = t.chunk_bytes {
            config.chunk_bytes = c;
        }
        config.cross_nic = t.cross_nic;
        let (channels, chunk_bytes) = (config.channels, config.chunk_bytes);
        let launch = ringcc_verbs::Launch::from_env().map_err(failed)?;
        let comm = Communicator::new(launch, config).map_err(failed)?;
        Ok(VerbsBackend {
            comm,
            register,
            channels,
            chunk_bytes,
            salt: 0x7665_7262,
        })
    }

    /// Agrees on one u64 across ranks with the communicator.
    fn agree(&mut self, v: u64, op: ReduceOp) -> Result<u64, CliError> {
        let mut out = [0u8; 8];
        let call = Call {
            collective: Collective::AllReduce,
            count: 1,
            dtype: DataType::U64,
            op,
        };
        self.comm
            .run(call, &v.to_ne_bytes(), &mut out)
            .map_err(failed)?;
        Ok(u64::from_ne_bytes(out))
    }

    fn plan(&self, c: &Call) -> Result<Plan, CliError> {
        Plan::new(
            c.collective,
            c.count,
            c.dtype,
            self.comm.world_size(),
            self.channels,
            self.chunk_bytes,
        )
        .map_err(CliError::core)
    }

    /// The call's buffers: an input and an output, or (in place) one
    /// buffer, empty beside it.
    fn buffers(&self, c: &Call, in_place: bool) -> Result<(Plan, Vec<u8>, Vec<u8>), CliError> {
        let plan = self.plan(c)?;
        let (input, output) = c.buffer_bytes(self.comm.world_size());
        if input == usize::MAX || output == usize::MAX {
            return Err(CliError::usage(
                "buffer size overflows this machine's addresses",
            ));
        }
        if in_place {
            return Ok((plan, alloc(input.max(output))?, Vec::new()));
        }
        Ok((plan, alloc(input)?, alloc(output)?))
    }

    /// Where the input and the output are in an in-place buffer: byte
    /// ranges of NCCL's layout for this rank.
    fn in_place_ranges(&self, c: &Call) -> (Range<usize>, Range<usize>) {
        let (input, output) = c.buffer_bytes(self.comm.world_size());
        let (i, o) = c.in_place_offsets(self.comm.rank().0);
        let at = |elems: u64| {
            usize::try_from(elems)
                .unwrap_or(usize::MAX)
                .saturating_mul(c.elem())
        };
        let (i, o) = (at(i), at(o));
        (i..i.saturating_add(input), o..o.saturating_add(output))
    }
}

fn alloc(bytes: usize) -> Result<Vec<u8>, CliError> {
    let mut v = Vec::new();
    v.try_reserve_exact(bytes).map_err(|_| {
        CliError::failed(format!(
            "cannot allocate a {bytes}-byte buffer on this host"
        ))
    })?;
    v.resize(bytes, 0);
    Ok(v)
}

impl PerfBackend for VerbsBackend {
    fn ranks(&self) -> u32 {
        self.comm.world_size()
    }

    fn describe(&self) -> Vec<String> {
        vec![format!(
            "Backend: verbs — {} rank(s), one per process, RC queue pairs, {} channel(s); this is rank {}; \
             host buffers {}; in place: one buffer in NCCL's layout.",
            self.comm.world_size(),
            self.channels,
            self.comm.rank(),
            if self.register {
                "registered once per size (-R 1)"
            } else {
                "registered by every call (-R 0)"
            }
        )]
    }

    fn simulated(&self) -> bool {
        false
    }

    fn prints(&self) -> bool {
        self.comm.rank() == Rank(0)
    }

    fn estimate(&self, c: &Call, _calls: u64, _checked: bool) -> Estimate {
        // This rank's host buffers, input and output out of place (the
        // timed calls and the check each hold one pair, one after the
        // other; in place holds less).
        let (input, output) = c.buffer_bytes(self.comm.world_size());
        let bytes = (input as u64).saturating_add(output as u64);
        Estimate {
            bytes,
            seconds: 0.0,
            unchecked_bytes: bytes,
        }
    }

    fn lacks(&self, flag: NcclFlag) -> Option<String> {
        Some(match flag {
            NcclFlag::Ngpus | NcclFlag::Nthreads => {
                "the verbs backend runs one rank per process, launched by mpirun, srun or torchrun"
                    .into()
            }
            NcclFlag::Blocking => "every verbs call blocks until it completes".into(),
            NcclFlag::Average => {
                "time is the slowest rank's (as -a 3), agreed on by the communicator".into()
            }
            NcclFlag::CudaGraph => {
                "the verbs backend moves host memory: there is no CUDA graph".into()
            }
            NcclFlag::CpuTime => "verbs calls block, so wall time is the CPU's time".into(),
            NcclFlag::ParallelInit => {
                "one rank per process: there is nothing to initialize in parallel".into()
            }
            NcclFlag::AggIters => {
                "there is no group launch yet: the calls of an iteration run one after another"
                    .into()
            }
            NcclFlag::LocalRegister | NcclFlag::CheckIters => return None,
        })
    }

    fn time(&mut self, c: &Call, in_place: bool, warmup: u32, iters: u32) -> Result<f64, CliError> {
        let (_, mut input, mut output) = self.buffers(c, in_place)?;
        let call = *c;
        let comm = &mut self.comm;
        let local = match (in_place, self.register) {
            (true, true) => {
                let mut reg = comm.register(&mut input).map_err(failed)?;
                timed(comm, warmup, iters, |c| {
                    c.run_registered_in_place(call, &mut reg)
                })?
            }
            (true, false) => timed(comm, warmup, iters, |c| c.run_in_place(call, &mut input))?,
            (false, true) => {
                let reg_in = comm.register(&mut input).map_err(failed)?;
                let mut reg_out = comm.register(&mut output).map_err(failed)?;
                timed(comm, warmup, iters, |c| {
                    c.run_registered(call, &reg_in, &mut reg_out)
                })?
            }
            (false, false) => timed(comm, warmup, iters, |c| c.run(call, &input, &mut output))?,
        };
        let local = local.as_nanos() as u64 / u64::from(iters.max(1));
        Ok(self.agree(local, ReduceOp::Max)? as f64 * 1e-9)
    }

    /// One call on the core's reference inputs ([`verify::fill_input`]);
    /// `corrupt` elements of the victim's output (the root's for Reduce,
    /// else rank 0's) get a byte flipped before [`verify::count_wrong`]
    /// compares every element with the reference, which must count them.
    fn check(&mut self, c: &Call, in_place: bool, corrupt: u64) -> Result<u64, CliError> {
        let (plan, mut input, mut output) = self.buffers(c, in_place)?;
        let rank = self.comm.rank();
        let internal = |e: ringcc_core::Error| CliError::internal(e.to_string());
        let (in_range, out_range) = self.in_place_ranges(c);
        if in_place {
            let inp = input
                .get_mut(in_range)
                .ok_or_else(|| CliError::internal("in-place input outside the buffer"))?;
            verify::fill_input(&plan, c.op, rank.0, self.salt, inp).map_err(internal)?;
            self.comm.run_in_place(*c, &mut input).map_err(failed)?;
        } else {
            verify::fill_input(&plan, c.op, rank.0, self.salt, &mut input).map_err(internal)?;
            self.comm.run(*c, &input, &mut output).map_err(failed)?;
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
        let wrong = verify::count_wrong(&plan, c.op, rank.0, self.salt, out).map_err(internal)?;
        self.salt = self.salt.wrapping_add(1);
        self.agree(wrong, ReduceOp::Sum)
    }
}
