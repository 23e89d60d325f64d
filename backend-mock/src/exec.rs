//! Carrying out one slice (`Exec`) on a GPU: the bytes (payload mode) and
//! the time.
//!
//! The data flow is the core's: the incoming slot (RECV) or the input,
//! reduced with the input (REDUCE, `incoming ⊕ local`, finalized where the
//! primitive completes the reduction), copied to the output (COPY), and
//! sent (SEND): over NVLink straight into the successor's slot, or into
//! the rank's staging slot, from which the RNIC sends it once the slice is
//! done.
//!
//! Time: the bytes the slice moves through device memory over the GPU's
//! bandwidth, plus a fixed overhead; an NVLink store streams while the
//! block computes, so the slice is done when both the compute and the link
//! transfer (a serial resource shared by every channel using that GPU
//! pair) are. The successor sees the slot and the `tail` one link latency
//! after the last byte left.

use ringcc_core::prim::{slice_result, Exec};
use ringcc_core::{Primitive, Rank};

use crate::error::Error;
use crate::events::{Ev, NONE};
use crate::fabric::Hop;
use crate::sim::{RunCtx, RunData, Sim};
use crate::trace::Rec;

/// NVLink payload in flight: lands in `lane`'s FIFO at `offset`.
#[derive(Debug)]
pub(crate) struct Xfer {
    pub rank: u32,
    pub offset: usize,
    pub data: Vec<u8>,
}

impl<const N: usize> Sim<N> {
    #[inline(always)]
    pub(crate) fn start_exec(&mut self, l: u32, e: &Exec) -> Result<(), Error> {
        let now = self.events.now();
        let t = self.lanes[l].t;
        let elem = self.run.elem[t.rank as usize];
        let bytes = e.count.saturating_mul(elem);
        let p = e.primitive;
        let result = if self.cfg.payload {
            Some(self.compute(l, e, bytes as usize)?)
        } else {
            None
        };
        let net_send = e.send.is_some() && matches!(t.hop, Hop::Net { .. });
        let touched = u64::from(p.contains(Primitive::RECV))
            + u64::from(p.reads_input())
            + u64::from(p.contains(Primitive::COPY))
            + u64::from(net_send);
        let mut done = now
            .saturating_add(self.time.gpu_overhead)
            .saturating_add(self.time.gpu_rate.time(touched * bytes));
        // A channel is one thread block: what it can push per second is
        // bounded whatever the link could take.
        let wire = self.time.wire_bytes(bytes);
        let channel_end = match self.time.channel_rate {
            Some(r) => {
                let end = now.saturating_add(r.time(wire));
                done = done.max(end);
                end
            }
            None => 0,
        };
        if let Some(span) = e.send {
            match t.hop {
                Hop::Nvlink { link } => {
                    let succ = self.fab.lane(t.channel, t.next);
                    if let Some(h) = e.header {
                        self.lanes.cold[succ as usize].mailbox = Some((span.step, h));
                    }
                    let res = &mut self.fab.links[link as usize];
                    let (start, end) = res.reserve(now, wire);
                    let end = end.max(channel_end);
                    let arrive = end.saturating_add(res.latency);
                    done = done.max(end);
                    if self.trace.on {
                        self.trace.push(Rec::Xfer {
                            link,
                            start,
                            end,
                            bytes,
                            from: t.rank,
                            to: t.next,
                            channel: t.channel,
                        });
                    }
                    if self.faults.nvlinks.delivers(t.rank, t.next, start) {
                        let xfer = match result {
                            Some(data) => self.xfers.insert(Xfer {
                                rank: t.next,
                                offset: self.lanes.cold[succ as usize].mem.inbox
                                    + span.byte_offset(&self.cfg.geometry) as usize,
                                data,
                            }),
                            None => NONE,
                        };
                        self.events.at(
                            arrive,
                            Ev::Tail {
                                lane: succ,
                                hdr: e.header.is_some(),
                                xfer,
                                tail: span.end() as u32,
                            },
                        );
                    }
                }
                Hop::Net { .. } => {
                    if let Some(data) = result {
                        let off = self.lanes.cold[l as usize].mem.staging
                            + span.byte_offset(&self.cfg.geometry) as usize;
                        self.mem.write(t.rank, off, &data);
                    }
                }
                Hop::Loopback => {}
            }
        }
        self.stats.execs += 1;
        if self.trace.on {
            self.trace.push(Rec::Exec {
                lane: l,
                start: now,
                end: done,
                prim: p,
                chunk: e.chunk.0,
                step: e.step_index,
                slice: e.slice,
                loop_index: e.loop_index,
                bytes,
            });
        }
        self.events.at(done, Ev::ExecDone { lane: l });
        Ok(())
    }

