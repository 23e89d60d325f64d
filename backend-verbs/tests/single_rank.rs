//! A one-rank communicator needs no RDMA device: the whole API (store,
//! setup, plans, machines, buffers, errors) runs everywhere.

use std::time::Duration;

use ringcc_core::{verify, Collective, DataType, Plan, Rank, ReduceOp};
use ringcc_verbs::{Call, Communicator, Config, Error, Launch, Launcher};

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

fn one_rank() -> Communicator {
    let launch = Launch {
        rank: Rank(0),
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
    assert_eq!((comm.rank(), comm.world_size()), (Rank(0), 1));
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

/// In place: one buffer, the input at `in_place_offsets(rank).0`, the
/// output read back at `.1` (on one rank every offset is 0, and the
/// buffer is as long as the larger side).
#[test]
fn every_collective_in_place_on_one_rank_equals_the_reference() {
    let mut comm = one_rank();
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
        ] {
            for count in [0u64, 1, 17, 100_000] {
                i += 1;
                let call = Call::new(collective, count, dtype, op);
                let plan = Plan::new(collective, count, dtype, 1, 1, 64).unwrap();
                let (ib, ob) = call.buffer_bytes(1);
                let (io, oo) = call.in_place_offsets(0);
                let e = usize::from(dtype.size());
                let mut buf = vec![0xEEu8; ib.max(ob)];
                let at = io as usize * e;
                buf[at..at + ib].copy_from_slice(&input(&plan, op, 0, i));
                if i.is_multiple_of(2) {
                    comm.run_in_place(call, &mut buf).unwrap();
                } else {
                    let mut reg = comm.register(&mut buf).unwrap();
                    comm.run_registered_in_place(call, &mut reg).unwrap();
                }
                let at = oo as usize * e;
                assert_eq!(
                    Some(buf[at..at + ob].to_vec()),
                    expected(&plan, op, 0, i),
                    "in place: {collective} {count} {dtype} {op}"
                );
            }
        }
    }
    assert_eq!(comm.calls(), i);
    // The one buffer must hold the larger side exactly.
    let mut short = vec![0u8; 12];
    assert!(matches!(
        comm.run_in_place(
            Call::all_reduce(4, DataType::F32, ReduceOp::Sum),
            &mut short
        ),
        Err(Error::BadBuffer {
            which: "in-place",
            expected: 16,
            got: 12
        })
    ));
}

#[test]
fn wrong_buffer_sizes_are_typed_errors_and_poison_the_communicator() {
    let mut comm = one_rank();
    let inp = vec![0u8; 12];
    let mut out = vec![0u8; 8];
    match comm.all_reduce(&inp, &mut out, DataType::F32, ReduceOp::Sum) {
        Err(Error::BadBuffer {
            which: "output",
            expected: 12,
            got: 8,
        }) => {}
        other => panic!("expected a bad output buffer, got {other:?}"),
    }
    let mut out = vec![0u8; 12];
    assert!(matches!(
        comm.all_reduce(&inp, &mut out, DataType::F32, ReduceOp::Sum),
        Err(Error::Poisoned { .. })
    ));
}

#[test]
fn odd_byte_counts_are_refused() {
    let mut comm = one_rank();
    let inp = vec![0u8; 6];
    let mut out = vec![0u8; 6];
    assert!(matches!(
        comm.all_reduce(&inp, &mut out, DataType::F32, ReduceOp::Sum),
        Err(Error::BadBuffer { which: "input", .. })
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
            rank: Some(Rank(0)),
            reason,
        }) => assert!(reason.contains("ctrl-c")),
        other => panic!("expected an abort, got {other:?}"),
    }
}

#[test]
fn registered_buffers_run_many_calls_and_equal_the_reference() {
    let mut comm = one_rank();
    let count = 10_000u64;
    let (dtype, op) = (DataType::F32, ReduceOp::Sum);
    let plan = Plan::new(Collective::AllReduce, count, dtype, 1, 1, 64).unwrap();
    let bytes = count as usize * 4;
    let mut inp = vec![0u8; bytes];
    let mut out = vec![0u8; bytes];
    let input_reg = comm.register(&mut inp).unwrap();
    let mut output_reg = comm.register(&mut out).unwrap();
    assert_eq!((input_reg.len(), output_reg.is_empty()), (bytes, false));
    let mut input_reg = input_reg;
    for salt in 1..=3u64 {
        // New data in the registered input between calls.
        input_reg
            .as_mut_slice()
            .copy_from_slice(&input(&plan, op, 0, salt));
        output_reg.as_mut_slice().fill(0xAB);
        let call = Call {
            collective: Collective::AllReduce,
            count,
            dtype,
            op,
        };
        comm.run_registered(call, &input_reg, &mut output_reg)
            .unwrap();
        assert_eq!(
            Some(output_reg.as_slice().to_vec()),
            expected(&plan, op, 0, salt),
            "call {salt}"
        );
    }
    assert_eq!(comm.calls(), 3);
    // The wrong length is the same typed error as for plain buffers.
    let call = Call {
        collective: Collective::AllReduce,
        count: count + 1,
        dtype,
        op,
    };
    assert!(matches!(
        comm.run_registered(call, &input_reg, &mut output_reg),
        Err(Error::BadBuffer { which: "input", .. })
    ));
}

#[test]
fn a_buffer_registered_with_another_communicator_is_refused() {
    let mut a = one_rank();
    let b = one_rank();
    let mut inp = vec![0u8; 64];
    let mut out = vec![0u8; 64];
    let theirs = b.register(&mut inp).unwrap();
    let mut mine = a.register(&mut out).unwrap();
    let call = Call {
        collective: Collective::AllReduce,
        count: 16,
        dtype: DataType::F32,
        op: ReduceOp::Sum,
    };
    match a.run_registered(call, &theirs, &mut mine) {
        Err(Error::ForeignRegistration { what: "input" }) => {}
        other => panic!("expected a foreign input registration, got {other:?}"),
    }
    // As with any misuse, the communicator is unusable afterwards.
    let mut fresh = vec![0u8; 64];
    assert!(matches!(
        a.all_reduce(&fresh.clone(), &mut fresh, DataType::F32, ReduceOp::Sum),
        Err(Error::Poisoned { .. })
    ));
    // The registration outlives the communicator that made it.
    drop(b);
    assert_eq!(theirs.len(), 64);
}
