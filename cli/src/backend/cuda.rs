//! `perf` on the CUDA GPUs of this process: `--gpus-per-node` ranks,
//! spread round-robin over the devices (several ranks may share a GPU).

use ringcc_cuda::perf::{self, PerfCase};
use ringcc_cuda::{driver, Comm, Config};

use crate::args::NcclFlag;
use crate::error::CliError;
use crate::perf::PerfBackend;
use crate::topo::Shape;
use ringcc_core::Call;

/// CUDA as a `perf` backend.
pub struct CudaBackend {
    comm: Comm,
    devices: usize,
    /// `#wrong` of the last timed case: after its timed calls the CUDA
    /// backend checks one more call on fresh inputs.
    last_wrong: Option<(Call, bool, u64)>,
}

fn failed(e: ringcc_cuda::Error) -> CliError {
    CliError::failed(format!("cuda: {e}"))
}

impl CudaBackend {
    /// A communicator over this process's GPUs: `t.gpus_per_node` ranks
    /// (`--gpus-per-node` or `--ranks`).
    pub fn new(t: &Shape) -> Result<CudaBackend, CliError> {
        if t.nodes != 1 {
            return Err(CliError::usage(
                "--backend cuda drives the GPUs of one node: use --nodes 1",
            ));
        }
        let devices = driver::device_count().map_err(failed)?;
        if devices == 0 {
            return Err(CliError::failed("cuda: no GPU found"));
        }
        let ordinals: Vec<usize> = (0..t.gpus_per_node as usize).map(|r| r % devices).collect();
        let channels =
            u8::try_from(t.channels()).map_err(|_| CliError::usage("too many channels"))?;
        let config = Config {
            channels,
            chunk_bytes: t.chunk_bytes(),
            ..Config::default()
        };
        let comm = Comm::init_all(&ordinals, config).map_err(failed)?;
        Ok(CudaBackend {
            comm,
            devices,
            last_wrong: None,
        })
    }
}

impl PerfBackend for CudaBackend {
    fn ranks(&self) -> u32 {
        self.comm.ranks()
    }

    fn describe(&self) -> Vec<String> {
        vec![format!(
            "Backend: cuda — {} rank(s) on {} GPU(s) of this process",
            self.comm.ranks(),
            self.devices
        )]
    }

    fn simulated(&self) -> bool {
        false
    }

    fn lacks(&self, flag: NcclFlag) -> Option<String> {
        Some(match flag {
            NcclFlag::Ngpus | NcclFlag::Nthreads => format!(
                "this process drives {} rank(s), set by --gpus-per-node, from one thread",
                self.comm.ranks()
            ),
            NcclFlag::Blocking => {
                "each perf cell synchronizes its streams once, after its timed calls".into()
            }
            NcclFlag::Average => {
                "time is the communicator's, all ranks of this process together (as -a 3)".into()
            }
            NcclFlag::CudaGraph => {
                "calls launch one kernel per slice; they are not captured in CUDA graphs yet".into()
            }
            NcclFlag::CpuTime => "time is measured with CUDA events on the streams".into(),
            NcclFlag::ParallelInit => {
                "the communicator initializes its GPUs from one thread".into()
            }
            NcclFlag::LocalRegister => "device buffers need no registration here (no NIC)".into(),
            NcclFlag::AggIters => {
                "there is no group launch yet: the calls of an iteration run one after another"
                    .into()
            }
            NcclFlag::CheckIters => "the backend checks the results of the run it timed".into(),
        })
    }

    fn time(
        &mut self,
        call: &Call,
        in_place: bool,
        warmup: u32,
        iters: u32,
    ) -> Result<f64, CliError> {
        let case = perf_case(call, in_place, warmup, iters);
        let r = perf::run(&mut self.comm, &case).map_err(failed)?;
        self.last_wrong = Some((*call, in_place, r.wrong));
        Ok(r.time_us * 1e-6)
    }

    fn check(&mut self, call: &Call, in_place: bool, corrupt: u64) -> Result<u64, CliError> {
        match self.last_wrong {
            Some((c, p, w)) if c == *call && p == in_place && corrupt == 0 => Ok(w),
            _ => {
                // A fresh checked run against the core's reference
                // (`ringcc_core::verify`); the test-only fault corrupts
                // elements of the victim's output in device memory before
                // the outputs are read back and compared.
                let case = perf_case(call, in_place, 0, 1);
                perf::verify_corrupted(&mut self.comm, &case, corrupt).map_err(failed)
            }
        }
    }
}

/// The CUDA backend's description of one perf cell.
fn perf_case(call: &Call, in_place: bool, warmup: u32, iters: u32) -> PerfCase {
    PerfCase {
        call: *call,
        in_place,
        warmup,
        iters,
    }
}
