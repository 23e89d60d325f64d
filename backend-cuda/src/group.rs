//! A group of per-rank calls that together make one collective (NCCL's
//! `ncclGroupStart` … `ncclGroupEnd` around one call per rank).

use crate::state::CallBuffers;
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, SyncOnDrop};
use ringcc_core::{Collective, Rank, ReduceOp};

use crate::comm::Comm;
use crate::config::LaunchMode;
use crate::dtype::CollType;
use crate::error::{Error, Result};
use crate::layout::StreamId;
use crate::state::Call;

/// A device buffer a call reads.
trait SendBuf {
    fn bytes(&self) -> u64;
    fn ordinal(&self) -> usize;
    fn ptr<'a>(&'a self, s: &'a CudaStream) -> (u64, SyncOnDrop<'a>);
}

/// A device buffer a call writes.
trait RecvBuf {
    fn bytes(&self) -> u64;
    fn ordinal(&self) -> usize;
    fn ptr_mut<'a>(&'a mut self, s: &'a CudaStream) -> (u64, SyncOnDrop<'a>);
}

impl<T> SendBuf for CudaSlice<T> {
    fn bytes(&self) -> u64 {
        self.num_bytes() as u64
    }
    fn ordinal(&self) -> usize {
        self.ordinal()
    }
    fn ptr<'a>(&'a self, s: &'a CudaStream) -> (u64, SyncOnDrop<'a>) {
        self.device_ptr(s)
    }
}

impl<T> RecvBuf for CudaSlice<T> {
    fn bytes(&self) -> u64 {
        self.num_bytes() as u64
    }
    fn ordinal(&self) -> usize {
        self.ordinal()
    }
    fn ptr_mut<'a>(&'a mut self, s: &'a CudaStream) -> (u64, SyncOnDrop<'a>) {
        self.device_ptr_mut(s)
    }
}

enum Bufs<'a> {
    Separate {
        send: &'a dyn SendBuf,
        recv: &'a mut dyn RecvBuf,
    },
    InPlace(&'a mut dyn RecvBuf),
}

struct Pending<'a> {
    spec: Call,
    bufs: Bufs<'a>,
}

/// One call per rank, then [`launch`](Group::launch). Each call is checked
/// when it is added (rank, device, buffer sizes); whether the ranks' calls
/// agree is checked by the ranks themselves, as on a real cluster: a
/// mismatch fails the launch with the core's `MismatchedCall`.
pub struct Group<'a> {
    comm: &'a mut Comm,
    calls: Vec<Option<Pending<'a>>>,
}

