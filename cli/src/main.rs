//! The `ringcc` command: nccl-tests-compatible `perf`, `explain` and
//! `trace`, on the simulator by default.

mod args;
mod backend;
mod error;
mod explain;
mod perf;
mod progress;
mod stdout;
mod topo;
mod trace;

use std::io::Write as _;

use clap::Parser;

use crate::args::{Cli, Command};
use crate::error::CliError;

/// The backends' log lines (a rendezvous that rejects a stranger, a rank
/// that fails or learns of another's abort, `RUST_LOG=ringcc_verbs=debug`'s
/// devices, connections and call headers) go to stderr, filtered by `RUST_LOG`; warnings and
/// errors when it is unset or unreadable. stdout stays the perf table.
fn init_log() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

fn run(cli: Cli) -> Result<i32, CliError> {
    match cli.command {
        Command::Perf(a) => backend::perf(&a),
        Command::Explain(a) => {
            stdout::print(&explain::explain(&a)?)?;
            Ok(0)
        }
        Command::Trace(a) => {
            trace::trace(&a)?;
            Ok(0)
        }
    }
}

fn main() {
    let cli = Cli::parse();
    init_log();
    let code = match run(cli) {
        Ok(code) => code,
        // The reader of stdout is gone: nothing to tell anyone.
        Err(e @ CliError::StdoutClosed) => e.exit_code(),
        Err(e) => {
            // Not `eprintln!`: it panics when stderr is closed too.
            let _ = writeln!(std::io::stderr(), "ringcc: {e}");
            e.exit_code()
        }
    };
    std::process::exit(code);
}
