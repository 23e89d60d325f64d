//! The double binary tree and the per-rank tree built on it: NCCL's shapes
//! (the pictures in src/graph/trees.cc), and properties over 1–64 nodes of
//! 1–8 ranks: one root, every rank reached, parent and child agree, at
//! most three children, depth at most ⌈log2 nodes⌉ + (ranks per node − 1),
//! and the two trees' interior nodes (nearly) disjoint.

use proptest::prelude::*;
use ringcc_core::tree::{btree, dtree, dtree_root, NodeLinks, TreePlan, TreeSteps, UniformTree};
use ringcc_core::{ChannelId, DataType, Primitive, Rank, Topology, Tree, TreeOrder};

fn links(n: u32, i: u32, which: u8) -> (Option<u32>, Vec<u32>) {
    let l: NodeLinks = dtree(n, i, which);
    (l.up, l.down.into_iter().flatten().collect())
}

/// The first picture of trees.cc: 14 nodes, tree 0.
#[test]
fn btree_matches_nccls_picture() {
    let want: [(u32, Option<u32>, &[u32]); 14] = [
        (0, None, &[8]),
        (8, Some(0), &[4, 12]),
        (4, Some(8), &[2, 6]),
        (12, Some(8), &[10, 13]),
        (2, Some(4), &[1, 3]),
        (6, Some(4), &[5, 7]),
        (10, Some(12), &[9, 11]),
        (1, Some(2), &[]),
        (3, Some(2), &[]),
        (5, Some(6), &[]),
        (7, Some(6), &[]),
        (9, Some(10), &[]),
        (11, Some(10), &[]),
        (13, Some(12), &[]),
    ];
    for (i, up, down) in want {
        assert_eq!(links(14, i, 0), (up, down.to_vec()), "node {i}");
    }
}

/// The mirrored tree of trees.cc's second picture (12 nodes): root 11,
/// 11 → 3 → {1, 7}.
#[test]
fn mirror_and_shift_match_nccls_pictures() {
    assert_eq!(dtree_root(12, 1), 11);
    assert_eq!(links(12, 11, 1), (None, vec![3]));
    assert_eq!(links(12, 3, 1).0, Some(11));
    let mut d = links(12, 3, 1).1;
    d.sort_unstable();
    assert_eq!(d, vec![1, 7]);
    // Shifted (13 nodes): root 1, 1 → 9 → {5, 0}.
    assert_eq!(dtree_root(13, 1), 1);
    assert_eq!(links(13, 1, 1), (None, vec![9]));
    let mut d = links(13, 9, 1).1;
    d.sort_unstable();
    assert_eq!(d, vec![0, 5]);
}

fn depth_of<T: TreeOrder>(t: &T, r: Rank) -> u32 {
    let mut d = 0;
    let mut at = r;
    while let Some(u) = t.peers(at).unwrap().up {
        at = u;
        d += 1;
        assert!(d <= t.ranks(), "a cycle through rank {}", r.0);
    }
    d
}

fn ceil_log2(n: u32) -> u32 {
    32 - (n.max(1) - 1).leading_zeros()
}

/// Checks one tree over `n` ranks: one root, parents and children agree,
/// every rank reached, the depth bound.
fn check_tree<T: TreeOrder>(t: &T, bound: u32) {
    let n = t.ranks();
    let mut roots = 0;
    let mut children = 0;
    for r in 0..n {
        let p = t.peers(Rank(r)).unwrap();
        assert!(p.n_down() <= 3);
        for (k, d) in p.down.iter().enumerate() {
            assert_eq!(d.is_some(), k < p.n_down(), "children packed");
        }
        match p.up {
            None => roots += 1,
            Some(u) => {
                let q = t.peers(u).unwrap();
                assert!(
                    q.down.contains(&Some(Rank(r))),
                    "{r}'s parent {} lists it",
                    u.0
                );
            }
        }
        for d in p.down.iter().flatten() {
            children += 1;
            assert_eq!(t.peers(*d).unwrap().up, Some(Rank(r)));
        }
        assert!(
            depth_of(t, Rank(r)) <= bound,
            "rank {r} deeper than {bound}"
        );
    }
    assert_eq!(roots, 1);
    // n − 1 edges and one root with every walk up ending there: a tree
    // that reaches every rank.
    assert_eq!(children, n - 1);
}

#[test]
fn node_trees_are_trees_up_to_1024_nodes() {
    for n in 1..=1024u32 {
        for which in 0..2u8 {
            let t = UniformTree {
                nodes: n,
                gpus: 1,
                which,
                head: 0,
            };
            check_tree(&t, ceil_log2(n));
            assert_eq!(t.root(), Rank(dtree_root(n, which)));
            assert!(t.peers(t.root()).unwrap().is_root());
        }
    }
}

