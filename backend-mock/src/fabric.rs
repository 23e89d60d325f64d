//! The physical cluster built from the core's topology: every channel's
//! ring as index tables, every connection's hop, and the links that carry
//! them (one NVLink per ordered GPU pair of a node, one transmit side per
//! NIC port) as serial resources.

use std::collections::HashMap;
use std::sync::Arc;

use ringcc_core::topology::{RingOrder, Topology};
use ringcc_core::{ChannelId, Error as CoreError, HopKind, NicId, NodeId, Rank, RingIndex};

use crate::config::{ClusterConfig, LinkModel, MAX_RANKS};
use crate::error::Error;
use crate::events::{ps, Ps, Rate};

/// One channel's ring as two index tables: O(1) `rank_at` / `index_of`
/// without borrowing the topology.
#[derive(Debug)]
pub(crate) struct RingTable {
    rank_at: Vec<u32>,
    index_of: Vec<u32>,
}

/// A shared ring table, what the plans and machines walk.
#[derive(Clone, Debug)]
pub(crate) struct RingRef(pub Arc<RingTable>);

impl RingOrder for RingRef {
    fn ranks(&self) -> u32 {
        self.0.rank_at.len() as u32
    }
    fn rank_at(&self, index: RingIndex) -> Result<Rank, CoreError> {
        self.0
            .rank_at
            .get(index.0 as usize)
            .map(|&r| Rank(r))
            .ok_or(CoreError::RankOutOfRange {
                rank: index.0,
                ranks: self.ranks(),
            })
    }
    fn index_of(&self, rank: Rank) -> Result<RingIndex, CoreError> {
        self.0
            .index_of
            .get(rank.0 as usize)
            .map(|&i| RingIndex(i))
            .ok_or(CoreError::RankOutOfRange {
                rank: rank.0,
                ranks: self.ranks(),
            })
    }
}

/// What carries one connection (a rank to its successor on a channel).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Hop {
    /// One rank: nothing moves.
    Loopback,
    /// A peer copy over NVLink `link`.
    Nvlink { link: u32 },
    /// RDMA from the sender's port `tx` to the receiver's port `rx` (the
    /// connection's queue pairs, in payload mode, are in the lane's
    /// `LaneMem`: a lane keeps a copy of its hop on the hot path).
    Net { tx: u32, rx: u32 },
}

/// What kind of link a [`LinkStats`](crate::LinkStats) entry is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkKind {
    /// NVLink from one GPU to another.
    NvLink {
        /// Sending rank.
        from: Rank,
        /// Receiving rank.
        to: Rank,
    },
    /// The transmit side of a NIC port.
    NicTx {
        /// The node.
        node: NodeId,
        /// The NIC.
        nic: NicId,
    },
}

impl LinkKind {
    /// The link's name in reports and traces.
    pub fn name(&self) -> String {
        match *self {
            LinkKind::NvLink { from, to } => format!("nvlink {}->{}", from.0, to.0),
            LinkKind::NicTx { node, nic } => format!("nic {}.{} tx", node.0, nic.0),
        }
    }
}

/// A serial link: one transfer at a time, each `bytes / bandwidth` long,
/// arriving `latency` after it left.
///
/// One cache line (its name is made from its kind when a report needs
/// it): every slice sent reserves a link.
#[derive(Clone, Debug)]
#[repr(align(64))]
pub(crate) struct LinkRes {
    pub kind: LinkKind,
    pub rate: Rate,
    pub latency: Ps,
    /// When the link is free for the next transfer.
    pub free_at: Ps,
    pub bytes: u64,
    pub messages: u64,
    pub busy: Ps,
}

impl LinkRes {
    fn new(kind: LinkKind, m: &LinkModel) -> LinkRes {
        LinkRes {
            kind,
            rate: Rate::new(m.bandwidth),
            latency: ps(m.latency),
            free_at: 0,
            bytes: 0,
            messages: 0,
            busy: 0,
        }
    }

