//! What an end has handed to its queue pair and not yet seen complete:
//! the bookkeeping both ends share, kept apart from the verbs calls so it
//! can be tested without a device.
//!
//! - [`Outstanding`]: the signaled requests of one send queue, in posting
//!   order, and how many requests each retires (a slice's unsignaled
//!   header write completes with its signaled data write): whether the
//!   queue has room, and whether everything completed.
//! - [`StagingUse`]: per FIFO slot, the slice whose write still reads the
//!   sender's staging copy of it: the executor may write a staging slot
//!   again only once that write completed (a retransmission re-reads it).

use ringcc_core::fifo::STEPS;
use ringcc_core::protocol::post::widen_step;
use ringcc_core::SlotIndex;

/// Signaled requests in flight on one send queue, in posting order.
#[derive(Debug, Default)]
pub(crate) struct Outstanding {
    /// (wr_id of the signaled request, requests it retires)
    queue: std::collections::VecDeque<(u64, u32)>,
    /// Requests posted and not yet retired.
    in_flight: u32,
}

impl Outstanding {
    /// `requests` were posted, the last signaled with `wr_id`.
    pub fn posted(&mut self, wr_id: u64, requests: u32) {
        self.queue.push_back((wr_id, requests));
        self.in_flight = self.in_flight.saturating_add(requests);
    }

    /// A signaled completion with `wr_id` arrived; false if it was not the
    /// oldest outstanding one (a queue-pair bug or a foreign id).
    pub fn completed(&mut self, wr_id: u64) -> bool {
        match self.queue.front() {
            Some(&(id, n)) if id == wr_id => {
                self.queue.pop_front();
                self.in_flight = self.in_flight.saturating_sub(n);
                true
            }
            _ => false,
        }
    }

    /// Whether `requests` more fit a queue of `depth`.
    pub fn has_room(&self, requests: u32, depth: u32) -> bool {
        self.in_flight.saturating_add(requests) <= depth
    }

    /// Whether every request completed.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }
}

/// Which staging slots a posted (or waiting) write still reads.
#[derive(Debug, Default)]
pub(crate) struct StagingUse {
    /// Per slot, the end step of the slice that last read it (0: none).
    read_until: [u64; STEPS as usize],
    /// The end step of the last data write that completed.
    done: u64,
}

impl StagingUse {
    /// The slice `step..end` was handed to the queue pair: its slots are
    /// read until its write completes.
    pub fn posted(&mut self, step: u64, end: u64) {
        for s in step..end {
            if let Some(r) = self.read_until.get_mut((s % STEPS) as usize) {
                *r = end;
            }
        }
    }

    /// The data write whose work request id carried `low` (the low half
    /// of its slice's end step) completed, and with it every earlier one.
    pub fn completed(&mut self, low: u32) {
        self.done = widen_step(low, self.done);
    }

    /// Whether `slot` may be written: no write reading it is incomplete.
    pub fn is_free(&self, slot: SlotIndex) -> bool {
        self.read_until
            .get(usize::from(slot.0))
            .is_none_or(|&until| self.done >= until)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outstanding_requests_retire_in_order_and_bound_the_queue() {
        let mut o = Outstanding::default();
        assert!(o.is_empty() && o.has_room(4, 4));
        o.posted(10, 2);
        o.posted(11, 1);
        assert!(!o.has_room(2, 4) && o.has_room(1, 4));
        assert!(!o.completed(11), "out of order");
        assert!(o.completed(10));
        assert!(o.has_room(3, 4) && !o.is_empty());
        assert!(o.completed(11));
        assert!(o.is_empty() && !o.completed(12));
    }

    #[test]
    fn a_staging_slot_is_free_once_the_write_reading_it_completed() {
        let mut u = StagingUse::default();
        assert!((0..8).all(|s| u.is_free(SlotIndex(s))));
        // Steps 6..8 and 8..10 (slots 6, 7 and 0, 1).
        u.posted(6, 8);
        u.posted(8, 10);
        assert!(!u.is_free(SlotIndex(6)) && !u.is_free(SlotIndex(0)));
        assert!(u.is_free(SlotIndex(2)));
        u.completed(8);
        assert!(u.is_free(SlotIndex(7)) && !u.is_free(SlotIndex(1)));
        u.completed(10);
        assert!((0..8).all(|s| u.is_free(SlotIndex(s))));
        // The ids carry 32 bits of the step: they widen across 2^32.
        let mut u = StagingUse::default();
        u.completed(u32::MAX - 1);
        u.posted((1 << 32) - 2, (1 << 32) + 2);
        assert!(!u.is_free(SlotIndex(0)));
        u.completed(2);
        assert!(u.is_free(SlotIndex(0)));
    }
}
