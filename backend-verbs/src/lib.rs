//! # ringcc-verbs: RDMA reliable connections as a ringcc transport
//!
//! [`VerbsTransport`] is a [`Transport`](ringcc_comm::transport::Transport)
//! of the communicator ([`ringcc_comm::Communicator`]), which owns
//! everything else: the bootstrap, the ring, the core's progress engine
//! and its one drive loop, the host executor, calls, abort. This crate
//! only moves slices and counters between a rank and its ring
//! neighbours, over RC queue pairs on rdma-core (through `sideway`):
//!
//! ```no_run
//! use ringcc_comm::launch::Launch;
//! use ringcc_comm::Communicator;
//! use ringcc_core::ReduceOp;
//! use ringcc_verbs::VerbsConfig;
//!
//! let config = VerbsConfig::from_env().map_err(|e| e.into_comm("config"))?;
//! let comm = Communicator::from_launch(
//!     Launch::from_env()?,
//!     ringcc_verbs::options_from_env()?,
//!     ringcc_verbs::transports(config),
//! )?;
//! let mut x = vec![1.0f32; 1 << 20];
//! comm.all_reduce_in_place(&mut x, ReduceOp::Sum)?;
//! comm.close()?;
//! # Ok::<(), ringcc_comm::Error>(())
//! ```
//!
//! (or [`communicator_from_env`]; a transport list may hold other
//! transports too, e.g. shared memory first and verbs between nodes, as
//! `ringcc perf --backend host` builds it). [`options_from_env`] is the
//! communicator's settings with verbs' FIFO ([`GEOMETRY`]): larger slots
//! than the communicator's default, which is sized for shared memory.
//!
//! Per hop, the receiver registers its FIFO and a call-header mailbox
//! for remote write ([`listen`](ringcc_comm::transport::Transport::listen));
//! the sender keeps a registered staging copy of the FIFO, which the
//! executor writes the slice into, and posts the core's work requests
//! for it unpatched ([`ringcc_core::protocol::post`]: RDMA WRITEs, the
//! last WITH IMMEDIATE carrying the new `tail`); the receiver turns the
//! completion and the mailbox into the engine's events
//! ([`ringcc_core::protocol::arrival`]), lets the executor read the slot
//! in place, and returns credit as a small RDMA WRITE WITH IMMEDIATE
//! into the sender's counter. A call of at least [`LEND_MIN`] bytes
//! lends the sending ends its buffers
//! ([`SendEnd::lend`](ringcc_comm::transport::SendEnd::lend)): they are
//! registered for the call, read only, and a slice of the input, or of
//! what a step wrote to the output, leaves straight from there; the call
//! returns once those writes completed and the registrations are gone.
//! What the two ends of a hop need of each other (queue pair address,
//! addresses and keys) goes through the job's store while connecting
//! (`exchange`). An idle rank sleeps on its bell; a thread per
//! communicator rings it when a NIC completes something (`wake`).
//!
//! Layers: `ib` (rdma-core through `sideway` and, for completion
//! events, its raw bindings: devices, registered memory, queue pairs
//! with typestates, completion queues on a channel) → `send` / `recv`
//! (the two ends, with the bookkeeping of what is in flight in
//! `inflight`) → [`VerbsTransport`] (devices, the connecting phases).
//! [`VerbsConfig`] holds the transport's settings (`RINGCC_IB_*`); the
//! communicator's are [`ringcc_comm::Options`], with the FIFO verbs
//! prefers ([`GEOMETRY`], [`CHUNK_BYTES`]).
#![deny(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

mod config;
mod error;
mod exchange;
mod ib;
mod inflight;
mod recv;
mod send;
mod transport;
mod wake;

use std::sync::Arc;

pub use config::{options_from_env, options_from_vars, Fault, VerbsConfig, CHUNK_BYTES, GEOMETRY};
pub use error::{BoxError, Error, Result};
pub use send::LEND_MIN;
pub use transport::VerbsTransport;

/// Names of the RDMA devices on this host (empty when rdma-core or its
/// providers are missing).
pub fn devices() -> Vec<String> {
    ib::nic::device_names().unwrap_or_default()
}

/// A communicator's transport list of verbs alone, with `config`'s
/// settings (one [`VerbsTransport`] per communicator, splits included).
pub fn transports(config: VerbsConfig) -> ringcc_comm::Transports {
    Arc::new(move || {
        vec![Box::new(VerbsTransport::new(config.clone()))
            as Box<dyn ringcc_comm::transport::Transport>]
    })
}

/// The communicator of this process over verbs alone, from the
/// launcher's environment (mpirun, srun, torchrun or `RINGCC_*`:
/// [`ringcc_comm::launch`]) with [`options_from_env`] and
/// [`VerbsConfig::from_env`].
pub fn communicator_from_env() -> ringcc_comm::Result<ringcc_comm::Communicator> {
    let launch = ringcc_comm::launch::Launch::from_env()?;
    let options = options_from_env()?;
    let config = VerbsConfig::from_env().map_err(|e| e.into_comm("VerbsConfig::from_env"))?;
    ringcc_comm::Communicator::from_launch(launch, options, transports(config))
}
