//! Unit tests of the TCP transport's receiving side: a raw socket plays
//! the sender (a valid hello, then crafted or fuzzed frames) and the
//! receiver's slots start filled with a guard pattern, so that every byte
//! written can be accounted for.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Shutdown, TcpStream};
use std::time::{Duration, Instant};

use proptest::prelude::*;
use ringcc_comm::transport::{Hop, Job, RecvEnd, Transport};
use ringcc_comm::Error;
use ringcc_core::fifo::{slot_of, FifoGeometry, STEPS};
use ringcc_core::progress::Event;
use ringcc_core::wire::call_header::{CallHeaderRepr, CALL_HEADER_LEN};
use ringcc_core::{CallDesc, ChannelId, Collective, DataType, Rank, ReduceOp, SlotIndex};

use super::frame::{FrameRepr, HelloRepr, Kind, Reason, Reply, FRAME_LEN, REPLY_LEN};
use super::recv::TcpRecvEnd;
use super::TcpTransport;
use crate::token_hash;

const TOKEN: &str = "unit-test-job";
const SLOT: u64 = 64;
const GUARD: u8 = 0xA5;
const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

fn geometry() -> FifoGeometry {
    FifoGeometry::new(SLOT, 2).unwrap()
}

fn hop() -> Hop {
    Hop {
        channel: ChannelId(0),
        sender: Rank(0),
        receiver: Rank(1),
    }
}

/// The job's store (the TCP transport keeps nothing in it).
static STORE: std::sync::LazyLock<ringcc_comm::store::MemStore> =
    std::sync::LazyLock::new(ringcc_comm::store::MemStore::new);

/// The bell of every rank in these tests (their loops poll, never sleep).
static BELL: std::sync::LazyLock<std::sync::Arc<dyn ringcc_comm::transport::Bell>> =
    std::sync::LazyLock::new(|| std::sync::Arc::new(ringcc_comm::LocalBell::new()));

fn job() -> Job<'static> {
    Job {
        token: TOKEN,
        rank: Rank(1),
        world: 2,
        geometry: geometry(),
        deadline: Instant::now() + Duration::from_secs(5),
        peers: &[],
        bell: &BELL,
        store: &*STORE,
    }
}

fn hello() -> HelloRepr {
    HelloRepr {
        token_hash: token_hash(TOKEN),
        sender: 0,
        receiver: 1,
        channel: 0,
        slot_bytes: SLOT,
        slots_per_slice: 2,
    }
}

/// Rank 1's transport, listening for the hop from rank 0 on channel 0.
fn receiver() -> TcpTransport {
    let mut t = TcpTransport::new(LOCALHOST, Duration::from_secs(2), Duration::from_secs(2));
    t.publish(TOKEN, Rank(1)).unwrap();
    t.listen(&job(), hop()).unwrap();
    t
}

