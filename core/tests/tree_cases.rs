//! Tree calls through the engine, case by case: ring and tree calls
//! interleaved on the same engines (one sequence of call numbers, each
//! kind's connections carried over), refusals that leave the engine
//! usable, events no correct peer sends (typed errors that poison), and a
//! stalled tree call's deadline naming the connection it waits on.

use std::collections::HashMap;

use ringcc_core::fifo::{FifoGeometry, STEPS};
use ringcc_core::prim::{slice_result, tree_slice_result, Action, TreeAction, TreeConn};
use ringcc_core::progress::{Channel, EngineError, Event, TreeChannel};
use ringcc_core::tree::{TreePlan, UniformTree};
use ringcc_core::verify::{fill_expected, fill_input};
use ringcc_core::{
    Blocked, Call, ChannelId, DataType, Engine, Error, InOrderRing, Primitive, ProtocolViolation,
    Rank, ReduceOp, TreeOrder,
};

const CAP: usize = 2;
const TIMEOUT: u64 = 1000;
type Eng = Engine<InOrderRing, [Channel<InOrderRing>; CAP], [TreeChannel; CAP]>;

fn g() -> FifoGeometry {
    FifoGeometry::new(16, 1).unwrap()
}

fn engine(r: u32) -> Eng {
    Engine::with_trees(
        Rank(r),
        [Channel::new(), Channel::new()],
        [TreeChannel::new(), TreeChannel::new()],
        TIMEOUT,
    )
}

fn conn_to(t: &UniformTree, from: u32, to: u32) -> TreeConn {
    let p = t.peers(Rank(from)).unwrap();
    if p.up == Some(Rank(to)) {
        return TreeConn::Up;
    }
    TreeConn::Down(p.down.iter().position(|d| *d == Some(Rank(to))).unwrap() as u8)
}

fn peer_on(t: &UniformTree, r: u32, conn: TreeConn) -> u32 {
    let p = t.peers(Rank(r)).unwrap();
    match conn {
        TreeConn::Up => p.up.unwrap().0,
        TreeConn::Down(i) => p.down[i as usize].unwrap().0,
    }
}

/// Ranks driven in turn, every exec carried out at once and every event
/// delivered at once.
struct Sync {
    nodes: u32,
    gpus: u32,
    engines: Vec<Eng>,
    /// (tree?, channel, from, to, step) → data.
    fifo: HashMap<(bool, u8, u32, u32, u64), Vec<u8>>,
}

impl Sync {
    fn new(nodes: u32, gpus: u32) -> Sync {
        Sync {
            nodes,
            gpus,
            engines: (0..nodes * gpus).map(engine).collect(),
            fifo: HashMap::new(),
        }
    }

    fn n(&self) -> u32 {
        self.nodes * self.gpus
    }

