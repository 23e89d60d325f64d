//! loom models of the LL and LL128 slot formats over a reused slot: one
//! writer, one reader, a credit counter; under every interleaving (and
//! every reordering the C11 model allows) the reader takes each step's
//! data exactly, never the previous use's, and never before it arrived.
//!
//! Run: `RUSTFLAGS="--cfg loom" cargo test -p ringcc-core --release --test loom_line`

#![cfg(loom)]

use loom::sync::Arc;
use loom::thread;
use ringcc_core::fifo::StepCounter;
use ringcc_core::line::{ll, ll128};
use ringcc_core::sync::{AtomicU64, Ordering};

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.check(f);
}

/// Step `s`'s data: `len(s)` bytes, each a function of `s`, so data of
/// one use of the slot differs from the next's.
fn data(s: u64) -> Vec<u8> {
    let len = [6usize, 3, 8][(s % 3) as usize];
    (0..len)
        .map(|i| (s as u8).wrapping_mul(31) ^ i as u8)
        .collect()
}

/// A one-slot FIFO (every step reuses the slot) carried by `write` /
/// `read`, `steps` steps; a mailbox word the writer stores (relaxed)
/// before each slot must be visible to the reader once the slot is.
fn reused_slot(
    steps: u64,
    words: usize,
    write: fn(&[AtomicU64], u64, &[u8]),
    read: fn(&[AtomicU64], u64, &mut [u8]) -> Option<usize>,
) {
    model(move || {
        let slot: Arc<Vec<AtomicU64>> = Arc::new((0..words).map(|_| AtomicU64::new(0)).collect());
        let head = Arc::new(StepCounter::new(0));
        let mailbox = Arc::new(AtomicU64::new(0));
        let (s2, h2, m2) = (slot.clone(), head.clone(), mailbox.clone());
        let writer = thread::spawn(move || {
            for s in 0..steps {
                // Credit: the receiver consumed step s - 1 (one slot).
                while h2.load() < s {
                    thread::yield_now();
                }
                m2.store(s + 1, Ordering::Relaxed);
                write(&s2, s, &data(s));
            }
        });
        let mut out = [0u8; 16];
        for s in 0..steps {
            let n = loop {
                match read(&slot, s, &mut out) {
                    Some(n) => break n,
                    None => thread::yield_now(),
                }
            };
            let want = data(s);
            assert_eq!(&out[..n], &want[..], "step {s}: stale or torn data");
            assert!(
                mailbox.load(Ordering::Relaxed) >= s + 1,
                "step {s}: slot seen before what was written ahead of it"
            );
            head.post(s + 1);
        }
        writer.join().unwrap();
    });
}

fn ll_write(s: &[AtomicU64], step: u64, d: &[u8]) {
    ll::write(s, step, d).unwrap();
}

fn ll_read(s: &[AtomicU64], step: u64, out: &mut [u8]) -> Option<usize> {
    // A fresh reader each poll: the model also covers a receiver that
    // starts over (the transport keeps one; both must be right).
    ll::Reader::new(step).poll(s, out).unwrap()
}

fn ll128_write(s: &[AtomicU64], step: u64, d: &[u8]) {
    ll128::write(s, step, d).unwrap();
}

fn ll128_read(s: &[AtomicU64], step: u64, out: &mut [u8]) -> Option<usize> {
    ll128::Reader::new(step).poll(s, out).unwrap()
}

#[test]
fn ll_slot_reused_three_times() {
    // Length unit + 2 data units: up to 8 bytes.
    reused_slot(3, 3, ll_write, ll_read);
}

#[test]
fn ll128_slot_reused_three_times() {
    // Length line + 1 data line.
    reused_slot(3, 2 * ll128::LINE_WORDS, ll128_write, ll128_read);
}

/// The model can fail: an LL writer that stores the data half and the
/// flag half of a unit separately (two stores, as a torn 8-byte write
/// would) lets the reader take a new flag with old data.
#[test]
fn a_torn_unit_is_caught() {
    fn torn_write(s: &[AtomicU64], step: u64, d: &[u8]) {
        let f = ll::flag(step);
        s[0].store(ll::pack(d.len() as u32, f), Ordering::Release);
        for (u, c) in s[1..].iter().zip(d.chunks(4)) {
            let mut b = [0u8; 4];
            b[..c.len()].copy_from_slice(c);
            let old = ll::unpack(u.load(Ordering::Relaxed)).0;
            u.store(ll::pack(old, f), Ordering::Release); // the flag half first
            u.store(ll::pack(u32::from_le_bytes(b), f), Ordering::Release);
        }
    }
    let r = std::panic::catch_unwind(|| reused_slot(2, 3, torn_write, ll_read));
    assert!(r.is_err(), "loom did not find the torn unit");
}
