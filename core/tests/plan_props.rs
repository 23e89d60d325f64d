//! Properties of collective plans over random rank counts, counts, types,
//! channels and chunk sizes (and ring orders, through cross-NIC
//! topologies).

use proptest::prelude::*;
use ringcc_core::topology::Topology;
use ringcc_core::{ChannelId, Collective, DataType, Plan, Primitive, Rank, Step};

const R: usize = 1024;

fn dtype() -> impl Strategy<Value = DataType> {
    prop::sample::select(DataType::ALL.to_vec())
}

fn collective(n: u32) -> impl Strategy<Value = Collective> {
    (0..5u8, 0..n).prop_map(|(k, root)| match k {
        0 => Collective::AllReduce,
        1 => Collective::ReduceScatter,
        2 => Collective::AllGather,
        3 => Collective::Broadcast { root: Rank(root) },
        _ => Collective::Reduce { root: Rank(root) },
    })
}

/// (nodes, gpus per node): n from 1 to 64, plus some large ones.
fn shape() -> impl Strategy<Value = (u32, u32)> {
    prop_oneof![
        8 => (1..=8u32, 1..=8u32),
        1 => Just((128u32, 8u32)),
        1 => Just((1u32, 300u32)),
    ]
}

#[derive(Debug, Clone)]
struct Case {
    nodes: u32,
    gpus: u32,
    cross_nic: bool,
    collective: Collective,
    count: u64,
    dtype: DataType,
    channels: u32,
    chunk_bytes: u64,
}

fn case() -> impl Strategy<Value = Case> {
    (shape(), any::<bool>()).prop_flat_map(|((nodes, gpus), cross_nic)| {
        let n = nodes * gpus;
        (
            collective(n),
            prop_oneof![4 => 0..5000u64, 1 => 0..200_000u64],
            dtype(),
            1..=8u32,
            1..=64u64,
        )
            .prop_map(
                move |(collective, count, dtype, channels, chunk_units)| Case {
                    nodes,
                    gpus,
                    cross_nic,
                    collective,
                    count,
                    dtype,
                    channels,
                    chunk_bytes: chunk_units * 16 * u64::from(dtype.size()),
                },
            )
    })
}

fn topo(c: &Case) -> Topology<R> {
    Topology::<R>::uniform(c.nodes, c.gpus, 2)
        .unwrap()
        .with_cross_nic(c.cross_nic)
}

fn plan(c: &Case) -> Plan {
    Plan::new(
        c.collective,
        c.count,
        c.dtype,
        c.nodes * c.gpus,
        c.channels,
        c.chunk_bytes,
    )
    .unwrap()
}

/// The element range a step's message carries, in the coordinates both
/// ends agree on (the region of the user buffer it belongs to).
fn region(p: &Plan, s: &Step) -> (u32, u64, u64) {
    let off = match p.collective() {
        Collective::AllGather => s.output_offset,
        _ => s.input_offset,
    };
    (s.chunk.0, off, s.count)
}

fn expected_primitives(p: &Plan, ring_index: u32, root_index: u32) -> Vec<Primitive> {
    let n = p.ranks();
    if n == 1 {
        return vec![Primitive::COPY_ONLY];
    }
    let middle = |k: u32, prim: Primitive| std::iter::repeat_n(prim, k as usize);
    match p.collective() {
        Collective::AllReduce => std::iter::once(Primitive::SEND_ONLY)
            .chain(middle(n - 2, Primitive::RECV_REDUCE_SEND))
            .chain([Primitive::RECV_REDUCE_COPY_SEND])
            .chain(middle(n - 2, Primitive::RECV_COPY_SEND))
            .chain([Primitive::RECV_ONLY])
            .collect(),
        Collective::ReduceScatter => std::iter::once(Primitive::SEND_ONLY)
            .chain(middle(n - 2, Primitive::RECV_REDUCE_SEND))
            .chain([Primitive::RECV_REDUCE_COPY])
            .collect(),
        Collective::AllGather => std::iter::once(Primitive::COPY_SEND)
            .chain(middle(n - 2, Primitive::RECV_COPY_SEND))
            .chain([Primitive::RECV_ONLY])
            .collect(),
        Collective::Broadcast { .. } => {
            let pos = (ring_index + n - root_index) % n;
            vec![if pos == 0 {
                Primitive::COPY_SEND
            } else if pos == n - 1 {
                Primitive::RECV_ONLY
            } else {
                Primitive::RECV_COPY_SEND
            }]
        }
        Collective::Reduce { .. } => {
            let pos = (ring_index + 2 * n - root_index - 1) % n;
            vec![if pos == 0 {
                Primitive::SEND_ONLY
            } else if pos == n - 1 {
                Primitive::RECV_REDUCE_COPY
            } else {
                Primitive::RECV_REDUCE_SEND
            }]
        }
    }
}

