//! The small integers of RDMA, as newtypes: a local key is not a remote
//! key, and a packet sequence number lives modulo 2^24.

use core::cmp::Ordering;

macro_rules! key {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
        #[cfg_attr(feature = "defmt", derive(defmt::Format))]
        pub struct $name(pub u32);

        impl $name {
            /// The raw value.
            #[inline]
            pub const fn get(self) -> u32 {
                self.0
            }
        }

        impl From<u32> for $name {
            #[inline]
            fn from(v: u32) -> Self {
                Self(v)
            }
        }

        impl core::fmt::Display for $name {
            fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                write!(f, "{:#x}", self.0)
            }
        }
    };
}

key!(
    /// A memory region's local key (`ibv_mr.lkey`): names local memory in a
    /// scatter/gather entry.
    Lkey
);
key!(
    /// A memory region's remote key (`ibv_mr.rkey`): what a peer must
    /// present to write into (or read from) the region.
    Rkey
);

/// Mask of a 24-bit field (PSN, QPN, MSN).
pub(crate) const MASK_24: u32 = 0x00ff_ffff;

/// A queue pair number: 24 bits (IBTA vol. 1 §9.2 "DestQP").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Qpn(u32);

impl Qpn {
    /// The QPN `v` (the upper 8 bits are dropped).
    #[inline]
    pub const fn new(v: u32) -> Qpn {
        Qpn(v & MASK_24)
    }

    /// The raw value, `0..2^24`.
    #[inline]
    pub const fn get(self) -> u32 {
        self.0
    }
}

impl core::fmt::Display for Qpn {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{:#08x}", self.0)
    }
}

/// A packet sequence number: 24 bits, wrapping (IBTA vol. 1 §9.7.1).
///
/// Comparison is only meaningful within half the sequence space: `a` is
/// *before* `b` when `b - a mod 2^24` is in `1..2^23`
/// ([`Psn::cmp_window`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Psn(u32);

impl Psn {
    /// Size of the PSN space, `2^24`.
    pub const MODULUS: u32 = 1 << 24;
    /// Half the PSN space, `2^23`: the window within which two PSNs can be
    /// ordered.
    pub const HALF: u32 = 1 << 23;

    /// The PSN `v mod 2^24`.
    #[inline]
    pub const fn new(v: u32) -> Psn {
        Psn(v & MASK_24)
    }

    /// The raw value, `0..2^24`.
    #[inline]
    pub const fn get(self) -> u32 {
        self.0
    }

    /// `self + n mod 2^24`.
    #[inline]
    #[must_use]
    pub const fn add(self, n: u32) -> Psn {
        Psn(self.0.wrapping_add(n) & MASK_24)
    }

    /// `self - n mod 2^24`.
    #[inline]
    #[must_use]
    pub const fn sub(self, n: u32) -> Psn {
        Psn(self.0.wrapping_sub(n) & MASK_24)
    }

    /// The next PSN.
    #[inline]
    #[must_use]
    pub const fn next(self) -> Psn {
        self.add(1)
    }

    /// How far `to` is ahead of `self`: `to - self mod 2^24`.
    #[inline]
    pub const fn distance_to(self, to: Psn) -> u32 {
        to.0.wrapping_sub(self.0) & MASK_24
    }

    /// Orders `self` against `other` within the half-space window:
    /// `Greater` when `self` is 1..2^23 steps ahead of `other`, `Less` when
    /// it is 1..=2^23 steps behind (the exact opposite point counts as
    /// behind, as a responder counts it a duplicate).
    pub const fn cmp_window(self, other: Psn) -> Ordering {
        let d = other.distance_to(self);
        if d == 0 {
            Ordering::Equal
        } else if d < Self::HALF {
            Ordering::Greater
        } else {
            Ordering::Less
        }
    }
}

impl core::fmt::Display for Psn {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        core::fmt::Display::fmt(&self.0, f)
    }
}

/// One scatter/gather entry (`struct ibv_sge`): `length` bytes of local
/// memory at `addr`, registered under `lkey`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Sge {
    /// Local virtual address.
    pub addr: u64,
    /// Bytes.
    pub length: u32,
    /// Local key of the region holding the bytes.
    pub lkey: Lkey,
}

/// The remote side of an RDMA operation (`wr.rdma` of `ibv_send_wr`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct RemoteAddr {
    /// Remote virtual address.
    pub addr: u64,
    /// Remote key of the region.
    pub rkey: Rkey,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn psn_wraps_and_orders_within_half_window() {
        let top = Psn::new(0xff_ffff);
        assert_eq!(top.next(), Psn::new(0));
        assert_eq!(Psn::new(0).sub(1), top);
        assert_eq!(top.distance_to(Psn::new(2)), 3);
        assert_eq!(Psn::new(5).cmp_window(Psn::new(5)), Ordering::Equal);
        assert_eq!(Psn::new(2).cmp_window(top), Ordering::Greater);
        assert_eq!(top.cmp_window(Psn::new(2)), Ordering::Less);
        assert_eq!(
            Psn::new(Psn::HALF - 1).cmp_window(Psn::new(0)),
            Ordering::Greater
        );
        assert_eq!(Psn::new(Psn::HALF).cmp_window(Psn::new(0)), Ordering::Less);
        assert_eq!(Qpn::new(0x1ff_ffff).get(), 0xff_ffff);
    }
}
