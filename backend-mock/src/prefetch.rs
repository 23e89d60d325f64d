//! Cache prefetch hints: the only `unsafe` of this crate.

/// Asks the CPU to start loading the first `lines` cache lines of `*v`
/// into its caches. A hint only: no effect on what any load returns; a
/// no-op on targets without a stable prefetch intrinsic.
#[inline(always)]
pub(crate) fn lines<T>(v: &T, lines: usize) {
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
