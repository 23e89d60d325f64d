//! Slot flow control.
//!
//! A connection (one rank to its successor, on one channel) is a FIFO of
//! [`STEPS`] slots living in the receiver's memory, with two monotonically
//! increasing step counters:
//!
//! - `tail`, written by the sender: data for every step `< tail` is in its
//!   slot (slot of step `s` is `s mod STEPS`);
//! - `head`, written by the receiver: every step `< head` has been consumed,
//!   its slot may be reused.
//!
//! The sender may fill step `s` only when `s < head + STEPS`; the receiver
//! may read step `s` only when `s < tail`. A slice occupies one or more
//! consecutive slots and moves both counters by that many steps.
//!
//! The pure rules are [`can_send`] / [`can_recv`]; [`ShmFifo`] is the
//! shared-memory implementation (release on post, acquire on wait), whose
//! slot words are atomics too, so it is entirely safe code. Its loom models
//! live in `tests/loom_fifo.rs`.

use crate::error::Error;
use crate::id::SlotIndex;
use crate::sync::{AtomicU64, Ordering};

/// Slots per connection (NCCL's `NCCL_STEPS`).
pub const STEPS: u64 = 8;

/// The slot that holds step `step`.
#[inline]
pub const fn slot_of(step: u64) -> SlotIndex {
    SlotIndex((step % STEPS) as u8)
}

/// Whether a sender that has seen `head` may fill steps `step..step+slots`.
#[inline]
pub const fn can_send(head: u64, step: u64, slots: u64) -> bool {
    can_send_depth(STEPS, head, step, slots)
}

/// [`can_send`] for a FIFO of `depth` slots.
#[inline]
pub const fn can_send_depth(depth: u64, head: u64, step: u64, slots: u64) -> bool {
    match (step.checked_add(slots), head.checked_add(depth)) {
        (Some(end), Some(limit)) => end <= limit,
        _ => false,
    }
}

/// Whether a receiver that has seen `tail` may read steps `step..step+slots`.
#[inline]
pub const fn can_recv(tail: u64, step: u64, slots: u64) -> bool {
    match step.checked_add(slots) {
        Some(end) => end <= tail,
        None => false,
    }
}

/// How a chunk is cut into FIFO slots.
///
/// NCCL's Simple protocol: 512 KiB slots, a chunk of 4 slots (2 MiB) sent
/// as slices of 2 slots. A chunk always takes the same number of slices,
/// even when it is short or empty, so both ends stay in lock-step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct FifoGeometry {
    slot_bytes: u64,
    slots_per_slice: u64,
}

impl FifoGeometry {
    /// NCCL's defaults: 512 KiB slots, 2 slots per slice.
    pub const NCCL: FifoGeometry = FifoGeometry {
        slot_bytes: 512 * 1024,
        slots_per_slice: 2,
    };

    /// `slot_bytes` per slot (a non-zero multiple of 16), `slots_per_slice`
    /// slots per slice: 1, 2 or 4. It must divide [`STEPS`], so that a
    /// slice never wraps around the end of the FIFO, and leave room for two
    /// slices: a ring whose FIFOs hold one slice deadlocks, since every rank
    /// frees its input only by sending into its successor's full FIFO (the
    /// executor's properties found exactly that).
    pub const fn new(slot_bytes: u64, slots_per_slice: u64) -> Result<FifoGeometry, Error> {
        if slot_bytes == 0 || !slot_bytes.is_multiple_of(16) {
            return Err(Error::BadFifoGeometry);
        }
        if slots_per_slice == 0
            || !STEPS.is_multiple_of(slots_per_slice)
            || slots_per_slice.saturating_mul(2) > STEPS
        {
            return Err(Error::BadFifoGeometry);
        }
        Ok(FifoGeometry {
            slot_bytes,
            slots_per_slice,
        })
    }

    /// Bytes per slot.
    pub const fn slot_bytes(&self) -> u64 {
        self.slot_bytes
    }

    /// Slots per slice.
    pub const fn slots_per_slice(&self) -> u64 {
        self.slots_per_slice
    }

    /// Bytes per slice.
    pub const fn slice_bytes(&self) -> u64 {
        self.slot_bytes.saturating_mul(self.slots_per_slice)
    }

    /// Bytes of the whole FIFO (what a receiver registers per connection).
    pub const fn fifo_bytes(&self) -> u64 {
        self.slot_bytes.saturating_mul(STEPS)
    }

    /// The most slices a chunk may take: one less than the FIFO holds
    /// (see [`Machine::new`](crate::prim::Machine::new)). NCCL's geometry:
    /// 3, with its 2-slice chunks.
    pub const fn max_slices_per_chunk(&self) -> u64 {
        match STEPS.checked_div(self.slots_per_slice) {
            Some(s) => s.saturating_sub(1),
            None => 0,
        }
    }

    /// The largest chunk (bytes) this geometry can pipeline.
    pub const fn max_chunk_bytes(&self) -> u64 {
        self.max_slices_per_chunk()
            .saturating_mul(self.slice_bytes())
    }

