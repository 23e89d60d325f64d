//! The event queue: a calendar of time buckets, exact in (time, push
//! order).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::events::{Ev, Packed, Ps};

/// A scheduled event.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Entry {
    pub time: Ps,
    pub ev: Packed,
}

/// Buckets of the calendar ring (a power of two).
const RING: usize = 1 << 13;

/// Entries per storage block.
const BLOCK: usize = 8;

/// "No block".
const NIL: u32 = u32::MAX;

/// The bucket width is checked after this many bucket loads, or events
/// loaded, whichever comes first.
const CHECK_LOADS: u32 = 4096;
const CHECK_EVENTS: u64 = 1 << 16;

/// Width rules: more than `HIGH` distinct times in a bucket on average
/// halve it (unless the horizon would be too short); fewer than `LOW`
/// events in a bucket, or more than one push in `FAR` beyond the horizon,
/// double it. (Events cluster at equal times, all ranks doing the same
/// work at once: narrowing cannot split those.)
const HIGH: u64 = 16;
const LOW: u64 = 2;
const FAR: u64 = 16;

/// A calendar queue: a ring of fixed-width time buckets covering the near
/// future, an ordered heap for the far future. Pop order is exactly
/// ascending time, and push order among equal times.
///
/// Large clusters keep tens of thousands of events pending, each pushed
/// into a random bucket, so the layout is about cache misses:
///
/// - A bucket is a chain of fixed-size blocks from one pool (freed blocks
///   are reused first, while still cached), and where its next entry goes
///   (block and fill) sits in a small per-bucket array: a push is one
///   store into the block, with no pointer to chase first.
/// - Entries carry no sequence number: a bucket holds its entries in push
///   order (the far heap's migrate before any direct push can reach their
///   bucket), and the bucket being drained is sorted stably by time.
/// - The bucket width adapts: every few thousand buckets it is halved or
///   doubled when the buckets hold too many or too few events on average,
///   so that a push is an append and a bucket a short sort whatever the
///   event density.
///
/// The bucket being drained (`current`) is sorted ascending and read
/// from a cursor (`next_entry`), so that loading it needs no reversal; an
/// event for it is inserted in order among the entries not yet read.
#[derive(Debug)]
pub(crate) struct Calendar {
    /// log2 of the bucket width in picoseconds.
    shift: u32,
    /// Absolute bucket number being drained.
    cur: u64,
    /// Its events, sorted ascending; those before `next_entry` are popped.
    current: Vec<Entry>,
    /// The next entry of `current` to pop.
    next_entry: usize,
    /// Per ring slot: first block of its chain (`NIL`: empty).
    head: Vec<u32>,
    /// Per ring slot: last block of its chain and its fill.
    tail: Vec<(u32, u32)>,
    /// Block storage and chain links.
    blocks: Vec<[Entry; BLOCK]>,
    next: Vec<u32>,
    free: Vec<u32>,
    /// Bit per ring slot: not empty.
    bits: Vec<u64>,
    /// Events beyond the ring's horizon, by (time, push number).
    far: BinaryHeap<Reverse<(Ps, u64, FarEv)>>,
    /// Push counter (orders the far heap).
    pushes: u64,
    /// Since the last width check.
    tally: Tally,
    /// Width checks enabled (the heuristic's tests turn them off).
    adapt: bool,
}

/// An event in the far heap (ordered by the tuple before it only).
#[derive(Clone, Copy, Debug)]
struct FarEv(Packed);

impl PartialEq for FarEv {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}
impl Eq for FarEv {}
impl PartialOrd for FarEv {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for FarEv {
    fn cmp(&self, _: &Self) -> std::cmp::Ordering {
        std::cmp::Ordering::Equal
    }
}

impl Calendar {
    /// A calendar whose buckets start `2^shift` ps wide.
    pub fn new(shift: u32) -> Calendar {
        Calendar {
            shift,
            cur: 0,
            current: Vec::new(),
            next_entry: 0,
            head: vec![NIL; RING],
            tail: vec![(NIL, 0); RING],
            blocks: Vec::new(),
            next: Vec::new(),
            free: Vec::new(),
            bits: vec![0; RING / 64],
            far: BinaryHeap::new(),
            pushes: 0,
            tally: Tally::default(),
            adapt: true,
        }
    }

