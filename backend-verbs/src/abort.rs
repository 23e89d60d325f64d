//! The job-wide abort: this rank's flag ([`AbortState`]), the rank's own
//! abort published as the job's notice in the store ([`send_abort`]), and
//! a watcher thread that turns the notice (or the loss of rank 0's store)
//! into the flag ([`Watcher`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use ringcc_comm::store::abort::{notice, parse_notice};
use ringcc_comm::store::tcp::TcpStore;
use ringcc_comm::store::{Store, ABORT_KEY};
use ringcc_core::Rank;
use tracing::{debug, warn};

use crate::error::{Error, Result};

/// How often the watcher looks for the job's abort notice.
const WATCH_EVERY: Duration = Duration::from_millis(20);

/// How long reading a notice that is known to be there may take.
const READ_NOTICE: Duration = Duration::from_secs(2);

/// The job-wide abort flag of one rank, set by a local failure, by
/// [`AbortHandle::abort`](crate::AbortHandle::abort) or by the store's
/// notice; read by the progress loop at every turn.
#[derive(Debug, Default)]
pub(crate) struct AbortState {
    flag: AtomicBool,
    reason: Mutex<Option<(Option<u32>, String)>>,
}

impl AbortState {
    /// Whether the job is aborted.
    pub fn is_set(&self) -> bool {
        self.flag.load(Ordering::Acquire)
    }

    /// Records the first abort (later ones are ignored). Returns whether
    /// this call set it.
    pub fn set(&self, rank: Option<u32>, reason: String) -> bool {
        let mut r = self.reason.lock().unwrap_or_else(|p| p.into_inner());
        if r.is_some() {
            return false;
        }
        *r = Some((rank, reason));
        self.flag.store(true, Ordering::Release);
        true
    }

    /// The abort as an error, if set.
    pub fn error(&self) -> Option<Error> {
        if !self.is_set() {
            return None;
        }
        let r = self.reason.lock().unwrap_or_else(|p| p.into_inner());
        let (rank, reason) = r.clone().unwrap_or((None, "aborted".into()));
        Some(Error::Aborted {
            rank: rank.map(Rank),
            reason,
        })
    }
}

/// Publishes this rank's failure as the job's abort notice, unless a
/// notice is already there (the first abort is the cause; the others
/// follow from it). Best effort: a store that cannot be reached is only
/// logged.
pub(crate) fn send_abort(store: &dyn Store, rank: Rank, reason: &str) {
    let r = store.check(ABORT_KEY).and_then(|already| {
        if already {
            Ok(())
        } else {
            store.set(ABORT_KEY, &notice(Some(rank), reason))
        }
    });
    if let Err(e) = r {
        warn!(rank = rank.0, "cannot publish the abort notice: {e}");
    }
}

