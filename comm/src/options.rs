//! A communicator's settings, with NCCL-style environment overrides.
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `RINGCC_NCHANNELS` | channels (rings), 1..=64 | 2 |
//! | `RINGCC_SLOT_BYTES` | bytes per FIFO slot | the ring's transports': 131072, or 524288 on a ring with a TCP hop |
//! | `RINGCC_CHUNK_BYTES` | the plan's chunk | 524288 |
//! | `RINGCC_CHANNEL_BYTES` | a call uses one channel per this many bytes of its larger buffer (at least one, at most `RINGCC_NCHANNELS`) | the ring's transports': 4194304, or one channel on a ring with a TCP hop |
//! | `RINGCC_PROTO` | the protocols calls may run under, NCCL_PROTO's syntax: `LL`, `LL,LL128`, `^LL128`, any case | all: the tuner picks per call ([`choose_protocol`](crate::proto::choose_protocol)) |
//! | `RINGCC_ALGO` | the algorithms, NCCL_ALGO's syntax (`Ring`, `^Tree`); the communicator runs rings | all |
//! | `RINGCC_TIMEOUT_MS` | a call fails when nothing moves this long | 30000 |
//! | `RINGCC_NODE` | this process's node identity (ranks of one node share memory) | the host name |
//! | `RINGCC_SHM_DISABLE=1` | never use shared memory (as `NCCL_SHM_DISABLE`) | |
//! | `RINGCC_IB_DISABLE=1` | never use RDMA (as `NCCL_IB_DISABLE`) | |
//! | `RINGCC_NET` | the one network transport to use between nodes: `tcp` or `verbs` (as `NCCL_NET`) | the first available |
//! | `RINGCC_DEBUG=INFO` | print the init banner (ranks, nodes, channels, each hop's transport) | |

use std::time::Duration;

use ringcc_core::fifo::FifoGeometry;
use ringcc_core::tune::{AlgoSet, ProtoSet};

use crate::error::{Error, Result};

/// How a communicator runs. The data-path settings (channels, FIFO,
/// chunk) must be the same on every rank; connecting checks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    /// Channels (rings), `1..=64`.
    pub channels: u8,
    /// The FIFO of every connection. `None`: what the ring's transports
    /// ask for, one slot per slice
    /// ([`Transport::slot_bytes`](crate::transport::Transport::slot_bytes):
    /// [`SLOT_BYTES`](crate::transport::SLOT_BYTES), or 512 KiB on a
    /// ring with a TCP hop).
    pub geometry: Option<FifoGeometry>,
    /// The plan's chunk (bytes per rank and step before the last loop
    /// shrinks it); at most what the FIFO holds less one slice.
    pub chunk_bytes: u64,
    /// A call uses one channel per this many bytes of its larger buffer
    /// (at least one, at most [`channels`](Self::channels)): every
    /// channel adds hand-offs, and one drive thread serves them all.
    /// `None`: what the ring's transports ask for
    /// ([`Transport::channel_bytes`](crate::transport::Transport::channel_bytes):
    /// [`CHANNEL_BYTES`](crate::transport::CHANNEL_BYTES), or one channel
    /// on a ring with a TCP hop).
    pub channel_bytes: Option<u64>,
    /// The protocols calls may run under (`RINGCC_PROTO`); the tuner
    /// picks among them per call
    /// ([`choose_protocol`](crate::proto::choose_protocol)).
    pub protos: ProtoSet,
    /// The algorithms calls may run (`RINGCC_ALGO`).
    pub algos: AlgoSet,
    /// Connecting and every call fail when nothing moves for this long.
    pub timeout: Duration,
    /// Idle polls spent spinning and yielding before a wait naps.
    pub spin: u32,
    /// This process's node identity.
    pub node: String,
    /// Transports never to use (`shm`, `tcp`, `verbs`).
    pub disabled: Vec<String>,
    /// The one network transport to use between nodes, when set.
    pub net: Option<String>,
    /// Print the init banner.
    pub debug_info: bool,
}

impl Default for Options {
    /// Two channels, the ring's transports' slots (128 KiB, one slot per
    /// slice: 1 MiB of FIFO per connection; 512 KiB on a ring with a TCP
    /// hop), 512 KiB chunks (half the smaller FIFO, as NCCL's Simple
    /// protocol), a 30 s deadline, this host's name as the node.
    fn default() -> Self {
        Options {
            channels: 2,
            geometry: None,
            chunk_bytes: 512 << 10,
            channel_bytes: None,
            protos: ProtoSet::ALL,
            algos: AlgoSet::ALL,
            timeout: Duration::from_secs(30),
            spin: 2000,
            node: crate::launch::node_name(),
            disabled: Vec::new(),
            net: None,
            debug_info: false,
        }
    }
}

/// The FIFO of a ring whose transports ask for nothing else:
/// [`SLOT_BYTES`](crate::transport::SLOT_BYTES), one slot per slice.
pub(crate) fn default_geometry() -> FifoGeometry {
    FifoGeometry::new(crate::transport::SLOT_BYTES, 1).unwrap_or_default()
}

/// Transports that reach only inside a node (shared memory, CUDA IPC).
const LOCAL: [&str; 2] = ["shm", "cuda-ipc"];

impl Options {
    /// The defaults with the environment's overrides.
    pub fn from_env() -> Result<Options> {
        Options::from_vars(|k| std::env::var(k).ok())
    }