    /// The current log2 bucket width.
    #[cfg(test)]
    pub fn shift(&self) -> u32 {
        self.shift
    }

    /// Turns the width adaptation on or off.
    #[cfg(test)]
    pub fn set_adapt(&mut self, on: bool) {
        self.adapt = on;
    }

    #[inline]
    fn bucket(&self, time: Ps) -> u64 {
        time >> self.shift
    }

    /// Always inlined, and the entry passed as scalars (registers) to
    /// what is not: the common case writes it straight into its block
    /// instead of building it on the stack and reading it back (a
    /// store-forwarding stall on every push).
    #[inline(always)]
    pub fn push(&mut self, time: Ps, ev: Packed) {
        self.pushes = self.pushes.wrapping_add(1);
        let b = self.bucket(time);
        if b <= self.cur {
            self.push_current(time, ev);
        } else if b - self.cur < RING as u64 {
            self.append((b as usize) & (RING - 1), time, ev);
        } else {
            self.push_far(time, ev);
        }
    }

    /// An event for the bucket being drained (times never go back): after
    /// every entry of the same time, which were pushed before.
    #[inline(never)]
    fn push_current(&mut self, time: Ps, ev: Packed) {
        let first = self.next_entry;
        let i = first + self.current[first..].partition_point(|x| x.time <= time);
        self.current.insert(i, Entry { time, ev });
        self.tally.events += 1;
    }

    #[inline(never)]
    fn push_far(&mut self, time: Ps, ev: Packed) {
        self.tally.far += 1;
        self.far.push(Reverse((time, self.pushes, FarEv(ev))));
    }

    /// Appends an entry to ring slot `s`.
    #[inline(always)]
    fn append(&mut self, s: usize, time: Ps, ev: Packed) {
        let (blk, fill) = self.tail[s];
        if blk != NIL && (fill as usize) < BLOCK {
            let slot = &mut self.blocks[blk as usize][fill as usize];
            // Field by field, from registers.
            slot.time = time;
            slot.ev.w0 = ev.w0;
            slot.ev.w1 = ev.w1;
            self.tail[s] = (blk, fill + 1);
            return;
        }
        self.append_block(s, time, ev);
    }

    /// Appends an entry to ring slot `s` in a new block.
    #[inline(never)]
    fn append_block(&mut self, s: usize, time: Ps, ev: Packed) {
        let (blk, _) = self.tail[s];
        let nb = self.alloc();
        self.blocks[nb as usize][0] = Entry { time, ev };
        if blk == NIL {
            self.head[s] = nb;
            self.bits[s / 64] |= 1 << (s % 64);
        } else {
            self.next[blk as usize] = nb;
        }
        self.tail[s] = (nb, 1);
    }

    fn alloc(&mut self) -> u32 {
        let b = match self.free.pop() {
            Some(b) => b,
            None => {
                self.blocks.push(
                    [Entry {
                        time: 0,
                        ev: Ev::Wake { lane: 0 }.pack(),
                    }; BLOCK],
                );
                self.next.push(NIL);
                (self.blocks.len() - 1) as u32
            }
        };
        self.next[b as usize] = NIL;
        b
    }

