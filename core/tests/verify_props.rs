//! The blocked, typed fills of `verify` against the element-by-element
//! definition they replaced (kept here as the oracle), and the reference
//! against the core's own kernels reducing the generated inputs in a
//! random order: the check stays exact in any reduction order.

use half::{bf16, f16};
use proptest::prelude::*;
use ringcc_core::reduce::{finalize, reduce_in_place, DataType, ReduceOp};
use ringcc_core::verify::{self, Elem, MAX_ELEM};
use ringcc_core::{Collective, Plan, Rank};

/// The original definitions, one element at a time, in i128.
mod oracle {
    use super::*;

    pub fn value(d: DataType, op: ReduceOp, ranks: u32, rank: u32, index: u64, salt: u64) -> i128 {
        let x = index
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
            .wrapping_add(u64::from(rank).wrapping_mul(0xc2b2_ae3d_27d4_eb4f))
            .wrapping_add(salt);
        let x = (x ^ (x >> 29)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        let r = x ^ (x >> 32);
        let pick = |m: u64, off: i128| i128::from(r % m) - off;
        match (d.is_float(), op) {
            (true, ReduceOp::Prod) => {
                let m = if ranks <= 12 { 3 } else { 2 };
                match r % m {
                    0 => 1,
                    1 => -1,
                    _ => 2,
                }
            }
            (true, _) => pick(7, 3),
            (false, ReduceOp::Prod) => pick(5, 2),
            (false, _) => pick(2001, 1000),
        }
    }

    pub fn encode(d: DataType, v: i128) -> Elem {
        let mut e = [0u8; MAX_ELEM];
        let b: Vec<u8> = match d {
            DataType::I8 => (v as i8).to_ne_bytes().to_vec(),
            DataType::U8 => (v as u8).to_ne_bytes().to_vec(),
            DataType::I32 => (v as i32).to_ne_bytes().to_vec(),
            DataType::U32 => (v as u32).to_ne_bytes().to_vec(),
            DataType::I64 => (v as i64).to_ne_bytes().to_vec(),
            DataType::U64 => (v as u64).to_ne_bytes().to_vec(),
            DataType::F16 => f16::from_f64(v as f64).to_ne_bytes().to_vec(),
            DataType::Bf16 => bf16::from_f64(v as f64).to_ne_bytes().to_vec(),
            DataType::F32 => (v as f32).to_ne_bytes().to_vec(),
            DataType::F64 => (v as f64).to_ne_bytes().to_vec(),
        };
        e[..b.len()].copy_from_slice(&b);
        e
    }

    fn wrapped(d: DataType, v: i128) -> i128 {
        let e = encode(d, v);
        let a4 = [e[0], e[1], e[2], e[3]];
        match d {
            DataType::I8 => i128::from(e[0] as i8),
            DataType::U8 => i128::from(e[0]),
            DataType::I32 => i128::from(i32::from_ne_bytes(a4)),
            DataType::U32 => i128::from(u32::from_ne_bytes(a4)),
            DataType::I64 => i128::from(i64::from_ne_bytes(e)),
            DataType::U64 => i128::from(u64::from_ne_bytes(e)),
            _ => v,
        }
    }

    pub fn reduced(d: DataType, op: ReduceOp, ranks: u32, index: u64, salt: u64) -> Elem {
        let mut acc: Option<i128> = None;
        for r in 0..ranks {
            let v = wrapped(d, value(d, op, ranks, r, index, salt));
            acc = Some(match acc {
                None => v,
                Some(a) => match op {
                    ReduceOp::Sum | ReduceOp::Avg => a.wrapping_add(v),
                    ReduceOp::Prod => wrapped(d, a.wrapping_mul(v)),
                    ReduceOp::Min => a.min(v),
                    ReduceOp::Max => a.max(v),
                },
            });
        }
        let v = acc.unwrap_or(0);
        if op != ReduceOp::Avg {
            return encode(d, v);
        }
        let w = wrapped(d, v);
        let n = i128::from(ranks.max(1));
        let fl = ranks.max(1) as f32;
        let mut e = [0u8; MAX_ELEM];
        let b: Vec<u8> = match d {
            DataType::F32 => ((w as f32) / fl).to_ne_bytes().to_vec(),
            DataType::F64 => ((w as f64) / f64::from(ranks.max(1)))
                .to_ne_bytes()
                .to_vec(),
            DataType::F16 => f16::from_f32((w as f32) / fl).to_ne_bytes().to_vec(),
            DataType::Bf16 => bf16::from_f32((w as f32) / fl).to_ne_bytes().to_vec(),
            _ => return encode(d, w / n),
        };
        e[..b.len()].copy_from_slice(&b);
        e
    }
}

fn dtype() -> impl Strategy<Value = DataType> {
    (0..DataType::ALL.len()).prop_map(|i| DataType::ALL[i])
}

fn op() -> impl Strategy<Value = ReduceOp> {
    (0..ReduceOp::ALL.len()).prop_map(|i| ReduceOp::ALL[i])
}

fn collective(root: u32) -> impl Strategy<Value = Collective> {
    prop_oneof![
        Just(Collective::AllReduce),
        Just(Collective::ReduceScatter),
        Just(Collective::AllGather),
        Just(Collective::Broadcast { root: Rank(root) }),
        Just(Collective::Reduce { root: Rank(root) }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn values_and_reductions_match_the_element_by_element_definition(
        d in dtype(), op in op(), ranks in 1u32..80, first in any::<u64>(),
        salt in any::<u64>(), len in 0usize..150,
    ) {
        let size = usize::from(d.size());
        let rank = (first as u32) % ranks;
        let mut vals = vec![0u8; len * size];
        verify::fill_values(d, op, ranks, rank, first, salt, &mut vals).unwrap();
        let mut red = vec![0u8; len * size];
        verify::fill_reduced(d, op, ranks, first, salt, &mut red).unwrap();
        for i in 0..len {
            let index = first.wrapping_add(i as u64);
            let v = oracle::value(d, op, ranks, rank, index, salt);
            prop_assert_eq!(verify::value(d, op, ranks, rank, index, salt), v);
            prop_assert_eq!(verify::encode(d, v), oracle::encode(d, v));
            prop_assert_eq!(&vals[i * size..][..size], &oracle::encode(d, v)[..size]);
            let want = oracle::reduced(d, op, ranks, index, salt);
            prop_assert_eq!(&red[i * size..][..size], &want[..size]);
            prop_assert_eq!(verify::reduced(d, op, ranks, index, salt), want);
        }
    }

    /// The reference is what the core's kernels make of the generated
    /// inputs, accumulated in a random order of ranks.
    #[test]
    fn the_reference_is_exact_in_any_reduction_order(
        d in dtype(), op in op(), ranks in 1u32..64, len in 1usize..200,
        salt in any::<u64>(), order in any::<u64>(),
    ) {
        let size = usize::from(d.size());
        let mut perm: Vec<u32> = (0..ranks).collect();
        let mut x = order | 1;
        for i in (1..perm.len()).rev() {
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
            perm.swap(i, (x % (i as u64 + 1)) as usize);
        }
        let mut acc = vec![0u8; len * size];
        verify::fill_values(d, op, ranks, perm[0], 0, salt, &mut acc).unwrap();
        let mut v = vec![0u8; len * size];
        for &r in &perm[1..] {
            verify::fill_values(d, op, ranks, r, 0, salt, &mut v).unwrap();
            reduce_in_place(d, op, &mut acc, &v).unwrap();
        }
        finalize(d, op, &mut acc, ranks).unwrap();
        let mut want = vec![0u8; len * size];
        verify::fill_reduced(d, op, ranks, 0, salt, &mut want).unwrap();
        prop_assert_eq!(verify::count_diff(&want, &acc, size), 0);
    }

    /// The blocked expected values and `count_wrong` agree with the
    /// element-by-element definition, and every corrupted element counts.
    #[test]
    fn count_wrong_counts_exactly_the_corrupted_elements(
        d in dtype(), op in op(), ranks in 1u32..20, count in 0u64..300,
        salt in any::<u64>(), rank_pick in any::<u32>(), root_pick in any::<u32>(),
        c in collective(0), bad in proptest::collection::vec(any::<u16>(), 0..8),
    ) {
        let root = root_pick % ranks;
        let c = match c {
            Collective::Broadcast { .. } => Collective::Broadcast { root: Rank(root) },
            Collective::Reduce { .. } => Collective::Reduce { root: Rank(root) },
            c => c,
        };
        let rank = rank_pick % ranks;
        let plan = Plan::new(c, count, d, ranks, 2, 4096).unwrap();
        let size = usize::from(d.size());
        let out_len = plan.output_len() as usize;
        let mut out = vec![0u8; out_len * size];
        let defined = verify::fill_expected(&plan, op, rank, 0, salt, &mut out).unwrap();
        for i in 0..out_len {
            let e = verify::expected(&plan, op, rank, i as u64, salt);
            let want = match c {
                Collective::AllReduce => Some(oracle::reduced(d, op, ranks, i as u64, salt)),
                Collective::ReduceScatter => Some(oracle::reduced(d, op, ranks, u64::from(rank) * count + i as u64, salt)),
                Collective::AllGather => {
                    let (b, j) = (i as u64 / count, i as u64 % count);
                    Some(oracle::encode(d, oracle::value(d, op, ranks, b as u32, j, salt)))
                }
                Collective::Broadcast { root } => Some(oracle::encode(d, oracle::value(d, op, ranks, root.0, i as u64, salt))),
                Collective::Reduce { root } => (rank == root.0).then(|| oracle::reduced(d, op, ranks, i as u64, salt)),
            };
            prop_assert_eq!(e, want);
            prop_assert_eq!(defined, want.is_some());
            if let Some(w) = want {
                prop_assert_eq!(&out[i * size..][..size], &w[..size]);
            }
        }
        prop_assert_eq!(verify::count_wrong(&plan, op, rank, salt, &out).unwrap(), 0);
        let mut hit = std::collections::BTreeSet::new();
        if out_len > 0 {
            for b in &bad {
                let i = *b as usize % out_len;
                out[i * size] ^= 0x5a;
                if !hit.insert(i) {
                    // Flipped twice: back to the right value.
                    hit.remove(&i);
                }
            }
        }
        let want_wrong = if defined { hit.len() as u64 } else { 0 };
        prop_assert_eq!(verify::count_wrong(&plan, op, rank, salt, &out).unwrap(), want_wrong);
    }
}

#[test]
fn ragged_lengths_are_typed_errors() {
    let mut b = [0u8; 7];
    assert!(verify::fill_values(DataType::F32, ReduceOp::Sum, 4, 0, 0, 0, &mut b).is_err());
    assert!(verify::fill_reduced(DataType::F64, ReduceOp::Sum, 4, 0, 0, &mut b).is_err());
    let plan = Plan::new(Collective::AllReduce, 4, DataType::F32, 2, 1, 4096).unwrap();
    assert!(verify::count_wrong(&plan, ReduceOp::Sum, 0, 0, &b).is_err());
    assert!(verify::fill_input(&plan, ReduceOp::Sum, 0, 0, &mut b).is_err());
}
