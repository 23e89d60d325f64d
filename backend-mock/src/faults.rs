//! Seeded, reproducible faults, each a wrapper around the component that
//! fails: [`NicFaults`] (a NIC port, and what its packets suffer),
//! [`NvlinkFaults`], [`RankFaults`], and one connection's corrupted key or
//! address. Every fault rule is here; the transports ask a wrapper one
//! question where the component acts (a port transmits or receives, a
//! store crosses an NVLink, a rank's queue pair answers).
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

use ringcc_core::{ChannelId, NicId, NodeId, Rank};

use crate::config::ClusterConfig;
use crate::error::Error;
use crate::events::{ps, Ps};
use crate::fabric::{Fabric, Hop};

/// A component that fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Component {
    /// A rank: its GPU stops, and its queue pairs no longer answer (the
    /// process is gone).
    Rank(Rank),
    /// A NIC port of a node (or its cable): nothing leaves or enters it.
    Nic {
        /// The node.
        node: NodeId,
        /// The NIC within the node.
        nic: NicId,
    },
    /// The NVLink path from one GPU to another of the same node.
    NvLink {
        /// Sending rank.
        from: Rank,
        /// Receiving rank.
        to: Rank,
    },
}

impl Component {
    /// The component as configuration errors name it (the raw numbers, as
    /// they were named before the fields became newtypes).
    fn describe(&self) -> String {
        match *self {
            Component::Rank(r) => format!("Rank({r})"),
            Component::Nic { node, nic } => format!("Nic {{ node: {node}, nic: {nic} }}"),
            Component::NvLink { from, to } => format!("NvLink {{ from: {from}, to: {to} }}"),
        }
    }
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
    pub channel: ChannelId,
    /// The sending rank.
    pub rank: Rank,
}

