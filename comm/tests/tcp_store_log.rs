//! A refused connection and a rank's abort leave clear warnings in the
//! log (its own test binary: it installs a global log subscriber).

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ringcc_comm::store::abort::notice;
use ringcc_comm::store::tcp::{TcpStore, TcpStoreServer};
use ringcc_comm::store::{Store, ABORT_KEY};
use ringcc_core::Rank;

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn refusals_and_aborts_are_logged_with_peer_and_reason() {
    let log = Captured::default();
    let writer = log.clone();
    tracing_subscriber::fmt()
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .init();
    let bind: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let server = TcpStoreServer::start(bind, "job-42", 2).unwrap();
    let addr = server.local_addr().to_string();

    let mut garbage = TcpStream::connect(&addr).unwrap();
    garbage.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
    let stranger = TcpStore::connect(&addr, "job-41", Rank(1), 2, Duration::from_secs(5));
    assert!(stranger.is_err());
    let rank0 = TcpStore::connect(&addr, "job-42", Rank(0), 2, Duration::from_secs(5)).unwrap();
    rank0
        .set(
            ABORT_KEY,
            &notice(Some(Rank(0)), "rank 0 failed during setup: boom"),
        )
        .unwrap();

    let t0 = Instant::now();
    loop {
        let text = String::from_utf8_lossy(&log.0.lock().unwrap()).into_owned();
        let refusals: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("rendezvous: rejected connection"))
            .collect();
        let aborts = text
            .lines()
            .filter(|l| l.contains("WARN") && l.contains("rendezvous: rank aborts: rank 0 failed"))
            .count();
        if refusals.len() >= 2 && aborts == 1 {
            assert!(refusals
                .iter()
                .all(|l| l.contains("WARN") && l.contains("127.0.0.1")));
            assert!(refusals.iter().any(|l| l.contains("bad hello")), "{text}");
            assert!(
                refusals.iter().any(|l| l.contains("wrong job token")),
                "{text}"
            );
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "not logged: {text}");
        std::thread::sleep(Duration::from_millis(10));
    }
}
