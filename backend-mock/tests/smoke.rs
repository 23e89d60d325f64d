mod common;
use ringcc_core::{Collective, DataType, ReduceOp};
use ringcc_mock::Call;

#[test]
fn allreduce_small() {
    let call = Call::new(Collective::AllReduce, 1000, DataType::F32, ReduceOp::Sum);
    let (c, r, _) = common::run_checked(common::small(2, 2, 2, 2), call, false, 1);
    eprintln!("{r:?} {:?}", c.stats());
}
