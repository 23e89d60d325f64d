//! The TCP store over loopback: requests across threads, waits, strangers,
//! and the abort notice of a rank that vanished.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use ringcc_comm::store::abort::parse_notice;
use ringcc_comm::store::tcp::{TcpStore, TcpStoreServer, VERSION};
use ringcc_comm::store::{Store, ABORT_KEY};
use ringcc_comm::Error;
use ringcc_core::Rank;

const T: Duration = Duration::from_secs(10);

fn server(token: &str, n: u32) -> (TcpStoreServer, String) {
    let bind: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let s = TcpStoreServer::start(bind, token, n).unwrap();
    let addr = s.local_addr().to_string();
    (s, addr)
}

fn connect(addr: &str, token: &str, rank: u32, n: u32) -> Result<TcpStore, Error> {
    TcpStore::connect(addr, token, Rank(rank), n, T)
}

/// Waits (with a deadline) until `f` holds.
fn wait_until(what: &str, f: impl Fn() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < T, "{what}: not reached in {T:?}");
        thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn set_and_get_across_threads() {
    let (_s, addr) = server("tok", 4);
    let handles: Vec<_> = (0..4u32)
        .map(|r| {
            let addr = addr.clone();
            thread::spawn(move || {
                let c = connect(&addr, "tok", r, 4).unwrap();
                c.set(&format!("k/{r}"), format!("value {r}").as_bytes())
                    .unwrap();
                (0..4u32)
                    .map(|p| c.get(&format!("k/{p}"), T).unwrap())
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    for h in handles {
        let got = h.join().unwrap();
        for (p, v) in got.iter().enumerate() {
            assert_eq!(v, format!("value {p}").as_bytes());
        }
    }
}

#[test]
fn any_bytes_round_trip_and_a_set_overwrites() {
    let (_s, addr) = server("tok", 1);
    let c = connect(&addr, "tok", 0, 1).unwrap();
    let all: Vec<u8> = (0..=255).collect();
    c.set("bytes", &all).unwrap();
    assert_eq!(c.get("bytes", T).unwrap(), all);
    c.set("bytes", b"").unwrap();
    assert_eq!(c.get("bytes", T).unwrap(), b"");
    assert!(c.check("bytes").unwrap());
    assert!(!c.check("nothing").unwrap());
}

#[test]
fn a_get_waits_for_a_later_set_while_others_are_served() {
    let (_s, addr) = server("tok", 2);
    let waiter = {
        let addr = addr.clone();
        thread::spawn(move || {
            let c = connect(&addr, "tok", 0, 2).unwrap();
            let t0 = Instant::now();
            (c.get("late", T).unwrap(), t0.elapsed())
        })
    };
    let c = connect(&addr, "tok", 1, 2).unwrap();
    // The waiting get blocks nobody: this connection is served meanwhile.
    c.set("other", b"x").unwrap();
    assert_eq!(c.get("other", T).unwrap(), b"x");
    thread::sleep(Duration::from_millis(50));
    c.set("late", b"finally").unwrap();
    let (v, waited) = waiter.join().unwrap();
    assert_eq!(v, b"finally");
    assert!(waited < T, "{waited:?}");
}

#[test]
fn a_get_times_out_naming_the_key() {
    let (_s, addr) = server("tok", 1);
    let c = connect(&addr, "tok", 0, 1).unwrap();
    let t0 = Instant::now();
    let e = c.get("never/set", Duration::from_millis(100)).unwrap_err();
    assert!(matches!(e, Error::Timeout { .. }), "{e}");
    assert!(e.to_string().contains("never/set"), "{e}");
    assert!(t0.elapsed() < Duration::from_secs(3));
    // The connection stays usable after a timeout.
    c.set("k", b"v").unwrap();
}

#[test]
fn add_counts_from_many_clients() {
    let (_s, addr) = server("tok", 8);
    let handles: Vec<_> = (0..8u32)
        .map(|r| {
            let addr = addr.clone();
            thread::spawn(move || {
                let c = connect(&addr, "tok", r, 8).unwrap();
                for _ in 0..25 {
                    c.add("count", 2).unwrap();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let c = connect(&addr, "tok", 0, 8).unwrap();
    assert_eq!(c.add("count", 0).unwrap(), 400);
    assert_eq!(c.get("count", T).unwrap(), b"400");
    c.set("text", b"not a number").unwrap();
    assert!(matches!(
        c.add("text", 1),
        Err(Error::Store { call: "add", .. })
    ));
}

fn refused(r: Result<TcpStore, Error>, what: &str) -> String {
    match r {
        Err(Error::Stranger { reason, .. }) => reason,
        Err(e) => panic!("{what}: unexpected error {e}"),
        Ok(_) => panic!("{what} was accepted"),
    }
}

#[test]
fn strangers_are_refused_and_the_store_serves_on() {
    let (_s, addr) = server("right", 2);
    let rank0 = connect(&addr, "right", 0, 2).unwrap();
    rank0.set("before", b"1").unwrap();

    let mut g = TcpStream::connect(&addr).unwrap();
    g.write_all(b"\x00\x01 this is not json\n").unwrap();
    let mut reply = String::new();
    g.set_read_timeout(Some(T)).unwrap();
    let _ = g.read_to_string(&mut reply);
    assert!(
        reply.contains("reject") && reply.contains("bad hello"),
        "{reply}"
    );

    let reason = refused(connect(&addr, "wrong", 1, 2), "a wrong token");
    assert!(reason.contains("token"), "{reason}");
    let reason = refused(connect(&addr, "right", 1, 3), "a wrong world size");
    assert!(reason.contains("world size"), "{reason}");
    let reason = refused(connect(&addr, "right", 7, 2), "a rank out of range");
    assert!(reason.contains("out of range"), "{reason}");

    // A hello longer than a hello can be is refused without reading on.
    let mut big = TcpStream::connect(&addr).unwrap();
    let _ = big.write_all(&vec![b'{'; 64 * 1024]);
    let mut reply = String::new();
    big.set_read_timeout(Some(T)).unwrap();
    let _ = big.read_to_string(&mut reply);
    assert!(reply.contains("longer than"), "{reply}");

    // Nothing of it disturbed the job.
    let rank1 = connect(&addr, "right", 1, 2).unwrap();
    assert_eq!(rank1.get("before", T).unwrap(), b"1");
    rank1.set("after", b"2").unwrap();
    assert_eq!(rank0.get("after", T).unwrap(), b"2");
    assert!(
        !rank0.check(ABORT_KEY).unwrap(),
        "a stranger aborted the job"
    );
}

#[test]
fn a_silent_stranger_is_refused_after_the_hello_timeout_and_blocks_nobody() {
    let bind: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let s =
        TcpStoreServer::start_with_hello_timeout(bind, "t", 1, Duration::from_millis(300)).unwrap();
    let addr = s.local_addr().to_string();
    // Connects and says nothing; the store must keep serving.
    let mut silent = TcpStream::connect(&addr).unwrap();
    let c = connect(&addr, "t", 0, 1).unwrap();
    c.set("k", b"v").unwrap();
    assert_eq!(c.get("k", T).unwrap(), b"v");
    let mut reply = String::new();
    silent.set_read_timeout(Some(T)).unwrap();
    let _ = silent.read_to_string(&mut reply);
    assert!(
        reply.contains("reject") && reply.contains("timed out"),
        "{reply}"
    );
}

#[test]
fn a_rank_dropped_without_bye_publishes_the_abort_notice() {
    let (_s, addr) = server("t", 3);
    let survivor = connect(&addr, "t", 0, 3).unwrap();
    // Rank 2 speaks the protocol by hand, so that it can vanish without a
    // bye, as a killed process does.
    let mut raw = TcpStream::connect(&addr).unwrap();
    let hello = format!(
        "{{\"type\":\"hello\",\"version\":{VERSION},\"token\":\"t\",\"rank\":2,\"world_size\":3}}\n"
    );
    raw.write_all(hello.as_bytes()).unwrap();
    let mut welcome = [0u8; 64];
    raw.set_read_timeout(Some(T)).unwrap();
    let n = raw.read(&mut welcome).unwrap();
    assert!(String::from_utf8_lossy(&welcome[..n]).contains("welcome"));
    drop(raw);
    wait_until("the abort notice", || survivor.check(ABORT_KEY).unwrap());
    match parse_notice(&survivor.get(ABORT_KEY, T).unwrap()) {
        Error::Aborted { rank, reason } => {
            assert_eq!(rank, Some(Rank(2)));
            assert!(reason.contains("rank 2 vanished"), "{reason}");
        }
        e => panic!("not an abort: {e}"),
    }
}

#[test]
fn a_rank_that_vanishes_during_a_get_is_noticed_and_wakes_the_waiters() {
    let (_s, addr) = server("t", 2);
    let c0 = connect(&addr, "t", 0, 2).unwrap();
    let mut raw = TcpStream::connect(&addr).unwrap();
    let hello = format!(
        "{{\"type\":\"hello\",\"version\":{VERSION},\"token\":\"t\",\"rank\":1,\"world_size\":2}}\n\
         {{\"type\":\"get\",\"key\":\"never\",\"timeout_ms\":60000}}\n"
    );
    raw.write_all(hello.as_bytes()).unwrap();
    thread::sleep(Duration::from_millis(50));
    drop(raw);
    let t0 = Instant::now();
    // Rank 0 waits for a key of rank 1's: the notice is there within the
    // get's liveness check, long before the 60 s.
    wait_until("the abort notice", || c0.check(ABORT_KEY).unwrap());
    assert!(t0.elapsed() < Duration::from_secs(5));
}

#[test]
fn bye_and_drop_leave_cleanly_and_clones_share_the_rank() {
    let (_s, addr) = server("t", 2);
    let c0 = connect(&addr, "t", 0, 2).unwrap();
    let watcher = c0.try_clone().unwrap();
    assert_eq!(watcher.rank(), Rank(0));
    let c1 = connect(&addr, "t", 1, 2).unwrap();
    c1.set("from 1", b"x").unwrap();
    assert_eq!(watcher.get("from 1", T).unwrap(), b"x");
    c1.bye().unwrap();
    assert!(matches!(c1.set("k", b"v"), Err(Error::Store { .. })));
    drop(c1);
    let c1b = connect(&addr, "t", 1, 2).unwrap();
    drop(c1b); // bye in Drop
    drop(watcher);
    // Give the server the time to see the closes (it has no event to
    // wait for: the absence of the notice is the point).
    thread::sleep(Duration::from_millis(200));
    assert!(
        !c0.check(ABORT_KEY).unwrap(),
        "a clean leave aborted the job"
    );
}

#[test]
fn a_clean_server_close_is_reported_as_such() {
    let (s, addr) = server("t", 1);
    let c = Arc::new(connect(&addr, "t", 0, 1).unwrap());
    let waiter = {
        let c = Arc::clone(&c);
        thread::spawn(move || c.get("never", T))
    };
    thread::sleep(Duration::from_millis(50));
    let t0 = Instant::now();
    drop(s); // joins its threads: the waiting get is answered first
    assert!(t0.elapsed() < Duration::from_secs(5));
    assert!(matches!(waiter.join().unwrap(), Err(Error::Store { .. })));
    assert!(c.server_closed());
    let late = TcpStore::connect(&addr, "t", Rank(0), 1, Duration::from_millis(100));
    assert!(late.is_err(), "connected to a closed store");
}

#[test]
fn an_idle_connection_learns_of_the_close_on_its_next_request() {
    let (s, addr) = server("t", 1);
    let c = connect(&addr, "t", 0, 1).unwrap();
    drop(s);
    assert!(c.check("k").is_err());
    assert!(c.server_closed());
}

#[test]
fn connecting_retries_until_the_store_is_up() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let bind: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let late = thread::spawn(move || {
        thread::sleep(Duration::from_millis(200));
        TcpStoreServer::start(bind, "t", 1).unwrap()
    });
    let c = connect(&bind.to_string(), "t", 0, 1).unwrap();
    c.set("k", b"v").unwrap();
    drop(c);
    drop(late.join().unwrap());
}

#[test]
fn connecting_to_nothing_fails_within_the_deadline() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let t0 = Instant::now();
    let r = TcpStore::connect(
        &format!("127.0.0.1:{port}"),
        "t",
        Rank(0),
        1,
        Duration::from_millis(300),
    );
    assert!(
        matches!(
            r,
            Err(Error::Store {
                call: "connect",
                ..
            })
        ),
        "{r:?}"
    );
    assert!(t0.elapsed() < Duration::from_secs(3));
}
