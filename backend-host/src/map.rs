//! The raw layer: one shared mapping of a segment's file descriptor,
//! unmapped on drop.

use std::ffi::c_void;
use std::os::fd::AsFd;
use std::ptr::NonNull;

use rustix::mm::{MapFlags, ProtFlags};

use crate::error::{Error, Result};

/// `len` bytes of a shared-memory object mapped read-write and shared.
#[derive(Debug)]
pub(crate) struct Mapping {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: a mapping belongs to the process, not to the thread that made it;
// moving the owner to another thread moves nothing in memory. (`Sync` is
// deliberately not implemented: the slot copies rely on one user per end.)
unsafe impl Send for Mapping {}

impl Mapping {
    /// Maps the first `len` bytes of `fd` (`len` > 0).
    pub(crate) fn new(fd: impl AsFd, len: usize, segment: &str) -> Result<Mapping> {
        if len == 0 {
            return Err(Error::Internal(format!("mapping 0 bytes of {segment}")));
        }
        // SAFETY: a null hint lets the kernel choose a fresh range, so no
        // existing Rust object is overlapped; the result is checked, and the
        // range is only unmapped by `Drop`, with the same length.
        let p = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                fd,
                0,
            )
        }
        .map_err(Error::shm("mmap", segment))?;
        let base = NonNull::new(p.cast::<u8>())
            .ok_or_else(|| Error::Internal(format!("mmap of {segment} returned null")))?;
        Ok(Mapping { base, len })
    }

    /// The first byte (page aligned).
    pub(crate) fn base(&self) -> NonNull<u8> {
        self.base
    }

    /// Bytes mapped.
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `base..base+len` is exactly the range `mmap` returned, and
        // every reference handed out into it borrows the owner of this
        // mapping, so none outlives it.
        let r = unsafe { rustix::mm::munmap(self.base.as_ptr().cast::<c_void>(), self.len) };
        if let Err(e) = r {
            tracing::warn!("munmap of a shared-memory segment failed: {e}");
        }
    }
}
