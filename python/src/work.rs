//! `Work`: an asynchronous call in flight. It keeps the call's buffers
//! (their exporters cannot free or resize them) until the call is done.

use std::sync::Mutex;
use std::time::Duration;

use pyo3::prelude::*;

use crate::buffer::Buf;
use crate::error::to_py;

/// What an asynchronous call keeps alive until it is done.
#[derive(Debug)]
pub struct Keep(pub Vec<Buf>);

enum State {
    Pending(ringcc_comm::Work<Keep>),
    Done(ringcc_comm::Result<()>),
}

/// An asynchronous collective: `wait()` for it (its error is raised
/// there), `wait(timeout)` for a while, or ask `is_completed()`. Calls
/// complete in the order they were issued; dropping a `Work` does not
/// cancel its call.
#[pyclass(module = "ringcc._ringcc")]
pub struct Work {
    state: Mutex<State>,
}

impl Work {
    /// The handle of a queued call.
    pub fn new(w: ringcc_comm::Work<Keep>) -> Work {
        Work {
            state: Mutex::new(State::Pending(w)),
        }
    }

    /// Waits (at most `timeout`, `None`: until done, which the
    /// communicator's deadline bounds), detached from the interpreter:
    /// `Some(outcome)` when done, `None` when still running.
    fn wait_detached(
        &self,
        py: Python<'_>,
        timeout: Option<Duration>,
    ) -> Option<ringcc_comm::Result<()>> {
        py.detach(|| {
            // Locked while detached: a second waiter blocks here without
            // holding the GIL, which releasing the buffers may need.
            let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
            if let State::Pending(w) = &*st {
                if let Some(t) = timeout {
                    // Done well or not (`Err`): the outcome is taken below.
                    if let Ok(false) = w.wait_timeout(t) {
                        return None;
                    }
                }
            }
            let done = match std::mem::replace(&mut *st, State::Done(Ok(()))) {
                State::Pending(w) => w.wait().map(drop),
                State::Done(r) => r,
            };
            let copy = done
                .as_ref()
                .map(|_| ())
                .map_err(ringcc_comm::Error::duplicate);
            *st = State::Done(done);
            Some(copy)
        })
    }
}

#[pymethods]
impl Work {
    /// Waits until the call is done and returns `True`, or raises its
    /// error (a `ringcc.Error`). With `timeout` (seconds, or a
    /// `datetime.timedelta`), returns `False` if it is still running then.
    #[pyo3(signature = (timeout=None))]
    fn wait(&self, py: Python<'_>, timeout: Option<Bound<'_, PyAny>>) -> PyResult<bool> {
        let timeout = match timeout {
            Some(t) if !t.is_none() => Some(crate::comm::seconds(&t)?),
            _ => None,
        };
        match self.wait_detached(py, timeout) {
            None => Ok(false),
            Some(Ok(())) => Ok(true),
            Some(Err(e)) => Err(to_py(py, &e)),
        }
    }

    /// Whether the call has finished, well or not (its error, if any, is
    /// raised by `wait`).
    fn is_completed(&self, py: Python<'_>) -> bool {
        py.detach(
            || match &*self.state.lock().unwrap_or_else(|p| p.into_inner()) {
                State::Pending(w) => w.is_completed(),
                State::Done(_) => true,
            },
        )
    }

    /// The call's error as an exception (not raised), `None` if it
    /// succeeded; raises nothing and waits for nothing: `None` also
    /// while it runs.
    fn exception(&self, py: Python<'_>) -> Option<PyErr> {
        if !self.is_completed(py) {
            return None;
        }
        match self.wait_detached(py, Some(Duration::ZERO)) {
            Some(Err(e)) => Some(to_py(py, &e)),
            _ => None,
        }
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        format!("<ringcc.Work completed={}>", self.is_completed(py))
    }
}
