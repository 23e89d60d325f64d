//! Which protocol a call runs under: the core's tuner
//! ([`ringcc_core::tune`]) with the latencies of this library's own
//! transports — the one place the choice is made.
//!
//! Every rank must choose alike, or the ring hangs (a sender writing
//! lines to a receiver that waits for a slice of another size): the
//! choice is a pure function of the call and the communicator's shape
//! (ranks, nodes, channels) and settings, and the settings
//! (`RINGCC_PROTO`, `RINGCC_ALGO` among them) are compared across ranks
//! when the communicator connects.

use ringcc_core::tune::{
    AlgoSet, Capabilities, GpuGen, Hardware, Latencies, PerAlgoProto, ProtoSet, Tuner,
};
use ringcc_core::{Call, Protocol};

use crate::error::{Error, Result};

// Measured on the development machine (2 cores, quiet), 8 B AllReduce,
// `ringcc perf allreduce --backend host --np N --proto <p> -b 8 -e 8
// -n 100000 -c 0`, 8 interleaved rounds: one rank (no hop) 0.33–0.45 µs;
// two ranks (two hops and the last credit) Simple median 1.35 µs
// (1.09–2.54), LL 1.5 µs (1.10–2.30). LL saves the separate `tail` line
// per hop (one cache-line transfer, ~50–90 ns of a 150–180 ns round
// trip) but its receiver polls and decodes more per step, so on this CPU
// it comes out no faster; at 512 B and 4 KiB it is clearly slower (4 KiB:
// LL 3.4–8.7 µs, Simple 1.5–4.0 µs: its 8-byte units are written and read
// one by one). An LL128 line is two cache lines (data, then the flag),
// so it saves nothing over Simple. With these figures the tuner keeps
// shared memory on Simple; LL and LL128 run when forced.

/// Per call, µs, `[Ring, Tree][LL, LL128, Simple]`: what a call costs
/// before its first hop (the job queue, starting the engine, the plan),
/// measured as a one-rank call. Tree is not run by the communicator.
const HOST_BASE_US: PerAlgoProto = [[0.4, 0.4, 0.4], [0.0, 0.0, 0.0]];
/// Per shared-memory hop, µs: a slice handed from one process to the
/// next (half of the two-rank figure less the base).
const HOST_SHM_US: PerAlgoProto = [[0.55, 0.5, 0.5], [0.0, 0.0, 0.0]];
/// Per TCP hop, µs (veth between network namespaces, `TCP_NODELAY`;
/// 8 B on two ranks takes 29–39 µs): the frame carries its own arrival,
/// so the protocols differ only in their slice sizes here.
const HOST_NET_US: PerAlgoProto = [[12.0, 12.0, 12.0], [0.0, 0.0, 0.0]];

/// The host transports' latencies, in the tuner's form.
pub const HOST_LATENCIES: Latencies = Latencies {
    base_us: HOST_BASE_US,
    nvlink_us: HOST_SHM_US,
    pci_us: HOST_SHM_US,
    net_us: HOST_NET_US,
};

/// Shared-memory bus bandwidth of a ring, GB/s (the 2-rank AllReduce
/// busbw at 1–16 MiB on the development machine: 9.6–14.3 GB/s).
const HOST_SHM_GBPS: f64 = 10.0;
/// TCP between hosts, GB/s (veth between namespaces: 2.1–2.4 GB/s
/// busbw at 1 MiB).
const HOST_NET_GBPS: f64 = 2.0;

/// The transports whose ends carry LL and LL128 calls: shared memory
/// (line slots) and TCP (framed, in the protocol's smaller slices). Verbs
/// and CUDA IPC ends take the connection's FIFO geometry once, at
/// connect, and count steps by it; a call whose protocol changes the
/// slice geometry would put their counters out of step with the engine's
/// (the receiver then sees a call header where none is expected).
pub const LINE_TRANSPORTS: [&str; 2] = ["shm", "tcp"];

/// The protocols a job may run: `protos`, or Simple alone when any rank
/// offers a transport outside [`LINE_TRANSPORTS`] (every rank sees the
/// same peers, so every rank decides alike). A list that keeps nothing is
/// a [`Error::BadConfig`] naming the transports.
pub fn job_protocols<'a>(
    offered: impl IntoIterator<Item = &'a str>,
    protos: ProtoSet,
) -> Result<ProtoSet> {
    let mut others: Vec<&str> = offered
        .into_iter()
        .filter(|t| !LINE_TRANSPORTS.contains(t))
        .collect();
    if others.is_empty() {
        return Ok(protos);
    }
    if protos.contains(Protocol::Simple) {
        return Ok(ProtoSet::only(Protocol::Simple));
    }
    others.sort_unstable();
    others.dedup();
    Err(Error::BadConfig(format!(
        "RINGCC_PROTO leaves only LL / LL128, which this job's transports cannot carry: \
         its ranks offer {} (shared memory and TCP carry every protocol; the others Simple)",
        others.join(", ")
    )))
}

