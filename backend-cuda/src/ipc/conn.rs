//! One connection's FIFO in exported memory, and the two ends over it.
//!
//! ```text
//! 0     header   magic (stored last, release) · token hash · slot bytes ·
//!                slots per slice · depth · total · sender mapped (release)
//! 128   tail     StepCounter (sender → receiver)
//! 256   head     StepCounter (receiver → sender)
//! 384   mailbox  call-header sequence word (release) · CALL_HEADER_LEN bytes
//! 512   slots    STEPS slots, each slot bytes rounded up to 128
//! ```
//!
//! Every region starts on a 128-byte line (a GPU's cache line, as the
//! device loop places its counters), so each counter has its own line.
//! The receiver owns the memory and exports it; the sender imports it,
//! writes slices straight into the slots and posts `tail`; the receiver
//! reads the slots in place and posts `head` (see `ringcc_core::fifo`).

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use ringcc_comm::peer::PeerProcess;
use ringcc_comm::transport::{RecvEnd, SendEnd};
use ringcc_comm::Error as CommError;
use ringcc_core::fifo::{FifoGeometry, StepCounter, STEPS};
use ringcc_core::prim::SlotSpan;
use ringcc_core::progress::Event;
use ringcc_core::wire::call_header::CALL_HEADER_LEN;
use ringcc_core::{ChannelId, Rank, SlotIndex};

use super::memory::{ExportedMemory, ImportedMemory, Mapping};
use super::NAME;

type Result<T> = std::result::Result<T, CommError>;

/// "ringcc\x01\x17" as a little-endian word (never zero).
const MAGIC: u64 = u64::from_le_bytes(*b"ringcc\x01\x17");

const LINE: usize = 128;
const TAIL: usize = LINE;
const HEAD: usize = 2 * LINE;
const MAILBOX_SEQ: usize = 3 * LINE;
const MAILBOX: usize = MAILBOX_SEQ + 8;
const SLOTS: usize = 4 * LINE;

/// Header words (byte offsets in the first line).
mod field {
    pub const MAGIC: usize = 0;
    pub const TOKEN_HASH: usize = 8;
    pub const SLOT_BYTES: usize = 16;
    pub const SLOTS_PER_SLICE: usize = 24;
    pub const DEPTH: usize = 32;
    pub const TOTAL: usize = 40;
    pub const SENDER_MAPPED: usize = 48;
}

const _: () = assert!(MAILBOX + CALL_HEADER_LEN <= SLOTS);
const _: () = assert!(size_of::<StepCounter>() == 8 && align_of::<StepCounter>() <= LINE);

/// Where a FIFO of `geometry` lives in its memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnLayout {
    slot_bytes: usize,
    stride: usize,
    total: usize,
}

impl ConnLayout {
    /// The layout for `geometry`.
    pub fn new(geometry: FifoGeometry) -> Result<ConnLayout> {
        let too_big = || CommError::BadConfig(format!("cuda-ipc: {geometry:?} beyond memory"));
        let slot_bytes = usize::try_from(geometry.slot_bytes()).map_err(|_| too_big())?;
        let stride = slot_bytes
            .checked_next_multiple_of(LINE)
            .ok_or_else(too_big)?;
        let total = stride
            .checked_mul(STEPS as usize)
            .and_then(|s| s.checked_add(SLOTS))
            .ok_or_else(too_big)?;
        Ok(ConnLayout {
            slot_bytes,
            stride,
            total,
        })
    }

    /// Bytes of the whole FIFO.
    pub fn total(&self) -> u64 {
        self.total as u64
    }
}

/// A connection's memory as either end sees it.
#[derive(Debug)]
struct Fifo {
    base: NonNull<u8>,
    layout: ConnLayout,
}

// SAFETY: `base` points into a mapping owned by the same end as this
// value (kept alive beside it); moving it to another thread moves no
// memory.
unsafe impl Send for Fifo {}

impl Fifo {
    fn new(map: &Mapping, layout: ConnLayout) -> Result<Fifo> {
        if map.len() < layout.total {
            return Err(CommError::Internal(format!(
                "cuda-ipc: a {} B mapping for a {} B FIFO",
                map.len(),
                layout.total
            )));
        }
        Ok(Fifo {
            base: map.base(),
            layout,
        })
    }

