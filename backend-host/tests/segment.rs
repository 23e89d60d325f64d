//! The shared-memory segment: create/open, the checks that refuse a wrong
//! segment, the slot bounds, and a real two-process producer/consumer.
//! Every wait has a deadline; the child process is killed if it outlives
//! its own.

mod common;
use common::Reap;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ringcc_core::fifo::{can_send, slot_of, FifoGeometry, STEPS};
use ringcc_core::wire::call_header::CALL_HEADER_LEN;
use ringcc_core::{ChannelId, Rank};
use ringcc_host::wait::wait_at_least;
use ringcc_host::{Error, Segment, SegmentName};

const ROLE: &str = "RINGCC_HOST_TEST_ROLE";
const TOKEN: &str = "RINGCC_HOST_TEST_TOKEN";
const SLICES: u64 = 64;
const CHILD_DEADLINE: Duration = Duration::from_secs(20);

fn geometry() -> FifoGeometry {
    FifoGeometry::new(4096, 2).unwrap()
}

/// A token no other test (or run) shares.
fn token(test: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("ringcc-host-test-{test}-{}-{nanos}", std::process::id())
}

fn name(token: &str) -> SegmentName {
    SegmentName::new(token, Rank(1), ChannelId(0))
}

fn soon(ms: u64) -> Instant {
    Instant::now() + Duration::from_millis(ms)
}

/// The byte at `k` of slot `j` of slice `i`.
fn pattern(i: u64, j: u64, k: usize) -> u8 {
    (i.wrapping_mul(31) ^ j.wrapping_mul(7) ^ (k as u64) ^ ((k as u64) >> 8)) as u8
}

#[test]
fn create_then_open_in_one_process() {
    let t = token("one");
    let n = name(&t);
    let mut owner = Segment::create(&n, geometry(), &t).unwrap();
    let mut peer = Segment::open(&n, &t, geometry(), soon(2_000)).unwrap();
    assert!(owner.is_owner() && !peer.is_owner());
    assert_eq!(peer.layout(), owner.layout());

    // Both see the same counters, mailbox and slots.
    peer.tail().post(3);
    assert_eq!(owner.tail().load(), 3);
    owner.head().post(2);
    assert_eq!(peer.head().load(), 2);
    peer.post_call_header(7, &[0x5a; CALL_HEADER_LEN]);
    assert_eq!(owner.call_header_seq().load(), 7);
    assert_eq!(owner.read_call_header(), [0x5a; CALL_HEADER_LEN]);
    let data: Vec<u8> = (0..4096).map(|k| pattern(0, 5, k)).collect();
    peer.slot(slot_of(5)).unwrap().write_from(&data).unwrap();
    let mut out = vec![0u8; 4096];
    owner.slot(slot_of(5)).unwrap().read_into(&mut out).unwrap();
    assert_eq!(out, data);

    // Only the owner unlinks; afterwards the name is gone, the mappings stay.
    assert!(matches!(peer.unlink(), Err(Error::BadConfig(_))));
    owner.unlink().unwrap();
    owner.unlink().unwrap();
    assert!(!owner.is_linked());
    let e = Segment::open(&n, &t, geometry(), soon(20)).unwrap_err();
    assert!(matches!(e, Error::Timeout { .. }), "{e}");
    peer.tail().post(4);
    assert_eq!(owner.tail().load(), 4);
}

#[test]
fn owner_drop_unlinks() {
    let t = token("drop");
    let n = name(&t);
    drop(Segment::create(&n, geometry(), &t).unwrap());
    // The name is free again.
    drop(Segment::create(&n, geometry(), &t).unwrap());
}

