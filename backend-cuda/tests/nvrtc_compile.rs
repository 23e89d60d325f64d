//! Every generated module compiles with NVRTC and assembles (NVRTC's
//! built-in ptxas) for Hopper (`sm_90`) and Ampere (`sm_80`), and yields
//! PTX for the oldest architecture the NVRTC found supports. NVRTC needs no
//! GPU: `pip install nvidia-cuda-nvrtc-cu12` is enough (or set
//! `RINGCC_NVRTC_LIB`). Without NVRTC the test says it skipped.

use ringcc_cuda::kernel::ModuleKey;
use ringcc_cuda::nvrtc::{Image, Nvrtc, Target};
use ringcc_cuda::Error;

fn nvrtc() -> Option<&'static Nvrtc> {
    match Nvrtc::get() {
        Ok(n) => Some(n),
        Err(Error::NoNvrtc { searched }) => {
            eprintln!(
                "SKIPPED: no NVRTC library (pip install nvidia-cuda-nvrtc-cu12, or set RINGCC_NVRTC_LIB); searched {} places",
                searched.len()
            );
            None
        }
        Err(e) => panic!("NVRTC present but unusable: {e}"),
    }
}

#[test]
fn every_module_compiles_and_assembles() {
    let Some(nvrtc) = nvrtc() else { return };
    let (major, minor) = nvrtc.version().unwrap();
    let archs = nvrtc.supported_archs().unwrap();
    eprintln!(
        "NVRTC {major}.{minor} from {}; archs {archs:?}",
        nvrtc.path()
    );
    let oldest = *archs.iter().min().unwrap();
    let mut targets = vec![Target::Ptx(oldest)];
    for a in [80, 90] {
        if archs.contains(&a) {
            targets.push(Target::Cubin(a));
        }
    }
    for module in ModuleKey::all() {
        for t in &targets {
            match nvrtc.compile_module(module, t) {
                Ok(Image::Ptx(p)) => {
                    assert!(
                        p.contains(".entry ringcc_recvReduceCopySend_"),
                        "{}",
                        module.name()
                    );
                    assert!(!p.contains('\0'));
                }
                Ok(Image::Cubin(c)) => assert!(c.starts_with(b"\x7fELF"), "{}", module.name()),
                Err(e) => panic!("{} for {t:?}: {e}", module.name()),
            }
        }
    }
}

#[test]
fn compile_errors_carry_the_log() {
    let Some(nvrtc) = nvrtc() else { return };
    match nvrtc.compile(
        "broken",
        "extern \"C\" __global__ void k() { nope; }",
        &Target::Ptx(80),
    ) {
        Err(Error::Compile { module, log }) => {
            assert_eq!(module, "broken");
            assert!(log.contains("nope"), "{log}");
        }
        other => panic!("expected a compile error, got {other:?}"),
    }
}

/// The vector loop really is 16-byte loads and stores in the PTX.
#[test]
fn kernels_use_vector_memory_operations() {
    let Some(nvrtc) = nvrtc() else { return };
    for dtype in ringcc_core::DataType::ALL {
        let m = ModuleKey {
            dtype,
            op: ringcc_core::ReduceOp::Sum,
        };
        let Image::Ptx(ptx) = nvrtc.compile_module(m, &Target::Ptx(80)).unwrap() else {
            panic!()
        };
        assert!(
            ptx.contains("ld.global.v4.u32")
                || ptx.contains("ld.global.v4.b32")
                || ptx.contains("ld.global.v2.u64")
                || ptx.contains("ld.global.v2.b64"),
            "{dtype}: no 16-byte load\n"
        );
        assert!(
            ptx.contains("st.global.v4.u32")
                || ptx.contains("st.global.v4.b32")
                || ptx.contains("st.global.v2.u64")
                || ptx.contains("st.global.v2.b64"),
            "{dtype}: no 16-byte store"
        );
    }
}
