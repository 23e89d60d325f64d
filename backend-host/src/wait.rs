//! Bounded waits on a step counter: spin a little, then sleep in short
//! naps, and give up at the deadline.

use std::time::{Duration, Instant};

use ringcc_core::fifo::StepCounter;

use crate::error::{Error, Result};

/// Loads before the first nap.
const SPINS: u32 = 2_000;
/// The longest nap.
const NAP: Duration = Duration::from_micros(50);

/// Waits until `counter` reaches `target` and returns the value seen, or
/// [`Error::Timeout`] naming `what` once `deadline` has passed.
pub fn wait_at_least(
    counter: &StepCounter,
    target: u64,
    deadline: Instant,
    what: impl FnOnce() -> String,
) -> Result<u64> {
    for _ in 0..SPINS {
        let v = counter.load();
        if v >= target {
            return Ok(v);
        }
        std::hint::spin_loop();
    }
    poll_until(
        deadline,
        NAP,
        || {
            let v = counter.load();
            Ok((v >= target).then_some(v))
        },
        || {
            format!(
                "{} (counter at {}, waiting for {target})",
                what(),
                counter.load()
            )
        },
    )
}

/// Polls `ready` until it gives a value, sleeping up to `nap` between
/// looks; [`Error::Timeout`] naming `what` once `deadline` has passed (an
/// error from `ready` ends the wait at once). The one deadline loop of
/// this crate's waits.
pub(crate) fn poll_until<T>(
    deadline: Instant,
    nap: Duration,
    mut ready: impl FnMut() -> Result<Option<T>>,
    what: impl FnOnce() -> String,
) -> Result<T> {
    let start = Instant::now();
    loop {
        if let Some(v) = ready()? {
            return Ok(v);
        }
        let now = Instant::now();
        let Some(left) = deadline
            .checked_duration_since(now)
            .filter(|d| !d.is_zero())
        else {
            return Err(Error::Timeout {
                waiting_for: what(),
                after: now.saturating_duration_since(start),
            });
        };
        std::thread::sleep(left.min(nap));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reached_counter_returns_at_once() {
        let c = StepCounter::new(5);
        let far = Instant::now() + Duration::from_secs(60);
        assert_eq!(wait_at_least(&c, 3, far, String::new).unwrap(), 5);
    }

    #[test]
    fn stuck_counter_times_out_near_the_deadline() {
        let c = StepCounter::new(0);
        let start = Instant::now();
        let e = wait_at_least(&c, 1, start + Duration::from_millis(50), || "credit".into())
            .unwrap_err();
        assert!(start.elapsed() < Duration::from_millis(50 + 1_000));
        assert!(matches!(e, Error::Timeout { .. }), "{e}");
        assert!(e.to_string().contains("credit"), "{e}");
    }
}
