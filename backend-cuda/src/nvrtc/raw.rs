//! Raw NVRTC entry points, resolved from a library loaded at run time.

use std::ffi::{c_char, c_int, c_void};

use libloading::Library;

use crate::error::{Error, Result};

/// `nvrtcProgram`.
pub type Program = *mut c_void;
/// `nvrtcResult` (0 = `NVRTC_SUCCESS`).
pub type NvrtcResult = c_int;

/// The NVRTC functions this crate calls. Valid while `_lib` lives.
#[derive(Debug)]
pub struct NvrtcLib {
    pub version: unsafe extern "C" fn(*mut c_int, *mut c_int) -> NvrtcResult,
    pub get_num_supported_archs: unsafe extern "C" fn(*mut c_int) -> NvrtcResult,
    pub get_supported_archs: unsafe extern "C" fn(*mut c_int) -> NvrtcResult,
    pub create_program: unsafe extern "C" fn(
        *mut Program,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> NvrtcResult,
    pub destroy_program: unsafe extern "C" fn(*mut Program) -> NvrtcResult,
    pub compile_program: unsafe extern "C" fn(Program, c_int, *const *const c_char) -> NvrtcResult,
    pub get_ptx_size: unsafe extern "C" fn(Program, *mut usize) -> NvrtcResult,
    pub get_ptx: unsafe extern "C" fn(Program, *mut c_char) -> NvrtcResult,
    pub get_cubin_size: unsafe extern "C" fn(Program, *mut usize) -> NvrtcResult,
    pub get_cubin: unsafe extern "C" fn(Program, *mut c_char) -> NvrtcResult,
    pub get_program_log_size: unsafe extern "C" fn(Program, *mut usize) -> NvrtcResult,
    pub get_program_log: unsafe extern "C" fn(Program, *mut c_char) -> NvrtcResult,
    _lib: Library,
}

macro_rules! sym {
    ($lib:expr, $name:literal) => {{
        // SAFETY: the symbol is NVRTC's public C function of that name; its
        // type is the one declared in `nvrtc.h` (and in `NvrtcLib`). The
        // pointer is copied out and used only while the library is loaded
        // (it is stored beside the `Library` that owns it).
        let s = unsafe { $lib.get(concat!($name, "\0").as_bytes()) }.map_err(|source| {
            Error::NvrtcSymbol {
                symbol: $name,
                source,
            }
        })?;
        *s
    }};
}

impl NvrtcLib {
    /// Loads NVRTC from `path` (a file path or a library name the dynamic
    /// loader resolves).
    pub fn open(path: &str) -> std::result::Result<Result<NvrtcLib>, libloading::Error> {
        // SAFETY: loading NVRTC runs its initializers, which have no
        // preconditions; the handle is kept for as long as the function
        // pointers taken from it.
        let lib = unsafe { Library::new(path) }?;
        Ok(Self::resolve(lib))
    }

    fn resolve(lib: Library) -> Result<NvrtcLib> {
        Ok(NvrtcLib {
            version: sym!(lib, "nvrtcVersion"),
            get_num_supported_archs: sym!(lib, "nvrtcGetNumSupportedArchs"),
            get_supported_archs: sym!(lib, "nvrtcGetSupportedArchs"),
            create_program: sym!(lib, "nvrtcCreateProgram"),
            destroy_program: sym!(lib, "nvrtcDestroyProgram"),
            compile_program: sym!(lib, "nvrtcCompileProgram"),
            get_ptx_size: sym!(lib, "nvrtcGetPTXSize"),
            get_ptx: sym!(lib, "nvrtcGetPTX"),
            get_cubin_size: sym!(lib, "nvrtcGetCUBINSize"),
            get_cubin: sym!(lib, "nvrtcGetCUBIN"),
            get_program_log_size: sym!(lib, "nvrtcGetProgramLogSize"),
            get_program_log: sym!(lib, "nvrtcGetProgramLog"),
            _lib: lib,
        })
    }
}
