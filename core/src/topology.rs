//! Ranks, nodes, NICs, and the rings built over them.
//!
//! A [`Topology`] groups ranks (GPUs) by node. Its base order lists every
//! node's ranks consecutively, nodes in order, so that each ring enters a
//! node once and leaves it once: `NET n → GPU a → … → GPU x → NET n`. Every
//! channel `c` is one ring over that order; its cross-node hops use NIC
//! `c mod nics` on both ends (NCCL's `NCCL_CROSS_NIC=0`, and the seed's
//! "8 channels on 8 NICs, same GPU order").
//!
//! With cross-NIC allowed, channel `c`'s ring is rotated inside each node so
//! that it enters the node at local GPU `c mod g` and leaves it at
//! `(c − 1) mod g`; each of those hops uses the NIC nearest the GPU
//! (`local · nics / g`), so entry and exit NICs differ. This spreads both the
//! NICs and the GPUs' PCIe links over the channels.
//!
//! The capacity `R` (maximum ranks) is a const generic: firmware picks a
//! small one, a host build 1024 or more. Every query is O(1).

use crate::error::Error;
use crate::id::{ChannelId, NicId, NodeId, Rank, RingIndex};

/// The most channels a communicator can have (NCCL's `MAXCHANNELS`).
pub const MAX_CHANNELS: u32 = 64;

/// What carries one hop of a ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum HopKind {
    /// A one-rank ring: the rank's successor is itself; nothing moves.
    Loopback,
    /// Both ranks on one node: a GPU peer copy over NVLink (or PCIe); no
    /// NIC, no queue pair, no packets.
    Intra,
    /// Between nodes, leaving the sender's node through `send_nic` and
    /// entering the receiver's through `recv_nic`.
    Inter {
        /// The NIC of the sending node.
        send_nic: NicId,
        /// The NIC of the receiving node.
        recv_nic: NicId,
    },
}

/// The capacity the std crates (simulator, backends, command, tests) give
/// a [`Topology`]: 4096 ranks, as large as the NCCL jobs people run. A
/// firmware build picks its own with the const generic.
pub const MAX_RANKS: usize = 4096;

/// Ranks grouped by node, with up to `R` ranks.
#[derive(Clone, Debug)]
pub struct Topology<const R: usize> {
    ranks: u32,
    nodes: u32,
    nics: u16,
    cross_nic: bool,
    /// Base position → rank.
    order: [u32; R],
    /// Rank → base position.
    pos: [u32; R],
    /// Rank → node.
    node_of: [u32; R],
    /// Node → base position of its first rank (`nodes` entries used).
    node_start: [u32; R],
}

impl<const R: usize> Topology<R> {
    /// `nodes` nodes with `gpus_per_node` GPUs each (rank `r` on node
    /// `r / gpus_per_node`) and `nics_per_node` NICs each.
    pub fn uniform(nodes: u32, gpus_per_node: u32, nics_per_node: u16) -> Result<Self, Error> {
        if nodes == 0 || gpus_per_node == 0 {
            return Err(Error::NoRanks);
        }
        let ranks = u64::from(nodes).saturating_mul(u64::from(gpus_per_node));
        let ranks = Self::check_capacity(ranks)?;
        let mut t = Self::empty(ranks, nodes, nics_per_node)?;
        for r in 0..ranks {
            let node = r.checked_div(gpus_per_node).unwrap_or(0);
            t.set(r, r, node);
        }
        for k in 0..nodes {
            t.set_node_start(k, k.saturating_mul(gpus_per_node));
        }
        Ok(t)
    }

