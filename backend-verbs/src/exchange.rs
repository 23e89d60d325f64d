//! What a hop's two ends tell each other, through the job's store
//! ([`Job::store`]): a queue pair only has an address once it exists,
//! which is after every rank published its [`PeerInfo`]
//! (`ringcc_comm::transport::PeerInfo`), so each hop exchanges its own
//! two records.
//!
//! | phase | who | sets | waits for |
//! |---|---|---|---|
//! | `listen` | receiver | `verbs/{channel}/{sender}-{receiver}/recv`: QP, FIFO and mailbox (address, rkey, capacity) | — |
//! | `connect` | sender | `…/send`: QP, credit counter (address, rkey) | `…/recv` |
//! | `accept` | receiver | — | `…/send` |
//!
//! `connect` waits only for what the peer did in `listen` (which the
//! communicator's barrier between the phases has already seen through),
//! `accept` for what it did in `connect`: no phase waits for a later one.
//! Every wait ends at the job's deadline, or earlier at the job's abort
//! notice (a rank that failed to connect publishes one).

use std::time::{Duration, Instant};

use ringcc_comm::store::abort::parse_notice;
use ringcc_comm::store::{Store, ABORT_KEY};
use ringcc_comm::transport::{Hop, Job};
use ringcc_comm::Error as CommError;
use ringcc_core::protocol::post::{RemoteCounter, RemoteFifo, RemoteHeader};
use ringcc_core::wire::Rkey;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::ib::qp::QpAddr;

type Result<T> = std::result::Result<T, CommError>;

/// How often a wait looks for the job's abort notice.
const ABORT_POLL: Duration = Duration::from_millis(100);

/// Registered memory of one end, as its peer addresses it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RemoteBuf {
    pub addr: u64,
    pub rkey: u32,
    pub capacity: u64,
}

/// The receiving end of a hop, for its sender.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RecvRecord {
    pub qp: QpAddr,
    pub fifo: RemoteBuf,
    pub mailbox: RemoteBuf,
}

/// The sending end of a hop, for its receiver.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SendRecord {
    pub qp: QpAddr,
    pub counter: RemoteBuf,
}

impl RecvRecord {
    pub fn fifo(&self) -> RemoteFifo {
        RemoteFifo {
            addr: self.fifo.addr,
            rkey: Rkey(self.fifo.rkey),
            capacity: self.fifo.capacity,
        }
    }

    pub fn mailbox(&self) -> RemoteHeader {
        RemoteHeader {
            addr: self.mailbox.addr,
            rkey: Rkey(self.mailbox.rkey),
            capacity: self.mailbox.capacity,
        }
    }
}

impl SendRecord {
    pub fn counter(&self) -> RemoteCounter {
        RemoteCounter {
            addr: self.counter.addr,
            rkey: Rkey(self.counter.rkey),
        }
    }
}

/// Which end's record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Side {
    Recv,
    Send,
}

/// The store key of `hop`'s `side` record.
pub(crate) fn key(hop: Hop, side: Side) -> String {
    let side = match side {
        Side::Recv => "recv",
        Side::Send => "send",
    };
    format!(
        "verbs/{}/{}-{}/{side}",
        hop.channel.0, hop.sender.0, hop.receiver.0
    )
}

/// Publishes this end's record of `hop`.
pub(crate) fn put<T: Serialize>(store: &dyn Store, hop: Hop, side: Side, record: &T) -> Result<()> {
    let bytes = serde_json::to_vec(record).map_err(|e| CommError::Internal(e.to_string()))?;
    store.set(&key(hop, side), &bytes)
}

/// The peer's record of `hop`, waiting until the job's deadline (or its
/// abort notice).
pub(crate) fn take<T: DeserializeOwned>(job: &Job<'_>, hop: Hop, side: Side) -> Result<T> {
    let key = key(hop, side);
    let peer = match side {
        Side::Recv => hop.receiver,
        Side::Send => hop.sender,
    };
    let bytes = wait(job.store, &key, job.deadline).map_err(|e| match e {
        CommError::Timeout { after, .. } => CommError::Timeout {
            waiting_for: format!(
                "rank {peer}'s verbs connection of channel {} (store key {key:?})",
                hop.channel
            ),
            after,
        },
        other => other,
    })?;
    serde_json::from_slice(&bytes).map_err(|e| CommError::Protocol {
        transport: "verbs",
        peer,
        channel: hop.channel,
        reason: format!("store key {key:?} holds no {side:?} record: {e}"),
    })
}

