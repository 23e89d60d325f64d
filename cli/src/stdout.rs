//! Every subcommand's stdout. A write to a closed pipe (`ringcc … | head`)
//! ends the command quietly, as Unix tools end on SIGPIPE, where `print!`
//! would panic: Rust ignores SIGPIPE, so the write fails with EPIPE.

use std::io::{self, Write};

use crate::error::CliError;

/// Writes `text` to stdout and flushes it (the table's rows appear as
/// they are measured, and a closed pipe is noticed at the write that hit
/// it, not at exit).
pub fn print(text: &str) -> Result<(), CliError> {
    let mut out = io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(write_failed)
}

/// [`print()`] with a newline.
pub fn println(line: &str) -> Result<(), CliError> {
    let mut out = io::stdout().lock();
    out.write_all(line.as_bytes())
        .and_then(|()| out.write_all(b"\n"))
        .and_then(|()| out.flush())
        .map_err(write_failed)
}

fn write_failed(e: io::Error) -> CliError {
    if e.kind() == io::ErrorKind::BrokenPipe {
        CliError::StdoutClosed
    } else {
        CliError::failed(format!("cannot write to stdout: {e}"))
    }
}
