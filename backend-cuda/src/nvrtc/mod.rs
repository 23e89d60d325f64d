//! NVRTC, loaded at run time: raw entry points (`raw`) → checked calls
//! returning [`Result`] → [`Nvrtc::compile`], which owns its program.
//!
//! NVRTC needs neither a GPU nor a driver, so the generated kernels are
//! compiled (and, for `sm_XX` targets, assembled by NVRTC's built-in
//! `ptxas`) on any machine that has the library, e.g. from
//! `pip install nvidia-cuda-nvrtc-cu12`.

pub mod locate;
mod raw;

use std::ffi::{c_char, c_int, CStr, CString};
use std::sync::OnceLock;

use crate::error::{Error, Result};
use crate::kernel::{loop_source, module_source, ModuleKey};

use raw::{NvrtcLib, Program};

/// A loaded NVRTC library.
#[derive(Debug)]
pub struct Nvrtc {
    lib: NvrtcLib,
    path: String,
}

/// What a compilation produced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// PTX for a virtual architecture (`compute_XY`), loaded by the driver.
    Ptx(u32),
    /// Machine code for a real architecture (`sm_XY`), assembled by NVRTC.
    Cubin(u32),
}

/// Compiled code.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Image {
    /// PTX text (without the trailing NUL).
    Ptx(String),
    /// A cubin.
    Cubin(Vec<u8>),
}

static LOADED: OnceLock<std::result::Result<Nvrtc, Vec<String>>> = OnceLock::new();

impl Nvrtc {
    /// The process's NVRTC, loaded on first use from the first candidate
    /// of [`locate::SearchEnv::from_process`] that loads. Fails with
    /// [`Error::NoNvrtc`] listing what was tried.
    pub fn get() -> Result<&'static Nvrtc> {
        let r = LOADED.get_or_init(|| {
            let candidates = locate::SearchEnv::from_process().candidates();
            for c in &candidates {
                match NvrtcLib::open(c) {
                    Ok(Ok(lib)) => {
                        tracing::debug!(path = %c, "ringcc-cuda: NVRTC loaded");
                        return Ok(Nvrtc {
                            lib,
                            path: c.clone(),
                        });
                    }
                    Ok(Err(e)) => {
                        tracing::debug!(path = %c, error = %e, "ringcc-cuda: unusable NVRTC")
                    }
                    Err(_) => {}
                }
            }
            Err(candidates)
        });
        r.as_ref().map_err(|searched| Error::NoNvrtc {
            searched: searched.clone(),
        })
    }

    /// Where the library was loaded from.
    pub fn path(&self) -> &str {
        &self.path
    }

    fn check(call: &'static str, code: raw::NvrtcResult) -> Result<()> {
        if code == 0 {
            Ok(())
        } else {
            Err(Error::Nvrtc { call, code })
        }
    }

    /// NVRTC's version, `(major, minor)`.
    pub fn version(&self) -> Result<(i32, i32)> {
        let (mut a, mut b) = (0, 0);
        // SAFETY: both pointers are valid for writes of a c_int.
        Self::check("nvrtcVersion", unsafe {
            (self.lib.version)(&mut a, &mut b)
        })?;
        Ok((a, b))
    }

    /// The real architectures this NVRTC can target (`[75, 80, …]`).
    pub fn supported_archs(&self) -> Result<Vec<u32>> {
        let mut n: c_int = 0;
        // SAFETY: `n` is valid for a write of a c_int.
        Self::check("nvrtcGetNumSupportedArchs", unsafe {
            (self.lib.get_num_supported_archs)(&mut n)
        })?;
        let mut v: Vec<c_int> = vec![0; usize::try_from(n).unwrap_or(0)];
        // SAFETY: `v` has room for the `n` entries NVRTC writes.
        Self::check("nvrtcGetSupportedArchs", unsafe {
            (self.lib.get_supported_archs)(v.as_mut_ptr())
        })?;
        Ok(v.into_iter()
            .filter_map(|a| u32::try_from(a).ok())
            .collect())
    }

    /// Compiles `source` (named `name` in messages) for `target`.
    pub fn compile(&self, name: &str, source: &str, target: &Target) -> Result<Image> {
        let arch = match target {
            Target::Ptx(a) => format!("--gpu-architecture=compute_{a}"),
            Target::Cubin(a) => format!("--gpu-architecture=sm_{a}"),
        };
        let src = CString::new(source).map_err(|_| Error::BadConfig {
            what: "kernel source contains a NUL byte",
        })?;
        let cname = CString::new(name).map_err(|_| Error::BadConfig {
            what: "kernel name contains a NUL byte",
        })?;
        let prog = ProgramGuard::create(self, &src, &cname)?;
        let opts: Vec<CString> = [arch.as_str(), "--std=c++14"]
            .iter()
            .filter_map(|o| CString::new(*o).ok())
            .collect();
        let ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
        // SAFETY: `prog` is a live program; `ptrs` holds `ptrs.len()` valid
        // NUL-terminated strings that outlive the call.
        let code =
            unsafe { (self.lib.compile_program)(prog.prog, ptrs.len() as c_int, ptrs.as_ptr()) };
        if code != 0 {
            return Err(Error::Compile {
                module: name.to_owned(),
                log: prog.log().unwrap_or_else(|e| format!("(no log: {e})")),
            });
        }
        match target {
            Target::Ptx(_) => {
                let bytes = prog.output(self.lib.get_ptx_size, self.lib.get_ptx, "nvrtcGetPTX")?;
                let text = CStr::from_bytes_until_nul(&bytes)
                    .map(|c| c.to_string_lossy().into_owned())
                    .unwrap_or_else(|_| String::from_utf8_lossy(&bytes).into_owned());
                Ok(Image::Ptx(text))
            }
            Target::Cubin(_) => Ok(Image::Cubin(prog.output(
                self.lib.get_cubin_size,
                self.lib.get_cubin,
                "nvrtcGetCUBIN",
            )?)),
        }
    }

    /// Compiles one module of fused kernels.
    pub fn compile_module(&self, module: ModuleKey, target: &Target) -> Result<Image> {
        self.compile(&module.name(), &module_source(module), target)
    }

    /// Compiles one module's device loop (`<module>_loop`).
    pub fn compile_loop(&self, module: ModuleKey, target: &Target) -> Result<Image> {
        self.compile(
            &format!("{}_loop", module.name()),
            &loop_source(module),
            target,
        )
    }
}

