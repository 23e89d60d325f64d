//! The whole device loop on the host: the generated persistent kernel
//! ([`loop_source`]) compiled as host C++, one host thread per thread of a
//! block (a block per (rank, channel), as on the GPU), host memory
//! standing in for every rank's device memory and its neighbours' (the
//! FIFOs, the `tail`/`head` words and call words laid out as the CUDA
//! backend lays them), the counters real atomics (acquire / release), and
//! the status records and abort word as the host-mapped memory the GPU
//! uses. Results are checked against the core's reference
//! ([`ringcc_core::verify`]).
//!
//! Each block runs its calls back to back, as a stream would, without
//! waiting for the other ranks between calls, so calls overlap across
//! ranks as they do on a GPU. Needs `c++`; says it skipped otherwise.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use ringcc_core::fifo::FifoGeometry;
use ringcc_core::verify::{count_wrong, fill_input};
use ringcc_core::{Call, ChannelId, Collective, DataType, Plan, Rank, ReduceOp};
use ringcc_cuda::device_loop::abi::{self, RcChan, RcLoopArgs, RcStatus};
use ringcc_cuda::device_loop::{loop_args, status_error};
use ringcc_cuda::kernel::{loop_source, loop_symbol, ModuleKey};
use ringcc_cuda::Error;

/// `struct rc_block_shared` of the host emulation.
#[repr(C)]
#[derive(Default)]
struct BlockShared {
    bar_count: AtomicU32,
    bar_gen: AtomicU32,
    ok: AtomicI32,
    go: AtomicI32,
}

type LoopFn = unsafe extern "C" fn(RcLoopArgs, u32, u32, u32, *mut BlockShared);

/// The (type, op) pairs the tests run (and `Sum` of each type, which the
/// collectives that do not reduce use).
const PAIRS: [(DataType, ReduceOp); 7] = [
    (DataType::F32, ReduceOp::Sum),
    (DataType::Bf16, ReduceOp::Avg),
    (DataType::I8, ReduceOp::Max),
    (DataType::F64, ReduceOp::Min),
    (DataType::U64, ReduceOp::Prod),
    (DataType::F16, ReduceOp::Sum),
    (DataType::I32, ReduceOp::Avg),
];

fn modules() -> Vec<ModuleKey> {
    // F32 Max: the mismatch test's odd rank.
    let mut m = vec![ModuleKey {
        dtype: DataType::F32,
        op: ReduceOp::Max,
    }];
    for (dtype, op) in PAIRS {
        for op in [op, ReduceOp::Sum] {
            let k = ModuleKey { dtype, op };
            if !m.contains(&k) {
                m.push(k);
            }
        }
    }
    m
}

struct Kernels {
    loops: HashMap<ModuleKey, LoopFn>,
    _lib: libloading::Library,
}

fn kernels() -> Option<&'static Kernels> {
    static K: OnceLock<Option<Kernels>> = OnceLock::new();
    K.get_or_init(|| {
        let sources: Vec<(String, String)> = modules()
            .into_iter()
            .map(|m| (format!("{}_loop", m.name()), loop_source(m)))
            .collect();
        let lib = common::build("host-loop", &sources)?;
        let mut loops = HashMap::new();
        for m in modules() {
            // SAFETY: `ringcc_loop_<type>_<op>` is the loop kernel, whose
            // host-emulation signature is `LoopFn`.
            let f = *unsafe { lib.get::<LoopFn>(loop_symbol(m).as_bytes()) }.unwrap();
            loops.insert(m, f);
        }
        Some(Kernels { loops, _lib: lib })
    })
    .as_ref()
}

/// A 16-byte aligned byte buffer.
struct Aligned {
    words: Vec<u128>,
    len: usize,
}

impl Aligned {
    fn new(len: usize, fill: u8) -> Aligned {
        let w = u128::from_ne_bytes([fill; 16]);
        Aligned {
            words: vec![w; len.div_ceil(16).max(1)],
            len,
        }
    }
    fn ptr(&mut self) -> u64 {
        self.words.as_mut_ptr() as u64
    }
    fn bytes(&self) -> &[u8] {
        // SAFETY: a u128 vector viewed as its first `len` bytes.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr().cast(), self.len) }
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, uniquely borrowed.
        unsafe { std::slice::from_raw_parts_mut(self.words.as_mut_ptr().cast(), self.len) }
    }
}

/// Words per channel of a rank's flag memory, as the CUDA backend lays it
/// out: tail, call words, head, state, each on its own 128-byte line.
const LINE: usize = 16;
const STATUS_WORDS: usize = std::mem::size_of::<RcStatus>() / 8;

