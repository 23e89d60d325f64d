//! Calls in flight: the queue every call goes through (so calls complete
//! in issue order), the [`Work`] handle of an asynchronous call, and the
//! caller's buffers as the queue holds them.
//!
//! Whoever holds the ring runs the queue front to back: a blocking call
//! queues itself and then runs the queue up to its own call in its own
//! thread (no hand-off, no wake-up latency); the progress thread runs
//! whatever asynchronous calls are queued when no caller does.

use std::any::Any;
use std::collections::VecDeque;
use std::marker::PhantomData;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ringcc_core::Call;

use crate::buffer::Buffers;
use crate::error::{Error, Result};

/// Locks, ignoring poisoning: every critical section here leaves its
/// data consistent at every point.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A call's buffers as raw parts: out of place (`input`, `output`) or in
/// place (`output` only). Whoever queues a call guarantees the memory
/// stays valid and untouched by anyone else until the call is done —
/// a blocking call by waiting for it, an asynchronous one by moving the
/// owning value into the call ([`Job::owned`]).
#[derive(Debug)]
pub(crate) struct RawBufs {
    pub(crate) input: *const u8,
    pub(crate) input_len: usize,
    pub(crate) output: *mut u8,
    pub(crate) output_len: usize,
    pub(crate) in_place: bool,
}

// SAFETY: the pointers are only dereferenced by the one thread that runs
// the call, while the submitter guarantees exclusive access (see the
// type's doc); they carry no thread affinity.
unsafe impl Send for RawBufs {}
// SAFETY: as for `Send`: shared references to a `RawBufs` only read the
// pointer values; the memory behind them is accessed by the one thread
// that runs the call.
unsafe impl Sync for RawBufs {}

impl RawBufs {
    pub(crate) fn apart(input: &[u8], output: &mut [u8]) -> RawBufs {
        RawBufs {
            input: input.as_ptr(),
            input_len: input.len(),
            output: output.as_mut_ptr(),
            output_len: output.len(),
            in_place: false,
        }
    }

    pub(crate) fn in_place(buf: &mut [u8]) -> RawBufs {
        RawBufs {
            input: buf.as_ptr(),
            input_len: 0,
            output: buf.as_mut_ptr(),
            output_len: buf.len(),
            in_place: true,
        }
    }

    /// The buffers as the executor takes them, checked against the call.
    ///
    /// # Safety
    /// The memory must be valid for the lifetime chosen and not accessed
    /// by anyone else meanwhile (the queue's contract, above).
    pub(crate) unsafe fn buffers<'a>(
        &self,
        call: &Call,
        ranks: u32,
        rank: u32,
    ) -> Result<Buffers<'a>> {
        if self.in_place {
            // SAFETY: the caller's contract: `output..output+output_len` is
            // one live, exclusively ours allocation (from a `&mut [u8]`).
            let buf = unsafe { std::slice::from_raw_parts_mut(self.output, self.output_len) };
            Buffers::in_place(call, ranks, rank, buf)
        } else {
            // SAFETY: as above, for two distinct allocations: the input
            // came from a `&[u8]`, the output from a `&mut [u8]` borrowed
            // at the same time, so they do not overlap.
            let (input, output) = unsafe {
                (
                    std::slice::from_raw_parts(self.input, self.input_len),
                    std::slice::from_raw_parts_mut(self.output, self.output_len),
                )
            };
            Buffers::apart(call, ranks, input, output)
        }
    }
}

/// A call's outcome and who waits for it.
#[derive(Default)]
struct Outcome {
    result: Option<Result<()>>,
    /// Threads blocked on `done` (a finish without waiters makes no
    /// system call: `notify_all` always does one).
    waiters: u32,
}

/// One queued call.
pub(crate) struct Job {
    pub(crate) call: Call,
    pub(crate) bufs: RawBufs,
    /// The value owning the buffers of an asynchronous call, handed back
    /// by [`Work::wait`].
    owned: Mutex<Option<Box<dyn Any + Send>>>,
    outcome: Mutex<Outcome>,
    done: Condvar,
}

