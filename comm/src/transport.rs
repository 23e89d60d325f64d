//! What a transport provides: the two ends of one connection (a rank to
//! its ring successor on one channel) and the steps that connect them.
//!
//! A connection is the core's FIFO ([`ringcc_core::fifo`]): `STEPS` slots
//! of [`FifoGeometry::slot_bytes`], a `tail` the sender posts after the
//! bytes, a `head` the receiver posts to return credit, and the call
//! header delivered before the first slice of each call. Where the slots
//! live and how the counters travel is the transport's business:
//!
//! | transport | receiver's slots | `tail` / header | `head` (credit) |
//! |---|---|---|---|
//! | shared memory | the receiver's segment, mapped by both | atomics in the segment | an atomic in the segment |
//! | TCP | the receiver's memory, filled by its reader thread | frames (checked header) | a credit frame back |
//! | RDMA | the receiver's registered FIFO | WRITE_WITH_IMM | a small RDMA WRITE |
//!
//! The communicator's one drive loop turns [`RecvEnd::poll`] and
//! [`SendEnd::poll`] into the engine's events and the engine's actions
//! into [`RecvEnd::slot`] / [`SendEnd::slot_mut`] (the host executor
//! reduces straight from the incoming slot into the outgoing one),
//! [`SendEnd::post`] and [`RecvEnd::post_head`]. An end never blocks for
//! longer than a transport-level write needs.
//!
//! Connecting is three phases over every hop of the job, so that no
//! transport needs its peer to call in a particular order: every rank
//! first [`listen`](Transport::listen)s for each hop it receives, then
//! (after a store barrier) [`connect`](Transport::connect)s each hop it
//! sends, then [`accept`](Transport::accept)s each hop it receives.
//! `connect` may wait only for what the peer did in `listen` or
//! [`publish`](Transport::publish).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ringcc_core::fifo::FifoGeometry;
use ringcc_core::prim::SlotSpan;
use ringcc_core::progress::Event;
use ringcc_core::wire::call_header::CALL_HEADER_LEN;
use ringcc_core::{ChannelId, Protocol, Rank, SlotIndex};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::store::Store;

/// Where the running call takes some slices' bytes unchanged: straight
/// into its output (a receive-only step, or a receive that is copied out
/// and sent on). An end that reads payloads out of a stream (TCP) asks it
/// when a payload begins and reads the bytes there instead of into a
/// slot: one copy fewer. See [`RecvEnd::poll_landing`].
pub trait Landing {
    /// The `len` output bytes that FIFO step `step` of call `call` (the
    /// last call header received on the stream) goes to, when the running
    /// call takes that step's bytes unchanged and `call` is the running
    /// call; `None` otherwise (the bytes go to the step's slot). Asked
    /// again for a payload read in several pieces, it gives the same
    /// bytes.
    fn dest(&mut self, call: &ringcc_core::CallDesc, step: u64, len: usize) -> Option<&mut [u8]>;
}

/// A [`Landing`] that takes nothing: every payload goes to its slot.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoLanding;

impl Landing for NoLanding {
    fn dest(&mut self, _: &ringcc_core::CallDesc, _: u64, _: usize) -> Option<&mut [u8]> {
        None
    }
}

/// The receiving end of a connection (the predecessor's slices arrive
/// here).
pub trait RecvEnd: Send {
    /// The next thing that arrived and was not reported yet: a
    /// [`Event::Header`] before the [`Event::Tail`] that covers its step,
    /// `Tail` values increasing. `None` when nothing new arrived. A peer
    /// that went away or broke the protocol is an error.
    fn poll(&mut self) -> Result<Option<Event>>;

    /// Whether [`poll_landing`](RecvEnd::poll_landing) can put payloads
    /// where the call wants them (the default: no; every payload goes to
    /// its slot).
    fn lands(&self) -> bool {
        false
    }

    /// [`poll`](RecvEnd::poll), putting each payload that `landing` wants
    /// straight where it says instead of into the step's slot (which the
    /// caller then does not read). The default polls.
    fn poll_landing(&mut self, landing: &mut dyn Landing) -> Result<Option<Event>> {
        let _ = landing;
        self.poll()
    }

    /// The first `len` bytes of `slot`. Valid to read while the step the
    /// slot holds is below the last `tail` reported and not yet credited
    /// back; `len` beyond the slot is an error.
    fn slot(&self, slot: SlotIndex, len: usize) -> Result<&[u8]>;

    /// Returns credit: every step below `head` is consumed and its slot
    /// may be written again.
    fn post_head(&mut self, head: u64) -> Result<()>;