/// The architecture to compile for on a device of compute capability
/// `device` (`major * 10 + minor`): the newest `supported` one not newer
/// than the device (PTX for it is JIT-compiled forward by the driver).
pub fn pick_arch(device: u32, supported: &[u32]) -> Option<u32> {
    supported.iter().copied().filter(|&a| a <= device).max()
}

/// An NVRTC program, destroyed on drop.
struct ProgramGuard<'a> {
    prog: Program,
    nvrtc: &'a Nvrtc,
}

impl ProgramGuard<'_> {
    fn create<'a>(nvrtc: &'a Nvrtc, src: &CStr, name: &CStr) -> Result<ProgramGuard<'a>> {
        let mut prog: Program = std::ptr::null_mut();
        // SAFETY: `prog` is valid for a write; `src` and `name` are
        // NUL-terminated; no headers are passed (count 0, null arrays).
        let code = unsafe {
            (nvrtc.lib.create_program)(
                &mut prog,
                src.as_ptr(),
                name.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        Nvrtc::check("nvrtcCreateProgram", code)?;
        Ok(ProgramGuard { prog, nvrtc })
    }

    fn log(&self) -> Result<String> {
        let bytes = self.output(
            self.nvrtc.lib.get_program_log_size,
            self.nvrtc.lib.get_program_log,
            "nvrtcGetProgramLog",
        )?;
        Ok(String::from_utf8_lossy(&bytes)
            .trim_end_matches('\0')
            .to_owned())
    }

    /// Reads one of the program's outputs through its size and copy
    /// functions.
    fn output(
        &self,
        size: unsafe extern "C" fn(Program, *mut usize) -> raw::NvrtcResult,
        get: unsafe extern "C" fn(Program, *mut c_char) -> raw::NvrtcResult,
        call: &'static str,
    ) -> Result<Vec<u8>> {
        let mut n = 0usize;
        // SAFETY: live program; `n` valid for a write.
        Nvrtc::check(call, unsafe { size(self.prog, &mut n) })?;
        let mut buf = vec![0u8; n];
        // SAFETY: `buf` has the `n` bytes NVRTC said it writes.
        Nvrtc::check(call, unsafe { get(self.prog, buf.as_mut_ptr().cast()) })?;
        Ok(buf)
    }
}

impl Drop for ProgramGuard<'_> {
    fn drop(&mut self) {
        // SAFETY: the program was created by nvrtcCreateProgram and is
        // destroyed exactly once, here.
        let code = unsafe { (self.nvrtc.lib.destroy_program)(&mut self.prog) };
        if code != 0 {
            tracing::warn!(code, "ringcc-cuda: nvrtcDestroyProgram failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_the_newest_arch_the_device_runs() {
        let s = [75, 80, 86, 89, 90, 100, 120];
        assert_eq!(pick_arch(90, &s), Some(90));
        assert_eq!(pick_arch(87, &s), Some(86));
        assert_eq!(pick_arch(130, &s), Some(120));
        assert_eq!(pick_arch(70, &s), None);
        assert_eq!(pick_arch(90, &[]), None);
    }
}