    /// Payload mode: computes the slice's result, writes the output, and
    /// returns the bytes to send.
    fn compute(&mut self, l: u32, e: &Exec, bytes: usize) -> Result<Vec<u8>, Error> {
        let t = self.lanes[l].t;
        let rank = t.rank;
        let call = self.run.calls[rank as usize];
        let p = e.primitive;
        let missing = |what: &'static str| Error::Reduce {
            rank: t.rank_id(),
            call: what,
            source: ringcc_core::Error::BadLength { dst: bytes, src: 0 },
        };
        let incoming = match e.recv {
            Some(span) => {
                let off = self.lanes.cold[l as usize].mem.inbox
                    + span.byte_offset(&self.cfg.geometry) as usize;
                let s = self.mem.read(rank, off, bytes);
                if s.len() != bytes {
                    return Err(missing("read FIFO slot"));
                }
                Some(s)
            }
            None => None,
        };
        let local = if p.reads_input() {
            Some(self.run.payload_input(rank, e.input_offset, bytes)?)
        } else {
            None
        };
        let mut result = vec![0u8; bytes];
        if incoming.is_none() && local.is_none() {
            return Err(missing("primitive without data"));
        }
        slice_result(
            p,
            call.dtype,
            call.op,
            self.fab.ranks,
            incoming,
            local,
            &mut result,
        )
        .map_err(|source| Error::Reduce {
            rank: t.rank_id(),
            call: "slice_result",
            source,
        })?;
        if p.contains(Primitive::COPY) {
            self.run.payload_output(rank, e.output_offset, &result)?;
        }
        Ok(result)
    }

    /// NVLink payload lands in the receiver's slot.
    pub(crate) fn land(&mut self, xfer: u32) {
        if let Some(x) = self.xfers.take(xfer) {
            self.mem.write(x.rank, x.offset, &x.data);
        }
    }
}

impl RunCtx {
    /// Payload mode: `bytes` of `rank`'s input from input element
    /// `input_offset` (in place: from the output buffer), from the
    /// callers' buffers or generated where read.
    pub(crate) fn payload_input(
        &mut self,
        rank: u32,
        input_offset: u64,
        bytes: usize,
    ) -> Result<&[u8], Error> {
        let lay = self.layouts[rank as usize];
        let elem = self.elem[rank as usize] as usize;
        let missing = payload_missing(rank, bytes, "read input");
        match &mut self.data {
            RunData::Buffers(b) => {
                let at = lay.input_at + input_offset as usize * elem;
                let b = b.get(rank as usize).ok_or_else(missing)?;
                let src = if lay.in_place { &b.output } else { &b.input };
                src.get(at..at + bytes).ok_or_else(missing)
            }
            RunData::Generated(g) => {
                g.input(rank, input_offset, bytes)
                    .map_err(|source| Error::Reduce {
                        rank: Rank(rank),
                        call: "generate input",
                        source,
                    })
            }
            RunData::None => Err(missing()),
        }
    }

    /// Payload mode: `rank` writes `data` at output element
    /// `output_offset` (generated data: checked there).
    pub(crate) fn payload_output(
        &mut self,
        rank: u32,
        output_offset: u64,
        data: &[u8],
    ) -> Result<(), Error> {
        let lay = self.layouts[rank as usize];
        let elem = self.elem[rank as usize] as usize;
        let missing = payload_missing(rank, data.len(), "write output");
        match &mut self.data {
            RunData::Buffers(b) => {
                let at = lay.output_at + output_offset as usize * elem;
                b.get_mut(rank as usize)
                    .and_then(|b| b.output.get_mut(at..at + data.len()))
                    .ok_or_else(missing)?
                    .copy_from_slice(data);
                Ok(())
            }
            RunData::Generated(g) => {
                g.write(rank, output_offset, data)
                    .map_err(|source| Error::Reduce {
                        rank: Rank(rank),
                        call: "check output",
                        source,
                    })
            }
            RunData::None => Err(missing()),
        }
    }
}

/// The error of a payload access that found no bytes where `what` needed
/// `bytes` of them.
pub(crate) fn payload_missing(
    rank: u32,
    bytes: usize,
    what: &'static str,
) -> impl Fn() -> Error + Copy {
    move || Error::Reduce {
        rank: Rank(rank),
        call: what,
        source: ringcc_core::Error::BadLength { dst: bytes, src: 0 },
    }
}