    /// Slices a chunk of `chunk_bytes` is cut into (at least 1).
    pub const fn slices_per_chunk(&self, chunk_bytes: u64) -> u64 {
        let s = crate::math::div_up(chunk_bytes, self.slice_bytes());
        if s == 0 {
            1
        } else {
            s
        }
    }
}

impl Default for FifoGeometry {
    fn default() -> Self {
        FifoGeometry::NCCL
    }
}

/// Why a non-blocking FIFO operation did not happen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum TryError {
    /// No free slot (send) / no filled slot (receive) yet: try again later.
    WouldBlock,
    /// The data does not fit in a slot / the output is shorter than the
    /// slot's data. Nothing was written.
    TooLong,
}

/// A monotonically increasing step counter shared between two threads:
/// stores are releases, loads are acquires.
///
/// `repr(transparent)` over one `AtomicU64`: a counter may live in memory
/// shared between processes (the host crate's shared-memory segment views
/// an aligned, initialised 8-byte word as a `StepCounter`).
#[derive(Debug)]
#[repr(transparent)]
pub struct StepCounter(AtomicU64);

impl StepCounter {
    /// A counter at `v`.
    pub fn new(v: u64) -> Self {
        StepCounter(AtomicU64::new(v))
    }

    /// Publishes `v`: everything written before is visible to whoever
    /// [`load`](Self::load)s `v` or more.
    #[inline]
    pub fn post(&self, v: u64) {
        self.0.store(v, Ordering::Release);
    }

    /// The latest value, with the writes that preceded it.
    #[inline]
    pub fn load(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }
}

/// A shared-memory connection: `D` slots ([`STEPS`] unless a model
/// checker wants a smaller state space) of `W` 64-bit words each, plus the
/// `head` and `tail` counters. Lives in memory both sides can see; split
/// into one [`Producer`] and one [`Consumer`].
#[derive(Debug)]
pub struct ShmFifo<const W: usize, const D: usize = { STEPS as usize }> {
    slots: [[AtomicU64; W]; D],
    lens: [AtomicU64; D],
    head: StepCounter,
    tail: StepCounter,
}

impl<const W: usize, const D: usize> ShmFifo<W, D> {
    /// Slots in this FIFO.
    pub const DEPTH: u64 = D as u64;

    fn slot_index(step: u64) -> usize {
        step.checked_rem(D as u64).unwrap_or(0) as usize
    }

    /// An empty FIFO, both counters at 0.
    pub fn new() -> Self {
        ShmFifo {
            slots: core::array::from_fn(|_| core::array::from_fn(|_| AtomicU64::new(0))),
            lens: core::array::from_fn(|_| AtomicU64::new(0)),
            head: StepCounter::new(0),
            tail: StepCounter::new(0),
        }
    }

    /// The sender's and the receiver's halves. Each must be used by one
    /// thread at a time.
    pub fn split(&self) -> (Producer<'_, W, D>, Consumer<'_, W, D>) {
        (
            Producer {
                fifo: self,
                next: self.tail.load(),
            },
            Consumer {
                fifo: self,
                next: self.head.load(),
            },
        )
    }

    /// The `tail` counter (sender → receiver).
    pub fn tail(&self) -> &StepCounter {
        &self.tail
    }

    /// The `head` counter (receiver → sender).
    pub fn head(&self) -> &StepCounter {
        &self.head
    }

    /// Writes `data` into the slot of `step` (sender side; the caller has
    /// checked [`can_send`]). Not visible until `tail` passes `step`.
    pub fn write_slot(&self, step: u64, data: &[u64]) -> Result<(), TryError> {
        if data.len() > W {
            return Err(TryError::TooLong);
        }
        let i = Self::slot_index(step);
        let (Some(slot), Some(len)) = (self.slots.get(i), self.lens.get(i)) else {
            return Err(TryError::TooLong);
        };
        for (w, &v) in slot.iter().zip(data) {
            w.store(v, Ordering::Relaxed);
        }
        len.store(data.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Reads the slot of `step` into `out` (receiver side; the caller has
    /// checked [`can_recv`]) and returns the number of words.
    pub fn read_slot(&self, step: u64, out: &mut [u64]) -> Result<usize, TryError> {
        let i = Self::slot_index(step);
        let (Some(slot), Some(len)) = (self.slots.get(i), self.lens.get(i)) else {
            return Err(TryError::TooLong);
        };
        let n = usize::try_from(len.load(Ordering::Relaxed)).unwrap_or(usize::MAX);
        let Some(out) = out.get_mut(..n) else {
            return Err(TryError::TooLong);
        };
        for (o, w) in out.iter_mut().zip(slot.iter()) {
            *o = w.load(Ordering::Relaxed);
        }
        Ok(n)
    }
}

impl<const W: usize, const D: usize> Default for ShmFifo<W, D> {
    fn default() -> Self {
        Self::new()
    }
}

/// The sending half of a [`ShmFifo`].
#[derive(Debug)]
pub struct Producer<'a, const W: usize, const D: usize = { STEPS as usize }> {
    fifo: &'a ShmFifo<W, D>,
    next: u64,
}

impl<const W: usize, const D: usize> Producer<'_, W, D> {
    /// Sends one slot of data if a slot is free: writes it, then publishes
    /// the new `tail`. Returns the step it occupied.
    pub fn try_send(&mut self, data: &[u64]) -> Result<u64, TryError> {
        if data.len() > W {
            return Err(TryError::TooLong);
        }
        if !can_send_depth(D as u64, self.fifo.head.load(), self.next, 1) {
            return Err(TryError::WouldBlock);
        }
        let step = self.next;
        self.fifo.write_slot(step, data)?;
        self.next = step.saturating_add(1);
        self.fifo.tail.post(self.next);
        Ok(step)
    }

    /// The next step this producer will fill.
    pub fn next_step(&self) -> u64 {
        self.next
    }
}

/// The receiving half of a [`ShmFifo`].
#[derive(Debug)]
pub struct Consumer<'a, const W: usize, const D: usize = { STEPS as usize }> {
    fifo: &'a ShmFifo<W, D>,
    next: u64,
}

