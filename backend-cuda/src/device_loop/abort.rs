//! The job-wide abort of device-loop ranks (NCCL's `ncclCommAbort`
//! reaching every rank): a rank that aborts posts the job's abort notice
//! in the store ([`ABORT_KEY`], the communicator's format) and raises its
//! loop's abort word; every rank's watcher thread looks for the notice
//! every [`WATCH_EVERY`] and raises its own word when it appears, so the
//! loops stop at their next bounded wait with an abort status instead of
//! waiting out their timeout.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use ringcc_comm::store::abort::{notice, parse_notice};
use ringcc_comm::store::{Store, ABORT_KEY};
use ringcc_core::Rank;

use super::abi::ABORT_HOST;
use crate::error::{Error, Result};

/// How often the watcher looks for the job's abort notice.
pub const WATCH_EVERY: Duration = Duration::from_millis(10);

/// One rank's share of the job's abort. See the module documentation.
pub struct JobAbort {
    rank: Rank,
    store: Arc<dyn Store>,
    /// The loop's abort word, when the rank has none of its own.
    word: Arc<AtomicU64>,
    /// Another word raised with it (a GPU rank's, in pinned memory).
    also: Option<usize>,
    seen: Arc<Mutex<Option<ringcc_comm::Error>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for JobAbort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobAbort")
            .field("rank", &self.rank)
            .field("raised", &self.word.load(Ordering::Acquire))
            .finish_non_exhaustive()
    }
}

/// Raises the loop's abort word (and the other one) to the host's abort.
fn raise(word: &AtomicU64, also: Option<usize>) {
    word.store(ABORT_HOST, Ordering::Release);
    if let Some(a) = also {
        // SAFETY: the crate's own word (8-aligned host memory that
        // outlives the watcher, accessed atomically by everyone; see
        // `watch_also`).
        unsafe { &*(a as *const AtomicU64) }.store(ABORT_HOST, Ordering::Release);
    }
}

impl JobAbort {
    /// Starts `rank`'s watcher on `store` (the job's, shared with every
    /// rank); the loop's abort word is [`word`](JobAbort::word).
    pub fn watch(store: Arc<dyn Store>, rank: Rank) -> Result<JobAbort> {
        Self::watch_also(store, rank, None)
    }

    /// [`watch`](JobAbort::watch), also raising the word at host address
    /// `also` (which must outlive the watcher).
    pub(crate) fn watch_also(
        store: Arc<dyn Store>,
        rank: Rank,
        also: Option<usize>,
    ) -> Result<JobAbort> {
        let word = Arc::new(AtomicU64::new(0));
        let seen = Arc::new(Mutex::new(None));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (store, word, seen, stop) =
                (store.clone(), word.clone(), seen.clone(), stop.clone());
            std::thread::Builder::new()
                .name(format!("ringcc-abort-{}", rank.0))
                .spawn(move || {
                    while !stop.load(Ordering::Acquire) {
                        if let Ok(true) = store.check(ABORT_KEY) {
                            let why = store
                                .get(ABORT_KEY, WATCH_EVERY)
                                .map_or_else(|e| e, |n| parse_notice(&n));
                            if let Ok(mut s) = seen.lock() {
                                s.get_or_insert(why);
                            }
                            raise(&word, also);
                            return;
                        }
                        std::thread::sleep(WATCH_EVERY);
                    }
                })
                .map_err(|_| Error::BadConfig {
                    what: "no thread for the abort watcher",
                })?
        };
        Ok(JobAbort {
            rank,
            store,
            word,
            also,
            seen,
            stop,
            thread: Some(thread),
        })
    }

    /// The loop's abort word: raised by [`abort`](JobAbort::abort) here
    /// or by the job's notice from any rank.
    pub fn word(&self) -> &AtomicU64 {
        &self.word
    }

    /// Aborts the job: the notice (naming this rank and `reason`) for
    /// every rank, and this rank's loops stop at once.
    pub fn abort(&self, reason: &str) -> Result<()> {
        let reason = format!("rank {} aborted: {reason}", self.rank.0);
        if let Ok(mut s) = self.seen.lock() {
            s.get_or_insert(ringcc_comm::Error::Aborted {
                rank: Some(self.rank),
                reason: reason.clone(),
            });
        }
        raise(&self.word, self.also);
        self.store
            .set(ABORT_KEY, &notice(Some(self.rank), &reason))
            .map_err(Error::comm("Store::set"))
    }

    /// The abort, if the job was aborted (by this rank or another).
    pub fn aborted(&self) -> Option<ringcc_comm::Error> {
        self.seen
            .lock()
            .ok()
            .and_then(|s| s.as_ref().map(ringcc_comm::Error::duplicate))
    }
}

impl Drop for JobAbort {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
