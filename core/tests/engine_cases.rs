//! The progress engine's refusals, failures and reports, case by case:
//! mismatched calls poison the engine that sees them (and only that
//! one), a stalled rank's deadline names rank, channel and what it waits
//! for, refusals that are the caller's mistake (`BadChannel`, `Busy`)
//! leave the engine usable, `abort` poisons it, and a call may leave out
//! channels an earlier one used.

mod engine_world;

use engine_world::{CallSpec, Mode, Perm, World, CAP};
use ringcc_core::fifo::FifoGeometry;
use ringcc_core::prim::{Action, Blocked, LinkState, Next};
use ringcc_core::progress::{
    ArrayEngine, Channel, Driven, Drove, Engine, EngineError, Event, Stall,
};
use ringcc_core::rng::Rng;
use ringcc_core::{
    Call, CallDesc, ChannelId, Collective, DataType, Error, InOrderRing, ProtocolViolation, Rank,
    ReduceOp, RingOrder,
};

type One = ArrayEngine<InOrderRing, CAP>;

const TIMEOUT: u64 = 1000;

fn g() -> FifoGeometry {
    FifoGeometry::new(16, 1).unwrap()
}

fn engine(rank: u32) -> One {
    One::new(Rank(rank), Default::default(), TIMEOUT)
}

fn start(
    e: &mut One,
    now: u64,
    call: &Call,
    n: u32,
    channels: u32,
) -> Result<CallDesc, EngineError> {
    let plan = call.plan(n, channels, 16).unwrap();
    e.start(now, call, &plan, g(), |_| InOrderRing { ranks: n })
}

/// Runs a one-rank call to the end, every exec completing at once;
/// returns the execs.
fn run_alone(e: &mut One) -> u32 {
    let mut execs = 0;
    for _ in 0..10_000 {
        if e.is_idle() {
            return execs;
        }
        match e.poll().unwrap() {
            Some((c, Action::Exec(_))) => {
                e.handle(0, c, Event::ExecDone).unwrap();
                execs += 1;
            }
            Some((_, Action::Done)) => {}
            other => panic!("a one-rank call does not {other:?}"),
        }
    }
    panic!("a one-rank call that does not end");
}

fn machine_err(channel: u8, during: &'static str, source: Error) -> EngineError {
    EngineError::Machine {
        channel: ChannelId(channel),
        during,
        source,
    }
}

/// Everything a poisoned engine answers (`ring1`: a one-rank ring).
fn poisoned<M, S>(e: &mut Engine<M, S>, first: EngineError, ring1: M)
where
    M: RingOrder + Copy,
    S: AsRef<[Channel<M>]> + AsMut<[Channel<M>]>,
{
    assert_eq!(e.failure(), Some(first));
    assert_eq!(e.poll(), Err(EngineError::Poisoned));
    assert_eq!(
        e.handle(0, ChannelId(0), Event::Tail(0)),
        Err(EngineError::Poisoned)
    );
    assert_eq!(e.handle_timeout(u64::MAX), Err(EngineError::Poisoned));
    assert_eq!(e.poll_timeout(), None);
    let call = Call::all_reduce(4, DataType::I32, ReduceOp::Sum);
    let plan = call.plan(1, 1, 16).unwrap();
    assert_eq!(
        e.start(0, &call, &plan, g(), |_| ring1),
        Err(EngineError::Poisoned)
    );
    assert_eq!(e.failure(), Some(first), "the first failure is kept");
}

fn assert_poisoned(e: &mut One, first: EngineError) {
    poisoned(e, first, InOrderRing { ranks: 1 });
}

// ---- mismatched calls --------------------------------------------------

/// A world where rank `odd` makes `odd_call` as its call `at`, everyone
/// else `base`; run until nothing moves.
fn mismatched(n: u32, odd: u32, base: Call, odd_call: Call, at: usize, seed: u64) -> World {
    let spec = |call| CallSpec {
        call,
        chunk_bytes: 16,
        salt: 7,
        channels: 2,
    };
    let calls = (0..n)
        .map(|r| {
            (0..2)
                .map(|k| spec(if r == odd && k == at { odd_call } else { base }))
                .collect()
        })
        .collect();
    let mut rng = Rng::new(seed);
    let rings = [
        Perm::identity(n),
        Perm::reversed(n),
        Perm::shuffled(n, &mut rng),
    ];
    let mut w = World::new(g(), rings, calls, seed, Mode::Tolerant);
    assert!(w.run(1_000_000), "the world settles");
    w
}