    /// The defaults with the overrides `get` returns (testable
    /// without touching the process environment).
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Options> {
        let mut o = Options::default();
        let num = |var: &str| -> Result<Option<u64>> {
            match get(var) {
                None => Ok(None),
                Some(v) if v.trim().is_empty() => Ok(None),
                Some(v) => v.trim().parse().map(Some).map_err(|_| Error::Env {
                    var: var.to_owned(),
                    reason: format!("{v:?} is not a number"),
                }),
            }
        };
        if let Some(c) = num("RINGCC_NCHANNELS")? {
            o.channels = u8::try_from(c).unwrap_or(u8::MAX);
        }
        if let Some(s) = num("RINGCC_SLOT_BYTES")? {
            o.geometry = Some(crate::connect::geometry(s, 1)?);
        }
        if let Some(c) = num("RINGCC_CHUNK_BYTES")? {
            o.chunk_bytes = c;
        }
        if let Some(b) = num("RINGCC_CHANNEL_BYTES")? {
            o.channel_bytes = Some(b);
        }
        if let Some(p) = get("RINGCC_PROTO") {
            o.protos = crate::proto::parse_protos(&p).map_err(|reason| Error::Env {
                var: "RINGCC_PROTO".into(),
                reason,
            })?;
        }
        if let Some(a) = get("RINGCC_ALGO") {
            o.algos = crate::proto::parse_algos(&a).map_err(|reason| Error::Env {
                var: "RINGCC_ALGO".into(),
                reason,
            })?;
        }
        if let Some(t) = num("RINGCC_TIMEOUT_MS")? {
            o.timeout = Duration::from_millis(t);
        }
        if let Some(n) = get("RINGCC_NODE").filter(|n| !n.trim().is_empty()) {
            o.node = n.trim().to_owned();
        }
        let on = |var: &str| get(var).is_some_and(|v| v.trim() == "1");
        if on("RINGCC_SHM_DISABLE") || on("RINGCC_P2P_DISABLE") {
            o.disabled.push("shm".into());
        }
        if on("RINGCC_IB_DISABLE") {
            o.disabled.push("verbs".into());
        }
        if let Some(net) = get("RINGCC_NET").filter(|n| !n.trim().is_empty()) {
            let net = net.trim().to_ascii_lowercase();
            let net = if net == "ib" || net == "rdma" {
                "verbs".to_owned()
            } else if net == "socket" {
                "tcp".to_owned()
            } else {
                net
            };
            if net != "tcp" && net != "verbs" {
                return Err(Error::Env {
                    var: "RINGCC_NET".into(),
                    reason: format!("{net:?} is not a network transport (tcp, verbs)"),
                });
            }
            o.net = Some(net);
        }
        o.debug_info = get("RINGCC_DEBUG").is_some_and(|v| {
            let v = v.trim().to_ascii_uppercase();
            v == "INFO" || v == "TRACE"
        });
        o.validate()?;
        Ok(o)
    }

    /// Checks the settings that cannot work.
    pub fn validate(&self) -> Result<()> {
        // The tuner refuses what leaves nothing to run (Tree alone: the
        // communicator runs rings; an empty protocol list).
        crate::proto::host_tuner(2, 1, 1, self.algos, self.protos)?;
        if !(1..=64).contains(&self.channels) {
            return Err(Error::BadConfig(format!(
                "{} channels: a communicator has 1 to 64",
                self.channels
            )));
        }
        // Without a geometry set, the ring's is at least the default's.
        let g = self.geometry.unwrap_or_else(default_geometry);
        if self.chunk_bytes == 0 || self.chunk_bytes > g.max_chunk_bytes() {
            return Err(Error::BadConfig(format!(
                "a {} B chunk does not fit a {} B FIFO (at most {} B: one slice stays free)",
                self.chunk_bytes,
                g.fifo_bytes(),
                g.max_chunk_bytes()
            )));
        }
        if self.channel_bytes == Some(0) {
            return Err(Error::BadConfig("0 bytes per channel".into()));
        }
        if self.timeout.is_zero() {
            return Err(Error::BadConfig("a zero timeout".into()));
        }
        Ok(())
    }

    /// Whether transport `name` may be used at all.
    pub fn allows(&self, name: &str) -> bool {
        if self.disabled.iter().any(|d| d == name) {
            return false;
        }
        match &self.net {
            Some(net) => LOCAL.contains(&name) || net == name,
            None => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars<'a>(kv: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| kv.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
    }

    #[test]
    fn environment_overrides_the_defaults() {
        let o = Options::from_vars(vars(&[
            ("RINGCC_NCHANNELS", "4"),
            ("RINGCC_NODE", "n7"),
            ("RINGCC_SHM_DISABLE", "1"),
            ("RINGCC_NET", "socket"),
            ("RINGCC_DEBUG", "info"),
            ("RINGCC_PROTO", "ll128"),
        ]))
        .unwrap();
        assert_eq!(o.channels, 4);
        assert_eq!(o.node, "n7");
        assert!(!o.allows("shm"));
        assert!(o.allows("tcp"));
        assert!(!o.allows("verbs"));
        // RINGCC_NET picks the network; it never turns off CUDA IPC.
        assert!(o.allows("cuda-ipc"));
        assert!(o.debug_info);
        assert_eq!(o.protos, ProtoSet::only(ringcc_core::Protocol::Ll128));
    }

    #[test]
    fn bad_values_are_typed_errors() {
        for kv in [
            ("RINGCC_NCHANNELS", "many"),
            ("RINGCC_NCHANNELS", "0"),
            ("RINGCC_NET", "carrier-pigeon"),
            ("RINGCC_CHUNK_BYTES", "99999999999"),
            ("RINGCC_TIMEOUT_MS", "0"),
            ("RINGCC_PROTO", "LL64"),
            ("RINGCC_ALGO", "Trie"),
            ("RINGCC_ALGO", "Tree"),
        ] {
            let e = Options::from_vars(vars(&[kv])).unwrap_err();
            assert!(
                matches!(e, Error::Env { .. } | Error::BadConfig(_)),
                "{kv:?}: {e}"
            );
        }
    }
}