    /// [`post_head`](RecvEnd::post_head), told whether the call will
    /// receive again on this end (`more`): then a later credit of the same
    /// call covers this one, and an end that pays per credit message (TCP)
    /// may hold it back until the window needs it; the call's last credit
    /// (`more` false) goes at once. The default posts every credit.
    fn post_credit(&mut self, head: u64, more: bool) -> Result<()> {
        let _ = more;
        self.post_head(head)
    }
}

/// The sending end of a connection (our slices leave here).
pub trait SendEnd: Send {
    /// The successor's credit that was not reported yet, as
    /// [`Event::Head`]; `None` when nothing new arrived.
    fn poll(&mut self) -> Result<Option<Event>>;

    /// The first `len` bytes of `slot`, to write a slice into (the
    /// successor's own slot where the transport maps it, else a staging
    /// slot). Valid for a step the successor has credited.
    fn slot_mut(&mut self, slot: SlotIndex, len: usize) -> Result<&mut [u8]>;

    /// The protocol of the call about to start, before its first
    /// [`slot_mut`](SendEnd::slot_mut). An end that can carry a
    /// low-latency protocol's lines (LL, LL128: data that carries its own
    /// arrival, no separate `tail`) switches to it; the default ignores
    /// it and carries every call the Simple way (its slots hold the
    /// smaller slices of the call's [geometry](Protocol::fifo_geometry)).
    /// The receiving end needs no such word: it tells the ways apart.
    fn begin(&mut self, protocol: Protocol) {
        let _ = protocol;
    }

    /// Publishes the slice written at `span`: the call header of call
    /// `seq` first when given, then the `bytes` written into the span's
    /// slots (each slot full but the last), then `tail = span.end()`.
    fn post(
        &mut self,
        seq: u64,
        span: SlotSpan,
        header: Option<&[u8; CALL_HEADER_LEN]>,
        bytes: usize,
    ) -> Result<()>;

    /// Whether [`poll`](SendEnd::poll) has work of its own now (bytes
    /// queued to write). An end that says `false` is polled only when the
    /// engine waits for its credit, and at every look after progress and
    /// every 16th idle one (where a poll is a system call, TCP's, the
    /// credit stream is not read while nobody needs it). The default says
    /// `true`: polled at every look.
    fn needs_poll(&self) -> bool {
        true
    }

    /// Whether [`post_from`](SendEnd::post_from) saves a copy here: an
    /// end whose slots are staging memory of its own (TCP) sends a slice
    /// that lies in the caller's memory straight from there, and the
    /// executor then leaves [`slot_mut`](SendEnd::slot_mut) alone for
    /// it. An end whose slots are the successor's own (shared memory)
    /// says `false` (the default): writing into them is the one copy.
    fn prefers_post_from(&self) -> bool {
        false
    }

    /// Publishes the slice `data` (the caller's memory: the bytes the
    /// executor would have written into the span's slots, each slot
    /// `slot_bytes` full but the last) as [`post`](SendEnd::post) does.
    /// Nothing of `data` is referenced once this returns — what the end
    /// cannot hand over at once, it copies — unless `data` lies in
    /// memory [lent](SendEnd::lend) to the end for the running call. The
    /// default copies `data` into the span's slots and posts them
    /// ([`post_staged`]).
    fn post_from(
        &mut self,
        seq: u64,
        span: SlotSpan,
        header: Option<&[u8; CALL_HEADER_LEN]>,
        data: &[u8],
        slot_bytes: usize,
    ) -> Result<()> {
        post_staged(self, seq, span, header, data, slot_bytes)
    }

    /// Offers the running call's buffers (`regions`: the input and the
    /// output, or the one buffer of a call in place) to an end whose
    /// hardware reads memory by itself (a NIC): it may prepare them
    /// (register them) and then [`post_from`](SendEnd::post_from) slices
    /// that lie in them without copying them first, the hardware reading
    /// them after `post_from` returns. Whether it will (the default: no,
    /// nothing is kept). An end that cannot prepare them says no; that
    /// is no error.
    ///
    /// # Safety
    /// Every region must stay valid until [`settle`](SendEnd::settle)
    /// returns or the end is dropped, and no byte of a slice posted from
    /// them may be written before that slice has reached the successor
    /// (the executor writes a byte it sent only as the final value of an
    /// element, which exists only after the successor took this rank's
    /// contribution).
    unsafe fn lend(&mut self, regions: &[&[u8]]) -> Result<bool> {
        let _ = regions;
        Ok(false)
    }