#[test]
fn a_mismatched_call_fails_and_poisons_the_engine_that_sees_it() {
    let base = Call::all_reduce(24, DataType::F32, ReduceOp::Sum);
    let odds = [
        Call::all_reduce(25, DataType::F32, ReduceOp::Sum),
        Call::all_reduce(24, DataType::I32, ReduceOp::Sum),
        Call::all_reduce(24, DataType::F32, ReduceOp::Max),
        Call::reduce_scatter(24, DataType::F32, ReduceOp::Sum),
        Call::reduce(24, DataType::F32, ReduceOp::Sum, Rank(0)),
    ];
    for (i, odd_call) in odds.into_iter().enumerate() {
        for seed in 0..12u64 {
            let n = 2 + (seed % 3) as u32;
            let odd = (seed % u64::from(n)) as u32;
            let at = (seed % 2) as usize;
            let mut w = mismatched(n, odd, base, odd_call, at, seed * 31 + i as u64);
            let (want, got) = (base.desc(at as u64), odd_call.desc(at as u64));
            let mut mismatches = 0;
            for r in 0..n {
                let Some(err) = w.ranks[r as usize].failure else {
                    // Not failed: waits, and its deadline says for what.
                    let e = &mut w.ranks[r as usize].engine;
                    assert!(!e.is_idle(), "rank {r} cannot finish");
                    e.set_timeout(10);
                    let dl = e.poll_timeout().unwrap();
                    match e.handle_timeout(dl) {
                        Err(EngineError::Timeout(s)) => {
                            assert_eq!((s.rank, s.seq, s.waited), (Rank(r), at as u64, 10));
                            assert!(
                                matches!(s.blocked, Blocked::Data { .. } | Blocked::Credit { .. }),
                                "{s}"
                            );
                        }
                        other => panic!("rank {r}: {other:?}"),
                    }
                    continue;
                };
                let EngineError::Machine {
                    channel,
                    during,
                    source:
                        Error::MismatchedCall {
                            expected,
                            got: seen,
                        },
                } = err
                else {
                    panic!("rank {r}: {err}");
                };
                mismatches += 1;
                let mine = if r == odd { got } else { want };
                let theirs = if r == odd { want } else { got };
                assert_eq!((expected, seen), (mine, theirs), "rank {r}");
                assert!(during == "handle_header" || during == "Machine::new");
                assert_eq!(err.channel(), Some(channel));
                assert_eq!(err.core(), err_core(&err));
                let e = &mut w.ranks[r as usize].engine;
                if during == "handle_header" {
                    assert_eq!(e.blocked_on(channel), Blocked::Failed);
                    assert!(e.machine(channel).unwrap().error().is_some());
                }
                poisoned(e, err, Perm::identity(1));
            }
            assert!(mismatches > 0, "odd call {i}, seed {seed}: nobody noticed");
            // Call `at - 1` (when there is one) completed everywhere.
            for st in &w.ranks {
                assert!(st.engine.seq() >= at as u64);
            }
        }
    }
}

fn err_core(e: &EngineError) -> Option<Error> {
    match e {
        EngineError::Machine { source, .. } => Some(*source),
        _ => None,
    }
}

/// What does not matter to a collective is not compared: the operation
/// of an AllGather or a Broadcast.
#[test]
fn an_operation_that_does_not_apply_is_no_mismatch() {
    for seed in 0..8u64 {
        let spec = |op| CallSpec {
            call: Call::new(
                Collective::Broadcast { root: Rank(1) },
                20,
                DataType::U8,
                op,
            ),
            chunk_bytes: 16,
            salt: seed,
            channels: 2,
        };
        let calls = vec![
            vec![spec(ReduceOp::Sum)],
            vec![spec(ReduceOp::Max)],
            // Not Prod: the test inputs for a product are other values.
            vec![spec(ReduceOp::Avg)],
        ];
        let rings = [Perm::identity(3), Perm::reversed(3), Perm::identity(3)];
        let mut w = World::new(g(), rings, calls, seed, Mode::Strict);
        assert!(w.run(1_000_000));
        assert!(w.finished(), "{}", w.report());
        w.check_quiet();
    }
}

// ---- deadlines and stall reports -------------------------------------

/// Two ranks, rank 1 never calls: rank 0 runs until it can go no
/// further.
fn lonely(call: Call, channels: u32) -> World {
    let spec = CallSpec {
        call,
        chunk_bytes: 16,
        salt: 1,
        channels,
    };
    let rings = [Perm::identity(2); CAP];
    let mut w = World::new(g(), rings, vec![vec![spec], vec![]], 3, Mode::Strict);
    assert!(w.run(100_000));
    assert!(!w.finished());
    w
}