#[test]
fn existing_name_is_not_taken_over() {
    let t = token("exists");
    let n = name(&t);
    let _owner = Segment::create(&n, geometry(), &t).unwrap();
    let e = Segment::create(&n, geometry(), &t).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Shm {
                call: "shm_open",
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn another_jobs_segment_is_refused() {
    let ours = token("stranger-ours");
    let theirs = token("stranger-theirs");
    let n = name(&ours);
    let _owner = Segment::create(&n, geometry(), &theirs).unwrap();
    let e = Segment::open(&n, &ours, geometry(), soon(2_000)).unwrap_err();
    assert!(matches!(e, Error::Stranger { .. }), "{e}");
    assert!(e.to_string().contains(n.as_str()), "{e}");
}

#[test]
fn geometry_mismatch_is_refused_naming_both() {
    let t = token("geometry");
    let n = name(&t);
    let _owner = Segment::create(&n, geometry(), &t).unwrap();
    let other = FifoGeometry::new(8192, 4).unwrap();
    let e = Segment::open(&n, &t, other, soon(2_000)).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, Error::BadConfig(_)), "{e}");
    assert!(
        msg.contains("4096 B x 2") && msg.contains("8192 B x 4"),
        "{msg}"
    );
}

#[test]
fn open_without_owner_times_out_within_its_deadline() {
    let t = token("nobody");
    let n = name(&t);
    let wait = Duration::from_millis(200);
    let start = Instant::now();
    let e = Segment::open(&n, &t, geometry(), start + wait).unwrap_err();
    let elapsed = start.elapsed();
    assert!(matches!(e, Error::Timeout { .. }), "{e}");
    assert!(e.to_string().contains(n.as_str()), "{e}");
    assert!(elapsed >= wait, "gave up early: {elapsed:?}");
    assert!(elapsed < wait + Duration::from_millis(500), "{elapsed:?}");
}

#[test]
fn slot_write_beyond_capacity_is_refused_and_writes_nothing() {
    let t = token("overflow");
    let n = name(&t);
    let owner = Segment::create(&n, geometry(), &t).unwrap();
    let slot = owner.slot(slot_of(3)).unwrap();
    assert_eq!(slot.capacity(), 4096);
    slot.write_from(&[0x11; 4096]).unwrap();
    let e = slot.write_from(&[0x22; 4097]).unwrap_err();
    assert!(
        matches!(
            e,
            Error::SlotOverflow {
                slot: 3,
                len: 4097,
                capacity: 4096
            }
        ),
        "{e}"
    );
    let mut out = vec![0u8; 4096];
    slot.read_into(&mut out).unwrap();
    assert!(out.iter().all(|&b| b == 0x11));
    let mut long = vec![0u8; 4097];
    assert!(matches!(
        slot.read_into(&mut long),
        Err(Error::SlotOverflow { .. })
    ));
    // A shorter copy is fine, and neighbours are untouched.
    slot.write_from(&[0x33; 10]).unwrap();
    let mut next = vec![0xffu8; 4096];
    owner
        .slot(slot_of(4))
        .unwrap()
        .read_into(&mut next)
        .unwrap();
    assert!(next.iter().all(|&b| b == 0));
    assert!(matches!(
        owner.slot(ringcc_core::SlotIndex(STEPS as u8)),
        Err(Error::NoSuchSlot { slot: STEPS })
    ));
}

#[test]
fn names_differ_per_token_and_never_contain_it() {
    let (a, b) = ("job-token-alpha", "job-token-beta");
    let (na, nb) = (name(a), name(b));
    assert_ne!(na, nb);
    for (tok, n) in [(a, &na), (b, &nb)] {
        assert!(!n.as_str().contains(tok), "{n}");
        assert!(
            n.as_str().starts_with("/ringcc-") && n.as_str().ends_with("-r1-c0"),
            "{n}"
        );
        assert!(n.as_str().len() <= SegmentName::MAX_LEN);
        assert_eq!(n.as_str().matches('/').count(), 1);
    }
    assert_ne!(
        SegmentName::new(a, Rank(1), ChannelId(0)),
        SegmentName::new(a, Rank(1), ChannelId(1))
    );
    assert_ne!(
        SegmentName::new(a, Rank(1), ChannelId(0)),
        SegmentName::new(a, Rank(2), ChannelId(0))
    );
}

