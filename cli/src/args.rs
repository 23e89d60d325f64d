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
    /// The host backend with RDMA verbs on every hop (RC queue pairs;
    /// ranks of one node through the NIC's loopback); needs the `verbs`
    /// feature and an RDMA device.
    Verbs,
    /// CUDA GPUs of this process; needs the `cuda` feature and a GPU.
    Cuda,
    /// Host memory, one rank per process: shared memory inside a node,
    /// RDMA verbs (with the `verbs` feature, where a device is present) or
    /// TCP between nodes; ranks from --np N or a launcher (mpirun, srun,
    /// torchrun, RINGCC_RANK).
    Host,
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
    /// RDMA NICs per node [default: the preset's, else 8].
    #[arg(long)]
    pub nics_per_node: Option<u16>,
    /// Channels (rings); each channel's cross-node hops use NIC
    /// `channel mod nics`. Default: one per NIC (at least 1).
    #[arg(long)]
    pub channels: Option<u32>,
    /// Let rings leave a node through another NIC than they entered.
    #[arg(long)]
    pub cross_nic: bool,
    /// Chunk size in bytes (K/M/G suffixes). Default: NCCL's 2M on the
    /// simulator and CUDA; on host and verbs, `RINGCC_CHUNK_BYTES`, else
    /// the communicator's (verbs': two slices of its FIFO).
    #[arg(long, value_parser = parse_size)]
    pub chunk_bytes: Option<u64>,
    /// NVLink bandwidth of the simulator, GB/s [default: the preset's,
    /// else 300].
    #[arg(long)]
    pub nvlink_gbps: Option<f64>,
    /// NIC port bandwidth of the simulator, Gb/s [default: the preset's,
    /// else 400].
    #[arg(long)]
    pub nic_gbits: Option<f64>,
    /// A common node's figures: dgx-h100, dgx-a100, p5-efa, p4d-efa
    /// (explicit flags override them).
    #[arg(long)]
    pub preset: Option<String>,
    /// Algorithms the tuner may pick (NCCL_ALGO syntax: `ring`,
    /// `ring,tree`, `^tree`); default `RINGCC_ALGO`, else all.
    #[arg(long)]
    pub algo: Option<String>,
    /// Protocols the tuner may pick (NCCL_PROTO syntax: `LL,LL128`,
    /// `^LL`, `simple`); default `RINGCC_PROTO`, else all.
    #[arg(long)]
    pub proto: Option<String>,
    /// Simulator: NVLink hop latency under Simple, µs [default: 1].
    #[arg(long)]
    pub nvlink_us: Option<f64>,
    /// Simulator: NIC hop latency under Simple, µs [default: 5; p5-efa
    /// 32.2, p4d-efa 80].
    #[arg(long)]
    pub nic_us: Option<f64>,
    /// Simulator: NVLink hop latency under LL, µs [default: 0.6; presets 0.3].
    #[arg(long)]
    pub ll_nvlink_us: Option<f64>,
    /// Simulator: NIC hop latency under LL, µs [default: 2.7; dgx-h100 and
    /// dgx-a100 4, p5-efa 29.2 (calibrated), p4d-efa 79].
    #[arg(long)]
    pub ll_nic_us: Option<f64>,
    /// Simulator: NVLink hop latency under LL128, µs [default: 1.9; presets 1].
    #[arg(long)]
    pub ll128_nvlink_us: Option<f64>,
    /// Simulator: NIC hop latency under LL128, µs, before the proxy's
    /// sweep [default: 4 (NCCL's); p5-efa 29.2, p4d-efa 79].
    #[arg(long)]
    pub ll128_nic_us: Option<f64>,
    /// Simulator: share of NVLink line rate a ring reaches [default: 1;
    /// presets 0.82].
    #[arg(long)]
    pub nvlink_eff: Option<f64>,
    /// Simulator: share of NIC line rate data reaches [default: 1; presets 0.96].
    #[arg(long)]
    pub nic_eff: Option<f64>,
    /// Simulator: what one channel moves at most, GB/s [no limit;
    /// presets 24 H100, 20 A100].
    #[arg(long)]
    pub channel_gbps: Option<f64>,
    /// Simulator: what one channel moves at most under LL128, GB/s of
    /// data [default: --channel-gbps; presets NCCL's
    /// perChMaxRingLL128Bws: 36.7 H100, 20 A100].
    #[arg(long)]
    pub ll128_channel_gbps: Option<f64>,
    /// Simulator: a NIC port's fixed time per message, µs [default: 0;
    /// EFA presets 1].
    #[arg(long)]
    pub nic_overhead_us: Option<f64>,
    /// Simulator: what one kernel launch costs its thread, µs; a rank's
    /// call starts this long after it is issued [default: 0; presets 4].
    #[arg(long)]
    pub launch_us: Option<f64>,
    /// Simulator: GPUs one thread launches one after the other
    /// (nccl-tests' `-g`): local rank l starts after (l mod N) + 1
    /// launches [default: 1].
    #[arg(long)]
    pub launches_per_thread: Option<u32>,
    /// Simulator: the network proxy's time per channel's operation, µs: a
    /// message between nodes waits one sweep (this × the call's
    /// channels) on top of the NIC hop latency [default: 0; presets 0.8].
    #[arg(long)]
    pub proxy_us: Option<f64>,
    /// Simulator: the network latency the network plugin reports to NCCL,
    /// µs; the tuner adds it to every network hop (twice under Simple),
    /// as NCCL's model does; simulated hops are unchanged [default: 0;
    /// EFA presets 75].
    #[arg(long)]
    pub net_latency_us: Option<f64>,
}

