//! Saturating integer helpers: sizes come from callers and must never make
//! the core panic or wrap silently.

/// `ceil(a / b)`; 0 when `b` is 0.
#[inline]
pub(crate) const fn div_up(a: u64, b: u64) -> u64 {
    match a.checked_div(b) {
        Some(q) => {
            if a.wrapping_sub(q.wrapping_mul(b)) == 0 {
                q
            } else {
                q.wrapping_add(1)
            }
        }
        None => 0,
    }
}

/// `a` rounded up to a multiple of `b`, saturating at the largest multiple
/// of `b` that fits (or `a` itself when `b` is 0).
#[inline]
pub(crate) const fn align_up(a: u64, b: u64) -> u64 {
    if b == 0 {
        return a;
    }
    let q = div_up(a, b);
    match q.checked_mul(b) {
        Some(v) => v,
        None => match u64::MAX.checked_div(b) {
            Some(m) => m.wrapping_mul(b),
            None => a,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn div_up_and_align_up() {
        assert_eq!(div_up(0, 4), 0);
        assert_eq!(div_up(1, 4), 1);
        assert_eq!(div_up(8, 4), 2);
        assert_eq!(div_up(9, 4), 3);
        assert_eq!(div_up(9, 0), 0);
        assert_eq!(div_up(u64::MAX, 1), u64::MAX);
        assert_eq!(div_up(u64::MAX, 2), 1 << 63);
        assert_eq!(align_up(0, 16), 0);
        assert_eq!(align_up(1, 16), 16);
        assert_eq!(align_up(16, 16), 16);
        assert_eq!(align_up(u64::MAX, 16), u64::MAX - 15);
        assert_eq!(align_up(7, 0), 7);
    }
}
