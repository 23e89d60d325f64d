//! A rank's bell: the word it sleeps on when idle (a futex in a small
//! shared-memory segment of its own), which its ring neighbours bump and
//! wake after posting a counter it may wait for.
//!
//! The bell is a [`Segment`] of the smallest geometry, used only for two
//! of its lines: the ticket (`seq`, in the `tail` line) and the sleeping
//! flag (in the `head` line), each viewed as an `AtomicU32` and never as
//! the segment's counters. Creation, publication and the owner, mode and
//! token checks are the segment's.
//!
//! The handshake that loses no wake-up (see
//! [`ringcc_comm::transport::Bell`]): the sleeper stores `sleeping = 1`,
//! fences (SeqCst), polls its ends once more, then `futex_wait(seq,
//! ticket)`; a poster stores its counter (release), fences (SeqCst), and
//! only if it sees `sleeping` bumps `seq` and `futex_wake`s. One of the
//! two fences comes first: either the poster sees the flag, or the
//! sleeper's last poll sees the counter. A peer that never sleeps costs
//! its neighbours one fence and one load per post.

use std::sync::atomic::AtomicU32;
use std::time::{Duration, Instant};

use ringcc_comm::BellWords;
use ringcc_core::fifo::FifoGeometry;
use ringcc_core::Rank;

use crate::error::{Error, Result};
use crate::layout::Layout;
use crate::{Segment, SegmentName};

/// The geometry of a bell's segment (its slots go unused).
fn geometry() -> Result<FifoGeometry> {
    FifoGeometry::new(16, 1).map_err(|source| Error::Core {
        channel: None,
        call: "FifoGeometry::new",
        source,
    })
}

/// One rank's bell, as its owner or a neighbour maps it.
#[derive(Debug)]
pub struct Bell {
    seg: Segment,
}

// SAFETY: a bell's shared state is two 32-bit words accessed only
// atomically (`word`); `unlink` takes `&mut self`. Sharing a `&Bell`
// between threads therefore only shares atomics, which is what `Sync`
// asks (the segment's slot copies, the reason `Mapping` is not `Sync`,
// are never used on a bell).
unsafe impl Sync for Bell {}

impl Bell {
    /// Creates `rank`'s bell in the job of `token` (owner side).
    pub fn create(token: &str, rank: Rank) -> Result<Bell> {
        let seg = Segment::create(&SegmentName::bell(token, rank), geometry()?, token)?;
        Ok(Bell { seg })
    }

    /// Opens `rank`'s bell (a neighbour's side), waiting for its owner
    /// until `deadline`.
    pub fn open(token: &str, rank: Rank, deadline: Instant) -> Result<Bell> {
        let seg = Segment::open(
            &SegmentName::bell(token, rank),
            token,
            geometry()?,
            deadline,
        )?;
        Ok(Bell { seg })
    }

    /// Removes the name (owner side, once every neighbour has opened it).
    pub fn unlink(&mut self) -> Result<()> {
        self.seg.unlink()
    }

    fn word(&self, off: usize) -> &AtomicU32 {
        let p = self.seg.line_ptr(off);
        // SAFETY: `off` is the start of a 64-byte line of the segment's
        // layout (`Layout::TAIL` or `Layout::HEAD`), inside the mapping and
        // 4-aligned (the mapping is page aligned); the mapping lives as
        // long as `&self`. The bytes are initialised (zero from
        // `ftruncate`), every bit pattern is a valid `u32`, and every
        // process accesses a bell's words only through this view, as
        // 32-bit atomics (a bell's segment counters are never used).
        unsafe { &*p.cast::<AtomicU32>() }
    }

    fn seq(&self) -> &AtomicU32 {
        self.word(Layout::TAIL)
    }

    fn sleeping(&self) -> &AtomicU32 {
        self.word(Layout::HEAD)
    }

    fn words(&self) -> BellWords<'_> {
        BellWords {
            seq: self.seq(),
            sleeping: self.sleeping(),
            shared: true,
        }
    }

    /// Wakes the owner if it sleeps (a neighbour's side, right after
    /// posting a counter with release).
    pub fn ring(&self) {
        self.words().ring();
    }
}

impl ringcc_comm::transport::Bell for Bell {
    fn arm(&self) -> u32 {
        self.words().arm()
    }
    fn sleep(&self, ticket: u32, timeout: Duration) {
        self.words().sleep(ticket, timeout);
    }
    fn disarm(&self) {
        self.words().disarm();
    }
    fn ring(&self) {
        self.words().ring();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::sync::Arc;

    use ringcc_comm::transport::Bell as _;

    use super::*;

    fn token() -> String {
        format!("bell-test-{}-{:?}", std::process::id(), Instant::now())
    }

    #[test]
    fn a_ring_wakes_the_sleeper_and_a_missed_one_is_not_lost() {
        let t = token();
        let mut own = Bell::create(&t, Rank(0)).unwrap();
        let peer = Bell::open(&t, Rank(0), Instant::now() + Duration::from_secs(5)).unwrap();
        own.unlink().unwrap();
        let own = Arc::new(own);
        // Rung between arm and sleep: the sleep returns at once.
        let ticket = own.arm();
        peer.ring();
        let t0 = Instant::now();
        own.sleep(ticket, Duration::from_secs(5));
        own.disarm();
        assert!(t0.elapsed() < Duration::from_secs(1));
        // Rung while asleep, from another thread.
        let ticket = own.arm();
        let ringer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            peer.ring();
        });
        let t0 = Instant::now();
        own.sleep(ticket, Duration::from_secs(5));
        own.disarm();
        assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
        ringer.join().unwrap();
        // Nobody rings: the timeout.
        let ticket = own.arm();
        let t0 = Instant::now();
        own.sleep(ticket, Duration::from_millis(30));
        assert!(t0.elapsed() >= Duration::from_millis(25));
    }

    #[test]
    fn a_ring_without_a_sleeper_costs_no_wake_up() {
        let t = token();
        let own = Bell::create(&t, Rank(3)).unwrap();
        let peer = Bell::open(&t, Rank(3), Instant::now() + Duration::from_secs(5)).unwrap();
        let before = own.seq().load(Ordering::Relaxed);
        peer.ring();
        assert_eq!(own.seq().load(Ordering::Relaxed), before);
    }
}
