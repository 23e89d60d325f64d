//! The reduction kernels.
//!
//! Each (type, op) pair is one monomorphized loop over `[u8; N]` element
//! arrays (`as_chunks`), converted with `from_ne_bytes`/`to_ne_bytes`: no
//! alignment is assumed, nothing can panic, and LLVM turns the loop into
//! unaligned vector loads and stores.

use super::{DataType, ReduceOp};
use crate::error::Error;
use half::{bf16, f16};

#[inline(always)]
fn zip_in_place<const N: usize>(
    acc: &mut [u8],
    src: &[u8],
    f: impl Fn([u8; N], [u8; N]) -> [u8; N],
) {
    let (acc, _) = acc.as_chunks_mut::<N>();
    let (src, _) = src.as_chunks::<N>();
    for (a, b) in acc.iter_mut().zip(src) {
        *a = f(*a, *b);
    }
}

#[inline(always)]
fn zip_into<const N: usize>(
    dst: &mut [u8],
    a: &[u8],
    b: &[u8],
    f: impl Fn([u8; N], [u8; N]) -> [u8; N],
) {
    let (dst, _) = dst.as_chunks_mut::<N>();
    let (a, _) = a.as_chunks::<N>();
    let (b, _) = b.as_chunks::<N>();
    for ((d, x), y) in dst.iter_mut().zip(a).zip(b) {
        *d = f(*x, *y);
    }
}

#[inline(always)]
fn map_in_place<const N: usize>(buf: &mut [u8], f: impl Fn([u8; N]) -> [u8; N]) {
    let (buf, _) = buf.as_chunks_mut::<N>();
    for x in buf.iter_mut() {
        *x = f(*x);
    }
}

/// Expands to one `match` over the step operation for an element type,
/// calling `$drive` with the size and the element-wise closure.
macro_rules! dispatch_int {
    ($op:expr, $t:ty, $drive:ident, $($args:expr),*) => {{
        const N: usize = core::mem::size_of::<$t>();
        match $op {
            ReduceOp::Sum | ReduceOp::Avg => $drive::<N>($($args),*, |x, y| {
                <$t>::from_ne_bytes(x).wrapping_add(<$t>::from_ne_bytes(y)).to_ne_bytes()
            }),
            ReduceOp::Prod => $drive::<N>($($args),*, |x, y| {
                <$t>::from_ne_bytes(x).wrapping_mul(<$t>::from_ne_bytes(y)).to_ne_bytes()
            }),
            ReduceOp::Min => $drive::<N>($($args),*, |x, y| {
                <$t>::from_ne_bytes(x).min(<$t>::from_ne_bytes(y)).to_ne_bytes()
            }),
            ReduceOp::Max => $drive::<N>($($args),*, |x, y| {
                <$t>::from_ne_bytes(x).max(<$t>::from_ne_bytes(y)).to_ne_bytes()
            }),
        }
    }};
}

/// Like `dispatch_int` for floats computed in `$t` after loading with
/// `$load` and storing with `$store` (identity for f32/f64; through f32
/// for f16/bf16, as GPUs do).
macro_rules! dispatch_float {
    ($op:expr, $n:expr, $load:expr, $store:expr, $drive:ident, $($args:expr),*) => {{
        const N: usize = $n;
        let load = $load;
        let store = $store;
        match $op {
            ReduceOp::Sum | ReduceOp::Avg => $drive::<N>($($args),*, |x, y| store(load(x) + load(y))),
            ReduceOp::Prod => $drive::<N>($($args),*, |x, y| store(load(x) * load(y))),
            ReduceOp::Min => $drive::<N>($($args),*, |x, y| store(load(x).min(load(y)))),
            ReduceOp::Max => $drive::<N>($($args),*, |x, y| store(load(x).max(load(y)))),
        }
    }};
}

macro_rules! dispatch {
    ($dtype:expr, $op:expr, $drive:ident, $($args:expr),*) => {
        match $dtype {
            DataType::I8 => dispatch_int!($op, i8, $drive, $($args),*),
            DataType::U8 => dispatch_int!($op, u8, $drive, $($args),*),
            DataType::I32 => dispatch_int!($op, i32, $drive, $($args),*),
            DataType::U32 => dispatch_int!($op, u32, $drive, $($args),*),
            DataType::I64 => dispatch_int!($op, i64, $drive, $($args),*),
            DataType::U64 => dispatch_int!($op, u64, $drive, $($args),*),
            DataType::F32 => dispatch_float!($op, 4, f32::from_ne_bytes, f32::to_ne_bytes, $drive, $($args),*),
            DataType::F64 => dispatch_float!($op, 8, f64::from_ne_bytes, f64::to_ne_bytes, $drive, $($args),*),
            DataType::F16 => dispatch_float!(
                $op, 2,
                |b: [u8; 2]| f16::from_ne_bytes(b).to_f32(),
                |v: f32| f16::from_f32(v).to_ne_bytes(),
                $drive, $($args),*
            ),
            DataType::Bf16 => dispatch_float!($op, 2, bf16_load, bf16_store, $drive, $($args),*),
        }
    };
}

