//! `perf` on the deterministic cluster simulator.
//!
//! Timed iterations run in the simulator's timing-only mode (no payload:
//! large clusters stay fast) and report simulated cluster time. The check
//! is one run of a second simulated cluster with payload per size and
//! placement (the simulator is deterministic: more would only repeat it),
//! without user buffers: inputs are generated where the simulated GPUs
//! read them and every output element is compared with the reference as
//! it is written ([`GeneratedData`]), the reference computed once per size
//! and shared by the ranks and both placements. So the check holds one
//! rank's output and a bit per output element, not every rank's buffers,
//! and costs O(count) per rank.

use ringcc_core::cost::Link;
use ringcc_core::{ChannelId, Plan};
use ringcc_mock::{Call, Cluster, ClusterConfig, GeneratedData};

use crate::args::{NcclFlag, TopoArgs};
use crate::error::CliError;
use crate::perf::{Estimate, PerfBackend, PerfCall};
use crate::topo;

/// The simulator as a `perf` backend.
pub struct MockBackend {
    cfg: ClusterConfig,
    timing: Option<Cluster>,
    payload: Option<Cluster>,
    /// The check of the current size (kept for its second placement).
    generated: Option<GeneratedData>,
    salt: u64,
}

/// Measured on a 2-core machine: wall seconds the simulator takes per
/// slice of a timing-only run, and per slice and per byte a GPU moves in a
/// payload run (reading its input, generating and checking included).
const TIMING_PER_SLICE: f64 = 150e-9;
const PAYLOAD_PER_SLICE: f64 = 3e-6;
const PAYLOAD_PER_BYTE: f64 = 2.5e-9;

/// The simulator configuration the topology flags describe.
pub fn config(t: &TopoArgs) -> Result<ClusterConfig, CliError> {
    let t = &topo::resolve(t)?;
    let cfg = ClusterConfig {
        nodes: t.nodes,
        gpus_per_node: t.gpus_per_node,
        nics_per_node: t.nics_per_node,
        cross_nic: t.cross_nic,
        channels: t.channels(),
        chunk_bytes: t.chunk_bytes(),
        nvlink: Link {
            bandwidth: t.nvlink_gbps * 1e9,
            ..Link::NVLINK
        },
        nic: Link {
            bandwidth: t.nic_gbits * 1e9 / 8.0,
            ..Link::NIC_400G
        },
        ..ClusterConfig::default()
    };
    cfg.validate().map_err(|e| CliError::usage(e.to_string()))?;
    Ok(cfg)
}

impl MockBackend {
    /// A simulated cluster of the flags' shape.
    pub fn new(t: &TopoArgs) -> Result<MockBackend, CliError> {
        Ok(MockBackend {
            cfg: config(t)?,
            timing: None,
            payload: None,
            generated: None,
            salt: 0x6e63_636c,
        })
    }

    fn cluster<'a>(
        slot: &'a mut Option<Cluster>,
        cfg: &ClusterConfig,
        payload: bool,
    ) -> Result<&'a mut Cluster, CliError> {
        if slot.is_none() {
            let c = Cluster::new(ClusterConfig {
                payload,
                ..cfg.clone()
            })
            .map_err(|e| CliError::usage(e.to_string()))?;
            *slot = Some(c);
        }
        slot.as_mut()
            .ok_or_else(|| CliError::internal("cluster missing"))
    }
}

fn mock_call(c: &PerfCall) -> Call {
    Call::new(c.collective, c.count, c.dtype, c.op)
}

fn run_failed(what: &str, e: impl std::fmt::Display) -> CliError {
    CliError::failed(format!("simulated {what} failed: {e}"))
}

impl PerfBackend for MockBackend {
    fn ranks(&self) -> u32 {
        self.cfg.ranks() as u32
    }

    fn describe(&self) -> Vec<String> {
        let c = &self.cfg;
        vec![
            format!(
                "Backend: mock (simulated cluster) — {} node(s) x {} GPU(s), {} NIC(s) per node, {} channel(s){}",
                c.nodes,
                c.gpus_per_node,
                c.nics_per_node,
                c.channels,
                if c.cross_nic { ", cross-NIC" } else { "" }
            ),
            format!(
                "  NVLink {:.0} GB/s, {:.1} us; NIC {:.0} Gb/s, {:.1} us; chunk {} B, MTU {} B",
                c.nvlink.bandwidth / 1e9,
                c.nvlink.latency * 1e6,
                c.nic.bandwidth * 8.0 / 1e9,
                c.nic.latency * 1e6,
                c.chunk_bytes,
                c.mtu
            ),
        ]
    }

    fn simulated(&self) -> bool {
        true
    }

    fn time(
        &mut self,
        call: &PerfCall,
        in_place: bool,
        warmup: u32,
        iters: u32,
    ) -> Result<f64, CliError> {
        let n = self.ranks();
        let calls = vec![mock_call(call); n as usize];
        let cluster = Self::cluster(&mut self.timing, &self.cfg, false)?;
        let mut total = 0.0;
        for i in 0..warmup.saturating_add(iters) {
            let report = cluster
                .run(&calls, &mut [], in_place)
                .map_err(|e| run_failed("run", e))?;
            if let Some(Err(e)) = report.ranks.iter().find(|r| r.is_err()) {
                return Err(run_failed("collective", e));
            }
            if i >= warmup {
                total += report.end - report.start;
            }
        }
        Ok(total / f64::from(iters))
    }

