//! Faults: loss, duplication and reordering are recovered with exact
//! results; a dead rank, NIC or NVLink ends every surviving rank's
//! collective with an error within bounded virtual time; a corrupted key
//! surfaces as REM_ACCESS_ERR; mismatched calls fail everywhere.

mod common;

use ringcc_core::wire::WcStatus;
use ringcc_core::{ChannelId, Collective, DataType, NicId, NodeId, Rank, ReduceOp};
use ringcc_mock::{
    Call, Cluster, ClusterConfig, Component, ConnId, Error, Failure, Faults, RankBuffers, RunReport,
};

fn lossy(loss: f64, seed: u64) -> ClusterConfig {
    let mut cfg = common::small(2, 2, 2, 2);
    cfg.faults = Faults {
        seed: Some(seed),
        loss,
        duplicate: loss / 4.0,
        reorder: loss / 4.0,
        jitter: 1e-6,
        ..Faults::default()
    };
    cfg.rnic.timeout = 8; // 1 ms
    cfg
}

#[test]
fn ten_percent_loss_gives_exact_results() {
    let call = Call::new(Collective::AllReduce, 20_000, DataType::F32, ReduceOp::Sum);
    let mut first: Option<Vec<Vec<u8>>> = None;
    for seed in 0..4 {
        let (c, r, outs) = common::run_checked(lossy(0.10, seed), call, false, 5);
        let s = c.stats();
        eprintln!(
            "seed {seed}: {:.3} ms, {} packets, {} lost, {} duplicated, {} retransmitted, {} NAKs, {} timeouts",
            r.duration() * 1e3,
            s.packets,
            s.lost,
            s.duplicated,
            s.retransmissions,
            s.naks,
            s.timeouts
        );
        assert!(s.lost > 0 && s.retransmissions > 0 && s.naks > 0);
        // Different fault seeds, same results.
        match &first {
            None => first = Some(outs),
            Some(f) => assert_eq!(f, &outs),
        }
    }
}

/// Without `faults.seed`, the cluster seed drives the faults; with it, the
/// faults stay put whatever the cluster seed. Timing-only mode with jitter:
/// the cluster seed changes nothing else there (no PSNs, no keys), so the
/// event log moves only if the faults do.
#[test]
fn the_cluster_seed_drives_the_faults_unless_they_are_pinned() {
    let call = Call::new(Collective::AllReduce, 20_000, DataType::F32, ReduceOp::Sum);
    let hash = |seed: u64, fault_seed: Option<u64>| {
        let mut cfg = common::small(2, 2, 2, 2);
        cfg.payload = false;
        cfg.seed = seed;
        cfg.faults = Faults {
            seed: fault_seed,
            jitter: 2e-6,
            ..Faults::default()
        };
        let mut c = Cluster::new(cfg).unwrap();
        let r = run_all(&mut c, call, false);
        assert!(r.ranks.iter().all(Result::is_ok), "{:?}", r.ranks);
        c.stats().event_hash
    };
    assert_eq!(hash(1, None), hash(1, None), "same seed, same log");
    assert_ne!(
        hash(1, None),
        hash(2, None),
        "the cluster seed must reach the faults"
    );
    assert_eq!(hash(1, Some(9)), hash(2, Some(9)), "a pinned fault seed");
    assert_ne!(hash(1, Some(9)), hash(1, Some(10)));
}

fn run_all(c: &mut Cluster, call: Call, payload: bool) -> RunReport {
    let n = c.ranks();
    let mut bufs: Vec<RankBuffers> = if payload {
        common::buffers(&call, n, false, 1)
    } else {
        Vec::new()
    };
    c.run(&vec![call; n as usize], &mut bufs, false).unwrap()
}

fn assert_all_failed(r: &RunReport) {
    for (rank, res) in r.ranks.iter().enumerate() {
        assert!(res.is_err(), "rank {rank} reported success");
    }
}