/// Sends `h` to `t`'s listener and returns the stream and the reply.
fn say_hello(t: &TcpTransport, h: &HelloRepr) -> (TcpStream, Reply) {
    let mut s = TcpStream::connect(t.local_addr().unwrap()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(&h.emit()).unwrap();
    let mut r = [0u8; REPLY_LEN];
    s.read_exact(&mut r).unwrap();
    (s, Reply::parse(&r))
}

/// A connected hop: the raw sender's stream and the receiving end (slots
/// filled with `GUARD`).
fn connected() -> (TcpTransport, TcpStream, TcpRecvEnd) {
    let mut t = receiver();
    let (s, reply) = say_hello(&t, &hello());
    assert_eq!(reply, Reply::Accepted);
    let end = t.accept_end(&job(), hop(), GUARD).unwrap();
    (t, s, end)
}

fn data(step: u64, len: usize, last: bool, seq: u64) -> Vec<u8> {
    let mut v = FrameRepr {
        kind: Kind::Data,
        last,
        length: len as u32,
        seq,
        step,
    }
    .emit()
    .to_vec();
    v.extend((0..len).map(|i| (step as u8).wrapping_mul(31).wrapping_add(i as u8)));
    v
}

fn desc(seq: u64) -> CallDesc {
    CallDesc {
        seq,
        collective: Collective::AllReduce,
        count: 1000 + seq,
        dtype: DataType::F32,
        op: ReduceOp::Sum,
    }
}

fn header(seq: u64, step: u64) -> Vec<u8> {
    let mut v = FrameRepr {
        kind: Kind::CallHeader,
        last: false,
        length: CALL_HEADER_LEN as u32,
        seq,
        step,
    }
    .emit()
    .to_vec();
    let h = CallHeaderRepr {
        desc: desc(seq),
        step: step as u32,
    };
    v.extend_from_slice(&h.to_bytes());
    v
}

/// Polls until the end fails; the events before and the error.
fn drain(end: &mut TcpRecvEnd) -> (Vec<Event>, Error) {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut events = Vec::new();
    loop {
        match end.poll() {
            Ok(Some(e)) => events.push(e),
            Ok(None) => {
                assert!(
                    Instant::now() < deadline,
                    "no error in time; events {events:?}"
                );
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => return (events, e),
        }
    }
}

/// Polls until `n` events arrived.
fn events(end: &mut TcpRecvEnd, n: usize) -> Vec<Event> {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut events = Vec::new();
    while events.len() < n {
        match end.poll().unwrap() {
            Some(e) => events.push(e),
            None => {
                assert!(Instant::now() < deadline, "only {events:?} in time");
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
    events
}

fn send_and_close(mut s: TcpStream, bytes: &[u8]) {
    s.write_all(bytes).unwrap();
    s.shutdown(Shutdown::Write).unwrap();
    // Closing now is graceful: what was written still arrives, then EOF.
}

fn protocol_reason(e: &Error) -> &str {
    match e {
        Error::Protocol {
            transport: "tcp",
            peer: Rank(0),
            channel: ChannelId(0),
            reason,
        } => reason,
        other => panic!("expected a protocol error from rank 0 on channel 0, got {other:?}"),
    }
}

fn assert_gone(e: &Error, what: &str) {
    match e {
        Error::PeerGone { reason, .. } => {
            assert!(reason.contains(what), "{reason:?} should say {what:?}")
        }
        other => panic!("expected PeerGone, got {other:?}"),
    }
}

/// The guard everywhere but the bytes of `written` (step, len) frames.
fn expected_slots(written: &[(u64, usize)]) -> Vec<u8> {
    let mut v = vec![GUARD; (SLOT * STEPS) as usize];
    for &(step, len) in written {
        let at = usize::from(slot_of(step).0) * SLOT as usize;
        let payload = data(step, len, false, 0);
        v[at..at + len].copy_from_slice(&payload[FRAME_LEN..]);
    }
    v
}

#[test]
fn headers_come_before_the_tails_that_cover_them() {
    let (_t, mut s, mut end) = connected();
    let mut b = header(1, 0);
    b.extend(data(0, 64, false, 1));
    b.extend(data(1, 10, true, 1));
    b.extend(header(2, 2));
    b.extend(data(2, 64, false, 2));
    b.extend(data(3, 0, true, 2));
    s.write_all(&b).unwrap();
    let got = events(&mut end, 4);
    let h = |seq, step| Event::Header {
        step,
        desc: desc(seq),
    };
    assert_eq!(got, vec![h(1, 0), Event::Tail(2), h(2, 2), Event::Tail(4)]);
    assert_eq!(
        end.slot(SlotIndex(1), 10).unwrap(),
        &data(1, 10, false, 0)[FRAME_LEN..]
    );
    // Step 4 was never received: its slot cannot be read.
    assert!(end.slot(SlotIndex(4), 1).is_err());
    assert_slot_error(
        end.slot(SlotIndex(0), SLOT as usize + 1).map(|_| ()),
        "RecvEnd::slot",
        "SlotOverflow",
    );
    assert_slot_error(
        end.slot(SlotIndex(8), 1).map(|_| ()),
        "RecvEnd::slot",
        "NoSuchSlot",
    );
    end.post_head(4).unwrap();
    assert!(end.slot(SlotIndex(0), 1).is_err());
    assert!(end.post_head(5).is_err(), "credit beyond the tail seen");
}

#[test]
fn credit_opens_the_window() {
    let (_t, mut s, mut end) = connected();
    let b: Vec<u8> = (0..STEPS).flat_map(|k| data(k, 8, true, 0)).collect();
    s.write_all(&b).unwrap();
    assert_eq!(events(&mut end, 1), vec![Event::Tail(STEPS)]);
    end.post_head(2).unwrap();
    // The credit frame reaches the sender once the end sees the stream
    // paused (credit for a burst of slices goes out in one frame).
    assert_eq!(end.poll().unwrap(), None);
    let mut c = [0u8; FRAME_LEN];
    s.read_exact(&mut c).unwrap();
    assert_eq!(FrameRepr::parse(&c).unwrap(), FrameRepr::credit(2));
    s.write_all(&data(STEPS, 8, true, 0)).unwrap();
    s.write_all(&data(STEPS + 1, 8, true, 0)).unwrap();
    assert_eq!(events(&mut end, 2), vec![Event::Tail(9), Event::Tail(10)]);
    // Step 10 needs credit up to 3.
    send_and_close(s, &data(STEPS + 2, 8, true, 0));
    let (ev, e) = drain(&mut end);
    assert!(ev.is_empty());
    assert!(protocol_reason(&e).contains("outside the window"), "{e}");
    let slots = end.stop_and_snapshot();
    let written: Vec<_> = (0..STEPS + 2).map(|k| (k, 8)).collect();
    assert_eq!(slots, expected_slots(&written));
}

#[test]
fn a_frame_longer_than_a_slot_is_refused_before_its_bytes() {
    let (_t, s, mut end) = connected();
    send_and_close(s, &data(0, SLOT as usize + 1, true, 0));
    let (ev, e) = drain(&mut end);
    assert!(ev.is_empty());
    assert!(protocol_reason(&e).contains("65 bytes"), "{e}");
    assert_eq!(end.stop_and_snapshot(), expected_slots(&[]));
}

#[test]
fn steps_must_come_in_order() {
    let (_t, s, mut end) = connected();
    let mut b = data(0, 4, true, 0);
    b.extend(data(2, 4, true, 0));
    send_and_close(s, &b);
    let (ev, e) = drain(&mut end);
    assert_eq!(ev, vec![Event::Tail(1)]);
    assert!(protocol_reason(&e).contains("out of order"), "{e}");
    assert_eq!(end.stop_and_snapshot(), expected_slots(&[(0, 4)]));
}

#[test]
fn eof_mid_frame_is_peer_gone() {
    let (_t, s, mut end) = connected();
    let b = data(0, 40, true, 0);
    send_and_close(s, &b[..FRAME_LEN + 5]);
    let (ev, e) = drain(&mut end);
    assert!(ev.is_empty());
    assert_gone(&e, "mid-frame");
    // Only the 5 bytes that came were written, inside slot 0.
    let mut want = expected_slots(&[]);
    want[..5].copy_from_slice(&b[FRAME_LEN..FRAME_LEN + 5]);
    assert_eq!(end.stop_and_snapshot(), want);

    let (_t, s, mut end) = connected();
    send_and_close(s, &b[..10]);
    assert_gone(&drain(&mut end).1, "mid-frame");
}

#[test]
fn a_closed_connection_is_peer_gone_and_stays() {
    let (_t, s, mut end) = connected();
    send_and_close(s, &data(0, 4, true, 0));
    let (ev, e) = drain(&mut end);
    assert_eq!(ev, vec![Event::Tail(1)]);
    assert_gone(&e, "closed");
    assert!(matches!(end.poll(), Err(Error::PeerGone { .. })));
}

fn goodbye(step: u64) -> Vec<u8> {
    FrameRepr::goodbye(step).emit().to_vec()
}

#[test]
fn a_goodbye_between_slices_is_quiet_inside_one_peer_gone() {
    let (_t, s, mut end) = connected();
    send_and_close(s, &[data(0, 4, true, 0), goodbye(1)].concat());
    assert_eq!(events(&mut end, 1), vec![Event::Tail(1)]);
    let until = Instant::now() + Duration::from_millis(300);
    while Instant::now() < until {
        assert_eq!(end.poll().unwrap(), None);
        std::thread::sleep(Duration::from_millis(5));
    }
    end.post_head(1).unwrap();

    let mid_slice = [
        [data(0, 4, false, 0), goodbye(1)].concat(),
        [header(1, 0), goodbye(0)].concat(),
    ];
    for bytes in mid_slice {
        let (_t, s, mut end) = connected();
        send_and_close(s, &bytes);
        assert_gone(&drain(&mut end).1, "middle of a slice");
    }
    let (_t, s, mut end) = connected();
    send_and_close(s, &[data(0, 4, true, 0), goodbye(5)].concat());
    let e = drain(&mut end).1;
    assert!(protocol_reason(&e).contains("a goodbye at step 5"), "{e}");
}

#[test]
fn credit_and_unknown_kinds_are_refused() {
    for (kind, want) in [
        (Kind::Credit, "credit"),
        (Kind::Unknown(9), "unknown frame kind"),
    ] {
        let (_t, s, mut end) = connected();
        let mut f = FrameRepr::credit(0);
        f.kind = kind;
        send_and_close(s, &f.emit());
        let e = drain(&mut end).1;
        assert!(protocol_reason(&e).contains(want), "{e}");
    }
}

#[test]
fn call_headers_are_checked() {
    // Garbage in the header's bytes: the core's parse error.
    let (_t, s, mut end) = connected();
    let mut b = header(1, 0);
    b[FRAME_LEN] = b'X';
    send_and_close(s, &b);
    let e = drain(&mut end).1;
    assert!(
        matches!(
            e,
            Error::Core {
                call: "CallHeaderRepr::parse",
                ..
            }
        ),
        "{e:?}"
    );

    let cases: [(Vec<u8>, &str); 4] = [
        // A frame of another call than its header.
        (
            {
                let mut b = header(1, 0);
                b[16..24].copy_from_slice(&2u64.to_be_bytes());
                b
            },
            "call header of call 1",
        ),
        (
            [header(1, 0), header(2, 0)].concat(),
            "a second call header",
        ),
        (
            [header(2, 0), data(0, 1, true, 2), header(1, 1)].concat(),
            "after one of call 2",
        ),
        (
            [header(2, 0), data(0, 1, true, 2), data(1, 1, true, 1)].concat(),
            "went back",
        ),
    ];
    for (bytes, want) in cases {
        let (_t, s, mut end) = connected();
        send_and_close(s, &bytes);
        let e = drain(&mut end).1;
        assert!(
            protocol_reason(&e).contains(want),
            "{e} should say {want:?}"
        );
    }
}

#[test]
fn hellos_are_judged() {
    let t = receiver();
    let refused = |f: fn(&mut HelloRepr), why: Reason| {
        let mut h = hello();
        f(&mut h);
        let (mut s, r) = say_hello(&t, &h);
        assert_eq!(r, Reply::Refused(why));
        // And the connection is closed.
        assert_eq!(s.read(&mut [0u8; 1]).unwrap(), 0);
    };
    refused(|h| h.token_hash ^= 1, Reason::WrongToken);
    refused(|h| h.receiver = 0, Reason::WrongReceiver);
    refused(|h| h.channel = 1, Reason::UnknownHop);
    refused(|h| h.slot_bytes = 128, Reason::Geometry);
    let (_s, r) = say_hello(&t, &hello());
    assert_eq!(r, Reply::Accepted);
    refused(|_| {}, Reason::Duplicate);
}

/// One frame of a fuzzed stream: a valid next frame, or one of the ways
/// a frame can be wrong.
#[derive(Clone, Debug)]
enum Fault {
    TooLong,
    WrongStep(u64),
    BadKind(u8),
    BadMagic(u8),
    Reserved,
    Truncated(usize),
    BadHeaderBytes,
}

fn fault() -> impl Strategy<Value = Fault> {
    prop_oneof![
        Just(Fault::TooLong),
        (1u64..20).prop_map(Fault::WrongStep),
        prop_oneof![Just(3u8), 4u8..=255, Just(0u8)].prop_map(Fault::BadKind),
        (0u8..4).prop_map(Fault::BadMagic),
        Just(Fault::Reserved),
        (0usize..FRAME_LEN + 8).prop_map(Fault::Truncated),
        Just(Fault::BadHeaderBytes),
    ]
}

/// What the reader must make of a fuzzed stream.
struct Expect {
    written: Vec<(u64, usize)>,
    /// A partial payload (step, bytes that came).
    partial: Option<(u64, Vec<u8>)>,
    tail: u64,
    headers: Vec<u64>,
    /// `true`: PeerGone, `false`: Protocol or Core.
    gone: bool,
}

/// `frames` valid frames (length, last, header before) then `fault`,
/// then `trailer`, as bytes and what they must do.
fn fuzz_stream(
    frames: &[(usize, bool, bool)],
    fault: Option<&Fault>,
    trailer: &[u8],
) -> (Vec<u8>, Expect) {
    let mut b = Vec::new();
    let mut x = Expect {
        written: Vec::new(),
        partial: None,
        tail: 0,
        headers: Vec::new(),
        gone: true,
    };
    let mut seq = 0;
    for (step, &(len, last, with_header)) in frames.iter().enumerate() {
        let step = step as u64;
        if with_header {
            seq += 1;
            b.extend(header(seq, step));
            x.headers.push(step);
        }
        b.extend(data(step, len, last, seq));
        x.written.push((step, len));
        if last {
            x.tail = step + 1;
        }
    }
    let next = frames.len() as u64;
    let Some(fault) = fault else {
        b.extend_from_slice(trailer);
        // A short trailer is a partial frame header (PeerGone); a longer
        // one a header without the magic number.
        x.gone = trailer.len() < FRAME_LEN;
        return (b, x);
    };
    x.gone = false;
    let mut f = data(next, 8, true, seq);
    match fault {
        Fault::TooLong => f = data(next, SLOT as usize + 1, true, seq),
        Fault::WrongStep(d) => f = data(next + d, 8, true, seq),
        Fault::BadKind(k) => f[5] = *k,
        Fault::BadMagic(i) => f[usize::from(*i)] ^= 0x20,
        Fault::Reserved => f[12] = 1,
        Fault::Truncated(n) => {
            f.truncate(*n);
            // A whole header for a step past the window is refused first.
            x.gone = *n < FRAME_LEN || next < STEPS;
            if *n > FRAME_LEN && next < STEPS {
                x.partial = Some((next, f[FRAME_LEN..].to_vec()));
            }
        }
        Fault::BadHeaderBytes => {
            f = header(seq + 1, next);
            f[FRAME_LEN + 4] = 9; // the call header's version
        }
    }
    b.extend(f);
    if !matches!(fault, Fault::Truncated(_)) {
        b.extend_from_slice(trailer);
    }
    (b, x)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Random bytes after a valid hello: a typed error, nothing written.
    #[test]
    fn fuzzed_bytes_after_a_hello(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        prop_assume!(!bytes.starts_with(b"RCTF"));
        let (_t, s, mut end) = connected();
        send_and_close(s, &bytes);
        let (ev, e) = drain(&mut end);
        prop_assert!(ev.is_empty());
        prop_assert!(matches!(e, Error::Protocol { .. } | Error::PeerGone { .. }), "{e:?}");
        prop_assert_eq!(end.stop_and_snapshot(), expected_slots(&[]));
    }

    /// Valid frames, then one wrong frame (or none) and random bytes: the
    /// valid frames land, the wrong one writes nothing outside its slot,
    /// the error has the right type.
    #[test]
    fn fuzzed_frames(
        frames in proptest::collection::vec((0..=SLOT as usize, any::<bool>(), any::<bool>()), 0..=STEPS as usize),
        fault in proptest::option::of(fault()),
        trailer in proptest::collection::vec(any::<u8>(), 0..100),
    ) {
        prop_assume!(!trailer.starts_with(b"RCTF"));
        let (bytes, x) = fuzz_stream(&frames, fault.as_ref(), &trailer);
        let (_t, s, mut end) = connected();
        send_and_close(s, &bytes);
        let (ev, e) = drain(&mut end);
        if x.gone {
            prop_assert!(matches!(e, Error::PeerGone { .. }), "{e:?}");
        } else {
            prop_assert!(matches!(e, Error::Protocol { .. } | Error::Core { .. }), "{e:?}");
        }
        // Tails rise to the last slice's end; each header comes before
        // the first tail past its step.
        let mut seen = 0;
        let mut headers = Vec::new();
        for ev in &ev {
            match *ev {
                Event::Tail(t) => { prop_assert!(t > seen); seen = t; }
                Event::Header { step, .. } => { prop_assert_eq!(step, seen); headers.push(step); }
                other => prop_assert!(false, "unexpected {other:?}"),
            }
        }
        prop_assert_eq!(seen, x.tail);
        let want: Vec<u64> = x.headers.iter().copied().filter(|&h| h < x.tail).collect();
        prop_assert_eq!(headers, want);
        let mut slots = expected_slots(&x.written);
        if let Some((step, part)) = &x.partial {
            let at = usize::from(slot_of(*step).0) * SLOT as usize;
            slots[at..at + part.len()].copy_from_slice(part);
        }
        prop_assert_eq!(end.stop_and_snapshot(), slots);
    }

    /// Random bytes instead of a hello: refused or dropped, and the
    /// acceptor serves the next connection.
    #[test]
    fn fuzzed_hellos(bytes in proptest::collection::vec(any::<u8>(), 0..120)) {
        prop_assume!(!bytes.starts_with(b"RCTH"));
        let t = TcpTransport::new(LOCALHOST, Duration::from_millis(500), Duration::from_secs(2));
        let mut t = t;
        t.publish(TOKEN, Rank(1)).unwrap();
        t.listen(&job(), hop()).unwrap();
        let mut s = TcpStream::connect(t.local_addr().unwrap()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        // The acceptor may have refused and closed (a reset, as bytes
        // were left unread) before these return.
        let _ = s.write_all(&bytes);
        let _ = s.shutdown(Shutdown::Write);
        let mut reply = Vec::new();
        let _ = s.read_to_end(&mut reply);
        if bytes.len() >= super::frame::HELLO_LEN {
            prop_assert_eq!(reply, Reply::Refused(Reason::BadHello).emit().to_vec());
        } else {
            prop_assert!(reply.is_empty());
        }
        let (_s, r) = say_hello(&t, &hello());
        prop_assert_eq!(r, Reply::Accepted);
    }
}

// ---- the sending end: slices posted from the caller's memory -------------

/// A sending end over a loopback connection whose other side is a raw
/// stream, with socket buffers small enough that a slice of `slot`-byte
/// slots does not go in one `sendmsg`.
fn sender_and_raw(slot: u64) -> (super::send::TcpSendEnd, TcpStream) {
    let l = std::net::TcpListener::bind((LOCALHOST, 0)).unwrap();
    // Inherited by the accepted socket: a small receive window.
    rustix::net::sockopt::set_socket_recv_buffer_size(&l, 4096).unwrap();
    let s = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (raw, _) = l.accept().unwrap();
    rustix::net::sockopt::set_socket_send_buffer_size(&s, 4096).unwrap();
    let peer = super::io::Peer {
        rank: Rank(1),
        channel: ChannelId(0),
    };
    let g = FifoGeometry::new(slot, 2).unwrap();
    let end =
        super::send::TcpSendEnd::start(s, peer, g, Duration::from_secs(5), BELL.clone()).unwrap();
    (end, raw)
}

/// Reads `len` bytes from `raw`, polling `end` (which writes what it
/// still holds) in between.
fn read_while_polling(
    raw: &mut TcpStream,
    end: &mut super::send::TcpSendEnd,
    len: usize,
) -> Vec<u8> {
    use ringcc_comm::transport::SendEnd;
    raw.set_read_timeout(Some(Duration::from_millis(5)))
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut got = Vec::new();
    let mut buf = vec![0u8; 1 << 16];
    while got.len() < len {
        assert!(Instant::now() < deadline, "{} of {len} bytes", got.len());
        assert_eq!(end.poll().unwrap(), None, "no credit was sent");
        match raw.read(&mut buf) {
            Ok(0) => panic!("the end closed the stream"),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) => assert!(
                matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ),
                "{e}"
            ),
        }
    }
    got
}

/// Splits a stream of frames into (frame, payload) pairs.
fn frames(mut b: &[u8]) -> Vec<(FrameRepr, Vec<u8>)> {
    let mut out = Vec::new();
    while let Some((h, rest)) = b.split_first_chunk::<FRAME_LEN>() {
        let f = FrameRepr::parse(h).unwrap();
        let (payload, rest) = rest.split_at(f.length as usize);
        out.push((f, payload.to_vec()));
        b = rest;
    }
    assert!(b.is_empty(), "{} bytes after the last whole frame", b.len());
    out
}

#[test]
fn a_slice_posted_from_memory_arrives_whole_when_the_socket_takes_part() {
    use ringcc_comm::transport::SendEnd;
    use ringcc_core::prim::SlotSpan;
    const BIG: u64 = 64 << 10;
    let (mut end, mut raw) = sender_and_raw(BIG);
    assert!(end.prefers_post_from());
    let hdr = [0x11u8; CALL_HEADER_LEN];
    let mut spans = Vec::new();
    // Two spans: the socket takes part of the first straight from
    // memory (the rest is copied); the second is posted while the first
    // still waits in the end, so all of it is copied.
    for (seq, step, len) in [(1u64, 0u64, 2 * BIG as usize - 100), (1, 2, 300)] {
        let mut data: Vec<u8> = (0..len).map(|i| (i * 7 + step as usize) as u8).collect();
        let span = SlotSpan { step, slots: 2 };
        let header = (step == 0).then_some(&hdr);
        end.post_from(seq, span, header, &data, BIG as usize)
            .unwrap();
        // The 4 KiB socket buffers took part of the first span at most.
        assert!(end.queued() > 0, "span at {step}: the socket took it all");
        spans.push((span, data.clone()));
        // Nothing of `data` is referenced any more.
        data.fill(0xEE);
        drop(data);
    }
    let whole = |(_, d): &(SlotSpan, Vec<u8>)| 2 * FRAME_LEN + d.len();
    let len = FRAME_LEN + CALL_HEADER_LEN + spans.iter().map(whole).sum::<usize>();
    let got = frames(&read_while_polling(&mut raw, &mut end, len));
    let mut want = vec![(
        FrameRepr {
            kind: Kind::CallHeader,
            last: false,
            length: CALL_HEADER_LEN as u32,
            seq: 1,
            step: 0,
        },
        hdr.to_vec(),
    )];
    for (span, data) in &spans {
        let first = data.len().min(BIG as usize);
        for (k, part) in [&data[..first], &data[first..]].into_iter().enumerate() {
            want.push((
                FrameRepr {
                    kind: Kind::Data,
                    last: k == 1,
                    length: part.len() as u32,
                    seq: 1,
                    step: span.step + k as u64,
                },
                part.to_vec(),
            ));
        }
    }
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g.0, w.0, "frame {i}");
        assert!(g.1 == w.1, "frame {i}: payload differs");
    }
    // A post from memory is checked as any post: out of order, refused.
    let e = end
        .post_from(
            2,
            SlotSpan { step: 9, slots: 1 },
            None,
            &[1, 2, 3],
            BIG as usize,
        )
        .unwrap_err();
    assert!(matches!(e, Error::Internal(_)), "{e:?}");
}

/// A credit posted while the call receives again waits, even with the
/// stream paused, until a later credit of the call (here its last) or
/// half the window is due: then one frame carries it.
#[test]
fn credit_is_held_while_the_call_receives_again() {
    let (_t, mut s, mut end) = connected();
    s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    let b: Vec<u8> = (0..STEPS).flat_map(|k| data(k, 8, true, 0)).collect();
    s.write_all(&b).unwrap();
    assert_eq!(events(&mut end, 1), vec![Event::Tail(STEPS)]);
    let mut c = [0u8; FRAME_LEN];
    // Held: nothing comes, however often the end is polled.
    end.post_credit(1, true).unwrap();
    for _ in 0..20 {
        assert_eq!(end.poll().unwrap(), None);
    }
    assert!(s.read_exact(&mut c).is_err(), "a held credit was sent");
    // Half the window due: it goes.
    end.post_credit(STEPS / 2, true).unwrap();
    s.read_exact(&mut c).unwrap();
    assert_eq!(FrameRepr::parse(&c).unwrap(), FrameRepr::credit(STEPS / 2));
    end.post_credit(STEPS / 2 + 1, true).unwrap();
    assert_eq!(end.poll().unwrap(), None);
    // The call's last credit is not held: (with slices past it in, as
    // here) it goes once a poll finds the stream paused, and covers the
    // held one.
    end.post_credit(STEPS / 2 + 2, false).unwrap();
    assert_eq!(end.poll().unwrap(), None);
    s.read_exact(&mut c).unwrap();
    assert_eq!(
        FrameRepr::parse(&c).unwrap(),
        FrameRepr::credit(STEPS / 2 + 2)
    );
    assert!(s.read_exact(&mut c).is_err(), "one frame per credit sent");
}

/// `r` is `call`'s transport error wrapping this crate's `variant`.
fn assert_slot_error(r: ringcc_comm::Result<()>, call: &str, variant: &str) {
    match r {
        Err(ringcc_comm::Error::Transport {
            call: c, source, ..
        }) if c == call => {
            let e = format!("{source:?}");
            assert!(
                e.starts_with(variant),
                "{call}: expected {variant}, got {e}"
            );
        }
        other => panic!("{call}: expected a transport error, got {other:?}"),
    }
}

/// A staging slot beyond the FIFO, or more bytes than a slot holds, is
/// the end's typed error; a slot within it is exactly as long as asked.
#[test]
fn staging_slots_outside_the_fifo_are_refused() {
    use ringcc_comm::transport::SendEnd;
    let (mut end, _raw) = sender_and_raw(SLOT);
    assert_eq!(
        end.slot_mut(SlotIndex(7), SLOT as usize).unwrap().len(),
        SLOT as usize
    );
    assert_eq!(end.slot_mut(SlotIndex(3), 5).unwrap().len(), 5);
    assert_slot_error(
        end.slot_mut(SlotIndex(8), 1).map(|_| ()),
        "SendEnd::slot_mut",
        "NoSuchSlot",
    );
    assert_slot_error(
        end.slot_mut(SlotIndex(0), SLOT as usize + 1).map(|_| ()),
        "SendEnd::slot_mut",
        "SlotOverflow",
    );
    assert_slot_error(
        end.slot_mut(SlotIndex(u8::MAX), usize::MAX).map(|_| ()),
        "SendEnd::slot_mut",
        "SlotOverflow",
    );
}

/// After a read that found the socket empty and whose events are all
/// reported, the next poll skips reading (a small call's engine acts
/// first) and the one after reads again: one skip, never two.
#[test]
fn a_poll_after_a_short_read_skips_one_read_only() {
    let (_t, mut s, mut end) = connected();
    let mut b = header(1, 0);
    b.extend(data(0, 8, true, 1));
    s.write_all(&b).unwrap();
    let h = Event::Header {
        step: 0,
        desc: desc(1),
    };
    assert_eq!(events(&mut end, 2), vec![h, Event::Tail(1)]);
    // The read that brought both frames was short: the next poll skips.
    let before = end.reads;
    assert_eq!(end.poll().unwrap(), None);
    assert_eq!(end.reads, before, "the poll after a short read read again");
    // The one after reads (and finds nothing, so the next reads too).
    assert_eq!(end.poll().unwrap(), None);
    assert_eq!(end.reads, before + 1, "two polls in a row skipped");
    assert_eq!(end.poll().unwrap(), None);
    assert_eq!(end.reads, before + 2, "a poll after an empty read skipped");
}

/// TCP moves bytes with the CPU: it does not take device memory, and a
/// dma-buf lent to it anyway is refused with a typed error, on both
/// ends, before anything is made.
#[test]
fn device_memory_is_refused_not_copied_from() {
    let mut t = TcpTransport::new(LOCALHOST, Duration::from_secs(2), Duration::from_secs(2));
    t.publish(TOKEN, Rank(1)).unwrap();
    assert!(t.device_memory().is_err_and(|why| why.contains("CPU")));
    let len = geometry().fifo_bytes() as usize;
    // SAFETY: refused before any use (the descriptor is never touched).
    let fifo = unsafe { ringcc_comm::transport::FifoMemory::dma_buf(-1, 0, 0x7000_0000, len) };
    assert_eq!(fifo.device(), Some((-1, 0)));
    match t.listen_in(&job(), hop(), fifo) {
        Err(Error::BadConfig(m)) => assert!(m.contains("device memory"), "{m}"),
        other => panic!("expected BadConfig, got {other:?}"),
    }
    let out = Hop {
        channel: ChannelId(0),
        sender: Rank(1),
        receiver: Rank(0),
    };
    match t.connect_from(&job(), out, fifo) {
        Err(Error::BadConfig(m)) => assert!(m.contains("tcp"), "{m}"),
        Err(e) => panic!("expected BadConfig, got {e:?}"),
        Ok(_) => panic!("a sending end over device memory"),
    }
}
