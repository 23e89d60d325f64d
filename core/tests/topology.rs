//! Rings over topologies: every rank once, nodes consecutive, entered and
//! left once, NICs as the channel map says.

use proptest::prelude::*;
use ringcc_core::topology::{HopKind, Topology};
use ringcc_core::{ChannelId, Error, NicId, NodeId, Rank, RingIndex};

type T = Topology<1024>;

#[test]
fn the_seed_example_three_nodes_two_gpus() {
    // 节点A: GPU0, GPU1; 节点B: GPU2, GPU3; 节点C: GPU4, GPU5 — ring 0→1→…→5→0,
    // alternating NVLink and IB hops.
    let t = T::uniform(3, 2, 1).unwrap();
    let ring = t.ring(ChannelId(0)).unwrap();
    let order: Vec<u32> = ring.iter().map(|r| r.0).collect();
    assert_eq!(order, [0, 1, 2, 3, 4, 5]);
    let hops: Vec<HopKind> = (0..6).map(|r| ring.hop(Rank(r)).unwrap()).collect();
    let ib = HopKind::Inter {
        send_nic: NicId(0),
        recv_nic: NicId(0),
    };
    assert_eq!(
        hops,
        [HopKind::Intra, ib, HopKind::Intra, ib, HopKind::Intra, ib]
    );
    assert_eq!(ring.next(Rank(5)).unwrap(), Rank(0));
    assert_eq!(ring.prev(Rank(0)).unwrap(), Rank(5));
}

#[test]
fn eight_channels_on_eight_nics_use_every_nic() {
    let t = T::uniform(2, 8, 8).unwrap();
    for c in 0..16u8 {
        let ring = t.ring(ChannelId(c)).unwrap();
        let nic = NicId(u16::from(c % 8));
        assert_eq!(
            ring.hop(Rank(7)).unwrap(),
            HopKind::Inter {
                send_nic: nic,
                recv_nic: nic
            }
        );
        assert_eq!(t.nic_of_channel(ChannelId(c)), Some(nic));
    }
}

#[test]
fn cross_nic_rotates_rings_inside_nodes() {
    let t = T::uniform(2, 4, 4).unwrap().with_cross_nic(true);
    let ring = t.ring(ChannelId(1)).unwrap();
    let order: Vec<u32> = ring.iter().map(|r| r.0).collect();
    // Node 0 entered at local GPU 1 and left at GPU 0; ring index 0 is rank 0.
    assert_eq!(order, [0, 5, 6, 7, 4, 1, 2, 3]);
    // Rank 0 (exit of node 0, local 0) sends through NIC 0 to rank 5 (entry
    // of node 1, local 1), which takes it through NIC 1.
    assert_eq!(
        ring.hop(Rank(0)).unwrap(),
        HopKind::Inter {
            send_nic: NicId(0),
            recv_nic: NicId(1)
        }
    );
}

#[test]
fn placement_by_node_labels() {
    // Cyclic placement (srun --distribution=cyclic): ranks alternate nodes.
    let t = T::from_placement(&[7, 9, 7, 9, 7, 9], 2).unwrap();
    assert_eq!(t.nodes(), 2);
    assert_eq!(t.node_of(Rank(1)).unwrap(), NodeId(1));
    assert_eq!(t.local_of(Rank(4)).unwrap(), 2);
    let ring = t.ring(ChannelId(0)).unwrap();
    let order: Vec<u32> = ring.iter().map(|r| r.0).collect();
    assert_eq!(order, [0, 2, 4, 1, 3, 5]);
    assert_eq!(ring.index_of(Rank(1)).unwrap(), RingIndex(3));
    assert_eq!(
        ring.hop(Rank(4)).unwrap(),
        HopKind::Inter {
            send_nic: NicId(0),
            recv_nic: NicId(0)
        }
    );
    let nodes: Vec<u32> = t.node_ranks(NodeId(1)).map(|r| r.0).collect();
    assert_eq!(nodes, [1, 3, 5]);
}

#[test]
fn bad_topologies_are_typed_errors() {
    assert_eq!(T::uniform(0, 8, 1).unwrap_err(), Error::NoRanks);
    assert_eq!(T::uniform(2, 8, 0).unwrap_err(), Error::NoNic);
    assert!(T::uniform(1, 8, 0).is_ok());
    assert_eq!(
        Topology::<8>::uniform(3, 3, 1).unwrap_err(),
        Error::TooManyRanks {
            ranks: 9,
            capacity: 8
        }
    );
    assert_eq!(
        T::uniform(1, 2, 1)
            .unwrap()
            .ring(ChannelId(64))
            .unwrap_err(),
        Error::BadChannel { channel: 64 }
    );
    assert_eq!(T::from_placement(&[], 1).unwrap_err(), Error::NoRanks);
    let t = T::uniform(1, 2, 1).unwrap();
    assert_eq!(
        t.ring(ChannelId(0)).unwrap().next(Rank(2)),
        Err(Error::RankOutOfRange { rank: 2, ranks: 2 })
    );
    assert_eq!(
        T::uniform(1, 1, 1)
            .unwrap()
            .ring(ChannelId(0))
            .unwrap()
            .hop(Rank(0))
            .unwrap(),
        HopKind::Loopback
    );
}

proptest! {
    #[test]
    fn rings_are_permutations_with_consecutive_nodes(
        labels in prop::collection::vec(0u32..6, 1..80),
        nics in 1u16..9,
        cross in any::<bool>(),
        channel in 0u8..64,
    ) {
        let t = T::from_placement(&labels, nics).unwrap().with_cross_nic(cross);
        let n = t.ranks();
        let ring = t.ring(ChannelId(channel)).unwrap();
        let order: Vec<Rank> = ring.iter().collect();
        // A permutation starting at rank 0.
        let mut seen = vec![false; n as usize];
        for r in &order { prop_assert!(!seen[r.0 as usize]); seen[r.0 as usize] = true; }
        prop_assert_eq!(order[0], Rank(0));
        // next/prev/index consistent.
        for (i, &r) in order.iter().enumerate() {
            prop_assert_eq!(ring.index_of(r).unwrap(), RingIndex(i as u32));
            prop_assert_eq!(ring.rank_at(RingIndex(i as u32)).unwrap(), r);
            let next = order[(i + 1) % order.len()];
            prop_assert_eq!(ring.next(r).unwrap(), next);
            prop_assert_eq!(ring.prev(next).unwrap(), r);
        }
        // Each node's ranks are consecutive: the ring changes node exactly
        // `nodes` times (once per node) when there is more than one node.
        let changes = (0..order.len())
            .filter(|&i| t.node_of(order[i]).unwrap() != t.node_of(order[(i + 1) % order.len()]).unwrap())
            .count();
        prop_assert_eq!(changes as u32, if t.nodes() > 1 { t.nodes() } else { 0 });
        // Hop kinds and NICs.
        for &r in &order {
            let next = ring.next(r).unwrap();
            match ring.hop(r).unwrap() {
                HopKind::Loopback => prop_assert_eq!(n, 1),
                HopKind::Intra => prop_assert_eq!(t.node_of(r).unwrap(), t.node_of(next).unwrap()),
                HopKind::Inter { send_nic, recv_nic } => {
                    prop_assert!(t.node_of(r).unwrap() != t.node_of(next).unwrap());
                    prop_assert!(send_nic.0 < nics && recv_nic.0 < nics);
                    if !cross {
                        prop_assert_eq!(send_nic, NicId(u16::from(channel) % nics));
                        prop_assert_eq!(recv_nic, send_nic);
                    }
                }
            }
        }
    }
}
