//! A communicator's abort state: set by a local failure, by
//! [`Communicator::abort`](crate::Communicator::abort), or by the job's
//! abort notice in the store (the watcher thread); read by the drive
//! loop at every idle turn.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use ringcc_core::Rank;

use crate::error::Error;

/// Whether (and why) the job is aborted.
#[derive(Debug, Default)]
pub(crate) struct AbortState {
    flag: AtomicBool,
    notice: Mutex<Option<(Option<Rank>, String)>>,
}

impl AbortState {
    /// Whether the job is aborted.
    pub(crate) fn is_set(&self) -> bool {
        self.flag.load(Ordering::Acquire)
    }

    /// Records the first abort (later ones are ignored); whether this
    /// call set it.
    pub(crate) fn set(&self, rank: Option<Rank>, reason: String) -> bool {
        let mut n = self.notice.lock().unwrap_or_else(|p| p.into_inner());
        if n.is_some() {
            return false;
        }
        *n = Some((rank, reason));
        self.flag.store(true, Ordering::Release);
        true
    }

    /// The abort as an error, if set.
    pub(crate) fn error(&self) -> Option<Error> {
        if !self.is_set() {
            return None;
        }
        let n = self.notice.lock().unwrap_or_else(|p| p.into_inner());
        let (rank, reason) = n.clone().unwrap_or((None, "aborted".into()));
        Some(Error::Aborted { rank, reason })
    }
}
