//! `perf` over RDMA verbs: one rank per process, launched by mpirun, srun
//! or torchrun (or RINGCC_RANK / RINGCC_WORLD_SIZE / RINGCC_ADDR). Rank 0
//! prints the table; times are the slowest rank's wall-clock time, and
//! `#wrong` is summed over every rank — both agreed on with the
//! communicator itself. The in-place columns run in place: one buffer in
//! NCCL's layout ([`Call::in_place_offsets`]), the communicator's
//! `run_in_place`. The timing loop, the buffers and the check are the
//! host backend's too ([`super::RankComm`]).

use ringcc_core::{Plan, Rank};
use ringcc_verbs::{Call, Communicator, Config};

use super::{buffers, timed, RankComm};
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

impl RankComm for Communicator {
    fn rank(&self) -> Rank {
        Communicator::rank(self)
    }

    fn world_size(&self) -> u32 {
        Communicator::world_size(self)
    }

    fn run(&mut self, call: &Call, input: &[u8], output: &mut [u8]) -> Result<(), CliError> {
        Communicator::run(self, *call, input, output).map_err(failed)
    }

    fn run_in_place(&mut self, call: &Call, buf: &mut [u8]) -> Result<(), CliError> {
        Communicator::run_in_place(self, *call, buf).map_err(failed)
    }
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
        let launch =
            ringcc_verbs::Launch::from_env().map_err(|e| failed(ringcc_verbs::Error::from(e)))?;
        let comm = Communicator::new(launch, config).map_err(failed)?;
        Ok(VerbsBackend {
            comm,
            register,
            channels,
            chunk_bytes,
            salt: 0x7665_7262,
        })
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
        super::estimate(c, self.comm.world_size())
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
        let (mut input, mut output) = buffers(c, self.comm.world_size(), in_place)?;
        let call = *c;
        let comm = &mut self.comm;
        let local = match (in_place, self.register) {
            (true, true) => {
                let mut reg = comm.register(&mut input).map_err(failed)?;
                timed(warmup, iters, || {
                    comm.run_registered_in_place(call, &mut reg).map_err(failed)
                })?
            }
            (true, false) => timed(warmup, iters, || {
                RankComm::run_in_place(comm, &call, &mut input)
            })?,
            (false, true) => {
                let reg_in = comm.register(&mut input).map_err(failed)?;
                let mut reg_out = comm.register(&mut output).map_err(failed)?;
                timed(warmup, iters, || {
                    comm.run_registered(call, &reg_in, &mut reg_out)
                        .map_err(failed)
                })?
            }
            (false, false) => timed(warmup, iters, || {
                RankComm::run(comm, &call, &input, &mut output)
            })?,
        };
        super::slowest(&mut self.comm, local, iters)
    }

    /// [`super::check`] on this communicator.
    fn check(&mut self, c: &Call, in_place: bool, corrupt: u64) -> Result<u64, CliError> {
        let plan = self.plan(c)?;
        let wrong = super::check(&mut self.comm, &plan, c, in_place, corrupt, self.salt)?;
        self.salt = self.salt.wrapping_add(1);
        Ok(wrong)
    }
}
