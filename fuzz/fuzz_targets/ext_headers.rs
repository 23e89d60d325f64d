//! RETH, AETH, ImmDt: parse any bytes as each; parse → emit → parse is the
//! identity.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ringcc_core::wire::roce::{Aeth, AethRepr, ImmDt, ImmDtRepr, Reth, RethRepr};

fuzz_target!(|data: &[u8]| {
    if let Ok(r) = Reth::new_checked(data).and_then(|v| RethRepr::parse(&v)) {
        let mut out = [0u8; 16];
        r.emit(&mut out).expect("a parsed RETH emits");
        assert_eq!(RethRepr::parse(&Reth::new_unchecked(&out[..])), Ok(r));
    }
    if let Ok(a) = Aeth::new_checked(data).and_then(|v| AethRepr::parse(&v)) {
        let mut out = [0u8; 4];
        a.emit(&mut out).expect("a parsed AETH emits");
        assert_eq!(&out[..], &data[..4]);
        assert_eq!(AethRepr::parse(&Aeth::new_unchecked(&out[..])), Ok(a));
    }
    if let Ok(i) = ImmDt::new_checked(data).and_then(|v| ImmDtRepr::parse(&v)) {
        let mut out = [0u8; 4];
        i.emit(&mut out).expect("a parsed ImmDt emits");
        assert_eq!(ImmDtRepr::parse(&ImmDt::new_unchecked(&out[..])), Ok(i));
    }
});