/// The host standing in for the GPUs of one communicator.
struct HostRing {
    ranks: u32,
    channels: u8,
    geometry: FifoGeometry,
    chunk_bytes: u64,
    timeout: Duration,
    _fifos: Vec<Aligned>,
    flags: Vec<Box<[AtomicU64]>>,
    tables: Vec<Vec<RcChan>>,
    status: Box<[AtomicU64]>,
    abort: Box<AtomicU64>,
    shared: Vec<BlockShared>,
    seq: u64,
}

impl HostRing {
    fn new(ranks: u32, channels: u8, slot_bytes: u64, timeout: Duration) -> HostRing {
        let geometry = FifoGeometry::new(slot_bytes, 2).unwrap();
        let n = ranks as usize;
        let ch = usize::from(channels);
        let mut fifos: Vec<Aligned> = (0..n * ch)
            .map(|_| Aligned::new((slot_bytes * 8) as usize, 0))
            .collect();
        let fifo_ptr: Vec<u64> = fifos.iter_mut().map(Aligned::ptr).collect();
        let flags: Vec<Box<[AtomicU64]>> = (0..n)
            .map(|_| (0..ch * 4 * LINE).map(|_| AtomicU64::new(0)).collect())
            .collect();
        let word =
            |r: usize, c: usize, line: usize| flags[r][c * 4 * LINE + line * LINE].as_ptr() as u64;
        let tables = (0..n)
            .map(|r| {
                let (prev, next) = ((r + n - 1) % n, (r + 1) % n);
                (0..ch)
                    .map(|c| RcChan {
                        recv_tail: word(r, c, 0),
                        recv_head: word(prev, c, 2),
                        send_head: word(r, c, 2),
                        send_tail: word(next, c, 0),
                        recv_call: word(r, c, 1),
                        send_call: word(next, c, 1),
                        state: word(r, c, 3),
                        recv_fifo: fifo_ptr[c * n + r],
                        send_fifo: fifo_ptr[c * n + next],
                        slot_bytes,
                    })
                    .collect()
            })
            .collect();
        HostRing {
            ranks,
            channels,
            geometry,
            chunk_bytes: slot_bytes * 4,
            timeout,
            _fifos: fifos,
            flags,
            tables,
            status: (0..n * ch * STATUS_WORDS)
                .map(|_| AtomicU64::new(0))
                .collect(),
            abort: Box::new(AtomicU64::new(0)),
            shared: (0..n * ch).map(|_| BlockShared::default()).collect(),
            seq: 0,
        }
    }

    fn plan(&self, call: &Call) -> Plan {
        call.plan(self.ranks, u32::from(self.channels), self.chunk_bytes)
            .unwrap()
    }

    fn status(&self, r: u32, c: u8) -> RcStatus {
        let base = (r as usize * usize::from(self.channels) + usize::from(c)) * STATUS_WORDS;
        let w: Vec<u64> = self.status[base..base + STATUS_WORDS]
            .iter()
            .map(|a| a.load(Ordering::Acquire))
            .collect();
        RcStatus {
            code: w[0],
            seq: w[1],
            waiting: w[2],
            seen: w[3],
            need: w[4],
            loop_index: w[5],
            step_index: w[6],
            slice: w[7],
            got_seq: w[8],
            got_count: w[9],
            got_desc: w[10],
            recv_next: w[11],
            send_next: w[12],
            own_count: w[13],
            own_desc: w[14],
            spare: w[15],
        }
    }

    fn statuses(&self) -> Vec<(Rank, ChannelId, RcStatus)> {
        let mut v = Vec::new();
        for r in 0..self.ranks {
            for c in 0..self.channels {
                v.push((Rank(r), ChannelId(c), self.status(r, c)));
            }
        }
        v
    }

    /// The `recv_next` / `send_next` a rank's channel keeps between calls.
    fn state(&self, r: u32, c: u8) -> (u64, u64) {
        let base = usize::from(c) * 4 * LINE + 3 * LINE;
        let f = &self.flags[r as usize];
        (
            f[base].load(Ordering::Acquire),
            f[base + 1].load(Ordering::Acquire),
        )
    }
}

/// One call of every rank, with its buffers.
struct Job {
    calls: Vec<Call>,
    in_place: bool,
    /// Per rank: the send buffer and the receive buffer (the same one,
    /// index 0, in place).
    bufs: Vec<Vec<Aligned>>,
    args: Vec<RcLoopArgs>,
    seq: u64,
}