/// Marks `[off, off+len)` of `cover` once; fails on out of bounds or overlap.
fn mark(cover: &mut [u8], off: u64, len: u64, what: &str) -> Result<(), TestCaseError> {
    let end = off
        .checked_add(len)
        .ok_or_else(|| TestCaseError::fail("offset overflow"))?;
    prop_assert!(
        end as usize <= cover.len(),
        "{what}: [{off}, {end}) out of bounds {}",
        cover.len()
    );
    for c in &mut cover[off as usize..end as usize] {
        prop_assert_eq!(*c, 0, "{} covers an element twice", what);
        *c = 1;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 192, .. ProptestConfig::default() })]

    /// Every rank walks the primitive table; every rank takes the same
    /// number of steps; step k of loop l has index k.
    #[test]
    fn primitive_sequences_follow_the_table(c in case()) {
        let t = topo(&c);
        let p = plan(&c);
        let n = p.ranks();
        for ch in 0..c.channels {
            let ring = t.ring(ChannelId(ch as u8)).unwrap();
            let root_index = c.collective.root().map(|r| ring.index_of(r).unwrap().0).unwrap_or(0);
            let total = p.total_steps(ChannelId(ch as u8)).unwrap();
            // Large rings: check a sample of ranks.
            let ranks: Vec<u32> = if n > 64 { vec![0, 1, n / 2, n - 1] } else { (0..n).collect() };
            for r in ranks {
                let idx = ring.index_of(Rank(r)).unwrap().0;
                let want = expected_primitives(&p, idx, root_index);
                let steps: Vec<Step> = p.steps(ChannelId(ch as u8), Rank(r), ring).unwrap().collect();
                prop_assert_eq!(steps.len() as u64, total);
                for (k, s) in steps.iter().enumerate() {
                    let i = k % want.len();
                    prop_assert_eq!(s.primitive, want[i], "rank {} step {}", r, k);
                    prop_assert_eq!(s.index as usize, i);
                    prop_assert_eq!(s.loop_index as usize, k / want.len());
                    // The table's chunk: (r − s − 1) mod n, AllGather (r − s) mod n.
                    let (n64, r64, s64) = (u64::from(n), u64::from(idx), i as u64);
                    let want_chunk = match c.collective {
                        _ if n == 1 => 0,
                        Collective::AllReduce | Collective::ReduceScatter => (r64 + 3 * n64 - s64 - 1) % n64,
                        Collective::AllGather => (r64 + 3 * n64 - s64) % n64,
                        _ => 0,
                    };
                    prop_assert_eq!(u64::from(s.chunk.0), want_chunk);
                }
            }
        }
    }

    /// A rank that receives at all receives at its last step: so after
    /// any receiving step with steps left, another receive comes, and the
    /// credit now due is covered by a later one of the same call (what
    /// `Machine::receives_ahead` promises a transport that holds credit
    /// back).
    #[test]
    fn a_rank_that_receives_receives_last(c in case()) {
        let t = topo(&c);
        let p = plan(&c);
        let n = p.ranks();
        for ch in 0..c.channels {
            let ring = t.ring(ChannelId(ch as u8)).unwrap();
            let ranks: Vec<u32> = if n > 64 { vec![0, 1, n / 2, n - 1] } else { (0..n).collect() };
            for r in ranks {
                let steps: Vec<Step> = p.steps(ChannelId(ch as u8), Rank(r), ring).unwrap().collect();
                let receives = steps.iter().any(|s| s.primitive.contains(Primitive::RECV));
                if let (true, Some(last)) = (receives, steps.last()) {
                    prop_assert!(last.primitive.contains(Primitive::RECV),
                        "rank {} channel {}: last step {:?}", r, ch, last.primitive);
                }
            }
        }
    }

    /// What rank r sends as its k-th message, next(r) receives as its k-th:
    /// same chunk, same region, same length — and for the ring collectives
    /// at the next step of the same loop.
    #[test]
    fn sends_match_the_successors_receives(c in case()) {
        let t = topo(&c);
        let p = plan(&c);
        let n = p.ranks();
        prop_assume!(n <= 64);
        for ch in 0..c.channels {
            let ring = t.ring(ChannelId(ch as u8)).unwrap();
            for r in 0..n {
                let next = ring.next(Rank(r)).unwrap();
                let sends: Vec<Step> = p.steps(ChannelId(ch as u8), Rank(r), ring).unwrap()
                    .filter(|s| s.primitive.contains(Primitive::SEND)).collect();
                let recvs: Vec<Step> = p.steps(ChannelId(ch as u8), next, ring).unwrap()
                    .filter(|s| s.primitive.contains(Primitive::RECV)).collect();
                prop_assert_eq!(sends.len(), recvs.len());
                for (s, v) in sends.iter().zip(&recvs) {
                    prop_assert_eq!(region(&p, s), region(&p, v));
                    prop_assert_eq!(s.loop_index, v.loop_index);
                    if !matches!(c.collective, Collective::Broadcast { .. } | Collective::Reduce { .. }) {
                        prop_assert_eq!(s.index + 1, v.index);
                    }
                }
            }
        }
    }

    /// Every rank's output is written exactly once, its input read exactly
    /// once per phase, never out of bounds.
    #[test]
    fn chunks_cover_the_buffers_exactly_once(c in case()) {
        let t = topo(&c);
        let p = plan(&c);
        let n = p.ranks();
        prop_assume!(p.input_len().max(p.output_len()) <= 2_000_000);
        let ranks: Vec<u32> = if n > 16 { vec![0, n / 3, n - 1] } else { (0..n).collect() };
        for r in ranks {
            let mut out = vec![0u8; p.output_len() as usize];
            let mut inp = vec![0u8; p.input_len() as usize];
            for ch in 0..c.channels {
                let ring = t.ring(ChannelId(ch as u8)).unwrap();
                for s in p.steps(ChannelId(ch as u8), Rank(r), ring).unwrap() {
                    if s.primitive.contains(Primitive::COPY) {
                        mark(&mut out, s.output_offset, s.count, "output")?;
                    }
                    if s.primitive.reads_input() {
                        // AllReduce reads each input chunk once while
                        // reducing; its AllGather half reads no input.
                        mark(&mut inp, s.input_offset, s.count, "input")?;
                    }
                }
            }
            let writes_output = match c.collective {
                Collective::Reduce { root } => root.0 == r,
                _ => true,
            };
            if writes_output {
                prop_assert!(out.iter().all(|&v| v == 1), "output not fully written on rank {}", r);
            } else {
                prop_assert!(out.iter().all(|&v| v == 0));
            }
            let reads_input = match c.collective {
                Collective::Broadcast { root } => root.0 == r,
                _ => true,
            };
            prop_assert!(inp.iter().all(|&v| v == u8::from(reads_input)), "input coverage on rank {}", r);
        }
    }

    /// AllReduce moves 2·S·(n−1)/n per rank, up to the slack of the last
    /// loop's aligned chunks; exactly when the count divides evenly.
    #[test]
    fn allreduce_bytes_per_rank(c in case()) {
        let c = Case { collective: Collective::AllReduce, ..c };
        let t = topo(&c);
        let p = plan(&c);
        let n = u64::from(p.ranks());
        prop_assume!(n > 1 && n <= 64);
        let e = u64::from(c.dtype.size());
        let s_bytes = c.count * e;
        let ideal = 2.0 * s_bytes as f64 * (n - 1) as f64 / n as f64;
        // Per channel, the last loop's chunks are at most
        // align_up(ceil(len/n), 16 B): the two chunks a rank does not send
        // account for the deviation.
        let per_channel = (c.count.div_ceil(u64::from(c.channels))).div_ceil(n) * e + 16;
        let slack = (2 * u64::from(c.channels) * per_channel) as f64;
        for r in 0..p.ranks() {
            let mut sent = 0u64;
            for ch in 0..c.channels {
                let ring = t.ring(ChannelId(ch as u8)).unwrap();
                sent += p.steps(ChannelId(ch as u8), Rank(r), ring).unwrap()
                    .filter(|s| s.primitive.contains(Primitive::SEND))
                    .map(|s| s.count * e).sum::<u64>();
            }
            prop_assert!((sent as f64 - ideal).abs() <= slack, "rank {} sent {} ideal {} slack {}", r, sent, ideal, slack);
            let even = 16 * n * u64::from(c.channels) * p.chunk_elems();
            if c.count > 0 && c.count.is_multiple_of(even) {
                prop_assert_eq!(sent as f64, ideal);
            }
        }
    }
}