impl Job {
    pub(crate) fn new(call: Call, bufs: RawBufs, owned: Option<Box<dyn Any + Send>>) -> Arc<Job> {
        Arc::new(Job {
            call,
            bufs,
            owned: Mutex::new(owned),
            outcome: Mutex::new(Outcome::default()),
            done: Condvar::new(),
        })
    }

    pub(crate) fn finish(&self, r: Result<()>) {
        let mut o = lock(&self.outcome);
        o.result = Some(r);
        if o.waiters > 0 {
            self.done.notify_all();
        }
    }

    pub(crate) fn is_done(&self) -> bool {
        lock(&self.outcome).result.is_some()
    }

    /// Waits until done or `deadline` (`None`: no limit); `None` at the
    /// deadline, else the outcome (the error copied: `take` leaves the
    /// original for the first to take it).
    fn wait_until(&self, deadline: Option<Instant>, take: bool) -> Option<Result<()>> {
        let mut o = lock(&self.outcome);
        loop {
            if let Some(res) = o.result.take() {
                let copy = res.as_ref().map(|_| ()).map_err(Error::duplicate);
                if take {
                    o.result = Some(copy);
                    return Some(res);
                }
                o.result = Some(res);
                return Some(copy);
            }
            o.waiters += 1;
            o = match deadline {
                None => self.done.wait(o).unwrap_or_else(|p| p.into_inner()),
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        o.waiters -= 1;
                        return None;
                    }
                    self.done
                        .wait_timeout(o, left)
                        .unwrap_or_else(|p| p.into_inner())
                        .0
                }
            };
            o.waiters -= 1;
        }
    }

    /// Waits until done and takes the outcome.
    pub(crate) fn wait(&self) -> Result<()> {
        self.wait_until(None, true)
            .unwrap_or_else(|| Err(Error::Internal("a wait without a deadline ended".into())))
    }
}

/// The calls queued and not yet started, in issue order.
#[derive(Default)]
pub(crate) struct Queue {
    pub(crate) jobs: VecDeque<Arc<Job>>,
    pub(crate) stop: bool,
}

/// An asynchronous call: [`wait`](Work::wait) for it (and get its
/// buffers back), or ask whether it is done. Calls complete in the order
/// they were issued. Dropping a `Work` does not cancel the call; its
/// buffers are freed when it is done.
pub struct Work<B> {
    job: Arc<Job>,
    _buffers: PhantomData<fn() -> B>,
}

impl<B> std::fmt::Debug for Work<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Work")
            .field("call", &self.job.call)
            .field("done", &self.job.is_done())
            .finish()
    }
}

impl<B: 'static> Work<B> {
    pub(crate) fn new(job: Arc<Job>) -> Work<B> {
        Work {
            job,
            _buffers: PhantomData,
        }
    }

    /// Whether the call has finished (successfully or not).
    pub fn is_completed(&self) -> bool {
        self.job.is_done()
    }

    /// Waits up to `timeout`: `Ok(true)` when the call finished well,
    /// `Ok(false)` when it is still running, its error when it failed.
    pub fn wait_timeout(&self, timeout: Duration) -> Result<bool> {
        match self.job.wait_until(Some(Instant::now() + timeout), false) {
            None => Ok(false),
            Some(r) => r.map(|()| true),
        }
    }

    /// Waits for the call (it ends within the communicator's deadline)
    /// and hands its buffers back.
    pub fn wait(self) -> Result<B> {
        self.job.wait()?;
        let owned = lock(&self.job.owned).take();
        owned
            .and_then(|b| b.downcast::<B>().ok())
            .map(|b| *b)
            .ok_or_else(|| Error::Internal("an asynchronous call lost its buffers".into()))
    }
}
