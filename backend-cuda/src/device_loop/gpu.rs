//! The device loop on CUDA: its memory, its modules, one launch per rank.
//!
//! - Device memory per rank (from `cuMemAlloc`, so peer access applies):
//!   per channel four 128-byte lines — the `tail` its predecessor
//!   publishes, the predecessor's call words, the `head` its successor
//!   publishes, and its own `recv_next`/`send_next` between calls — and
//!   its channel table ([`RcChan`] per channel). The FIFOs are the
//!   communicator's (the slice path's, unused in this mode).
//! - Mapped host memory (`cuMemHostAlloc`, portable and device-mapped):
//!   the abort word and one [`RcStatus`] per (rank, channel), readable and
//!   writable by the host while the kernels run.
//!
//! Not run on this project's development machines (no GPU): the host-C++
//! tests run the same kernel source on host memory; `scripts/gpu-check.sh`
//! runs this file.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use cudarc::driver::{result, sys, CudaContext, CudaFunction, CudaModule, CudaStream};
use cudarc::nvrtc::Ptx;
use ringcc_core::fifo::FifoGeometry;
use ringcc_core::{Call, ChannelId, Plan, Rank};

use super::abi::{self, RcChan, RcStatus};
use crate::device::cuda::DeviceAlloc;
use crate::driver;
use crate::error::{Error, Result};
use crate::kernel::{loop_symbol, ModuleKey, LOOP_THREADS};
use crate::layout::{ConnId, Layout};
use crate::nvrtc::{pick_arch, Image, Nvrtc, Target};

/// Words per 128-byte line.
const LINE: u64 = 16;
/// Per channel of a rank's flag memory: tail, call words, head, state.
const TAIL: u64 = 0;
const CALL: u64 = LINE;
const HEAD: u64 = 2 * LINE;
const STATE: u64 = 3 * LINE;
const CHANNEL_WORDS: u64 = 4 * LINE;
/// Words of one status record.
const STATUS_WORDS: u64 = (std::mem::size_of::<RcStatus>() / 8) as u64;

/// The oldest architecture the loop's `ld.acquire` / `st.relaxed.sys` and
/// `%globaltimer` run on.
pub(crate) const MIN_ARCH: u32 = 70;

type LoopPtxCache = Mutex<HashMap<(u32, ModuleKey), Arc<String>>>;

fn ptx_cache() -> &'static LoopPtxCache {
    static CACHE: OnceLock<LoopPtxCache> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(HashMap::new()))
}

/// PTX of `module`'s device loop for `arch`, compiled once per process.
pub fn loop_ptx(arch: u32, module: ModuleKey) -> Result<Arc<String>> {
    if let Some(p) = ptx_cache()
        .lock()
        .ok()
        .and_then(|c| c.get(&(arch, module)).cloned())
    {
        return Ok(p);
    }
    let ptx = match Nvrtc::get()?.compile_loop(module, &Target::Ptx(arch))? {
        Image::Ptx(p) => Arc::new(p),
        Image::Cubin(_) => {
            return Err(Error::BadConfig {
                what: "NVRTC returned a cubin for a PTX target",
            })
        }
    };
    if let Ok(mut c) = ptx_cache().lock() {
        c.insert((arch, module), ptx.clone());
    }
    Ok(ptx)
}

/// Pinned host memory mapped into every context, freed on drop.
#[derive(Debug)]
pub(crate) struct HostMapped {
    host: *mut u64,
    dev: sys::CUdeviceptr,
    words: usize,
    ctx: Arc<CudaContext>,
}

// SAFETY: the allocation is plain memory owned by this value; every access
// goes through volatile reads and writes of whole words.
unsafe impl Send for HostMapped {}