impl Job {
    /// Every rank's call on fresh inputs from the core's generator.
    fn new(ring: &mut HostRing, calls: Vec<Call>, in_place: bool) -> Job {
        let seq = ring.seq;
        ring.seq += 1;
        let mut bufs = Vec::new();
        let mut args = Vec::new();
        for (r, call) in calls.iter().enumerate() {
            let plan = ring.plan(call);
            let e = usize::from(call.dtype.size());
            let (il, ol) = (
                plan.input_len() as usize * e,
                plan.output_len() as usize * e,
            );
            let mut input = vec![0u8; il];
            fill_input(&plan, call.op, r as u32, seq, &mut input).unwrap();
            let mut b = if in_place {
                let (io, _) = call.in_place_offsets(r as u32);
                let mut one = Aligned::new(il.max(ol), 0xA5);
                one.bytes_mut()[io as usize * e..][..il].copy_from_slice(&input);
                vec![one]
            } else {
                let mut i = Aligned::new(il, 0);
                i.bytes_mut().copy_from_slice(&input);
                vec![i, Aligned::new(ol, 0xA5)]
            };
            let (ip, op) = if in_place {
                let (io, oo) = call.in_place_offsets(r as u32);
                let base = b[0].ptr();
                (base + io * e as u64, base + oo * e as u64)
            } else {
                (b[0].ptr(), b[1].ptr())
            };
            let c0 = ring.tables[r].as_ptr() as u64;
            let st = ring.status[r * usize::from(ring.channels) * STATUS_WORDS].as_ptr() as u64;
            let ab = ring.abort.as_ptr() as u64;
            args.push(loop_args(
                &plan,
                call,
                seq,
                ring.geometry,
                Rank(r as u32),
                ring.timeout,
                (ip, op),
                (c0, st, ab),
            ));
            bufs.push(b);
        }
        Job {
            calls,
            in_place,
            bufs,
            args,
            seq,
        }
    }

    /// Elements that differ from the core's reference, over all ranks.
    fn wrong(&self, ring: &HostRing) -> u64 {
        let mut wrong = 0;
        for (r, call) in self.calls.iter().enumerate() {
            let plan = ring.plan(call);
            let e = usize::from(call.dtype.size());
            let out = if self.in_place {
                let (_, oo) = call.in_place_offsets(r as u32);
                &self.bufs[r][0].bytes()[oo as usize * e..][..plan.output_len() as usize * e]
            } else {
                self.bufs[r][1].bytes()
            };
            wrong += count_wrong(&plan, call.op, r as u32, self.seq, out).unwrap();
        }
        wrong
    }
}

/// Runs `jobs` in order on every block of every rank but `skip`, with
/// `threads` host threads per block; each block runs the jobs back to
/// back. `during` runs on the test's thread meanwhile. Returns the time.
fn run(
    ring: &HostRing,
    jobs: &[Job],
    threads: u32,
    skip: Option<u32>,
    during: impl FnOnce(),
) -> Duration {
    let k = kernels().expect("kernels built");
    // Every block's kernels first: a missing one fails before any starts.
    let mut blocks = Vec::new();
    for r in (0..ring.ranks).filter(|&r| Some(r) != skip) {
        for c in 0..ring.channels {
            let shared = &ring.shared[r as usize * usize::from(ring.channels) + usize::from(c)];
            let fns: Vec<(LoopFn, RcLoopArgs)> = jobs
                .iter()
                .map(|j| {
                    let call = &j.calls[r as usize];
                    let m = ModuleKey {
                        dtype: call.dtype,
                        op: call.desc(0).op,
                    };
                    let f = *k
                        .loops
                        .get(&m)
                        .unwrap_or_else(|| panic!("no kernel for {m:?}"));
                    (f, j.args[r as usize])
                })
                .collect();
            blocks.push((c, shared as *const BlockShared as usize, fns));
        }
    }
    let started = Instant::now();
    std::thread::scope(|s| {
        for (c, sp, fns) in &blocks {
            for t in 0..threads {
                let (c, sp, fns) = (*c, *sp, fns.clone());
                s.spawn(move || {
                    for (f, a) in fns {
                        // SAFETY: the arguments point into `ring` and the
                        // jobs' buffers, which outlive the scope; every
                        // block's threads run the same calls in the same
                        // order, with their own shared words.
                        unsafe { f(a, u32::from(c), t, threads, sp as *mut BlockShared) };
                    }
                });
            }
        }
        during();
    });
    started.elapsed()
}

