//! The 32-byte call header: fixture, round trip, rejection of garbage.

use proptest::prelude::*;
use ringcc_core::wire::call_header::{CALL_HEADER_LEN, MAGIC};
use ringcc_core::wire::{CallHeader, CallHeaderRepr, Error};
use ringcc_core::{CallDesc, Collective, DataType, Rank, ReduceOp};

/// The layout documented in `ringcc_core::wire::call_header`; codes from
/// `Collective::code` (Reduce = 4), `DataType::code`, `ReduceOp::code`.
#[test]
fn fixture() {
    let desc = CallDesc::new(
        0x0102_0304_0506_0708,
        Collective::Reduce { root: Rank(3) },
        1_000_000,
        DataType::F32,
        ReduceOp::Max,
    );
    let repr = CallHeaderRepr {
        desc,
        step: 0xdead_beef,
    };
    let b = repr.to_bytes();
    assert_eq!(&b[0..4], b"RCCH");
    assert_eq!(b[4], 1);
    assert_eq!(b[5], 4);
    assert_eq!(b[6], DataType::F32.code());
    assert_eq!(b[7], ReduceOp::Max.code());
    assert_eq!(&b[8..16], &[1, 2, 3, 4, 5, 6, 7, 8]);
    assert_eq!(&b[16..24], &1_000_000u64.to_be_bytes());
    assert_eq!(&b[24..28], &[0, 0, 0, 3]);
    assert_eq!(&b[28..32], &[0xde, 0xad, 0xbe, 0xef]);
    let view = CallHeader::new_checked(&b[..]).unwrap();
    assert_eq!(view.root(), 3);
    assert_eq!(CallHeaderRepr::parse(&view), Ok(repr));
    assert_eq!(repr.buffer_len(), CALL_HEADER_LEN);
}

#[test]
fn rejects_garbage() {
    let good = CallHeaderRepr {
        desc: CallDesc::new(1, Collective::AllReduce, 5, DataType::U8, ReduceOp::Sum),
        step: 0,
    }
    .to_bytes();
    let parse = |b: &[u8]| CallHeaderRepr::parse(&CallHeader::new_unchecked(b));
    assert_eq!(parse(&good[..31]), Err(Error::Truncated));
    let mut b = good;
    b[0] = b'X';
    assert_eq!(parse(&b), Err(Error::Malformed));
    let mut b = good;
    b[4] = 2;
    assert_eq!(parse(&b), Err(Error::Unsupported));
    let mut b = good;
    b[5] = 9; // no such collective
    assert_eq!(parse(&b), Err(Error::Malformed));
    let mut b = good;
    b[6] = 200; // no such type
    assert_eq!(parse(&b), Err(Error::Malformed));
    let mut b = good;
    b[7] = 200; // no such op
    assert_eq!(parse(&b), Err(Error::Malformed));
    let mut b = good;
    b[27] = 1; // a root on AllReduce
    assert_eq!(parse(&b), Err(Error::Malformed));
    assert_eq!(MAGIC, *b"RCCH");
}

fn desc() -> impl Strategy<Value = CallDesc> {
    (
        any::<u64>(),
        0..5u8,
        any::<u32>(),
        any::<u64>(),
        prop::sample::select(DataType::ALL.to_vec()),
        prop::sample::select(ReduceOp::ALL.to_vec()),
    )
        .prop_map(|(seq, k, root, count, dtype, op)| {
            let collective = Collective::from_code(k, Rank(root)).unwrap();
            CallDesc::new(seq, collective, count, dtype, op)
        })
}

proptest! {
    #[test]
    fn roundtrip(desc in desc(), step in any::<u32>()) {
        let repr = CallHeaderRepr { desc, step };
        let mut b = [0u8; 40];
        repr.emit(&mut b).unwrap();
        prop_assert_eq!(CallHeaderRepr::parse(&CallHeader::new_checked(&b[..]).unwrap()), Ok(repr));
    }

    #[test]
    fn parse_never_panics(b in prop::collection::vec(any::<u8>(), 0..40)) {
        if let Ok(r) = CallHeaderRepr::parse(&CallHeader::new_unchecked(&b[..])) {
            prop_assert_eq!(&r.to_bytes()[..], &b[..32]);
        }
    }
}
