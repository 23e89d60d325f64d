//! `perf` over RDMA verbs: one rank per process, launched by mpirun, srun
//! or torchrun (or RINGCC_RANK / RINGCC_WORLD_SIZE / RINGCC_ADDR). Rank 0
//! prints the table; times are the slowest rank's wall-clock time, and
//! `#wrong` is summed over every rank — both agreed on with the
//! communicator itself.

use std::time::Instant;

use ringcc_core::{verify, Collective, DataType, Plan, ReduceOp};
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

    fn buffers(&self, c: &Call) -> Result<(Plan, Vec<u8>, Vec<u8>), CliError> {
        let plan = Plan::new(
            c.collective,
            c.count,
            c.dtype,
            self.comm.world_size(),
            self.channels,
            self.chunk_bytes,
        )
        .map_err(CliError::core)?;
        let e = usize::from(c.dtype.size());
        let alloc = |elems: u64| -> Result<Vec<u8>, CliError> {
            let bytes = usize::try_from(elems)
                .ok()
                .and_then(|n| n.checked_mul(e))
                .ok_or_else(|| CliError::usage("buffer size overflows this machine's addresses"))?;
            let mut v = Vec::new();
            v.try_reserve_exact(bytes).map_err(|_| {
                CliError::failed(format!(
                    "cannot allocate a {bytes}-byte buffer on this host"
                ))
            })?;
            v.resize(bytes, 0);
            Ok(v)
        };
        Ok((plan, alloc(plan.input_len())?, alloc(plan.output_len())?))
    }
}

impl PerfBackend for VerbsBackend {
    fn ranks(&self) -> u32 {
        self.comm.world_size()
    }

    fn describe(&self) -> Vec<String> {
        vec![format!(
            "Backend: verbs — {} rank(s), one per process, RC queue pairs, {} channel(s); this is rank {}; \
             buffers {}. The API takes separate host buffers: the in-place columns repeat the out-of-place data path.",
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
        self.comm.rank() == 0
    }

    fn estimate(&self, c: &Call, _calls: u64, _checked: bool) -> Estimate {
        // This rank's host buffers, input and output (the timed calls and
        // the check each hold one pair, one after the other).
        let n = u64::from(self.comm.world_size());
        let one = c.count.saturating_mul(u64::from(c.dtype.size()));
        let (input, output) = match c.collective {
            Collective::ReduceScatter => (one.saturating_mul(n), one),
            Collective::AllGather => (one, one.saturating_mul(n)),
            _ => (one, one),
        };
        let bytes = input.saturating_add(output);
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

    fn time(
        &mut self,
        c: &Call,
        _in_place: bool,
        warmup: u32,
        iters: u32,
    ) -> Result<f64, CliError> {
        let (_, mut input, mut output) = self.buffers(c)?;
        let call = *c;
        let comm = &mut self.comm;
        let local = if self.register {
            let reg_in = comm.register(&mut input).map_err(failed)?;
            let mut reg_out = comm.register(&mut output).map_err(failed)?;
            timed(comm, warmup, iters, |c| {
                c.run_registered(call, &reg_in, &mut reg_out)
            })?
        } else {
            timed(comm, warmup, iters, |c| c.run(call, &input, &mut output))?
        };
        let local = local.as_nanos() as u64 / u64::from(iters.max(1));
        Ok(self.agree(local, ReduceOp::Max)? as f64 * 1e-9)
    }

    fn check(&mut self, c: &Call, _in_place: bool, corrupt: u64) -> Result<u64, CliError> {
        let (plan, mut input, mut output) = self.buffers(c)?;
        let rank = self.comm.rank();
        verify::fill_input(&plan, c.op, rank, self.salt, &mut input)
            .map_err(|e| CliError::internal(e.to_string()))?;
        self.comm.run(*c, &input, &mut output).map_err(failed)?;
        let victim = match c.collective {
            Collective::Reduce { root } => root.0,
            _ => 0,
        };
        if rank == victim {
            let e = usize::from(c.dtype.size());
            for el in output.chunks_exact_mut(e).take(corrupt as usize) {
                el[0] ^= 0x5a;
            }
        }
        let wrong = verify::count_wrong(&plan, c.op, rank, self.salt, &output)
            .map_err(|e| CliError::internal(e.to_string()))?;
        self.salt = self.salt.wrapping_add(1);
        self.agree(wrong, ReduceOp::Sum)
    }
}
