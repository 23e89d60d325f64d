//! The checked layer: one connection's FIFO in a POSIX shared-memory
//! segment, created by the receiver and opened by the sender.
//!
//! Protocol, per segment:
//! 1. the owner (receiver) [`create`](Segment::create)s it: `shm_open`
//!    exclusive, mode 0600, `ftruncate`, `mmap`, header fields, and last the
//!    magic word with release;
//! 2. the peer (sender) [`open`](Segment::open)s it, retrying until the
//!    magic is visible (acquire) or its deadline passes, and checks layout
//!    version, token hash, geometry, size, owner uid and mode;
//! 3. the owner [`unlink`](Segment::unlink)s the name once the peer says it
//!    has mapped it (out of band; the mappings stay valid);
//! 4. the sender fills slots of steps below `head + STEPS` and publishes
//!    them by posting `tail`; the receiver reads slots of steps below
//!    `tail` and frees them by posting `head` (see `ringcc_core::fifo`).

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ringcc_core::fifo::{FifoGeometry, StepCounter, STEPS};
use ringcc_core::wire::call_header::CALL_HEADER_LEN;
use ringcc_core::{Protocol, SlotIndex};
use rustix::fs::Mode;
use rustix::io::Errno;
use rustix::shm::{self, OFlags};

use crate::error::{Error, Result};
use crate::layout::{field, Layout, LAYOUT_VERSION, MAGIC};
use crate::name::{token_hash, SegmentName};
use ringcc_comm::map::Mapping;

// The counters and the magic word are viewed in place as atomics.
const _: () = assert!(size_of::<StepCounter>() == 8 && align_of::<StepCounter>() <= Layout::LINE);
const _: () = assert!(size_of::<AtomicU64>() == 8 && align_of::<AtomicU64>() <= Layout::LINE);

/// How long the opener naps between two looks for its segment.
const OPEN_NAP: Duration = Duration::from_millis(1);

/// One connection's FIFO in shared memory: header, `tail` and `head`
/// counters, call-header mailbox, [`STEPS`] slots (see [`Layout`]).
///
/// The owner (the receiving rank) creates it and unlinks its name; the
/// peer (the sending rank) opens it. Dropping either unmaps; dropping the
/// owner also unlinks a name still linked.
#[derive(Debug)]
pub struct Segment {
    name: SegmentName,
    map: Mapping,
    layout: Layout,
    geometry: FifoGeometry,
    owner: bool,
    linked: bool,
}

impl Segment {
    /// Creates the segment `name` for a FIFO of `geometry` in the job of
    /// `token` (owner side). Fails with [`Error::Shm`] (`shm_open`,
    /// `EEXIST`) when the name exists already, e.g. left by a crashed job.
    pub fn create(name: &SegmentName, geometry: FifoGeometry, token: &str) -> Result<Segment> {
        let layout = Layout::new(geometry)?;
        let n = name.as_str();
        let fd = shm::open(
            n,
            OFlags::CREATE | OFlags::EXCL | OFlags::RDWR,
            Mode::from_raw_mode(0o600),
        )
        .map_err(Error::shm("shm_open", n))?;
        match Self::init(fd, name, layout, geometry, token) {
            Ok(seg) => Ok(seg),
            Err(e) => {
                if let Err(u) = shm::unlink(n) {
                    tracing::warn!("shm_unlink of {n} after a failed create: {u}");
                }
                Err(e)
            }
        }
    }

    fn init(
        fd: OwnedFd,
        name: &SegmentName,
        layout: Layout,
        geometry: FifoGeometry,
        token: &str,
    ) -> Result<Segment> {
        let n = name.as_str();
        // The umask may have cleared bits of the mode `shm_open` was given.
        rustix::fs::fchmod(&fd, Mode::from_raw_mode(0o600)).map_err(Error::shm("fchmod", n))?;
        rustix::fs::ftruncate(&fd, layout.total()).map_err(Error::shm("ftruncate", n))?;
        let len = usize::try_from(layout.total())
            .map_err(|_| Error::Internal(format!("segment {n}: size beyond usize")))?;
        let map = Mapping::new(&fd, len).map_err(Error::shm("mmap", n))?;
        let seg = Segment {
            name: name.clone(),
            map,
            layout,
            geometry,
            owner: true,
            linked: true,
        };
        let words = [
            (field::VERSION, LAYOUT_VERSION),
            (field::TOKEN_HASH, token_hash(token)),
            (field::SLOT_BYTES, geometry.slot_bytes()),
            (field::SLOTS_PER_SLICE, geometry.slots_per_slice()),
            (field::DEPTH, STEPS),
            (field::TOTAL, layout.total()),
        ];
        for (off, v) in words {
            // SAFETY: `off` is one of the header's word offsets, inside the
            // first line of a mapping of at least `Layout::SLOTS` bytes and
            // 8-aligned (the mapping is page aligned). No other process
            // reads the header before it sees the magic word below, which is
            // stored after these with release.
            unsafe { seg.ptr(off).cast::<u64>().write(v) };
        }
        seg.magic().store(MAGIC, Ordering::Release);
        Ok(seg)
    }