/// A rank dies in the middle of a collective: every other rank fails
/// within the deadline plus the abort's flight, in payload and timing mode;
/// later runs are refused.
#[test]
fn dead_rank_fails_every_rank_in_bounded_time() {
    let mut seen_retry = false;
    for (payload, victim, timeout) in [
        (true, 1u32, 6u8),
        (true, 2, 4),
        (false, 1, 6),
        (false, 2, 4),
    ] {
        {
            let at = 30e-6;
            let deadline = 2e-3;
            let mut cfg = common::small(2, 2, 2, 2);
            cfg.payload = payload;
            cfg.deadline = deadline;
            // 6: 8 tries of 0.26 ms outlast the deadline; 4: 8 tries of
            // 65 us come first.
            cfg.rnic.timeout = timeout;
            cfg.faults.failures = vec![Failure {
                what: Component::Rank(Rank(victim)),
                at,
            }];
            let mut c = Cluster::new(cfg).unwrap();
            let call = Call::new(Collective::AllReduce, 200_000, DataType::F32, ReduceOp::Sum);
            let r = run_all(&mut c, call, payload);
            assert_all_failed(&r);
            assert!(matches!(
                r.ranks[victim as usize],
                Err(Error::RankDied { .. })
            ));
            // Ranks keep working on what they already hold (at most a FIFO
            // of slices, tens of microseconds here) before they wait; then
            // the deadline, then the abort's flight.
            let drain = 100e-6;
            let bound = at + drain + deadline + c.config().control.latency;
            assert!(r.end <= bound, "ended at {} > {bound}", r.end);
            for (rank, res) in r.ranks.iter().enumerate() {
                let e = res.as_ref().unwrap_err();
                seen_retry |= e.wc_status() == Some(WcStatus::RetryExcErr);
                eprintln!("payload {payload} victim {victim}: rank {rank}: {e}");
                if rank as u32 != victim {
                    assert!(
                        matches!(
                            e,
                            Error::Aborted { .. }
                                | Error::Timeout { .. }
                                | Error::Completion { .. }
                        ),
                        "{e:?}"
                    );
                }
            }
            let mut bufs = common::buffers(&call, c.ranks(), false, 1);
            let again = c.run(&[call; 4], &mut bufs, false);
            assert!(matches!(again, Err(Error::Poisoned { .. })), "{again:?}");
        }
    }
    assert!(seen_retry, "no rank saw its peer's queue pair vanish");
}

#[test]
fn runs_after_a_failure_are_refused() {
    let mut cfg = common::small(1, 2, 1, 1);
    cfg.deadline = 1e-3;
    cfg.faults.failures = vec![Failure {
        what: Component::Rank(Rank(0)),
        at: 0.0,
    }];
    let mut c = Cluster::new(cfg).unwrap();
    let call = Call::new(Collective::AllReduce, 100, DataType::I32, ReduceOp::Sum);
    let r = run_all(&mut c, call, true);
    assert_all_failed(&r);
    assert!(c.is_aborted());
    let mut bufs = common::buffers(&call, 2, false, 1);
    let e = c.run(&[call; 2], &mut bufs, false).unwrap_err();
    assert!(matches!(e, Error::Poisoned { .. }), "{e:?}");
}

/// A NIC dies: its queue pairs' peers exhaust their retries
/// (RETRY_EXC_ERR), and everyone fails.
#[test]
fn dead_nic_gives_retry_exceeded() {
    for payload in [true, false] {
        let mut cfg = common::small(2, 1, 1, 1);
        cfg.payload = payload;
        cfg.rnic.timeout = 4; // 65 us
        cfg.deadline = 1.0;
        cfg.faults.failures = vec![Failure {
            what: Component::Nic {
                node: NodeId(1),
                nic: NicId(0),
            },
            at: 20e-6,
        }];
        let mut c = Cluster::new(cfg).unwrap();
        let call = Call::new(Collective::AllReduce, 100_000, DataType::F32, ReduceOp::Sum);
        let r = run_all(&mut c, call, payload);
        assert_all_failed(&r);
        let statuses: Vec<_> = r
            .ranks
            .iter()
            .map(|x| x.as_ref().unwrap_err().wc_status())
            .collect();
        eprintln!("payload {payload}: {statuses:?}");
        assert!(statuses.iter().all(|s| *s == Some(WcStatus::RetryExcErr)));
        // About (retry_cnt + 1) timeouts after the failure, not the deadline.
        assert!(r.end < 20e-6 + 9.0 * 4.096e-6 * 16.0 + 1e-3, "{}", r.end);
    }
}

