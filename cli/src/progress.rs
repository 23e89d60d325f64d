//! A progress line on stderr for long runs: only on a terminal (nothing
//! on a pipe or in a file), and only once the run has taken more than
//! [`DELAY`] — a short run prints its table and nothing else.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// How long a run goes before its progress line appears.
pub const DELAY: Duration = Duration::from_secs(2);

/// The delay, overridable for tests (`RINGCC_PROGRESS_DELAY_MS`).
fn delay() -> Duration {
    std::env::var("RINGCC_PROGRESS_DELAY_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(DELAY, Duration::from_millis)
}

/// The progress of one `perf` run, measured in estimated seconds of work.
pub struct Progress {
    bar: ProgressBar,
    stop: Arc<AtomicBool>,
}

/// Units of the bar: estimated milliseconds of work.
fn units(seconds: f64) -> u64 {
    (seconds.max(0.0) * 1000.0).min(1e15) as u64
}

impl Progress {
    /// A progress line for work estimated at `seconds` (0 when unknown),
    /// shown after [`DELAY`] when `on` and stderr is a terminal.
    pub fn new(on: bool, seconds: f64) -> Progress {
        let bar = ProgressBar::with_draw_target(
            Some(units(seconds).max(1)),
            ProgressDrawTarget::hidden(),
        );
        let style = ProgressStyle::with_template(
            "[ringcc perf] {wide_msg} {bar:16} {percent:>3}% {elapsed}/~{duration}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar());
        bar.set_style(style);
        let stop = Arc::new(AtomicBool::new(false));
        if on {
            let (bar, stop) = (bar.clone(), Arc::clone(&stop));
            // A terminal check here and indicatif's own: nothing is drawn
            // on a pipe.
            if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
                std::thread::spawn(move || {
                    std::thread::sleep(delay());
                    if !stop.load(Ordering::Acquire) {
                        bar.set_draw_target(ProgressDrawTarget::stderr());
                        bar.enable_steady_tick(Duration::from_millis(250));
                    }
                });
            }
        }
        Progress { bar, stop }
    }

    /// What is running now.
    pub fn show(&self, msg: &str) {
        self.bar.set_message(msg.to_string());
    }

    /// `seconds` of the estimated work are done.
    pub fn advance(&self, seconds: f64) {
        self.bar.inc(units(seconds));
    }

    /// Runs `f` (which prints to stdout) with the line cleared, so a table
    /// row on the same terminal never lands inside it.
    pub fn suspend<R>(&self, f: impl FnOnce() -> R) -> R {
        self.bar.suspend(f)
    }

    /// Removes the line for good.
    pub fn finish(&self) {
        self.stop.store(true, Ordering::Release);
        self.bar.finish_and_clear();
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.finish();
    }
}
