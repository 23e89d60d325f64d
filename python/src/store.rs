//! Any Python object with torch `Store`'s methods (`set`, `get`, `add`,
//! `check`, `wait`) as a ringcc [`Store`]: torch's own `TCPStore`,
//! `FileStore`, `HashStore` or `PrefixStore`, or a class of the caller's.
//!
//! The communicator calls it from its own threads (the watcher looks for
//! the job's abort notice every 20 ms) with the GIL released; each call
//! attaches to the interpreter for its duration, and fails instead when
//! the interpreter is shutting down.

use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};
use ringcc_comm::store::{get_timeout, Store};
use ringcc_comm::{Error, Result};

/// A Python store.
#[derive(Debug)]
pub struct PyStore {
    obj: Py<PyAny>,
}

impl PyStore {
    /// `obj` as a store (its methods are looked up at each call).
    pub fn new(obj: Py<PyAny>) -> PyStore {
        PyStore { obj }
    }

    /// Runs `f` attached to the interpreter; a Python exception becomes
    /// [`Error::Store`] naming `call` and `key`.
    fn with<T>(
        &self,
        call: &'static str,
        key: &str,
        f: impl FnOnce(&Bound<'_, PyAny>) -> PyResult<T>,
    ) -> Result<T> {
        let store_err = |source: String| Error::Store {
            call,
            key: key.to_owned(),
            source: source.into(),
        };
        Python::try_attach(|py| f(self.obj.bind(py)).map_err(|e| store_err(e.to_string())))
            .unwrap_or_else(|| Err(store_err("the Python interpreter is shutting down".into())))
    }
}

fn timedelta<'py>(py: Python<'py>, d: Duration) -> PyResult<Bound<'py, PyAny>> {
    py.import("datetime")?
        .getattr("timedelta")?
        .call1((0, d.as_secs(), d.subsec_micros()))
}

/// Whether a store's exception reads as a timeout (torch raises
/// `DistStoreError` / `RuntimeError` with the word in its message).
fn is_timeout(py: Python<'_>, e: &PyErr) -> bool {
    if e.is_instance_of::<pyo3::exceptions::PyTimeoutError>(py) {
        return true;
    }
    let m = e.to_string().to_ascii_lowercase();
    m.contains("timeout") || m.contains("timed out")
}

impl Store for PyStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        self.with("set", key, |s| {
            s.call_method1("set", (key, PyBytes::new(s.py(), value)))
                .map(drop)
        })
    }

    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        let waited = Python::try_attach(|py| {
            let s = self.obj.bind(py);
            let keys = PyList::new(py, [key])?;
            match s.call_method1("wait", (keys, timedelta(py, timeout)?)) {
                Ok(_) => Ok(None),
                Err(e) if is_timeout(py, &e) => Ok(Some(get_timeout(key, timeout))),
                Err(e) => Err(e),
            }
        });
        match waited {
            None => {
                return Err(Error::Store {
                    call: "wait",
                    key: key.to_owned(),
                    source: "the Python interpreter is shutting down".into(),
                })
            }
            Some(Ok(Some(timed_out))) => return Err(timed_out),
            Some(Ok(None)) => {}
            Some(Err(e)) => {
                return Err(Error::Store {
                    call: "wait",
                    key: key.to_owned(),
                    source: e.to_string().into(),
                })
            }
        }
        self.with("get", key, |s| {
            let v = s.call_method1("get", (key,))?;
            Ok(v.cast::<PyBytes>()?.as_bytes().to_vec())
        })
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        self.with("add", key, |s| {
            s.call_method1("add", (key, delta))?.extract()
        })
    }

    fn check(&self, key: &str) -> Result<bool> {
        self.with("check", key, |s| {
            let keys = PyList::new(s.py(), [key])?;
            s.call_method1("check", (keys,))?.extract()
        })
    }
}
