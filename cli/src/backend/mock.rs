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
use ringcc_core::tune::{AlgoSet, ProtoSet, Tuner};
use ringcc_core::{ChannelId, Plan, Rank};
use ringcc_mock::{Calibration, Call, Cluster, ClusterConfig, GeneratedData, HopLatency};

use crate::args::{NcclFlag, TopoArgs};
use crate::error::CliError;
use crate::perf::{Estimate, PerfBackend};
use crate::topo;

/// The simulator as a `perf` backend.
pub struct MockBackend {
    cfg: ClusterConfig,
    tuner: Tuner,
    timing: Option<Cluster>,
    /// The payload clusters of the out-of-place and the in-place check.
    payload: [Option<Cluster>; 2],
    /// The check of the current size.
    generated: Option<GeneratedData>,
    /// The in-place check's `#wrong`, run beside the out-of-place one.
    in_place_wrong: Option<(Call, u64, Result<u64, String>)>,
    salt: u64,
}

/// Measured on a 2-core machine: wall seconds the simulator takes per
/// slice of a timing-only run, and per slice and per byte a GPU moves in a
/// payload run (reading its input, generating and checking included).
const TIMING_PER_SLICE: f64 = 65e-9;
const PAYLOAD_PER_SLICE: f64 = 0.8e-6;
const PAYLOAD_PER_BYTE: f64 = 0.7e-9;

/// The simulator configuration the topology flags describe: the preset's
/// (or the simulator's defaults), then every explicit flag over it.
pub fn config(t: &TopoArgs) -> Result<ClusterConfig, CliError> {
    let base = match topo::preset(t)? {
        Some(p) => p.config(t.nodes),
        None => ClusterConfig::default(),
    };
    let t_args = t;
    let t = &topo::resolve(t)?;
    let us = |v: Option<f64>, d: f64| v.map_or(d, |x| x * 1e-6);
    let k = base.calibration;
    let cfg = ClusterConfig {
        nodes: t.nodes,
        gpus_per_node: t.gpus_per_node,
        nics_per_node: t.nics_per_node,
        cross_nic: t.cross_nic,
        channels: t.channels(),
        chunk_bytes: t.chunk_bytes(),
        nvlink: Link {
            bandwidth: t.nvlink_gbps * 1e9,
            latency: us(t_args.nvlink_us, base.nvlink.latency),
        },
        nic: Link {
            bandwidth: t.nic_gbits * 1e9 / 8.0,
            latency: us(t_args.nic_us, base.nic.latency),
        },
        calibration: Calibration {
            nvlink_efficiency: t_args.nvlink_eff.unwrap_or(k.nvlink_efficiency),
            nic_efficiency: t_args.nic_eff.unwrap_or(k.nic_efficiency),
            channel_bandwidth: t_args.channel_gbps.map_or(k.channel_bandwidth, |g| g * 1e9),
            ll128_channel_bandwidth: t_args
                .ll128_channel_gbps
                .map(|g| g * 1e9)
                .or(k.ll128_channel_bandwidth),
            ll: HopLatency {
                nvlink: us(t_args.ll_nvlink_us, k.ll.nvlink),
                nic: us(t_args.ll_nic_us, k.ll.nic),
            },
            ll128: HopLatency {
                nvlink: us(t_args.ll128_nvlink_us, k.ll128.nvlink),
                nic: us(t_args.ll128_nic_us, k.ll128.nic),
            },
            nic_message_overhead: us(t_args.nic_overhead_us, k.nic_message_overhead),
            launch_latency: us(t_args.launch_us, k.launch_latency),
            launches_per_thread: t_args.launches_per_thread.unwrap_or(k.launches_per_thread),
            proxy_latency: us(t_args.proxy_us, k.proxy_latency),
            reported_net_latency: us(t_args.net_latency_us, k.reported_net_latency),
        },
        ..base
    };
    cfg.validate().map_err(|e| CliError::usage(e.to_string()))?;
    Ok(cfg)
}

