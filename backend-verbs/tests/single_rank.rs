//! What runs without an RDMA device: a communicator of one rank with the
//! verbs transport (it needs no hop), the transport not offering itself
//! on a host without devices.

use std::sync::Arc;
use std::time::Duration;

use ringcc_comm::launch::{Launch, Launcher};
use ringcc_comm::store::MemStore;
use ringcc_comm::transport::Transport;
use ringcc_comm::{Communicator, Options};
use ringcc_core::{verify, Call, Collective, DataType, Plan, Rank, ReduceOp};
use ringcc_verbs::{VerbsConfig, VerbsTransport};

/// Rank `rank`'s input for `plan` (the core's exact test values).
fn input(plan: &Plan, op: ReduceOp, rank: u32, salt: u64) -> Vec<u8> {
    let mut v = vec![0u8; plan.input_len() as usize * usize::from(plan.dtype().size())];
    verify::fill_input(plan, op, rank, salt, &mut v).unwrap();
    v
}

/// Rank `rank`'s expected output, `None` where it is undefined.
fn expected(plan: &Plan, op: ReduceOp, rank: u32, salt: u64) -> Option<Vec<u8>> {
    let mut v = vec![0u8; plan.output_len() as usize * usize::from(plan.dtype().size())];
    verify::fill_expected(plan, op, rank, 0, salt, &mut v)
        .unwrap()
        .then_some(v)
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

fn launch() -> Launch {
    Launch {
        rank: Rank(0),
        world_size: 1,
        addr: format!("127.0.0.1:{}", free_port()),
        token: "t".into(),
        launcher: Launcher::Ringcc,
    }
}

fn options() -> Options {
    Options {
        timeout: Duration::from_secs(10),
        ..Options::default()
    }
}

/// One rank over rank 0's TCP store, as a launcher starts it, with verbs
/// as its only transport: every collective, out of place and in place.
#[test]
fn one_rank_with_verbs_runs_every_collective() {
    let comm = Communicator::from_launch(
        launch(),
        options(),
        ringcc_verbs::transports(VerbsConfig::default()),
    )
    .unwrap();
    assert_eq!((comm.rank(), comm.world_size()), (Rank(0), 1));
    assert!(comm.hops().is_empty());
    let mut i = 0u64;
    for collective in [
        Collective::AllReduce,
        Collective::ReduceScatter,
        Collective::AllGather,
        Collective::Broadcast { root: Rank(0) },
        Collective::Reduce { root: Rank(0) },
    ] {
        for (dtype, op) in [
            (DataType::F32, ReduceOp::Sum),
            (DataType::I8, ReduceOp::Avg),
            (DataType::Bf16, ReduceOp::Max),
        ] {
            for count in [0u64, 1, 17, 100_000] {
                i += 1;
                let call = Call::new(collective, count, dtype, op);
                let plan = Plan::new(collective, count, dtype, 1, 1, 64).unwrap();
                let inp = input(&plan, op, 0, i);
                let want = expected(&plan, op, 0, i);
                let mut out = vec![0u8; plan.output_len() as usize * dtype.size() as usize];
                comm.run(&call, &inp, &mut out).unwrap();
                assert_eq!(Some(out), want, "{collective} {count} {dtype} {op}");
                // In place: on one rank every offset is 0.
                let (ib, ob) = call.buffer_bytes(1);
                let mut buf = vec![0xEEu8; ib.max(ob)];
                buf[..ib].copy_from_slice(&inp);
                comm.run_in_place(&call, &mut buf).unwrap();
                assert_eq!(
                    Some(buf[..ob].to_vec()),
                    want,
                    "in place: {collective} {count} {dtype} {op}"
                );
            }
        }
    }
    assert_eq!(comm.calls(), 2 * i);
    comm.close().unwrap();
}

/// On a host without RDMA devices (or without rdma-core) the transport
/// does not offer itself — no error — and a job of two ranks with verbs
/// alone fails to connect saying no transport reaches.
#[test]
fn without_a_device_verbs_is_not_offered_and_two_ranks_find_no_transport() {
    if !ringcc_verbs::devices().is_empty() {
        eprintln!("skipped: this host has RDMA devices");
        return;
    }
    let mut t = VerbsTransport::new(VerbsConfig::default());
    assert_eq!(t.name(), "verbs");
    assert_eq!(t.publish("t", Rank(0)).unwrap(), None);
    // Naming a device changes nothing when there is none at all.
    let mut named = VerbsConfig::default();
    named.devices = vec!["mlx5_0".into()];
    assert_eq!(
        VerbsTransport::new(named).publish("t", Rank(0)).unwrap(),
        None
    );

    let store = Arc::new(MemStore::new());
    let ranks: Vec<_> = (0..2)
        .map(|r| {
            let store = Arc::clone(&store);
            std::thread::spawn(move || {
                Communicator::new(
                    Rank(r),
                    2,
                    store,
                    "no-device",
                    options(),
                    ringcc_verbs::transports(VerbsConfig::default()),
                )
                .map(|_| ())
            })
        })
        .collect();
    for h in ranks {
        match h.join().unwrap() {
            Err(ringcc_comm::Error::BadConfig(why)) => {
                assert!(why.contains("no transport reaches"), "{why}")
            }
            other => panic!("expected no transport, got {other:?}"),
        }
    }
}
