//! The raw layer of shared memory that transports map: one shared,
//! read-write mapping of a file descriptor's first bytes (a POSIX
//! shared-memory segment, a memfd standing in for device memory),
//! unmapped on drop. Each transport wraps it in its own checked layer.

use std::ffi::c_void;
use std::os::fd::AsFd;
use std::ptr::NonNull;

use rustix::io::Errno;
use rustix::mm::{MapFlags, ProtFlags};

/// `len` bytes of a descriptor mapped read-write and shared.
#[derive(Debug)]
pub struct Mapping {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: a mapping belongs to the process, not to the thread that made
// it; moving its owner to another thread moves nothing in memory. Not
// `Sync`: each end is used by one thread at a time.
unsafe impl Send for Mapping {}

impl Mapping {
    /// Maps the first `len` bytes of `fd`; `len` 0 is `EINVAL`, as
    /// `mmap` says.
    pub fn new(fd: impl AsFd, len: usize) -> Result<Mapping, Errno> {
        if len == 0 {
            return Err(Errno::INVAL);
        }
        // SAFETY: a null hint lets the kernel choose a fresh range, so no
        // Rust object is overlapped; the result is checked, and the range
        // is unmapped only by `Drop`, with the same length.
        let p = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                fd,
                0,
            )
        }?;
        let base = NonNull::new(p.cast::<u8>()).ok_or(Errno::FAULT)?;
        Ok(Mapping { base, len })
    }

    /// The first byte (page aligned).
    pub fn base(&self) -> NonNull<u8> {
        self.base
    }

    /// Bytes mapped.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is mapped (never: `new` refuses 0 bytes).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `base..base+len` is exactly the range `mmap` returned;
        // every reference into it borrows the mapping's owner, so none
        // outlives it.
        let r = unsafe { rustix::mm::munmap(self.base.as_ptr().cast::<c_void>(), self.len) };
        if let Err(e) = r {
            tracing::warn!("munmap of a shared mapping failed: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two mappings of one memfd share their bytes; 0 bytes is refused.
    #[test]
    fn two_mappings_of_one_descriptor_share_bytes() {
        let fd =
            rustix::fs::memfd_create("ringcc-map-test", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        rustix::fs::ftruncate(&fd, 4096).unwrap();
        let a = Mapping::new(&fd, 4096).unwrap();
        let b = Mapping::new(&fd, 4096).unwrap();
        assert_eq!(a.len(), 4096);
        assert!(!a.is_empty());
        // SAFETY: both map the same 4096 live bytes; one thread.
        unsafe {
            a.base().as_ptr().add(100).write_volatile(42);
            assert_eq!(b.base().as_ptr().add(100).read_volatile(), 42);
        }
        assert_eq!(Mapping::new(&fd, 0).unwrap_err(), Errno::INVAL);
    }
}
