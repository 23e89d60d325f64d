//! The state machine refuses impossible event sequences with typed errors
//! and never panics.

use ringcc_core::fifo::FifoGeometry;
use ringcc_core::prim::{check_start, Action, Blocked, LinkState, Machine};
use ringcc_core::{
    CallDesc, ChannelId, Collective, DataType, Error, InOrderRing, Plan, ProtocolViolation, Rank,
    ReduceOp,
};

const N: u32 = 4;

fn call(seq: u64, count: u64) -> CallDesc {
    CallDesc::new(
        seq,
        Collective::AllReduce,
        count,
        DataType::F32,
        ReduceOp::Sum,
    )
}

fn machine_with(seq: u64, count: u64, link: LinkState) -> Result<Machine<InOrderRing>, Error> {
    let plan = Plan::new(Collective::AllReduce, count, DataType::F32, N, 1, 64)?;
    let steps = plan.steps(ChannelId(0), Rank(1), InOrderRing { ranks: N })?;
    Machine::new(call(seq, count), steps, FifoGeometry::new(32, 1)?, link)
}

fn machine() -> Machine<InOrderRing> {
    machine_with(0, 64, LinkState::default()).unwrap()
}

fn exec(m: &mut Machine<InOrderRing>) -> ringcc_core::Exec {
    match m.poll_action().unwrap() {
        Some(Action::Exec(e)) => e,
        other => panic!("expected an exec, got {other:?}"),
    }
}

/// Runs `m` to its end against an eager peer — the call header `desc`
/// first, then data one step at a time, every send credited at once —
/// handing each credit, with what `receives_ahead` said then, to
/// `on_credit`: whether the machine finished.
fn run_eager(
    m: &mut Machine<InOrderRing>,
    desc: CallDesc,
    mut on_credit: impl FnMut(u64, bool),
) -> bool {
    let mut tail = 0;
    let mut header_given = false;
    for _ in 0..10_000 {
        match m.poll_action().unwrap() {
            Some(Action::Exec(e)) => {
                m.handle_exec_done().unwrap();
                if let Some(s) = e.send {
                    m.handle_head(s.end()).unwrap();
                }
            }
            Some(Action::ReturnCredit { head }) => on_credit(head, m.receives_ahead()),
            Some(Action::Done) => return true,
            None => {
                if !header_given {
                    m.handle_header(0, desc).unwrap();
                    header_given = true;
                }
                tail += 1;
                m.handle_tail(tail).unwrap();
            }
        }
    }
    false
}

#[test]
fn first_send_carries_the_header_and_later_ones_do_not() {
    let mut m = machine();
    let e = exec(&mut m);
    assert_eq!(e.header, Some(call(0, 64)));
    assert_eq!(e.send.unwrap().step, 0);
    m.handle_exec_done().unwrap();
    let e = exec(&mut m);
    assert_eq!(e.header, None);
    assert_eq!(e.send.unwrap().step, 1);
}

#[test]
fn waits_for_data_and_credit() {
    let mut m = machine();
    // Step 0 sends 2 slices (64 B chunk / 32 B slice); then step 1 needs
    // data: nothing to do.
    for _ in 0..2 {
        let _ = exec(&mut m);
        m.handle_exec_done().unwrap();
    }
    assert_eq!(m.poll_action().unwrap(), None);
    m.handle_header(0, call(0, 64)).unwrap();
    m.handle_tail(1).unwrap();
    let e = exec(&mut m);
    assert_eq!(e.recv.unwrap().step, 0);
    assert_eq!(e.send.unwrap().step, 2);
}

/// The machine stores no copy of its outstanding exec: `pending` rebuilds
/// it, and must give exactly what `poll_action` handed out, slice after
/// slice, until it is done.
#[test]
fn pending_is_the_exec_last_emitted() {
    let mut m = machine();
    assert_eq!(m.pending(), None);
    let mut seen = 0;
    for round in 1..=20u64 {
        while let Some(a) = m.poll_action().unwrap() {
            match a {
                Action::Exec(e) => {
                    assert!(m.is_busy());
                    assert_eq!(m.pending(), Some(e));
                    // Waiting on data or credit does not change it.
                    assert_eq!(m.poll_action().unwrap(), None);
                    assert_eq!(m.pending(), Some(e));
                    m.handle_exec_done().unwrap();
                    assert!(!m.is_busy());
                    assert_eq!(m.pending(), None);
                    seen += 1;
                }
                Action::ReturnCredit { .. } => assert_eq!(m.pending(), None),
                Action::Done => {}
            }
        }
        if round == 1 {
            m.handle_header(0, call(0, 64)).unwrap();
        }
        // The predecessor posts one more slot per round (12 in all).
        m.handle_tail(round.min(12)).unwrap();
        let sent = m.send_next();
        m.handle_head(sent).unwrap();
    }
    // 7 steps of 2 slices (64 B chunks, 32 B slices).
    assert_eq!(seen, 14);
    assert!(m.is_done());
}

