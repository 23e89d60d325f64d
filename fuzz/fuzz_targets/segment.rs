//! Segmentation and the PSN checker on arbitrary parameters: packets tile
//! the message in order with consecutive PSNs; the checker accepts exactly
//! the expected PSN.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ringcc_core::wire::segment::{PathMtu, PsnChecker, PsnVerdict, Segmenter};
use ringcc_core::wire::{Psn, RemoteAddr, Rkey};

fuzz_target!(|input: (u32, u8, u32, Option<u32>, bool, Vec<u32>)| {
    let (len, mtu, psn, imm, write, psns) = input;
    let mtu = PathMtu::ALL[usize::from(mtu) % PathMtu::ALL.len()];
    let len = len % (1 << 18);
    let first = Psn::new(psn);
    let remote = RemoteAddr {
        addr: 0x1000,
        rkey: Rkey(1),
    };
    let s = if write {
        Segmenter::write(remote, len, mtu, first, imm)
    } else {
        Segmenter::send(len, mtu, first, imm)
    }
    .expect("lengths below 2^31 segment");
    let n = s.packets();
    let mut at = 0u32;
    for (i, d) in s.clone().enumerate() {
        assert_eq!(d.offset, at);
        assert_eq!(d.psn, first.add(i as u32));
        assert_eq!(s.packet(i as u32), Some(d));
        assert_eq!(d.opcode.starts_message(), i == 0);
        assert_eq!(d.opcode.ends_message(), i as u32 + 1 == n);
        at += d.len;
    }
    assert_eq!(at, len);

    let mut c = PsnChecker::new(first);
    for p in psns.into_iter().take(256) {
        let before = c.expected();
        match c.receive(Psn::new(p)) {
            PsnVerdict::Accept => {
                assert_eq!(Psn::new(p), before);
                assert_eq!(c.expected(), before.next());
            }
            PsnVerdict::Nak { expected } => assert_eq!(expected, before),
            PsnVerdict::Duplicate | PsnVerdict::Drop => assert_eq!(c.expected(), before),
        }
    }
});
