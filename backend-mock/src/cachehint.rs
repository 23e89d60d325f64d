//! Hints to the CPU and the kernel about the lanes, the one structure of a
//! large simulation too big for the caches: a prefetch ahead of use, and
//! huge pages (16 K lanes span 2300 pages of 4 KiB, beyond the TLB; a
//! miss costs a page walk, two-dimensional in a virtual machine). Hints
//! only: neither changes what any load returns. The only `unsafe` of this
//! crate.

/// Asks the CPU to start loading the first `lines` cache lines of `*v`.
/// A no-op on targets without a stable prefetch intrinsic.
#[inline(always)]
pub(crate) fn prefetch<T>(v: &T, lines: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let p = (v as *const T).cast::<i8>();
        for k in 0..lines {
            // SAFETY: `_mm_prefetch` needs SSE, which every x86_64 CPU has
            // (it is in the target's baseline features). A prefetch never
            // faults and changes no memory, whatever the address, so an
            // address past the end of `*v` (`wrapping_add`, never
            // dereferenced) is harmless.
            #[allow(unsafe_code)]
            unsafe {
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(64 * k));
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (v, lines);
    }
}

/// [`prefetch`] of the `lines` cache lines at address `addr` (an address
/// taken from a live value earlier: a hint, never dereferenced).
#[inline(always)]
pub(crate) fn prefetch_addr(addr: usize, lines: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let p = addr as *const i8;
        for k in 0..lines {
            // SAFETY: as in `prefetch`: a prefetch never faults and
            // changes no memory, whatever the address.
            #[allow(unsafe_code)]
            unsafe {
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(64 * k));
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (addr, lines);
    }
}

/// An empty vector with room for `n` elements whose memory the kernel is
/// asked to back with transparent huge pages (Linux, `MADV_HUGEPAGE`;
/// ignored where unsupported). Call before filling it: pages are chosen
/// when first touched.
pub(crate) fn huge_vec<T>(n: usize) -> Vec<T> {
    let v = Vec::with_capacity(n);
    #[cfg(target_os = "linux")]
    {
        const PAGE: usize = 4096;
        let bytes = n.saturating_mul(std::mem::size_of::<T>());
        let start = v.as_ptr() as usize;
        // Whole pages inside the allocation.
        let lo = start.div_ceil(PAGE) * PAGE;
        let hi = (start + bytes) / PAGE * PAGE;
        if bytes >= 2 << 20 && hi > lo {
            // SAFETY: `[lo, hi)` is page-aligned and lies inside the
            // vector's allocation, which lives at least as long as this
            // call; `MADV_HUGEPAGE` only sets the kernel's paging policy
            // for the range: contents and validity are unchanged, and a
            // failure (a kernel without transparent huge pages) leaves
            // everything as it was.
            #[allow(unsafe_code)]
            unsafe {
                libc::madvise(lo as *mut libc::c_void, hi - lo, libc::MADV_HUGEPAGE);
            }
        }
    }
    v
}
