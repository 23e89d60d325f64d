//! The simulator's state and its run loop: build a machine per lane for
//! the call, drive them, process events until every lane has finished
//! (done, failed or dead) and no abort is still on its way, then report.
//!
//! Failures propagate like NCCL's asynchronous errors: the first lane of a
//! rank to fail stops the rank's other lanes and broadcasts an abort over
//! the control network; every rank that receives it fails, even one that
//! had finished (its success was not confirmed before the abort). Every
//! lane also has its own deadline: no progress for `deadline` virtual
//! seconds is a timeout. So a dead peer ends the run in bounded virtual
//! time, and only a rank whose own result is complete, in a run where no
//! rank failed, reports success.

use ringcc_core::{ChannelId, Plan, Rank};

use crate::config::ClusterConfig;
use crate::error::Error;
use crate::events::{
    ps, secs, Ev, Events, Packed, Ps, Rate, Slab, KIND_EXEC_DONE, KIND_TAIL, KIND_WAKE,
};
use crate::exec::Xfer;
use crate::fabric::Fabric;
use crate::faults::FaultState;
use crate::flow::give_up_after;
use crate::generated::GeneratedData;
use crate::lane::{LaneState, Lanes, CAPACITIES};
use crate::memory::Memory;
use crate::pcap::Capture;
use crate::report::{BufLayout, Call, LinkStats, RankBuffers, RunReport, Stats};
use crate::rnic::{NicPort, Rnic};
use crate::trace::Trace;

/// A rank's fate in the current run.
#[derive(Clone, Debug, Default)]
pub(crate) struct RankState {
    pub died: Option<Ps>,
    pub error: Option<Error>,
    pub aborted: Option<u32>,
    pub abort_sent: bool,
}

/// The bytes a payload run reads and writes.
#[derive(Debug, Default)]
pub(crate) enum RunData {
    /// Timing-only: none.
    #[default]
    None,
    /// The callers' buffers, one pair per rank.
    Buffers(Vec<RankBuffers>),
    /// Inputs generated where they are read, outputs checked where they
    /// are written.
    Generated(GeneratedData),
}

/// What the current run needs.
#[derive(Debug, Default)]
pub(crate) struct RunCtx {
    pub calls: Vec<Call>,
    pub elem: Vec<u64>,
    pub layouts: Vec<BufLayout>,
    pub data: RunData,
    pub epoch: u32,
    pub active: bool,
    pub finished: usize,
    pub aborts_in_flight: u64,
    /// Some rank's call starts later than it is issued (a launch latency):
    /// each rank's engine is driven from its `launch_at` on.
    pub staggered: bool,
    /// When each rank's kernel starts (staggered runs only).
    pub launch_at: Vec<Ps>,
    /// When the last exec of the run so far finished: where the call ends,
    /// as an NCCL kernel returns after its last copy or reduction without
    /// waiting for the final credits (the next call's sends find their
    /// slots freed long before they need them).
    pub last_exec: Ps,
}

impl RunCtx {
    /// Whether `rank`'s kernel has not started at `now`: its engine takes
    /// what arrives (tails land in its FIFO) but does not act.
    #[inline(always)]
    pub fn before_launch(&self, rank: u32, now: Ps) -> bool {
        self.staggered && self.launch_at.get(rank as usize).is_some_and(|&t| now < t)
    }
}

pub(crate) struct Sim<const N: usize> {
    pub cfg: ClusterConfig,
    pub fab: Fabric,
    pub events: Events,
    /// Every lane, and each rank's core progress engine.
    pub lanes: Lanes<N>,
    pub ranks: Vec<RankState>,
    pub run: RunCtx,
    pub mem: Memory,
    pub nic: Rnic,
    pub faults: FaultState,
    pub trace: Trace,
    pub capture: Capture,
    pub stats: Stats,
    pub xfers: Slab<Xfer>,
    pub time: Timing,
    pub aborted: Option<Error>,
    /// The algorithm later runs use (Ring unless set).
    pub algorithm: ringcc_core::Algorithm,
    /// The channels later runs use (all the cluster's unless set): the
    /// tuner's count for the call's size, as NCCL drops channels a small
    /// call would leave nearly empty.
    pub channels: Option<u32>,
    /// A tree call's transport state.
    pub tree: crate::treerun::TreeState,
}

