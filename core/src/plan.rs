//! Collective plans: which primitive, on which chunk, at which offsets,
//! every rank takes at every step.
//!
//! A [`Plan`] is validated once ([`Plan::new`]); [`Plan::steps`] then yields,
//! for one (channel, rank), an iterator of [`Step`]s computed in O(1) each
//! without allocation.
//!
//! # Data layout (per rank, in elements; NCCL's)
//!
//! | collective | input | output |
//! |---|---|---|
//! | AllReduce | `count` | `count` |
//! | ReduceScatter | `n · count` (block `b` is rank `b`'s) | `count` |
//! | AllGather | `count` | `n · count` (block `b` from rank `b`) |
//! | Broadcast | `count` (read on the root) | `count` |
//! | Reduce | `count` | `count` (written on the root) |
//!
//! # Channels and loops
//!
//! Channels own contiguous ranges of the buffer (of each block, for
//! ReduceScatter and AllGather): `ceil(count / channels)` rounded up to 16
//! bytes each, the last ones possibly shorter or empty. A channel runs
//! `max(1, ceil(len / span))` loop iterations, where a loop spans `n`
//! chunks for AllReduce and one chunk (per block) otherwise. In a loop,
//! AllReduce's chunk shrinks to `min(chunk, align_up(ceil(rem / n), 16 B))`,
//! so the last loop's chunks are balanced; trailing chunks may be empty and
//! still take their step. Even an empty channel (or `count = 0`) runs one
//! loop of empty steps: every connection then carries the call header, so a
//! mismatched call is always detected and never leaves a rank waiting.
//!
//! # Steps of one loop, ring index `r`, `n ≥ 2` ranks
//!
//! AllReduce, `s` in `0..=2n−2`, chunk `(r − s − 1) mod n`: send,
//! recvReduceSend × (n−2), recvReduceCopySend, recvCopySend × (n−2), recv.
//! ReduceScatter, `s` in `0..n`, chunk `(r − s − 1) mod n`: send,
//! recvReduceSend × (n−2), recvReduceCopy — ring index `r` ends with chunk
//! `r`, which is the block of the rank at ring index `r`. AllGather, `s` in
//! `0..n`, chunk `(r − s) mod n`: copySend, recvCopySend × (n−2), recv.
//! Broadcast: a chain from the root along the ring (copySend, recvCopySend…,
//! recv). Reduce: a chain along the ring ending at the root (send,
//! recvReduceSend…, recvReduceCopy). With one rank every collective is one
//! `copy` per loop.

use crate::error::Error;
use crate::id::{ChannelId, ChunkId, Rank, RingIndex};
use crate::math::{align_up, div_up};
use crate::prim::Primitive;
use crate::reduce::DataType;
use crate::topology::{RingOrder, MAX_CHANNELS};

pub use crate::call::{CallDesc, Collective};

/// One step of one rank on one channel.
///
/// Offsets and counts are in elements. `input_offset` matters when the
/// primitive reads local input ([`Primitive::reads_input`]),
/// `output_offset` when it contains COPY.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Step {
    /// What the step does.
    pub primitive: Primitive,
    /// Loop iteration of the channel.
    pub loop_index: u64,
    /// Step within the loop (`0..steps_per_loop`).
    pub index: u32,
    /// The chunk it touches.
    pub chunk: ChunkId,
    /// Offset into this rank's input buffer.
    pub input_offset: u64,
    /// Offset into this rank's output buffer.
    pub output_offset: u64,
    /// Number of elements (may be 0).
    pub count: u64,
}

/// A validated plan for one collective on one communicator shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    collective: Collective,
    count: u64,
    dtype: DataType,
    ranks: u32,
    channels: u32,
    chunk_elems: u64,
    align_elems: u64,
}

/// The alignment of chunk boundaries, in bytes.
pub const CHUNK_ALIGN: u64 = 16;

