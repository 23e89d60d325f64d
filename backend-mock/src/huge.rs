//! Fixed-length arrays on transparent huge pages: the lanes, the ranks'
//! engines and their channels' machines, the structures of a large
//! simulation too big for the TLB (16 K lanes' machines span some 1500
//! pages of 4 KiB; a miss costs a page walk, two-dimensional in a virtual
//! machine).
//!
//! A huge page needs a 2 MiB-aligned range of the mapping, so an array of
//! at least [`MIN_BYTES`] gets an allocation of its own that starts on a
//! 2 MiB boundary and spans whole 2 MiB pages, advised `MADV_HUGEPAGE`
//! before it is first touched. (A `Vec` of exactly 2 MiB, as the lanes
//! of 1024 ranks were, starts anywhere and gets none.) Smaller arrays are
//! ordinary allocations.

use std::alloc::{alloc, dealloc, handle_alloc_error, Layout};
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

/// A huge page.
const HUGE: usize = 2 << 20;

/// Arrays from this size on get huge pages (below it, the page rounding
/// would waste more than the TLB gains).
const MIN_BYTES: usize = 1 << 20;

/// An owned array of `len` values, like a `Box<[T]>`, on huge pages when
/// it is large.
pub(crate) struct HugeSlice<T> {
    ptr: NonNull<T>,
    len: usize,
}

// SAFETY: a `HugeSlice<T>` owns its values as a `Box<[T]>` does, and
// gives access to them only through `&self` / `&mut self`.
#[expect(unsafe_code, reason = "see the SAFETY comment")]
unsafe impl<T: Send> Send for HugeSlice<T> {}
// SAFETY: as for `Send`: `&HugeSlice<T>` gives only `&[T]`.
#[expect(unsafe_code, reason = "see the SAFETY comment")]
unsafe impl<T: Sync> Sync for HugeSlice<T> {}

/// The allocation of `len` values of `T`, if it needs one (none for no
/// bytes).
///
/// The simulator's arrays are bounded by its validated configuration
/// (at most `MAX_RANKS` × `MAX_CHANNELS` lanes of a few hundred bytes,
/// and `MAX_RANKS` engines of at most `MAX_CHANNELS` inline channels,
/// some 33 KiB each: well under 1 GiB in all), so the size cannot
/// overflow from any input; the `expect`s state an invariant, as `Vec`'s
/// own capacity overflow does.
fn layout<T>(len: usize) -> Option<Layout> {
    let bytes = len.checked_mul(size_of::<T>()).expect("array too large");
    if bytes == 0 {
        return None;
    }
    let layout = if bytes >= MIN_BYTES {
        Layout::from_size_align(bytes.next_multiple_of(HUGE), HUGE.max(align_of::<T>()))
    } else {
        Layout::array::<T>(len)
    };
    Some(layout.expect("array too large"))
}

impl<T> HugeSlice<T> {
    /// The array `[f(0), f(1), …, f(len - 1)]`.
    pub fn from_fn(len: usize, mut f: impl FnMut(usize) -> T) -> HugeSlice<T> {
        let Some(layout) = layout::<T>(len) else {
            return HugeSlice {
                ptr: NonNull::dangling(),
                len,
            };
        };
        // SAFETY: `layout` has a non-zero size.
        #[expect(unsafe_code, reason = "see the SAFETY comment")]
        let raw = unsafe { alloc(layout) };
        let Some(ptr) = NonNull::new(raw.cast::<T>()) else {
            handle_alloc_error(layout)
        };
        #[cfg(target_os = "linux")]
        if layout.align() == HUGE {
            // SAFETY: the range is the whole allocation, page-aligned;
            // `MADV_HUGEPAGE` only sets the kernel's paging policy for it
            // (contents and validity unchanged; a kernel without
            // transparent huge pages refuses, which changes nothing).
            #[expect(unsafe_code, reason = "see the SAFETY comment")]
            unsafe {
                libc::madvise(raw.cast(), layout.size(), libc::MADV_HUGEPAGE);
            }
        }
        for i in 0..len {
            // SAFETY: `i < len`: inside the allocation, which is aligned
            // for `T`. (Should `f` panic, the values written so far and
            // the allocation leak, which is safe.)
            #[expect(unsafe_code, reason = "see the SAFETY comment")]
            unsafe {
                ptr.as_ptr().add(i).write(f(i));
            }
        }
        HugeSlice { ptr, len }
    }
}

impl<T> Drop for HugeSlice<T> {
    fn drop(&mut self) {
        // SAFETY: the `len` values are initialised (`from_fn`) and dropped
        // here once; the allocation was made with the same `layout`.
        #[expect(unsafe_code, reason = "see the SAFETY comment")]
        unsafe {
            std::ptr::drop_in_place(std::ptr::slice_from_raw_parts_mut(
                self.ptr.as_ptr(),
                self.len,
            ));
            if let Some(layout) = layout::<T>(self.len) {
                dealloc(self.ptr.as_ptr().cast(), layout);
            }
        }
    }
}

impl<T> Deref for HugeSlice<T> {
    type Target = [T];

    #[inline(always)]
    fn deref(&self) -> &[T] {
        // SAFETY: `len` initialised values at `ptr`, owned by `self`.
        #[expect(unsafe_code, reason = "see the SAFETY comment")]
        unsafe {
            std::slice::from_raw_parts(self.ptr.as_ptr(), self.len)
        }
    }
}

impl<T> DerefMut for HugeSlice<T> {
    #[inline(always)]
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in `deref`, and `&mut self` is unique.
        #[expect(unsafe_code, reason = "see the SAFETY comment")]
        unsafe {
            std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len)
        }
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for HugeSlice<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::sync::Arc;

    /// Large arrays start on a huge page; values are built in order and
    /// dropped once.
    #[test]
    fn arrays_and_drops() {
        let big = HugeSlice::from_fn(MIN_BYTES / 8, |i| i as u64);
        assert_eq!(big.as_ptr() as usize % HUGE, 0);
        assert!(big.iter().enumerate().all(|(i, &v)| v == i as u64));
        let counter = Arc::new(());
        let mut small = HugeSlice::from_fn(10, |_| Arc::clone(&counter));
        assert_eq!(small.len(), 10);
        assert_eq!(Arc::strong_count(&counter), 11);
        small[1] = Arc::new(());
        assert_eq!(Arc::strong_count(&counter), 10);
        drop(small);
        assert_eq!(Arc::strong_count(&counter), 1);
        let empty: HugeSlice<u64> = HugeSlice::from_fn(0, |_| 0);
        assert!(empty.is_empty());
        let zst = HugeSlice::from_fn(5, |_| ());
        assert_eq!(zst.len(), 5);
    }
}