impl HostMapped {
    pub(crate) fn zeroed(ctx: &Arc<CudaContext>, words: usize) -> Result<HostMapped> {
        ctx.bind_to_thread()
            .map_err(Error::driver("cuCtxSetCurrent"))?;
        let bytes = words.max(1).saturating_mul(8);
        let flags = sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP;
        // SAFETY: a context is current; the memory is zeroed below before
        // anything reads it.
        let host = unsafe { result::malloc_host(bytes, flags) }
            .map_err(Error::driver("cuMemHostAlloc"))?
            .cast::<u64>();
        let mut m = HostMapped {
            host,
            dev: 0,
            words: words.max(1),
            ctx: ctx.clone(),
        };
        // SAFETY: `host` is a fresh allocation of `bytes` bytes, 8-aligned
        // (cuMemHostAlloc returns page-aligned memory).
        unsafe { std::ptr::write_bytes(m.host, 0, m.words) };
        let mut dev: sys::CUdeviceptr = 0;
        // SAFETY: `host` was allocated with DEVICEMAP; `dev` is valid for
        // a write; flags must be 0.
        unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dev, m.host.cast::<c_void>(), 0) }
            .result()
            .map_err(Error::driver("cuMemHostGetDevicePointer"))?;
        m.dev = dev;
        Ok(m)
    }

    /// The host address of the first word.
    pub(crate) fn host_addr(&self) -> usize {
        self.host as usize
    }

    /// The device address of word `i` (0 past the end: never used).
    pub(crate) fn dev_word(&self, i: u64) -> u64 {
        if i < self.words as u64 {
            self.dev + i * 8
        } else {
            0
        }
    }

    pub(crate) fn read(&self, i: usize) -> u64 {
        if i >= self.words {
            return 0;
        }
        // SAFETY: `i` is inside the allocation; the word is aligned; the
        // device writes it concurrently, hence a volatile read of a whole
        // word (a torn value is impossible for an aligned u64).
        unsafe { std::ptr::read_volatile(self.host.add(i)) }
    }

    pub(crate) fn write(&self, i: usize, v: u64) {
        if i >= self.words {
            return;
        }
        // SAFETY: as in `read`; the device reads it concurrently.
        unsafe { std::ptr::write_volatile(self.host.add(i), v) }
    }
}

impl Drop for HostMapped {
    fn drop(&mut self) {
        self.ctx.record_err(self.ctx.bind_to_thread());
        // SAFETY: allocated by cuMemHostAlloc and freed once; the
        // communicator synchronizes (and aborts) its kernels before this.
        self.ctx
            .record_err(unsafe { result::free_host(self.host.cast::<c_void>()) });
    }
}

/// Zeroed device memory exported as a dma-buf, for a NIC to register
/// (GPUDirect RDMA: `ibv_reg_dmabuf_mr`, NCCL's way since CUDA 11.7):
/// the FIFOs of a hop between nodes, which the loop writes and reads in
/// device memory while the NIC reads and writes them over PCIe.
///
/// The exported range starts and ends on host page boundaries, as
/// dma-buf export asks; the allocation is a page larger to give it room.
#[derive(Debug)]
pub(crate) struct DmaBufMem {
    // The descriptor closes before the memory is freed.
    fd: std::os::fd::OwnedFd,
    addr: u64,
    len: u64,
    ctx: Arc<CudaContext>,
    _alloc: DeviceAlloc,
}

impl DmaBufMem {
    /// Whether `ctx`'s device exports dma-bufs (CUDA 11.7+ on a driver
    /// and GPU that can) and flushes a NIC's writes from the host
    /// ([`flush_writes`]): `Err` says why not.
    ///
    /// [`flush_writes`]: DmaBufMem::flush_writes
    pub(crate) fn supported(ctx: &Arc<CudaContext>) -> std::result::Result<(), String> {
        use sys::CUdevice_attribute::{
            CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED as DMA_BUF,
            CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS as FLUSH,
        };
        let host =
            sys::CUflushGPUDirectRDMAWritesOptions::CU_FLUSH_GPU_DIRECT_RDMA_WRITES_OPTION_HOST;
        match ctx.attribute(DMA_BUF) {
            Ok(1) => {}
            Ok(_) => return Err("the GPU or its driver exports no dma-buf".into()),
            Err(e) => return Err(format!("cuDeviceGetAttribute(DMA_BUF_SUPPORTED): {e}")),
        }
        match ctx.attribute(FLUSH) {
            Ok(o) if o & host as i32 != 0 => Ok(()),
            Ok(_) => Err("the GPU cannot flush GPUDirect RDMA writes from the host".into()),
            Err(e) => Err(format!(
                "cuDeviceGetAttribute(GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS): {e}"
            )),
        }
    }