impl Plan {
    /// Validates the parameters.
    ///
    /// `count` is the user's element count (per block for ReduceScatter
    /// and AllGather, as in NCCL); `chunk_bytes` the size of one chunk,
    /// a non-zero multiple of the element size.
    pub fn new(
        collective: Collective,
        count: u64,
        dtype: DataType,
        ranks: u32,
        channels: u32,
        chunk_bytes: u64,
    ) -> Result<Plan, Error> {
        if ranks == 0 {
            return Err(Error::NoRanks);
        }
        if channels == 0 || channels > MAX_CHANNELS {
            return Err(Error::BadChannel { channel: channels });
        }
        let elem = u64::from(dtype.size());
        if chunk_bytes == 0 || !chunk_bytes.is_multiple_of(elem) {
            return Err(Error::BadChunk {
                chunk_bytes,
                elem_size: dtype.size(),
            });
        }
        if let Some(root) = collective.root() {
            if root.0 >= ranks {
                return Err(Error::RankOutOfRange {
                    rank: root.0,
                    ranks,
                });
            }
        }
        let plan = Plan {
            collective,
            count,
            dtype,
            ranks,
            channels,
            chunk_elems: chunk_bytes.checked_div(elem).unwrap_or(0),
            align_elems: CHUNK_ALIGN.checked_div(elem).unwrap_or(1),
        };
        // Both buffers, in bytes, must be addressable with u64.
        let blocks = match collective {
            Collective::ReduceScatter | Collective::AllGather => u64::from(ranks),
            _ => 1,
        };
        count
            .checked_mul(blocks)
            .and_then(|elems| elems.checked_mul(elem))
            .ok_or(Error::CountOverflow)?;
        Ok(plan)
    }

    /// The collective.
    pub fn collective(&self) -> Collective {
        self.collective
    }

    /// The user's element count.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// The element type.
    pub fn dtype(&self) -> DataType {
        self.dtype
    }

    /// Number of ranks.
    pub fn ranks(&self) -> u32 {
        self.ranks
    }

    /// Number of channels.
    pub fn channels(&self) -> u32 {
        self.channels
    }

    /// Chunk size in elements.
    pub fn chunk_elems(&self) -> u64 {
        self.chunk_elems
    }

    fn blocks(&self) -> u64 {
        u64::from(self.ranks)
    }

    /// Elements in each rank's input buffer.
    pub fn input_len(&self) -> u64 {
        match self.collective {
            Collective::ReduceScatter => self.count.saturating_mul(self.blocks()),
            _ => self.count,
        }
    }

    /// Elements in each rank's output buffer.
    pub fn output_len(&self) -> u64 {
        match self.collective {
            Collective::AllGather => self.count.saturating_mul(self.blocks()),
            _ => self.count,
        }
    }

    /// Steps each rank takes per loop iteration.
    pub fn steps_per_loop(&self) -> u32 {
        if self.ranks == 1 {
            return 1;
        }
        match self.collective {
            Collective::AllReduce => self.ranks.saturating_mul(2).saturating_sub(1),
            Collective::ReduceScatter | Collective::AllGather => self.ranks,
            Collective::Broadcast { .. } | Collective::Reduce { .. } => 1,
        }
    }

    /// The element range a channel owns (of the buffer, or of each block
    /// for ReduceScatter and AllGather).
    pub fn channel_range(&self, channel: ChannelId) -> Result<core::ops::Range<u64>, Error> {
        let c = u64::from(channel.0);
        if c >= u64::from(self.channels) {
            return Err(Error::BadChannel {
                channel: u32::from(channel.0),
            });
        }
        let per = align_up(
            div_up(self.count, u64::from(self.channels)),
            self.align_elems,
        );
        let start = c.saturating_mul(per).min(self.count);
        let end = c.saturating_add(1).saturating_mul(per).min(self.count);
        Ok(start..end)
    }

    /// Elements one loop iteration of the channel spans (before shrinking).
    fn loop_span(&self) -> u64 {
        match self.collective {
            Collective::AllReduce => self.chunk_elems.saturating_mul(u64::from(self.ranks)),
            _ => self.chunk_elems,
        }
    }

    /// Loop iterations of a channel (at least 1).
    pub fn loops(&self, channel: ChannelId) -> Result<u64, Error> {
        let r = self.channel_range(channel)?;
        Ok(div_up(r.end.saturating_sub(r.start), self.loop_span()).max(1))
    }

