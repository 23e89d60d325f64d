//! Inputs whose every reduction order gives the same exact result (as
//! nccl-tests chooses them), and the reference results computed without
//! the ring: element by element, in wide integers or `f64`.

use half::{bf16, f16};
use ringcc_core::{Collective, DataType, Plan, ReduceOp};

use crate::exec::Rng;

/// Encodes a small integer value as one element of `dtype` (native order).
/// Integers wrap, as the kernels' wrapping arithmetic does.
pub fn encode(dtype: DataType, v: i128) -> Vec<u8> {
    match dtype {
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
    }
}

/// A value for element `i` of rank `rank`, chosen so that the reduction of
/// `ranks` of them is exact in `dtype` under `op` whatever the order.
pub fn value(dtype: DataType, op: ReduceOp, ranks: u32, rank: u32, i: u64, salt: u64) -> i128 {
    let mut rng = Rng::new(salt ^ (u64::from(rank) << 40) ^ i.wrapping_mul(0x2545_f491_4f6c_dd1d));
    let r = rng.next_u64();
    if dtype.is_float() {
        match op {
            // Products of ±1 and a few 2s stay exact powers of two.
            ReduceOp::Prod => {
                let two_ok = ranks <= 12;
                match r % if two_ok { 3 } else { 2 } {
                    0 => 1,
                    1 => -1,
                    _ => 2,
                }
            }
            // Sums of |v| <= 3 over <= 64 ranks stay below 256: exact even
            // in bfloat16.
            _ => (r % 7) as i128 - 3,
        }
    } else {
        match op {
            ReduceOp::Prod => (r % 5) as i128 - 2,
            _ => (r % 2001) as i128 - 1000,
        }
    }
}

/// Input bytes of rank `rank` for `plan`.
pub fn input(plan: &Plan, op: ReduceOp, rank: u32, salt: u64) -> Vec<u8> {
    let d = plan.dtype();
    (0..plan.input_len())
        .flat_map(|i| encode(d, value(d, op, plan.ranks(), rank, i, salt)))
        .collect()
}

/// The reduction of the values at index `i` of every rank, encoded.
fn reduced(plan: &Plan, op: ReduceOp, i: u64, salt: u64) -> Vec<u8> {
    let d = plan.dtype();
    let n = plan.ranks();
    // Integers reduce as the wrapped values the ranks actually hold.
    let vals: Vec<i128> = (0..n)
        .map(|r| value(d, op, n, r, i, salt))
        .map(|v| {
            if d.is_float() {
                v
            } else {
                decode_int(d, &encode(d, v))
            }
        })
        .collect();
    let fold = |f: &dyn Fn(i128, i128) -> i128| vals.iter().copied().reduce(f).unwrap_or(0);
    // Integer wrapping arithmetic is a ring homomorphism: reduce in i128,
    // wrap once when encoding. Exact for floats by choice of values.
    let sum = fold(&|a, b| a + b);
    let v = match op {
        ReduceOp::Sum => sum,
        ReduceOp::Prod => fold(&|a, b| wrap_mul(d, a, b)),
        ReduceOp::Min => fold(&i128::min),
        ReduceOp::Max => fold(&i128::max),
        ReduceOp::Avg => return avg(d, sum, n),
    };
    encode(d, v)
}

fn wrap_mul(d: DataType, a: i128, b: i128) -> i128 {
    // Keep the product in range of i128 by wrapping to the type each time.
    let p = a.wrapping_mul(b);
    if d.is_float() {
        p
    } else {
        let bytes = encode(d, p);
        decode_int(d, &bytes)
    }
}

fn decode_int(d: DataType, b: &[u8]) -> i128 {
    match d {
        DataType::I8 => i8::from_ne_bytes([b[0]]) as i128,
        DataType::U8 => b[0] as i128,
        DataType::I32 => i32::from_ne_bytes(b.try_into().unwrap()) as i128,
        DataType::U32 => u32::from_ne_bytes(b.try_into().unwrap()) as i128,
        DataType::I64 => i64::from_ne_bytes(b.try_into().unwrap()) as i128,
        DataType::U64 => u64::from_ne_bytes(b.try_into().unwrap()) as i128,
        _ => unreachable!(),
    }
}

/// Average as the kernels define it: the (wrapped) sum divided once by the
/// rank count, truncating for integers, in `f32` for the 16-bit floats.
fn avg(d: DataType, sum: i128, n: u32) -> Vec<u8> {
    let wrapped = if d.is_float() {
        sum
    } else {
        decode_int(d, &encode(d, sum))
    };
    match d {
        DataType::F32 => ((wrapped as f32) / n as f32).to_ne_bytes().to_vec(),
        DataType::F64 => ((wrapped as f64) / f64::from(n)).to_ne_bytes().to_vec(),
        DataType::F16 => f16::from_f32((wrapped as f32) / n as f32)
            .to_ne_bytes()
            .to_vec(),
        DataType::Bf16 => bf16::from_f32((wrapped as f32) / n as f32)
            .to_ne_bytes()
            .to_vec(),
        DataType::I8 | DataType::I32 | DataType::I64 => encode(d, wrapped / i128::from(n)),
        _ => encode(d, wrapped / i128::from(n)),
    }
}

/// The expected output of rank `rank`, or `None` where the collective
/// leaves that rank's output undefined (Reduce on a non-root rank).
pub fn expected(plan: &Plan, op: ReduceOp, rank: u32, salt: u64) -> Option<Vec<u8>> {
    let d = plan.dtype();
    let n = plan.ranks();
    let count = plan.count();
    let val = |r: u32, i: u64| encode(d, value(d, op, n, r, i, salt));
    Some(match plan.collective() {
        Collective::AllReduce => (0..count)
            .flat_map(|i| reduced(plan, op, i, salt))
            .collect(),
        Collective::ReduceScatter => {
            let base = u64::from(rank) * count;
            (0..count)
                .flat_map(|i| reduced(plan, op, base + i, salt))
                .collect()
        }
        Collective::AllGather => (0..n)
            .flat_map(|b| (0..count).flat_map(move |i| val(b, i)))
            .collect(),
        Collective::Broadcast { root } => (0..count).flat_map(|i| val(root.0, i)).collect(),
        Collective::Reduce { root } => {
            if rank != root.0 {
                return None;
            }
            (0..count)
                .flat_map(|i| reduced(plan, op, i, salt))
                .collect()
        }
    })
}