/// NCCL's chunk size.
pub const DEFAULT_CHUNK_BYTES: u64 = 2 << 20;

/// NICs per node without --nics-per-node or a preset: a DGX's.
pub const DEFAULT_NICS_PER_NODE: u16 = 8;

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
            .unwrap_or(u32::from(self.nics_per_node.unwrap_or(DEFAULT_NICS_PER_NODE)).clamp(1, 64))
    }
}

/// `ringcc perf`: nccl-tests' flags and meaning. A flag that has no
/// meaning on the chosen backend is accepted and said once in the
/// header ([`NcclFlag`]).
#[derive(Args, Debug)]
pub struct PerfArgs {
    /// The collective.
    pub collective: CollArg,
    /// Minimum size in bytes (K/M/G/T suffixes; at most 1T).
    #[arg(short = 'b', long = "minbytes", value_parser = parse_perf_size, default_value = "32M")]
    pub minbytes: u64,
    /// Maximum size in bytes (K/M/G/T suffixes; at most 1T).
    #[arg(short = 'e', long = "maxbytes", value_parser = parse_perf_size, default_value = "32M")]
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
    /// Calls aggregated into each timed iteration (nccl-tests launches
    /// them in one group); the time is per call.
    #[arg(
        short = 'm',
        long = "agg_iters",
        alias = "agg-iters",
        default_value_t = 1
    )]
    pub agg_iters: u32,
    /// Check the results of this many iterations (0: no check).
    #[arg(short = 'c', long = "check", default_value_t = 1)]
    pub check: u32,
    /// Reduction operation: sum, prod, min, max, avg, or all.
    #[arg(short = 'o', long = "op", value_parser = parse_ops, default_value = "sum")]
    pub ops: OpList,
    /// Element type: int8, uint8, int32, uint32, int64, uint64, half,
    /// bfloat16, float, double, or all.
    #[arg(short = 'd', long = "datatype", value_parser = parse_dtypes, default_value = "float")]
    pub dtypes: TypeList,
    /// Root rank of Broadcast and Reduce.
    #[arg(short = 'r', long = "root", default_value_t = 0)]
    pub root: u32,
    /// Run the whole sweep this many times, printing each (0: until
    /// interrupted).
    #[arg(
        short = 'N',
        long = "run_cycles",
        alias = "run-cycles",
        default_value_t = 1
    )]
    pub run_cycles: u32,
    /// Give up when the run takes longer than this many seconds of wall
    /// time (0: no limit), checked between calls.
    #[arg(short = 'T', long = "timeout", default_value_t = 0)]
    pub timeout: u64,
    /// nccl-tests: threads per process (each drives `-g` GPUs).
    #[arg(short = 't', long = "nthreads")]
    pub nthreads: Option<u32>,
    /// nccl-tests: GPUs per thread.
    #[arg(short = 'g', long = "ngpus")]
    pub ngpus: Option<u32>,
    /// nccl-tests: 1 waits for each call to complete before the next.
    #[arg(short = 'z', long = "blocking", value_parser = clap::value_parser!(u8).range(0..=1))]
    pub blocking: Option<u8>,
    /// nccl-tests: which rank's time is reported (0 rank 0, 1 average,
    /// 2 minimum, 3 maximum).
    #[arg(short = 'a', long = "average", value_parser = clap::value_parser!(u8).range(0..=3))]
    pub average: Option<u8>,
    /// nccl-tests: capture the iterations in a CUDA graph, launched this
    /// many times.
    #[arg(short = 'G', long = "cudagraph")]
    pub cudagraph: Option<u32>,
    /// nccl-tests: 1 reports CPU time instead of wall time.
    #[arg(short = 'C', long = "report_cputime", value_parser = clap::value_parser!(u8).range(0..=1))]
    pub report_cputime: Option<u8>,
    /// nccl-tests: 1 initializes the communicators in parallel threads.
    #[arg(short = 'p', long = "parallel_init", value_parser = clap::value_parser!(u8).range(0..=1))]
    pub parallel_init: Option<u8>,
    /// Also write the results as JSON to this file.
    #[arg(short = 'J', long = "json")]
    pub json: Option<std::path::PathBuf>,
    /// Which backend runs the collective.
    #[arg(long, value_enum, default_value_t = BackendArg::Mock)]
    pub backend: BackendArg,
    /// --backend host or verbs without a launcher: start this many ranks on
    /// this machine (processes of this command); rank 0 prints the table.
    #[arg(long)]
    pub np: Option<u32>,
    /// nccl-tests' `-R 1` (register the buffers once per size with
    /// `ncclCommRegister`), accepted for its command lines: no backend
    /// here registers a caller's buffer (verbs copies slices through
    /// registered staging), and the table's header says so.
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