/// The tuner for `cfg` with the overrides: `--algo` / `--proto`, else
/// `RINGCC_ALGO` / `RINGCC_PROTO` (NCCL_ALGO / NCCL_PROTO syntax). The
/// simulator runs every algorithm × protocol
/// ([`ClusterConfig::CAPABILITIES`]), so only a malformed list is refused
/// here.
pub fn tuner(t: &TopoArgs, cfg: &ClusterConfig) -> Result<Tuner, CliError> {
    let mut tuner = cfg.tuner();
    let from = |flag: &Option<String>, env: &str| -> Option<(String, String)> {
        flag.clone()
            .map(|v| (format!("--{}", &env[7..].to_ascii_lowercase()), v))
            .or_else(|| std::env::var(env).ok().map(|v| (env.to_string(), v)))
    };
    if let Some((src, v)) = from(&t.algo, "RINGCC_ALGO") {
        tuner.algos = AlgoSet::parse(&v).map_err(|e| CliError::usage(format!("{src} {v}: {e}")))?;
    }
    if let Some((src, v)) = from(&t.proto, "RINGCC_PROTO") {
        tuner.protos =
            ProtoSet::parse(&v).map_err(|e| CliError::usage(format!("{src} {v}: {e}")))?;
    }
    Ok(tuner)
}

impl MockBackend {
    /// A simulated cluster of the flags' shape.
    pub fn new(t: &TopoArgs) -> Result<MockBackend, CliError> {
        let cfg = config(t)?;
        Ok(MockBackend {
            tuner: tuner(t, &cfg)?,
            cfg,
            timing: None,
            payload: [None, None],
            generated: None,
            in_place_wrong: None,
            salt: 0x6e63_636c,
        })
    }

    /// The tuner's choice for `call` (the timed run and its check take
    /// the same).
    fn choice(&self, call: &Call) -> Result<ringcc_core::tune::Choice, CliError> {
        self.tuner
            .choose(call.collective, nccl_tests_size(call, self.ranks()))
            .map_err(|e| CliError::usage(e.to_string()))
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

/// nccl-tests' size of a call: the whole buffer (`n` blocks for
/// ReduceScatter and AllGather).
pub fn nccl_tests_size(call: &Call, n: u32) -> u64 {
    let bytes = call.count.saturating_mul(u64::from(call.dtype.size()));
    match call.collective {
        ringcc_core::Collective::ReduceScatter | ringcc_core::Collective::AllGather => {
            bytes.saturating_mul(u64::from(n))
        }
        _ => bytes,
    }
}

/// One checked payload run; its `#wrong`, or why it failed.
fn checked_run(
    cluster: &mut Cluster,
    calls: &[Call],
    data: &mut GeneratedData,
    in_place: bool,
) -> Result<u64, String> {
    let report = cluster
        .run_generated(calls, data, in_place)
        .map_err(|e| format!("simulated run failed: {e}"))?;
    if let Some(Err(e)) = report.ranks.iter().find(|r| r.is_err()) {
        return Err(format!("simulated collective failed: {e}"));
    }
    Ok(data.wrong())
}

/// The header's line of the calibration in effect: the LL / LL128 hops,
/// launch and proxy latencies, link efficiencies and channel limits (the
/// Simple hops are on the line before), so that a run's table says what
/// it was simulated with.
fn calibration_line(c: &ClusterConfig) -> String {
    let k = &c.calibration;
    let us = |s: f64| s * 1e6;
    let gbps = |b: f64| {
        if b.is_finite() {
            format!("{:.1} GB/s", b / 1e9)
        } else {
            "none".to_string()
        }
    };
    let mut line = format!(
        "  hops (NVLink/NIC): LL {:.1}/{:.1} us, LL128 {:.1}/{:.1} us; launch {:.1} us",
        us(k.ll.nvlink),
        us(k.ll.nic),
        us(k.ll128.nvlink),
        us(k.ll128.nic),
        us(k.launch_latency),
    );
    if k.launches_per_thread > 1 {
        line += &format!(" x up to {} per thread", k.launches_per_thread);
    }
    line += &format!(
        "; proxy {:.1} us x the call's channels per network crossing; \
         efficiency NVLink {:.2}, NIC {:.2}; channel limit {}",
        us(k.proxy_latency),
        k.nvlink_efficiency,
        k.nic_efficiency,
        gbps(k.channel_bandwidth),
    );
    if let Some(b) = k.ll128_channel_bandwidth {
        line += &format!(" (LL128 {})", gbps(b));
    }
    if k.nic_message_overhead > 0.0 {
        line += &format!("; NIC {:.1} us per message", us(k.nic_message_overhead));
    }
    if k.reported_net_latency > 0.0 {
        line += &format!(
            "; the tuner is told {:.0} us of network latency",
            us(k.reported_net_latency)
        );
    }
    line
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
            calibration_line(c),
            // The timed run takes the tuner's algorithm and protocol; the
            // payload check (`#wrong`) moves and reduces the bytes with the
            // same algorithm (ring or tree), under Simple: the simulator's
            // payload mode carries Simple slots only, so LL/LL128 lines are
            // timing-only there (the core's own tests prove them:
            // line_props, loom_line).
            "  algorithm, protocol and channels per size: the tuner's (`ringcc explain`); #wrong \
             checks the data with the row's algorithm and channels (ring or tree) under Simple's \
             bytes (LL/LL128 run timing-only)"
                .to_string(),
        ]
    }