/// A failed machine answers every poll with the error it failed with.
#[test]
fn failure_is_kept() {
    let mut m = machine();
    let err = m.handle_tail(100).unwrap_err();
    assert_eq!(err, Error::Protocol(ProtocolViolation::Overrun));
    assert_eq!(m.error(), Some(err));
    assert_eq!(m.poll_action(), Err(err));
    assert_eq!(m.poll_action(), Err(err));
    assert_eq!(m.handle_head(0), Err(Error::Finished));
}

#[test]
fn mismatched_header_is_a_typed_error() {
    let mut m = machine();
    let err = m.handle_header(0, call(0, 65)).unwrap_err();
    assert_eq!(
        err,
        Error::MismatchedCall {
            expected: call(0, 64),
            got: call(0, 65)
        }
    );
    assert!(m.poll_action().is_err());
    assert_eq!(m.handle_tail(1), Err(Error::Finished));
    // An earlier call's header is a sequence mismatch.
    let mut m = machine_with(3, 64, LinkState::default()).unwrap();
    assert!(matches!(
        m.handle_header(0, call(1, 64)),
        Err(Error::MismatchedCall { .. })
    ));
    // A later call's is kept (the calls in between may leave the channel
    // out, or not send on it), by the next machines too, until the call it
    // names checks it.
    let mut m = machine();
    m.handle_header(0, call(5, 64)).unwrap();
    assert_eq!(m.link().early_header, Some((0, call(5, 64))));
    let next = machine_with(1, 64, m.link()).unwrap();
    assert_eq!(next.link().early_header, Some((0, call(5, 64))));
    assert!(matches!(
        machine_with(5, 32, m.link()),
        Err(Error::MismatchedCall { .. })
    ));
    assert!(machine_with(5, 64, m.link()).is_ok());
    assert!(matches!(
        machine_with(6, 64, m.link()),
        Err(Error::MismatchedCall { .. })
    ));
    // Only one later header, and only where this call's data ends.
    let mut m = machine();
    m.handle_header(0, call(1, 64)).unwrap();
    assert_eq!(
        m.handle_header(0, call(2, 64)),
        Err(Error::Protocol(ProtocolViolation::UnexpectedHeader))
    );
    let mut m = machine();
    assert_eq!(
        m.handle_header(3, call(1, 64)),
        Err(Error::Protocol(ProtocolViolation::UnexpectedHeader))
    );
}

#[test]
fn data_without_header_is_a_protocol_error() {
    let mut m = machine();
    for _ in 0..2 {
        let _ = exec(&mut m);
        m.handle_exec_done().unwrap();
    }
    m.handle_tail(1).unwrap();
    assert_eq!(
        m.poll_action(),
        Err(Error::Protocol(ProtocolViolation::MissingHeader))
    );
}

#[test]
fn counters_that_no_correct_peer_produces() {
    let mut m = machine();
    m.handle_tail(3).unwrap();
    assert_eq!(
        m.handle_tail(2),
        Err(Error::Protocol(ProtocolViolation::TailBackwards))
    );
    let mut m = machine();
    assert_eq!(
        m.handle_tail(9),
        Err(Error::Protocol(ProtocolViolation::Overrun))
    );
    let mut m = machine();
    assert_eq!(
        m.handle_head(1),
        Err(Error::Protocol(ProtocolViolation::HeadAhead))
    );
    let mut m = machine();
    let _ = exec(&mut m);
    m.handle_exec_done().unwrap();
    m.handle_head(1).unwrap();
    assert_eq!(
        m.handle_head(0),
        Err(Error::Protocol(ProtocolViolation::HeadBackwards))
    );
    let mut m = machine();
    assert_eq!(m.handle_exec_done(), Err(Error::NoExecPending));
    let mut m = machine();
    m.handle_header(0, call(0, 64)).unwrap();
    assert_eq!(
        m.handle_header(0, call(0, 64)),
        Err(Error::Protocol(ProtocolViolation::UnexpectedHeader))
    );
}

