//! A GPU rank per process on the device loop (`ncclCommInitRank` on a
//! GPU): this rank's loop memory in device memory, exported with legacy
//! CUDA IPC; both ring neighbours' opened over the store
//! ([`RegionLayout`]: the lines and FIFOs as the in-process loop lays
//! them); one persistent kernel per call, launched on the rank's stream,
//! so calls are stream-ordered and asynchronous as NCCL's.
//!
//! Not run on this project's development machines (no GPU): the same
//! exchange and the same kernel run across processes on the host fake
//! device in `tests/loop_processes.rs`; `scripts/gpu-check.sh` runs this
//! file (2 and 4 processes sharing a GPU).

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{result, CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream};
use cudarc::driver::{DevicePtr, DevicePtrMut};
use cudarc::nvrtc::Ptx;
use ringcc_comm::launch::Launch;
use ringcc_comm::store::tcp::TcpStoreServer;
use ringcc_comm::store::{PrefixStore, Store};
use ringcc_core::prim::check_start;
use ringcc_core::{Call, ChannelId, Collective, InOrderRing, Rank, ReduceOp};

use super::abi::{self, RcStatus};
use super::abort::JobAbort;
use super::gpu::{loop_ptx, HostMapped, MIN_ARCH};
use super::peers::{wait_key, Neighbour, NetLinks, NodeNet, RegionLayout, Sides};
use super::proxy::{Proxy, Region};
use crate::config::Config;
use crate::device::cuda::DeviceAlloc;
use crate::driver;
use crate::dtype::CollType;
use crate::error::{Error, Result};
use crate::ipc::cuda::{CudaExport, CudaHandle, CudaImport};
use crate::kernel::{loop_symbol, ModuleKey, LOOP_THREADS};
use crate::nvrtc::{pick_arch, Nvrtc};

/// Words of one status record; the first line of the host words is the
/// abort word's.
const STATUS_WORDS: u64 = (std::mem::size_of::<RcStatus>() / 8) as u64;
const LINE_WORDS: u64 = 16;

fn key(rank: Rank) -> String {
    format!("cuda-ipc-gpu/{}", rank.0)
}

/// One rank of a job of processes, on one GPU. See the module
/// documentation.
pub struct GpuRank {
    // Stopped first (after `Drop` synchronized the kernels): they raise
    // the abort word in `host`, and the proxy serves the staging regions
    // the table names.
    proxy: Option<Proxy>,
    job_abort: JobAbort,
    /// Splits made so far (each one's store keys are its own).
    splits: u64,
    /// How the hops between nodes travel (for the banner and `Debug`).
    between_nodes: Option<&'static str>,
    rank: Rank,
    world: u32,
    config: Config,
    layout: RegionLayout,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    // Dropped in this order: the table and the imports before our own
    // memory (after the kernels stopped: see `Drop`).
    table: DeviceAlloc,
    _prev: Option<CudaImport>,
    _next: Option<CudaImport>,
    own: CudaExport,
    host: HostMapped,
    modules: HashMap<ModuleKey, (CudaFunction, Arc<CudaModule>)>,
    arch: u32,
    seq: u64,
    poisoned: Option<String>,
    closed: bool,
    store: Arc<dyn Store>,
    /// Rank 0's built-in store, when this rank serves it (dropped last).
    _server: Option<TcpStoreServer>,
}

impl std::fmt::Debug for GpuRank {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuRank")
            .field("rank", &self.rank)
            .field("world", &self.world)
            .field("ordinal", &self.ctx.ordinal())
            .field("channels", &self.config.channels)
            .field("seq", &self.seq)
            .field("poisoned", &self.poisoned)
            .field("between_nodes", &self.between_nodes)
            .field("proxy", &self.proxy)
            .finish_non_exhaustive()
    }
}

/// Whether a hop between nodes over `t` keeps its FIFOs in `ctx`'s device
/// memory for the NIC to read and write (GPUDirect RDMA, as NCCL decides
/// it: the transport registers dma-bufs and the GPU exports them; off
/// with `RINGCC_DMABUF_ENABLE=0`, NCCL's `NCCL_DMABUF_ENABLE`); else why
/// not, for the banner.
fn gpudirect(
    ctx: &Arc<CudaContext>,
    t: &dyn ringcc_comm::transport::Transport,
) -> std::result::Result<(), String> {
    if std::env::var("RINGCC_DMABUF_ENABLE").is_ok_and(|v| v.trim() == "0") {
        return Err("RINGCC_DMABUF_ENABLE=0".into());
    }
    t.device_memory()?;
    super::gpu::DmaBufMem::supported(ctx)
}