    /// Makes every write a NIC has completed into this GPU's memory
    /// visible to its kernels (`cuFlushGPUDirectRDMAWrites`, to the
    /// owner): what the proxy does before it raises a `tail` over slices
    /// the NIC landed in device memory, as NCCL flushes a GPUDirect
    /// receive before the GPU may read it — the completion and the `tail`
    /// travel another path than the data, which PCIe does not order.
    pub(crate) fn flush_writes(ctx: &CudaContext) -> Result<()> {
        use sys::CUflushGPUDirectRDMAWritesScope::CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TO_OWNER as OWNER;
        use sys::CUflushGPUDirectRDMAWritesTarget::CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TARGET_CURRENT_CTX as CTX;
        ctx.bind_to_thread()
            .map_err(Error::driver("cuCtxSetCurrent"))?;
        // SAFETY: a context is current on this thread; the call takes no
        // pointers.
        unsafe { sys::cuFlushGPUDirectRDMAWrites(CTX, OWNER) }
            .result()
            .map_err(Error::driver("cuFlushGPUDirectRDMAWrites"))
    }

    /// The context the memory belongs to.
    pub(crate) fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// `len` zeroed bytes of `ctx`'s device memory, exported.
    pub(crate) fn zeroed(ctx: &Arc<CudaContext>, len: u64) -> Result<DmaBufMem> {
        use std::os::fd::FromRawFd;
        const PAGE: u64 = 4096;
        let rounded = len.max(1).next_multiple_of(PAGE);
        let alloc = DeviceAlloc::zeroed(ctx, rounded + PAGE)?;
        let addr = alloc.ptr().next_multiple_of(PAGE);
        let size = usize::try_from(rounded).map_err(|_| Error::BadConfig {
            what: "a FIFO region beyond the address space",
        })?;
        let mut fd: std::ffi::c_int = -1;
        // SAFETY: `[addr, addr + rounded)` lies inside `alloc` (a page of
        // room for the alignment), in this context, current since
        // `zeroed`; `fd` is valid for the int the driver writes.
        unsafe {
            sys::cuMemGetHandleForAddressRange(
                (&mut fd as *mut std::ffi::c_int).cast::<c_void>(),
                addr,
                size,
                sys::CUmemRangeHandleType::CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
                0,
            )
        }
        .result()
        .map_err(Error::driver("cuMemGetHandleForAddressRange(DMA_BUF_FD)"))?;
        if fd < 0 {
            return Err(Error::BadConfig {
                what: "cuMemGetHandleForAddressRange gave no descriptor",
            });
        }
        // SAFETY: a descriptor the driver just opened for us, owned here.
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
        Ok(DmaBufMem {
            fd,
            addr,
            len: rounded,
            ctx: Arc::clone(ctx),
            _alloc: alloc,
        })
    }

    /// The first byte's device address.
    pub(crate) fn addr(&self) -> u64 {
        self.addr
    }

    /// Bytes exported.
    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    /// The dma-buf's descriptor (the export starts at `addr`: offset 0).
    pub(crate) fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.fd.as_fd()
    }
}

/// A loaded device-loop module.
#[derive(Debug)]
struct LoopModule {
    function: CudaFunction,
    _module: Arc<CudaModule>,
}

/// The device loop's resources of one communicator; see the module
/// documentation.
#[derive(Debug)]
pub(crate) struct LoopDevice {
    layout: Layout,
    contexts: HashMap<usize, Arc<CudaContext>>,
    streams: Vec<sys::CUstream>,
    /// Kept alive for the kernels (the tables point into them).
    _flags: Vec<DeviceAlloc>,
    tables: Vec<DeviceAlloc>,
    host: HostMapped,
    modules: HashMap<(usize, ModuleKey), LoopModule>,
    arch: HashMap<usize, u32>,
    timeout: Duration,
}