#[test]
fn next_calls_header_may_arrive_early_and_is_carried_over() {
    let mut m = machine_with(7, 0, LinkState::default()).unwrap();
    // Run the whole (empty) collective with an eager peer.
    assert!(run_eager(&mut m, call(7, 0), |_, _| {}));
    let link = m.link();
    // The predecessor starts call 8 right away.
    m.handle_header(link.recv_next, call(8, 64)).unwrap();
    let link = m.link();
    assert_eq!(link.early_header, Some((link.recv_next, call(8, 64))));
    // The next machine validates it: a matching call starts fine…
    assert!(machine_with(8, 64, link).is_ok());
    // …a different one is a mismatch at construction.
    assert!(matches!(
        machine_with(8, 32, link),
        Err(Error::MismatchedCall { .. })
    ));
}

#[test]
fn chunk_must_leave_a_slice_free() {
    let plan = Plan::new(Collective::AllReduce, 64, DataType::F32, N, 1, 256).unwrap();
    let steps = plan
        .steps(ChannelId(0), Rank(0), InOrderRing { ranks: N })
        .unwrap();
    // 8 slots of 32 B; 256 B chunks would take all 8 slices.
    let err = Machine::new(
        call(0, 64),
        steps,
        FifoGeometry::new(32, 1).unwrap(),
        LinkState::default(),
    )
    .unwrap_err();
    assert_eq!(
        err,
        Error::ChunkTooLargeForFifo {
            chunk_bytes: 256,
            fifo_bytes: 256
        }
    );
    let steps = plan
        .steps(ChannelId(0), Rank(0), InOrderRing { ranks: N })
        .unwrap();
    let err = Machine::new(
        call(0, 65),
        steps,
        FifoGeometry::new(32, 1).unwrap(),
        LinkState::default(),
    )
    .unwrap_err();
    assert_eq!(err, Error::PlanMismatch);
    // The same checks without a machine (a device loop's host side).
    let small = FifoGeometry::new(32, 1).unwrap();
    assert_eq!(
        check_start(&call(0, 64), &plan, small),
        Err(Error::ChunkTooLargeForFifo {
            chunk_bytes: 256,
            fifo_bytes: 256
        })
    );
    assert_eq!(
        check_start(&call(0, 65), &plan, small),
        Err(Error::PlanMismatch)
    );
    assert_eq!(
        check_start(&call(0, 64), &plan, FifoGeometry::new(64, 1).unwrap()),
        Ok(())
    );
}

/// A call header is accepted once, at the step the connection is at: a
/// second one, or one at another step, is a protocol error — for this
/// call's header and for the next call's, which may come early.
#[test]
fn a_header_twice_or_at_the_wrong_step_is_refused() {
    let unexpected = Err(Error::Protocol(ProtocolViolation::UnexpectedHeader));
    // This call's header at a step the connection is not at.
    let mut m = machine();
    assert_eq!(m.handle_header(1, call(0, 64)), unexpected);
    // The next call's header: once, at the step after this call's.
    let mut m = machine();
    let at = m.link().recv_next;
    assert_eq!(m.handle_header(at + 1, call(1, 64)), unexpected);
    let mut m = machine();
    m.handle_header(at, call(1, 64)).unwrap();
    assert_eq!(m.handle_header(at, call(1, 64)), unexpected);
    // A refused header poisons the machine.
    assert!(m.poll_action().is_err());
}

/// The credit for a slice may overtake the slice's own completion (a send
/// completion and the peer's credit come on different queues): accepted up
/// to the end of the slice in flight, and no further; the machine is not
/// done before its exec is.
#[test]
fn credit_may_overtake_the_completion_of_the_slice_it_covers() {
    let mut m = machine();
    let e = exec(&mut m);
    assert_eq!(e.send.unwrap().end(), 1);
    m.handle_head(1).unwrap();
    assert_eq!(m.poll_action(), Ok(None), "its slice is still outstanding");
    m.handle_exec_done().unwrap();
    let e = exec(&mut m);
    assert_eq!(e.send.unwrap().end(), 2);
    assert_eq!(
        m.handle_head(3),
        Err(Error::Protocol(ProtocolViolation::HeadAhead))
    );
    // Without a send in flight, nothing beyond what was posted.
    let mut m = machine();
    let _ = exec(&mut m);
    m.handle_exec_done().unwrap();
    assert_eq!(
        m.handle_head(2),
        Err(Error::Protocol(ProtocolViolation::HeadAhead))
    );
}

