//! The tuner: NCCL's style of cost model, and the choice of algorithm,
//! protocol and channel count it makes for each call.
//!
//! Per algorithm × protocol the model has a base latency, a per-hop
//! latency inside a node and across the network, and a bus bandwidth: the
//! link's, times the protocol's efficiency, capped by the channels times a
//! per-channel limit. A call of `S` bytes then takes
//! `latency + S / algbw` (NCCL's `ncclTopoGetAlgoTime`), where the ring's
//! latency counts its steps (`2(n−1)` for AllReduce, of which `2·nodes`
//! cross the network) and the tree's counts `2 × (chain + log2 nodes)`
//! hops. The tuner evaluates every candidate the backend can run
//! ([`Capabilities`]) and the overrides allow ([`AlgoSet`], [`ProtoSet`],
//! parsed from `RINGCC_ALGO` / `RINGCC_PROTO` in NCCL_ALGO / NCCL_PROTO
//! syntax) and takes the fastest, first in code order on a tie.
//!
//! Every rank must choose the same, or the ranks would run different
//! schedules and hang: the choice is a pure function of its inputs (the
//! same IEEE-754 operations in the same order on every machine), with no
//! clock, no randomness and no state.
//!
//! Where the constants come from: NCCL's `src/graph/tuning.cc` as of
//! NCCL 2.19/2.20 (the version with NVLS Tree and MNNVL; the stored copy
//! read is NVIDIA/nccl commit `b6475625`), latencies in µs and bandwidths
//! in GB/s as there. The thread counts and thresholds of the channel
//! heuristic are NCCL's `NCCL_{SIMPLE,LL,LL128}_MAX_NTHREADS` and
//! `NCCL_*_THREAD_THRESHOLD` (src/include/device.h, comm.h of the same
//! era). What is ringcc's own, and not NCCL's, is said where it is.

use crate::call::{Algorithm, Collective, Protocol};
use crate::error::Error;

/// `[algorithm][protocol]`, in code order: `[Ring, Tree][LL, LL128, Simple]`.
pub type PerAlgoProto = [[f64; 3]; 2];

/// NCCL's `baseLat` (µs): Ring `{6.6, 14.0, 8.4}`, Tree `{6.8, 14.0, 0}`.
pub const BASE_LAT_US: PerAlgoProto = [[6.6, 14.0, 8.4], [6.8, 14.0, 0.0]];
/// NCCL's `hwLat[NCCL_HW_NVLINK]` (µs per hop): Ring `{.6, 1.9, 3.4}`,
/// Tree `{.6, 1.25, 28}`.
pub const NVLINK_LAT_US: PerAlgoProto = [[0.6, 1.9, 3.4], [0.6, 1.25, 28.0]];
/// NCCL's `hwLat[NCCL_HW_PCI]` (µs per hop): Ring `{1.0, 2.5, 5.7}`,
/// Tree `{1.0, 1.9, 28}`.
pub const PCI_LAT_US: PerAlgoProto = [[1.0, 2.5, 5.7], [1.0, 1.9, 28.0]];
/// NCCL's `hwLat[NCCL_HW_NET]` (µs per hop): Ring `{2.7, 4.0, 14.0}`,
/// Tree `{5.0, 8.5, 28}`.
pub const NET_LAT_US: PerAlgoProto = [[2.7, 4.0, 14.0], [5.0, 8.5, 28.0]];

