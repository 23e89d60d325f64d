//! The RDMA layer over rdma-core: sideway (and, for completion events,
//! its raw bindings) below; safe types for what the transport needs
//! above.
//!
//! - [`nic`]: an opened device port, its GID and protection domain;
//! - [`mem`]: registered memory an end owns;
//! - [`qp`]: RC queue pairs with their state in the type;
//! - [`cq`]: completion queues bound to a NIC's completion channel.

pub(crate) mod cq;
pub(crate) mod mem;
pub(crate) mod nic;
pub(crate) mod qp;
