//! `ringcc perf --backend cuda` (the default build has it). Without a GPU
//! it must fail in one clear line, without a panic or an abort; with one,
//! its check is the core's and finds injected corruption.

mod common;

use common::{rows, run, stderr, stdout};

/// What the backend says where this machine has no usable GPU, if it
/// does; `None` where it ran.
fn no_gpu(o: &std::process::Output) -> Option<String> {
    let err = stderr(o);
    (err.contains("no CUDA driver") || err.contains("no GPU found")).then_some(err)
}

#[test]
fn cuda_backend_without_a_gpu_fails_in_one_line_or_counts_corruption() {
    for coll in [
        "allreduce",
        "reducescatter",
        "allgather",
        "broadcast",
        "reduce",
    ] {
        let o = run(&format!(
            "perf {coll} --backend cuda -b 64K -e 64K -n 1 -w 0 --gpus-per-node 2 --inject-corruption 3"
        ));
        if let Some(err) = no_gpu(&o) {
            assert_eq!(o.status.code(), Some(1), "{coll}: {err}");
            assert_eq!(err.trim().lines().count(), 1, "{err}");
            assert!(err.starts_with("ringcc: cuda: "), "{err}");
            assert!(!err.contains("panicked") && !err.contains("abort"), "{err}");
            eprintln!("no GPU here: {}", err.trim());
            return;
        }
        // A GPU: every injected element is found, out of place and in
        // place, and the run fails on them.
        let out = stdout(&o);
        assert_eq!(o.status.code(), Some(1), "{coll}: {out}{}", stderr(&o));
        let r = &rows(&out)[0];
        assert_eq!((r[8].as_str(), r[12].as_str()), ("3", "3"), "{coll}: {out}");
        assert!(out.contains("# Out of bounds values : 6 FAILED"), "{out}");
        let o = run(&format!(
            "perf {coll} --backend cuda -b 64K -e 64K -n 1 -w 0 --gpus-per-node 2"
        ));
        assert!(o.status.success(), "{coll}: {}{}", stdout(&o), stderr(&o));
        let r = &rows(&stdout(&o))[0];
        assert_eq!((r[8].as_str(), r[12].as_str()), ("0", "0"), "{coll}");
    }
}