/// Sets the deadline, checks nothing happens before it, and returns the
/// stall it reports at it (and that it poisons).
fn stall_at_deadline<S>(e: &mut Engine<Perm, S>) -> Stall
where
    S: AsRef<[Channel<Perm>]> + AsMut<[Channel<Perm>]>,
{
    e.set_timeout(TIMEOUT);
    assert_eq!(e.timeout(), TIMEOUT);
    let dl = e.poll_timeout().unwrap();
    assert_eq!(e.handle_timeout(dl - 1), Ok(()));
    assert_eq!(e.failure(), None);
    let Err(EngineError::Timeout(s)) = e.handle_timeout(dl) else {
        panic!("no timeout at the deadline");
    };
    assert_eq!(s.waited, TIMEOUT);
    assert_eq!(s, e.stall(dl));
    assert_eq!(e.failure(), Some(EngineError::Timeout(s)));
    assert_eq!(e.poll(), Err(EngineError::Poisoned));
    assert_eq!(e.poll_timeout(), None);
    assert_eq!(EngineError::Timeout(s).channel(), Some(s.channel));
    assert_eq!(EngineError::Timeout(s).core(), None);
    s
}

#[test]
fn a_rank_waiting_for_data_says_so_at_its_deadline() {
    // AllReduce of 4 i32 on 2 ranks: step 0 sends one slice, step 1
    // needs the predecessor's first slice.
    let mut w = lonely(Call::all_reduce(4, DataType::I32, ReduceOp::Sum), 1);
    let s = stall_at_deadline(&mut w.ranks[0].engine);
    let want = Stall {
        rank: Rank(0),
        seq: 0,
        channel: ChannelId(0),
        blocked: Blocked::Data { tail: 0, need: 1 },
        open: 1,
        waited: TIMEOUT,
    };
    assert_eq!(s, want);
    let text = EngineError::Timeout(s).to_string();
    assert!(
        text.contains(
            "rank 0 call 0: channel 0 waits for data from its predecessor (tail 0, needs 1)"
        ),
        "{text}"
    );
    // Rank 1 never started: no deadline, nothing to report.
    let idle = &mut w.ranks[1].engine;
    assert_eq!(idle.poll_timeout(), None);
    assert_eq!(idle.handle_timeout(u64::MAX), Ok(()));
    assert_eq!(idle.blocked_on(ChannelId(0)), Blocked::Done);
}

#[test]
fn a_rank_waiting_for_credit_says_so_at_its_deadline() {
    // A Broadcast root whose successor never reads: 10 slices per
    // channel, 8 fit.
    let bcast = |count| Call::broadcast(count, DataType::I32, Rank(0));
    let mut w = lonely(bcast(80), 2);
    let s = stall_at_deadline(&mut w.ranks[0].engine);
    assert_eq!(s.channel, ChannelId(0));
    assert_eq!(s.blocked, Blocked::Credit { head: 0, need: 1 });
    assert_eq!(s.open, 2);
    // All sent (one slice), waiting for it to be consumed before Done.
    let mut w = lonely(bcast(4), 1);
    let e = &w.ranks[0].engine;
    assert_eq!(e.link(ChannelId(0)).send_next, 1);
    let s = stall_at_deadline(&mut w.ranks[0].engine);
    assert_eq!(s.blocked, Blocked::Credit { head: 0, need: 1 });
    assert!(s
        .to_string()
        .contains("credit from its successor (head 0, needs 1)"));
}

#[test]
fn the_stall_names_the_first_blocked_channel_and_counts_the_open_ones() {
    let call = Call::all_reduce(8, DataType::I32, ReduceOp::Sum);
    let mut e = engine(0);
    start(&mut e, 5, &call, 1, 2).unwrap();
    // Nothing polled yet: both ready, the first is named.
    let s = e.stall(5);
    assert_eq!(
        (s.channel, s.blocked, s.open, s.waited),
        (ChannelId(0), Blocked::Ready, 2, 0)
    );
    let (c0, a0) = e.poll().unwrap().unwrap();
    let (c1, a1) = e.poll().unwrap().unwrap();
    assert_eq!((c0, c1), (ChannelId(0), ChannelId(1)));
    assert!(matches!((a0, a1), (Action::Exec(_), Action::Exec(_))));
    assert_eq!(e.poll(), Ok(None));
    assert_eq!(e.stall(9).blocked, Blocked::Exec);
    assert_eq!(e.stall(9).channel, ChannelId(0));
    // Channel 0's exec done (so it is ready for its Done): the blocked
    // channel 1 is named, not the ready one.
    e.handle(20, c0, Event::ExecDone).unwrap();
    assert_eq!(e.blocked_on(c0), Blocked::Ready);
    let s = e.stall(25);
    assert_eq!(
        (s.channel, s.blocked, s.open, s.waited),
        (c1, Blocked::Exec, 2, 5)
    );
    assert_eq!(e.poll(), Ok(Some((c0, Action::Done))));
    assert_eq!(e.poll(), Ok(None));
    assert_eq!(e.blocked_on(c0), Blocked::Done);
    assert_eq!(e.poll_timeout(), Some(20 + TIMEOUT));
    assert_eq!(e.handle_timeout(20 + TIMEOUT - 1), Ok(()));
    let Err(EngineError::Timeout(s)) = e.handle_timeout(20 + TIMEOUT) else {
        panic!("no timeout");
    };
    assert_eq!(
        (s.channel, s.blocked, s.open, s.waited),
        (c1, Blocked::Exec, 1, TIMEOUT)
    );
    assert!(
        s.to_string().contains("channel 1 waits for its own slice"),
        "{s}"
    );
    assert!(s.to_string().contains("1 channel(s) open"), "{s}");
}

