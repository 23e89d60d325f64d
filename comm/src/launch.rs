//! Who am I, how many are we, where is rank 0: launcher detection.
//!
//! One rank per process, as with NCCL. The rank, the world size and the
//! rendezvous address come from the first launcher whose variables are
//! set, in this order:
//!
//! | launcher | rank | world size | address |
//! |---|---|---|---|
//! | ringcc | `RINGCC_RANK` | `RINGCC_WORLD_SIZE` | `RINGCC_ADDR` |
//! | mpirun (Open MPI) | `OMPI_COMM_WORLD_RANK` | `OMPI_COMM_WORLD_SIZE` | |
//! | PMI (MPICH, Intel MPI, srun --mpi=pmi2) | `PMI_RANK` | `PMI_SIZE` | |
//! | srun | `SLURM_PROCID` | `SLURM_NTASKS` | first host of `SLURM_STEP_NODELIST` |
//! | torchrun | `RANK` | `WORLD_SIZE` | `MASTER_ADDR`, `MASTER_PORT` + 1 |
//!
//! `RINGCC_ADDR` (`host:port`, or `host` with the port from `RINGCC_PORT`,
//! default [`DEFAULT_PORT`]) overrides the address under every launcher.
//! Under torchrun the port is `MASTER_PORT + 1`, because torchrun's own
//! agent already serves its store on `MASTER_PORT`.
//!
//! Every connection to rank 0's store presents the job's token:
//! `RINGCC_TOKEN` when set, otherwise a hash of what every rank of the job
//! sees alike (world size, address, the launcher's job and step ids). A
//! derived token is not a secret; it keeps strangers and stale jobs that
//! reuse the port out.
//!
//! A rank's *node* ([`node_name`]) says which ranks share a machine (and
//! so may use shared memory): `RINGCC_NODE` when set, else the host name.

use ringcc_core::Rank;

use crate::error::{Error, Result};

/// Where the host name is read from (Linux).
const HOSTNAME_FILE: &str = "/proc/sys/kernel/hostname";

/// The port rank 0 serves on when none is given.
pub const DEFAULT_PORT: u16 = 29517;

/// The launcher the rank and world size were read from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Launcher {
    /// `RINGCC_RANK` / `RINGCC_WORLD_SIZE`.
    Ringcc,
    /// Open MPI's `mpirun`.
    OpenMpi,
    /// A PMI launcher (MPICH's `mpiexec`, Intel MPI, …).
    Pmi,
    /// Slurm's `srun`.
    Slurm,
    /// PyTorch's `torchrun`.
    Torchrun,
}

/// Rank, world size, rendezvous address and token of this process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Launch {
    /// This process's rank, `0..world_size`.
    pub rank: Rank,
    /// Number of ranks.
    pub world_size: u32,
    /// Rank 0's rendezvous address, `host:port`.
    pub addr: String,
    /// The job token every rank presents to the store.
    pub token: String,
    /// Where rank and world size came from.
    pub launcher: Launcher,
}

/// (launcher, rank variable, world-size variable), in detection order.
const SOURCES: [(Launcher, &str, &str); 5] = [
    (Launcher::Ringcc, "RINGCC_RANK", "RINGCC_WORLD_SIZE"),
    (
        Launcher::OpenMpi,
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
    ),
    (Launcher::Pmi, "PMI_RANK", "PMI_SIZE"),
    (Launcher::Slurm, "SLURM_PROCID", "SLURM_NTASKS"),
    (Launcher::Torchrun, "RANK", "WORLD_SIZE"),
];

/// Variables whose values identify one job (run) of a launcher; they feed
/// the derived token.
const JOB_IDS: [&str; 8] = [
    "SLURM_JOB_ID",
    "SLURM_STEP_ID",
    "OMPI_MCA_ess_base_jobid",
    "OMPI_MCA_orte_ess_jobid",
    "PMIX_NAMESPACE",
    "PMI_JOBID",
    "TORCHELASTIC_RUN_ID",
    "MASTER_PORT",
];

impl Launch {
    /// Reads the process environment.
    pub fn from_env() -> Result<Launch> {
        Launch::from_vars(|k| std::env::var(k).ok())
    }

    /// The job's built-in store: rank 0 serves it at the launch address
    /// (on that address, not on every interface) and every rank connects
    /// with the job token, waiting up to `timeout`. The server (rank 0's,
    /// else `None`) must outlive every use of the store.
    pub fn join_store(
        &self,
        timeout: std::time::Duration,
    ) -> Result<(
        Option<crate::store::tcp::TcpStoreServer>,
        crate::store::tcp::TcpStore,
    )> {
        use crate::store::tcp::{TcpStore, TcpStoreServer};
        let server = if self.rank == Rank(0) {
            let bind = crate::resolve(&self.addr)?;
            Some(TcpStoreServer::start(bind, &self.token, self.world_size)?)
        } else {
            None
        };
        let store =
            TcpStore::connect(&self.addr, &self.token, self.rank, self.world_size, timeout)?;
        Ok((server, store))
    }

