//! A host "fake device": device memory as byte vectors, streams as queues
//! that run later, in a seeded random interleaving that respects stream
//! order and event waits, and the core's reduction kernels in place of the
//! fused kernels.
//!
//! The progress loop that feeds the GPU feeds it too, so the
//! communicator's logic (plans, the core's engines, slot addressing,
//! staging, event ordering) is tested end to end without a GPU. It also checks the FIFO protocol: a
//! slot must be read between two writes and written between two reads,
//! else [`Error::Hazard`]. A missing event wait shows up as a hazard or as
//! a wrong result under some interleaving.

use std::collections::{HashMap, VecDeque};

use ringcc_core::reduce::{finalize, reduce};
use ringcc_core::{Primitive, SlotIndex};

use super::{CopyOp, Device, SliceOp, SlotUse};
use crate::error::{Error, Result};
use crate::layout::{BufId, ConnId, EventId, Layout, MemRef, StreamId};

#[derive(Clone, Copy, Debug)]
enum Op {
    Launch(SliceOp),
    Copy(CopyOp),
    Record { event: usize, generation: u64 },
    Wait { event: usize, generation: u64 },
}

/// The fake device. See the module documentation.
#[derive(Debug)]
pub struct FakeDevice {
    layout: Layout,
    mem: Vec<Vec<u8>>,
    /// Buffer → (index in `mem`, base offset, length).
    bufs: HashMap<BufId, (usize, u64, u64)>,
    streams: Vec<VecDeque<Op>>,
    /// Per event: (records enqueued, records executed).
    events: Vec<(u64, u64)>,
    full: HashMap<(ConnId, SlotIndex), bool>,
    rng: u64,
    eagerness: u32,
    ops_run: u64,
}

impl FakeDevice {
    /// A fake device for `layout`, allocating every FIFO (and staging FIFO
    /// where the link is staged). `seed` picks the interleaving; after each
    /// enqueue up to `eagerness` ready operations run (0: nothing runs until
    /// [`synchronize`](Self::synchronize)).
    pub fn new(layout: Layout, seed: u64, eagerness: u32) -> FakeDevice {
        let fifo = layout.geometry().fifo_bytes() as usize;
        let mut d = FakeDevice {
            mem: Vec::new(),
            bufs: HashMap::new(),
            streams: vec![VecDeque::new(); layout.streams()],
            events: vec![(0, 0); layout.events()],
            full: HashMap::new(),
            rng: seed ^ 0x9e37_79b9_7f4a_7c15,
            eagerness,
            ops_run: 0,
            layout,
        };
        let conns: Vec<ConnId> = d.layout.connections().collect();
        for k in conns {
            d.alloc(BufId::Fifo(k), fifo);
            let sender = d.layout.prev(k.receiver);
            if d.layout.link(sender) == crate::layout::LinkKind::Staged {
                d.alloc(BufId::Staging(k), fifo);
            }
        }
        d
    }

    fn alloc(&mut self, id: BufId, bytes: usize) {
        self.mem.push(vec![0; bytes]);
        self.bufs.insert(id, (self.mem.len() - 1, 0, bytes as u64));
    }

    /// Binds rank `rank`'s buffers for the next call (the previous call's
    /// buffers are dropped). Either both buffers are given, or `memory` is
    /// one allocation that both live in, at the given (offset, length)
    /// ranges — in-place calls, as NCCL defines them.
    pub fn bind(
        &mut self,
        rank: ringcc_core::Rank,
        memory: Vec<u8>,
        input: (u64, u64),
        output: (u64, u64),
        separate_output: Option<Vec<u8>>,
    ) {
        for id in [BufId::Input(rank), BufId::Output(rank)] {
            if let Some((i, _, _)) = self.bufs.remove(&id) {
                self.mem[i] = Vec::new();
            }
        }
        self.mem.push(memory);
        let i = self.mem.len() - 1;
        self.bufs.insert(BufId::Input(rank), (i, input.0, input.1));
        let o = match separate_output {
            Some(v) => {
                self.mem.push(v);
                self.mem.len() - 1
            }
            None => i,
        };
        self.bufs
            .insert(BufId::Output(rank), (o, output.0, output.1));
    }

    /// Rank `rank`'s output buffer (after [`synchronize`](Self::synchronize)).
    pub fn output(&self, rank: ringcc_core::Rank) -> Option<&[u8]> {
        let (i, base, len) = *self.bufs.get(&BufId::Output(rank))?;
        self.mem.get(i)?.get(base as usize..(base + len) as usize)
    }

    /// Rank `rank`'s output buffer, to write into (test-only faults).
    pub fn output_mut(&mut self, rank: ringcc_core::Rank) -> Option<&mut [u8]> {
        let (i, base, len) = *self.bufs.get(&BufId::Output(rank))?;
        self.mem
            .get_mut(i)?
            .get_mut(base as usize..(base + len) as usize)
    }

    /// Operations executed so far.
    pub fn ops_run(&self) -> u64 {
        self.ops_run
    }