fn collectives(n: u32) -> Vec<Collective> {
    vec![
        Collective::AllReduce,
        Collective::ReduceScatter,
        Collective::AllGather,
        Collective::Broadcast { root: Rank(n - 1) },
        Collective::Reduce { root: Rank(1 % n) },
    ]
}

/// Every collective × the (type, op) pairs, out of place, then in place,
/// on `n` ranks; all blocks done, every output right, the counters of
/// both ends of every connection equal.
fn sweep(n: u32, channels: u8, threads: u32, count: u64) {
    if kernels().is_none() {
        return;
    }
    let mut ring = HostRing::new(n, channels, 64, Duration::from_secs(60));
    let mut jobs = Vec::new();
    for c in collectives(n) {
        for (dtype, op) in PAIRS {
            let op = if c.reduces() { op } else { ReduceOp::Sum };
            jobs.push(Job::new(
                &mut ring,
                vec![Call::new(c, count, dtype, op); n as usize],
                false,
            ));
        }
        jobs.push(Job::new(
            &mut ring,
            vec![Call::new(c, count + 5, DataType::F32, ReduceOp::Sum); n as usize],
            true,
        ));
    }
    // Empty and one-element calls take their steps too.
    for count in [0, 1] {
        jobs.push(Job::new(
            &mut ring,
            vec![Call::all_reduce(count, DataType::F32, ReduceOp::Sum); n as usize],
            false,
        ));
    }
    let took = run(&ring, &jobs, threads, None, || {});
    eprintln!(
        "{n} ranks, {channels} channels, {threads} threads per block: {} calls in {took:?}",
        jobs.len()
    );
    for (r, c, s) in ring.statuses() {
        assert_eq!(
            (s.code, s.seq),
            (abi::STATUS_DONE, ring.seq - 1),
            "rank {} channel {}: {s:?}",
            r.0,
            c.0
        );
    }
    assert!(status_error(ring.statuses(), ring.timeout).is_none());
    for j in &jobs {
        assert_eq!(
            j.wrong(&ring),
            0,
            "{} in place {} on {n} ranks",
            j.calls[0].desc(j.seq),
            j.in_place
        );
    }
    for c in 0..channels {
        for r in 0..n {
            let (_, send_next) = ring.state(r, c);
            let (recv_next, _) = ring.state((r + 1) % n, c);
            assert_eq!(
                send_next,
                recv_next,
                "channel {c}: rank {r} → {}",
                (r + 1) % n
            );
            assert!(send_next > 0 || n == 1);
        }
    }
}

#[test]
fn every_collective_two_ranks() {
    sweep(2, 2, 2, 2053);
}

#[test]
fn every_collective_three_ranks_one_thread_per_block() {
    sweep(3, 3, 1, 1001);
}

#[test]
fn every_collective_four_ranks() {
    sweep(4, 2, 3, 3001);
}

