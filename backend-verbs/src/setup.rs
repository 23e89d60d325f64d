//! Building a communicator: store, devices, topology, queue pairs.
//!
//! Three all-gather rounds through the job's store (rank 0's TCP store):
//! in round `n` every rank sets `gather/n/<rank>` and reads every rank's
//! key, looking for the job's abort notice while it waits.
//!
//! 0. every rank's node name and the settings that must agree → the
//!    topology (rings, channel → NIC);
//! 1. every rank's channel ends (QP number, GID, PSN, MTU; FIFO, mailbox
//!    and credit counter addresses and keys) → queue pairs to RTR/RTS;
//! 2. a barrier: every rank has posted its receives and is ready to send.

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ringcc_comm::launch::fnv1a;
use ringcc_comm::store::abort::parse_notice;
use ringcc_comm::store::{Store, ABORT_KEY};
use ringcc_core::topology::{HopKind, Topology};
use ringcc_core::{ChannelId, Rank};
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use serde_json::Value;
use tracing::info;

use crate::config::{Agreement, Config};
use crate::conn::{ChannelEnds, RecvHalf, SendHalf};
use crate::error::{Error, Result};
use crate::ib::cq::EventCqs;
use crate::ib::nic::{device_names, Nic};
use crate::ib::qp::{RetryParams, RQ_DEPTH, SQ_DEPTH};
use crate::transport::{Chan, OwnedRing, Transport};

/// The largest job: the core's capacity for std crates.
pub use ringcc_core::MAX_RANKS;

#[derive(Serialize, Deserialize)]
struct Hello {
    node: String,
    agreement: Agreement,
}

/// What setup leaves behind.
pub(crate) struct Built {
    pub transport: Transport,
}

/// How often a setup wait looks for the job's abort notice.
const ABORT_POLL: Duration = Duration::from_millis(100);

/// Round `round` of the all-gather: publishes `mine` as this rank's and
/// returns every rank's (index = rank), waiting up to `timeout` for them
/// all.
fn all_gather<T: Serialize, U: DeserializeOwned>(
    store: &dyn Store,
    round: u32,
    me: Rank,
    world: u32,
    mine: &T,
    what: &str,
    timeout: Duration,
) -> Result<Vec<U>> {
    let bytes = serde_json::to_vec(mine).map_err(|e| Error::RendezvousProtocol(e.to_string()))?;
    store.set(&format!("gather/{round}/{}", me.0), &bytes)?;
    let deadline = Instant::now() + timeout;
    (0..world)
        .map(|r| {
            let key = format!("gather/{round}/{r}");
            let v = wait_key(store, &key, deadline).map_err(|e| match e {
                Error::Timeout { .. } => Error::Timeout {
                    waiting_for: format!(
                        "rank {r}'s {what} (setup round {round}, store key {key:?})"
                    ),
                    after: timeout,
                },
                other => other,
            })?;
            serde_json::from_slice(&v)
                .map_err(|e| Error::RendezvousProtocol(format!("rank {r}'s {what}: {e}")))
        })
        .collect()
}