    fn next_random(&mut self) -> u64 {
        // xorshift64*
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn ready(&self, s: usize) -> bool {
        match self.streams[s].front() {
            None => false,
            Some(Op::Wait { event, generation }) => self.events[*event].1 >= *generation,
            Some(_) => true,
        }
    }

    /// Runs one ready operation of a random stream; `false` if none is
    /// ready.
    fn step(&mut self) -> Result<bool> {
        let ready: Vec<usize> = (0..self.streams.len()).filter(|&s| self.ready(s)).collect();
        if ready.is_empty() {
            return Ok(false);
        }
        let pick = ready[(self.next_random() % ready.len() as u64) as usize];
        let Some(op) = self.streams[pick].pop_front() else {
            return Ok(false);
        };
        self.ops_run += 1;
        match op {
            Op::Launch(op) => self.run_slice(&op)?,
            Op::Copy(op) => self.run_copy(&op)?,
            Op::Record { event, generation } => self.events[event].1 = generation,
            Op::Wait { .. } => {}
        }
        Ok(true)
    }

    fn run_some(&mut self) -> Result<()> {
        if self.eagerness == 0 {
            return Ok(());
        }
        let k = self.next_random() % (u64::from(self.eagerness) + 1);
        for _ in 0..k {
            if !self.step()? {
                break;
            }
        }
        Ok(())
    }

    /// Runs everything enqueued. Fails with [`Error::Stalled`] if some
    /// stream waits for an event that is never recorded.
    pub fn synchronize(&mut self) -> Result<()> {
        while self.step()? {}
        if let Some(s) = self.streams.iter().position(|q| !q.is_empty()) {
            return Err(Error::Stalled {
                detail: format!(
                    "fake device: stream {s} waits forever on {:?}",
                    self.streams[s].front()
                ),
            });
        }
        Ok(())
    }

    fn read(&self, m: MemRef, len: u64) -> Result<Vec<u8>> {
        let (i, range) = self.range(m, len)?;
        Ok(self.mem[i][range].to_vec())
    }

    fn write(&mut self, m: MemRef, data: &[u8]) -> Result<()> {
        let (i, range) = self.range(m, data.len() as u64)?;
        self.mem[i][range].copy_from_slice(data);
        Ok(())
    }

    fn range(&self, m: MemRef, len: u64) -> Result<(usize, std::ops::Range<usize>)> {
        let oob = |cap: u64| Error::OutOfBounds {
            buffer: format!("{:?}", m.buf),
            offset: m.offset,
            len,
            capacity: cap,
        };
        let (i, base, cap) = *self.bufs.get(&m.buf).ok_or_else(|| oob(0))?;
        match m.offset.checked_add(len) {
            Some(end) if end <= cap => Ok((i, (base + m.offset) as usize..(base + end) as usize)),
            _ => Err(oob(cap)),
        }
    }

    fn use_slots(&mut self, u: Option<SlotUse>, write: bool) -> Result<()> {
        let Some(u) = u else { return Ok(()) };
        for s in u.slots() {
            let full = self.full.entry((u.conn, s)).or_insert(false);
            if *full == write {
                return Err(Error::Hazard {
                    detail: format!(
                        "{} slot {} of {:?} at step {} while it is {}",
                        if write { "write to" } else { "read of" },
                        s.0,
                        u.conn,
                        u.span.step,
                        if write { "unread" } else { "empty" }
                    ),
                });
            }
            *full = write;
        }
        Ok(())
    }

    fn run_slice(&mut self, op: &SliceOp) -> Result<()> {
        self.use_slots(op.reads, false)?;
        let p = op.kernel.primitive;
        let dtype = op.kernel.module.dtype;
        let rop = op.kernel.module.op;
        let len = op.count.saturating_mul(u64::from(dtype.size()));
        let r = op.recv.map(|m| self.read(m, len)).transpose()?;
        let x = op.input.map(|m| self.read(m, len)).transpose()?;
        let core = |call| Error::core(call);
        let mut v = match (p.contains(Primitive::REDUCE), r, x) {
            (true, Some(r), Some(x)) => {
                let mut v = vec![0; r.len()];
                reduce(dtype, rop, &mut v, &r, &x).map_err(core("reduce"))?;
                v
            }
            (false, Some(r), _) => r,
            (false, None, Some(x)) => x,
            _ => {
                return Err(Error::BadConfig {
                    what: "slice op lacks the buffers its primitive reads",
                })
            }
        };
        if p.finalizes() {
            finalize(dtype, rop, &mut v, op.nranks).map_err(core("finalize"))?;
        }
        if let Some(m) = op.output {
            self.write(m, &v)?;
        }
        if let Some(m) = op.send {
            self.write(m, &v)?;
        }
        self.use_slots(op.writes, true)
    }

    fn run_copy(&mut self, op: &CopyOp) -> Result<()> {
        let data = self.read(op.src, op.bytes)?;
        self.write(op.dst, &data)?;
        self.use_slots(op.writes, true)
    }

    fn stream(&self, s: StreamId) -> usize {
        self.layout.stream_index(s)
    }
}

impl Device for FakeDevice {
    fn launch(&mut self, stream: StreamId, op: &SliceOp) -> Result<()> {
        let s = self.stream(stream);
        self.streams[s].push_back(Op::Launch(*op));
        self.run_some()
    }

    fn copy(&mut self, stream: StreamId, op: &CopyOp) -> Result<()> {
        let s = self.stream(stream);
        self.streams[s].push_back(Op::Copy(*op));
        self.run_some()
    }

    fn record(&mut self, stream: StreamId, event: EventId) -> Result<()> {
        let s = self.stream(stream);
        let e = self.layout.event_index(event);
        self.events[e].0 += 1;
        let generation = self.events[e].0;
        self.streams[s].push_back(Op::Record {
            event: e,
            generation,
        });
        self.run_some()
    }

    fn wait(&mut self, stream: StreamId, event: EventId) -> Result<()> {
        let s = self.stream(stream);
        let e = self.layout.event_index(event);
        let generation = self.events[e].0;
        self.streams[s].push_back(Op::Wait {
            event: e,
            generation,
        });
        self.run_some()
    }
}
