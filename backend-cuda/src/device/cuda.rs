//! The GPU [`Device`]: streams, events, FIFO memory and fused kernels of
//! one communicator, through cudarc's driver API.

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::{result, sys, CudaContext, CudaEvent, CudaStream};
use ringcc_core::{Call, Plan, Rank};

use super::{CopyOp, Device, SliceOp};
use crate::config::LaunchMode;
use crate::device_loop::gpu::LoopDevice;
use crate::device_loop::LoopLauncher;
use crate::driver;
use crate::error::{Error, Result};
use crate::fused::FusedModule;
use crate::kernel::ModuleKey;
use crate::layout::{BufId, EventId, Layout, LinkKind, MemRef, StreamId};

/// Device memory from `cuMemAlloc` (not a stream-ordered pool, so peer
/// access applies to it), freed on drop.
#[derive(Debug)]
pub(crate) struct DeviceAlloc {
    ptr: sys::CUdeviceptr,
    bytes: u64,
    ctx: Arc<CudaContext>,
}

impl DeviceAlloc {
    pub(crate) fn zeroed(ctx: &Arc<CudaContext>, bytes: u64) -> Result<DeviceAlloc> {
        ctx.bind_to_thread()
            .map_err(Error::driver("cuCtxSetCurrent"))?;
        let n = usize::try_from(bytes).map_err(|_| Error::BadConfig {
            what: "allocation larger than the address space",
        })?;
        // SAFETY: the context is current; the size is non-negative.
        let ptr = unsafe { result::malloc_sync(n.max(1)) }.map_err(Error::driver("cuMemAlloc"))?;
        let a = DeviceAlloc {
            ptr,
            bytes,
            ctx: ctx.clone(),
        };
        // SAFETY: `ptr` is a fresh allocation of at least `n` bytes.
        unsafe { result::memset_d8_sync(ptr, 0, n) }.map_err(Error::driver("cuMemsetD8"))?;
        Ok(a)
    }

    /// The device address.
    pub(crate) fn ptr(&self) -> sys::CUdeviceptr {
        self.ptr
    }
}

impl Drop for DeviceAlloc {
    fn drop(&mut self) {
        self.ctx.record_err(self.ctx.bind_to_thread());
        // SAFETY: allocated by cuMemAlloc in this context and freed once;
        // the communicator synchronizes its streams before dropping it.
        self.ctx.record_err(unsafe { result::free_sync(self.ptr) });
    }
}

/// One GPU of the communicator.
#[derive(Debug)]
pub(crate) struct Gpu {
    pub(crate) ctx: Arc<CudaContext>,
    waves: u32,
    modules: HashMap<ModuleKey, FusedModule>,
}

impl Gpu {
    fn module(&mut self, key: ModuleKey) -> Result<&FusedModule> {
        if !self.modules.contains_key(&key) {
            let m = FusedModule::load(&self.ctx, key, self.waves)?;
            self.modules.insert(key, m);
        }
        self.modules.get(&key).ok_or(Error::BadConfig {
            what: "module missing after load",
        })
    }
}

/// The GPUs of one communicator as one [`Device`]. See the module
/// documentation.
#[derive(Debug)]
pub(crate) struct CudaDevice {
    layout: Layout,
    gpus: HashMap<usize, Gpu>,
    streams: Vec<Arc<CudaStream>>,
    events: Vec<CudaEvent>,
    fifos: HashMap<BufId, DeviceAlloc>,
    bound: HashMap<BufId, (sys::CUdeviceptr, u64)>,
    /// The device loop's resources, when calls run on it.
    loops: Option<LoopDevice>,
}

