//! The firmware [`BlockingDriver`] over the engine (feature
//! `embedded-hal`): two ranks on two threads, two channels, several
//! consecutive calls through a [`Transport`] over shared queues, every
//! output the reference; a rank alone times out after the engine's
//! deadline in slept nanoseconds; a transport failure aborts the engine.
//!
//! Run: `cargo test -p ringcc-core --features embedded-hal --test engine_driver`

#![cfg(feature = "embedded-hal")]

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use embedded_hal::delay::DelayNs;
use ringcc_core::driver::{BlockingDriver, DriverError, Transport};
use ringcc_core::fifo::FifoGeometry;
use ringcc_core::prim::{slice_result, Action};
use ringcc_core::progress::{ArrayEngine, EngineError, Event};
use ringcc_core::verify::{fill_expected, fill_input};
use ringcc_core::{Blocked, Call, ChannelId, DataType, InOrderRing, Primitive, Rank, ReduceOp};

const N: u32 = 2;
const CHANNELS: u32 = 2;
const POLL_NS: u32 = 1_000;

type Eng = ArrayEngine<InOrderRing, 2>;

fn geometry() -> FifoGeometry {
    FifoGeometry::new(32, 2).unwrap()
}

const RING: InOrderRing = InOrderRing { ranks: N };

/// Sleeps by counting (and letting the other thread run).
#[derive(Default)]
struct Counting {
    ns: u64,
    calls: u64,
}

impl DelayNs for Counting {
    fn delay_ns(&mut self, ns: u32) {
        self.ns += u64::from(ns);
        self.calls += 1;
        std::thread::yield_now();
    }
}

/// What both ranks share: each rank's inbox of events (data from its
/// predecessor, credit from its successor, in order), and the FIFOs'
/// slots by (receiver, channel, step).
#[derive(Default)]
struct Shared {
    inbox: [VecDeque<(ChannelId, Event)>; N as usize],
    slots: HashMap<(u32, u8, u64), Vec<u8>>,
}

struct Side {
    rank: u32,
    shared: Arc<Mutex<Shared>>,
    /// Completions of this rank's own execs.
    done: VecDeque<(ChannelId, Event)>,
    call: Call,
    input: Vec<u8>,
    output: Vec<u8>,
}

#[derive(Debug, PartialEq)]
struct Broken;

impl Transport for Side {
    type Error = Broken;

    fn execute(&mut self, channel: ChannelId, action: &Action) -> Result<(), Broken> {
        let succ = (self.rank + 1) % N;
        let pred = (self.rank + N - 1) % N;
        let mut sh = self.shared.lock().unwrap();
        match action {
            Action::Exec(e) => {
                let es = self.call.elem();
                let bytes = e.count as usize * es;
                let incoming = e.recv.map(|span| {
                    let mut v = Vec::new();
                    for s in span.step..span.end() {
                        let slot = sh.slots.remove(&(self.rank, channel.0, s));
                        v.extend(slot.expect("the slot was written and not yet read"));
                    }
                    v
                });
                let local = e.primitive.reads_input().then(|| {
                    let at = e.input_offset as usize * es;
                    &self.input[at..at + bytes]
                });
                let mut out = vec![0u8; bytes];
                slice_result(
                    e.primitive,
                    self.call.dtype,
                    self.call.op,
                    N,
                    incoming.as_deref(),
                    local,
                    &mut out,
                )
                .unwrap();
                if e.primitive.contains(Primitive::COPY) {
                    let at = e.output_offset as usize * es;
                    self.output[at..at + bytes].copy_from_slice(&out);
                }
                if let Some(span) = e.send {
                    let sb = geometry().slot_bytes() as usize;
                    for (k, s) in (span.step..span.end()).enumerate() {
                        let part = out[(k * sb).min(bytes)..((k + 1) * sb).min(bytes)].to_vec();
                        let old = sh.slots.insert((succ, channel.0, s), part);
                        assert!(old.is_none(), "slot overwritten before it was read");
                    }
                    let events = e.successor_events().map(|ev| (channel, ev));
                    sh.inbox[succ as usize].extend(events);
                }
                self.done.push_back((channel, Event::ExecDone));
            }
            Action::ReturnCredit { head } => {
                sh.inbox[pred as usize].push_back((channel, Event::Head(*head)))
            }
            Action::Done => {}
        }
        Ok(())
    }