    fn word(&self, off: usize) -> &AtomicU64 {
        debug_assert!(off < LINE && off.is_multiple_of(8));
        // SAFETY: `off` is a header field offset, inside the mapping (at
        // least `SLOTS` bytes) and 8-aligned (the mapping is page
        // aligned); shared memory is only ever accessed through atomics
        // at these offsets.
        unsafe { &*self.base.as_ptr().add(off).cast::<AtomicU64>() }
    }

    fn counter(&self, off: usize) -> &StepCounter {
        // SAFETY: TAIL and HEAD are line-aligned offsets inside the
        // mapping; a StepCounter is one AtomicU64, valid for any bit
        // pattern (zeroed memory is a counter at 0).
        unsafe { &*self.base.as_ptr().add(off).cast::<StepCounter>() }
    }

    fn tail(&self) -> &StepCounter {
        self.counter(TAIL)
    }

    fn head(&self) -> &StepCounter {
        self.counter(HEAD)
    }

    /// Slot `slot`'s first `len` bytes.
    fn slot(&self, slot: SlotIndex, len: usize) -> Result<NonNull<u8>> {
        if u64::from(slot.0) >= STEPS || len > self.layout.slot_bytes {
            return Err(CommError::Internal(format!(
                "cuda-ipc: {len} B of slot {} (slots of {} B)",
                slot.0, self.layout.slot_bytes
            )));
        }
        let off = SLOTS + usize::from(slot.0) * self.layout.stride;
        // SAFETY: `off + len <= total <= mapping length` (checked above
        // and in `new`).
        Ok(unsafe { NonNull::new_unchecked(self.base.as_ptr().add(off)) })
    }

    fn post_header(&self, seq: u64, header: &[u8; CALL_HEADER_LEN]) {
        // SAFETY: MAILBOX..MAILBOX+CALL_HEADER_LEN lies in the header
        // lines; the receiver reads it only after seeing `seq` (release
        // below) and the sender overwrites it only once the receiver
        // consumed the step it belongs to.
        unsafe {
            std::ptr::copy_nonoverlapping(
                header.as_ptr(),
                self.base.as_ptr().add(MAILBOX),
                CALL_HEADER_LEN,
            );
        }
        self.counter(MAILBOX_SEQ).post(seq);
    }

    fn read_header(&self) -> [u8; CALL_HEADER_LEN] {
        let mut h = [0u8; CALL_HEADER_LEN];
        // SAFETY: as in `post_header`; called after an acquire load of the
        // sequence word saw it posted.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.base.as_ptr().add(MAILBOX),
                h.as_mut_ptr(),
                CALL_HEADER_LEN,
            );
        }
        h
    }
}

/// The receiver's FIFO: created zeroed, its header written, published
/// (magic) — then exported.
#[derive(Debug)]
pub struct Inbox {
    memory: ExportedMemory,
    fifo: Fifo,
}

impl Inbox {
    /// A FIFO of `geometry` for the job of `token`, in fake device memory.
    pub fn create(geometry: FifoGeometry, token: &str) -> Result<Inbox> {
        let layout = ConnLayout::new(geometry)?;
        let memory = ExportedMemory::fake(layout.total(), "ringcc-cuda-ipc")?;
        let fifo = Fifo::new(memory.mapping(), layout)?;
        for (off, v) in [
            (
                field::TOKEN_HASH,
                ringcc_comm::launch::fnv1a(token.as_bytes()),
            ),
            (field::SLOT_BYTES, geometry.slot_bytes()),
            (field::SLOTS_PER_SLICE, geometry.slots_per_slice()),
            (field::DEPTH, STEPS),
            (field::TOTAL, layout.total()),
        ] {
            fifo.word(off).store(v, Ordering::Relaxed);
        }
        fifo.word(field::MAGIC).store(MAGIC, Ordering::Release);
        Ok(Inbox { memory, fifo })
    }

    /// The exported memory (its handle goes to the sender).
    pub fn memory(&self) -> &ExportedMemory {
        &self.memory
    }

    /// Whether the sender has imported and checked it.
    pub fn sender_mapped(&self) -> bool {
        self.fifo.word(field::SENDER_MAPPED).load(Ordering::Acquire) == 1
    }
}

