//! # ringcc-mock: a deterministic cluster simulator
//!
//! The oracle every ringcc backend is tested against, and what users run
//! first. It runs the very progress engine of `ringcc-core` — one
//! [`Engine`](ringcc_core::Engine) per simulated rank, the whole cluster on
//! one thread, as each real rank runs its own — and the core's RDMA
//! connection protocol, unpatched, over a simulated cluster with a virtual
//! clock:
//!
//! - **GPUs** ([`exec`](crate) slices): each rank has its own memory;
//!   a slice reads its incoming FIFO slot and its input, reduces with the
//!   core's kernels, writes its output and sends; it takes the bytes it
//!   moves over the device bandwidth plus a fixed overhead.
//! - **NVLink** between the GPUs of a node: a peer copy straight into the
//!   successor's slot, no queue pair, no packet (as the seed stresses); a
//!   serial link per GPU pair, shared by the channels (a ring's rank sends
//!   to one peer of its node; a tree's rank, which sends to two, has one
//!   NVLink for both, as behind an NVSwitch).
//! - **RNICs** between nodes: RC queue pairs (RESET → INIT → RTR → RTS)
//!   with send, receive and completion queues, memory regions with keys,
//!   bounds and access flags; a finished slice becomes work requests
//!   (`protocol::post::SliceWrites`), mlx5 WQEs in the send queue, a doorbell,
//!   fetch and parse, DMA read, MTU segmentation with PSNs, RoCEv2 frames
//!   (Ethernet / IPv4 / UDP 4791 / BTH / RETH / ImmDt / ICRC) on a serial
//!   port, the responder's PSN, key, bounds and access checks, DMA write,
//!   ACKs, go-back-N with a retransmission timer and retry count, and
//!   completions with the right status. Channels map to NICs as the core's
//!   topology says, so 8 channels on 8 NICs use 8 ports in parallel.
//! - **Timing-only mode** (`payload: false`) moves no bytes and models each
//!   RDMA message as one flow on its port (the packet model's time on a
//!   lossless port, at O(1) per message; the two agree within a percent or
//!   two, tested). The event queue is a calendar queue with O(1) pushes
//!   and pops, credits are handed over lazily (an event only for a lane that
//!   waits for one), so a slice costs about two events: 1024 ranks x 16
//!   channels, 1 GiB AllReduce (33.5 M slices, 75 M events) in about
//!   2.9 s on one core of the development machine (`cargo bench -p
//!   ringcc-mock --bench sim -- timing-1024`). At that size the 16 K lanes outgrow the
//!   caches: a lane keeps what events touch in two cache lines, its
//!   machine's hot fields open its channel in the rank's engine (three
//!   more), the lanes and the engines sit on huge pages (an array each;
//!   every engine holds its channels inline, so that a channel's address
//!   is computed, not loaded), and the run loop
//!   prefetches the lane and its machine's lines a dozen events ahead (not
//!   the engine's line: measured no faster) —
//!   the first events of each calendar bucket as the bucket begins (the
//!   crate's only `unsafe`: the prefetches and the arrays).
//! - **Faults** ([`Faults`]): seeded packet loss, duplication, reordering,
//!   jitter, a dead rank / NIC / NVLink at a virtual time, a corrupted
//!   remote key. Loss is recovered by retransmission; a failure ends every
//!   rank's collective with a typed error within bounded virtual time
//!   (deadlines, and aborts over a modelled control network).
//! - **Outputs**: a Chrome / Perfetto trace ([`Cluster::write_chrome_trace`]),
//!   a pcap of the RoCEv2 frames ([`Cluster::write_pcap`]), statistics with
//!   a hash of the event log ([`Cluster::stats`]).
//!
//! Same configuration and seed, same event log, bit for bit.
//!
//! Not modelled: completion-queue overflow (each rank's progress loop takes
//! completions as they are raised), congestion inside the switch (ports
//! are the only shared network resources), PCIe, and contention for a
//! GPU's memory between its channels.
//!
//! ```
//! use ringcc_mock::{Call, Cluster, ClusterConfig, RankBuffers};
//! use ringcc_core::{Collective, DataType, Rank, ReduceOp};
//!
//! let cfg = ClusterConfig {
//!     nodes: 2,
//!     gpus_per_node: 2,
//!     nics_per_node: 2,
//!     channels: 2,
//!     chunk_bytes: 4096,
//!     geometry: ringcc_core::fifo::FifoGeometry::new(1024, 2).unwrap(),
//!     payload: true,
//!     ..ClusterConfig::default()
//! };
//! let mut cluster = Cluster::new(cfg).unwrap();
//! let n = cluster.ranks();
//! let call = Call::new(Collective::AllReduce, 1000, DataType::I32, ReduceOp::Sum);
//! let mut bufs: Vec<RankBuffers> = (0..n)
//!     .map(|r| {
//!         let mut b = RankBuffers::zeroed(&call, n, Rank(r), false);
//!         for (i, x) in b.input.chunks_mut(4).enumerate() {
//!             x.copy_from_slice(&(i as i32 + r as i32).to_ne_bytes());
//!         }
//!         b
//!     })
//!     .collect();
//! let report = cluster.run(&vec![call; n as usize], &mut bufs, false).unwrap();
//! assert!(report.ok());
//! let first = i32::from_ne_bytes(bufs[0].output[..4].try_into().unwrap());
//! assert_eq!(first, 0 + 1 + 2 + 3);
//! ```

