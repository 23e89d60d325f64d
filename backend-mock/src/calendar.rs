//! The event queue: a calendar of time buckets, exact in (time, seq)
//! order.

use crate::engine::Ev;

/// A scheduled event.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Entry {
    /// `time << 64 | seq`: ordering by the key is ordering by (time, seq).
    pub key: u128,
    pub ev: Ev,
}

/// Buckets of the calendar ring (a power of two).
const RING: usize = 1 << 14;

/// A calendar queue of the keys (time, seq): a ring of fixed-width time
/// buckets covering the near future, an ordered heap for the far future.
/// The bucket being drained is sorted once; an event for it is inserted
/// in order. With a width that holds a few events per bucket, a push is
/// an append and a pop a `Vec::pop`, whatever the number of pending
/// events (a binary heap's pop walks log n cache lines). Pop order is
/// exactly ascending (time, seq).
#[derive(Debug)]
pub(crate) struct Calendar {
    /// log2 of the bucket width in picoseconds.
    shift: u32,
    /// Absolute bucket number being drained.
    cur: u64,
    /// Its events, sorted descending (the next one last).
    pub current: Vec<Entry>,
    ring: Vec<Vec<Entry>>,
    /// Bit per ring slot: not empty.
    bits: Vec<u64>,
    /// Events beyond the ring's horizon.
    far: std::collections::BinaryHeap<std::cmp::Reverse<FarEntry>>,
}

/// An entry of the far heap, ordered by key.
#[derive(Clone, Copy, Debug)]
struct FarEntry(Entry);

impl PartialEq for FarEntry {
    fn eq(&self, o: &Self) -> bool {
        self.0.key == o.0.key
    }
}
impl Eq for FarEntry {}
impl PartialOrd for FarEntry {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for FarEntry {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.0.key.cmp(&o.0.key)
    }
}

impl Calendar {
    pub fn new(shift: u32) -> Calendar {
        Calendar {
            shift,
            cur: 0,
            current: Vec::new(),
            ring: (0..RING).map(|_| Vec::new()).collect(),
            bits: vec![0; RING / 64],
            far: std::collections::BinaryHeap::new(),
        }
    }

    #[inline]
    fn bucket(&self, key: u128) -> u64 {
        ((key >> 64) as u64) >> self.shift
    }

    #[inline]
    pub fn push(&mut self, e: Entry) {
        let b = self.bucket(e.key);
        if b <= self.cur {
            // The bucket being drained (keys never go back in time).
            let i = self.current.partition_point(|x| x.key > e.key);
            self.current.insert(i, e);
        } else if b - self.cur < RING as u64 {
            let s = (b as usize) & (RING - 1);
            self.ring[s].push(e);
            self.bits[s / 64] |= 1 << (s % 64);
        } else {
            self.far.push(std::cmp::Reverse(FarEntry(e)));
        }
    }

    /// The first non-empty ring slot after the current bucket, as an
    /// absolute bucket number.
    fn next_in_ring(&self) -> Option<u64> {
        let start = ((self.cur as usize) + 1) & (RING - 1);
        let words = RING / 64;
        let (w0, b0) = (start / 64, start % 64);
        let first = self.bits[w0] & (!0u64 << b0);
        let found = if first != 0 {
            Some(w0 * 64 + first.trailing_zeros() as usize)
        } else {
            (1..=words).find_map(|k| {
                let w = (w0 + k) % words;
                let v = self.bits[w];
                (v != 0).then(|| w * 64 + v.trailing_zeros() as usize)
            })
        }?;
        let dist = (found + RING - start) % RING;
        Some(self.cur + 1 + dist as u64)
    }

    #[inline]
    pub fn pop(&mut self) -> Option<Entry> {
        if let Some(e) = self.current.pop() {
            return Some(e);
        }
        let ring = self.next_in_ring();
        let far = self.far.peek().map(|e| self.bucket(e.0 .0.key));
        let next = match (ring, far) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => a.or(b)?,
        };
        self.cur = next;
        while let Some(e) = self.far.peek() {
            let b = self.bucket(e.0 .0.key);
            if b - self.cur >= RING as u64 {
                break;
            }
            let e = self.far.pop()?.0 .0;
            let s = (b as usize) & (RING - 1);
            self.ring[s].push(e);
            self.bits[s / 64] |= 1 << (s % 64);
        }
        let s = (self.cur as usize) & (RING - 1);
        std::mem::swap(&mut self.current, &mut self.ring[s]);
        self.bits[s / 64] &= !(1 << (s % 64));
        self.current
            .sort_unstable_by_key(|e| std::cmp::Reverse(e.key));
        self.current.pop()
    }
}