    /// Ranks placed on nodes by `node_of_rank[r]` (any labels; nodes are
    /// ordered by first appearance, each node's GPUs by rank), with
    /// `nics_per_node` NICs on every node.
    pub fn from_placement(node_of_rank: &[u32], nics_per_node: u16) -> Result<Self, Error> {
        let ranks = Self::check_capacity(node_of_rank.len() as u64)?;
        if ranks == 0 {
            return Err(Error::NoRanks);
        }
        // Pass 1: dense node index (first appearance) per rank, node sizes.
        let mut t = Self::empty(ranks, 0, nics_per_node)?;
        let mut label_of_node = [0u32; R];
        let mut count = [0u32; R];
        let mut nodes = 0u32;
        for (r, &label) in node_of_rank.iter().enumerate() {
            let mut found = None;
            for k in 0..nodes as usize {
                if label_of_node.get(k) == Some(&label) {
                    found = Some(k);
                    break;
                }
            }
            let k = match found {
                Some(k) => k,
                None => {
                    let k = nodes as usize;
                    *label_of_node.get_mut(k).ok_or(Error::Capacity)? = label;
                    nodes = nodes.saturating_add(1);
                    k
                }
            };
            *t.node_of.get_mut(r).ok_or(Error::Capacity)? = k as u32;
            let c = count.get_mut(k).ok_or(Error::Capacity)?;
            *c = c.saturating_add(1);
        }
        t.nodes = nodes;
        t.validate_nics()?;
        // Pass 2: prefix sums give each node's first base position.
        let mut start = 0u32;
        for k in 0..nodes {
            t.set_node_start(k, start);
            start = start.saturating_add(count.get(k as usize).copied().unwrap_or(0));
        }
        // Pass 3: place ranks (stable: by rank within a node).
        let mut fill = t.node_start;
        for r in 0..ranks {
            let k = t.node_of.get(r as usize).copied().unwrap_or(0) as usize;
            let slot = fill.get_mut(k).ok_or(Error::Capacity)?;
            let p = *slot;
            *slot = p.saturating_add(1);
            *t.order.get_mut(p as usize).ok_or(Error::Capacity)? = r;
            *t.pos.get_mut(r as usize).ok_or(Error::Capacity)? = p;
        }
        Ok(t)
    }

    /// Allows (or forbids) a ring to leave a node through a different NIC
    /// than it entered (NCCL's `NCCL_CROSS_NIC`). Default: forbidden.
    #[must_use]
    pub fn with_cross_nic(mut self, allow: bool) -> Self {
        self.cross_nic = allow;
        self
    }

    fn check_capacity(ranks: u64) -> Result<u32, Error> {
        let cap = R as u64;
        if ranks > cap || ranks > u64::from(u32::MAX) {
            return Err(Error::TooManyRanks {
                ranks,
                capacity: cap,
            });
        }
        Ok(ranks as u32)
    }

    fn empty(ranks: u32, nodes: u32, nics: u16) -> Result<Self, Error> {
        let t = Topology {
            ranks,
            nodes,
            nics,
            cross_nic: false,
            order: [0; R],
            pos: [0; R],
            node_of: [0; R],
            node_start: [0; R],
        };
        t.validate_nics()?;
        Ok(t)
    }

    fn validate_nics(&self) -> Result<(), Error> {
        if self.nodes > 1 && self.nics == 0 {
            return Err(Error::NoNic);
        }
        Ok(())
    }

    fn set(&mut self, rank: u32, position: u32, node: u32) {
        if let Some(o) = self.order.get_mut(position as usize) {
            *o = rank;
        }
        if let Some(p) = self.pos.get_mut(rank as usize) {
            *p = position;
        }
        if let Some(n) = self.node_of.get_mut(rank as usize) {
            *n = node;
        }
    }

    fn set_node_start(&mut self, node: u32, position: u32) {
        if let Some(s) = self.node_start.get_mut(node as usize) {
            *s = position;
        }
    }

    /// Number of ranks.
    #[inline]
    pub fn ranks(&self) -> u32 {
        self.ranks
    }

    /// Number of nodes.
    #[inline]
    pub fn nodes(&self) -> u32 {
        self.nodes
    }

    /// NICs per node.
    #[inline]
    pub fn nics_per_node(&self) -> u16 {
        self.nics
    }

    /// Whether rings may leave a node through another NIC than they entered.
    #[inline]
    pub fn cross_nic(&self) -> bool {
        self.cross_nic
    }

