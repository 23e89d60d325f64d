//! The TCP transport between two ranks of one process (ranks 0 and 1,
//! two channels, 127.0.0.1): connecting, slices both ways with the
//! credit handshake and every byte checked, call headers before their
//! tails, strangers, garbage and silence refused while valid hops still
//! connect, a vanished peer seen as `PeerGone`.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use ringcc_comm::transport::{Hop, Job, PeerInfo, RecvEnd, SendEnd, Transport};
use ringcc_comm::Error;
use ringcc_core::fifo::{slot_of, FifoGeometry, STEPS};
use ringcc_core::prim::SlotSpan;
use ringcc_core::progress::Event;
use ringcc_core::rng::Rng;
use ringcc_core::wire::call_header::{CallHeaderRepr, CALL_HEADER_LEN};
use ringcc_core::{CallDesc, ChannelId, Collective, DataType, Rank, ReduceOp};
use ringcc_host::tcp::TcpTransport;

const TOKEN: &str = "tcp-test-job";

/// The job's store (the TCP transport keeps nothing in it).
static STORE: std::sync::LazyLock<ringcc_comm::store::MemStore> =
    std::sync::LazyLock::new(ringcc_comm::store::MemStore::new);

/// The bell of every rank in these tests (their loops poll, never sleep).
static BELL: std::sync::LazyLock<std::sync::Arc<dyn ringcc_comm::transport::Bell>> =
    std::sync::LazyLock::new(|| std::sync::Arc::new(ringcc_comm::LocalBell::new()));
const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
const HELLO_TIMEOUT: Duration = Duration::from_secs(1);

fn transport() -> TcpTransport {
    TcpTransport::new(LOCALHOST, HELLO_TIMEOUT, Duration::from_secs(10))
}

/// Two published ranks (0 and 1) and what they published.
fn world() -> ([TcpTransport; 2], Vec<PeerInfo>) {
    world_with(Duration::from_secs(10))
}

/// [`world`] with writes that give up after `timeout`.
fn world_with(timeout: Duration) -> ([TcpTransport; 2], Vec<PeerInfo>) {
    let tr = || TcpTransport::new(LOCALHOST, HELLO_TIMEOUT, timeout);
    let mut t = [tr(), tr()];
    let mut peers = Vec::new();
    for (r, t) in t.iter_mut().enumerate() {
        let v = t.publish(TOKEN, Rank(r as u32)).unwrap().unwrap();
        let addr: SocketAddr = v["addr"].as_str().unwrap().parse().unwrap();
        assert_eq!(addr.ip(), LOCALHOST);
        assert_eq!(Some(addr), t.local_addr());
        peers.push(PeerInfo {
            rank: r as u32,
            node: format!("node{r}"),
            pid: std::process::id(),
            transports: BTreeMap::from([("tcp".to_string(), v)]),
        });
    }
    assert!(t[0].reaches(&peers[0], &peers[1]));
    assert!(t[1].reaches(&peers[1], &peers[0]));
    (t, peers)
}

/// Rank `rank`'s view of the job, connecting within `within`.
fn job(peers: &[PeerInfo], g: FifoGeometry, rank: u32, within: Duration) -> Job<'_> {
    Job {
        token: TOKEN,
        rank: Rank(rank),
        world: 2,
        geometry: g,
        deadline: Instant::now() + within,
        peers,
        bell: &BELL,
        store: &*STORE,
    }
}

type Ends = (Box<dyn SendEnd>, Box<dyn RecvEnd>);

/// Listens, connects and accepts `hops` (in three phases, as a
/// communicator does): the ends, in `hops`' order.
fn connect(
    t: &mut [TcpTransport; 2],
    peers: &[PeerInfo],
    g: FifoGeometry,
    hops: &[Hop],
) -> Vec<Ends> {
    let d = Duration::from_secs(10);
    for h in hops {
        let r = h.receiver.0;
        t[r as usize].listen(&job(peers, g, r, d), *h).unwrap();
    }
    let sends: Vec<_> = hops
        .iter()
        .map(|h| {
            let s = h.sender.0;
            t[s as usize].connect(&job(peers, g, s, d), *h).unwrap()
        })
        .collect();
    hops.iter()
        .zip(sends)
        .map(|(h, s)| {
            let r = h.receiver.0;
            (s, t[r as usize].accept(&job(peers, g, r, d), *h).unwrap())
        })
        .collect()
}