#[test]
fn edge_cases_are_defined() {
    use ringcc_core::Error;
    let ar = Collective::AllReduce;
    // n = 1: one copy per loop.
    let p = Plan::new(ar, 10, DataType::F32, 1, 1, 16).unwrap();
    let steps: Vec<Step> = p
        .steps(ChannelId(0), Rank(0), ringcc_core::InOrderRing { ranks: 1 })
        .unwrap()
        .collect();
    assert_eq!(steps.len(), 3);
    assert!(steps.iter().all(|s| s.primitive == Primitive::COPY_ONLY));
    assert_eq!(steps.iter().map(|s| s.count).sum::<u64>(), 10);
    // count = 0: one loop of empty steps on every channel.
    let p = Plan::new(ar, 0, DataType::F32, 4, 3, 64).unwrap();
    for ch in 0..3 {
        let steps: Vec<Step> = p
            .steps(
                ChannelId(ch),
                Rank(1),
                ringcc_core::InOrderRing { ranks: 4 },
            )
            .unwrap()
            .collect();
        assert_eq!(steps.len(), 7);
        assert!(steps.iter().all(|s| s.count == 0));
    }
    // count < n: trailing chunks are empty but take their step.
    let p = Plan::new(ar, 2, DataType::F64, 8, 1, 64).unwrap();
    let steps: Vec<Step> = p
        .steps(ChannelId(0), Rank(0), ringcc_core::InOrderRing { ranks: 8 })
        .unwrap()
        .collect();
    assert_eq!(steps.len(), 15);
    assert!(steps.iter().any(|s| s.count == 0));
    // Chunk not a multiple of the element size; zero chunk; channels.
    assert_eq!(
        Plan::new(ar, 10, DataType::F32, 2, 1, 6),
        Err(Error::BadChunk {
            chunk_bytes: 6,
            elem_size: 4
        })
    );
    assert!(matches!(
        Plan::new(ar, 10, DataType::F32, 2, 1, 0),
        Err(Error::BadChunk { .. })
    ));
    assert_eq!(
        Plan::new(ar, 10, DataType::F32, 2, 0, 16),
        Err(Error::BadChannel { channel: 0 })
    );
    assert_eq!(
        Plan::new(ar, 10, DataType::F32, 2, 65, 16),
        Err(Error::BadChannel { channel: 65 })
    );
    assert_eq!(
        Plan::new(ar, 10, DataType::F32, 0, 1, 16),
        Err(Error::NoRanks)
    );
    assert_eq!(
        Plan::new(
            Collective::Broadcast { root: Rank(4) },
            10,
            DataType::F32,
            4,
            1,
            16
        ),
        Err(Error::RankOutOfRange { rank: 4, ranks: 4 })
    );
    // Counts near the u64 limit: bytes must fit; the largest that fits
    // plans without overflow, and its steps stay in bounds.
    assert_eq!(
        Plan::new(ar, u64::MAX, DataType::F32, 4, 1, 16),
        Err(Error::CountOverflow)
    );
    assert_eq!(
        Plan::new(Collective::AllGather, u64::MAX / 2, DataType::U8, 4, 1, 16),
        Err(Error::CountOverflow)
    );
    let big = u64::MAX / 8;
    let p = Plan::new(ar, big, DataType::F64, 3, 64, 1 << 20).unwrap();
    let mut steps = p
        .steps(
            ChannelId(63),
            Rank(2),
            ringcc_core::InOrderRing { ranks: 3 },
        )
        .unwrap();
    assert!(steps.remaining() > 0);
    let range = p.channel_range(ChannelId(63)).unwrap();
    for s in steps.by_ref().take(1000) {
        assert!(s.input_offset >= range.start && s.input_offset + s.count <= range.end);
    }
    let p = Plan::new(ar, u64::MAX, DataType::U8, 2, 64, 16).unwrap();
    let range = p.channel_range(ChannelId(63)).unwrap();
    assert_eq!(range.end, u64::MAX);
    let last = p
        .steps(
            ChannelId(63),
            Rank(1),
            ringcc_core::InOrderRing { ranks: 2 },
        )
        .unwrap();
    assert!(last.remaining() > 0);
}

