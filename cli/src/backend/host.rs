//! `perf` over the communicator (`ringcc-comm`), one rank per process:
//! `--backend host` (shared memory inside a node; verbs or TCP between
//! nodes) and `--backend verbs` (verbs on every hop) are this one
//! backend with another transport list ([`Fabric`]). Under a launcher
//! (mpirun, srun, torchrun or `RINGCC_RANK` / `RINGCC_WORLD_SIZE` /
//! `RINGCC_ADDR`) this process is one rank; with `--np N` and no
//! launcher, [`super::np::launch`] starts N rank processes of this
//! command on this machine and waits for them.
//!
//! Rank 0 prints the table; times are the slowest rank's wall-clock time
//! and `#wrong` is summed over every rank, both agreed on with the
//! communicator itself ([`super::RankComm`]). The in-place columns run in
//! place: one buffer in NCCL's layout ([`Call::in_place_offsets`]).

use ringcc_comm::launch::Launch;
use ringcc_comm::Communicator;
use ringcc_core::{Call, Plan, Rank};

use super::fabric::Fabric;
use super::np::{launched_by, watch_parent, PARENT_VAR};
use super::{buffers, timed, RankComm};
use crate::args::{NcclFlag, TopoArgs};
use crate::error::CliError;
use crate::perf::{Estimate, PerfBackend};

/// The communicator as a `perf` backend: this process's rank.
pub struct HostBackend {
    comm: Communicator,
    fabric: Fabric,
    salt: u64,
}

impl RankComm for HostBackend {
    fn rank(&self) -> Rank {
        self.comm.rank()
    }

    fn world_size(&self) -> u32 {
        self.comm.world_size()
    }

    fn run(&mut self, call: &Call, input: &[u8], output: &mut [u8]) -> Result<(), CliError> {
        let fabric = self.fabric;
        self.comm
            .run(call, input, output)
            .map_err(|e| fabric.failed(e))
    }

    fn run_in_place(&mut self, call: &Call, buf: &mut [u8]) -> Result<(), CliError> {
        let fabric = self.fabric;
        self.comm
            .run_in_place(call, buf)
            .map_err(|e| fabric.failed(e))
    }
}

impl HostBackend {
    /// Joins the job this process was launched into, with `fabric`'s
    /// transports and settings ([`Fabric::options`]) and `--channels` /
    /// `--chunk-bytes` over them.
    pub fn new(t: &TopoArgs, fabric: Fabric) -> Result<HostBackend, CliError> {
        let started_by_np = std::env::var(PARENT_VAR).ok();
        let one_node = started_by_np.is_some();
        if let Some(pid) = started_by_np {
            watch_parent(pid);
        }
        let mut options = fabric.options(one_node)?;
        fabric.check(&options)?;
        let Some(_) = launched_by() else {
            return Err(CliError::usage(format!(
                "--backend {} needs its ranks: --np N starts N on this machine, or run one \
                 rank per process under mpirun, srun, torchrun (or RINGCC_RANK, \
                 RINGCC_WORLD_SIZE, RINGCC_ADDR)",
                fabric.name()
            )));
        };
        if let Some(c) = t.channels {
            options.channels = u8::try_from(c).unwrap_or(u8::MAX);
        }
        if let Some(c) = t.chunk_bytes {
            options.chunk_bytes = c;
        }
        // `--proto` / `--algo` over RINGCC_PROTO / RINGCC_ALGO, as on the
        // simulator (every rank gets the same flags from `--np` or its
        // launcher's command line).
        if let Some(p) = &t.proto {
            options.protos = ringcc_comm::proto::parse_protos(p)
                .map_err(|r| CliError::usage(format!("--proto: {r}")))?;
        }
        if let Some(a) = &t.algo {
            options.algos = ringcc_comm::proto::parse_algos(a)
                .map_err(|r| CliError::usage(format!("--algo: {r}")))?;
        }
        options.validate().map_err(|e| fabric.bad_setting(e))?;
        let launch = Launch::from_env().map_err(|e| fabric.bad_setting(e))?;
        let failed = |e| fabric.failed(e);
        let toward = ringcc_comm::resolve(&launch.addr).map_err(failed)?;
        let ip = ringcc_comm::net::bind_ip(Some(toward)).map_err(failed)?;
        let transports = fabric.transports(ip, &options)?;
        let comm = Communicator::from_launch(launch, options, transports).map_err(failed)?;
        Ok(HostBackend {
            comm,
            fabric,
            salt: 0x686f_7374,
        })
    }
}

