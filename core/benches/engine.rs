//! Nanoseconds per slice through the progress engine: the workload of
//! `plan`'s machine bench (one rank of 64, AllReduce, data and credit
//! always available), driven through `Engine::poll` / `Engine::handle`,
//! and through `Engine::poll_channel` / `Engine::pending`.
//! Its own bench binary: in one binary with the bare machine's bench the
//! compiler inlines the machine differently and the bare number moves.
//!
//! `cargo bench -p ringcc-core --bench engine`

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use ringcc_core::fifo::FifoGeometry;
use ringcc_core::prim::{Action, Next};
use ringcc_core::progress::{ArrayEngine, Channel, Engine, Event};
use ringcc_core::{Call, ChannelId, Collective, DataType, Plan, Rank, ReduceOp};
use std::hint::black_box;

fn engine(c: &mut Criterion) {
    let ring = ringcc_core::InOrderRing { ranks: 64 };
    let plan = Plan::new(
        Collective::AllReduce,
        1 << 24,
        DataType::F32,
        64,
        1,
        1 << 16,
    )
    .unwrap();
    let geometry = FifoGeometry::new(1 << 14, 2).unwrap();
    let slices = plan.total_steps(ChannelId(0)).unwrap() * 2;
    let mut g = c.benchmark_group("engine");
    g.throughput(Throughput::Elements(slices));
    // The same slices through the progress engine (one channel): what the
    // engine's bookkeeping adds per event over the machine itself.
    let call1 = Call::all_reduce(1 << 24, DataType::F32, ReduceOp::Sum);
    g.bench_function("allreduce_64_ranks_slices", |b| {
        b.iter(|| {
            let mut e: ArrayEngine<_, 1> = Engine::new(Rank(9), [Channel::new()], u64::MAX);
            e.start(0, &call1, &plan, geometry, |_| ring).unwrap();
            let c = ChannelId(0);
            let mut header = true;
            let mut n = 0u64;
            while !e.is_idle() {
                match e.poll().unwrap() {
                    Some((_, Action::Exec(x))) => {
                        e.handle(0, c, Event::ExecDone).unwrap();
                        if let Some(s) = x.send {
                            e.handle(0, c, Event::Head(s.end())).unwrap();
                        }
                        n += 1;
                    }
                    Some((_, Action::ReturnCredit { head })) => {
                        black_box(head);
                    }
                    Some((_, Action::Done)) => {}
                    None => {
                        let l = e.link(c);
                        if header && l.recv_tail == 0 {
                            let desc = call1.desc(0);
                            e.handle(0, c, Event::Header { step: 0, desc }).unwrap();
                            header = false;
                        }
                        e.handle(0, c, Event::Tail(l.recv_next + 8)).unwrap();
                    }
                }
            }
            black_box(n)
        })
    });
    // The same through `poll_channel` (the exec read back with
    // `pending`): how a backend that drives one channel at a time, the
    // simulator, polls.
    g.bench_function("allreduce_64_ranks_slices_poll_channel", |b| {
        b.iter(|| {
            let mut e: ArrayEngine<_, 1> = Engine::new(Rank(9), [Channel::new()], u64::MAX);
            e.start(0, &call1, &plan, geometry, |_| ring).unwrap();
            let c = ChannelId(0);
            let mut header = true;
            let mut n = 0u64;
            while !e.is_idle() {
                match e.poll_channel(c).unwrap() {
                    Some(Next::Exec) => {
                        let x = e.pending(c).unwrap();
                        e.handle(0, c, Event::ExecDone).unwrap();
                        if let Some(s) = x.send {
                            e.handle(0, c, Event::Head(s.end())).unwrap();
                        }
                        n += 1;
                    }
                    Some(Next::ReturnCredit { head }) => {
                        black_box(head);
                    }
                    Some(Next::Done) => {}
                    None => {
                        let l = e.link(c);
                        if header && l.recv_tail == 0 {
                            let desc = call1.desc(0);
                            e.handle(0, c, Event::Header { step: 0, desc }).unwrap();
                            header = false;
                        }
                        e.handle(0, c, Event::Tail(l.recv_next + 8)).unwrap();
                    }
                }
            }
            black_box(n)
        })
    });
    g.finish();
}

criterion_group!(benches, engine);
criterion_main!(benches);