    /// Moves ring slot `s`'s entries, in push order, to the end of `out`
    /// and empties the slot.
    fn take_slot(&mut self, s: usize, out: &mut Vec<Entry>) {
        let (last, fill) = self.tail[s];
        let mut b = self.head[s];
        while b != NIL {
            let n = if b == last { fill as usize } else { BLOCK };
            out.extend_from_slice(&self.blocks[b as usize][..n]);
            self.free.push(b);
            b = self.next[b as usize];
        }
        self.head[s] = NIL;
        self.tail[s] = (NIL, 0);
        self.bits[s / 64] &= !(1 << (s % 64));
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

    /// The next entry of the bucket being drained, if any is left.
    #[inline(always)]
    fn pop_current(&mut self) -> Option<Entry> {
        let e = *self.current.get(self.next_entry)?;
        self.next_entry += 1;
        Some(e)
    }

    /// The entry `k` places after the next one to pop (`0`: that one), if
    /// it is in the bucket being drained (a hint for prefetching).
    #[inline]
    pub fn peek_current(&self, k: usize) -> Option<&Entry> {
        // Wrapping: past the end either way, and no saturation to pay for.
        self.current.get(self.next_entry.wrapping_add(k))
    }

    /// Whether the entry popped last was the first of its bucket (the
    /// bucket was just loaded: the entries after it were out of sight of
    /// [`peek_current`](Calendar::peek_current) until now).
    #[inline]
    pub fn first_of_bucket(&self) -> bool {
        self.next_entry == 1
    }

    #[inline]
    pub fn pop(&mut self) -> Option<Entry> {
        if let Some(e) = self.pop_current() {
            return Some(e);
        }
        // Between buckets: the width is checked here, not on every pop.
        if self.adapt && (self.tally.loads >= CHECK_LOADS || self.tally.events >= CHECK_EVENTS) {
            self.check_width();
            if let Some(e) = self.pop_current() {
                return Some(e);
            }
        }
        self.load_next()?;
        self.pop_current()
    }

    /// Makes the next non-empty bucket current (`current` is used up);
    /// `None` when there is none.
    fn load_next(&mut self) -> Option<()> {
        self.current.clear();
        self.next_entry = 0;
        let ring = self.next_in_ring();
        let far = self.far.peek().map(|e| self.bucket(e.0 .0));
        let next = match (ring, far) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => a.or(b)?,
        };
        self.cur = next;
        // Far events whose bucket came within the horizon, before any
        // push can reach it, and in (time, push) order: push order
        // within every bucket is kept.
        while let Some(&Reverse((time, _, _))) = self.far.peek() {
            let b = self.bucket(time);
            if b - self.cur >= RING as u64 {
                break;
            }
            let Some(Reverse((time, _, FarEv(ev)))) = self.far.pop() else {
                break;
            };
            if b == self.cur {
                self.current.push(Entry { time, ev });
            } else {
                self.append((b as usize) & (RING - 1), time, ev);
            }
        }
        let s = (self.cur as usize) & (RING - 1);
        let mut cur = std::mem::take(&mut self.current);
        self.take_slot(s, &mut cur);
        self.tally.loads += 1;
        self.tally.events += cur.len() as u64;
        self.tally.distinct += sort_by_time(&mut cur);
        self.current = cur;
        Some(())
    }

    /// Halves or doubles the bucket width when the mean bucket is too
    /// full or too empty; re-files every pending event, in pop order.
    #[cold]
    fn check_width(&mut self) {
        let t = std::mem::take(&mut self.tally);
        let loads = u64::from(t.loads.max(1));
        let far = t.far.saturating_mul(FAR) > t.events;
        let shift = if far || t.events < LOW * loads {
            self.shift + 1
        } else if t.distinct > HIGH * loads && t.far.saturating_mul(FAR * 4) <= t.events {
            self.shift.saturating_sub(1)
        } else {
            return;
        };
        if shift == self.shift || shift > 40 {
            return;
        }
        let mut all = Vec::new();
        while let Some(e) = self.pop_no_check() {
            all.push(e);
        }
        self.shift = shift;
        self.cur = all.first().map_or(self.cur, |e| self.bucket(e.time));
        for e in all {
            self.push(e.time, e.ev);
        }
    }