/// NCCL's tree correction factors per protocol `[LL, LL128, Simple]`, for
/// sizes `64 B · 2^i`, i in 0..23 (64 B to 256 MiB); 1.0 above.
pub const TREE_CORRECTION: [[f64; 23]; 3] = [
    [
        1.0, 1.0, 1.0, 1.0, 0.9, 0.8, 0.7, 0.7, 0.7, 0.7, 0.6, 0.5, 0.4, 0.4, 0.5, 0.6, 0.7, 0.8,
        0.9, 1.0, 1.0, 1.0, 1.0,
    ],
    [
        1.0, 1.0, 1.0, 1.0, 1.0, 0.9, 0.8, 0.8, 0.8, 0.7, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.8, 0.9,
        0.9, 0.9, 0.9, 1.0, 1.0,
    ],
    [
        0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.8, 0.7, 0.6, 0.6, 0.5, 0.5, 0.5, 0.5, 0.6, 0.7, 0.8,
        0.7, 0.7, 0.8, 0.9, 0.9,
    ],
];

/// The latency side of the model (µs): a call's base latency and the
/// latency of one hop inside a node (NVLink or PCIe) and across the
/// network, per algorithm × protocol. [`Latencies::NCCL`] is NCCL's
/// table for GPUs; a backend whose hops cost something else (shared
/// memory between CPU processes, TCP) gives its own, measured, so that the
/// same model picks its protocol.
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Latencies {
    /// Per call (`baseLat`).
    pub base_us: PerAlgoProto,
    /// Per hop inside a node over NVLink (`hwLat[NCCL_HW_NVLINK]`).
    pub nvlink_us: PerAlgoProto,
    /// Per hop inside a node without NVLink (`hwLat[NCCL_HW_PCI]`).
    pub pci_us: PerAlgoProto,
    /// Per hop across the network (`hwLat[NCCL_HW_NET]`).
    pub net_us: PerAlgoProto,
}

impl Latencies {
    /// NCCL's tables ([`BASE_LAT_US`], [`NVLINK_LAT_US`], [`PCI_LAT_US`],
    /// [`NET_LAT_US`]).
    pub const NCCL: Latencies = Latencies {
        base_us: BASE_LAT_US,
        nvlink_us: NVLINK_LAT_US,
        pci_us: PCI_LAT_US,
        net_us: NET_LAT_US,
    };
}

/// The GPU generation: it selects NCCL's per-channel caps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum GpuGen {
    /// sm_70 (V100).
    Volta,
    /// sm_80 (A100).
    Ampere,
    /// sm_90 (H100, H200).
    Hopper,
}

impl GpuGen {
    /// NCCL's `perChMaxRingLL128Bws[gen][N1/N2/N4]`: the most one ring
    /// channel moves under LL128, GB/s of bus bandwidth (on Hopper more
    /// than a Simple channel's ~24).
    pub fn ring_ll128_cap(self, nodes: u32) -> f64 {
        pick3(
            match self {
                GpuGen::Volta | GpuGen::Ampere => [20.0, 20.0, 20.0],
                GpuGen::Hopper => [36.7, 36.7, 36.7],
            },
            nodes,
        )
    }

    /// NCCL's `perChMaxTreeLL128Bws[gen][N1/N2/N4]`.
    fn tree_ll128_cap(self, nodes: u32) -> f64 {
        pick3(
            match self {
                GpuGen::Volta | GpuGen::Ampere => [20.0, 20.0, 20.0],
                GpuGen::Hopper => [36.7, 36.7, 29.0],
            },
            nodes,
        )
    }

    /// NCCL's `perChMaxTreeBws[gen][N1/N2/N4]`.
    fn tree_cap(self, nodes: u32) -> f64 {
        pick3(
            match self {
                GpuGen::Volta => [26.5, 18.5, 10.0],
                GpuGen::Ampere => [24.0, 23.6, 17.8],
                GpuGen::Hopper => [38.7, 41.4, 36.0],
            },
            nodes,
        )
    }
}

/// NCCL's `N1/N2/N4` column: one node, two, more.
fn pick3(row: [f64; 3], nodes: u32) -> f64 {
    match nodes {
        0 | 1 => row[0],
        2 => row[1],
        _ => row[2],
    }
}

