//! What the multi-process tests share.

use std::process::Child;

/// Kills a child that is still running when dropped (a failed assert must
/// not leave processes behind).
pub struct Reap(pub Child);

impl Drop for Reap {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}
