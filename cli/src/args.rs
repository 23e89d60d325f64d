//! Command-line arguments: nccl-tests' flags for `perf`, and the topology
//! flags every subcommand shares.

use clap::{Args, Parser, Subcommand, ValueEnum};
use ringcc_core::{Collective, DataType, Rank, ReduceOp};

/// ringcc: NCCL-style ring collectives, on a simulated cluster or on real
/// GPUs and RDMA NICs.
#[derive(Parser, Debug)]
#[command(name = "ringcc", version, about, propagate_version = true)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Measure a collective like nccl-tests (on the simulator by default).
    Perf(PerfArgs),
    /// Print the schedule of a collective: rings, hops, steps, contents.
    Explain(ExplainArgs),
    /// Simulate one collective and write its timeline and wire capture.
    Trace(TraceArgs),
}

/// The collectives, as nccl-tests names its binaries.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum CollArg {
    /// all_reduce_perf
    #[value(alias = "all_reduce", alias = "all-reduce")]
    Allreduce,
    /// reduce_scatter_perf
    #[value(alias = "reduce_scatter", alias = "reduce-scatter")]
    Reducescatter,
    /// all_gather_perf
    #[value(alias = "all_gather", alias = "all-gather")]
    Allgather,
    /// broadcast_perf
    Broadcast,
    /// reduce_perf
    Reduce,
}

impl CollArg {
    /// The core's collective with `root`.
    pub fn collective(self, root: u32) -> Collective {
        match self {
            CollArg::Allreduce => Collective::AllReduce,
            CollArg::Reducescatter => Collective::ReduceScatter,
            CollArg::Allgather => Collective::AllGather,
            CollArg::Broadcast => Collective::Broadcast { root: Rank(root) },
            CollArg::Reduce => Collective::Reduce { root: Rank(root) },
        }
    }
}

/// Which backend runs the collective.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendArg {
    /// The deterministic cluster simulator (no hardware needed).
    Mock,
    /// RDMA verbs over RC queue pairs, one rank per process (mpirun, srun,
    /// torchrun); needs the `verbs` feature.
    Verbs,
    /// CUDA GPUs of this process; needs the `cuda` feature and a GPU.
    Cuda,
}

/// The cluster's shape and the library's tuning, shared by every
/// subcommand.
#[derive(Args, Debug, Clone)]
pub struct TopoArgs {
    /// Total ranks (GPUs), spread evenly over --nodes; with
    /// --gpus-per-node too, it must be nodes x gpus-per-node.
    #[arg(long)]
    pub ranks: Option<u32>,
    /// Nodes (hosts) of the simulated cluster.
    #[arg(long, default_value_t = 1)]
    pub nodes: u32,
    /// GPUs (ranks) per node [default: 8, or --ranks / --nodes].
    #[arg(long)]
    pub gpus_per_node: Option<u32>,
    /// RDMA NICs per node.
    #[arg(long, default_value_t = 8)]
    pub nics_per_node: u16,
    /// Channels (rings); each channel's cross-node hops use NIC
    /// `channel mod nics`. Default: one per NIC (at least 1).
    #[arg(long)]
    pub channels: Option<u32>,
    /// Let rings leave a node through another NIC than they entered.
    #[arg(long)]
    pub cross_nic: bool,
    /// Chunk size in bytes (K/M/G suffixes). Default: NCCL's 2M on the
    /// simulator and CUDA; on verbs, two slices of its FIFO geometry
    /// (`RINGCC_SLOT_BYTES`, `RINGCC_SLOTS_PER_SLICE`, `RINGCC_CHUNK_BYTES`).
    #[arg(long, value_parser = parse_size)]
    pub chunk_bytes: Option<u64>,
    /// NVLink bandwidth of the simulator, GB/s.
    #[arg(long, default_value_t = 300.0)]
    pub nvlink_gbps: f64,
    /// NIC port bandwidth of the simulator, Gb/s.
    #[arg(long, default_value_t = 400.0)]
    pub nic_gbits: f64,
}

/// NCCL's chunk size.
pub const DEFAULT_CHUNK_BYTES: u64 = 2 << 20;

/// GPUs per node without --gpus-per-node or --ranks: a DGX's.
pub const DEFAULT_GPUS_PER_NODE: u32 = 8;

impl TopoArgs {
    /// Chunk size: `--chunk-bytes`, or NCCL's 2 MiB.
    pub fn chunk_bytes(&self) -> u64 {
        self.chunk_bytes.unwrap_or(DEFAULT_CHUNK_BYTES)
    }