/// Buffers that end at the very top of the u64 range: every chunk stays in
/// bounds and the chunks of a loop tile the loop exactly.
#[test]
fn chunks_at_the_end_of_the_u64_range() {
    // One loop per channel (the chunk is as large as it gets); channel 1
    // ends at u64::MAX, where ls + (n−1)·lc overflows before clamping.
    for (n, ch) in [(2u32, 0u8), (2, 1), (3, 1), (7, 1), (13, 1)] {
        let p = Plan::new(
            Collective::AllReduce,
            u64::MAX,
            DataType::U8,
            n,
            2,
            u64::MAX,
        )
        .unwrap();
        let range = p.channel_range(ChannelId(ch)).unwrap();
        let steps = p
            .steps(
                ChannelId(ch),
                Rank(1),
                ringcc_core::InOrderRing { ranks: n },
            )
            .unwrap();
        let mut seen: Vec<(u64, u64)> = steps
            .take(p.steps_per_loop() as usize)
            .filter(|s| {
                s.primitive.contains(Primitive::SEND) || s.primitive.contains(Primitive::COPY)
            })
            .map(|s| (s.input_offset, s.count))
            .collect();
        seen.sort_unstable();
        seen.dedup();
        for (off, count) in &seen {
            assert!(
                *off >= range.start && off.checked_add(*count).is_some_and(|e| e <= range.end),
                "{off} {count}"
            );
        }
        // Non-empty chunks are contiguous from the loop start.
        let mut at = range.start;
        for (off, count) in seen.iter().filter(|(_, c)| *c > 0) {
            assert_eq!(*off, at, "n {n}");
            at += count;
        }
    }
}

