//! Every generated module — the fused kernels and the device loop of every
//! (type, op) — compiles with NVRTC and assembles (NVRTC's built-in
//! ptxas) for Hopper (`sm_90`), and yields PTX for the oldest architecture
//! the NVRTC found does not deprecate (the device loop: for `sm_70`, the
//! oldest it runs on). NVRTC needs no
//! GPU: `pip install nvidia-cuda-nvrtc-cu12` is enough (or set
//! `RINGCC_NVRTC_LIB`). Without NVRTC the test says it skipped, unless
//! `RINGCC_NVRTC_LIB` or `RINGCC_REQUIRE_NVRTC` is set: then it fails.

use ringcc_cuda::kernel::{loop_symbol, ModuleKey};
use ringcc_cuda::nvrtc::{Image, Nvrtc, Target};
use ringcc_cuda::Error;

fn nvrtc() -> Option<&'static Nvrtc> {
    match Nvrtc::get() {
        Ok(n) => Some(n),
        Err(Error::NoNvrtc { searched })
            if std::env::var_os("RINGCC_NVRTC_LIB").is_none()
                && std::env::var_os("RINGCC_REQUIRE_NVRTC").is_none() =>
        {
            eprintln!(
                "SKIPPED: no NVRTC library (pip install nvidia-cuda-nvrtc-cu12, or set RINGCC_NVRTC_LIB); searched {} places",
                searched.len()
            );
            None
        }
        Err(e) => panic!(
            "NVRTC required (RINGCC_NVRTC_LIB or RINGCC_REQUIRE_NVRTC set) but unusable: {e}"
        ),
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
    // PTX for the oldest architecture NVRTC does not call deprecated (75
    // in CUDA 12 and 13), and Hopper machine code, assembled by ptxas.
    let oldest = archs.iter().copied().filter(|&a| a >= 75).min().unwrap();
    let mut targets = vec![Target::Ptx(oldest)];
    if archs.contains(&90) {
        targets.push(Target::Cubin(90));
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
fn every_device_loop_compiles_and_assembles() {
    let Some(nvrtc) = nvrtc() else { return };
    let archs = nvrtc.supported_archs().unwrap();
    let oldest = archs.iter().copied().filter(|&a| a >= 70).min().unwrap();
    let mut targets = vec![Target::Ptx(oldest)];
    if archs.contains(&90) {
        targets.push(Target::Cubin(90));
    }
    for module in ModuleKey::all() {
        for t in &targets {
            match nvrtc.compile_loop(module, t) {
                Ok(Image::Ptx(p)) => {
                    let entry = format!(".entry {}(", loop_symbol(module));
                    assert!(p.contains(&entry), "{}: no {entry}", module.name());
                    // The counters: acquire loads, release pattern, sys scope.
                    assert!(p.contains("ld.acquire.sys.global.u64"), "{}", module.name());
                    assert!(p.contains("fence.acq_rel.sys"), "{}", module.name());
                    assert!(p.contains("st.relaxed.sys.global.u64"), "{}", module.name());
                    assert!(p.contains("%globaltimer"), "{}", module.name());
                    assert!(p.contains("bar.sync"), "{}", module.name());
                }
                Ok(Image::Cubin(c)) => assert!(c.starts_with(b"\x7fELF"), "{}", module.name()),
                Err(e) => panic!("{} loop for {t:?}: {e}", module.name()),
            }
        }
    }
}

/// The device loop moves slices with the fused kernels' 16-byte vectors.
#[test]
fn device_loop_uses_vector_memory_operations() {
    let Some(nvrtc) = nvrtc() else { return };
    let m = ModuleKey {
        dtype: ringcc_core::DataType::F32,
        op: ringcc_core::ReduceOp::Sum,
    };
    let Image::Ptx(ptx) = nvrtc.compile_loop(m, &Target::Ptx(80)).unwrap() else {
        panic!()
    };
    assert!(
        ptx.contains("ld.global.v4") || ptx.contains("ld.v4"),
        "no 16-byte load"
    );
    assert!(
        ptx.contains("st.global.v4") || ptx.contains("st.v4"),
        "no 16-byte store"
    );
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