fn hop(channel: u8, sender: u32) -> Hop {
    Hop {
        channel: ChannelId(channel),
        sender: Rank(sender),
        receiver: Rank(1 - sender),
    }
}

/// One slice of the schedule both ends of a hop know.
#[derive(Clone, Debug)]
struct Slice {
    span: SlotSpan,
    seq: u64,
    header: Option<[u8; CALL_HEADER_LEN]>,
    bytes: usize,
    fill: u8,
}

fn schedule(seed: u64, n: usize, g: FifoGeometry) -> Vec<Slice> {
    let mut rng = Rng::new(seed);
    let sps = g.slots_per_slice();
    let mut seq = 0;
    (0..n)
        .map(|i| {
            let span = SlotSpan {
                step: i as u64 * sps,
                slots: sps,
            };
            let header = (i == 0 || rng.chance(0.15)).then(|| {
                seq += 1;
                CallHeaderRepr {
                    desc: CallDesc {
                        seq,
                        collective: Collective::AllGather,
                        count: rng.below(1 << 20),
                        dtype: DataType::U8,
                        op: ReduceOp::Sum,
                    },
                    step: span.step as u32,
                }
                .to_bytes()
            });
            // Mostly full slices, some short, some empty.
            let full = g.slice_bytes();
            let bytes = match rng.below(4) {
                0 => 0,
                1 => rng.below(full + 1),
                _ => full - rng.below(2) * rng.below(full / 2),
            } as usize;
            Slice {
                span,
                seq,
                header,
                bytes,
                fill: rng.next_u64() as u8,
            }
        })
        .collect()
}

fn byte_of(s: &Slice, at: usize) -> u8 {
    s.fill.wrapping_add((at as u8).wrapping_mul(7)) ^ (at >> 8) as u8
}

/// Drives one hop's sender: posts every slice the credit allows.
struct Sender<'a> {
    end: &'a mut dyn SendEnd,
    plan: &'a [Slice],
    next: usize,
    head: u64,
    slot_bytes: usize,
}

impl Sender<'_> {
    fn step(&mut self) -> bool {
        let mut moved = false;
        while let Some(ev) = self.end.poll().unwrap() {
            match ev {
                Event::Head(h) => {
                    assert!(h > self.head, "head {h} after {}", self.head);
                    self.head = h;
                }
                other => panic!("a send end reported {other:?}"),
            }
            moved = true;
        }
        while let Some(s) = self.plan.get(self.next) {
            if s.span.end() > self.head + STEPS {
                break;
            }
            let mut at = 0;
            for k in 0..s.span.slots {
                let len = (s.bytes - at).min(self.slot_bytes);
                if len > 0 {
                    let dst = self.end.slot_mut(slot_of(s.span.step + k), len).unwrap();
                    for (i, b) in dst.iter_mut().enumerate() {
                        *b = byte_of(s, at + i);
                    }
                }
                at += len;
            }
            self.end
                .post(s.seq, s.span, s.header.as_ref(), s.bytes)
                .unwrap();
            self.next += 1;
            moved = true;
        }
        moved
    }
}

/// Drives one hop's receiver: checks events and bytes, returns credit.
struct Receiver<'a> {
    end: &'a mut dyn RecvEnd,
    plan: &'a [Slice],
    /// Slices checked and credited.
    done: usize,
    tail: u64,
    /// Headers received, by step.
    headers: Vec<u64>,
    slot_bytes: usize,
}

