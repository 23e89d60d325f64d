//! The device loop's network proxy: ring hops between nodes, staged
//! through host memory.
//!
//! Inside a node a rank's loop writes its successor's FIFO directly
//! (CUDA IPC). A successor on another node has no memory the loop can
//! reach, so, as NCCL's proxy thread does without GPUDirect RDMA, the hop
//! goes through **host memory both ends can see**: the loop's channel
//! table points the outgoing FIFO, `tail` and call words into a
//! [`Region`] of host memory (pinned and mapped into the device on a GPU),
//! and the host's proxy thread ships each slice the loop publishes there
//! over the hop's transport (TCP or RDMA, the communicator's
//! [`SendEnd`]), and returns the successor's credit into the region's
//! `head`, where the loop waits for it. On the receiving node each
//! arriving slice lands in the loop's incoming region, and the proxy
//! publishes the call words and `tail` after it; the loop's `head` there
//! goes back to the sender as credit. The device is never stalled on the
//! network: it reads and writes the pinned regions over PCIe while the
//! previous slices travel (the FIFO's eight steps are the overlap).
//!
//! **No CPU copy on the way** (as NCCL's proxy without GPUDirect: the NIC
//! reads and writes the host FIFOs the GPU uses). Each region's FIFO of a
//! channel is lent to that channel's end when the hop is connected
//! ([`FifoMemory`], `Transport::listen_in` / `connect_from`): RDMA
//! registers it, so the predecessor's NIC writes arrivals straight into
//! the loop's incoming FIFO and this NIC's writes gather each slice from
//! the loop's outgoing one — the proxy only posts the requests and moves
//! the counters. TCP, which cannot take the memory, reads each payload
//! straight into the region's slot ([`Landing`]) and sends from the
//! region (`SendEnd::post_from`): one kernel copy each way, as any socket.
//! Anything else is copied, and counted ([`Proxy::copied_bytes`]).
//!
//! **GPUDirect RDMA**: where the transport registers dma-bufs and the GPU
//! exports them, a hop's FIFOs live in device memory apart from its
//! counters (`Staging`); the NIC reads and writes them in the GPU, and
//! the proxy, which never touches a FIFO byte there, only moves the
//! counters and call words in the pinned region.
//!
//! The proxy knows each slice's length from the call itself, as NCCL's
//! proxy knows its steps: the call words the loop wrote (or the call
//! header that arrived) name the call, and [`SendSizes`] walks the core's
//! plan for the sending rank and channel, cut into slices exactly as the
//! core's `Machine` (and the generated loop) cut them.
//!
//! A transport failure (a dead peer, a malformed frame) stops the proxy
//! and raises its abort word, which the loop polls: the rank's blocks end
//! with an abort status at once rather than at their timeout.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use ringcc_comm::transport::{Bell, FifoMemory, Landing, RecvEnd, SendEnd};
use ringcc_core::fifo::{slot_of, FifoGeometry, STEPS};
use ringcc_core::plan::Steps;
use ringcc_core::prim::{slice_count, slice_range, Primitive, SlotSpan};
use ringcc_core::progress::Event;
use ringcc_core::wire::call_header::CallHeaderRepr;
use ringcc_core::{Call, CallDesc, ChannelId, InOrderRing, Protocol, Rank};

use super::abi::{pack_desc, unpack_desc};
use super::peers::RegionLayout;
use crate::error::{Error, Result};

/// What every rank's plans are made with (the loop's launch arguments).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlanShape {
    /// Ranks of the job.
    pub ranks: u32,
    /// Channels every call runs on.
    pub channels: u32,
    /// The plans' chunk size.
    pub chunk_bytes: u64,
    /// The FIFO of every connection.
    pub geometry: FifoGeometry,
}

/// The byte lengths of the slices `sender` sends on `channel` in one call,
/// in order: per step whose primitive sends, `max(1, ⌈count / slice⌉)`
/// slices of at most a FIFO slice each (an empty step sends one empty
/// slice), as the core's `Machine` cuts them.
#[derive(Debug)]
pub struct SendSizes {
    steps: Steps<InOrderRing>,
    elem: u64,
    slice_elems: u64,
    count: u64,
    slice: u64,
    slices: u64,
}

impl SendSizes {
    /// The slices of `desc` sent by `sender` on `channel`.
    pub fn new(
        desc: &CallDesc,
        shape: &PlanShape,
        channel: ChannelId,
        sender: Rank,
    ) -> Result<SendSizes> {
        let plan = Call::from(*desc)
            .plan(shape.ranks, shape.channels, shape.chunk_bytes)
            .map_err(Error::core("Plan::new"))?;
        let steps = plan
            .steps(channel, sender, InOrderRing { ranks: shape.ranks })
            .map_err(Error::core("Plan::steps"))?;
        let elem = u64::from(desc.dtype.size());
        Ok(SendSizes {
            steps,
            elem,
            slice_elems: shape.geometry.slice_bytes() / elem,
            count: 0,
            slice: 0,
            slices: 0,
        })
    }
}