/// What a [`Cluster`](crate::Cluster) asks of its simulation, whatever
/// the capacity `N` of its engines ([`Lanes`] says why that is a type
/// parameter): one virtual call per collective or query, none per event.
pub(crate) trait Simulation: Send {
    fn cfg(&self) -> &ClusterConfig;
    fn fab(&self) -> &Fabric;
    fn now(&self) -> Ps;
    fn aborted(&self) -> bool;
    fn algorithm(&self) -> ringcc_core::Algorithm;
    fn stats(&self) -> &Stats;
    fn trace(&self) -> &Trace;
    fn capture(&self) -> &Capture;
    fn used_channels(&self) -> u32;
    fn run(
        &mut self,
        calls: &[Call],
        data: &mut RunData,
        in_place: bool,
    ) -> Result<RunReport, Error>;
    fn set_protocol(&mut self, protocol: ringcc_core::Protocol) -> Result<(), Error>;
    fn set_algorithm(&mut self, algorithm: ringcc_core::Algorithm) -> Result<(), Error>;
    fn set_channels(&mut self, channels: Option<u32>) -> Result<(), Error>;
}

/// The simulation of `cfg`, with engines of the smallest of
/// [`CAPACITIES`] that holds its channels.
pub(crate) fn new_simulation(cfg: ClusterConfig) -> Result<Box<dyn Simulation>, Error> {
    let [small, mid, _] = CAPACITIES;
    let channels = cfg.channels as usize;
    Ok(if channels <= small {
        Box::new(Sim::<{ CAPACITIES[0] }>::new(cfg)?)
    } else if channels <= mid {
        Box::new(Sim::<{ CAPACITIES[1] }>::new(cfg)?)
    } else {
        Box::new(Sim::<{ CAPACITIES[2] }>::new(cfg)?)
    })
}

impl<const N: usize> Simulation for Sim<N> {
    fn cfg(&self) -> &ClusterConfig {
        &self.cfg
    }
    fn fab(&self) -> &Fabric {
        &self.fab
    }
    fn now(&self) -> Ps {
        self.events.now()
    }
    fn aborted(&self) -> bool {
        self.aborted.is_some()
    }
    fn algorithm(&self) -> ringcc_core::Algorithm {
        self.algorithm
    }
    fn stats(&self) -> &Stats {
        &self.stats
    }
    fn trace(&self) -> &Trace {
        &self.trace
    }
    fn capture(&self) -> &Capture {
        &self.capture
    }
    fn used_channels(&self) -> u32 {
        Sim::used_channels(self)
    }
    fn run(
        &mut self,
        calls: &[Call],
        data: &mut RunData,
        in_place: bool,
    ) -> Result<RunReport, Error> {
        Sim::run(self, calls, data, in_place)
    }
    fn set_protocol(&mut self, protocol: ringcc_core::Protocol) -> Result<(), Error> {
        Sim::set_protocol(self, protocol)
    }
    fn set_algorithm(&mut self, algorithm: ringcc_core::Algorithm) -> Result<(), Error> {
        Sim::set_algorithm(self, algorithm)
    }
    fn set_channels(&mut self, channels: Option<u32>) -> Result<(), Error> {
        Sim::set_channels(self, channels)
    }
}

/// The configuration's times and rates in simulator units.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Timing {
    /// Fixed cost of one slice on a GPU.
    pub gpu_overhead: Ps,
    /// A GPU's device-memory bandwidth.
    pub gpu_rate: Rate,
    /// From a doorbell to the NIC fetching the work request.
    pub doorbell: Ps,
    /// The NIC's retransmission timeout.
    pub rto: Ps,
    /// When a requester gives up on a lost message (all retries spent).
    pub give_up: Ps,
    /// A receiver-not-ready back-off.
    pub rnr_delay: Ps,
    /// A rank's deadline: no progress for this long is a timeout.
    pub deadline: Ps,
    /// The control network's latency (aborts).
    pub control: Ps,
    /// Wire bytes per data byte of the run's protocol, as a fraction.
    pub wire: (u64, u64),
    /// One channel's throughput limit, if any.
    pub channel_rate: Option<Rate>,
    /// A NIC message's fixed overhead, as bytes of its port's time.
    pub nic_overhead_bytes: u64,
    /// Every NVLink's latency under the run's protocol (they are all
    /// alike: `apply_protocol` sets them together). A credit's
    /// flag store reads it here rather than from its link, a cache miss
    /// per slice on large clusters.
    pub nvlink_latency: Ps,
}