/// An NVLink dies: nothing crosses it; the waiting ranks time out.
#[test]
fn dead_nvlink_times_out() {
    let mut cfg = common::small(1, 3, 1, 1);
    cfg.deadline = 5e-4;
    cfg.faults.failures = vec![Failure {
        what: Component::NvLink {
            from: Rank(1),
            to: Rank(2),
        },
        at: 0.0,
    }];
    let mut c = Cluster::new(cfg).unwrap();
    let call = Call::new(Collective::AllGather, 1000, DataType::U8, ReduceOp::Sum);
    let r = run_all(&mut c, call, true);
    assert_all_failed(&r);
    assert!(r
        .ranks
        .iter()
        .any(|x| matches!(x, Err(Error::Timeout { .. }))));
    let drain = 100e-6;
    assert!(r.end <= drain + 5e-4 + 20e-6, "{}", r.end);
}

/// A corrupted remote key or address: the responder NAKs the first write,
/// the sender's completion is REM_ACCESS_ERR, the others are aborted
/// because of it.
#[test]
fn bad_rkey_or_address_is_remote_access_error() {
    let mut cfg = common::small(2, 2, 2, 2);
    // Rank 1 (node 0's last GPU) sends to rank 2 across nodes.
    cfg.faults.bad_rkey = Some(ConnId {
        channel: ChannelId(1),
        rank: Rank(1),
    });
    let mut c = Cluster::new(cfg).unwrap();
    let call = Call::new(Collective::AllReduce, 5000, DataType::I64, ReduceOp::Sum);
    let r = run_all(&mut c, call, true);
    assert_all_failed(&r);
    match &r.ranks[1] {
        Err(Error::Completion {
            status,
            request,
            channel,
            ..
        }) => {
            assert_eq!(*status, WcStatus::RemAccessErr);
            assert_eq!((*request, *channel), ("data write", ChannelId(1)));
        }
        other => panic!("{other:?}"),
    }
    for res in &r.ranks {
        assert_eq!(
            res.as_ref().unwrap_err().wc_status(),
            Some(WcStatus::RemAccessErr)
        );
    }
    // A wrong address under the right key: the bounds check fails.
    let mut cfg = common::small(2, 2, 2, 2);
    cfg.faults.bad_raddr = Some(ConnId {
        channel: ChannelId(0),
        rank: Rank(3),
    });
    let mut c = Cluster::new(cfg).unwrap();
    let r = run_all(&mut c, call, true);
    assert_all_failed(&r);
    match &r.ranks[3] {
        Err(Error::Completion { status, .. }) => assert_eq!(*status, WcStatus::RemAccessErr),
        other => panic!("{other:?}"),
    }
    // The key of an NVLink hop cannot be corrupted: refused.
    let mut cfg = common::small(2, 2, 2, 2);
    cfg.faults.bad_rkey = Some(ConnId {
        channel: ChannelId(0),
        rank: Rank(0),
    });
    assert!(matches!(Cluster::new(cfg), Err(Error::BadConfig { .. })));
}

