//! The alpha-beta cost model used by the simulator and `explain`.
//!
//! A hop of `b` bytes over a link costs `latency + b / bandwidth`. A ring
//! collective of `S` bytes on `n` ranks, pipelined, costs
//! `steps · latency + volume / bandwidth` where every rank moves
//! `volume` bytes: AllReduce `2 S (n−1)/n` over `2(n−1)` steps,
//! ReduceScatter and AllGather `S (n−1)/n` over `n−1` steps (S the total
//! buffer), Broadcast and Reduce `S` over `n−1` steps. nccl-tests'
//! `algbw = S / t` and `busbw = algbw · factor` with the factors of
//! [`Collective::bus_factor`].

use crate::plan::Collective;

/// A link's latency (seconds) and bandwidth (bytes per second).
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Link {
    /// Seconds from the first byte leaving to the first byte arriving.
    pub latency: f64,
    /// Bytes per second.
    pub bandwidth: f64,
}

impl Link {
    /// NVLink as in the seeds: 300 GB/s, 1 µs.
    pub const NVLINK: Link = Link {
        latency: 1e-6,
        bandwidth: 300e9,
    };
    /// A 400 Gb/s NIC port (50 GB/s), 5 µs.
    pub const NIC_400G: Link = Link {
        latency: 5e-6,
        bandwidth: 50e9,
    };

    /// Time for one hop of `bytes`.
    pub fn hop_time(&self, bytes: f64) -> f64 {
        self.latency + bytes / self.bandwidth
    }
}

/// Bytes each rank sends in a ring collective of `bytes` (nccl-tests'
/// size) on `ranks` ranks.
pub fn bytes_per_rank(collective: Collective, bytes: f64, ranks: u32) -> f64 {
    let n = f64::from(ranks.max(1));
    match collective {
        Collective::Broadcast { .. } | Collective::Reduce { .. } => {
            if ranks <= 1 {
                0.0
            } else {
                bytes
            }
        }
        // busbw's factor is exactly the share of S each rank moves.
        _ => bytes * collective.bus_factor(ranks) * if n > 1.0 { 1.0 } else { 0.0 },
    }
}

/// Latency-bound steps of a ring collective on `ranks` ranks.
pub fn ring_steps(collective: Collective, ranks: u32) -> u32 {
    let m = ranks.saturating_sub(1);
    match collective {
        Collective::AllReduce => m.saturating_mul(2),
        _ => m,
    }
}

/// Alpha-beta time of a pipelined ring collective of `bytes` on `ranks`
/// ranks whose slowest link is `link`.
pub fn ring_time(collective: Collective, bytes: f64, ranks: u32, link: Link) -> f64 {
    f64::from(ring_steps(collective, ranks)) * link.latency
        + bytes_per_rank(collective, bytes, ranks) / link.bandwidth
}

/// nccl-tests' algorithm bandwidth, bytes per second.
pub fn algbw(bytes: f64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        bytes / seconds
    } else {
        0.0
    }
}

/// nccl-tests' bus bandwidth, bytes per second.
pub fn busbw(collective: Collective, bytes: f64, seconds: f64, ranks: u32) -> f64 {
    algbw(bytes, seconds) * collective.bus_factor(ranks)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1e-12)
    }

    #[test]
    fn seed_hops() {
        // 256 MB over NVLink and over a 400G NIC (the seed's numbers, with
        // its slips corrected: 0.85 ms, not µs; ~6x, not 6000x).
        let nv = Link {
            latency: 0.0,
            bandwidth: 300e9,
        }
        .hop_time(256e6);
        let ib = Link {
            latency: 0.0,
            bandwidth: 50e9,
        }
        .hop_time(256e6);
        assert!((nv - 0.853e-3).abs() < 1e-5, "{nv}");
        assert!((ib - 5.12e-3).abs() < 1e-5, "{ib}");
        assert!(close(ib / nv, 6.0));
    }

    #[test]
    fn allreduce_volume_and_busbw() {
        let s = 1e9;
        let n = 8;
        let v = bytes_per_rank(Collective::AllReduce, s, n);
        assert!(close(v, 2.0 * s * 7.0 / 8.0));
        let link = Link {
            latency: 0.0,
            bandwidth: 50e9,
        };
        let t = ring_time(Collective::AllReduce, s, n, link);
        // With no latency, busbw equals the link bandwidth exactly.
        assert!(close(busbw(Collective::AllReduce, s, t, n), 50e9));
        assert!(close(
            bytes_per_rank(Collective::AllGather, s, n),
            s * 7.0 / 8.0
        ));
        assert!(close(
            bytes_per_rank(
                Collective::Broadcast {
                    root: crate::Rank(0)
                },
                s,
                n
            ),
            s
        ));
        assert_eq!(bytes_per_rank(Collective::AllReduce, s, 1), 0.0);
        assert_eq!(ring_steps(Collective::AllReduce, 4), 6);
        assert_eq!(
            ring_steps(
                Collective::Reduce {
                    root: crate::Rank(0)
                },
                4
            ),
            3
        );
    }
}
