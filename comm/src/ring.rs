//! The ring order of a communicator: ranks grouped by node (each node's
//! ranks consecutive, nodes in order of their lowest rank), so a ring
//! crosses between nodes as few times as it can — the core topology's
//! rule `NET → GPU a → … → GPU x → NET`.

use std::sync::Arc;

use ringcc_core::{Error as CoreError, Rank, RingIndex, RingOrder};

/// A ring over `order` (ring index → rank), cheap to clone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RingOrderOf {
    order: Arc<[u32]>,
    index: Arc<[u32]>,
}

impl RingOrderOf {
    /// The ring that visits the ranks node by node: `nodes[r]` is rank
    /// `r`'s node name.
    pub fn by_node<S: AsRef<str>>(nodes: &[S]) -> RingOrderOf {
        let mut first: Vec<(usize, &str)> = Vec::new();
        for (r, n) in nodes.iter().enumerate() {
            if !first.iter().any(|(_, m)| *m == n.as_ref()) {
                first.push((r, n.as_ref()));
            }
        }
        let mut order = Vec::with_capacity(nodes.len());
        for (_, node) in &first {
            for (r, n) in nodes.iter().enumerate() {
                if n.as_ref() == *node {
                    order.push(r as u32);
                }
            }
        }
        RingOrderOf::from_order(order)
    }

    fn from_order(order: Vec<u32>) -> RingOrderOf {
        let mut index = vec![0u32; order.len()];
        for (i, &r) in order.iter().enumerate() {
            if let Some(slot) = index.get_mut(r as usize) {
                *slot = i as u32;
            }
        }
        RingOrderOf {
            order: order.into(),
            index: index.into(),
        }
    }

    /// The rank after `rank` on the ring.
    pub fn next(&self, rank: Rank) -> Rank {
        let n = self.order.len() as u32;
        let i = self.index.get(rank.0 as usize).copied().unwrap_or(0);
        Rank(
            self.order
                .get(((i + 1) % n.max(1)) as usize)
                .copied()
                .unwrap_or(0),
        )
    }

    /// The rank before `rank` on the ring.
    pub fn prev(&self, rank: Rank) -> Rank {
        let n = self.order.len() as u32;
        let i = self.index.get(rank.0 as usize).copied().unwrap_or(0);
        Rank(
            self.order
                .get(((i + n.max(1) - 1) % n.max(1)) as usize)
                .copied()
                .unwrap_or(0),
        )
    }

    /// The ranks in ring order.
    pub fn ranks_in_order(&self) -> &[u32] {
        &self.order
    }
}

impl RingOrder for RingOrderOf {
    fn ranks(&self) -> u32 {
        self.order.len() as u32
    }

    fn rank_at(&self, index: RingIndex) -> Result<Rank, CoreError> {
        self.order
            .get(index.0 as usize)
            .map(|&r| Rank(r))
            .ok_or(CoreError::RankOutOfRange {
                rank: index.0,
                ranks: self.ranks(),
            })
    }

    fn index_of(&self, rank: Rank) -> Result<RingIndex, CoreError> {
        self.index
            .get(rank.0 as usize)
            .map(|&i| RingIndex(i))
            .ok_or(CoreError::RankOutOfRange {
                rank: rank.0,
                ranks: self.ranks(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_stay_together_in_order_of_their_lowest_rank() {
        let r = RingOrderOf::by_node(&["a", "b", "a", "b", "c"]);
        assert_eq!(r.ranks_in_order(), &[0, 2, 1, 3, 4]);
        assert_eq!(r.next(Rank(2)), Rank(1));
        assert_eq!(r.prev(Rank(0)), Rank(4));
        assert_eq!(r.index_of(Rank(3)).unwrap(), RingIndex(3));
        assert_eq!(r.rank_at(RingIndex(1)).unwrap(), Rank(2));
        assert!(r.rank_at(RingIndex(5)).is_err());
    }

    #[test]
    fn one_node_is_rank_order() {
        let r = RingOrderOf::by_node(&["x"; 4]);
        assert_eq!(r.ranks_in_order(), &[0, 1, 2, 3]);
        assert_eq!(r.next(Rank(3)), Rank(0));
    }
}
