//! Tree AllReduce through the progress engine, over random interleavings:
//! `nodes × gpus` ranks, each with its own [`Engine`] (tree storage from
//! [`Engine::with_trees`]), run one or more consecutive tree calls through
//! an in-memory world whose every move — which rank polls, which exec
//! completes, which queued header / tail / head arrives, when a rank
//! starts its next call — a seeded RNG picks.
//!
//! Some worlds mix ring AllReduce calls (on the in-order ring) in: one
//! engine runs both kinds, with one sequence of call numbers.
//!
//! Every run checks: each rank's output is the reference bit for bit, and
//! each output element is written exactly once per call; no FIFO slot is
//! overwritten before it is read or read twice; the world never gets stuck
//! with work left; at the end both ends of every connection agree on its
//! counters. A call that differs on one rank is a typed `MismatchedCall`
//! on a neighbour, and a stuck rank's stall report names the connection.

use std::collections::{HashMap, VecDeque};

use proptest::prelude::*;
use ringcc_core::fifo::{FifoGeometry, STEPS};
use ringcc_core::prim::{
    slice_result, tree_slice_result, Action, Exec, SlotSpan, TreeAction, TreeConn, TreeExec,
    TREE_CONNS,
};
use ringcc_core::progress::{Channel, EngineError, Event, TreeChannel};
use ringcc_core::rng::Rng;
use ringcc_core::tree::{TreeDir, TreePeers, TreePlan, UniformTree};
use ringcc_core::verify::{fill_expected, fill_input};
use ringcc_core::{
    Blocked, Call, ChannelId, DataType, Engine, Error, InOrderRing, Primitive, Rank, ReduceOp,
    TreeOrder,
};

const CAP: usize = 4;
const GEOMETRIES: [(u64, u64); 4] = [(32, 1), (16, 2), (16, 1), (16, 4)];

type Eng = Engine<InOrderRing, [Channel<InOrderRing>; CAP], [TreeChannel; CAP]>;

#[derive(Clone, Copy, Debug)]
struct Spec {
    /// A tree call (else a ring AllReduce on the in-order ring).
    tree: bool,
    call: Call,
    chunk_bytes: u64,
    channels: u32,
    salt: u64,
}

/// A pipe: (tree?, channel, from, to).
type Key = (bool, u8, u32, u32);

/// An exec of either kind, as the world carries it out.
#[derive(Clone, Debug)]
struct Work {
    tree: bool,
    /// A tree exec's direction (its stream).
    dir: TreeDir,
    primitive: Primitive,
    input_offset: u64,
    output_offset: u64,
    count: u64,
    recv: Vec<(Key, SlotSpan)>,
    send: Vec<(Key, SlotSpan, Vec<Event>)>,
}

impl Work {
    fn of_tree(w: &World, r: u32, c: ChannelId, e: &TreeExec) -> Work {
        let peer = |conn| other_end(w.nodes, w.gpus, c, r, conn).0;
        Work {
            tree: true,
            dir: e.dir,
            primitive: e.primitive,
            input_offset: e.input_offset,
            output_offset: e.output_offset,
            count: e.count,
            recv: e
                .recv_conns()
                .map(|(conn, s)| ((true, c.0, peer(conn), r), s))
                .collect(),
            send: e
                .send_conns()
                .map(|(conn, s)| ((true, c.0, r, peer(conn)), s, e.peer_events(conn).collect()))
                .collect(),
        }
    }

    fn of_ring(w: &World, r: u32, c: ChannelId, e: &Exec) -> Work {
        let (next, prev) = ((r + 1) % w.n, (r + w.n - 1) % w.n);
        Work {
            tree: false,
            dir: TreeDir::Turn,
            primitive: e.primitive,
            input_offset: e.input_offset,
            output_offset: e.output_offset,
            count: e.count,
            recv: e
                .recv
                .map(|s| ((false, c.0, prev, r), s))
                .into_iter()
                .collect(),
            send: e
                .send
                .map(|s| ((false, c.0, r, next), s, e.successor_events().collect()))
                .into_iter()
                .collect(),
        }
    }
}