    /// Runs `call` on every rank (as a tree call when `tree`) and checks
    /// every output against the reference.
    fn run(&mut self, call: Call, tree: bool, channels: u32, salt: u64) {
        let n = self.n();
        let (nodes, gpus) = (self.nodes, self.gpus);
        let plan = call.plan(n, channels, 16).unwrap();
        let tplan = TreePlan::new(call.count, call.dtype, n, channels, 16).unwrap();
        let es = call.elem();
        let mut inputs = Vec::new();
        let mut outputs = Vec::new();
        for r in 0..n {
            let mut b = vec![0u8; plan.input_len() as usize * es];
            fill_input(&plan, call.op, r, salt, &mut b).unwrap();
            inputs.push(b);
            outputs.push(vec![0u8; plan.output_len() as usize * es]);
            let seq = self.engines[r as usize].seq();
            let e = &mut self.engines[r as usize];
            let desc = if tree {
                e.start_tree(0, &call, &tplan, g(), |c| {
                    UniformTree::for_channel(nodes, gpus, gpus as u16, c)
                })
            } else {
                e.start(0, &call, &plan, g(), |_| InOrderRing { ranks: n })
            }
            .unwrap();
            assert_eq!(desc.seq, seq);
            if tree {
                // Each channel's machine runs over the connections its
                // tree gives this rank: up unless the root, a child's each.
                for c in 0..tplan.channels() {
                    let p = UniformTree::for_channel(nodes, gpus, gpus as u16, ChannelId(c as u8))
                        .peers(Rank(r))
                        .unwrap();
                    let want = (0..p.n_down()).fold(u8::from(p.up.is_some()), |m, i| {
                        m | 1 << TreeConn::Down(i as u8).index()
                    });
                    let m = e.tree_machine(ChannelId(c as u8)).unwrap();
                    assert_eq!(m.present(), want, "rank {r} channel {c}");
                }
            }
        }
        let mut rounds = 0;
        while self.engines.iter().any(|e| !e.is_idle()) {
            rounds += 1;
            assert!(rounds < 100_000, "stuck");
            for r in 0..n {
                if tree {
                    self.poll_tree(r, &call, &inputs, &mut outputs);
                } else {
                    self.poll_ring(r, &call, &inputs, &mut outputs);
                }
            }
        }
        if tree {
            for e in &self.engines {
                for c in 0..tplan.channels() {
                    let m = e.tree_machine(ChannelId(c as u8)).expect("a tree machine");
                    assert!(m.is_done(), "rank {}: a finished tree call", e.rank().0);
                }
            }
        }
        for (r, out) in outputs.iter().enumerate() {
            let mut want = vec![0u8; out.len()];
            if fill_expected(&plan, call.op, r as u32, 0, salt, &mut want).unwrap() {
                assert_eq!(&want, out, "rank {r} (tree: {tree})");
            }
        }
    }

    fn poll_ring(&mut self, r: u32, call: &Call, inputs: &[Vec<u8>], outputs: &mut [Vec<u8>]) {
        let n = self.n();
        let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
        let es = call.elem();
        while let Some((c, a)) = self.engines[r as usize].poll().unwrap() {
            match a {
                Action::Exec(e) => {
                    let len = e.count as usize * es;
                    let inc = e.recv.map(|s| {
                        self.fifo
                            .remove(&(false, c.0, prev, r, s.step))
                            .expect("ring data")
                    });
                    let lo = e.input_offset as usize * es;
                    let local = e
                        .primitive
                        .reads_input()
                        .then(|| &inputs[r as usize][lo..lo + len]);
                    let mut out = vec![0u8; len];
                    slice_result(
                        e.primitive,
                        call.dtype,
                        call.op,
                        n,
                        inc.as_deref(),
                        local,
                        &mut out,
                    )
                    .unwrap();
                    if e.primitive.contains(Primitive::COPY) {
                        let o = e.output_offset as usize * es;
                        outputs[r as usize][o..o + len].copy_from_slice(&out);
                    }
                    if let Some(s) = e.send {
                        self.fifo.insert((false, c.0, r, next, s.step), out);
                        for ev in e.successor_events() {
                            self.engines[next as usize].handle(0, c, ev).unwrap();
                        }
                    }
                    self.engines[r as usize]
                        .handle(0, c, Event::ExecDone)
                        .unwrap();
                }
                Action::ReturnCredit { head } => {
                    self.engines[prev as usize]
                        .handle(0, c, Event::Head(head))
                        .unwrap();
                }
                Action::Done => {}
            }
        }
    }

