//! BTH: parse any bytes; parse → emit → parse is the identity.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ringcc_core::wire::roce::{Bth, BthRepr};

fuzz_target!(|data: &[u8]| {
    let Ok(view) = Bth::new_checked(data) else {
        return;
    };
    let _ = (view.opcode().layout(), view.payload().len());
    let repr = BthRepr::parse(&view).expect("a whole BTH always parses");
    let mut out = [0u8; 12];
    repr.emit(&mut out).expect("a parsed BTH emits");
    assert_eq!(BthRepr::parse(&Bth::new_unchecked(&out[..])), Ok(repr));
});