    fn poll(&mut self) -> Result<Option<(ChannelId, Event)>, Broken> {
        if let Some(ev) = self.done.pop_front() {
            return Ok(Some(ev));
        }
        Ok(self.shared.lock().unwrap().inbox[self.rank as usize].pop_front())
    }
}

fn calls() -> Vec<Call> {
    vec![
        Call::all_reduce(100, DataType::F32, ReduceOp::Sum),
        Call::broadcast(37, DataType::I32, Rank(1)),
        Call::reduce_scatter(20, DataType::U8, ReduceOp::Max),
        Call::all_gather(9, DataType::F16),
        Call::reduce(50, DataType::I64, ReduceOp::Avg, Rank(0)),
    ]
}

/// Rank `rank`'s side of every call in [`calls`], driven to the end.
fn rank_thread(rank: u32, shared: Arc<Mutex<Shared>>) -> Counting {
    // 2·10⁹ ns of sleep without progress: two million polls that found
    // nothing, far beyond a descheduled peer, and a hung run fails in
    // seconds.
    let mut engine = Eng::new(Rank(rank), Default::default(), 2_000_000_000);
    let mut driver = BlockingDriver::new(Counting::default(), POLL_NS);
    for (k, call) in calls().into_iter().enumerate() {
        let plan = call.plan(N, CHANNELS, 32).unwrap();
        let es = call.elem();
        let mut input = vec![0u8; plan.input_len() as usize * es];
        fill_input(&plan, call.op, rank, k as u64, &mut input).unwrap();
        let mut side = Side {
            rank,
            shared: shared.clone(),
            done: VecDeque::new(),
            call,
            input,
            output: vec![0u8; plan.output_len() as usize * es],
        };
        let desc = engine
            .start(driver.now(), &call, &plan, geometry(), |_| RING)
            .unwrap();
        assert_eq!(desc.seq, k as u64);
        driver.run(&mut engine, &mut side).unwrap();
        assert!(engine.is_idle());
        assert_eq!(engine.seq(), k as u64 + 1);
        let mut want = vec![0u8; side.output.len()];
        if fill_expected(&plan, call.op, rank, 0, k as u64, &mut want).unwrap() {
            assert!(want == side.output, "rank {rank} call {k} ({call:?})");
        }
    }
    let delay = driver.into_inner();
    assert!(delay.ns == delay.calls * u64::from(POLL_NS));
    delay
}

#[test]
fn two_ranks_on_two_threads_run_every_call_to_the_reference() {
    for _ in 0..20 {
        let shared = Arc::new(Mutex::new(Shared::default()));
        let (s0, s1) = (shared.clone(), shared.clone());
        let t0 = std::thread::spawn(move || rank_thread(0, s0));
        let t1 = std::thread::spawn(move || rank_thread(1, s1));
        t0.join().unwrap();
        t1.join().unwrap();
        let sh = shared.lock().unwrap();
        assert!(sh.slots.is_empty(), "every slot read");
        assert!(sh.inbox.iter().all(VecDeque::is_empty), "every event taken");
    }
}

fn lone_side(shared: Arc<Mutex<Shared>>, call: Call) -> Side {
    Side {
        rank: 0,
        shared,
        done: VecDeque::new(),
        call,
        input: vec![0u8; 64 * call.elem()],
        output: vec![0u8; 64 * call.elem()],
    }
}

