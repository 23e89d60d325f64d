//! A refused connection leaves a clear warning in the log (its own test
//! binary: it installs a global log subscriber).

use std::io::Write;
use std::net::TcpStream;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ringcc_verbs::rendezvous::{StoreClient, StoreServer};

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
fn refusals_are_logged_with_peer_and_reason() {
    let log = Captured::default();
    let writer = log.clone();
    tracing_subscriber::fmt()
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .init();
    let server = StoreServer::start("127.0.0.1:0", "job-42", 2).unwrap();
    let addr = server.local_addr().to_string();

    let mut garbage = TcpStream::connect(&addr).unwrap();
    garbage.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
    let stranger = StoreClient::connect(&addr, "job-41", 1, 2, Duration::from_secs(5));
    assert!(stranger.is_err());

    let t0 = Instant::now();
    loop {
        let text = String::from_utf8_lossy(&log.0.lock().unwrap()).into_owned();
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("rejected connection"))
            .collect();
        if lines.len() >= 2 {
            assert!(lines
                .iter()
                .all(|l| l.contains("WARN") && l.contains("127.0.0.1")));
            assert!(lines.iter().any(|l| l.contains("bad hello")), "{text}");
            assert!(
                lines.iter().any(|l| l.contains("wrong job token")),
                "{text}"
            );
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "no rejection logged: {text}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
