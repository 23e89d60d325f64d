//! Payload runs without user buffers: every rank's input is generated
//! where the simulated GPU reads it, every output element is checked where
//! it is written.
//!
//! A checked run of the simulator with real buffers holds every rank's
//! input and output — ranks × size × 2 bytes — and then computes each
//! rank's expected output. [`GeneratedData`] holds instead what the check
//! needs: the reduction of the call's inputs, computed once for the call
//! (and shared by the ranks, so the check is O(count) per rank), and one
//! bit per output element and rank saying whether its last write was
//! right. Inputs come from [`ringcc_core::verify`]'s exact values, as
//! `fill_input` would have written them.
//!
//! In place, a rank reads the buffer it writes: a read of an element it
//! already wrote sees what it wrote — the reference value where the write
//! was right, the wrong bytes themselves (kept per element) where not — so
//! a schedule that reads what it has overwritten is still caught, as with
//! real memory.

use std::collections::HashMap;
use std::sync::Arc;

use ringcc_core::verify::{self, Elem, MAX_ELEM};
use ringcc_core::{Collective, Plan, Rank};

use crate::error::Error;
use crate::report::{BufLayout, Call};

/// One rank's record of its output.
#[derive(Debug, Default, Clone)]
struct RankCheck {
    /// Bit `i`: output element `i` was last written with the right value.
    ok: Vec<u64>,
    /// In place: the bytes of elements last written wrong (or written at
    /// all where the output is undefined), so later reads see them.
    odd: HashMap<u64, Elem>,
}

impl RankCheck {
    fn get(&self, i: u64) -> bool {
        self.ok
            .get((i / 64) as usize)
            .is_some_and(|w| w & (1 << (i % 64)) != 0)
    }

    fn set(&mut self, i: u64, v: bool) {
        if let Some(w) = self.ok.get_mut((i / 64) as usize) {
            if v {
                *w |= 1 << (i % 64);
            } else {
                *w &= !(1 << (i % 64));
            }
        }
    }

    /// Marks elements `lo..hi` right, a word at a time.
    fn set_range(&mut self, lo: u64, hi: u64) {
        let mut i = lo;
        while i < hi {
            let bit = i % 64;
            let n = (64 - bit).min(hi - i);
            let mask = if n == 64 {
                u64::MAX
            } else {
                ((1u64 << n) - 1) << bit
            };
            if let Some(w) = self.ok.get_mut((i / 64) as usize) {
                *w |= mask;
            }
            i += n;
        }
    }

    /// Whether any element of `lo..hi` was written (right or wrong).
    fn any_written(&self, lo: u64, hi: u64) -> bool {
        if !self.odd.is_empty() {
            return true;
        }
        let (a, b) = ((lo / 64) as usize, hi.div_ceil(64) as usize);
        self.ok
            .get(a..b.min(self.ok.len()))
            .is_some_and(|ws| ws.iter().any(|w| *w != 0))
    }

    fn right(&self, len: u64) -> u64 {
        let full = (len / 64) as usize;
        let mut n: u64 = self
            .ok
            .iter()
            .take(full)
            .map(|w| u64::from(w.count_ones()))
            .sum();
        if !len.is_multiple_of(64) {
            if let Some(w) = self.ok.get(full) {
                n += u64::from((w & ((1u64 << (len % 64)) - 1)).count_ones());
            }
        }
        n
    }
}

/// Inputs generated where they are read and outputs checked where they
/// are written, for one call on every rank of a payload-mode cluster
/// ([`Cluster::run_generated`](crate::Cluster::run_generated)).
///
/// Memory: the reference (one rank's output for AllReduce and Reduce, one
/// rank's input for ReduceScatter, nothing for AllGather and Broadcast,
/// whose expected values are single inputs) plus one bit per output
/// element and rank; see [`GeneratedData::bytes_needed`].
#[derive(Debug, Default)]
pub struct GeneratedData {
    call: Option<Call>,
    plan: Option<Plan>,
    ranks: u32,
    salt: u64,
    in_place: bool,
    /// The reduction of every rank's input element `i` (reducing
    /// collectives), encoded.
    reference: Arc<Vec<u8>>,
    checks: Vec<RankCheck>,
    layouts: Vec<BufLayout>,
    scratch: Vec<u8>,
    want: Vec<u8>,
    /// Test-only fault: the first `.1` output elements of rank `.0` are
    /// corrupted as they are written.
    corrupt: (u32, u64),
}

/// Whether `c`'s expected output needs the reduction of every rank.
fn reduces(c: Collective) -> bool {
    matches!(
        c,
        Collective::AllReduce | Collective::ReduceScatter | Collective::Reduce { .. }
    )
}