impl CudaDevice {
    /// Builds the device: `user_streams[r]` is rank `r`'s stream (on its
    /// device). Creates the channel streams, the events and the FIFOs, and
    /// enables peer access where the layout uses it. With
    /// [`LaunchMode::Persistent`] it also builds the device loop's
    /// resources, or, where the loop cannot run, says why and runs slices.
    pub(crate) fn new(
        layout: Layout,
        contexts: HashMap<usize, Arc<CudaContext>>,
        user_streams: Vec<Arc<CudaStream>>,
        waves: u32,
        launch: LaunchMode,
        timeout: std::time::Duration,
    ) -> Result<CudaDevice> {
        let mut gpus = HashMap::new();
        for (&ordinal, ctx) in &contexts {
            gpus.insert(
                ordinal,
                Gpu {
                    ctx: ctx.clone(),
                    waves,
                    modules: HashMap::new(),
                },
            );
        }
        let ctx_of = |ordinal: usize| -> Result<&Arc<CudaContext>> {
            contexts.get(&ordinal).ok_or(Error::NoDevice {
                ordinal,
                count: contexts.len(),
            })
        };
        for r in 0..layout.ranks() {
            let r = ringcc_core::Rank(r);
            if layout.link(r) == LinkKind::Direct {
                let (a, b) = (layout.device(r)?, layout.device(layout.next(r))?);
                if a != b {
                    driver::enable_peer_access(ctx_of(a)?, ctx_of(b)?)?;
                }
            }
        }
        let mut streams = user_streams;
        for c in 0..layout.channels() {
            for r in 0..layout.ranks() {
                let s = StreamId::Channel(ringcc_core::ChannelId(c), ringcc_core::Rank(r));
                let ctx = ctx_of(layout.stream_device(s)?)?;
                streams.push(ctx.new_stream().map_err(Error::driver("cuStreamCreate"))?);
            }
        }
        let mut events: Vec<Option<CudaEvent>> = (0..layout.events()).map(|_| None).collect();
        let mut all_events = Vec::new();
        for r in 0..layout.ranks() {
            let r = ringcc_core::Rank(r);
            all_events.push(EventId::Begin(r));
            for c in 0..layout.channels() {
                let c = ringcc_core::ChannelId(c);
                all_events.push(EventId::End(c, r));
                let k = layout.incoming(c, r);
                for s in 0..ringcc_core::fifo::STEPS as u8 {
                    let s = ringcc_core::SlotIndex(s);
                    all_events.push(EventId::Written(k, s));
                    all_events.push(EventId::Read(k, s));
                }
            }
        }
        for e in all_events {
            let ctx = ctx_of(layout.event_device(e)?)?;
            events[layout.event_index(e)] = Some(
                ctx.new_event(None)
                    .map_err(Error::driver("cuEventCreate"))?,
            );
        }
        let events: Vec<CudaEvent> = events.into_iter().flatten().collect();
        if events.len() != layout.events() {
            return Err(Error::BadConfig {
                what: "event table incomplete",
            });
        }
        let bytes = layout.geometry().fifo_bytes();
        let mut fifos = HashMap::new();
        for k in layout.connections() {
            fifos.insert(
                BufId::Fifo(k),
                DeviceAlloc::zeroed(ctx_of(layout.buffer_device(BufId::Fifo(k))?)?, bytes)?,
            );
            if layout.link(layout.prev(k.receiver)) == LinkKind::Staged {
                let id = BufId::Staging(k);
                fifos.insert(
                    id,
                    DeviceAlloc::zeroed(ctx_of(layout.buffer_device(id)?)?, bytes)?,
                );
            }
        }
        let staged = (0..layout.ranks()).any(|r| layout.link(Rank(r)) == LinkKind::Staged);
        let loops = match launch {
            LaunchMode::Slice => None,
            LaunchMode::Persistent if staged => {
                tracing::info!(
                    "ringcc-cuda: a hop without peer access is staged; launching slices"
                );
                None
            }
            LaunchMode::Persistent => {
                let users = streams.get(..layout.ranks() as usize).unwrap_or_default();
                match LoopDevice::new(&layout, &contexts, users, timeout, |k| {
                    fifos.get(&BufId::Fifo(k)).map(DeviceAlloc::ptr)
                }) {
                    Ok(l) => Some(l),
                    Err(e) => {
                        tracing::warn!(error = %e, "ringcc-cuda: device loop unavailable; launching slices");
                        None
                    }
                }
            }
        };
        Ok(CudaDevice {
            layout,
            gpus,
            streams,
            events,
            fifos,
            bound: HashMap::new(),
            loops,
        })
    }