// ---- the caller's mistakes ---------------------------------------------

#[test]
fn bad_channels_are_refused_without_poisoning() {
    let mut e = engine(0);
    for c in [3u8, 64, 255] {
        assert_eq!(
            e.handle(0, ChannelId(c), Event::Tail(1)),
            Err(EngineError::BadChannel {
                channel: u32::from(c),
                capacity: 3
            })
        );
    }
    let call = Call::all_reduce(64, DataType::I32, ReduceOp::Sum);
    assert_eq!(
        start(&mut e, 0, &call, 1, 4),
        Err(EngineError::BadChannel {
            channel: 3,
            capacity: 3
        })
    );
    assert_eq!(e.failure(), None);
    assert!(e.is_idle());
    assert!(e.channel(ChannelId(3)).is_none());
    assert_eq!(e.link(ChannelId(3)), Default::default());
    assert_eq!(e.blocked_on(ChannelId(3)), Blocked::Done);
    assert_eq!(e.machine(ChannelId(3)).map(|_| ()), None);
    start(&mut e, 0, &call, 1, 3).unwrap();
    assert_eq!(run_alone(&mut e), 6 + 6 + 4);
    // Storage beyond the plan's limit of 64 channels is never used.
    let mut big = Engine::<InOrderRing, Vec<_>>::new(Rank(0), vec![Channel::new(); 70], TIMEOUT);
    assert_eq!(
        big.handle(0, ChannelId(64), Event::Tail(0)),
        Err(EngineError::BadChannel {
            channel: 64,
            capacity: 64
        })
    );
    big.handle(0, ChannelId(63), Event::Tail(0)).unwrap();
    // The calls that look the channel up once refuse it the same way.
    let refused = EngineError::BadChannel {
        channel: 64,
        capacity: 64,
    };
    assert_eq!(
        big.handle_poll(0, ChannelId(64), Event::Tail(0)),
        Err(refused)
    );
    assert_eq!(
        big.drive(0, ChannelId(64), None, Some(Event::Tail(0))),
        Err(refused)
    );
    assert_eq!(big.failure(), None);
    let text = EngineError::BadChannel {
        channel: 64,
        capacity: 64,
    }
    .to_string();
    assert_eq!(text, "channel 64 out of range (engine has 64)");
}

#[test]
fn a_second_start_while_running_is_busy_and_harmless() {
    let call = Call::all_gather(20, DataType::U8);
    let mut e = engine(0);
    let d = start(&mut e, 0, &call, 1, 2).unwrap();
    assert_eq!(d, call.desc(0));
    assert_eq!(start(&mut e, 0, &call, 1, 2), Err(EngineError::Busy));
    assert_eq!(e.failure(), None);
    assert_eq!(e.call(), Some(d));
    assert_eq!(run_alone(&mut e), 2);
    assert_eq!((e.seq(), e.call()), (1, None));
    assert_eq!(start(&mut e, 0, &call, 1, 2).unwrap().seq, 1);
    assert_eq!(EngineError::Busy.to_string(), "a call is still running");
}

#[test]
fn a_credit_already_known_is_ignored() {
    // Rank 0 of two sends its first slice; its successor's counter then
    // reads 1, again 1, and an older 0 (a re-read racing the update).
    let call = Call::all_reduce(16, DataType::F32, ReduceOp::Sum);
    let mut e = engine(0);
    start(&mut e, 0, &call, 2, 1).unwrap();
    let c = ChannelId(0);
    match e.poll().unwrap() {
        Some((ch, Action::Exec(x))) => {
            assert_eq!(ch, c);
            assert!(x.send.is_some(), "step 0 sends");
        }
        other => panic!("{other:?}"),
    }
    e.handle(1, c, Event::ExecDone).unwrap();
    // Between steps, with its send not yet credited: its next step is
    // there to take (a receive), not a wait for credit.
    assert_eq!(e.blocked_on(c), Blocked::Ready);
    for head in [1, 1, 0] {
        assert_eq!(e.handle(2, c, Event::Head(head)), Ok(()), "head {head}");
        assert_eq!(e.link(c).send_head, 1);
    }
    assert_eq!(e.failure(), None);
    assert_eq!(e.poll(), Ok(None), "rank 0 now waits for data");
}

