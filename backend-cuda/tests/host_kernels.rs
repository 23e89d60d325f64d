//! The generated kernel source, compiled as plain C++ for the host (the
//! `RINGCC_HOST_EMULATION` switch: `_Float16` instead of the PTX `cvt`
//! instructions, the grid position passed in), runs every kernel of every
//! (type, op) module on the CPU: aligned and misaligned buffers, vector
//! loop and scalar tail, several emulated grids. Its results must equal the
//! core's reduction kernels bit for bit, and it must write nothing outside
//! the slice. Needs a C++ compiler (`c++`); says it skipped otherwise.

use std::ffi::c_void;
use std::path::{Path, PathBuf};
use std::process::Command;

use half::{bf16, f16};
use ringcc_core::reduce::{finalize, reduce};
use ringcc_core::rng::Rng;
use ringcc_core::{DataType, Primitive};
use ringcc_cuda::kernel::{module_source, KernelKey, ModuleKey, HOST_EMULATION_DEFINE, PRIMITIVES};

type HostKernel = unsafe extern "C" fn(
    *const c_void,
    *const c_void,
    *mut c_void,
    *mut c_void,
    u64,
    u32,
    u64,
    u64,
);

fn compiler() -> Option<String> {
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".to_owned());
    Command::new(&cxx)
        .arg("--version")
        .output()
        .ok()?
        .status
        .success()
        .then_some(cxx)
}

fn build(dir: &Path, cxx: &str) -> PathBuf {
    let modules: Vec<ModuleKey> = ModuleKey::all().collect();
    let mut objects = Vec::new();
    for batch in modules.chunks(4) {
        let mut children = Vec::new();
        for m in batch {
            let src = dir.join(format!("{}.cpp", m.name()));
            std::fs::write(&src, module_source(*m)).unwrap();
            let obj = dir.join(format!("{}.o", m.name()));
            let child = Command::new(cxx)
                .args(["-O1", "-fPIC", "-c", "-x", "c++"])
                .arg(format!("-D{HOST_EMULATION_DEFINE}"))
                .arg(&src)
                .arg("-o")
                .arg(&obj)
                .spawn()
                .unwrap();
            children.push((m.name(), child));
            objects.push(obj);
        }
        for (name, mut c) in children {
            assert!(
                c.wait().unwrap().success(),
                "{name} does not compile as host C++"
            );
        }
    }
    let lib = dir.join("libringcc_host_kernels.so");
    let st = Command::new(cxx)
        .arg("-shared")
        .args(&objects)
        .arg("-o")
        .arg(&lib)
        .status()
        .unwrap();
    assert!(st.success());
    lib
}

/// A random f32 from the core's seeded generator: a mantissa in [1, 2),
/// an exponent in -10..=10, either sign.
fn float(rng: &mut Rng) -> f32 {
    let r = rng.next_u64();
    let m = 1.0 + (r & 0xffff) as f32 / 65536.0;
    let e = ((r >> 16) % 21) as i32 - 10;
    let s = if (r >> 40) & 1 == 1 { -1.0 } else { 1.0 };
    s * m * 2f32.powi(e)
}

/// `count` random elements: any bits for integers, finite non-zero values
/// for floats (so min/max never meet ±0 and nothing is NaN).
fn data(dtype: DataType, count: usize, rng: &mut Rng) -> Vec<u8> {
    let mut v = Vec::new();
    for _ in 0..count {
        match dtype {
            DataType::F16 => v.extend(f16::from_f32(float(rng)).to_ne_bytes()),
            DataType::Bf16 => v.extend(bf16::from_f32(float(rng)).to_ne_bytes()),
            DataType::F32 => v.extend(float(rng).to_ne_bytes()),
            DataType::F64 => v.extend((f64::from(float(rng)) * 1.000_000_1).to_ne_bytes()),
            _ => v.extend(&rng.next_u64().to_ne_bytes()[..usize::from(dtype.size())]),
        }
    }
    v
}

/// What the core says one slice of `p` produces.
fn reference(p: Primitive, m: ModuleKey, r: &[u8], x: &[u8], nranks: u32) -> Vec<u8> {
    let mut v = if p.contains(Primitive::REDUCE) {
        let mut v = vec![0; r.len()];
        reduce(m.dtype, m.op, &mut v, r, x).unwrap();
        v
    } else if p.contains(Primitive::RECV) {
        r.to_vec()
    } else {
        x.to_vec()
    };
    if p.finalizes() {
        finalize(m.dtype, m.op, &mut v, nranks).unwrap();
    }
    v
}

/// A 16-byte aligned buffer of `len` bytes starting `shift` bytes in,
/// surrounded by guard bytes.
struct Buf {
    store: Vec<u128>,
    shift: usize,
    len: usize,
}

const GUARD: usize = 32;

