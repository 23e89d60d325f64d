//! Which transports the communicator of a `perf` rank process gets: the
//! one difference between `--backend host` and `--backend verbs`, which
//! are otherwise the same backend ([`super::host`]).
//!
//! | fabric | transports, in order of preference | FIFO |
//! |---|---|---|
//! | host | shared memory, verbs (feature `verbs`), TCP | verbs' where a hop may go over verbs, else the communicator's |
//! | verbs | verbs alone: every hop, a node's own through the NIC's loopback | verbs' |
//!
//! The communicator picks each hop's transport (the first both ends
//! offer that reaches between them; `RINGCC_SHM_DISABLE`,
//! `RINGCC_IB_DISABLE`, `RINGCC_NET` take transports out). Verbs offers
//! itself only where an RDMA device opens. The FIFO is one setting for
//! every hop of a job, and every rank must run the same, decided before
//! the ranks know each other: verbs' (`ringcc_verbs::options_from_env`;
//! the communicator's 128 KiB slots cost verbs half its bandwidth on
//! Soft-RoCE) where a hop may go over verbs — this host can run verbs,
//! and either a launcher started the rank (the job may span nodes) or
//! shared memory is turned off — else the communicator's (verbs' 4 MiB
//! FIFO costs shared memory ~20 % at 16–64 MiB). Ranks that `--np`
//! started share this host, so they keep shared memory's FIFO. A job
//! mixing hosts with and without RDMA devices must set
//! `RINGCC_SLOT_BYTES` (the communicator says which ranks differ).

use std::net::IpAddr;

use ringcc_comm::{Options, Transports};

use crate::error::CliError;

/// Which transports a rank may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fabric {
    /// `--backend host`: shared memory inside a node; between nodes RDMA
    /// verbs where this build has them and a device is present, else TCP.
    Host,
    /// `--backend verbs`: RDMA verbs on every hop.
    Verbs,
}

impl Fabric {
    /// The backend's name, as `--backend` spells it.
    pub fn name(self) -> &'static str {
        match self {
            Fabric::Host => "host",
            Fabric::Verbs => "verbs",
        }
    }

    /// The settings or the launcher's variables are wrong: a usage
    /// error, named by the backend.
    pub fn bad_setting(self, e: ringcc_comm::Error) -> CliError {
        CliError::usage(format!("{}: {e}", self.name()))
    }

    /// The communicator failed: a run failure, named by the backend.
    pub fn failed(self, e: ringcc_comm::Error) -> CliError {
        CliError::failed(format!("{}: {e}", self.name()))
    }

    /// What the transports are, for the table's header.
    pub fn describe(self) -> &'static str {
        match (self, cfg!(feature = "verbs")) {
            (Fabric::Host, true) => {
                "shared memory inside a node, RDMA verbs (where a device is present) or TCP \
                 between nodes"
            }
            (Fabric::Host, false) => "shared memory inside a node, TCP between nodes",
            (Fabric::Verbs, _) => {
                "RDMA verbs on every hop (RC queue pairs; ranks of one node through the NIC's \
                 loopback)"
            }
        }
    }

    /// The communicator's settings from the environment, with verbs'
    /// FIFO where a hop may go over verbs. `one_node`: every rank of the
    /// job runs on this host (`--np` started them), so a hop goes over
    /// verbs only where shared memory is turned off.
    pub fn options(self, one_node: bool) -> Result<Options, CliError> {
        let options = Options::from_env().map_err(|e| self.bad_setting(e))?;
        let verbs_hops = match self {
            Fabric::Verbs => true,
            Fabric::Host => verbs::usable(&options) && !(one_node && options.allows("shm")),
        };
        if verbs_hops {
            return verbs::options().map_err(|e| self.bad_setting(e));
        }
        Ok(options)
    }

    /// Refuses what cannot run before any rank waits for another:
    /// verbs in a build without it, turned off by the environment, or on
    /// a host without an RDMA device.
    pub fn check(self, options: &Options) -> Result<(), CliError> {
        match self {
            Fabric::Host => Ok(()),
            Fabric::Verbs => verbs::check(options),
        }
    }

    /// The transport list of every communicator of this process; TCP
    /// binds to `bind_ip`.
    pub fn transports(self, bind_ip: IpAddr, options: &Options) -> Result<Transports, CliError> {
        match self {
            Fabric::Host => verbs::with_host(bind_ip, options),
            Fabric::Verbs => verbs::alone(),
        }
    }
}

