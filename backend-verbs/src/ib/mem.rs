//! Registered memory: the buffers this crate owns (FIFO slots, mailboxes,
//! credit counters, staging). The caller's buffers are never registered:
//! the executor reads the incoming slot in place and writes the outgoing
//! one into staging, so the NIC only ever touches memory an end owns.
//!
//! The unsafe part is small and in one place: memory that a NIC may write
//! is only ever handed out as a byte slice for a range the slot protocol
//! says no remote writer touches (see [`HostBuf::bytes`]).

use std::alloc::Layout;
use std::ptr::NonNull;
use std::sync::Arc;

use sideway::ibverbs::memory_region::MemoryRegion;
use sideway::ibverbs::protection_domain::ProtectionDomain;
use sideway::ibverbs::AccessFlags;

use crate::error::{Error, Result};

/// Page alignment for everything registered.
const ALIGN: usize = 4096;

/// A zeroed, page-aligned heap allocation.
struct Alloc {
    ptr: NonNull<u8>,
    layout: Layout,
}

impl Alloc {
    fn zeroed(len: usize) -> Option<Alloc> {
        let layout = Layout::from_size_align(len.max(1), ALIGN).ok()?;
        // SAFETY: `layout` has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        NonNull::new(ptr).map(|ptr| Alloc { ptr, layout })
    }
}

impl Drop for Alloc {
    fn drop(&mut self) {
        // SAFETY: allocated in `zeroed` with this layout, freed once.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// A buffer this crate owns, registered with one protection domain.
///
/// Field order matters: the registration is dropped (deregistered) before
/// the memory is freed.
pub(crate) struct HostBuf {
    mr: Arc<MemoryRegion>,
    mem: Alloc,
    len: usize,
}

// SAFETY: the buffer is plain memory; all access goes through `&self`
// methods whose callers uphold the slot protocol.
unsafe impl Send for HostBuf {}

impl HostBuf {
    /// `len` zeroed bytes registered with `access` on `pd`.
    pub fn new(
        pd: &Arc<ProtectionDomain>,
        len: usize,
        access: AccessFlags,
        device: &str,
    ) -> Result<HostBuf> {
        let mem = Alloc::zeroed(len).ok_or_else(|| Error::Verbs {
            call: "alloc",
            device: device.to_owned(),
            source: format!("cannot allocate {len} bytes").into(),
        })?;
        // SAFETY: `mem` is valid for `len` bytes and outlives the
        // registration (field order: `mr` drops first).
        let mr = unsafe { pd.reg_mr(mem.ptr.as_ptr() as usize, len.max(1), access) }
            .map_err(Error::verbs("ibv_reg_mr", device))?;
        Ok(HostBuf { mr, mem, len })
    }

    pub fn addr(&self) -> u64 {
        self.mem.ptr.as_ptr() as u64
    }

    pub fn lkey(&self) -> u32 {
        self.mr.lkey()
    }

    pub fn rkey(&self) -> u32 {
        self.mr.rkey()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    fn range(&self, offset: u64, len: usize) -> Option<*mut u8> {
        let off = usize::try_from(offset).ok()?;
        if off.checked_add(len)? > self.len {
            return None;
        }
        // SAFETY: `off + len <= self.len`, inside the allocation.
        Some(unsafe { self.mem.ptr.as_ptr().add(off) })
    }

    /// `len` bytes at `offset` (`None` out of bounds).
    ///
    /// # Safety
    /// No remote writer may target the range while the slice lives: for a
    /// FIFO slot, the `tail` covering it has been seen and its credit not
    /// yet returned; for a buffer without remote access, always true.
    pub unsafe fn bytes(&self, offset: u64, len: usize) -> Option<&[u8]> {
        let p = self.range(offset, len)?;
        // SAFETY: in bounds; the caller excludes concurrent remote writes
        // and no `&mut` to the range exists (see `bytes_mut`).
        Some(unsafe { std::slice::from_raw_parts(p, len) })
    }

    /// `len` writable bytes at `offset` (`None` out of bounds).
    ///
    /// # Safety
    /// No remote writer may target the range, and the NIC must not be
    /// reading it (no posted request that gathers from it is
    /// outstanding), while the slice lives.
    pub unsafe fn bytes_mut(&mut self, offset: u64, len: usize) -> Option<&mut [u8]> {
        let p = self.range(offset, len)?;
        // SAFETY: in bounds; `&mut self` excludes every other slice of
        // this buffer, the caller excludes the NIC.
        Some(unsafe { std::slice::from_raw_parts_mut(p, len) })
    }

    /// A copy of the `N` bytes at `offset` (memory a remote may write: a
    /// counter, a header mailbox).
    pub fn read_array<const N: usize>(&self, offset: u64) -> Option<[u8; N]> {
        let p = self.range(offset, N)?;
        // SAFETY: in bounds; `[u8; N]` has alignment 1. A volatile copy of
        // bytes a NIC may be writing yields some value of them: callers
        // only compare counters (monotonic) or parse a header (checked).
        Some(unsafe { std::ptr::read_volatile(p as *const [u8; N]) })
    }
}