/// The tuner of a communicator of `ranks` ranks over `nodes` nodes with
/// `channels` channels, allowed `algos` × `protos`. The communicator runs
/// rings only; LL and LL128 run on every transport (those without line
/// slots carry them framed, in the protocols' smaller slices). An
/// override that leaves nothing to run is a [`Error::BadConfig`].
pub fn host_tuner(
    ranks: u32,
    nodes: u32,
    channels: u8,
    algos: AlgoSet,
    protos: ProtoSet,
) -> Result<Tuner> {
    let hw = Hardware {
        gen: GpuGen::Hopper,
        nvlink: true,
        intra_gbps: HOST_SHM_GBPS,
        inter_gbps: HOST_NET_GBPS,
        channel_gbps: HOST_SHM_GBPS,
        max_channels: u32::from(channels.max(1)),
        net_overhead_us: 0.0,
        net_latency_us: 0.0,
        amd_cpu: false,
    };
    let mut t = Tuner::new(hw, ranks.max(1), nodes.max(1), Capabilities::RING)
        .with_latencies(HOST_LATENCIES);
    t.algos = algos;
    t.protos = protos;
    // Refuse at connect what could only fail at the first call.
    let probe = Call::all_reduce(1, ringcc_core::DataType::U8, ringcc_core::ReduceOp::Sum);
    choose_protocol(&t, &probe, ranks)?;
    Ok(t)
}

/// The protocol of `call` on a communicator of `ranks` ranks: the tuner's
/// choice for the call's larger buffer.
pub fn choose_protocol(tuner: &Tuner, call: &Call, ranks: u32) -> Result<Protocol> {
    let (i, o) = call.buffer_bytes(ranks);
    let bytes = u64::try_from(i.max(o)).unwrap_or(u64::MAX);
    tuner
        .choose(call.collective, bytes)
        .map(|c| c.chosen.protocol)
        .map_err(|e| {
            Error::BadConfig(format!(
                "no algorithm and protocol left to run (RINGCC_ALGO / RINGCC_PROTO): {e}"
            ))
        })
}

/// The last choice per collective: a training loop repeats its sizes, and
/// the model (six candidates, each a few dozen floating-point operations)
/// costs as much as a one-rank call. Exact: a hit is the same question.
#[derive(Clone, Copy, Debug, Default)]
pub struct ChoiceCache {
    /// Per collective code: the bytes asked about and the answer.
    last: [Option<(u64, Protocol)>; 5],
}

impl ChoiceCache {
    /// [`choose_protocol`], remembered per collective.
    pub fn choose(&mut self, tuner: &Tuner, call: &Call, ranks: u32) -> Result<Protocol> {
        let (i, o) = call.buffer_bytes(ranks);
        let bytes = u64::try_from(i.max(o)).unwrap_or(u64::MAX);
        let slot = self.last.get_mut(usize::from(call.collective.code()));
        if let Some(Some((b, p))) = slot.as_deref() {
            if *b == bytes {
                return Ok(*p);
            }
        }
        let p = choose_protocol(tuner, call, ranks)?;
        if let Some(s) = slot {
            *s = Some((bytes, p));
        }
        Ok(p)
    }
}

/// Parses `RINGCC_PROTO` (NCCL_PROTO's syntax: `LL`, `LL,LL128`,
/// `^LL128`, any case); empty means every protocol.
pub fn parse_protos(value: &str) -> std::result::Result<ProtoSet, String> {
    if value.trim().is_empty() {
        return Ok(ProtoSet::ALL);
    }
    ProtoSet::parse(value).map_err(|_| {
        format!("{value:?} is not a list of protocols (LL, LL128, Simple; ^ to exclude)")
    })
}