    /// Ends a [loan](SendEnd::lend): waits (`drain`; bounded) until no
    /// request the end posted still reads lent memory, then lets the
    /// memory go. Without `drain` (the call failed) it lets go at once,
    /// after which the hardware can no longer reach the memory. Nothing
    /// to do without a loan (the default).
    fn settle(&mut self, drain: bool) -> Result<()> {
        let _ = drain;
        Ok(())
    }
}

/// [`SendEnd::post_from`] by copying: `data` into the span's slots
/// ([`SendEnd::slot_mut`]), then [`SendEnd::post`]. For an end that
/// sends some slices from the caller's memory and stages the others.
pub fn post_staged<E: SendEnd + ?Sized>(
    end: &mut E,
    seq: u64,
    span: SlotSpan,
    header: Option<&[u8; CALL_HEADER_LEN]>,
    data: &[u8],
    slot_bytes: usize,
) -> Result<()> {
    for (k, part) in data.chunks(slot_bytes.max(1)).enumerate() {
        let step = span.step.saturating_add(k as u64);
        end.slot_mut(ringcc_core::fifo::slot_of(step), part.len())?
            .copy_from_slice(part);
    }
    end.post(seq, span, header, data.len())
}

/// Where an idle rank sleeps instead of napping: a word bumped (and the
/// rank woken through it, a futex) whenever something it may wait for
/// arrives — by its peers through shared memory, by a transport's reader
/// threads in this process. Every rank has one ([`Job::bell`]): the first
/// transport that offers one ([`Transport::bell`]: shared memory's lives
/// in a segment its neighbours map), else a process-local one.
///
/// The handshake (the lost-wake-up race closed by two fences):
/// `ticket = arm()`, poll every end once more, then `sleep(ticket, t)`
/// unless something arrived, then `disarm()`. A peer posts its counter,
/// then rings: it sees the rank armed, or the rank's last poll sees the
/// counter.
pub trait Bell: Send + Sync + std::fmt::Debug {
    /// Announces that the rank is about to sleep; the ticket to sleep on.
    fn arm(&self) -> u32;
    /// Sleeps until the bell rang after `ticket` was taken, or `timeout`.
    fn sleep(&self, ticket: u32, timeout: Duration);
    /// Announces that the rank is awake again.
    fn disarm(&self);
    /// Wakes the rank if it sleeps (after publishing what it waits for).
    fn ring(&self);
}

/// One connection of a job: `sender` → `receiver` on `channel`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Hop {
    /// The channel (ring).
    pub channel: ChannelId,
    /// The sending rank.
    pub sender: Rank,
    /// The receiving rank (the sender's successor on the ring).
    pub receiver: Rank,
}

/// What each rank publishes about itself before the job connects.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerInfo {
    /// The rank.
    pub rank: u32,
    /// The node (host) it runs on: `RINGCC_NODE`, else the host name.
    /// Ranks of one node may share memory.
    pub node: String,
    /// Its process id.
    pub pid: u32,
    /// Per transport this rank can use, what peers need to reach it
    /// (an address, …). A transport missing here is not available at
    /// this rank (absent, or disabled by its environment).
    pub transports: BTreeMap<String, serde_json::Value>,
}

/// What every step of connecting knows about the job.
#[derive(Clone, Copy)]
pub struct Job<'a> {
    /// The job token (segment names, hellos).
    pub token: &'a str,
    /// This rank.
    pub rank: Rank,
    /// Number of ranks.
    pub world: u32,
    /// Every connection's FIFO.
    pub geometry: FifoGeometry,
    /// Connecting fails after this.
    pub deadline: Instant,
    /// Every rank's published info, by rank.
    pub peers: &'a [PeerInfo],
    /// This rank's bell: ends whose news arrives on threads of this
    /// process ring it.
    pub bell: &'a Arc<dyn Bell>,
    /// The job's store, for what a hop's two ends can exchange only once
    /// `listen` has made it (a queue pair's address): set under keys of
    /// the transport's own prefix (`verbs/…`), waited for until
    /// [`deadline`](Job::deadline).
    pub store: &'a dyn Store,
}

impl std::fmt::Debug for Job<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job")
            .field("token", &self.token)
            .field("rank", &self.rank)
            .field("world", &self.world)
            .field("geometry", &self.geometry)
            .field("deadline", &self.deadline)
            .field("peers", &self.peers)
            .field("bell", &self.bell)
            .finish_non_exhaustive()
    }
}

impl Job<'_> {
    /// The published info of `rank`.
    pub fn peer(&self, rank: Rank) -> Option<&PeerInfo> {
        self.peers.get(rank.0 as usize)
    }
}