    /// Opens the segment `name` that the owner creates for `expected`, in
    /// the job of `token` (peer side). Retries until the owner has created
    /// and published it; [`Error::Timeout`] naming the segment once
    /// `deadline` passes. A segment of another layout or with the wrong
    /// size, owner or mode is [`Error::BadSegment`], of another job
    /// [`Error::Stranger`], of another geometry [`Error::BadConfig`].
    pub fn open(
        name: &SegmentName,
        token: &str,
        expected: FifoGeometry,
        deadline: Instant,
    ) -> Result<Segment> {
        let layout = Layout::new(expected)?;
        crate::wait::poll_until(
            deadline,
            OPEN_NAP,
            || Self::try_open(name, token, expected, layout),
            || format!("shared-memory segment {name} to be created and published by its owner"),
        )
    }

    /// One look: `None` while the owner has not created or published it.
    fn try_open(
        name: &SegmentName,
        token: &str,
        expected: FifoGeometry,
        layout: Layout,
    ) -> Result<Option<Segment>> {
        let n = name.as_str();
        let fd = match shm::open(n, OFlags::RDWR, Mode::empty()) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => return Ok(None),
            Err(e) => return Err(Error::shm("shm_open", n)(e)),
        };
        let size = rustix::fs::fstat(&fd)
            .map_err(Error::shm("fstat", n))?
            .st_size;
        if size == 0 {
            return Ok(None); // created, not yet sized
        }
        let bad = |reason: String| Error::BadSegment {
            segment: n.to_owned(),
            reason,
        };
        let len = usize::try_from(size)
            .ok()
            .filter(|&l| l >= Layout::SLOTS)
            .ok_or_else(|| bad(format!("{size} bytes, less than a header")))?;
        let map = Mapping::new(&fd, len).map_err(Error::shm("mmap", n))?;
        let seg = Segment {
            name: name.clone(),
            map,
            layout,
            geometry: expected,
            owner: false,
            linked: false,
        };
        match seg.magic().load(Ordering::Acquire) {
            0 => return Ok(None), // sized, not yet published
            MAGIC => {}
            m => return Err(bad(format!("magic {m:#018x}, not a ringcc segment"))),
        }
        // Published: the owner set mode and size before the magic.
        let st = rustix::fs::fstat(&fd).map_err(Error::shm("fstat", n))?;
        let uid = rustix::process::getuid().as_raw();
        if st.st_uid != uid {
            return Err(bad(format!("owned by uid {}, not ours ({uid})", st.st_uid)));
        }
        let mode = st.st_mode & 0o7777;
        if mode != 0o600 {
            return Err(bad(format!("mode {mode:o}, not 600")));
        }
        let version = seg.header(field::VERSION);
        if version != LAYOUT_VERSION {
            return Err(bad(format!(
                "layout version {version}, this build speaks {LAYOUT_VERSION}"
            )));
        }
        let found = seg.header(field::TOKEN_HASH);
        let ours = token_hash(token);
        if found != ours {
            return Err(Error::Stranger {
                segment: n.to_owned(),
                ours,
                found,
            });
        }
        let depth = seg.header(field::DEPTH);
        if depth != STEPS {
            return Err(Error::BadConfig(format!(
                "shared-memory segment {n} has {depth} slots, this build uses {STEPS}"
            )));
        }
        let (sb, sps) = (
            seg.header(field::SLOT_BYTES),
            seg.header(field::SLOTS_PER_SLICE),
        );
        if (sb, sps) != (expected.slot_bytes(), expected.slots_per_slice()) {
            return Err(match FifoGeometry::new(sb, sps) {
                Ok(g) => Error::geometry_mismatch(n, expected, g),
                Err(_) => bad(format!("invalid geometry {sb} B x {sps} slot(s) per slice")),
            });
        }
        let total = seg.header(field::TOTAL);
        if total != layout.total() || u64::try_from(size).ok() != Some(total) {
            return Err(bad(format!(
                "{size} bytes (header says {total}), the layout needs {}",
                layout.total()
            )));
        }
        seg.peer_flag().store(1, Ordering::Release);
        Ok(Some(seg))
    }

    /// Removes the name (owner side), once the peer has mapped the segment;
    /// both mappings stay valid. Idempotent. On the peer's side a
    /// [`Error::BadConfig`]: only the owner unlinks.
    pub fn unlink(&mut self) -> Result<()> {
        if !self.owner {
            return Err(Error::BadConfig(format!(
                "only the owner of {} unlinks it",
                self.name
            )));
        }
        if self.linked {
            shm::unlink(self.name.as_str())
                .map_err(Error::shm("shm_unlink", self.name.as_str()))?;
            self.linked = false;
        }
        Ok(())
    }

    /// The segment's name.
    pub fn name(&self) -> &SegmentName {
        &self.name
    }

    /// Its FIFO geometry.
    pub fn geometry(&self) -> FifoGeometry {
        self.geometry
    }

    /// Its byte layout.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// Whether this side created it (the receiver).
    pub fn is_owner(&self) -> bool {
        self.owner
    }

    /// Whether the name is still linked (owner side; always `false` on
    /// the peer's).
    pub fn is_linked(&self) -> bool {
        self.linked
    }

    /// The `tail` counter: steps the sender has filled.
    pub fn tail(&self) -> &StepCounter {
        self.counter(Layout::TAIL)
    }

    /// The `head` counter: steps the receiver has consumed.
    pub fn head(&self) -> &StepCounter {
        self.counter(Layout::HEAD)
    }

    /// The call-header mailbox's sequence: posted (release) after the
    /// header bytes, by [`post_call_header`](Self::post_call_header).
    pub fn call_header_seq(&self) -> &StepCounter {
        self.counter(Layout::MAILBOX_SEQ)
    }

    /// Writes a call header into the mailbox, then posts `seq` (sender
    /// side). The receiver must have consumed the previous header (the
    /// protocol's call order guarantees it).
    pub fn post_call_header(&self, seq: u64, header: &[u8; CALL_HEADER_LEN]) {
        // SAFETY: `MAILBOX..MAILBOX+CALL_HEADER_LEN` lies inside the mapping
        // (before `SLOTS`) and cannot overlap `header`, which is Rust memory.
        // Protocol invariant: only the sender writes the mailbox, and only
        // while the receiver is not reading it (it reads after the posted
        // sequence, before the first slice of the call is credited).
        unsafe {
            std::ptr::copy_nonoverlapping(
                header.as_ptr(),
                self.ptr(Layout::MAILBOX),
                CALL_HEADER_LEN,
            );
        }
        self.call_header_seq().post(seq);
    }

    /// The mailbox's header bytes (receiver side), valid for the sequence
    /// [`call_header_seq`](Self::call_header_seq) showed before this call.
    pub fn read_call_header(&self) -> [u8; CALL_HEADER_LEN] {
        let mut out = [0u8; CALL_HEADER_LEN];
        // SAFETY: as in `post_call_header`; the caller has loaded (acquire)
        // the sequence the sender posted after writing these bytes, and the
        // sender writes no new header until the receiver moved on.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.ptr(Layout::MAILBOX),
                out.as_mut_ptr(),
                CALL_HEADER_LEN,
            );
        }
        out
    }

    /// The slot `index` (`0..STEPS`; [`ringcc_core::fifo::slot_of`] maps a
    /// step to it). An index beyond is [`Error::NoSuchSlot`].
    pub fn slot(&self, index: SlotIndex) -> Result<SlotRef<'_>> {
        let i = u64::from(index.get());
        // Not `ok_or`: that builds (and drops) the error on every call of
        // this hot path.
        let Some(off) = self
            .layout
            .slot_offset(i)
            .and_then(|o| usize::try_from(o).ok())
        else {
            return Err(Error::NoSuchSlot { slot: i });
        };
        Ok(SlotRef {
            index,
            ptr: self.ptr(off),
            capacity: self.layout.slot_bytes(),
            _segment: std::marker::PhantomData,
        })
    }

    /// The line slot `index` of `protocol` (LL: its 8-byte units; LL128:
    /// its lines' 64-bit words), as atomics both ends store and load, and
    /// the data bytes it carries. Simple, or an index beyond the slots,
    /// is [`Error::NoSuchSlot`].
    pub fn lines(&self, protocol: Protocol, index: SlotIndex) -> Result<(&[AtomicU64], usize)> {
        let i = u64::from(index.get());
        let Some((off, bytes, data)) = self.layout.line_slot(protocol, i).and_then(|(o, b, d)| {
            Some((
                usize::try_from(o).ok()?,
                usize::try_from(b).ok()?,
                usize::try_from(d).ok()?,
            ))
        }) else {
            return Err(Error::NoSuchSlot { slot: i });
        };
        debug_assert!(off.is_multiple_of(8) && bytes.is_multiple_of(8));
        debug_assert!(off + bytes <= self.map.len());
        // SAFETY: the layout puts the slot's `bytes` (a multiple of 8) at
        // `off` (a multiple of 128) inside the mapping (`line_slot` keeps
        // it below the total, the mapping's length), which lives as long
        // as `&self`; the mapping is page aligned, so every word is
        // 8-aligned. The bytes are initialised (zero from `ftruncate`) and
        // every bit pattern is a valid `u64`. Both processes access the
        // line regions only through these atomics (no plain reads or
        // writes, no other view overlaps them).
        let words = unsafe {
            std::slice::from_raw_parts(self.ptr(off).cast::<AtomicU64>().cast_const(), bytes / 8)
        };
        Ok((words, data))
    }

    /// Pointer to the first byte of the layout line at `off` (a bell's
    /// words; see `bell.rs`).
    pub(crate) fn line_ptr(&self, off: usize) -> *mut u8 {
        debug_assert!(off.is_multiple_of(Layout::LINE) && off < Layout::SLOTS);
        self.ptr(off)
    }

    /// Pointer to byte `off` of the mapping (`off` < the mapping's length,
    /// which every caller's offset satisfies by the layout).
    fn ptr(&self, off: usize) -> *mut u8 {
        debug_assert!(off < self.map.len());
        // SAFETY: every `off` passed here comes from `Layout` and is below
        // its total, which is the mapping's length (checked in `open`,
        // made so in `create`), so the result stays inside the mapping.
        unsafe { self.map.base().as_ptr().add(off) }
    }

    fn counter(&self, off: usize) -> &StepCounter {
        // SAFETY: `off` is a line-aligned counter offset of the layout, so
        // the word is aligned and inside the mapping, which lives as long as
        // `&self`. Its bytes are initialised (zero from `ftruncate`, then
        // only atomic stores), every bit pattern is a valid `u64`, and
        // `StepCounter` is `repr(transparent)` over `AtomicU64`. Both
        // processes only access the word atomically.
        unsafe { &*self.ptr(off).cast::<StepCounter>() }
    }

    /// Whether the peer has mapped and checked the segment (owner side):
    /// from then on the name may be unlinked.
    pub fn peer_mapped(&self) -> bool {
        self.peer_flag().load(Ordering::Acquire) != 0
    }

    fn peer_flag(&self) -> &AtomicU64 {
        // SAFETY: as in `counter`: an 8-aligned word of the header line
        // inside the mapping, zero until the opener's release store, only
        // accessed atomically by both processes.
        unsafe { &*self.ptr(field::PEER_MAPPED).cast::<AtomicU64>() }
    }

    fn magic(&self) -> &AtomicU64 {
        // SAFETY: as in `counter`: offset 0 of a page-aligned mapping,
        // accessed atomically by both processes (the owner's release store,
        // the opener's acquire load).
        unsafe { &*self.ptr(field::MAGIC).cast::<AtomicU64>() }
    }

    /// A header word, read after the magic was seen with acquire.
    fn header(&self, off: usize) -> u64 {
        // SAFETY: a header word offset: aligned, inside the mapping. The
        // owner wrote it before publishing the magic with release; we saw
        // the magic with acquire, and the owner never writes it again.
        unsafe { self.ptr(off).cast::<u64>().read() }
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        if self.owner && self.linked {
            if let Err(e) = shm::unlink(self.name.as_str()) {
                tracing::warn!("shm_unlink of {} on drop: {e}", self.name);
            }
        }
        // `self.map` unmaps.
    }
}

