//! Property: any sequence of calls (every collective, type, op, count,
//! in place or not) on 1–4 ranks × 1–3 channels, over shared memory with
//! small FIFOs, gives every rank the reference result (`core::verify`) —
//! also when the sending ends take the call's buffers on loan and read a
//! slice posted from them only later, as a NIC does ([`Lending`]).
//! Ranks are threads here (the multi-process runs are `comm_ranks.rs`).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use ringcc_comm::store::{MemStore, Store};
use ringcc_comm::transport::{post_staged, Bell, Hop, Job, PeerInfo, RecvEnd, SendEnd, Transport};
use ringcc_comm::{Communicator, Error, Options, Transports};
use ringcc_core::fifo::FifoGeometry;
use ringcc_core::prim::SlotSpan;
use ringcc_core::progress::Event;
use ringcc_core::wire::call_header::CALL_HEADER_LEN;
use ringcc_core::{verify, Protocol, SlotIndex};
use ringcc_core::{Call, Collective, DataType, Rank, ReduceOp};
use ringcc_host::ShmTransport;

fn shm_only() -> Transports {
    Arc::new(|| vec![Box::new(ShmTransport::new()) as Box<dyn Transport>])
}

/// Shared memory whose sending ends take every call's buffers on loan
/// ([`SendEnd::lend`]) and read a slice posted from them
/// ([`SendEnd::post_from`]) only `delay` polls later (or when the next
/// slice or the call's settling forces it), as a NIC reads after the post
/// returns: a byte the executor writes over before its slice has left
/// makes that slice differ from what was posted (an error) and the
/// result wrong.
fn lending(delay: u8, stats: &Arc<LendStats>) -> Transports {
    let stats = Arc::clone(stats);
    Arc::new(move || {
        vec![Box::new(Lending {
            inner: ShmTransport::new(),
            delay,
            stats: Arc::clone(&stats),
        }) as Box<dyn Transport>]
    })
}

/// What the lending ends of one job saw, over all ranks.
#[derive(Debug, Default)]
struct LendStats {
    /// Loans taken ([`SendEnd::lend`]).
    lends: AtomicU64,
    /// Loans settled after draining (a call that succeeded).
    drained: AtomicU64,
    /// Slices posted from lent memory and sent later.
    deferred: AtomicU64,
}

struct Lending {
    inner: ShmTransport,
    delay: u8,
    stats: Arc<LendStats>,
}

impl Transport for Lending {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn publish(
        &mut self,
        token: &str,
        rank: Rank,
    ) -> ringcc_comm::Result<Option<serde_json::Value>> {
        self.inner.publish(token, rank)
    }
    fn reaches(&self, a: &PeerInfo, b: &PeerInfo) -> bool {
        self.inner.reaches(a, b)
    }
    fn listen(&mut self, job: &Job<'_>, hop: Hop) -> ringcc_comm::Result<()> {
        self.inner.listen(job, hop)
    }
    fn bell(&mut self) -> Option<Arc<dyn Bell>> {
        self.inner.bell()
    }
    fn connect(&mut self, job: &Job<'_>, hop: Hop) -> ringcc_comm::Result<Box<dyn SendEnd>> {
        Ok(Box::new(LendingEnd {
            inner: self.inner.connect(job, hop)?,
            delay: self.delay,
            loan: None,
            queue: VecDeque::new(),
            polls: 0,
            stats: Arc::clone(&self.stats),
        }))
    }
    fn accept(&mut self, job: &Job<'_>, hop: Hop) -> ringcc_comm::Result<Box<dyn RecvEnd>> {
        self.inner.accept(job, hop)
    }
}

/// A slice posted from lent memory, not yet read.
struct Deferred {
    seq: u64,
    span: SlotSpan,
    header: Option<[u8; CALL_HEADER_LEN]>,
    data: *const u8,
    len: usize,
    slot_bytes: usize,
    /// The bytes as they were when posted.
    posted: Vec<u8>,
}

struct LendingEnd {
    inner: Box<dyn SendEnd>,
    delay: u8,
    /// The lent regions (address, length), while lent.
    loan: Option<Vec<(usize, usize)>>,
    queue: VecDeque<Deferred>,
    polls: u8,
    stats: Arc<LendStats>,
}

// SAFETY: the raw pointers name the lent buffers, which the lender keeps
// valid until `settle` (or drop); the end is used by one thread at a
// time like any other.
unsafe impl Send for LendingEnd {}

