//! What every test of the `ringcc` binary needs: running it as a user
//! does, its output as text, the rows of a perf table, a scratch folder.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Command, Output};

/// Runs `ringcc args…` with no backtrace or log settings of the caller.
pub fn ringcc(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ringcc"))
        .args(args)
        .env_remove("RUST_BACKTRACE")
        .env_remove("RUST_LOG")
        .output()
        .expect("run ringcc")
}

/// Runs `ringcc` with the words of `line` as its arguments.
pub fn run(line: &str) -> Output {
    ringcc(&line.split_whitespace().collect::<Vec<_>>())
}

/// Its stdout, as text.
pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Its stderr, as text.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The data rows of a perf table: the whitespace-separated fields.
pub fn rows(text: &str) -> Vec<Vec<String>> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| l.split_whitespace().map(str::to_owned).collect())
        .collect()
}

/// A fresh, empty scratch folder for one test of one file.
pub fn scratch(file: &str, test: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ringcc-{file}-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("create a scratch folder");
    d
}
