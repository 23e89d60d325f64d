//! The TCP rendezvous: rank 0 serves a small store; every rank (rank 0
//! included) connects to it, presents the job token, and exchanges its
//! connection information in all-gather rounds. After setup the same
//! connection carries abort notices, so that one rank's failure reaches
//! all others.

mod client;
mod proto;
mod server;

pub use client::{AbortState, StoreClient, Watcher};
pub use proto::{ClientMsg, ServerMsg, MAX_LINE, VERSION};
pub use server::{StoreServer, HELLO_TIMEOUT};
