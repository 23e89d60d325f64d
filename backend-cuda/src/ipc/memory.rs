//! Exported device memory, the raw and checked layers: an allocation its
//! owner exports as an [`IpcHandle`] and another process of the node
//! imports and maps (CUDA's `cuIpcGetMemHandle` / `cuIpcOpenMemHandle`
//! shape).
//!
//! On the fake device the "device memory" is a `memfd` of the owner's
//! process, and the handle names it as `/proc/<pid>/fd/<fd>`: the importer
//! opens that path (same user, same PID namespace) and maps the same pages.
//! Both mappings are `MAP_SHARED`, so stores through one are loads through
//! the other — what peer access gives two GPUs.

use std::os::fd::{AsRawFd, OwnedFd};

pub(crate) use ringcc_comm::map::Mapping;
use ringcc_comm::Error as CommError;
use rustix::fs::{MemfdFlags, Mode, OFlags};
use serde::{Deserialize, Serialize};

type Result<T> = std::result::Result<T, CommError>;

/// What the owner of an exported allocation publishes so that a peer
/// process can map it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum IpcHandle {
    /// The fake device's memory: descriptor `fd` (a memfd) of process
    /// `pid`, `bytes` long.
    Fake {
        /// The owner's process id.
        pid: u32,
        /// The memfd's descriptor number in the owner's process.
        fd: i32,
        /// Bytes exported.
        bytes: u64,
    },
}

fn io(call: &'static str) -> impl FnOnce(rustix::io::Errno) -> CommError {
    move |e| CommError::Io {
        call,
        source: std::io::Error::from(e),
    }
}

/// An allocation this process owns and exports (the receiver's FIFO).
#[derive(Debug)]
pub struct ExportedMemory {
    map: Mapping,
    /// Kept open for as long as a peer may import it (the memory lives
    /// while the owner does).
    fd: OwnedFd,
}

impl ExportedMemory {
    /// `bytes` of zeroed fake device memory, exportable.
    pub fn fake(bytes: u64, name: &str) -> Result<ExportedMemory> {
        let len = usize::try_from(bytes)
            .map_err(|_| CommError::BadConfig(format!("cuda-ipc: {bytes} B beyond memory")))?;
        let fd = rustix::fs::memfd_create(name, MemfdFlags::CLOEXEC).map_err(io("memfd_create"))?;
        rustix::fs::ftruncate(&fd, bytes).map_err(io("ftruncate"))?;
        let map = Mapping::new(&fd, len).map_err(io("mmap"))?;
        Ok(ExportedMemory { map, fd })
    }

    /// The handle a peer imports it with.
    pub fn handle(&self) -> IpcHandle {
        IpcHandle::Fake {
            pid: std::process::id(),
            fd: self.fd.as_raw_fd(),
            bytes: self.map.len() as u64,
        }
    }

    pub(crate) fn mapping(&self) -> &Mapping {
        &self.map
    }
}

/// A peer's allocation, mapped here.
#[derive(Debug)]
pub struct ImportedMemory {
    map: Mapping,
}

impl ImportedMemory {
    /// Maps the allocation `handle` names; at least `min_bytes` long.
    pub fn open(handle: &IpcHandle, min_bytes: u64) -> Result<ImportedMemory> {
        match handle {
            IpcHandle::Fake { pid, fd, bytes } => {
                if *bytes < min_bytes {
                    return Err(CommError::BadConfig(format!(
                        "cuda-ipc: the exported FIFO has {bytes} B, this rank needs {min_bytes} B"
                    )));
                }
                let path = format!("/proc/{pid}/fd/{fd}");
                let file =
                    rustix::fs::open(path.as_str(), OFlags::RDWR | OFlags::CLOEXEC, Mode::empty())
                        .map_err(io("open /proc/<pid>/fd/<fd>"))?;
                let size = rustix::fs::fstat(&file).map_err(io("fstat"))?.st_size;
                if u64::try_from(size).ok() != Some(*bytes) {
                    return Err(CommError::BadConfig(format!(
                        "cuda-ipc: {path} has {size} B, its handle says {bytes} B"
                    )));
                }
                let len = usize::try_from(*bytes).map_err(|_| {
                    CommError::BadConfig(format!("cuda-ipc: {bytes} B beyond memory"))
                })?;
                Ok(ImportedMemory {
                    map: Mapping::new(&file, len).map_err(io("mmap"))?,
                })
            }
        }
    }

    pub(crate) fn mapping(&self) -> &Mapping {
        &self.map
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the owner writes, the importer reads, and back: one memory.
    #[test]
    fn an_import_maps_the_same_pages() {
        let owner = ExportedMemory::fake(4096, "ringcc-test").unwrap();
        let peer = ImportedMemory::open(&owner.handle(), 4096).unwrap();
        let (a, b) = (owner.mapping().base(), peer.mapping().base());
        assert_ne!(a, b);
        // SAFETY: both point to 4096 mapped bytes; this test is their only
        // user, and the accesses are sequential.
        unsafe {
            a.as_ptr().add(100).write(7);
            assert_eq!(b.as_ptr().add(100).read(), 7);
            b.as_ptr().add(4095).write(9);
            assert_eq!(a.as_ptr().add(4095).read(), 9);
        }
    }

    #[test]
    fn a_short_or_wrong_handle_is_refused() {
        let owner = ExportedMemory::fake(4096, "ringcc-test").unwrap();
        assert!(matches!(
            ImportedMemory::open(&owner.handle(), 8192),
            Err(CommError::BadConfig(_))
        ));
        let IpcHandle::Fake { pid, fd, .. } = owner.handle();
        let lying = IpcHandle::Fake {
            pid,
            fd,
            bytes: 8192,
        };
        assert!(matches!(
            ImportedMemory::open(&lying, 0),
            Err(CommError::BadConfig(_))
        ));
        let gone = IpcHandle::Fake {
            pid,
            fd: 100_000,
            bytes: 4096,
        };
        assert!(matches!(
            ImportedMemory::open(&gone, 0),
            Err(CommError::Io { .. })
        ));
    }
}