/// The launcher's local rank (`LOCAL_RANK`, `OMPI_COMM_WORLD_LOCAL_RANK`,
/// `SLURM_LOCALID`, `MPI_LOCALRANKID`), else `rank`.
fn local_rank(rank: Rank) -> usize {
    [
        "LOCAL_RANK",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "SLURM_LOCALID",
        "MPI_LOCALRANKID",
    ]
    .iter()
    .find_map(|k| std::env::var(k).ok()?.trim().parse().ok())
    .unwrap_or(rank.0 as usize)
}

impl GpuRank {
    /// Joins the job as `rank` of `world` on GPU `ordinal`, exchanging
    /// IPC handles over `store` (every rank hands in a store reaching the
    /// same keys). Fails where the loop cannot run (compute capability
    /// below 7.0, no NVRTC architecture), or with a timeout when a
    /// neighbour does not publish its memory within `config.timeout`.
    pub fn init(
        ordinal: usize,
        rank: Rank,
        world: u32,
        store: Arc<dyn Store>,
        config: Config,
    ) -> Result<GpuRank> {
        Self::init_on_nodes(ordinal, rank, world, store, config, None)
    }

    /// [`init`](GpuRank::init) for a job on several nodes (every rank
    /// calls it with `net`): the neighbours on this rank's node over CUDA
    /// IPC as there, a neighbour on another node through staging that
    /// this rank's [`Proxy`] serves over `net`'s transports (TCP, RDMA):
    /// the hop's counters in pinned host memory, and its FIFOs — with
    /// GPUDirect RDMA, in device memory exported as a dma-buf that the
    /// NIC registers, reads and writes (where the transport takes device
    /// memory and the GPU exports dma-bufs, unless
    /// `RINGCC_DMABUF_ENABLE=0`); else in the pinned host memory too,
    /// which the loop reads and writes over PCIe. The banner says which,
    /// and why not. A node's ranks must be consecutive.
    pub fn init_on_nodes(
        ordinal: usize,
        rank: Rank,
        world: u32,
        store: Arc<dyn Store>,
        config: Config,
        net: Option<NodeNet>,
    ) -> Result<GpuRank> {
        config.validate()?;
        if world == 0 || rank.0 >= world {
            return Err(Error::RankOutOfRange { rank, ranks: world });
        }
        driver::probe()?;
        let ctx = driver::context(ordinal)?;
        let cc = driver::compute_capability(&ctx)?;
        let arch = match pick_arch(cc, &Nvrtc::get()?.supported_archs()?) {
            Some(a) if a >= MIN_ARCH => a,
            _ => {
                return Err(Error::BadConfig {
                    what: "the device loop needs compute capability 7.0 or newer",
                })
            }
        };
        let stream = ctx.new_stream().map_err(Error::driver("cuStreamCreate"))?;
        let layout = RegionLayout::new(config.channels, config.geometry)?;
        let own = CudaExport::zeroed(&ctx, layout.total())?;
        let handle = serde_json::to_vec(own.handle()).map_err(|_| Error::BadConfig {
            what: "an IPC handle that does not serialize",
        })?;
        store
            .set(&key(rank), &handle)
            .map_err(Error::comm("Store::set"))?;
        let deadline = Instant::now() + config.timeout;
        let import = |peer: Rank| -> Result<Option<CudaImport>> {
            if peer == rank {
                return Ok(None);
            }
            let what = format!("rank {}'s exported GPU loop memory", peer.0);
            let bytes = wait_key(&*store, &key(peer), deadline, &what)?;
            let h: CudaHandle = serde_json::from_slice(&bytes).map_err(|_| Error::BadConfig {
                what: "a store key that holds no CUDA IPC handle",
            })?;
            CudaImport::open(&ctx, &h, layout.total()).map(Some)
        };
        let (prev_rank, next_rank) = (
            Rank((rank.0 + world - 1) % world),
            Rank((rank.0 + 1) % world),
        );
        let links = match net {
            Some(net) => Some(net.connect(
                &*store,
                (rank, world),
                layout,
                (config.geometry, "pinned host memory"),
                deadline,
                (&|| Region::pinned(&ctx, layout.total()), &|t| {
                    Ok(match gpudirect(&ctx, t) {
                        Ok(()) => Ok(Region::device(&ctx, layout.total())?),
                        Err(why) => Err(why),
                    })
                }),
            )?),
            None => None,
        };
        let Sides {
            prev,
            inc,
            next,
            out,
        } = NetLinks::sides(links.as_ref(), import, (prev_rank, next_rank))?;
        let base = |m: &Option<CudaImport>| m.as_ref().map(CudaImport::ptr);
        let chans = layout.table_with(
            own.ptr(),
            Neighbour::of(base(&prev), inc, own.ptr()),
            Neighbour::of(base(&next), out, own.ptr()),
        );
        let bytes = std::mem::size_of_val(chans.as_slice()) as u64;
        let table = DeviceAlloc::zeroed(&ctx, bytes)?;
        // SAFETY: `table` holds `bytes` bytes; `chans` is that many bytes
        // of plain `repr(C)` words; the context is current (`zeroed`).
        unsafe { result::memcpy_htod_sync(table.ptr(), chans.as_slice()) }
            .map_err(Error::driver("cuMemcpyHtoD"))?;
        let host = HostMapped::zeroed(
            &ctx,
            (LINE_WORDS + u64::from(config.channels) * STATUS_WORDS) as usize,
        )?;
        let between_nodes = links.as_ref().and_then(NetLinks::transport);
        let gpudirect = links.as_ref().is_some_and(NetLinks::gpudirect);
        let proxy = match links {
            Some(l) => l.start(rank, Some(host.host_addr()))?,
            None => None,
        };
        match between_nodes {
            Some(t) => tracing::info!(
                rank = rank.0,
                world,
                ordinal,
                channels = config.channels,
                gpudirect,
                "ringcc-cuda: GPU rank on the device loop, CUDA IPC inside the node, \
                 {t} between nodes {}",
                if gpudirect {
                    "with GPUDirect RDMA (FIFOs in device memory, registered with the NIC)"
                } else {
                    "staged through pinned host memory (no GPUDirect RDMA)"
                }
            ),
            None => tracing::info!(
                rank = rank.0,
                world,
                ordinal,
                channels = config.channels,
                "ringcc-cuda: GPU rank on the device loop, CUDA IPC to its neighbours"
            ),
        }
        let job_abort = JobAbort::watch_also(Arc::clone(&store), rank, Some(host.host_addr()))?;
        Ok(GpuRank {
            proxy,
            job_abort,
            splits: 0,
            between_nodes,
            rank,
            world,
            config,
            layout,
            ctx,
            stream,
            table,
            _prev: prev,
            _next: next,
            own,
            host,
            modules: HashMap::new(),
            arch,
            seq: 0,
            poisoned: None,
            closed: false,
            store,
            _server: None,
        })
    }

