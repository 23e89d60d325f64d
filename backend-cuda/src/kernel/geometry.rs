//! Launch geometry: how many blocks of how many threads a slice gets.

/// Threads per block of every fused kernel (its `__launch_bounds__`).
pub const BLOCK_THREADS: u32 = 512;

/// Bytes one thread moves per vector load or store.
pub const VECTOR_BYTES: u64 = 16;

/// The grid of one kernel launch.
///
/// The kernels use a grid-stride loop over 16-byte vectors (then a scalar
/// tail), so any grid is correct; this one gives each thread one vector
/// when the slice is small and caps the grid at `max_blocks` (a few waves of
/// the device's multiprocessors) when it is large.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchGeometry {
    /// Blocks in the grid (x).
    pub grid: u32,
    /// Threads per block (x).
    pub block: u32,
}

impl LaunchGeometry {
    /// The geometry for `count` elements of `elem_bytes` each, with at most
    /// `max_blocks` blocks. `None` when there is nothing to do (`count` or
    /// `elem_bytes` is 0): the launch is skipped.
    pub fn for_slice(count: u64, elem_bytes: u64, max_blocks: u32) -> Option<LaunchGeometry> {
        let bytes = count.checked_mul(elem_bytes)?;
        if bytes == 0 {
            return None;
        }
        let vectors = bytes.div_ceil(VECTOR_BYTES);
        let blocks = vectors.div_ceil(u64::from(BLOCK_THREADS));
        let grid = blocks.min(u64::from(max_blocks.max(1)));
        Some(LaunchGeometry {
            grid: u32::try_from(grid).unwrap_or(u32::MAX),
            block: BLOCK_THREADS,
        })
    }

    /// Blocks to allow for a device with `multiprocessors` SMs: enough
    /// resident threads to keep its memory system busy (`waves` blocks per
    /// SM), at least one.
    pub fn max_blocks_for(multiprocessors: u32, waves: u32) -> u32 {
        multiprocessors.saturating_mul(waves).max(1)
    }

    /// Threads in the whole grid.
    pub fn threads(&self) -> u64 {
        u64::from(self.grid) * u64::from(self.block)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn small_and_empty_slices() {
        assert_eq!(LaunchGeometry::for_slice(0, 4, 100), None);
        assert_eq!(LaunchGeometry::for_slice(10, 0, 100), None);
        let g = LaunchGeometry::for_slice(1, 1, 100).unwrap();
        assert_eq!((g.grid, g.block), (1, BLOCK_THREADS));
        // 1 MiB of floats: 65536 vectors, 128 blocks of 512.
        let g = LaunchGeometry::for_slice(1 << 18, 4, 1000).unwrap();
        assert_eq!(g.grid, 128);
        let g = LaunchGeometry::for_slice(1 << 18, 4, 100).unwrap();
        assert_eq!(g.grid, 100);
        assert_eq!(LaunchGeometry::max_blocks_for(132, 8), 1056);
        assert_eq!(LaunchGeometry::max_blocks_for(0, 8), 1);
    }

    proptest! {
        /// Every vector of the slice is covered by some thread's first
        /// iteration, or the grid is at its cap.
        #[test]
        fn grid_covers_or_caps(count in 1u64..1 << 40, elem in prop::sample::select(vec![1u64, 2, 4, 8]), cap in 1u32..5000) {
            let g = LaunchGeometry::for_slice(count, elem, cap).unwrap();
            prop_assert!(g.grid >= 1 && g.grid <= cap);
            let vectors = (count * elem).div_ceil(VECTOR_BYTES);
            prop_assert!(g.threads() >= vectors || g.grid == cap);
            // Never more than one block of idle threads.
            prop_assert!(g.threads() < vectors + u64::from(BLOCK_THREADS));
        }
    }
}