impl Iterator for SendSizes {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        while self.slice >= self.slices {
            let step = self.steps.next()?;
            if !step.primitive.contains(Primitive::SEND) {
                continue;
            }
            self.count = step.count;
            self.slices = slice_count(step.count, self.slice_elems);
            self.slice = 0;
        }
        let (lo, hi) = slice_range(self.count, self.slice_elems, self.slice);
        self.slice += 1;
        usize::try_from((hi - lo) * self.elem).ok()
    }
}

/// Host memory laid out as a rank's loop memory ([`RegionLayout`]) that a
/// hop between nodes is staged through; the loop reaches it at
/// [`addr`](Region::addr), the proxy at its host address.
pub struct Region {
    host: usize,
    addr: u64,
    len: u64,
    mem: RegionMem,
}

enum RegionMem {
    /// Host memory the host-emulated loop uses directly.
    Host(#[allow(dead_code)] Box<[u128]>),
    /// Pinned host memory mapped into a GPU.
    #[allow(dead_code)]
    Pinned(super::gpu::HostMapped),
    /// Device memory exported as a dma-buf (GPUDirect RDMA): only a NIC
    /// and the loop touch it, never the CPU.
    Device(super::gpu::DmaBufMem),
}

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Region")
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

impl Region {
    /// `len` zeroed bytes of host memory that the loop reaches at the same
    /// address (the host fake device).
    pub fn host(len: u64) -> Result<Region> {
        let words = usize::try_from(len.div_ceil(16))
            .map_err(|_| Error::BadConfig {
                what: "a staging region beyond memory",
            })?
            .max(1);
        let mem: Box<[u128]> = vec![0u128; words].into_boxed_slice();
        let host = mem.as_ptr() as usize;
        Ok(Region {
            host,
            addr: host as u64,
            len,
            mem: RegionMem::Host(mem),
        })
    }

    /// `len` zeroed bytes of pinned host memory mapped into `ctx`'s device.
    pub(crate) fn pinned(ctx: &Arc<cudarc::driver::CudaContext>, len: u64) -> Result<Region> {
        let words = usize::try_from(len.div_ceil(8)).map_err(|_| Error::BadConfig {
            what: "a staging region beyond memory",
        })?;
        let m = super::gpu::HostMapped::zeroed(ctx, words)?;
        Ok(Region {
            host: m.host_addr(),
            addr: m.dev_word(0),
            len,
            mem: RegionMem::Pinned(m),
        })
    }

    /// `len` zeroed bytes of `ctx`'s device memory, exported as a dma-buf
    /// for a NIC to register (GPUDirect RDMA): the FIFOs of a hop between
    /// nodes, apart from its words ([`Staging`]).
    pub(crate) fn device(ctx: &Arc<cudarc::driver::CudaContext>, len: u64) -> Result<Region> {
        let m = super::gpu::DmaBufMem::zeroed(ctx, len)?;
        Ok(Region {
            host: 0,
            addr: m.addr(),
            len: m.len(),
            mem: RegionMem::Device(m),
        })
    }

    /// Where the loop reaches it.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Whether it is device memory (the CPU never touches it).
    pub(crate) fn on_device(&self) -> bool {
        matches!(self.mem, RegionMem::Device(_))
    }

    /// Channel `c`'s FIFO of `layout`, to lend a transport's end: its
    /// NIC then lands arrivals in it, or sends slices from it, in place.
    pub(crate) fn fifo(&self, layout: &RegionLayout, c: u8) -> Result<FifoMemory> {
        let (at, len) = (layout.fifo_offset(c), layout.fifo_bytes());
        let fits = c < layout.channels() && at.checked_add(len).is_some_and(|e| e <= self.len);
        if let (RegionMem::Device(m), true, Ok(len)) = (&self.mem, fits, usize::try_from(len)) {
            use std::os::fd::AsRawFd;
            // SAFETY: in bounds of the exported device memory, which stays
            // allocated (and its dma-buf open) until the region drops,
            // after every end it was lent (as for host memory below); the
            // loop touches the slots only as the FIFO's protocol lets the
            // end's owner.
            return Ok(unsafe { FifoMemory::dma_buf(m.fd().as_raw_fd(), at, self.addr + at, len) });
        }
        let ptr = std::ptr::NonNull::new((self.host as u64).wrapping_add(at) as usize as *mut u8);
        match (fits && !self.on_device(), ptr, usize::try_from(len)) {
            // SAFETY: in bounds of this region, whose memory stays in
            // place until it drops (a box or a pinned allocation; moving
            // the `Region` moves neither). Its owners drop every end and
            // transport it was lent before it (`NetLinks`' and `Proxy`'s
            // field order, `NodeNet::connect`'s locals), and the loop
            // touches the FIFO's slots only as the FIFO's protocol lets
            // the end's owner (it reads a slot between its tail and its
            // credit, writes one only after the successor's credit).
            (true, Some(ptr), Ok(len)) => Ok(unsafe { FifoMemory::new(ptr, len) }),
            _ => Err(Error::BadConfig {
                what: "a channel's FIFO beyond its staging region",
            }),
        }
    }