    /// Joins the job the launcher's environment describes (rank, world
    /// size, rank 0's address: see [`Launch`]) on GPU `local rank mod
    /// devices` (`LOCAL_RANK` and its kin, else the rank); rank 0 serves
    /// the store.
    pub fn from_env(config: Config) -> Result<GpuRank> {
        let launch = Launch::from_env().map_err(Error::comm("Launch::from_env"))?;
        driver::probe()?;
        let devices = driver::device_count()?.max(1);
        let ordinal = local_rank(launch.rank) % devices;
        Self::from_launch(launch, ordinal, config)
    }

    /// Joins the job `launch` describes on GPU `ordinal`: rank 0 serves
    /// the built-in TCP store at the launch address, every rank connects.
    pub fn from_launch(launch: Launch, ordinal: usize, config: Config) -> Result<GpuRank> {
        config.validate()?;
        driver::probe()?;
        let (server, store) = launch
            .join_store(config.timeout)
            .map_err(Error::comm("Launch::join_store"))?;
        let mut g = Self::init(
            ordinal,
            launch.rank,
            launch.world_size,
            Arc::new(store),
            config,
        )?;
        g._server = server;
        Ok(g)
    }

    /// This rank.
    pub fn rank(&self) -> Rank {
        self.rank
    }

    /// Number of ranks.
    pub fn world_size(&self) -> u32 {
        self.world
    }