/// A ring's FIFO slot where neither the user nor a transport asks for
/// another ([`Transport::slot_bytes`]): 128 KiB, one slot per slice (1
/// MiB of FIFO per connection).
pub const SLOT_BYTES: u64 = 128 << 10;

/// Bytes of a call's larger buffer per channel it uses, where no
/// transport of the ring asks for more
/// ([`Transport::channel_bytes`]): every channel adds hand-offs, and one
/// drive thread serves them all.
pub const CHANNEL_BYTES: u64 = 4 << 20;

/// Memory a caller lends a hop's end for its FIFO's slots: `STEPS` slots
/// of the job's [`FifoGeometry::slot_bytes`], slot `s` at byte
/// `s × slot_bytes` — where a receiving end lands arrivals
/// ([`Transport::listen_in`]) or a sending end sends slices from
/// ([`Transport::connect_from`]). A device loop's network proxy lends the
/// staging regions the loop itself reads and writes, so that no CPU copy
/// stands between them and the network (NCCL's proxy: the NIC reads and
/// writes the host FIFOs the GPU uses) — or, with GPUDirect RDMA, the
/// loop's FIFOs in device memory, exported as a dma-buf
/// ([`FifoMemory::dma_buf`]): only a transport whose
/// [`Transport::device_memory`] says so may be lent those.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FifoMemory {
    addr: usize,
    len: usize,
    /// Device memory: the dma-buf's descriptor and the first byte's
    /// offset in it (`addr` is then the device address, not the CPU's).
    dma_buf: Option<(i32, u64)>,
}

impl FifoMemory {
    /// `len` bytes of host memory at `ptr`.
    ///
    /// # Safety
    /// The bytes stay valid for reads and writes, and in place, until
    /// every end and every transport that was lent them has been dropped.
    /// While they are lent, the caller touches a slot only as the FIFO's
    /// protocol lets the owner of that end: a receiver reads a slot
    /// between the `tail` that covers it and the credit it returns; a
    /// sender writes a slot only once the successor has credited its
    /// previous step, and does not write it again before the next credit.
    pub unsafe fn new(ptr: std::ptr::NonNull<u8>, len: usize) -> FifoMemory {
        FifoMemory {
            addr: ptr.as_ptr() as usize,
            len,
            dma_buf: None,
        }
    }

    /// `len` bytes of device memory at device address `addr`, exported
    /// as the dma-buf `fd` from byte `offset` on (CUDA's
    /// `cuMemGetHandleForAddressRange`): a NIC that can registers it
    /// (`ibv_reg_dmabuf_mr`, GPUDirect RDMA) and reads and writes the
    /// device's memory itself. The CPU never dereferences it.
    ///
    /// # Safety
    /// [`new`](FifoMemory::new)'s contract for the device memory; `fd` is
    /// a dma-buf of it, open until the call it is lent to returns.
    pub unsafe fn dma_buf(fd: i32, offset: u64, addr: u64, len: usize) -> FifoMemory {
        FifoMemory {
            addr: addr as usize,
            len,
            dma_buf: Some((fd, offset)),
        }
    }

    /// The first byte (host memory; for device memory its device address,
    /// which the CPU must not dereference).
    pub fn as_ptr(&self) -> *mut u8 {
        self.addr as *mut u8
    }

    /// The address of the first byte (the device's, for device memory).
    pub fn addr(&self) -> usize {
        self.addr
    }

    /// Bytes lent.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is lent.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Device memory: the dma-buf's descriptor and the offset of the
    /// first byte in it; `None` for host memory.
    pub fn device(&self) -> Option<(i32, u64)> {
        self.dma_buf
    }

    /// Whether it holds a FIFO of `geometry` (`STEPS` slots).
    pub fn holds(&self, geometry: &FifoGeometry) -> bool {
        u64::try_from(self.len).is_ok_and(|l| l >= geometry.fifo_bytes())
    }
}

/// The refusal of device memory by a transport that cannot take it.
fn no_device_memory(name: &str, hop: Hop) -> Error {
    Error::BadConfig(format!(
        "{name} cannot take device memory (a dma-buf) as the FIFO of {hop:?}: \
         lend it only where Transport::device_memory says so"
    ))
}

/// Which end of a hop a rank makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HopEnd {
    /// The sending end (this rank is the hop's sender).
    Send,
    /// The receiving end.
    Recv,
}

/// A way of connecting ranks. One value per communicator; it keeps what
/// the connecting phases share (a listener, pending segments).
pub trait Transport: Send {
    /// Its name in the banner, in `PeerInfo::transports` and in the
    /// overrides (`shm`, `tcp`, `verbs`).
    fn name(&self) -> &'static str;