    fn check_rank(&self, rank: Rank) -> Result<u32, Error> {
        if rank.0 >= self.ranks {
            return Err(Error::RankOutOfRange {
                rank: rank.0,
                ranks: self.ranks,
            });
        }
        Ok(rank.0)
    }

    /// The node a rank lives on.
    pub fn node_of(&self, rank: Rank) -> Result<NodeId, Error> {
        let r = self.check_rank(rank)?;
        Ok(NodeId(self.node_of.get(r as usize).copied().unwrap_or(0)))
    }

    /// The rank's GPU index within its node (`0..gpus_in_node`).
    pub fn local_of(&self, rank: Rank) -> Result<u32, Error> {
        let r = self.check_rank(rank)?;
        let node = self.node_of.get(r as usize).copied().unwrap_or(0);
        let p = self.pos.get(r as usize).copied().unwrap_or(0);
        Ok(p.saturating_sub(self.start_of(node)))
    }

    /// Number of GPUs (ranks) on a node; 0 for a node that does not exist.
    pub fn gpus_in_node(&self, node: NodeId) -> u32 {
        if node.0 >= self.nodes {
            return 0;
        }
        let end = if node.0.saturating_add(1) == self.nodes {
            self.ranks
        } else {
            self.start_of(node.0.saturating_add(1))
        };
        end.saturating_sub(self.start_of(node.0))
    }

    /// The ranks of a node, by local GPU index.
    pub fn node_ranks(&self, node: NodeId) -> impl Iterator<Item = Rank> + '_ {
        let start = self.start_of(node.0) as usize;
        let len = self.gpus_in_node(node) as usize;
        self.order
            .get(start..start.saturating_add(len))
            .unwrap_or(&[])
            .iter()
            .map(|&r| Rank(r))
    }

    fn start_of(&self, node: u32) -> u32 {
        self.node_start.get(node as usize).copied().unwrap_or(0)
    }

    /// The NIC channel `c` uses for its cross-node hops when cross-NIC is
    /// forbidden (`c mod nics`); `None` without NICs.
    pub fn nic_of_channel(&self, channel: ChannelId) -> Option<NicId> {
        let c = u16::from(channel.0);
        c.checked_rem(self.nics).map(NicId)
    }

    /// Channel `c`'s ring.
    pub fn ring(&self, channel: ChannelId) -> Result<Ring<'_, R>, Error> {
        if u32::from(channel.0) >= MAX_CHANNELS {
            return Err(Error::BadChannel {
                channel: u32::from(channel.0),
            });
        }
        let origin = Ring {
            topo: self,
            channel,
            origin: 0,
        }
        .ring_pos(0);
        Ok(Ring {
            topo: self,
            channel,
            origin,
        })
    }
}

/// One channel's ring over a [`Topology`]: successor, predecessor, ring
/// index and hop kind of every rank, each in O(1).
#[derive(Clone, Copy, Debug)]
pub struct Ring<'a, const R: usize> {
    topo: &'a Topology<R>,
    channel: ChannelId,
    /// Ring position of rank 0 (ring index 0).
    origin: u32,
}

impl<'a, const R: usize> Ring<'a, R> {
    /// The channel this ring belongs to.
    pub fn channel(&self) -> ChannelId {
        self.channel
    }

    /// Number of ranks on the ring.
    pub fn len(&self) -> u32 {
        self.topo.ranks
    }

    /// Always false: a topology has at least one rank.
    pub fn is_empty(&self) -> bool {
        self.topo.ranks == 0
    }

    /// This channel's rotation inside node `node` (0 without cross-NIC).
    fn rotation(&self, node: u32) -> u32 {
        if !self.topo.cross_nic {
            return 0;
        }
        let g = self.topo.gpus_in_node(NodeId(node));
        u32::from(self.channel.0).checked_rem(g).unwrap_or(0)
    }