    /// The stream the calls are ordered on: allocate buffers and order
    /// other work there.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The first failure, if one poisoned the rank.
    pub fn failure(&self) -> Option<&str> {
        self.poisoned.as_deref()
    }

    fn function(&mut self, module: ModuleKey) -> Result<cudarc::driver::sys::CUfunction> {
        if !self.modules.contains_key(&module) {
            let code = loop_ptx(self.arch, module)?;
            let m = self
                .ctx
                .load_module(Ptx::from_src(code.as_str()))
                .map_err(Error::driver("cuModuleLoadData"))?;
            let f = m
                .load_function(&loop_symbol(module))
                .map_err(Error::driver("cuModuleGetFunction"))?;
            self.modules.insert(module, (f, m));
        }
        self.modules
            .get(&module)
            .map(|(f, _)| f.cu_function())
            .ok_or(Error::BadConfig {
                what: "module missing after load",
            })
    }

    /// AllReduce of `send` into `recv` (the same length).
    pub fn all_reduce<T: CollType>(
        &mut self,
        send: &CudaSlice<T>,
        recv: &mut CudaSlice<T>,
        op: ReduceOp,
    ) -> Result<()> {
        let call = Call::new(Collective::AllReduce, send.len() as u64, T::DTYPE, op);
        self.raw(call, send, recv)
    }

    /// Enqueues `call` on the rank's stream, reading `send` and writing
    /// `recv` (untyped views of the call's buffers: `call.dtype` says what
    /// they hold; sizes as [`Call::buffer_bytes`]). Returns once it is
    /// enqueued; failures on the device show at
    /// [`synchronize`](GpuRank::synchronize).
    pub fn raw<T>(
        &mut self,
        call: Call,
        send: &CudaSlice<T>,
        recv: &mut CudaSlice<T>,
    ) -> Result<()> {
        let plan = self.check(&call)?;
        let (ib, ob) = call.buffer_bytes(self.world);
        for (which, need, got) in [
            ("send", ib, send.num_bytes()),
            ("recv", ob, recv.num_bytes()),
        ] {
            if got < need {
                return Err(Error::BadBuffer {
                    rank: self.rank,
                    which,
                    expected: need as u64,
                    got: got as u64,
                });
            }
        }
        let stream = self.stream.clone();
        let (sp, _g1) = send.device_ptr(&stream);
        let (rp, _g2) = recv.device_ptr_mut(&stream);
        // The guards record cudarc's read/write events after the launch.
        self.launch(&call, &plan, (sp, rp))
    }

    /// Enqueues `call` in place in `buf`, laid out as NCCL's in-place
    /// calls are ([`Call::in_place_offsets`]); as [`raw`](GpuRank::raw).
    pub fn raw_in_place<T>(&mut self, call: Call, buf: &mut CudaSlice<T>) -> Result<()> {
        let plan = self.check(&call)?;
        let (ib, ob) = call.buffer_bytes(self.world);
        let e = call.elem();
        let (io, oo) = call.in_place_offsets(self.rank.0);
        let need = (io as usize * e + ib).max(oo as usize * e + ob);
        if buf.num_bytes() < need {
            return Err(Error::BadBuffer {
                rank: self.rank,
                which: "in-place",
                expected: need as u64,
                got: buf.num_bytes() as u64,
            });
        }
        let stream = self.stream.clone();
        let (p, _g) = buf.device_ptr_mut(&stream);
        self.launch(&call, &plan, (p + io * e as u64, p + oo * e as u64))
    }

    /// What the engine checks when a call starts: a live rank, a plan,
    /// and a plan that fits the FIFO.
    fn check(&self, call: &Call) -> Result<ringcc_core::Plan> {
        if let Some(cause) = &self.poisoned {
            return Err(Error::Poisoned {
                cause: cause.clone(),
            });
        }
        let plan = call
            .plan(
                self.world,
                u32::from(self.config.channels),
                self.config.chunk_bytes,
            )
            .map_err(Error::core("Plan::new"))?;
        plan.steps(ChannelId(0), self.rank, InOrderRing { ranks: self.world })
            .map_err(Error::core("Plan::steps"))?;
        check_start(&call.desc(self.seq), &plan, self.config.geometry)
            .map_err(Error::core("Machine::new"))?;
        Ok(plan)
    }

