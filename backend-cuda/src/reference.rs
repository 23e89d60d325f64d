//! Test data whose reduction is exact in any order, and the expected
//! result of every collective, computed with the core's host kernels.
//!
//! Used by the fake-device tests, the GPU tests and `perf`'s `#wrong`
//! column (nccl-tests' idea: inputs chosen so every reduction order gives
//! the same bits).

use half::{bf16, f16};
use ringcc_core::reduce::{finalize, reduce_in_place};
use ringcc_core::{Collective, DataType, ReduceOp};

use crate::error::{Error, Result};
use crate::state::Call;

/// `count` elements of `dtype` for one rank: any bits for integers
/// (wrapping arithmetic is exact in any order); for floats, small integers
/// in `-4..=4`, or ±{½, 1, 2} for `Prod`, so that sums and products of up
/// to 64 ranks are exact in every float type.
pub fn pattern(dtype: DataType, op: ReduceOp, count: u64, seed: u64) -> Vec<u8> {
    let mut s = ringcc_core::rng::Rng::new(seed);
    let mut out = Vec::with_capacity((count * u64::from(dtype.size())) as usize);
    for _ in 0..count {
        let r = s.next_u64();
        let v = if op == ReduceOp::Prod {
            let m = [0.5, 1.0, 2.0][(r % 3) as usize];
            if (r >> 8) & 1 == 1 {
                -m
            } else {
                m
            }
        } else {
            (r % 9) as f64 - 4.0
        };
        match dtype {
            DataType::F16 => out.extend(f16::from_f64(v).to_ne_bytes()),
            DataType::Bf16 => out.extend(bf16::from_f64(v).to_ne_bytes()),
            DataType::F32 => out.extend((v as f32).to_ne_bytes()),
            DataType::F64 => out.extend(v.to_ne_bytes()),
            _ => out.extend(&r.to_ne_bytes()[..usize::from(dtype.size())]),
        }
    }
    out
}

fn reduce_all(dtype: DataType, op: ReduceOp, inputs: &[&[u8]]) -> Result<Vec<u8>> {
    let Some((first, rest)) = inputs.split_first() else {
        return Ok(Vec::new());
    };
    let mut acc = first.to_vec();
    for x in rest {
        reduce_in_place(dtype, op, &mut acc, x).map_err(Error::core("reduce_in_place"))?;
    }
    finalize(dtype, op, &mut acc, inputs.len() as u32).map_err(Error::core("finalize"))?;
    Ok(acc)
}

/// The expected output of every rank (`None` where the collective leaves
/// the output unspecified: Reduce's non-roots). `inputs[r]` is rank `r`'s
/// input of exactly the call's input size.
pub fn expected(spec: &Call, inputs: &[Vec<u8>]) -> Result<Vec<Option<Vec<u8>>>> {
    let n = inputs.len();
    let block = (spec.count * u64::from(spec.dtype.size())) as usize;
    let views: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
    Ok(match spec.collective {
        Collective::AllReduce => {
            let v = reduce_all(spec.dtype, spec.op, &views)?;
            vec![Some(v); n]
        }
        Collective::ReduceScatter => {
            let v = reduce_all(spec.dtype, spec.op, &views)?;
            (0..n)
                .map(|r| v.get(r * block..(r + 1) * block).map(<[u8]>::to_vec))
                .collect()
        }
        Collective::AllGather => {
            let v: Vec<u8> = views.iter().flat_map(|x| x.iter().copied()).collect();
            vec![Some(v); n]
        }
        Collective::Broadcast { root } => {
            vec![inputs.get(root.0 as usize).cloned(); n]
        }
        Collective::Reduce { root } => {
            let v = reduce_all(spec.dtype, spec.op, &views)?;
            (0..n)
                .map(|r| (r == root.0 as usize).then(|| v.clone()))
                .collect()
        }
    })
}

/// Elements of `got` that differ from `want` (nccl-tests' `#wrong`).
pub fn wrong(dtype: DataType, got: &[u8], want: &[u8]) -> u64 {
    let e = usize::from(dtype.size());
    let diff = got
        .chunks(e)
        .zip(want.chunks(e))
        .filter(|(a, b)| a != b)
        .count();
    let missing = want.len().abs_diff(got.len()).div_ceil(e);
    (diff + missing) as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringcc_core::Rank;

    #[test]
    fn float_patterns_reduce_exactly_in_any_order() {
        for dtype in [DataType::F16, DataType::Bf16, DataType::F32, DataType::F64] {
            for op in ReduceOp::ALL {
                let inputs: Vec<Vec<u8>> = (0..8).map(|r| pattern(dtype, op, 64, r)).collect();
                let views: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
                let fwd = reduce_all(dtype, op, &views).unwrap();
                let mut rev = views.clone();
                rev.reverse();
                rev.rotate_left(3);
                assert_eq!(fwd, reduce_all(dtype, op, &rev).unwrap(), "{dtype} {op}");
            }
        }
    }

    #[test]
    fn expected_outputs_have_the_right_shape() {
        let inputs: Vec<Vec<u8>> = (0..3)
            .map(|r| pattern(DataType::I32, ReduceOp::Sum, 12, r))
            .collect();
        let spec = |collective| Call {
            collective,
            count: 4,
            dtype: DataType::I32,
            op: ReduceOp::Sum,
        };
        let rs = expected(&spec(Collective::ReduceScatter), &inputs).unwrap();
        assert!(rs.iter().all(|o| o.as_ref().unwrap().len() == 16));
        let ar_in: Vec<Vec<u8>> = inputs.iter().map(|v| v[..16].to_vec()).collect();
        let ag = expected(&spec(Collective::AllGather), &ar_in).unwrap();
        assert_eq!(ag[2].as_ref().unwrap().len(), 48);
        let red = expected(&spec(Collective::Reduce { root: Rank(1) }), &ar_in).unwrap();
        assert!(red[0].is_none() && red[1].is_some() && red[2].is_none());
        let sum: i32 = (0..3)
            .map(|r| i32::from_ne_bytes(ar_in[r][..4].try_into().unwrap()))
            .fold(0i32, i32::wrapping_add);
        assert_eq!(red[1].as_ref().unwrap()[..4], sum.to_ne_bytes());
        assert_eq!(wrong(DataType::I32, &ar_in[0], &ar_in[0]), 0);
        assert_eq!(wrong(DataType::I32, &ar_in[0][..8], &ar_in[0]), 2);
        let mut bad = ar_in[0].clone();
        bad[5] ^= 1;
        assert_eq!(wrong(DataType::I32, &bad, &ar_in[0]), 1);
    }
}