/// The hardware the model describes.
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Hardware {
    /// GPU generation.
    pub gen: GpuGen,
    /// GPUs of a node talk over NVLink (else PCIe).
    pub nvlink: bool,
    /// What the intra-node fabric gives a ring, all channels together,
    /// GB/s of bus bandwidth (NVLink line rate × its efficiency).
    pub intra_gbps: f64,
    /// What one node's NICs give, all together, GB/s (NICs × port rate ×
    /// efficiency).
    pub inter_gbps: f64,
    /// What one channel can move with the Simple protocol, GB/s. Not in
    /// NCCL's model (its graph search bounds channels instead): ringcc's,
    /// the same figure as the simulator's `--channel-gbps`.
    pub channel_gbps: f64,
    /// Channels a communicator has (1..=64).
    pub max_channels: u32,
    /// NCCL's `getNetOverhead`: µs to post a network operation (1.0 on
    /// Intel CPUs, 2.0 on AMD).
    pub net_overhead_us: f64,
    /// The latency the network plugin reports (`ncclNetProperties_t::
    /// latency`, NCCL's `graph->latencyInter`), µs: NCCL adds it to every
    /// network hop, and once more under Simple (the receive flush). 0 for
    /// NCCL's own IB and socket transports; aws-ofi-nccl reports 75 on
    /// p4d, p4de and p5 (`platform-aws.cpp`).
    pub net_latency_us: f64,
    /// The host CPU is AMD (NCCL's `llMaxBws` row for more than one node).
    pub amd_cpu: bool,
}

/// What the tuner is asked about.
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Tuner {
    /// The hardware.
    pub hw: Hardware,
    /// Ranks of the communicator.
    pub ranks: u32,
    /// Nodes they are spread over (equal ranks per node).
    pub nodes: u32,
    /// What the backend can run.
    pub caps: Capabilities,
    /// Algorithms the user allows (`RINGCC_ALGO`).
    pub algos: AlgoSet,
    /// Protocols the user allows (`RINGCC_PROTO`).
    pub protos: ProtoSet,
    /// The latency tables ([`Latencies::NCCL`] unless the backend gives
    /// its own).
    pub lat: Latencies,
}

/// The model's figures for one candidate.
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Estimate {
    /// The algorithm.
    pub algorithm: Algorithm,
    /// The protocol.
    pub protocol: Protocol,
    /// Channels the call would use.
    pub channels: u32,
    /// Latency term, µs.
    pub latency_us: f64,
    /// Algorithm bandwidth at that channel count, GB/s.
    pub algbw_gbps: f64,
    /// `latency + bytes / algbw`, µs.
    pub time_us: f64,
}

/// Every candidate's estimate, in code order (`Ring` then `Tree`, each
/// `LL`, `LL128`, `Simple`); `None` where the model has no such schedule
/// (Tree for anything but AllReduce).
pub type Table = [Option<Estimate>; 6];

/// The tuner's answer: the chosen candidate and every candidate's figures.
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Choice {
    /// The chosen candidate.
    pub chosen: Estimate,
    /// Every candidate's estimate.
    pub table: Table,
    /// Which of `table` were allowed (capabilities and overrides).
    pub allowed: [bool; 6],
}

const fn slot(a: Algorithm, p: Protocol) -> usize {
    (a.code() as usize)
        .wrapping_mul(3)
        .wrapping_add(p.code() as usize)
}

const fn bit(a: Algorithm, p: Protocol) -> u8 {
    1u8.wrapping_shl(slot(a, p) as u32)
}

/// Which algorithm × protocol pairs a backend can run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Capabilities(u8);

impl Capabilities {
    /// Nothing.
    pub const NONE: Capabilities = Capabilities(0);
    /// Ring with every protocol.
    pub const RING: Capabilities = Capabilities(0b000_111);
    /// Everything.
    pub const ALL: Capabilities = Capabilities(0b111_111);

    /// Adds one pair.
    #[must_use]
    pub const fn with(self, a: Algorithm, p: Protocol) -> Capabilities {
        Capabilities(self.0 | bit(a, p))
    }