impl Timing {
    /// A channel's limit under the run's protocol, in wire bytes per
    /// second (the executor times wire bytes): LL128's own figure where
    /// one is set (bytes of data: 16/15 of it on the wire), else the
    /// channel limit.
    fn channel_rate(cfg: &ClusterConfig) -> Option<Rate> {
        let k = &cfg.calibration;
        match (cfg.protocol, k.ll128_channel_bandwidth) {
            (ringcc_core::Protocol::Ll128, Some(data)) => {
                let (num, den) = crate::config::Calibration::wire_factor(cfg.protocol);
                Some(Rate::new(data * num as f64 / den as f64))
            }
            _ => (k.channel_bandwidth != f64::INFINITY).then(|| Rate::new(k.channel_bandwidth)),
        }
    }

    fn new(cfg: &ClusterConfig) -> Timing {
        Timing {
            gpu_overhead: ps(cfg.gpu.step_overhead),
            gpu_rate: Rate::new(cfg.gpu.mem_bandwidth),
            doorbell: ps(cfg.rnic.doorbell_latency),
            rto: ps(cfg.rnic.rto()),
            give_up: give_up_after(cfg),
            rnr_delay: ps(cfg.rnic.rnr_delay),
            deadline: ps(cfg.deadline),
            control: ps(cfg.control.latency),
            wire: crate::config::Calibration::wire_factor(cfg.protocol),
            channel_rate: Timing::channel_rate(cfg),
            nic_overhead_bytes: (cfg.calibration.nic_message_overhead
                * cfg.nic.bandwidth
                * cfg.calibration.nic_efficiency)
                .round() as u64,
            nvlink_latency: ps(cfg.nvlink.latency),
        }
    }

    /// `bytes` of data as bytes on a link under the run's protocol.
    #[inline(always)]
    pub fn wire_bytes(&self, bytes: u64) -> u64 {
        let (num, den) = self.wire;
        if num == den {
            bytes
        } else {
            bytes.saturating_mul(num).div_ceil(den.max(1))
        }
    }
}

/// How far ahead [`Sim::prefetch_ahead`] looks: far enough for the misses
/// to complete, near enough for the lines to stay (measured: 6 to 24 are
/// alike on 1024 ranks).
const PREFETCH_AHEAD: usize = 12;

/// Initial calendar bucket width: each lane has an event every
/// microsecond or so; aim at about ten distinct times per bucket (the
/// calendar adapts the width from there).
fn bucket_shift(lanes: usize) -> u32 {
    let width = 32e6 / lanes.max(1) as f64;
    (width.log2().floor() as u32).clamp(8, 30)
}

impl<const N: usize> Sim<N> {
    /// Switches the protocol of later runs: the links' latencies and the
    /// wire factor follow it.
    pub fn set_protocol(&mut self, protocol: ringcc_core::Protocol) -> Result<(), Error> {
        let mut cfg = self.cfg.clone();
        cfg.protocol = protocol;
        cfg.validate()?;
        self.cfg.protocol = protocol;
        self.apply_protocol();
        Ok(())
    }

