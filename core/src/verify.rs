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
//!
//! Speed: an input element costs one hash; a reduced element one hash per
//! rank. [`fill_values`] and [`fill_reduced`] write whole ranges with the
//! per-type conversion hoisted out of the loop, and [`count_wrong`]
//! compares in blocks. A caller that checks many ranks of one call (a
//! simulator holding every rank) computes the reduction once with
//! [`fill_reduced`] and compares each rank against it, which makes the
//! check O(count) per rank instead of O(ranks × count).

use half::{bf16, f16};

use crate::error::Error;
use crate::plan::{Collective, Plan};
use crate::reduce::{DataType, ReduceOp};

/// The most bytes an element takes.
pub const MAX_ELEM: usize = 8;

/// One encoded element: `bytes[..size]` is meaningful.
pub type Elem = [u8; MAX_ELEM];

/// Elements per block of the blocked fills and comparisons (stack storage).
const BLOCK: usize = 64;

/// The 64-bit hash of (rank, index, salt) that picks a value.
#[inline(always)]
fn mix(rank: u32, index: u64, salt: u64) -> u64 {
    // A cheap mix of (rank, index, salt): consecutive elements and ranks
    // differ, and no rank's values are a shift of another's.
    let x = index
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
        .wrapping_add(u64::from(rank).wrapping_mul(0xc2b2_ae3d_27d4_eb4f))
        .wrapping_add(salt);
    let x = (x ^ (x >> 29)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^ (x >> 32)
}

/// What a hash becomes for one (type, op, ranks): the value's range.
#[derive(Clone, Copy, Debug)]
enum Pick {
    /// Floats: `-3..=3`.
    Float,
    /// Float products: 1, -1, or 2.
    FloatProd3,
    /// Float products over more than 12 ranks: 1 or -1.
    FloatProd2,
    /// Integer products: `-2..=2`.
    IntProd,
    /// Integers: `-1000..=1000`.
    Int,
}

/// A value range with its divisor known at compile time, so that picking
/// a value is a multiply, not a division.
trait Values: Copy {
    fn get(self, r: u64) -> i64;
}

/// `r % M - OFF`.
#[derive(Clone, Copy)]
struct Mod<const M: u64, const OFF: i64>;

impl<const M: u64, const OFF: i64> Values for Mod<M, OFF> {
    #[inline(always)]
    fn get(self, r: u64) -> i64 {
        // M < 2^11: the remainder and the difference fit an i64.
        (r.checked_rem(M).unwrap_or(0) as i64).wrapping_sub(OFF)
    }
}

/// 1, -1 or (with `M == 3`) 2.
#[derive(Clone, Copy)]
struct Pow2<const M: u64>;

impl<const M: u64> Values for Pow2<M> {
    #[inline(always)]
    fn get(self, r: u64) -> i64 {
        match r.checked_rem(M).unwrap_or(0) {
            0 => 1,
            1 => -1,
            _ => 2,
        }
    }
}

/// Runs `$body` with `$v` bound to the [`Values`] of `$pick`, one
/// monomorphized copy per range.
macro_rules! with_values {
    ($pick:expr, |$v:ident| $body:expr) => {
        match $pick {
            Pick::Float => {
                let $v = Mod::<7, 3>;
                $body
            }
            Pick::FloatProd3 => {
                let $v = Pow2::<3>;
                $body
            }
            Pick::FloatProd2 => {
                let $v = Pow2::<2>;
                $body
            }
            Pick::IntProd => {
                let $v = Mod::<5, 2>;
                $body
            }
            Pick::Int => {
                let $v = Mod::<2001, 1000>;
                $body
            }
        }
    };
}

impl Pick {
    fn new(dtype: DataType, op: ReduceOp, ranks: u32) -> Pick {
        match (dtype.is_float(), op) {
            (true, ReduceOp::Prod) if ranks <= 12 => Pick::FloatProd3,
            (true, ReduceOp::Prod) => Pick::FloatProd2,
            (true, _) => Pick::Float,
            (false, ReduceOp::Prod) => Pick::IntProd,
            (false, _) => Pick::Int,
        }
    }

    fn get(self, r: u64) -> i64 {
        with_values!(self, |v| v.get(r))
    }
}

/// The value rank `rank` holds at input element `index`, before wrapping
/// to the type (`ranks` selects the float product range).
pub fn value(dtype: DataType, op: ReduceOp, ranks: u32, rank: u32, index: u64, salt: u64) -> i128 {
    i128::from(Pick::new(dtype, op, ranks).get(mix(rank, index, salt)))
}

/// Writes `v` as one element of `dtype` (native byte order) into `out`
/// (`dtype.size()` bytes); integers wrap. Values reach here already small
/// or wrapped to 64 bits, so the conversions go through `i64` (exact).
#[inline(always)]
fn put(dtype: DataType, v: i128, out: &mut [u8]) {
    let w = v as i64;
    let mut write = |b: &[u8]| {
        for (o, s) in out.iter_mut().zip(b) {
            *o = *s;
        }
    };
    match dtype {
        DataType::I8 => write(&(w as i8).to_ne_bytes()),
        DataType::U8 => write(&(w as u8).to_ne_bytes()),
        DataType::I32 => write(&(w as i32).to_ne_bytes()),
        DataType::U32 => write(&(w as u32).to_ne_bytes()),
        DataType::I64 => write(&w.to_ne_bytes()),
        DataType::U64 => write(&(w as u64).to_ne_bytes()),
        DataType::F16 => write(&f16::from_f64(w as f64).to_ne_bytes()),
        DataType::Bf16 => write(&bf16::from_f64(w as f64).to_ne_bytes()),
        DataType::F32 => write(&(w as f32).to_ne_bytes()),
        DataType::F64 => write(&(w as f64).to_ne_bytes()),
    }
}

/// Writes `f(i)` as element `i` of `out`, for every whole `N`-byte element:
/// the store is a fixed-size copy the compiler keeps in registers.
#[inline(always)]
fn store<const N: usize>(out: &mut [u8], mut f: impl FnMut(u64) -> [u8; N]) {
    let (elems, _) = out.as_chunks_mut::<N>();
    let mut i = 0u64;
    for e in elems {
        *e = f(i);
        i = i.wrapping_add(1);
    }
}

/// `store`s `f(i)` (an `i128` value, wrapped or converted to `dtype` as
/// [`put`] does) into every element of `out`, with the type's conversion
/// chosen once, outside the loop.
#[inline(always)]
fn store_values(dtype: DataType, out: &mut [u8], mut f: impl FnMut(u64) -> i128) {
    match dtype {
        DataType::I8 => store::<1>(out, |i| (f(i) as i64 as i8).to_ne_bytes()),
        DataType::U8 => store::<1>(out, |i| (f(i) as i64 as u8).to_ne_bytes()),
        DataType::I32 => store::<4>(out, |i| (f(i) as i64 as i32).to_ne_bytes()),
        DataType::U32 => store::<4>(out, |i| (f(i) as i64 as u32).to_ne_bytes()),
        DataType::I64 => store::<8>(out, |i| (f(i) as i64).to_ne_bytes()),
        DataType::U64 => store::<8>(out, |i| (f(i) as i64 as u64).to_ne_bytes()),
        DataType::F16 => store::<2>(out, |i| f16::from_f64(f(i) as i64 as f64).to_ne_bytes()),
        DataType::Bf16 => store::<2>(out, |i| bf16::from_f64(f(i) as i64 as f64).to_ne_bytes()),
        DataType::F32 => store::<4>(out, |i| (f(i) as i64 as f32).to_ne_bytes()),
        DataType::F64 => store::<8>(out, |i| (f(i) as i64 as f64).to_ne_bytes()),
    }
}

/// Encodes `v` as one element of `dtype` (native byte order); integers
/// wrap.
pub fn encode(dtype: DataType, v: i128) -> Elem {
    let mut e = [0u8; MAX_ELEM];
    put(dtype, v, &mut e);
    e
}

/// The value an integer element actually holds once wrapped to `dtype`.
#[inline(always)]
fn wrapped(dtype: DataType, v: i128) -> i128 {
    let w = v as i64;
    match dtype {
        DataType::I8 => i128::from(w as i8),
        DataType::U8 => i128::from(w as u8),
        DataType::I32 => i128::from(w as i32),
        DataType::U32 => i128::from(w as u32),
        DataType::I64 => i128::from(w),
        DataType::U64 => i128::from(w as u64),
        // Floats hold the small integers exactly.
        _ => v,
    }
}

/// One step of the reduction of wrapped values.
#[inline(always)]
fn combine(dtype: DataType, op: ReduceOp, a: i128, v: i128) -> i128 {
    match op {
        ReduceOp::Sum | ReduceOp::Avg => a.wrapping_add(v),
        // Wrap after each product so the i128 never overflows.
        ReduceOp::Prod => wrapped(dtype, a.wrapping_mul(v)),
        ReduceOp::Min => a.min(v),
        ReduceOp::Max => a.max(v),
    }
}

/// Writes the reduced accumulator `v` (over `ranks` ranks) as `dtype`:
/// Avg as the kernels define it — the wrapped sum divided once,
/// truncating integers, in f32 for the 16-bit floats.
#[inline(always)]
fn put_reduced(dtype: DataType, op: ReduceOp, ranks: u32, v: i128, out: &mut [u8]) {
    if op != ReduceOp::Avg {
        return put(dtype, v, out);
    }
    let w = wrapped(dtype, v);
    let n = ranks.max(1);
    let fl = n as f32;
    let mut write = |b: &[u8]| {
        for (o, s) in out.iter_mut().zip(b) {
            *o = *s;
        }
    };
    match dtype {
        DataType::F32 => write(&((w as i64 as f32) / fl).to_ne_bytes()),
        DataType::F64 => write(&((w as i64 as f64) / f64::from(n)).to_ne_bytes()),
        DataType::F16 => write(&f16::from_f32((w as i64 as f32) / fl).to_ne_bytes()),
        DataType::Bf16 => write(&bf16::from_f32((w as i64 as f32) / fl).to_ne_bytes()),
        _ => put(dtype, w.checked_div(i128::from(n)).unwrap_or(0), out),
    }
}

/// The reduction over every rank of input element `index`, encoded.
pub fn reduced(dtype: DataType, op: ReduceOp, ranks: u32, index: u64, salt: u64) -> Elem {
    let mut e = [0u8; MAX_ELEM];
    if let Some(out) = e.get_mut(..usize::from(dtype.size())) {
        // One whole element: the fill cannot fail.
        let _ = fill_reduced(dtype, op, ranks, index, salt, out);
    }
    e
}

/// Checks that `bytes` holds whole elements of `size` bytes.
fn whole(bytes: &[u8], size: usize) -> Result<(), Error> {
    if bytes.len().checked_rem(size) != Some(0) {
        return Err(Error::BadLength {
            dst: bytes.len(),
            src: bytes
                .len()
                .checked_next_multiple_of(size)
                .unwrap_or(usize::MAX),
        });
    }
    Ok(())
}

/// Writes rank `rank`'s input elements `first..` into `out` (whole
/// elements of `dtype`; the length says how many).
pub fn fill_values(
    dtype: DataType,
    op: ReduceOp,
    ranks: u32,
    rank: u32,
    first: u64,
    salt: u64,
    out: &mut [u8],
) -> Result<(), Error> {
    let size = usize::from(dtype.size());
    whole(out, size)?;
    with_values!(Pick::new(dtype, op, ranks), |v| {
        store_values(dtype, out, |i| {
            i128::from(v.get(mix(rank, first.wrapping_add(i), salt)))
        })
    });
    Ok(())
}

/// Writes the reduction over every rank of input elements `first..` into
/// `out` (whole elements of `dtype`): [`reduced`] for a range, one hash
/// per rank and element, in blocks.
pub fn fill_reduced(
    dtype: DataType,
    op: ReduceOp,
    ranks: u32,
    first: u64,
    salt: u64,
    out: &mut [u8],
) -> Result<(), Error> {
    let size = usize::from(dtype.size());
    whole(out, size)?;
    with_values!(Pick::new(dtype, op, ranks), |v| {
        reduce_blocks(dtype, op, ranks, first, salt, out, v)
    });
    Ok(())
}

/// [`fill_reduced`]'s loop for one value range.
#[inline(always)]
fn reduce_blocks(
    dtype: DataType,
    op: ReduceOp,
    ranks: u32,
    first: u64,
    salt: u64,
    out: &mut [u8],
    v: impl Values,
) {
    let size = usize::from(dtype.size());
    let mut base = first;
    for block in out.chunks_mut(BLOCK.saturating_mul(size)) {
        let mut acc = [0i128; BLOCK];
        let len = block.len().checked_div(size).unwrap_or(0);
        let mut index = base;
        for a in acc.iter_mut().take(len) {
            *a = wrapped(dtype, i128::from(v.get(mix(0, index, salt))));
            index = index.wrapping_add(1);
        }
        for r in 1..ranks {
            let mut index = base;
            for a in acc.iter_mut().take(len) {
                let x = wrapped(dtype, i128::from(v.get(mix(r, index, salt))));
                *a = combine(dtype, op, *a, x);
                index = index.wrapping_add(1);
            }
        }
        if op == ReduceOp::Avg {
            for (o, a) in block.chunks_exact_mut(size).zip(acc) {
                put_reduced(dtype, op, ranks, a, o);
            }
        } else {
            store_values(dtype, block, |i| {
                acc.get(usize::try_from(i).unwrap_or(usize::MAX))
                    .copied()
                    .unwrap_or(0)
            });
        }
        base = base.wrapping_add(len as u64);
    }
}

/// Checks that a buffer of `bytes` holds exactly `elems` elements of
/// `plan`'s type.
fn sized(plan: &Plan, elems: u64, bytes: usize) -> Result<(), Error> {
    let want = usize::try_from(elems)
        .ok()
        .and_then(|n| n.checked_mul(usize::from(plan.dtype().size())));
    if want != Some(bytes) {
        return Err(Error::BadLength {
            dst: bytes,
            src: want.unwrap_or(usize::MAX),
        });
    }
    Ok(())
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
    sized(plan, plan.input_len(), input.len())?;
    fill_values(plan.dtype(), op, plan.ranks(), rank, 0, salt, input)
}

/// The expected output element `index` of rank `rank`, or `None` where the
/// collective leaves the output undefined (Reduce on a non-root rank).
pub fn expected(plan: &Plan, op: ReduceOp, rank: u32, index: u64, salt: u64) -> Option<Elem> {
    let mut e = [0u8; MAX_ELEM];
    let size = usize::from(plan.dtype().size());
    match fill_expected(plan, op, rank, index, salt, e.get_mut(..size)?) {
        Ok(true) => Some(e),
        _ => None,
    }
}

/// Writes the expected output elements `first..` of rank `rank` into
/// `out` (whole elements); `Ok(false)` where the collective leaves the
/// output undefined (Reduce on a non-root rank), with `out` untouched.
pub fn fill_expected(
    plan: &Plan,
    op: ReduceOp,
    rank: u32,
    first: u64,
    salt: u64,
    out: &mut [u8],
) -> Result<bool, Error> {
    let d = plan.dtype();
    let n = plan.ranks();
    let count = plan.count();
    match plan.collective() {
        Collective::AllReduce => fill_reduced(d, op, n, first, salt, out)?,
        Collective::ReduceScatter => {
            let base = u64::from(rank).wrapping_mul(count);
            fill_reduced(d, op, n, base.wrapping_add(first), salt, out)?;
        }
        Collective::AllGather => {
            let size = usize::from(d.size());
            whole(out, size)?;
            // Block by block: element `i` of the output is element
            // `i % count` of rank `i / count`'s input.
            let mut index = first;
            let mut rest = out;
            while !rest.is_empty() {
                let block = index.checked_div(count).unwrap_or(0);
                let at = index.checked_rem(count).unwrap_or(0);
                let left = count.saturating_sub(at).max(1);
                let take = usize::try_from(left)
                    .unwrap_or(usize::MAX)
                    .min(rest.len().checked_div(size).unwrap_or(0));
                let (now, later) = rest.split_at_mut(take.saturating_mul(size));
                fill_values(d, op, n, block as u32, at, salt, now)?;
                index = index.wrapping_add(take as u64);
                rest = later;
            }
        }
        Collective::Broadcast { root } => fill_values(d, op, n, root.0, first, salt, out)?,
        Collective::Reduce { root } => {
            if rank != root.0 {
                return Ok(false);
            }
            fill_reduced(d, op, n, first, salt, out)?;
        }
    }
    Ok(true)
}

/// How many elements of `got` differ from `want` (whole elements of
/// `size` bytes; the shorter slice bounds the comparison).
pub fn count_diff(want: &[u8], got: &[u8], size: usize) -> u64 {
    let mut wrong = 0u64;
    for (w, g) in want.chunks_exact(size).zip(got.chunks_exact(size)) {
        if w != g {
            wrong = wrong.saturating_add(1);
        }
    }
    wrong
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
    sized(plan, plan.output_len(), output.len())?;
    let mut wrong = 0u64;
    let mut first = 0u64;
    let mut buf = [0u8; BLOCK * MAX_ELEM];
    for got in output.chunks(BLOCK.saturating_mul(size)) {
        let exp = buf.get_mut(..got.len()).unwrap_or(&mut []);
        if !fill_expected(plan, op, rank, first, salt, exp)? {
            return Ok(0);
        }
        wrong = wrong.saturating_add(count_diff(exp, got, size));
        first = first.wrapping_add(got.len().checked_div(size).unwrap_or(0) as u64);
    }
    Ok(wrong)
}