impl ConnId {
    /// The connection as configuration errors name it (the raw numbers).
    fn describe(&self) -> String {
        format!(
            "ConnId {{ channel: {}, rank: {} }}",
            self.channel, self.rank
        )
    }
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
                Component::Rank(r) => u64::from(r.get()) < ranks,
                Component::Nic { node, nic } => {
                    node.get() < cfg.nodes && nic.get() < cfg.nics_per_node
                }
                Component::NvLink { from, to } => {
                    let (from, to) = (from.get(), to.get());
                    u64::from(from) < ranks
                        && u64::from(to) < ranks
                        && from / cfg.gpus_per_node == to / cfg.gpus_per_node
                        && from != to
                }
            };
            if !ok {
                return Err(bad(format!("no such component: {}", f.what.describe())));
            }
        }
        for c in self.bad_rkey.iter().chain(&self.bad_raddr) {
            if u32::from(c.channel.get()) >= cfg.channels || u64::from(c.rank.get()) >= ranks {
                return Err(bad(format!("no such connection: {}", c.describe())));
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

/// The faults in effect, in simulator units: one wrapper per kind of
/// component that can fail. The transports ask these, and nothing else,
/// whether what they move gets through.
#[derive(Clone, Debug)]
pub(crate) struct FaultState {
    /// The NIC ports: their failures and what their packets suffer.
    pub nics: NicFaults,
    /// The NVLinks' failures.
    pub nvlinks: NvlinkFaults,
    /// The ranks' deaths.
    pub ranks: RankFaults,
    /// The connection whose sender uses a corrupted key or address.
    keys: KeyFaults,
}

/// What happens on the NIC ports: a port that fails stops sending and
/// receiving; every packet may be lost, duplicated, held back or delayed.
#[derive(Clone, Debug)]
pub(crate) struct NicFaults {
    rng: Rng,
    loss: f64,
    duplicate: f64,
    reorder: f64,
    reorder_delay: Ps,
    jitter: Ps,
    /// Per port (the fabric's numbering): when it fails.
    dies: Vec<Option<Ps>>,
}

/// The NVLinks that fail: (from, to) → when.
#[derive(Clone, Debug, Default)]
pub(crate) struct NvlinkFaults {
    dies: Vec<((u32, u32), Ps)>,
}

/// Per rank: when it dies.
#[derive(Clone, Debug, Default)]
pub(crate) struct RankFaults {
    dies: Vec<Option<Ps>>,
}

/// The connections whose sender was given a wrong key or address.
#[derive(Clone, Copy, Debug, Default)]
struct KeyFaults {
    bad_rkey: Option<ConnId>,
    bad_raddr: Option<ConnId>,
}

/// The earlier of a slot's failure time and `at`.
fn earliest(slot: &mut Option<Ps>, at: Ps) {
    *slot = Some(slot.map_or(at, |old| old.min(at)));
}

impl FaultState {
    /// The faults `f` on `fab` in a cluster whose seed is `cluster_seed`
    /// (used when `f.seed` is `None`). A corrupted key or address must
    /// name an RDMA hop.
    pub fn new(f: &Faults, cluster_seed: u64, fab: &Fabric) -> Result<FaultState, Error> {
        for c in f.bad_rkey.iter().chain(&f.bad_raddr) {
            let l = fab.lane(u32::from(c.channel.get()), c.rank.get());
            if !matches!(
                fab.lanes.get(l as usize).map(|t| t.hop),
                Some(Hop::Net { .. })
            ) {
                return Err(Error::BadConfig {
                    what: format!(
                        "channel {} of rank {} is not an RDMA hop: there is no key or address to corrupt",
                        c.channel, c.rank
                    ),
                });
            }
        }
        let mut ranks = vec![None; fab.ranks as usize];
        let mut ports = vec![None; fab.ports.len()];
        let mut nvlinks = Vec::new();
        for x in &f.failures {
            let at = ps(x.at);
            match x.what {
                Component::Rank(r) => {
                    if let Some(slot) = ranks.get_mut(r.get() as usize) {
                        earliest(slot, at);
                    }
                }
                Component::Nic { node, nic } => {
                    let port = fab
                        .ports
                        .iter()
                        .position(|p| (p.node, p.nic) == (node.get(), nic.get()));
                    if let Some(slot) = port.and_then(|p| ports.get_mut(p)) {
                        earliest(slot, at);
                    }
                }
                Component::NvLink { from, to } => nvlinks.push(((from.get(), to.get()), at)),
            }
        }
        Ok(FaultState {
            nics: NicFaults {
                rng: Rng::new(f.seed.unwrap_or(cluster_seed) ^ 0xfa17_5eed_0000_0001),
                loss: f.loss,
                duplicate: f.duplicate,
                reorder: f.reorder,
                reorder_delay: ps(f.reorder_delay),
                jitter: ps(f.jitter),
                dies: ports,
            },
            nvlinks: NvlinkFaults { dies: nvlinks },
            ranks: RankFaults { dies: ranks },
            keys: KeyFaults {
                bad_rkey: f.bad_rkey,
                bad_raddr: f.bad_raddr,
            },
        })
    }

    /// Whether a timing-only message from port `from` to port `to` (rank
    /// `dst`), leaving at `sent` and arriving at `arrive`, is lost to a
    /// failure: of either port, or of the rank that should answer.
    pub fn message_lost(&self, from: u32, to: u32, dst: u32, sent: Ps, arrive: Ps) -> bool {
        !self.nics.up(from, sent) || !self.nics.up(to, arrive) || !self.ranks.alive(dst, arrive)
    }

    /// The remote key and FIFO address connection `conn`'s sender
    /// presents, given the true ones (`fifo_bytes` apart from the next
    /// region).
    pub fn remote(&self, conn: ConnId, rkey: u32, addr: u64, fifo_bytes: u64) -> (u32, u64) {
        let rkey = if self.keys.bad_rkey == Some(conn) {
            rkey ^ 0x0001_0000
        } else {
            rkey
        };
        let addr = if self.keys.bad_raddr == Some(conn) {
            addr + fifo_bytes
        } else {
            addr
        };
        (rkey, addr)
    }
}

impl RankFaults {
    /// Whether `rank` still runs at `now`.
    #[inline]
    pub fn alive(&self, rank: u32, now: Ps) -> bool {
        !matches!(self.dies.get(rank as usize), Some(Some(t)) if *t <= now)
    }

    /// (rank, time) of every death.
    pub fn deaths(&self) -> impl Iterator<Item = (u32, Ps)> + '_ {
        self.dies
            .iter()
            .enumerate()
            .filter_map(|(r, t)| t.map(|t| (r as u32, t)))
    }
}

impl NvlinkFaults {
    /// Whether a store over the NVLink from `from` to `to` that starts at
    /// `at` gets through.
    #[inline]
    pub fn delivers(&self, from: u32, to: u32, at: Ps) -> bool {
        !self.dies.iter().any(|&(k, t)| k == (from, to) && t <= at)
    }
}

impl NicFaults {
    /// Whether NIC port `port` works at `now`.
    #[inline]
    pub fn up(&self, port: u32, now: Ps) -> bool {
        !matches!(self.dies.get(port as usize), Some(Some(t)) if *t <= now)
    }

    /// Extra delay of one NIC message or packet: jitter, and for packets
    /// the reorder hold-back.
    pub fn jitter(&mut self) -> Ps {
        if self.jitter == 0 {
            return 0;
        }
        (self.rng.unit() * self.jitter as f64) as Ps
    }

    /// The fate of one packet that starts leaving port `port` at `start`,
    /// has left at `end` and would arrive `latency` later: lost when the
    /// port has failed, else what the packet faults make of it.
    pub fn transmit(&mut self, port: u32, start: Ps, end: Ps, latency: Ps) -> Fate {
        if !self.up(port, start) || self.rng.chance(self.loss) {
            return Fate::Lost;
        }
        let mut at = end.saturating_add(latency).saturating_add(self.jitter());
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

    /// Configuration errors name components and connections by their raw
    /// numbers, as they did before the fields became newtypes.
    #[test]
    fn bad_components_are_named_by_number() {
        let cfg = ClusterConfig {
            nodes: 2,
            gpus_per_node: 2,
            nics_per_node: 2,
            channels: 2,
            payload: true,
            ..Default::default()
        };
        let fails = |what| Faults {
            failures: vec![Failure { what, at: 0.0 }],
            ..Default::default()
        };
        let msg = |f: Faults| match f.validate(&cfg) {
            Err(Error::BadConfig { what }) => what,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            msg(fails(Component::Rank(Rank(4)))),
            "no such component: Rank(4)"
        );
        assert_eq!(
            msg(fails(Component::Nic {
                node: NodeId(0),
                nic: NicId(2),
            })),
            "no such component: Nic { node: 0, nic: 2 }"
        );
        assert_eq!(
            msg(fails(Component::NvLink {
                from: Rank(1),
                to: Rank(2),
            })),
            "no such component: NvLink { from: 1, to: 2 }"
        );
        let bad = Faults {
            bad_rkey: Some(ConnId {
                channel: ChannelId(2),
                rank: Rank(0),
            }),
            ..Default::default()
        };
        assert_eq!(
            msg(bad),
            "no such connection: ConnId { channel: 2, rank: 0 }"
        );
    }

    #[test]
    fn failures_apply_from_their_time() {
        let f = Faults {
            failures: vec![
                Failure {
                    what: Component::Rank(Rank(1)),
                    at: 1e-3,
                },
                Failure {
                    what: Component::Nic {
                        node: NodeId(0),
                        nic: NicId(1),
                    },
                    at: 0.0,
                },
            ],
            ..Default::default()
        };
        let cfg = ClusterConfig {
            nodes: 2,
            gpus_per_node: 2,
            nics_per_node: 2,
            ..Default::default()
        };
        let fab = Fabric::build(&cfg).unwrap();
        let s = FaultState::new(&f, 0, &fab).unwrap();
        assert!(s.ranks.alive(1, ps(0.5e-3)));
        assert!(!s.ranks.alive(1, ps(1e-3)));
        assert!(s.ranks.alive(0, ps(1.0)));
        assert_eq!(s.ranks.deaths().collect::<Vec<_>>(), [(1, ps(1e-3))]);
        let port = fab
            .ports
            .iter()
            .position(|p| (p.node, p.nic) == (0, 1))
            .unwrap() as u32;
        assert!(!s.nics.up(port, 0));
        assert!((0..fab.ports.len() as u32)
            .filter(|&p| p != port)
            .all(|p| s.nics.up(p, ps(1.0))));
    }
}
