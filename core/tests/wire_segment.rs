//! Segmentation of messages into MTU-sized packets, and the responder's
//! PSN check.

use proptest::prelude::*;
use ringcc_core::wire::roce::{Opcode, RethRepr};
use ringcc_core::wire::segment::{PathMtu, PsnChecker, PsnClass, PsnVerdict, Segmenter};
use ringcc_core::wire::{Error, Psn, Qpn, RemoteAddr, Rkey};

const REMOTE: RemoteAddr = RemoteAddr {
    addr: 0x7000_0000,
    rkey: Rkey(0x77),
};

#[test]
fn write_of_10000_bytes_at_4096_wraps_the_psn() {
    // IBTA vol. 1 §9.4: First / Middle / Last(with Immediate); PSNs
    // consecutive modulo 2^24, so 0xfffffe, 0xffffff, 0.
    let s = Segmenter::write(
        REMOTE,
        10_000,
        PathMtu::Mtu4096,
        Psn::new(0xff_fffe),
        Some(7),
    )
    .unwrap();
    assert_eq!(s.packets(), 3);
    assert_eq!(s.next_psn(), Psn::new(1));
    let by_psn = s.packet_at(Psn::new(0));
    assert_eq!(s.packet_at(Psn::new(1)), None);
    let p: Vec<_> = s.collect();
    assert_eq!(by_psn, Some(p[2]));
    assert_eq!(
        p.iter().map(|d| d.opcode).collect::<Vec<_>>(),
        [
            Opcode::WriteFirst,
            Opcode::WriteMiddle,
            Opcode::WriteLastWithImm
        ]
    );
    assert_eq!(
        p.iter().map(|d| d.psn.get()).collect::<Vec<_>>(),
        [0xff_fffe, 0xff_ffff, 0]
    );
    assert_eq!(
        p.iter().map(|d| (d.offset, d.len)).collect::<Vec<_>>(),
        [(0, 4096), (4096, 4096), (8192, 1808)]
    );
    assert_eq!(
        p[0].reth,
        Some(RethRepr {
            va: 0x7000_0000,
            rkey: Rkey(0x77),
            dma_len: 10_000
        })
    );
    assert_eq!((p[1].reth, p[2].reth), (None, None));
    assert_eq!(
        p.iter().map(|d| d.imm).collect::<Vec<_>>(),
        [None, None, Some(7)]
    );
    assert_eq!(
        p.iter().map(|d| d.ack_req).collect::<Vec<_>>(),
        [false, false, true]
    );
    // The last packet's payload (1808 bytes) needs no pad.
    assert_eq!(p[2].bth(Qpn::new(5), 0xffff).pad_count, 0);
}

#[test]
fn small_and_empty_messages_are_one_only_packet() {
    let p: Vec<_> = Segmenter::write(REMOTE, 0, PathMtu::Mtu1024, Psn::new(9), Some(1))
        .unwrap()
        .collect();
    assert_eq!(p.len(), 1);
    assert_eq!(p[0].opcode, Opcode::WriteOnlyWithImm);
    assert_eq!((p[0].len, p[0].imm, p[0].ack_req), (0, Some(1), true));
    assert_eq!(p[0].reth.map(|r| r.dma_len), Some(0));

    let p: Vec<_> = Segmenter::write(REMOTE, 1024, PathMtu::Mtu1024, Psn::new(0), None)
        .unwrap()
        .collect();
    assert_eq!(p.len(), 1);
    assert_eq!(p[0].opcode, Opcode::WriteOnly);

    let p: Vec<_> = Segmenter::send(1025, PathMtu::Mtu1024, Psn::new(0), None)
        .unwrap()
        .solicited(true)
        .collect();
    assert_eq!(
        p.iter()
            .map(|d| (d.opcode, d.len, d.reth, d.solicited))
            .collect::<Vec<_>>(),
        [
            (Opcode::SendFirst, 1024, None, false),
            (Opcode::SendLast, 1, None, true)
        ]
    );
    assert_eq!(p[1].bth(Qpn::new(1), 0xffff).pad_count, 3);

    assert_eq!(
        Segmenter::send((1 << 31) + 1, PathMtu::Mtu256, Psn::new(0), None).map(|_| ()),
        Err(Error::Malformed)
    );
}

#[test]
fn mtu_codes_are_ibv_mtu() {
    // rdma-core verbs.h `enum ibv_mtu`: IBV_MTU_256 = 1 … IBV_MTU_4096 = 5.
    for (i, m) in PathMtu::ALL.iter().enumerate() {
        assert_eq!(m.ibv(), i as u32 + 1);
        assert_eq!(PathMtu::from_ibv(m.ibv()), Some(*m));
        assert_eq!(m.bytes(), 256 << i);
    }
    assert_eq!(PathMtu::from_ibv(0), None);
}

#[test]
fn checker_accepts_naks_once_and_reports_duplicates() {
    let mut c = PsnChecker::new(Psn::new(0xff_ffff));
    assert_eq!(c.receive(Psn::new(0xff_ffff)), PsnVerdict::Accept);
    assert_eq!(c.expected(), Psn::new(0));
    // A gap: PSN 0 was lost.
    assert_eq!(
        c.receive(Psn::new(1)),
        PsnVerdict::Nak {
            expected: Psn::new(0)
        }
    );
    assert_eq!(c.receive(Psn::new(2)), PsnVerdict::Drop);
    // A retransmission of an old packet.
    assert_eq!(c.receive(Psn::new(0xff_ffff)), PsnVerdict::Duplicate);
    // Go-back-N resends from 0.
    assert_eq!(c.receive(Psn::new(0)), PsnVerdict::Accept);
    assert_eq!(c.receive(Psn::new(1)), PsnVerdict::Accept);
    // A new gap is NAKed again.
    assert_eq!(
        c.receive(Psn::new(5)),
        PsnVerdict::Nak {
            expected: Psn::new(2)
        }
    );
    // Half the PSN space: 2^23 - 1 ahead is a gap, 2^23 away a duplicate.
    let c = PsnChecker::new(Psn::new(0));
    assert_eq!(c.classify(Psn::new((1 << 23) - 1)), PsnClass::OutOfSequence);
    assert_eq!(c.classify(Psn::new(1 << 23)), PsnClass::Duplicate);
    assert_eq!(c.classify(Psn::new(0xff_ffff)), PsnClass::Duplicate);
}