/// bfloat16 → f32: the upper half of the f32's bits (exact).
#[inline(always)]
fn bf16_load(b: [u8; 2]) -> f32 {
    f32::from_bits(u32::from(u16::from_ne_bytes(b)) << 16)
}

/// f32 → bfloat16, rounding to nearest even, NaNs kept NaN (quiet bit
/// set) — `half::bf16::from_f32`'s result, written without branches so the
/// loop vectorizes.
#[inline(always)]
fn bf16_store(v: f32) -> [u8; 2] {
    let x = v.to_bits();
    let rounded = x.wrapping_add(0x7fff_u32.wrapping_add((x >> 16) & 1)) >> 16;
    let quiet_nan = (x >> 16) | 0x0040;
    let is_nan = (x & 0x7fff_ffff) > 0x7f80_0000;
    let r = if is_nan { quiet_nan } else { rounded };
    (r as u16).to_ne_bytes()
}

fn check(dtype: DataType, dst: usize, src: usize) -> Result<(), Error> {
    let size = usize::from(dtype.size());
    if dst != src || !dst.is_multiple_of(size) {
        return Err(Error::BadLength { dst, src });
    }
    Ok(())
}

/// `acc[i] = acc[i] ⊕ src[i]` for every element, with the step operation
/// of `op` (`Avg` sums; see [`finalize`]).
///
/// Both slices must have the same length, a whole number of elements.
pub fn reduce_in_place(
    dtype: DataType,
    op: ReduceOp,
    acc: &mut [u8],
    src: &[u8],
) -> Result<(), Error> {
    check(dtype, acc.len(), src.len())?;
    dispatch!(dtype, op, zip_in_place, acc, src);
    Ok(())
}

/// `dst[i] = a[i] ⊕ b[i]` for every element (out of place), with the step
/// operation of `op`.
///
/// All three slices must have the same length, a whole number of elements.
pub fn reduce(
    dtype: DataType,
    op: ReduceOp,
    dst: &mut [u8],
    a: &[u8],
    b: &[u8],
) -> Result<(), Error> {
    check(dtype, dst.len(), a.len())?;
    check(dtype, dst.len(), b.len())?;
    dispatch!(dtype, op, zip_into, dst, a, b);
    Ok(())
}

/// Completes a reduction of `nranks` contributions: for `Avg`, divides every
/// element by `nranks` (truncating toward zero for integers); for the other
/// operations, does nothing.
pub fn finalize(dtype: DataType, op: ReduceOp, buf: &mut [u8], nranks: u32) -> Result<(), Error> {
    if nranks == 0 {
        return Err(Error::NoRanks);
    }
    check(dtype, buf.len(), buf.len())?;
    if op != ReduceOp::Avg || nranks == 1 {
        return Ok(());
    }
    let si = i64::from(nranks);
    let ui = u64::from(nranks);
    let fl = nranks as f32;
    let db = f64::from(nranks);
    macro_rules! signed {
        ($t:ty) => {
            map_in_place::<{ core::mem::size_of::<$t>() }>(buf, |x| {
                let v = i64::from(<$t>::from_ne_bytes(x))
                    .checked_div(si)
                    .unwrap_or(0);
                (v as $t).to_ne_bytes()
            })
        };
    }
    macro_rules! unsigned {
        ($t:ty) => {
            map_in_place::<{ core::mem::size_of::<$t>() }>(buf, |x| {
                let v = u64::from(<$t>::from_ne_bytes(x))
                    .checked_div(ui)
                    .unwrap_or(0);
                (v as $t).to_ne_bytes()
            })
        };
    }
    match dtype {
        DataType::I8 => signed!(i8),
        DataType::I32 => signed!(i32),
        DataType::I64 => signed!(i64),
        DataType::U8 => unsigned!(u8),
        DataType::U32 => unsigned!(u32),
        DataType::U64 => unsigned!(u64),
        DataType::F32 => map_in_place::<4>(buf, |x| (f32::from_ne_bytes(x) / fl).to_ne_bytes()),
        DataType::F64 => map_in_place::<8>(buf, |x| (f64::from_ne_bytes(x) / db).to_ne_bytes()),
        DataType::F16 => map_in_place::<2>(buf, |x| {
            f16::from_f32(f16::from_ne_bytes(x).to_f32() / fl).to_ne_bytes()
        }),
        DataType::Bf16 => map_in_place::<2>(buf, |x| {
            bf16::from_f32(bf16::from_ne_bytes(x).to_f32() / fl).to_ne_bytes()
        }),
    }
    Ok(())
}