    /// The CPU's view (`None` for device memory).
    fn view(&self) -> Option<View> {
        (!self.on_device()).then_some(View {
            host: self.host,
            len: self.len,
        })
    }
}

/// Makes a NIC's writes into device memory visible to the loop.
type Flush = Arc<dyn Fn() -> Result<()> + Send + Sync>;

/// Where a hop between nodes is staged, laid out as [`RegionLayout`]: the
/// loop's words (`tail`, call words, `head`) in host memory the proxy
/// reads and writes, and the FIFOs — in the same region, or apart in
/// memory of their own (device memory a NIC registers: GPUDirect RDMA,
/// the NIC reading and writing the loop's FIFOs in the GPU).
#[derive(Debug)]
pub(crate) struct Staging {
    words: Region,
    fifos: Option<Region>,
}

impl Staging {
    /// Words and FIFOs in `words`, or the FIFOs apart in `fifos`.
    pub(crate) fn new(words: Region, fifos: Option<Region>) -> Staging {
        Staging { words, fifos }
    }

    /// The memory holding the FIFOs.
    fn fifo_region(&self) -> &Region {
        self.fifos.as_ref().unwrap_or(&self.words)
    }

    /// Where the loop reaches the words and the FIFOs.
    pub(crate) fn addrs(&self) -> (u64, u64) {
        (self.words.addr(), self.fifo_region().addr())
    }

    /// Channel `c`'s FIFO, to lend a transport's end ([`Region::fifo`]).
    pub(crate) fn fifo(&self, layout: &RegionLayout, c: u8) -> Result<FifoMemory> {
        self.fifo_region().fifo(layout, c)
    }

    /// Whether the FIFOs are in device memory.
    pub(crate) fn fifos_on_device(&self) -> bool {
        self.fifo_region().on_device()
    }

    /// For FIFOs in device memory, what makes a NIC's writes into them
    /// visible to the loop ([`DmaBufMem::flush_writes`]).
    ///
    /// [`DmaBufMem::flush_writes`]: super::gpu::DmaBufMem::flush_writes
    fn flusher(&self) -> Option<Flush> {
        match &self.fifo_region().mem {
            RegionMem::Device(m) => {
                let ctx = Arc::clone(m.context());
                Some(Arc::new(move || super::gpu::DmaBufMem::flush_writes(&ctx)))
            }
            _ => None,
        }
    }

    /// Whether the FIFOs are apart from the words.
    pub(crate) fn fifos_apart(&self) -> bool {
        self.fifos.is_some()
    }

    /// Whether both hold `layout`.
    fn holds(&self, layout: &RegionLayout) -> bool {
        self.words.len >= layout.total() && self.fifo_region().len >= layout.total()
    }
}

/// A region as the proxy thread sees it (the region outlives the thread:
/// [`Proxy`] joins it before its regions drop).
#[derive(Clone, Copy)]
struct View {
    host: usize,
    len: u64,
}

impl View {
    fn word(&self, off: u64) -> Result<&AtomicU64> {
        if !off.is_multiple_of(8) || off.checked_add(8).is_none_or(|e| e > self.len) {
            return Err(Error::BadConfig {
                what: "a region word out of bounds",
            });
        }
        // SAFETY: in bounds and 8-aligned (the region is 16-aligned); the
        // loop and the proxy access these words only atomically; the
        // memory lives as long as the proxy thread (see `View`).
        Ok(unsafe { &*((self.host + off as usize) as *const AtomicU64) })
    }

    fn bytes(&self, off: u64, len: usize) -> Result<&[u8]> {
        if off.checked_add(len as u64).is_none_or(|e| e > self.len) {
            return Err(Error::BadConfig {
                what: "a slice beyond its staging region",
            });
        }
        // SAFETY: in bounds; the loop wrote these bytes before it released
        // the tail the proxy acquired, and writes them again only after
        // the credit the proxy forwards once the slice is shipped.
        Ok(unsafe { std::slice::from_raw_parts((self.host + off as usize) as *const u8, len) })
    }