/// An AllReduce on `n` ranks whose channel 1 ends at u64::MAX, in two
/// loops: the first takes `n·c` elements, the second the `r` (5..5+n) left
/// over, so small that `loop start + (n−1)·chunk` overflows. Returns the
/// plan, channel 1's range and `r`.
fn two_loops_at_the_top(n: u32) -> (Plan, std::ops::Range<u64>, u64) {
    let probe = Plan::new(Collective::AllReduce, u64::MAX, DataType::U8, n, 2, 16).unwrap();
    let range = probe.channel_range(ChannelId(1)).unwrap();
    let len = range.end - range.start;
    let r = (5..5 + u64::from(n))
        .find(|r| (len - r).is_multiple_of(u64::from(n)))
        .unwrap();
    let c = (len - r) / u64::from(n);
    let p = Plan::new(Collective::AllReduce, u64::MAX, DataType::U8, n, 2, c).unwrap();
    assert_eq!(p.loops(ChannelId(1)).unwrap(), 2);
    (p, range, r)
}

/// The last loop of a channel that ends at u64::MAX, with a remainder so
/// small that `loop start + (n−1)·chunk` overflows before clamping: its
/// chunks still tile the remainder exactly.
#[test]
fn last_loop_at_the_top_of_the_u64_range() {
    let n = 3u32;
    let (p, range, r) = two_loops_at_the_top(n);
    let spl = p.steps_per_loop() as usize;
    let mut last: Vec<(u64, u64)> = p
        .steps(ChannelId(1), Rank(0), ringcc_core::InOrderRing { ranks: n })
        .unwrap()
        .skip(spl)
        .map(|s| (s.input_offset, s.count))
        .collect();
    last.sort_unstable();
    last.dedup();
    let mut at = range.end - r;
    for (off, count) in last.iter().filter(|(_, c)| *c > 0) {
        assert_eq!(*off, at);
        at += count;
    }
    assert_eq!(at, range.end);
}