    /// Ring position (in `0..ranks`, before re-basing on rank 0) of a base
    /// position.
    fn ring_pos_of_base(&self, base: u32) -> u32 {
        let rank = self.topo.order.get(base as usize).copied().unwrap_or(0);
        let node = self.topo.node_of.get(rank as usize).copied().unwrap_or(0);
        let start = self.topo.start_of(node);
        let g = self.topo.gpus_in_node(NodeId(node));
        let i = base.saturating_sub(start);
        let t = self.rotation(node);
        // (i - t) mod g, without underflow.
        let j = i
            .wrapping_add(g)
            .wrapping_sub(t)
            .checked_rem(g)
            .unwrap_or(0);
        start.saturating_add(j)
    }

    fn base_of_ring_pos(&self, q: u32) -> u32 {
        // Rotation keeps positions inside their node, so the node at ring
        // position q is the node at base position q.
        let rank = self.topo.order.get(q as usize).copied().unwrap_or(0);
        let node = self.topo.node_of.get(rank as usize).copied().unwrap_or(0);
        let start = self.topo.start_of(node);
        let g = self.topo.gpus_in_node(NodeId(node));
        let j = q.saturating_sub(start);
        let t = self.rotation(node);
        let i = j.wrapping_add(t).checked_rem(g).unwrap_or(0);
        start.saturating_add(i)
    }

    fn ring_pos(&self, rank: u32) -> u32 {
        let base = self.topo.pos.get(rank as usize).copied().unwrap_or(0);
        self.ring_pos_of_base(base)
    }

    fn rank_at_pos(&self, q: u32) -> u32 {
        let base = self.base_of_ring_pos(q);
        self.topo.order.get(base as usize).copied().unwrap_or(0)
    }

    fn step_pos(&self, q: u32, forward: bool) -> u32 {
        let n = self.topo.ranks;
        if forward {
            q.wrapping_add(1).checked_rem(n).unwrap_or(0)
        } else {
            q.wrapping_add(n)
                .wrapping_sub(1)
                .checked_rem(n)
                .unwrap_or(0)
        }
    }

    /// The rank's successor: the rank it sends to.
    pub fn next(&self, rank: Rank) -> Result<Rank, Error> {
        let r = self.topo.check_rank(rank)?;
        Ok(Rank(
            self.rank_at_pos(self.step_pos(self.ring_pos(r), true)),
        ))
    }

    /// The rank's predecessor: the rank it receives from.
    pub fn prev(&self, rank: Rank) -> Result<Rank, Error> {
        let r = self.topo.check_rank(rank)?;
        Ok(Rank(
            self.rank_at_pos(self.step_pos(self.ring_pos(r), false)),
        ))
    }

    /// The rank's position along the ring, counted from rank 0.
    pub fn index_of(&self, rank: Rank) -> Result<RingIndex, Error> {
        let r = self.topo.check_rank(rank)?;
        let n = self.topo.ranks;
        let q = self.ring_pos(r);
        Ok(RingIndex(
            q.wrapping_add(n)
                .wrapping_sub(self.origin)
                .checked_rem(n)
                .unwrap_or(0),
        ))
    }

    /// The rank at a ring index.
    pub fn rank_at(&self, index: RingIndex) -> Result<Rank, Error> {
        let n = self.topo.ranks;
        if index.0 >= n {
            return Err(Error::RankOutOfRange {
                rank: index.0,
                ranks: n,
            });
        }
        let q = index
            .0
            .wrapping_add(self.origin)
            .checked_rem(n)
            .unwrap_or(0);
        Ok(Rank(self.rank_at_pos(q)))
    }

    /// The NIC a node is entered through on this ring.
    fn entry_nic(&self, node: u32) -> NicId {
        let nics = self.topo.nics;
        if !self.topo.cross_nic {
            return self.topo.nic_of_channel(self.channel).unwrap_or(NicId(0));
        }
        self.nic_near(node, self.rotation(node), nics)
    }

