//! The discrete-event engine: a virtual clock in integer picoseconds and a
//! priority queue of events ordered by time, and among equal times by the
//! order they were scheduled in, so that a run is a pure function of its
//! configuration.
//!
//! Every processed event is folded into a word-wise FNV-1a hash of
//! (time, kind, ids): two runs with the same configuration and seed have
//! the same hash; a different interleaving changes it.

use crate::calendar::Calendar;

/// Virtual time in picoseconds (2^64 ps is about 213 days).
pub(crate) type Ps = u64;

/// Seconds to picoseconds (saturating; negative and NaN give 0).
pub(crate) fn ps(seconds: f64) -> Ps {
    // `as` saturates; adding a half rounds the non-negative values.
    (seconds * 1e12 + 0.5) as Ps
}

/// Picoseconds to seconds.
pub(crate) fn secs(t: Ps) -> f64 {
    t as f64 * 1e-12
}

/// A bandwidth as picoseconds per byte in 32.32 fixed point: transfer
/// times in integer arithmetic on the hot path (within a picosecond of
/// `ps(bytes / bandwidth)`).
///
/// It holds the bandwidths from
/// [`MIN_BANDWIDTH`](crate::config::MIN_BANDWIDTH) to
/// [`MAX_BANDWIDTH`](crate::config::MAX_BANDWIDTH), which
/// [`ClusterConfig::validate`](crate::ClusterConfig::validate) enforces:
/// below, the picoseconds per byte overflow the 32 integer bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Rate(u64);

impl Rate {
    /// The rate of `bandwidth` bytes per second. Outside the range above
    /// it saturates (a slower link would look faster than it is): the
    /// configuration is validated first.
    pub fn new(bandwidth: f64) -> Rate {
        // `as` saturates (and maps NaN to 0).
        Rate((1e12 / bandwidth * 4_294_967_296.0).round() as u64)
    }

    /// Picoseconds to move `bytes`, saturating at `Ps::MAX` (a slow link
    /// and a huge transfer can exceed 2^64 ps).
    #[inline]
    pub fn time(self, bytes: u64) -> Ps {
        // (2^64 - 1)^2 + 2^31 < 2^128: the product cannot overflow.
        let t = (u128::from(bytes) * u128::from(self.0) + (1 << 31)) >> 32;
        Ps::try_from(t).unwrap_or(Ps::MAX)
    }
}

/// "No slab entry".
pub(crate) const NONE: u32 = u32::MAX;

/// What happens at a point of virtual time. Small and `Copy`: indices, not
/// references.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ev {
    /// A lane's outstanding slice is complete on its GPU.
    ExecDone { lane: u32 },
    /// The predecessor's `tail` (and, with `hdr`, the call header parked in
    /// the lane's mailbox) becomes visible to `lane`; `xfer` names NVLink
    /// payload bytes to land first.
    /// (`tail` is the low 32 bits of the step counter.)
    Tail {
        lane: u32,
        hdr: bool,
        xfer: u32,
        tail: u32,
    },
    /// A lane that waits for credit: its first pending credit arrived.
    Wake { lane: u32 },
    /// Timing-only mode: a message of `lane`'s connection was lost for
    /// good; the requester (`lane`'s rank) gets `RETRY_EXC_ERR`.
    FlowFail { lane: u32, credit: bool },
    /// The out-of-band abort from `origin` reaches `rank`.
    Abort { rank: u32, origin: u32 },
    /// A rank dies.
    Death { rank: u32 },
    /// Check every lane's deadline (run `epoch`).
    Watchdog { epoch: u32 },
    /// The RNIC processes a doorbell of a queue pair: it fetches the WQEs
    /// posted before the doorbell rang (producer index `upto`).
    Doorbell { qp: u32, upto: u32 },
    /// A NIC port may put its next packet on the wire.
    PortTx { port: u32 },
    /// A frame arrives at its destination port.
    Packet { frame: u32 },
    /// A queue pair's retransmission timer, or (`rnr`) the end of its
    /// receiver-not-ready back-off.
    QpTimer { qp: u32, rnr: bool },
    /// A tree call's event (the slab entry `id` of the tree's messages).
    Tree { id: u32 },
    /// `rank`'s kernel of run `epoch` starts (after its launch latency).
    Launch { rank: u32, epoch: u32 },
}

impl Ev {
    /// Packs the event into two words, as the calendar stores it: from
    /// registers, with two stores (an enum built on the stack and copied
    /// would be read back before its byte stores reach the cache: a
    /// store-forwarding stall on every push).
    #[inline(always)]
    pub fn pack(self) -> Packed {
        let (kind, a, b) = self.words();
        let xfer = match self {
            Ev::Tail { xfer, .. } => xfer,
            _ => 0,
        };
        Packed {
            w0: u64::from(kind) | a << 8,
            w1: b | u64::from(xfer) << 32,
        }
    }