    /// Whether the pair can run.
    pub const fn allows(self, a: Algorithm, p: Protocol) -> bool {
        self.0 & bit(a, p) != 0
    }

    /// Whether any pair of `a` can run.
    pub const fn has_algorithm(self, a: Algorithm) -> bool {
        self.0 & 0b111u8.wrapping_shl((a.code() as u32).wrapping_mul(3)) != 0
    }
}

/// Parses NCCL's list syntax (`parseList` in tuning.cc): names separated
/// by commas, matched ignoring ASCII case; a leading `^` excludes the
/// names from the full set instead. Unlike NCCL, an unknown or empty name
/// is an error rather than silently ignored.
fn parse_list<T: Copy>(s: &str, all: &[T], name: impl Fn(T) -> &'static str) -> Result<u8, Error> {
    let s = s.trim();
    let (exclude, body) = match s.strip_prefix('^') {
        Some(rest) => (true, rest),
        None => (false, s),
    };
    let mut named = 0u8;
    for token in body.split(',') {
        let token = token.trim();
        let bit = all
            .iter()
            .position(|&x| name(x).eq_ignore_ascii_case(token))
            .ok_or(Error::BadTuningList)?;
        named |= 1u8
            .checked_shl(u32::try_from(bit).map_err(|_| Error::BadTuningList)?)
            .ok_or(Error::BadTuningList)?;
    }
    let full = 1u8
        .checked_shl(u32::try_from(all.len()).map_err(|_| Error::BadTuningList)?)
        .map_or(u8::MAX, |b| b.wrapping_sub(1));
    Ok(if exclude { full & !named } else { named })
}

/// A set of algorithms (`RINGCC_ALGO`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct AlgoSet(u8);

impl AlgoSet {
    /// Every algorithm.
    pub const ALL: AlgoSet = AlgoSet(0b11);

    /// One algorithm.
    pub const fn only(a: Algorithm) -> AlgoSet {
        AlgoSet(1u8.wrapping_shl(a.code() as u32))
    }

    /// Whether `a` is in the set.
    pub const fn contains(self, a: Algorithm) -> bool {
        self.0 & 1u8.wrapping_shl(a.code() as u32) != 0
    }

    /// Parses `Ring`, `ring,tree`, `^Tree` (NCCL_ALGO's syntax).
    pub fn parse(s: &str) -> Result<AlgoSet, Error> {
        parse_list(s, &Algorithm::ALL, Algorithm::name).map(AlgoSet)
    }
}

/// A set of protocols (`RINGCC_PROTO`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct ProtoSet(u8);

impl ProtoSet {
    /// Every protocol.
    pub const ALL: ProtoSet = ProtoSet(0b111);

    /// One protocol.
    pub const fn only(p: Protocol) -> ProtoSet {
        ProtoSet(1u8.wrapping_shl(p.code() as u32))
    }

    /// Whether `p` is in the set.
    pub const fn contains(self, p: Protocol) -> bool {
        self.0 & 1u8.wrapping_shl(p.code() as u32) != 0
    }

    /// Parses `LL,LL128`, `simple`, `^LL` (NCCL_PROTO's syntax).
    pub fn parse(s: &str) -> Result<ProtoSet, Error> {
        parse_list(s, &Protocol::ALL, Protocol::name).map(ProtoSet)
    }
}

/// Threads per channel and bytes per thread below which NCCL drops a
/// channel: `NCCL_{LL,LL128,SIMPLE}_MAX_NTHREADS` = 512 / 640 / 512 and
/// `NCCL_{LL,LL128,SIMPLE}_THREAD_THRESHOLD` = 8 / 8 / 64 (the ring's LL
/// threshold is multiplied by the rank count).
fn bytes_per_channel(a: Algorithm, p: Protocol, ranks: u32) -> u64 {
    match p {
        Protocol::Ll => {
            let per: u64 = 512 * 8;
            if a == Algorithm::Ring {
                per.saturating_mul(u64::from(ranks.max(1)))
            } else {
                per
            }
        }
        Protocol::Ll128 => 640 * 8,
        Protocol::Simple => 512 * 64,
    }
}

