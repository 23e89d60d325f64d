//! A one-rank communicator needs no RDMA device: the whole API (store,
//! setup, plans, machines, buffers, errors) runs everywhere.

use std::time::Duration;

use ringcc_core::{Collective, DataType, Plan, Rank, ReduceOp};
use ringcc_tests::reference::{expected, input};
use ringcc_verbs::{Call, Communicator, Config, Error, Launch, Launcher};

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

fn one_rank() -> Communicator {
    let launch = Launch {
        rank: 0,
        world_size: 1,
        addr: format!("127.0.0.1:{}", free_port()),
        token: "t".into(),
        launcher: Launcher::Ringcc,
    };
    let mut config = Config::default();
    config.connect_timeout = Duration::from_secs(10);
    Communicator::new(launch, config).unwrap()
}

#[test]
fn every_collective_on_one_rank_equals_the_reference() {
    let mut comm = one_rank();
    assert_eq!((comm.rank(), comm.world_size()), (0, 1));
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
                let plan = Plan::new(collective, count, dtype, 1, 1, 64).unwrap();
                let inp = input(&plan, op, 0, i);
                let mut out = vec![0u8; plan.output_len() as usize * dtype.size() as usize];
                let call = Call {
                    collective,
                    count,
                    dtype,
                    op,
                };
                comm.run(call, &inp, &mut out).unwrap();
                assert_eq!(
                    Some(out),
                    expected(&plan, op, 0, i),
                    "{collective} {count} {dtype} {op}"
                );
            }
        }
    }
    assert_eq!(comm.calls(), i);
}

#[test]
fn wrong_buffer_sizes_are_typed_errors_and_poison_the_communicator() {
    let mut comm = one_rank();
    let inp = vec![0u8; 12];
    let mut out = vec![0u8; 8];
    match comm.all_reduce(&inp, &mut out, DataType::F32, ReduceOp::Sum) {
        Err(Error::BadBuffer {
            what: "output",
            expected: 12,
            got: 8,
        }) => {}
        other => panic!("expected a bad output buffer, got {other:?}"),
    }
    let mut out = vec![0u8; 12];
    assert!(matches!(
        comm.all_reduce(&inp, &mut out, DataType::F32, ReduceOp::Sum),
        Err(Error::Poisoned(_))
    ));
}

#[test]
fn odd_byte_counts_are_refused() {
    let mut comm = one_rank();
    let inp = vec![0u8; 6];
    let mut out = vec![0u8; 6];
    assert!(matches!(
        comm.all_reduce(&inp, &mut out, DataType::F32, ReduceOp::Sum),
        Err(Error::BadBuffer { what: "input", .. })
    ));
}

#[test]
fn an_abort_handle_fails_the_next_call_and_never_blocks() {
    let mut comm = one_rank();
    let h = comm.abort_handle();
    let t0 = std::time::Instant::now();
    h.abort("operator pressed ctrl-c");
    assert!(t0.elapsed() < Duration::from_secs(1));
    let inp = vec![0u8; 4];
    let mut out = vec![0u8; 4];
    match comm.all_reduce(&inp, &mut out, DataType::F32, ReduceOp::Sum) {
        Err(Error::Aborted {
            rank: Some(0),
            reason,
        }) => assert!(reason.contains("ctrl-c")),
        other => panic!("expected an abort, got {other:?}"),
    }
}