    /// The NIC a node is left through on this ring.
    fn exit_nic(&self, node: u32) -> NicId {
        let nics = self.topo.nics;
        if !self.topo.cross_nic {
            return self.topo.nic_of_channel(self.channel).unwrap_or(NicId(0));
        }
        let g = self.topo.gpus_in_node(NodeId(node));
        let exit_local = self
            .rotation(node)
            .wrapping_add(g)
            .wrapping_sub(1)
            .checked_rem(g)
            .unwrap_or(0);
        self.nic_near(node, exit_local, nics)
    }

    /// The NIC nearest to local GPU `local` of a node: NICs spread evenly
    /// over the node's GPUs.
    fn nic_near(&self, node: u32, local: u32, nics: u16) -> NicId {
        let g = u64::from(self.topo.gpus_in_node(NodeId(node)));
        let v = u64::from(local)
            .saturating_mul(u64::from(nics))
            .checked_div(g)
            .unwrap_or(0);
        NicId(u16::try_from(v).unwrap_or(0))
    }

    /// What carries the hop from `rank` to its successor.
    pub fn hop(&self, rank: Rank) -> Result<HopKind, Error> {
        let next = self.next(rank)?;
        if next == rank {
            return Ok(HopKind::Loopback);
        }
        let a = self.topo.node_of(rank)?;
        let b = self.topo.node_of(next)?;
        if a == b {
            return Ok(HopKind::Intra);
        }
        Ok(HopKind::Inter {
            send_nic: self.exit_nic(a.0),
            recv_nic: self.entry_nic(b.0),
        })
    }

    /// The ranks in ring order, starting at rank 0.
    pub fn iter(&self) -> impl Iterator<Item = Rank> + '_ {
        (0..self.topo.ranks).filter_map(move |i| self.rank_at(RingIndex(i)).ok())
    }
}

/// What a plan needs to know of a ring: its length and which rank sits at
/// each ring index. Implemented by [`Ring`], by [`InOrderRing`], and by
/// references to either, so a backend can hand plans a ring it owns.
pub trait RingOrder {
    /// Number of ranks on the ring.
    fn ranks(&self) -> u32;
    /// The rank at a ring index (`index < ranks`).
    fn rank_at(&self, index: RingIndex) -> Result<Rank, Error>;
    /// The ring index of a rank.
    fn index_of(&self, rank: Rank) -> Result<RingIndex, Error>;
}

impl<const R: usize> RingOrder for Ring<'_, R> {
    fn ranks(&self) -> u32 {
        self.len()
    }
    fn rank_at(&self, index: RingIndex) -> Result<Rank, Error> {
        Ring::rank_at(self, index)
    }
    fn index_of(&self, rank: Rank) -> Result<RingIndex, Error> {
        Ring::index_of(self, rank)
    }
}

impl<T: RingOrder + ?Sized> RingOrder for &T {
    fn ranks(&self) -> u32 {
        (**self).ranks()
    }
    fn rank_at(&self, index: RingIndex) -> Result<Rank, Error> {
        (**self).rank_at(index)
    }
    fn index_of(&self, rank: Rank) -> Result<RingIndex, Error> {
        (**self).index_of(rank)
    }
}

/// A ring in rank order (`0 → 1 → … → n−1 → 0`): ring index = rank. What a
/// single node, or any node-major topology without cross-NIC, produces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InOrderRing {
    /// Number of ranks.
    pub ranks: u32,
}

impl RingOrder for InOrderRing {
    fn ranks(&self) -> u32 {
        self.ranks
    }
    fn rank_at(&self, index: RingIndex) -> Result<Rank, Error> {
        if index.0 >= self.ranks {
            return Err(Error::RankOutOfRange {
                rank: index.0,
                ranks: self.ranks,
            });
        }
        Ok(Rank(index.0))
    }
    fn index_of(&self, rank: Rank) -> Result<RingIndex, Error> {
        if rank.0 >= self.ranks {
            return Err(Error::RankOutOfRange {
                rank: rank.0,
                ranks: self.ranks,
            });
        }
        Ok(RingIndex(rank.0))
    }
}