fn mtu() -> impl Strategy<Value = PathMtu> {
    prop::sample::select(PathMtu::ALL.to_vec())
}

proptest! {
    #[test]
    fn packets_cover_the_message_once_in_order(
        len in prop_oneof![0..20_000u32, 0..(1u32 << 31)],
        m in mtu(), psn in 0..(1u32 << 24), imm in any::<Option<u32>>(), write in any::<bool>(),
    ) {
        let s = if write {
            Segmenter::write(REMOTE, len, m, Psn::new(psn), imm).unwrap()
        } else {
            Segmenter::send(len, m, Psn::new(psn), imm).unwrap()
        };
        let n = s.packets();
        prop_assert_eq!(n, len.div_ceil(m.bytes()).max(1));
        prop_assert_eq!(s.len(), n as usize);
        let next = s.next_psn();
        let mut expect_offset = 0u32;
        let mut count = 0u32;
        // Check the first two and the last two packets of long messages,
        // every packet of short ones.
        for (i, d) in s.enumerate() {
            let i = i as u32;
            prop_assert_eq!(d.offset, expect_offset);
            prop_assert_eq!(d.psn, Psn::new(psn).add(i));
            prop_assert_eq!(d.psn.get(), (psn + i) % (1 << 24));
            let first = i == 0;
            let last = i + 1 == n;
            prop_assert!(d.len <= m.bytes());
            if !last { prop_assert_eq!(d.len, m.bytes()); }
            prop_assert_eq!(d.opcode.starts_message(), first);
            prop_assert_eq!(d.opcode.ends_message(), last);
            let layout = d.opcode.layout().unwrap();
            prop_assert_eq!(layout.reth, write && first);
            prop_assert_eq!(d.reth.is_some(), write && first);
            prop_assert_eq!(layout.immdt, last && imm.is_some());
            prop_assert_eq!(d.imm, if last { imm } else { None });
            prop_assert_eq!(d.ack_req, last);
            if write {
                prop_assert!(matches!(d.opcode, Opcode::WriteFirst | Opcode::WriteMiddle | Opcode::WriteLast
                    | Opcode::WriteLastWithImm | Opcode::WriteOnly | Opcode::WriteOnlyWithImm));
            }
            expect_offset += d.len;
            count += 1;
            if n > 64 && i == 1 {
                // Skip to the tail: the middle is uniform.
                break;
            }
        }
        if n <= 64 {
            prop_assert_eq!(expect_offset, len);
            prop_assert_eq!(count, n);
        }
        prop_assert_eq!(next, Psn::new(psn).add(n));
    }

    #[test]
    fn skipping_to_the_tail_matches(len in 0..(1u32 << 31), m in mtu()) {
        let s = Segmenter::write(REMOTE, len, m, Psn::new(0), None).unwrap();
        let n = s.packets();
        let last = s.clone().last().unwrap();
        prop_assert_eq!(last.offset + last.len, len);
        prop_assert_eq!(last.psn, Psn::new(n - 1));
        prop_assert_eq!(s.clone().nth(n as usize), None);
    }

    #[test]
    fn checker_classifies_by_half_window(exp in 0..(1u32 << 24), d in 0..(1u32 << 24)) {
        let c = PsnChecker::new(Psn::new(exp));
        let psn = Psn::new(exp).add(d);
        let class = c.classify(psn);
        let want = if d == 0 { PsnClass::Expected } else if d < (1 << 23) { PsnClass::OutOfSequence } else { PsnClass::Duplicate };
        prop_assert_eq!(class, want);
    }

    #[test]
    fn go_back_n_delivers_in_order(losses in prop::collection::vec(any::<bool>(), 1..60), start in 0..(1u32 << 24)) {
        // A sender transmits PSNs start.. and loses some first transmissions;
        // on a NAK it resends from `expected`. The checker accepts every
        // PSN exactly once, in order.
        let mut c = PsnChecker::new(Psn::new(start));
        let total = losses.len() as u32;
        let mut accepted = Vec::new();
        let mut next = 0u32;
        let mut lost = losses.clone();
        let mut rounds = 0;
        while (accepted.len() as u32) < total {
            rounds += 1;
            prop_assert!(rounds < 10_000);
            let i = next;
            next += 1;
            if i < total && lost[i as usize] {
                lost[i as usize] = false;
                continue;
            }
            if i >= total {
                // Tail loss: a timeout resends from the checker's expectation.
                next = c.expected().get().wrapping_sub(start) & 0xff_ffff;
                continue;
            }
            match c.receive(Psn::new(start).add(i)) {
                PsnVerdict::Accept => accepted.push(i),
                PsnVerdict::Nak { expected } => next = expected.get().wrapping_sub(start) & 0xff_ffff,
                PsnVerdict::Drop | PsnVerdict::Duplicate => {}
            }
        }
        prop_assert_eq!(accepted, (0..total).collect::<Vec<_>>());
    }
}
