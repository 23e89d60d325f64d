//! Tree AllReduce: NCCL's double binary tree across nodes, a chain inside
//! each node, and the pipelined reduce-up / broadcast-down schedule.
//!
//! # The trees
//!
//! Across `N` nodes, tree 0 is a binary tree read off the bits of the node
//! index (NCCL's `ncclGetBtree`, src/graph/trees.cc): node 0 is the root and
//! has one child, the largest power of two below `N`; a node whose lowest
//! set bit is `b` hangs below `(i ^ b) | 2b` (or `i ^ b` when that is out of
//! range) and has children `i − b/2` and the first of `i + b/2, i + b/4, …`
//! that exists. Odd nodes are leaves. Tree 1 (NCCL's `ncclGetDtree`) is
//! tree 0 mirrored (`i → N−1−i`) when `N` is even and shifted by one node
//! (`i → i+1 mod N`) when it is odd, so that the leaves of one tree are
//! (nearly all) the interior nodes of the other and the two trees load the
//! nodes' links evenly. Channel `c` uses tree `c mod 2`; channels split the
//! buffer as the ring's do, so each tree carries half the data.
//!
//! Between nodes, channels `2k` and `2k + 1` — one of each tree — share NIC
//! `k mod nics` ([`tree_nic`]). NCCL pairs them the same way: its channel
//! `c` runs tree 0 and channel `c + n/2` tree 1 over one graph channel's
//! NIC (`connectTrees`, src/graph/connect.cc). A node is interior in one
//! tree and (nearly always) a leaf in the other, so a NIC that carried two
//! channels of the same tree (the ring's `c mod nics` with 16 channels on
//! 8 NICs) would carry three times its sibling's bytes, and the tree's
//! bandwidth on three or more nodes two thirds of what the NICs allow.
//! As in NCCL, a call of fewer than `2 · nics` channels carries its trees
//! over `channels / 2` NICs (NCCL reaches every NIC of a node with more
//! graph channels, so more channels).
//!
//! Inside a node the ranks form a chain in the node's order, starting at
//! the channel's head ([`tree_head`]: the first GPU of the channel's NIC's
//! share of the node, so NIC `k` of 8 on 8 GPUs has GPU `k`) and wrapping
//! around: the head is on the inter-node tree, the rank after it hangs
//! below it, and so on. NCCL's tree graph likewise starts each channel's
//! chain at the GPU next to its NIC. Heads spread over the node this way
//! share out the NVLink sends as well: a chain's head and tail send one
//! way, its inner ranks both, so that with each pair of channels headed
//! by another of 8 GPUs no GPU sends more than `1.75 S` of an AllReduce of
//! `S` bytes, where a chain fixed at the node's first rank has its inner
//! ranks send `2 S`. A rank thus has at most one parent (`up`) and at most three
//! children (`down`: two nodes' heads and the next rank of its node),
//! NCCL's `tree.up` / `tree.down[NCCL_MAX_TREE_ARITY = 3]`.
//!
//! # The schedule
//!
//! A channel's range is cut into chunks of the plan's chunk size (at least
//! one, possibly empty, so every connection carries the call header). Per
//! chunk the data goes up — each rank receives the partial sums of its
//! children, reduces them with its input and sends the result to its parent
//! (`recvReduceSend`; a leaf just `send`s) — and the root finishes the
//! reduction and starts it down in one step (`recvReduceCopySend`); going
//! down, each rank copies the result to its output and forwards it
//! (`recvCopySend`; a leaf `recv`s). A non-root rank interleaves the two
//! directions one chunk apart — `up 0, up 1, down 0, up 2, down 1, …,
//! down K−1` — so chunk `k` goes up while chunk `k − 1` comes down. A lag
//! of one chunk is the most a FIFO that holds a single chunk allows: a rank
//! two chunks ahead would wait for room in its parent's FIFO, which the
//! parent frees only after its children consumed what it sent down.
//!
//! The [`TreeMachine`](crate::prim::TreeMachine) does not walk that one
//! sequence, though: it [splits](TreeSteps::split) a non-root rank's steps
//! into the up stream and the down stream and runs them concurrently, one
//! exec outstanding each (NCCL's `runTreeSplit`, src/device/all_reduce.h),
//! so a rank reduces up and broadcasts down at the same time. The two
//! streams use disjoint connections (up: the children's in, the parent's
//! out; down: the other way), so neither waits for the other; they meet
//! only at the root, whose one stream turns each chunk around.