    fn poll_tree(&mut self, r: u32, call: &Call, inputs: &[Vec<u8>], outputs: &mut [Vec<u8>]) {
        let n = self.n();
        let es = call.elem();
        while let Some((c, a)) = self.engines[r as usize].poll_tree().unwrap() {
            let t = UniformTree::for_channel(self.nodes, self.gpus, self.gpus as u16, c);
            match a {
                TreeAction::Exec(e) => {
                    let len = e.count as usize * es;
                    let inc: Vec<Vec<u8>> = e
                        .recv_conns()
                        .map(|(conn, s)| {
                            let from = peer_on(&t, r, conn);
                            self.fifo
                                .remove(&(true, c.0, from, r, s.step))
                                .expect("tree data")
                        })
                        .collect();
                    let lo = e.input_offset as usize * es;
                    let local = e
                        .primitive
                        .reads_input()
                        .then(|| &inputs[r as usize][lo..lo + len]);
                    let mut out = vec![0u8; len];
                    tree_slice_result(
                        e.primitive,
                        call.dtype,
                        call.op,
                        n,
                        inc.iter().map(Vec::as_slice),
                        local,
                        &mut out,
                    )
                    .unwrap();
                    if e.primitive.contains(Primitive::COPY) {
                        let o = e.output_offset as usize * es;
                        outputs[r as usize][o..o + len].copy_from_slice(&out);
                    }
                    for (conn, s) in e.send_conns() {
                        let to = peer_on(&t, r, conn);
                        self.fifo.insert((true, c.0, r, to, s.step), out.clone());
                        let back = conn_to(&t, to, r);
                        for ev in e.peer_events(conn) {
                            self.engines[to as usize]
                                .handle_tree(0, c, back, ev)
                                .unwrap();
                        }
                    }
                    self.engines[r as usize]
                        .handle_tree(0, c, TreeConn::Up, Event::ExecDone)
                        .unwrap();
                }
                TreeAction::ReturnCredit { conn, head } => {
                    let to = peer_on(&t, r, conn);
                    let back = conn_to(&t, to, r);
                    self.engines[to as usize]
                        .handle_tree(0, c, back, Event::Head(head))
                        .unwrap();
                }
                TreeAction::Done => {}
            }
        }
    }
}

#[test]
fn ring_and_tree_calls_share_one_engine() {
    for (nodes, gpus) in [(1, 1), (1, 2), (2, 1), (3, 2), (5, 3), (8, 2)] {
        let mut w = Sync::new(nodes, gpus);
        let sum = Call::all_reduce(70, DataType::F32, ReduceOp::Sum);
        let avg = Call::all_reduce(33, DataType::I32, ReduceOp::Avg);
        let ag = Call::all_gather(9, DataType::U8);
        w.run(sum, false, 2, 1);
        w.run(sum, true, 2, 2);
        w.run(avg, true, 1, 3);
        w.run(ag, false, 2, 4);
        w.run(avg, false, 1, 5);
        w.run(sum, true, 2, 6);
        for e in &w.engines {
            assert_eq!(e.seq(), 6);
            assert!(!e.is_tree_call() || e.is_idle());
        }
        assert!(w.fifo.is_empty(), "every slot read");
    }
}

fn tree_call() -> (Call, TreePlan) {
    let call = Call::all_reduce(16, DataType::F32, ReduceOp::Sum);
    (call, TreePlan::new(16, DataType::F32, 2, 1, 16).unwrap())
}

fn start(e: &mut Eng) -> Result<ringcc_core::CallDesc, EngineError> {
    let (call, plan) = tree_call();
    e.start_tree(0, &call, &plan, g(), |c| {
        UniformTree::for_channel(1, 2, 1, c)
    })
}

#[test]
fn refusals_leave_the_engine_usable() {
    let mut e = engine(0);
    // More channels than the tree storage.
    let call = Call::all_reduce(16, DataType::F32, ReduceOp::Sum);
    let wide = TreePlan::new(16, DataType::F32, 2, 3, 16).unwrap();
    let r = e.start_tree(0, &call, &wide, g(), |c| {
        UniformTree::for_channel(1, 2, 1, c)
    });
    assert!(matches!(r, Err(EngineError::BadChannel { .. })), "{r:?}");
    // A tree of another size.
    let (call, plan) = tree_call();
    let r = e.start_tree(0, &call, &plan, g(), |c| {
        UniformTree::for_channel(2, 2, 1, c)
    });
    assert_eq!(
        r.map_err(|e| e.core()),
        Err(Some(Error::BadTopology)),
        "a tree of 4 ranks for a plan of 2"
    );
    // Not an AllReduce.
    let bc = Call::broadcast(16, DataType::F32, Rank(0));
    let r = e.start_tree(0, &bc, &plan, g(), |c| UniformTree::for_channel(1, 2, 1, c));
    assert_eq!(r.map_err(|e| e.core()), Err(Some(Error::PlanMismatch)));
    assert!(e.failure().is_none() && e.is_idle());
    start(&mut e).unwrap();
    assert_eq!(start(&mut e), Err(EngineError::Busy));
    assert!(e.is_tree_call());
}