/// Parses `RINGCC_ALGO` (NCCL_ALGO's syntax: `Ring`, `^Tree`, any case);
/// empty means every algorithm.
pub fn parse_algos(value: &str) -> std::result::Result<AlgoSet, String> {
    if value.trim().is_empty() {
        return Ok(AlgoSet::ALL);
    }
    AlgoSet::parse(value)
        .map_err(|_| format!("{value:?} is not a list of algorithms (Ring, Tree; ^ to exclude)"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringcc_core::{Algorithm, DataType, ReduceOp};

    fn tuner(ranks: u32, nodes: u32, protos: ProtoSet) -> Tuner {
        host_tuner(ranks, nodes, 2, AlgoSet::ALL, protos).unwrap()
    }

    #[test]
    fn measured_latencies_keep_shared_memory_on_simple_and_overrides_win() {
        let t = tuner(4, 1, ProtoSet::ALL);
        let small = Call::all_reduce(2, DataType::F32, ReduceOp::Sum);
        let big = Call::all_reduce(1 << 20, DataType::F32, ReduceOp::Sum);
        assert_eq!(choose_protocol(&t, &small, 4).unwrap(), Protocol::Simple);
        assert_eq!(choose_protocol(&t, &big, 4).unwrap(), Protocol::Simple);
        for p in Protocol::ALL {
            let t = tuner(2, 1, ProtoSet::only(p));
            assert_eq!(choose_protocol(&t, &big, 2).unwrap(), p);
            assert_eq!(choose_protocol(&t, &small, 2).unwrap(), p);
        }
        let ll_or_ll128 = tuner(2, 1, parse_protos("^Simple").unwrap());
        assert_eq!(
            choose_protocol(&ll_or_ll128, &small, 2).unwrap(),
            Protocol::Ll128
        );
        // Were an LL hop cheaper (a machine where it measures so), small
        // calls would take LL: the choice follows the latencies given.
        let mut lat = HOST_LATENCIES;
        lat.nvlink_us[0][0] = 0.3;
        let fast_ll = tuner(2, 1, ProtoSet::ALL).with_latencies(lat);
        assert_eq!(choose_protocol(&fast_ll, &small, 2).unwrap(), Protocol::Ll);
        assert_eq!(
            choose_protocol(&fast_ll, &big, 2).unwrap(),
            Protocol::Simple
        );
    }

    #[test]
    fn the_choice_is_the_tuners_argmin() {
        for (ranks, nodes) in [(2, 1), (4, 1), (4, 2), (8, 2)] {
            let t = tuner(ranks, nodes, ProtoSet::ALL);
            for shift in 0..30 {
                let call = Call::all_reduce(1 << shift, DataType::U8, ReduceOp::Sum);
                let p = choose_protocol(&t, &call, ranks).unwrap();
                let e = |p| {
                    t.estimate(call.collective, 1 << shift, Algorithm::Ring, p)
                        .unwrap()
                        .time_us
                };
                for q in Protocol::ALL {
                    assert!(e(p) <= e(q), "{ranks}x{nodes} 2^{shift}: {p} vs {q}");
                }
            }
        }
    }

    #[test]
    fn the_cache_answers_as_the_tuner() {
        let t = tuner(4, 2, ProtoSet::ALL);
        let mut cache = ChoiceCache::default();
        for shift in [3, 20, 3, 10, 10, 30, 3] {
            for call in [
                Call::all_reduce(1 << shift, DataType::U8, ReduceOp::Sum),
                Call::all_gather(1 << shift, DataType::U8),
            ] {
                assert_eq!(
                    cache.choose(&t, &call, 4).unwrap(),
                    choose_protocol(&t, &call, 4).unwrap()
                );
            }
        }
    }

    #[test]
    fn verbs_or_cuda_ipc_in_the_job_keep_it_on_simple() {
        assert_eq!(
            job_protocols(["shm", "tcp"], ProtoSet::ALL).unwrap(),
            ProtoSet::ALL
        );
        assert_eq!(
            job_protocols(["shm", "verbs", "tcp"], ProtoSet::ALL).unwrap(),
            ProtoSet::only(Protocol::Simple)
        );
        let e = job_protocols(["cuda-ipc"], parse_protos("LL").unwrap()).unwrap_err();
        assert!(e.to_string().contains("cuda-ipc"), "{e}");
        // Simple alone stays Simple; a job with no hop (one rank) keeps all.
        assert_eq!(
            job_protocols(["verbs"], ProtoSet::only(Protocol::Simple)).unwrap(),
            ProtoSet::only(Protocol::Simple)
        );
        assert_eq!(job_protocols([], ProtoSet::ALL).unwrap(), ProtoSet::ALL);
    }

    #[test]
    fn lists_parse_as_nccl_and_nothing_left_is_an_error() {
        assert_eq!(
            parse_protos("ll128").unwrap(),
            ProtoSet::only(Protocol::Ll128)
        );
        assert_eq!(parse_protos(" ").unwrap(), ProtoSet::ALL);
        assert!(parse_protos("LL256").is_err());
        assert_eq!(parse_algos("ring").unwrap(), AlgoSet::only(Algorithm::Ring));
        assert!(parse_algos("Trie").is_err());
        // The communicator runs rings: Tree alone leaves nothing.
        let e = host_tuner(2, 1, 1, AlgoSet::only(Algorithm::Tree), ProtoSet::ALL).unwrap_err();
        assert!(matches!(e, Error::BadConfig(_)), "{e}");
    }
}