    /// Steps a rank takes on a channel; the same for every rank.
    pub fn total_steps(&self, channel: ChannelId) -> Result<u64, Error> {
        Ok(self
            .loops(channel)?
            .saturating_mul(u64::from(self.steps_per_loop())))
    }

    /// The steps of `rank` on `channel`, whose ring is `ring`.
    pub fn steps<M: RingOrder>(
        &self,
        channel: ChannelId,
        rank: Rank,
        ring: M,
    ) -> Result<Steps<M>, Error> {
        if ring.ranks() != self.ranks {
            return Err(Error::BadTopology);
        }
        let range = self.channel_range(channel)?;
        let loops = self.loops(channel)?;
        let index = ring.index_of(rank)?;
        let root_index = match self.collective.root() {
            Some(root) => ring.index_of(root)?,
            None => RingIndex(0),
        };
        let chain_pos = self.chain_pos(index.0, root_index.0);
        let chunk0 = self.chunk_at(index.0, 0);
        let mut steps = Steps {
            plan: *self,
            ring,
            start: range.start,
            end: range.end,
            chain_pos,
            chunk0,
            chunk: chunk0,
            spl: self.steps_per_loop(),
            last: self.ranks.saturating_sub(1),
            two_last: self.ranks.saturating_sub(1).saturating_mul(2),
            chain_prim: self.primitive_at(0, chain_pos),
            loop_start: 0,
            loop_chunk: 0,
            chunk_start: 0,
            chunk_last_start: 0,
            incremental: true,
            fast: false,
            unclipped: false,
            prim: Primitive::SEND_ONLY,
            phase_next: 0,
            run_end: 0,
            loops,
            loop_index: 0,
            step: 0,
        };
        steps.enter_loop();
        Ok(steps)
    }

    /// Position of ring index `r` along a rooted collective's chain (0 =
    /// the chain's first rank); 0 for the ring collectives.
    fn chain_pos(&self, r: u32, root: u32) -> u32 {
        let n = self.ranks;
        let from_root = r
            .wrapping_add(n)
            .wrapping_sub(root)
            .checked_rem(n)
            .unwrap_or(0);
        match self.collective {
            Collective::Broadcast { .. } => from_root,
            // The Reduce chain starts at the root's successor.
            Collective::Reduce { .. } => from_root
                .wrapping_add(n)
                .wrapping_sub(1)
                .checked_rem(n)
                .unwrap_or(0),
            _ => 0,
        }
    }

    /// The chunk ring index `r` touches at step `s` of a loop: `(r − s − 1)
    /// mod n` (AllReduce, ReduceScatter), `(r − s) mod n` (AllGather), 0
    /// for the chains.
    fn chunk_at(&self, r: u32, s: u32) -> u32 {
        let (n, r, s) = (u64::from(self.ranks), u64::from(r), u64::from(s));
        let k = match self.collective {
            _ if self.ranks == 1 => return 0,
            Collective::AllReduce | Collective::ReduceScatter => 1,
            Collective::AllGather => 0,
            Collective::Broadcast { .. } | Collective::Reduce { .. } => return 0,
        };
        // s < 2n: add 3n first, nothing can wrap.
        let v = r
            .wrapping_add(n.wrapping_mul(3))
            .wrapping_sub(s)
            .wrapping_sub(k);
        v.checked_rem(n).unwrap_or(0) as u32
    }