impl PerfBackend for HostBackend {
    fn ranks(&self) -> u32 {
        self.comm.world_size()
    }

    fn describe(&self) -> Vec<String> {
        let o = self.comm.options();
        let mut nodes: Vec<&str> = self.comm.peers().iter().map(|p| p.node.as_str()).collect();
        nodes.sort_unstable();
        nodes.dedup();
        let hops = match self.comm.hops().first() {
            Some((out, inc)) => format!("rank {}'s hops: out {out}, in {inc}", self.comm.rank()),
            None => "one rank: no hops".into(),
        };
        let g = self.comm.geometry();
        let per = match self.comm.channel_bytes() {
            u64::MAX => "one per call: a ring with a TCP hop".to_string(),
            b => format!("one per {b} B of a call's buffer"),
        };
        vec![format!(
            "Backend: {} — {} rank(s) on {} node(s), one per process; {}; up to {} \
             channel(s) ({per}), {} B FIFO slots ({} per slice), {} B \
             chunks; {hops}; in place: one buffer in NCCL's layout.",
            self.fabric.name(),
            self.comm.world_size(),
            nodes.len(),
            self.fabric.describe(),
            o.channels,
            g.slot_bytes(),
            g.slots_per_slice(),
            o.chunk_bytes,
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
        let name = self.fabric.name();
        Some(match flag {
            NcclFlag::Ngpus | NcclFlag::Nthreads | NcclFlag::ParallelInit => {
                format!("the {name} backend runs one rank per process (--np N, or a launcher)")
            }
            NcclFlag::Blocking | NcclFlag::CpuTime => {
                format!("every {name} call blocks until it completes, so wall time is the CPU's")
            }
            NcclFlag::Average => {
                "time is the slowest rank's (as -a 3), agreed on by the communicator".into()
            }
            NcclFlag::CudaGraph => format!("the {name} backend moves host memory: no CUDA graph"),
            NcclFlag::LocalRegister => match self.fabric {
                Fabric::Host => "host memory needs no registration".into(),
                Fabric::Verbs => "a call of a MiB or more registers its buffers for its own \
                                  length and the NIC sends from them; none is kept across calls"
                    .into(),
            },
            NcclFlag::AggIters => {
                "perf does not group the calls of an iteration: they run one after another".into()
            }
            NcclFlag::CheckIters => return None,
        })
    }

    fn time(&mut self, c: &Call, in_place: bool, warmup: u32, iters: u32) -> Result<f64, CliError> {
        let (mut input, mut output) = buffers(c, self.comm.world_size(), in_place)?;
        let local = if in_place {
            timed(warmup, iters, || self.run_in_place(c, &mut input))?
        } else {
            timed(warmup, iters, || self.run(c, &input, &mut output))?
        };
        super::slowest(self, local, iters)
    }

    /// [`super::check`] on this communicator.
    fn check(&mut self, c: &Call, in_place: bool, corrupt: u64) -> Result<u64, CliError> {
        let o = self.comm.options();
        let plan = Plan::new(
            c.collective,
            c.count,
            c.dtype,
            self.comm.world_size(),
            u32::from(o.channels),
            o.chunk_bytes,
        )
        .map_err(CliError::core)?;
        let salt = self.salt;
        let wrong = super::check(self, &plan, c, in_place, corrupt, salt)?;
        self.salt = self.salt.wrapping_add(1);
        Ok(wrong)
    }
}
