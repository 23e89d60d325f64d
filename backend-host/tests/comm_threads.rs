//! Ranks as threads of one process over shared memory, bootstrapped
//! through an in-memory store: the communicator's loop, executor and
//! queue without process start-up (the multi-process tests are in
//! `comm_ranks.rs`).

use std::sync::Arc;
use std::time::Duration;

use ringcc_comm::store::{MemStore, Store};
use ringcc_comm::transport::Transport;
use ringcc_comm::{Communicator, Error, Options, Transports};
use ringcc_core::{Call, DataType, Rank, ReduceOp};
use ringcc_host::ShmTransport;

fn shm_only() -> Transports {
    Arc::new(|| vec![Box::new(ShmTransport::new()) as Box<dyn Transport>])
}

fn token(what: &str) -> String {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    format!("comm-threads-{what}-{}-{t}", std::process::id())
}

/// Runs `f` on `ranks` communicators, one thread each.
fn ranks<T: Send + 'static>(
    what: &str,
    n: u32,
    options: Options,
    f: impl Fn(Communicator) -> T + Send + Sync + 'static,
) -> Vec<T> {
    let store: Arc<dyn Store> = Arc::new(MemStore::new());
    let t = token(what);
    let f = Arc::new(f);
    let threads: Vec<_> = (0..n)
        .map(|r| {
            let (store, t, o, f) = (
                Arc::clone(&store),
                t.clone(),
                options.clone(),
                Arc::clone(&f),
            );
            std::thread::spawn(move || {
                let c = Communicator::new(Rank(r), n, store, &t, o, shm_only()).unwrap();
                f(c)
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

#[test]
fn typed_collectives_on_threads() {
    let out = ranks("typed", 3, Options::default(), |c| {
        let r = c.rank().0 as f32;
        let mut a = vec![r + 1.0; 100_003];
        c.all_reduce_in_place(&mut a, ReduceOp::Sum).unwrap();
        assert!(a.iter().all(|&x| x == 6.0));
        let input: Vec<i64> = (0..3 * 1000).map(|i| i + c.rank().0 as i64).collect();
        let mut rs = vec![0i64; 1000];
        c.reduce_scatter(&input, &mut rs, ReduceOp::Sum).unwrap();
        let b = c.rank().0 as i64;
        assert!(rs
            .iter()
            .enumerate()
            .all(|(i, &x)| x == 3 * (b * 1000 + i as i64) + 3));
        let mut g = vec![0u32; 3 * 5];
        c.all_gather(&[c.rank().0; 5], &mut g).unwrap();
        assert_eq!(g, [0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2]);
        c.barrier().unwrap();
        c.close().unwrap();
    });
    assert_eq!(out.len(), 3);
}

#[test]
fn a_wrong_buffer_is_refused_and_the_communicator_still_works() {
    ranks("buffer", 2, Options::default(), |c| {
        let call = Call::all_reduce(10, DataType::F32, ReduceOp::Sum);
        let mut out = vec![0u8; 40];
        let e = c.run(&call, &[0u8; 39], &mut out).unwrap_err();
        assert!(
            matches!(
                e,
                Error::BadBuffer {
                    which: "input",
                    expected: 40,
                    got: 39
                }
            ),
            "{e}"
        );
        let e = c.run_in_place(&call, &mut [0u8; 8]).unwrap_err();
        assert!(
            matches!(
                e,
                Error::BadBuffer {
                    which: "in-place",
                    ..
                }
            ),
            "{e}"
        );
        let mut x = [1u32; 7];
        c.all_reduce_in_place(&mut x, ReduceOp::Sum).unwrap();
        assert_eq!(x, [2; 7]);
    });
}

#[test]
fn settings_that_differ_across_ranks_are_refused() {
    let store: Arc<dyn Store> = Arc::new(MemStore::new());
    let t = token("settings");
    let threads: Vec<_> = (0..2u32)
        .map(|r| {
            let (store, t) = (Arc::clone(&store), t.clone());
            std::thread::spawn(move || {
                let o = Options {
                    channels: 1 + r as u8,
                    timeout: Duration::from_secs(5),
                    ..Options::default()
                };
                Communicator::new(Rank(r), 2, store, &t, o, shm_only()).map(|_| ())
            })
        })
        .collect();
    for t in threads {
        let e = t.join().unwrap().unwrap_err();
        assert!(matches!(e, Error::BadConfig(_)), "{e}");
    }
}

#[test]
fn a_chunk_the_fifo_cannot_hold_is_refused() {
    let o = Options {
        chunk_bytes: 64 << 20,
        ..Options::default()
    };
    let e =
        Communicator::new(Rank(0), 1, Arc::new(MemStore::new()), "x", o, shm_only()).unwrap_err();
    assert!(matches!(e, Error::BadConfig(_)), "{e}");
}

#[test]
fn abort_fails_the_next_call_even_on_one_rank() {
    let c = Communicator::new(
        Rank(0),
        1,
        Arc::new(MemStore::new()),
        &token("abort1"),
        Options::default(),
        shm_only(),
    )
    .unwrap();
    let mut x = [1.0f32; 4];
    c.all_reduce_in_place(&mut x, ReduceOp::Sum).unwrap();
    c.abort("stop");
    let e = c.all_reduce_in_place(&mut x, ReduceOp::Sum).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Aborted {
                rank: Some(Rank(0)),
                ..
            }
        ),
        "{e}"
    );
    // And it stays failed.
    assert!(c.all_reduce_in_place(&mut x, ReduceOp::Sum).is_err());
}

/// Four ranks on two "nodes" (shared memory inside, TCP between): the
/// ring has TCP hops, so every rank runs calls on one channel
/// (`channel_bytes` unbounded) with TCP's larger FIFO slots, and calls
/// still give the sum; on one node (shared memory only) the defaults
/// apply; explicit settings win on both.
#[test]
fn a_ring_with_a_tcp_hop_runs_calls_on_one_channel() {
    use ringcc_comm::transport::{CHANNEL_BYTES, SLOT_BYTES};
    use ringcc_core::fifo::FifoGeometry;
    use ringcc_host::tcp::TCP_SLOT_BYTES;
    let both = ringcc_host::transports("127.0.0.1".parse().unwrap(), Duration::from_secs(20));
    let split = ["a", "a", "b", "b"];
    let one = ["a", "a", "a", "a"];
    let small = FifoGeometry::new(16 << 10, 1).unwrap();
    for (nodes, set, want) in [
        (split, None, (u64::MAX, TCP_SLOT_BYTES)),
        (one, None, (CHANNEL_BYTES, SLOT_BYTES)),
        (split, Some((8192, small)), (8192, small.slot_bytes())),
        (one, Some((8192, small)), (8192, small.slot_bytes())),
    ] {
        let store: Arc<dyn Store> = Arc::new(MemStore::new());
        let t = token("tcp-channels");
        let threads: Vec<_> = (0..4u32)
            .map(|r| {
                let (store, t, both) = (Arc::clone(&store), t.clone(), Arc::clone(&both));
                let o = Options {
                    node: nodes[r as usize].into(),
                    channel_bytes: set.map(|s| s.0),
                    geometry: set.map(|s| s.1),
                    chunk_bytes: if set.is_some() { 64 << 10 } else { 512 << 10 },
                    timeout: Duration::from_secs(20),
                    ..Options::default()
                };
                std::thread::spawn(move || {
                    let c = Communicator::new(Rank(r), 4, store, &t, o, both).unwrap();
                    let mut a = vec![1.0f32 + r as f32; 300_001];
                    c.all_reduce_in_place(&mut a, ReduceOp::Sum).unwrap();
                    assert!(a.iter().all(|&x| x == 10.0));
                    let got = (c.channel_bytes(), c.geometry().slot_bytes());
                    c.close().unwrap();
                    got
                })
            })
            .collect();
        for t in threads {
            assert_eq!(t.join().unwrap(), want, "nodes {nodes:?}, set {set:?}");
        }
    }
}

/// Over TCP the slices a call takes unchanged (the last AllGather step
/// of an AllReduce, AllGather's receive-and-forward, Broadcast's) are
/// read straight into the output, not a slot: the ranks whose incoming
/// hop is TCP land bytes, the shared-memory ones none, and every result
/// is exact — out of place and in place, several sizes (slices cut at
/// odd places), several calls in a row.
#[test]
fn tcp_payloads_land_straight_in_the_output() {
    let both = ringcc_host::transports("127.0.0.1".parse().unwrap(), Duration::from_secs(20));
    let store: Arc<dyn Store> = Arc::new(MemStore::new());
    let t = token("tcp-landing");
    let nodes = ["a", "a", "b", "b"];
    let threads: Vec<_> = (0..4u32)
        .map(|r| {
            let (store, t, both) = (Arc::clone(&store), t.clone(), Arc::clone(&both));
            let o = Options {
                node: nodes[r as usize].into(),
                timeout: Duration::from_secs(20),
                ..Options::default()
            };
            std::thread::spawn(move || {
                let c = Communicator::new(Rank(r), 4, store, &t, o, both).unwrap();
                for n in [1usize, 4097, 300_001, 1 << 20] {
                    let a: Vec<f32> = (0..n).map(|i| (i % 97) as f32 + r as f32).collect();
                    let mut out = vec![0.0f32; n];
                    c.all_reduce(&a, &mut out, ReduceOp::Sum).unwrap();
                    let want = |i: usize| 4.0 * (i % 97) as f32 + 6.0;
                    assert!((0..n).all(|i| out[i] == want(i)), "all_reduce {n}");
                    let mut b = a.clone();
                    c.all_reduce_in_place(&mut b, ReduceOp::Sum).unwrap();
                    assert!((0..n).all(|i| b[i] == want(i)), "in place {n}");
                    let mut g = vec![0.0f32; 4 * n];
                    c.all_gather(&a, &mut g).unwrap();
                    assert!(
                        (0..4 * n).all(|i| g[i] == ((i % n) % 97) as f32 + (i / n) as f32),
                        "all_gather {n}"
                    );
                    let mut d = vec![0.0f32; n];
                    c.broadcast(&a, &mut d, Rank(1)).unwrap();
                    assert!(
                        (0..n).all(|i| d[i] == (i % 97) as f32 + 1.0),
                        "broadcast {n}"
                    );
                }
                let (landed, hops) = (c.landed_bytes(), c.hops().to_vec());
                c.close().unwrap();
                (landed, hops)
            })
        })
        .collect();
    for (r, t) in threads.into_iter().enumerate() {
        let (landed, hops) = t.join().unwrap();
        let tcp_in = hops.iter().any(|&(_, i)| i == "tcp");
        assert_eq!(tcp_in, r % 2 == 0, "rank {r}: hops {hops:?}");
        if tcp_in {
            assert!(landed > 1 << 20, "rank {r}: landed {landed}");
        } else {
            assert_eq!(landed, 0, "rank {r}: shared memory lands nothing");
        }
    }
}