impl Tuner {
    /// A tuner with every algorithm and protocol allowed.
    pub fn new(hw: Hardware, ranks: u32, nodes: u32, caps: Capabilities) -> Tuner {
        Tuner {
            hw,
            ranks,
            nodes,
            caps,
            algos: AlgoSet::ALL,
            protos: ProtoSet::ALL,
            lat: Latencies::NCCL,
        }
    }

    /// The same tuner with the backend's own latency tables.
    #[must_use]
    pub const fn with_latencies(mut self, lat: Latencies) -> Tuner {
        self.lat = lat;
        self
    }

    fn nodes(&self) -> u32 {
        self.nodes.clamp(1, self.ranks.max(1))
    }

    fn max_channels(&self) -> u32 {
        self.hw.max_channels.clamp(1, 64)
    }

    /// Channels a call of `bytes` uses: NCCL's heuristic, fewer channels
    /// while each would get less than its threads' threshold.
    pub fn channels(&self, a: Algorithm, p: Protocol, bytes: u64) -> u32 {
        let per = bytes_per_channel(a, p, self.ranks).max(1);
        let want = u32::try_from(bytes.checked_div(per).unwrap_or(0)).unwrap_or(u32::MAX);
        want.clamp(1, self.max_channels())
    }

    /// The bus bandwidth (GB/s) of `a` × `p` with every channel, and the
    /// algorithm bandwidth it gives.
    fn algbw_full(&self, c: Collective, a: Algorithm, p: Protocol) -> f64 {
        let hw = &self.hw;
        let nodes = self.nodes();
        let n = f64::from(self.ranks.max(1));
        let ch = f64::from(self.max_channels());
        let ppn = n / f64::from(nodes);
        let net = hw.inter_gbps.max(0.0);
        let intra = hw.intra_gbps.max(0.0);
        // ringcc's reading of NCCL's bwIntra / bwInter choice: a ring is
        // bound by the slower of the two fabrics; a tree on two nodes
        // sends each half of the data over the network once each way, so
        // it may reach twice the NICs' rate (what published 2-node runs
        // show); on more nodes it is bound by the network.
        let link = match (a, nodes) {
            (_, 1) => intra,
            (Algorithm::Ring, _) => intra.min(net),
            (Algorithm::Tree, 2) => intra.min(2.0 * net),
            (Algorithm::Tree, _) => intra.min(net),
        };
        // NCCL's llMaxBws: Hopper row for one node ({87.7, 22.5, 19.0}
        // Ampere/Hopper, {39.0, 39.0, 20.4} Volta); CPU row otherwise.
        let ll_max = if nodes == 1 {
            match hw.gen {
                GpuGen::Volta => 39.0,
                _ => 87.7,
            }
        } else if hw.amd_cpu {
            pick3([87.7, 22.5, 19.0], nodes)
        } else {
            pick3([39.0, 39.0, 20.4], nodes)
        };
        let bus = match (a, p) {
            (Algorithm::Ring, Protocol::Ll) => {
                let eff = if nodes > 1
                    || matches!(c, Collective::AllReduce | Collective::Reduce { .. })
                {
                    0.25
                } else {
                    1.0 / 3.0
                };
                (link * eff).min(ll_max)
            }
            (Algorithm::Ring, Protocol::Ll128) => {
                let eff = if ppn < 2.0 { 0.7 } else { 0.92 };
                (link * eff).min(ch * hw.gen.ring_ll128_cap(nodes))
            }
            (Algorithm::Ring, Protocol::Simple) => link.min(ch * hw.channel_gbps.max(0.0)),
            (Algorithm::Tree, _) => {
                let t = (link * 0.92).min(ch * hw.gen.tree_cap(nodes));
                match p {
                    Protocol::Ll => (t / 3.8).min(ll_max),
                    Protocol::Ll128 => {
                        let eff = if nodes == 1 { 7.0 / 9.0 } else { 120.0 / 128.0 };
                        (t * eff).min(ch * hw.gen.tree_ll128_cap(nodes))
                    }
                    Protocol::Simple => t,
                }
            }
        };
        match a {
            Algorithm::Ring => {
                let steps = f64::from(ring_steps(c, self.ranks).max(1));
                bus * n / steps
            }
            Algorithm::Tree => bus * 0.5,
        }
    }

