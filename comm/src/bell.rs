//! The process-local [`Bell`]: a futex word in this process's memory, for
//! a rank whose transports share no memory with its peers (TCP, RDMA):
//! their reader threads ring it.

use std::sync::atomic::{fence, AtomicU32, Ordering};
use std::time::Duration;

use rustix::thread::futex;

use crate::transport::Bell;

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
}

impl Bell for LocalBell {
    fn arm(&self) -> u32 {
        let ticket = self.seq.load(Ordering::Acquire);
        self.sleeping.store(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        ticket
    }

    fn sleep(&self, ticket: u32, timeout: Duration) {
        let ts = rustix::fs::Timespec {
            tv_sec: i64::try_from(timeout.as_secs()).unwrap_or(i64::MAX),
            tv_nsec: i64::from(timeout.subsec_nanos()),
        };
        // EAGAIN (rung since the ticket), ETIMEDOUT, EINTR: look again.
        let _ = futex::wait(&self.seq, futex::Flags::PRIVATE, ticket, Some(&ts));
    }

    fn disarm(&self) {
        self.sleeping.store(0, Ordering::Relaxed);
    }

    fn ring(&self) {
        fence(Ordering::SeqCst);
        if self.sleeping.load(Ordering::Relaxed) != 0 {
            self.seq.fetch_add(1, Ordering::Release);
            let _ = futex::wake(&self.seq, futex::Flags::PRIVATE, u32::MAX);
        }
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