#[test]
fn impossible_tree_events_are_typed_errors_that_poison() {
    let bad = |f: &dyn Fn(&mut Eng) -> Result<(), EngineError>, want: Error| {
        let mut e = engine(1); // the leaf of a 2-rank tree: only `Up`
        start(&mut e).unwrap();
        let got = f(&mut e).unwrap_err();
        assert_eq!(got.core(), Some(want), "{got}");
        assert_eq!(e.poll_tree(), Err(EngineError::Poisoned));
        assert_eq!(e.failure(), Some(got));
    };
    let c = ChannelId(0);
    bad(
        &|e| e.handle_tree(0, c, TreeConn::Down(0), Event::Tail(1)),
        Error::BadTopology,
    );
    bad(
        &|e| e.handle_tree(0, c, TreeConn::Up, Event::Tail(STEPS + 1)),
        Error::Protocol(ProtocolViolation::Overrun),
    );
    bad(
        &|e| e.handle_tree(0, c, TreeConn::Up, Event::Head(1)),
        Error::Protocol(ProtocolViolation::HeadAhead),
    );
    bad(
        &|e| e.handle_tree(0, c, TreeConn::Up, Event::ExecDone),
        Error::NoExecPending,
    );
    // Data without the call header on the connection's first message.
    bad(
        &|e| {
            // The leaf sends up first; take that exec and complete it.
            while let Some((c, a)) = e.poll_tree()? {
                if let TreeAction::Exec(_) = a {
                    e.handle_tree(0, c, TreeConn::Up, Event::ExecDone)?;
                }
            }
            e.handle_tree(0, c, TreeConn::Up, Event::Tail(1))?;
            e.poll_tree().map(|_| ())
        },
        Error::Protocol(ProtocolViolation::MissingHeader),
    );
    // A tail that moves back (the same one again is fine).
    let mut e = engine(1);
    start(&mut e).unwrap();
    for _ in 0..2 {
        assert_eq!(e.handle_tree(0, c, TreeConn::Up, Event::Tail(2)), Ok(()));
    }
    bad(
        &|e| {
            e.handle_tree(0, c, TreeConn::Up, Event::Tail(2))?;
            e.handle_tree(0, c, TreeConn::Up, Event::Tail(1))
        },
        Error::Protocol(ProtocolViolation::TailBackwards),
    );
    // The call's header, or the next call's (early), twice on the
    // connection.
    for seq in [0, 1] {
        bad(
            &|e| {
                let header = Event::Header {
                    step: 0,
                    desc: tree_call().0.desc(seq),
                };
                e.handle_tree(0, c, TreeConn::Up, header)?;
                e.handle_tree(0, c, TreeConn::Up, header)
            },
            Error::Protocol(ProtocolViolation::UnexpectedHeader),
        );
    }
    // A header for another call on the connection.
    bad(
        &|e| {
            let (call, _) = tree_call();
            let mut other = call.desc(0);
            other.count = 15;
            e.handle_tree(
                0,
                c,
                TreeConn::Up,
                Event::Header {
                    step: 0,
                    desc: other,
                },
            )
        },
        Error::MismatchedCall {
            expected: tree_call().0.desc(0),
            got: {
                let mut o = tree_call().0.desc(0);
                o.count = 15;
                o
            },
        },
    );
}

