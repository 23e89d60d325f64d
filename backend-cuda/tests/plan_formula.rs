//! The device loop's schedule is the core's: the generated step formula
//! and walk ([`plan_test_source`], the same C++ the device loop is made
//! of), compiled as host C++, against `ringcc_core`'s `Plan` (every step:
//! primitive, loop, index, chunk, offsets, count) and `Machine` (every
//! slice: the same plus the slice number and the FIFO steps it receives
//! at and sends to), for generated collectives, rank counts, ranks, rings
//! (in order and permuted), roots, counts, types, channels, chunk and
//! FIFO geometries and starting counters. Also: the structures' layout
//! equals the Rust mirrors'. Needs `c++`; says it skipped otherwise.

mod common;

use std::sync::OnceLock;

use proptest::prelude::*;
use ringcc_core::fifo::FifoGeometry;
use ringcc_core::{
    Action, Blocked, Call, ChannelId, Collective, DataType, LinkState, Machine, Plan, Rank,
    ReduceOp, RingIndex, RingOrder,
};
use ringcc_cuda::device_loop::abi::{RcChan, RcExec, RcLoopArgs, RcPlan, RcStatus, RcStep};
use ringcc_cuda::device_loop::rc_plan;
use ringcc_cuda::kernel::plan_test_source;

type StepFn = unsafe extern "C" fn(*const RcPlan, u64, u32, *mut RcStep);
type LoopsFn = unsafe extern "C" fn(*const RcPlan) -> u64;
type SplFn = unsafe extern "C" fn(*const RcPlan) -> u32;
type WalkFn = unsafe extern "C" fn(*const RcPlan, u64, u64, *mut RcExec, u64) -> u64;
type AbiFn = unsafe extern "C" fn(*mut u64, u64) -> u64;

struct Formula {
    step: StepFn,
    loops: LoopsFn,
    spl: SplFn,
    walk: WalkFn,
    abi: AbiFn,
    _lib: libloading::Library,
}

fn formula() -> Option<&'static Formula> {
    static F: OnceLock<Option<Formula>> = OnceLock::new();
    F.get_or_init(|| {
        let lib = common::build("plan-formula", &[("plan".into(), plan_test_source())])?;
        // SAFETY: the symbols are the `rc_test_*` entry points of
        // plan_test_source, with exactly these signatures.
        unsafe {
            Some(Formula {
                step: *lib.get::<StepFn>(b"rc_test_plan_step").unwrap(),
                loops: *lib.get::<LoopsFn>(b"rc_test_plan_loops").unwrap(),
                spl: *lib.get::<SplFn>(b"rc_test_plan_steps_per_loop").unwrap(),
                walk: *lib.get::<WalkFn>(b"rc_test_plan_walk").unwrap(),
                abi: *lib.get::<AbiFn>(b"rc_test_abi").unwrap(),
                _lib: lib,
            })
        }
    })
    .as_ref()
}

/// A ring in any order: `order[i]` is the rank at ring index `i`.
#[derive(Clone, Debug)]
struct Perm {
    order: Vec<u32>,
}

impl RingOrder for Perm {
    fn ranks(&self) -> u32 {
        self.order.len() as u32
    }
    fn rank_at(&self, index: RingIndex) -> Result<Rank, ringcc_core::Error> {
        self.order
            .get(index.0 as usize)
            .map(|&r| Rank(r))
            .ok_or(ringcc_core::Error::BadTopology)
    }
    fn index_of(&self, rank: Rank) -> Result<RingIndex, ringcc_core::Error> {
        self.order
            .iter()
            .position(|&r| r == rank.0)
            .map(|i| RingIndex(i as u32))
            .ok_or(ringcc_core::Error::BadTopology)
    }
}

#[derive(Clone, Debug)]
struct Case {
    call: Call,
    ranks: u32,
    rank: u32,
    ring: Perm,
    channels: u32,
    geometry: FifoGeometry,
    chunk_bytes: u64,
    recv0: u64,
    send0: u64,
}

