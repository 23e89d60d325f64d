//! Hints to the CPU about the lanes, the one structure of a large
//! simulation too big for the caches: a prefetch ahead of use (the huge
//! pages they sit on are [`crate::huge`]'s). Hints only: no load returns
//! anything else for them.

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
