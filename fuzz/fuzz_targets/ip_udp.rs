//! Ethernet, IPv4 and UDP: parse any bytes; parse → emit → parse is the
//! identity, and an emitted IPv4 header's checksum verifies.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ringcc_core::wire::roce::{internet_checksum, EthernetRepr, Ipv4Repr, UdpRepr};

fuzz_target!(|data: &[u8]| {
    if let Ok(e) = EthernetRepr::parse(data) {
        let mut out = [0u8; 14];
        e.emit(&mut out).expect("a parsed Ethernet header emits");
        assert_eq!(&out[..], &data[..14]);
    }
    let ip = data.get(14..).unwrap_or(&[]);
    if let Ok(r) = Ipv4Repr::parse(ip) {
        let mut out = vec![0u8; 20 + usize::from(r.payload_len)];
        r.emit(&mut out).expect("a parsed IPv4 header emits");
        assert_eq!(internet_checksum(&out[..20]), 0);
        assert_eq!(Ipv4Repr::parse(&out), Ok(r));
        if let Ok(u) = UdpRepr::parse(&ip[20..]) {
            let mut out = vec![0u8; 8 + usize::from(u.payload_len)];
            u.emit(&mut out).expect("a parsed UDP header emits");
            assert_eq!(UdpRepr::parse(&out), Ok(u));
        }
    }
});