impl std::fmt::Debug for Group<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Group")
            .field(
                "calls",
                &self
                    .calls
                    .iter()
                    .map(|c| c.as_ref().map(|p| p.spec))
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl<'a> Group<'a> {
    pub(crate) fn new(comm: &'a mut Comm) -> Group<'a> {
        let n = comm.ranks() as usize;
        Group {
            comm,
            calls: (0..n).map(|_| None).collect(),
        }
    }

    /// Rank `rank`'s AllReduce of `send` into `recv`.
    pub fn all_reduce<T: CollType>(
        &mut self,
        rank: Rank,
        send: &'a CudaSlice<T>,
        recv: &'a mut CudaSlice<T>,
        op: ReduceOp,
    ) -> Result<()> {
        let spec = spec::<T>(Collective::AllReduce, send.len(), op);
        self.add(rank, spec, Bufs::Separate { send, recv })
    }

    /// Rank `rank`'s ReduceScatter: `recv.len()` elements per rank.
    pub fn reduce_scatter<T: CollType>(
        &mut self,
        rank: Rank,
        send: &'a CudaSlice<T>,
        recv: &'a mut CudaSlice<T>,
        op: ReduceOp,
    ) -> Result<()> {
        let spec = spec::<T>(Collective::ReduceScatter, recv.len(), op);
        self.add(rank, spec, Bufs::Separate { send, recv })
    }

    /// Rank `rank`'s AllGather: `send.len()` elements per rank.
    pub fn all_gather<T: CollType>(
        &mut self,
        rank: Rank,
        send: &'a CudaSlice<T>,
        recv: &'a mut CudaSlice<T>,
    ) -> Result<()> {
        let spec = spec::<T>(Collective::AllGather, send.len(), ReduceOp::Sum);
        self.add(rank, spec, Bufs::Separate { send, recv })
    }

    /// Rank `rank`'s Broadcast from `root` (`send` is read on the root).
    pub fn broadcast<T: CollType>(
        &mut self,
        rank: Rank,
        send: &'a CudaSlice<T>,
        recv: &'a mut CudaSlice<T>,
        root: Rank,
    ) -> Result<()> {
        let spec = spec::<T>(Collective::Broadcast { root }, recv.len(), ReduceOp::Sum);
        self.add(rank, spec, Bufs::Separate { send, recv })
    }

    /// Rank `rank`'s Reduce to `root` (`recv` is written on the root).
    pub fn reduce<T: CollType>(
        &mut self,
        rank: Rank,
        send: &'a CudaSlice<T>,
        recv: &'a mut CudaSlice<T>,
        op: ReduceOp,
        root: Rank,
    ) -> Result<()> {
        let spec = spec::<T>(Collective::Reduce { root }, send.len(), op);
        self.add(rank, spec, Bufs::Separate { send, recv })
    }

    /// Rank `rank`'s in-place call on `buf` (`count` as NCCL counts it).
    pub fn in_place<T: CollType>(
        &mut self,
        rank: Rank,
        buf: &'a mut CudaSlice<T>,
        collective: Collective,
        count: u64,
        op: ReduceOp,
    ) -> Result<()> {
        let spec = Call {
            collective,
            count,
            dtype: T::DTYPE,
            op,
        };
        self.add(rank, spec, Bufs::InPlace(buf))
    }

    /// Rank `rank`'s call on untyped buffers (`spec.dtype` says what they
    /// hold): what `ringcc perf` uses.
    pub fn raw(
        &mut self,
        rank: Rank,
        spec: Call,
        send: &'a CudaSlice<u8>,
        recv: &'a mut CudaSlice<u8>,
    ) -> Result<()> {
        self.add(rank, spec, Bufs::Separate { send, recv })
    }

    /// Rank `rank`'s in-place call on an untyped buffer.
    pub fn raw_in_place(
        &mut self,
        rank: Rank,
        spec: Call,
        buf: &'a mut CudaSlice<u8>,
    ) -> Result<()> {
        self.add(rank, spec, Bufs::InPlace(buf))
    }

    fn add(&mut self, rank: Rank, spec: Call, bufs: Bufs<'a>) -> Result<()> {
        self.comm.check_rank(rank)?;
        let n = self.comm.ranks();
        let config = *self.comm.config();
        let device = self.comm.layout().device(rank)?;
        let check_device = |got: usize| {
            if got == device {
                Ok(())
            } else {
                Err(Error::WrongDevice {
                    rank,
                    expected: device,
                    got,
                })
            }
        };
        let check_len = |which, needed: u64, got: u64| {
            if got >= needed {
                Ok(())
            } else {
                Err(Error::BadBuffer {
                    rank,
                    which,
                    expected: needed,
                    got,
                })
            }
        };
        match &bufs {
            Bufs::Separate { send, recv } => {
                let (ib, ob) = spec.bytes(n, &config)?;
                check_device(send.ordinal())?;
                check_device(recv.ordinal())?;
                check_len("send", ib, send.bytes())?;
                check_len("recv", ob, recv.bytes())?;
            }
            Bufs::InPlace(buf) => {
                let bp = spec.in_place(n, rank, &config)?;
                check_device(buf.ordinal())?;
                check_len("in-place", bp.total, buf.bytes())?;
            }
        }
        let slot = self
            .calls
            .get_mut(rank.0 as usize)
            .ok_or(Error::RankOutOfRange { rank, ranks: n })?;
        if slot.is_some() {
            return Err(Error::DuplicateRank { rank });
        }
        *slot = Some(Pending { spec, bufs });
        Ok(())
    }

    /// Enqueues the collective on every rank's stream. Fails with
    /// [`Error::MissingRank`] if a rank made no call (nothing is enqueued
    /// then), or with the first error of the progress loop (the
    /// communicator is then poisoned).
    pub fn launch(self) -> Result<()> {
        let Group { comm, calls } = self;
        let n = comm.ranks();
        let mut pending = Vec::with_capacity(calls.len());
        for (r, c) in calls.into_iter().enumerate() {
            pending.push(c.ok_or(Error::MissingRank {
                rank: Rank(r as u32),
            })?);
        }
        let config = *comm.config();
        let streams: Vec<Arc<CudaStream>> = (0..n)
            .map(|r| comm.device.stream(StreamId::User(Rank(r))).cloned())
            .collect::<Result<_>>()?;
        let specs: Vec<Call> = pending.iter().map(|p| p.spec).collect();
        // The guards record the buffers' cudarc read/write events on the
        // user streams when dropped: after the collective is joined back
        // into those streams.
        let mut guards: Vec<SyncOnDrop<'_>> = Vec::with_capacity(2 * n as usize);
        for ((r, p), stream) in pending.iter_mut().enumerate().zip(&streams) {
            let rank = Rank(r as u32);
            let (ib, ob) = p.spec.bytes(n, &config)?;
            match &mut p.bufs {
                Bufs::Separate { send, recv } => {
                    let (sp, g1) = send.ptr(stream);
                    let (rp, g2) = recv.ptr_mut(stream);
                    guards.push(g1);
                    guards.push(g2);
                    comm.device.bind(rank, (sp, ib), (rp, ob));
                }
                Bufs::InPlace(buf) => {
                    let bp = p.spec.in_place(n, rank, &config)?;
                    let (ptr, g) = buf.ptr_mut(stream);
                    guards.push(g);
                    comm.device.bind(
                        rank,
                        (ptr + bp.input.0, bp.input.1),
                        (ptr + bp.output.0, bp.output.1),
                    );
                }
            }
        }
        let r = match comm.device.launch_mode() {
            LaunchMode::Persistent => comm.state.run_loops(&mut comm.device, &specs),
            LaunchMode::Slice => comm.state.run(&mut comm.device, &specs),
        };
        comm.device.unbind();
        drop(guards);
        r
    }
}

fn spec<T: CollType>(collective: Collective, len: usize, op: ReduceOp) -> Call {
    Call {
        collective,
        count: len as u64,
        dtype: T::DTYPE,
        op,
    }
}
