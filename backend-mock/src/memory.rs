//! Each rank's device memory (payload mode) and its registered memory
//! regions: the FIFO slots its predecessor writes, the call-header
//! mailbox, the staging slots its RNIC sends from, and the credit counter
//! its successor writes.
//!
//! Addresses are synthetic virtual addresses, `VA_BASE + rank · 2^36 +
//! offset`. A region has one key (as mlx5's `lkey == rkey`): its index in
//! the rank's protection domain in the upper 24 bits and a random byte
//! below, so a corrupted key names no region, or another one, and fails
//! the access check.

use crate::faults::Rng;

/// Base of every rank's addresses.
pub(crate) const VA_BASE: u64 = 0x7f00_0000_0000_0000;
const RANK_SHIFT: u32 = 36;

/// A registered memory region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Mr {
    pub key: u32,
    pub va: u64,
    pub len: u64,
    /// `IBV_ACCESS_REMOTE_WRITE`.
    pub remote_write: bool,
}

/// Why an access was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Denied {
    /// No region has this key.
    Key,
    /// The region does not allow the access.
    Access,
    /// The range leaves the region.
    Bounds,
}

/// All ranks' memory.
///
/// Regions are reserved first ([`alloc`](Memory::alloc)) and the arenas
/// allocated zeroed once, at [`commit`](Memory::commit): the allocator
/// then maps fresh zero pages that cost nothing until a slot is written,
/// so FIFO space that a run never reaches (most of a 4 MiB FIFO on a
/// large cluster, where slices are small) takes no memory.
#[derive(Debug, Default)]
pub(crate) struct Memory {
    pub arenas: Vec<Vec<u8>>,
    reserved: Vec<usize>,
    pds: Vec<Vec<Mr>>,
}

impl Memory {
    pub fn new(ranks: u32) -> Memory {
        Memory {
            arenas: vec![Vec::new(); ranks as usize],
            reserved: vec![0; ranks as usize],
            pds: vec![Vec::new(); ranks as usize],
        }
    }

    /// The virtual address of `offset` in `rank`'s memory.
    pub fn va(rank: u32, offset: usize) -> u64 {
        VA_BASE + (u64::from(rank) << RANK_SHIFT) + offset as u64
    }

    /// Reserves `len` zeroed bytes in `rank`'s memory, 64-byte aligned;
    /// returns the offset. The bytes exist after [`commit`](Memory::commit).
    pub fn alloc(&mut self, rank: u32, len: usize) -> usize {
        let a = &mut self.reserved[rank as usize];
        let off = a.div_ceil(64) * 64;
        *a = off + len;
        off
    }

    /// Allocates every rank's reserved bytes, zeroed.
    pub fn commit(&mut self) {
        for (a, len) in self.arenas.iter_mut().zip(&self.reserved) {
            if a.len() < *len {
                // `vec![0; n]` asks the allocator for zeroed memory: fresh
                // pages, not written until used.
                let mut fresh = vec![0u8; *len];
                fresh[..a.len()].copy_from_slice(a);
                *a = fresh;
            }
        }
    }

    /// Registers `len` bytes at `offset` of `rank`'s memory; returns the key.
    pub fn register(
        &mut self,
        rank: u32,
        offset: usize,
        len: usize,
        remote_write: bool,
        rng: &mut Rng,
    ) -> u32 {
        let pd = &mut self.pds[rank as usize];
        let salt = (rng.next_u64() as u32 & 0xff) | 1;
        let key = ((pd.len() as u32 + 1) << 8) | salt;
        pd.push(Mr {
            key,
            va: Self::va(rank, offset),
            len: len as u64,
            remote_write,
        });
        key
    }

    /// Checks an access of `len` bytes at `va` under `key` in `rank`'s
    /// protection domain; returns the arena offset.
    pub fn check(
        &self,
        rank: u32,
        key: u32,
        va: u64,
        len: u64,
        remote_write: bool,
    ) -> Result<usize, Denied> {
        let idx = (key >> 8) as usize;
        let mr = idx
            .checked_sub(1)
            .and_then(|i| self.pds.get(rank as usize)?.get(i))
            .filter(|mr| mr.key == key)
            .ok_or(Denied::Key)?;
        if remote_write && !mr.remote_write {
            return Err(Denied::Access);
        }
        let end = va.checked_add(len).ok_or(Denied::Bounds)?;
        if va < mr.va || end > mr.va + mr.len {
            return Err(Denied::Bounds);
        }
        let off = va - Self::va(rank, 0);
        Ok(off as usize)
    }

    /// `len` bytes at `offset` of `rank`'s memory.
    pub fn read(&self, rank: u32, offset: usize, len: usize) -> &[u8] {
        self.arenas
            .get(rank as usize)
            .and_then(|a| a.get(offset..offset.saturating_add(len)))
            .unwrap_or(&[])
    }

    /// Writes `data` at `offset` of `rank`'s memory (within what `alloc`
    /// reserved; callers checked the region).
    pub fn write(&mut self, rank: u32, offset: usize, data: &[u8]) -> bool {
        match self
            .arenas
            .get_mut(rank as usize)
            .and_then(|a| a.get_mut(offset..offset.saturating_add(data.len())))
        {
            Some(dst) => {
                dst.copy_from_slice(data);
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_bounds_and_access() {
        let mut m = Memory::new(2);
        let mut rng = Rng::new(1);
        let a = m.alloc(1, 100);
        let b = m.alloc(1, 50);
        assert_eq!(b % 64, 0);
        m.commit();
        assert_eq!(m.arenas[1].len(), b + 50);
        let ka = m.register(1, a, 100, true, &mut rng);
        let kb = m.register(1, b, 50, false, &mut rng);
        let va = Memory::va(1, a);
        assert_eq!(m.check(1, ka, va + 10, 90, true), Ok(a + 10));
        assert_eq!(m.check(1, ka, va + 10, 91, true), Err(Denied::Bounds));
        assert_eq!(m.check(1, ka, va - 1, 1, true), Err(Denied::Bounds));
        assert_eq!(m.check(1, ka ^ 0x80, va, 1, true), Err(Denied::Key));
        assert_eq!(m.check(0, ka, va, 1, true), Err(Denied::Key));
        assert_eq!(
            m.check(1, kb, Memory::va(1, b), 1, true),
            Err(Denied::Access)
        );
        assert!(m.check(1, kb, Memory::va(1, b), 50, false).is_ok());
        assert!(m.write(1, a, &[1, 2, 3]));
        assert_eq!(m.read(1, a, 3), &[1, 2, 3]);
    }
}
