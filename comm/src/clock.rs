//! The drive loop's clock: the kernel's coarse monotonic clock.
//!
//! What the loop times — a call's deadline (seconds), a look at a peer's
//! process (every 200 ms), how long to nap — needs milliseconds, not
//! nanoseconds. `CLOCK_MONOTONIC_COARSE` is the time of the kernel's last
//! tick (resolution 1–4 ms), read from the vDSO without the TSC; the
//! precise clock behind `Instant` cost a fifth of a small call's time on
//! shared memory (a dozen reads per 8-byte AllReduce).

use rustix::time::{clock_gettime, ClockId};

/// Nanoseconds on the coarse monotonic clock (never decreasing).
pub(crate) fn coarse_nanos() -> u64 {
    let t = clock_gettime(ClockId::MonotonicCoarse);
    let secs = u64::try_from(t.tv_sec).unwrap_or(0);
    let nanos = u64::try_from(t.tv_nsec).unwrap_or(0);
    secs.saturating_mul(1_000_000_000).saturating_add(nanos)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    /// It moves with the precise clock, to within a few ticks.
    #[test]
    fn coarse_time_follows_the_monotonic_clock() {
        let (c0, i0) = (coarse_nanos(), Instant::now());
        std::thread::sleep(Duration::from_millis(60));
        let (c1, i1) = (coarse_nanos(), Instant::now());
        assert!(c1 >= c0);
        let coarse = Duration::from_nanos(c1 - c0);
        let precise = i1 - i0;
        let diff = coarse.abs_diff(precise);
        assert!(
            diff < Duration::from_millis(25),
            "{coarse:?} vs {precise:?}"
        );
    }
}