/// A directed connection: `from` sends to `to` on channel `c`.
#[derive(Default)]
struct Pipe {
    /// Data by FIFO step, written at the sender's exec, taken at the
    /// receiver's.
    slots: HashMap<u64, Vec<u8>>,
    /// Steps the receiver has consumed (the FIFO's free edge).
    read_upto: u64,
    /// The sender's steps written so far.
    written: u64,
    /// Header and tail events for the receiver.
    data: VecDeque<Event>,
    /// Head events for the sender.
    credit: VecDeque<Event>,
}

struct RankState {
    engine: Box<Eng>,
    next_call: usize,
    current: Option<usize>,
    input: Vec<Vec<u8>>,
    output: Vec<Vec<u8>>,
    writes: Vec<Vec<u32>>,
    failure: Option<EngineError>,
}

struct World {
    nodes: u32,
    gpus: u32,
    n: u32,
    geometry: FifoGeometry,
    calls: Vec<Vec<Spec>>,
    ranks: Vec<RankState>,
    /// (tree?, channel, from, to) → pipe.
    pipes: HashMap<Key, Pipe>,
    outstanding: Vec<(u32, u8, usize, Work)>,
    rng: Rng,
    now: u64,
    strict: bool,
    /// A ring exec just polled (carried past the action's conversion).
    ring_execs: Vec<Exec>,
    /// How often a tree channel had both streams' execs outstanding.
    concurrent: u64,
}

/// A NIC per GPU: each channel pair's chains start at another GPU.
fn tree(nodes: u32, gpus: u32, c: ChannelId) -> UniformTree {
    UniformTree::for_channel(nodes, gpus, gpus as u16, c)
}

fn plan_of(n: u32, s: &Spec) -> TreePlan {
    TreePlan::new(s.call.count, s.call.dtype, n, s.channels, s.chunk_bytes).expect("plan")
}

/// The rank on the other end of `conn`, and the connection index it sees
/// this rank on.
fn other_end(nodes: u32, gpus: u32, c: ChannelId, me: u32, conn: TreeConn) -> (u32, TreeConn) {
    let t = tree(nodes, gpus, c);
    let p = t.peers(Rank(me)).unwrap();
    let peer = match conn {
        TreeConn::Up => p.up,
        TreeConn::Down(i) => p.down[i as usize],
    }
    .expect("connection exists");
    let q = t.peers(peer).unwrap();
    let back = if q.up == Some(Rank(me)) {
        TreeConn::Up
    } else {
        let i = q.down.iter().position(|d| *d == Some(Rank(me))).unwrap();
        TreeConn::Down(i as u8)
    };
    (peer.0, back)
}

impl World {
    fn new(
        nodes: u32,
        gpus: u32,
        geometry: FifoGeometry,
        calls: Vec<Vec<Spec>>,
        seed: u64,
    ) -> World {
        let n = nodes * gpus;
        let ranks = (0..n)
            .map(|r| {
                let engine = Box::new(Engine::with_trees(
                    Rank(r),
                    core::array::from_fn(|_| Channel::new()),
                    core::array::from_fn(|_| TreeChannel::new()),
                    1_000_000,
                ));
                let specs = &calls[r as usize];
                let input = specs
                    .iter()
                    .map(|s| {
                        let plan = plan_of(n, s);
                        let mut b = vec![0u8; s.call.count as usize * s.call.elem()];
                        fill_input(plan.ring_plan(), s.call.op, r, s.salt, &mut b).unwrap();
                        b
                    })
                    .collect();
                let output = specs
                    .iter()
                    .map(|s| vec![0xa5; s.call.count as usize * s.call.elem()])
                    .collect();
                let writes = specs
                    .iter()
                    .map(|s| vec![0; s.call.count as usize])
                    .collect();
                RankState {
                    engine,
                    next_call: 0,
                    current: None,
                    input,
                    output,
                    writes,
                    failure: None,
                }
            })
            .collect();
        World {
            nodes,
            gpus,
            n,
            geometry,
            calls,
            ranks,
            pipes: HashMap::new(),
            outstanding: Vec::new(),
            rng: Rng::new(seed),
            now: 0,
            strict: true,
            ring_execs: Vec::new(),
            concurrent: 0,
        }
    }

