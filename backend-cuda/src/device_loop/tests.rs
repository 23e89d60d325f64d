//! The host side of the device loop without a GPU: the checks before a
//! launch, the statuses' errors, the launch arguments, and the call state
//! (sequence numbers, poisoning) through a recording launcher.

use std::time::Duration;

use ringcc_core::fifo::FifoGeometry;
use ringcc_core::{Call, ChannelId, DataType, Rank, ReduceOp};

use super::abi::{self, RcStatus};
use super::*;
use crate::config::Config;
use crate::state::CommState;

fn layout(n: usize) -> Layout {
    Layout::new(vec![0; n], 2, FifoGeometry::new(64, 2).unwrap(), |_, _| {
        true
    })
    .unwrap()
}

const AR: Call = Call::all_reduce(100, DataType::F32, ReduceOp::Sum);

#[test]
fn mismatched_calls_are_the_cores_error_before_anything_launches() {
    let l = layout(3);
    let mut calls = [AR; 3];
    calls[1] = Call::all_reduce(100, DataType::F32, ReduceOp::Max);
    let plans: Vec<Plan> = calls.iter().map(|c| c.plan(3, 2, 256).unwrap()).collect();
    match check_calls(&l, &calls, &plans, 7) {
        Err(Error::Core {
            channel: Some(ChannelId(0)),
            source: ringcc_core::Error::MismatchedCall { expected, got },
            ..
        }) => {
            // Rank 1 is the first whose predecessor's call differs.
            assert_eq!(expected, calls[1].desc(7));
            assert_eq!(got, AR.desc(7));
        }
        other => panic!("expected MismatchedCall, got {other:?}"),
    }
    let plans: Vec<Plan> = [AR; 3].iter().map(|c| c.plan(3, 2, 256).unwrap()).collect();
    check_calls(&l, &[AR; 3], &plans, 7).unwrap();
}

#[test]
fn a_chunk_too_large_for_the_fifo_is_refused_as_the_engine_does() {
    let l = layout(2);
    let call = Call::all_reduce(1 << 16, DataType::F32, ReduceOp::Sum);
    let plans: Vec<Plan> = [call; 2]
        .iter()
        .map(|c| c.plan(2, 2, 1 << 20).unwrap())
        .collect();
    assert!(matches!(
        check_calls(&l, &[call; 2], &plans, 0),
        Err(Error::Core {
            channel: Some(ChannelId(0)),
            source: ringcc_core::Error::ChunkTooLargeForFifo { .. },
            ..
        })
    ));
    assert!(matches!(
        check_calls(&l, &[call], &plans[..1], 0),
        Err(Error::RankCount { .. })
    ));
}

fn status(code: u64, waiting: u64) -> RcStatus {
    RcStatus {
        code,
        seq: 4,
        waiting,
        seen: 6,
        need: 8,
        ..RcStatus::default()
    }
}

