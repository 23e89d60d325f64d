//! The verbs transport's own settings (the communicator's — channels,
//! FIFO, chunk, timeout, node — are [`ringcc_comm::Options`]).
//!
//! | variable | field | default |
//! |---|---|---|
//! | `RINGCC_IB_HCA` | [`devices`](VerbsConfig::devices): NIC `i` → `devices[i]`, channel `c` → NIC `c mod len` | every device found |
//! | `RINGCC_IB_PORT` | [`port`](VerbsConfig::port) | 1 |
//! | `RINGCC_IB_GID_INDEX` | [`gid_index`](VerbsConfig::gid_index) | a RoCEv2 IPv4 GID, else 0 |
//! | `RINGCC_IB_TIMEOUT` | [`ib_timeout`](VerbsConfig::ib_timeout) (4.096 µs · 2^t) | 20 |
//! | `RINGCC_IB_RETRY_CNT` | [`retry_cnt`](VerbsConfig::retry_cnt) | 7 |
//! | `RINGCC_IB_RNR_RETRY` | [`rnr_retry`](VerbsConfig::rnr_retry) | 7 |
//!
//! `RINGCC_IB_DISABLE=1` (the communicator's) turns the transport off.
//!
//! The FIFO of a job whose hops run over verbs is the communicator's
//! setting ([`ringcc_comm::Options::geometry`], one for every hop of a
//! job); [`options_from_env`] gives it verbs' defaults, [`GEOMETRY`] and
//! [`CHUNK_BYTES`], where `RINGCC_SLOT_BYTES` and `RINGCC_CHUNK_BYTES`
//! leave it unset.

use std::time::Duration;

use ringcc_comm::Options;
use ringcc_core::fifo::FifoGeometry;

use crate::error::{Error, Result};

/// The FIFO of a verbs hop unless `RINGCC_SLOT_BYTES` sets one: NCCL's
/// (512 KiB slots, 2 per slice: 1 MiB messages, 4 MiB per connection).
/// Every slice is one RDMA message, its completion and, later, a credit:
/// the communicator's default slot (128 KiB, sized for shared memory)
/// pays that cost eight times as often per byte.
pub const GEOMETRY: FifoGeometry = FifoGeometry::NCCL;

/// The plan's chunk that goes with [`GEOMETRY`] unless
/// `RINGCC_CHUNK_BYTES` sets one: two slices, NCCL's.
pub const CHUNK_BYTES: u64 = 2 * GEOMETRY.slice_bytes();

/// [`options_from_vars`] on the process environment.
pub fn options_from_env() -> ringcc_comm::Result<Options> {
    options_from_vars(|k| std::env::var(k).ok())
}

/// The communicator's settings for a job whose hops run over verbs:
/// [`Options::from_vars`], with [`GEOMETRY`] in place of the
/// communicator's default FIFO when `RINGCC_SLOT_BYTES` is unset, and
/// [`CHUNK_BYTES`] as the chunk when `RINGCC_CHUNK_BYTES` is unset too.
/// A chunk that does not fit the FIFO is the communicator's `BadConfig`.
pub fn options_from_vars(get: impl Fn(&str) -> Option<String>) -> ringcc_comm::Result<Options> {
    let set = |k: &str| get(k).is_some_and(|v| !v.trim().is_empty());
    let (slot, chunk) = (set("RINGCC_SLOT_BYTES"), set("RINGCC_CHUNK_BYTES"));
    // The communicator reads a slot size alone (one slot per slice) and
    // checks the chunk against it: hand it verbs' slot, then the
    // geometry, and check again.
    let mut o = Options::from_vars(|k| match k {
        "RINGCC_SLOT_BYTES" if !slot => Some(GEOMETRY.slot_bytes().to_string()),
        "RINGCC_CHUNK_BYTES" if !slot && !chunk => Some(CHUNK_BYTES.to_string()),
        _ => get(k),
    })?;
    if !slot {
        o.geometry = Some(GEOMETRY);
        o.validate()?;
    }
    Ok(o)
}

/// Faults a test can inject (not for production use).
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fault {
    /// Advertise a wrong rkey for this rank's FIFOs, so that the
    /// predecessor's writes fail with a remote access error.
    CorruptFifoRkey,
}

/// Settings of a [`VerbsTransport`](crate::VerbsTransport).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct VerbsConfig {
    /// RDMA devices by name; NIC `i` is `devices[i]` (a name may repeat:
    /// each entry is opened on its own), channel `c` uses NIC
    /// `c mod devices.len()`. Empty: every device found, sorted by name,
    /// skipping those that cannot be used.
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
    #[doc(hidden)]
    pub fault: Option<Fault>,
}

impl Default for VerbsConfig {
    /// Every device, port 1, NCCL's retry settings (timeout 20, retry 7,
    /// RNR retry 7).
    fn default() -> Self {
        VerbsConfig {
            devices: Vec::new(),
            port: 1,
            gid_index: None,
            ib_timeout: 20,
            retry_cnt: 7,
            rnr_retry: 7,
            fault: None,
        }
    }
}