impl Case {
    fn plan(&self) -> Plan {
        self.call
            .plan(self.ranks, self.channels, self.chunk_bytes)
            .unwrap()
    }

    /// The formula's input for `channel`, with the ring's order.
    fn rc_plan(&self, channel: u32) -> RcPlan {
        let plan = self.plan();
        let mut p = rc_plan(&plan, self.geometry, ChannelId(channel as u8), Rank(0));
        p.ring = self.ring.order.as_ptr();
        p.ring_index = self.ring.index_of(Rank(self.rank)).unwrap().0;
        if let Some(root) = self.call.collective.root() {
            p.root_index = self.ring.index_of(root).unwrap().0;
        }
        p
    }
}

fn collective(kind: u8, root: u32) -> Collective {
    match kind {
        0 => Collective::AllReduce,
        1 => Collective::ReduceScatter,
        2 => Collective::AllGather,
        3 => Collective::Broadcast { root: Rank(root) },
        _ => Collective::Reduce { root: Rank(root) },
    }
}

/// Cases whose chunks fit the FIFO (what `Machine::new` accepts), with
/// counts up to `max_count`.
fn cases(max_count: u64) -> impl Strategy<Value = Case> {
    (
        (0u8..5, 1u32..=9, any::<u32>(), any::<u32>(), any::<bool>()),
        (0..DataType::ALL.len(), 0..=max_count, 1u32..=9),
        (
            1u64..=16,
            prop::sample::select(vec![1u64, 2, 4]),
            any::<u64>(),
        ),
        (0u64..1 << 40, 0u64..1 << 40, any::<u64>()),
    )
        .prop_map(
            |(
                (kind, ranks, rank, root, shuffle),
                (t, count, channels),
                (slot16, sps, ck),
                (r0, s0, seed),
            )| {
                let dtype = DataType::ALL[t];
                let elem = u64::from(dtype.size());
                let geometry = FifoGeometry::new(16 * slot16, sps).unwrap();
                let max_elems = (geometry.max_chunk_bytes() / elem).max(1);
                let chunk_bytes = elem * (1 + ck % max_elems);
                let mut order: Vec<u32> = (0..ranks).collect();
                if shuffle {
                    // Fisher-Yates with a small LCG from the seed.
                    let mut x = seed | 1;
                    for i in (1..order.len()).rev() {
                        x = x
                            .wrapping_mul(6364136223846793005)
                            .wrapping_add(1442695040888963407);
                        order.swap(i, (x >> 33) as usize % (i + 1));
                    }
                }
                let channels = channels.min(if count > 1000 { 9 } else { 64 });
                Case {
                    call: Call::new(collective(kind, root % ranks), count, dtype, ReduceOp::Sum),
                    ranks,
                    rank: rank % ranks,
                    ring: Perm { order },
                    channels,
                    geometry,
                    chunk_bytes,
                    recv0: r0,
                    send0: s0,
                }
            },
        )
}

/// Every step of every channel equals the core's, up to `limit` steps a
/// channel; the loop count and steps per loop too.
fn check_steps(f: &Formula, c: &Case, limit: usize) -> Result<(), TestCaseError> {
    let plan = c.plan();
    for ch in 0..c.channels {
        let p = c.rc_plan(ch);
        // SAFETY: `p` is a valid rc_plan whose ring has `ranks` entries.
        let (loops, spl) = unsafe { ((f.loops)(&p), (f.spl)(&p)) };
        prop_assert_eq!(loops, plan.loops(ChannelId(ch as u8)).unwrap());
        prop_assert_eq!(spl, plan.steps_per_loop());
        let steps = plan
            .steps(ChannelId(ch as u8), Rank(c.rank), &c.ring)
            .unwrap();
        for want in steps.take(limit) {
            let mut got = RcStep::default();
            // SAFETY: as above; `got` is valid for a write.
            unsafe { (f.step)(&p, want.loop_index, want.index, &mut got) };
            let ctx = format!("channel {ch} loop {} step {}", want.loop_index, want.index);
            prop_assert_eq!(got.primitive, u32::from(want.primitive.bits()), "{}", ctx);
            prop_assert_eq!(got.loop_index, want.loop_index, "{}", ctx);
            prop_assert_eq!(got.index, want.index, "{}", ctx);
            prop_assert_eq!(got.chunk, want.chunk.0, "{}", ctx);
            prop_assert_eq!(got.input_offset, want.input_offset, "{}", ctx);
            prop_assert_eq!(got.output_offset, want.output_offset, "{}", ctx);
            prop_assert_eq!(got.count, want.count, "{}", ctx);
        }
    }
    Ok(())
}

