//! Turning the topology flags into a checked cluster shape.

use ringcc_core::topology::Topology;

use crate::args::TopoArgs;
use crate::error::CliError;

/// The largest cluster the command builds.
pub const MAX_RANKS: usize = 4096;

/// A checked shape: the topology flags with every count resolved.
pub type Shape = TopoArgs;

/// The flags' shape, with `--ranks` (if given) spread over `--nodes`.
pub fn shape_for_ranks(t: &TopoArgs, ranks: Option<u32>) -> Result<Shape, CliError> {
    let mut s = t.clone();
    if let Some(n) = ranks {
        if n == 0 {
            return Err(CliError::usage("--ranks must be at least 1"));
        }
        if t.nodes == 0 || n % t.nodes != 0 {
            return Err(CliError::usage(format!(
                "--ranks {n} does not divide evenly over --nodes {}",
                t.nodes
            )));
        }
        s.gpus_per_node = n / t.nodes;
    }
    check(&s)?;
    Ok(s)
}

/// Checks a shape for what the flags alone can get wrong.
pub fn check(s: &Shape) -> Result<(), CliError> {
    if s.nodes == 0 || s.gpus_per_node == 0 {
        return Err(CliError::usage(
            "--nodes and --gpus-per-node must be at least 1",
        ));
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