/// The primitive table and chunk formula on the general (non-incremental)
/// path too: the last loop of a channel that ends at the top of the u64
/// range, where `loop start + (n−1)·chunk` overflows, walks DESIGN.md's
/// table step by step on every rank.
#[test]
fn the_table_holds_where_offsets_reach_the_top_of_the_u64_range() {
    for n in [2u32, 3, 4, 7] {
        let (p, _, _) = two_loops_at_the_top(n);
        let spl = p.steps_per_loop() as usize;
        for rank in 0..n {
            let steps: Vec<Step> = p
                .steps(
                    ChannelId(1),
                    Rank(rank),
                    ringcc_core::InOrderRing { ranks: n },
                )
                .unwrap()
                .skip(spl)
                .collect();
            assert_eq!(steps.len() as u32, 2 * n - 1);
            for (s, st) in steps.iter().enumerate() {
                let s = s as u32;
                let want = if s == 0 {
                    Primitive::SEND_ONLY
                } else if s < n - 1 {
                    Primitive::RECV_REDUCE_SEND
                } else if s == n - 1 {
                    Primitive::RECV_REDUCE_COPY_SEND
                } else if s < 2 * n - 2 {
                    Primitive::RECV_COPY_SEND
                } else {
                    Primitive::RECV_ONLY
                };
                assert_eq!(st.primitive, want, "n {n} rank {rank} step {s}");
                assert_eq!(
                    st.chunk.0,
                    (rank + 2 * n - s - 1) % n,
                    "n {n} rank {rank} step {s}"
                );
            }
        }
    }
}

/// `size_hint` is exact: the steps not yet yielded, as `remaining` says.
#[test]
fn size_hint_counts_the_steps_left() {
    let p = Plan::new(Collective::AllReduce, 100, DataType::F32, 3, 2, 16).unwrap();
    let mut steps = p
        .steps(ChannelId(1), Rank(2), ringcc_core::InOrderRing { ranks: 3 })
        .unwrap();
    let total = p.total_steps(ChannelId(1)).unwrap() as usize;
    assert!(total > 5);
    for left in (0..=total).rev() {
        assert_eq!(steps.size_hint(), (left, Some(left)));
        assert_eq!(steps.remaining(), left as u64);
        assert_eq!(steps.next().is_some(), left > 0);
    }
}