use crate::error::Error;
use crate::id::{ChannelId, NicId, NodeId, Rank};
use crate::math::div_up;
use crate::plan::{Collective, Plan};
use crate::prim::Primitive;
use crate::reduce::DataType;
use crate::topology::{HopKind, Topology};

/// NCCL's `NCCL_MAX_TREE_ARITY`: children per rank.
pub const MAX_TREE_ARITY: usize = 3;

/// One node's links in a binary tree over node indices.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct NodeLinks {
    /// The parent node; `None` at the root.
    pub up: Option<u32>,
    /// The child nodes (at most two; `down[1]` only with `down[0]`).
    pub down: [Option<u32>; 2],
}

/// Node `i`'s links in the binary tree over `n` nodes rooted at 0 whose
/// shape follows the bits of the index (NCCL's `ncclGetBtree`; see the
/// [module documentation](self)). No links for `i >= n`.
pub fn btree(n: u32, i: u32) -> NodeLinks {
    if i >= n || n < 2 {
        return NodeLinks::default();
    }
    // The lowest set bit of i; for the root, the first power of two >= n.
    let mut bit = 1u32;
    while bit < n && bit & i == 0 {
        bit = bit.saturating_mul(2);
    }
    let low = bit / 2;
    if i == 0 {
        return NodeLinks {
            up: None,
            down: [(low > 0).then_some(low), None],
        };
    }
    let up = match bit.checked_mul(2).map(|b2| (i ^ bit) | b2) {
        Some(u) if u < n => u,
        _ => i ^ bit,
    };
    let down0 = (low > 0).then(|| i.saturating_sub(low));
    let mut step = low;
    let mut down1 = None;
    while step > 0 {
        match i.checked_add(step) {
            Some(d) if d < n => {
                down1 = Some(d);
                break;
            }
            _ => step /= 2,
        }
    }
    NodeLinks {
        up: Some(up),
        down: [down0, down1],
    }
}

/// Node `i`'s links in tree `which` (0 or 1) of the double binary tree over
/// `n` nodes (NCCL's `ncclGetDtree`): tree 0 is [`btree`]; tree 1 mirrors it
/// when `n` is even and shifts it by one node when `n` is odd.
pub fn dtree(n: u32, i: u32, which: u8) -> NodeLinks {
    if which.is_multiple_of(2) || i >= n {
        return btree(n, i);
    }
    // Tree 1's node i is tree 0's node `to(i)`; tree 0's node x is tree
    // 1's node `from(x)`.
    let shift = n % 2 == 1;
    let to = |x: u32| {
        if shift {
            x.wrapping_add(n)
                .wrapping_sub(1)
                .checked_rem(n)
                .unwrap_or(0)
        } else {
            n.saturating_sub(1).saturating_sub(x)
        }
    };
    let from = |x: u32| {
        if shift {
            x.wrapping_add(1).checked_rem(n).unwrap_or(0)
        } else {
            n.saturating_sub(1).saturating_sub(x)
        }
    };
    let l = btree(n, to(i));
    NodeLinks {
        up: l.up.map(from),
        down: [l.down[0].map(from), l.down[1].map(from)],
    }
}

/// The root node of tree `which` over `n` nodes (NCCL's
/// `ncclGetDtreeRoots`): 0 for tree 0; for tree 1, 1 when `n` is odd (and
/// above 1), else `n − 1`.
pub fn dtree_root(n: u32, which: u8) -> u32 {
    if which.is_multiple_of(2) {
        0
    } else if n % 2 == 1 && n > 1 {
        1
    } else {
        n.saturating_sub(1)
    }
}

/// One rank's neighbours on one channel's tree: NCCL's `tree.up` and
/// `tree.down`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct TreePeers {
    /// The parent; `None` at the root.
    pub up: Option<Rank>,
    /// The children, packed at the front: `down[i]` is `Some` for
    /// `i < n_down()`.
    pub down: [Option<Rank>; MAX_TREE_ARITY],
}

impl TreePeers {
    /// Number of children.
    pub fn n_down(&self) -> usize {
        self.down.iter().take_while(|d| d.is_some()).count()
    }

    /// Whether the rank is the tree's root.
    pub fn is_root(&self) -> bool {
        self.up.is_none()
    }

