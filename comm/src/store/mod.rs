//! The bootstrap: a key-value [`Store`] every rank of a job reaches, as
//! torch's `c10d::Store` and NCCL's bootstrap network.
//!
//! A communicator needs little of it: every rank publishes what its peers
//! need to connect to it ([`Store::set`]), waits for theirs
//! ([`Store::get`] with a deadline), counts arrivals ([`Store::add`]) and
//! looks for the job's abort notice ([`Store::check`]). Any store will do:
//! the built-in TCP store served by rank 0 ([`tcp`]), an in-process
//! [`MemStore`] for threads, or one a framework already built (the Python
//! package hands in torch's). [`PrefixStore`] gives a split communicator
//! its own key space in the same store.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

pub mod abort;
pub mod tcp;

/// The key under which a job's abort notice is published (never
/// prefixed: one abort reaches every communicator of the job).
pub const ABORT_KEY: &str = "ringcc/abort";

/// A key-value store shared by the ranks of a job. Values are bytes;
/// keys are never deleted while a job runs.
pub trait Store: Send + Sync {
    /// Sets `key` to `value` (overwrites), waking every waiter.
    fn set(&self, key: &str, value: &[u8]) -> Result<()>;

    /// The value of `key`, waiting up to `timeout` for some rank to set
    /// it ([`Error::Timeout`] naming the key after that).
    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>>;

    /// Adds `delta` to the integer counter `key` (created at 0) and
    /// returns the new value.
    fn add(&self, key: &str, delta: i64) -> Result<i64>;

    /// Whether `key` is set, without waiting.
    fn check(&self, key: &str) -> Result<bool>;
}

impl<S: Store + ?Sized> Store for Arc<S> {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        (**self).set(key, value)
    }
    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        (**self).get(key, timeout)
    }
    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        (**self).add(key, delta)
    }
    fn check(&self, key: &str) -> Result<bool> {
        (**self).check(key)
    }
}

/// The timeout error of a [`Store::get`] on `key`.
pub fn get_timeout(key: &str, after: Duration) -> Error {
    Error::Timeout {
        waiting_for: format!("store key {key:?}"),
        after,
    }
}

/// A store in this process's memory, for ranks that are threads (tests,
/// a single-process job).
#[derive(Debug, Default)]
pub struct MemStore {
    map: Mutex<HashMap<String, Vec<u8>>>,
    changed: Condvar,
}

impl MemStore {
    /// An empty store.
    pub fn new() -> MemStore {
        MemStore::default()
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Vec<u8>>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Store for MemStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        self.lock().insert(key.to_owned(), value.to_vec());
        self.changed.notify_all();
        Ok(())
    }

    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        let deadline = Instant::now() + timeout;
        let mut map = self.lock();
        loop {
            if let Some(v) = map.get(key) {
                return Ok(v.clone());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(get_timeout(key, timeout));
            }
            map = self
                .changed
                .wait_timeout(map, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        let mut map = self.lock();
        let now = counter_value(key, map.get(key).map(Vec::as_slice))?.saturating_add(delta);
        map.insert(key.to_owned(), now.to_string().into_bytes());
        drop(map);
        self.changed.notify_all();
        Ok(now)
    }

    fn check(&self, key: &str) -> Result<bool> {
        Ok(self.lock().contains_key(key))
    }
}

/// A counter's value as stored by [`Store::add`] (decimal text, as torch's
/// stores keep it); a missing key is 0.
pub fn counter_value(key: &str, value: Option<&[u8]>) -> Result<i64> {
    match value {
        None => Ok(0),
        Some(v) => std::str::from_utf8(v)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .ok_or_else(|| Error::Store {
                call: "add",
                key: key.to_owned(),
                source: "the key holds a value that is not a counter".into(),
            }),
    }
}

/// Another store's keys under `prefix/` (the [`ABORT_KEY`] excepted): a
/// split communicator's key space.
#[derive(Clone)]
pub struct PrefixStore {
    inner: Arc<dyn Store>,
    prefix: String,
}

impl std::fmt::Debug for PrefixStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrefixStore")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl PrefixStore {
    /// `inner`'s keys under `prefix/`.
    pub fn new(inner: Arc<dyn Store>, prefix: impl Into<String>) -> PrefixStore {
        PrefixStore {
            inner,
            prefix: prefix.into(),
        }
    }

    fn key(&self, key: &str) -> String {
        if key == ABORT_KEY {
            key.to_owned()
        } else {
            format!("{}/{key}", self.prefix)
        }
    }
}

impl Store for PrefixStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        self.inner.set(&self.key(key), value)
    }
    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        self.inner.get(&self.key(key), timeout)
    }
    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        self.inner.add(&self.key(key), delta)
    }
    fn check(&self, key: &str) -> Result<bool> {
        self.inner.check(&self.key(key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_store_waits_for_a_key_set_by_another_thread() {
        let s = Arc::new(MemStore::new());
        let t = {
            let s = Arc::clone(&s);
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(20));
                s.set("k", b"v").unwrap();
            })
        };
        assert_eq!(s.get("k", Duration::from_secs(5)).unwrap(), b"v");
        t.join().unwrap();
    }

    #[test]
    fn mem_store_get_times_out_naming_the_key() {
        let s = MemStore::new();
        let e = s.get("nobody", Duration::from_millis(10)).unwrap_err();
        assert!(matches!(e, Error::Timeout { .. }), "{e}");
        assert!(e.to_string().contains("nobody"), "{e}");
    }

    #[test]
    fn add_counts_and_refuses_a_non_counter() {
        let s = MemStore::new();
        assert_eq!(s.add("c", 2).unwrap(), 2);
        assert_eq!(s.add("c", -5).unwrap(), -3);
        s.set("x", b"hello").unwrap();
        assert!(matches!(s.add("x", 1), Err(Error::Store { .. })));
    }

    #[test]
    fn prefix_store_separates_keys_but_not_the_abort_notice() {
        let base: Arc<dyn Store> = Arc::new(MemStore::new());
        let a = PrefixStore::new(Arc::clone(&base), "a");
        let b = PrefixStore::new(Arc::clone(&base), "b");
        a.set("k", b"1").unwrap();
        assert!(!b.check("k").unwrap());
        assert!(base.check("a/k").unwrap());
        a.set(ABORT_KEY, b"why").unwrap();
        assert!(b.check(ABORT_KEY).unwrap());
    }
}
