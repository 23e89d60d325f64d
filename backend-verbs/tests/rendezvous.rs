//! The TCP rendezvous on its own: no RDMA device needed.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use ringcc_verbs::rendezvous::{AbortState, StoreClient, StoreServer};
use ringcc_verbs::Error;
use serde_json::json;

const T: Duration = Duration::from_secs(10);

fn server(token: &str, n: u32) -> (StoreServer, String) {
    let s = StoreServer::start("127.0.0.1:0", token, n).unwrap();
    let addr = s.local_addr().to_string();
    (s, addr)
}

#[test]
fn all_gather_rounds_return_contributions_by_rank() {
    let (_s, addr) = server("tok", 4);
    let handles: Vec<_> = (0..4u32)
        .map(|r| {
            let addr = addr.clone();
            thread::spawn(move || {
                let mut c = StoreClient::connect(&addr, "tok", r, 4, T).unwrap();
                let a = c.all_gather(0, json!({ "rank": r }), T).unwrap();
                let b = c.all_gather(1, json!(r * 10), T).unwrap();
                (a, b)
            })
        })
        .collect();
    for h in handles {
        let (a, b) = h.join().unwrap();
        assert_eq!(a.len(), 4);
        for (i, v) in a.iter().enumerate() {
            assert_eq!(v["rank"], json!(i));
        }
        assert_eq!(b, vec![json!(0), json!(10), json!(20), json!(30)]);
    }
}

#[test]
fn strangers_are_rejected_and_the_job_goes_on() {
    let (_s, addr) = server("right", 2);
    // Garbage, then a stranger with the wrong token, then a raw oversized
    // hello-less line: each is refused, none disturbs the job.
    let mut g = TcpStream::connect(&addr).unwrap();
    g.write_all(b"\x00\x01 this is not json\n").unwrap();
    let mut reply = String::new();
    let _ = g.read_to_string(&mut reply);
    assert!(reply.contains("reject"), "{reply}");

    match StoreClient::connect(&addr, "wrong", 0, 2, T) {
        Err(Error::Rejected { reason }) => assert!(reason.contains("token"), "{reason}"),
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("a wrong token was accepted"),
    }
    match StoreClient::connect(&addr, "right", 0, 3, T) {
        Err(Error::Rejected { reason }) => assert!(reason.contains("world size"), "{reason}"),
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("a wrong world size was accepted"),
    }
    match StoreClient::connect(&addr, "right", 7, 2, T) {
        Err(Error::Rejected { reason }) => assert!(reason.contains("out of range"), "{reason}"),
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("an out-of-range rank was accepted"),
    }

    let a = {
        let addr = addr.clone();
        thread::spawn(move || {
            let mut c = StoreClient::connect(&addr, "right", 0, 2, T).unwrap();
            c.all_gather(0, json!("zero"), T).unwrap()
        })
    };
    // Rank 0 is now taken (give it a moment to join): a second rank 0 is
    // refused.
    thread::sleep(Duration::from_millis(200));
    match StoreClient::connect(&addr, "right", 0, 2, T) {
        Err(Error::Rejected { reason }) => assert!(reason.contains("already"), "{reason}"),
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("a duplicate rank was accepted"),
    }
    let mut c1 = StoreClient::connect(&addr, "right", 1, 2, T).unwrap();
    let b = c1.all_gather(0, json!("one"), T).unwrap();
    assert_eq!(a.join().unwrap(), vec![json!("zero"), json!("one")]);
    assert_eq!(b, vec![json!("zero"), json!("one")]);
}

#[test]
fn a_silent_stranger_does_not_block_the_store() {
    let (_s, addr) = server("t", 1);
    // Connects and says nothing; the store must keep accepting.
    let _silent = TcpStream::connect(&addr).unwrap();
    let mut c = StoreClient::connect(&addr, "t", 0, 1, T).unwrap();
    assert_eq!(c.all_gather(0, json!(1), T).unwrap(), vec![json!(1)]);
}

