//! The progress loop: one core [`Engine`] per rank, all in this process,
//! fed to a [`Device`].
//!
//! The engines do the protocol (one machine per channel, sequence
//! numbers, the connection counters carried from call to call, the
//! deadline, the stall report). This loop only carries out what they hand
//! out and tells them what happened:
//!
//! - `Exec`: the fused kernel (and, for a staged link, the copy) is
//!   enqueued after waits for the events that guard the slots it reads and
//!   writes, with records of those events after it; the exec is then done
//!   for the engine, and the successor's engine gets
//!   [`Exec::successor_events`] (the call header, the new `tail`).
//! - `ReturnCredit { head }`: the predecessor's engine gets
//!   [`Event::Head`].
//! - `Done`: nothing; the call is enqueued when every engine is idle.
//!
//! The `head` and `tail` counters are host values (the one place both ends
//! of every connection are seen); what makes them true on the device is
//! the event each slot carries: `Written` is recorded after the kernel (or
//! copy) that fills the slot and waited for by the kernel that reads it,
//! `Read` is recorded after that read and waited for by the next write of
//! the slot. The loop therefore never waits for the device: it enqueues
//! the whole collective, and the device runs it in order.
//!
//! Time is the engines' (nanoseconds, from the caller's clock): an engine
//! that sees nothing for the configured timeout fails the call with its
//! stall report. The one thing this loop adds is what only a loop that
//! holds every rank can see: a pass in which no engine did anything means
//! none ever will, reported at once ([`Error::Stalled`], from the engines'
//! [`Engine::stall`]) instead of at the deadline.

use std::time::Duration;

use ringcc_core::progress::Channel;
use ringcc_core::{
    Action, Call, CallDesc, ChannelId, Engine, Event, Exec, InOrderRing, Plan, Primitive, Rank,
};

use crate::device::{CopyOp, Device, SliceOp, SlotUse};
use crate::error::{Error, Result};
use crate::kernel::{KernelKey, ModuleKey};
use crate::layout::{BufId, EventId, Layout, LinkKind, MemRef, StreamId};

/// One rank's engine: its channels in a boxed slice, walking the ring in
/// rank order.
pub type RankEngine = Engine<InOrderRing, Box<[Channel<InOrderRing>]>>;

/// The engines of a communicator over `layout`: one per rank, with one
/// channel slot per channel, giving up on a call when nothing happens
/// for `timeout`.
pub fn engines(layout: &Layout, timeout: Duration) -> Vec<RankEngine> {
    let ticks = u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX);
    (0..layout.ranks())
        .map(|r| {
            let channels = vec![Channel::new(); usize::from(layout.channels())];
            Engine::new(Rank(r), channels.into_boxed_slice(), ticks)
        })
        .collect()
}

/// Checks a call before anything starts: one call per rank, each with a
/// plan (the plans are returned, `plans[r]` for rank `r`). Nothing is
/// touched, so a refusal here leaves the communicator usable.
pub fn plans(layout: &Layout, calls: &[Call], chunk_bytes: u64) -> Result<Vec<Plan>> {
    let n = layout.ranks();
    if calls.len() != n as usize {
        return Err(Error::RankCount {
            expected: n as usize,
            got: calls.len(),
        });
    }
    calls
        .iter()
        .map(|c| {
            c.plan(n, u32::from(layout.channels()), chunk_bytes)
                .map_err(Error::core("Plan::new"))
        })
        .collect()
}

