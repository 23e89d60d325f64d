//! Call header: parse any bytes; what parses re-emits to the same 32 bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ringcc_core::wire::{CallHeader, CallHeaderRepr};

fuzz_target!(|data: &[u8]| {
    let Ok(view) = CallHeader::new_checked(data) else {
        return;
    };
    let Ok(repr) = CallHeaderRepr::parse(&view) else {
        return;
    };
    let bytes = repr.to_bytes();
    assert_eq!(&bytes[..], &data[..32]);
    assert_eq!(
        CallHeaderRepr::parse(&CallHeader::new_unchecked(&bytes[..])),
        Ok(repr)
    );
});