/// The verbs transport in this build.
#[cfg(feature = "verbs")]
mod verbs {
    use std::net::IpAddr;
    use std::sync::Arc;

    use ringcc_comm::transport::Transport;
    use ringcc_comm::{Options, Transports};
    use ringcc_host::tcp::TcpTransport;
    use ringcc_host::{ShmTransport, TCP_HELLO_TIMEOUT};
    use ringcc_verbs::{VerbsConfig, VerbsTransport};

    use super::Fabric;
    use crate::error::CliError;

    /// Whether verbs may be used and a device is present.
    pub fn usable(options: &Options) -> bool {
        options.allows("verbs") && !ringcc_verbs::devices().is_empty()
    }

    pub fn options() -> ringcc_comm::Result<Options> {
        ringcc_verbs::options_from_env()
    }

    pub fn check(options: &Options) -> Result<(), CliError> {
        if !options.allows("verbs") {
            return Err(CliError::usage(
                "verbs: --backend verbs runs every hop over verbs, which RINGCC_IB_DISABLE=1 or \
                 RINGCC_NET=tcp turns off (--backend host picks a transport per hop)",
            ));
        }
        if ringcc_verbs::devices().is_empty() {
            return Err(CliError::failed(
                "verbs: no RDMA device on this host (rdma-core lists none, or is not \
                 installed): --backend verbs needs one; --backend host runs over shared \
                 memory and TCP",
            ));
        }
        Ok(())
    }

    fn config(fabric: Fabric) -> Result<VerbsConfig, CliError> {
        VerbsConfig::from_env().map_err(|e| fabric.bad_setting(e.into_comm("VerbsConfig")))
    }

    /// Shared memory, verbs, TCP.
    pub fn with_host(bind_ip: IpAddr, options: &Options) -> Result<Transports, CliError> {
        let config = config(Fabric::Host)?;
        let timeout = options.timeout;
        Ok(Arc::new(move || {
            vec![
                Box::new(ShmTransport::new()) as Box<dyn Transport>,
                Box::new(VerbsTransport::new(config.clone())),
                Box::new(TcpTransport::new(bind_ip, TCP_HELLO_TIMEOUT, timeout)),
            ]
        }))
    }

    /// Verbs alone.
    pub fn alone() -> Result<Transports, CliError> {
        Ok(ringcc_verbs::transports(config(Fabric::Verbs)?))
    }
}

/// A build without the verbs transport: `--backend verbs` is refused,
/// `--backend host` is shared memory and TCP.
#[cfg(not(feature = "verbs"))]
mod verbs {
    use std::net::IpAddr;

    use ringcc_comm::{Options, Transports};

    use crate::error::CliError;

    pub fn usable(_: &Options) -> bool {
        false
    }

    pub fn options() -> ringcc_comm::Result<Options> {
        Options::from_env()
    }

    fn missing() -> CliError {
        CliError::usage(
            "this ringcc was built without the verbs backend: cargo build --release -p ringcc \
             --features verbs",
        )
    }

    pub fn check(_: &Options) -> Result<(), CliError> {
        Err(missing())
    }

    pub fn with_host(bind_ip: IpAddr, options: &Options) -> Result<Transports, CliError> {
        Ok(ringcc_host::transports(bind_ip, options.timeout))
    }

    pub fn alone() -> Result<Transports, CliError> {
        Err(missing())
    }
}