    /// How calls run: [`LaunchMode::Persistent`] when the device loop was
    /// built.
    pub(crate) fn launch_mode(&self) -> LaunchMode {
        if self.loops.is_some() {
            LaunchMode::Persistent
        } else {
            LaunchMode::Slice
        }
    }

    /// The device loop's resources, when calls run on it.
    pub(crate) fn loops(&self) -> Option<&LoopDevice> {
        self.loops.as_ref()
    }

    /// `len` bytes of a bound user buffer (0 when `len` is 0: nothing is
    /// accessed).
    fn user_address(&self, buf: BufId, len: u64) -> Result<u64> {
        if len == 0 {
            return Ok(0);
        }
        self.address(MemRef { buf, offset: 0 }, len)
    }

    /// Binds a rank's input and output for the next call (device
    /// addresses and byte lengths).
    pub(crate) fn bind(&mut self, rank: ringcc_core::Rank, input: (u64, u64), output: (u64, u64)) {
        self.bound.insert(BufId::Input(rank), input);
        self.bound.insert(BufId::Output(rank), output);
    }

    /// Forgets the bound user buffers.
    pub(crate) fn unbind(&mut self) {
        self.bound.clear();
    }

    /// Compiles and loads the kernels of `module` on every device now:
    /// the device loop's, or the fused kernels'.
    pub(crate) fn prepare(&mut self, module: ModuleKey) -> Result<()> {
        if let Some(l) = &mut self.loops {
            return l.prepare(module);
        }
        for d in self.gpus.values_mut() {
            d.module(module)?;
        }
        Ok(())
    }

    pub(crate) fn stream(&self, s: StreamId) -> Result<&Arc<CudaStream>> {
        self.streams
            .get(self.layout.stream_index(s))
            .ok_or(Error::BadConfig {
                what: "no such stream",
            })
    }

    /// Every channel stream.
    pub(crate) fn channel_streams(&self) -> &[Arc<CudaStream>] {
        self.streams
            .get(self.layout.ranks() as usize..)
            .unwrap_or_default()
    }

    /// The device address of `len` bytes at `m`, checked against the
    /// buffer's size.
    fn address(&self, m: MemRef, len: u64) -> Result<sys::CUdeviceptr> {
        let (base, cap) = match m.buf {
            BufId::Input(_) | BufId::Output(_) => self.bound.get(&m.buf).copied(),
            BufId::Fifo(_) | BufId::Staging(_) => self.fifos.get(&m.buf).map(|a| (a.ptr, a.bytes)),
        }
        .unwrap_or((0, 0));
        match m.offset.checked_add(len) {
            Some(end) if end <= cap && base != 0 => Ok(base + m.offset),
            _ => Err(Error::OutOfBounds {
                buffer: format!("{:?}", m.buf),
                offset: m.offset,
                len,
                capacity: cap,
            }),
        }
    }

    fn event(&self, e: EventId) -> Result<&CudaEvent> {
        self.events
            .get(self.layout.event_index(e))
            .ok_or(Error::BadConfig {
                what: "no such event",
            })
    }
}

impl Device for CudaDevice {
    fn launch(&mut self, stream: StreamId, op: &SliceOp) -> Result<()> {
        let dtype = op.kernel.module.dtype;
        let len = op.count.saturating_mul(u64::from(dtype.size()));
        if len == 0 {
            return Ok(());
        }
        let addr = |m: Option<MemRef>| -> Result<u64> {
            m.map(|m| self.address(m, len))
                .transpose()
                .map(|a| a.unwrap_or(0))
        };
        let ptrs = [
            addr(op.recv)?,
            addr(op.input)?,
            addr(op.output)?,
            addr(op.send)?,
        ];
        let device = self.layout.stream_device(stream)?;
        let s = self.stream(stream)?.clone();
        let dev = self.gpus.get_mut(&device).ok_or(Error::NoDevice {
            ordinal: device,
            count: 0,
        })?;
        dev.ctx
            .bind_to_thread()
            .map_err(Error::driver("cuCtxSetCurrent"))?;
        let module = dev.module(op.kernel.module)?;
        // SAFETY: every address was bounds-checked above for `count`
        // elements in a live allocation: the FIFOs this device owns, or the
        // user buffers bound (and borrowed) for this call. FIFO addresses on
        // another device are written only over enabled peer access (the
        // layout's Direct links). The stream belongs to this device, whose
        // context is current.
        unsafe {
            module.launch_raw(
                s.cu_stream(),
                op.kernel.primitive,
                ptrs,
                op.count,
                op.nranks,
            )
        }
    }

