//! Newtypes for the small integers of the domain, so that a rank cannot be
//! passed where a ring index is expected (they differ as soon as a ring is
//! not in rank order).

macro_rules! id {
    ($(#[$doc:meta])* $name:ident($ty:ty)) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
        #[cfg_attr(feature = "defmt", derive(defmt::Format))]
        pub struct $name(pub $ty);

        impl $name {
            /// The raw value.
            #[inline]
            pub const fn get(self) -> $ty {
                self.0
            }
        }

        impl core::fmt::Display for $name {
            fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                core::fmt::Display::fmt(&self.0, f)
            }
        }

        impl From<$ty> for $name {
            #[inline]
            fn from(v: $ty) -> Self {
                Self(v)
            }
        }
    };
}

id!(
    /// A rank: the user's number for one participant (one GPU), `0..ranks`.
    Rank(u32)
);
id!(
    /// A position along one channel's ring, counted from rank 0's position:
    /// rank 0 always has ring index 0, its successor 1, and so on.
    RingIndex(u32)
);
id!(
    /// A node (host) of the topology, numbered in ring order `0..nodes`.
    NodeId(u32)
);
id!(
    /// A NIC of a node, `0..nics_per_node`.
    NicId(u16)
);
id!(
    /// A channel, `0..channels`; each channel is one ring.
    ChannelId(u8)
);
id!(
    /// Which of the `n` chunks of a loop iteration a step touches. For
    /// AllReduce it names a region of the buffer; for ReduceScatter and
    /// AllGather the block of the rank at that ring index.
    ChunkId(u32)
);
id!(
    /// A FIFO slot, `0..STEPS`.
    SlotIndex(u8)
);