    /// `len` writable bytes at `off`: a slot a transport's end lands a
    /// payload in.
    ///
    /// # Safety
    /// Nobody else reads or writes the range while the slice lives: a
    /// slot of a step that the predecessor may send (credited), which the
    /// loop reads only after the proxy publishes the tail that covers it.
    #[allow(clippy::mut_from_ref)]
    unsafe fn bytes_mut(&self, off: u64, len: usize) -> Result<&mut [u8]> {
        if off.checked_add(len as u64).is_none_or(|e| e > self.len) {
            return Err(Error::BadConfig {
                what: "a slice beyond its staging region",
            });
        }
        // SAFETY: in bounds; the caller excludes every other access.
        Ok(unsafe { std::slice::from_raw_parts_mut((self.host + off as usize) as *mut u8, len) })
    }

    /// Copies `src` to byte `off` of the region.
    fn write(&self, off: u64, src: &[u8]) -> Result<()> {
        if off
            .checked_add(src.len() as u64)
            .is_none_or(|e| e > self.len)
        {
            return Err(Error::BadConfig {
                what: "a slice beyond its staging region",
            });
        }
        // SAFETY: in bounds; `src` is another allocation (a transport's
        // slot); the loop reads these bytes only after the tail the proxy
        // releases once they are written, and the sender reuses the slot
        // only after the loop's credit.
        unsafe {
            std::ptr::copy_nonoverlapping(
                src.as_ptr(),
                (self.host + off as usize) as *mut u8,
                src.len(),
            )
        };
        Ok(())
    }
}

/// One outgoing hop's channel: the loop's slices leave from the region.
struct Outgoing {
    c: u8,
    end: Box<dyn SendEnd>,
    /// The end sends from the region's FIFO itself (it was lent it):
    /// slices are published with `post`, nothing is copied.
    lent: bool,
    shipped: u64,
    /// The call being shipped and its remaining slices.
    call: Option<(CallDesc, SendSizes)>,
}

/// One incoming hop's channel: the predecessor's slices land in the
/// region.
struct Incoming {
    c: u8,
    end: Box<dyn RecvEnd>,
    /// The end lands arrivals in the region's FIFO itself (it was lent
    /// it): its slots are the region's.
    lent: bool,
    /// Per slot, `1 +` the step whose bytes the end landed straight in
    /// the region's slot (a stream end reading payloads where the
    /// [`Landing`] says); 0: none.
    landed: [u64; STEPS as usize],
    tail: u64,
    copied: u64,
    credited: u64,
    /// Headers not yet reached by the copy, in step order.
    headers: std::collections::VecDeque<(u64, CallDesc)>,
    call: Option<SendSizes>,
}

/// What the proxy thread works on.
struct Work {
    me: Rank,
    prev: Rank,
    shape: PlanShape,
    layout: RegionLayout,
    /// The staging words of each side.
    out: Option<View>,
    inc: Option<View>,
    /// The CPU's view of each side's FIFOs (`None` on the device: then
    /// every end of the side took them, and the proxy never touches a
    /// byte of them).
    out_fifo: Option<View>,
    inc_fifo: Option<View>,
    /// Incoming FIFOs in device memory: flushed before each `tail`.
    inc_flush: Option<Flush>,
    outgoing: Vec<Outgoing>,
    incoming: Vec<Incoming>,
    /// Bytes copied between the regions and a transport's own memory.
    copied: Arc<AtomicU64>,
}

/// Bytes of FIFOs in device memory wanted by the CPU: what
/// [`Proxy::start`] rules out (every end of such a side took its FIFO).
const DEVICE_FIFO: Error = Error::BadConfig {
    what: "a FIFO in device memory reached by the CPU",
};

/// Where a stream end (TCP) reads an incoming payload: straight into the
/// region's slot of its step, marked in `landed`, instead of a slot of
/// its own that the proxy would copy from.
struct RegionLanding<'a> {
    region: View,
    /// The channel's FIFO: its offset in the region, its bytes.
    fifo: u64,
    fifo_bytes: u64,
    slot_bytes: u64,
    landed: &'a mut [u64; STEPS as usize],
}

impl Landing for RegionLanding<'_> {
    fn dest(&mut self, _call: &CallDesc, step: u64, len: usize) -> Option<&mut [u8]> {
        let off = u64::from(slot_of(step).0) * self.slot_bytes;
        if off.checked_add(len as u64)? > self.fifo_bytes {
            return None;
        }
        let slots = (len as u64).div_ceil(self.slot_bytes.max(1));
        for k in 0..slots {
            let s = step.checked_add(k)?;
            self.landed[slot_of(s).0 as usize] = s + 1;
        }
        // SAFETY: the slots of a step the predecessor sends, which it may
        // only once the loop credited the step that held them last; the
        // loop reads them only after the tail that covers this step.
        unsafe { self.region.bytes_mut(self.fifo + off, len) }.ok()
    }
}