    /// Reads variables through `get` (the environment, or a test's map).
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Launch> {
        let get = |k: &str| get(k).filter(|v| !v.trim().is_empty());
        let Some((launcher, rank_var, size_var)) = SOURCES
            .iter()
            .copied()
            .find(|(_, rank_var, _)| get(rank_var).is_some())
        else {
            return Err(Error::Env {
                var: "RINGCC_RANK".into(),
                reason: "no rank found: set RINGCC_RANK/RINGCC_WORLD_SIZE/RINGCC_ADDR or run \
                         under mpirun, srun or torchrun"
                    .into(),
            });
        };
        let rank = parse_u32(rank_var, get(rank_var))?;
        let world_size = parse_u32(size_var, get(size_var))?;
        if world_size == 0 {
            return Err(Error::Env {
                var: size_var.into(),
                reason: "the world size must be at least 1".into(),
            });
        }
        if rank >= world_size {
            return Err(Error::Env {
                var: rank_var.into(),
                reason: format!("rank {rank} is out of range for world size {world_size}"),
            });
        }
        let addr = rendezvous_addr(&get, launcher)?;
        let token = match get("RINGCC_TOKEN") {
            Some(t) => t,
            None => derive_token(&get, world_size, &addr),
        };
        Ok(Launch {
            rank: Rank(rank),
            world_size,
            addr,
            token,
            launcher,
        })
    }
}

fn parse_u32(var: &str, value: Option<String>) -> Result<u32> {
    let Some(v) = value else {
        return Err(Error::Env {
            var: var.into(),
            reason: "not set".into(),
        });
    };
    v.trim().parse::<u32>().map_err(|e| Error::Env {
        var: var.into(),
        reason: format!("{v:?} is not a non-negative integer ({e})"),
    })
}

fn parse_port(var: &str, v: &str) -> Result<u16> {
    v.trim().parse::<u16>().map_err(|e| Error::Env {
        var: var.into(),
        reason: format!("{v:?} is not a port number ({e})"),
    })
}

fn rendezvous_addr(get: &impl Fn(&str) -> Option<String>, launcher: Launcher) -> Result<String> {
    let default_port = match get("RINGCC_PORT") {
        Some(p) => parse_port("RINGCC_PORT", &p)?,
        None => DEFAULT_PORT,
    };
    if let Some(a) = get("RINGCC_ADDR") {
        return with_port("RINGCC_ADDR", a.trim(), default_port);
    }
    if let Some(host) = get("MASTER_ADDR") {
        let port = match (get("RINGCC_PORT"), get("MASTER_PORT")) {
            (Some(_), _) | (None, None) => default_port,
            (None, Some(p)) => parse_port("MASTER_PORT", &p)?
                .checked_add(1)
                .ok_or(Error::Env {
                    var: "MASTER_PORT".into(),
                    reason: "no port above it for ringcc's store".into(),
                })?,
        };
        return Ok(join_host_port(host.trim(), port));
    }
    if launcher == Launcher::Slurm {
        let list = get("SLURM_STEP_NODELIST").or_else(|| get("SLURM_JOB_NODELIST"));
        if let Some(host) = list.as_deref().and_then(first_host) {
            return Ok(join_host_port(&host, default_port));
        }
    }
    Err(Error::Env {
        var: "RINGCC_ADDR".into(),
        reason: "no rendezvous address: set RINGCC_ADDR=host:port (rank 0's host)".into(),
    })
}

/// `host:port` from `a`, adding `port` when `a` names only a host.
fn with_port(var: &str, a: &str, port: u16) -> Result<String> {
    if a.is_empty() {
        return Err(Error::Env {
            var: var.into(),
            reason: "empty".into(),
        });
    }
    // "[v6]:port", "host:port", "v4:port" carry a port; "host", "[v6]" and
    // a bare IPv6 address do not.
    if let Some(rest) = a.strip_prefix('[') {
        return match rest.split_once(']') {
            Some((_, "")) => Ok(format!("{a}:{port}")),
            Some((_, p)) if p.starts_with(':') => {
                parse_port(var, &p[1..])?;
                Ok(a.to_owned())
            }
            _ => Err(Error::Env {
                var: var.into(),
                reason: format!("{a:?} is not host:port"),
            }),
        };
    }
    match a.matches(':').count() {
        0 => Ok(format!("{a}:{port}")),
        1 => {
            let (_, p) = a.split_once(':').unwrap_or((a, ""));
            parse_port(var, p)?;
            Ok(a.to_owned())
        }
        _ => Ok(format!("[{a}]:{port}")),
    }
}

