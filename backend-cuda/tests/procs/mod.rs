//! Jobs of rank processes for the multi-process tests: the test binary
//! re-executes itself once per rank, running one `#[ignore]`d test (the
//! rank's body) with the rank's variables; the parent waits for all of
//! them, bounded, kills what is left, and hands back each one's exit
//! status and output. No rank outlives the test (a failed assert
//! included).

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// What one rank process did.
#[derive(Debug)]
pub struct Exit {
    /// Its exit status (`None`: killed, by the test or by the parent at
    /// the limit).
    pub code: Option<i32>,
    /// Its stdout, then its stderr.
    pub out: String,
}

/// Kills a child still running when dropped.
struct Reap(Child);

impl Drop for Reap {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Starts `ranks` processes of this test binary, each running the
/// ignored test `child` with `env(rank)`, and waits for all of them (up
/// to `limit`; the rest are killed). Their exits in rank order.
pub fn run(
    child: &str,
    ranks: u32,
    limit: Duration,
    env: &dyn Fn(u32) -> Vec<(&'static str, String)>,
) -> Vec<Exit> {
    let exe = std::env::current_exe().unwrap();
    let t0 = Instant::now();
    let mut children: Vec<Reap> = (0..ranks)
        .map(|r| {
            Reap(
                Command::new(&exe)
                    .args(["--exact", child, "--ignored", "--nocapture"])
                    .envs(env(r))
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .expect("spawn a rank"),
            )
        })
        .collect();
    let mut done: Vec<Option<Option<i32>>> = (0..ranks).map(|_| None).collect();
    while done.iter().any(Option::is_none) && t0.elapsed() < limit {
        for (r, c) in children.iter_mut().enumerate() {
            if done[r].is_none() {
                if let Ok(Some(st)) = c.0.try_wait() {
                    done[r] = Some(st.code());
                }
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    children
        .iter_mut()
        .zip(done)
        .map(|(c, d)| {
            if d.is_none() {
                let _ = c.0.kill();
            }
            let _ = c.0.wait();
            let mut out = String::new();
            if let Some(mut s) = c.0.stdout.take() {
                let _ = std::io::Read::read_to_string(&mut s, &mut out);
            }
            if let Some(mut s) = c.0.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut s, &mut out);
            }
            Exit {
                code: d.flatten(),
                out,
            }
        })
        .collect()
}