    /// Whether the rank has no children.
    pub fn is_leaf(&self) -> bool {
        self.down[0].is_none()
    }

    fn push_down(&mut self, r: Rank) -> Result<(), Error> {
        let slot = self
            .down
            .iter_mut()
            .find(|d| d.is_none())
            .ok_or(Error::Capacity)?;
        *slot = Some(r);
        Ok(())
    }
}

/// What a tree plan needs to know of a channel's tree: its size and each
/// rank's neighbours. Implemented by [`Tree`], [`UniformTree`] and
/// references to either.
pub trait TreeOrder {
    /// Number of ranks on the tree.
    fn ranks(&self) -> u32;
    /// The neighbours of `rank`.
    fn peers(&self, rank: Rank) -> Result<TreePeers, Error>;
}

impl<T: TreeOrder + ?Sized> TreeOrder for &T {
    fn ranks(&self) -> u32 {
        (**self).ranks()
    }
    fn peers(&self, rank: Rank) -> Result<TreePeers, Error> {
        (**self).peers(rank)
    }
}

/// The links of the rank at position `pos` of its node's chain (0: the
/// head) on node `node` of `gpus` ranks, given the node tree's links and
/// how to name the rank at `(node, position)`.
fn rank_peers(
    links: NodeLinks,
    node: u32,
    pos: u32,
    gpus: u32,
    rank_at: impl Fn(u32, u32) -> Option<Rank>,
) -> Result<TreePeers, Error> {
    let mut p = TreePeers::default();
    if pos == 0 {
        p.up = match links.up {
            Some(u) => Some(rank_at(u, 0).ok_or(Error::BadTopology)?),
            None => None,
        };
        for d in links.down.into_iter().flatten() {
            p.push_down(rank_at(d, 0).ok_or(Error::BadTopology)?)?;
        }
    } else {
        p.up = Some(rank_at(node, pos.saturating_sub(1)).ok_or(Error::BadTopology)?);
    }
    if pos.saturating_add(1) < gpus {
        p.push_down(rank_at(node, pos.saturating_add(1)).ok_or(Error::BadTopology)?)?;
    }
    Ok(p)
}

/// The position in a chain that starts at local rank `head` of the node's
/// `gpus` ranks of the rank with local index `local`, and back.
/// (Both without overflow for any `u32`s.)
const fn chain_pos(local: u32, head: u32, gpus: u32) -> u32 {
    let (Some(l), Some(h)) = (local.checked_rem(gpus), head.checked_rem(gpus)) else {
        return 0;
    };
    if l >= h {
        l.saturating_sub(h)
    } else {
        l.saturating_add(gpus.saturating_sub(h))
    }
}

/// The local index of chain position `pos` (see [`chain_pos`]).
const fn chain_local(pos: u32, head: u32, gpus: u32) -> u32 {
    let (Some(p), Some(h)) = (pos.checked_rem(gpus), head.checked_rem(gpus)) else {
        return 0;
    };
    let room = gpus.saturating_sub(h);
    if p < room {
        p.saturating_add(h)
    } else {
        p.saturating_sub(room)
    }
}

/// The NIC tree channel `channel` uses between nodes on a node of `nics`
/// NICs: `(channel / 2) mod nics`, so that each NIC serves a channel of
/// each tree (see the [module documentation](self)); `None` without NICs.
pub const fn tree_nic(channel: ChannelId, nics: u16) -> Option<NicId> {
    match (channel.0 as u16 / 2).checked_rem(nics) {
        Some(n) => Some(NicId(n)),
        None => None,
    }
}

/// The local rank that heads tree channel `channel`'s chain on a node of
/// `gpus` ranks and `nics` NICs: the first GPU of its [`tree_nic`]'s share
/// of the node (`nic · gpus / nics`), the GPU next to that NIC on a node
/// with a NIC per GPU. 0 without NICs.
pub const fn tree_head(channel: ChannelId, gpus: u32, nics: u16) -> u32 {
    match tree_nic(channel, nics) {
        Some(nic) => match (nic.0 as u64)
            .saturating_mul(gpus as u64)
            .checked_div(nics as u64)
        {
            // Below `gpus`: `nic < nics`.
            Some(head) => head as u32,
            None => 0,
        },
        None => 0,
    }
}