/// Opens the FIFO a receiver exported, checking it is one of ours, of
/// this job, with this geometry; then tells the receiver it is mapped.
pub fn open_outbox(
    memory: ImportedMemory,
    geometry: FifoGeometry,
    token: &str,
    peer: Rank,
    channel: ChannelId,
) -> Result<(ImportedMemory, FifoView)> {
    let layout = ConnLayout::new(geometry)?;
    let fifo = Fifo::new(memory.mapping(), layout)?;
    let bad = |reason: String| CommError::Protocol {
        transport: NAME,
        peer,
        channel,
        reason,
    };
    match fifo.word(field::MAGIC).load(Ordering::Acquire) {
        MAGIC => {}
        m => return Err(bad(format!("magic {m:#018x}: not a ringcc FIFO"))),
    }
    let h = ringcc_comm::launch::fnv1a(token.as_bytes());
    if fifo.word(field::TOKEN_HASH).load(Ordering::Relaxed) != h {
        return Err(CommError::Stranger {
            at: format!("rank {peer}'s exported FIFO (channel {channel})"),
            reason: "another job's token".into(),
        });
    }
    let got = [
        fifo.word(field::SLOT_BYTES).load(Ordering::Relaxed),
        fifo.word(field::SLOTS_PER_SLICE).load(Ordering::Relaxed),
        fifo.word(field::DEPTH).load(Ordering::Relaxed),
        fifo.word(field::TOTAL).load(Ordering::Relaxed),
    ];
    let want = [
        geometry.slot_bytes(),
        geometry.slots_per_slice(),
        STEPS,
        layout.total(),
    ];
    if got != want {
        return Err(bad(format!(
            "FIFO (slot bytes, slots per slice, depth, total) {got:?}, expected {want:?}"
        )));
    }
    fifo.word(field::SENDER_MAPPED).store(1, Ordering::Release);
    Ok((memory, FifoView(fifo)))
}

/// An imported FIFO, checked (from [`open_outbox`]).
#[derive(Debug)]
pub struct FifoView(Fifo);

/// The receiving end: this rank's own exported FIFO.
#[derive(Debug)]
pub struct IpcRecv {
    inbox: Inbox,
    peer: PeerProcess,
}

impl IpcRecv {
    pub(crate) fn new(inbox: Inbox, peer: PeerProcess) -> IpcRecv {
        IpcRecv { inbox, peer }
    }
}

impl RecvEnd for IpcRecv {
    fn poll(&mut self) -> Result<Option<Event>> {
        let tail = self.inbox.fifo.tail().load();
        let fifo = &self.inbox.fifo;
        self.peer.poll_tail(
            tail,
            || fifo.counter(MAILBOX_SEQ).load(),
            || fifo.read_header(),
        )
    }

    fn slot(&self, slot: SlotIndex, len: usize) -> Result<&[u8]> {
        let p = self.inbox.fifo.slot(slot, len)?;
        // SAFETY: the engine asks only for slots of steps below the `tail`
        // reported (acquire) and not yet credited back, which the sender
        // does not write meanwhile; `len` is inside the slot (checked);
        // the slice borrows `self`, so it ends before `post_head`.
        Ok(unsafe { std::slice::from_raw_parts(p.as_ptr(), len) })
    }

    fn post_head(&mut self, head: u64) -> Result<()> {
        self.inbox.fifo.head().post(head);
        Ok(())
    }
}

/// The sending end: the successor's FIFO, imported and mapped here.
#[derive(Debug)]
pub struct IpcSend {
    // Field order: the view before the memory it points into.
    fifo: Fifo,
    _memory: ImportedMemory,
    peer: PeerProcess,
}

impl IpcSend {
    pub(crate) fn new(memory: ImportedMemory, view: FifoView, peer: PeerProcess) -> IpcSend {
        IpcSend {
            fifo: view.0,
            _memory: memory,
            peer,
        }
    }
}

impl SendEnd for IpcSend {
    fn poll(&mut self) -> Result<Option<Event>> {
        let head = self.fifo.head().load();
        self.peer.poll_head(head)
    }

    fn slot_mut(&mut self, slot: SlotIndex, len: usize) -> Result<&mut [u8]> {
        let p = self.fifo.slot(slot, len)?;
        // SAFETY: the engine hands out a send span only for steps the
        // successor credited (`head`, acquire) and not yet published, so
        // the receiver does not read the slot meanwhile; the slice borrows
        // `self` mutably, so no other slice of this end is alive.
        Ok(unsafe { std::slice::from_raw_parts_mut(p.as_ptr(), len) })
    }

    fn post(
        &mut self,
        _seq: u64,
        span: SlotSpan,
        header: Option<&[u8; CALL_HEADER_LEN]>,
        _bytes: usize,
    ) -> Result<()> {
        if let Some(h) = header {
            self.fifo.post_header(span.step + 1, h);
        }
        // Release: the header and the slice's bytes before the counter.
        self.fifo.tail().post(span.end());
        Ok(())
    }
}