impl LendingEnd {
    /// Sends every deferred slice, reading it now.
    fn flush(&mut self) -> ringcc_comm::Result<()> {
        while let Some(d) = self.queue.pop_front() {
            // SAFETY: `d.data` lies in a region lent for the running
            // call, valid until `settle` (which flushes first); the
            // executor is not running while the end is called (one
            // thread), so nothing writes the bytes meanwhile — a read
            // as the NIC's DMA would make it.
            let now = unsafe { std::slice::from_raw_parts(d.data, d.len) };
            if now != d.posted {
                return Err(Error::Internal(format!(
                    "lent bytes of the slice at step {} changed before it left",
                    d.span.step
                )));
            }
            post_staged(
                &mut *self.inner,
                d.seq,
                d.span,
                d.header.as_ref(),
                now,
                d.slot_bytes,
            )?;
            self.stats.deferred.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    fn lent(&self, data: &[u8]) -> bool {
        let (at, len) = (data.as_ptr() as usize, data.len());
        self.loan
            .iter()
            .flatten()
            .any(|&(a, l)| at >= a && at + len <= a + l)
    }
}

impl SendEnd for LendingEnd {
    fn poll(&mut self) -> ringcc_comm::Result<Option<Event>> {
        self.polls = self.polls.saturating_add(1);
        if self.polls > self.delay {
            self.flush()?;
        }
        self.inner.poll()
    }
    fn slot_mut(&mut self, slot: SlotIndex, len: usize) -> ringcc_comm::Result<&mut [u8]> {
        self.inner.slot_mut(slot, len)
    }
    fn begin(&mut self, protocol: Protocol) {
        self.inner.begin(protocol)
    }
    fn post(
        &mut self,
        seq: u64,
        span: SlotSpan,
        header: Option<&[u8; CALL_HEADER_LEN]>,
        bytes: usize,
    ) -> ringcc_comm::Result<()> {
        self.flush()?;
        self.inner.post(seq, span, header, bytes)
    }
    fn needs_poll(&self) -> bool {
        !self.queue.is_empty() || self.inner.needs_poll()
    }
    fn post_from(
        &mut self,
        seq: u64,
        span: SlotSpan,
        header: Option<&[u8; CALL_HEADER_LEN]>,
        data: &[u8],
        slot_bytes: usize,
    ) -> ringcc_comm::Result<()> {
        if !self.lent(data) {
            return Err(Error::Internal(
                "a slice posted from memory that was not lent".into(),
            ));
        }
        self.queue.push_back(Deferred {
            seq,
            span,
            header: header.copied(),
            data: data.as_ptr(),
            len: data.len(),
            slot_bytes,
            posted: data.to_vec(),
        });
        self.polls = 0;
        Ok(())
    }
    unsafe fn lend(&mut self, regions: &[&[u8]]) -> ringcc_comm::Result<bool> {
        if self.loan.is_some() {
            return Err(Error::Internal("lent again before settling".into()));
        }
        self.loan = Some(
            regions
                .iter()
                .map(|r| (r.as_ptr() as usize, r.len()))
                .collect(),
        );
        self.stats.lends.fetch_add(1, Ordering::Relaxed);
        Ok(true)
    }
    fn settle(&mut self, drain: bool) -> ringcc_comm::Result<()> {
        if self.loan.take().is_none() {
            return Err(Error::Internal("settled without a loan".into()));
        }
        let r = if drain { self.flush() } else { Ok(()) };
        if drain {
            self.stats.drained.fetch_add(1, Ordering::Relaxed);
        }
        self.queue.clear();
        r
    }
}

#[derive(Clone, Debug)]
struct Case {
    ranks: u32,
    channels: u8,
    slot_bytes: u64,
    /// Sending ends that borrow the buffers and read this many polls late.
    lend: Option<u8>,
    calls: Vec<(Call, bool)>,
}

fn call(ranks: u32) -> impl Strategy<Value = (Call, bool)> {
    let dtypes = prop::sample::select(DataType::ALL.to_vec());
    let ops = prop::sample::select(vec![
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Min,
        ReduceOp::Max,
        ReduceOp::Avg,
    ]);
    (0u8..5, 0u64..3000, dtypes, ops, 0..ranks, any::<bool>()).prop_map(
        move |(c, count, dtype, op, root, in_place)| {
            let root = Rank(root);
            let collective = match c {
                0 => Collective::AllReduce,
                1 => Collective::ReduceScatter,
                2 => Collective::AllGather,
                3 => Collective::Broadcast { root },
                _ => Collective::Reduce { root },
            };
            (Call::new(collective, count, dtype, op), in_place)
        },
    )
}

fn case() -> impl Strategy<Value = Case> {
    (
        1u32..=4,
        1u8..=3,
        prop::sample::select(vec![1024u64, 4096, 16384]),
        prop::option::of(0u8..4),
    )
        .prop_flat_map(|(ranks, channels, slot_bytes, lend)| {
            prop::collection::vec(call(ranks), 1..5).prop_map(move |calls| Case {
                ranks,
                channels,
                slot_bytes,
                lend,
                calls,
            })
        })
}

/// One rank's run of the case: `Err` names the first wrong call.
fn rank(comm: &Communicator, calls: &[(Call, bool)]) -> Result<(), String> {
    let (ranks, r) = (comm.world_size(), comm.rank().0);
    for (k, (call, in_place)) in calls.iter().enumerate() {
        let salt = k as u64 * 13 + 5;
        let plan = call.plan(ranks, 1, 1 << 20).map_err(|e| e.to_string())?;
        let (ib, ob) = call.buffer_bytes(ranks);
        let mut input = vec![0u8; ib];
        verify::fill_input(&plan, call.op, r, salt, &mut input).map_err(|e| e.to_string())?;
        let got = if *in_place {
            let (ie, oe) = call.in_place_offsets(r);
            let at = |e: u64| e as usize * call.elem();
            let mut buf = vec![0u8; ib.max(ob)];
            buf[at(ie)..at(ie) + ib].copy_from_slice(&input);
            comm.run_in_place(call, &mut buf)
                .map_err(|e| format!("call {k} {call:?} in place: {e}"))?;
            buf[at(oe)..at(oe) + ob].to_vec()
        } else {
            let mut out = vec![0u8; ob];
            comm.run(call, &input, &mut out)
                .map_err(|e| format!("call {k} {call:?}: {e}"))?;
            out
        };
        let mut want = vec![0u8; ob];
        if verify::fill_expected(&plan, call.op, r, 0, salt, &mut want)
            .map_err(|e| e.to_string())?
        {
            let wrong = verify::count_diff(&want, &got, call.elem());
            if wrong != 0 {
                return Err(format!(
                    "rank {r} call {k} {call:?} in place {in_place}: {wrong} wrong"
                ));
            }
        }
    }
    Ok(())
}

fn run(case: &Case, token: &str) -> Result<(), String> {
    let stats = Arc::default();
    run_counted(case, token, &stats)?;
    let (lends, drained) = (
        stats.lends.load(Ordering::Relaxed),
        stats.drained.load(Ordering::Relaxed),
    );
    if lends != drained {
        return Err(format!("{lends} loans, {drained} settled after draining"));
    }
    Ok(())
}

/// [`run`], the lending ends counting into `stats`.
fn run_counted(case: &Case, token: &str, stats: &Arc<LendStats>) -> Result<(), String> {
    let store: Arc<dyn Store> = Arc::new(MemStore::new());
    let options = Options {
        channels: case.channels,
        geometry: Some(FifoGeometry::new(case.slot_bytes, 1).unwrap()),
        chunk_bytes: case.slot_bytes * 2,
        // Every channel in use from a few KiB on.
        channel_bytes: Some(2048),
        timeout: Duration::from_secs(20),
        ..Options::default()
    };
    let threads: Vec<_> = (0..case.ranks)
        .map(|r| {
            let (store, o, calls, t) = (
                Arc::clone(&store),
                options.clone(),
                case.calls.clone(),
                token.to_owned(),
            );
            let n = case.ranks;
            let transports = case.lend.map_or_else(shm_only, |d| lending(d, stats));
            std::thread::spawn(move || -> Result<(), String> {
                let c = Communicator::new(Rank(r), n, store, &t, o, transports)
                    .map_err(|e| format!("connect: {e}"))?;
                rank(&c, &calls)?;
                c.close().map_err(|e| e.to_string())
            })
        })
        .collect();
    let mut first = Ok(());
    for t in threads {
        let r = t
            .join()
            .map_err(|_| "a rank panicked".to_string())
            .and_then(|r| r);
        if first.is_ok() {
            first = r;
        }
    }
    first
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn any_call_sequence_gives_the_reference_result(case in case()) {
        let token = format!(
            "comm-props-{}-{:?}",
            std::process::id(),
            std::time::Instant::now()
        );
        prop_assert_eq!(run(&case, &token), Ok(()));
    }
}

/// Lending is really exercised: a 3-rank AllReduce in place, then out
/// of place, sends slices from the lent buffers (and gets the reference
/// result).
#[test]
fn lent_buffers_are_sent_from_after_the_post() {
    let call = Call::new(Collective::AllReduce, 3000, DataType::F32, ReduceOp::Sum);
    let case = Case {
        ranks: 3,
        channels: 2,
        slot_bytes: 1024,
        lend: Some(2),
        calls: vec![(call, true), (call, false)],
    };
    let token = format!("comm-props-lend-{}", std::process::id());
    let stats = Arc::default();
    assert_eq!(run_counted(&case, &token, &stats), Ok(()));
    let LendStats {
        lends,
        drained,
        deferred,
    } = &*stats;
    let [lends, drained, deferred] = [lends, drained, deferred].map(|a| a.load(Ordering::Relaxed));
    // A loan per call, rank and channel: 2 × 3 × 2.
    assert_eq!((lends, drained), (12, 12));
    assert!(deferred > 0);
}
