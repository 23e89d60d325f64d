//! A loom model of the progress engine over the shared-memory FIFO: two
//! ranks, each a thread with its own [`Engine`](ringcc_core::Engine), two
//! channels, a tiny AllReduce (each channel its three steps: send,
//! recvReduceCopySend, recv). Slices, and the call header ahead of a
//! connection's first one, travel in [`ShmFifo`] slots published by the
//! sender's release of `tail`; credit returns through `head`. Under every
//! interleaving loom explores (bounded preemptions) both ranks finish and
//! hold the reference result.
//!
//! Run: `RUSTFLAGS="--cfg loom" cargo test -p ringcc-core --release --test loom_engine`

#![cfg(loom)]

use std::collections::VecDeque;

use loom::sync::Arc;
use loom::thread;
use ringcc_core::fifo::{FifoGeometry, ShmFifo};
use ringcc_core::prim::{slice_result, Action, Blocked, Exec};
use ringcc_core::progress::{ArrayEngine, Event};
use ringcc_core::verify::{fill_expected, fill_input};
use ringcc_core::{
    Call, CallDesc, ChannelId, Collective, DataType, InOrderRing, Primitive, Rank, ReduceOp,
};

const N: u32 = 2;
const CHANNELS: usize = 2;
/// A slot: the call header packed in one word (0: none), one word of
/// data (a slice of at most two i32 here). Two words, not the 32-byte
/// wire header: every atomic access is a point where loom may switch
/// threads, and the model must stay small enough to explore.
const W: usize = 2;

/// Eight i32 over two channels: four each, chunks of two, one loop of
/// three steps per channel, every slice one slot.
const CALL: Call = Call::all_reduce(8, DataType::I32, ReduceOp::Sum);
const CHUNK_BYTES: u64 = 8;
const SALT: u64 = 3;

fn geometry() -> FifoGeometry {
    FifoGeometry::new(16, 1).unwrap()
}

/// The connections: into rank `r` on channel `c` at `c * N + r`.
struct Net {
    fifos: [ShmFifo<W>; CHANNELS * N as usize],
}

impl Net {
    fn fifo_into(&self, c: ChannelId, r: u32) -> &ShmFifo<W> {
        &self.fifos[usize::from(c.0) * N as usize + r as usize]
    }
}

fn words(bytes: &[u8]) -> impl Iterator<Item = u64> + '_ {
    bytes.chunks(8).map(|c| {
        let mut w = [0u8; 8];
        w[..c.len()].copy_from_slice(c);
        u64::from_ne_bytes(w)
    })
}

struct RankSide<'a> {
    rank: u32,
    net: &'a Net,
    input: Vec<u8>,
    output: Vec<u8>,
    /// Slots read from the FIFO (step, words), per channel, in order.
    read: [VecDeque<(u64, [u64; W])>; CHANNELS],
}

impl RankSide<'_> {
    fn inbox(&self, c: ChannelId) -> &ShmFifo<W> {
        self.net.fifo_into(c, self.rank)
    }

    fn outbox(&self, c: ChannelId) -> &ShmFifo<W> {
        self.net.fifo_into(c, (self.rank + 1) % N)
    }

    /// Carries out one slice: read, reduce, write, publish.
    fn exec(&mut self, c: ChannelId, e: &Exec) {
        let bytes = e.count as usize * CALL.elem();
        let incoming = e.recv.map(|span| {
            assert_eq!(span.slots, 1);
            let (step, slot) = self.read[usize::from(c.0)]
                .pop_front()
                .expect("a slot read");
            assert_eq!(step, span.step, "slots consumed in order");
            let mut v: Vec<u8> = slot[1..].iter().flat_map(|w| w.to_ne_bytes()).collect();
            v.truncate(bytes);
            v
        });
        let local = e.primitive.reads_input().then(|| {
            let at = e.input_offset as usize * CALL.elem();
            &self.input[at..at + bytes]
        });
        let mut out = vec![0u8; bytes];
        slice_result(
            e.primitive,
            CALL.dtype,
            CALL.op,
            N,
            incoming.as_deref(),
            local,
            &mut out,
        )
        .unwrap();
        if e.primitive.contains(Primitive::COPY) {
            let at = e.output_offset as usize * CALL.elem();
            self.output[at..at + bytes].copy_from_slice(&out);
        }
        if let Some(span) = e.send {
            let mut msg = vec![e.header.map_or(0, pack)];
            msg.extend(words(&out));
            let fifo = self.outbox(c);
            fifo.write_slot(span.step, &msg).unwrap();
            // Release: the slot's words before the counter.
            fifo.tail().post(span.end());
        }
    }

    /// Reads the slot of `step` (published: `tail` was seen past it, and
    /// not yet freed: `head` is below it) once, for the exec that will
    /// consume it; returns the call header the sender put there, if any.
    fn take_slot(&mut self, c: ChannelId, step: u64) -> Option<Event> {
        let mut slot = [0u64; W];
        let n = self.inbox(c).read_slot(step, &mut slot).unwrap();
        assert_eq!(n, W, "a slot below tail holds its slice");
        self.read[usize::from(c.0)].push_back((step, slot));
        (slot[0] != 0).then(|| Event::Header {
            step,
            desc: unpack(slot[0]),
        })
    }
}

