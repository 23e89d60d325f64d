//! Nanoseconds per plan step, and per state-machine slice.
//!
//! `cargo bench -p ringcc-core --bench plan`

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use ringcc_core::fifo::FifoGeometry;
use ringcc_core::prim::{Action, LinkState, Machine};
use ringcc_core::topology::Topology;
use ringcc_core::{CallDesc, ChannelId, Collective, DataType, Plan, Rank, ReduceOp};
use std::hint::black_box;

fn steps(c: &mut Criterion) {
    // 1024 ranks (128 nodes x 8 GPUs, cross-NIC rings), 1 GiB of f32.
    let topo = Topology::<1024>::uniform(128, 8, 8)
        .unwrap()
        .with_cross_nic(true);
    let ring = topo.ring(ChannelId(5)).unwrap();
    let plan = Plan::new(
        Collective::AllReduce,
        1 << 28,
        DataType::F32,
        1024,
        16,
        1 << 16,
    )
    .unwrap();
    let total = plan.total_steps(ChannelId(5)).unwrap();
    let mut g = c.benchmark_group("plan");
    g.throughput(Throughput::Elements(total));
    g.bench_function("allreduce_1024_ranks_steps", |b| {
        b.iter(|| {
            let mut acc = 0u64;
            for s in plan.steps(ChannelId(5), Rank(517), ring).unwrap() {
                acc = acc.wrapping_add(s.input_offset ^ s.count ^ u64::from(s.chunk.0));
            }
            black_box(acc)
        })
    });
    // The same number of iterations of a loop that only advances an
    // offset and folds it in: the floor any step iterator sits on, measured
    // in the same run so the ratio survives a noisy machine.
    g.bench_function("reference_loop_same_count", |b| {
        b.iter(|| {
            let mut acc = 0u64;
            let mut off = 0u64;
            for i in 0..black_box(total) {
                off = off.wrapping_add(black_box(1 << 14));
                acc = acc.wrapping_add(off ^ i);
            }
            black_box(acc)
        })
    });
    let rs = Plan::new(
        Collective::ReduceScatter,
        1 << 18,
        DataType::F32,
        1024,
        16,
        1 << 16,
    )
    .unwrap();
    g.throughput(Throughput::Elements(rs.total_steps(ChannelId(5)).unwrap()));
    g.bench_function("reducescatter_1024_ranks_steps", |b| {
        b.iter(|| {
            let mut acc = 0u64;
            for s in rs.steps(ChannelId(5), Rank(517), ring).unwrap() {
                acc = acc.wrapping_add(s.input_offset ^ s.count);
            }
            black_box(acc)
        })
    });
    g.finish();
}

/// A machine walking its plan with data and credit always available: the
/// core's cost per slice exec, as a backend pays it.
fn machine(c: &mut Criterion) {
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
    let call = CallDesc::new(
        0,
        Collective::AllReduce,
        1 << 24,
        DataType::F32,
        ReduceOp::Sum,
    );
    let geometry = FifoGeometry::new(1 << 14, 2).unwrap();
    let slices = plan.total_steps(ChannelId(0)).unwrap() * 2;
    let mut g = c.benchmark_group("machine");
    g.throughput(Throughput::Elements(slices));
    g.bench_function("allreduce_64_ranks_slices", |b| {
        b.iter(|| {
            let steps = plan.steps(ChannelId(0), Rank(9), ring).unwrap();
            let mut m = Machine::new(call, steps, geometry, LinkState::default()).unwrap();
            let mut header = true;
            let mut n = 0u64;
            loop {
                match m.poll_action().unwrap() {
                    Some(Action::Exec(e)) => {
                        m.handle_exec_done().unwrap();
                        if let Some(s) = e.send {
                            m.handle_head(s.end()).unwrap();
                        }
                        n += 1;
                    }
                    Some(Action::ReturnCredit { head }) => {
                        black_box(head);
                    }
                    Some(Action::Done) => break,
                    None => {
                        // Data for the next receive "arrives".
                        let l = m.link();
                        if header && l.recv_tail == 0 {
                            m.handle_header(0, call).unwrap();
                            header = false;
                        }
                        m.handle_tail(l.recv_next + 8).unwrap();
                    }
                }
            }
            black_box(n)
        })
    });
    g.finish();
}

criterion_group!(benches, steps, machine);
criterion_main!(benches);
