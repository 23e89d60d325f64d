//! Seeded, reproducible faults, applied as a wrapper around the links.
//!
//! Packet faults (loss, duplication, reordering) act on the NIC links and
//! need the packet-level model (payload mode); delay jitter applies to NIC
//! packets or, in timing-only mode, to whole messages (which stay in order,
//! as a reliable connection delivers them). Failures switch a component off
//! at a virtual time: a rank (its GPU stops, its queue pairs stop
//! answering), a NIC (nothing leaves or enters it), an NVLink (nothing
//! crosses it). A corrupted remote key makes one connection's sender use a
//! wrong key (or a wrong address), so its first RDMA WRITE fails the
//! responder's key (or bounds) check.

use crate::config::ClusterConfig;
use crate::error::Error;
use crate::events::{ps, Ps};

/// A component that fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Component {
    /// A rank: its GPU stops, and its queue pairs no longer answer (the
    /// process is gone).
    Rank(u32),
    /// A NIC port of a node (or its cable): nothing leaves or enters it.
    Nic {
        /// The node.
        node: u32,
        /// The NIC within the node.
        nic: u16,
    },
    /// The NVLink path from one GPU to another of the same node.
    NvLink {
        /// Sending rank.
        from: u32,
        /// Receiving rank.
        to: u32,
    },
}

/// A component failing at a virtual time (seconds since the cluster was
/// built).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Failure {
    /// What fails.
    pub what: Component,
    /// When, in virtual seconds.
    pub at: f64,
}

/// One connection: channel `channel`'s hop from `rank` to its successor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnId {
    /// The channel.
    pub channel: u32,
    /// The sending rank.
    pub rank: u32,
}

/// The faults of a cluster. The default injects nothing.
#[derive(Clone, Debug, PartialEq)]
pub struct Faults {
    /// Seed of the fault generator (loss, duplication, reordering,
    /// jitter): the same seed gives the same faults. `None` (the default)
    /// derives it from the cluster's [`seed`](ClusterConfig::seed), so that
    /// one seed varies the whole run; `Some` pins the faults while the
    /// cluster seed changes, or the other way round.
    pub seed: Option<u64>,
    /// Probability that a NIC packet is lost.
    pub loss: f64,
    /// Probability that a NIC packet is delivered twice.
    pub duplicate: f64,
    /// Probability that a NIC packet is held back by `reorder_delay`, so
    /// that later packets overtake it.
    pub reorder: f64,
    /// How long a reordered packet is held back, seconds.
    pub reorder_delay: f64,
    /// Extra delay, uniform in `[0, jitter]` seconds, of every NIC packet
    /// (every NIC message in timing-only mode).
    pub jitter: f64,
    /// Components that fail, and when.
    pub failures: Vec<Failure>,
    /// A connection whose sender presents a corrupted remote key.
    pub bad_rkey: Option<ConnId>,
    /// A connection whose sender was told a wrong FIFO address (one FIFO
    /// too far): its writes fall outside the registered region.
    pub bad_raddr: Option<ConnId>,
}

impl Default for Faults {
    fn default() -> Self {
        Faults {
            seed: None,
            loss: 0.0,
            duplicate: 0.0,
            reorder: 0.0,
            reorder_delay: 20e-6,
            jitter: 0.0,
            failures: Vec::new(),
            bad_rkey: None,
            bad_raddr: None,
        }
    }
}

impl Faults {
    /// Whether any packet-level fault is set.
    pub fn packet_faults(&self) -> bool {
        self.loss > 0.0
            || self.duplicate > 0.0
            || self.reorder > 0.0
            || self.bad_rkey.is_some()
            || self.bad_raddr.is_some()
    }

    pub(crate) fn validate(&self, cfg: &ClusterConfig) -> Result<(), Error> {
        let bad = |what: String| Error::BadConfig { what };
        for (name, p) in [
            ("loss", self.loss),
            ("duplicate", self.duplicate),
            ("reorder", self.reorder),
        ] {
            if !(0.0..=0.5).contains(&p) {
                return Err(bad(format!("{name} probability {p} must be in 0..=0.5")));
            }
        }
        for (name, s) in [
            ("reorder delay", self.reorder_delay),
            ("jitter", self.jitter),
        ] {
            if !(s.is_finite() && s >= 0.0) {
                return Err(bad(format!("{name} must be non-negative and finite")));
            }
        }
        if self.packet_faults() && !cfg.payload {
            return Err(bad(
                "loss, duplication, reordering and key corruption need payload mode \
                 (packets are simulated only there)"
                    .into(),
            ));
        }
        let ranks = cfg.ranks();
        for f in &self.failures {
            if !(f.at.is_finite() && f.at >= 0.0) {
                return Err(bad(format!("failure time {} must be non-negative", f.at)));
            }
            let ok = match f.what {
                Component::Rank(r) => u64::from(r) < ranks,
                Component::Nic { node, nic } => node < cfg.nodes && nic < cfg.nics_per_node,
                Component::NvLink { from, to } => {
                    u64::from(from) < ranks
                        && u64::from(to) < ranks
                        && from / cfg.gpus_per_node == to / cfg.gpus_per_node
                        && from != to
                }
            };
            if !ok {
                return Err(bad(format!("no such component: {:?}", f.what)));
            }
        }
        for c in self.bad_rkey.iter().chain(&self.bad_raddr) {
            if c.channel >= cfg.channels || u64::from(c.rank) >= ranks {
                return Err(bad(format!("no such connection: {c:?}")));
            }
        }
        Ok(())
    }
}