    /// (kind, ids) for the event-log hash (`a` below 2^33, `b` below
    /// 2^32).
    #[inline(always)]
    fn words(&self) -> (u8, u64, u64) {
        match *self {
            Ev::ExecDone { lane } => (KIND_EXEC_DONE, u64::from(lane), 0),
            Ev::Tail {
                lane,
                hdr,
                xfer: _,
                tail,
            } => (
                KIND_TAIL,
                u64::from(lane) | u64::from(hdr) << 32,
                u64::from(tail),
            ),
            Ev::Wake { lane } => (KIND_WAKE, u64::from(lane), 0),
            Ev::FlowFail { lane, credit } => (4, u64::from(lane), u64::from(credit)),
            Ev::Abort { rank, origin } => (5, u64::from(rank), u64::from(origin)),
            Ev::Death { rank } => (6, u64::from(rank), 0),
            Ev::Watchdog { epoch } => (7, u64::from(epoch), 0),
            Ev::Doorbell { qp, upto } => (8, u64::from(qp), u64::from(upto)),
            Ev::PortTx { port } => (9, u64::from(port), 0),
            Ev::Packet { frame } => (10, u64::from(frame), 0),
            Ev::QpTimer { qp, rnr } => (11, u64::from(qp), u64::from(rnr)),
            Ev::Tree { id } => (12, u64::from(id), 0),
            Ev::Launch { rank, epoch } => (13, u64::from(rank), u64::from(epoch)),
        }
    }
}

/// [`Packed::kind`] of an [`Ev::ExecDone`].
pub(crate) const KIND_EXEC_DONE: u8 = 1;
/// [`Packed::kind`] of an [`Ev::Tail`].
pub(crate) const KIND_TAIL: u8 = 2;
/// [`Packed::kind`] of an [`Ev::Wake`].
pub(crate) const KIND_WAKE: u8 = 3;

/// An [`Ev`] packed into two words: `kind | a << 8` and `b | xfer << 32`
/// of [`Ev::words`] (and a `Tail`'s `xfer`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Packed {
    pub w0: u64,
    pub w1: u64,
}

impl Packed {
    /// (kind, a, b) of [`Ev::words`].
    #[inline(always)]
    fn words(self) -> (u8, u64, u64) {
        (self.w0 as u8, self.w0 >> 8, self.w1 & 0xffff_ffff)
    }

    /// The lane of an `ExecDone`, `Tail` or `Wake` (what [`Ev::words`]
    /// keeps in the low 32 bits of `a`), as [`Packed::kind`] tells.
    #[inline(always)]
    pub fn lane(self) -> u32 {
        (self.w0 >> 8) as u32
    }

    /// The kind of [`Ev::words`]: [`KIND_EXEC_DONE`], [`KIND_TAIL`],
    /// [`KIND_WAKE`], or another event's.
    #[inline(always)]
    pub fn kind(self) -> u8 {
        self.w0 as u8
    }

    /// The event.
    #[inline(always)]
    pub fn unpack(self) -> Ev {
        let (kind, a, b) = self.words();
        let (lo, b32) = (a as u32, b as u32);
        match kind {
            KIND_EXEC_DONE => Ev::ExecDone { lane: lo },
            KIND_TAIL => Ev::Tail {
                lane: lo,
                hdr: a >> 32 != 0,
                xfer: (self.w1 >> 32) as u32,
                tail: b32,
            },
            KIND_WAKE => Ev::Wake { lane: lo },
            4 => Ev::FlowFail {
                lane: lo,
                credit: b != 0,
            },
            5 => Ev::Abort {
                rank: lo,
                origin: b32,
            },
            6 => Ev::Death { rank: lo },
            7 => Ev::Watchdog { epoch: lo },
            8 => Ev::Doorbell { qp: lo, upto: b32 },
            9 => Ev::PortTx { port: lo },
            10 => Ev::Packet { frame: lo },
            12 => Ev::Tree { id: lo },
            13 => Ev::Launch {
                rank: lo,
                epoch: b32,
            },
            _ => Ev::QpTimer {
                qp: lo,
                rnr: b != 0,
            },
        }
    }
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// FNV-1a over 64-bit words (one multiply per word, not per byte: the
/// log is hashed on the hot path).
#[inline]
fn fnv_word(h: u64, w: u64) -> u64 {
    (h ^ w).wrapping_mul(FNV_PRIME)
}

/// The clock and the queue.
#[derive(Debug)]
pub(crate) struct Events {
    heap: Calendar,
    now: Ps,
    processed: u64,
    hash: u64,
}

impl Events {
    /// An engine whose calendar buckets are `2^shift` ps wide.
    pub fn new(shift: u32) -> Events {
        Events {
            heap: Calendar::new(shift.min(40)),
            now: 0,
            processed: 0,
            hash: FNV_OFFSET,
        }
    }

