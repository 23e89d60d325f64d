//! The Chrome / Perfetto trace and the pcap capture: well-formed, and
//! saying what happened.

mod common;

use std::collections::BTreeSet;

use ringcc_core::wire::roce::RocePacketRepr;
use ringcc_core::{Collective, DataType, ReduceOp};
use ringcc_mock::{Call, Cluster, ClusterConfig, Error, Faults};

const PRIMITIVES: [&str; 8] = [
    "send",
    "recvReduceSend",
    "recvReduceCopySend",
    "recvCopySend",
    "recv",
    "copySend",
    "recvReduceCopy",
    "copy",
];

#[test]
fn chrome_trace_has_a_track_per_rank_channel_and_link() {
    for payload in [true, false] {
        let mut cfg = common::small(2, 2, 2, 2);
        cfg.trace = true;
        cfg.payload = payload;
        let call = Call::new(Collective::AllReduce, 4000, DataType::F32, ReduceOp::Sum);
        let mut c = Cluster::new(cfg).unwrap();
        let mut bufs = if payload {
            common::buffers(&call, 4, false, 2)
        } else {
            Vec::new()
        };
        assert!(c.run(&[call; 4], &mut bufs, false).unwrap().ok());
        let mut out = Vec::new();
        c.write_chrome_trace(&mut out).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out).expect("valid JSON");
        let events = v["traceEvents"].as_array().unwrap();
        let mut tracks = BTreeSet::new();
        let mut link_tracks = BTreeSet::new();
        let mut names = BTreeSet::new();
        for e in events {
            if e["ph"] != "X" {
                continue;
            }
            let (pid, tid) = (e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap());
            assert!(e["ts"].as_f64().unwrap() >= 0.0 && e["dur"].as_f64().unwrap() >= 0.0);
            if pid < 4 {
                let name = e["name"].as_str().unwrap();
                assert!(PRIMITIVES.contains(&name), "{name}");
                names.insert(name.to_string());
                tracks.insert((pid, tid));
                for k in ["chunk", "step", "slice", "bytes"] {
                    assert!(e["args"][k].is_u64(), "{k} in {e}");
                }
            } else {
                assert_eq!(pid, 4);
                assert!(e["args"]["bytes"].as_u64().unwrap() > 0 || payload);
                link_tracks.insert(tid);
            }
        }
        assert_eq!(tracks.len(), 8, "4 ranks x 2 channels");
        // AllReduce uses send, recvReduceSend, recvReduceCopySend,
        // recvCopySend, recv.
        for p in [
            "send",
            "recvReduceSend",
            "recvReduceCopySend",
            "recvCopySend",
            "recv",
        ] {
            assert!(names.contains(p), "{p} missing");
        }
        // NVLinks 0->1 and 2->3, NIC ports of both nodes.
        assert_eq!(link_tracks.len(), 6, "{link_tracks:?}");
        assert_eq!(
            events.iter().filter(|e| e["ph"] == "X").count(),
            c.trace_len()
        );
        let meta: Vec<&str> = events
            .iter()
            .filter(|e| e["ph"] == "M" && e["name"] == "thread_name")
            .filter_map(|e| e["args"]["name"].as_str())
            .collect();
        assert!(
            meta.contains(&"channel 1")
                && meta.contains(&"nvlink 0->1")
                && meta.contains(&"nic 1.0 tx")
        );
    }
}

/// Reads a libpcap file: (nanoseconds, frame) records.
fn read_pcap(b: &[u8]) -> Vec<(u64, Vec<u8>)> {
    let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
    assert_eq!(u32_at(0), 0xa1b2_3c4d, "nanosecond pcap magic");
    assert_eq!(u16::from_le_bytes([b[4], b[5]]), 2);
    assert_eq!(u32_at(20), 1, "LINKTYPE_ETHERNET");
    let mut at = 24;
    let mut out = Vec::new();
    while at < b.len() {
        let (sec, nsec, incl, orig) = (u32_at(at), u32_at(at + 4), u32_at(at + 8), u32_at(at + 12));
        assert_eq!(incl, orig);
        assert!(nsec < 1_000_000_000);
        let f = b[at + 16..at + 16 + incl as usize].to_vec();
        out.push((u64::from(sec) * 1_000_000_000 + u64::from(nsec), f));
        at += 16 + incl as usize;
    }
    assert_eq!(at, b.len());
    out
}

#[test]
fn pcap_holds_valid_rocev2_frames() {
    let mut cfg = common::small(2, 1, 1, 1);
    cfg.capture = true;
    cfg.faults = Faults {
        seed: Some(4),
        loss: 0.05,
        ..Faults::default()
    };
    cfg.rnic.timeout = 8;
    let call = Call::new(Collective::AllReduce, 3000, DataType::I32, ReduceOp::Sum);
    let (c, _, _) = common::run_checked(cfg, call, false, 9);
    let mut out = Vec::new();
    c.write_pcap(&mut out).unwrap();
    let frames = read_pcap(&out);
    assert_eq!(frames.len(), c.captured_frames());
    assert_eq!(frames.len() as u64, c.stats().packets);
    let mut last = 0;
    let mut psns = BTreeSet::new();
    let mut repeats = 0;
    let (mut acks, mut data) = (0, 0);
    for (t, f) in &frames {
        assert!(*t >= last, "timestamps in order");
        last = *t;
        let p = RocePacketRepr::parse(f).expect("valid frame, ICRC included");
        assert_eq!(p.udp.dst_port, 4791);
        if p.aeth.is_some() {
            acks += 1;
        } else {
            data += 1;
            if !psns.insert((p.bth.dest_qpn.get(), p.bth.psn.get())) {
                repeats += 1;
            }
        }
    }
    assert!(acks > 0 && data > 0);
    assert_eq!(
        repeats,
        c.stats().retransmissions,
        "every retransmission is on the wire"
    );
    assert!(repeats > 0);
}

#[test]
fn timing_mode_has_no_packets_to_capture() {
    let cfg = ClusterConfig {
        capture: true,
        payload: false,
        ..ClusterConfig::default()
    };
    assert!(matches!(Cluster::new(cfg), Err(Error::BadConfig { .. })));
    let cfg = ClusterConfig {
        payload: false,
        faults: Faults {
            loss: 0.01,
            ..Faults::default()
        },
        ..ClusterConfig::default()
    };
    assert!(matches!(Cluster::new(cfg), Err(Error::BadConfig { .. })));
}