impl Receiver<'_> {
    fn step(&mut self) -> bool {
        let mut moved = false;
        while let Some(ev) = self.end.poll().unwrap() {
            moved = true;
            match ev {
                Event::Header { step, desc } => {
                    // Before the tail that covers it, at a slice that has one.
                    assert_eq!(step, self.tail, "header at {step} after tail {}", self.tail);
                    let s = self
                        .plan
                        .iter()
                        .find(|s| s.span.step == step)
                        .expect("a header at a slice's start");
                    let want = CallHeaderRepr::parse(
                        &ringcc_core::wire::call_header::CallHeader::new_unchecked(
                            &s.header.expect("a slice with a header")[..],
                        ),
                    )
                    .unwrap();
                    assert_eq!(desc, want.desc);
                    self.headers.push(step);
                }
                Event::Tail(t) => {
                    assert!(t > self.tail);
                    self.tail = t;
                }
                other => panic!("a receive end reported {other:?}"),
            }
        }
        while let Some(s) = self.plan.get(self.done) {
            if s.span.end() > self.tail {
                break;
            }
            assert_eq!(
                s.header.is_some(),
                self.headers.contains(&s.span.step),
                "slice at step {}",
                s.span.step
            );
            let mut at = 0;
            for k in 0..s.span.slots {
                let len = (s.bytes - at).min(self.slot_bytes);
                let got = self.end.slot(slot_of(s.span.step + k), len).unwrap();
                for (i, b) in got.iter().enumerate() {
                    assert_eq!(
                        *b,
                        byte_of(s, at + i),
                        "slice at step {} byte {}",
                        s.span.step,
                        at + i
                    );
                }
                at += len;
            }
            self.end.post_head(s.span.end()).unwrap();
            self.done += 1;
            moved = true;
        }
        moved
    }
}