#[test]
fn abort_poisons_running_or_idle() {
    let call = Call::all_reduce(8, DataType::I32, ReduceOp::Sum);
    let mut e = engine(0);
    start(&mut e, 0, &call, 1, 1).unwrap();
    let _ = e.poll().unwrap();
    e.abort();
    assert_poisoned(&mut e, EngineError::Aborted);
    e.abort();
    assert_eq!(e.failure(), Some(EngineError::Aborted));
    let mut idle = engine(2);
    idle.abort();
    assert_poisoned(&mut idle, EngineError::Aborted);
    assert_eq!(EngineError::Aborted.to_string(), "aborted");
    assert_eq!(
        EngineError::Poisoned.to_string(),
        "the engine failed earlier"
    );
    assert_eq!(EngineError::Aborted.channel(), None);
}

#[test]
fn a_start_that_cannot_work_is_refused_and_loses_nothing() {
    let call = Call::all_reduce(8, DataType::I32, ReduceOp::Sum);
    // The plan of another call.
    let mut e = engine(0);
    let other = Call::all_reduce(9, DataType::I32, ReduceOp::Sum)
        .plan(1, 1, 16)
        .unwrap();
    let err = e
        .start(0, &call, &other, g(), |_| InOrderRing { ranks: 1 })
        .unwrap_err();
    assert_eq!(err, machine_err(0, "Machine::new", Error::PlanMismatch));
    assert_refused(&mut e, &call);
    // A ring of the wrong size (channel 1's): channel 0, already given
    // its machine, goes back to what it had.
    let mut e = engine(0);
    let plan = call.plan(2, 2, 16).unwrap();
    let err = e
        .start(0, &call, &plan, g(), |c| InOrderRing {
            ranks: 2 + u32::from(c.0),
        })
        .unwrap_err();
    assert_eq!(err, machine_err(1, "Plan::steps", Error::BadTopology));
    assert!(e.machine(ChannelId(0)).is_none());
    assert_eq!(e.link(ChannelId(0)), LinkState::default());
    assert_refused(&mut e, &call);
    // A chunk the FIFO cannot pipeline.
    let mut e = engine(0);
    let plan = call.plan(2, 1, 128).unwrap();
    let err = e
        .start(0, &call, &plan, g(), |_| InOrderRing { ranks: 2 })
        .unwrap_err();
    assert!(matches!(
        err,
        EngineError::Machine {
            source: Error::ChunkTooLargeForFifo { .. },
            ..
        }
    ));
    let text = err.to_string();
    assert!(text.starts_with("channel 0 (Machine::new): "), "{text}");
    assert_refused(&mut e, &call);
}

/// A refused start leaves the engine idle, unpoisoned, its sequence
/// number unused: the right call then runs.
fn assert_refused(e: &mut One, call: &Call) {
    assert_eq!(e.failure(), None);
    assert!(e.is_idle());
    assert_eq!(e.seq(), 0);
    let plan = call.plan(1, 1, 16).unwrap();
    let desc = e
        .start(0, call, &plan, g(), |_| InOrderRing { ranks: 1 })
        .unwrap();
    assert_eq!(desc.seq, 0);
    assert!(run_alone(e) > 0);
    assert!(e.is_idle());
    assert_eq!(e.seq(), 1);
}

// ---- events no correct peer sends ---------------------------------------

#[test]
fn impossible_events_on_a_channel_without_a_machine_poison() {
    let desc = |seq| Call::all_reduce(4, DataType::I32, ReduceOp::Sum).desc(seq);
    let header = |step, seq| Event::Header {
        step,
        desc: desc(seq),
    };
    let cases: [(&[Event], &str, ProtocolViolation); 6] = [
        (&[Event::Tail(9)], "handle_tail", ProtocolViolation::Overrun),
        (
            &[Event::Tail(8), Event::Tail(7)],
            "handle_tail",
            ProtocolViolation::TailBackwards,
        ),
        (
            &[Event::Head(0), Event::Head(1)],
            "handle_head",
            ProtocolViolation::HeadAhead,
        ),
        (
            &[header(0, 1), header(0, 2)],
            "handle_header",
            ProtocolViolation::UnexpectedHeader,
        ),
        (
            &[header(1, 0)],
            "handle_header",
            ProtocolViolation::UnexpectedHeader,
        ),
        (
            &[header(0, 0), header(0, 0)],
            "handle_header",
            ProtocolViolation::UnexpectedHeader,
        ),
    ];
    for (events, during, v) in cases {
        let mut e = engine(1);
        let (last, ok) = events.split_last().unwrap();
        for &ev in ok {
            e.handle(0, ChannelId(2), ev).unwrap();
        }
        let err = e.handle(0, ChannelId(2), *last).unwrap_err();
        assert_eq!(
            err,
            machine_err(2, during, Error::Protocol(v)),
            "{events:?}"
        );
        assert_poisoned(&mut e, err);
    }
    let mut e = engine(1);
    let err = e.handle(0, ChannelId(0), Event::ExecDone).unwrap_err();
    assert_eq!(
        err,
        machine_err(0, "handle_exec_done", Error::NoExecPending)
    );
    // An early header and data are kept for the call they belong to.
    let mut e = engine(1);
    e.handle(0, ChannelId(1), header(0, 0)).unwrap();
    e.handle(0, ChannelId(1), Event::Tail(2)).unwrap();
    let link = e.link(ChannelId(1));
    assert_eq!((link.recv_tail, link.early_header), (2, Some((0, desc(0)))));
}