impl VerbsConfig {
    /// The defaults, overridden by the `RINGCC_IB_*` variables of the
    /// process environment.
    pub fn from_env() -> Result<VerbsConfig> {
        VerbsConfig::from_vars(|k| std::env::var(k).ok())
    }

    /// The defaults, overridden by variables read through `get`.
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<VerbsConfig> {
        let get = |k: &str| {
            get(k)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        let mut c = VerbsConfig::default();
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
        c.validate()?;
        Ok(c)
    }

    /// Checks the values that cannot work.
    pub fn validate(&self) -> Result<()> {
        if self.ib_timeout > 31 || self.retry_cnt > 7 || self.rnr_retry > 7 {
            return Err(Error::BadConfig(
                "ib_timeout must be <= 31, retry_cnt and rnr_retry <= 7".into(),
            ));
        }
        if self.port == 0 {
            return Err(Error::BadConfig("ports are numbered from 1".into()));
        }
        Ok(())
    }

    /// How long the NIC keeps trying before a request to a silent peer
    /// completes with `RETRY_EXC_ERR`: the ACK timeout times the tries.
    pub fn retry_budget(&self) -> Duration {
        let ack = Duration::from_nanos(4096u64 << self.ib_timeout.min(31));
        ack.saturating_mul(u32::from(self.retry_cnt) + 1)
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn cfg(vars: &[(&str, &str)]) -> Result<VerbsConfig> {
        let m: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        VerbsConfig::from_vars(|k| m.get(k).cloned())
    }

    #[test]
    fn defaults_are_nccls() {
        let c = cfg(&[]).unwrap();
        assert_eq!(c, VerbsConfig::default());
        assert_eq!((c.ib_timeout, c.retry_cnt, c.rnr_retry), (20, 7, 7));
        // 4.096 µs · 2^20 ≈ 4.3 s per try, 8 tries.
        let b = c.retry_budget();
        assert!(
            b > Duration::from_secs(34) && b < Duration::from_secs(35),
            "{b:?}"
        );
    }

    #[test]
    fn variables_override() {
        let c = cfg(&[
            ("RINGCC_IB_HCA", "mlx5_0, mlx5_1"),
            ("RINGCC_IB_GID_INDEX", "3"),
            ("RINGCC_IB_PORT", "2"),
            ("RINGCC_IB_TIMEOUT", "14"),
        ])
        .unwrap();
        assert_eq!(c.devices, vec!["mlx5_0", "mlx5_1"]);
        assert_eq!(c.gid_index, Some(3));
        assert_eq!((c.port, c.ib_timeout), (2, 14));
    }

    fn options(vars: &[(&str, &str)]) -> ringcc_comm::Result<Options> {
        let m: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        options_from_vars(|k| m.get(k).cloned())
    }

    #[test]
    fn verbs_fifo_unless_the_variables_set_one() {
        let o = options(&[("RINGCC_NCHANNELS", "3")]).unwrap();
        assert_eq!((o.geometry, o.chunk_bytes), (Some(GEOMETRY), CHUNK_BYTES));
        assert_eq!(o.channels, 3);
        assert!(CHUNK_BYTES <= GEOMETRY.max_chunk_bytes());
        // A chunk alone: verbs' FIFO with that chunk.
        let o = options(&[("RINGCC_CHUNK_BYTES", "65536")]).unwrap();
        assert_eq!((o.geometry, o.chunk_bytes), (Some(GEOMETRY), 65536));
        // A slot size: the communicator's reading of it, its chunk.
        let o = options(&[
            ("RINGCC_SLOT_BYTES", "4096"),
            ("RINGCC_CHUNK_BYTES", "16384"),
        ])
        .unwrap();
        assert_eq!(o.geometry, Some(FifoGeometry::new(4096, 1).unwrap()));
        assert_eq!(o.chunk_bytes, 16384);
        // A chunk verbs' FIFO cannot pipeline (more than 3 of its slices,
        // though 7 of a lone 512 KiB slot would do) is refused.
        let too_big = (GEOMETRY.max_chunk_bytes() + GEOMETRY.slot_bytes()).to_string();
        match options(&[("RINGCC_CHUNK_BYTES", &too_big)]) {
            Err(ringcc_comm::Error::BadConfig(why)) => assert!(why.contains("chunk"), "{why}"),
            other => panic!("{other:?}"),
        }
        // The communicator's own variables are still checked.
        assert!(matches!(
            options(&[("RINGCC_NCHANNELS", "x")]),
            Err(ringcc_comm::Error::Env { .. })
        ));
    }

    #[test]
    fn bad_values_are_errors_naming_the_variable() {
        for (k, v) in [
            ("RINGCC_IB_TIMEOUT", "40"),
            ("RINGCC_IB_RETRY_CNT", "8"),
            ("RINGCC_IB_PORT", "x"),
            ("RINGCC_IB_PORT", "0"),
            ("RINGCC_IB_HCA", "a,,b"),
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
