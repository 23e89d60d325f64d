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
//! ```
//! use std::sync::Arc;
//! use ringcc_comm::{store::MemStore, Communicator, Options};
//! use ringcc_core::{Rank, ReduceOp};
//!
//! // A job of one rank needs no transport; real jobs pass a transport
//! // crate's list (`ringcc_host::transports`) and a shared store.
//! let comm = Communicator::new(
//!     Rank(0), 1, Arc::new(MemStore::new()), "doc-job",
//!     Options::default(), Arc::new(Vec::new),
//! )?;
//! let mut x = vec![1.5f32; 1000];
//! comm.all_reduce_in_place(&mut x, ReduceOp::Sum)?;
//! assert!(x.iter().all(|&v| v == 1.5));
//! let x = comm.all_reduce_async(x, ReduceOp::Max)?.wait()?;
//! assert_eq!(x.len(), 1000);
//! comm.close()?;
//! # Ok::<(), ringcc_comm::Error>(())
//! ```
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
mod clock;
mod comm;
mod connect;
mod drive;
mod element;
mod error;
mod exec;
mod land;
pub mod launch;
pub mod map;
pub mod net;
mod options;
pub mod peer;
pub mod proto;
mod ring;
pub mod store;
pub mod transport;
mod work;

pub use bell::{BellWords, LocalBell};
pub use comm::{resolve, split_place, Communicator, Group, SplitPlace, Transports};
pub use connect::{connect_between_nodes, Lend, Lent, NodeLinks};
pub use element::Element;
pub use error::{BoxError, Error, Result};
pub use options::Options;
pub use ring::RingOrderOf;
pub use work::Work;