    /// The current virtual time.
    #[inline]
    pub fn now(&self) -> Ps {
        self.now
    }

    /// Schedules `ev` at `time` (not before now).
    #[inline(always)]
    pub fn at(&mut self, time: Ps, ev: Ev) {
        let time = time.max(self.now);
        self.heap.push(time, ev.pack());
    }

    /// Schedules `ev` `delay` after now.
    #[inline]
    pub fn after(&mut self, delay: Ps, ev: Ev) {
        self.at(self.now.saturating_add(delay), ev);
    }

    /// The next event; the clock moves to its time (the run loop uses
    /// [`pop_packed`](Events::pop_packed)).
    #[cfg(test)]
    pub fn pop(&mut self) -> Option<Ev> {
        self.pop_packed().map(Packed::unpack)
    }

    /// The next event, left packed (for a dispatch on its kind, without
    /// building the enum first); the clock moves to its time.
    #[inline]
    pub fn pop_packed(&mut self) -> Option<Packed> {
        let e = self.heap.pop()?;
        let time = e.time;
        self.now = time;
        self.processed = self.processed.wrapping_add(1);
        let (kind, a, b) = e.ev.words();
        let mut h = fnv_word(self.hash, time);
        h = fnv_word(h, u64::from(kind));
        h = fnv_word(h, a);
        self.hash = fnv_word(h, b);
        Some(e.ev)
    }

    /// The event `k + 1` places after the one just popped, when it is
    /// already known (in the calendar bucket being drained): a hint for
    /// prefetching.
    #[inline]
    pub fn peek_ahead(&self, k: usize) -> Option<Ev> {
        self.heap.peek_current(k).map(|e| e.ev.unpack())
    }

    /// Whether the event just popped began a calendar bucket: the events
    /// after it were not known before (see [`peek_ahead`](Events::peek_ahead)).
    #[inline]
    pub fn began_bucket(&self) -> bool {
        self.heap.first_of_bucket()
    }

    /// Events processed so far.
    pub fn processed(&self) -> u64 {
        self.processed
    }

    /// Hash of the event log so far.
    pub fn hash(&self) -> u64 {
        self.hash
    }
}

/// A vector of optional entries with a free list: stable `u32` ids for
/// things in flight (frames, NVLink payloads).
#[derive(Debug)]
pub(crate) struct Slab<T> {
    items: Vec<Option<T>>,
    free: Vec<u32>,
}

impl<T> Slab<T> {
    pub fn new() -> Slab<T> {
        Slab {
            items: Vec::new(),
            free: Vec::new(),
        }
    }

    pub fn insert(&mut self, v: T) -> u32 {
        match self.free.pop() {
            Some(i) => {
                if let Some(slot) = self.items.get_mut(i as usize) {
                    *slot = Some(v);
                }
                i
            }
            None => {
                self.items.push(Some(v));
                (self.items.len() - 1) as u32
            }
        }
    }