/// The value of `key`, waiting until `deadline` in slices of
/// [`ABORT_POLL`], failing with the job's abort notice when one appears
/// meanwhile.
fn wait(store: &dyn Store, key: &str, deadline: Instant) -> Result<Vec<u8>> {
    let t0 = Instant::now();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match store.get(key, left.min(ABORT_POLL)) {
            Ok(v) => return Ok(v),
            Err(CommError::Timeout { waiting_for, .. }) if left <= ABORT_POLL => {
                return Err(CommError::Timeout {
                    waiting_for,
                    after: t0.elapsed(),
                })
            }
            Err(CommError::Timeout { .. }) => {}
            Err(e) => return Err(e),
        }
        if store.check(ABORT_KEY)? {
            return Err(parse_notice(&store.get(ABORT_KEY, ABORT_POLL)?));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use ringcc_comm::store::abort::notice;
    use ringcc_comm::store::MemStore;
    use ringcc_comm::transport::Bell;
    use ringcc_core::fifo::FifoGeometry;
    use ringcc_core::{ChannelId, Rank};

    use super::*;

    #[derive(Debug)]
    struct NoBell;
    impl Bell for NoBell {
        fn arm(&self) -> u32 {
            0
        }
        fn sleep(&self, _: u32, _: Duration) {}
        fn disarm(&self) {}
        fn ring(&self) {}
    }

    fn with_job<R>(store: &dyn Store, within: Duration, f: impl FnOnce(&Job<'_>) -> R) -> R {
        let bell: Arc<dyn Bell> = Arc::new(NoBell);
        let job = Job {
            token: "t",
            rank: Rank(1),
            world: 2,
            geometry: FifoGeometry::NCCL,
            deadline: Instant::now() + within,
            peers: &[],
            bell: &bell,
            store,
        };
        f(&job)
    }

    const HOP: Hop = Hop {
        channel: ChannelId(3),
        sender: Rank(0),
        receiver: Rank(1),
    };

    fn record() -> SendRecord {
        SendRecord {
            qp: QpAddr {
                qpn: 17,
                psn: 99,
                lid: 0,
                gid: [7; 16],
                mtu: 5,
            },
            counter: RemoteBuf {
                addr: 0x1000,
                rkey: 42,
                capacity: 8,
            },
        }
    }

    #[test]
    fn a_record_arrives_under_its_hops_key() {
        let store = MemStore::new();
        assert_eq!(key(HOP, Side::Recv), "verbs/3/0-1/recv");
        put(&store, HOP, Side::Send, &record()).unwrap();
        let got: SendRecord = with_job(&store, Duration::from_secs(5), |j| {
            take(j, HOP, Side::Send).unwrap()
        });
        assert_eq!(got, record());
        assert_eq!(got.counter().rkey, Rkey(42));
    }

    #[test]
    fn a_missing_record_times_out_naming_the_peer_and_an_abort_ends_the_wait_early() {
        let store = Arc::new(MemStore::new());
        let t0 = Instant::now();
        let e = with_job(&*store, Duration::from_millis(250), |j| {
            take::<SendRecord>(j, HOP, Side::Send).unwrap_err()
        });
        match &e {
            CommError::Timeout { waiting_for, .. } => {
                assert!(
                    waiting_for.contains("rank 0's verbs connection of channel 3"),
                    "{e}"
                )
            }
            other => panic!("{other:?}"),
        }
        assert!(t0.elapsed() < Duration::from_secs(3));

        let aborter = {
            let store = Arc::clone(&store);
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(50));
                store
                    .set(
                        ABORT_KEY,
                        &notice(Some(Rank(0)), "rank 0 failed to connect"),
                    )
                    .unwrap();
            })
        };
        let t0 = Instant::now();
        let e = with_job(&*store, Duration::from_secs(30), |j| {
            take::<RecvRecord>(j, HOP, Side::Recv).unwrap_err()
        });
        assert!(
            matches!(
                &e,
                CommError::Aborted {
                    rank: Some(Rank(0)),
                    ..
                }
            ),
            "{e:?}"
        );
        assert!(t0.elapsed() < Duration::from_secs(3));
        aborter.join().unwrap();
    }

    #[test]
    fn garbage_under_the_key_is_a_protocol_error() {
        let store = MemStore::new();
        store.set(&key(HOP, Side::Recv), b"not json").unwrap();
        let e = with_job(&store, Duration::from_secs(1), |j| {
            take::<RecvRecord>(j, HOP, Side::Recv).unwrap_err()
        });
        assert!(
            matches!(e, CommError::Protocol { peer: Rank(1), .. }),
            "{e:?}"
        );
    }
}
