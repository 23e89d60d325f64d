//! # ringcc-host: transports between processes of one host
//!
//! The shared-memory transport's groundwork: one connection (a rank to its
//! ring successor, on one channel) is a FIFO living in a POSIX
//! shared-memory [`Segment`] owned by the *receiver*. The sender opens it,
//! fills slots and posts `tail`; the receiver reads and returns credit by
//! posting `head`, with the core's [`StepCounter`](ringcc_core::fifo::StepCounter)
//! (release on post, acquire on load) and its flow-control rules
//! ([`ringcc_core::fifo`]). The call header travels in a mailbox in the
//! same segment.
//!
//! Layers, as in the other backends: `map` (raw: one `mmap` and its
//! `munmap`, through `rustix`), [`Segment`] (checked: header with magic,
//! version, token hash and geometry; owner-only mode, size and uid checks;
//! slot copies bounded by the slot size), [`wait`] (bounded spin-then-nap
//! waits with a deadline). Names come from [`SegmentName`]: a hash of the
//! job token, the receiving rank and the channel. Where the bytes live is
//! computed once, by [`Layout`]. [`ShmTransport`] is the communicator's
//! transport on top (`ringcc_comm::transport`): its ends lend the
//! executor the slots in place and post the counters.
#![deny(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

mod bell;
mod error;
mod layout;
mod name;
mod segment;
pub mod shm;
mod shm_lines;
pub mod tcp;
pub mod wait;

pub use bell::Bell;
pub use error::{Error, Result};
pub use layout::{Layout, LAYOUT_VERSION, MAGIC};
pub use name::{token_hash, SegmentName};
pub use segment::{Segment, SlotRef};
pub use shm::{ShmRecv, ShmSend, ShmTransport};

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use ringcc_comm::transport::Transport;
use ringcc_comm::{Communicator, Options, Transports};

/// How long a new TCP connection may take to present its hello.
pub const TCP_HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// This crate's transports, in order of preference: shared memory inside
/// a node, TCP (bound to `bind_ip`; writes bounded by `timeout`) between
/// nodes.
pub fn transports(bind_ip: IpAddr, timeout: Duration) -> Transports {
    Arc::new(move || {
        vec![
            Box::new(ShmTransport::new()) as Box<dyn Transport>,
            Box::new(tcp::TcpTransport::new(bind_ip, TCP_HELLO_TIMEOUT, timeout)),
        ]
    })
}

/// The communicator of this process from the launcher's environment
/// (mpirun, srun, torchrun or `RINGCC_*`: see [`ringcc_comm::launch`]),
/// with the settings of [`Options::from_env`] and this crate's
/// transports; TCP binds to `RINGCC_SOCKET_IFNAME`'s address, else the
/// one that routes toward the store.
pub fn communicator_from_env() -> ringcc_comm::Result<Communicator> {
    let launch = ringcc_comm::launch::Launch::from_env()?;
    let options = Options::from_env()?;
    let toward = ringcc_comm::resolve(&launch.addr)?;
    let ip = ringcc_comm::net::bind_ip(Some(toward))?;
    let timeout = options.timeout;
    Communicator::from_launch(launch, options, transports(ip, timeout))
}
