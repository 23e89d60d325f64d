//! The process-local [`Bell`]: a futex word in this process's memory, for
//! a rank whose transports share no memory with its peers (TCP, RDMA):
//! their reader threads ring it.

use std::sync::atomic::{fence, AtomicU32, Ordering};
use std::time::Duration;

use rustix::thread::futex;

use crate::transport::Bell;

/// The bell handshake on two words wherever they live: the ticket
/// (`seq`, the futex word) and the sleeping flag, in this process's
/// memory (`shared: false`, a private futex) or in memory the rank's
/// peers map (`shared: true`). The sleeper: `arm`, poll once more,
/// `sleep`, `disarm`; a poster: publish (release), then `ring`. The two
/// SeqCst fences make sure the poster sees the flag or the sleeper's last
/// poll sees what was published.
#[derive(Clone, Copy, Debug)]
pub struct BellWords<'a> {
    /// The ticket: bumped by a ring that finds the rank asleep.
    pub seq: &'a AtomicU32,
    /// Non-zero while the rank is (about to be) asleep.
    pub sleeping: &'a AtomicU32,
    /// Whether other processes ring it.
    pub shared: bool,
}

impl BellWords<'_> {
    fn flags(self) -> futex::Flags {
        if self.shared {
            futex::Flags::empty()
        } else {
            futex::Flags::PRIVATE
        }
    }

    /// See [`Bell::arm`].
    pub fn arm(self) -> u32 {
        let ticket = self.seq.load(Ordering::Acquire);
        self.sleeping.store(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        ticket
    }

    /// See [`Bell::sleep`].
    pub fn sleep(self, ticket: u32, timeout: Duration) {
        let ts = rustix::fs::Timespec {
            tv_sec: i64::try_from(timeout.as_secs()).unwrap_or(i64::MAX),
            tv_nsec: i64::from(timeout.subsec_nanos()),
        };
        // EAGAIN (rung since the ticket), ETIMEDOUT, EINTR: look again.
        let _ = futex::wait(self.seq, self.flags(), ticket, Some(&ts));
    }

    /// See [`Bell::disarm`].
    pub fn disarm(self) {
        self.sleeping.store(0, Ordering::Relaxed);
    }

    /// See [`Bell::ring`]: a fence and a load, a system call only when the
    /// rank sleeps.
    pub fn ring(self) {
        fence(Ordering::SeqCst);
        if self.sleeping.load(Ordering::Relaxed) != 0 {
            self.seq.fetch_add(1, Ordering::Release);
            let _ = futex::wake(self.seq, self.flags(), u32::MAX);
        }
    }
}

/// A bell rung only by threads of this process.
#[derive(Debug, Default)]
pub struct LocalBell {
    seq: AtomicU32,
    sleeping: AtomicU32,
}

impl LocalBell {
    /// A bell nobody sleeps on yet.
    pub fn new() -> LocalBell {
        LocalBell::default()
    }

    fn words(&self) -> BellWords<'_> {
        BellWords {
            seq: &self.seq,
            sleeping: &self.sleeping,
            shared: false,
        }
    }
}

impl Bell for LocalBell {
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
    use std::sync::Arc;
    use std::time::Instant;

    use super::*;

    #[test]
    fn a_ring_from_another_thread_wakes_the_sleeper() {
        let b = Arc::new(LocalBell::new());
        let t = b.arm();
        let r = {
            let b = Arc::clone(&b);
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(30));
                b.ring();
            })
        };
        let t0 = Instant::now();
        b.sleep(t, Duration::from_secs(5));
        b.disarm();
        assert!(t0.elapsed() < Duration::from_secs(2));
        r.join().unwrap();
        // A ring between arm and sleep is not lost.
        let t = b.arm();
        b.ring();
        let t0 = Instant::now();
        b.sleep(t, Duration::from_secs(5));
        assert!(t0.elapsed() < Duration::from_secs(1));
    }
}
