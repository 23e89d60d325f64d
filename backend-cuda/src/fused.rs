//! The fused kernels of one (type, op) module, loaded on one device:
//! compiled by NVRTC on first use (PTX cached per architecture), launched
//! one slice at a time. The progress loop launches them through the
//! [`Device`](crate::device::Device); [`FusedModule::launch`] is the
//! checked entry point for benchmarks and for users who run slices
//! themselves.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{
    result, sys, CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr,
    DevicePtrMut,
};
use cudarc::nvrtc::Ptx;
use ringcc_core::Primitive;

use crate::driver;
use crate::error::{Error, Result};
use crate::kernel::{primitive_index, KernelKey, LaunchGeometry, ModuleKey, PRIMITIVES};
use crate::nvrtc::{pick_arch, Image, Nvrtc, Target};

type PtxCache = Mutex<HashMap<(u32, ModuleKey), Arc<String>>>;

fn ptx_cache() -> &'static PtxCache {
    static CACHE: OnceLock<PtxCache> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(HashMap::new()))
}

/// PTX of `module` for `arch`, compiled once per process.
pub fn ptx(arch: u32, module: ModuleKey) -> Result<Arc<String>> {
    if let Some(p) = ptx_cache()
        .lock()
        .ok()
        .and_then(|c| c.get(&(arch, module)).cloned())
    {
        return Ok(p);
    }
    let started = std::time::Instant::now();
    let ptx = match Nvrtc::get()?.compile_module(module, &Target::Ptx(arch))? {
        Image::Ptx(p) => Arc::new(p),
        Image::Cubin(_) => {
            return Err(Error::BadConfig {
                what: "NVRTC returned a cubin for a PTX target",
            })
        }
    };
    tracing::debug!(module = %module.name(), arch, ms = started.elapsed().as_millis() as u64, "ringcc-cuda: compiled");
    if let Ok(mut c) = ptx_cache().lock() {
        c.insert((arch, module), ptx.clone());
    }
    Ok(ptx)
}

/// See the module documentation.
#[derive(Debug)]
pub struct FusedModule {
    key: ModuleKey,
    max_blocks: u32,
    functions: Vec<CudaFunction>,
    _module: Arc<CudaModule>,
}

impl FusedModule {
    /// Compiles (or takes from the cache) and loads `key`'s kernels in
    /// `ctx`; grids are capped at `waves` blocks per multiprocessor.
    pub fn load(ctx: &Arc<CudaContext>, key: ModuleKey, waves: u32) -> Result<FusedModule> {
        let cc = driver::compute_capability(ctx)?;
        let sms = driver::multiprocessors(ctx)?;
        let arch = pick_arch(cc, &Nvrtc::get()?.supported_archs()?).ok_or(Error::BadConfig {
            what: "NVRTC supports no architecture this device runs",
        })?;
        let code = ptx(arch, key)?;
        let module = ctx
            .load_module(Ptx::from_src(code.as_str()))
            .map_err(Error::driver("cuModuleLoadData"))?;
        let mut functions = Vec::with_capacity(PRIMITIVES.len());
        for primitive in PRIMITIVES {
            let name = KernelKey {
                primitive,
                module: key,
            }
            .symbol()
            .unwrap_or_default();
            functions.push(
                module
                    .load_function(&name)
                    .map_err(Error::driver("cuModuleGetFunction"))?,
            );
        }
        Ok(FusedModule {
            key,
            max_blocks: LaunchGeometry::max_blocks_for(sms, waves),
            functions,
            _module: module,
        })
    }

    /// The module's (type, op).
    pub fn key(&self) -> ModuleKey {
        self.key
    }

    /// The largest grid a launch uses.
    pub fn max_blocks(&self) -> u32 {
        self.max_blocks
    }