#[test]
fn a_stalled_tree_call_names_the_connection_it_waits_on() {
    // The root of a 1-node, 3-rank chain waits for its child's data.
    let mut e: Eng = engine(0);
    let call = Call::all_reduce(16, DataType::F32, ReduceOp::Sum);
    let plan = TreePlan::new(16, DataType::F32, 3, 1, 16).unwrap();
    e.start_tree(5, &call, &plan, g(), |c| {
        UniformTree::for_channel(1, 3, 1, c)
    })
    .unwrap();
    assert_eq!(e.poll_tree(), Ok(None));
    let b = e.tree_blocked_on(ChannelId(0));
    assert_eq!(b.conn, Some(TreeConn::Down(0)));
    assert_eq!(b.blocked, Blocked::Data { tail: 0, need: 1 });
    assert!(b.to_string().contains("data from a child"), "{b}");
    assert_eq!(e.poll_timeout(), Some(5 + TIMEOUT));
    assert_eq!(e.handle_timeout(5 + TIMEOUT - 1), Ok(()));
    match e.handle_timeout(5 + TIMEOUT) {
        Err(EngineError::Timeout(s)) => {
            assert_eq!(s.channel, ChannelId(0));
            assert_eq!(s.blocked, Blocked::Data { tail: 0, need: 1 });
            assert_eq!(s.waited, TIMEOUT);
        }
        other => panic!("{other:?}"),
    }
    // The middle rank of the chain waits for its child's data too.
    let mut m: Eng = engine(1);
    m.start_tree(0, &call, &plan, g(), |c| {
        UniformTree::for_channel(1, 3, 1, c)
    })
    .unwrap();
    assert_eq!(m.poll_tree(), Ok(None));
    assert_eq!(
        m.tree_blocked_on(ChannelId(0)).conn,
        Some(TreeConn::Down(0))
    );
}

#[test]
fn a_leaf_without_credit_names_its_parent_connection() {
    // The leaf of a 1-node, 2-rank chain sends its whole input up; with
    // no credit back it fills the FIFO and waits for room on `Up`.
    let mut e: Eng = engine(1);
    let slices = 2 * STEPS;
    let count = slices * 4; // 16-byte slots, one per slice: 4 floats each.
    let call = Call::all_reduce(count, DataType::F32, ReduceOp::Sum);
    let plan = TreePlan::new(count, DataType::F32, 2, 1, 64).unwrap();
    e.start_tree(0, &call, &plan, g(), |c| {
        UniformTree::for_channel(1, 2, 1, c)
    })
    .unwrap();
    let c = ChannelId(0);
    let mut sent = 0;
    while let Some((ch, a)) = e.poll_tree().unwrap() {
        assert_eq!(ch, c);
        assert!(!e.tree_machine(c).unwrap().is_done(), "running");
        match a {
            TreeAction::Exec(x) => {
                assert_eq!(x.send_conns().count(), 1, "a leaf only sends up");
                sent += 1;
                e.handle_tree_exec_done(0, c, x.dir).unwrap();
            }
            other => panic!("a leaf with no data from above does not {other:?}"),
        }
    }
    assert_eq!(sent, STEPS, "as many slices as the FIFO holds");
    let b = e.tree_blocked_on(c);
    assert_eq!(b.conn, Some(TreeConn::Up));
    assert_eq!(b.blocked, Blocked::Credit { head: 0, need: 1 });
    // One credit: one more slice.
    e.handle_tree(0, c, TreeConn::Up, Event::Head(1)).unwrap();
    match e.poll_tree().unwrap() {
        Some((_, TreeAction::Exec(x))) => e.handle_tree_exec_done(0, c, x.dir).unwrap(),
        other => panic!("{other:?}"),
    }
    assert_eq!(e.poll_tree(), Ok(None));
    assert_eq!(e.tree_blocked_on(c).conn, Some(TreeConn::Up));
    assert!(!e.tree_machine(c).unwrap().is_done());
}

#[test]
fn tree_channels_beyond_the_limit_are_refused() {
    // Storage for more tree channels than a call may use: the ones past
    // `MAX_CHANNELS` are never addressed.
    use ringcc_core::topology::MAX_CHANNELS;
    let mut e = Engine::with_trees(
        Rank(0),
        [Channel::<InOrderRing>::new(), Channel::new()],
        vec![TreeChannel::new(); MAX_CHANNELS as usize + 1],
        TIMEOUT,
    );
    let c = ChannelId(MAX_CHANNELS as u8);
    let refused = Err(EngineError::BadChannel {
        channel: MAX_CHANNELS,
        capacity: MAX_CHANNELS,
    });
    assert_eq!(e.handle_tree(0, c, TreeConn::Up, Event::Tail(1)), refused);
    assert_eq!(e.failure(), None, "a refusal does not poison");
    let last = ChannelId(MAX_CHANNELS as u8 - 1);
    assert_eq!(e.handle_tree(0, last, TreeConn::Up, Event::Tail(1)), Ok(()));
}