    fn fail(&mut self, r: u32, e: EngineError) {
        assert!(!self.strict, "rank {r}: {e}");
        self.ranks[r as usize].failure.get_or_insert(e);
    }

    fn live(&self, r: u32) -> bool {
        self.ranks[r as usize].failure.is_none()
    }

    fn try_start(&mut self, r: u32) -> bool {
        let (nodes, gpus, n, g) = (self.nodes, self.gpus, self.n, self.geometry);
        let st = &mut self.ranks[r as usize];
        if st.failure.is_some()
            || !st.engine.is_idle()
            || st.next_call >= self.calls[r as usize].len()
        {
            return false;
        }
        let k = st.next_call;
        let s = self.calls[r as usize][k];
        let plan = plan_of(n, &s);
        let started = if s.tree {
            st.engine
                .start_tree(self.now, &s.call, &plan, g, |c| tree(nodes, gpus, c))
        } else {
            st.engine
                .start(self.now, &s.call, plan.ring_plan(), g, |_| InOrderRing {
                    ranks: n,
                })
        };
        match started {
            Ok(desc) => assert_eq!(desc.seq, k as u64),
            Err(e) => {
                self.fail(r, e);
                return true;
            }
        }
        let st = &mut self.ranks[r as usize];
        st.next_call += 1;
        st.current = Some(k);
        true
    }

    fn poll(&mut self, r: u32) -> bool {
        let mut moved = false;
        loop {
            if !self.live(r) {
                return moved;
            }
            let eng = &mut self.ranks[r as usize].engine;
            let got = if eng.is_tree_call() {
                eng.poll_tree()
            } else {
                eng.poll().map(|a| {
                    a.map(|(c, a)| {
                        (
                            c,
                            match a {
                                // Carried as a tree action of the ring's kind.
                                Action::Exec(e) => {
                                    self.ring_execs.push(e);
                                    TreeAction::Done
                                }
                                Action::ReturnCredit { head } => TreeAction::ReturnCredit {
                                    conn: TreeConn::Up,
                                    head,
                                },
                                Action::Done => TreeAction::Done,
                            },
                        )
                    })
                })
            };
            match got {
                Ok(None) => return moved,
                Ok(Some((c, a))) => {
                    moved = true;
                    let call = self.ranks[r as usize].current.expect("a call runs");
                    let tree_call = self.ranks[r as usize].engine.is_tree_call();
                    if let Some(e) = self.ring_execs.pop() {
                        assert_eq!(self.ranks[r as usize].engine.pending(c), Some(e));
                        let w = Work::of_ring(self, r, c, &e);
                        self.outstanding.push((r, c.0, call, w));
                        continue;
                    }
                    match a {
                        TreeAction::Exec(e) => {
                            let both = self.ranks[r as usize].engine.pending_tree_execs(c);
                            assert!(both.contains(&Some(e)), "the exec is outstanding");
                            assert_eq!(
                                self.ranks[r as usize].engine.pending_tree(c),
                                both[0].or(both[1]),
                                "the first outstanding exec, the up stream's first"
                            );
                            if both.iter().all(Option::is_some) {
                                assert_ne!(both[0].map(|x| x.dir), both[1].map(|x| x.dir));
                                self.concurrent += 1;
                            }
                            let w = Work::of_tree(self, r, c, &e);
                            self.outstanding.push((r, c.0, call, w));
                        }
                        TreeAction::ReturnCredit { conn, head } => {
                            let key = if tree_call {
                                let (peer, _) = other_end(self.nodes, self.gpus, c, r, conn);
                                (true, c.0, peer, r)
                            } else {
                                (false, c.0, (r + self.n - 1) % self.n, r)
                            };
                            let p = self.pipes.entry(key).or_default();
                            p.read_upto = p.read_upto.max(head);
                            p.credit.push_back(Event::Head(head));
                        }
                        TreeAction::Done => {
                            if self.ranks[r as usize].engine.is_idle() {
                                self.ranks[r as usize].current = None;
                            }
                        }
                    }
                }
                Err(e) => {
                    self.fail(r, e);
                    return true;
                }
            }
        }
    }