#[test]
fn impossible_counters_on_a_running_channel_poison() {
    let call = Call::all_reduce(4, DataType::I32, ReduceOp::Sum);
    let mut e = engine(1);
    start(&mut e, 0, &call, 2, 1).unwrap();
    let c = ChannelId(0);
    let Some((_, Action::Exec(x))) = e.poll().unwrap() else {
        panic!("step 0 sends");
    };
    assert_eq!(x.header, Some(call.desc(0)));
    e.handle(1, c, Event::ExecDone).unwrap();
    // A head already known (a counter read twice) is ignored.
    e.handle(2, c, Event::Head(0)).unwrap();
    e.handle(2, c, Event::Head(1)).unwrap();
    e.handle(2, c, Event::Head(1)).unwrap();
    assert_eq!(e.link(c).send_head, 1);
    let err = e.handle(3, c, Event::Head(2)).unwrap_err();
    assert_eq!(
        err,
        machine_err(
            0,
            "handle_head",
            Error::Protocol(ProtocolViolation::HeadAhead)
        )
    );
    assert_eq!(e.blocked_on(c), Blocked::Failed);
    assert_poisoned(&mut e, err);

    let mut e = engine(1);
    start(&mut e, 0, &call, 2, 1).unwrap();
    let err = e.handle(0, c, Event::Tail(9)).unwrap_err();
    assert_eq!(
        err,
        machine_err(
            0,
            "handle_tail",
            Error::Protocol(ProtocolViolation::Overrun)
        )
    );
    let mut e = engine(1);
    start(&mut e, 0, &call, 2, 1).unwrap();
    let err = e.handle(0, c, Event::ExecDone).unwrap_err();
    assert_eq!(
        err,
        machine_err(0, "handle_exec_done", Error::NoExecPending)
    );
    let mut e = engine(1);
    start(&mut e, 0, &call, 2, 1).unwrap();
    e.handle(0, c, Event::Tail(1)).unwrap();
    let _ = e.poll().unwrap();
    e.handle(0, c, Event::ExecDone).unwrap();
    // Data without the call header.
    let err = e.poll().unwrap_err();
    assert_eq!(
        err,
        machine_err(
            0,
            "poll_action",
            Error::Protocol(ProtocolViolation::MissingHeader)
        )
    );
    assert_poisoned(&mut e, err);
}

#[test]
fn a_finished_channel_that_fails_between_calls_says_so() {
    // After a call, an impossible event for the next one fails the
    // finished machine it reaches: the channel, no longer part of a call,
    // reports `Failed`, not `Done`.
    let call = Call::all_reduce(64, DataType::I32, ReduceOp::Sum);
    let mut e = engine(0);
    start(&mut e, 0, &call, 1, 2).unwrap();
    assert!(run_alone(&mut e) > 0);
    let c = ChannelId(1);
    assert_eq!(e.blocked_on(c), Blocked::Done);
    let err = e.handle(1, c, Event::Tail(u64::MAX)).unwrap_err();
    assert_eq!(
        err,
        machine_err(
            1,
            "handle_tail",
            Error::Protocol(ProtocolViolation::Overrun)
        )
    );
    assert_eq!(e.blocked_on(c), Blocked::Failed);
    assert_eq!(e.blocked_on(ChannelId(0)), Blocked::Done);
    assert_poisoned(&mut e, err);
}

#[test]
fn an_event_with_its_first_poll_counts_as_progress() {
    // `handle_poll` is `handle` then `poll_channel`: the event moves the
    // deadline, and the poll hands out the channel's next action.
    let call = Call::all_reduce(64, DataType::I32, ReduceOp::Sum);
    let mut e = engine(0);
    start(&mut e, 0, &call, 1, 1).unwrap();
    let c = ChannelId(0);
    assert_eq!(e.poll_timeout(), Some(TIMEOUT));
    assert_eq!(e.poll_channel(c), Ok(Some(Next::Exec)));
    let mut now = 0;
    let mut execs = 1;
    loop {
        now += 700;
        match e.handle_poll(now, c, Event::ExecDone) {
            Ok(Some(Next::Exec)) => execs += 1,
            Ok(Some(Next::Done)) => break,
            other => panic!("a one-rank call does not {other:?}"),
        }
        // Past the first deadline, not past the one the event moved.
        assert_eq!(e.poll_timeout(), Some(now + TIMEOUT));
        assert_eq!(e.handle_timeout(now + TIMEOUT - 1), Ok(()));
    }
    assert!(execs > 1);
    assert!(e.is_idle());
    // Idle: an event on a channel outside any running call has nothing
    // to poll; one on a channel the storage lacks is refused.
    assert_eq!(e.handle_poll(now, c, Event::Tail(0)), Ok(None));
    assert_eq!(
        e.handle_poll(now, ChannelId(9), Event::Tail(1)),
        Err(EngineError::BadChannel {
            channel: 9,
            capacity: CAP as u32
        })
    );
}

