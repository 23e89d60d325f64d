//! The command's errors: one clear line each, and an exit status.

use std::fmt;

/// What went wrong, and which exit status it gets.
#[derive(Debug)]
pub enum CliError {
    /// Bad flags or an impossible request (exit 2).
    Usage(String),
    /// The run failed: a backend error, a wrong result (exit 1).
    Failed(String),
    /// A bug in ringcc itself (exit 3).
    Internal(String),
    /// Whoever read stdout closed it (`ringcc … | head`): the command
    /// stops without a message, with the status a shell reports for a
    /// process that SIGPIPE ended (128 + 13).
    StdoutClosed,
}

/// The exit status of [`CliError::StdoutClosed`].
pub const EXIT_STDOUT_CLOSED: i32 = 128 + 13;

impl CliError {
    /// A usage error.
    pub fn usage(m: impl Into<String>) -> CliError {
        CliError::Usage(m.into())
    }

    /// A run failure.
    pub fn failed(m: impl Into<String>) -> CliError {
        CliError::Failed(m.into())
    }

    /// An internal error.
    pub fn internal(m: impl Into<String>) -> CliError {
        CliError::Internal(m.into())
    }

    /// A core error from validating the user's request.
    pub fn core(e: ringcc_core::Error) -> CliError {
        CliError::Usage(e.to_string())
    }

    /// The process exit status.
    pub fn exit_code(&self) -> i32 {
        match self {
            CliError::Usage(_) => 2,
            CliError::Failed(_) => 1,
            CliError::Internal(_) => 3,
            CliError::StdoutClosed => EXIT_STDOUT_CLOSED,
        }
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CliError::Usage(m) | CliError::Failed(m) => f.write_str(m),
            CliError::Internal(m) => write!(f, "internal error: {m} (please report this)"),
            CliError::StdoutClosed => f.write_str("stdout was closed"),
        }
    }
}

impl std::error::Error for CliError {}
