//! Registered memory: the buffers this crate owns (FIFO slots, mailboxes,
//! credit counters, staging), and FIFO memory a caller lends an end
//! ([`FifoMemory`]: a device loop's staging regions, which the NIC then
//! reads and writes in place; device memory too, lent as a dma-buf:
//! GPUDirect RDMA). A communicator's call buffers are never
//! registered: the executor reads the incoming slot in place and writes
//! the outgoing one into staging.
//!
//! The unsafe part is small and in one place: memory that a NIC may write
//! is only ever handed out as a byte slice for a range the slot protocol
//! says no remote writer touches (see [`HostBuf::bytes`]).

use std::alloc::Layout;
use std::ptr::NonNull;
use std::sync::Arc;

use ringcc_comm::transport::FifoMemory;
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

/// The memory under a [`HostBuf`].
enum Mem {
    /// Allocated (and freed) by the buffer.
    Owned(Alloc),
    /// Lent by the caller, who keeps it alive (see [`HostBuf::lent`]).
    Lent(NonNull<u8>),
    /// Device memory lent as a dma-buf, at this device address (the
    /// registration's I/O virtual address): the NIC reads and writes it,
    /// the CPU never does.
    Device(u64),
}

impl Mem {
    /// The first byte's address as work requests name it.
    fn addr(&self) -> u64 {
        match self {
            Mem::Owned(a) => a.ptr.as_ptr() as u64,
            Mem::Lent(p) => p.as_ptr() as u64,
            Mem::Device(iova) => *iova,
        }
    }

    /// The first byte for the CPU (`None`: device memory).
    fn ptr(&self) -> Option<*mut u8> {
        match self {
            Mem::Owned(a) => Some(a.ptr.as_ptr()),
            Mem::Lent(p) => Some(p.as_ptr()),
            Mem::Device(_) => None,
        }
    }
}

/// A buffer registered with one protection domain: this crate's own, or
/// memory lent to an end.
///
/// Field order matters: the registration is dropped (deregistered) before
/// the memory is freed.
pub(crate) struct HostBuf {
    mr: Arc<MemoryRegion>,
    mem: Mem,
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
        Ok(HostBuf {
            mr,
            mem: Mem::Owned(mem),
            len,
        })
    }

    /// The lent memory `mem`, registered with `access` on `pd`: host
    /// memory with `ibv_reg_mr`, device memory lent as a dma-buf with
    /// `ibv_reg_dmabuf_mr` (GPUDirect RDMA), its device address as the
    /// registration's I/O virtual address, so that work requests name it
    /// as the loop does.
    ///
    /// # Safety
    /// `mem`'s contract ([`FifoMemory::new`], [`FifoMemory::dma_buf`]):
    /// it stays valid and in place until this buffer (and whatever queue
    /// pair may reach it) is dropped.
    pub unsafe fn lent(
        pd: &Arc<ProtectionDomain>,
        mem: FifoMemory,
        access: AccessFlags,
        device: &str,
    ) -> Result<HostBuf> {
        let refuse = |call, why: &str| Error::Verbs {
            call,
            device: device.to_owned(),
            source: why.to_owned().into(),
        };
        let len = mem.len();
        if let Some((fd, offset)) = mem.device() {
            let iova = mem.addr() as u64;
            if len == 0 || iova == 0 || fd < 0 {
                return Err(refuse(
                    "ibv_reg_dmabuf_mr",
                    "lent device memory that is empty, at address 0 or without a dma-buf",
                ));
            }
            // SAFETY: `fd` is a dma-buf of `len` bytes of device memory
            // from `offset` on, which the caller keeps allocated until
            // this buffer drops; the registration drops first (field
            // order). The CPU never touches it (`Mem::Device`).
            let mr = unsafe { pd.reg_dmabuf_mr(offset, len, iova, fd, access) }
                .map_err(Error::verbs("ibv_reg_dmabuf_mr", device))?;
            return Ok(HostBuf {
                mr,
                mem: Mem::Device(iova),
                len,
            });
        }
        let ptr = NonNull::new(mem.as_ptr())
            .filter(|_| len != 0)
            .ok_or_else(|| refuse("ibv_reg_mr", "lent memory that is empty or at address 0"))?;
        // SAFETY: the caller keeps `mem` valid for `len` bytes until this
        // buffer drops, and the registration drops first (field order).
        let mr = unsafe { pd.reg_mr(ptr.as_ptr() as usize, len, access) }
            .map_err(Error::verbs("ibv_reg_mr", device))?;
        Ok(HostBuf {
            mr,
            mem: Mem::Lent(ptr),
            len,
        })
    }

    /// The first byte's address as work requests name it (a device
    /// address for device memory).
    pub fn addr(&self) -> u64 {
        self.mem.addr()
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

    /// The CPU's pointer to `len` bytes at `offset`: `None` out of
    /// bounds, and always for device memory.
    fn range(&self, offset: u64, len: usize) -> Option<*mut u8> {
        let off = usize::try_from(offset).ok()?;
        if off.checked_add(len)? > self.len {
            return None;
        }
        let base = self.mem.ptr()?;
        // SAFETY: `off + len <= self.len`, inside the allocation.
        Some(unsafe { base.add(off) })
    }

    /// `len` bytes at `offset` (`None` out of bounds, or device memory).
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

    /// `len` writable bytes at `offset` (`None` out of bounds, or device
    /// memory).
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