/// One channel's tree over a [`Topology`]: tree `channel mod 2` of the
/// double binary tree over its nodes, a chain through each node's ranks in
/// the node's order from the channel's [`tree_head`].
#[derive(Clone, Copy, Debug)]
pub struct Tree<'a, const R: usize> {
    topo: &'a Topology<R>,
    channel: ChannelId,
    which: u8,
}

impl<'a, const R: usize> Tree<'a, R> {
    /// The tree channel `channel` uses.
    pub fn new(topo: &'a Topology<R>, channel: ChannelId) -> Self {
        Tree {
            topo,
            channel,
            which: channel.0 % 2,
        }
    }

    /// The channel this tree belongs to.
    pub fn channel(&self) -> ChannelId {
        self.channel
    }

    /// What carries the hop from `from` to `to` (tree neighbours, either
    /// way): nothing for a rank to itself, NVLink inside a node, and
    /// between nodes the channel's [`tree_nic`] on both ends (no
    /// cross-NIC, NCCL's `NCCL_CROSS_NIC=0`). What a simulator maps a tree
    /// connection onto.
    pub fn hop(&self, from: Rank, to: Rank) -> Result<HopKind, Error> {
        if from == to {
            self.topo.node_of(from)?;
            return Ok(HopKind::Loopback);
        }
        if self.topo.node_of(from)? == self.topo.node_of(to)? {
            return Ok(HopKind::Intra);
        }
        let nic = tree_nic(self.channel, self.topo.nics_per_node()).ok_or(Error::NoNic)?;
        Ok(HopKind::Inter {
            send_nic: nic,
            recv_nic: nic,
        })
    }

    /// Which of the two trees (0 or 1).
    pub fn which(&self) -> u8 {
        self.which
    }

    /// The root rank.
    pub fn root(&self) -> Option<Rank> {
        let node = dtree_root(self.topo.nodes(), self.which);
        self.rank_at(node, 0)
    }

    /// The local rank heading the chain of node `node`.
    fn head(&self, node: u32) -> u32 {
        let gpus = self.topo.gpus_in_node(NodeId(node));
        tree_head(self.channel, gpus, self.topo.nics_per_node())
    }

    /// The rank at chain position `pos` of node `node`.
    fn rank_at(&self, node: u32, pos: u32) -> Option<Rank> {
        let gpus = self.topo.gpus_in_node(NodeId(node));
        let local = chain_local(pos, self.head(node), gpus);
        self.topo
            .node_ranks(NodeId(node))
            .nth(local as usize)
            .filter(|_| pos < gpus)
    }
}

impl<const R: usize> TreeOrder for Tree<'_, R> {
    fn ranks(&self) -> u32 {
        self.topo.ranks()
    }

    fn peers(&self, rank: Rank) -> Result<TreePeers, Error> {
        let node = self.topo.node_of(rank)?.0;
        let local = self.topo.local_of(rank)?;
        let gpus = self.topo.gpus_in_node(NodeId(node));
        let pos = chain_pos(local, self.head(node), gpus);
        let links = dtree(self.topo.nodes(), node, self.which);
        rank_peers(links, node, pos, gpus, |n, p| self.rank_at(n, p))
    }
}

/// Tree `which` over `nodes` nodes of `gpus` ranks each, rank `r` on node
/// `r / gpus` (the [`Topology::uniform`] placement), each node's chain
/// starting at local rank `head` — without a topology's storage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UniformTree {
    /// Nodes.
    pub nodes: u32,
    /// Ranks per node.
    pub gpus: u32,
    /// Which of the two trees (0 or 1; channel `c` uses `c mod 2`).
    pub which: u8,
    /// The local rank heading each node's chain (taken mod `gpus`).
    pub head: u32,
}

impl UniformTree {
    /// The tree channel `channel` uses on nodes of `nics` NICs (the
    /// [`Tree`] of [`Topology::uniform`]`(nodes, gpus, nics)`).
    pub fn for_channel(nodes: u32, gpus: u32, nics: u16, channel: ChannelId) -> Self {
        UniformTree {
            nodes,
            gpus,
            which: channel.0 % 2,
            head: tree_head(channel, gpus, nics),
        }
    }

    /// The root rank.
    pub fn root(&self) -> Rank {
        let node = dtree_root(self.nodes, self.which);
        Rank(
            node.saturating_mul(self.gpus)
                .saturating_add(chain_local(0, self.head, self.gpus)),
        )
    }
}