    fn check(&mut self, call: &PerfCall, in_place: bool, corrupt: u64) -> Result<u64, CliError> {
        let n = self.ranks();
        let mc = mock_call(call);
        if self.generated.as_ref().and_then(GeneratedData::call) != Some(mc) {
            // A new size (or type, op): new inputs, a new reference.
            self.generated = None;
            self.salt = self.salt.wrapping_add(1);
            let g = GeneratedData::new(mc, n, self.salt).map_err(|e| run_failed("check", e))?;
            self.generated = Some(g);
        }
        let Some(data) = self.generated.as_mut() else {
            return Err(CliError::internal("generated data missing"));
        };
        // The test-only fault lands on a rank whose output is defined.
        let victim = match call.collective {
            ringcc_core::Collective::Reduce { root } => root.0,
            _ => 0,
        };
        data.corrupt_output(victim, corrupt);
        let cluster = Self::cluster(&mut self.payload, &self.cfg, true)?;
        let report = cluster
            .run_generated(&vec![mc; n as usize], data, in_place)
            .map_err(|e| run_failed("run", e))?;
        if let Some(Err(e)) = report.ranks.iter().find(|r| r.is_err()) {
            return Err(run_failed("collective", e));
        }
        Ok(data.wrong())
    }

    fn deterministic(&self) -> bool {
        true
    }

    fn lacks(&self, flag: NcclFlag) -> Option<String> {
        let ranks = self.cfg.ranks();
        Some(match flag {
            NcclFlag::Ngpus | NcclFlag::Nthreads => format!(
                "the simulator runs all {ranks} ranks of the cluster in this process; --nodes, --gpus-per-node and --ranks set its shape"
            ),
            NcclFlag::Blocking => "the simulator completes every call before the next starts".into(),
            NcclFlag::Average => "time is the simulated cluster's, from the call's start on every rank to its end on the last (every rank starts together)".into(),
            NcclFlag::CudaGraph => "the simulator launches no CUDA kernels, so there is no graph to capture".into(),
            NcclFlag::CpuTime => "simulated time has no CPU time; the time column is the virtual clock".into(),
            NcclFlag::ParallelInit => "the simulated cluster is built once, in this thread".into(),
            NcclFlag::LocalRegister => "the simulator registers its memory regions once, when the cluster is built".into(),
            NcclFlag::AggIters => "the simulator has no group launch: the calls of an iteration run one after another".into(),
            NcclFlag::CheckIters => "the simulator is deterministic: each size and placement is checked by one payload run".into(),
        })
    }

    fn estimate(&self, call: &PerfCall, calls: u64, checked: bool) -> Estimate {
        let c = &self.cfg;
        let n = self.ranks();
        let Ok(plan) = Plan::new(
            call.collective,
            call.count,
            call.dtype,
            n,
            c.channels,
            c.chunk_bytes,
        ) else {
            return Estimate::default();
        };
        // Slices of one call: every lane's steps, each step a chunk of up
        // to `slices_per_chunk` slices.
        let elem = u64::from(call.dtype.size());
        let chunk = plan.chunk_elems().saturating_mul(elem).max(1);
        let per_step = c.geometry.slices_per_chunk(chunk).max(1);
        let steps: u64 = (0..c.channels)
            .map(|ch| plan.total_steps(ChannelId(ch as u8)).unwrap_or(0))
            .sum();
        let slices = steps.saturating_mul(u64::from(n)).saturating_mul(per_step) as f64;
        let lanes = u64::from(n).saturating_mul(u64::from(c.channels));
        // The simulator's own state: a few KiB per lane.
        let base = lanes.saturating_mul(4096).saturating_add(32 << 20);
        let timing = slices * TIMING_PER_SLICE * calls as f64;
        if !checked {
            return Estimate {
                bytes: base,
                seconds: 2.0 * timing,
                unchecked_bytes: base,
            };
        }
        let mc = mock_call(call);
        let (input, output) = mc.buffer_bytes(n);
        // Each rank reads its input and writes its output about once.
        let moved = (input as u64)
            .saturating_add(output as u64)
            .saturating_mul(u64::from(n)) as f64;
        let reference = GeneratedData::bytes_needed(&mc, n);
        // FIFO space a lane touches: its slots, as far as its share of
        // the data fills them; RDMA hops also have a staging FIFO.
        let share = (input.max(output) as u64 / u64::from(c.channels).max(1)).saturating_mul(2);
        let fifo = c.geometry.fifo_bytes().min(share.saturating_add(4096 * 8));
        let fifos = lanes.saturating_mul(fifo).saturating_mul(2);
        Estimate {
            bytes: base.saturating_add(reference).saturating_add(fifos),
            seconds: 2.0 * (timing + slices * PAYLOAD_PER_SLICE + moved * PAYLOAD_PER_BYTE),
            unchecked_bytes: base,
        }
    }
}