    /// What this rank publishes for it (an address to connect to, …), or
    /// `None` when it cannot be used here. Called once, before any
    /// other step.
    fn publish(&mut self, token: &str, rank: Rank) -> Result<Option<serde_json::Value>>;

    /// Whether it can join `a` and `b`, given what both published (both
    /// published something for it; e.g. shared memory: the same node).
    /// Must be symmetric: both ends decide alike.
    fn reaches(&self, a: &PeerInfo, b: &PeerInfo) -> bool;

    /// Receiver, phase 1: make `hop` ready to be connected to.
    fn listen(&mut self, job: &Job<'_>, hop: Hop) -> Result<()>;

    /// A bell this rank's peers can ring (see [`Bell`]), after
    /// [`publish`](Transport::publish); `None` (the default) when the
    /// transport has no memory its peers share.
    fn bell(&mut self) -> Option<Arc<dyn Bell>> {
        None
    }

    /// The FIFO slot a ring with a hop over this transport should use
    /// where the user set none (the ring's largest wins over
    /// [`SLOT_BYTES`]; `RINGCC_SLOT_BYTES` overrides). The default,
    /// `None`, is content with [`SLOT_BYTES`]; a transport whose every
    /// slice costs system calls asks for larger slices (TCP).
    fn slot_bytes(&self) -> Option<u64> {
        None
    }

    /// A call uses one channel per this many bytes of its larger buffer
    /// on a ring with a hop over this transport (the ring's largest
    /// wins; `RINGCC_CHANNEL_BYTES` overrides). The default,
    /// [`CHANNEL_BYTES`], suits transports whose channels cost only
    /// hand-offs; one whose every extra connection costs more than it
    /// adds says more (TCP: one channel).
    fn channel_bytes(&self) -> u64 {
        CHANNEL_BYTES
    }

    /// Sender, phase 2: the sending end of `hop`.
    fn connect(&mut self, job: &Job<'_>, hop: Hop) -> Result<Box<dyn SendEnd>>;

    /// Receiver, phase 3: the receiving end of `hop`, once its sender has
    /// connected.
    fn accept(&mut self, job: &Job<'_>, hop: Hop) -> Result<Box<dyn RecvEnd>>;

    /// [`listen`](Transport::listen), with the FIFO's slots in `fifo`
    /// (see [`FifoMemory`]): a transport that can, lands arrivals there,
    /// so that [`RecvEnd::slot`] lends `fifo`'s own bytes, and says
    /// `true`. The default listens with memory of the end's own and says
    /// `false` (the caller copies out of [`RecvEnd::slot`]).
    ///
    /// Device memory ([`FifoMemory::dma_buf`]) cannot land anywhere the
    /// CPU copies from: a transport that does not take it
    /// ([`device_memory`](Transport::device_memory) says no)
    /// refuses it with [`Error::BadConfig`], as the default does.
    fn listen_in(&mut self, job: &Job<'_>, hop: Hop, fifo: FifoMemory) -> Result<bool> {
        if fifo.device().is_some() {
            return Err(no_device_memory(self.name(), hop));
        }
        self.listen(job, hop).map(|()| false)
    }

    /// [`connect`](Transport::connect), with the staging slots in
    /// `staging` (see [`FifoMemory`]): a transport that can, sends each
    /// slice from there, and says `true` — the caller writes a slice into
    /// `staging`'s slots itself and publishes it with [`SendEnd::post`]
    /// (never [`SendEnd::slot_mut`]). The default connects as usual and
    /// says `false` (the caller hands slices to
    /// [`SendEnd::post_from`]).
    fn connect_from(
        &mut self,
        job: &Job<'_>,
        hop: Hop,
        staging: FifoMemory,
    ) -> Result<(Box<dyn SendEnd>, bool)> {
        if staging.device().is_some() {
            return Err(no_device_memory(self.name(), hop));
        }
        self.connect(job, hop).map(|end| (end, false))
    }

    /// `Ok` where [`listen_in`](Transport::listen_in) and
    /// [`connect_from`](Transport::connect_from) take device memory lent
    /// as a dma-buf ([`FifoMemory::dma_buf`]) — GPUDirect RDMA, the NIC
    /// reading and writing GPU memory itself —, else why not (for the
    /// init banner). Asked after [`publish`](Transport::publish); the
    /// default (every transport that moves bytes with the CPU) says no.
    fn device_memory(&self) -> std::result::Result<(), String> {
        Err(format!("{} moves bytes with the CPU", self.name()))
    }
}