#[test]
fn statuses_report_the_worst_failure_first() {
    let t = Duration::from_millis(300);
    let ok = [
        (Rank(0), ChannelId(0), status(abi::STATUS_DONE, 0)),
        (Rank(1), ChannelId(0), status(abi::STATUS_IDLE, 0)),
    ];
    assert!(status_error(ok, t).is_none());
    let e = status_error(
        [
            (Rank(0), ChannelId(0), status(abi::STATUS_PEER_FAILED, 1)),
            (
                Rank(2),
                ChannelId(1),
                status(abi::STATUS_TIMEOUT, abi::WAIT_DATA),
            ),
            (
                Rank(3),
                ChannelId(0),
                status(abi::STATUS_TIMEOUT, abi::WAIT_CREDIT),
            ),
        ],
        t,
    )
    .unwrap();
    match e {
        Error::Timeout { waiting_for, after } => {
            assert_eq!(after, t);
            assert!(
                waiting_for.starts_with("rank 2 call 4: channel 1 (device loop"),
                "{waiting_for}"
            );
            assert!(
                waiting_for.ends_with("waits for data from its predecessor (tail 6, needs 8)"),
                "{waiting_for}"
            );
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
    let finish = status_error(
        [(
            Rank(1),
            ChannelId(0),
            status(abi::STATUS_TIMEOUT, abi::WAIT_FINISH),
        )],
        t,
    )
    .unwrap()
    .to_string();
    assert!(
        finish.contains("credit from its successor (head 6, needs 8) to finish"),
        "{finish}"
    );
    assert!(matches!(
        status_error([(Rank(0), ChannelId(0), status(abi::STATUS_ABORTED, 0))], t),
        Some(Error::Poisoned { .. })
    ));
    assert!(matches!(
        status_error([(Rank(0), ChannelId(0), status(99, 0))], t),
        Some(Error::Poisoned { .. })
    ));
    assert!(matches!(
        status_error(
            [(
                Rank(0),
                ChannelId(0),
                status(abi::STATUS_PROTOCOL, abi::WAIT_DATA)
            )],
            t
        ),
        Some(Error::Core {
            source: ringcc_core::Error::Protocol(ProtocolViolation::Overrun),
            ..
        })
    ));
}

#[test]
fn a_mismatch_status_decodes_both_calls() {
    let own = AR.desc(4);
    let theirs = Call::broadcast(100, DataType::F32, Rank(1)).desc(4);
    let s = RcStatus {
        code: abi::STATUS_MISMATCH,
        seq: 4,
        got_seq: theirs.seq,
        got_count: theirs.count,
        got_desc: abi::pack_desc(&theirs),
        own_count: own.count,
        own_desc: abi::pack_desc(&own),
        ..RcStatus::default()
    };
    match status_error(
        [
            (Rank(0), ChannelId(0), status(abi::STATUS_TIMEOUT, 1)),
            (Rank(1), ChannelId(1), s),
        ],
        Duration::from_secs(1),
    ) {
        Some(Error::Core {
            channel: Some(ChannelId(1)),
            source: ringcc_core::Error::MismatchedCall { expected, got },
            ..
        }) => {
            assert_eq!(expected, own);
            assert_eq!(got, theirs);
        }
        other => panic!("expected MismatchedCall, got {other:?}"),
    }
    // Call words that are no call: a protocol error, not a panic.
    let garbage = RcStatus {
        got_desc: u64::MAX,
        ..s
    };
    assert!(matches!(
        status_error([(Rank(1), ChannelId(0), garbage)], Duration::from_secs(1)),
        Some(Error::Core {
            source: ringcc_core::Error::Protocol(ProtocolViolation::UnexpectedHeader),
            ..
        })
    ));
}

#[test]
fn launch_arguments_follow_the_plan_and_geometry() {
    let g = FifoGeometry::new(64, 2).unwrap();
    let call = Call::reduce(1000, DataType::F16, ReduceOp::Avg, Rank(2));
    let plan = call.plan(4, 3, 256).unwrap();
    let a = loop_args(
        &plan,
        &call,
        9,
        g,
        Rank(1),
        Duration::from_millis(5),
        (0x1000, 0x2000),
        (0x10, 0x20, 0x30),
    );
    assert_eq!((a.input, a.output), (0x1000, 0x2000));
    assert_eq!(
        (a.chans, a.status, a.abort_flag, a.ring),
        (0x10, 0x20, 0x30, 0)
    );
    assert_eq!(
        (a.seq, a.count, a.chunk_elems, a.slice_elems),
        (9, 1000, 128, 64)
    );
    assert_eq!(a.timeout_ns, 5_000_000);
    assert_eq!((a.collective, a.nranks, a.channels), (4, 4, 3));
    assert_eq!((a.ring_index, a.root_index, a.slots_per_slice), (1, 2, 2));
    assert_eq!(abi::unpack_desc(9, 1000, a.desc), Some(call.desc(9)));
    let p = rc_plan(&plan, g, ChannelId(2), Rank(3));
    assert_eq!(
        (p.channel, p.ring_index, p.align_elems, p.elem_bytes),
        (2, 3, 8, 2)
    );
}

/// Records the launches it is asked for.
#[derive(Default)]
struct Recorder {
    launched: Vec<(u64, Vec<Call>)>,
    fail: bool,
}

impl LoopLauncher for Recorder {
    fn launch_loops(&mut self, seq: u64, calls: &[Call], _plans: &[Plan]) -> Result<()> {
        if self.fail {
            return Err(Error::BadConfig { what: "test" });
        }
        self.launched.push((seq, calls.to_vec()));
        Ok(())
    }
}

#[test]
fn the_communicator_state_numbers_calls_and_poisons_on_failure() {
    let config = Config::small(64, 2).unwrap();
    let mut state = CommState::new(layout(2), config).unwrap();
    let mut rec = Recorder::default();
    state.run_loops(&mut rec, &[AR; 2]).unwrap();
    state.run_loops(&mut rec, &[AR; 2]).unwrap();
    assert_eq!(rec.launched.iter().map(|l| l.0).collect::<Vec<_>>(), [0, 1]);
    assert_eq!(state.seq(), 2);
    // Refused before it starts: nothing changes.
    assert!(matches!(
        state.run_loops(&mut rec, &[AR]),
        Err(Error::RankCount { .. })
    ));
    assert!(state.failure().is_none());
    // A mismatch is found before the launch, and poisons.
    let other = Call::all_gather(100, DataType::F32);
    let e = state.run_loops(&mut rec, &[AR, other]).unwrap_err();
    assert!(matches!(e, Error::Core { .. }), "{e:?}");
    assert_eq!(rec.launched.len(), 2);
    assert_eq!(state.failure(), Some(e.to_string().as_str()));
    assert!(matches!(
        state.run_loops(&mut rec, &[AR; 2]),
        Err(Error::Poisoned { .. })
    ));
    // A failed launch poisons too.
    let mut state = CommState::new(layout(2), config).unwrap();
    let mut bad = Recorder {
        fail: true,
        ..Recorder::default()
    };
    assert!(state.run_loops(&mut bad, &[AR; 2]).is_err());
    assert!(state.failure().is_some());
}