/// The core machine's execs for one (channel, rank), fed with data and
/// credit as soon as it waits, from counters `recv0` / `send0`; at most
/// `limit`.
fn machine_execs(c: &Case, ch: u32, limit: usize) -> Vec<ringcc_core::Exec> {
    let plan = c.plan();
    let steps = plan
        .steps(ChannelId(ch as u8), Rank(c.rank), &c.ring)
        .unwrap();
    let desc = c.call.desc(0);
    let link = LinkState {
        recv_tail: c.recv0,
        recv_next: c.recv0,
        send_head: c.send0,
        send_next: c.send0,
        early_header: None,
    };
    let mut m = Machine::new(desc, steps, c.geometry, link).unwrap();
    m.handle_header(c.recv0, desc).unwrap();
    let mut out = Vec::new();
    while out.len() < limit {
        match m.poll_action().unwrap() {
            Some(Action::Exec(x)) => {
                out.push(x);
                m.handle_exec_done().unwrap();
            }
            Some(Action::ReturnCredit { .. }) => {}
            Some(Action::Done) => break,
            None => match m.blocked_on() {
                Blocked::Data { need, .. } => m.handle_tail(need).unwrap(),
                Blocked::Credit { need, .. } => m.handle_head(need).unwrap(),
                other => panic!("machine blocked on {other}"),
            },
        }
    }
    out
}

