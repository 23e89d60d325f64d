//! RDMA verbs backend for ringcc.

mod error;
pub mod launch;
pub mod rendezvous;

pub use error::{Error, Result};
