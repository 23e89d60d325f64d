//! Whole RoCEv2 frames: parse any bytes; then the same bytes with their
//! IPv4 checksum and ICRC repaired, so that the fuzzer reaches the
//! transport parsing behind the CRCs. Whatever parses re-emits to a frame
//! that parses to the same packet.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ringcc_core::wire::roce::{fill_icrc_ipv4, internet_checksum, RocePacketRepr};

fn roundtrip(frame: &[u8]) {
    if let Ok(p) = RocePacketRepr::parse(frame) {
        let mut out = vec![0u8; p.buffer_len()];
        assert_eq!(p.emit(&mut out), Ok(out.len()));
        assert_eq!(RocePacketRepr::parse(&out), Ok(p));
    }
}

fuzz_target!(|data: &[u8]| {
    roundtrip(data);
    if data.len() < 14 + 20 + 8 + 12 + 4 {
        return;
    }
    let mut f = data.to_vec();
    let ip_total = usize::from(u16::from_be_bytes([f[16], f[17]]));
    let end = (14 + ip_total).min(f.len());
    f[24..26].fill(0);
    let sum = internet_checksum(&f[14..34]);
    f[24..26].copy_from_slice(&sum.to_be_bytes());
    let _ = fill_icrc_ipv4(&mut f[14..end]);
    roundtrip(&f);
});