    /// The primitive of step `s` of a loop, for a rank at `chain_pos` along
    /// a rooted collective's chain. Comparisons only: this runs per step.
    fn primitive_at(&self, s: u32, chain_pos: u32) -> Primitive {
        let n = self.ranks;
        if n == 1 {
            return Primitive::COPY_ONLY;
        }
        let last = n.wrapping_sub(1);
        match self.collective {
            Collective::AllReduce => {
                if s == 0 {
                    Primitive::SEND_ONLY
                } else if s < last {
                    Primitive::RECV_REDUCE_SEND
                } else if s == last {
                    Primitive::RECV_REDUCE_COPY_SEND
                } else if s < n.wrapping_mul(2).wrapping_sub(2) {
                    Primitive::RECV_COPY_SEND
                } else {
                    Primitive::RECV_ONLY
                }
            }
            Collective::ReduceScatter => {
                if s == 0 {
                    Primitive::SEND_ONLY
                } else if s < last {
                    Primitive::RECV_REDUCE_SEND
                } else {
                    Primitive::RECV_REDUCE_COPY
                }
            }
            Collective::AllGather => {
                if s == 0 {
                    Primitive::COPY_SEND
                } else if s < last {
                    Primitive::RECV_COPY_SEND
                } else {
                    Primitive::RECV_ONLY
                }
            }
            Collective::Broadcast { .. } => {
                if chain_pos == 0 {
                    Primitive::COPY_SEND
                } else if chain_pos < last {
                    Primitive::RECV_COPY_SEND
                } else {
                    Primitive::RECV_ONLY
                }
            }
            Collective::Reduce { .. } => {
                if chain_pos == 0 {
                    Primitive::SEND_ONLY
                } else if chain_pos < last {
                    Primitive::RECV_REDUCE_SEND
                } else {
                    Primitive::RECV_REDUCE_COPY
                }
            }
        }
    }
}

/// The steps of one rank on one channel; see [`Plan::steps`].
///
/// `repr(C)`: the fields [`next`](Iterator::next)'s hot path reads and
/// writes come first (one cache line), the plan and the loop set-up after.
#[derive(Clone, Debug)]
#[repr(C)]
pub struct Steps<M> {
    step: u32,
    /// Steps below this take the hot path of [`next`](Iterator::next)
    /// (0: none do, until the slow path has set up the phase).
    run_end: u32,
    /// Chunk of the current step (moves back one per step, mod n).
    chunk: u32,
    /// `n − 1` and `2n − 2`: where the primitive table's phases end.
    last: u32,
    /// Fast path: the primitive of the current phase of the table.
    prim: Primitive,
    /// AllReduce: where the current chunk starts (before clamping), and
    /// where chunk `n − 1` starts.
    chunk_start: u64,
    chunk_last_start: u64,
    /// The current loop's chunk size and first element.
    loop_chunk: u64,
    loop_index: u64,
    loop_start: u64,
    two_last: u32,
    /// Fast path: the step at which the next phase begins.
    phase_next: u32,
    /// Steps per loop.
    spl: u32,
    /// Chunk of step 0 of every loop.
    chunk0: u32,
    /// Position along a rooted collective's chain.
    chain_pos: u32,
    /// The chains' one primitive per loop.
    chain_prim: Primitive,
    incremental: bool,
    /// AllReduce over 2+ ranks with incremental offsets: the common case,
    /// which [`next`](Iterator::next) takes without the general match.
    fast: bool,
    /// Fast path: every chunk of this loop lies wholly inside the range
    /// (no clamping at `end`).
    unclipped: bool,
    loops: u64,
    start: u64,
    end: u64,
    plan: Plan,
    ring: M,
}

impl<M: RingOrder> Steps<M> {
    /// The plan these steps belong to.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// Steps not yet yielded.
    pub fn remaining(&self) -> u64 {
        let per = u64::from(self.spl);
        self.loops
            .saturating_sub(self.loop_index)
            .saturating_mul(per)
            .saturating_sub(u64::from(self.step))
    }

    /// Sets the loop-level values (once per loop, not per step: the
    /// divisions live here).
    #[inline]
    fn enter_loop(&mut self) {
        let p = &self.plan;
        let ls = self
            .start
            .saturating_add(self.loop_index.saturating_mul(p.loop_span()))
            .min(self.end);
        let rem = self.end.saturating_sub(ls);
        self.loop_start = ls;
        self.loop_chunk = match p.collective {
            // The last loop's chunks shrink to an aligned n-th of the rest.
            Collective::AllReduce => p
                .chunk_elems
                .min(align_up(div_up(rem, u64::from(p.ranks)), p.align_elems)),
            _ => p.chunk_elems.min(rem),
        };
        self.chunk = self.chunk0;
        let last_start = u64::from(self.last)
            .checked_mul(self.loop_chunk)
            .and_then(|o| ls.checked_add(o));
        self.incremental = last_start.is_some();
        self.fast = self.incremental && p.collective == Collective::AllReduce && self.last > 0;
        self.chunk_last_start = last_start.unwrap_or(u64::MAX);
        self.unclipped = last_start
            .and_then(|l| l.checked_add(self.loop_chunk))
            .is_some_and(|e| e <= self.end);
        self.phase_next = 0;
        self.run_end = 0;
        self.chunk_start =
            ls.saturating_add(u64::from(self.chunk0).saturating_mul(self.loop_chunk));
    }