    /// The latency term (µs) of `a` × `p`, without the plateau factor.
    fn latency(&self, c: Collective, a: Algorithm, p: Protocol) -> f64 {
        let (ai, pi) = (a.code() as usize, p.code() as usize);
        let get = |t: &PerAlgoProto| t.get(ai).and_then(|r| r.get(pi)).copied().unwrap_or(0.0);
        let nodes = self.nodes();
        let hw = &self.hw;
        let lat = &self.lat;
        let intra_table = if hw.nvlink {
            &lat.nvlink_us
        } else {
            &lat.pci_us
        };
        let mut intra = get(intra_table);
        let flush = if p == Protocol::Simple { 2.0 } else { 1.0 };
        let inter = get(&lat.net_us) + hw.net_latency_us * flush;
        let base = get(&lat.base_us);
        let ppn = self.ranks.max(1).checked_div(nodes).unwrap_or(1);
        match a {
            Algorithm::Ring => {
                let steps = ring_steps(c, self.ranks);
                match c {
                    Collective::Broadcast { .. } | Collective::Reduce { .. } => {
                        // NCCL: nsteps × the hop latency of the slowest
                        // fabric; Simple takes the tree's (chunk) latency.
                        let table = if nodes > 1 { &lat.net_us } else { intra_table };
                        let hop = if p == Protocol::Simple {
                            table.get(1).and_then(|r| r.get(2)).copied().unwrap_or(0.0)
                        } else {
                            get(table)
                        };
                        base + f64::from(steps) * hop
                    }
                    _ => {
                        let inter_steps = match (c, nodes) {
                            (_, 1) => 0,
                            (Collective::AllReduce, _) => nodes.saturating_mul(2),
                            _ => nodes.saturating_sub(1),
                        }
                        .min(steps);
                        if nodes > 1 {
                            let post = if p == Protocol::Simple { 3.0 } else { 1.0 };
                            intra = intra.max(hw.net_overhead_us * post);
                        }
                        base + f64::from(steps.saturating_sub(inter_steps)) * intra
                            + f64::from(inter_steps) * inter
                    }
                }
            }
            Algorithm::Tree => {
                let depth = f64::from(31u32.saturating_sub(nodes.leading_zeros()));
                base + 2.0 * (f64::from(ppn.saturating_sub(1)) * intra + depth * inter)
            }
        }
    }