    fn complete(&mut self, i: usize) {
        let (r, c, k, e) = self.outstanding.swap_remove(i);
        let ch = ChannelId(c);
        let spec = self.calls[r as usize][k];
        let es = spec.call.elem();
        let lo = e.input_offset as usize * es;
        let len = e.count as usize * es;
        let mut incoming = Vec::new();
        for (key, span) in &e.recv {
            let p = self.pipes.get_mut(key).expect("pipe with data");
            let bytes = p
                .slots
                .remove(&span.step)
                .unwrap_or_else(|| panic!("rank {r}: no data at step {} on {key:?}", span.step));
            assert_eq!(bytes.len(), len, "slice length");
            incoming.push(bytes);
        }
        let local = e
            .primitive
            .reads_input()
            .then(|| &self.ranks[r as usize].input[k][lo..lo + len]);
        let mut out = vec![0u8; len];
        if e.tree {
            tree_slice_result(
                e.primitive,
                spec.call.dtype,
                spec.call.op,
                self.n,
                incoming.iter().map(|v| v.as_slice()),
                local,
                &mut out,
            )
        } else {
            slice_result(
                e.primitive,
                spec.call.dtype,
                spec.call.op,
                self.n,
                incoming.first().map(Vec::as_slice),
                local,
                &mut out,
            )
        }
        .unwrap();
        if e.primitive.contains(Primitive::COPY) {
            let st = &mut self.ranks[r as usize];
            let o = e.output_offset as usize * es;
            st.output[k][o..o + len].copy_from_slice(&out);
            for w in &mut st.writes[k]
                [e.output_offset as usize..e.output_offset as usize + e.count as usize]
            {
                *w += 1;
            }
        }
        for (key, span, events) in &e.send {
            let p = self.pipes.entry(*key).or_default();
            assert!(span.end() <= p.read_upto + STEPS, "{key:?}: FIFO overrun");
            assert_eq!(span.step, p.written, "{key:?}: steps out of order");
            p.written = span.end();
            assert!(
                p.slots.insert(span.step, out.clone()).is_none(),
                "slot written twice"
            );
            p.data.extend(events.iter().copied());
        }
        let eng = &mut self.ranks[r as usize].engine;
        let done = if e.tree {
            // The plain `ExecDone` completes the one exec outstanding; with
            // both streams' outstanding, the completion names its stream.
            let [a, b] = eng.pending_tree_execs(ch);
            if a.is_some() && b.is_some() {
                eng.handle_tree_exec_done(self.now, ch, e.dir)
            } else {
                eng.handle_tree(self.now, ch, TreeConn::Up, Event::ExecDone)
            }
        } else {
            eng.handle(self.now, ch, Event::ExecDone)
        };
        if let Err(err) = done {
            self.fail(r, err);
        }
    }

    /// Delivers the front event of a random non-empty queue.
    fn deliver(&mut self) -> bool {
        let keys: Vec<_> = self
            .pipes
            .iter()
            .filter(|(_, p)| !p.data.is_empty() || !p.credit.is_empty())
            .map(|(k, _)| *k)
            .collect();
        if keys.is_empty() {
            return false;
        }
        let mut keys = keys;
        keys.sort_unstable();
        let key = keys[self.rng.below(keys.len() as u64) as usize];
        let (is_tree, c, from, to) = key;
        let p = self.pipes.get_mut(&key).unwrap();
        let data = !p.data.is_empty() && (p.credit.is_empty() || self.rng.chance(0.5));
        let ch = ChannelId(c);
        if data {
            let ev = p.data.pop_front().unwrap();
            // The receiver sees the sender on its own connection.
            if self.live(to) {
                let eng = &mut self.ranks[to as usize].engine;
                let r = if is_tree {
                    let conn = conn_to_of(self.nodes, self.gpus, ch, to, from);
                    self.ranks[to as usize]
                        .engine
                        .handle_tree(self.now, ch, conn, ev)
                } else {
                    eng.handle(self.now, ch, ev)
                };
                if let Err(e) = r {
                    self.fail(to, e);
                }
            }
        } else {
            let ev = p.credit.pop_front().unwrap();
            if self.live(from) {
                let r = if is_tree {
                    let conn = conn_to_of(self.nodes, self.gpus, ch, from, to);
                    self.ranks[from as usize]
                        .engine
                        .handle_tree(self.now, ch, conn, ev)
                } else {
                    self.ranks[from as usize].engine.handle(self.now, ch, ev)
                };
                if let Err(e) = r {
                    self.fail(from, e);
                }
            }
        }
        true
    }

