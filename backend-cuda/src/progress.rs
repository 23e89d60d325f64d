//! The progress loop: one core [`Machine`] per (channel, rank), driven to
//! completion over an [`Engine`].
//!
//! All ranks live in this process, so the loop delivers every machine's
//! events itself: an `Exec` is carried out by enqueueing its fused kernel
//! (after waiting for the events that guard the slots it reads and writes),
//! then the successor's machine gets the call header and the new `tail`;
//! `ReturnCredit` gives the predecessor's machine the new `head`. The `head`
//! and `tail` counters are host values owned by this loop (the one place
//! both ends of every connection are seen); what makes them true on the
//! device is the event each slot carries: `Written` is recorded after the
//! kernel (or copy) that fills the slot and waited for by the kernel that
//! reads it, `Read` is recorded after that read and waited for by the next
//! write of the slot. The loop therefore never waits for the device: it
//! enqueues the whole collective, and the device runs it in order.

use std::time::{Duration, Instant};

use ringcc_core::{
    Action, CallDesc, ChannelId, Exec, InOrderRing, LinkState, Machine, Plan, Primitive, Rank,
};

use crate::engine::{CopyOp, Engine, SliceOp, SlotUse};
use crate::error::{Error, Result};
use crate::kernel::{KernelKey, ModuleKey};
use crate::layout::{BufId, EventId, Layout, LinkKind, MemRef, StreamId};

/// Enqueues one collective: `calls[r]` is rank `r`'s call, `links` the
/// connection counters of every (channel, rank) in
/// [`Layout::slot_index`] order, updated on success.
///
/// Returns once every machine is done (everything is enqueued); fails with
/// the first machine's error, [`Error::Stalled`] if the machines wait on
/// each other, or [`Error::Timeout`] after `timeout`.
pub fn run_call<E: Engine>(
    engine: &mut E,
    layout: &Layout,
    links: &mut [LinkState],
    calls: &[CallDesc],
    chunk_bytes: u64,
    timeout: Duration,
) -> Result<()> {
    let n = layout.ranks();
    if calls.len() != n as usize {
        return Err(Error::RankCount {
            expected: n as usize,
            got: calls.len(),
        });
    }
    if links.len() != layout.pairs() {
        return Err(Error::BadConfig {
            what: "link state count differs from channels × ranks",
        });
    }
    let ring = InOrderRing { ranks: n };
    let channels = layout.channels();
    let mut machines = Vec::with_capacity(layout.pairs());
    for c in 0..channels {
        for (r, call) in calls.iter().enumerate() {
            let (c, r) = (ChannelId(c), Rank(r as u32));
            let plan = Plan::new(
                call.collective,
                call.count,
                call.dtype,
                n,
                u32::from(channels),
                chunk_bytes,
            )
            .map_err(Error::core("Plan::new"))?;
            let steps = plan.steps(c, r, ring).map_err(Error::core("Plan::steps"))?;
            let link = links[layout.slot_index(c, r)];
            machines.push(
                Machine::new(*call, steps, layout.geometry(), link)
                    .map_err(Error::core("Machine::new"))?,
            );
        }
    }
    for r in 0..n {
        let r = Rank(r);
        engine.record(StreamId::User(r), EventId::Begin(r))?;
        for c in 0..channels {
            engine.wait(StreamId::Channel(ChannelId(c), r), EventId::Begin(r))?;
        }
    }
    drive(engine, layout, &mut machines, timeout)?;
    for c in 0..channels {
        for r in 0..n {
            let (c, r) = (ChannelId(c), Rank(r));
            engine.record(StreamId::Channel(c, r), EventId::End(c, r))?;
            engine.wait(StreamId::User(r), EventId::End(c, r))?;
        }
    }
    for (link, m) in links.iter_mut().zip(&machines) {
        *link = m.link();
    }
    Ok(())
}

fn drive<E: Engine>(
    engine: &mut E,
    layout: &Layout,
    machines: &mut [Machine<InOrderRing>],
    timeout: Duration,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    let n = layout.ranks() as usize;
    let mut done = vec![false; machines.len()];
    loop {
        let mut progressed = false;
        for i in 0..machines.len() {
            if done[i] {
                continue;
            }
            let (c, r) = (ChannelId((i / n) as u8), Rank((i % n) as u32));
            while let Some(action) = machines[i]
                .poll_action()
                .map_err(Error::core("Machine::poll_action"))?
            {
                progressed = true;
                match action {
                    Action::Exec(e) => {
                        let call = *machines[i].call();
                        exec(engine, layout, c, r, &call, &e)?;
                        machines[i]
                            .handle_exec_done()
                            .map_err(Error::core("Machine::handle_exec_done"))?;
                        if let Some(span) = e.send {
                            let j = layout.slot_index(c, layout.next(r));
                            if let Some(h) = e.header {
                                machines[j]
                                    .handle_header(span.step, h)
                                    .map_err(Error::core("Machine::handle_header"))?;
                            }
                            machines[j]
                                .handle_tail(span.end())
                                .map_err(Error::core("Machine::handle_tail"))?;
                        }
                    }
                    Action::ReturnCredit { head } => {
                        let j = layout.slot_index(c, layout.prev(r));
                        machines[j]
                            .handle_head(head)
                            .map_err(Error::core("Machine::handle_head"))?;
                    }
                    Action::Done => {
                        done[i] = true;
                        break;
                    }
                }
            }
        }
        if done.iter().all(|&d| d) {
            return Ok(());
        }
        if !progressed {
            return Err(Error::Stalled {
                detail: stall_detail(machines, &done, n),
            });
        }
        if Instant::now() > deadline {
            return Err(Error::Timeout {
                waiting_for: "the progress loop to enqueue the collective",
                after: timeout,
            });
        }
    }
}

