//! The hardware floor under LL versus Simple on shared memory: how long
//! one step's hand-off between two cores takes in each protocol's shape,
//! with no engine, executor or polling loop around it.
//!
//! - LL's shape: the data and its flag in one 8-byte store; the receiver
//!   spins on that word (one cache line crosses).
//! - Simple's shape: the data in one cache line, then the `tail` counter
//!   in another (release); the receiver spins on the tail, then reads the
//!   data (two lines cross, the second only once the first is seen).
//!
//! Two threads play ping-pong, each round a hop each way, both shapes
//! interleaved in one run; it prints nanoseconds per hop and Simple's
//! time over LL's. That ratio bounds what LL can gain on an 8-byte call
//! on this machine: every hop of the call gains at most that factor, and
//! the engine's and executor's fixed work per call gain nothing.
//!
//! `cargo bench -p ringcc-host --bench handoff` (`HANDOFF_HOPS`, default
//! 2,000,000 round trips per measurement; `HANDOFF_ROUNDS`, default 5).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// A word with a cache-line pair of its own (128 bytes: the adjacent-line
/// prefetcher moves lines in pairs, which would couple two words 64 bytes
/// apart).
#[repr(align(128))]
struct Line(AtomicU64);

impl Line {
    fn new() -> Line {
        Line(AtomicU64::new(0))
    }
}

/// Each side's inbox in both shapes.
struct Inbox {
    /// LL: data (low half) and flag (high half) in one word.
    unit: Line,
    /// Simple: the data's line and the tail's.
    data: Line,
    tail: Line,
}

impl Inbox {
    fn new() -> Inbox {
        Inbox {
            unit: Line::new(),
            data: Line::new(),
            tail: Line::new(),
        }
    }

    fn reset(&self) {
        for line in [&self.unit, &self.data, &self.tail] {
            line.0.store(0, Ordering::SeqCst);
        }
    }
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Shape {
    Ll,
    Simple,
}

/// Sends step `i`'s value `v` into `to`.
#[inline(always)]
fn send(to: &Inbox, shape: Shape, i: u64, v: u32) {
    match shape {
        Shape::Ll => to.unit.0.store((i << 32) | u64::from(v), Ordering::Release),
        Shape::Simple => {
            to.data.0.store(u64::from(v), Ordering::Relaxed);
            to.tail.0.store(i, Ordering::Release);
        }
    }
}

/// Waits for step `i` in `at` and returns its value.
#[inline(always)]
fn recv(at: &Inbox, shape: Shape, i: u64) -> u32 {
    match shape {
        Shape::Ll => loop {
            let w = at.unit.0.load(Ordering::Acquire);
            if w >> 32 == i {
                return w as u32;
            }
            std::hint::spin_loop();
        },
        Shape::Simple => {
            while at.tail.0.load(Ordering::Acquire) != i {
                std::hint::spin_loop();
            }
            at.data.0.load(Ordering::Relaxed) as u32
        }
    }
}

/// One side's `hops` round trips; the value is summed along (an 8-byte
/// AllReduce's reduction, and a check that every hop carried it).
fn play(mine: &Inbox, theirs: &Inbox, shape: Shape, first: bool, hops: u64) -> u32 {
    let mut acc = 0u32;
    for i in 1..=hops {
        if first {
            send(theirs, shape, i, acc.wrapping_add(1));
            acc = recv(mine, shape, i);
        } else {
            let v = recv(mine, shape, i);
            acc = v.wrapping_add(1);
            send(theirs, shape, i, acc);
        }
    }
    acc
}

/// Nanoseconds per one-way hop of `shape`.
fn measure(a: &Arc<Inbox>, b: &Arc<Inbox>, shape: Shape, hops: u64) -> f64 {
    a.reset();
    b.reset();
    let (a2, b2) = (Arc::clone(a), Arc::clone(b));
    let other = std::thread::spawn(move || play(&b2, &a2, shape, false, hops));
    let start = Instant::now();
    let got = play(a, b, shape, true, hops);
    let took = start.elapsed();
    let theirs = other.join().expect("the other side finished");
    // Each side adds one per round trip and forwards the value: both end
    // on 2 per round trip.
    assert_eq!(got, (2 * hops) as u32, "{shape:?}: a hop lost its value");
    assert_eq!(theirs, got, "{shape:?}: the sides disagree");
    took.as_nanos() as f64 / (2 * hops) as f64
}

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&v| v > 0)
        .unwrap_or(default)
}

fn main() {
    // `cargo bench` passes `--bench`; a filter argument selects nothing
    // here.
    let hops = env("HANDOFF_HOPS", 2_000_000);
    let rounds = env("HANDOFF_ROUNDS", 5);
    let (a, b) = (Arc::new(Inbox::new()), Arc::new(Inbox::new()));
    let mut ratios = Vec::new();
    println!("hand-off between two threads, ns per hop ({hops} round trips per measurement)");
    println!("round      LL  Simple  Simple/LL");
    for round in 1..=rounds {
        // Alternate which shape goes first.
        let (ll, simple) = if round % 2 == 1 {
            let ll = measure(&a, &b, Shape::Ll, hops);
            (ll, measure(&a, &b, Shape::Simple, hops))
        } else {
            let simple = measure(&a, &b, Shape::Simple, hops);
            (measure(&a, &b, Shape::Ll, hops), simple)
        };
        let ratio = simple / ll;
        ratios.push(ratio);
        println!("{round:>5} {ll:>7.1} {simple:>7.1} {ratio:>10.2}");
    }
    ratios.sort_by(f64::total_cmp);
    let median = ratios[ratios.len() / 2];
    println!(
        "median Simple/LL per hop: {median:.2} (the most LL can gain on a latency-bound call here)"
    );
}