/// The point of the second tree: a node interior in one tree is a leaf
/// in the other, for all nodes but at most one. Checked up to 1024 nodes.
#[test]
fn few_nodes_are_interior_in_both_trees() {
    for n in 3..=1024u32 {
        let both = (0..n)
            .filter(|&i| !btree(n, i).down.iter().all(Option::is_none))
            .filter(|&i| !dtree(n, i, 1).down.iter().all(Option::is_none))
            .count();
        assert!(both <= 1, "{n} nodes: {both} interior in both trees");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Ranks: nodes as above, a chain inside each node from the channel's
    /// head through the node's ranks in order (wrapping); depth at most
    /// ⌈log2 nodes⌉ plus the chain.
    #[test]
    fn rank_trees_reach_every_rank(
        nodes in 1..=64u32, gpus in 1..=8u32, nics in 1..=16u16, channel in 0..64u8,
    ) {
        let id = ChannelId(channel);
        let t = UniformTree::for_channel(nodes, gpus, nics, id);
        check_tree(&t, ceil_log2(nodes) + (gpus - 1));
        // The chain: the head on the node tree (or the root), each next
        // rank of the node below the one before.
        let head = ringcc_core::tree_head(id, gpus, nics);
        prop_assert!(head < gpus);
        for r in 0..nodes * gpus {
            let (node, local) = (r / gpus, r % gpus);
            let up = t.peers(Rank(r)).unwrap().up;
            if local == head {
                prop_assert!(up.is_none_or(|u| u.0 / gpus != node && u.0 % gpus == head));
            } else {
                prop_assert_eq!(up, Some(Rank(node * gpus + (local + gpus - 1) % gpus)));
            }
        }
        // Over a topology with the same placement: the same tree.
        let topo = Topology::<512>::uniform(nodes, gpus, nics).unwrap();
        let tt = Tree::new(&topo, id);
        for r in 0..nodes * gpus {
            prop_assert_eq!(tt.peers(Rank(r)).unwrap(), t.peers(Rank(r)).unwrap());
        }
        prop_assert_eq!(tt.root(), Some(t.root()));
    }

    /// A plan's steps: each chunk once up (or at the root, turned) and
    /// once down, up before down, a non-root rank at most one chunk ahead
    /// going up; the primitives by role; chunks cover the channel's range.
    #[test]
    fn steps_cover_each_chunk_up_then_down(
        count in 0..5000u64, channels in 1..=8u32, chunk in 1..64u64, nodes in 1..=9u32, gpus in 1..=4u32,
    ) {
        let n = nodes * gpus;
        let plan = TreePlan::new(count, DataType::F32, n, channels, chunk * 4).unwrap();
        let mut covered = 0u64;
        for c in 0..channels {
            let id = ChannelId(c as u8);
            let t = UniformTree::for_channel(nodes, gpus, gpus as u16, id);
            let k = plan.chunks(id).unwrap();
            let range = plan.ring_plan().channel_range(id).unwrap();
            covered += range.end - range.start;
            for r in 0..n {
                let p = t.peers(Rank(r)).unwrap();
                let steps: TreeSteps = plan.steps(id, p).unwrap();
                let all: Vec<_> = steps.collect();
                let mut up = vec![0u32; k as usize];
                let mut down = vec![0u32; k as usize];
                let mut highest_up = 0u64;
                for s in &all {
                    prop_assert!(s.offset >= range.start && s.offset + s.count <= range.end);
                    let want = match (p.is_root(), p.is_leaf(), s.dir) {
                        (true, _, _) if n == 1 => Primitive::COPY_ONLY,
                        (true, _, _) => Primitive::RECV_REDUCE_COPY_SEND,
                        (false, true, ringcc_core::tree::TreeDir::Up) => Primitive::SEND_ONLY,
                        (false, true, _) => Primitive::RECV_ONLY,
                        (false, false, ringcc_core::tree::TreeDir::Up) => Primitive::RECV_REDUCE_SEND,
                        (false, false, _) => Primitive::RECV_COPY_SEND,
                    };
                    prop_assert_eq!(s.primitive, want);
                    match s.dir {
                        ringcc_core::tree::TreeDir::Up => {
                            up[s.chunk as usize] += 1;
                            highest_up = s.chunk;
                        }
                        ringcc_core::tree::TreeDir::Down => {
                            prop_assert_eq!(up[s.chunk as usize], 1, "down before up");
                            prop_assert!(highest_up <= s.chunk + 1, "more than one chunk ahead");
                            down[s.chunk as usize] += 1;
                        }
                        ringcc_core::tree::TreeDir::Turn => {
                            up[s.chunk as usize] += 1;
                            down[s.chunk as usize] += 1;
                        }
                    }
                }
                prop_assert!(up.iter().chain(&down).all(|&x| x == 1));
            }
        }
        prop_assert_eq!(covered, count);
    }

    /// `TreeSteps::split` (the concurrent streams of a non-root rank): the
    /// up stream is the interleaved order's up steps and the down stream
    /// its down steps, each in chunk order with the interleaved indices,
    /// also when split after `walked` steps; a root's one stream is whole.
    #[test]
    fn split_streams_are_the_interleaved_steps_by_direction(
        count in 0..5000u64, chunk in 1..64u64, nodes in 1..=9u32, gpus in 1..=4u32, walked in 0..8usize,
    ) {
        use ringcc_core::tree::TreeDir;
        let n = nodes * gpus;
        let plan = TreePlan::new(count, DataType::F32, n, 2, chunk * 4).unwrap();
        for c in 0..2u8 {
            let id = ChannelId(c);
            let t = UniformTree::for_channel(nodes, gpus, gpus as u16, id);
            for r in 0..n {
                let p = t.peers(Rank(r)).unwrap();
                let all: Vec<_> = plan.steps(id, p).unwrap().collect();
                let mut steps = plan.steps(id, p).unwrap();
                let skip = walked.min(all.len());
                for _ in 0..skip {
                    steps.next();
                }
                let (a, b) = steps.split();
                let rest = &all[skip..];
                match b {
                    None => {
                        prop_assert!(p.is_root());
                        prop_assert_eq!(a.collect::<Vec<_>>(), rest.to_vec());
                    }
                    Some(b) => {
                        prop_assert!(!p.is_root());
                        let up: Vec<_> = rest.iter().copied().filter(|s| s.dir == TreeDir::Up).collect();
                        let down: Vec<_> = rest.iter().copied().filter(|s| s.dir == TreeDir::Down).collect();
                        prop_assert_eq!(a.remaining(), up.len() as u64);
                        prop_assert_eq!(b.remaining(), down.len() as u64);
                        prop_assert_eq!(a.collect::<Vec<_>>(), up);
                        prop_assert_eq!(b.collect::<Vec<_>>(), down);
                    }
                }
            }
        }
    }
}

/// Tree edges inside a node are NVLink hops; across nodes they use the
/// channel's NIC on both ends, channels `2k` and `2k + 1` (one of each
/// tree) the same.
#[test]
fn tree_hops_follow_the_nodes_and_the_channel_pairs_nic() {
    use ringcc_core::{HopKind, NicId};
    let topo = Topology::<64>::uniform(5, 4, 4).unwrap();
    for c in 0..8u8 {
        let t = Tree::new(&topo, ChannelId(c));
        assert_eq!(t.channel(), ChannelId(c));
        for r in 0..20 {
            let p = t.peers(Rank(r)).unwrap();
            for d in p.down.iter().flatten() {
                let want = if d.0 / 4 == r / 4 {
                    HopKind::Intra
                } else {
                    HopKind::Inter {
                        send_nic: NicId(u16::from(c / 2) % 4),
                        recv_nic: NicId(u16::from(c / 2) % 4),
                    }
                };
                assert_eq!(t.hop(Rank(r), *d).unwrap(), want);
                assert_eq!(t.hop(*d, Rank(r)).unwrap(), want);
            }
        }
        assert_eq!(t.hop(Rank(3), Rank(3)).unwrap(), HopKind::Loopback);
        assert!(t.hop(Rank(0), Rank(99)).is_err());
    }
}

/// A channel's chain starts at the first GPU of its NIC's share of the
/// node: GPU `k` for NIC `k` of a NIC per GPU, `2k` for 4 NICs on 8
/// GPUs, `k / 2` for 16 NICs on 8; a pair of channels (one of each tree)
/// per head; without NICs the node's first rank.
#[test]
fn a_chain_starts_next_to_its_channels_nic() {
    use ringcc_core::{tree_head, tree_nic};
    for c in 0..64u8 {
        let id = ChannelId(c);
        let k = u32::from(c / 2);
        assert_eq!(tree_head(id, 8, 8), k % 8);
        assert_eq!(tree_head(id, 8, 4), 2 * (k % 4));
        assert_eq!(tree_head(id, 8, 16), (k % 16) / 2);
        assert_eq!(tree_head(id, 3, 2), [0, 1][(k % 2) as usize]);
        assert_eq!(tree_head(id, 8, 0), 0);
        assert_eq!(tree_nic(id, 0), None);
        for gpus in 1..=9u32 {
            for nics in 1..=17u16 {
                assert!(tree_head(id, gpus, nics) < gpus);
            }
        }
    }
    // Every GPU heads a pair of channels when there is a NIC per GPU.
    let heads: Vec<u32> = (0..16u8).map(|c| tree_head(ChannelId(c), 8, 8)).collect();
    assert_eq!(heads, [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7]);
}
