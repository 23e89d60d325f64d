//! `--np N`: this command starts N rank processes of itself on this
//! machine (as `mpirun -np N` would) and waits for them; and what a rank
//! process needs to know about how it was started ([`launched_by`],
//! [`watch_parent`]).

use std::collections::hash_map::RandomState;
use std::ffi::OsString;
use std::hash::{BuildHasher, Hasher};
use std::io::{Read, Write};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ringcc_comm::launch::Launch;

use crate::args::PerfArgs;
use crate::error::CliError;

/// Set in the ranks `--np` starts: the starting process's pid. Such a
/// rank exits when its stdin (a pipe from that process) closes, so that
/// no rank outlives it.
pub const PARENT_VAR: &str = "RINGCC_PERF_PARENT";

/// How long the other ranks may run on once one has exited.
const GRACE: Duration = Duration::from_secs(10);

/// The launcher variable that gives this process its rank, when one is
/// set. [`Launch`] looks for a rank variable before it reads anything
/// else, so the first variable it finds set is that one.
pub fn launched_by() -> Option<String> {
    let found = std::cell::RefCell::new(None);
    let _ = Launch::from_vars(|k| {
        let v = std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        if v.is_some() && found.borrow().is_none() {
            *found.borrow_mut() = Some(k.to_owned());
        }
        v
    });
    found.into_inner()
}

/// A rank started by `--np`: exits when the process that started it is
/// gone (its stdin, a pipe from that process, reads end of file).
pub fn watch_parent(pid: String) {
    let _ = std::thread::Builder::new()
        .name("ringcc-parent".into())
        .spawn(move || {
            let mut sink = [0u8; 64];
            while matches!(std::io::stdin().read(&mut sink), Ok(n) if n > 0) {}
            let _ = writeln!(
                std::io::stderr(),
                "ringcc: the ringcc process that started this rank (pid {pid}) is gone"
            );
            std::process::exit(1);
        });
}

/// One rank process of `--np`.
struct RankProc {
    child: Child,
    /// Held open while the rank runs: its end of file tells the rank
    /// that this process is gone.
    _stdin: Option<ChildStdin>,
    /// The rank's stderr, read to the end (not rank 0's: it is ours).
    stderr: Option<JoinHandle<String>>,
    status: Option<ExitStatus>,
    /// Why this process killed the rank, when it did.
    killed: Option<String>,
}

/// The ranks of one `--np` job; dropping it kills those still running.
struct Job(Vec<RankProc>);

impl Drop for Job {
    fn drop(&mut self) {
        for r in &mut self.0 {
            if r.status.is_none() {
                kill(r, "");
            }
        }
    }
}

fn kill(r: &mut RankProc, why: &str) {
    let _ = r.child.kill();
    r.status = r.child.wait().ok();
    r.killed = Some(why.to_owned());
}

/// `--np N`: starts N rank processes of this command (its arguments
/// less `--np`) with `RINGCC_RANK`, `RINGCC_WORLD_SIZE`, `RINGCC_ADDR` on
/// a free port of 127.0.0.1 and a random `RINGCC_TOKEN`; rank 0's stdout
/// and stderr are this process's. When one rank exits, the others have
/// [`GRACE`] to follow before they are killed (and with `-T`, the job
/// `-T` + a minute in all); a failed rank's stderr is printed. Returns
/// rank 0's exit status, or 1 when only another rank failed.
pub fn launch(a: &PerfArgs, np: u32) -> Result<i32, CliError> {
    if np == 0 || np as usize > ringcc_core::MAX_RANKS {
        return Err(CliError::usage(format!(
            "--np {np}: a job has 1 to {} ranks",
            ringcc_core::MAX_RANKS
        )));
    }
    if let Some(var) = launched_by() {
        return Err(CliError::usage(format!(
            "--np starts its own ranks, but {var} is set: under a launcher, leave --np out"
        )));
    }
    let exe = std::env::current_exe()
        .map_err(|e| CliError::failed(format!("cannot find this program's path: {e}")))?;
    let args = without_np(std::env::args_os().skip(1));
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| CliError::failed(format!("no free port on 127.0.0.1: {e}")))?
        .port();
    let token = random_token();
    let mut job = Job(Vec::new());
    for r in 0..np {
        let mut cmd = Command::new(&exe);
        cmd.args(&args)
            .env("RINGCC_RANK", r.to_string())
            .env("RINGCC_WORLD_SIZE", np.to_string())
            .env("RINGCC_ADDR", format!("127.0.0.1:{port}"))
            .env("RINGCC_TOKEN", &token)
            .env(PARENT_VAR, std::process::id().to_string())
            .stdin(Stdio::piped());
        if r > 0 {
            cmd.stdout(Stdio::null()).stderr(Stdio::piped());
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| CliError::failed(format!("cannot start rank {r}: {e}")))?;
        let stderr = child.stderr.take().map(|mut pipe| {
            std::thread::spawn(move || {
                let mut b = Vec::new();
                let _ = pipe.read_to_end(&mut b);
                String::from_utf8_lossy(&b).into_owned()
            })
        });
        job.0.push(RankProc {
            _stdin: child.stdin.take(),
            child,
            stderr,
            status: None,
            killed: None,
        });
    }
    let deadline = (a.timeout > 0)
        .then(|| Instant::now().checked_add(Duration::from_secs(a.timeout.saturating_add(60))))
        .flatten();
    wait(&mut job, deadline)?;
    Ok(report(&mut job))
}

