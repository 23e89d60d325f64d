//! # ringcc-comm: one communicator per rank
//!
//! The std layer between the core and the transports. A [`Communicator`]
//! is one rank of a job (one process per GPU or per CPU rank, as with
//! NCCL): it bootstraps over a [`Store`](store::Store) (the built-in TCP
//! store of rank 0, or one a framework hands in), learns where every rank
//! runs, picks a [`Transport`](transport::Transport) per hop (shared
//! memory inside a node; RDMA or TCP between nodes), connects every
//! channel's ring, and then runs collectives by driving the core's
//! progress [`Engine`](ringcc_core::Engine) in one loop: the transports'
//! ends report counters and headers as the engine's events, the host
//! executor carries out its slices (the core's reduce kernels, reading
//! straight from the incoming slot and writing straight into the outgoing
//! one), and the loop waits with the engine's deadline.
//!
//! Layers: [`launch`] (rank, world size and store address from mpirun,
//! srun, torchrun or `RINGCC_*`), [`store`] (the bootstrap), [`transport`]
//! (the traits a transport crate implements), `exec` (the host executor),
//! `drive` (the loop), [`Communicator`] (calls, `Work` handles and the
//! progress thread, groups, split, abort, close).
#![deny(missing_docs)]

mod abort;
pub mod bell;
mod buffer;
mod comm;
mod connect;
mod drive;
mod element;
mod error;
mod exec;
pub mod launch;
pub mod net;
mod options;
mod ring;
pub mod store;
pub mod transport;
mod work;

pub use bell::{BellWords, LocalBell};
pub use comm::{resolve, Communicator, Group, Transports};
pub use element::Element;
pub use error::{BoxError, Error, Result};
pub use options::Options;
pub use ring::RingOrderOf;
pub use work::Work;