/// The primitives print as NCCL names them; any other combination is
/// "invalid".
#[test]
fn primitive_names_are_nccls() {
    use ringcc_core::Primitive as P;
    let names = [
        (P::SEND_ONLY, "send"),
        (P::RECV_REDUCE_SEND, "recvReduceSend"),
        (P::RECV_REDUCE_COPY_SEND, "recvReduceCopySend"),
        (P::RECV_COPY_SEND, "recvCopySend"),
        (P::RECV_ONLY, "recv"),
        (P::COPY_SEND, "copySend"),
        (P::RECV_REDUCE_COPY, "recvReduceCopy"),
        (P::COPY_ONLY, "copy"),
        (P::RECV, "invalid"),
        (P::REDUCE | P::SEND, "invalid"),
    ];
    for (p, name) in names {
        assert_eq!(p.name(), name);
        assert_eq!(p.to_string(), name);
    }
}

/// `receives_ahead` at each credit: true while the call will receive
/// again, false at its last credit only (a transport that holds credit
/// back while it is true never holds the call's last one).
#[test]
fn only_the_calls_last_credit_has_no_receives_ahead() {
    for count in [0u64, 1, 64, 200, 1000] {
        let mut m = machine_with(3, count, LinkState::default()).unwrap();
        let mut credits = Vec::new();
        let done = run_eager(&mut m, call(3, count), |head, ahead| {
            credits.push((head, ahead))
        });
        assert!(done, "count {count}");
        let (last, ahead) = credits.pop().expect("rank 1 receives");
        assert!(!ahead, "count {count}: the last credit ({last})");
        assert_eq!(last, m.link().recv_next);
        assert!(
            credits.iter().all(|&(_, ahead)| ahead),
            "count {count}: {credits:?}"
        );
        assert!(!m.receives_ahead());
    }
}

/// Rank `rank`'s machine for a 2-rank Broadcast of 16 floats from rank 0
/// (two 32-byte slices), starting from `link`, and the call's header.
fn broadcast_machine(rank: u32, link: LinkState) -> (Machine<InOrderRing>, CallDesc) {
    let bcast = ringcc_core::Call::broadcast(16, DataType::F32, Rank(0));
    let plan = bcast.plan(2, 1, 64).unwrap();
    let steps = plan
        .steps(ChannelId(0), Rank(rank), InOrderRing { ranks: 2 })
        .unwrap();
    let desc = bcast.desc(0);
    let geometry = FifoGeometry::new(32, 1).unwrap();
    (Machine::new(desc, steps, geometry, link).unwrap(), desc)
}

#[test]
fn a_receive_only_step_with_its_data_in_is_ready() {
    // The last rank of a 2-rank Broadcast only receives: once its data is
    // in, it waits for nothing — not for credit, though its send window is
    // full of an earlier call's slices not yet consumed.
    let full = LinkState {
        send_next: ringcc_core::fifo::STEPS,
        ..LinkState::default()
    };
    let (mut m, desc) = broadcast_machine(1, full);
    assert_eq!(m.poll_action().unwrap(), None);
    assert_eq!(m.blocked_on(), Blocked::Data { tail: 0, need: 1 });
    m.handle_header(0, desc).unwrap();
    m.handle_tail(1).unwrap();
    assert_eq!(m.blocked_on(), Blocked::Ready);
    assert!(!m.waits_for_credit());
    let e = exec(&mut m);
    assert_eq!((e.recv.map(|r| r.step), e.send), (Some(0), None));
}

#[test]
fn with_its_last_credit_in_a_finished_sender_waits_no_more() {
    // The root of a 2-rank Broadcast sends its slices, then waits for the
    // credit that says they were consumed; once it is in, it waits for
    // nothing, and its next poll ends the call.
    let (mut m, _) = broadcast_machine(0, LinkState::default());
    let mut sent = 0;
    while let Some(Action::Exec(e)) = m.poll_action().unwrap() {
        sent = e.send.expect("the root only sends").end();
        m.handle_exec_done().unwrap();
    }
    assert_eq!(sent, 2);
    assert!(m.waits_for_credit());
    assert_eq!(m.blocked_on(), Blocked::Credit { head: 0, need: 2 });
    m.handle_head(sent).unwrap();
    assert!(!m.waits_for_credit());
    assert_eq!(m.blocked_on(), Blocked::Ready);
    assert_eq!(m.poll_action().unwrap(), Some(Action::Done));
}
