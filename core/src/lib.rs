//! # ringcc-core: the schedule of a ring collective, and nothing else
//!
//! This crate computes and decides; it never moves a byte over a wire,
//! reads a clock, allocates or uses `unsafe`. It is what DPU/SmartNIC
//! firmware embeds, and what every ringcc backend (simulator, RDMA verbs,
//! CUDA) drives, so that all of them run the very same schedule.
//!
//! How the layers fit, from the bottom up:
//!
//! - [`topology`] groups ranks by node and builds each channel's ring so that
//!   a node's GPUs are consecutive and the node is entered and left through a
//!   NIC (`NET n → GPU a → … → GPU x → NET n`); it answers `next`, `prev`,
//!   ring index and hop kind (NVLink or NIC) for every rank in O(1).
//! - [`plan`] turns one collective call (AllReduce, ReduceScatter,
//!   AllGather, Broadcast, Reduce) into, per channel and rank, an iterator of
//!   [`Step`]s: which [`Primitive`] (NCCL's
//!   `send`, `recvReduceSend`, `recvReduceCopySend`, `recvCopySend`, `recv`,
//!   …), on which chunk, at which offsets.
//! - [`prim`] holds the primitives and the sans-IO [`Machine`]
//!   that walks a plan: it waits for data from the predecessor and credit
//!   from the successor ([`fifo`]'s slot rules), asks its backend to
//!   reduce / copy / send one slice at a time, returns credit, checks that
//!   both neighbours made the same call (a [`CallDesc`]
//!   header on every connection's first message), and finishes only when
//!   everything it sent was consumed.
//! - [`line`](mod@line) is how a slot carries its data under each
//!   [`Protocol`]: Simple's plain bytes, LL's 8-byte units and LL128's
//!   128-byte lines that carry their own arrival flag, and each
//!   protocol's FIFO geometry (NCCL's numbers).
//! - [`fifo`] is the flow control itself: 8 slots per connection, `head` and
//!   `tail` step counters, and a shared-memory FIFO built on the [`sync`]
//!   shim's atomics, model-checked with loom.
//! - [`reduce`] has the element types, the operations and the host
//!   reduction kernels that every backend's results are checked against.
//! - [`wire`] describes, byte for byte, the RDMA work requests, NIC queue
//!   entries and RoCEv2 packets that carry a step.
//! - [`verify`] generates nccl-tests-style inputs whose reduction is exact
//!   in any order and counts wrong output elements (`#wrong`).
//! - [`cost`] is the alpha-beta model (`latency + bytes / bandwidth`) and
//!   nccl-tests' `algbw` / `busbw`.
//! - [`tree`] builds NCCL's double binary tree across nodes with a chain
//!   inside each node, and the tree AllReduce's schedule (reduce up,
//!   broadcast down, pipelined by chunk), which [`prim::TreeMachine`] walks
//!   with one connection up and up to three down.
//! - [`progress`] is the drive loop, written once: one rank's call over
//!   all its channels ([`Engine`]): events in, actions out, time passed in,
//!   sequence numbers, counters carried between calls, poisoning, the
//!   deadline and a stall report. Every backend drives it.
//! - [`protocol`] is the connection protocol over RDMA: which writes carry
//!   a slice, how credit returns, how a completion becomes an event, the
//!   work-request id codec.
//! - `driver` (feature `embedded-hal`) is firmware's blocking loop over an
//!   [`Engine`]: it polls a completion source and sleeps with bounded
//!   waits through `embedded_hal::delay::DelayNs`.
//!
//! Every failure is a typed [`Error`]; no input makes this crate panic (its
//! lints forbid indexing, unchecked arithmetic, `unwrap` and `panic!` outside
//! tests). Capacities are const generics.

#![cfg_attr(not(test), no_std)]
#![forbid(unsafe_code)]
#![deny(missing_docs)]
#![cfg_attr(
    not(test),
    deny(
        clippy::indexing_slicing,
        clippy::arithmetic_side_effects,
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::unreachable,
        clippy::todo,
        clippy::unimplemented
    )
)]

mod log;
mod math;

pub mod call;
pub mod cost;
#[cfg(feature = "embedded-hal")]
pub mod driver;
pub mod error;
pub mod fifo;
pub mod id;
pub mod line;
pub mod plan;
pub mod prim;
pub mod progress;
pub mod protocol;
pub mod reduce;
pub mod rng;
pub mod sync;
pub mod topology;
pub mod tree;
pub mod tune;
pub mod verify;
pub mod wire;

pub use call::{Algorithm, Call, Protocol};
pub use error::{Error, ProtocolViolation, Result};
pub use id::{ChannelId, ChunkId, NicId, NodeId, Rank, RingIndex, SlotIndex};
pub use plan::{CallDesc, Collective, Plan, Step};
pub use prim::{Action, Blocked, Exec, LinkState, Machine, Primitive};
pub use progress::{Engine, EngineError, Event, Stall};
pub use reduce::{DataType, ReduceOp};
pub use topology::{HopKind, InOrderRing, Ring, RingOrder, Topology, MAX_RANKS};
pub use tree::{tree_head, tree_nic, Tree, TreeOrder, TreePeers, TreePlan, UniformTree};