    /// Channels to use.
    pub fn channels(&self) -> u32 {
        self.channels
            .unwrap_or(u32::from(self.nics_per_node).clamp(1, 64))
    }
}

/// `ringcc perf`: nccl-tests' flags and meaning.
#[derive(Args, Debug)]
pub struct PerfArgs {
    /// The collective.
    pub collective: CollArg,
    /// Minimum size in bytes (K/M/G suffixes).
    #[arg(short = 'b', long = "minbytes", value_parser = parse_size, default_value = "32M")]
    pub minbytes: u64,
    /// Maximum size in bytes (K/M/G suffixes).
    #[arg(short = 'e', long = "maxbytes", value_parser = parse_size, default_value = "32M")]
    pub maxbytes: u64,
    /// Multiplication factor between sizes (disabled when not given: sizes
    /// then grow by --stepbytes).
    #[arg(short = 'f', long = "stepfactor")]
    pub stepfactor: Option<u64>,
    /// Fixed increment between sizes (K/M/G suffixes).
    #[arg(short = 'i', long = "stepbytes", value_parser = parse_size, default_value = "1M")]
    pub stepbytes: u64,
    /// Timed iterations per size.
    #[arg(short = 'n', long = "iters", default_value_t = 20)]
    pub iters: u32,
    /// Warm-up iterations per size (not timed).
    #[arg(
        short = 'w',
        long = "warmup_iters",
        alias = "warmup-iters",
        default_value_t = 5
    )]
    pub warmup: u32,
    /// Check the results of this many iterations (0: no check).
    #[arg(short = 'c', long = "check", default_value_t = 1)]
    pub check: u32,
    /// Reduction operation: sum, prod, min, max, avg.
    #[arg(short = 'o', long = "op", value_parser = parse_op, default_value = "sum")]
    pub op: ReduceOp,
    /// Element type: int8, uint8, int32, uint32, int64, uint64, half,
    /// bfloat16, float, double.
    #[arg(short = 'd', long = "datatype", value_parser = parse_dtype, default_value = "float")]
    pub dtype: DataType,
    /// Root rank of Broadcast and Reduce.
    #[arg(short = 'r', long = "root", default_value_t = 0)]
    pub root: u32,
    /// Also write the results as JSON to this file.
    #[arg(short = 'J', long = "json")]
    pub json: Option<std::path::PathBuf>,
    /// Which backend runs the collective.
    #[arg(long, value_enum, default_value_t = BackendArg::Mock)]
    pub backend: BackendArg,
    /// 1: register the buffers with the backend once per size, before the
    /// timed calls, as nccl-tests' `-R 1` does with `ncclCommRegister`
    /// (verbs only: it skips the per-call `ibv_reg_mr`). 0: every call
    /// registers its own.
    #[arg(
        short = 'R',
        long = "local_register",
        default_value_t = 0,
        value_parser = clap::value_parser!(u8).range(0..=1)
    )]
    pub local_register: u8,
    /// The cluster's shape.
    #[command(flatten)]
    pub topo: TopoArgs,
    /// Test only: corrupt this many elements of rank 0's output before
    /// checking, to prove the check can fail.
    #[arg(long, hide = true, default_value_t = 0)]
    pub inject_corruption: u64,
}

/// `ringcc explain`.
#[derive(Args, Debug)]
pub struct ExplainArgs {
    /// The collective.
    pub collective: CollArg,
    /// Root rank of Broadcast and Reduce.
    #[arg(short = 'r', long = "root", default_value_t = 0)]
    pub root: u32,
    /// Elements per rank (per block for ReduceScatter / AllGather); by
    /// default one element per chunk, so the picture stays small.
    #[arg(long)]
    pub count: Option<u64>,
    /// Element type (for sizes).
    #[arg(short = 'd', long = "datatype", value_parser = parse_dtype, default_value = "float")]
    pub dtype: DataType,
    /// Show the symbolic contents (a0+b0+…) after every step.
    #[arg(long)]
    pub values: bool,
    /// Which channel's schedule to print.
    #[arg(long, default_value_t = 0)]
    pub channel: u8,
    /// The cluster's shape.
    #[command(flatten)]
    pub topo: TopoArgs,
}