#![deny(unsafe_code)]
#![deny(missing_docs)]

mod abort;
mod cachehint;
mod calendar;
mod config;
mod error;
mod events;
mod exec;
mod fabric;
mod faults;
mod flow;
mod generated;
mod huge;
mod lane;
mod memory;
mod pcap;
mod rdma;
mod report;
mod rnic;
mod sim;
mod trace;
mod treerun;

use std::io::{self, Write};

pub use config::{
    Calibration, ClusterConfig, GpuModel, HopLatency, LinkModel, Preset, RnicModel,
    EFA_P5_SIMPLE_EXTRA, EFA_P5_STEP, EFA_REPORTED_LATENCY, IB_LL128_HOP, IB_LL_HOP, MAX_BANDWIDTH,
    MAX_RANKS, MIN_BANDWIDTH, PRESET_LAUNCH_LATENCY, PRESET_PROXY_LATENCY,
};
pub use error::Error;
pub use fabric::LinkKind;
pub use faults::{Component, ConnId, Failure, Faults};
pub use generated::GeneratedData;
pub use report::{Call, LinkStats, RankBuffers, RunReport, Stats};

use ringcc_core::{ChannelId, HopKind, NicId, Rank};

/// A simulated cluster: ranks, links, RNICs and a virtual clock.
///
/// Collectives run one after another ([`run`](Cluster::run)); the call
/// sequence number, the connection counters and the clock carry over. A
/// run in which any rank failed aborts the communicator: later runs return
/// [`Error::Poisoned`].
pub struct Cluster {
    sim: Box<dyn sim::Simulation>,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("ranks", &self.ranks())
            .field("now", &self.now())
            .field("aborted", &self.sim.aborted())
            .finish()
    }
}

