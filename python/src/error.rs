//! ringcc's errors as Python exceptions: the classes live in
//! `ringcc.errors` (pure Python); this module fills in their fields.

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

/// What an exception of `ringcc.errors` carries.
#[derive(Debug)]
pub struct Details {
    /// [`ringcc_comm::Error::kind`], or the binding's own (`bad_buffer`,
    /// `closed`).
    pub kind: &'static str,
    /// The message (the error's `Display`).
    pub message: String,
    /// The rank the error names: who aborted, the peer that is gone or
    /// misbehaved.
    pub rank: Option<u32>,
    /// The channel the error names.
    pub channel: Option<u8>,
    /// What a timeout waited for.
    pub waiting_for: Option<String>,
    /// How long a timeout waited, in seconds.
    pub after: Option<f64>,
    /// A call that differs across ranks (the core's `MismatchedCall`).
    pub mismatch: bool,
}

impl Details {
    /// An error of the binding itself, with no rank or channel.
    pub fn new(kind: &'static str, message: impl Into<String>) -> Details {
        Details {
            kind,
            message: message.into(),
            rank: None,
            channel: None,
            waiting_for: None,
            after: None,
            mismatch: false,
        }
    }

    /// The fields of a communicator's error.
    pub fn of(e: &ringcc_comm::Error) -> Details {
        use ringcc_comm::Error as E;
        let mut d = Details::new(e.kind(), e.to_string());
        match e {
            E::Timeout { waiting_for, after } => {
                d.waiting_for = Some(waiting_for.clone());
                d.after = Some(after.as_secs_f64());
            }
            E::Aborted { rank, .. } => d.rank = rank.map(|r| r.0),
            E::Core {
                channel, source, ..
            } => {
                d.channel = channel.map(|c| c.0);
                d.mismatch = matches!(source, ringcc_core::Error::MismatchedCall { .. });
            }
            E::Protocol { peer, channel, .. } | E::PeerGone { peer, channel, .. } => {
                d.rank = Some(peer.0);
                d.channel = Some(channel.0);
            }
            _ => {}
        }
        d
    }

    /// The exception: `ringcc.errors`'s class for the kind, or a
    /// `RuntimeError` with the message if that module cannot be loaded.
    pub fn into_py(self, py: Python<'_>) -> PyErr {
        let made = py.import("ringcc.errors").and_then(|m| {
            m.getattr("_from_ringcc")?.call1((
                self.kind,
                &self.message,
                self.rank,
                self.channel,
                self.waiting_for.as_deref(),
                self.after,
                self.mismatch,
            ))
        });
        match made {
            Ok(exc) => PyErr::from_value(exc),
            Err(e) => PyRuntimeError::new_err(format!(
                "ringcc: {} (and ringcc.errors failed to load: {e})",
                self.message
            )),
        }
    }
}

/// A communicator's error as an exception.
pub fn to_py(py: Python<'_>, e: &ringcc_comm::Error) -> PyErr {
    Details::of(e).into_py(py)
}

/// A refused buffer (`ringcc.BadBuffer`).
pub fn bad_buffer(py: Python<'_>, message: impl Into<String>) -> PyErr {
    Details::new("bad_buffer", message).into_py(py)
}