/// The walk's slices equal the machine's execs (up to `limit`), and the
/// walk has as many as the machine when the machine finished.
fn check_walk(f: &Formula, c: &Case, limit: usize) -> Result<(), TestCaseError> {
    for ch in 0..c.channels {
        let want = machine_execs(c, ch, limit);
        let p = c.rc_plan(ch);
        let mut got = vec![RcExec::default(); limit];
        // SAFETY: `got` has room for `limit` records; `p` is valid.
        let total = unsafe { (f.walk)(&p, c.recv0, c.send0, got.as_mut_ptr(), limit as u64) };
        if want.len() < limit {
            prop_assert_eq!(total, want.len() as u64, "channel {}: slices", ch);
        } else {
            prop_assert!(total >= limit as u64, "channel {}: {} slices", ch, total);
        }
        for (i, (w, g)) in want.iter().zip(&got).enumerate() {
            let ctx = format!("channel {ch} slice #{i}: {w:?} vs {g:?}");
            prop_assert_eq!(g.primitive, u32::from(w.primitive.bits()), "{}", ctx);
            prop_assert_eq!(g.loop_index, w.loop_index, "{}", ctx);
            prop_assert_eq!(g.step_index, w.step_index, "{}", ctx);
            prop_assert_eq!(g.slice, w.slice, "{}", ctx);
            prop_assert_eq!(g.input_offset, w.input_offset, "{}", ctx);
            prop_assert_eq!(g.output_offset, w.output_offset, "{}", ctx);
            prop_assert_eq!(g.count, w.count, "{}", ctx);
            if let Some(r) = w.recv {
                prop_assert_eq!(g.recv_step, r.step, "{}", ctx);
                prop_assert_eq!(r.slots, c.geometry.slots_per_slice(), "{}", ctx);
            }
            if let Some(s) = w.send {
                prop_assert_eq!(g.send_step, s.step, "{}", ctx);
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 600, ..ProptestConfig::default() })]

    /// Every step, every channel, small and medium counts.
    #[test]
    fn the_step_formula_is_the_core_plan(c in cases(5000)) {
        let Some(f) = formula() else { return Ok(()) };
        check_steps(f, &c, usize::MAX)?;
    }

    /// Every slice of every channel: the walk is the core machine's.
    #[test]
    fn the_walk_is_the_core_machine(c in cases(3000)) {
        let Some(f) = formula() else { return Ok(()) };
        check_walk(f, &c, 1 << 16)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// Counts up to the largest a plan accepts: the loop count for every
    /// channel, the first steps and slices of each (saturating offsets,
    /// clamped last chunks far from zero).
    #[test]
    fn huge_counts(c in cases(u64::MAX)) {
        let Some(f) = formula() else { return Ok(()) };
        let elem = u64::from(c.call.dtype.size());
        let blocks = if matches!(c.call.collective, Collective::ReduceScatter | Collective::AllGather) {
            u64::from(c.ranks)
        } else {
            1
        };
        let c = Case {
            call: Call { count: c.call.count / elem / blocks, ..c.call },
            ..c
        };
        check_steps(f, &c, 300)?;
        check_walk(f, &c, 300)?;
    }
}

/// Sizes and offsets of every shared structure, as the C++ compiler lays
/// them out, equal the Rust mirrors'.
#[test]
fn shared_structures_have_one_layout() {
    let Some(f) = formula() else { return };
    let mut got = [0u64; 32];
    // SAFETY: `got` has room for 32 words.
    let n = unsafe { (f.abi)(got.as_mut_ptr(), got.len() as u64) } as usize;
    use std::mem::{offset_of, size_of};
    let want = [
        size_of::<RcPlan>(),
        offset_of!(RcPlan, ring),
        offset_of!(RcPlan, collective),
        offset_of!(RcPlan, slots_per_slice),
        size_of::<RcStep>(),
        offset_of!(RcStep, count),
        offset_of!(RcStep, primitive),
        size_of::<RcExec>(),
        offset_of!(RcExec, send_step),
        offset_of!(RcExec, primitive),
        size_of::<RcChan>(),
        offset_of!(RcChan, state),
        offset_of!(RcChan, send_fifo),
        offset_of!(RcChan, slot_bytes),
        size_of::<RcStatus>(),
        offset_of!(RcStatus, need),
        offset_of!(RcStatus, got_desc),
        offset_of!(RcStatus, send_next),
        size_of::<RcLoopArgs>(),
        offset_of!(RcLoopArgs, ring),
        offset_of!(RcLoopArgs, desc),
        offset_of!(RcLoopArgs, collective),
        offset_of!(RcLoopArgs, slots_per_slice),
    ]
    .map(|v| v as u64);
    assert_eq!(&got[..n], &want[..]);
}

/// A few fixed cases, so a failure names a familiar shape: NCCL's
/// geometry, 2 and 4 ranks, every collective.
#[test]
fn familiar_shapes() {
    let Some(f) = formula() else { return };
    for kind in 0..5 {
        for ranks in [2u32, 4] {
            for rank in 0..ranks {
                let c = Case {
                    call: Call::new(collective(kind, 1), 1 << 20, DataType::F32, ReduceOp::Sum),
                    ranks,
                    rank,
                    ring: Perm {
                        order: (0..ranks).collect(),
                    },
                    channels: 2,
                    geometry: FifoGeometry::NCCL,
                    chunk_bytes: 2 << 20,
                    recv0: 0,
                    send0: 0,
                };
                check_steps(f, &c, usize::MAX).unwrap();
                check_walk(f, &c, 1 << 16).unwrap();
            }
        }
    }
}