    /// Moves to the next loop; false at the end. Kept out of line: it runs
    /// once per loop, [`next`](Iterator::next) once per step.
    #[inline(always)]
    fn next_loop(&mut self) -> bool {
        cold_path();
        if self.loop_index.saturating_add(1) >= self.loops {
            return false;
        }
        self.loop_index = self.loop_index.saturating_add(1);
        self.step = 0;
        self.enter_loop();
        true
    }
}

/// Marks the branch that calls it as unlikely.
#[cold]
#[inline(never)]
fn cold_path() {}

impl<M: RingOrder> Iterator for Steps<M> {
    type Item = Step;

    #[inline(always)]
    fn next(&mut self) -> Option<Step> {
        let s = self.step;
        if s < self.run_end {
            // The hot path: AllReduce, inside one phase of the table, every
            // chunk of the loop wholly in range. One compare per step.
            let cs = self.chunk_start;
            return self.emit(s, self.prim, cs, cs, self.loop_chunk);
        }
        self.next_slow()
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let r = self.remaining();
        match usize::try_from(r) {
            Ok(r) => (r, Some(r)),
            Err(_) => (usize::MAX, None),
        }
    }
}

impl<M: RingOrder> Steps<M> {
    /// [`next`](Iterator::next) off its hot path: a new loop or phase, the
    /// end, clamped chunks, and every other case.
    #[inline(always)]
    fn next_slow(&mut self) -> Option<Step> {
        cold_path();
        if self.step >= self.spl && !self.next_loop() {
            return None;
        }
        let s = self.step;
        let chunk = self.chunk;
        if !self.fast {
            return self.next_general(s, chunk);
        }
        if s >= self.phase_next {
            self.enter_phase(s);
        }
        let lc = self.loop_chunk;
        let (cs, count) = if self.unclipped {
            // The next steps of this phase take the hot path.
            self.run_end = self.phase_next.min(self.spl);
            (self.chunk_start, lc)
        } else {
            let cs = self.chunk_start.min(self.end);
            let ce = cs.saturating_add(lc).min(self.end);
            (cs, ce.saturating_sub(cs))
        };
        self.emit(s, self.prim, cs, cs, count)
    }

    /// Every other case of [`next`](Iterator::next): one rank, the other
    /// collectives, offsets near the top of the u64 range. Inlined behind
    /// [`next_slow`](Steps::next_slow)'s cold hint: a call would take the
    /// iterator's address and keep its fields in memory on the hot path.
    #[inline(always)]
    fn next_general(&mut self, s: u32, chunk: u32) -> Option<Step> {
        cold_path();
        let last = self.last;
        let (ls, lc) = (self.loop_start, self.loop_chunk);
        let p = &self.plan;
        let (primitive, input_offset, output_offset, count) = match p.collective {
            _ if last == 0 => {
                // One rank: a copy; AllReduce's aligned chunk may overhang.
                let len = lc.min(self.end.saturating_sub(ls));
                (Primitive::COPY_ONLY, ls, ls, len)
            }
            Collective::AllReduce => {
                let prim = if s == 0 {
                    Primitive::SEND_ONLY
                } else if s < last {
                    Primitive::RECV_REDUCE_SEND
                } else if s == last {
                    Primitive::RECV_REDUCE_COPY_SEND
                } else if s < self.two_last {
                    Primitive::RECV_COPY_SEND
                } else {
                    Primitive::RECV_ONLY
                };
                // `chunk_start` = ls + chunk · lc, kept incrementally when
                // the loop's largest offset fits in a u64 (always, but for
                // buffers at the very end of the address space).
                let cs = if self.incremental {
                    self.chunk_start
                } else {
                    ls.saturating_add(u64::from(chunk).saturating_mul(lc))
                }
                .min(self.end);
                let ce = cs.saturating_add(lc).min(self.end);
                (prim, cs, cs, ce.saturating_sub(cs))
            }
            Collective::ReduceScatter | Collective::AllGather => {
                let prim = p.primitive_at(s, self.chain_pos);
                let rank = self
                    .ring
                    .rank_at(RingIndex(chunk))
                    .map(|r| r.0)
                    .unwrap_or(chunk);
                let block = u64::from(rank).saturating_mul(p.count).saturating_add(ls);
                if p.collective == Collective::ReduceScatter {
                    (prim, block, ls, lc)
                } else {
                    (prim, ls, block, lc)
                }
            }
            _ => (self.chain_prim, ls, ls, lc),
        };
        self.emit(s, primitive, input_offset, output_offset, count)
    }

