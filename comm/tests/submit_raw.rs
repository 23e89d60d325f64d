//! `Communicator::submit_raw` / `submit_raw_in_place`: calls on memory a
//! binding owns through a keep-alive value, on a job of one rank (no
//! transport needed; the executor still copies input to output).

use std::sync::Arc;
use std::time::Duration;

use ringcc_comm::{store::MemStore, Communicator, Error, Options};
use ringcc_core::{Call, DataType, Rank, ReduceOp};

fn one_rank() -> Communicator {
    Communicator::new(
        Rank(0),
        1,
        Arc::new(MemStore::new()),
        "submit-raw",
        Options::default(),
        Arc::new(Vec::new),
    )
    .expect("a job of one rank")
}

/// Memory owned by a box the call keeps (as a Python object would be).
struct Owned {
    input: Box<[f32]>,
    output: Box<[f32]>,
}

#[test]
fn out_of_place_call_writes_the_kept_output_and_hands_it_back() {
    let comm = one_rank();
    let mut owned = Owned {
        input: (0..1000).map(|i| i as f32 * 0.5).collect(),
        output: vec![0.0; 1000].into_boxed_slice(),
    };
    let (i, o) = (
        owned.input.as_ptr().cast::<u8>(),
        owned.output.as_mut_ptr().cast::<u8>(),
    );
    let call = Call::all_reduce(1000, DataType::F32, ReduceOp::Sum);
    // SAFETY: both boxes live in `owned`, which the call keeps until it is
    // done (moving a box does not move its heap memory); they do not
    // overlap and nothing else touches them meanwhile.
    let work = unsafe { comm.submit_raw(call, i, 4000, o, 4000, owned) };
    let owned = work.wait().expect("the call");
    assert_eq!(owned.output, owned.input);
    comm.close().expect("close");
}

#[test]
fn in_place_calls_run_in_issue_order() {
    let comm = one_rank();
    let mut a: Box<[u8]> = vec![7; 64].into_boxed_slice();
    let mut b: Box<[u8]> = vec![9; 64].into_boxed_slice();
    let (pa, pb) = (a.as_mut_ptr(), b.as_mut_ptr());
    let call = Call::all_reduce(64, DataType::U8, ReduceOp::Max);
    // SAFETY: each box is kept by its own call until that call is done.
    let wa = unsafe { comm.submit_raw_in_place(call, pa, 64, a) };
    // SAFETY: as above.
    let wb = unsafe { comm.submit_raw_in_place(call, pb, 64, b) };
    // The second call completes only after the first.
    assert!(wb
        .wait_timeout(Duration::from_secs(10))
        .expect("second call"));
    assert!(wa.is_completed());
    assert_eq!(&*wa.wait().expect("first call"), &[7; 64]);
    assert_eq!(comm.calls(), 2);
    comm.close().expect("close");
}

#[test]
fn a_buffer_of_the_wrong_size_is_refused_through_the_work() {
    let comm = one_rank();
    let mut buf: Box<[u8]> = vec![0; 10].into_boxed_slice();
    let p = buf.as_mut_ptr();
    let call = Call::all_reduce(16, DataType::U8, ReduceOp::Sum);
    // SAFETY: the box is kept by the call; the call reads at most the 10
    // bytes it is given (it is refused before it starts).
    let work = unsafe { comm.submit_raw_in_place(call, p, 10, buf) };
    match work.wait() {
        Err(Error::BadBuffer { expected, got, .. }) => assert_eq!((expected, got), (16, 10)),
        other => panic!("expected BadBuffer, got {other:?}"),
    }
    // A refused buffer does not poison the communicator.
    let mut ok = [1u8; 4];
    comm.all_reduce_in_place(&mut ok, ReduceOp::Sum)
        .expect("a later call");
    comm.close().expect("close");
}
