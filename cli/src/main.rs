//! The `ringcc` command: nccl-tests-compatible `perf`, `explain` and
//! `trace`, on the simulator by default.

mod args;
mod backend;
mod error;
mod explain;
mod perf;
mod topo;
mod trace;

use clap::Parser;

use crate::args::{Cli, Command};
use crate::error::CliError;

fn run(cli: Cli) -> Result<i32, CliError> {
    match cli.command {
        Command::Perf(a) => {
            let mut b = backend::open(&a)?;
            let ok = perf::perf(&a, b.as_mut())?;
            Ok(if ok { 0 } else { 1 })
        }
        Command::Explain(a) => {
            print!("{}", explain::explain(&a)?);
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
    let code = match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("ringcc: {e}");
            e.exit_code()
        }
    };
    std::process::exit(code);
}