/// `ringcc trace`.
#[derive(Args, Debug)]
pub struct TraceArgs {
    /// The collective.
    pub collective: CollArg,
    /// Size in bytes (K/M/G suffixes).
    #[arg(short = 'b', long = "bytes", value_parser = parse_size, default_value = "1M")]
    pub bytes: u64,
    /// Reduction operation.
    #[arg(short = 'o', long = "op", value_parser = parse_op, default_value = "sum")]
    pub op: ReduceOp,
    /// Element type.
    #[arg(short = 'd', long = "datatype", value_parser = parse_dtype, default_value = "float")]
    pub dtype: DataType,
    /// Root rank of Broadcast and Reduce.
    #[arg(short = 'r', long = "root", default_value_t = 0)]
    pub root: u32,
    /// Write a Chrome / Perfetto trace (JSON) here.
    #[arg(long)]
    pub chrome: Option<std::path::PathBuf>,
    /// Write a pcap of the simulated RoCEv2 traffic here.
    #[arg(long)]
    pub pcap: Option<std::path::PathBuf>,
    /// Packet loss probability on NIC links (0..0.5), seeded.
    #[arg(long, default_value_t = 0.0)]
    pub loss: f64,
    /// Fault and interleaving seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// The cluster's shape.
    #[command(flatten)]
    pub topo: TopoArgs,
}

/// Parses `1024`, `4K`, `32M`, `1G` (powers of 1024; `KB`/`KiB` too).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let upper = t.to_ascii_uppercase();
    let (digits, shift) = match upper.trim_end_matches("IB").trim_end_matches('B') {
        d if d.ends_with('K') => (&t[..d.len() - 1], 10),
        d if d.ends_with('M') => (&t[..d.len() - 1], 20),
        d if d.ends_with('G') => (&t[..d.len() - 1], 30),
        d if d.ends_with('T') => (&t[..d.len() - 1], 40),
        d => (&t[..d.len()], 0),
    };
    let v: u64 = digits
        .trim()
        .parse()
        .map_err(|_| format!("'{s}' is not a size (examples: 8, 64K, 32M, 1G)"))?;
    v.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("size '{s}' is too large"))
}

/// Parses nccl-tests' operation names.
pub fn parse_op(s: &str) -> Result<ReduceOp, String> {
    ReduceOp::from_name(s)
        .ok_or_else(|| format!("unknown operation '{s}' (sum, prod, min, max, avg)"))
}

/// Parses nccl-tests' type names and common aliases.
pub fn parse_dtype(s: &str) -> Result<DataType, String> {
    DataType::from_name(s).ok_or_else(|| {
        format!("unknown data type '{s}' (int8, uint8, int32, uint32, int64, uint64, half, bfloat16, float, double)")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("8"), Ok(8));
        assert_eq!(parse_size("64K"), Ok(64 << 10));
        assert_eq!(parse_size("32M"), Ok(32 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("2MB"), Ok(2 << 20));
        assert_eq!(parse_size("2MiB"), Ok(2 << 20));
        assert_eq!(parse_size("4k"), Ok(4 << 10));
        assert!(parse_size("").is_err());
        assert!(parse_size("M").is_err());
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("-1").is_err());
        assert!(parse_size("99999999999T").is_err());
    }

    #[test]
    fn cli_parses() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
        let cli = Cli::try_parse_from([
            "ringcc",
            "perf",
            "allreduce",
            "-b",
            "8",
            "-e",
            "128M",
            "-f",
            "2",
            "-d",
            "bfloat16",
        ])
        .unwrap();
        let Command::Perf(p) = cli.command else {
            panic!()
        };
        assert_eq!(
            (p.minbytes, p.maxbytes, p.stepfactor, p.dtype),
            (8, 128 << 20, Some(2), DataType::Bf16)
        );
        // No --chunk-bytes: NCCL's chunk, and "not given" for the verbs
        // backend, whose chunk then follows its FIFO geometry.
        assert_eq!(p.topo.chunk_bytes, None);
        assert_eq!(p.topo.chunk_bytes(), 2 << 20);
    }

    #[test]
    fn chunk_bytes_given() {
        let cli =
            Cli::try_parse_from(["ringcc", "perf", "allreduce", "--chunk-bytes", "512K"]).unwrap();
        let Command::Perf(p) = cli.command else {
            panic!()
        };
        assert_eq!(p.topo.chunk_bytes, Some(512 << 10));
        assert_eq!(p.topo.chunk_bytes(), 512 << 10);
    }
}