#[test]
fn two_processes_move_every_byte_through_the_counters() {
    let t = token("two");
    let n = name(&t);
    let g = geometry();
    let mut seg = Segment::create(&n, g, &t).unwrap();
    let child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_producer", "--ignored", "--test-threads=1"])
        .env(ROLE, "producer")
        .env(TOKEN, &t)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut child = Reap(child);
    let deadline = Instant::now() + CHILD_DEADLINE;

    // The child has mapped the segment once it posts the call header.
    wait_at_least(seg.call_header_seq(), 1, deadline, || {
        "the child's call header".into()
    })
    .unwrap();
    assert_eq!(seg.read_call_header(), [0xa5; CALL_HEADER_LEN]);
    seg.unlink().unwrap();

    let sps = g.slots_per_slice();
    let mut out = vec![0u8; g.slot_bytes() as usize];
    for i in 0..SLICES {
        let step = i * sps;
        wait_at_least(seg.tail(), step + sps, deadline, || format!("slice {i}")).unwrap();
        for j in 0..sps {
            seg.slot(slot_of(step + j))
                .unwrap()
                .read_into(&mut out)
                .unwrap();
            for (k, &b) in out.iter().enumerate() {
                assert_eq!(b, pattern(i, j, k), "slice {i} slot {j} byte {k}");
            }
        }
        seg.head().post(step + sps);
    }

    loop {
        if let Some(status) = child.0.try_wait().unwrap() {
            assert!(status.success(), "producer failed: {status}");
            break;
        }
        assert!(Instant::now() < deadline, "producer did not exit");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(seg.tail().load(), SLICES * sps);
}

/// The producer of `two_processes_…`, run only in its child process (it
/// returns at once without the role variable).
#[test]
#[ignore = "the child half of two_processes_move_every_byte_through_the_counters"]
fn child_producer() {
    if std::env::var(ROLE).as_deref() != Ok("producer") {
        return;
    }
    let t = std::env::var(TOKEN).unwrap();
    let g = geometry();
    let deadline = Instant::now() + CHILD_DEADLINE;
    let seg = Segment::open(&name(&t), &t, g, deadline).unwrap();
    seg.post_call_header(1, &[0xa5; CALL_HEADER_LEN]);
    let sps = g.slots_per_slice();
    let mut data = vec![0u8; g.slot_bytes() as usize];
    for i in 0..SLICES {
        let step = i * sps;
        let need = (step + sps).saturating_sub(STEPS);
        let head = wait_at_least(seg.head(), need, deadline, || {
            format!("credit for slice {i}")
        })
        .unwrap();
        assert!(can_send(head, step, sps));
        for j in 0..sps {
            for (k, b) in data.iter_mut().enumerate() {
                *b = pattern(i, j, k);
            }
            seg.slot(slot_of(step + j))
                .unwrap()
                .write_from(&data)
                .unwrap();
        }
        seg.tail().post(step + sps);
    }
}

/// The segment's file under Linux's shared-memory mount, when there is one.
fn shm_file(n: &SegmentName) -> Option<std::path::PathBuf> {
    let p = std::path::Path::new("/dev/shm").join(n.as_str().trim_start_matches('/'));
    p.exists().then_some(p)
}

#[test]
fn readable_by_others_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let t = token("mode");
    let n = name(&t);
    let _owner = Segment::create(&n, geometry(), &t).unwrap();
    let Some(p) = shm_file(&n) else {
        eprintln!("no /dev/shm: skipped");
        return;
    };
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
    let e = Segment::open(&n, &t, geometry(), soon(2_000)).unwrap_err();
    assert!(matches!(e, Error::BadSegment { .. }), "{e}");
    assert!(e.to_string().contains("mode 644"), "{e}");
}

#[test]
fn foreign_bytes_are_not_a_segment() {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let t = token("magic");
    let n = name(&t);
    let p = std::path::Path::new("/dev/shm").join(n.as_str().trim_start_matches('/'));
    if !std::path::Path::new("/dev/shm").is_dir() {
        eprintln!("no /dev/shm: skipped");
        return;
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&p)
        .unwrap();
    f.write_all(&[0x42; 4096]).unwrap();
    drop(f);
    let e = Segment::open(&n, &t, geometry(), soon(2_000));
    std::fs::remove_file(&p).unwrap();
    let e = e.unwrap_err();
    assert!(matches!(e, Error::BadSegment { .. }), "{e}");
    assert!(e.to_string().contains("not a ringcc segment"), "{e}");
}
