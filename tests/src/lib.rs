//! Workspace-level test support for ringcc.
//!
//! - [`exec`]: an in-memory executor that runs a collective over `n` ranks'
//!   buffers through the core's progress engine (one per rank, all
//!   channels together) with a seeded random interleaving, checking flow
//!   control independently of the engine.
//! - [`reference`](mod@reference): exact inputs and the reference results they must give.
//! - [`shm`]: ranks as real threads over the core's shared-memory FIFOs,
//!   each one engine over all its channels, driven by the core's firmware
//!   `BlockingDriver`.
//!
//! The integration tests in `tests/` use both; the `seed_allreduce`
//! example replays the seed documents' 4-GPU walk-through.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub mod exec;
pub mod reference;
pub mod shm;