impl<const W: usize, const D: usize> Consumer<'_, W, D> {
    /// Receives one slot if one is filled: reads it into `out`, then frees
    /// the slot by publishing the new `head`. Returns the number of words.
    pub fn try_recv(&mut self, out: &mut [u64]) -> Result<usize, TryError> {
        if !can_recv(self.fifo.tail.load(), self.next, 1) {
            return Err(TryError::WouldBlock);
        }
        let n = self.fifo.read_slot(self.next, out)?;
        self.next = self.next.saturating_add(1);
        self.fifo.head.post(self.next);
        Ok(n)
    }

    /// The next step this consumer will read.
    pub fn next_step(&self) -> u64 {
        self.next
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn rules() {
        assert!(can_send(0, 0, 8));
        assert!(!can_send(0, 0, 9));
        assert!(!can_send(0, 7, 2));
        assert!(can_send(1, 7, 2));
        assert!(!can_send(u64::MAX, u64::MAX, 1));
        assert!(can_recv(2, 0, 2));
        assert!(!can_recv(2, 1, 2));
        assert!(!can_recv(u64::MAX, u64::MAX, 1));
        assert_eq!(slot_of(9), SlotIndex(1));
    }

    #[test]
    fn geometry() {
        assert_eq!(FifoGeometry::NCCL.slice_bytes(), 1 << 20);
        assert_eq!(FifoGeometry::NCCL.slices_per_chunk(2 << 20), 2);
        assert_eq!(FifoGeometry::NCCL.slices_per_chunk(1), 1);
        assert_eq!(FifoGeometry::NCCL.fifo_bytes(), 4 << 20);
        assert_eq!(FifoGeometry::NCCL.max_slices_per_chunk(), 3);
        assert_eq!(FifoGeometry::NCCL.max_chunk_bytes(), 3 << 20);
        assert_eq!(FifoGeometry::new(0, 1), Err(Error::BadFifoGeometry));
        assert_eq!(FifoGeometry::new(24, 1), Err(Error::BadFifoGeometry));
        assert_eq!(FifoGeometry::new(16, 3), Err(Error::BadFifoGeometry));
        assert_eq!(FifoGeometry::new(16, 0), Err(Error::BadFifoGeometry));
        assert_eq!(FifoGeometry::new(16, 8), Err(Error::BadFifoGeometry));
        assert!(FifoGeometry::new(16, 4).is_ok());
    }

    #[test]
    fn shm_fifo_fills_then_blocks_then_drains_in_order() {
        let fifo = ShmFifo::<2>::new();
        let (mut tx, mut rx) = fifo.split();
        for i in 0..STEPS {
            assert_eq!(tx.next_step(), i);
            assert_eq!(tx.try_send(&[i, i + 100]), Ok(i));
        }
        assert_eq!(tx.try_send(&[0]), Err(TryError::WouldBlock));
        // A refused send takes no step.
        assert_eq!(tx.next_step(), STEPS);
        assert_eq!(tx.try_send(&[0, 1, 2]), Err(TryError::TooLong));
        let mut out = [0u64; 2];
        for i in 0..STEPS {
            assert_eq!(rx.next_step(), i);
            assert_eq!(rx.try_recv(&mut out), Ok(2));
            assert_eq!(out, [i, i + 100]);
        }
        assert_eq!(rx.try_recv(&mut out), Err(TryError::WouldBlock));
        assert_eq!(rx.next_step(), STEPS);
        assert_eq!(tx.try_send(&[7]), Ok(STEPS));
        let mut short = [0u64; 0];
        assert_eq!(rx.try_recv(&mut short), Err(TryError::TooLong));
        assert_eq!(rx.try_recv(&mut out), Ok(1));
        assert_eq!(out[0], 7);
    }
}