/// This rank's store connections after setup: one that publishes this
/// rank's abort, and a watcher thread with a connection of its own that
/// looks for the job's notice. Dropping it stops the thread and says bye
/// on both (a clean leave).
pub(crate) struct Watcher {
    store: TcpStore,
    rank: Rank,
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Watcher {
    /// Starts watching for the job's notice on a second connection of
    /// `store`'s, into `state`.
    pub fn start(store: TcpStore, state: Arc<AbortState>) -> Result<Watcher> {
        let own = store.try_clone()?;
        let rank = store.rank();
        let (stop, stopped) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("ringcc-watch".into())
            .spawn(move || watch(&own, &state, &stopped))
            .map_err(|source| Error::Rendezvous {
                call: "spawn",
                addr: store.addr().to_owned(),
                source,
            })?;
        Ok(Watcher {
            store,
            rank,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// Tells every rank this one failed (best effort; the store's write
    /// and reply timeouts bound it).
    pub fn send_abort(&self, reason: &str) {
        send_abort(&self.store, self.rank, reason);
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // `store` says bye as it drops.
    }
}

/// Looks for the notice every [`WATCH_EVERY`] until `stopped` says stop,
/// the notice is seen, or the store is gone.
fn watch(store: &TcpStore, state: &AbortState, stopped: &mpsc::Receiver<()>) {
    let rank = store.rank().0;
    loop {
        match store.check(ABORT_KEY) {
            Ok(false) => {}
            Ok(true) => {
                let e = store
                    .get(ABORT_KEY, READ_NOTICE)
                    .map_or_else(|e| e, |v| parse_notice(&v));
                let (r, reason) = match e {
                    ringcc_comm::Error::Aborted { rank, reason } => (rank.map(|r| r.0), reason),
                    other => (None, other.to_string()),
                };
                if state.set(r, reason.clone()) {
                    let by = r.map(|r| format!("rank {r}: ")).unwrap_or_default();
                    warn!(rank, "abort notice from the store: {by}{reason}");
                }
                return;
            }
            Err(e) if store.server_closed() => {
                debug!(rank, "rendezvous: the store closed cleanly ({e})");
                return;
            }
            Err(e) => {
                if stopped.try_recv() != Err(mpsc::TryRecvError::Empty) {
                    return;
                }
                state.set(
                    Some(0),
                    format!("lost the connection to rank 0's store ({e})"),
                );
                return;
            }
        }
        match stopped.recv_timeout(WATCH_EVERY) {
            Err(RecvTimeoutError::Timeout) => {}
            Ok(()) | Err(RecvTimeoutError::Disconnected) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::{SocketAddr, TcpListener, TcpStream};
    use std::time::Instant;

    use ringcc_comm::store::tcp::{TcpStoreServer, VERSION};

    const T: Duration = Duration::from_secs(10);

    fn server(n: u32) -> (TcpStoreServer, String) {
        let bind: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let s = TcpStoreServer::start(bind, "t", n).unwrap();
        let addr = s.local_addr().to_string();
        (s, addr)
    }

    fn join(addr: &str, rank: u32, n: u32) -> TcpStore {
        TcpStore::connect(addr, "t", Rank(rank), n, T).unwrap()
    }

    fn watching(addr: &str, rank: u32, n: u32) -> (Watcher, Arc<AbortState>) {
        let state = Arc::new(AbortState::default());
        let w = Watcher::start(join(addr, rank, n), Arc::clone(&state)).unwrap();
        (w, state)
    }

    fn wait_until(what: &str, f: impl Fn() -> bool) {
        let t0 = Instant::now();
        while !f() {
            assert!(t0.elapsed() < T, "{what}: not within {T:?}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn aborted_by(state: &AbortState) -> (Option<Rank>, String) {
        match state.error() {
            Some(Error::Aborted { rank, reason }) => (rank, reason),
            other => panic!("expected an abort, got {other:?}"),
        }
    }

    #[test]
    fn an_abort_reaches_every_rank_and_the_first_one_wins() {
        let (_s, addr) = server(3);
        let (w0, s0) = watching(&addr, 0, 3);
        let (w1, s1) = watching(&addr, 1, 3);
        let c2 = join(&addr, 2, 3);
        send_abort(&c2, Rank(2), "rank 2 hit a bad rkey");
        w1.send_abort("rank 1 saw its queue pair flushed");
        wait_until("both ranks aborted", || s0.is_set() && s1.is_set());
        for s in [&s0, &s1] {
            let (rank, reason) = aborted_by(s);
            assert_eq!(rank, Some(Rank(2)));
            assert!(reason.contains("bad rkey"), "{reason}");
        }
        drop((w0, w1));
    }

    #[test]
    fn a_vanished_rank_aborts_the_others_but_a_clean_leave_does_not() {
        let (_s, addr) = server(3);
        let (w0, s0) = watching(&addr, 0, 3);
        let (w1, s1) = watching(&addr, 1, 3);
        // Rank 2 speaks the protocol by hand, so that it can vanish
        // without a bye, as a killed process does.
        let mut raw = TcpStream::connect(&addr).unwrap();
        let hello = format!(
            "{{\"type\":\"hello\",\"version\":{VERSION},\"token\":\"t\",\"rank\":2,\"world_size\":3}}\n"
        );
        raw.write_all(hello.as_bytes()).unwrap();
        let mut welcome = [0u8; 64];
        raw.set_read_timeout(Some(T)).unwrap();
        let n = raw.read(&mut welcome).unwrap();
        assert!(String::from_utf8_lossy(&welcome[..n]).contains("welcome"));
        // Rank 1 leaves cleanly: nobody aborts (a few of the watcher's
        // turns pass).
        drop(w1);
        std::thread::sleep(WATCH_EVERY * 5);
        assert!(!s0.is_set(), "a clean leave aborted the job");
        drop(raw);
        wait_until("rank 0 aborted", || s0.is_set());
        let (rank, reason) = aborted_by(&s0);
        assert_eq!(rank, Some(Rank(2)));
        assert!(reason.contains("vanished"), "{reason}");
        assert!(!s1.is_set());
        drop(w0);
    }

    #[test]
    fn a_clean_store_close_is_not_an_abort() {
        let (s, addr) = server(1);
        let (w, state) = watching(&addr, 0, 1);
        drop(s);
        // The watcher's next turn learns of the close and stops.
        wait_until("the watcher stopped", || {
            w.thread.as_ref().is_some_and(JoinHandle::is_finished)
        });
        assert!(!state.is_set());
    }

    /// A "store" that welcomes every connection and then dies with its
    /// connections open (as a killed rank 0 does).
    #[test]
    fn a_lost_store_aborts_the_rank() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let fake = std::thread::spawn(move || {
            let mut conns = Vec::new();
            for _ in 0..2 {
                let (s, _) = listener.accept().unwrap();
                let mut hello = String::new();
                BufReader::new(&s).read_line(&mut hello).unwrap();
                (&s).write_all(b"{\"type\":\"welcome\"}\n").unwrap();
                conns.push(s);
            }
            conns
        });
        let (w, state) = watching(&addr, 1, 2);
        drop(fake.join().unwrap());
        wait_until("the rank aborted", || state.is_set());
        let (rank, reason) = aborted_by(&state);
        assert_eq!(rank, Some(Rank(0)));
        assert!(reason.contains("lost the connection"), "{reason}");
        drop(w);
    }

    #[test]
    fn a_stranger_is_rejected_with_the_stores_reason() {
        let (_s, addr) = server(2);
        let e = TcpStore::connect(&addr, "not-the-token", Rank(1), 2, T).unwrap_err();
        match Error::from(e) {
            Error::Rejected { reason } => assert!(reason.contains("token"), "{reason}"),
            other => panic!("expected a rejection, got {other}"),
        }
    }
}