    fn copy(&mut self, stream: StreamId, op: &CopyOp) -> Result<()> {
        if op.bytes == 0 {
            return Ok(());
        }
        let src = self.address(op.src, op.bytes)?;
        let dst = self.address(op.dst, op.bytes)?;
        let src_ctx = self.gpu_ctx(self.layout.buffer_device(op.src.buf)?)?;
        let dst_ctx = self.gpu_ctx(self.layout.buffer_device(op.dst.buf)?)?;
        let s = self.stream(stream)?;
        s.context()
            .bind_to_thread()
            .map_err(Error::driver("cuCtxSetCurrent"))?;
        // SAFETY: both ranges were bounds-checked in live allocations of
        // their contexts; the stream is live.
        unsafe {
            result::memcpy_peer_async(
                dst_ctx.cu_ctx(),
                dst,
                src_ctx.cu_ctx(),
                src,
                op.bytes as usize,
                s.cu_stream(),
            )
        }
        .map_err(Error::driver("cuMemcpyPeerAsync"))
    }

    fn record(&mut self, stream: StreamId, event: EventId) -> Result<()> {
        let s = self.stream(stream)?;
        self.event(event)?
            .record(s)
            .map_err(Error::driver("cuEventRecord"))
    }

    fn wait(&mut self, stream: StreamId, event: EventId) -> Result<()> {
        let s = self.stream(stream)?;
        s.wait(self.event(event)?)
            .map_err(Error::driver("cuStreamWaitEvent"))
    }
}

impl CudaDevice {
    fn gpu_ctx(&self, ordinal: usize) -> Result<Arc<CudaContext>> {
        self.gpus
            .get(&ordinal)
            .map(|d| d.ctx.clone())
            .ok_or(Error::NoDevice {
                ordinal,
                count: self.gpus.len(),
            })
    }
}

impl LoopLauncher for CudaDevice {
    /// One launch per rank on its stream, after the modules are loaded
    /// everywhere. Fails first with the failure an earlier call left on
    /// the device (sticky); a launch that fails after others succeeded
    /// raises the abort word, so those stop at once.
    fn launch_loops(&mut self, seq: u64, calls: &[Call], plans: &[Plan]) -> Result<()> {
        let Some(loops) = &self.loops else {
            return Err(Error::BadConfig {
                what: "the device loop is not available on this communicator",
            });
        };
        if let Some(e) = loops.failure() {
            return Err(e);
        }
        let mut buffers = Vec::with_capacity(calls.len());
        for (r, plan) in plans.iter().enumerate() {
            let rank = Rank(r as u32);
            let elem = u64::from(plan.dtype().size());
            buffers.push((
                self.user_address(BufId::Input(rank), plan.input_len().saturating_mul(elem))?,
                self.user_address(BufId::Output(rank), plan.output_len().saturating_mul(elem))?,
            ));
        }
        let Some(loops) = &mut self.loops else {
            return Ok(());
        };
        for call in calls {
            loops.prepare(ModuleKey {
                dtype: call.dtype,
                op: call.desc(seq).op,
            })?;
        }
        for (r, ((call, plan), b)) in calls.iter().zip(plans).zip(buffers).enumerate() {
            if let Err(e) = loops.launch(Rank(r as u32), call, plan, seq, b) {
                loops.abort();
                return Err(e);
            }
        }
        Ok(())
    }
}