/// One rank called with a different count, type, op or root: the ranks
/// that see its header (it and its successor) fail with MismatchedCall,
/// all others with an error; nobody succeeds.
#[test]
fn mismatched_calls_fail_everywhere() {
    let base = Call::new(Collective::AllReduce, 3000, DataType::I32, ReduceOp::Sum);
    let odd_ones = [
        Call {
            count: 3016,
            ..base
        },
        Call {
            dtype: DataType::F32,
            ..base
        },
        Call {
            op: ReduceOp::Max,
            ..base
        },
        Call {
            collective: Collective::ReduceScatter,
            count: 750,
            ..base
        },
    ];
    for payload in [true, false] {
        for (i, odd) in odd_ones.iter().enumerate() {
            let mut cfg = common::small(2, 2, 2, 2);
            cfg.payload = payload;
            let mut c = Cluster::new(cfg).unwrap();
            let n = c.ranks();
            let who = (i as u32 + 1) % n;
            let mut calls = vec![base; n as usize];
            calls[who as usize] = *odd;
            let mut bufs: Vec<RankBuffers> = if payload {
                calls
                    .iter()
                    .enumerate()
                    .map(|(r, call)| RankBuffers::zeroed(call, n, Rank(r as u32), false))
                    .collect()
            } else {
                Vec::new()
            };
            let r = c.run(&calls, &mut bufs, false).unwrap();
            assert_all_failed(&r);
            let ring = c.ring(ChannelId(0));
            let succ = ring[(ring.iter().position(|&x| x == Rank(who)).unwrap() + 1) % n as usize];
            for saw in [Rank(who), succ] {
                let e = r.ranks[saw.get() as usize].as_ref().unwrap_err();
                assert!(
                    e.is_mismatched_call(),
                    "payload {payload} case {i} rank {saw}: {e}"
                );
            }
        }
    }
    // A different root.
    let mut c = Cluster::new(common::small(1, 3, 1, 1)).unwrap();
    let b = |root| {
        Call::new(
            Collective::Broadcast { root: Rank(root) },
            100,
            DataType::U8,
            ReduceOp::Sum,
        )
    };
    let calls = [b(0), b(0), b(1)];
    let mut bufs: Vec<RankBuffers> = (0..3)
        .map(|r| RankBuffers::zeroed(&calls[r], 3, Rank(r as u32), false))
        .collect();
    let r = c.run(&calls, &mut bufs, false).unwrap();
    assert_all_failed(&r);
    assert!(r
        .ranks
        .iter()
        .any(|x| x.as_ref().unwrap_err().is_mismatched_call()));
}

/// A livelock bound: too few events for the run fails every rank.
#[test]
fn event_limit() {
    let mut cfg = common::small(2, 2, 2, 2);
    cfg.max_events = 50;
    let mut c = Cluster::new(cfg).unwrap();
    let call = Call::new(Collective::AllReduce, 10_000, DataType::F32, ReduceOp::Sum);
    let r = run_all(&mut c, call, true);
    assert_all_failed(&r);
    assert!(r
        .ranks
        .iter()
        .any(|x| matches!(x, Err(Error::EventLimit { .. }))));
}

/// Bad calls are refused before anything runs; the cluster stays usable.
#[test]
fn invalid_calls_are_refused() {
    let mut c = Cluster::new(common::small(1, 2, 1, 1)).unwrap();
    let call = Call::new(Collective::AllReduce, 10, DataType::F32, ReduceOp::Sum);
    assert!(matches!(
        c.run(&[call], &mut [], false),
        Err(Error::CallCount { .. })
    ));
    let bad_root = Call::new(
        Collective::Broadcast { root: Rank(5) },
        10,
        DataType::F32,
        ReduceOp::Sum,
    );
    assert!(matches!(
        c.run(&[bad_root; 2], &mut [], false),
        Err(Error::InvalidCall { rank: Rank(0), .. })
    ));
    let mut bufs = vec![RankBuffers::default(); 2];
    assert!(matches!(
        c.run(&[call; 2], &mut bufs, false),
        Err(Error::BadBuffer { rank: Rank(0), .. })
    ));
    let mut bufs = common::buffers(&call, 2, false, 1);
    let r = c.run(&[call; 2], &mut bufs, false).unwrap();
    assert!(r.ok());
}