fn stall_detail(machines: &[Machine<InOrderRing>], done: &[bool], n: usize) -> String {
    let mut s = String::new();
    for (i, m) in machines.iter().enumerate() {
        if !done[i] {
            let l = m.link();
            s.push_str(&format!(
                "[channel {} rank {}: recv tail {} next {}, send head {} next {}] ",
                i / n,
                i % n,
                l.recv_tail,
                l.recv_next,
                l.send_head,
                l.send_next
            ));
        }
    }
    s
}

/// The fused-kernel launch (and, for a staged link, the copy) that carries
/// out `e` for rank `r` on channel `c`, with the event waits and records
/// that order it against the other ranks' use of the same slots.
pub fn exec<E: Engine>(
    engine: &mut E,
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
            engine.wait(stream, EventId::Written(inc, s))?;
        }
    }
    if let Some(span) = e.send {
        for s in Layout::span_slots(span) {
            engine.wait(stream, EventId::Read(out, s))?;
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
    engine.launch(stream, &op)?;
    if let (true, Some(span)) = (staged, e.send) {
        engine.copy(
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
            engine.record(stream, EventId::Read(inc, s))?;
        }
    }
    if let Some(span) = e.send {
        for s in Layout::span_slots(span) {
            engine.record(stream, EventId::Written(out, s))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::fake::FakeDevice;
    use ringcc_core::{Collective, DataType, ReduceOp};

    fn setup() -> (Layout, FakeDevice, Vec<CallDesc>) {
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
        let call = CallDesc::new(0, Collective::AllReduce, 100, DataType::F32, ReduceOp::Sum);
        (layout, dev, vec![call; 2])
    }

    #[test]
    fn runs_and_advances_the_links() {
        let (layout, mut dev, calls) = setup();
        let mut links = vec![LinkState::default(); 2];
        run_call(
            &mut dev,
            &layout,
            &mut links,
            &calls,
            256,
            Duration::from_secs(5),
        )
        .unwrap();
        dev.synchronize().unwrap();
        assert!(links
            .iter()
            .all(|l| l.send_next > 0 && l.send_head == l.send_next));
        assert_eq!(dev.output(Rank(1)).unwrap()[..4], 2f32.to_ne_bytes());
    }

    /// Connection counters no correct history produces (a full FIFO that
    /// its receiver has already drained): the machines wait on each other,
    /// and the loop says so at once instead of hanging.
    #[test]
    fn a_stall_is_an_error_not_a_hang() {
        let (layout, mut dev, calls) = setup();
        let full = LinkState {
            recv_tail: 0,
            recv_next: 0,
            send_head: 0,
            send_next: 8,
            early_header: None,
        };
        let mut links = vec![full; 2];
        match run_call(
            &mut dev,
            &layout,
            &mut links,
            &calls,
            256,
            Duration::from_secs(5),
        ) {
            Err(Error::Stalled { detail }) => assert!(detail.contains("rank 0"), "{detail}"),
            other => panic!("expected a stall, got {other:?}"),
        }
    }

    #[test]
    fn wrong_shapes_are_rejected() {
        let (layout, mut dev, calls) = setup();
        let mut links = vec![LinkState::default(); 2];
        assert!(matches!(
            run_call(
                &mut dev,
                &layout,
                &mut links,
                &calls[..1],
                256,
                Duration::from_secs(1)
            ),
            Err(Error::RankCount { .. })
        ));
        assert!(matches!(
            run_call(
                &mut dev,
                &layout,
                &mut links[..1],
                &calls,
                256,
                Duration::from_secs(1)
            ),
            Err(Error::BadConfig { .. })
        ));
        assert!(matches!(
            run_call(
                &mut dev,
                &layout,
                &mut links,
                &calls,
                10,
                Duration::from_secs(1)
            ),
            Err(Error::Core {
                call: "Plan::new",
                ..
            })
        ));
    }
}
