//! # ringcc from Python: the `ringcc._ringcc` extension module
//!
//! The pure-Python package `ringcc` (beside this crate, in `ringcc/`)
//! wraps this module; users never import it directly. It holds what must
//! be Rust:
//!
//! - [`comm`]: `Communicator`, one rank of a job (`ringcc_comm`'s, with
//!   `ringcc_host`'s shared-memory and TCP transports), bootstrapped from
//!   the launcher's environment or over any Python object with torch
//!   `Store`'s methods ([`store`]). Every collective takes buffer-protocol
//!   objects, blocking (the caller's thread drives the ring, the GIL
//!   released) or asynchronous (`Work`, [`work`]).
//! - [`buffer`]: a Python buffer as the bytes and element type of a call,
//!   checked (C-contiguous, writable where written, whole elements).
//! - [`error`]: ringcc's typed errors as the exceptions of `ringcc.errors`
//!   (kind, rank, channel, what a timeout waited for).
//!
//! The GIL: calls into the communicator run detached from the
//! interpreter; the only way back in is the store adapter and releasing
//! a buffer, both of which attach only while the interpreter can be
//! attached to (never during its shutdown), so no thread of the
//! communicator can wait for the GIL while the GIL's holder waits for it.
#![deny(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

use pyo3::prelude::*;

pub mod buffer;
pub mod comm;
pub mod error;
pub mod store;
pub mod work;

/// The module `ringcc._ringcc`.
#[pymodule]
fn _ringcc(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<comm::Communicator>()?;
    m.add_class::<work::Work>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(comm::dtypes, m)?)?;
    Ok(())
}