#[test]
fn drive_runs_an_events_loop_in_one_call() {
    // `drive` is the event (and credit) with every poll after it until
    // the channel waits: on one rank, each `ExecDone` ends in the next
    // exec, the last in `Done`; the deadline moves with each event; a
    // poll with no event moves it not.
    let call = Call::all_reduce(64, DataType::I32, ReduceOp::Sum);
    let mut e = engine(0);
    start(&mut e, 0, &call, 1, 1).unwrap();
    let c = ChannelId(0);
    let first = e.drive(0, c, None, None).unwrap();
    assert_eq!(
        first,
        Driven {
            credit: None,
            then: Drove::Exec
        }
    );
    assert!(e.pending(c).is_some());
    // The exec outstanding, nothing more without an event.
    let again = e.drive(50, c, None, None).unwrap();
    assert_eq!(again.then, Drove::Wait { credit: false });
    assert_eq!(e.poll_timeout(), Some(TIMEOUT), "no event, no progress");
    let (mut now, mut execs) = (0, 1);
    loop {
        now += 700;
        let d = e.drive(now, c, None, Some(Event::ExecDone)).unwrap();
        assert_eq!(d.credit, None, "one rank returns no credit");
        match d.then {
            Drove::Exec => execs += 1,
            Drove::Done => break,
            other => panic!("a one-rank call does not {other:?}"),
        }
        assert_eq!(e.poll_timeout(), Some(now + TIMEOUT));
    }
    assert!(execs > 1);
    assert!(e.is_idle());
    // Idle: an event on a channel outside any running call only moves
    // its counters; a channel the storage lacks is refused.
    let idle = e.drive(now, c, Some(0), Some(Event::Tail(0))).unwrap();
    assert_eq!(idle.then, Drove::Wait { credit: false });
    assert_eq!(
        e.drive(now, ChannelId(9), None, Some(Event::Tail(1))),
        Err(EngineError::BadChannel {
            channel: 9,
            capacity: CAP as u32
        })
    );
    // A poisoned engine refuses before anything.
    e.abort();
    assert_eq!(e.drive(now, c, None, None), Err(EngineError::Poisoned));
    // On a channel no call has used yet, a credit is checked as `handle`
    // checks it: none can be due before this rank sent anything.
    let mut fresh = engine(0);
    assert!(matches!(
        fresh.drive(0, ChannelId(1), Some(3), None),
        Err(EngineError::Machine {
            during: "handle_head",
            source: Error::Protocol(ProtocolViolation::HeadAhead),
            ..
        })
    ));
}

// ---- calls over different channel counts -------------------------------

fn empty(seq: u64) -> CallDesc {
    Call::all_reduce(0, DataType::I8, ReduceOp::Sum).desc(seq)
}

/// Rank 0 of an empty 2-rank AllReduce, played by hand: its header and
/// both its slices (FIFO steps `step`, `step + 1`) on channel `c`.
fn peer_sends(e: &mut One, c: u8, seq: u64, step: u64) -> Result<(), EngineError> {
    let c = ChannelId(c);
    e.handle(
        0,
        c,
        Event::Header {
            step,
            desc: empty(seq),
        },
    )?;
    e.handle(0, c, Event::Tail(step + 2))
}

/// Runs rank 1 until it waits; every exec completes at once, the
/// credit for its sends is kept in `held`.
fn drain(e: &mut One, held: &mut Vec<(ChannelId, u64)>) {
    for _ in 0..1000 {
        let Some((c, a)) = e.poll().unwrap() else {
            return;
        };
        if let Action::Exec(x) = a {
            e.handle(0, c, Event::ExecDone).unwrap();
            if let Some(s) = x.send {
                held.push((c, s.end()));
            }
        }
    }
    panic!("actions without end");
}

fn release(e: &mut One, held: &mut Vec<(ChannelId, u64)>) {
    for (c, h) in held.drain(..) {
        e.handle(0, c, Event::Head(h)).unwrap();
    }
}

