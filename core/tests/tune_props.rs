//! Properties of the tuner: its choice is the arg-min of its own model
//! over what is allowed, deterministic (every rank computes the same from
//! the same inputs, or the ranks would run different schedules and hang),
//! and respects the overrides and the backend's capabilities.

use proptest::prelude::*;
use ringcc_core::tune::{AlgoSet, Capabilities, GpuGen, Hardware, ProtoSet, Tuner};
use ringcc_core::{Algorithm, Collective, Protocol, Rank};

fn hardware() -> impl Strategy<Value = Hardware> {
    (
        prop_oneof![
            Just(GpuGen::Volta),
            Just(GpuGen::Ampere),
            Just(GpuGen::Hopper)
        ],
        any::<bool>(),
        1.0f64..1000.0,
        1.0f64..1000.0,
        1.0f64..100.0,
        1u32..=64,
        0.0f64..3.0,
        prop_oneof![Just(0.0f64), 0.0f64..100.0],
        any::<bool>(),
    )
        .prop_map(
            |(gen, nvlink, intra, inter, ch, max_channels, ovh, net, amd)| Hardware {
                gen,
                nvlink,
                intra_gbps: intra,
                inter_gbps: inter,
                channel_gbps: ch,
                max_channels,
                net_overhead_us: ovh,
                net_latency_us: net,
                amd_cpu: amd,
            },
        )
}

fn collective() -> impl Strategy<Value = Collective> {
    prop_oneof![
        Just(Collective::AllReduce),
        Just(Collective::ReduceScatter),
        Just(Collective::AllGather),
        Just(Collective::Broadcast { root: Rank(0) }),
        Just(Collective::Reduce { root: Rank(0) }),
    ]
}

fn tuner() -> impl Strategy<Value = Tuner> {
    (
        hardware(),
        1u32..=64,
        1u32..=16,
        0u8..64,
        prop_oneof![Just("ring"), Just("tree"), Just("^ring"), Just("Ring,Tree")],
        prop_oneof![
            Just("LL"),
            Just("ll128"),
            Just("Simple"),
            Just("^LL"),
            Just("LL,LL128"),
            Just("LL,LL128,Simple")
        ],
    )
        .prop_map(|(hw, nodes, ppn, caps, algos, protos)| {
            let mut c = Capabilities::NONE;
            for a in Algorithm::ALL {
                for p in Protocol::ALL {
                    let bit = u32::from(a.code()) * 3 + u32::from(p.code());
                    if caps & (1 << bit) != 0 {
                        c = c.with(a, p);
                    }
                }
            }
            let mut t = Tuner::new(hw, nodes * ppn, nodes, c);
            t.algos = AlgoSet::parse(algos).unwrap();
            t.protos = ProtoSet::parse(protos).unwrap();
            t
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn the_choice_is_the_argmin_of_the_model(t in tuner(), c in collective(), bytes in 0u64..(1 << 36)) {
        match t.choose(c, bytes) {
            Ok(choice) => {
                let e = choice.chosen;
                prop_assert!(t.allowed(e.algorithm, e.protocol));
                prop_assert_eq!(t.estimate(c, bytes, e.algorithm, e.protocol), Some(e));
                for a in Algorithm::ALL {
                    for p in Protocol::ALL {
                        if let (true, Some(o)) = (t.allowed(a, p), t.estimate(c, bytes, a, p)) {
                            // Never a choice the model rates slower.
                            prop_assert!(e.time_us <= o.time_us, "{e:?} slower than {o:?}");
                        }
                    }
                }
            }
            Err(_) => {
                for a in Algorithm::ALL {
                    for p in Protocol::ALL {
                        prop_assert!(!t.allowed(a, p) || t.estimate(c, bytes, a, p).is_none());
                    }
                }
            }
        }
    }

    #[test]
    fn every_rank_chooses_the_same(t in tuner(), c in collective(), bytes in 0u64..(1 << 36)) {
        // Each rank builds its tuner from the same inputs: a copy made the
        // way another process would make it must choose bit for bit alike.
        let other = Tuner { hw: t.hw, ..t };
        let a = t.choose(c, bytes);
        let b = other.choose(c, bytes);
        prop_assert_eq!(format!("{a:?}"), format!("{b:?}"));
        if let (Ok(a), Ok(b)) = (a, b) {
            prop_assert_eq!(a.chosen.time_us.to_bits(), b.chosen.time_us.to_bits());
        }
    }

    #[test]
    fn overrides_and_capabilities_are_respected(t in tuner(), bytes in 0u64..(1 << 36)) {
        if let Ok(choice) = t.choose(Collective::AllReduce, bytes) {
            let e = choice.chosen;
            prop_assert!(t.caps.allows(e.algorithm, e.protocol));
            prop_assert!(t.algos.contains(e.algorithm));
            prop_assert!(t.protos.contains(e.protocol));
            prop_assert!(e.channels >= 1 && e.channels <= t.hw.max_channels.max(1));
        }
    }

    /// A network plugin's reported latency only ever adds time, only
    /// across nodes, and never changes the bandwidth term.
    #[test]
    fn a_reported_network_latency_only_adds_time_across_nodes(
        t in tuner(),
        c in collective(),
        bytes in 0u64..(1 << 36),
        extra in 0.0f64..200.0,
    ) {
        let more = Tuner { hw: Hardware { net_latency_us: t.hw.net_latency_us + extra, ..t.hw }, ..t };
        for a in Algorithm::ALL {
            for p in Protocol::ALL {
                if let (Some(x), Some(y)) = (t.estimate(c, bytes, a, p), more.estimate(c, bytes, a, p)) {
                    prop_assert!(y.latency_us >= x.latency_us, "{x:?} {y:?}");
                    prop_assert_eq!(x.algbw_gbps.to_bits(), y.algbw_gbps.to_bits());
                    if t.nodes == 1 {
                        prop_assert_eq!(x.latency_us.to_bits(), y.latency_us.to_bits());
                    }
                }
            }
        }
    }
}
