//! The one place the core takes its atomics from.
//!
//! Under `cfg(loom)` the atomics are loom's model-checked ones; otherwise
//! they are `core`'s. Nothing else in the crate names `core::sync::atomic`
//! directly, so a loom build checks every atomic the core uses.

#[cfg(loom)]
pub use loom::sync::atomic::{fence, AtomicU64, Ordering};

#[cfg(not(loom))]
pub use core::sync::atomic::{fence, AtomicU64, Ordering};

/// A hint to the CPU (or to loom's scheduler) that this thread is spinning.
#[inline]
pub fn spin_hint() {
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    core::hint::spin_loop();
}