#[test]
fn a_middle_rank_names_the_child_it_waits_credit_from() {
    // The middle rank of a 1-node, 3-rank chain: its up-stream (data from
    // the leaf, sent to the root) finishes with `Up`'s window full, the
    // root holding credit back; its down-stream (data from the root, sent
    // to the leaf) then fills `Down(0)`, the leaf holding credit back.
    // What it waits for is the leaf's credit, not the root's.
    let mut e: Eng = engine(1);
    let slices = 12u64;
    let count = slices * 4; // one 16-byte slot per slice: 4 floats each.
    let call = Call::all_reduce(count, DataType::F32, ReduceOp::Sum);
    let plan = TreePlan::new(count, DataType::F32, 3, 1, 64).unwrap();
    let desc = e
        .start_tree(0, &call, &plan, g(), |c| {
            UniformTree::for_channel(1, 3, 1, c)
        })
        .unwrap();
    let c = ChannelId(0);
    let down = TreeConn::Down(0);
    let run = |e: &mut Eng| {
        while let Some((_, a)) = e.poll_tree().unwrap() {
            match a {
                TreeAction::Exec(x) => e.handle_tree_exec_done(0, c, x.dir).unwrap(),
                TreeAction::ReturnCredit { .. } => {}
                TreeAction::Done => panic!("the middle rank cannot finish here"),
            }
        }
    };
    let header = Event::Header { step: 0, desc };
    e.handle_tree(0, c, down, header).unwrap();
    e.handle_tree(0, c, down, Event::Tail(STEPS)).unwrap();
    run(&mut e);
    e.handle_tree(0, c, down, Event::Tail(slices)).unwrap();
    e.handle_tree(0, c, TreeConn::Up, Event::Head(slices - STEPS))
        .unwrap();
    run(&mut e);
    let up = e.tree_machine(c).unwrap().links()[0];
    assert_eq!((up.send_head, up.send_next), (slices - STEPS, slices));
    e.handle_tree(0, c, TreeConn::Up, header).unwrap();
    e.handle_tree(0, c, TreeConn::Up, Event::Tail(STEPS))
        .unwrap();
    run(&mut e);
    e.handle_tree(0, c, TreeConn::Up, Event::Tail(slices))
        .unwrap();
    run(&mut e);
    let b = e.tree_blocked_on(c);
    assert_eq!(b.conn, Some(down), "{b}");
    assert_eq!(b.blocked, Blocked::Credit { head: 0, need: 1 });
    // Both streams finish sending; the root credits everything, the leaf
    // all but the last four: the call waits for those, from the leaf.
    e.handle_tree(0, c, down, Event::Head(STEPS)).unwrap();
    e.handle_tree(0, c, TreeConn::Up, Event::Head(slices))
        .unwrap();
    run(&mut e);
    let b = e.tree_blocked_on(c);
    assert_eq!(b.conn, Some(down), "{b}");
    assert_eq!(
        b.blocked,
        Blocked::Credit {
            head: STEPS,
            need: slices
        }
    );
    e.handle_tree(0, c, down, Event::Head(slices)).unwrap();
    assert_eq!(e.poll_tree(), Ok(Some((c, TreeAction::Done))));
    assert!(e.is_idle());
}