    /// Every rank's tree plan of a tree call (AllReduce only), and the
    /// trees' peers.
    fn tree_plans(
        &mut self,
        calls: &[Call],
        chunk_bytes: u64,
    ) -> Result<Vec<ringcc_core::TreePlan>, Error> {
        let n = self.fab.ranks;
        let used = self.used_channels();
        let plans = calls
            .iter()
            .enumerate()
            .map(|(r, c)| {
                let invalid = |source| Error::InvalidCall {
                    rank: Rank(r as u32),
                    source,
                };
                if c.collective != ringcc_core::Collective::AllReduce {
                    return Err(invalid(ringcc_core::Error::BadTopology));
                }
                ringcc_core::TreePlan::new(c.count, c.dtype, n, used, chunk_bytes).map_err(invalid)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let used = plans.first().map_or(0, |p| p.channels());
        self.tree_peers(used)?;
        Ok(plans)
    }

    /// The FIFO geometry and chunk of a call under the run's protocol
    /// (`core::line`'s): Simple keeps the configured ones; LL and LL128
    /// use one slot per slice, NCCL's slot size (LL 32 KiB of data,
    /// LL128 576,000 B, capped by the configured slot) and a chunk of one
    /// slice. So an LL connection has 8 slices in flight where Simple has
    /// 4: on a NIC hop, whose credit comes back a network round trip
    /// later, that is half the credit stalls of a small message.
    pub fn call_geometry(&self) -> Result<(ringcc_core::fifo::FifoGeometry, u64), Error> {
        let p = self.cfg.protocol;
        let g = p
            .fifo_geometry(self.cfg.geometry)
            .map_err(|e| Error::BadConfig {
                what: format!("{p} cannot cut this FIFO geometry into slots: {e}"),
            })?;
        Ok((g, p.chunk_bytes(g, self.cfg.chunk_bytes)))
    }

    /// The FIFO geometry and chunk of a tree call of `bytes` per rank.
    ///
    /// NCCL's tree runs one FIFO step per slice and per chunk
    /// (`chunkSteps = sliceSteps = 1` for every algorithm but Ring,
    /// src/enqueue.cc), and for Simple halves that chunk while the
    /// channel's data makes too few of them for the tree's depth: below
    /// `depth·8` chunks down to 128 KiB, below `depth·4` down to 64 KiB,
    /// below `depth` down to 32 KiB (`tree.depth` = ranks per node − 1 +
    /// log2(nodes), src/graph/connect.cc). So a slice here is NCCL's tree
    /// chunk, in one slot. LL and LL128 slots get the same cap: their
    /// receivers forward line by line as lines land, which a simulator
    /// moving whole slots approaches with small slots.
    ///
    /// NCCL runs the reduce-up and broadcast-down halves concurrently
    /// (`runTreeSplit`, src/device/all_reduce.h), and so does the core's
    /// tree machine (one stream each, slice by slice). The core's chunk
    /// stays as many slices as the FIFO pipelines (7 of 8 slots): it was
    /// the unit of the earlier one-machine interleave, where one-slice
    /// chunks made each rank wait a whole round trip of the tree every two
    /// slices; with the split streams it only groups the steps.
    pub fn tree_geometry(
        &self,
        bytes: u64,
    ) -> Result<(ringcc_core::fifo::FifoGeometry, u64), Error> {
        let (g, _) = self.call_geometry()?;
        let g = {
            let nodes = u64::from(self.cfg.nodes.max(1));
            let depth = u64::from(self.cfg.gpus_per_node.max(1)) - 1
                + u64::from(63 - nodes.leading_zeros());
            let per_channel = bytes / u64::from(self.used_channels().max(1));
            let mut slice = g.slot_bytes().min(512 * 1024);
            for (times, floor) in [(8, 128 * 1024), (4, 64 * 1024), (1, 32 * 1024)] {
                while per_channel / slice < depth * times && slice > floor {
                    slice /= 2;
                }
            }
            ringcc_core::fifo::FifoGeometry::new(slice, 1).map_err(|e| Error::BadConfig {
                what: format!("tree FIFO geometry of {slice} B slots: {e}"),
            })?
        };
        Ok((g, g.max_chunk_bytes()))
    }

    /// The (NVLink, NIC) hop latencies of the run's protocol, seconds (the
    /// NIC's with the network proxy's sweep: see
    /// [`Calibration::proxy_latency`](crate::config::Calibration::proxy_latency)).
    pub fn protocol_latencies(&self) -> (f64, f64) {
        use ringcc_core::Protocol;
        let k = &self.cfg.calibration;
        let (nvlink, nic) = match self.cfg.protocol {
            Protocol::Simple => (self.cfg.nvlink.latency, self.cfg.nic.latency),
            Protocol::Ll => (k.ll.nvlink, k.ll.nic),
            Protocol::Ll128 => (k.ll128.nvlink, k.ll128.nic),
        };
        // One proxy thread per rank progresses every channel's network
        // operation in turn: a message waits about one sweep of them.
        (
            nvlink,
            nic + k.proxy_latency * f64::from(self.used_channels()),
        )
    }

    /// Switches the algorithm of later runs (Tree: AllReduce only; in
    /// payload mode it moves and reduces the bytes as the ring does).
    pub fn set_algorithm(&mut self, algorithm: ringcc_core::Algorithm) -> Result<(), Error> {
        self.algorithm = algorithm;
        Ok(())
    }

    /// Later runs use the first `channels` of the cluster's channels
    /// (`None`: all of them).
    pub fn set_channels(&mut self, channels: Option<u32>) -> Result<(), Error> {
        if let Some(n) = channels.filter(|&n| n == 0 || n > self.cfg.channels) {
            return Err(Error::BadConfig {
                what: format!(
                    "{n} channels for a call on a cluster of {} channels",
                    self.cfg.channels
                ),
            });
        }
        self.channels = channels;
        // The proxy's sweep, and so the NIC hop, depends on the channels.
        self.apply_protocol();
        Ok(())
    }

    /// The channels a run uses.
    pub fn used_channels(&self) -> u32 {
        self.channels.unwrap_or(self.cfg.channels)
    }

    fn apply_protocol(&mut self) {
        let (nvlink, nic) = self.protocol_latencies();
        self.time.nvlink_latency = ps(nvlink);
        for l in &mut self.fab.links {
            l.latency = match l.kind {
                crate::fabric::LinkKind::NvLink { .. } => ps(nvlink),
                crate::fabric::LinkKind::NicTx { .. } => ps(nic),
            };
        }
        self.time.wire = crate::config::Calibration::wire_factor(self.cfg.protocol);
        self.time.channel_rate = Timing::channel_rate(&self.cfg);
    }

    /// The simulation of `cfg`, its engines holding `N` channels each
    /// (at least the configuration's: [`new_simulation`] picks `N`).
    pub fn new(cfg: ClusterConfig) -> Result<Sim<N>, Error> {
        cfg.validate()?;
        let fab = Fabric::build(&cfg)?;
        let n = fab.ranks;
        let ports = fab
            .ports
            .iter()
            .map(|p| NicPort::new(p.node, p.nic))
            .collect();
        let lanes_len = fab.lanes.len();
        let lanes = Lanes::new(&fab, ps(cfg.deadline)).ok_or_else(|| Error::BadConfig {
            what: format!("{} channels in engines of {N}", fab.channels),
        })?;
        let mut sim = Sim {
            time: Timing::new(&cfg),
            faults: FaultState::new(&cfg.faults, cfg.seed, &fab)?,
            trace: Trace::new(cfg.trace),
            capture: Capture::new(cfg.capture),
            mem: Memory::new(if cfg.payload { n } else { 0 }),
            nic: Rnic::new(ports),
            ranks: vec![RankState::default(); n as usize],
            run: RunCtx::default(),
            stats: Stats::default(),
            xfers: Slab::new(),
            events: Events::new(bucket_shift(lanes_len)),
            aborted: None,
            algorithm: ringcc_core::Algorithm::Ring,
            channels: None,
            tree: Default::default(),
            lanes,
            fab,
            cfg,
        };
        if sim.cfg.protocol != ringcc_core::Protocol::Simple
            || sim.cfg.calibration.proxy_latency > 0.0
        {
            sim.apply_protocol();
        }
        if sim.cfg.payload {
            sim.setup_payload()?;
        }
        let deaths: Vec<(u32, Ps)> = sim.faults.ranks.deaths().collect();
        for (rank, t) in deaths {
            sim.events.at(t, Ev::Death { rank });
        }
        sim.update_stats();
        Ok(sim)
    }

    fn update_stats(&mut self) {
        self.stats.events = self.events.processed();
        self.stats.event_hash = self.events.hash();
        self.stats.links = self
            .fab
            .links
            .iter()
            .map(|l| LinkStats {
                name: l.kind.name(),
                kind: l.kind,
                bytes: l.bytes,
                messages: l.messages,
                busy: secs(l.busy),
            })
            .collect();
    }

    fn check_buffers(
        &self,
        calls: &[Call],
        buffers: &[RankBuffers],
        in_place: bool,
    ) -> Result<(), Error> {
        let n = self.fab.ranks;
        if buffers.len() != n as usize {
            return Err(Error::BufferCount {
                ranks: n,
                buffers: buffers.len(),
            });
        }
        for (r, (call, b)) in calls.iter().zip(buffers).enumerate() {
            let l = BufLayout::new(call, n, r as u32, in_place);
            let rank = r as u32;
            let checks: &[(&'static str, usize, usize)] = if in_place {
                &[("in-place", l.in_place_len(), b.output.len())]
            } else {
                &[
                    ("input", l.input_len, b.input.len()),
                    ("output", l.output_len, b.output.len()),
                ]
            };
            for &(which, expected, got) in checks {
                if expected != got {
                    return Err(Error::BadBuffer {
                        rank: Rank(rank),
                        which,
                        expected,
                        got,
                    });
                }
            }
        }
        Ok(())
    }

    /// One collective on every rank.
    ///
    /// `data` moves into the simulator for the run and back at its end
    /// (it is left as it was when the run cannot start).
    ///
    /// Never inlined (into [`Simulation::run`]): the event loop compiles
    /// as its own function, as it did before `Sim` took its capacity
    /// parameter; inlined, it ran 1.3 % more instructions (cachegrind,
    /// `timing-128`).
    #[inline(never)]
    pub fn run(
        &mut self,
        calls: &[Call],
        data: &mut RunData,
        in_place: bool,
    ) -> Result<RunReport, Error> {
        if let Some(cause) = &self.aborted {
            return Err(Error::Poisoned {
                cause: Box::new(cause.clone()),
            });
        }
        let n = self.fab.ranks;
        if calls.len() != n as usize {
            return Err(Error::CallCount {
                ranks: n,
                calls: calls.len(),
            });
        }
        let tree = self.algorithm == ringcc_core::Algorithm::Tree;
        let (geometry, chunk_bytes) = match calls.first() {
            Some(c) if tree => {
                self.tree_geometry(c.count.saturating_mul(u64::from(c.dtype.size())))?
            }
            _ => self.call_geometry()?,
        };
        let tree_plans = if tree {
            Some(self.tree_plans(calls, chunk_bytes)?)
        } else {
            None
        };
        let used = self.used_channels();
        let cfg = &self.cfg;
        let plans: Vec<Plan> = calls
            .iter()
            .enumerate()
            .map(|(r, c)| {
                Plan::new(c.collective, c.count, c.dtype, n, used, chunk_bytes).map_err(|source| {
                    Error::InvalidCall {
                        rank: Rank(r as u32),
                        source,
                    }
                })
            })
            .collect::<Result<_, _>>()?;
        match data {
            RunData::Buffers(b) if cfg.payload => self.check_buffers(calls, b, in_place)?,
            RunData::Generated(g) if cfg.payload => {
                if let Some(r) = calls.iter().position(|c| Some(*c) != g.call()) {
                    return Err(Error::BadConfig {
                        what: format!(
                            "rank {r}'s call is not the one the generated data was made for: \
                             mismatched calls need real buffers (Cluster::run)"
                        ),
                    });
                }
                g.begin(in_place)?;
            }
            RunData::None if cfg.payload => {
                return Err(Error::BufferCount {
                    ranks: n,
                    buffers: 0,
                })
            }
            _ => {}
        }
        // From here on the run happens.
        let now = self.events.now();
        let start_events = self.events.processed();
        self.run.calls = calls.to_vec();
        self.run.elem = calls.iter().map(|c| u64::from(c.dtype.size())).collect();
        self.run.layouts = (0..n)
            .map(|r| BufLayout::new(&calls[r as usize], n, r, in_place))
            .collect();
        self.run.data = if self.cfg.payload {
            std::mem::take(data)
        } else {
            RunData::None
        };
        self.run.epoch = self.run.epoch.wrapping_add(1);
        self.run.active = true;
        self.run.finished = 0;
        self.run.aborts_in_flight = 0;
        self.run.last_exec = now;
        for rs in &mut self.ranks {
            rs.error = None;
            rs.aborted = None;
            rs.abort_sent = false;
        }
        if tree_plans.is_some() {
            self.lanes.tree_storage();
        }
        let mut refused = Vec::new();
        let (nodes, gpus, nics) = (
            self.cfg.nodes,
            self.cfg.gpus_per_node,
            self.cfg.nics_per_node,
        );
        for (r, engine) in self.lanes.engines.iter_mut().enumerate() {
            let rings = &self.fab.rings;
            let started = match &tree_plans {
                Some(tp) => engine
                    .start_tree(now, &calls[r], &tp[r], geometry, |c| {
                        ringcc_core::UniformTree::for_channel(nodes, gpus, nics, c)
                    })
                    .map(|_| ()),
                None => engine
                    .start(now, &calls[r], &plans[r], geometry, |c| {
                        rings[usize::from(c.0)].clone()
                    })
                    .map(|_| ()),
            };
            if let Err(e) = started {
                refused.push((r as u32, e));
            }
        }
        // The channels the call uses (a tree plan may use fewer still).
        let used = tree_plans
            .as_ref()
            .and_then(|tp| tp.first())
            .map_or(used, |p| p.channels());
        for l in 0..self.lanes.len() {
            let t = self.fab.lanes[l as usize];
            let dead = self.ranks[t.rank as usize].died.is_some();
            self.lanes.cold[l as usize].mailbox = None;
            self.lanes.cold[l as usize].credits.clear();
            let lane = &mut self.lanes[l];
            lane.credits = Default::default();
            lane.wake = false;
            lane.credit_blocked = false;
            lane.state = if dead {
                self.run.finished += 1;
                LaneState::Dead
            } else if t.channel >= used {
                // A channel the call does not use has nothing to do.
                self.run.finished += 1;
                LaneState::Done
            } else {
                LaneState::Running
            };
        }
        for (r, e) in refused {
            let err = self.engine_error(r, e);
            self.fail_lane(self.fab.lane(0, r), err);
        }
        self.events.at(
            now.saturating_add(self.time.deadline),
            Ev::Watchdog {
                epoch: self.run.epoch,
            },
        );
        let k = &self.cfg.calibration;
        let launch = ps(k.launch_latency);
        self.run.staggered = launch > 0;
        if self.run.staggered {
            // Each rank's kernel starts after its thread's launches up to
            // and including its own; its engine acts from then on.
            let per_thread = u64::from(k.launches_per_thread.max(1));
            let gpus = u64::from(self.cfg.gpus_per_node.max(1));
            self.run.launch_at = (0..u64::from(n))
                .map(|r| {
                    let nth = (r % gpus) % per_thread + 1;
                    now.saturating_add(launch.saturating_mul(nth))
                })
                .collect();
            for r in 0..n {
                let at = self.run.launch_at[r as usize];
                self.events.at(
                    at,
                    Ev::Launch {
                        rank: r,
                        epoch: self.run.epoch,
                    },
                );
            }
        } else if tree {
            for r in 0..n {
                self.drive_tree(r);
            }
        } else {
            for l in 0..self.lanes.len() {
                self.drive_rank(l);
            }
        }
        let total = self.lanes.len() as usize;
        loop {
            if self.run.finished >= total && self.run.aborts_in_flight == 0 {
                break;
            }
            let events = self.events.processed() - start_events;
            if events >= self.cfg.max_events {
                tracing::warn!(events, "event limit reached");
                self.fail_all(|rank| Error::EventLimit { rank, events });
                break;
            }
            let Some(ev) = self.events.pop_packed() else {
                // The watchdog keeps the queue non-empty while a lane runs.
                self.fail_all(|rank| Error::Timeout {
                    rank,
                    channel: ChannelId(0),
                    waited: 0.0,
                    waiting_for: "an event (none left)",
                });
                break;
            };
            self.prefetch_ahead();
            self.dispatch_packed(ev);
        }
        Ok(self.finish(start_events, data, now))
    }

    /// Starts loading the lane of the event [`PREFETCH_AHEAD`] places
    /// ahead into the cache. On large clusters a lane is several cache
    /// misses per event, most of the cost; a prefetch lets them overlap
    /// with the work of the events in between instead of stalling each.
    ///
    /// The look-ahead sees only the calendar bucket being drained, so the
    /// first events of each bucket (a bucket holds a few dozen) were never
    /// [`PREFETCH_AHEAD`] places ahead: when a bucket begins, they are all
    /// started at once, each with what lead it has.
    ///
    /// Not prefetched (each measured at 1024 ranks: no faster with, and 20
    /// instructions an event): the rank's engine line (likely cached: a
    /// thousand engines' hot lines, each touched by its sixteen channels'
    /// events) and, for a finished slice, the predecessor's lane its
    /// credit goes to.
    #[inline]
    fn prefetch_ahead(&self) {
        if self.events.began_bucket() {
            self.prefetch_bucket_start();
        }
        self.prefetch_event(PREFETCH_AHEAD);
    }

    /// Starts loading what the event `k + 1` places ahead touches.
    #[inline(always)]
    fn prefetch_event(&self, k: usize) {
        if let Some(Ev::ExecDone { lane } | Ev::Tail { lane, .. } | Ev::Wake { lane }) =
            self.events.peek_ahead(k)
        {
            self.lanes.prefetch(lane);
        }
    }

    /// The first [`PREFETCH_AHEAD`] events after the first of a bucket
    /// (once a bucket: not worth inlining into every event).
    #[inline(never)]
    fn prefetch_bucket_start(&self) {
        for k in 0..PREFETCH_AHEAD {
            self.prefetch_event(k);
        }
    }

    /// [`dispatch`](Sim::dispatch) of a packed event: a lane's events
    /// (nearly all of them) straight from the packed words.
    #[inline(always)]
    fn dispatch_packed(&mut self, p: Packed) {
        match p.kind() {
            KIND_EXEC_DONE => self.on_exec_done(p.lane()),
            KIND_TAIL => match p.unpack() {
                Ev::Tail {
                    lane,
                    hdr,
                    xfer,
                    tail,
                } => self.on_tail(lane, hdr, xfer, tail),
                ev => self.dispatch(ev),
            },
            KIND_WAKE => self.on_wake(p.lane()),
            _ => self.dispatch(p.unpack()),
        }
    }

    #[inline(always)]
    fn dispatch(&mut self, ev: Ev) {
        match ev {
            Ev::ExecDone { lane } => self.on_exec_done(lane),
            Ev::Tail {
                lane,
                hdr,
                xfer,
                tail,
            } => self.on_tail(lane, hdr, xfer, tail),
            Ev::Wake { lane } => self.on_wake(lane),
            Ev::FlowFail { lane, credit } => self.on_flow_fail(lane, credit),
            Ev::Abort { rank, origin } => self.on_abort(rank, origin),
            Ev::Death { rank } => self.on_death(rank),
            Ev::Watchdog { epoch } => self.on_watchdog(epoch),
            Ev::Doorbell { qp, upto } => {
                self.on_doorbell(qp, upto);
                self.drain_cq();
            }
            Ev::PortTx { port } => self.on_port_tx(port),
            Ev::Packet { frame } => {
                self.on_packet(frame);
                self.drain_cq();
            }
            Ev::QpTimer { qp, rnr } => {
                self.on_qp_timer(qp, rnr);
                self.drain_cq();
            }
            Ev::Tree { id } => self.on_tree(id),
            Ev::Launch { rank, epoch } => self.on_launch(rank, epoch),
        }
    }

    /// `rank`'s kernel starts (run `epoch`): its engine acts on what has
    /// arrived so far, on every channel, as a call's beginning does.
    fn on_launch(&mut self, rank: u32, epoch: u32) {
        if epoch != self.run.epoch || !self.run.active {
            return;
        }
        if self.algorithm == ringcc_core::Algorithm::Tree {
            self.drive_tree(rank);
        } else {
            for c in 0..self.fab.channels {
                self.drive_rank(self.fab.lane(c, rank));
            }
        }
    }

    /// Ends the run: per-rank results, buffers back, state for the next.
    fn finish(&mut self, start_events: u64, data: &mut RunData, start: Ps) -> RunReport {
        let n = self.fab.ranks;
        let mut results = Vec::with_capacity(n as usize);
        for r in 0..n {
            let rs = &self.ranks[r as usize];
            results.push(if let Some(t) = rs.died {
                Err(Error::RankDied {
                    rank: Rank(r),
                    at: secs(t),
                })
            } else if let Some(e) = &rs.error {
                Err(e.clone())
            } else if let Some(origin) = rs.aborted {
                Err(self.aborted_error(r, origin))
            } else {
                Ok(())
            });
        }
        for lane in self.lanes.hot.iter_mut() {
            lane.state = LaneState::Idle;
        }
        if self.cfg.payload {
            *data = std::mem::take(&mut self.run.data);
        }
        self.run.active = false;
        if self.aborted.is_none() {
            let first = (0..n as usize).find_map(|r| {
                let rs = &self.ranks[r];
                match (&rs.error, rs.died) {
                    (_, Some(t)) => Some(Error::RankDied {
                        rank: Rank(r as u32),
                        at: secs(t),
                    }),
                    (Some(e), _) if !matches!(e, Error::Aborted { .. }) => Some(e.clone()),
                    _ => None,
                }
            });
            self.aborted = first.or_else(|| results.iter().find_map(|r| r.clone().err()));
        }
        self.update_stats();
        let settled = self.events.now();
        // A successful call ends with its last exec; a failed one when the
        // run stopped.
        let end = if results.iter().all(Result::is_ok) {
            self.run.last_exec.clamp(start, settled)
        } else {
            settled
        };
        RunReport {
            ranks: results,
            start: secs(start),
            end: secs(end),
            settled: secs(settled),
            events: self.events.processed() - start_events,
        }
    }

    pub(crate) fn lane_done(&mut self, l: u32) {
        let lane = &mut self.lanes[l];
        if lane.state == LaneState::Running {
            lane.state = LaneState::Done;
            self.run.finished += 1;
        }
    }
}