    fn simulated(&self) -> bool {
        true
    }

    fn time(
        &mut self,
        call: &Call,
        in_place: bool,
        warmup: u32,
        iters: u32,
    ) -> Result<f64, CliError> {
        let n = self.ranks();
        let calls = vec![*call; n as usize];
        let choice = self.choice(call)?;
        let cluster = Self::cluster(&mut self.timing, &self.cfg, false)?;
        cluster
            .set_protocol(choice.chosen.protocol)
            .map_err(|e| run_failed("protocol", e))?;
        cluster
            .set_algorithm(choice.chosen.algorithm)
            .map_err(|e| run_failed("algorithm", e))?;
        cluster
            .set_channels(Some(choice.chosen.channels))
            .map_err(|e| run_failed("channels", e))?;
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

    /// Checks `call` in both placements at once, on two threads (the runs
    /// are independent, and the check is most of a simulated perf run's
    /// wall time); returns the out-of-place `#wrong` and keeps the
    /// in-place one for the call that asks for it next.
    fn check(&mut self, call: &Call, in_place: bool, corrupt: u64) -> Result<u64, CliError> {
        if in_place {
            if let Some((c, k, w)) = self.in_place_wrong.take() {
                if c == *call && k == corrupt {
                    return w.map_err(CliError::failed);
                }
            }
        }
        let n = self.ranks();
        let mc = *call;
        // The timed row's algorithm and channels (the tuner's choice, as
        // `time` made it), under Simple: the payload clusters carry Simple slots only.
        let chosen = self.choice(call)?.chosen;
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
            ringcc_core::Collective::Reduce { root } => root,
            _ => Rank(0),
        };
        data.corrupt_output(victim, corrupt);
        let calls = vec![mc; n as usize];
        let [out_cl, in_cl] = &mut self.payload;
        let out_cl = Self::cluster(out_cl, &self.cfg, true)?;
        out_cl
            .set_algorithm(chosen.algorithm)
            .and_then(|()| out_cl.set_channels(Some(chosen.channels)))
            .map_err(|e| run_failed("algorithm and channels", e))?;
        let in_cl = Self::cluster(in_cl, &self.cfg, true)?;
        in_cl
            .set_algorithm(chosen.algorithm)
            .and_then(|()| in_cl.set_channels(Some(chosen.channels)))
            .map_err(|e| run_failed("algorithm and channels", e))?;
        if in_place {
            // Asked for in place alone (not after its out-of-place twin).
            return checked_run(in_cl, &calls, data, true).map_err(CliError::failed);
        }
        let mut twin = data.share();
        let (out_w, in_w) = std::thread::scope(|s| {
            let t = s.spawn(|| checked_run(in_cl, &calls, &mut twin, true));
            let out_w = checked_run(out_cl, &calls, data, false);
            let in_w = t
                .join()
                .unwrap_or_else(|_| Err("the in-place check panicked".into()));
            (out_w, in_w)
        });
        self.in_place_wrong = Some((*call, corrupt, in_w));
        out_w.map_err(CliError::failed)
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

    fn estimate(&self, call: &Call, calls: u64, checked: bool) -> Estimate {
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
        let mc = *call;
        let (input, output) = mc.buffer_bytes(n);
        // Each rank reads its input and writes its output about once.
        let moved = (input as u64)
            .saturating_add(output as u64)
            .saturating_mul(u64::from(n)) as f64;
        // Both placements run at once, sharing the reference.
        let check = GeneratedData::reference_bytes(&mc, n)
            .saturating_add(GeneratedData::run_bytes(&mc, n).saturating_mul(2));
        // FIFO space a lane touches: every slice position of its FIFO, as
        // far as the call's slices fill it (fresh zero pages cost nothing
        // until written); RDMA hops also have a staging FIFO.
        let g = &c.geometry;
        let positions = (g.fifo_bytes() / g.slice_bytes().max(1)).max(1);
        let buffer = input.max(output) as u64;
        let step = c
            .chunk_bytes
            .min(buffer.div_ceil(u64::from(c.channels).max(1) * u64::from(n)));
        let slice = g.slice_bytes().min(step).div_ceil(4096) * 4096;
        let fifo = g.fifo_bytes().min(positions.saturating_mul(slice));
        let fifos = lanes.saturating_mul(fifo).saturating_mul(2 * 2);
        Estimate {
            bytes: base.saturating_add(check).saturating_add(fifos),
            // Two placements on two cores: a little more than one.
            seconds: 2.0 * timing + 1.3 * (slices * PAYLOAD_PER_SLICE + moved * PAYLOAD_PER_BYTE),
            unchecked_bytes: base,
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use ringcc_core::{Collective, DataType, ReduceOp};

    use super::*;
    use crate::args::{Cli, Command};

    fn backend(flags: &[&str]) -> MockBackend {
        let args = ["ringcc", "perf", "allreduce"].iter().chain(flags);
        let Command::Perf(p) = Cli::try_parse_from(args).unwrap().command else {
            panic!("not perf");
        };
        MockBackend::new(&p.topo).unwrap()
    }

    /// The header says the calibration a table was simulated with: the
    /// preset's figures, and a flag's where one overrides it.
    #[test]
    fn the_header_names_the_calibration() {
        let line = |flags: &[&str]| backend(flags).describe()[2].clone();
        let plain = line(&["--nodes", "2"]);
        assert!(plain.contains("LL 0.6/2.7 us, LL128 1.9/4.0 us"), "{plain}");
        assert!(plain.contains("launch 0.0 us; proxy 0.0 us"), "{plain}");
        assert!(plain.contains("channel limit none"), "{plain}");
        let h100 = line(&["--nodes", "2", "--preset", "dgx-h100"]);
        assert!(h100.contains("LL 0.3/4.0 us, LL128 1.0/4.0 us"), "{h100}");
        assert!(
            h100.contains("launch 4.0 us; proxy 0.8 us x the call's channels"),
            "{h100}"
        );
        assert!(h100.contains("efficiency NVLink 0.82, NIC 0.96"), "{h100}");
        assert!(
            h100.contains("channel limit 24.0 GB/s (LL128 36.7 GB/s)"),
            "{h100}"
        );
        let set = line(&[
            "--nodes",
            "2",
            "--preset",
            "p5-efa",
            "--proxy-us",
            "2",
            "--launches-per-thread",
            "8",
        ]);
        assert!(set.contains("proxy 2.0 us"), "{set}");
        assert!(set.contains("x up to 8 per thread"), "{set}");
        assert!(set.contains("NIC 1.0 us per message"), "{set}");
        assert!(set.contains("told 75 us of network latency"), "{set}");
    }

    /// The check runs the timed row's algorithm: where the tuner picks
    /// Tree, the payload clusters run the tree (and `#wrong` counts what
    /// it got wrong); where it picks Ring, the ring.
    #[test]
    fn the_check_runs_the_timed_rows_algorithm() {
        let mut b = backend(&["--nodes", "2", "--gpus-per-node", "4"]);
        let mut seen = Vec::new();
        for count in [2u64, 1 << 12, 1 << 22] {
            let call = Call::new(Collective::AllReduce, count, DataType::F32, ReduceOp::Sum);
            let algo = b.choice(&call).unwrap().chosen.algorithm;
            seen.push(algo);
            assert_eq!(b.check(&call, false, 0).unwrap(), 0, "{count} {algo}");
            assert_eq!(b.check(&call, true, 0).unwrap(), 0, "{count} {algo}");
            for cl in b.payload.iter().flatten() {
                assert_eq!(cl.algorithm(), algo, "{count}");
            }
            let call = Call::new(Collective::AllReduce, count, DataType::I32, ReduceOp::Max);
            assert_eq!(b.check(&call, false, 2).unwrap(), 2, "{count} {algo}");
            assert_eq!(b.check(&call, true, 2).unwrap(), 2, "{count} {algo}");
        }
        assert!(seen.contains(&ringcc_core::Algorithm::Tree), "{seen:?}");
        assert!(seen.contains(&ringcc_core::Algorithm::Ring), "{seen:?}");
    }

    /// The launch and proxy flags: none leaves the simulator's defaults
    /// (no launch, no proxy), a preset sets its figures, a flag wins.
    #[test]
    fn launch_and_proxy_flags() {
        let k = |flags: &[&str]| backend(flags).cfg.calibration;
        let none = k(&["--nodes", "2"]);
        assert_eq!(
            (
                none.launch_latency,
                none.launches_per_thread,
                none.proxy_latency
            ),
            (0.0, 1, 0.0)
        );
        let preset = k(&["--nodes", "2", "--preset", "dgx-h100"]);
        assert_eq!(preset.launch_latency, ringcc_mock::PRESET_LAUNCH_LATENCY);
        assert_eq!(preset.proxy_latency, ringcc_mock::PRESET_PROXY_LATENCY);
        let set = k(&[
            "--preset",
            "dgx-h100",
            "--launch-us",
            "2.5",
            "--launches-per-thread",
            "8",
            "--proxy-us",
            "3",
        ]);
        assert!((set.launch_latency - 2.5e-6).abs() < 1e-15);
        assert_eq!(set.launches_per_thread, 8);
        assert!((set.proxy_latency - 3e-6).abs() < 1e-15);
        let args = ["ringcc", "perf", "allreduce", "--launches-per-thread", "0"];
        let Command::Perf(p) = Cli::try_parse_from(args).unwrap().command else {
            panic!("not perf");
        };
        assert!(MockBackend::new(&p.topo).is_err());
    }

    /// The EFA presets: p4d-efa's node (4 NICs of 100 Gb/s unless a flag
    /// says otherwise) and the reported network latency, which reaches
    /// the tuner (a flag wins) and no other preset has.
    #[test]
    fn efa_presets_and_the_reported_network_latency() {
        let cfg = |flags: &[&str]| backend(flags).cfg;
        let p4d = cfg(&["--nodes", "2", "--preset", "p4d-efa"]);
        assert_eq!(p4d.nics_per_node, 4);
        assert!((p4d.nic.bandwidth - 12.5e9).abs() < 1.0);
        assert_eq!(
            p4d.calibration.reported_net_latency,
            ringcc_mock::EFA_REPORTED_LATENCY
        );
        assert_eq!(p4d.hardware().net_latency_us, 75.0);
        let a100 = cfg(&["--nodes", "2", "--preset", "dgx-a100"]);
        assert_eq!(a100.nics_per_node, 8);
        assert_eq!(a100.hardware().net_latency_us, 0.0);
        let extra = ringcc_mock::EFA_REPORTED_LATENCY;
        let close = |a: f64, b: f64| (a - b).abs() < 1e-12;
        assert!(close(
            p4d.calibration.ll.nic,
            a100.calibration.ll.nic + extra
        ));
        assert!(close(
            p4d.calibration.ll128.nic,
            a100.calibration.ll128.nic + extra
        ));
        assert!(close(p4d.nic.latency, a100.nic.latency + extra));
        let p5 = cfg(&["--nodes", "2", "--preset", "p5-efa"]);
        let proxy = p5.calibration.proxy_latency;
        assert!(close(
            p5.calibration.ll.nic + proxy,
            ringcc_mock::EFA_P5_STEP
        ));
        assert!(close(
            p5.nic.latency + proxy,
            ringcc_mock::EFA_P5_STEP + ringcc_mock::EFA_P5_SIMPLE_EXTRA
        ));
        assert_eq!(p5.hardware().net_latency_us, 75.0);
        let set = cfg(&[
            "--nodes",
            "2",
            "--preset",
            "p4d-efa",
            "--nics-per-node",
            "2",
            "--net-latency-us",
            "10",
        ]);
        assert_eq!(set.nics_per_node, 2);
        assert!((set.hardware().net_latency_us - 10.0).abs() < 1e-9);
        // What the tuner is told moves its estimates, not the simulated hops.
        assert_eq!(set.calibration.ll.nic, p4d.calibration.ll.nic);
        let est = |c: &ringcc_mock::ClusterConfig| {
            c.tuner()
                .estimate(
                    Collective::AllReduce,
                    8,
                    ringcc_core::Algorithm::Tree,
                    ringcc_core::Protocol::Ll,
                )
                .unwrap()
                .latency_us
        };
        let told = cfg(&[
            "--nodes",
            "2",
            "--preset",
            "p4d-efa",
            "--net-latency-us",
            "0",
        ]);
        assert!((est(&p4d) - est(&told) - 2.0 * 75.0).abs() < 1e-9);
    }

    /// The LL128 channel limit: none without a preset (the channel limit
    /// applies), NCCL's perChMaxRingLL128Bws with one, a flag wins.
    #[test]
    fn ll128_channel_limit_flag() {
        let k = |flags: &[&str]| backend(flags).cfg.calibration;
        assert_eq!(k(&["--nodes", "2"]).ll128_channel_bandwidth, None);
        assert_eq!(
            k(&["--preset", "dgx-h100"]).ll128_channel_bandwidth,
            Some(36.7e9)
        );
        assert_eq!(
            k(&["--preset", "dgx-a100"]).ll128_channel_bandwidth,
            Some(20e9)
        );
        let set = k(&["--preset", "dgx-h100", "--ll128-channel-gbps", "50"]);
        assert_eq!(set.ll128_channel_bandwidth, Some(50e9));
        let args = ["ringcc", "perf", "allreduce", "--ll128-channel-gbps", "0"];
        let Command::Perf(p) = Cli::try_parse_from(args).unwrap().command else {
            panic!("not perf");
        };
        assert!(MockBackend::new(&p.topo).is_err());
    }
}