#[test]
fn a_credit_may_return_while_its_slice_still_runs() {
    // A transport posts a slice's data before its exec is done, so the
    // peer's credit for it may come first: one slice ahead of what was
    // sent, on the connection a running exec sends on, and on no other.
    let c = ChannelId(0);
    // The leaf of a 2-rank tree sends its first slice up.
    let mut e = engine(1);
    start(&mut e).unwrap();
    let Ok(Some((_, TreeAction::Exec(x)))) = e.poll_tree() else {
        panic!("the leaf sends first");
    };
    // The same credit read twice is no news.
    for _ in 0..2 {
        assert_eq!(e.handle_tree(0, c, TreeConn::Up, Event::Head(1)), Ok(()));
    }
    e.handle_tree_exec_done(0, c, x.dir).unwrap();
    let up = e.tree_machine(c).unwrap().links()[0];
    assert_eq!((up.send_head, up.send_next), (1, 1));
    // Two slices ahead is one too many.
    let mut e = engine(1);
    start(&mut e).unwrap();
    assert!(matches!(e.poll_tree(), Ok(Some((_, TreeAction::Exec(_))))));
    let got = e
        .handle_tree(0, c, TreeConn::Up, Event::Head(2))
        .unwrap_err();
    assert_eq!(
        got.core(),
        Some(Error::Protocol(ProtocolViolation::HeadAhead))
    );
    // The middle rank of a 1-node, 3-rank chain, its up-stream sending to
    // the root: a credit from the leaf, to whom nothing was sent, is
    // refused.
    let mut e: Eng = engine(1);
    let call = Call::all_reduce(16, DataType::F32, ReduceOp::Sum);
    let plan = TreePlan::new(16, DataType::F32, 3, 1, 16).unwrap();
    let desc = e
        .start_tree(0, &call, &plan, g(), |c| {
            UniformTree::for_channel(1, 3, 1, c)
        })
        .unwrap();
    let down = TreeConn::Down(0);
    e.handle_tree(0, c, down, Event::Header { step: 0, desc })
        .unwrap();
    e.handle_tree(0, c, down, Event::Tail(1)).unwrap();
    let exec = loop {
        match e.poll_tree().unwrap() {
            Some((_, TreeAction::Exec(x))) => break x,
            Some((_, TreeAction::ReturnCredit { .. })) => {}
            other => panic!("the middle rank reduces the leaf's slice: {other:?}"),
        }
    };
    assert!(exec.send[TreeConn::Up.index()].is_some(), "sent up");
    assert!(exec.send[down.index()].is_none(), "nothing down");
    let got = e.handle_tree(0, c, down, Event::Head(1)).unwrap_err();
    assert_eq!(
        got.core(),
        Some(Error::Protocol(ProtocolViolation::HeadAhead))
    );
}

#[test]
fn a_finished_tree_channel_that_fails_between_calls_says_so() {
    // After a tree call, an impossible event for the next one fails the
    // finished machine it reaches: the channel reports `Failed`, not
    // `Done`.
    let mut w = Sync::new(1, 2);
    w.run(
        Call::all_reduce(70, DataType::F32, ReduceOp::Sum),
        true,
        1,
        1,
    );
    let e = &mut w.engines[1];
    let c = ChannelId(0);
    assert_eq!(e.tree_blocked_on(c).blocked, Blocked::Done);
    let got = e
        .handle_tree(0, c, TreeConn::Up, Event::Tail(u64::MAX))
        .unwrap_err();
    assert_eq!(
        got.core(),
        Some(Error::Protocol(ProtocolViolation::Overrun)),
        "{got}"
    );
    assert_eq!(e.tree_blocked_on(c).blocked, Blocked::Failed);
    assert_eq!(e.tree_blocked_on(c).conn, None);
}

/// Tree storage is handed over only while the engine is idle: an engine
/// built without any refuses a tree call, runs one on storage it is given
/// afterwards, and while that call runs refuses to give it up.
#[test]
fn tree_storage_is_handed_over_only_while_idle() {
    type Grown = Engine<InOrderRing, [Channel<InOrderRing>; CAP], Vec<TreeChannel>>;
    let mut e: Grown = Engine::with_trees(
        Rank(0),
        [Channel::new(), Channel::new()],
        Vec::new(),
        TIMEOUT,
    );
    let (call, plan) = tree_call();
    let tree = |c| UniformTree::for_channel(1, 2, 1, c);
    let r = e.start_tree(0, &call, &plan, g(), tree);
    assert!(matches!(r, Err(EngineError::BadChannel { .. })), "{r:?}");
    let old = e.replace_trees(vec![TreeChannel::new(), TreeChannel::new()]);
    assert!(old.is_ok_and(|t| t.is_empty()));
    e.start_tree(0, &call, &plan, g(), tree).unwrap();
    assert!(matches!(
        e.replace_trees(Vec::new()),
        Err(EngineError::Busy)
    ));
    assert_eq!(e.tree_channels().len(), 2);
    assert!(e.tree_machine(ringcc_core::ChannelId(0)).is_some());
}