/// Enqueues one collective: `calls[r]` (with `plans[r]`, from [`plans`])
/// is rank `r`'s call, started on `engines[r]` at `clock()`.
///
/// Returns once every engine is idle (everything is enqueued). Fails with
/// the first engine's error (the channel's machine error as
/// [`Error::Core`], a deadline as [`Error::Timeout`]), a device error, or
/// [`Error::Stalled`] when the engines wait on each other. After a failure
/// the engines are in the middle of a call: the caller poisons its
/// communicator ([`CommState`](crate::state::CommState) does).
pub fn run_call<D: Device>(
    device: &mut D,
    layout: &Layout,
    engines: &mut [RankEngine],
    calls: &[Call],
    plans: &[Plan],
    clock: impl Fn() -> u64,
) -> Result<()> {
    let n = layout.ranks();
    if engines.len() != n as usize || calls.len() != engines.len() || plans.len() != calls.len() {
        return Err(Error::RankCount {
            expected: n as usize,
            got: engines.len().min(calls.len()).min(plans.len()),
        });
    }
    let ring = InOrderRing { ranks: n };
    let geometry = layout.geometry();
    let now = clock();
    for ((e, call), plan) in engines.iter_mut().zip(calls).zip(plans) {
        e.start(now, call, plan, geometry, |_| ring)
            .map_err(|x| Error::from_engine(x, e.failure()))?;
    }
    let channels = layout.channels();
    for r in (0..n).map(Rank) {
        device.record(StreamId::User(r), EventId::Begin(r))?;
        for c in (0..channels).map(ChannelId) {
            device.wait(StreamId::Channel(c, r), EventId::Begin(r))?;
        }
    }
    enqueue(device, layout, engines, &clock)?;
    for c in (0..channels).map(ChannelId) {
        for r in (0..n).map(Rank) {
            device.record(StreamId::Channel(c, r), EventId::End(c, r))?;
            device.wait(StreamId::User(r), EventId::End(c, r))?;
        }
    }
    Ok(())
}

/// Feeds `event` on channel `c` to rank `r`'s engine.
fn deliver(
    engines: &mut [RankEngine],
    r: Rank,
    now: u64,
    c: ChannelId,
    event: Event,
) -> Result<()> {
    let e = engine(engines, r)?;
    e.handle(now, c, event)
        .map_err(|x| Error::from_engine(x, e.failure()))
}

fn engine(engines: &mut [RankEngine], r: Rank) -> Result<&mut RankEngine> {
    let ranks = engines.len() as u32;
    engines
        .get_mut(r.0 as usize)
        .ok_or(Error::RankOutOfRange { rank: r, ranks })
}

/// The loop of the module documentation, until every engine is idle.
fn enqueue<D: Device>(
    device: &mut D,
    layout: &Layout,
    engines: &mut [RankEngine],
    clock: &impl Fn() -> u64,
) -> Result<()> {
    loop {
        let now = clock();
        let mut progressed = false;
        for r in (0..layout.ranks()).map(Rank) {
            loop {
                let e = engine(engines, r)?;
                let Some((c, action)) = e.poll().map_err(|x| Error::from_engine(x, e.failure()))?
                else {
                    break;
                };
                progressed = true;
                match action {
                    Action::Exec(x) => {
                        let call = e.call().ok_or(Error::BadConfig {
                            what: "an engine handed out an exec without a call",
                        })?;
                        exec(device, layout, c, r, &call, &x)?;
                        deliver(engines, r, now, c, Event::ExecDone)?;
                        for ev in x.successor_events() {
                            deliver(engines, layout.next(r), now, c, ev)?;
                        }
                    }
                    Action::ReturnCredit { head } => {
                        deliver(engines, layout.prev(r), now, c, Event::Head(head))?;
                    }
                    Action::Done => {}
                }
            }
        }
        if engines.iter().all(RankEngine::is_idle) {
            return Ok(());
        }
        let now = clock();
        if !progressed {
            return Err(Error::Stalled {
                detail: stall_report(engines, now),
            });
        }
        for e in engines.iter_mut() {
            e.handle_timeout(now)
                .map_err(|x| Error::from_engine(x, e.failure()))?;
        }
    }
}

/// Every busy engine's [`Engine::stall`], in rank order.
fn stall_report(engines: &[RankEngine], now: u64) -> String {
    engines
        .iter()
        .filter(|e| !e.is_idle())
        .map(|e| e.stall(now).to_string())
        .collect::<Vec<_>>()
        .join("; ")
}

