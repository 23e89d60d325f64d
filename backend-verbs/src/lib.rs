//! # ringcc-verbs: ring collectives over RDMA reliable connections
//!
//! One process per rank, as with NCCL. A [`Communicator`] connects, per
//! channel, one RC queue pair to its ring successor and one from its
//! predecessor, on the NIC the core's topology assigns to the channel
//! (`RINGCC_IB_HCA` maps NIC indices to devices). The schedule is the
//! core's: one progress [`Engine`](ringcc_core::Engine) per communicator
//! drives a machine per channel, and this crate only turns completions
//! into the engine's events, carries out the actions it hands out, and
//! waits, which is what every ringcc backend does.
//!
//! The data path is one-sided. Each receiver registers its 8-slot FIFO
//! (and a call-header mailbox) for remote write and advertises address,
//! rkey and capacity at connect time. The sender reduces or copies a
//! slice on the host with the core's kernels, then RDMA-WRITEs it into the
//! successor's slot, the last write WRITE WITH IMMEDIATE carrying the new
//! `tail` ([`ringcc_core::protocol::post`] forms the requests and checks the
//! capacity first). The receiver learns of the data from the completion,
//! consumes it, and returns credit by writing its `head` into the
//! sender's registered counter (also with an immediate, so that an idle
//! rank sleeps on its completion channel instead of spinning). The
//! caller's buffers are registered for local access only: by every call,
//! or once with [`Communicator::register`] (as NCCL's `ncclCommRegister`)
//! for the calls of [`Communicator::run_registered`].
//!
//! Setup goes through the TCP store rank 0 serves
//! ([`ringcc_comm::store::tcp`]): each rank presents the job token, then
//! the ranks exchange node names, settings and queue-pair addresses
//! through its keys. The store carries abort notices afterwards: a rank
//! that fails publishes the job's notice, every rank's watcher thread
//! sees it (or sees rank 0's store vanish, or the store sees a rank
//! vanish and publishes the notice itself), and every rank's next wait
//! returns [`Error::Aborted`]. Every wait has a deadline
//! ([`Config::timeout`] without progress).
//!
//! Layers: [`launch`] (who am I, from mpirun / srun / torchrun or
//! `RINGCC_*`: ringcc-comm's), [`Config`], `abort` (the abort flag and
//! the watcher), `setup` (the store rounds), `ib` (rdma-core through
//! `sideway`: devices, registered memory, queue pairs with typestates,
//! completion queues with events), `conn` (a channel's two connections),
//! `transport` (completions → events, the wait, the call loop around the
//! engine) and `exec` (an action → host work and work requests),
//! [`Communicator`].

mod abort;
mod comm;
mod config;
mod conn;
mod error;
mod exec;
mod ib;
mod setup;
mod transport;

pub use comm::{AbortHandle, Call, Communicator, Registered};
pub use config::{Config, Fault};
pub use error::{Error, Result};
pub use ringcc_comm::launch::{self, Launch, Launcher};
pub use setup::MAX_RANKS;

/// Names of the RDMA devices on this host (empty when rdma-core or its
/// providers are missing).
pub fn devices() -> Vec<String> {
    ib::nic::device_names().unwrap_or_default()
}