impl Cluster {
    /// Builds the cluster: topology, rings, links; with payload, every
    /// rank's memory, registered regions and connected queue pairs.
    pub fn new(cfg: ClusterConfig) -> Result<Cluster, Error> {
        Ok(Cluster {
            sim: sim::new_simulation(cfg)?,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &ClusterConfig {
        self.sim.cfg()
    }

    /// Number of ranks.
    pub fn ranks(&self) -> u32 {
        self.sim.fab().ranks
    }

    /// One collective on every rank: `calls[r]` is rank `r`'s call
    /// (normally all equal; a different one is detected as
    /// `MismatchedCall`). `buffers[r]` holds rank `r`'s buffers in NCCL's
    /// layout ([`RankBuffers`]), in place when `in_place`; timing-only
    /// runs ignore them (pass `&mut []`).
    ///
    /// Returns `Err` for a call that cannot start (wrong number of calls
    /// or buffers, an invalid call, an aborted communicator); per-rank
    /// failures are in [`RunReport::ranks`].
    pub fn run(
        &mut self,
        calls: &[Call],
        buffers: &mut [RankBuffers],
        in_place: bool,
    ) -> Result<RunReport, Error> {
        let mut data = if self.sim.cfg().payload {
            sim::RunData::Buffers(buffers.iter_mut().map(std::mem::take).collect())
        } else {
            sim::RunData::None
        };
        let report = self.sim.run(calls, &mut data, in_place);
        if let sim::RunData::Buffers(b) = data {
            for (dst, src) in buffers.iter_mut().zip(b) {
                *dst = src;
            }
        }
        report
    }

    /// One collective on every rank of a payload-mode cluster, without
    /// user buffers: each rank's input is generated where it is read and
    /// every output element checked where it is written
    /// ([`GeneratedData`]); afterwards [`GeneratedData::wrong`] is the
    /// run's `#wrong`. Every rank must make `data`'s call. This is how a
    /// large cluster is checked in the memory of one machine: what it holds
    /// is [`GeneratedData::bytes_needed`] plus the FIFOs the run touches.
    pub fn run_generated(
        &mut self,
        calls: &[Call],
        data: &mut GeneratedData,
        in_place: bool,
    ) -> Result<RunReport, Error> {
        if !self.sim.cfg().payload {
            return Err(Error::BadConfig {
                what: "run_generated needs payload mode: timing-only runs move no bytes".into(),
            });
        }
        let mut run = sim::RunData::Generated(std::mem::take(data));
        let report = self.sim.run(calls, &mut run, in_place);
        if let sim::RunData::Generated(g) = run {
            *data = g;
        }
        report
    }

    /// The virtual clock, seconds since the cluster was built. It only
    /// moves forward, across runs.
    pub fn now(&self) -> f64 {
        events::secs(self.sim.now())
    }

    /// Whether a failed run aborted the communicator.
    pub fn is_aborted(&self) -> bool {
        self.sim.aborted()
    }

    /// Switches the protocol later runs carry (timing-only mode): link
    /// latencies and wire bytes follow it. Fails in payload mode for
    /// anything but Simple.
    pub fn set_protocol(&mut self, protocol: ringcc_core::Protocol) -> Result<(), Error> {
        self.sim.set_protocol(protocol)
    }

    /// Switches the algorithm later runs use: Ring (the default) or Tree
    /// (NCCL's double binary tree with chains inside nodes; AllReduce
    /// only; in payload mode its slices' bytes move and reduce as the
    /// ring's do, in the same simulated time).
    pub fn set_algorithm(&mut self, algorithm: ringcc_core::Algorithm) -> Result<(), Error> {
        self.sim.set_algorithm(algorithm)
    }

    /// Later runs use the first `channels` of the cluster's channels
    /// (the tuner's [`Estimate::channels`](ringcc_core::tune::Estimate::channels)
    /// for the call's size, as NCCL drops channels a small call would
    /// leave nearly empty); `None`, the default, uses all of them. Zero or
    /// more than the cluster has is a `BadConfig`.
    pub fn set_channels(&mut self, channels: Option<u32>) -> Result<(), Error> {
        self.sim.set_channels(channels)
    }

    /// The channels later runs use.
    pub fn channels(&self) -> u32 {
        self.sim.used_channels()
    }

    /// The algorithm later runs use.
    pub fn algorithm(&self) -> ringcc_core::Algorithm {
        self.sim.algorithm()
    }

    /// Counters, per-link traffic and the event-log hash, as of the end
    /// of the last run.
    pub fn stats(&self) -> &Stats {
        self.sim.stats()
    }

    /// Channel `channel`'s ring, in ring order from rank 0.
    pub fn ring(&self, channel: ChannelId) -> Vec<Rank> {
        let n = self.ranks();
        let channel = u32::from(channel.get());
        let Some(_) = self.sim.fab().rings.get(channel as usize) else {
            return Vec::new();
        };
        let mut out = Vec::with_capacity(n as usize);
        let mut r = 0;
        for _ in 0..n {
            out.push(Rank(r));
            r = self.sim.fab().lanes[self.sim.fab().lane(channel, r) as usize].next;
        }
        out
    }

    /// What carries channel `channel`'s hop from `rank` to its successor.
    pub fn hop(&self, channel: ChannelId, rank: Rank) -> Option<HopKind> {
        let (channel, rank) = (u32::from(channel.get()), rank.get());
        if channel >= self.sim.fab().channels || rank >= self.ranks() {
            return None;
        }
        let t = &self.sim.fab().lanes[self.sim.fab().lane(channel, rank) as usize];
        Some(match t.hop {
            fabric::Hop::Loopback => HopKind::Loopback,
            fabric::Hop::Nvlink { .. } => HopKind::Intra,
            fabric::Hop::Net { tx, rx, .. } => HopKind::Inter {
                send_nic: NicId(self.sim.fab().ports[tx as usize].nic),
                recv_nic: NicId(self.sim.fab().ports[rx as usize].nic),
            },
        })
    }

    /// Writes the recorded timeline (needs `trace: true`) as Chrome
    /// trace-event JSON, for `chrome://tracing` or Perfetto.
    pub fn write_chrome_trace(&self, w: impl Write) -> io::Result<()> {
        self.sim.trace().write(self.sim.fab(), w)
    }

    /// Spans recorded in the timeline.
    pub fn trace_len(&self) -> usize {
        self.sim.trace().len()
    }

    /// Writes the captured RoCEv2 frames (needs `capture: true`, payload
    /// mode) as a libpcap file (nanosecond timestamps, Ethernet).
    pub fn write_pcap(&self, w: impl Write) -> io::Result<()> {
        self.sim.capture().write(w)
    }

    /// Frames captured.
    pub fn captured_frames(&self) -> usize {
        self.sim.capture().frames.len()
    }
}
