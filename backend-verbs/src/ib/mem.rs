//! Registered memory: the buffers this crate owns (FIFO slots, mailboxes,
//! credit counters, staging), and FIFO memory a caller lends an end
//! ([`FifoMemory`]: a device loop's staging regions, which the NIC then
//! reads and writes in place; device memory too, lent as a dma-buf:
//! GPUDirect RDMA), and a communicator call's buffers for the length of
//! the call ([`Leases`]: read-only registrations, so that a large call's
//! sends leave from the caller's memory instead of a staging copy).
//!
//! The unsafe part is small and in one place: memory that a NIC may write
//! is only ever handed out as a byte slice for a range the slot protocol
//! says no remote writer touches (see [`HostBuf::bytes`]).

use std::alloc::Layout;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, Weak};

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

/// The caller's memory registered for one call (local read only: the NIC
/// reads the slices it sends and never writes), shared by the ends on
/// one protection domain: every sending end of a call is lent the same
/// buffers, and one registration serves them all. A registration lives
/// while some end holds it ([`Lease`]); the ends let go when the call
/// ends, so nothing stays registered past the call that lent the memory
/// (a cache across calls would keep pinning pages the caller may have
/// freed and reused).
pub(crate) struct Leases {
    pd: Arc<ProtectionDomain>,
    device: String,
    live: Mutex<Vec<(usize, usize, Weak<MemoryRegion>)>>,
}

/// One end's hold on a registration of lent memory.
pub(crate) struct Lease {
    addr: usize,
    len: usize,
    mr: Arc<MemoryRegion>,
}

impl Lease {
    /// The local key of the bytes `data`, when they lie in this lease.
    pub fn lkey_of(&self, data: &[u8]) -> Option<u32> {
        within((self.addr, self.len), (data.as_ptr() as usize, data.len())).then(|| self.mr.lkey())
    }
}

/// Whether the bytes `(at, len)` lie in the region `(addr, size)`.
fn within((addr, size): (usize, usize), (at, len): (usize, usize)) -> bool {
    match (at.checked_add(len), addr.checked_add(size)) {
        (Some(end), Some(limit)) => at >= addr && end <= limit,
        _ => false,
    }
}

impl Leases {
    pub fn new(pd: &Arc<ProtectionDomain>, device: &str) -> Leases {
        Leases {
            pd: Arc::clone(pd),
            device: device.to_owned(),
            live: Mutex::new(Vec::new()),
        }
    }

    /// `mem`, registered for local reads: the registration some end
    /// already holds for exactly these bytes, else a new one.
    ///
    /// # Safety
    /// `mem` stays valid until every [`Lease`] of it is dropped and no
    /// request that reads it is still in flight (the caller's contract
    /// of [`SendEnd::lend`](ringcc_comm::transport::SendEnd::lend)).
    pub unsafe fn lease(&self, mem: &[u8]) -> Result<Lease> {
        let (addr, len) = (mem.as_ptr() as usize, mem.len());
        let mut live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        live.retain(|(_, _, mr)| mr.strong_count() > 0);
        if let Some(mr) = live
            .iter()
            .find(|&&(a, l, _)| (a, l) == (addr, len))
            .and_then(|(_, _, mr)| mr.upgrade())
        {
            return Ok(Lease { addr, len, mr });
        }
        // SAFETY: `mem` is valid for `len` bytes for as long as the
        // registration lives (the caller's contract); local read access
        // lets the NIC only read it.
        let mr = unsafe { self.pd.reg_mr(addr, len.max(1), AccessFlags::none()) }
            .map_err(Error::verbs("ibv_reg_mr", &self.device))?;
        live.push((addr, len, Arc::downgrade(&mr)));
        Ok(Lease { addr, len, mr })
    }
}

#[cfg(test)]
mod tests {
    use super::within;

    #[test]
    fn a_slice_is_sent_from_a_lease_only_when_it_lies_in_it() {
        let region = (4096, 1000);
        assert!(within(region, (4096, 1000)));
        assert!(within(region, (4500, 596)));
        assert!(within(region, (5096, 0)));
        assert!(!within(region, (4500, 597)));
        assert!(!within(region, (4095, 1)));
        assert!(!within(region, (5097, 0)));
        assert!(!within(region, (usize::MAX, 2)));
        assert!(!within((usize::MAX, 2), (usize::MAX, 0)));
    }
}
