//! Communicator settings.

use std::time::Duration;

use ringcc_core::fifo::FifoGeometry;

use crate::error::{Error, Result};

/// How the GPU communicator carries out a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LaunchMode {
    /// One persistent kernel per rank and call, one block per channel,
    /// walking the whole plan on the device ([`crate::device_loop`]).
    Persistent,
    /// One fused-kernel launch per slice, ordered by events
    /// ([`crate::progress`]).
    Slice,
}

impl LaunchMode {
    /// The environment variable that picks the default mode.
    pub const ENV: &'static str = "RINGCC_CUDA_LAUNCH";

    /// `persistent` or `slice` (any case, surrounding blanks ignored).
    pub fn parse(s: &str) -> Option<LaunchMode> {
        match s.trim().to_ascii_lowercase().as_str() {
            "persistent" => Some(LaunchMode::Persistent),
            "slice" => Some(LaunchMode::Slice),
            _ => None,
        }
    }

    /// The mode's name, as [`parse`](LaunchMode::parse) reads it.
    pub fn name(self) -> &'static str {
        match self {
            LaunchMode::Persistent => "persistent",
            LaunchMode::Slice => "slice",
        }
    }

    /// [`ENV`](LaunchMode::ENV) if it is set to a mode, else
    /// `Persistent`; another value is logged and ignored.
    pub fn from_env() -> LaunchMode {
        match std::env::var(Self::ENV) {
            Ok(v) => LaunchMode::parse(&v).unwrap_or_else(|| {
                tracing::warn!(value = %v, "ringcc-cuda: {} must be persistent or slice; using persistent", Self::ENV);
                LaunchMode::Persistent
            }),
            Err(_) => LaunchMode::Persistent,
        }
    }
}

impl std::fmt::Display for LaunchMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// How a communicator is built. [`Config::default`] follows NCCL's Simple
/// protocol: 512 KiB slots, slices of 2 slots, chunks of 4; it launches
/// the device loop unless `RINGCC_CUDA_LAUNCH=slice`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    /// Channels (rings, each with its own stream per rank), `1..=64`.
    pub channels: u8,
    /// FIFO slot size and slots per slice.
    pub geometry: FifoGeometry,
    /// Ring chunk size in bytes: a non-zero multiple of 16.
    pub chunk_bytes: u64,
    /// The deadline of every wait (enqueueing a call, synchronizing).
    pub timeout: Duration,
    /// The fused kernels' grid is capped at this many blocks per
    /// multiprocessor.
    pub waves: u32,
    /// Use peer access between devices where the hardware allows it
    /// (otherwise every cross-device hop is staged and copied).
    pub peer_access: bool,
    /// How calls run on the GPU. `Persistent` falls back to `Slice` where
    /// the device loop cannot run: a staged hop (no peer access), two
    /// ranks on one stream, a device older than compute capability 7.0
    /// ([`Comm::launch_mode`](crate::Comm::launch_mode) says which runs).
    /// The host fake device always runs slices.
    pub launch: LaunchMode,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            channels: 2,
            geometry: FifoGeometry::NCCL,
            chunk_bytes: 4 * FifoGeometry::NCCL.slot_bytes(),
            timeout: Duration::from_secs(60),
            waves: 8,
            peer_access: true,
            launch: LaunchMode::from_env(),
        }
    }
}

impl Config {
    /// A small FIFO (`slot_bytes` per slot, 2 per slice, chunks of 4
    /// slots): many steps and wrap-arounds on little data, for tests.
    pub fn small(slot_bytes: u64, channels: u8) -> Result<Config> {
        let geometry =
            FifoGeometry::new(slot_bytes, 2).map_err(Error::core("FifoGeometry::new"))?;
        Ok(Config {
            channels,
            geometry,
            chunk_bytes: slot_bytes.saturating_mul(4),
            ..Config::default()
        })
    }

    /// Checks the settings that the layout and plans do not.
    pub fn validate(&self) -> Result<()> {
        if self.chunk_bytes == 0 || !self.chunk_bytes.is_multiple_of(16) {
            return Err(Error::BadConfig {
                what: "chunk_bytes must be a non-zero multiple of 16",
            });
        }
        if self.timeout.is_zero() {
            return Err(Error::BadConfig {
                what: "timeout must be positive",
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_follow_nccl_and_validate() {
        let c = Config::default();
        assert_eq!(c.chunk_bytes, 2 << 20);
        assert_eq!(c.geometry.slice_bytes(), 1 << 20);
        assert!(c.validate().is_ok());
        assert!(Config {
            chunk_bytes: 8,
            ..c
        }
        .validate()
        .is_err());
        assert!(Config {
            timeout: Duration::ZERO,
            ..c
        }
        .validate()
        .is_err());
        assert!(Config::small(24, 1).is_err());
        assert_eq!(LaunchMode::parse(" Slice\n"), Some(LaunchMode::Slice));
        assert_eq!(
            LaunchMode::parse("PERSISTENT"),
            Some(LaunchMode::Persistent)
        );
        assert_eq!(LaunchMode::parse("fast"), None);
        for m in [LaunchMode::Slice, LaunchMode::Persistent] {
            assert_eq!(LaunchMode::parse(m.name()), Some(m));
        }
        assert_eq!(Config::small(64, 3).unwrap().chunk_bytes, 256);
    }
}