/// The fused-kernel launch (and, for a staged link, the copy) that carries
/// out `e` for rank `r` on channel `c`, with the event waits and records
/// that order it against the other ranks' use of the same slots.
pub fn exec<D: Device>(
    device: &mut D,
    layout: &Layout,
    c: ChannelId,
    r: Rank,
    call: &CallDesc,
    e: &Exec,
) -> Result<()> {
    let elem = u64::from(call.dtype.size());
    let stream = StreamId::Channel(c, r);
    let inc = layout.incoming(c, r);
    let out = layout.outgoing(c, r);
    let staged = layout.link(r) == LinkKind::Staged;
    let p = e.primitive;
    if let Some(span) = e.recv {
        for s in Layout::span_slots(span) {
            device.wait(stream, EventId::Written(inc, s))?;
        }
    }
    if let Some(span) = e.send {
        for s in Layout::span_slots(span) {
            device.wait(stream, EventId::Read(out, s))?;
        }
    }
    let send_buf = if staged {
        BufId::Staging(out)
    } else {
        BufId::Fifo(out)
    };
    let op = SliceOp {
        kernel: KernelKey {
            primitive: p,
            module: ModuleKey {
                dtype: call.dtype,
                op: call.op,
            },
        },
        count: e.count,
        recv: e.recv.map(|s| layout.slot_ref(BufId::Fifo(inc), s)),
        input: p.reads_input().then(|| MemRef {
            buf: BufId::Input(r),
            offset: e.input_offset.saturating_mul(elem),
        }),
        output: p.contains(Primitive::COPY).then(|| MemRef {
            buf: BufId::Output(r),
            offset: e.output_offset.saturating_mul(elem),
        }),
        send: e.send.map(|s| layout.slot_ref(send_buf, s)),
        nranks: layout.ranks(),
        reads: e.recv.map(|span| SlotUse { conn: inc, span }),
        writes: if staged {
            None
        } else {
            e.send.map(|span| SlotUse { conn: out, span })
        },
    };
    device.launch(stream, &op)?;
    if let (true, Some(span)) = (staged, e.send) {
        device.copy(
            stream,
            &CopyOp {
                src: layout.slot_ref(BufId::Staging(out), span),
                dst: layout.slot_ref(BufId::Fifo(out), span),
                bytes: e.count.saturating_mul(elem),
                writes: Some(SlotUse { conn: out, span }),
            },
        )?;
    }
    if let Some(span) = e.recv {
        for s in Layout::span_slots(span) {
            device.record(stream, EventId::Read(inc, s))?;
        }
    }
    if let Some(span) = e.send {
        for s in Layout::span_slots(span) {
            device.record(stream, EventId::Written(out, s))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::fake::FakeDevice;
    use ringcc_core::{Blocked, DataType, ReduceOp};
    use std::cell::Cell;

    const CALL: Call = Call::all_reduce(100, DataType::F32, ReduceOp::Sum);

    fn setup() -> (Layout, FakeDevice, Vec<RankEngine>) {
        let geometry = ringcc_core::fifo::FifoGeometry::new(64, 2).unwrap();
        let layout = Layout::new(vec![0, 0], 1, geometry, |_, _| true).unwrap();
        let mut dev = FakeDevice::new(layout.clone(), 1, 2);
        for r in 0..2 {
            dev.bind(
                Rank(r),
                (0..100).flat_map(|_| 1f32.to_ne_bytes()).collect(),
                (0, 400),
                (0, 400),
                Some(vec![0; 400]),
            );
        }
        let engines = engines(&layout, Duration::from_secs(5));
        (layout, dev, engines)
    }

    #[test]
    fn runs_and_the_engines_carry_the_links() {
        let (layout, mut dev, mut engines) = setup();
        let calls = [CALL; 2];
        let plans = plans(&layout, &calls, 256).unwrap();
        for seq in 0..3 {
            run_call(&mut dev, &layout, &mut engines, &calls, &plans, || 0).unwrap();
            dev.synchronize().unwrap();
            assert_eq!(dev.output(Rank(1)).unwrap()[..4], 2f32.to_ne_bytes());
            for e in &engines {
                assert!(e.is_idle());
                assert_eq!(e.seq(), seq + 1);
                let l = e.link(ChannelId(0));
                assert!(l.send_next > 0 && l.send_head == l.send_next);
            }
        }
        let l = engines[0].link(ChannelId(0));
        assert_eq!(l.recv_next, l.send_next, "{l:?}");
    }

    /// Rank 1's engine never starts: rank 0 sends what it can and then
    /// waits for rank 1. The loop says so at once, from rank 0's engine,
    /// instead of waiting for the deadline.
    #[test]
    fn a_stall_is_reported_from_the_engines_at_once() {
        let (layout, mut dev, mut engines) = setup();
        let plan = CALL.plan(2, 1, 256).unwrap();
        let ring = InOrderRing { ranks: 2 };
        engines[0]
            .start(0, &CALL, &plan, layout.geometry(), |_| ring)
            .unwrap();
        match enqueue(&mut dev, &layout, &mut engines, &|| 0) {
            Err(Error::Stalled { detail }) => {
                assert!(
                    detail.starts_with("rank 0 call 0: channel 0 waits for"),
                    "{detail}"
                );
                assert!(!detail.contains("rank 1"), "{detail}");
            }
            other => panic!("expected a stall, got {other:?}"),
        }
        assert!(matches!(
            engines[0].blocked_on(ChannelId(0)),
            Blocked::Data { .. } | Blocked::Credit { .. }
        ));
    }

    /// A clock that jumps past the deadline between passes: the engines'
    /// own deadline fails the call with their stall report.
    #[test]
    fn the_engines_deadline_is_a_timeout_with_the_stall_report() {
        let (layout, mut dev, mut engines) = setup();
        let calls = [CALL; 2];
        let plans = plans(&layout, &calls, 256).unwrap();
        let t = Cell::new(0u64);
        let clock = || {
            t.set(t.get() + 6_000_000_000);
            t.get()
        };
        match run_call(&mut dev, &layout, &mut engines, &calls, &plans, clock) {
            Err(Error::Timeout { waiting_for, after }) => {
                assert!(waiting_for.starts_with("rank 0 call 0"), "{waiting_for}");
                assert!(after >= Duration::from_secs(5), "{after:?}");
            }
            other => panic!("expected a timeout, got {other:?}"),
        }
        assert!(engines[0].failure().is_some());
    }

    #[test]
    fn wrong_shapes_are_rejected_before_anything_starts() {
        let (layout, mut dev, mut engines) = setup();
        assert!(matches!(
            plans(&layout, &[CALL], 256),
            Err(Error::RankCount { .. })
        ));
        assert!(matches!(
            plans(&layout, &[CALL; 2], 10),
            Err(Error::Core {
                channel: None,
                call: "Plan::new",
                ..
            })
        ));
        let plans = plans(&layout, &[CALL; 2], 256).unwrap();
        assert!(matches!(
            run_call(
                &mut dev,
                &layout,
                &mut engines[..1],
                &[CALL],
                &plans[..1],
                || 0
            ),
            Err(Error::RankCount { .. })
        ));
        assert!(engines.iter().all(|e| e.is_idle() && e.failure().is_none()));
    }

    /// A call whose chunks do not fit the FIFO is refused by the engine's
    /// start, with the channel that refused it.
    #[test]
    fn an_engine_refusal_names_its_channel() {
        let (layout, mut dev, mut engines) = setup();
        let calls = [Call::all_reduce(1 << 16, DataType::F32, ReduceOp::Sum); 2];
        let plans = plans(&layout, &calls, 1 << 20).unwrap();
        let e = run_call(&mut dev, &layout, &mut engines, &calls, &plans, || 0).unwrap_err();
        assert!(
            matches!(
                e,
                Error::Core {
                    channel: Some(ChannelId(0)),
                    source: ringcc_core::Error::ChunkTooLargeForFifo { .. },
                    ..
                }
            ),
            "{e:?}"
        );
        assert_eq!(
            e.core_error()
                .map(|c| matches!(c, ringcc_core::Error::ChunkTooLargeForFifo { .. })),
            Some(true)
        );
    }
}