    /// Occupies the link for `bytes`, starting no earlier than `ready`;
    /// returns (start, end) of the transfer on the link.
    #[inline(always)]
    pub fn reserve(&mut self, ready: Ps, bytes: u64) -> (Ps, Ps) {
        let start = ready.max(self.free_at);
        let d = self.rate.time(bytes);
        let end = start.saturating_add(d);
        self.free_at = end;
        self.bytes = self.bytes.saturating_add(bytes);
        self.messages = self.messages.saturating_add(1);
        self.busy = self.busy.saturating_add(d);
        (start, end)
    }
}

/// A NIC port.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PortInfo {
    pub node: u32,
    pub nic: u16,
    /// Its transmit link.
    pub link: u32,
}

/// One lane's place in the fabric.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LaneTopo {
    pub rank: u32,
    pub channel: u32,
    pub next: u32,
    pub prev: u32,
    pub hop: Hop,
}

impl LaneTopo {
    /// The lane's rank, as the public types name it.
    #[inline]
    pub fn rank_id(&self) -> Rank {
        Rank(self.rank)
    }

    /// The lane's channel, as the public types name it (channels are
    /// fewer than [`MAX_CHANNELS`](ringcc_core::topology::MAX_CHANNELS)).
    #[inline]
    pub fn channel_id(&self) -> ChannelId {
        ChannelId(self.channel as u8)
    }
}

/// The port number of NIC `nic` of node `node` on nodes of `nics` NICs:
/// ports are numbered node-major, every NIC of node 0 first.
pub(crate) fn nic_port(node: u32, nics: u16, nic: NicId) -> u32 {
    node * u32::from(nics) + u32::from(nic.0)
}

/// The whole fabric.
#[derive(Debug)]
pub(crate) struct Fabric {
    pub ranks: u32,
    pub channels: u32,
    pub rings: Vec<RingRef>,
    pub node_of: Vec<u32>,
    pub links: Vec<LinkRes>,
    pub ports: Vec<PortInfo>,
    /// Per lane (`channel · ranks + rank`).
    pub lanes: Vec<LaneTopo>,
}