impl GeneratedData {
    /// Bytes this check holds for `call` on `ranks` ranks (the reference
    /// and the per-rank bits), to estimate a run before making it.
    pub fn bytes_needed(call: &Call, ranks: u32) -> u64 {
        Self::reference_bytes(call, ranks).saturating_add(Self::run_bytes(call, ranks))
    }

    /// Bytes of the reference alone, which [`share`](Self::share)d checks
    /// hold once between them.
    pub fn reference_bytes(call: &Call, ranks: u32) -> u64 {
        let elem = call.elem() as u64;
        match call.collective {
            Collective::AllReduce | Collective::Reduce { .. } => call.count.saturating_mul(elem),
            Collective::ReduceScatter => call
                .count
                .saturating_mul(u64::from(ranks))
                .saturating_mul(elem),
            _ => 0,
        }
    }

    /// Bytes each check of a call holds for itself: a bit per output
    /// element and rank.
    pub fn run_bytes(call: &Call, ranks: u32) -> u64 {
        let n = u64::from(ranks);
        let out_elems = match call.collective {
            Collective::AllGather => call.count.saturating_mul(n),
            _ => call.count,
        };
        out_elems.div_ceil(8).saturating_mul(n)
    }

    /// The check of `call` on `ranks` ranks with inputs salted by `salt`:
    /// computes the reference (on every core of the machine).
    pub fn new(call: Call, ranks: u32, salt: u64) -> Result<GeneratedData, Error> {
        let invalid = |source| Error::InvalidCall {
            rank: Rank(0),
            source,
        };
        let plan = Plan::new(call.collective, call.count, call.dtype, ranks, 1, 1 << 20)
            .map_err(invalid)?;
        let elem = call.elem();
        let mut reference = Vec::new();
        if reduces(call.collective) {
            let n = match call.collective {
                Collective::ReduceScatter => plan.input_len(),
                _ => plan.output_len(),
            };
            let bytes = usize::try_from(n)
                .ok()
                .and_then(|n| n.checked_mul(elem))
                .ok_or_else(|| Error::BadConfig {
                    what: format!("a reference of {n} elements does not fit this machine"),
                })?;
            // A reference larger than the machine's memory is an error
            // to report, not an allocation abort.
            reference
                .try_reserve_exact(bytes)
                .map_err(|_| Error::BadConfig {
                    what: format!(
                        "cannot allocate the check's reference: {bytes} bytes (one rank's {})",
                        if matches!(call.collective, Collective::ReduceScatter) {
                            "input"
                        } else {
                            "output"
                        }
                    ),
                })?;
            reference.resize(bytes, 0);
            fill_reduced_parallel(&call, ranks, salt, &mut reference).map_err(invalid)?;
        }
        Ok(GeneratedData {
            call: Some(call),
            plan: Some(plan),
            ranks,
            salt,
            reference: Arc::new(reference),
            ..GeneratedData::default()
        })
    }

    /// Another check of the same call and inputs, sharing the reference
    /// (computed once): for a second run at the same time, e.g. the other
    /// placement on another thread.
    pub fn share(&self) -> GeneratedData {
        GeneratedData {
            call: self.call,
            plan: self.plan,
            ranks: self.ranks,
            salt: self.salt,
            reference: Arc::clone(&self.reference),
            corrupt: self.corrupt,
            ..GeneratedData::default()
        }
    }

    /// The call this check is for.
    pub fn call(&self) -> Option<Call> {
        self.call
    }

    /// The salt of the generated inputs.
    pub fn salt(&self) -> u64 {
        self.salt
    }

    /// Test-only fault: the first `elements` output elements of `rank` are
    /// corrupted (a byte flipped) as they are written, so the check must
    /// count them.
    pub fn corrupt_output(&mut self, rank: Rank, elements: u64) {
        self.corrupt = (rank.get(), elements);
    }

    /// Starts a run: no output element written yet.
    pub(crate) fn begin(&mut self, in_place: bool) -> Result<(), Error> {
        let Some(call) = self.call else {
            return Err(Error::BadConfig {
                what: "GeneratedData::default() holds no call: build it with GeneratedData::new"
                    .into(),
            });
        };
        self.in_place = in_place;
        let out_elems = self.out_elems() as usize;
        self.layouts = (0..self.ranks)
            .map(|r| BufLayout::new(&call, self.ranks, r, in_place))
            .collect();
        self.checks
            .resize_with(self.ranks as usize, RankCheck::default);
        for c in &mut self.checks {
            c.ok.clear();
            c.ok.resize(out_elems.div_ceil(64), 0);
            c.odd.clear();
        }
        Ok(())
    }

    fn elem(&self) -> usize {
        self.call.map_or(1, |c| c.elem())
    }

    fn out_elems(&self) -> u64 {
        self.plan.as_ref().map_or(0, |p| p.output_len())
    }