#[test]
fn an_abort_reaches_every_rank() {
    let (_s, addr) = server("t", 3);
    let mut clients: Vec<_> = (0..3u32)
        .map(|r| {
            let addr = addr.clone();
            thread::spawn(move || StoreClient::connect(&addr, "t", r, 3, T).unwrap())
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().unwrap())
        .collect();
    let mut c2 = clients.pop().unwrap();
    let states: Vec<Arc<AbortState>> = (0..2).map(|_| Arc::default()).collect();
    let watchers: Vec<_> = clients
        .into_iter()
        .zip(&states)
        .map(|(c, s)| c.into_watcher(Arc::clone(s)).unwrap())
        .collect();
    c2.send_abort("rank 2 hit a bad rkey");
    wait_until(|| states.iter().all(|s| s.is_set()));
    for s in &states {
        match s.error() {
            Some(Error::Aborted { rank, reason }) => {
                assert_eq!(rank, Some(ringcc_core::Rank(2)));
                assert!(reason.contains("bad rkey"));
            }
            other => panic!("expected an abort, got {other:?}"),
        }
    }
    drop(watchers);
}

#[test]
fn a_vanished_rank_aborts_the_others_but_a_clean_leave_does_not() {
    let (_s, addr) = server("t", 3);
    let clients: Vec<_> = (0..2u32)
        .map(|r| {
            let addr = addr.clone();
            thread::spawn(move || StoreClient::connect(&addr, "t", r, 3, T).unwrap())
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().unwrap())
        .collect();
    // Rank 2 speaks the protocol by hand, so that it can vanish without a
    // bye, as a killed process does.
    let mut raw = TcpStream::connect(&addr).unwrap();
    raw.write_all(
        b"{\"type\":\"hello\",\"version\":1,\"token\":\"t\",\"rank\":2,\"world_size\":3}\n",
    )
    .unwrap();
    let mut welcome = [0u8; 64];
    let n = raw.read(&mut welcome).unwrap();
    assert!(String::from_utf8_lossy(&welcome[..n]).contains("welcome"));

    let states: Vec<Arc<AbortState>> = (0..2).map(|_| Arc::default()).collect();
    let mut watchers: Vec<_> = clients
        .into_iter()
        .zip(&states)
        .map(|(c, s)| Some(c.into_watcher(Arc::clone(s)).unwrap()))
        .collect();
    // Rank 1 leaves cleanly: nobody aborts.
    watchers[1] = None;
    thread::sleep(Duration::from_millis(300));
    assert!(!states[0].is_set(), "a clean leave aborted the job");
    // Rank 2 vanishes: rank 0 learns of it.
    drop(raw);
    wait_until(|| states[0].is_set());
    match states[0].error() {
        Some(Error::Aborted { rank, reason }) => {
            assert_eq!(rank, Some(ringcc_core::Rank(2)));
            assert!(reason.contains("lost"), "{reason}");
        }
        other => panic!("expected an abort, got {other:?}"),
    }
    assert!(!states[1].is_set());
}

#[test]
fn a_clean_store_close_is_not_an_abort() {
    let (s, addr) = server("t", 1);
    let c = StoreClient::connect(&addr, "t", 0, 1, T).unwrap();
    let state = Arc::new(AbortState::default());
    let _w = c.into_watcher(Arc::clone(&state)).unwrap();
    // A clean close of the store is not an abort...
    drop(s);
    thread::sleep(Duration::from_millis(300));
    assert!(!state.is_set());
}

#[test]
fn connecting_retries_until_the_store_is_up() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let addr = format!("127.0.0.1:{port}");
    let a = addr.clone();
    let late = thread::spawn(move || {
        thread::sleep(Duration::from_millis(400));
        StoreServer::start(&a, "t", 1).unwrap()
    });
    let mut c = StoreClient::connect(&addr, "t", 0, 1, T).unwrap();
    assert_eq!(c.all_gather(0, json!(5), T).unwrap(), vec![json!(5)]);
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
    let r = StoreClient::connect(
        &format!("127.0.0.1:{port}"),
        "t",
        0,
        1,
        Duration::from_millis(500),
    );
    assert!(matches!(
        r,
        Err(Error::Rendezvous {
            call: "connect",
            ..
        })
    ));
    assert!(t0.elapsed() < Duration::from_secs(3));
}

#[test]
fn a_missing_rank_times_out_the_gather() {
    let (_s, addr) = server("t", 2);
    let mut c = StoreClient::connect(&addr, "t", 0, 2, T).unwrap();
    let t0 = Instant::now();
    let r = c.all_gather(0, json!(0), Duration::from_millis(300));
    assert!(matches!(r, Err(Error::Timeout { .. })), "{r:?}");
    assert!(t0.elapsed() < Duration::from_secs(3));
}

fn wait_until(f: impl Fn() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < T, "condition not reached in {T:?}");
        thread::sleep(Duration::from_millis(10));
    }
}
