//! The command's standard output.

/// Writes `text` to stdout.
pub fn print(text: &str) {
    print!("{text}");
}