#[test]
fn slices_both_ways_on_two_channels() {
    let g = FifoGeometry::new(4096, 2).unwrap();
    let (mut t, peers) = world();
    let hops = [hop(0, 0), hop(0, 1), hop(1, 0), hop(1, 1)];
    let mut ends = connect(&mut t, &peers, g, &hops);
    let plans: Vec<_> = (0..hops.len())
        .map(|i| schedule(i as u64 + 1, 300, g))
        .collect();
    let mut senders = Vec::new();
    let mut receivers = Vec::new();
    for ((s, r), plan) in ends.iter_mut().zip(&plans) {
        senders.push(Sender {
            end: &mut **s,
            plan,
            next: 0,
            head: 0,
            slot_bytes: 4096,
        });
        receivers.push(Receiver {
            end: &mut **r,
            plan,
            done: 0,
            tail: 0,
            headers: Vec::new(),
            slot_bytes: 4096,
        });
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while receivers.iter().any(|r| r.done < r.plan.len()) {
        assert!(Instant::now() < deadline, "stuck");
        let mut moved = false;
        for s in &mut senders {
            moved |= s.step();
        }
        for r in &mut receivers {
            moved |= r.step();
        }
        if !moved {
            std::thread::sleep(Duration::from_micros(100));
        }
    }
    for r in &receivers {
        let with_header = r.plan.iter().filter(|s| s.header.is_some()).count();
        assert_eq!(r.headers.len(), with_header);
    }
}

/// Polls until the end fails.
fn error_of(
    mut poll: impl FnMut() -> ringcc_comm::Result<Option<Event>>,
    within: Duration,
) -> Error {
    let deadline = Instant::now() + within;
    loop {
        match poll() {
            Err(e) => return e,
            Ok(_) => {
                assert!(Instant::now() < deadline, "no error within {within:?}");
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
}

/// Posts `n` one-slot slices of 8 bytes from step `from`.
fn post_slices(s: &mut dyn SendEnd, from: u64, n: u64) {
    for step in from..from + n {
        s.slot_mut(slot_of(step), 8).unwrap().fill(step as u8);
        s.post(0, SlotSpan { step, slots: 1 }, None, 8).unwrap();
    }
}

/// Polls until `want` arrives (other events are skipped).
fn wait_for(mut poll: impl FnMut() -> ringcc_comm::Result<Option<Event>>, want: Event) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while poll().unwrap() != Some(want) {
        assert!(Instant::now() < deadline, "no {want:?} in time");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Polls for a while: nothing may be reported.
fn quiet(mut poll: impl FnMut() -> ringcc_comm::Result<Option<Event>>) {
    let until = Instant::now() + Duration::from_millis(300);
    while Instant::now() < until {
        assert_eq!(poll().unwrap(), None);
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn an_end_closed_in_order_is_quiet_a_lost_peer_is_peer_gone() {
    let (mut t, peers) = world();
    let g = FifoGeometry::new(256, 1).unwrap();
    // Channel 1, 0→1; channel 0, 1→0; channel 0, 0→1.
    let hops = [hop(1, 0), hop(0, 1), hop(0, 0)];
    let mut ends = connect(&mut t, &peers, g, &hops).into_iter();
    let (mut s_c1, mut r_c1) = ends.next().unwrap();
    let (mut s_back, mut r_back) = ends.next().unwrap();
    let (s_c0, mut r_c0) = ends.next().unwrap();

    // A receiver that leaves with slices it never consumed: its sender
    // hears of it at once.
    post_slices(&mut *s_c1, 0, 3);
    wait_for(|| r_c1.poll(), Event::Tail(3));
    r_c1.post_head(2).unwrap();
    // (With more slices in, the credit goes out from the receiver's next
    // poll.)
    wait_for(
        || {
            r_c1.poll()?;
            s_c1.poll()
        },
        Event::Head(2),
    );
    drop(r_c1);
    let e = error_of(|| s_c1.poll(), Duration::from_secs(5));
    assert!(
        matches!(e, Error::PeerGone { peer: Rank(1), channel: ChannelId(1), ref reason, .. }
            if reason.contains("2..3")),
        "{e:?}"
    );

    // A receiver that leaves once everything was consumed (the last call
    // of a job): quiet, until something is sent.
    post_slices(&mut *s_back, 0, 2);
    wait_for(|| r_back.poll(), Event::Tail(2));
    r_back.post_head(2).unwrap();
    wait_for(|| s_back.poll(), Event::Head(2));
    drop(r_back);
    quiet(|| s_back.poll());
    s_back.slot_mut(slot_of(2), 1).unwrap();
    let e = s_back
        .post(0, SlotSpan { step: 2, slots: 1 }, None, 1)
        .unwrap_err();
    assert!(matches!(e, Error::PeerGone { peer: Rank(0), .. }), "{e:?}");

    // A sender that leaves between slices: its receiver reports what
    // came and stays quiet; the slices can still be read and credited.
    let mut s_c0 = s_c0;
    post_slices(&mut *s_c0, 0, 2);
    wait_for(|| r_c0.poll(), Event::Tail(2));
    drop(s_c0);
    quiet(|| r_c0.poll());
    assert_eq!(r_c0.slot(slot_of(1), 8).unwrap(), &[1u8; 8]);
    r_c0.post_head(2).unwrap();
    assert_eq!(r_c0.slot(slot_of(1), 8).unwrap_err().kind(), "internal");

    // The transports (and their acceptors) go; nothing hangs.
    drop(t);
}

/// The hello of `frame.rs`, written out by hand: a client that is no
/// `TcpTransport`.
fn raw_hello(token: &str, sender: u32, receiver: u32, channel: u8, g: FifoGeometry) -> Vec<u8> {
    let mut h = b"RCTH\x01".to_vec();
    h.extend([channel, 0, 0]);
    h.extend(ringcc_host::token_hash(token).to_be_bytes());
    h.extend(sender.to_be_bytes());
    h.extend(receiver.to_be_bytes());
    h.extend(g.slot_bytes().to_be_bytes());
    h.extend(g.slots_per_slice().to_be_bytes());
    h
}

#[test]
fn a_lost_sender_is_peer_gone() {
    let (mut t, peers) = world();
    let g = FifoGeometry::new(256, 1).unwrap();
    let d = Duration::from_secs(5);
    let h = hop(0, 0);
    t[1].listen(&job(&peers, g, 1, d), h).unwrap();
    let mut s = TcpStream::connect(t[1].local_addr().unwrap()).unwrap();
    s.write_all(&raw_hello(TOKEN, 0, 1, 0, g)).unwrap();
    let mut reply = [0u8; 2];
    s.read_exact(&mut reply).unwrap();
    assert_eq!(&reply, b"A\x00");
    let mut r = t[1].accept(&job(&peers, g, 1, d), h).unwrap();
    // The process "dies": the connection ends without a goodbye.
    drop(s);
    let e = error_of(|| r.poll(), d);
    assert!(
        matches!(
            e,
            Error::PeerGone {
                peer: Rank(0),
                channel: ChannelId(0),
                ..
            }
        ),
        "{e:?}"
    );
}

#[test]
fn strangers_garbage_and_silence_are_refused() {
    let (mut t, peers) = world();
    let g = FifoGeometry::new(256, 1).unwrap();
    let d = Duration::from_secs(5);
    let h = hop(0, 0);
    t[1].listen(&job(&peers, g, 1, d), h).unwrap();
    let addr = t[1].local_addr().unwrap();

    // Silence: holds a connection without a word.
    let mut silent = TcpStream::connect(addr).unwrap();
    silent.set_read_timeout(Some(d)).unwrap();
    let opened = Instant::now();

    // Another job's rank 0.
    let mut intruder = transport();
    let bad_job = Job {
        token: "another-job",
        ..job(&peers, g, 0, d)
    };
    let e = intruder.connect(&bad_job, h).err().expect("refused");
    match &e {
        Error::Stranger { at, reason } => {
            assert_eq!(at, &addr.to_string());
            assert!(reason.contains("token"), "{reason}");
        }
        other => panic!("expected Stranger, got {other:?}"),
    }

    // Garbage in place of a hello: a refusal, then the connection closes.
    let mut garbage = TcpStream::connect(addr).unwrap();
    garbage.set_read_timeout(Some(d)).unwrap();
    garbage.write_all(&[0x5a; 40]).unwrap();
    let mut reply = Vec::new();
    garbage.read_to_end(&mut reply).unwrap();
    assert_eq!(reply, b"R\x01");

    // The valid rank still connects, while the silent one waits.
    let mut s = t[0].connect(&job(&peers, g, 0, d), h).unwrap();
    let mut r = t[1].accept(&job(&peers, g, 1, d), h).unwrap();
    assert!(
        opened.elapsed() < HELLO_TIMEOUT,
        "the valid hop waited for the silent one"
    );

    // A second connection for the connected hop is refused.
    let e = t[0]
        .connect(&job(&peers, g, 0, d), h)
        .err()
        .expect("a duplicate");
    assert!(
        matches!(e, Error::BadConfig(ref m) if m.contains("connected already")),
        "{e:?}"
    );

    // The silent connection is closed after the hello timeout.
    let n = silent.read(&mut [0u8; 8]).unwrap_or(0);
    assert_eq!(n, 0);
    let waited = opened.elapsed();
    assert!(
        waited >= HELLO_TIMEOUT && waited < HELLO_TIMEOUT * 10,
        "{waited:?}"
    );

    // And the hop works.
    s.slot_mut(slot_of(0), 3).unwrap().copy_from_slice(b"abc");
    s.post(0, SlotSpan { step: 0, slots: 1 }, None, 3).unwrap();
    let deadline = Instant::now() + d;
    loop {
        if let Some(ev) = r.poll().unwrap() {
            assert_eq!(ev, Event::Tail(1));
            break;
        }
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(r.slot(slot_of(0), 3).unwrap(), b"abc");
}

#[test]
fn connecting_is_bounded_and_checked() {
    let (mut t, peers) = world();
    let g = FifoGeometry::new(256, 1).unwrap();
    let d = Duration::from_secs(5);
    // Nobody listened for the hop: refused, a configuration error.
    let e = t[0]
        .connect(&job(&peers, g, 0, d), hop(0, 0))
        .err()
        .expect("refused");
    assert!(
        matches!(e, Error::BadConfig(ref m) if m.contains("listened")),
        "{e:?}"
    );

    // Another FIFO geometry.
    t[1].listen(&job(&peers, g, 1, d), hop(0, 0)).unwrap();
    let other = job(&peers, FifoGeometry::new(512, 1).unwrap(), 0, d);
    let e = t[0].connect(&other, hop(0, 0)).err().expect("refused");
    assert!(
        matches!(e, Error::BadConfig(ref m) if m.contains("geometry")),
        "{e:?}"
    );

    // Addresses where nothing listens any more: retried until the deadline.
    let (gone, gone_peers) = world();
    drop(gone);
    let start = Instant::now();
    let within = Duration::from_millis(300);
    let e = t[0]
        .connect(&job(&gone_peers, g, 0, within), hop(1, 0))
        .err()
        .expect("nobody listens");
    assert!(matches!(e, Error::Timeout { .. }), "{e:?}");
    assert!(start.elapsed() >= within && start.elapsed() < Duration::from_secs(3));

    // Accept without a sender: bounded too.
    let j = job(&peers, g, 1, Duration::from_millis(100));
    t[1].listen(&j, hop(1, 0)).unwrap();
    let e = t[1].accept(&j, hop(1, 0)).err().expect("nobody connects");
    assert!(matches!(e, Error::Timeout { .. }), "{e:?}");
}

/// Polls `r` until it reports `n` slices of `len`-byte slots, each
/// slot's bytes `fill(step)`, crediting each.
fn receive_slices(
    r: &mut dyn RecvEnd,
    s: &mut dyn SendEnd,
    from: u64,
    n: u64,
    len: usize,
    fill: impl Fn(u64) -> u8,
) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut done = from;
    while done < from + n {
        assert!(Instant::now() < deadline, "only up to step {done}");
        // The sender's queued bytes go from its polls.
        while s.poll().unwrap().is_some() {}
        match r.poll().unwrap() {
            Some(Event::Tail(t)) => {
                for step in done..t {
                    let got = r.slot(slot_of(step), len).unwrap();
                    assert!(got.iter().all(|&b| b == fill(step)), "step {step}");
                }
                done = t;
                r.post_head(t).unwrap();
            }
            Some(other) => panic!("unexpected {other:?}"),
            None => std::thread::yield_now(),
        }
    }
}

/// Slices far larger than the socket takes at once: what it does not take
/// waits in the end's queue and leaves from later polls, whole and in
/// order.
#[test]
fn large_slices_leave_from_later_polls() {
    const SLOT: usize = 2 << 20;
    let g = FifoGeometry::new(SLOT as u64, 1).unwrap();
    let (mut t, peers) = world();
    let (mut s, mut r) = connect(&mut t, &peers, g, &[hop(0, 0)]).pop().unwrap();
    let fill = |step: u64| (step as u8).wrapping_mul(13).wrapping_add(1);
    for round in 0..3 {
        let from = round * STEPS;
        for step in from..from + STEPS {
            s.slot_mut(slot_of(step), SLOT).unwrap().fill(fill(step));
            s.post(0, SlotSpan { step, slots: 1 }, None, SLOT).unwrap();
        }
        receive_slices(&mut *r, &mut *s, from, STEPS, SLOT, fill);
        wait_for(|| s.poll(), Event::Head(from + STEPS));
    }
}

/// Frames the receiver never takes: once they have waited `timeout` for
/// room in the socket, the sending end fails with `Timeout`, and stays
/// failed.
#[test]
fn frames_nobody_takes_time_out() {
    const SLOT: usize = 4 << 20;
    let timeout = Duration::from_millis(300);
    let g = FifoGeometry::new(SLOT as u64, 1).unwrap();
    let (mut t, peers) = world_with(timeout);
    let (mut s, _r) = connect(&mut t, &peers, g, &[hop(0, 0)]).pop().unwrap();
    let start = Instant::now();
    for step in 0..STEPS {
        s.slot_mut(slot_of(step), SLOT).unwrap();
        s.post(0, SlotSpan { step, slots: 1 }, None, SLOT).unwrap();
    }
    let e = error_of(|| s.poll(), Duration::from_secs(10));
    assert!(matches!(e, Error::Timeout { .. }), "{e:?}");
    assert!(start.elapsed() >= timeout, "{:?}", start.elapsed());
    assert!(matches!(s.poll(), Err(Error::Timeout { .. })));
}

/// A rank asleep on its bell (its ends idle, their watchers armed) wakes
/// when a slice arrives, long before the sleep's timeout.
#[test]
fn a_rank_asleep_on_its_bell_wakes_for_a_slice() {
    let bell: std::sync::Arc<dyn ringcc_comm::transport::Bell> =
        std::sync::Arc::new(ringcc_comm::LocalBell::new());
    let (mut t, peers) = world();
    let g = FifoGeometry::new(256, 1).unwrap();
    let d = Duration::from_secs(10);
    let h = hop(0, 0);
    t[1].listen(&job(&peers, g, 1, d), h).unwrap();
    let mut s = t[0].connect(&job(&peers, g, 0, d), h).unwrap();
    let receiver = Job {
        bell: &bell,
        ..job(&peers, g, 1, d)
    };
    let mut r = t[1].accept(&receiver, h).unwrap();
    // Idle long enough for the watcher to be armed.
    let idle = Instant::now();
    while idle.elapsed() < Duration::from_millis(20) {
        assert_eq!(r.poll().unwrap(), None);
        std::thread::sleep(Duration::from_millis(1));
    }
    let sender = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        post_slices(&mut *s, 0, 1);
        s
    });
    // The drive loop's handshake: arm, a last look, sleep.
    let ticket = bell.arm();
    assert_eq!(r.poll().unwrap(), None);
    let slept = Instant::now();
    bell.sleep(ticket, Duration::from_secs(30));
    bell.disarm();
    assert!(
        slept.elapsed() < Duration::from_secs(10),
        "{:?}",
        slept.elapsed()
    );
    wait_for(|| r.poll(), Event::Tail(1));
    assert_eq!(r.slot(slot_of(0), 8).unwrap(), &[0u8; 8]);
    let _s = sender.join().unwrap();
}

/// 256 MiB through one hop on loopback (release build):
/// `cargo test --release -p ringcc-host --test tcp -- --ignored --nocapture`
#[test]
#[ignore = "a measurement, not a check"]
fn throughput_one_hop() {
    const TOTAL: u64 = 256 << 20;
    let g = FifoGeometry::new(512 << 10, 2).unwrap();
    let (mut t, peers) = world();
    let (mut s, mut r) = connect(&mut t, &peers, g, &[hop(0, 0)]).pop().unwrap();
    let slices = TOTAL / g.slice_bytes();
    let slice = g.slice_bytes() as usize;
    let start = Instant::now();
    let sender = std::thread::spawn(move || {
        let mut head = 0;
        for i in 0..slices {
            let span = SlotSpan {
                step: i * 2,
                slots: 2,
            };
            while span.end() > head + STEPS {
                match s.poll().unwrap() {
                    Some(Event::Head(h)) => head = h,
                    // Two cores on the test machines: leave them to the
                    // reader threads.
                    _ => std::thread::yield_now(),
                }
            }
            for k in 0..2 {
                s.slot_mut(slot_of(span.step + k), slice / 2).unwrap()[0] = i as u8;
            }
            s.post(0, span, None, slice).unwrap();
        }
        s
    });
    let mut sum = 0u64;
    let mut done = 0;
    while done < slices * 2 {
        if let Some(Event::Tail(t)) = r.poll().unwrap() {
            while done < t {
                sum += u64::from(r.slot(slot_of(done), slice / 2).unwrap()[0]);
                done += 1;
            }
            r.post_head(t).unwrap();
        } else {
            std::thread::yield_now();
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let _s = sender.join().unwrap();
    assert!(sum > 0);
    println!(
        "tcp loopback, one hop: {} MiB in {secs:.3} s = {:.2} GB/s",
        TOTAL >> 20,
        TOTAL as f64 / secs / 1e9
    );
}
