//! Properties of the LL and LL128 slot formats (`ringcc_core::line`):
//! any data of any length at any step round-trips; units or lines that
//! arrive in any order are taken only once all have arrived; a slot left
//! from an earlier use of the same slot (any earlier step, any data) is
//! never taken as this step's data, even when part of the new slot has
//! arrived over it.

#![cfg(not(loom))]

use proptest::prelude::*;
use ringcc_core::line::{ll, ll128};
use ringcc_core::sync::{AtomicU64, Ordering};
use ringcc_core::Protocol;

fn zeroed(n: usize) -> Vec<AtomicU64> {
    (0..n).map(|_| AtomicU64::new(0)).collect()
}

fn words(s: &[AtomicU64]) -> Vec<u64> {
    s.iter().map(|w| w.load(Ordering::Relaxed)).collect()
}

/// The two formats behind one face: slot words for `cap` data bytes,
/// the arrival unit in words, write, and a reader's poll.
#[derive(Clone, Copy, Debug)]
enum Format {
    Ll,
    Ll128,
}

impl Format {
    fn slot_words(self, cap: usize) -> usize {
        let p = match self {
            Format::Ll => Protocol::Ll,
            Format::Ll128 => Protocol::Ll128,
        };
        (p.slot_line_bytes(cap as u64) / 8) as usize
    }
    /// Words that arrive together (a unit, a line).
    fn grain(self) -> usize {
        match self {
            Format::Ll => 1,
            Format::Ll128 => ll128::LINE_WORDS,
        }
    }
    fn write(self, s: &[AtomicU64], step: u64, data: &[u8]) {
        match self {
            Format::Ll => ll::write(s, step, data).unwrap(),
            Format::Ll128 => ll128::write(s, step, data).unwrap(),
        }
    }
}

enum Reader {
    Ll(ll::Reader),
    Ll128(ll128::Reader),
}

impl Reader {
    fn new(f: Format, step: u64) -> Reader {
        match f {
            Format::Ll => Reader::Ll(ll::Reader::new(step)),
            Format::Ll128 => Reader::Ll128(ll128::Reader::new(step)),
        }
    }
    fn poll(&mut self, s: &[AtomicU64], out: &mut [u8]) -> Option<usize> {
        match self {
            Reader::Ll(r) => r.poll(s, out).unwrap(),
            Reader::Ll128(r) => r.poll(s, out).unwrap(),
        }
    }
}

fn format() -> impl Strategy<Value = Format> {
    prop_oneof![Just(Format::Ll), Just(Format::Ll128)]
}

/// The words `data` at `step` puts into a slot, grouped by arrival unit
/// (a group's words are stored together, the flag last).
fn groups(f: Format, cap: usize, step: u64, data: &[u8]) -> Vec<Vec<(usize, u64)>> {
    let scratch = zeroed(f.slot_words(cap));
    f.write(&scratch, step, data);
    let w = words(&scratch);
    w.chunks(f.grain())
        .enumerate()
        .map(|(g, c)| {
            c.iter()
                .enumerate()
                .map(|(i, &v)| (g * f.grain() + i, v))
                .collect()
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn any_length_any_step_round_trips(
        f in format(),
        data in proptest::collection::vec(any::<u8>(), 0..1000),
        extra in 0usize..300,
        step in any::<u64>(),
    ) {
        let step = step % (u64::MAX - 1);
        let cap = data.len() + extra;
        let slot = zeroed(f.slot_words(cap));
        f.write(&slot, step, &data);
        let mut out = vec![0xa5u8; cap + 8];
        let mut r = Reader::new(f, step);
        prop_assert_eq!(r.poll(&slot, &mut out), Some(data.len()));
        prop_assert_eq!(&out[..data.len()], &data[..]);
        // Any other step (this slot's earlier or later use) sees nothing.
        let mut other = Reader::new(f, step.wrapping_add(8));
        prop_assert_eq!(other.poll(&slot, &mut out), None);
    }

    /// The new slot's units arrive in any order over the old slot's; the
    /// reader, polled after every arrival, answers only at the end, with
    /// exactly the new data.
    #[test]
    fn arrival_in_any_order_over_a_stale_slot(
        f in format(),
        old in proptest::collection::vec(any::<u8>(), 0..600),
        new in proptest::collection::vec(any::<u8>(), 0..600),
        old_step in 0u64..1_000_000,
        uses in 1u64..1000,
        seed in any::<u64>(),
    ) {
        let cap = 600;
        let slot = zeroed(f.slot_words(cap));
        f.write(&slot, old_step, &old);
        let step = old_step + 8 * uses;
        let mut arrivals = groups(f, cap, step, &new);
        // Only the groups the new data uses are written; shuffle them.
        let used = match f {
            Format::Ll => ll::units_for(new.len() as u64) as usize,
            Format::Ll128 => ll128::lines_for(new.len() as u64) as usize,
        };
        arrivals.truncate(used);
        let mut rng = seed | 1;
        for i in (1..arrivals.len()).rev() {
            rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
            arrivals.swap(i, (rng % (i as u64 + 1)) as usize);
        }
        let mut r = Reader::new(f, step);
        let mut out = vec![0u8; cap];
        let n = arrivals.len();
        for (k, g) in arrivals.into_iter().enumerate() {
            prop_assert_eq!(r.poll(&slot, &mut out), None, "answered before arrival {}", k);
            let (flag, rest) = g.split_last().unwrap();
            for &(i, v) in rest {
                slot[i].store(v, Ordering::Relaxed);
            }
            slot[flag.0].store(flag.1, Ordering::Release);
            let got = r.poll(&slot, &mut out);
            if k + 1 < n {
                prop_assert_eq!(got, None);
            } else {
                prop_assert_eq!(got, Some(new.len()));
            }
        }
        prop_assert_eq!(&out[..new.len()], &new[..]);
    }

    /// Data that does not fit is refused and writes nothing.
    #[test]
    fn too_long_is_refused_untouched(f in format(), cap in 0usize..300, more in 1usize..50) {
        let slot = zeroed(f.slot_words(cap));
        let real_cap = match f {
            Format::Ll => ll::capacity(slot.len()),
            Format::Ll128 => ll128::capacity(slot.len()),
        };
        let data = vec![1u8; real_cap + more];
        let r = match f {
            Format::Ll => ll::write(&slot, 0, &data),
            Format::Ll128 => ll128::write(&slot, 0, &data),
        };
        prop_assert!(r.is_err());
        prop_assert!(words(&slot).iter().all(|&w| w == 0));
    }
}