impl LoopDevice {
    /// Builds the loop's memory for `layout`, whose FIFO of connection
    /// `k` is at `fifo(k)`. Fails (the caller then runs slices) where the
    /// loop cannot run: two ranks on one stream, a device older than
    /// [`MIN_ARCH`], no NVRTC architecture for it, or no peer access from
    /// a rank's device to its predecessor's (it writes the credit there).
    pub(crate) fn new(
        layout: &Layout,
        contexts: &HashMap<usize, Arc<CudaContext>>,
        user_streams: &[Arc<CudaStream>],
        timeout: Duration,
        fifo: impl Fn(ConnId) -> Option<u64>,
    ) -> Result<LoopDevice> {
        let n = layout.ranks();
        let ctx_of = |ordinal: usize| -> Result<&Arc<CudaContext>> {
            contexts.get(&ordinal).ok_or(Error::NoDevice {
                ordinal,
                count: contexts.len(),
            })
        };
        let streams: Vec<sys::CUstream> = user_streams.iter().map(|s| s.cu_stream()).collect();
        for (i, s) in streams.iter().enumerate() {
            if streams.iter().skip(i + 1).any(|t| t == s) {
                return Err(Error::BadConfig {
                    what: "the device loop needs one stream per rank",
                });
            }
        }
        let supported = Nvrtc::get()?.supported_archs()?;
        let mut arch = HashMap::new();
        for (&ordinal, ctx) in contexts {
            let cc = driver::compute_capability(ctx)?;
            match pick_arch(cc, &supported) {
                Some(a) if a >= MIN_ARCH => {
                    arch.insert(ordinal, a);
                }
                _ => {
                    return Err(Error::BadConfig {
                        what: "the device loop needs compute capability 7.0 or newer",
                    })
                }
            }
        }
        for r in (0..n).map(Rank) {
            let (a, b) = (layout.device(r)?, layout.device(layout.prev(r))?);
            if a != b {
                if !driver::can_access_peer(ctx_of(a)?, ctx_of(b)?)? {
                    return Err(Error::BadConfig {
                        what: "the device loop needs peer access to the predecessor's device",
                    });
                }
                driver::enable_peer_access(ctx_of(a)?, ctx_of(b)?)?;
            }
        }
        let channels = u64::from(layout.channels());
        let mut flags = Vec::with_capacity(n as usize);
        for r in (0..n).map(Rank) {
            flags.push(DeviceAlloc::zeroed(
                ctx_of(layout.device(r)?)?,
                channels * CHANNEL_WORDS * 8,
            )?);
        }
        let word = |r: Rank, c: u64, off: u64| -> u64 {
            flags
                .get(r.0 as usize)
                .map_or(0, |a| a.ptr() + (c * CHANNEL_WORDS + off) * 8)
        };
        let mut tables = Vec::with_capacity(n as usize);
        for r in (0..n).map(Rank) {
            let (prev, next) = (layout.prev(r), layout.next(r));
            let mut table = Vec::with_capacity(channels as usize);
            for c in 0..layout.channels() {
                let ch = ChannelId(c);
                let c = u64::from(c);
                let (recv_fifo, send_fifo) =
                    match (fifo(layout.incoming(ch, r)), fifo(layout.outgoing(ch, r))) {
                        (Some(a), Some(b)) => (a, b),
                        _ => {
                            return Err(Error::BadConfig {
                                what: "a connection without a FIFO",
                            })
                        }
                    };
                table.push(RcChan {
                    recv_tail: word(r, c, TAIL),
                    recv_head: word(prev, c, HEAD),
                    send_head: word(r, c, HEAD),
                    send_tail: word(next, c, TAIL),
                    recv_call: word(r, c, CALL),
                    send_call: word(next, c, CALL),
                    state: word(r, c, STATE),
                    recv_fifo,
                    send_fifo,
                    slot_bytes: layout.geometry().slot_bytes(),
                });
            }
            let bytes = std::mem::size_of_val(table.as_slice()) as u64;
            let ctx = ctx_of(layout.device(r)?)?;
            let alloc = DeviceAlloc::zeroed(ctx, bytes)?;
            // SAFETY: `alloc` holds `bytes` bytes; `table` is that many
            // bytes of plain `repr(C)` words; the context is current
            // (`zeroed` bound it).
            unsafe { result::memcpy_htod_sync(alloc.ptr(), table.as_slice()) }
                .map_err(Error::driver("cuMemcpyHtoD"))?;
            tables.push(alloc);
        }
        let any_ctx = contexts.values().next().ok_or(Error::BadConfig {
            what: "a communicator without a device",
        })?;
        let host = HostMapped::zeroed(
            any_ctx,
            (LINE + u64::from(n) * channels * STATUS_WORDS) as usize,
        )?;
        Ok(LoopDevice {
            layout: layout.clone(),
            contexts: contexts.clone(),
            streams,
            _flags: flags,
            tables,
            host,
            modules: HashMap::new(),
            arch,
            timeout,
        })
    }

    /// Compiles and loads `module`'s loop on every device now.
    pub(crate) fn prepare(&mut self, module: ModuleKey) -> Result<()> {
        let ordinals: Vec<usize> = self.contexts.keys().copied().collect();
        for o in ordinals {
            self.function(o, module)?;
        }
        Ok(())
    }