    /// Whether rank `rank`'s output is defined (not Reduce off the root).
    fn defined(&self, rank: u32) -> bool {
        match self.call.map(|c| c.collective) {
            Some(Collective::Reduce { root }) => root.0 == rank,
            _ => true,
        }
    }

    /// Writes the expected output elements `first..` of `rank` into
    /// `out` (a defined output).
    fn expect_into(&self, rank: u32, first: u64, out: &mut [u8]) -> Result<(), ringcc_core::Error> {
        let (Some(call), Some(plan)) = (self.call, self.plan.as_ref()) else {
            return Ok(());
        };
        let elem = self.elem();
        let base = match call.collective {
            Collective::ReduceScatter => u64::from(rank) * call.count,
            _ => 0,
        };
        if reduces(call.collective) {
            let at = ((base + first) as usize).saturating_mul(elem);
            let src = self.reference.get(at..at.saturating_add(out.len())).ok_or(
                ringcc_core::Error::BadLength {
                    dst: out.len(),
                    src: self.reference.len().saturating_sub(at),
                },
            )?;
            out.copy_from_slice(src);
            Ok(())
        } else {
            verify::fill_expected(plan, call.op, rank, first, self.salt, out).map(|_| ())
        }
    }

    /// Rank `rank`'s input bytes at input element `offset` (`bytes` long),
    /// as the call's layout places them.
    pub(crate) fn input(
        &mut self,
        rank: u32,
        offset: u64,
        bytes: usize,
    ) -> Result<&[u8], ringcc_core::Error> {
        let Some(call) = self.call else {
            return Err(ringcc_core::Error::BadLength { dst: bytes, src: 0 });
        };
        let elem = self.elem();
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.resize(bytes, 0);
        verify::fill_values(
            call.dtype,
            call.op,
            self.ranks,
            rank,
            offset,
            self.salt,
            &mut scratch,
        )?;
        if self.in_place {
            self.patch_written(rank, offset, &mut scratch, elem)?;
        }
        self.scratch = scratch;
        Ok(&self.scratch)
    }

    /// In place: replaces the input elements of `buf` (from input element
    /// `offset`) that the rank already overwrote with what it wrote.
    fn patch_written(
        &self,
        rank: u32,
        offset: u64,
        buf: &mut [u8],
        elem: usize,
    ) -> Result<(), ringcc_core::Error> {
        let (Some(lay), Some(check)) = (
            self.layouts.get(rank as usize),
            self.checks.get(rank as usize),
        ) else {
            return Ok(());
        };
        let (in_at, out_at) = ((lay.input_at / elem) as u64, (lay.output_at / elem) as u64);
        let out_len = self.out_elems();
        let n = (buf.len() / elem) as u64;
        // The buffer elements the read covers, as output indices.
        let lo = (in_at + offset).max(out_at);
        let hi = (in_at + offset + n).min(out_at + out_len);
        if lo >= hi || !check.any_written(lo - out_at, hi - out_at) {
            return Ok(());
        }
        let mut e = [0u8; MAX_ELEM];
        for b in lo..hi {
            let o = b - out_at;
            let at = ((b - in_at - offset) as usize) * elem;
            let Some(dst) = buf.get_mut(at..at + elem) else {
                continue;
            };
            if let Some(bytes) = check.odd.get(&o) {
                dst.copy_from_slice(&bytes[..elem]);
            } else if check.get(o) {
                self.expect_into(rank, o, &mut e[..elem])?;
                dst.copy_from_slice(&e[..elem]);
            }
        }
        Ok(())
    }

    /// Rank `rank` writes `data` at output element `offset`.
    pub(crate) fn write(
        &mut self,
        rank: u32,
        offset: u64,
        data: &[u8],
    ) -> Result<(), ringcc_core::Error> {
        let elem = self.elem();
        let n = (data.len() / elem) as u64;
        let out_len = self.out_elems();
        if offset.saturating_add(n) > out_len || !data.len().is_multiple_of(elem) {
            return Err(ringcc_core::Error::BadLength {
                dst: out_len.saturating_sub(offset) as usize * elem,
                src: data.len(),
            });
        }
        let r = rank as usize;
        if !self.defined(rank) {
            // Nothing to check; in place, later reads see what was written.
            if self.in_place {
                if let Some(check) = self.checks.get_mut(r) {
                    for (i, d) in data.chunks_exact(elem).enumerate() {
                        let mut e = [0u8; MAX_ELEM];
                        e[..elem].copy_from_slice(d);
                        check.odd.insert(offset + i as u64, e);
                    }
                }
            }
            return Ok(());
        }
        let mut want = std::mem::take(&mut self.want);
        want.resize(data.len(), 0);
        let res = self.expect_into(rank, offset, &mut want);
        let (victim, corrupt) = self.corrupt;
        let in_place = self.in_place;
        let corrupted = rank == victim && offset < corrupt;
        if let (Ok(()), Some(check)) = (&res, self.checks.get_mut(r)) {
            if !corrupted && want == data {
                // The common case: the whole slice is right.
                check.set_range(offset, offset + n);
                if in_place && !check.odd.is_empty() {
                    for o in offset..offset + n {
                        check.odd.remove(&o);
                    }
                }
            } else {
                for (i, (w, d)) in want
                    .chunks_exact(elem)
                    .zip(data.chunks_exact(elem))
                    .enumerate()
                {
                    let o = offset + i as u64;
                    let mut got = [0u8; MAX_ELEM];
                    got[..elem].copy_from_slice(d);
                    if rank == victim && o < corrupt {
                        got[0] ^= 0x5a;
                    }
                    let right = w == &got[..elem];
                    check.set(o, right);
                    if in_place {
                        if right {
                            check.odd.remove(&o);
                        } else {
                            check.odd.insert(o, got);
                        }
                    }
                }
            }
        }
        self.want = want;
        res
    }