fn join_host_port(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// The first host of a Slurm node list: `node[01-04,07],gpu2` → `node01`.
pub fn first_host(list: &str) -> Option<String> {
    let list = list.trim();
    // The first entry ends at the first comma outside brackets.
    let mut depth = 0u32;
    let mut end = list.len();
    for (i, ch) in list.char_indices() {
        match ch {
            '[' => depth = depth.saturating_add(1),
            ']' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                end = i;
                break;
            }
            _ => {}
        }
    }
    let entry = list.get(..end)?;
    let host = match entry.split_once('[') {
        None => entry.to_owned(),
        Some((prefix, range)) => {
            let first = range.trim_end_matches(']').split([',', '-']).next()?;
            format!("{prefix}{first}")
        }
    };
    (!host.is_empty()).then_some(host)
}

/// FNV-1a over the job's shared facts, as 16 hex digits.
fn derive_token(get: &impl Fn(&str) -> Option<String>, world: u32, addr: &str) -> String {
    let mut text = format!("ringcc-v1|{world}|{addr}");
    for k in JOB_IDS {
        if let Some(v) = get(k) {
            text.push('|');
            text.push_str(k);
            text.push('=');
            text.push_str(&v);
        }
    }
    format!("{:016x}", fnv1a(text.as_bytes()))
}

/// This rank's node name: `RINGCC_NODE` when set and not blank, else the
/// host name ([`host_name`]). Ranks with the same node name share a
/// machine.
pub fn node_name() -> String {
    node_name_from(|k| std::env::var(k).ok())
}

/// [`node_name`] with the variable read through `get`.
fn node_name_from(get: impl Fn(&str) -> Option<String>) -> String {
    get("RINGCC_NODE")
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
        .unwrap_or_else(host_name)
}

/// This machine's host name (from `/proc/sys/kernel/hostname`), or
/// `"localhost"` when it cannot be read or is empty.
pub fn host_name() -> String {
    std::fs::read_to_string(HOSTNAME_FILE)
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}