/// nccl-tests' flags whose meaning depends on the backend: each backend
/// says which it cannot honour and why ([`crate::perf::PerfBackend::lacks`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NcclFlag {
    /// `-g`: GPUs per thread.
    Ngpus,
    /// `-t`: threads per process.
    Nthreads,
    /// `-z`: blocking calls.
    Blocking,
    /// `-a`: which rank's time.
    Average,
    /// `-G`: CUDA graphs.
    CudaGraph,
    /// `-C`: CPU time.
    CpuTime,
    /// `-p`: parallel init.
    ParallelInit,
    /// `-R 1`: buffer registration.
    LocalRegister,
    /// `-m`: grouped launch of the aggregated calls.
    AggIters,
    /// `-c N` with N > 1: several checked iterations.
    CheckIters,
}

impl PerfArgs {
    /// The backend-dependent flags given on the command line, each with
    /// the text it was given as (for the header).
    pub fn given(&self) -> Vec<(NcclFlag, String)> {
        let mut v = Vec::new();
        let mut add = |f, given: Option<String>| {
            if let Some(g) = given {
                v.push((f, g));
            }
        };
        add(NcclFlag::Ngpus, self.ngpus.map(|g| format!("-g {g}")));
        add(NcclFlag::Nthreads, self.nthreads.map(|t| format!("-t {t}")));
        add(NcclFlag::Blocking, self.blocking.map(|z| format!("-z {z}")));
        add(NcclFlag::Average, self.average.map(|a| format!("-a {a}")));
        add(
            NcclFlag::CudaGraph,
            self.cudagraph.map(|g| format!("-G {g}")),
        );
        add(
            NcclFlag::CpuTime,
            self.report_cputime.map(|c| format!("-C {c}")),
        );
        add(
            NcclFlag::ParallelInit,
            self.parallel_init.map(|p| format!("-p {p}")),
        );
        add(
            NcclFlag::LocalRegister,
            (self.local_register != 0).then(|| format!("-R {}", self.local_register)),
        );
        add(
            NcclFlag::AggIters,
            (self.agg_iters > 1).then(|| format!("-m {}", self.agg_iters)),
        );
        add(
            NcclFlag::CheckIters,
            (self.check > 1).then(|| format!("-c {}", self.check)),
        );
        v
    }
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
    /// Size in bytes (K/M/G/T suffixes; at most 1T).
    #[arg(short = 'b', long = "bytes", value_parser = parse_perf_size, default_value = "1M")]
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
    /// Seed of the run: the injected faults, initial PSNs, memory keys.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// The cluster's shape.
    #[command(flatten)]
    pub topo: TopoArgs,
}

/// The largest buffer `perf` accepts: 1 TiB (no GPU has more memory;
/// larger sizes would only make the simulator run for days).
pub const MAX_BYTES: u64 = 1 << 40;

/// Parses a `perf` size: [`parse_size`], at most [`MAX_BYTES`].
pub fn parse_perf_size(s: &str) -> Result<u64, String> {
    let v = parse_size(s)?;
    if v > MAX_BYTES {
        return Err(format!(
            "size '{s}' is larger than the 1T (1099511627776 bytes) ringcc accepts"
        ));
    }
    Ok(v)
}

/// `-d`: the element types to run, in nccl-tests' order for `all`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TypeList(pub Vec<DataType>);

/// `-o`: the operations to run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpList(pub Vec<ReduceOp>);

/// Parses `-d`: one type or `all`.
pub fn parse_dtypes(s: &str) -> Result<TypeList, String> {
    if s.eq_ignore_ascii_case("all") {
        return Ok(TypeList(DataType::ALL.to_vec()));
    }
    parse_dtype(s).map(|d| TypeList(vec![d]))
}

/// Parses `-o`: one operation or `all`.
pub fn parse_ops(s: &str) -> Result<OpList, String> {
    if s.eq_ignore_ascii_case("all") {
        return Ok(OpList(ReduceOp::ALL.to_vec()));
    }
    parse_op(s).map(|o| OpList(vec![o]))
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
            (p.minbytes, p.maxbytes, p.stepfactor, p.dtypes),
            (8, 128 << 20, Some(2), TypeList(vec![DataType::Bf16]))
        );
        // No --chunk-bytes: NCCL's chunk, and "not given" for the host
        // and verbs backends, whose chunk is then the communicator's.
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