    fn function(&mut self, ordinal: usize, module: ModuleKey) -> Result<&CudaFunction> {
        if !self.modules.contains_key(&(ordinal, module)) {
            let ctx = self.contexts.get(&ordinal).ok_or(Error::NoDevice {
                ordinal,
                count: self.contexts.len(),
            })?;
            let arch = self.arch.get(&ordinal).copied().unwrap_or(MIN_ARCH);
            let code = loop_ptx(arch, module)?;
            let m = ctx
                .load_module(Ptx::from_src(code.as_str()))
                .map_err(Error::driver("cuModuleLoadData"))?;
            let function = m
                .load_function(&loop_symbol(module))
                .map_err(Error::driver("cuModuleGetFunction"))?;
            self.modules.insert(
                (ordinal, module),
                LoopModule {
                    function,
                    _module: m,
                },
            );
        }
        self.modules
            .get(&(ordinal, module))
            .map(|m| &m.function)
            .ok_or(Error::BadConfig {
                what: "module missing after load",
            })
    }

    /// Rank `r`'s statuses, channel by channel.
    pub(crate) fn statuses(&self) -> Vec<(Rank, ChannelId, RcStatus)> {
        let mut out = Vec::new();
        for r in 0..self.layout.ranks() {
            for c in 0..self.layout.channels() {
                let base = self.status_word(Rank(r), ChannelId(c)) as usize;
                let w = |i: usize| self.host.read(base + i);
                out.push((Rank(r), ChannelId(c), RcStatus::from_words(w)));
            }
        }
        out
    }

    /// The failure the statuses report, if any ([`super::status_error`]).
    pub(crate) fn failure(&self) -> Option<Error> {
        super::status_error(self.statuses(), self.timeout)
    }

    /// Raises the abort word: every loop stops at its next check.
    pub(crate) fn abort(&self) {
        self.host.write(0, abi::ABORT_HOST);
    }

    fn status_word(&self, r: Rank, c: ChannelId) -> u64 {
        LINE + (u64::from(r.0) * u64::from(self.layout.channels()) + u64::from(c.0)) * STATUS_WORDS
    }

    /// Enqueues rank `rank`'s loop for `call` (`plan`), call `seq`, on its
    /// stream, with its input and output at `buffers` (device addresses,
    /// bounds-checked by the caller for the plan's lengths).
    pub(crate) fn launch(
        &mut self,
        rank: Rank,
        call: &Call,
        plan: &Plan,
        seq: u64,
        buffers: (u64, u64),
    ) -> Result<()> {
        let ordinal = self.layout.device(rank)?;
        let geometry: FifoGeometry = self.layout.geometry();
        let tables = (
            self.tables.get(rank.0 as usize).map_or(0, DeviceAlloc::ptr),
            self.host.dev_word(self.status_word(rank, ChannelId(0))),
            self.host.dev_word(0),
        );
        let mut args = super::loop_args(
            plan,
            call,
            seq,
            geometry,
            rank,
            self.timeout,
            buffers,
            tables,
        );
        let stream = *self
            .streams
            .get(rank.0 as usize)
            .ok_or(Error::RankOutOfRange {
                rank,
                ranks: self.layout.ranks(),
            })?;
        let module = ModuleKey {
            dtype: call.dtype,
            op: call.desc(seq).op,
        };
        let grid = u32::from(self.layout.channels());
        let ctx = self
            .contexts
            .get(&ordinal)
            .cloned()
            .ok_or(Error::NoDevice {
                ordinal,
                count: self.contexts.len(),
            })?;
        ctx.bind_to_thread()
            .map_err(Error::driver("cuCtxSetCurrent"))?;
        let f = self.function(ordinal, module)?.cu_function();
        let mut params: [*mut c_void; 1] = [(&mut args as *mut abi::RcLoopArgs).cast()];
        // SAFETY: the kernel takes one `rc_loop_args` by value, which
        // `params[0]` points to until the call returns (the driver copies
        // it). Its addresses: the user buffers bound and bounds-checked
        // for this call and kept alive by the caller's stream ordering; the
        // channel table, flags and FIFOs this communicator owns (peer ones
        // reachable through the peer access `new` enabled); the mapped host
        // words. The stream is the rank's, on this context, now current.
        unsafe {
            result::launch_kernel(
                f,
                (grid, 1, 1),
                (LOOP_THREADS, 1, 1),
                0,
                stream,
                &mut params,
            )
        }
        .map_err(Error::driver("cuLaunchKernel"))
    }
}