impl TreeOrder for UniformTree {
    fn ranks(&self) -> u32 {
        self.nodes.saturating_mul(self.gpus)
    }

    fn peers(&self, rank: Rank) -> Result<TreePeers, Error> {
        let n = self.ranks();
        if rank.0 >= n {
            return Err(Error::RankOutOfRange {
                rank: rank.0,
                ranks: n,
            });
        }
        let g = self.gpus;
        let node = rank.0.checked_div(g).unwrap_or(0);
        let local = rank.0.checked_rem(g).unwrap_or(0);
        let pos = chain_pos(local, self.head, g);
        let links = dtree(self.nodes, node, self.which);
        rank_peers(links, node, pos, g, |n, p| {
            n.checked_mul(g)
                .and_then(|b| b.checked_add(chain_local(p, self.head, g)))
                .map(Rank)
                .filter(|r| r.0 < self.nodes.saturating_mul(g) && p < g)
        })
    }
}

/// Which way a tree step moves data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum TreeDir {
    /// Reduce up: receive from the children, send to the parent.
    Up,
    /// At the root: receive from the children, send back to them (or, on a
    /// one-rank tree, a local copy).
    Turn,
    /// Broadcast down: receive from the parent, send to the children.
    Down,
}

/// One step of one rank on one channel of a tree AllReduce. Offsets and
/// counts are in elements (input and output offsets are equal).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct TreeStep {
    /// What the step does.
    pub primitive: Primitive,
    /// Which connections it uses.
    pub dir: TreeDir,
    /// Step index on the channel.
    pub index: u64,
    /// The chunk (of the channel).
    pub chunk: u64,
    /// Offset into the input and output buffers.
    pub offset: u64,
    /// Elements (may be 0).
    pub count: u64,
}

/// A validated tree AllReduce plan: the channels' ranges and chunks (the
/// ring plan's rules, one chunk per loop), and each rank's steps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TreePlan {
    plan: Plan,
}

impl TreePlan {
    /// An AllReduce of `count` elements of `dtype` over `ranks` ranks and
    /// `channels` channels, in chunks of `chunk_bytes`.
    pub fn new(
        count: u64,
        dtype: DataType,
        ranks: u32,
        channels: u32,
        chunk_bytes: u64,
    ) -> Result<TreePlan, Error> {
        let plan = Plan::new(
            Collective::AllReduce,
            count,
            dtype,
            ranks,
            channels,
            chunk_bytes,
        )?;
        Ok(TreePlan { plan })
    }

    /// The ring plan of the same call, whose channel ranges and chunk size
    /// this plan shares (what the start checks read).
    pub fn ring_plan(&self) -> &Plan {
        &self.plan
    }

    /// Number of ranks.
    pub fn ranks(&self) -> u32 {
        self.plan.ranks()
    }

    /// Number of channels.
    pub fn channels(&self) -> u32 {
        self.plan.channels()
    }

    /// Chunks of a channel (at least one).
    pub fn chunks(&self, channel: ChannelId) -> Result<u64, Error> {
        let r = self.plan.channel_range(channel)?;
        Ok(div_up(r.end.saturating_sub(r.start), self.plan.chunk_elems()).max(1))
    }

