//! # ringcc-cuda: ring collectives on CUDA GPUs, driven by the core
//!
//! Several GPUs of one process (or several ranks on one GPU) form a
//! communicator, as `ncclCommInitAll` builds one. Every rank has the
//! core's sans-IO progress [`Engine`](ringcc_core::Engine) (a state
//! machine per channel, the connection counters from call to call, the
//! deadline); this crate's progress loop carries out what the engines ask:
//!
//! - [`kernel`]: one fused kernel per primitive and (type, op), generated
//!   as CUDA C++ ([`kernel::module_source`]) and compiled at run time by
//!   [`nvrtc`]: it reads the incoming FIFO slice and the local input,
//!   reduces, and writes the output and the successor's slice in one pass,
//!   with 16-byte vector loads and stores.
//! - [`layout`]: ranks → devices, streams, events, FIFO slots (in the
//!   receiver's memory; written directly over peer access, or staged and
//!   copied where peer access is not available).
//! - [`progress`]: the loop that feeds every rank's engine and carries out
//!   its actions on a [`Device`](device::Device) — the GPU, or the host
//!   [`FakeDevice`](device::fake::FakeDevice) that runs the same loop with
//!   the core's reduction kernels so the logic is tested without a GPU.
//! - [`Comm`]: the GPU communicator, with cudarc-shaped calls
//!   (`all_reduce(&send, &mut recv, op)` on `CudaSlice<T>`), and [`perf`],
//!   what `ringcc perf --backend cuda` runs (checked with the core's
//!   [`verify`](ringcc_core::verify), on the GPU or the fake device).
//!
//! The CUDA driver and NVRTC are loaded at run time: the crate builds and
//! its non-GPU tests run on machines without CUDA, and every entry point
//! that needs the driver first checks that `libcuda.so.1` loads
//! ([`driver::probe`]) and otherwise returns [`Error::NoDriver`] instead of
//! letting cudarc abort.
//!
//! ## Testing
//!
//! - `cargo test -p ringcc-cuda` runs everywhere: bookkeeping unit tests,
//!   every collective on the host fake device against the core's reference
//!   ([`ringcc_core::verify`]), every kernel compiled as host C++ (`c++`)
//!   and run against the core's kernels, and every module compiled and
//!   assembled by NVRTC when it is
//!   found (`pip install nvidia-cuda-nvrtc-cu12`, or `RINGCC_NVRTC_LIB`;
//!   set `RINGCC_REQUIRE_NVRTC=1` to fail rather than skip without it).
//! - `scripts/gpu-tests.sh` runs the `#[ignore]`d GPU tests where
//!   `nvidia-smi` finds a GPU; `scripts/gpu-check.sh` is the whole GPU check
//!   (tests and the fused kernels' bandwidth against a device copy and
//!   torch), with binaries from `scripts/gpu-build.sh` where the GPU machine
//!   has no Rust toolchain.

pub mod config;
pub mod device;
pub mod driver;
pub mod dtype;
pub mod error;
pub mod fused;
pub mod host;
pub mod kernel;
pub mod layout;
pub mod nvrtc;
pub mod perf;
pub mod progress;
pub mod state;

mod comm;
mod group;

pub use comm::Comm;
pub use config::Config;
pub use dtype::CollType;
pub use error::{Error, Result};
pub use group::Group;
pub use host::{HostCall, HostComm};
pub use state::{Call, CallBuffers};

pub use ringcc_core::{Collective, DataType, Rank, ReduceOp};