/// The core's seeded generator.
pub(crate) use ringcc_core::rng::Rng;

/// What the fault wrapper does with one packet (or message).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fate {
    /// Never arrives.
    Lost,
    /// Arrives at the first time, and again at the second when duplicated.
    Arrives(Ps, Option<Ps>),
}

/// The faults in effect, in simulator units.
#[derive(Clone, Debug)]
pub(crate) struct FaultState {
    pub rng: Rng,
    pub loss: f64,
    pub duplicate: f64,
    pub reorder: f64,
    pub reorder_delay: Ps,
    pub jitter: Ps,
    /// Per rank: when it dies.
    pub rank_dies: Vec<Option<Ps>>,
    /// (node, nic) → when it dies.
    pub nic_dies: Vec<((u32, u16), Ps)>,
    /// (from, to) → when it dies.
    pub nvlink_dies: Vec<((u32, u32), Ps)>,
    pub bad_rkey: Option<ConnId>,
    pub bad_raddr: Option<ConnId>,
}

impl FaultState {
    /// The faults `f` of a cluster of `ranks` ranks whose seed is
    /// `cluster_seed` (used when `f.seed` is `None`).
    pub fn new(f: &Faults, cluster_seed: u64, ranks: u32) -> FaultState {
        let mut rank_dies = vec![None; ranks as usize];
        let mut nic_dies = Vec::new();
        let mut nvlink_dies = Vec::new();
        for x in &f.failures {
            let at = ps(x.at);
            match x.what {
                Component::Rank(r) => {
                    if let Some(slot) = rank_dies.get_mut(r as usize) {
                        let t: &mut Option<Ps> = slot;
                        *t = Some(t.map_or(at, |old| old.min(at)));
                    }
                }
                Component::Nic { node, nic } => nic_dies.push(((node, nic), at)),
                Component::NvLink { from, to } => nvlink_dies.push(((from, to), at)),
            }
        }
        FaultState {
            rng: Rng::new(f.seed.unwrap_or(cluster_seed) ^ 0xfa17_5eed_0000_0001),
            loss: f.loss,
            duplicate: f.duplicate,
            reorder: f.reorder,
            reorder_delay: ps(f.reorder_delay),
            jitter: ps(f.jitter),
            rank_dies,
            nic_dies,
            nvlink_dies,
            bad_rkey: f.bad_rkey,
            bad_raddr: f.bad_raddr,
        }
    }

    pub fn rank_dead(&self, rank: u32, now: Ps) -> bool {
        matches!(self.rank_dies.get(rank as usize), Some(Some(t)) if *t <= now)
    }

    pub fn nic_dead(&self, node: u32, nic: u16, now: Ps) -> bool {
        self.nic_dies
            .iter()
            .any(|&(k, t)| k == (node, nic) && t <= now)
    }

    pub fn nvlink_dead(&self, from: u32, to: u32, now: Ps) -> bool {
        self.nvlink_dies
            .iter()
            .any(|&(k, t)| k == (from, to) && t <= now)
    }

    /// Extra delay of one NIC message or packet: jitter, and for packets
    /// the reorder hold-back.
    pub fn jitter(&mut self) -> Ps {
        if self.jitter == 0 {
            return 0;
        }
        (self.rng.unit() * self.jitter as f64) as Ps
    }

    /// The fate of one packet that finishes leaving its port at `sent` and
    /// would arrive `latency` later.
    pub fn packet(&mut self, sent: Ps, latency: Ps) -> Fate {
        if self.rng.chance(self.loss) {
            return Fate::Lost;
        }
        let mut at = sent.saturating_add(latency).saturating_add(self.jitter());
        if self.rng.chance(self.reorder) {
            at = at.saturating_add(self.reorder_delay);
        }
        let dup = if self.rng.chance(self.duplicate) {
            Some(at.saturating_add(1 + self.jitter()))
        } else {
            None
        };
        Fate::Arrives(at, dup)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rng_is_uniform_enough_and_seeded() {
        let mut a = Rng::new(7);
        let mut b = Rng::new(7);
        let n = 100_000;
        let hits = (0..n).filter(|_| a.chance(0.1)).count();
        assert!((9_000..11_000).contains(&hits), "{hits}");
        let mut a2 = Rng::new(7);
        for _ in 0..10 {
            assert_eq!(a2.next_u64(), b.next_u64());
        }
        assert!(!Rng::new(1).chance(0.0));
    }

    #[test]
    fn failures_apply_from_their_time() {
        let f = Faults {
            failures: vec![
                Failure {
                    what: Component::Rank(1),
                    at: 1e-3,
                },
                Failure {
                    what: Component::Nic { node: 0, nic: 1 },
                    at: 0.0,
                },
            ],
            ..Default::default()
        };
        let s = FaultState::new(&f, 0, 4);
        assert!(!s.rank_dead(1, ps(0.5e-3)));
        assert!(s.rank_dead(1, ps(1e-3)));
        assert!(!s.rank_dead(0, ps(1.0)));
        assert!(s.nic_dead(0, 1, 0));
        assert!(!s.nic_dead(0, 0, 0));
    }
}
