//! The vectorized kernels against a scalar, element-at-a-time reference on
//! arbitrary bytes (NaNs, infinities, every bit pattern), at arbitrary
//! alignments, in and out of place.

use half::{bf16, f16};
use proptest::prelude::*;
use ringcc_core::reduce::{finalize, reduce, reduce_in_place, DataType, ReduceOp};
use ringcc_core::Error;

/// One element of `a ⊕ b`, computed the obvious way.
fn scalar(d: DataType, op: ReduceOp, a: &[u8], b: &[u8]) -> Vec<u8> {
    macro_rules! int {
        ($t:ty) => {{
            let x = <$t>::from_ne_bytes(a.try_into().unwrap());
            let y = <$t>::from_ne_bytes(b.try_into().unwrap());
            match op {
                ReduceOp::Sum | ReduceOp::Avg => x.wrapping_add(y),
                ReduceOp::Prod => x.wrapping_mul(y),
                ReduceOp::Min => x.min(y),
                ReduceOp::Max => x.max(y),
            }
            .to_ne_bytes()
            .to_vec()
        }};
    }
    macro_rules! float {
        ($load:expr, $store:expr) => {{
            let (x, y) = ($load(a), $load(b));
            $store(match op {
                ReduceOp::Sum | ReduceOp::Avg => x + y,
                ReduceOp::Prod => x * y,
                ReduceOp::Min => x.min(y),
                ReduceOp::Max => x.max(y),
            })
        }};
    }
    match d {
        DataType::I8 => int!(i8),
        DataType::U8 => int!(u8),
        DataType::I32 => int!(i32),
        DataType::U32 => int!(u32),
        DataType::I64 => int!(i64),
        DataType::U64 => int!(u64),
        DataType::F32 => float!(
            |v: &[u8]| f32::from_ne_bytes(v.try_into().unwrap()),
            |v: f32| v.to_ne_bytes().to_vec()
        ),
        DataType::F64 => float!(
            |v: &[u8]| f64::from_ne_bytes(v.try_into().unwrap()),
            |v: f64| v.to_ne_bytes().to_vec()
        ),
        DataType::F16 => float!(
            |v: &[u8]| f16::from_ne_bytes(v.try_into().unwrap()).to_f32(),
            |v: f32| f16::from_f32(v).to_ne_bytes().to_vec()
        ),
        DataType::Bf16 => float!(
            |v: &[u8]| bf16::from_ne_bytes(v.try_into().unwrap()).to_f32(),
            |v: f32| bf16::from_f32(v).to_ne_bytes().to_vec()
        ),
    }
}

/// NaN payloads may legitimately differ between vector and scalar code;
/// compare floats as "both NaN or bit-equal".
fn same(d: DataType, x: &[u8], y: &[u8]) -> bool {
    let nan = |v: &[u8]| match d {
        DataType::F32 => f32::from_ne_bytes(v.try_into().unwrap()).is_nan(),
        DataType::F64 => f64::from_ne_bytes(v.try_into().unwrap()).is_nan(),
        DataType::F16 => f16::from_ne_bytes(v.try_into().unwrap()).is_nan(),
        DataType::Bf16 => bf16::from_ne_bytes(v.try_into().unwrap()).is_nan(),
        _ => false,
    };
    x == y || (nan(x) && nan(y))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, .. ProptestConfig::default() })]

    #[test]
    fn kernels_match_the_scalar_reference(
        d in prop::sample::select(DataType::ALL.to_vec()),
        op in prop::sample::select(ReduceOp::ALL.to_vec()),
        elems in 0usize..300,
        (sa, sb, sd) in (0usize..8, 0usize..8, 0usize..8),
        bytes in prop::collection::vec(any::<u8>(), 2 * 300 * 8),
    ) {
        let size = d.size() as usize;
        let len = elems * size;
        let a_buf = bytes[..len + sa].to_vec();
        let b_buf = bytes[300 * 8..300 * 8 + len + sb].to_vec();
        let (a, b) = (&a_buf[sa..], &b_buf[sb..]);
        let want: Vec<u8> = a.chunks_exact(size).zip(b.chunks_exact(size)).flat_map(|(x, y)| scalar(d, op, x, y)).collect();
        // Out of place, unaligned destination.
        let mut dst_buf = vec![0u8; len + sd];
        reduce(d, op, &mut dst_buf[sd..], a, b).unwrap();
        // In place.
        let mut acc_buf = a_buf.clone();
        reduce_in_place(d, op, &mut acc_buf[sa..], b).unwrap();
        for (i, w) in want.chunks_exact(size).enumerate() {
            let r = i * size..(i + 1) * size;
            prop_assert!(same(d, &dst_buf[sd..][r.clone()], w), "{:?} {:?} element {}", d, op, i);
            prop_assert!(same(d, &acc_buf[sa..][r], w), "{:?} {:?} element {} in place", d, op, i);
        }
    }
}

#[test]
fn avg_divides_once_truncating_integers() {
    let mut b = [0u8; 12];
    b[..4].copy_from_slice(&(-7i32).to_ne_bytes());
    b[4..8].copy_from_slice(&7i32.to_ne_bytes());
    b[8..].copy_from_slice(&i32::MIN.to_ne_bytes());
    finalize(DataType::I32, ReduceOp::Avg, &mut b, 2).unwrap();
    assert_eq!(i32::from_ne_bytes(b[..4].try_into().unwrap()), -3);
    assert_eq!(i32::from_ne_bytes(b[4..8].try_into().unwrap()), 3);
    assert_eq!(i32::from_ne_bytes(b[8..].try_into().unwrap()), i32::MIN / 2);
    let mut f = 10.0f32.to_ne_bytes();
    finalize(DataType::F32, ReduceOp::Avg, &mut f, 4).unwrap();
    assert_eq!(f32::from_ne_bytes(f), 2.5);
    let mut u = [255u8];
    finalize(DataType::U8, ReduceOp::Avg, &mut u, 1000).unwrap();
    assert_eq!(u, [0]);
    // Other ops: untouched.
    let mut s = 10.0f32.to_ne_bytes();
    finalize(DataType::F32, ReduceOp::Sum, &mut s, 4).unwrap();
    assert_eq!(f32::from_ne_bytes(s), 10.0);
}

#[test]
fn bad_lengths_are_typed_errors() {
    let mut a = [0u8; 8];
    assert_eq!(
        reduce_in_place(DataType::F32, ReduceOp::Sum, &mut a, &[0u8; 4]),
        Err(Error::BadLength { dst: 8, src: 4 })
    );
    let mut c = [0u8; 6];
    assert_eq!(
        reduce_in_place(DataType::F32, ReduceOp::Sum, &mut c, &[0u8; 6]),
        Err(Error::BadLength { dst: 6, src: 6 })
    );
    assert!(reduce(DataType::U8, ReduceOp::Max, &mut a, &[0u8; 8], &[0u8; 7]).is_err());
    assert_eq!(
        finalize(DataType::F32, ReduceOp::Avg, &mut a, 0),
        Err(Error::NoRanks)
    );
}