    /// Step `s` (on the current chunk) with these values; moves on to the
    /// next step: its chunk is one back (mod n) and starts one loop chunk
    /// earlier.
    #[inline(always)]
    fn emit(
        &mut self,
        s: u32,
        primitive: Primitive,
        input_offset: u64,
        output_offset: u64,
        count: u64,
    ) -> Option<Step> {
        let chunk = self.chunk;
        let step = Step {
            primitive,
            loop_index: self.loop_index,
            index: s,
            chunk: ChunkId(chunk),
            input_offset,
            output_offset,
            count,
        };
        self.step = s.wrapping_add(1);
        if chunk == 0 {
            self.chunk = self.last;
            self.chunk_start = self.chunk_last_start;
        } else {
            self.chunk = chunk.wrapping_sub(1);
            // Exact when `incremental` (ls + chunk · lc did not overflow, so
            // chunk_start >= lc); unused otherwise. Not saturating: a
            // compare and select here would lengthen the one dependency
            // chain that runs through every step.
            self.chunk_start = self.chunk_start.wrapping_sub(self.loop_chunk);
        }
        Some(step)
    }

    /// Fast path, at the first step `s` of a phase of AllReduce's table
    /// (five times a loop): its primitive and where the next phase begins.
    /// Empty phases (n = 2 has no recvReduceSend or recvCopySend) are
    /// skipped because the next boundary is computed from `s` itself.
    #[inline(always)]
    fn enter_phase(&mut self, s: u32) {
        let (last, two_last) = (self.last, self.two_last);
        let (prim, next) = if s == 0 {
            (Primitive::SEND_ONLY, 1)
        } else if s < last {
            (Primitive::RECV_REDUCE_SEND, last)
        } else if s == last {
            (Primitive::RECV_REDUCE_COPY_SEND, last.saturating_add(1))
        } else if s < two_last {
            (Primitive::RECV_COPY_SEND, two_last)
        } else {
            (Primitive::RECV_ONLY, u32::MAX)
        };
        self.prim = prim;
        self.phase_next = next;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::InOrderRing;

    /// `primitive_at`, the rule of the collectives whose steps look it up,
    /// gives every ring collective's primitives as the step iterator hands
    /// them out — AllReduce's too, which the iterator computes inline.
    #[test]
    fn primitive_at_agrees_with_the_steps() {
        for n in [1u32, 2, 3, 5] {
            for collective in [
                Collective::AllReduce,
                Collective::ReduceScatter,
                Collective::AllGather,
            ] {
                let plan = Plan::new(collective, 1000, DataType::F32, n, 2, 64).unwrap();
                for c in 0..2 {
                    for r in 0..n {
                        let ring = InOrderRing { ranks: n };
                        for s in plan.steps(ChannelId(c), Rank(r), ring).unwrap() {
                            assert_eq!(
                                plan.primitive_at(s.index, 0),
                                s.primitive,
                                "{collective:?} n={n} rank {r} step {}",
                                s.index
                            );
                        }
                    }
                }
            }
        }
    }
}