    pub fn take(&mut self, i: u32) -> Option<T> {
        let v = self.items.get_mut(i as usize)?.take();
        if v.is_some() {
            self.free.push(i);
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_times_pop_in_schedule_order() {
        let mut e = Events::new(10);
        e.at(5, Ev::Wake { lane: 1 });
        e.at(3, Ev::Wake { lane: 2 });
        e.at(5, Ev::Wake { lane: 3 });
        e.at(5, Ev::Wake { lane: 4 });
        let order: Vec<u32> = std::iter::from_fn(|| e.pop())
            .map(|ev| match ev {
                Ev::Wake { lane } => lane,
                _ => unreachable!(),
            })
            .collect();
        assert_eq!(order, [2, 1, 3, 4]);
        assert_eq!(e.now(), 5);
        assert_eq!(e.processed(), 4);
    }

    #[test]
    fn calendar_pops_in_key_order() {
        // Random pushes no earlier than the last pop, against a sorted
        // model.
        let mut rng = crate::faults::Rng::new(9);
        let mut e = Events::new(10);
        let mut model: Vec<(Ps, u32)> = Vec::new();
        let mut id = 0u32;
        for round in 0..2000 {
            for _ in 0..(rng.next_u64() % 4) {
                let dt = match rng.next_u64() % 4 {
                    0 => 0,
                    1 => rng.next_u64() % 10,
                    2 => rng.next_u64() % 100_000,
                    _ => rng.next_u64() % (1 << 40),
                };
                let t = e.now() + dt;
                e.at(t, Ev::ExecDone { lane: id });
                model.push((t, id));
                id += 1;
            }
            if round % 3 != 0 {
                // Stable sort: equal times keep schedule order.
                model.sort_by_key(|&(t, _)| t);
                let want = (!model.is_empty()).then(|| model.remove(0));
                let got = e.pop().map(|ev| match ev {
                    Ev::ExecDone { lane } => (e.now(), lane),
                    _ => unreachable!(),
                });
                assert_eq!(got, want);
            }
        }
    }

    #[test]
    fn events_pack_and_unpack() {
        let m = u32::MAX;
        for ev in [
            Ev::ExecDone { lane: m },
            Ev::Tail {
                lane: m,
                hdr: true,
                xfer: m - 1,
                tail: m - 2,
            },
            Ev::Tail {
                lane: 7,
                hdr: false,
                xfer: NONE,
                tail: 0,
            },
            Ev::Wake { lane: 3 },
            Ev::FlowFail {
                lane: m,
                credit: true,
            },
            Ev::FlowFail {
                lane: 0,
                credit: false,
            },
            Ev::Abort { rank: m, origin: m },
            Ev::Death { rank: m },
            Ev::Watchdog { epoch: m },
            Ev::Doorbell { qp: m, upto: m },
            Ev::PortTx { port: m },
            Ev::Packet { frame: m },
            Ev::QpTimer { qp: m, rnr: true },
            Ev::QpTimer { qp: 1, rnr: false },
        ] {
            assert_eq!(ev.pack().unpack(), ev);
            assert_eq!(ev.pack().words(), ev.words());
        }
    }

    #[test]
    fn hash_depends_on_the_log() {
        let run = |t: Ps| {
            let mut e = Events::new(10);
            e.at(t, Ev::ExecDone { lane: 0 });
            e.pop();
            e.hash()
        };
        assert_eq!(run(1), run(1));
        assert_ne!(run(1), run(2));
    }

    #[test]
    fn slab_reuses_ids() {
        let mut s = Slab::new();
        let a = s.insert(1);
        let b = s.insert(2);
        assert_eq!(s.take(a), Some(1));
        assert_eq!(s.take(a), None);
        let c = s.insert(3);
        assert_eq!(c, a);
        assert_eq!(s.take(b), Some(2));
        assert_eq!(ps(1.5e-6), 1_500_000);
        assert_eq!(Rate::new(300e9).time(300), 1000);
        for bw in [50e9, 300e9, 3e12, 1e9] {
            let r = Rate::new(bw);
            for b in [0u64, 1, 7, 4096, 1 << 20, 3 << 30] {
                assert!(r.time(b).abs_diff(ps(b as f64 / bw)) <= 1, "{bw} {b}");
            }
        }
    }

    #[test]
    fn rate_holds_the_accepted_bandwidths_and_saturates_past_them() {
        use crate::config::{MAX_BANDWIDTH, MIN_BANDWIDTH};
        // 1 KB/s: 1e9 ps per byte; 2^40 bytes take 1.1e21 ps > 2^64: the
        // time saturates instead of wrapping.
        let r = Rate::new(1e3);
        assert_eq!(r.time(1 << 40), Ps::MAX);
        assert_eq!(Rate::new(MIN_BANDWIDTH).time(u64::MAX), Ps::MAX);
        assert!(r.time(1 << 30) < r.time(1 << 31));
        // The slowest accepted bandwidth still fits, one byte per second
        // less does not (it saturates: the validation is what stops it).
        assert!(Rate::new(MIN_BANDWIDTH).0 < u64::MAX);
        assert_eq!(Rate::new(MIN_BANDWIDTH - 1.0).0, u64::MAX);
        assert!(Rate::new(MAX_BANDWIDTH).0 >= 1);
        // Over the slow end of the range, times are exact to 1e-9.
        for bw in [MIN_BANDWIDTH, 1e3, 1e6] {
            let r = Rate::new(bw);
            for b in [1u64, 4096, 1 << 20, 32 << 20] {
                let exact = b as f64 / bw * 1e12;
                let rel = (r.time(b) as f64 - exact).abs() / exact;
                assert!(rel < 1e-9, "{bw} B/s, {b} B: {} ps, not {exact}", r.time(b));
            }
        }
        assert!(Rate::new(MIN_BANDWIDTH).time(4096) > Rate::new(1e3).time(4096));
    }
}
