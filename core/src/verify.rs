//! Test data and result checking, nccl-tests style, without allocation.
//!
//! Inputs are small integers chosen per (rank, element) so that the
//! reduction of every rank's value is exact in the element type whatever
//! the order of the operations: sums of values in `-3..=3` over at most 64
//! ranks stay below 256 (exact even in bfloat16); float products use ±1 and
//! (up to 12 ranks) 2, so they stay powers of two; integers wrap, and
//! wrapping arithmetic does not depend on the order either. So every
//! backend's result can be compared bit for bit with the reference computed
//! here element by element — on a host, in a test, or in firmware as a
//! self-test. [`count_wrong`] is nccl-tests' `#wrong`.

use half::{bf16, f16};

use crate::error::Error;
use crate::plan::{Collective, Plan};
use crate::reduce::{DataType, ReduceOp};

/// The most bytes an element takes.
pub const MAX_ELEM: usize = 8;

/// One encoded element: `bytes[..size]` is meaningful.
pub type Elem = [u8; MAX_ELEM];

/// The value rank `rank` holds at input element `index`, before wrapping
/// to the type (`ranks` selects the float product range).
pub fn value(dtype: DataType, op: ReduceOp, ranks: u32, rank: u32, index: u64, salt: u64) -> i128 {
    // A cheap mix of (rank, index, salt): consecutive elements and ranks
    // differ, and no rank's values are a shift of another's.
    let x = index
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
        .wrapping_add(u64::from(rank).wrapping_mul(0xc2b2_ae3d_27d4_eb4f))
        .wrapping_add(salt);
    let x = (x ^ (x >> 29)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    let r = x ^ (x >> 32);
    let pick = |m: u64, off: i128| i128::from(r.checked_rem(m).unwrap_or(0)).wrapping_sub(off);
    match (dtype.is_float(), op) {
        (true, ReduceOp::Prod) => {
            let m = if ranks <= 12 { 3 } else { 2 };
            match r.checked_rem(m).unwrap_or(0) {
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

/// Encodes `v` as one element of `dtype` (native byte order); integers
/// wrap.
pub fn encode(dtype: DataType, v: i128) -> Elem {
    let mut e = [0u8; MAX_ELEM];
    let b: &[u8] = match dtype {
        DataType::I8 => &(v as i8).to_ne_bytes(),
        DataType::U8 => &(v as u8).to_ne_bytes(),
        DataType::I32 => &(v as i32).to_ne_bytes(),
        DataType::U32 => &(v as u32).to_ne_bytes(),
        DataType::I64 => &(v as i64).to_ne_bytes(),
        DataType::U64 => &(v as u64).to_ne_bytes(),
        DataType::F16 => &f16::from_f64(v as f64).to_ne_bytes(),
        DataType::Bf16 => &bf16::from_f64(v as f64).to_ne_bytes(),
        DataType::F32 => &(v as f32).to_ne_bytes(),
        DataType::F64 => &(v as f64).to_ne_bytes(),
    };
    for (d, s) in e.iter_mut().zip(b) {
        *d = *s;
    }
    e
}

/// The value an integer element actually holds once wrapped to `dtype`.
fn wrapped(dtype: DataType, v: i128) -> i128 {
    let e = encode(dtype, v);
    let a4 = [e[0], e[1], e[2], e[3]];
    match dtype {
        DataType::I8 => i128::from(e[0] as i8),
        DataType::U8 => i128::from(e[0]),
        DataType::I32 => i128::from(i32::from_ne_bytes(a4)),
        DataType::U32 => i128::from(u32::from_ne_bytes(a4)),
        DataType::I64 => i128::from(i64::from_ne_bytes(e)),
        DataType::U64 => i128::from(u64::from_ne_bytes(e)),
        // Floats hold the small integers exactly.
        _ => v,
    }
}

/// The reduction over every rank of input element `index`, encoded.
pub fn reduced(dtype: DataType, op: ReduceOp, ranks: u32, index: u64, salt: u64) -> Elem {
    let mut acc: Option<i128> = None;
    for r in 0..ranks {
        let v = wrapped(dtype, value(dtype, op, ranks, r, index, salt));
        acc = Some(match acc {
            None => v,
            Some(a) => match op {
                ReduceOp::Sum | ReduceOp::Avg => a.wrapping_add(v),
                // Wrap after each product so the i128 never overflows.
                ReduceOp::Prod => wrapped(dtype, a.wrapping_mul(v)),
                ReduceOp::Min => a.min(v),
                ReduceOp::Max => a.max(v),
            },
        });
    }
    let v = acc.unwrap_or(0);
    if op != ReduceOp::Avg {
        return encode(dtype, v);
    }
    // Avg as the kernels define it: the wrapped sum divided once, truncating
    // integers, in f32 for the 16-bit floats.
    let w = wrapped(dtype, v);
    let n = i128::from(ranks.max(1));
    let fl = ranks.max(1) as f32;
    let mut e = [0u8; MAX_ELEM];
    let b: &[u8] = match dtype {
        DataType::F32 => &((w as f32) / fl).to_ne_bytes(),
        DataType::F64 => &((w as f64) / f64::from(ranks.max(1))).to_ne_bytes(),
        DataType::F16 => &f16::from_f32((w as f32) / fl).to_ne_bytes(),
        DataType::Bf16 => &bf16::from_f32((w as f32) / fl).to_ne_bytes(),
        _ => return encode(dtype, w.checked_div(n).unwrap_or(0)),
    };
    for (d, s) in e.iter_mut().zip(b) {
        *d = *s;
    }
    e
}

/// Fills rank `rank`'s input buffer for `plan` (`plan.input_len()`
/// elements).
pub fn fill_input(
    plan: &Plan,
    op: ReduceOp,
    rank: u32,
    salt: u64,
    input: &mut [u8],
) -> Result<(), Error> {
    let d = plan.dtype();
    let size = usize::from(d.size());
    let want = usize::try_from(plan.input_len())
        .ok()
        .and_then(|n| n.checked_mul(size));
    if want != Some(input.len()) {
        return Err(Error::BadLength {
            dst: input.len(),
            src: want.unwrap_or(usize::MAX),
        });
    }
    for (i, out) in input.chunks_exact_mut(size).enumerate() {
        let e = encode(d, value(d, op, plan.ranks(), rank, i as u64, salt));
        for (o, b) in out.iter_mut().zip(e.iter()) {
            *o = *b;
        }
    }
    Ok(())
}

/// The expected output element `index` of rank `rank`, or `None` where the
/// collective leaves the output undefined (Reduce on a non-root rank).
pub fn expected(plan: &Plan, op: ReduceOp, rank: u32, index: u64, salt: u64) -> Option<Elem> {
    let d = plan.dtype();
    let n = plan.ranks();
    let count = plan.count();
    Some(match plan.collective() {
        Collective::AllReduce => reduced(d, op, n, index, salt),
        Collective::ReduceScatter => {
            let base = u64::from(rank).wrapping_mul(count);
            reduced(d, op, n, base.wrapping_add(index), salt)
        }
        Collective::AllGather => {
            let block = index.checked_div(count).unwrap_or(0);
            let i = index.checked_rem(count).unwrap_or(0);
            encode(d, value(d, op, n, block as u32, i, salt))
        }
        Collective::Broadcast { root } => encode(d, value(d, op, n, root.0, index, salt)),
        Collective::Reduce { root } => {
            if rank != root.0 {
                return None;
            }
            reduced(d, op, n, index, salt)
        }
    })
}

/// How many elements of rank `rank`'s `output` differ from the reference
/// (nccl-tests' `#wrong`); 0 where the output is undefined.
pub fn count_wrong(
    plan: &Plan,
    op: ReduceOp,
    rank: u32,
    salt: u64,
    output: &[u8],
) -> Result<u64, Error> {
    let size = usize::from(plan.dtype().size());
    let want = usize::try_from(plan.output_len())
        .ok()
        .and_then(|n| n.checked_mul(size));
    if want != Some(output.len()) {
        return Err(Error::BadLength {
            dst: output.len(),
            src: want.unwrap_or(usize::MAX),
        });
    }
    let mut wrong = 0u64;
    for (i, got) in output.chunks_exact(size).enumerate() {
        if let Some(e) = expected(plan, op, rank, i as u64, salt) {
            if e.get(..size) != Some(got) {
                wrong = wrong.saturating_add(1);
            }
        }
    }
    Ok(wrong)
}