    /// Launches this rank's loop for `call` on its buffers (device
    /// addresses, bounds-checked by the caller, kept alive and ordered on
    /// the stream by the caller's guards).
    fn launch(
        &mut self,
        call: &Call,
        plan: &ringcc_core::Plan,
        (sp, rp): (u64, u64),
    ) -> Result<()> {
        let module = ModuleKey {
            dtype: call.dtype,
            op: call.desc(self.seq).op,
        };
        let f = self.function(module)?;
        if let Some(p) = &self.proxy {
            // Its slices are about to come: no idle sleep in their way.
            p.wake();
        }
        let stream = self.stream.clone();
        let mut args = super::loop_args(
            plan,
            call,
            self.seq,
            self.config.geometry,
            self.rank,
            self.config.timeout,
            (sp, rp),
            (
                self.table.ptr(),
                self.host.dev_word(LINE_WORDS),
                self.host.dev_word(0),
            ),
        );
        self.ctx
            .bind_to_thread()
            .map_err(Error::driver("cuCtxSetCurrent"))?;
        let mut params: [*mut c_void; 1] = [(&mut args as *mut abi::RcLoopArgs).cast()];
        // SAFETY: the kernel takes one `rc_loop_args` by value, which
        // `params[0]` points to until the call returns (the driver copies
        // it). Its addresses: the user buffers (bounds-checked by the
        // caller, ordered on this stream by cudarc's guards the caller
        // holds until after the launch); the channel table and this rank's loop memory (owned
        // here); the neighbours' (opened here, closed only after the
        // kernels stopped); the mapped host words. The stream is this
        // rank's, on this context, now current.
        let launched = unsafe {
            result::launch_kernel(
                f,
                (u32::from(self.config.channels), 1, 1),
                (LOOP_THREADS, 1, 1),
                0,
                stream.cu_stream(),
                &mut params,
            )
        }
        .map_err(Error::driver("cuLaunchKernel"));
        match launched {
            Ok(()) => {
                self.seq += 1;
                Ok(())
            }
            Err(e) => {
                self.poisoned.get_or_insert_with(|| e.to_string());
                Err(e)
            }
        }
    }

    fn statuses(&self) -> Vec<(Rank, ChannelId, RcStatus)> {
        (0..self.config.channels)
            .map(|c| {
                let base = (LINE_WORDS + u64::from(c) * STATUS_WORDS) as usize;
                let w = |i: usize| self.host.read(base + i);
                (self.rank, ChannelId(c), RcStatus::from_words(w))
            })
            .collect()
    }

    /// Waits (with the deadline) until the stream finished everything
    /// enqueued; reports the failure a block recorded (a timeout with
    /// what it waited for, a mismatched call), and poisons the rank on
    /// one. When the deadline passes it raises the abort word and gives
    /// the kernels as long again (at least a second) to stop.
    pub fn synchronize(&mut self) -> Result<()> {
        let timeout = self.config.timeout;
        let mut deadline = Instant::now() + timeout;
        let done = self
            .stream
            .record_event(None)
            .map_err(Error::driver("cuEventRecord"))?;
        let mut aborted = false;
        let r = loop {
            if done
                .try_is_complete()
                .map_err(Error::driver("cuEventQuery"))?
            {
                break Ok(());
            }
            let now = Instant::now();
            if now > deadline {
                if aborted {
                    break Err(Error::Timeout {
                        waiting_for: "the device loop to stop after an abort".into(),
                        after: timeout,
                    });
                }
                self.host.write(0, abi::ABORT_HOST);
                aborted = true;
                deadline = now + timeout.max(Duration::from_secs(1));
            }
            std::thread::sleep(Duration::from_micros(20));
        };
        let r = r
            .and_then(|()| {
                self.ctx
                    .check_err()
                    .map_err(Error::driver("deferred CUDA call"))
            })
            .and_then(|()| match super::status_error(self.statuses(), timeout) {
                Some(e) => Err(e),
                None if aborted => Err(Error::Timeout {
                    waiting_for: "the device loop to finish the enqueued calls (aborted)".into(),
                    after: timeout,
                }),
                None => Ok(()),
            });
        // A loop stopped by the job's abort or by its proxy: that is the
        // cause.
        let r = match (r, self.job_abort.aborted()) {
            (Err(_), Some(source)) => Err(Error::Comm {
                call: "the job's abort",
                source,
            }),
            (r, _) => r,
        };
        let r = match (r, self.proxy.as_ref().and_then(Proxy::failure)) {
            (Err(Error::Poisoned { .. }), Some(f)) => Err(Error::Poisoned {
                cause: format!("the network proxy failed: {f}"),
            }),
            (r, _) => r,
        };
        if let Err(e) = &r {
            self.poisoned.get_or_insert_with(|| e.to_string());
        }
        r
    }

