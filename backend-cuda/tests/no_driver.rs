//! Without a CUDA driver every GPU entry point returns `Error::NoDriver`
//! (cudarc would abort the process on its first driver call). With a
//! driver, the same calls work or fail with a typed error.

use std::sync::Arc;

use ringcc_comm::store::MemStore;
use ringcc_core::Rank;
use ringcc_cuda::{driver, Comm, Config, Error, GpuRank};

#[test]
fn gpu_entry_points_report_a_missing_driver() {
    match driver::device_count() {
        Err(Error::NoDriver) => {
            assert!(matches!(
                Comm::init_all(&[0, 0], Config::default()),
                Err(Error::NoDriver)
            ));
            assert!(matches!(driver::context(0), Err(Error::NoDriver)));
            // A GPU rank per process, too: before any store traffic.
            let store = Arc::new(MemStore::new());
            assert!(matches!(
                GpuRank::init(0, Rank(0), 2, store.clone(), Config::default()),
                Err(Error::NoDriver)
            ));
            assert!(matches!(
                GpuRank::init(0, Rank(2), 2, store, Config::default()),
                Err(Error::RankOutOfRange { .. })
            ));
            // From a launcher's variables: refused before serving or
            // dialling a store.
            let launch = ringcc_comm::launch::Launch::from_vars(|k| match k {
                "RINGCC_RANK" => Some("0".into()),
                "RINGCC_WORLD_SIZE" => Some("2".into()),
                "RINGCC_ADDR" => Some("127.0.0.1:1".into()),
                _ => None,
            })
            .unwrap();
            assert!(matches!(
                GpuRank::from_launch(launch, 0, Config::default()),
                Err(Error::NoDriver)
            ));
            eprintln!("no CUDA driver here: NoDriver returned as expected");
        }
        Ok(n) => {
            eprintln!("{n} CUDA device(s) here");
            assert!(matches!(
                Comm::init_all(&[n], Config::default()),
                Err(Error::NoDevice { .. })
            ));
            assert!(matches!(
                GpuRank::init(n, Rank(0), 1, Arc::new(MemStore::new()), Config::default()),
                Err(Error::NoDevice { .. })
            ));
        }
        Err(e) => eprintln!("driver present but unusable: {e}"),
    }
}
