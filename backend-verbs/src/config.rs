//! Tunables, from the environment or set by hand.
//!
//! | variable | field | default |
//! |---|---|---|
//! | `RINGCC_IB_HCA` | [`devices`](Config::devices): NIC `i` → `devices[i % len]` | every device found |
//! | `RINGCC_IB_PORT` | [`port`](Config::port) | 1 |
//! | `RINGCC_IB_GID_INDEX` | [`gid_index`](Config::gid_index) | a RoCEv2 IPv4 GID, else 0 |
//! | `RINGCC_IB_TIMEOUT` | [`ib_timeout`](Config::ib_timeout) (4.096 µs · 2^t) | 20 |
//! | `RINGCC_IB_RETRY_CNT` | [`retry_cnt`](Config::retry_cnt) | 7 |
//! | `RINGCC_IB_RNR_RETRY` | [`rnr_retry`](Config::rnr_retry) | 7 |
//! | `RINGCC_NCHANNELS` | [`channels`](Config::channels) | 2 |
//! | `RINGCC_SLOT_BYTES` | [`slot_bytes`](Config::slot_bytes) | 512 KiB |
//! | `RINGCC_SLOTS_PER_SLICE` | [`slots_per_slice`](Config::slots_per_slice) | 2 |
//! | `RINGCC_CHUNK_BYTES` | [`chunk_bytes`](Config::chunk_bytes), at most `8 / slots_per_slice − 1` slices | 2 slices |
//! | `RINGCC_TIMEOUT` | [`timeout`](Config::timeout), seconds without progress | 30 |
//! | `RINGCC_CONNECT_TIMEOUT` | [`connect_timeout`](Config::connect_timeout), seconds | 60 |
//! | `RINGCC_SPIN_US` | [`spin`](Config::spin) before sleeping on completion events | 50 |
//! | `RINGCC_NODE` | [`node`](Config::node): this rank's node name | the host name |
//! | `RINGCC_CROSS_NIC` | [`cross_nic`](Config::cross_nic) | 0 |
//!
//! The FIFO geometry, channel count, port and NIC count must be equal on
//! every rank; the rendezvous checks it.

use std::time::Duration;

use ringcc_core::fifo::FifoGeometry;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Faults a test can inject (not for production use).
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fault {
    /// Advertise a wrong rkey for this rank's FIFOs, so that the
    /// predecessor's writes fail with a remote access error.
    CorruptFifoRkey,
}

/// Tunables of a [`Communicator`](crate::Communicator).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Config {
    /// RDMA devices by name; NIC `i` of the topology is
    /// `devices[i % devices.len()]`. Empty: every device found, sorted by
    /// name.
    pub devices: Vec<String>,
    /// The port of each device.
    pub port: u8,
    /// The GID index; `None`: the first RoCEv2 IPv4-mapped GID, else the
    /// first RoCEv2 GID, else index 0 (InfiniBand).
    pub gid_index: Option<u32>,
    /// Local ACK timeout exponent (`4.096 µs · 2^t`; NCCL's 20 ≈ 4.3 s).
    pub ib_timeout: u8,
    /// Transport retries before a send fails with `RETRY_EXC_ERR`.
    pub retry_cnt: u8,
    /// Receiver-not-ready retries (7 = infinite).
    pub rnr_retry: u8,
    /// Channels (rings), `1..=64`.
    pub channels: u32,
    /// Bytes per FIFO slot (a multiple of 16).
    pub slot_bytes: u64,
    /// Slots per slice (1, 2, 4 or 8).
    pub slots_per_slice: u64,
    /// Chunk bytes of the plan (a multiple of every element size: of 8).
    pub chunk_bytes: u64,
    /// How long a collective may go without any progress before it fails.
    pub timeout: Duration,
    /// How long setup waits for rank 0's store and for the other ranks.
    pub connect_timeout: Duration,
    /// How long the progress loop polls before it sleeps on completion
    /// events.
    pub spin: Duration,
    /// This rank's node name (ranks with the same name share a node);
    /// `None`: the host name.
    pub node: Option<String>,
    /// Whether a ring may leave a node through another NIC than it
    /// entered.
    pub cross_nic: bool,
    #[doc(hidden)]
    pub fault: Option<Fault>,
}

impl Default for Config {
    fn default() -> Self {
        let g = FifoGeometry::NCCL;
        Config {
            devices: Vec::new(),
            port: 1,
            gid_index: None,
            ib_timeout: 20,
            retry_cnt: 7,
            rnr_retry: 7,
            channels: 2,
            slot_bytes: g.slot_bytes(),
            slots_per_slice: g.slots_per_slice(),
            chunk_bytes: g.slice_bytes().saturating_mul(2),
            timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(60),
            spin: Duration::from_micros(50),
            node: None,
            cross_nic: false,
            fault: None,
        }
    }
}

