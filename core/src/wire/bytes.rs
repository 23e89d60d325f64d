//! Big-endian field access that cannot panic.
//!
//! Views check their length once in `new_checked`; after that every field
//! lies inside the buffer. These helpers still go through `get`, so that a
//! view built with `new_unchecked` over a short buffer reads zeros and
//! ignores writes instead of panicking.

use core::ops::Range;

/// The bytes of `range`, as an array of `L` bytes (zeros when the range is
/// outside `data` or not `L` long).
#[inline]
pub(crate) fn array<const L: usize>(data: &[u8], range: Range<usize>) -> [u8; L] {
    data.get(range)
        .and_then(|s| <[u8; L]>::try_from(s).ok())
        .unwrap_or([0; L])
}

/// The byte at `at` (0 when outside `data`).
#[inline]
pub(crate) fn u8_at(data: &[u8], at: usize) -> u8 {
    data.get(at).copied().unwrap_or(0)
}

#[inline]
pub(crate) fn be_u16(data: &[u8], range: Range<usize>) -> u16 {
    u16::from_be_bytes(array(data, range))
}

#[inline]
pub(crate) fn be_u32(data: &[u8], range: Range<usize>) -> u32 {
    u32::from_be_bytes(array(data, range))
}

#[inline]
pub(crate) fn be_u64(data: &[u8], range: Range<usize>) -> u64 {
    u64::from_be_bytes(array(data, range))
}

/// Copies `bytes` into `range` when it fits exactly; ignored otherwise.
#[inline]
pub(crate) fn put(data: &mut [u8], range: Range<usize>, bytes: &[u8]) {
    if let Some(dst) = data.get_mut(range) {
        if dst.len() == bytes.len() {
            dst.copy_from_slice(bytes);
        }
    }
}

#[inline]
pub(crate) fn put_u8(data: &mut [u8], at: usize, v: u8) {
    if let Some(b) = data.get_mut(at) {
        *b = v;
    }
}

#[inline]
pub(crate) fn put_be_u16(data: &mut [u8], range: Range<usize>, v: u16) {
    put(data, range, &v.to_be_bytes());
}

#[inline]
pub(crate) fn put_be_u32(data: &mut [u8], range: Range<usize>, v: u32) {
    put(data, range, &v.to_be_bytes());
}

#[inline]
pub(crate) fn put_be_u64(data: &mut [u8], range: Range<usize>, v: u64) {
    put(data, range, &v.to_be_bytes());
}

/// `n` rounded up to a multiple of `align` (a power of two), `None` on
/// overflow.
#[inline]
pub(crate) const fn align_up(n: usize, align: usize) -> Option<usize> {
    match n.checked_add(align.wrapping_sub(1)) {
        Some(v) => Some(v & !align.wrapping_sub(1)),
        None => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_range_reads_zero_and_writes_nothing() {
        let mut b = [1u8, 2, 3];
        assert_eq!(be_u32(&b, 0..4), 0);
        assert_eq!(be_u16(&b, 1..3), 0x0203);
        put_be_u32(&mut b, 0..4, 0xdead_beef);
        assert_eq!(b, [1, 2, 3]);
        assert_eq!(align_up(17, 16), Some(32));
        assert_eq!(align_up(usize::MAX, 16), None);
    }
}
