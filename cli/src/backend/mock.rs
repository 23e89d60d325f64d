//! `perf` on the deterministic cluster simulator.
//!
//! Timed iterations run in the simulator's timing-only mode (no payload:
//! large clusters stay fast) and report simulated cluster time; checked
//! iterations run a second simulated cluster with payload, whose outputs
//! are compared with the reference element by element.

use ringcc_core::cost::Link;
use ringcc_core::verify;
use ringcc_core::Plan;
use ringcc_mock::{Call, Cluster, ClusterConfig, RankBuffers};

use crate::args::TopoArgs;
use crate::error::CliError;
use crate::perf::{PerfBackend, PerfCall};
use crate::topo;

/// The simulator as a `perf` backend.
pub struct MockBackend {
    cfg: ClusterConfig,
    timing: Option<Cluster>,
    payload: Option<Cluster>,
    salt: u64,
}

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
        let mut bufs: Vec<RankBuffers> = Vec::new();
        let mut total = 0.0;
        for i in 0..warmup + iters {
            let report = cluster
                .run(&calls, &mut bufs, in_place)
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
        let plan = Plan::new(
            call.collective,
            call.count,
            call.dtype,
            n,
            self.cfg.channels,
            self.cfg.chunk_bytes,
        )
        .map_err(CliError::core)?;
        let mc = mock_call(call);
        let calls = vec![mc; n as usize];
        let elem = usize::from(call.dtype.size());
        let in_len = plan.input_len() as usize * elem;
        let out_len = plan.output_len() as usize * elem;
        let block = call.count as usize * elem;
        // NCCL's in-place layouts: ReduceScatter's output is block `rank`
        // of its input, AllGather's input block `rank` of its output.
        let at = |r: u32| -> (usize, usize) {
            match (in_place, call.collective) {
                (false, _) => (0, 0),
                (true, ringcc_core::Collective::ReduceScatter) => (0, block * r as usize),
                (true, ringcc_core::Collective::AllGather) => (block * r as usize, 0),
                (true, _) => (0, 0),
            }
        };
        let mut bufs = Vec::with_capacity(n as usize);
        for r in 0..n {
            let mut b = RankBuffers::zeroed(&mc, n, r, in_place);
            let (input_at, _) = at(r);
            let dst = if in_place {
                &mut b.output[input_at..input_at + in_len]
            } else {
                &mut b.input[..in_len]
            };
            verify::fill_input(&plan, call.op, r, self.salt, dst)
                .map_err(|e| CliError::internal(e.to_string()))?;
            bufs.push(b);
        }
        let cluster = Self::cluster(&mut self.payload, &self.cfg, true)?;
        let report = cluster
            .run(&calls, &mut bufs, in_place)
            .map_err(|e| run_failed("run", e))?;
        if let Some(Err(e)) = report.ranks.iter().find(|r| r.is_err()) {
            return Err(run_failed("collective", e));
        }
        // The test-only fault lands on a rank whose output is defined.
        let victim = match call.collective {
            ringcc_core::Collective::Reduce { root } => root.0 as usize,
            _ => 0,
        };
        let mut wrong = 0;
        for (r, b) in bufs.iter_mut().enumerate() {
            let (_, output_at) = at(r as u32);
            let out = &mut b.output[output_at..output_at + out_len];
            if r == victim {
                for e in out.chunks_exact_mut(elem).take(corrupt as usize) {
                    e[0] ^= 0x5a;
                }
            }
            wrong += verify::count_wrong(&plan, call.op, r as u32, self.salt, out)
                .map_err(|e| CliError::internal(e.to_string()))?;
        }
        self.salt = self.salt.wrapping_add(1);
        Ok(wrong)
    }
}