/// The value of `key`, waiting until `deadline` in slices of
/// [`ABORT_POLL`] and failing with the job's abort notice when one
/// appears meanwhile.
fn wait_key(store: &dyn Store, key: &str, deadline: Instant) -> Result<Vec<u8>> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match store.get(key, left.min(ABORT_POLL)) {
            Ok(v) => return Ok(v),
            Err(ringcc_comm::Error::Timeout { waiting_for, after }) if left.is_zero() => {
                return Err(Error::Timeout { waiting_for, after })
            }
            Err(ringcc_comm::Error::Timeout { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        if store.check(ABORT_KEY)? {
            return Err(parse_notice(&store.get(ABORT_KEY, ABORT_POLL)?).into());
        }
    }
}

/// This host's name.
pub(crate) fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: `buf` is writable for its length; gethostname NUL-terminates
    // when the name fits.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "localhost".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

fn psn(rank: Rank, channel: ChannelId, dir: u8) -> u32 {
    let (rank, channel) = (rank.0, channel.0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mut b = Vec::with_capacity(16);
    b.extend_from_slice(&rank.to_le_bytes());
    b.extend_from_slice(&[channel, dir]);
    b.extend_from_slice(&nanos.to_le_bytes());
    (fnv1a(&b) as u32) & 0x00ff_ffff
}

/// The device index (into `names`) of NIC `nic` of the topology.
fn device_of(nic: u16, names: &[String]) -> usize {
    usize::from(nic) % names.len().max(1)
}

pub(crate) fn build(store: &dyn Store, me: Rank, world: u32, config: &Config) -> Result<Built> {
    let geometry = config.geometry()?;
    let t = config.connect_timeout;
    // Devices are only needed when there is someone to talk to.
    let names: Vec<String> = if world > 1 {
        let n = if config.devices.is_empty() {
            device_names()?
        } else {
            config.devices.clone()
        };
        if n.is_empty() {
            return Err(Error::NoDevice {
                wanted: "any".into(),
                reason: "no RDMA device found".into(),
            });
        }
        n
    } else {
        Vec::new()
    };

    // Round 0: placement and agreement.
    let agreement = config.agreement(names.len());
    let hello = Hello {
        node: config.node.clone().unwrap_or_else(hostname),
        agreement: agreement.clone(),
    };
    let hellos: Vec<Hello> = all_gather(store, 0, me, world, &hello, "settings", t)?;
    if hellos.len() != world as usize {
        return Err(Error::RendezvousProtocol(format!(
            "{} ranks answered, expected {world}",
            hellos.len()
        )));
    }
    for (r, h) in hellos.iter().enumerate() {
        if h.agreement != hellos[0].agreement {
            return Err(Error::BadConfig(format!(
                "rank {r} is configured differently from rank 0: {:?} vs {:?}",
                h.agreement, hellos[0].agreement
            )));
        }
    }
    let mut labels: BTreeMap<&str, u32> = BTreeMap::new();
    let placement: Vec<u32> = hellos
        .iter()
        .map(|h| {
            let next = labels.len() as u32;
            *labels.entry(h.node.as_str()).or_insert(next)
        })
        .collect();
    let nics = u16::try_from(names.len()).unwrap_or(u16::MAX).max(1);
    let topo = Box::new(
        Topology::<MAX_RANKS>::from_placement(&placement, nics)
            .map_err(Error::core("Topology::from_placement"))?
            .with_cross_nic(config.cross_nic),
    );

    // Which device each channel's two ends use, and each channel's ring.
    let channels = config.channels;
    let mut plan = Vec::new(); // (channel, next, prev, send device, recv device)
    let mut rings = Vec::new();
    for c in 0..channels {
        let id = ChannelId(c as u8);
        let ring = topo.ring(id).map_err(Error::core("Topology::ring"))?;
        rings.push(OwnedRing::new(ring.iter().collect()));
        let next = ring.next(me).map_err(Error::core("Ring::next"))?;
        let prev = ring.prev(me).map_err(Error::core("Ring::prev"))?;
        let default_nic = topo.nic_of_channel(id).map_or(0, |n| n.0);
        let send_nic = match ring.hop(me).map_err(Error::core("Ring::hop"))? {
            HopKind::Inter { send_nic, .. } => send_nic.0,
            HopKind::Intra | HopKind::Loopback => default_nic,
        };
        let recv_nic = match ring.hop(prev).map_err(Error::core("Ring::hop"))? {
            HopKind::Inter { recv_nic, .. } => recv_nic.0,
            HopKind::Intra | HopKind::Loopback => default_nic,
        };
        plan.push((
            id,
            next,
            prev,
            device_of(send_nic, &names),
            device_of(recv_nic, &names),
        ));
    }

    // Open each device used once; CQs sized for its queue pairs.
    let mut opened: Vec<Nic> = Vec::new();
    let mut cqs: Vec<EventCqs> = Vec::new();
    let mut index_of_device: BTreeMap<usize, usize> = BTreeMap::new();
    if world > 1 {
        let mut qps: BTreeMap<usize, u32> = BTreeMap::new();
        for &(_, _, _, s, r) in &plan {
            *qps.entry(s).or_default() += 1;
            *qps.entry(r).or_default() += 1;
        }
        for (dev, n) in qps {
            let nic = Nic::open(&names[dev], config.port, config.gid_index)?;
            cqs.push(EventCqs::new(
                &nic,
                n.saturating_mul(SQ_DEPTH),
                n.saturating_mul(RQ_DEPTH),
            )?);
            index_of_device.insert(dev, opened.len());
            opened.push(nic);
        }
    }

    // Round 1: channel ends.
    let mut halves = Vec::new();
    let mut ends = Vec::new();
    for &(c, next, prev, s, r) in &plan {
        if world == 1 {
            halves.push(None);
            ends.push(ChannelEnds::default());
            continue;
        }
        let (si, ri) = (index_of_device[&s], index_of_device[&r]);
        let send = SendHalf::new(c, next, si, &opened[si], &cqs[si], &geometry, psn(me, c, 0))?;
        let recv = RecvHalf::new(c, prev, &opened[ri], &cqs[ri], &geometry, psn(me, c, 1))?;
        ends.push(ChannelEnds {
            send: Some(send.end()),
            recv: Some(recv.end(config.fault)),
        });
        halves.push(Some((send, recv)));
    }
    let all: Vec<Vec<ChannelEnds>> = all_gather(store, 1, me, world, &ends, "channel ends", t)?;
    let retry = RetryParams {
        timeout: config.ib_timeout,
        retry_cnt: config.retry_cnt,
        rnr_retry: config.rnr_retry,
    };
    let mut chans = Vec::new();
    for (&(c, next, prev, _, _), half) in plan.iter().zip(halves) {
        let Some((send, recv)) = half else {
            chans.push(Chan::new(c, None, None));
            continue;
        };
        let peer_end = |r: Rank| {
            all.get(r.0 as usize)
                .and_then(|e| e.get(usize::from(c.0)))
                .ok_or_else(|| {
                    Error::RendezvousProtocol(format!("rank {r} sent no ends for channel {c}"))
                })
        };
        let theirs_recv = peer_end(next)?.recv.clone().ok_or_else(|| {
            Error::RendezvousProtocol(format!("rank {next} has no receive end on channel {c}"))
        })?;
        let theirs_send = peer_end(prev)?.send.clone().ok_or_else(|| {
            Error::RendezvousProtocol(format!("rank {prev} has no send end on channel {c}"))
        })?;
        let s_nic = &opened[index_of_device[&plan[usize::from(c.0)].3]];
        let r_nic = &opened[index_of_device[&plan[usize::from(c.0)].4]];
        let recv = recv.connect(&theirs_send, r_nic, retry)?;
        let send = send.connect(&theirs_recv, s_nic, retry)?;
        info!(
            channel = c.0,
            next = next.0,
            prev = prev.0,
            send_device = %s_nic.name,
            recv_device = %r_nic.name,
            "verbs: channel connected"
        );
        chans.push(Chan::new(c, Some(send), Some(recv)));
    }

    // Round 2: everyone is ready to receive.
    all_gather::<_, Value>(store, 2, me, world, &Value::Null, "readiness", t)?;
    Ok(Built {
        transport: Transport::new(
            me,
            opened,
            cqs,
            chans,
            rings,
            geometry,
            config.timeout,
            config.spin,
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringcc_comm::store::abort::notice;
    use ringcc_comm::store::MemStore;
    use std::sync::Arc;

    const T: Duration = Duration::from_secs(10);

    #[test]
    fn all_gather_returns_every_ranks_contribution_by_rank() {
        let store = Arc::new(MemStore::new());
        let handles: Vec<_> = (0..3u32)
            .map(|r| {
                let store = Arc::clone(&store);
                std::thread::spawn(move || {
                    let a: Vec<u32> =
                        all_gather(&*store, 0, Rank(r), 3, &(r * 10), "n", T).unwrap();
                    let b: Vec<String> =
                        all_gather(&*store, 1, Rank(r), 3, &format!("r{r}"), "s", T).unwrap();
                    (a, b)
                })
            })
            .collect();
        for h in handles {
            let (a, b) = h.join().unwrap();
            assert_eq!(a, vec![0, 10, 20]);
            assert_eq!(b, vec!["r0", "r1", "r2"]);
        }
    }

    #[test]
    fn a_missing_rank_times_out_naming_it_and_an_abort_ends_the_wait() {
        let store = Arc::new(MemStore::new());
        let t0 = Instant::now();
        let r: Result<Vec<u32>> = all_gather(
            &*store,
            0,
            Rank(0),
            2,
            &1u32,
            "settings",
            Duration::from_millis(150),
        );
        match r {
            Err(Error::Timeout { waiting_for, .. }) => {
                assert!(waiting_for.contains("rank 1's settings"), "{waiting_for}")
            }
            other => panic!("expected a timeout, got {other:?}"),
        }
        assert!(t0.elapsed() < Duration::from_secs(3));

        let aborter = {
            let store = Arc::clone(&store);
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(50));
                store
                    .set(
                        ABORT_KEY,
                        &notice(Some(Rank(1)), "rank 1 failed during setup"),
                    )
                    .unwrap();
            })
        };
        let t0 = Instant::now();
        let r: Result<Vec<u32>> = all_gather(&*store, 1, Rank(0), 2, &1u32, "ends", T);
        assert!(
            matches!(
                &r,
                Err(Error::Aborted {
                    rank: Some(Rank(1)),
                    ..
                })
            ),
            "{r:?}"
        );
        assert!(t0.elapsed() < Duration::from_secs(3));
        aborter.join().unwrap();
    }
}
