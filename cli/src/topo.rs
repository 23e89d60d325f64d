//! Turning the topology flags into a checked cluster shape: the one path
//! every subcommand (and every `perf` backend) takes from [`TopoArgs`] to
//! the counts it uses.

use ringcc_core::topology::Topology;

use crate::args::{TopoArgs, DEFAULT_GPUS_PER_NODE};
use crate::error::CliError;

/// The largest cluster the command builds: the core's capacity.
pub use ringcc_core::MAX_RANKS;

/// A checked shape: the topology flags with every count resolved
/// (`--ranks` spread over the nodes, the defaults filled in).
#[derive(Debug, Clone, PartialEq)]
pub struct Shape {
    /// Nodes (hosts).
    pub nodes: u32,
    /// GPUs (ranks) per node.
    pub gpus_per_node: u32,
    /// RDMA NICs per node.
    pub nics_per_node: u16,
    /// Rings may leave a node through another NIC than they entered.
    pub cross_nic: bool,
    /// NVLink bandwidth of the simulator, GB/s.
    pub nvlink_gbps: f64,
    /// NIC port bandwidth of the simulator, Gb/s.
    pub nic_gbits: f64,
    channels: u32,
    chunk_bytes: u64,
}

impl Shape {
    /// Total ranks.
    pub fn ranks(&self) -> u64 {
        u64::from(self.nodes) * u64::from(self.gpus_per_node)
    }

    /// Channels (rings), 1..=64.
    pub fn channels(&self) -> u32 {
        self.channels
    }

    /// Chunk size in bytes, at least 1.
    pub fn chunk_bytes(&self) -> u64 {
        self.chunk_bytes
    }
}

/// GPUs per node from `--ranks`, `--nodes` and `--gpus-per-node`: the
/// ranks spread over the nodes, and refused where the flags disagree.
fn gpus_per_node(t: &TopoArgs) -> Result<u32, CliError> {
    let Some(n) = t.ranks else {
        return Ok(t.gpus_per_node.unwrap_or(DEFAULT_GPUS_PER_NODE));
    };
    if n == 0 {
        return Err(CliError::usage("--ranks must be at least 1"));
    }
    match t.gpus_per_node {
        Some(g) if u64::from(t.nodes) * u64::from(g) != u64::from(n) => {
            Err(CliError::usage(format!(
                "--ranks {n} disagrees with --nodes {} x --gpus-per-node {g} = {} ranks: \
                 give --ranks or --gpus-per-node, or values that agree",
                t.nodes,
                u64::from(t.nodes) * u64::from(g)
            )))
        }
        Some(g) => Ok(g),
        None if n % t.nodes != 0 => Err(CliError::usage(format!(
            "--ranks {n} does not divide evenly over --nodes {}",
            t.nodes
        ))),
        None => Ok(n / t.nodes),
    }
}

/// The `--preset`, checked.
pub fn preset(t: &TopoArgs) -> Result<Option<ringcc_mock::Preset>, CliError> {
    match &t.preset {
        None => Ok(None),
        Some(name) => ringcc_mock::Preset::parse(name).map(Some).ok_or_else(|| {
            let names: Vec<&str> = ringcc_mock::Preset::ALL.iter().map(|p| p.name()).collect();
            CliError::usage(format!("--preset {name}: not one of {}", names.join(", ")))
        }),
    }
}

/// Checks the topology flags and resolves them into a shape.
pub fn resolve(t: &TopoArgs) -> Result<Shape, CliError> {
    if t.nodes == 0 {
        return Err(CliError::usage("--nodes must be at least 1"));
    }
    let preset = preset(t)?.map(|p| p.config(t.nodes));
    let s = Shape {
        nodes: t.nodes,
        gpus_per_node: gpus_per_node(t)?,
        nics_per_node: t.nics_per_node.unwrap_or(
            preset
                .as_ref()
                .map_or(crate::args::DEFAULT_NICS_PER_NODE, |c| c.nics_per_node),
        ),
        cross_nic: t.cross_nic,
        nvlink_gbps: t
            .nvlink_gbps
            .unwrap_or(preset.as_ref().map_or(300.0, |c| c.nvlink.bandwidth / 1e9)),
        nic_gbits: t.nic_gbits.unwrap_or(
            preset
                .as_ref()
                .map_or(400.0, |c| c.nic.bandwidth * 8.0 / 1e9),
        ),
        channels: match (t.channels, &preset) {
            (None, Some(c)) => c.channels,
            _ => t.channels(),
        },
        chunk_bytes: t.chunk_bytes(),
    };
    check(&s)?;
    Ok(s)
}