/// The call header in one word: `seq`, the codes and `count` (enough for
/// this model's AllReduce), never 0.
fn pack(d: CallDesc) -> u64 {
    assert!(d.seq < 1 << 15 && d.count < 1 << 32 && d.collective.root().is_none());
    1 << 63
        | d.seq << 48
        | u64::from(d.collective.code()) << 40
        | u64::from(d.dtype.code()) << 36
        | u64::from(d.op.code()) << 32
        | d.count
}

fn unpack(w: u64) -> CallDesc {
    CallDesc {
        seq: (w >> 48) & 0x7fff,
        collective: Collective::from_code((w >> 40) as u8, Rank(0)).unwrap(),
        dtype: DataType::from_code(((w >> 36) & 0xf) as u8).unwrap(),
        op: ReduceOp::from_code(((w >> 32) & 0xf) as u8).unwrap(),
        count: w & 0xffff_ffff,
    }
}

/// One rank's whole call: the engine's loop, reading a counter only
/// where the engine says the channel waits for it.
fn run_rank(rank: u32, net: &Net) -> Vec<u8> {
    let plan = CALL.plan(N, CHANNELS as u32, CHUNK_BYTES).unwrap();
    let mut input = vec![0u8; plan.input_len() as usize * CALL.elem()];
    fill_input(&plan, CALL.op, rank, SALT, &mut input).unwrap();
    let mut side = RankSide {
        rank,
        net,
        input,
        output: vec![0u8; plan.output_len() as usize * CALL.elem()],
        read: Default::default(),
    };
    let mut engine =
        ArrayEngine::<InOrderRing, CHANNELS>::new(Rank(rank), Default::default(), u64::MAX);
    engine
        .start(0, &CALL, &plan, geometry(), |_| InOrderRing { ranks: N })
        .unwrap();
    let mut tail_seen = [0u64; CHANNELS];
    let mut head_seen = [0u64; CHANNELS];
    let mut execs = 0;
    let mut turn = 0;
    while !engine.is_idle() {
        let mut progressed = false;
        while let Some((c, a)) = engine.poll().unwrap() {
            progressed = true;
            match a {
                Action::Exec(e) => {
                    side.exec(c, &e);
                    engine.handle(0, c, Event::ExecDone).unwrap();
                    execs += 1;
                }
                Action::ReturnCredit { head } => side.inbox(c).head().post(head),
                Action::Done => {}
            }
        }
        // One counter read per round, for the next channel (round robin)
        // that waits for one.
        let waiting = (0..CHANNELS)
            .map(|k| (turn + k) % CHANNELS)
            .find(|&i| engine.blocked_on(ChannelId(i as u8)) != Blocked::Done);
        turn += 1;
        if let Some(i) = waiting {
            let c = ChannelId(i as u8);
            match engine.blocked_on(c) {
                Blocked::Data { .. } => {
                    let t = side.inbox(c).tail().load();
                    if t > tail_seen[i] {
                        for s in tail_seen[i]..t {
                            if let Some(h) = side.take_slot(c, s) {
                                engine.handle(0, c, h).unwrap();
                            }
                        }
                        engine.handle(0, c, Event::Tail(t)).unwrap();
                        tail_seen[i] = t;
                        progressed = true;
                    }
                }
                Blocked::Credit { .. } => {
                    let h = side.outbox(c).head().load();
                    if h > head_seen[i] {
                        engine.handle(0, c, Event::Head(h)).unwrap();
                        head_seen[i] = h;
                        progressed = true;
                    }
                }
                Blocked::Exec | Blocked::Ready | Blocked::Failed => {
                    panic!("rank {rank} channel {i}: {:?}", engine.blocked_on(c))
                }
                Blocked::Done => {}
            }
        }
        if !progressed {
            thread::yield_now();
        }
    }
    assert_eq!(
        execs,
        3 * CHANNELS,
        "three steps per channel, one slice each"
    );
    assert_eq!(engine.seq(), 1);
    side.output
}

#[test]
fn two_ranks_two_channels_all_reduce() {
    let mut b = loom::model::Builder::new();
    // Every interleaving with one forced preemption, besides every
    // voluntary switch at the spin waits: about 45,000 executions, some
    // seconds in release. A bound of 2 multiplies that by the number of
    // atomic accesses (~100): hours. LOOM_MAX_PREEMPTIONS overrides it.
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(1);
    }
    b.check(|| {
        let net = Arc::new(Net {
            fifos: std::array::from_fn(|_| ShmFifo::new()),
        });
        let n1 = net.clone();
        let peer = thread::spawn(move || run_rank(1, &n1));
        let out0 = run_rank(0, &net);
        let out1 = peer.join().unwrap();
        let plan = CALL.plan(N, CHANNELS as u32, CHUNK_BYTES).unwrap();
        let mut want = vec![0u8; out0.len()];
        assert!(fill_expected(&plan, CALL.op, 0, 0, SALT, &mut want).unwrap());
        assert_eq!(out0, want, "rank 0");
        assert_eq!(out1, want, "rank 1");
    });
}
