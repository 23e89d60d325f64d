//! Legacy CUDA IPC, the checked and RAII layers over cudarc's raw
//! bindings: device memory allocated here and exported
//! (`cuIpcGetMemHandle`), and a peer process's allocation opened
//! (`cuIpcOpenMemHandle`, with lazy peer access) and closed on drop
//! (`cuIpcCloseMemHandle`). The handle travels as 64 bytes in hex.
//!
//! Not run on this project's development machines (no GPU);
//! `scripts/gpu-check.sh` runs it (the multi-process GPU tests).

use std::sync::Arc;

use cudarc::driver::{sys, CudaContext};

use crate::device::cuda::DeviceAlloc;
use crate::error::{Error, Result};

/// Bytes of a legacy IPC handle.
pub const HANDLE_BYTES: usize = 64;

/// A legacy IPC handle as text (hex), with the allocation's size.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CudaHandle {
    /// `CUipcMemHandle`'s 64 bytes, hex.
    pub hex: String,
    /// Bytes of the allocation.
    pub bytes: u64,
}

impl CudaHandle {
    fn raw(&self) -> Result<sys::CUipcMemHandle> {
        let bad = Error::BadConfig {
            what: "an IPC handle that is not 64 bytes of hex",
        };
        if self.hex.len() != 2 * HANDLE_BYTES {
            return Err(bad);
        }
        let mut h = sys::CUipcMemHandle {
            reserved: [0; HANDLE_BYTES],
        };
        for (i, b) in h.reserved.iter_mut().enumerate() {
            let pair = self.hex.get(2 * i..2 * i + 2).ok_or(Error::BadConfig {
                what: "an IPC handle that is not 64 bytes of hex",
            })?;
            *b = u8::from_str_radix(pair, 16).map_err(|_| Error::BadConfig {
                what: "an IPC handle that is not 64 bytes of hex",
            })? as std::ffi::c_char;
        }
        Ok(h)
    }
}

/// Device memory of this process, zeroed and exported.
#[derive(Debug)]
pub struct CudaExport {
    alloc: DeviceAlloc,
    handle: CudaHandle,
}

impl CudaExport {
    /// `bytes` of zeroed device memory in `ctx`, with its IPC handle.
    pub fn zeroed(ctx: &Arc<CudaContext>, bytes: u64) -> Result<CudaExport> {
        let alloc = DeviceAlloc::zeroed(ctx, bytes)?;
        let mut h = sys::CUipcMemHandle {
            reserved: [0; HANDLE_BYTES],
        };
        // SAFETY: `alloc.ptr()` is the base of a live cuMemAlloc
        // allocation in the current context (`zeroed` bound it); `h` is
        // valid for a write.
        unsafe { sys::cuIpcGetMemHandle(&mut h, alloc.ptr()) }
            .result()
            .map_err(Error::driver("cuIpcGetMemHandle"))?;
        let hex = h
            .reserved
            .iter()
            .map(|&b| format!("{:02x}", b as u8))
            .collect();
        Ok(CudaExport {
            alloc,
            handle: CudaHandle { hex, bytes },
        })
    }

    /// The device address.
    pub fn ptr(&self) -> u64 {
        self.alloc.ptr()
    }

    /// The handle a peer process opens it with.
    pub fn handle(&self) -> &CudaHandle {
        &self.handle
    }
}

/// A peer process's device memory, opened in `ctx`; closed on drop.
#[derive(Debug)]
pub struct CudaImport {
    ptr: sys::CUdeviceptr,
    ctx: Arc<CudaContext>,
}

impl CudaImport {
    /// Opens `handle` in `ctx`, which must be at least `min_bytes` long.
    pub fn open(ctx: &Arc<CudaContext>, handle: &CudaHandle, min_bytes: u64) -> Result<CudaImport> {
        if handle.bytes < min_bytes {
            return Err(Error::BadConfig {
                what: "a peer's exported memory is smaller than the layout needs",
            });
        }
        let raw = handle.raw()?;
        ctx.bind_to_thread()
            .map_err(Error::driver("cuCtxSetCurrent"))?;
        let mut ptr: sys::CUdeviceptr = 0;
        let flags = sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as std::ffi::c_uint;
        // SAFETY: the context is current; `ptr` is valid for a write; the
        // handle came from a peer's cuIpcGetMemHandle (a wrong one is an
        // error code, not undefined behaviour).
        unsafe { sys::cuIpcOpenMemHandle_v2(&mut ptr, raw, flags) }
            .result()
            .map_err(Error::driver("cuIpcOpenMemHandle"))?;
        Ok(CudaImport {
            ptr,
            ctx: ctx.clone(),
        })
    }

    /// The device address of the mapping.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }
}

impl Drop for CudaImport {
    fn drop(&mut self) {
        self.ctx.record_err(self.ctx.bind_to_thread());
        // SAFETY: opened by cuIpcOpenMemHandle in this context and closed
        // once; its owner synchronizes its kernels before dropping it.
        let r = unsafe { sys::cuIpcCloseMemHandle(self.ptr) }.result();
        self.ctx.record_err(r);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_round_trip_through_hex_and_bad_ones_are_refused() {
        let hex: String = (0..64u8)
            .map(|b| format!("{:02x}", b.wrapping_mul(37)))
            .collect();
        let h = CudaHandle { hex, bytes: 1 };
        let raw = h.raw().unwrap();
        for (i, &b) in raw.reserved.iter().enumerate() {
            assert_eq!(b as u8, (i as u8).wrapping_mul(37));
        }
        for bad in ["", "zz", &"0".repeat(127), &"g".repeat(128)] {
            let h = CudaHandle {
                hex: bad.to_owned(),
                bytes: 1,
            };
            assert!(matches!(h.raw(), Err(Error::BadConfig { .. })), "{bad:?}");
        }
    }
}