    /// Finishes the enqueued calls, then waits (bounded) in the store
    /// until every rank has, so no neighbour's memory is freed while a
    /// kernel may still write it; reports the first failure.
    pub fn close(mut self) -> Result<()> {
        self.closed = true;
        let finished = self.synchronize();
        let store = Arc::clone(&self.store);
        let n = store
            .add("cuda-ipc-gpu/closed", 1)
            .map_err(Error::comm("Store::add"))?;
        let deadline = Instant::now() + self.config.timeout;
        let mut all = n >= i64::from(self.world);
        while !all && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
            all = store
                .add("cuda-ipc-gpu/closed", 0)
                .map_err(Error::comm("Store::add"))?
                >= i64::from(self.world);
        }
        finished?;
        if !all {
            return Err(Error::Timeout {
                waiting_for: "every rank to close".into(),
                after: self.config.timeout,
            });
        }
        Ok(())
    }

    /// Aborts the job (`ncclCommAbort`): this rank's loops stop at once,
    /// every other rank's within [`WATCH_EVERY`](super::abort::WATCH_EVERY)
    /// of the notice this posts in the store; their calls then fail with
    /// the abort (naming this rank and `reason`) and the ranks take no
    /// more calls.
    pub fn abort(&mut self, reason: &str) -> Result<()> {
        let r = self.job_abort.abort(reason);
        self.poisoned
            .get_or_insert_with(|| format!("rank {} aborted: {reason}", self.rank.0));
        r
    }

    /// Splits the job (`ncclCommSplit`): every rank calls it (splits in
    /// the same order on every rank); the ranks that give the same
    /// `color` form a new `GpuRank` on this rank's GPU, ranked by `key`,
    /// then by rank; `None` for a rank without a color. The new group
    /// reaches its members over CUDA IPC, so they must share a node (a
    /// group across nodes is made with [`init_on_nodes`](GpuRank::init_on_nodes)).
    pub fn split(&mut self, color: Option<u32>, key: u32) -> Result<Option<GpuRank>> {
        let n = self.splits;
        self.splits += 1;
        let deadline = Instant::now() + self.config.timeout;
        let ours: Arc<dyn Store> =
            Arc::new(PrefixStore::new(Arc::clone(&self.store), "cuda-ipc-gpu"));
        let Some(place) =
            ringcc_comm::split_place(&*ours, n, (self.rank, self.world), (color, key), deadline)
                .map_err(Error::comm("split_place"))?
        else {
            return Ok(None);
        };
        let store = Arc::new(PrefixStore::new(ours, place.prefix));
        let ordinal = self.ctx.ordinal();
        GpuRank::init(ordinal, place.rank, place.world, store, self.config).map(Some)
    }

    /// `(recv_next, send_next)` of channel `c`: what the loop keeps in
    /// this rank's memory between calls.
    pub fn link_state(&self, c: u8) -> Result<(u64, u64)> {
        let mut w = [0u64; 2];
        self.ctx
            .bind_to_thread()
            .map_err(Error::driver("cuCtxSetCurrent"))?;
        // SAFETY: the two words at `state(c)` lie inside this rank's loop
        // memory (the layout's offsets); `w` holds 16 bytes.
        unsafe { result::memcpy_dtoh_sync(&mut w, self.own.ptr() + self.layout.state(c)) }
            .map_err(Error::driver("cuMemcpyDtoH"))?;
        Ok((w[0], w[1]))
    }
}

impl Drop for GpuRank {
    /// Best effort: the kernels must stop before the memory goes.
    fn drop(&mut self) {
        if self.closed {
            return;
        }
        if let Err(e) = self.synchronize() {
            tracing::error!(error = %e, "ringcc-cuda: GPU rank dropped with unfinished work");
        }
    }
}