    /// The model's estimate for a call of `bytes` with `a` × `p`; `None`
    /// where the model has no such schedule (Tree is AllReduce only).
    pub fn estimate(
        &self,
        c: Collective,
        bytes: u64,
        a: Algorithm,
        p: Protocol,
    ) -> Option<Estimate> {
        if a == Algorithm::Tree && c != Collective::AllReduce {
            return None;
        }
        let channels = self.channels(a, p, bytes);
        let mut bw =
            self.algbw_full(c, a, p) * f64::from(channels) / f64::from(self.max_channels());
        if a == Algorithm::Tree {
            let log = 63u32.saturating_sub((bytes >> 6).max(1).leading_zeros());
            if let Some(f) = TREE_CORRECTION
                .get(p.code() as usize)
                .and_then(|r| r.get(log as usize))
            {
                bw *= f;
            }
        }
        let mut latency = self.latency(c, a, p);
        let n = u64::from(self.ranks.max(1));
        if a == Algorithm::Ring
            && p == Protocol::Simple
            && self.nodes() > 1
            && c == Collective::AllReduce
            && bytes
                .checked_div(u64::from(self.max_channels()).saturating_mul(n))
                .unwrap_or(0)
                >= 64
        {
            // NCCL's "plateau effect of ring".
            latency *= match self.hw.gen {
                GpuGen::Volta => 1.9,
                _ => 1.4,
            };
        }
        let time_us = if bw > 0.0 {
            latency + bytes as f64 / (1000.0 * bw)
        } else {
            f64::INFINITY
        };
        Some(Estimate {
            algorithm: a,
            protocol: p,
            channels,
            latency_us: latency,
            algbw_gbps: bw,
            time_us,
        })
    }

    /// Whether `a` × `p` may run: the backend can and the overrides allow.
    pub fn allowed(&self, a: Algorithm, p: Protocol) -> bool {
        self.caps.allows(a, p) && self.algos.contains(a) && self.protos.contains(p)
    }

    /// The choice for a call of `bytes`: the allowed candidate with the
    /// least estimated time, the first in code order on a tie.
    pub fn choose(&self, c: Collective, bytes: u64) -> Result<Choice, Error> {
        let mut table: Table = [None; 6];
        let mut allowed = [false; 6];
        let mut best: Option<Estimate> = None;
        for a in Algorithm::ALL {
            for p in Protocol::ALL {
                let e = self.estimate(c, bytes, a, p);
                let ok = self.allowed(a, p) && e.is_some();
                if let Some(t) = table.get_mut(slot(a, p)) {
                    *t = e;
                }
                if let Some(t) = allowed.get_mut(slot(a, p)) {
                    *t = ok;
                }
                if let (true, Some(e)) = (ok, e) {
                    if best.is_none_or(|b| e.time_us.total_cmp(&b.time_us).is_lt()) {
                        best = Some(e);
                    }
                }
            }
        }
        let chosen = best.ok_or(Error::NoTuningCandidate)?;
        Ok(Choice {
            chosen,
            table,
            allowed,
        })
    }
}