    /// The steps of the rank whose neighbours are `peers` on `channel`.
    pub fn steps(&self, channel: ChannelId, peers: TreePeers) -> Result<TreeSteps, Error> {
        let range = self.plan.channel_range(channel)?;
        let chunks = self.chunks(channel)?;
        let role = match (peers.up.is_some(), peers.is_leaf()) {
            (false, _) => Role::Root,
            (true, true) => Role::Leaf,
            (true, false) => Role::Interior,
        };
        let total = match role {
            Role::Root => chunks,
            _ => chunks.saturating_mul(2),
        };
        Ok(TreeSteps {
            start: range.start,
            end: range.end,
            chunk: self.plan.chunk_elems(),
            chunks,
            role,
            ranks: self.plan.ranks(),
            next: 0,
            total,
            only: None,
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    Root,
    Interior,
    Leaf,
}

/// The steps of one rank on one channel; see [`TreePlan::steps`]. O(1)
/// per step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TreeSteps {
    start: u64,
    end: u64,
    chunk: u64,
    chunks: u64,
    role: Role,
    ranks: u32,
    next: u64,
    total: u64,
    /// A one-direction stream (see [`TreeSteps::split`]).
    only: Option<TreeDir>,
}

impl TreeSteps {
    /// Splits a non-root rank's steps into its reduce-up stream and its
    /// broadcast-down stream (NCCL's `runTreeSplit`, src/device/all_reduce.h:
    /// one group of threads reduces up while the other broadcasts down), to
    /// run concurrently: the up stream reads the children's connections and
    /// writes the parent's, the down stream the other way round, so the two
    /// never share a connection's counters. Each keeps the steps' indices
    /// of the interleaved order. A root's (one) stream comes back whole,
    /// with `None`. Steps already yielded are not yielded again.
    pub fn split(self) -> (TreeSteps, Option<TreeSteps>) {
        if self.role == Role::Root || self.only.is_some() {
            return (self, None);
        }
        let done = self.next;
        // Of the first `done` interleaved steps, how many went up / down.
        // Up at step 0 and at the odd steps before the last.
        let ups = if done == 0 {
            0
        } else {
            (done / 2).saturating_add(1).min(self.chunks)
        };
        let downs = done.saturating_sub(ups);
        let up = TreeSteps {
            next: ups,
            total: self.chunks,
            only: Some(TreeDir::Up),
            ..self.clone()
        };
        let down = TreeSteps {
            next: downs,
            total: self.chunks,
            only: Some(TreeDir::Down),
            ..self
        };
        (up, Some(down))
    }

    /// The interleaved index of chunk `k` going `dir` (a non-root rank).
    fn index_of(&self, k: u64, dir: TreeDir) -> u64 {
        match dir {
            TreeDir::Up if k == 0 => 0,
            TreeDir::Up => k.saturating_mul(2).saturating_sub(1),
            _ if k.saturating_add(1) >= self.chunks => {
                self.chunks.saturating_mul(2).saturating_sub(1)
            }
            _ => k.saturating_mul(2).saturating_add(2),
        }
    }

    /// Steps not yet yielded.
    pub fn remaining(&self) -> u64 {
        self.total.saturating_sub(self.next)
    }

    /// The chunk and direction of step `s` of a non-root rank: `up 0`,
    /// then `up k+1, down k` pairs, then `down K−1`.
    fn up_down(&self, s: u64) -> (u64, TreeDir) {
        if s == 0 {
            return (0, TreeDir::Up);
        }
        let last = self.total.saturating_sub(1);
        if s >= last {
            return (self.chunks.saturating_sub(1), TreeDir::Down);
        }
        let p = s.saturating_sub(1) / 2;
        if s.saturating_sub(1).is_multiple_of(2) {
            (p.saturating_add(1), TreeDir::Up)
        } else {
            (p, TreeDir::Down)
        }
    }
}

impl Iterator for TreeSteps {
    type Item = TreeStep;

    fn next(&mut self) -> Option<TreeStep> {
        let s = self.next;
        if s >= self.total {
            return None;
        }
        self.next = s.saturating_add(1);
        let (chunk, dir, index) = match (self.role, self.only) {
            (Role::Root, _) => (s, TreeDir::Turn, s),
            (_, Some(d)) => (s, d, self.index_of(s, d)),
            _ => {
                let (k, d) = self.up_down(s);
                (k, d, s)
            }
        };
        let primitive = match (self.role, dir) {
            (Role::Root, _) if self.ranks == 1 => Primitive::COPY_ONLY,
            (Role::Root, _) => Primitive::RECV_REDUCE_COPY_SEND,
            (Role::Leaf, TreeDir::Up) => Primitive::SEND_ONLY,
            (Role::Leaf, _) => Primitive::RECV_ONLY,
            (_, TreeDir::Up) => Primitive::RECV_REDUCE_SEND,
            _ => Primitive::RECV_COPY_SEND,
        };
        let offset = self
            .start
            .saturating_add(chunk.saturating_mul(self.chunk))
            .min(self.end);
        let count = self.chunk.min(self.end.saturating_sub(offset));
        Some(TreeStep {
            primitive,
            dir,
            index,
            chunk,
            offset,
            count,
        })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let r = self.remaining();
        match usize::try_from(r) {
            Ok(r) => (r, Some(r)),
            Err(_) => (usize::MAX, None),
        }
    }
}