impl Fabric {
    pub fn build(cfg: &ClusterConfig) -> Result<Fabric, Error> {
        let topo_err = |source| Error::Topology { source };
        let topo = Box::new(
            Topology::<MAX_RANKS>::uniform(cfg.nodes, cfg.gpus_per_node, cfg.nics_per_node)
                .map_err(topo_err)?
                .with_cross_nic(cfg.cross_nic),
        );
        let n = topo.ranks();
        let node_of: Vec<u32> = (0..n)
            .map(|r| topo.node_of(Rank(r)).map(|k| k.0))
            .collect::<Result<_, _>>()
            .map_err(topo_err)?;
        let mut links = Vec::new();
        let mut ports = Vec::new();
        for node in 0..cfg.nodes {
            for nic in 0..cfg.nics_per_node {
                ports.push(PortInfo {
                    node,
                    nic,
                    link: links.len() as u32,
                });
                links.push(LinkRes::new(
                    LinkKind::NicTx {
                        node: NodeId(node),
                        nic: NicId(nic),
                    },
                    &LinkModel {
                        bandwidth: cfg.nic.bandwidth * cfg.calibration.nic_efficiency,
                        ..cfg.nic
                    },
                ));
            }
        }
        let port_of = |node: u32, nic: NicId| nic_port(node, cfg.nics_per_node, nic);
        let mut nvlinks: HashMap<(u32, u32), u32> = HashMap::new();
        let mut rings = Vec::new();
        let mut lanes = Vec::with_capacity((cfg.channels * n) as usize);
        // Lanes channel-major: a ring's neighbours are neighbours in memory
        // (measured faster than rank-major on 512 ranks).
        let mut by_channel = Vec::with_capacity(cfg.channels as usize);
        for c in 0..cfg.channels {
            let ring = topo.ring(ChannelId(c as u8)).map_err(topo_err)?;
            let mut rank_at = vec![0u32; n as usize];
            let mut index_of = vec![0u32; n as usize];
            for r in 0..n {
                let i = ring.index_of(Rank(r)).map_err(topo_err)?.0;
                index_of[r as usize] = i;
                rank_at[i as usize] = r;
            }
            rings.push(RingRef(Arc::new(RingTable { rank_at, index_of })));
            let mut lanes_c = Vec::with_capacity(n as usize);
            for r in 0..n {
                let next = ring.next(Rank(r)).map_err(topo_err)?.0;
                let prev = ring.prev(Rank(r)).map_err(topo_err)?.0;
                let hop = match ring.hop(Rank(r)).map_err(topo_err)? {
                    HopKind::Loopback => Hop::Loopback,
                    HopKind::Intra => {
                        let len = links.len() as u32;
                        let link = *nvlinks.entry((r, next)).or_insert(len);
                        if link == len {
                            links.push(LinkRes::new(
                                LinkKind::NvLink {
                                    from: Rank(r),
                                    to: Rank(next),
                                },
                                &LinkModel {
                                    bandwidth: cfg.nvlink.bandwidth
                                        * cfg.calibration.nvlink_efficiency,
                                    ..cfg.nvlink
                                },
                            ));
                        }
                        Hop::Nvlink { link }
                    }
                    HopKind::Inter { send_nic, recv_nic } => Hop::Net {
                        tx: port_of(node_of[r as usize], send_nic),
                        rx: port_of(node_of[next as usize], recv_nic),
                    },
                };
                lanes_c.push(LaneTopo {
                    rank: r,
                    channel: c,
                    next,
                    prev,
                    hop,
                });
            }
            by_channel.push(lanes_c);
        }
        for lanes_c in &by_channel {
            lanes.extend_from_slice(lanes_c);
        }
        Ok(Fabric {
            ranks: n,
            channels: cfg.channels,
            rings,
            node_of,
            links,
            ports,
            lanes,
        })
    }

    /// The lane of (channel, rank).
    #[inline]
    pub fn lane(&self, channel: u32, rank: u32) -> u32 {
        channel * self.ranks + rank
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eight_channels_use_eight_nics_and_shared_nvlinks() {
        let cfg = ClusterConfig {
            nodes: 2,
            gpus_per_node: 4,
            nics_per_node: 8,
            channels: 8,
            ..Default::default()
        };
        let f = Fabric::build(&cfg).unwrap();
        let mut tx_ports = std::collections::BTreeSet::new();
        for l in &f.lanes {
            if let Hop::Net { tx, .. } = l.hop {
                tx_ports.insert(tx);
            }
        }
        assert_eq!(tx_ports.len(), 16, "8 NICs on each of 2 nodes");
        // 16 ports + NVLinks 0->1, 1->2, 2->3 and 4->5, 5->6, 6->7 shared
        // by all channels.
        assert_eq!(f.links.len(), 16 + 6);
        let ring = &f.rings[3];
        for r in 0..8 {
            let i = ring.index_of(Rank(r)).unwrap();
            assert_eq!(ring.rank_at(i).unwrap(), Rank(r));
        }
    }

    #[test]
    fn reserve_serializes() {
        let mut l = LinkRes::new(
            LinkKind::NicTx {
                node: NodeId(0),
                nic: NicId(0),
            },
            &LinkModel::NIC_400G,
        );
        assert_eq!(l.reserve(0, 50_000), (0, 1_000_000));
        assert_eq!(l.reserve(10, 50_000), (1_000_000, 2_000_000));
        assert_eq!(l.reserve(5_000_000, 0), (5_000_000, 5_000_000));
        assert_eq!(l.bytes, 100_000);
        assert_eq!(l.kind.name(), "nic 0.0 tx");
        assert_eq!(size_of::<LinkRes>(), 64);
    }
}
