//! Property: any sequence of calls (every collective, type, op, count,
//! in place or not) on 1–4 ranks × 1–3 channels, over shared memory with
//! small FIFOs, gives every rank the reference result (`core::verify`).
//! Ranks are threads here (the multi-process runs are `comm_ranks.rs`).

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use ringcc_comm::store::{MemStore, Store};
use ringcc_comm::transport::Transport;
use ringcc_comm::{Communicator, Options, Transports};
use ringcc_core::fifo::FifoGeometry;
use ringcc_core::verify;
use ringcc_core::{Call, Collective, DataType, Rank, ReduceOp};
use ringcc_host::ShmTransport;

fn shm_only() -> Transports {
    Arc::new(|| vec![Box::new(ShmTransport::new()) as Box<dyn Transport>])
}

#[derive(Clone, Debug)]
struct Case {
    ranks: u32,
    channels: u8,
    slot_bytes: u64,
    calls: Vec<(Call, bool)>,
}

fn call(ranks: u32) -> impl Strategy<Value = (Call, bool)> {
    let dtypes = prop::sample::select(DataType::ALL.to_vec());
    let ops = prop::sample::select(vec![
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Min,
        ReduceOp::Max,
        ReduceOp::Avg,
    ]);
    (0u8..5, 0u64..3000, dtypes, ops, 0..ranks, any::<bool>()).prop_map(
        move |(c, count, dtype, op, root, in_place)| {
            let root = Rank(root);
            let collective = match c {
                0 => Collective::AllReduce,
                1 => Collective::ReduceScatter,
                2 => Collective::AllGather,
                3 => Collective::Broadcast { root },
                _ => Collective::Reduce { root },
            };
            (Call::new(collective, count, dtype, op), in_place)
        },
    )
}

fn case() -> impl Strategy<Value = Case> {
    (
        1u32..=4,
        1u8..=3,
        prop::sample::select(vec![1024u64, 4096, 16384]),
    )
        .prop_flat_map(|(ranks, channels, slot_bytes)| {
            prop::collection::vec(call(ranks), 1..5).prop_map(move |calls| Case {
                ranks,
                channels,
                slot_bytes,
                calls,
            })
        })
}

/// One rank's run of the case: `Err` names the first wrong call.
fn rank(comm: &Communicator, calls: &[(Call, bool)]) -> Result<(), String> {
    let (ranks, r) = (comm.world_size(), comm.rank().0);
    for (k, (call, in_place)) in calls.iter().enumerate() {
        let salt = k as u64 * 13 + 5;
        let plan = call.plan(ranks, 1, 1 << 20).map_err(|e| e.to_string())?;
        let (ib, ob) = call.buffer_bytes(ranks);
        let mut input = vec![0u8; ib];
        verify::fill_input(&plan, call.op, r, salt, &mut input).map_err(|e| e.to_string())?;
        let got = if *in_place {
            let (ie, oe) = call.in_place_offsets(r);
            let at = |e: u64| e as usize * call.elem();
            let mut buf = vec![0u8; ib.max(ob)];
            buf[at(ie)..at(ie) + ib].copy_from_slice(&input);
            comm.run_in_place(call, &mut buf)
                .map_err(|e| format!("call {k} {call:?} in place: {e}"))?;
            buf[at(oe)..at(oe) + ob].to_vec()
        } else {
            let mut out = vec![0u8; ob];
            comm.run(call, &input, &mut out)
                .map_err(|e| format!("call {k} {call:?}: {e}"))?;
            out
        };
        let mut want = vec![0u8; ob];
        if verify::fill_expected(&plan, call.op, r, 0, salt, &mut want)
            .map_err(|e| e.to_string())?
        {
            let wrong = verify::count_diff(&want, &got, call.elem());
            if wrong != 0 {
                return Err(format!(
                    "rank {r} call {k} {call:?} in place {in_place}: {wrong} wrong"
                ));
            }
        }
    }
    Ok(())
}

fn run(case: &Case, token: &str) -> Result<(), String> {
    let store: Arc<dyn Store> = Arc::new(MemStore::new());
    let options = Options {
        channels: case.channels,
        geometry: Some(FifoGeometry::new(case.slot_bytes, 1).unwrap()),
        chunk_bytes: case.slot_bytes * 2,
        // Every channel in use from a few KiB on.
        channel_bytes: Some(2048),
        timeout: Duration::from_secs(20),
        ..Options::default()
    };
    let threads: Vec<_> = (0..case.ranks)
        .map(|r| {
            let (store, o, calls, t) = (
                Arc::clone(&store),
                options.clone(),
                case.calls.clone(),
                token.to_owned(),
            );
            let n = case.ranks;
            std::thread::spawn(move || -> Result<(), String> {
                let c = Communicator::new(Rank(r), n, store, &t, o, shm_only())
                    .map_err(|e| format!("connect: {e}"))?;
                rank(&c, &calls)?;
                c.close().map_err(|e| e.to_string())
            })
        })
        .collect();
    let mut first = Ok(());
    for t in threads {
        let r = t
            .join()
            .map_err(|_| "a rank panicked".to_string())
            .and_then(|r| r);
        if first.is_ok() {
            first = r;
        }
    }
    first
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn any_call_sequence_gives_the_reference_result(case in case()) {
        let token = format!(
            "comm-props-{}-{:?}",
            std::process::id(),
            std::time::Instant::now()
        );
        prop_assert_eq!(run(&case, &token), Ok(()));
    }
}
