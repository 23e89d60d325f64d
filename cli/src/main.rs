//! The `ringcc` command.

fn main() {
    eprintln!("ringcc: the command line arrives with the simulator; see README.md");
    std::process::exit(2);
}