/// Checks a shape for what the flags alone can get wrong.
fn check(s: &Shape) -> Result<(), CliError> {
    if s.gpus_per_node == 0 {
        return Err(CliError::usage("--gpus-per-node must be at least 1"));
    }
    if s.ranks() > MAX_RANKS as u64 {
        return Err(CliError::usage(format!(
            "{} ranks: at most {MAX_RANKS} are supported",
            s.ranks()
        )));
    }
    if s.nodes > 1 && s.nics_per_node == 0 {
        return Err(CliError::usage(
            "more than one node needs --nics-per-node of at least 1",
        ));
    }
    let c = s.channels();
    if c == 0 || c > 64 {
        return Err(CliError::usage(format!("--channels {c}: must be 1..=64")));
    }
    if s.chunk_bytes() == 0 {
        return Err(CliError::usage("--chunk-bytes must be at least 1"));
    }
    if !(s.nvlink_gbps.is_finite()
        && s.nvlink_gbps > 0.0
        && s.nic_gbits.is_finite()
        && s.nic_gbits > 0.0)
    {
        return Err(CliError::usage("link bandwidths must be positive"));
    }
    Ok(())
}

/// The core topology of a shape.
pub fn build(s: &Shape) -> Result<Topology<MAX_RANKS>, CliError> {
    Ok(
        Topology::<MAX_RANKS>::uniform(s.nodes, s.gpus_per_node, s.nics_per_node)
            .map_err(CliError::core)?
            .with_cross_nic(s.cross_nic),
    )
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::args::{Cli, Command};

    /// The shape of `ringcc explain allreduce <flags>`.
    fn shape(flags: &[&str]) -> Result<Shape, CliError> {
        let args = ["ringcc", "explain", "allreduce"].iter().chain(flags);
        let cli = Cli::try_parse_from(args).map_err(|e| CliError::internal(e.to_string()))?;
        let Command::Explain(a) = cli.command else {
            return Err(CliError::internal("not explain"));
        };
        resolve(&a.topo)
    }

    fn nodes_gpus(flags: &[&str]) -> (u32, u32) {
        let s = shape(flags).unwrap_or_else(|e| panic!("{flags:?}: {e}"));
        (s.nodes, s.gpus_per_node)
    }

    fn refused(flags: &[&str]) -> String {
        match shape(flags) {
            Err(e @ CliError::Usage(_)) => e.to_string(),
            other => panic!("{flags:?}: {other:?}"),
        }
    }

    #[test]
    fn ranks_spread_over_the_nodes() {
        assert_eq!(nodes_gpus(&[]), (1, 8));
        assert_eq!(nodes_gpus(&["--ranks", "4"]), (1, 4));
        assert_eq!(nodes_gpus(&["--ranks", "16", "--nodes", "4"]), (4, 4));
        assert_eq!(nodes_gpus(&["--gpus-per-node", "3"]), (1, 3));
        assert_eq!(
            nodes_gpus(&["--nodes", "2", "--gpus-per-node", "3"]),
            (2, 3)
        );
        // Explicit and agreeing: accepted.
        assert_eq!(
            nodes_gpus(&["--ranks", "4", "--gpus-per-node", "4"]),
            (1, 4)
        );
        assert_eq!(
            nodes_gpus(&["--ranks", "12", "--nodes", "3", "--gpus-per-node", "4"]),
            (3, 4)
        );
        // An explicit 8 is still explicit: it must agree with --ranks.
        let e = refused(&["--ranks", "4", "--gpus-per-node", "8"]);
        assert!(e.contains("--ranks 4 disagrees"), "{e}");
    }

    #[test]
    fn disagreeing_flags_are_refused() {
        let e = refused(&["--ranks", "4", "--gpus-per-node", "3"]);
        assert!(
            e.contains("--ranks 4") && e.contains("--gpus-per-node 3"),
            "{e}"
        );
        // Without --nodes, --ranks is over one node.
        refused(&["--ranks", "16", "--gpus-per-node", "8"]);
        let e = refused(&["--ranks", "6", "--nodes", "4"]);
        assert!(e.contains("does not divide evenly"), "{e}");
        refused(&["--ranks", "0"]);
        refused(&["--nodes", "0"]);
        refused(&["--gpus-per-node", "0"]);
        refused(&["--ranks", "8192"]);
    }
}
