//! mlx5 WQE: parse any bytes; what parses re-emits to bytes that parse to
//! the same WQE, and converts to a work request and back.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ringcc_core::wire::mlx5::{Wqe, WqeRepr};

fuzz_target!(|data: &[u8]| {
    let Ok(view) = Wqe::new_checked(data) else {
        return;
    };
    let _ = (view.opcode(), view.qpn(), view.flags(), view.segment(3));
    let Ok(repr) = WqeRepr::<8>::parse(&view) else {
        return;
    };
    let mut out = vec![0u8; repr.buffer_len().expect("parsed WQE has a size")];
    assert_eq!(repr.emit(&mut out), Ok(out.len()));
    let again = WqeRepr::<8>::parse(&Wqe::new_checked(&out[..]).expect("emitted WQE is whole"));
    assert_eq!(again, Ok(repr.clone()));
    if let Ok(wr) = repr.to_request(7) {
        let back = WqeRepr::from_request(&wr, repr.qpn, repr.wqe_index).expect("request formats");
        assert_eq!(back.to_request(7), Ok(wr));
    }
});