    /// One random move; false when none is left.
    fn step(&mut self) -> bool {
        self.now += 1;
        for r in 0..self.n {
            if self.rng.chance(0.7) {
                self.try_start(r);
            }
        }
        let choice = self.rng.below(3);
        if choice == 0 && !self.outstanding.is_empty() {
            let i = self.rng.below(self.outstanding.len() as u64) as usize;
            self.complete(i);
            return true;
        }
        if choice == 1 && self.deliver() {
            return true;
        }
        let start = self.rng.below(u64::from(self.n)) as u32;
        for d in 0..self.n {
            let r = (start + d) % self.n;
            if self.poll(r) {
                return true;
            }
        }
        if !self.outstanding.is_empty() {
            let i = self.rng.below(self.outstanding.len() as u64) as usize;
            self.complete(i);
            return true;
        }
        if self.deliver() {
            return true;
        }
        (0..self.n).any(|r| self.try_start(r))
    }

    fn run(&mut self) {
        let mut moves = 0u64;
        while self.step() {
            moves += 1;
            assert!(moves < 20_000_000, "livelock");
        }
    }

    fn finished(&self) -> bool {
        self.ranks
            .iter()
            .enumerate()
            .all(|(r, s)| s.engine.is_idle() && s.next_call == self.calls[r].len())
    }

    fn check(&self) {
        assert!(self.finished(), "deadlock: a rank did not finish");
        for (r, st) in self.ranks.iter().enumerate() {
            for (k, s) in self.calls[r].iter().enumerate() {
                let plan = plan_of(self.n, s);
                let mut want = vec![0u8; st.output[k].len()];
                assert!(
                    fill_expected(plan.ring_plan(), s.call.op, r as u32, 0, s.salt, &mut want)
                        .unwrap()
                );
                let es = s.call.elem();
                for (i, (w, g)) in want.chunks(es).zip(st.output[k].chunks(es)).enumerate() {
                    assert_eq!(w, g, "rank {r} call {k} {:?}: element {i}", s.call);
                }
                assert!(
                    st.writes[k].iter().all(|&w| w == 1),
                    "rank {r} call {k}: an element not written once"
                );
            }
        }
        for ((_, c, from, to), p) in &self.pipes {
            assert!(p.slots.is_empty(), "ch {c} {from}->{to}: unread data");
            assert!(p.data.is_empty() && p.credit.is_empty());
            assert_eq!(
                p.read_upto, p.written,
                "ch {c} {from}->{to}: counters disagree"
            );
        }
    }
}

/// The connection index at `from` that leads to `to`.
fn conn_to_of(nodes: u32, gpus: u32, c: ChannelId, from: u32, to: u32) -> TreeConn {
    let p: TreePeers = tree(nodes, gpus, c).peers(Rank(from)).unwrap();
    if p.up == Some(Rank(to)) {
        return TreeConn::Up;
    }
    TreeConn::Down(p.down.iter().position(|d| *d == Some(Rank(to))).unwrap() as u8)
}

#[derive(Clone, Debug)]
struct Case {
    seed: u64,
    nodes: u32,
    gpus: u32,
    geometry: (u64, u64),
    calls: Vec<(bool, u32, u64, DataType, ReduceOp, u64)>,
}

