//! Exact inputs and reference results as byte vectors, on top of the
//! core's allocation-free [`ringcc_core::verify`].

use ringcc_core::verify::{self, MAX_ELEM};
use ringcc_core::{Plan, ReduceOp};

/// Input bytes of rank `rank` for `plan`.
pub fn input(plan: &Plan, op: ReduceOp, rank: u32, salt: u64) -> Vec<u8> {
    let mut v = vec![0u8; plan.input_len() as usize * plan.dtype().size() as usize];
    verify::fill_input(plan, op, rank, salt, &mut v).expect("input length");
    v
}

/// The expected output of rank `rank`, or `None` where the collective
/// leaves that rank's output undefined (Reduce on a non-root rank).
pub fn expected(plan: &Plan, op: ReduceOp, rank: u32, salt: u64) -> Option<Vec<u8>> {
    let size = plan.dtype().size() as usize;
    let mut out = Vec::with_capacity(plan.output_len() as usize * size);
    for i in 0..plan.output_len() {
        let e: [u8; MAX_ELEM] = verify::expected(plan, op, rank, i, salt)?;
        out.extend_from_slice(&e[..size]);
    }
    Some(out)
}