    /// nccl-tests' `#wrong` of the last run: output elements of every rank
    /// whose output is defined that were never written, or last written
    /// with a wrong value.
    pub fn wrong(&self) -> u64 {
        let len = self.out_elems();
        (0..self.ranks)
            .filter(|r| self.defined(*r))
            .filter_map(|r| self.checks.get(r as usize))
            .map(|c| len - c.right(len).min(len))
            .sum()
    }
}

/// [`verify::fill_reduced`] over `out`, split across the machine's cores.
fn fill_reduced_parallel(
    call: &Call,
    ranks: u32,
    salt: u64,
    out: &mut [u8],
) -> Result<(), ringcc_core::Error> {
    let elem = call.elem();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    // Whole elements per part, at least 64 Ki of them.
    let per = (out.len() / elem).div_ceil(threads).max(1 << 16) * elem;
    std::thread::scope(|s| {
        let parts: Vec<_> = out
            .chunks_mut(per)
            .enumerate()
            .map(|(i, part)| {
                let first = (i * per / elem) as u64;
                s.spawn(move || verify::fill_reduced(call.dtype, call.op, ranks, first, salt, part))
            })
            .collect();
        parts
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or(Err(ringcc_core::Error::BadLength { dst: 0, src: 0 }))
            })
            .collect::<Result<Vec<()>, _>>()
    })
    .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringcc_core::{DataType, ReduceOp};

    /// In place, a read of an element already written sees the write: the
    /// reference where it was right, the wrong bytes where not; an element
    /// not yet written is still the input.
    #[test]
    fn in_place_reads_see_earlier_writes() {
        let call = Call::new(Collective::AllReduce, 8, DataType::I32, ReduceOp::Sum);
        let mut g = GeneratedData::new(call, 3, 5).unwrap();
        g.begin(true).unwrap();
        let input: Vec<u8> = g.input(1, 0, 32).unwrap().to_vec();
        let mut right = vec![0u8; 32];
        verify::fill_reduced(DataType::I32, ReduceOp::Sum, 3, 0, 5, &mut right).unwrap();
        g.write(1, 2, &right[8..12]).unwrap(); // element 2: right
        g.write(1, 5, &[9, 9, 9, 9]).unwrap(); // element 5: wrong
        let now = g.input(1, 0, 32).unwrap().to_vec();
        assert_eq!(now[..8], input[..8]);
        assert_eq!(now[8..12], right[8..12]);
        assert_eq!(now[12..20], input[12..20]);
        assert_eq!(now[20..24], [9, 9, 9, 9]);
        assert_eq!(now[24..], input[24..]);
        // Rank 1: 7 elements not right; ranks 0 and 2 wrote nothing.
        assert_eq!(g.wrong(), 7 + 8 + 8);
        // Rewritten right, it counts as right and reads as the reference.
        g.write(1, 5, &right[20..24]).unwrap();
        assert_eq!(g.input(1, 5, 4).unwrap(), &right[20..24]);
        assert_eq!(g.wrong(), 6 + 8 + 8);
        // Out of place, reads never see writes.
        g.begin(false).unwrap();
        g.write(1, 0, &[1, 2, 3, 4]).unwrap();
        assert_eq!(g.input(1, 0, 32).unwrap(), &input[..]);
    }

    #[test]
    fn writes_outside_the_output_are_typed_errors() {
        let call = Call::new(
            Collective::Broadcast {
                root: ringcc_core::Rank(0),
            },
            4,
            DataType::F32,
            ReduceOp::Sum,
        );
        let mut g = GeneratedData::new(call, 2, 0).unwrap();
        g.begin(false).unwrap();
        assert!(g.write(0, 3, &[0; 8]).is_err());
        assert!(g.write(0, 0, &[0; 3]).is_err());
        assert!(g.write(0, 0, &[0; 16]).is_ok());
    }
}
