//! loom models of the slot FIFO: under every interleaving (and every
//! reordering the C11 memory model allows), no slot is overwritten before
//! it is read, none is read twice, none is lost.
//!
//! Run: `RUSTFLAGS="--cfg loom" cargo test -p ringcc-core --release --test loom_fifo`

#![cfg(loom)]

use loom::sync::atomic::{AtomicU64, Ordering};
use loom::sync::Arc;
use loom::thread;
use ringcc_core::fifo::{can_recv, can_send_depth, ShmFifo, TryError};

/// The models use a FIFO of 2 or 4 slots instead of the production 8: the
/// protocol does not depend on the depth, and a shallow FIFO reaches
/// wrap-around and slot reuse within a state space loom can exhaust.
const DEPTH: usize = 2;

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    // Every interleaving with up to this many forced preemptions is
    // explored (besides all voluntary switches at the spin waits).
    b.preemption_bound = Some(3);
    b.check(f);
}

/// Sends `items` two-word messages through a `ShmFifo` from one thread to
/// another; the receiver must see exactly 0, 1, 2, … in order, each with
/// its matching second word.
fn spsc(items: u64) {
    model(move || {
        let fifo = Arc::new(ShmFifo::<2, DEPTH>::new());
        let tx_fifo = fifo.clone();
        let producer = thread::spawn(move || {
            let (mut tx, _) = tx_fifo.split();
            let mut i = 0;
            while i < items {
                match tx.try_send(&[i, !i]) {
                    Ok(step) => {
                        assert_eq!(step, i);
                        i += 1;
                    }
                    Err(TryError::WouldBlock) => thread::yield_now(),
                    Err(e) => panic!("{e:?}"),
                }
            }
        });
        let (_, mut rx) = fifo.split();
        let mut out = [0u64; 2];
        let mut i = 0;
        while i < items {
            match rx.try_recv(&mut out) {
                Ok(2) => {
                    assert_eq!(
                        out,
                        [i, !i],
                        "slot lost, duplicated or overwritten before read"
                    );
                    i += 1;
                }
                Ok(n) => panic!("short read {n}"),
                Err(TryError::WouldBlock) => thread::yield_now(),
                Err(e) => panic!("{e:?}"),
            }
        }
        producer.join().unwrap();
    });
}

#[test]
fn fifo_two_items() {
    spsc(2);
}

#[test]
fn fifo_wraps_around_all_slots() {
    // More items than slots: the producer must wait for credit and reuse
    // every slot, twice.
    spsc(2 * DEPTH as u64 + 1);
}

/// The machines' multi-slot slices: a slice of 2 slots is written, then
/// published by one tail store; the reader waits for `tail >= step + 2`.
#[test]
fn fifo_multi_slot_slices() {
    model(|| {
        let fifo = Arc::new(ShmFifo::<1, 4>::new());
        let f2 = fifo.clone();
        let slices = 3u64; // 6 steps: wraps the 4 slots
        let producer = thread::spawn(move || {
            let mut step = 0;
            while step < slices * 2 {
                if !can_send_depth(4, f2.head().load(), step, 2) {
                    thread::yield_now();
                    continue;
                }
                f2.write_slot(step, &[step * 10]).unwrap();
                f2.write_slot(step + 1, &[step * 10 + 1]).unwrap();
                step += 2;
                f2.tail().post(step);
            }
        });
        let mut step = 0;
        let mut out = [0u64; 1];
        while step < slices * 2 {
            if !can_recv(fifo.tail().load(), step, 2) {
                thread::yield_now();
                continue;
            }
            fifo.read_slot(step, &mut out).unwrap();
            assert_eq!(out[0], step * 10);
            fifo.read_slot(step + 1, &mut out).unwrap();
            assert_eq!(out[0], step * 10 + 1);
            step += 2;
            fifo.head().post(step);
        }
        producer.join().unwrap();
    });
}

/// The model can fail: the same protocol with a relaxed `tail` store (no
/// release) lets the reader see the counter before the data, and loom finds
/// the interleaving.
#[test]
fn relaxed_publication_is_caught() {
    let result = std::panic::catch_unwind(|| {
        model(|| {
            let data = Arc::new(AtomicU64::new(0));
            let tail = Arc::new(AtomicU64::new(0));
            let (d2, t2) = (data.clone(), tail.clone());
            let producer = thread::spawn(move || {
                d2.store(42, Ordering::Relaxed);
                t2.store(1, Ordering::Relaxed); // should be Release
            });
            if tail.load(Ordering::Acquire) >= 1 {
                assert_eq!(
                    data.load(Ordering::Relaxed),
                    42,
                    "read the slot before its data"
                );
            }
            producer.join().unwrap();
        });
    });
    assert!(result.is_err(), "loom did not find the missing release");
}