/// One slot of a [`Segment`]: checked copies in and out.
///
/// Slot bytes are plain memory, written by the sender and read by the
/// receiver only after the counter handshake: the sender writes the slot of
/// step `s` only when `s < head + STEPS` and publishes it by posting a
/// `tail` above `s` (release); the receiver reads it only once it has
/// loaded a `tail` above `s` (acquire), and frees it by posting a `head`
/// above `s`. So the two ends never touch a slot at the same time. No Rust
/// reference into slot memory is ever formed, only raw-pointer copies: a
/// peer that breaks the protocol can make this side copy torn or stale
/// bytes, and nothing here assumes those bytes are stable.
#[derive(Debug)]
pub struct SlotRef<'a> {
    index: SlotIndex,
    ptr: *mut u8,
    capacity: u64,
    _segment: std::marker::PhantomData<&'a Segment>,
}

impl<'a> SlotRef<'a> {
    /// Which slot.
    pub fn index(&self) -> SlotIndex {
        self.index
    }

    /// Bytes it holds.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    fn check(&self, len: usize) -> Result<()> {
        if u64::try_from(len).is_ok_and(|l| l <= self.capacity) {
            Ok(())
        } else {
            Err(Error::SlotOverflow {
                slot: u64::from(self.index.get()),
                len,
                capacity: self.capacity,
            })
        }
    }

    /// Copies `data` to the start of the slot (sender side, after credit
    /// for this step). More than [`capacity`](Self::capacity) bytes is
    /// [`Error::SlotOverflow`] and writes nothing.
    pub fn write_from(&self, data: &[u8]) -> Result<()> {
        self.check(data.len())?;
        // SAFETY: `data.len() <= capacity`, and the slot's `capacity` bytes
        // lie inside the mapping (the layout's slot range), which outlives
        // `'a`; `data` is Rust memory, so the ranges do not overlap.
        // Protocol invariant (see the type's doc): the receiver does not read
        // this slot until we post a `tail` past its step.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr, data.len()) };
        Ok(())
    }

    /// The first `len` bytes of the slot as a slice, for the executor to
    /// read in place (receiver side). More than
    /// [`capacity`](Self::capacity) bytes is [`Error::SlotOverflow`].
    ///
    /// # Safety
    /// The caller holds the slot by the credit protocol for `'a`: a `tail`
    /// past its step was loaded (acquire) and no `head` past it was posted
    /// yet, so the sender does not write it meanwhile. A peer that breaks
    /// the protocol can still change the bytes under the slice; it is
    /// the caller's promise that it runs only with its own job's peers.
    pub unsafe fn as_slice(&self, len: usize) -> Result<&'a [u8]> {
        self.check(len)?;
        // SAFETY: `len <= capacity` bytes inside the mapping, which
        // outlives `'a`; no writer touches them while the caller holds
        // the slot (the function's contract).
        Ok(unsafe { std::slice::from_raw_parts(self.ptr.cast_const(), len) })
    }

    /// The first `len` bytes of the slot as a mutable slice, for the
    /// executor to write in place (sender side). More than
    /// [`capacity`](Self::capacity) bytes is [`Error::SlotOverflow`].
    ///
    /// # Safety
    /// The caller holds the slot by the credit protocol for `'a`: the
    /// receiver posted a `head` that frees its step and no `tail` past it
    /// was posted yet, so the receiver does not read it meanwhile; and no
    /// other slice into the same slot is alive.
    pub unsafe fn as_mut_slice(&self, len: usize) -> Result<&'a mut [u8]> {
        self.check(len)?;
        // SAFETY: as in `as_slice`, with the roles swapped; the caller
        // promises this is the only live slice into the slot.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.ptr, len) })
    }

    /// Copies the first `out.len()` bytes of the slot into `out` (receiver
    /// side, after `tail` passed this step). More than
    /// [`capacity`](Self::capacity) bytes is [`Error::SlotOverflow`] and
    /// copies nothing.
    pub fn read_into(&self, out: &mut [u8]) -> Result<()> {
        self.check(out.len())?;
        // SAFETY: as in `write_from`, with the roles swapped: the sender
        // does not write this slot again until we post a `head` past its
        // step.
        unsafe {
            std::ptr::copy_nonoverlapping(self.ptr.cast_const(), out.as_mut_ptr(), out.len())
        };
        Ok(())
    }
}