/// What every rank must agree on; exchanged and compared at setup.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Agreement {
    pub channels: u32,
    pub slot_bytes: u64,
    pub slots_per_slice: u64,
    pub chunk_bytes: u64,
    pub nics: usize,
    pub cross_nic: bool,
}

impl Config {
    /// The defaults, overridden by the `RINGCC_*` variables of the
    /// process environment.
    pub fn from_env() -> Result<Config> {
        Config::from_vars(|k| std::env::var(k).ok())
    }

    /// The defaults, overridden by variables read through `get`.
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Config> {
        let get = |k: &str| {
            get(k)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        let mut c = Config::default();
        if let Some(v) = get("RINGCC_IB_HCA") {
            c.devices = v.split(',').map(|d| d.trim().to_owned()).collect();
            if c.devices.iter().any(String::is_empty) {
                return Err(env("RINGCC_IB_HCA", &v, "an empty device name"));
            }
        }
        if let Some(v) = get("RINGCC_IB_PORT") {
            c.port = num("RINGCC_IB_PORT", &v)?;
        }
        if let Some(v) = get("RINGCC_IB_GID_INDEX") {
            c.gid_index = Some(num("RINGCC_IB_GID_INDEX", &v)?);
        }
        if let Some(v) = get("RINGCC_IB_TIMEOUT") {
            c.ib_timeout = num("RINGCC_IB_TIMEOUT", &v)?;
        }
        if let Some(v) = get("RINGCC_IB_RETRY_CNT") {
            c.retry_cnt = num("RINGCC_IB_RETRY_CNT", &v)?;
        }
        if let Some(v) = get("RINGCC_IB_RNR_RETRY") {
            c.rnr_retry = num("RINGCC_IB_RNR_RETRY", &v)?;
        }
        if let Some(v) = get("RINGCC_NCHANNELS") {
            c.channels = num("RINGCC_NCHANNELS", &v)?;
        }
        let mut chunk_set = false;
        if let Some(v) = get("RINGCC_SLOT_BYTES") {
            c.slot_bytes = num("RINGCC_SLOT_BYTES", &v)?;
        }
        if let Some(v) = get("RINGCC_SLOTS_PER_SLICE") {
            c.slots_per_slice = num("RINGCC_SLOTS_PER_SLICE", &v)?;
        }
        if let Some(v) = get("RINGCC_CHUNK_BYTES") {
            c.chunk_bytes = num("RINGCC_CHUNK_BYTES", &v)?;
            chunk_set = true;
        }
        if !chunk_set {
            c.chunk_bytes = c
                .slot_bytes
                .saturating_mul(c.slots_per_slice)
                .saturating_mul(2);
        }
        if let Some(v) = get("RINGCC_TIMEOUT") {
            c.timeout = secs("RINGCC_TIMEOUT", &v)?;
        }
        if let Some(v) = get("RINGCC_CONNECT_TIMEOUT") {
            c.connect_timeout = secs("RINGCC_CONNECT_TIMEOUT", &v)?;
        }
        if let Some(v) = get("RINGCC_SPIN_US") {
            c.spin = Duration::from_micros(num("RINGCC_SPIN_US", &v)?);
        }
        c.node = get("RINGCC_NODE");
        if let Some(v) = get("RINGCC_CROSS_NIC") {
            c.cross_nic = match v.as_str() {
                "0" | "false" | "no" => false,
                "1" | "true" | "yes" => true,
                _ => return Err(env("RINGCC_CROSS_NIC", &v, "not 0 or 1")),
            };
        }
        c.validate()?;
        Ok(c)
    }

    /// The FIFO geometry.
    pub fn geometry(&self) -> Result<FifoGeometry> {
        FifoGeometry::new(self.slot_bytes, self.slots_per_slice).map_err(|e| {
            Error::BadConfig(format!(
                "slot_bytes {} / slots_per_slice {}: {e}",
                self.slot_bytes, self.slots_per_slice
            ))
        })
    }

    /// Checks the values that cannot work.
    pub fn validate(&self) -> Result<()> {
        let g = self.geometry()?;
        if self.chunk_bytes > g.max_chunk_bytes() {
            return Err(Error::BadConfig(format!(
                "chunk_bytes {} exceeds the {} bytes the FIFO can pipeline \
                 (at most 8 / slots_per_slice - 1 slices of {} bytes)",
                self.chunk_bytes,
                g.max_chunk_bytes(),
                g.slice_bytes()
            )));
        }
        if self.channels == 0 || self.channels > ringcc_core::topology::MAX_CHANNELS {
            return Err(Error::BadConfig(format!(
                "{} channels (1..=64)",
                self.channels
            )));
        }
        if self.chunk_bytes == 0 || !self.chunk_bytes.is_multiple_of(8) {
            return Err(Error::BadConfig(format!(
                "chunk_bytes {} is not a non-zero multiple of 8",
                self.chunk_bytes
            )));
        }
        if self.slot_bytes > u64::from(u32::MAX) / 16 {
            return Err(Error::BadConfig(format!(
                "slot_bytes {} is too large",
                self.slot_bytes
            )));
        }
        if self.ib_timeout > 31 || self.retry_cnt > 7 || self.rnr_retry > 7 {
            return Err(Error::BadConfig(
                "ib_timeout must be <= 31, retry_cnt and rnr_retry <= 7".into(),
            ));
        }
        if self.timeout.is_zero() || self.connect_timeout.is_zero() {
            return Err(Error::BadConfig("timeouts must be positive".into()));
        }
        Ok(())
    }

    pub(crate) fn agreement(&self, nics: usize) -> Agreement {
        Agreement {
            channels: self.channels,
            slot_bytes: self.slot_bytes,
            slots_per_slice: self.slots_per_slice,
            chunk_bytes: self.chunk_bytes,
            nics,
            cross_nic: self.cross_nic,
        }
    }
}

fn env(var: &str, v: &str, why: &str) -> Error {
    Error::Env {
        var: var.into(),
        reason: format!("{v:?}: {why}"),
    }
}

fn num<T: std::str::FromStr>(var: &str, v: &str) -> Result<T>
where
    T::Err: std::fmt::Display,
{
    v.parse::<T>().map_err(|e| env(var, v, &e.to_string()))
}

fn secs(var: &str, v: &str) -> Result<Duration> {
    let s: f64 = num(var, v)?;
    if !(s.is_finite() && s > 0.0 && s < 1e9) {
        return Err(env(var, v, "not a positive number of seconds"));
    }
    Ok(Duration::from_secs_f64(s))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn cfg(vars: &[(&str, &str)]) -> Result<Config> {
        let m: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_vars(|k| m.get(k).cloned())
    }

    #[test]
    fn defaults_are_nccls() {
        let c = cfg(&[]).unwrap();
        assert_eq!(c, Config::default());
        assert_eq!((c.ib_timeout, c.retry_cnt, c.rnr_retry), (20, 7, 7));
        assert_eq!(c.slot_bytes, 512 * 1024);
        assert_eq!(c.chunk_bytes, 2 * 1024 * 1024);
    }

    #[test]
    fn variables_override() {
        let c = cfg(&[
            ("RINGCC_IB_HCA", "mlx5_0, mlx5_1"),
            ("RINGCC_IB_GID_INDEX", "3"),
            ("RINGCC_NCHANNELS", "4"),
            ("RINGCC_SLOT_BYTES", "4096"),
            ("RINGCC_SLOTS_PER_SLICE", "1"),
            ("RINGCC_TIMEOUT", "2.5"),
            ("RINGCC_NODE", "n1"),
            ("RINGCC_CROSS_NIC", "1"),
        ])
        .unwrap();
        assert_eq!(c.devices, vec!["mlx5_0", "mlx5_1"]);
        assert_eq!(c.gid_index, Some(3));
        assert_eq!(c.channels, 4);
        assert_eq!(c.chunk_bytes, 8192);
        assert_eq!(c.timeout, Duration::from_millis(2500));
        assert_eq!(c.node.as_deref(), Some("n1"));
        assert!(c.cross_nic);
    }

    #[test]
    fn bad_values_are_errors_naming_the_variable() {
        for (k, v) in [
            ("RINGCC_NCHANNELS", "0"),
            ("RINGCC_NCHANNELS", "65"),
            ("RINGCC_SLOT_BYTES", "100"),
            ("RINGCC_SLOTS_PER_SLICE", "3"),
            ("RINGCC_CHUNK_BYTES", "12"),
            ("RINGCC_CHUNK_BYTES", "4194304"),
            ("RINGCC_IB_TIMEOUT", "40"),
            ("RINGCC_IB_PORT", "x"),
            ("RINGCC_TIMEOUT", "-1"),
            ("RINGCC_IB_HCA", "a,,b"),
            ("RINGCC_CROSS_NIC", "maybe"),
        ] {
            let e = cfg(&[(k, v)]).unwrap_err();
            let s = e.to_string();
            assert!(
                s.contains(k) || matches!(e, Error::BadConfig(_)),
                "{k}={v}: {s}"
            );
        }
    }
}
