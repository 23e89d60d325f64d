//! Host C++ for the tests: the generated sources compiled with `c++`
//! (`$CXX`) under the host emulation into one shared library, loaded once
//! per test binary. Without a compiler the tests say they skipped.

use std::path::PathBuf;
use std::process::Command;

use ringcc_cuda::kernel::HOST_EMULATION_DEFINE;

/// The C++ compiler, if one runs.
pub fn compiler() -> Option<String> {
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".to_owned());
    Command::new(&cxx)
        .arg("--version")
        .output()
        .ok()?
        .status
        .success()
        .then_some(cxx)
}

/// Compiles `sources` (name, text) as host C++ under the host emulation,
/// two at a time, and links them into `lib<name>.so` in a fresh directory;
/// loads it. Panics with the compiler's message when a source does not
/// compile (the generated code is wrong). `None` without a compiler.
#[allow(dead_code, reason = "not every test binary loads in process")]
pub fn build(name: &str, sources: &[(String, String)]) -> Option<libloading::Library> {
    let (dir, lib) = build_to(name, sources)?;
    // SAFETY: the library was just built from our generated sources; its
    // initializers do nothing.
    let loaded = unsafe { libloading::Library::new(&lib) }.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    Some(loaded)
}

/// As [`build`], but leaves the library in its directory (for other
/// processes to load): `(directory, library)`; the caller removes the
/// directory.
pub fn build_to(name: &str, sources: &[(String, String)]) -> Option<(PathBuf, PathBuf)> {
    let Some(cxx) = compiler() else {
        eprintln!("SKIPPED: no C++ compiler (set CXX) for the host emulation");
        return None;
    };
    // One directory per build: tests of one binary build in parallel.
    static BUILDS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = BUILDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("ringcc-{name}-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut objects = Vec::new();
    for batch in sources.chunks(2) {
        let mut children = Vec::new();
        for (src_name, text) in batch {
            let src = dir.join(format!("{src_name}.cpp"));
            std::fs::write(&src, text).unwrap();
            let obj = dir.join(format!("{src_name}.o"));
            let child = Command::new(&cxx)
                .args([
                    "-O1", "-fPIC", "-pthread", "-Wall", "-Werror", "-c", "-x", "c++",
                ])
                .arg(format!("-D{HOST_EMULATION_DEFINE}"))
                .arg(&src)
                .arg("-o")
                .arg(&obj)
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            children.push((src_name.clone(), child));
            objects.push(obj);
        }
        for (n, c) in children {
            let out = c.wait_with_output().unwrap();
            assert!(
                out.status.success(),
                "{n} does not compile as host C++:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    let lib: PathBuf = dir.join(format!("lib{name}.so"));
    let st = Command::new(&cxx)
        .args(["-shared", "-pthread"])
        .args(&objects)
        .arg("-o")
        .arg(&lib)
        .status()
        .unwrap();
    assert!(st.success(), "linking {name}");
    Some((dir, lib))
}