fn specs(c: &Case) -> Vec<Spec> {
    let g = FifoGeometry::new(c.geometry.0, c.geometry.1).unwrap();
    c.calls
        .iter()
        .enumerate()
        .map(|(k, &(tree, channels, count, dtype, op, chunk))| {
            let es = u64::from(dtype.size());
            let max = g.max_chunk_bytes() / es;
            Spec {
                tree,
                call: Call::all_reduce(count, dtype, op),
                chunk_bytes: es * (1 + chunk % max),
                channels,
                salt: c.seed ^ k as u64,
            }
        })
        .collect()
}

fn world(c: &Case) -> World {
    let g = FifoGeometry::new(c.geometry.0, c.geometry.1).unwrap();
    let n = c.nodes * c.gpus;
    World::new(c.nodes, c.gpus, g, vec![specs(c); n as usize], c.seed)
}

/// `ring`: the share of ring AllReduce calls among the tree calls.
fn case(max_nodes: u32, max_gpus: u32, max_count: u64, ring: f64) -> impl Strategy<Value = Case> {
    (
        any::<u64>(),
        1..=max_nodes,
        1..=max_gpus,
        prop::sample::select(GEOMETRIES.to_vec()),
        prop::collection::vec(
            (
                prop::bool::weighted(1.0 - ring),
                1..=CAP as u32,
                prop_oneof![1 => Just(0u64), 1 => Just(1u64), 3 => 0..=max_count],
                prop::sample::select(DataType::ALL.to_vec()),
                prop::sample::select(ReduceOp::ALL.to_vec()),
                0..64u64,
            ),
            1..=3,
        ),
    )
        .prop_map(|(seed, nodes, gpus, geometry, calls)| Case {
            seed,
            nodes,
            gpus,
            geometry,
            calls,
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Small trees, many interleavings: counts from empty to many chunks,
    /// ring AllReduce calls among the tree calls on the same engines.
    #[test]
    fn small_trees_give_the_reference(c in case(6, 3, 200, 0.3)) {
        let mut w = world(&c);
        w.run();
        w.check();
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// The whole asked range: 1–64 nodes of 1–8 ranks (tree calls only:
    /// a 512-rank ring call is 2 million execs in this world).
    #[test]
    fn large_trees_give_the_reference(c in case(64, 8, 48, 0.0)) {
        let mut w = world(&c);
        w.run();
        w.check();
    }
}

/// A non-root rank runs its reduce-up and broadcast-down streams at the
/// same time (NCCL's `runTreeSplit`): with several chunks, the world sees
/// channels with both streams' execs outstanding, completing in random
/// order, and still gets the reference on 64 nodes x 8 ranks.
#[test]
fn both_streams_run_at_once() {
    for (nodes, gpus, seed) in [(2, 8, 1u64), (64, 8, 2), (5, 3, 3)] {
        let c = Case {
            seed,
            nodes,
            gpus,
            geometry: (16, 2),
            calls: vec![(true, 2, 200, DataType::F32, ReduceOp::Sum, 3)],
        };
        let mut w = world(&c);
        w.run();
        w.check();
        assert!(w.concurrent > 0, "{nodes}x{gpus}: never two execs at once");
    }
}

/// A plain `ExecDone` while both streams have an exec outstanding is
/// ambiguous: a typed error, not a guess.
#[test]
fn an_exec_done_without_its_stream_is_refused_when_both_run() {
    let c = Case {
        seed: 9,
        nodes: 2,
        gpus: 4,
        geometry: (16, 2),
        calls: vec![(true, 1, 200, DataType::F32, ReduceOp::Sum, 3)],
    };
    let mut w = world(&c);
    for _ in 0..2_000_000 {
        let hit = (0..w.n).find(|&r| {
            let [a, b] = w.ranks[r as usize].engine.pending_tree_execs(ChannelId(0));
            a.is_some() && b.is_some()
        });
        if let Some(r) = hit {
            let eng = &mut w.ranks[r as usize].engine;
            let e = eng
                .handle_tree(0, ChannelId(0), TreeConn::Up, Event::ExecDone)
                .unwrap_err();
            assert!(
                matches!(
                    e,
                    EngineError::Machine {
                        source: Error::AmbiguousExecDone,
                        ..
                    }
                ),
                "{e:?}"
            );
            return;
        }
        assert!(w.step(), "finished without two execs at once");
    }
    panic!("never two execs at once");
}

/// A rank whose call differs (another count) makes a neighbour fail with
/// `MismatchedCall`; ranks left waiting report the connection they wait on.
#[test]
fn a_mismatched_call_is_a_typed_error() {
    let mut rng = Rng::new(7);
    for i in 0..40u64 {
        let nodes = 1 + rng.below(9) as u32;
        let gpus = 1 + rng.below(3) as u32;
        let n = nodes * gpus;
        if n < 2 {
            continue;
        }
        let c = Case {
            seed: rng.next_u64(),
            nodes,
            gpus,
            geometry: GEOMETRIES[(i % 4) as usize],
            calls: vec![(
                true,
                1 + rng.below(CAP as u64) as u32,
                1 + rng.below(90),
                DataType::F32,
                ReduceOp::Sum,
                3,
            )],
        };
        let g = FifoGeometry::new(c.geometry.0, c.geometry.1).unwrap();
        let mut calls = vec![specs(&c); n as usize];
        let odd = rng.below(u64::from(n)) as usize;
        calls[odd][0].call.count += 1;
        let mut w = World::new(nodes, gpus, g, calls, c.seed);
        w.strict = false;
        w.run();
        let mismatched = w
            .ranks
            .iter()
            .filter_map(|s| s.failure)
            .any(|e| matches!(e.core(), Some(Error::MismatchedCall { .. })));
        assert!(mismatched, "case {c:?}: no rank saw the mismatch");
        // Somebody is left waiting; its stall report names what it waits on.
        for st in &mut w.ranks {
            if st.failure.is_none() && !st.engine.is_idle() {
                let stall = st.engine.stall(w.now);
                if matches!(stall.blocked, Blocked::Data { .. } | Blocked::Credit { .. }) {
                    assert!(st.engine.tree_blocked_on(stall.channel).conn.is_some());
                }
                match st.engine.handle_timeout(w.now + 2_000_000) {
                    Err(EngineError::Timeout(_)) => {}
                    other => panic!("expected a timeout, got {other:?}"),
                }
            }
        }
    }
}

/// Many seeds over small fixed shapes, cheap enough to run a lot.
#[test]
fn many_seeds_small_trees() {
    let mut rng = Rng::new(0x7eee);
    for _ in 0..300 {
        let c = Case {
            seed: rng.next_u64(),
            nodes: 1 + rng.below(5) as u32,
            gpus: 1 + rng.below(3) as u32,
            geometry: GEOMETRIES[rng.below(4) as usize],
            calls: (0..3)
                .map(|_| {
                    (
                        rng.chance(0.7),
                        1 + rng.below(CAP as u64) as u32,
                        rng.below(60),
                        DataType::ALL[rng.below(10) as usize],
                        ReduceOp::ALL[rng.below(5) as usize],
                        rng.below(4),
                    )
                })
                .collect(),
        };
        let mut w = world(&c);
        w.run();
        w.check();
    }
}

/// A tree call and ring-only engines: `Engine::new` has no tree storage,
/// so a tree call is refused as a channel out of range, not run half-way.
#[test]
fn a_ring_only_engine_refuses_tree_calls() {
    let mut e: Engine<InOrderRing, [Channel<InOrderRing>; 2]> =
        Engine::new(Rank(0), [Channel::new(), Channel::new()], 10);
    let plan = TreePlan::new(8, DataType::F32, 2, 1, 16).unwrap();
    let g = FifoGeometry::new(16, 1).unwrap();
    let r = e.start_tree(
        0,
        &Call::all_reduce(8, DataType::F32, ReduceOp::Sum),
        &plan,
        g,
        |c| tree(1, 2, c),
    );
    assert!(matches!(r, Err(EngineError::BadChannel { .. })), "{r:?}");
    assert!(e.is_idle() && e.failure().is_none());
    let _ = TREE_CONNS;
}