/// Rank 1 never starts: every other block ends with an error within a
/// few timeouts — the first to reach its deadline with a timeout, the
/// rest at once after it (their peer failed) — and the host's report is
/// a timeout naming what was waited for. Nothing hangs.
#[test]
fn a_rank_that_never_starts_is_a_timeout_not_a_hang() {
    if kernels().is_none() {
        return;
    }
    let timeout = Duration::from_secs(1);
    let mut ring = HostRing::new(3, 2, 64, timeout);
    let job = Job::new(
        &mut ring,
        vec![Call::all_reduce(5000, DataType::F32, ReduceOp::Sum); 3],
        false,
    );
    let took = run(&ring, std::slice::from_ref(&job), 2, Some(1), || {});
    assert!(took >= timeout && took < timeout * 15, "took {took:?}");
    let mut timeouts = 0;
    for (r, c, s) in ring.statuses() {
        if r == Rank(1) {
            assert_eq!(s.code, abi::STATUS_IDLE);
            continue;
        }
        assert!(
            matches!(s.code, abi::STATUS_TIMEOUT | abi::STATUS_PEER_FAILED),
            "rank {} channel {}: {s:?}",
            r.0,
            c.0
        );
        if s.code == abi::STATUS_TIMEOUT {
            timeouts += 1;
            assert!(matches!(
                s.waiting,
                abi::WAIT_DATA | abi::WAIT_CREDIT | abi::WAIT_FINISH
            ));
            assert!(s.seen < s.need, "{s:?}");
        }
    }
    assert!(timeouts >= 1);
    assert_eq!(ring.abort.load(Ordering::Acquire), abi::ABORT_PEER);
    match status_error(ring.statuses(), timeout) {
        Some(Error::Timeout { waiting_for, after }) => {
            assert_eq!(after, timeout);
            assert!(waiting_for.contains("call 0: channel"), "{waiting_for}");
            assert!(waiting_for.contains("from its"), "{waiting_for}");
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
    // The failure is sticky: the next call's blocks end at once.
    let next = Job::new(
        &mut ring,
        vec![Call::all_reduce(10, DataType::F32, ReduceOp::Sum); 3],
        false,
    );
    let took = run(&ring, std::slice::from_ref(&next), 2, None, || {});
    assert!(took < timeout, "took {took:?}");
    for (r, c, s) in ring.statuses() {
        if r == Rank(1) {
            // It starts now, and stops at once: its peers failed.
            assert_eq!(
                (s.code, s.seq),
                (abi::STATUS_PEER_FAILED, 1),
                "channel {}",
                c.0
            );
        } else {
            assert_eq!(
                s.seq, 0,
                "rank {} channel {}: the first failure stays",
                r.0, c.0
            );
        }
    }
}

/// The host raises the abort word: the waiting blocks stop long before
/// their deadline, each saying it was aborted.
#[test]
fn the_host_abort_stops_every_wait() {
    if kernels().is_none() {
        return;
    }
    let mut ring = HostRing::new(4, 2, 64, Duration::from_secs(120));
    let job = Job::new(
        &mut ring,
        vec![Call::reduce_scatter(3000, DataType::Bf16, ReduceOp::Sum); 4],
        false,
    );
    let abort = &ring.abort;
    let took = run(&ring, std::slice::from_ref(&job), 2, Some(2), || {
        std::thread::sleep(Duration::from_millis(200));
        abort.store(abi::ABORT_HOST, Ordering::Release);
    });
    assert!(took < Duration::from_secs(30), "took {took:?}");
    for (r, c, s) in ring.statuses() {
        let want = if r == Rank(2) {
            abi::STATUS_IDLE
        } else {
            abi::STATUS_ABORTED
        };
        assert_eq!(s.code, want, "rank {} channel {}: {s:?}", r.0, c.0);
    }
    assert!(matches!(
        status_error(ring.statuses(), ring.timeout),
        Some(Error::Poisoned { .. })
    ));
}

/// Rank 1 calls Max where the others call Sum: its successor and itself
/// find the other's call words at their first receive, and the report is
/// the core's MismatchedCall with both calls.
#[test]
fn a_mismatched_call_is_found_on_the_device() {
    if kernels().is_none() {
        return;
    }
    let mut ring = HostRing::new(3, 2, 64, Duration::from_secs(60));
    let sum = Call::all_reduce(700, DataType::F32, ReduceOp::Sum);
    let max = Call::all_reduce(700, DataType::F32, ReduceOp::Max);
    let job = Job::new(&mut ring, vec![sum, max, sum], false);
    let took = run(&ring, std::slice::from_ref(&job), 2, None, || {});
    assert!(took < Duration::from_secs(30), "took {took:?}");
    let mismatches = ring
        .statuses()
        .iter()
        .filter(|(_, _, s)| s.code == abi::STATUS_MISMATCH)
        .count();
    assert!(mismatches >= 1);
    match status_error(ring.statuses(), ring.timeout) {
        Some(Error::Core {
            source: ringcc_core::Error::MismatchedCall { expected, got },
            ..
        }) => {
            assert_ne!(expected, got);
            assert!([sum.desc(0), max.desc(0)].contains(&expected));
            assert!([sum.desc(0), max.desc(0)].contains(&got));
        }
        other => panic!("expected MismatchedCall, got {other:?}"),
    }
}

/// NCCL's geometry (512 KiB slots, 2 MiB chunks) on a few MiB: whole
/// slices of the vector loop, several loops per channel.
#[test]
fn nccl_geometry() {
    if kernels().is_none() {
        return;
    }
    let mut ring = HostRing::new(2, 2, 512 * 1024, Duration::from_secs(60));
    let jobs: Vec<Job> = [
        Call::all_reduce(3 << 20, DataType::F32, ReduceOp::Sum),
        Call::all_gather(1 << 20, DataType::Bf16),
    ]
    .into_iter()
    .map(|c| Job::new(&mut ring, vec![c; 2], false))
    .collect();
    run(&ring, &jobs, 2, None, || {});
    assert!(status_error(ring.statuses(), ring.timeout).is_none());
    for j in &jobs {
        assert_eq!(j.wrong(&ring), 0);
    }
}
