//! Properties of the progress engine over random interleavings: up to 5
//! ranks, each with its own [`Engine`](ringcc_core::Engine) over up to 3
//! channels, run several consecutive calls through an in-memory world
//! (`engine_world`) whose every move — which rank polls, which exec
//! completes, which queued header / tail / head arrives, when a rank
//! starts its next call — a seeded RNG picks. A rank starts its next call
//! as soon as it is idle (or a little later), so a faster predecessor's
//! next header and data reach slower ranks early.
//!
//! Every run checks: each rank's output is the reference, bit for bit,
//! each element written once; no exec is handed out twice; `pending` is
//! the exec handed out; after a `poll` that gives nothing every open
//! channel says what it waits for, and the stall report agrees; sequence
//! numbers advance per call; the world never gets stuck with work left;
//! at the end every FIFO slot was read and both ends of every connection
//! agree on its counters.

mod engine_world;

use engine_world::{CallSpec, Mode, Perm, World, CAP};
use proptest::prelude::*;
use ringcc_core::fifo::FifoGeometry;
use ringcc_core::rng::Rng;
use ringcc_core::{Call, Collective, DataType, Rank, ReduceOp};

const GEOMETRIES: [(u64, u64); 5] = [(32, 1), (16, 2), (16, 1), (16, 4), (48, 2)];

#[derive(Clone, Debug)]
struct RawCall {
    kind: u8,
    root: u32,
    count: u64,
    dtype: DataType,
    op: ReduceOp,
    chunk: u64,
}

#[derive(Clone, Debug)]
struct Case {
    seed: u64,
    ranks: u32,
    channels: u32,
    geometry: (u64, u64),
    calls: Vec<RawCall>,
}

fn raw_call() -> impl Strategy<Value = RawCall> {
    (
        0..5u8,
        0..5u32,
        prop_oneof![2 => 0..=16u64, 3 => 0..=300u64],
        prop::sample::select(DataType::ALL.to_vec()),
        prop::sample::select(ReduceOp::ALL.to_vec()),
        0..64u64,
    )
        .prop_map(|(kind, root, count, dtype, op, chunk)| RawCall {
            kind,
            root,
            count,
            dtype,
            op,
            chunk,
        })
}

fn case() -> impl Strategy<Value = Case> {
    (
        any::<u64>(),
        1..=5u32,
        1..=CAP as u32,
        prop::sample::select(GEOMETRIES.to_vec()),
        prop::collection::vec(raw_call(), 1..=4),
    )
        .prop_map(|(seed, ranks, channels, geometry, calls)| Case {
            seed,
            ranks,
            channels,
            geometry,
            calls,
        })
}

fn geometry((slot, sps): (u64, u64)) -> FifoGeometry {
    FifoGeometry::new(slot, sps).expect("geometry")
}

/// The call a raw draw stands for on `n` ranks, with a chunk the
/// geometry can pipeline.
fn spec(raw: &RawCall, n: u32, channels: u32, g: FifoGeometry, salt: u64) -> CallSpec {
    let root = Rank(raw.root % n);
    let collective = match raw.kind {
        0 => Collective::AllReduce,
        1 => Collective::ReduceScatter,
        2 => Collective::AllGather,
        3 => Collective::Broadcast { root },
        _ => Collective::Reduce { root },
    };
    let call = Call::new(collective, raw.count, raw.dtype, raw.op);
    let es = call.elem() as u64;
    let max_elems = g.max_chunk_bytes() / es;
    CallSpec {
        call,
        chunk_bytes: es * (1 + raw.chunk % max_elems),
        salt,
        channels,
    }
}

fn rings(n: u32, rng: &mut Rng) -> [Perm; CAP] {
    [Perm::identity(n), Perm::reversed(n), Perm::shuffled(n, rng)]
}

fn world(c: &Case, mode: Mode) -> World {
    let g = geometry(c.geometry);
    let specs: Vec<CallSpec> = c
        .calls
        .iter()
        .enumerate()
        .map(|(k, raw)| spec(raw, c.ranks, c.channels, g, c.seed ^ k as u64))
        .collect();
    let mut rng = Rng::new(c.seed);
    let rings = rings(c.ranks, &mut rng);
    World::new(
        g,
        rings,
        vec![specs; c.ranks as usize],
        c.seed.wrapping_add(1),
        mode,
    )
}

/// Runs a strict world to the end; fails if it gets stuck.
fn run_to_end(w: &mut World) {
    let ran_out = w.run(1_000_000);
    assert!(ran_out, "livelock: move limit hit\n{}", w.report());
    assert!(
        w.finished(),
        "deadlock: no move left with work to do\n{}",
        w.report()
    );
    w.check_quiet();
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn every_interleaving_gives_the_reference(c in case()) {
        let mut w = world(&c, Mode::Strict);
        run_to_end(&mut w);
    }

    /// The same worlds with each rank driven one channel at a time
    /// (`poll_channel`, the exec read back with `pending`), as a backend
    /// that feeds and polls the channel of each event does.
    #[test]
    fn polling_one_channel_at_a_time_gives_the_reference(c in case()) {
        let mut w = world(&c, Mode::Strict);
        w.per_channel = true;
        run_to_end(&mut w);
    }

    /// A call's plan may use fewer channels than the last one: the
    /// channels it leaves out keep their counters for a later call, and
    /// an early header on one of them belongs to the next call.
    #[test]
    fn calls_may_use_different_channel_counts(c in case(), chans in prop::collection::vec(1..=CAP as u32, 4)) {
        let mut w = world(&c, Mode::Strict);
        for list in &mut w.calls {
            for (k, s) in list.iter_mut().enumerate() {
                s.channels = chans[k];
            }
        }
        run_to_end(&mut w);
    }
}

/// Many more seeds over a few fixed shapes (cheap: no shrinking), so the
/// rare interleavings show up.
#[test]
fn many_seeds_small_worlds() {
    let mut rng = Rng::new(0x5eed);
    for i in 0..400u64 {
        let n = 1 + (i % 5) as u32;
        let raw = |rng: &mut Rng| RawCall {
            kind: rng.below(5) as u8,
            root: rng.below(5) as u32,
            count: rng.below(40),
            dtype: DataType::ALL[rng.below(10) as usize],
            op: ReduceOp::ALL[rng.below(5) as usize],
            chunk: rng.below(4),
        };
        let c = Case {
            seed: rng.next_u64(),
            ranks: n,
            channels: 1 + rng.below(CAP as u64) as u32,
            geometry: GEOMETRIES[rng.below(GEOMETRIES.len() as u64) as usize],
            calls: (0..3).map(|_| raw(&mut rng)).collect(),
        };
        let mut w = world(&c, Mode::Strict);
        w.eager_start = 0.9;
        w.per_channel = i % 2 == 1;
        run_to_end(&mut w);
    }
}