#[test]
fn a_rank_alone_times_out_after_the_deadline_in_slept_time() {
    let call = Call::all_reduce(64, DataType::I32, ReduceOp::Sum);
    let plan = call.plan(N, CHANNELS, 32).unwrap();
    let timeout = 50 * u64::from(POLL_NS);
    let mut engine = Eng::new(Rank(0), Default::default(), timeout);
    let mut driver = BlockingDriver::new(Counting::default(), POLL_NS);
    // An idle engine: nothing to run.
    let shared = Arc::new(Mutex::new(Shared::default()));
    let mut side = lone_side(shared, call);
    driver.run(&mut engine, &mut side).unwrap();
    assert_eq!(driver.now(), 0);
    engine
        .start(driver.now(), &call, &plan, geometry(), |_| RING)
        .unwrap();
    let err = driver.run(&mut engine, &mut side).unwrap_err();
    let DriverError::Engine(EngineError::Timeout(stall)) = err else {
        panic!("{err:?}");
    };
    assert_eq!((stall.rank, stall.seq, stall.open), (Rank(0), 0, 2));
    assert!(
        matches!(stall.blocked, Blocked::Data { tail: 0, .. }),
        "{stall}"
    );
    assert_eq!(stall.waited, timeout);
    assert_eq!(driver.now(), timeout, "the deadline is counted in slept ns");
    assert_eq!(engine.failure(), Some(EngineError::Timeout(stall)));
    assert!(err
        .to_string()
        .starts_with("engine: no progress: rank 0 call 0"));
    let delay = driver.into_inner();
    assert_eq!(delay.calls, 50);
}

/// A transport whose `execute` fails after `executes` successes, or
/// whose `poll` always fails.
struct Flaky {
    inner: Side,
    executes: u32,
    fail_poll: bool,
}

impl Transport for Flaky {
    type Error = Broken;

    fn execute(&mut self, channel: ChannelId, action: &Action) -> Result<(), Broken> {
        self.executes = self.executes.checked_sub(1).ok_or(Broken)?;
        self.inner.execute(channel, action)
    }

    fn poll(&mut self) -> Result<Option<(ChannelId, Event)>, Broken> {
        if self.fail_poll {
            return Err(Broken);
        }
        self.inner.poll()
    }
}

#[test]
fn a_transport_failure_aborts_the_engine() {
    let call = Call::all_reduce(64, DataType::I32, ReduceOp::Sum);
    let plan = call.plan(N, CHANNELS, 32).unwrap();
    for fail_poll in [false, true] {
        let mut engine = Eng::new(Rank(0), Default::default(), 1 << 30);
        let mut driver = BlockingDriver::new(Counting::default(), POLL_NS);
        let shared = Arc::new(Mutex::new(Shared::default()));
        let mut t = Flaky {
            inner: lone_side(shared, call),
            executes: if fail_poll { u32::MAX } else { 1 },
            fail_poll,
        };
        engine.start(0, &call, &plan, geometry(), |_| RING).unwrap();
        let err = driver.run(&mut engine, &mut t).unwrap_err();
        assert_eq!(err, DriverError::Transport(Broken));
        assert_eq!(err.to_string(), "transport: Broken");
        assert_eq!(engine.failure(), Some(EngineError::Aborted));
    }
}

/// An event no correct peer sends stops the driver with the engine's
/// error, naming channel and operation.
#[test]
fn an_impossible_event_stops_the_driver_with_the_engine_error() {
    let call = Call::all_reduce(64, DataType::I32, ReduceOp::Sum);
    let plan = call.plan(N, CHANNELS, 32).unwrap();
    let mut engine = Eng::new(Rank(0), Default::default(), 1 << 30);
    let mut driver = BlockingDriver::new(Counting::default(), POLL_NS);
    let shared = Arc::new(Mutex::new(Shared::default()));
    shared.lock().unwrap().inbox[0].push_back((ChannelId(1), Event::Tail(99)));
    let mut side = lone_side(shared, call);
    engine.start(0, &call, &plan, geometry(), |_| RING).unwrap();
    let err = driver.run(&mut engine, &mut side).unwrap_err();
    let DriverError::Engine(e) = err else {
        panic!("{err:?}");
    };
    assert_eq!(e.channel(), Some(ChannelId(1)));
    assert!(matches!(
        e,
        EngineError::Machine {
            during: "handle_tail",
            ..
        }
    ));
    assert_eq!(engine.failure(), Some(e));
}