impl Buf {
    fn new(len: usize, shift: usize, fill: &[u8]) -> Buf {
        let mut b = Buf {
            store: vec![
                0x5a5a_5a5a_5a5a_5a5a_5a5a_5a5a_5a5a_5a5a;
                (len + shift + 2 * GUARD).div_ceil(16) + 1
            ],
            shift,
            len,
        };
        b.bytes_mut()[GUARD + shift..GUARD + shift + fill.len()].copy_from_slice(fill);
        b
    }
    fn bytes(&self) -> &[u8] {
        // SAFETY: a u128 vector viewed as its bytes.
        unsafe { std::slice::from_raw_parts(self.store.as_ptr().cast(), self.store.len() * 16) }
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, uniquely borrowed.
        unsafe {
            std::slice::from_raw_parts_mut(self.store.as_mut_ptr().cast(), self.store.len() * 16)
        }
    }
    fn ptr(&mut self) -> *mut c_void {
        let off = GUARD + self.shift;
        self.bytes_mut()[off..].as_mut_ptr().cast()
    }
    fn slice(&self) -> &[u8] {
        &self.bytes()[GUARD + self.shift..GUARD + self.shift + self.len]
    }
    fn guards_intact(&self) -> bool {
        let b = self.bytes();
        let lo = GUARD + self.shift;
        b[..lo]
            .iter()
            .chain(&b[lo + self.len..])
            .all(|&x| x == 0x5a)
    }
}

#[test]
fn host_emulation_matches_the_core_kernels() {
    let Some(cxx) = compiler() else {
        eprintln!("SKIPPED: no C++ compiler (set CXX) for the host emulation of the kernels");
        return;
    };
    let dir = std::env::temp_dir().join(format!("ringcc-host-kernels-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let lib_path = build(&dir, &cxx);
    // SAFETY: the library was just built from our own source; its
    // initializers do nothing.
    let lib = unsafe { libloading::Library::new(&lib_path) }.unwrap();
    let mut rng = Rng::new(0x1234_5678_9abc_def1);
    let mut checked = 0u64;
    for m in ModuleKey::all() {
        let e = usize::from(m.dtype.size());
        for p in PRIMITIVES {
            let name = KernelKey {
                primitive: p,
                module: m,
            }
            .symbol()
            .unwrap();
            // SAFETY: the symbol is one of our kernels, whose host signature
            // is `HostKernel`.
            let f: HostKernel = *unsafe { lib.get::<HostKernel>(name.as_bytes()) }.unwrap();
            for &count in &[0usize, 1, 3, 16, 37, 130] {
                for &shift in &[0usize, e % 16] {
                    for &(threads, nranks) in &[(1u64, 2u32), (5, 3), (64, 7)] {
                        let len = count * e;
                        let r = data(m.dtype, count, &mut rng);
                        let x = data(m.dtype, count, &mut rng);
                        let mut rb = Buf::new(len, shift, &r);
                        let mut xb = Buf::new(len, 0, &x);
                        let mut ob = Buf::new(len, 0, &[]);
                        let mut sb = Buf::new(len, shift, &[]);
                        let recv = if p.contains(Primitive::RECV) {
                            rb.ptr()
                        } else {
                            std::ptr::null_mut()
                        };
                        let input = if p.reads_input() {
                            xb.ptr()
                        } else {
                            std::ptr::null_mut()
                        };
                        let out = if p.contains(Primitive::COPY) {
                            ob.ptr()
                        } else {
                            std::ptr::null_mut()
                        };
                        let send = if p.contains(Primitive::SEND) {
                            sb.ptr()
                        } else {
                            std::ptr::null_mut()
                        };
                        for tid in 0..threads {
                            // SAFETY: every non-null pointer has `count`
                            // elements (plus guards); the kernel touches
                            // only those its primitive uses.
                            unsafe {
                                f(recv, input, out, send, count as u64, nranks, tid, threads)
                            };
                        }
                        let want = reference(p, m, &r, &x, nranks);
                        let ctx = format!("{name} count {count} shift {shift} threads {threads}");
                        if p.contains(Primitive::COPY) {
                            assert_eq!(ob.slice(), &want[..], "{ctx}: output");
                        }
                        if p.contains(Primitive::SEND) {
                            assert_eq!(sb.slice(), &want[..], "{ctx}: send");
                        }
                        assert!(
                            ob.guards_intact() && sb.guards_intact(),
                            "{ctx}: wrote outside"
                        );
                        if !p.contains(Primitive::COPY) {
                            assert!(
                                ob.slice().iter().all(|&b| b == 0x5a),
                                "{ctx}: output written"
                            );
                        }
                        if !p.contains(Primitive::SEND) {
                            assert!(sb.slice().iter().all(|&b| b == 0x5a), "{ctx}: send written");
                        }
                        checked += 1;
                    }
                }
            }
        }
    }
    assert_eq!(checked, 50 * 8 * 6 * 2 * 3);
    drop(lib);
    let _ = std::fs::remove_dir_all(&dir);
}