/// Waits until every rank has exited, killing the rest [`GRACE`] after
/// the first exit or at `deadline`.
fn wait(job: &mut Job, deadline: Option<Instant>) -> Result<(), CliError> {
    let mut kill_at = deadline;
    let mut why = "the job ran past -T and a minute".to_owned();
    loop {
        let mut running = 0;
        for r in &mut job.0 {
            if r.status.is_some() {
                continue;
            }
            match r.child.try_wait() {
                Ok(Some(st)) => {
                    r.status = Some(st);
                    let k = Instant::now() + GRACE;
                    if kill_at.is_none_or(|t| k < t) {
                        kill_at = Some(k);
                        why = format!("another rank had exited {} s before", GRACE.as_secs());
                    }
                }
                Ok(None) => running += 1,
                Err(e) => return Err(CliError::failed(format!("cannot wait for a rank: {e}"))),
            }
        }
        if running == 0 {
            return Ok(());
        }
        if kill_at.is_some_and(|t| Instant::now() >= t) {
            for r in job.0.iter_mut().filter(|r| r.status.is_none()) {
                kill(r, &why);
            }
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Prints what the failed ranks other than rank 0 said (rank 0's stderr
/// is already ours; a usage error, which every rank shares, once) and
/// returns the job's exit status.
fn report(job: &mut Job) -> i32 {
    let code = |r: &RankProc| r.status.and_then(|s| s.code());
    let ok = |r: &RankProc| r.killed.is_none() && r.status.is_some_and(|s| s.success());
    let code0 = job.0.first().and_then(code);
    let mut err = std::io::stderr().lock();
    for (i, r) in job.0.iter_mut().enumerate() {
        let text = r
            .stderr
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default();
        if ok(r) {
            continue;
        }
        // Rank 0's stderr is ours. A rank that ended as rank 0 did adds
        // nothing when it says nothing (wrong results: rank 0 printed
        // them) or when it is a usage error (every rank's: rank 0 said it).
        let as_rank0 = i == 0 || (code(r) == code0 && (code0 == Some(2) || text.trim().is_empty()));
        if !as_rank0 {
            for line in text.lines() {
                let _ = writeln!(err, "[rank {i}] {line}");
            }
        }
        match (&r.killed, r.status) {
            (Some(why), _) => {
                let _ = writeln!(err, "ringcc: rank {i} killed: {why}");
            }
            // Without a word, or ended by a signal.
            (None, Some(st)) if (!as_rank0 && text.trim().is_empty()) || st.code().is_none() => {
                let _ = writeln!(err, "ringcc: rank {i} failed ({st})");
            }
            _ => {}
        }
    }
    match (job.0.iter().all(ok), code0) {
        (true, _) => 0,
        (false, Some(c)) if c != 0 => c,
        (false, _) => 1,
    }
}

/// The command's arguments without `--np N` / `--np=N`.
fn without_np(args: impl Iterator<Item = OsString>) -> Vec<OsString> {
    let mut out = Vec::new();
    let mut skip = false;
    for a in args {
        if std::mem::take(&mut skip) {
            continue;
        }
        if a == "--np" {
            skip = true;
        } else if !a.to_str().is_some_and(|s| s.starts_with("--np=")) {
            out.push(a);
        }
    }
    out
}

/// 128 random bits (the standard library's per-process hash keys) as hex.
fn random_token() -> String {
    let word = || {
        let mut h = RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        h.finish()
    };
    format!("np-{:016x}{:016x}", word(), word())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn np_is_taken_out_of_the_arguments() {
        let args = |v: &[&str]| v.iter().map(OsString::from).collect::<Vec<_>>();
        assert_eq!(
            without_np(args(&["perf", "allreduce", "--np", "3", "-b", "8"]).into_iter()),
            args(&["perf", "allreduce", "-b", "8"])
        );
        assert_eq!(
            without_np(args(&["perf", "--np=2", "allreduce"]).into_iter()),
            args(&["perf", "allreduce"])
        );
    }

    #[test]
    fn tokens_differ() {
        assert_ne!(random_token(), random_token());
    }
}