fn start_empty(e: &mut One, channels: u32) {
    let call = Call::all_reduce(0, DataType::I8, ReduceOp::Sum);
    start(e, 0, &call, 2, channels).unwrap();
}

/// Found by `calls_may_use_different_channel_counts`: when a call leaves
/// out a channel, a faster predecessor's header for the next call on it
/// was refused — `UnexpectedHeader` on a channel never used (compared
/// with the running call's sequence number), `MismatchedCall` on one an
/// earlier call used (compared by that call's finished machine).
#[test]
fn a_call_may_leave_out_channels_and_the_next_may_use_them_again() {
    let mut e = engine(1);
    let mut held = Vec::new();
    // Call 0 on one channel; rank 1 waits for its last credit when its
    // predecessor, done, starts call 1 on two channels.
    start_empty(&mut e, 1);
    peer_sends(&mut e, 0, 0, 0).unwrap();
    drain(&mut e, &mut held);
    assert_eq!(
        e.blocked_on(ChannelId(0)),
        Blocked::Credit { head: 0, need: 2 }
    );
    peer_sends(&mut e, 0, 1, 2).unwrap();
    peer_sends(&mut e, 1, 1, 0).expect("call 1's header on a channel call 0 leaves out");
    release(&mut e, &mut held);
    drain(&mut e, &mut held);
    assert!(e.is_idle());
    // Call 1 on both: the early headers open it.
    start_empty(&mut e, 2);
    drain(&mut e, &mut held);
    release(&mut e, &mut held);
    drain(&mut e, &mut held);
    assert_eq!((e.is_idle(), e.seq()), (true, 2));
    // Calls 2 and 3 on one channel again; call 4's header on the other
    // arrives while rank 1 finishes call 3: all that channel has is call
    // 1's finished machine, three calls back.
    start_empty(&mut e, 1);
    peer_sends(&mut e, 0, 2, 4).unwrap();
    drain(&mut e, &mut held);
    release(&mut e, &mut held);
    drain(&mut e, &mut held);
    start_empty(&mut e, 1);
    peer_sends(&mut e, 0, 3, 6).unwrap();
    drain(&mut e, &mut held);
    peer_sends(&mut e, 0, 4, 8).unwrap();
    peer_sends(&mut e, 1, 4, 2).expect("call 4's header after calls that leave the channel out");
    release(&mut e, &mut held);
    drain(&mut e, &mut held);
    start_empty(&mut e, 2);
    drain(&mut e, &mut held);
    release(&mut e, &mut held);
    drain(&mut e, &mut held);
    assert_eq!((e.is_idle(), e.seq(), e.failure()), (true, 5, None));
    let l = e.link(ChannelId(1));
    assert_eq!(
        (l.recv_next, l.recv_tail, l.send_next, l.send_head),
        (4, 4, 4, 4)
    );
    assert_eq!(e.link(ChannelId(0)).recv_next, 10);
    // A header for a call that (on this rank) leaves the channel out is
    // kept, and refused by the next call that uses the channel.
    start_empty(&mut e, 1);
    peer_sends(&mut e, 1, 5, 4).unwrap();
    peer_sends(&mut e, 0, 5, 10).unwrap();
    drain(&mut e, &mut held);
    release(&mut e, &mut held);
    drain(&mut e, &mut held);
    let call = Call::all_reduce(0, DataType::I8, ReduceOp::Sum);
    let err = start(&mut e, 0, &call, 2, 2).unwrap_err();
    let mismatch = Error::MismatchedCall {
        expected: empty(6),
        got: empty(5),
    };
    assert_eq!(err, machine_err(1, "Machine::new", mismatch));
}

/// On a channel no call has used yet, a header may come for the next
/// call or any later one, never for the running one.
#[test]
fn an_unused_channel_takes_headers_of_later_calls_only() {
    let mut e = engine(1);
    start_empty(&mut e, 1);
    peer_sends(&mut e, 1, 3, 0).expect("a later call's header");
    assert_eq!(e.link(ChannelId(1)).early_header, Some((0, empty(3))));
    let err = peer_sends(&mut e, 2, 0, 0).unwrap_err();
    assert_eq!(
        err,
        machine_err(
            2,
            "handle_header",
            Error::Protocol(ProtocolViolation::UnexpectedHeader)
        )
    );
    // Idle after a call: that call's header is late, not early.
    let mut e = engine(0);
    start(&mut e, 0, &Call::all_gather(4, DataType::U8), 1, 1).unwrap();
    run_alone(&mut e);
    let err = e
        .handle(
            0,
            ChannelId(1),
            Event::Header {
                step: 0,
                desc: Call::all_gather(4, DataType::U8).desc(0),
            },
        )
        .unwrap_err();
    assert_eq!(
        err,
        machine_err(
            1,
            "handle_header",
            Error::Protocol(ProtocolViolation::UnexpectedHeader)
        )
    );
}