/// The proxy of one rank: a thread moving its hops between nodes. See
/// the module documentation.
pub struct Proxy {
    stop: Arc<AtomicBool>,
    /// Set by [`wake`](Proxy::wake): a call is coming.
    woken: Arc<AtomicBool>,
    bell: Arc<dyn Bell>,
    abort: Arc<AtomicU64>,
    failure: Arc<Mutex<Option<String>>>,
    copied: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
    // After the thread (joined in `Drop`): the memory it works on.
    out: Option<Staging>,
    inc: Option<Staging>,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy")
            .field("out", &self.out)
            .field("inc", &self.inc)
            .field("failure", &self.failure())
            .finish_non_exhaustive()
    }
}

/// Polls without news before the thread yields, and before it sleeps.
const SPIN: u32 = 64;
const YIELD: u32 = 512;
/// The longest a sleep lasts (network news rings the bell sooner)…
const NAP: Duration = Duration::from_micros(50);
/// …and, once the proxy has found nothing for [`DOZE_AFTER`] sleeps in a
/// row (a rank between calls), the longest: the rank rings the bell when
/// it launches a call ([`Proxy::wake`]), so a call does not wait for it.
const DOZE: Duration = Duration::from_millis(2);
const DOZE_AFTER: u32 = 2000;

impl Proxy {
    /// Starts the proxy of rank `me` (predecessor `prev`): `send` holds a
    /// sending end per channel when the successor is on another node
    /// (its slices are staged in `out`), `recv` a receiving end per
    /// channel when the predecessor is (its slices land in `inc`); per
    /// end, whether it was lent the region's FIFO of its channel (and
    /// took it). On failure it also raises the word at host address
    /// `abort_also` (a GPU rank's abort word in pinned memory, which must
    /// outlive the proxy).
    #[allow(clippy::too_many_arguments, clippy::type_complexity)]
    pub(crate) fn start(
        me: Rank,
        prev: Rank,
        shape: PlanShape,
        layout: RegionLayout,
        (out, send, send_lent): (Option<Staging>, Vec<Box<dyn SendEnd>>, Vec<bool>),
        (inc, recv, recv_lent): (Option<Staging>, Vec<Box<dyn RecvEnd>>, Vec<bool>),
        bell: Arc<dyn Bell>,
        abort_also: Option<usize>,
    ) -> Result<Proxy> {
        let sides = [
            (&out, send.len(), &send_lent),
            (&inc, recv.len(), &recv_lent),
        ];
        for (staging, ends, lent) in sides {
            let fits = staging.as_ref().is_some_and(|s| s.holds(&layout));
            let shaped =
                ends == lent.len() && (ends == 0 || fits && ends == usize::from(layout.channels()));
            // The CPU cannot copy into or out of device FIFOs: every end
            // must have taken them.
            let reachable = staging
                .as_ref()
                .is_none_or(|s| !s.fifos_on_device() || lent.iter().all(|&l| l));
            if !shaped || !reachable {
                // The ends go before the regions they may have been lent.
                drop((send, recv));
                return Err(Error::BadConfig {
                    what: if shaped {
                        "FIFOs in device memory need ends that took them (GPUDirect RDMA)"
                    } else {
                        "a proxied hop needs a staging region and an end per channel"
                    },
                });
            }
        }
        let copied = Arc::new(AtomicU64::new(0));
        let work = Work {
            me,
            prev,
            shape,
            layout,
            out: out.as_ref().and_then(|s| s.words.view()),
            inc: inc.as_ref().and_then(|s| s.words.view()),
            out_fifo: out.as_ref().and_then(|s| s.fifo_region().view()),
            inc_fifo: inc.as_ref().and_then(|s| s.fifo_region().view()),
            inc_flush: inc.as_ref().and_then(Staging::flusher),
            outgoing: send
                .into_iter()
                .zip(send_lent)
                .enumerate()
                .map(|(c, (end, lent))| Outgoing {
                    c: c as u8,
                    end,
                    lent,
                    shipped: 0,
                    call: None,
                })
                .collect(),
            incoming: recv
                .into_iter()
                .zip(recv_lent)
                .enumerate()
                .map(|(c, (end, lent))| Incoming {
                    c: c as u8,
                    end,
                    lent,
                    landed: [0; STEPS as usize],
                    tail: 0,
                    copied: 0,
                    credited: 0,
                    headers: Default::default(),
                    call: None,
                })
                .collect(),
            copied: Arc::clone(&copied),
        };
        let stop = Arc::new(AtomicBool::new(false));
        let woken = Arc::new(AtomicBool::new(false));
        let abort = Arc::new(AtomicU64::new(0));
        let failure = Arc::new(Mutex::new(None));
        let thread = {
            let (stop, abort, failure, bell, woken) = (
                stop.clone(),
                abort.clone(),
                failure.clone(),
                bell.clone(),
                woken.clone(),
            );
            std::thread::Builder::new()
                .name(format!("ringcc-proxy-{}", me.0))
                .spawn(move || {
                    if let Err(e) = work.run(&stop, &woken, &*bell) {
                        if let Ok(mut f) = failure.lock() {
                            *f = Some(e.to_string());
                        }
                        abort.store(1, Ordering::Release);
                        if let Some(a) = abort_also {
                            // SAFETY: the caller's word (8-aligned host
                            // memory that outlives the proxy, accessed
                            // atomically by everyone).
                            unsafe { &*(a as *const AtomicU64) }.store(1, Ordering::Release);
                        }
                    }
                })
                .map_err(|_| Error::BadConfig {
                    what: "no thread for the network proxy",
                })?
        };
        Ok(Proxy {
            stop,
            woken,
            bell,
            abort,
            failure,
            copied,
            thread: Some(thread),
            out,
            inc,
        })
    }

