//! A CUDA rank per process: NCCL's `ncclCommInitRank` shape.
//!
//! [`RankComm`] is one rank of a job whose ranks are processes (one per
//! GPU, as torchrun, srun or mpirun start them). It is the per-rank
//! [`Communicator`] of `ringcc-comm` — bootstrap over a store (the
//! launcher's environment or an explicit `(rank, world, store)`), a
//! transport per hop, the one drive loop around the core's engine, the
//! progress thread, `Work` handles, abort and deadlines — with
//! [CUDA IPC](crate::ipc) as the transport between the ranks of a node
//! (first in preference; the caller's transports, e.g. TCP or RDMA from
//! their crates, carry the hops between nodes).
//!
//! Calls are asynchronous and ordered as on a stream: each is queued and
//! runs on the rank's progress thread in the order issued
//! ([`Communicator::submit`] returns a [`Work`](ringcc_comm::Work) whose
//! `wait` is the stream's synchronize, bounded by the deadline).
//!
//! Devices: the host fake device ([`RankDevice::Fake`]) only, today.
//! Its "device memory" is host memory, the FIFOs are exported as memfds,
//! and the slices are carried out by the communicator's host executor —
//! the core's reduction kernels, which are what the fake device runs. A
//! GPU rank per process is [`GpuRank`](crate::GpuRank) (the device loop,
//! no host in the data path); running the communicator's loop on a GPU
//! would need an executor that launches kernels on device buffers from
//! that loop, which `ringcc-comm` does not have, so [`RankDevice`] has no
//! GPU variant: nothing here pretends to run on one.

use std::sync::Arc;

use ringcc_comm::launch::Launch;
use ringcc_comm::store::Store;
use ringcc_comm::transport::Transport;
use ringcc_comm::{Communicator, Options, Transports};
use ringcc_core::Rank;

use crate::error::{Error, Result};
use crate::ipc::IpcTransport;

/// Where a per-process rank's memory lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RankDevice {
    /// The host fake device: host memory, FIFOs exported as memfds.
    Fake,
}

impl RankDevice {
    /// Its name in the IPC transport's published info.
    pub fn name(self) -> &'static str {
        match self {
            RankDevice::Fake => "fake",
        }
    }
}

/// The transports of a rank on `device`: CUDA IPC first (it reaches the
/// ranks of this node), then `extra`'s (the hops it does not reach).
pub fn transports(device: RankDevice, extra: Transports) -> Transports {
    Arc::new(move || {
        let mut ts: Vec<Box<dyn Transport>> = vec![Box::new(IpcTransport::new(device))];
        ts.extend(extra());
        ts
    })
}

/// One rank of a job of processes. See the module documentation.
#[derive(Debug)]
pub struct RankComm {
    comm: Communicator,
    device: RankDevice,
}

impl RankComm {
    /// Joins the job of `token` as `rank` of `world` on `device`,
    /// bootstrapping over `store` (every rank hands in a store reaching
    /// the same keys: `ncclCommInitRank(comm, world, id, rank)` with the
    /// token and store as the id). `extra` adds transports for the hops
    /// CUDA IPC does not reach (other nodes); `Arc::new(Vec::new)` for
    /// none.
    pub fn init(
        rank: Rank,
        world: u32,
        store: Arc<dyn Store>,
        token: &str,
        device: RankDevice,
        options: Options,
        extra: Transports,
    ) -> Result<RankComm> {
        let comm = Communicator::new(
            rank,
            world,
            store,
            token,
            options,
            transports(device, extra),
        )
        .map_err(Error::comm("Communicator::new"))?;
        Ok(RankComm { comm, device })
    }

    /// Joins the job the launcher's environment describes (rank, world
    /// size, rank 0's address: see [`Launch`]); rank 0 serves the store.
    pub fn from_env(device: RankDevice, options: Options, extra: Transports) -> Result<RankComm> {
        let launch = Launch::from_env().map_err(Error::comm("Launch::from_env"))?;
        Self::from_launch(launch, device, options, extra)
    }

    /// Joins the job `launch` describes.
    pub fn from_launch(
        launch: Launch,
        device: RankDevice,
        options: Options,
        extra: Transports,
    ) -> Result<RankComm> {
        let comm = Communicator::from_launch(launch, options, transports(device, extra))
            .map_err(Error::comm("Communicator::from_launch"))?;
        Ok(RankComm { comm, device })
    }

    /// The communicator: its calls (`run`, `submit`, `group`, `split`,
    /// `abort`), its rank, world size and hops.
    pub fn comm(&self) -> &Communicator {
        &self.comm
    }

    /// This rank.
    pub fn rank(&self) -> Rank {
        self.comm.rank()
    }

    /// Number of ranks.
    pub fn world_size(&self) -> u32 {
        self.comm.world_size()
    }

    /// The device its memory is on.
    pub fn device(&self) -> RankDevice {
        self.device
    }

    /// Finishes the queued calls and leaves the job (the communicator's
    /// [`close`](Communicator::close)).
    pub fn close(self) -> Result<()> {
        self.comm
            .close()
            .map_err(Error::comm("Communicator::close"))
    }
}