/// 64-bit FNV-1a of `bytes`: the hash behind the derived token, for other
/// values every rank must derive alike.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn launch(vars: &[(&str, &str)]) -> Result<Launch> {
        let m: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Launch::from_vars(|k| m.get(k).cloned())
    }

    #[test]
    fn ringcc_variables() {
        let l = launch(&[
            ("RINGCC_RANK", "2"),
            ("RINGCC_WORLD_SIZE", "4"),
            ("RINGCC_ADDR", "10.0.0.1:4000"),
            ("RINGCC_TOKEN", "secret"),
        ])
        .unwrap();
        assert_eq!(l.rank, Rank(2));
        assert_eq!(l.world_size, 4);
        assert_eq!(l.addr, "10.0.0.1:4000");
        assert_eq!(l.token, "secret");
        assert_eq!(l.launcher, Launcher::Ringcc);
    }

    #[test]
    fn host_without_port_gets_the_default_or_ringcc_port() {
        let l = launch(&[
            ("RINGCC_RANK", "0"),
            ("RINGCC_WORLD_SIZE", "1"),
            ("RINGCC_ADDR", "node7"),
        ])
        .unwrap();
        assert_eq!(l.addr, format!("node7:{DEFAULT_PORT}"));
        let l = launch(&[
            ("RINGCC_RANK", "0"),
            ("RINGCC_WORLD_SIZE", "1"),
            ("RINGCC_ADDR", "fe80::1"),
            ("RINGCC_PORT", "9"),
        ])
        .unwrap();
        assert_eq!(l.addr, "[fe80::1]:9");
        let l = launch(&[
            ("RINGCC_RANK", "0"),
            ("RINGCC_WORLD_SIZE", "1"),
            ("RINGCC_ADDR", "[::1]:77"),
        ])
        .unwrap();
        assert_eq!(l.addr, "[::1]:77");
    }

    #[test]
    fn open_mpi_with_ringcc_addr() {
        let l = launch(&[
            ("OMPI_COMM_WORLD_RANK", "3"),
            ("OMPI_COMM_WORLD_SIZE", "8"),
            ("RINGCC_ADDR", "head:1234"),
        ])
        .unwrap();
        assert_eq!(
            (l.rank.0, l.world_size, l.launcher),
            (3, 8, Launcher::OpenMpi)
        );
    }

    #[test]
    fn pmi() {
        let l = launch(&[("PMI_RANK", "1"), ("PMI_SIZE", "2"), ("RINGCC_ADDR", "h:1")]).unwrap();
        assert_eq!((l.rank.0, l.world_size, l.launcher), (1, 2, Launcher::Pmi));
    }

    #[test]
    fn slurm_takes_the_first_node() {
        let l = launch(&[
            ("SLURM_PROCID", "5"),
            ("SLURM_NTASKS", "16"),
            ("SLURM_STEP_NODELIST", "gpu[07-10,12],cpu1"),
            ("SLURM_JOB_ID", "991"),
        ])
        .unwrap();
        assert_eq!(l.rank, Rank(5));
        assert_eq!(l.world_size, 16);
        assert_eq!(l.addr, format!("gpu07:{DEFAULT_PORT}"));
        assert_eq!(l.launcher, Launcher::Slurm);
    }

    #[test]
    fn torchrun_uses_master_port_plus_one() {
        let l = launch(&[
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "10.1.2.3"),
            ("MASTER_PORT", "29500"),
        ])
        .unwrap();
        assert_eq!(l.addr, "10.1.2.3:29501");
        assert_eq!(l.launcher, Launcher::Torchrun);
    }

    #[test]
    fn ringcc_rank_wins_over_launchers() {
        let l = launch(&[
            ("RINGCC_RANK", "0"),
            ("RINGCC_WORLD_SIZE", "2"),
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "m"),
        ])
        .unwrap();
        assert_eq!(l.rank, Rank(0));
    }

    #[test]
    fn errors_name_the_variable() {
        let e = launch(&[]).unwrap_err();
        assert!(e.to_string().contains("RINGCC_RANK"), "{e}");
        let e = launch(&[("RINGCC_RANK", "x"), ("RINGCC_WORLD_SIZE", "2")]).unwrap_err();
        assert!(e.to_string().contains("RINGCC_RANK"), "{e}");
        let e = launch(&[("RINGCC_RANK", "2"), ("RINGCC_WORLD_SIZE", "2")]).unwrap_err();
        assert!(e.to_string().contains("out of range"), "{e}");
        let e = launch(&[("RINGCC_RANK", "0"), ("RINGCC_WORLD_SIZE", "0")]).unwrap_err();
        assert!(e.to_string().contains("at least 1"), "{e}");
        let e =
            launch(&[("OMPI_COMM_WORLD_RANK", "0"), ("OMPI_COMM_WORLD_SIZE", "2")]).unwrap_err();
        assert!(e.to_string().contains("RINGCC_ADDR"), "{e}");
        let e = launch(&[
            ("RINGCC_RANK", "0"),
            ("RINGCC_WORLD_SIZE", "2"),
            ("RINGCC_ADDR", "h:99999"),
        ])
        .unwrap_err();
        assert!(e.to_string().contains("port"), "{e}");
    }

    #[test]
    fn derived_token_is_shared_by_the_job_and_differs_between_jobs() {
        let a = launch(&[
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_JOB_NODELIST", "n1"),
            ("SLURM_JOB_ID", "1"),
        ])
        .unwrap();
        let b = launch(&[
            ("SLURM_PROCID", "1"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_JOB_NODELIST", "n1"),
            ("SLURM_JOB_ID", "1"),
        ])
        .unwrap();
        let c = launch(&[
            ("SLURM_PROCID", "1"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_JOB_NODELIST", "n1"),
            ("SLURM_JOB_ID", "2"),
        ])
        .unwrap();
        assert_eq!(a.token, b.token);
        assert_ne!(a.token, c.token);
        assert_eq!(a.token.len(), 16);
    }

    #[test]
    fn node_name_is_ringcc_node_else_the_host_name() {
        assert_eq!(node_name_from(|_| Some(" rack3-n7 ".into())), "rack3-n7");
        let host = host_name();
        assert!(!host.is_empty());
        assert_eq!(node_name_from(|_| None), host);
        assert_eq!(node_name_from(|_| Some("  ".into())), host);
    }

    #[test]
    fn fnv1a_is_the_reference_hash() {
        // Test vectors of the FNV-1a 64-bit reference.
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }

    #[test]
    fn first_host_of_node_lists() {
        assert_eq!(first_host("a").as_deref(), Some("a"));
        assert_eq!(first_host("a,b").as_deref(), Some("a"));
        assert_eq!(first_host("n[3-5]").as_deref(), Some("n3"));
        assert_eq!(first_host("n[03,07-9],m[1-2]").as_deref(), Some("n03"));
        assert_eq!(first_host("").as_deref(), None);
    }
}