    /// Wakes the proxy from an idle sleep: the rank is about to launch a
    /// call whose slices it will ship.
    pub fn wake(&self) {
        self.woken.store(true, Ordering::Release);
        self.bell.ring();
    }

    /// The word the proxy raises (to 1) when it fails: the loop's abort
    /// word where the loop should stop at once.
    pub fn abort_word(&self) -> &AtomicU64 {
        &self.abort
    }

    /// Bytes the proxy copied between the staging regions and a
    /// transport's own memory (FIFO slots, staging): 0 where every end
    /// uses the regions in place (RDMA, lent them) or reads payloads
    /// straight into them (TCP) and sends from them.
    pub fn copied_bytes(&self) -> u64 {
        self.copied.load(Ordering::Relaxed)
    }

    /// Why the proxy stopped, if it failed.
    pub fn failure(&self) -> Option<String> {
        self.failure.lock().ok().and_then(|f| f.clone())
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        self.bell.ring();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Work {
    fn run(mut self, stop: &AtomicBool, woken: &AtomicBool, bell: &dyn Bell) -> Result<()> {
        let mut idle = 0u32;
        while !stop.load(Ordering::Acquire) {
            let mut busy = false;
            for k in 0..self.outgoing.len() {
                busy |= self.ship(k)?;
            }
            for k in 0..self.incoming.len() {
                busy |= self.land(k)?;
            }
            if busy {
                idle = 0;
                continue;
            }
            idle = idle.saturating_add(1);
            if idle < SPIN {
                std::hint::spin_loop();
            } else if idle < YIELD {
                std::thread::yield_now();
            } else {
                // The loop's counters ring no bell: nap briefly (longer
                // when long idle); a transport's reader rings it when the
                // network has news, the rank when it launches a call.
                let nap = if idle - YIELD > DOZE_AFTER { DOZE } else { NAP };
                let ticket = bell.arm();
                // A wake before the arm is in the flag, one after it in
                // the bell: neither is lost.
                if woken.swap(false, Ordering::AcqRel) {
                    bell.disarm();
                    idle = 0;
                    continue;
                }
                bell.sleep(ticket, nap);
                bell.disarm();
            }
        }
        Ok(())
    }

    /// Outgoing channel `k`: credit in, published slices out.
    fn ship(&mut self, k: usize) -> Result<bool> {
        let (Some(region), Some(o)) = (self.out, self.outgoing.get_mut(k)) else {
            return Ok(false);
        };
        let layout = self.layout;
        let mut busy = false;
        while let Some(ev) = o.end.poll().map_err(Error::comm("SendEnd::poll"))? {
            if let Event::Head(h) = ev {
                region
                    .word(layout.head_offset(o.c))?
                    .fetch_max(h, Ordering::AcqRel);
                busy = true;
            }
        }
        let tail = region
            .word(layout.tail_offset(o.c))?
            .load(Ordering::Acquire);
        let sps = self.shape.geometry.slots_per_slice();
        let slot_bytes = self.shape.geometry.slot_bytes();
        while o.shipped + sps <= tail {
            let mut header = None;
            let next = match o.call.as_mut().and_then(|(_, s)| s.next()) {
                Some(b) => b,
                None => {
                    // A new call: its words were written before this tail.
                    let w = |i: u64| -> Result<u64> {
                        Ok(region
                            .word(layout.call_offset(o.c) + 8 * i)?
                            .load(Ordering::Acquire))
                    };
                    let desc = unpack_desc(w(0)?, w(1)?, w(2)?).ok_or(Error::BadConfig {
                        what: "the loop's call words name no call",
                    })?;
                    let mut sizes = SendSizes::new(&desc, &self.shape, ChannelId(o.c), self.me)?;
                    let first = sizes.next().ok_or(Error::BadConfig {
                        what: "a slice published beyond the call's plan",
                    })?;
                    header = Some(
                        CallHeaderRepr {
                            desc,
                            step: o.shipped as u32,
                        }
                        .to_bytes(),
                    );
                    o.end.begin(Protocol::Simple);
                    o.call = Some((desc, sizes));
                    first
                }
            };
            let seq = o.call.as_ref().map_or(0, |(d, _)| d.seq);
            let span = SlotSpan {
                step: o.shipped,
                slots: sps,
            };
            if o.lent {
                // The end's staging is this FIFO: the loop wrote it there.
                o.end
                    .post(seq, span, header.as_ref(), next)
                    .map_err(Error::comm("SendEnd::post"))?;
            } else {
                let at = layout.fifo_offset(o.c) + slot_of(o.shipped).0 as u64 * slot_bytes;
                let fifo = self.out_fifo.ok_or(DEVICE_FIFO)?;
                let data = fifo.bytes(at, next)?;
                if !o.end.prefers_post_from() {
                    // It copies `data` into staging of its own.
                    self.copied.fetch_add(next as u64, Ordering::Relaxed);
                }
                o.end
                    .post_from(seq, span, header.as_ref(), data, slot_bytes as usize)
                    .map_err(Error::comm("SendEnd::post_from"))?;
            }
            o.shipped += sps;
            busy = true;
        }
        Ok(busy)
    }

    /// Incoming channel `k`: arrivals copied into the region and
    /// published, the loop's credit returned.
    fn land(&mut self, k: usize) -> Result<bool> {
        let (Some(region), Some(i)) = (self.inc, self.incoming.get_mut(k)) else {
            return Ok(false);
        };
        let layout = self.layout;
        let mut busy = false;
        let fifos = self.inc_fifo;
        let mut landing = fifos.map(|region| RegionLanding {
            region,
            fifo: layout.fifo_offset(i.c),
            fifo_bytes: layout.fifo_bytes(),
            slot_bytes: self.shape.geometry.slot_bytes(),
            landed: &mut i.landed,
        });
        let lands = !i.lent && i.end.lands();
        loop {
            let ev = match landing.as_mut() {
                Some(landing) if lands => i.end.poll_landing(landing),
                _ => i.end.poll(),
            };
            let Some(ev) = ev.map_err(Error::comm("RecvEnd::poll"))? else {
                break;
            };
            match ev {
                Event::Header { step, desc } => i.headers.push_back((step, desc)),
                Event::Tail(t) => i.tail = i.tail.max(t),
                _ => {}
            }
            busy = true;
        }
        let sps = self.shape.geometry.slots_per_slice();
        let slot_bytes = self.shape.geometry.slot_bytes();
        let start = i.copied;
        while i.copied + sps <= i.tail {
            let mut bytes = i.call.as_mut().and_then(Iterator::next);
            if let Some(&(step, desc)) = i.headers.front() {
                if step == i.copied {
                    i.headers.pop_front();
                    // The call words before the tail that covers them.
                    let base = layout.call_offset(i.c);
                    region.word(base)?.store(desc.seq, Ordering::Relaxed);
                    region.word(base + 8)?.store(desc.count, Ordering::Relaxed);
                    region
                        .word(base + 16)?
                        .store(pack_desc(&desc), Ordering::Relaxed);
                    let mut sizes = SendSizes::new(&desc, &self.shape, ChannelId(i.c), self.prev)?;
                    bytes = sizes.next();
                    i.call = Some(sizes);
                }
            }
            let Some(mut left) = bytes else {
                return Err(Error::comm("the predecessor's slices")(
                    ringcc_comm::Error::Protocol {
                        transport: "proxy",
                        peer: self.prev,
                        channel: ChannelId(i.c),
                        reason: format!("data at step {} beyond its call's plan", i.copied),
                    },
                ));
            };
            for s in 0..sps {
                let len = left.min(slot_bytes as usize);
                let step = i.copied + s;
                let slot = slot_of(step);
                let landed = i.landed[slot.0 as usize] == step + 1;
                // An end that took device FIFOs landed there: nothing
                // for the CPU to look at.
                if len > 0 && !landed && (!i.lent || fifos.is_some()) {
                    let fifo = fifos.ok_or(DEVICE_FIFO)?;
                    let from = i
                        .end
                        .slot(slot, len)
                        .map_err(Error::comm("RecvEnd::slot"))?;
                    let at = layout.fifo_offset(i.c) + slot.0 as u64 * slot_bytes;
                    let in_place = from.as_ptr() as usize == fifo.host + at as usize;
                    if i.lent && !in_place {
                        return Err(Error::BadConfig {
                            what: "an end lent the staging FIFO lands elsewhere",
                        });
                    }
                    if !in_place {
                        fifo.write(at, from)?;
                        self.copied.fetch_add(len as u64, Ordering::Relaxed);
                    }
                }
                left -= len;
            }
            i.copied += sps;
        }
        if i.copied != start {
            if let Some(flush) = &self.inc_flush {
                // The NIC's writes of these slices, visible before their
                // tail is.
                flush()?;
            }
            region
                .word(layout.tail_offset(i.c))?
                .store(i.copied, Ordering::Release);
            busy = true;
        }
        let head = region
            .word(layout.head_offset(i.c))?
            .load(Ordering::Acquire);
        if head > i.credited {
            if head > i.copied {
                return Err(Error::BadConfig {
                    what: "the loop's credit beyond what arrived",
                });
            }
            i.end
                .post_head(head)
                .map_err(Error::comm("RecvEnd::post_head"))?;
            i.credited = head;
            busy = true;
        }
        Ok(busy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use ringcc_core::{DataType, ReduceOp};

    /// The slices a rank receives on `channel`, cut from its own plan's
    /// receiving steps as the core's `Machine` cuts them.
    fn recv_sizes(desc: &CallDesc, shape: &PlanShape, channel: u8, rank: u32) -> Vec<usize> {
        let plan = Call::from(*desc)
            .plan(shape.ranks, shape.channels, shape.chunk_bytes)
            .unwrap();
        let elem = u64::from(desc.dtype.size());
        let se = shape.geometry.slice_bytes() / elem;
        let mut v = Vec::new();
        let ring = InOrderRing { ranks: shape.ranks };
        for s in plan.steps(ChannelId(channel), Rank(rank), ring).unwrap() {
            if !s.primitive.contains(Primitive::RECV) {
                continue;
            }
            let slices = s.count.div_ceil(se).max(1);
            for k in 0..slices {
                let lo = (k * se).min(s.count);
                let hi = (lo + se).min(s.count);
                v.push(((hi - lo) * elem) as usize);
            }
        }
        v
    }

    proptest! {
        /// What the sending proxy ships is what the receiving rank's plan
        /// consumes, slice by slice, on every channel, and the bytes add
        /// up to the sending steps' elements.
        #[test]
        fn send_sizes_match_the_successors_receives(
            which in 0usize..5,
            count in 0u64..5000,
            ranks in 1u32..9,
            channels in 1u32..4,
            dtype in prop::sample::select(vec![DataType::I8, DataType::Bf16, DataType::F32, DataType::F64]),
            slot_units in 1u64..8,
            sps in prop::sample::select(vec![1u64, 2, 4]),
            root in 0u32..8,
        ) {
            let root = Rank(root % ranks);
            let collective = [
                ringcc_core::Collective::AllReduce,
                ringcc_core::Collective::ReduceScatter,
                ringcc_core::Collective::AllGather,
                ringcc_core::Collective::Broadcast { root },
                ringcc_core::Collective::Reduce { root },
            ][which];
            let geometry = FifoGeometry::new(16 * slot_units, sps).unwrap();
            let shape = PlanShape {
                ranks,
                channels,
                chunk_bytes: geometry.slice_bytes() * 2,
                geometry,
            };
            let desc = Call::new(collective, count, dtype, ReduceOp::Sum).desc(7);
            for c in 0..channels as u8 {
                for r in 0..ranks {
                    let sent: Vec<usize> =
                        SendSizes::new(&desc, &shape, ChannelId(c), Rank(r)).unwrap().collect();
                    let next = (r + 1) % ranks;
                    if ranks > 1 {
                        prop_assert_eq!(&sent, &recv_sizes(&desc, &shape, c, next));
                    }
                    let plan = Call::from(desc).plan(ranks, channels, shape.chunk_bytes).unwrap();
                    let elems: u64 = plan
                        .steps(ChannelId(c), Rank(r), InOrderRing { ranks })
                        .unwrap()
                        .filter(|s| s.primitive.contains(Primitive::SEND))
                        .map(|s| s.count)
                        .sum();
                    prop_assert_eq!(sent.iter().sum::<usize>() as u64, elems * u64::from(dtype.size()));
                }
            }
        }
    }

    #[test]
    fn regions_refuse_words_and_slices_outside_them() {
        let r = Region::host(256).unwrap();
        let v = r.view().unwrap();
        assert!(v.word(248).is_ok());
        assert!(v.word(252).is_err());
        assert!(v.word(256).is_err());
        assert!(v.word(u64::MAX - 3).is_err());
        assert!(v.word(u64::MAX - 7).is_err());
        assert!(v.bytes(200, 56).is_ok());
        assert!(v.bytes(200, 57).is_err());
        assert!(v.write(u64::MAX, &[1]).is_err());
        v.write(0, &[7; 16]).unwrap();
        assert_eq!(v.bytes(0, 16).unwrap(), &[7; 16]);
    }
}