/// The ring's steps of a collective on `ranks` ranks (NCCL's `nsteps`):
/// `2(n−1)` for AllReduce, `n−1` for ReduceScatter and AllGather, `n` for
/// Broadcast and Reduce.
pub fn ring_steps(c: Collective, ranks: u32) -> u32 {
    let m = ranks.max(1).saturating_sub(1);
    match c {
        Collective::AllReduce => m.saturating_mul(2),
        Collective::ReduceScatter | Collective::AllGather => m,
        Collective::Broadcast { .. } | Collective::Reduce { .. } => ranks.max(1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn dgx_h100() -> Hardware {
        Hardware {
            gen: GpuGen::Hopper,
            nvlink: true,
            intra_gbps: 370.0,
            inter_gbps: 8.0 * 48.0,
            channel_gbps: 24.0,
            max_channels: 32,
            net_overhead_us: 1.0,
            net_latency_us: 0.0,
            amd_cpu: false,
        }
    }

    #[test]
    fn lists_parse_as_nccl_does() {
        assert_eq!(AlgoSet::parse("ring"), Ok(AlgoSet::only(Algorithm::Ring)));
        assert_eq!(AlgoSet::parse("Ring,TREE"), Ok(AlgoSet::ALL));
        assert_eq!(AlgoSet::parse("^tree"), Ok(AlgoSet::only(Algorithm::Ring)));
        let p = ProtoSet::parse("LL,LL128").unwrap();
        assert!(p.contains(Protocol::Ll) && p.contains(Protocol::Ll128));
        assert!(!p.contains(Protocol::Simple));
        let p = ProtoSet::parse("^LL").unwrap();
        assert!(!p.contains(Protocol::Ll) && p.contains(Protocol::Simple));
        assert_eq!(ProtoSet::parse("LL,bogus"), Err(Error::BadTuningList));
        assert_eq!(ProtoSet::parse(""), Err(Error::BadTuningList));
    }

    #[test]
    fn small_messages_pick_ll_and_large_pick_simple() {
        let t = Tuner::new(dgx_h100(), 16, 2, Capabilities::RING);
        let small = t.choose(Collective::AllReduce, 8).unwrap().chosen;
        assert_eq!(small.protocol, Protocol::Ll);
        assert_eq!(small.channels, 1);
        let large = t.choose(Collective::AllReduce, 1 << 30).unwrap().chosen;
        assert_eq!(large.protocol, Protocol::Simple);
        assert_eq!(large.channels, 32);
    }

    #[test]
    fn tree_beats_ring_at_64_ranks_for_small_messages() {
        for ranks in [64u32, 128, 256, 512] {
            let t = Tuner::new(dgx_h100(), ranks, ranks / 8, Capabilities::ALL);
            for p in Protocol::ALL {
                let ring = t
                    .estimate(Collective::AllReduce, 8, Algorithm::Ring, p)
                    .unwrap();
                let tree = t
                    .estimate(Collective::AllReduce, 8, Algorithm::Tree, p)
                    .unwrap();
                assert!(
                    tree.time_us < ring.time_us,
                    "{ranks} {p}: {tree:?} {ring:?}"
                );
            }
            let c = t.choose(Collective::AllReduce, 8).unwrap().chosen;
            assert_eq!(c.algorithm, Algorithm::Tree);
        }
    }

    /// NCCL adds the plugin's latency to each network hop (ring: 2 ×
    /// nodes of them in an AllReduce; tree: 2 × log2 nodes), twice under
    /// Simple, and to nothing inside a node.
    #[test]
    fn a_reported_network_latency_is_added_per_network_hop() {
        let est = |net: f64, ranks: u32, nodes: u32, a: Algorithm, p: Protocol| {
            let hw = Hardware {
                net_latency_us: net,
                ..dgx_h100()
            };
            Tuner::new(hw, ranks, nodes, Capabilities::ALL)
                .estimate(Collective::AllReduce, 8, a, p)
                .unwrap()
                .latency_us
        };
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        for (nodes, ring_hops, tree_hops) in [(2u32, 4.0, 2.0), (4, 8.0, 4.0), (16, 32.0, 8.0)] {
            let ranks = nodes * 8;
            for p in Protocol::ALL {
                let flush = if p == Protocol::Simple { 2.0 } else { 1.0 };
                let ring = est(75.0, ranks, nodes, Algorithm::Ring, p)
                    - est(0.0, ranks, nodes, Algorithm::Ring, p);
                assert!(close(ring, 75.0 * ring_hops * flush), "{nodes} {p}: {ring}");
                let tree = est(75.0, ranks, nodes, Algorithm::Tree, p)
                    - est(0.0, ranks, nodes, Algorithm::Tree, p);
                assert!(close(tree, 75.0 * tree_hops * flush), "{nodes} {p}: {tree}");
            }
        }
        for p in Protocol::ALL {
            let one_node = est(75.0, 8, 1, Algorithm::Ring, p) - est(0.0, 8, 1, Algorithm::Ring, p);
            assert!(close(one_node, 0.0), "{p}: {one_node}");
        }
    }

    #[test]
    fn nothing_allowed_is_an_error() {
        let mut t = Tuner::new(dgx_h100(), 16, 2, Capabilities::RING);
        t.algos = AlgoSet::only(Algorithm::Tree);
        assert_eq!(
            t.choose(Collective::AllReduce, 8),
            Err(Error::NoTuningCandidate)
        );
    }
}
