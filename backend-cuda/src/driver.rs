//! The CUDA driver, checked before use.
//!
//! cudarc loads `libcuda.so.1` on the first driver call and panics if it is
//! missing; [`probe`] loads it first and turns its absence into
//! [`Error::NoDriver`]. Every entry point of this crate that touches the
//! driver calls it.

use std::sync::OnceLock;

use cudarc::driver::{result, sys, CudaContext};

use crate::error::{Error, Result};

/// Checks that the driver library loads and initializes.
pub fn probe() -> Result<()> {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: `is_culib_present` only tries to dlopen the driver library
    // under its usual names and closes what it opened.
    let present = *PRESENT.get_or_init(|| unsafe { sys::is_culib_present() });
    if !present {
        return Err(Error::NoDriver);
    }
    result::init().map_err(Error::driver("cuInit"))
}

/// Number of CUDA devices (`Err(NoDriver)` without a driver).
pub fn device_count() -> Result<usize> {
    probe()?;
    let n = result::device::get_count().map_err(Error::driver("cuDeviceGetCount"))?;
    Ok(usize::try_from(n).unwrap_or(0))
}

/// The primary context of device `ordinal`.
pub fn context(ordinal: usize) -> Result<std::sync::Arc<CudaContext>> {
    let count = device_count()?;
    if ordinal >= count {
        return Err(Error::NoDevice { ordinal, count });
    }
    CudaContext::new(ordinal).map_err(Error::driver("CudaContext::new"))
}

/// Whether device `a` can access device `b`'s memory.
pub fn can_access_peer(a: &CudaContext, b: &CudaContext) -> Result<bool> {
    let mut v: std::ffi::c_int = 0;
    // SAFETY: both devices come from live contexts; `v` is valid for a
    // write.
    unsafe { sys::cuDeviceCanAccessPeer(&mut v, a.cu_device(), b.cu_device()) }
        .result()
        .map_err(Error::driver("cuDeviceCanAccessPeer"))?;
    Ok(v != 0)
}

/// Lets kernels of context `from` access memory of context `to`. Enabling
/// twice is not an error.
pub fn enable_peer_access(from: &CudaContext, to: &CudaContext) -> Result<()> {
    from.bind_to_thread()
        .map_err(Error::driver("cuCtxSetCurrent"))?;
    // SAFETY: `to` is a live context; flags must be 0.
    match unsafe { sys::cuCtxEnablePeerAccess(to.cu_ctx(), 0) }.result() {
        Ok(()) => Ok(()),
        Err(e) if e.0 == sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => Ok(()),
        Err(e) => Err(Error::driver("cuCtxEnablePeerAccess")(e)),
    }
}

/// Compute capability as `major * 10 + minor`.
pub fn compute_capability(ctx: &CudaContext) -> Result<u32> {
    let (a, b) = ctx
        .compute_capability()
        .map_err(Error::driver("cuDeviceGetAttribute(COMPUTE_CAPABILITY)"))?;
    Ok(u32::try_from(a * 10 + b).unwrap_or(0))
}

/// The device's multiprocessor count.
pub fn multiprocessors(ctx: &CudaContext) -> Result<u32> {
    let n = ctx
        .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        .map_err(Error::driver("cuDeviceGetAttribute(MULTIPROCESSOR_COUNT)"))?;
    Ok(u32::try_from(n).unwrap_or(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a machine without the driver, every entry point answers
    /// `NoDriver` instead of aborting; with one, they work.
    #[test]
    fn no_driver_is_an_error_not_a_panic() {
        match device_count() {
            Err(Error::NoDriver) => {
                assert!(matches!(context(0), Err(Error::NoDriver)));
                assert!(matches!(probe(), Err(Error::NoDriver)));
            }
            Ok(n) => assert!(matches!(context(n), Err(Error::NoDevice { .. }))),
            Err(e) => eprintln!("driver present but unusable: {e}"),
        }
    }
}