    /// `pop` without width checks (for re-filing).
    fn pop_no_check(&mut self) -> Option<Entry> {
        if let Some(e) = self.pop_current() {
            return Some(e);
        }
        self.load_next()?;
        self.pop_current()
    }
}

/// Sorts a bucket (in push order) stably by time, which gives (time,
/// push) order; returns the number of distinct times.
fn sort_by_time(v: &mut [Entry]) -> u64 {
    if v.len() <= 24 {
        // Stable insertion sort: buckets hold a handful of events.
        for i in 1..v.len() {
            let e = v[i];
            let mut j = i;
            while j > 0 && v[j - 1].time > e.time {
                v[j] = v[j - 1];
                j -= 1;
            }
            v[j] = e;
        }
    } else {
        v.sort_by_key(|e| e.time);
    }
    let mut distinct = 0u64;
    let mut last = None;
    for e in v.iter() {
        distinct += u64::from(last != Some(e.time));
        last = Some(e.time);
    }
    distinct
}

/// What the buckets were like since the last width check.
#[derive(Clone, Copy, Debug, Default)]
struct Tally {
    /// Buckets loaded.
    loads: u32,
    /// Events they held, or that were inserted into the bucket being
    /// drained.
    events: u64,
    /// Distinct times in the buckets loaded.
    distinct: u64,
    /// Pushes beyond the horizon.
    far: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pushes no earlier than the last pop, in phases of dense and sparse
    /// times (so the width adapts both ways, and events cross the ring's
    /// horizon), against a model ordered by (time, push number).
    #[test]
    fn pops_in_order_while_the_width_adapts() {
        let mut rng = crate::faults::Rng::new(7);
        let mut c = Calendar::new(20);
        let mut model = BinaryHeap::new();
        let (mut now, mut id) = (0u64, 0u32);
        let (mut narrowed, mut widened) = (false, false);
        for phase in 0..6 {
            let spread = match phase % 3 {
                0 => 1 << 12,
                1 => 1 << 30,
                _ => 1 << 44,
            };
            for _ in 0..150_000 {
                for _ in 0..(rng.next_u64() % 3) {
                    let dt = match rng.next_u64() % 8 {
                        0 => 0,
                        1 => rng.next_u64() % 4,
                        _ => rng.next_u64() % spread,
                    };
                    c.push(now + dt, Ev::Wake { lane: id }.pack());
                    model.push(Reverse((now + dt, id)));
                    id += 1;
                }
                let before = c.shift();
                let got = c.pop().map(|e| match e.ev.unpack() {
                    Ev::Wake { lane } => (e.time, lane),
                    _ => unreachable!(),
                });
                narrowed |= c.shift() < before;
                widened |= c.shift() > before;
                let want = model.pop().map(|Reverse(x)| x);
                assert_eq!(got, want);
                if let Some((t, _)) = got {
                    now = t;
                }
            }
        }
        while let Some(Reverse(want)) = model.pop() {
            let e = c.pop().unwrap();
            assert_eq!(
                (
                    e.time,
                    matches!(e.ev.unpack(), Ev::Wake { lane } if lane == want.1)
                ),
                (want.0, true)
            );
        }
        assert!(c.pop().is_none());
        assert!(narrowed && widened, "the width adapted both ways");
    }

    #[test]
    fn equal_times_keep_push_order_without_adaptation() {
        let mut c = Calendar::new(4);
        c.set_adapt(false);
        for (i, t) in [100u64, 3, 100, 1 << 40, 3, 100, 1 << 40]
            .into_iter()
            .enumerate()
        {
            c.push(t, Ev::Wake { lane: i as u32 }.pack());
        }
        let order: Vec<u32> = std::iter::from_fn(|| c.pop())
            .map(|e| match e.ev.unpack() {
                Ev::Wake { lane } => lane,
                _ => unreachable!(),
            })
            .collect();
        assert_eq!(order, [1, 4, 0, 2, 5, 3, 6]);
        assert_eq!(c.shift(), 4);
    }
}