    /// Launches `primitive` on raw device addresses (0 for the buffers the
    /// primitive does not use).
    ///
    /// # Safety
    /// Every address the primitive uses must point to `count` elements of
    /// device memory valid for the launch's duration on `stream`, readable
    /// (recv, input) or writable (output, send) by this device, and the
    /// stream must belong to the module's context (which must be current).
    pub(crate) unsafe fn launch_raw(
        &self,
        stream: sys::CUstream,
        primitive: Primitive,
        mut ptrs: [u64; 4],
        count: u64,
        nranks: u32,
    ) -> Result<()> {
        let f = primitive_index(primitive)
            .and_then(|i| self.functions.get(i))
            .ok_or(Error::BadConfig {
                what: "a primitive no plan emits",
            })?;
        let elem = u64::from(self.key.dtype.size());
        let Some(g) = LaunchGeometry::for_slice(count, elem, self.max_blocks) else {
            return Ok(());
        };
        let (mut n, mut nranks) = (count, nranks);
        let [p0, p1, p2, p3] = &mut ptrs;
        let mut params: [*mut c_void; 6] = [
            (p0 as *mut u64).cast(),
            (p1 as *mut u64).cast(),
            (p2 as *mut u64).cast(),
            (p3 as *mut u64).cast(),
            (&mut n as *mut u64).cast(),
            (&mut nranks as *mut u32).cast(),
        ];
        // SAFETY: the kernel takes (4 pointers, u64, u32), the six values
        // `params` points to, which live until the call returns (the driver
        // copies them); the caller vouches for the addresses and stream.
        unsafe {
            result::launch_kernel(
                f.cu_function(),
                (g.grid, 1, 1),
                (g.block, 1, 1),
                0,
                stream,
                &mut params,
            )
        }
        .map_err(Error::driver("cuLaunchKernel"))
    }

    /// Launches `primitive` on `count` elements of the given byte buffers
    /// (each `None` exactly when the primitive does not use it; each at
    /// least `count` elements long), on `stream`.
    #[allow(clippy::too_many_arguments)]
    pub fn launch(
        &self,
        stream: &CudaStream,
        primitive: Primitive,
        recv: Option<&CudaSlice<u8>>,
        input: Option<&CudaSlice<u8>>,
        output: Option<&mut CudaSlice<u8>>,
        send: Option<&mut CudaSlice<u8>>,
        count: u64,
        nranks: u32,
    ) -> Result<()> {
        let bytes = count.saturating_mul(u64::from(self.key.dtype.size()));
        let uses = [
            primitive.contains(Primitive::RECV),
            primitive.reads_input(),
            primitive.contains(Primitive::COPY),
            primitive.contains(Primitive::SEND),
        ];
        let given = [
            recv.is_some(),
            input.is_some(),
            output.is_some(),
            send.is_some(),
        ];
        if uses != given {
            return Err(Error::BadConfig {
                what: "buffers do not match the primitive",
            });
        }
        let lens = [
            recv.map(|s| s.num_bytes()),
            input.map(|s| s.num_bytes()),
            output.as_ref().map(|s| s.num_bytes()),
            send.as_ref().map(|s| s.num_bytes()),
        ];
        for len in lens.into_iter().flatten() {
            if (len as u64) < bytes {
                return Err(Error::OutOfBounds {
                    buffer: "slice".to_owned(),
                    offset: 0,
                    len: bytes,
                    capacity: len as u64,
                });
            }
        }
        let (r, _g0) = recv.map(|s| s.device_ptr(stream)).unzip();
        let (i, _g1) = input.map(|s| s.device_ptr(stream)).unzip();
        let (o, _g2) = output.map(|s| s.device_ptr_mut(stream)).unzip();
        let (s, _g3) = send.map(|s| s.device_ptr_mut(stream)).unzip();
        let ptrs = [r, i, o, s].map(|p| p.unwrap_or(0));
        stream
            .context()
            .bind_to_thread()
            .map_err(Error::driver("cuCtxSetCurrent"))?;
        // SAFETY: every used pointer comes from a live slice of at least
        // `count` elements, ordered on `stream` by cudarc's guards (held
        // until after the launch); the stream's context is current.
        unsafe { self.launch_raw(stream.cu_stream(), primitive, ptrs, count, nranks) }
    }
}
