//! # CUDA IPC between the processes of a node
//!
//! A [`Transport`] of the per-rank communicator (`ringcc-comm`), chosen
//! per hop like every transport: it reaches between two ranks of one node
//! whose devices can map each other's memory. Each receiver's FIFO lives
//! in its device memory and is exported to its ring predecessor's
//! process:
//!
//! 1. **listen** (receiver): allocate the FIFO ([`conn::Inbox`]), export
//!    it ([`memory::IpcHandle`]) and publish the handle in the job's store
//!    under `cuda-ipc/<channel>/<sender>-<receiver>`;
//! 2. **connect** (sender): wait for the handle (until the job's deadline
//!    or its abort notice), import and map it, check it (magic, job,
//!    geometry), mark it mapped: the sender's end writes its slices
//!    straight into the receiver's slots and posts `tail` there;
//! 3. **accept** (receiver): wait until the sender has mapped it; the
//!    receiver's end reads the slots in place and posts `head`.
//!
//! Which memory stands behind the handle is the device's business. On the
//! host fake device (the only one this transport serves today) it is a
//! `memfd` named through `/proc/<pid>/fd/<fd>` — the same steps (export →
//! store → import → map → the executor reads and writes through the
//! mapping) that legacy CUDA IPC handles (`cuIpcGetMemHandle` /
//! `cuIpcOpenMemHandle`) take on a GPU. The communicator's drive loop and
//! host executor (the core's kernels: what the fake device runs) carry out
//! the slices.
//!
//! A peer that dies is noticed by the job's abort notice, by the process
//! table (an idle end looks now and then whether the peer's process still
//! exists), and at the latest by the engine's deadline.

pub mod conn;
pub mod cuda;
pub mod memory;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use ringcc_comm::store::abort::parse_notice;
use ringcc_comm::store::{Store, ABORT_KEY};
use ringcc_comm::transport::{Hop, Job, PeerInfo, RecvEnd, SendEnd, Transport};
use ringcc_comm::Error as CommError;
use ringcc_core::Rank;

use crate::rank::RankDevice;
use conn::{open_outbox, Inbox, IpcRecv, IpcSend};
use memory::{ImportedMemory, IpcHandle};
use ringcc_comm::peer::{pid_namespace, PeerProcess};

/// The transport's name (banner, `PeerInfo::transports`, overrides).
pub const NAME: &str = "cuda-ipc";

/// How long one look for a store key may block before the abort notice is
/// looked at.
const ABORT_POLL: Duration = Duration::from_millis(100);

/// The longest nap while waiting for the sender to map a FIFO.
const NAP: Duration = Duration::from_micros(200);

type Result<T> = std::result::Result<T, CommError>;

/// See the module documentation.
#[derive(Debug)]
pub struct IpcTransport {
    device: RankDevice,
    token: String,
    /// FIFOs exported by `listen`, waiting for `accept`.
    inboxes: HashMap<Hop, Inbox>,
}

impl IpcTransport {
    /// A transport for ranks whose memory is on `device`.
    pub fn new(device: RankDevice) -> IpcTransport {
        IpcTransport {
            device,
            token: String::new(),
            inboxes: HashMap::new(),
        }
    }
}

fn field<'a>(p: &'a PeerInfo, key: &str) -> Option<&'a serde_json::Value> {
    p.transports.get(NAME)?.get(key)
}

/// The store key of `hop`'s handle.
fn key(hop: Hop) -> String {
    format!(
        "{NAME}/{}/{}-{}",
        hop.channel.0, hop.sender.0, hop.receiver.0
    )
}

/// The value of `key`, waiting until `deadline` in slices of
/// [`ABORT_POLL`], failing with the job's abort notice when one appears
/// meanwhile, or with [`CommError::Timeout`] naming `what`.
fn wait_key(store: &dyn Store, key: &str, deadline: Instant, what: &str) -> Result<Vec<u8>> {
    let t0 = Instant::now();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match store.get(key, left.min(ABORT_POLL)) {
            Ok(v) => return Ok(v),
            Err(CommError::Timeout { .. }) if left <= ABORT_POLL => {
                return Err(CommError::Timeout {
                    waiting_for: format!("{what} (store key {key:?})"),
                    after: t0.elapsed(),
                })
            }
            Err(CommError::Timeout { .. }) => {}
            Err(e) => return Err(e),
        }
        if store.check(ABORT_KEY)? {
            return Err(parse_notice(&store.get(ABORT_KEY, ABORT_POLL)?));
        }
    }
}

impl IpcTransport {
    fn peer(&self, job: &Job<'_>, rank: Rank, hop: Hop) -> PeerProcess {
        // `reaches` saw both ends in one PID namespace.
        let pid = job.peer(rank).map(|p| p.pid);
        PeerProcess::new(NAME, rank, hop.channel, pid)
    }
}

impl Transport for IpcTransport {
    fn name(&self) -> &'static str {
        NAME
    }

    fn publish(&mut self, token: &str, _rank: Rank) -> Result<Option<serde_json::Value>> {
        self.token = token.to_owned();
        Ok(Some(serde_json::json!({
            "device": self.device.name(),
            "uid": rustix::process::getuid().as_raw(),
            "pidns": pid_namespace(),
        })))
    }

    /// The same node, user and PID namespace (a handle names a process),
    /// and the same kind of device.
    fn reaches(&self, a: &PeerInfo, b: &PeerInfo) -> bool {
        let same = |k: &str| field(a, k).is_some() && field(a, k) == field(b, k);
        a.node == b.node && same("device") && same("uid") && same("pidns")
    }

    fn listen(&mut self, job: &Job<'_>, hop: Hop) -> Result<()> {
        let inbox = Inbox::create(job.geometry, job.token)?;
        let handle = serde_json::to_vec(&inbox.memory().handle())
            .map_err(|e| CommError::Internal(e.to_string()))?;
        job.store.set(&key(hop), &handle)?;
        self.inboxes.insert(hop, inbox);
        Ok(())
    }

    fn connect(&mut self, job: &Job<'_>, hop: Hop) -> Result<Box<dyn SendEnd>> {
        let k = key(hop);
        let what = format!(
            "rank {}'s exported FIFO of channel {}",
            hop.receiver, hop.channel
        );
        let bytes = wait_key(job.store, &k, job.deadline, &what)?;
        let handle: IpcHandle =
            serde_json::from_slice(&bytes).map_err(|e| CommError::Protocol {
                transport: NAME,
                peer: hop.receiver,
                channel: hop.channel,
                reason: format!("store key {k:?} holds no IPC handle: {e}"),
            })?;
        let need = conn::ConnLayout::new(job.geometry)?.total();
        let memory = ImportedMemory::open(&handle, need)?;
        let (memory, view) =
            open_outbox(memory, job.geometry, job.token, hop.receiver, hop.channel)?;
        Ok(Box::new(IpcSend::new(
            memory,
            view,
            self.peer(job, hop.receiver, hop),
        )))
    }

    fn accept(&mut self, job: &Job<'_>, hop: Hop) -> Result<Box<dyn RecvEnd>> {
        let inbox = self.inboxes.remove(&hop).ok_or_else(|| {
            CommError::Internal(format!("{NAME}: accept of {hop:?} without listen"))
        })?;
        let peer = self.peer(job, hop.sender, hop);
        let t0 = Instant::now();
        let mut naps = 0u32;
        while !inbox.sender_mapped() {
            if naps.is_multiple_of(256) {
                peer.check_now()?;
            }
            naps = naps.wrapping_add(1);
            if Instant::now() >= job.deadline {
                return Err(CommError::Timeout {
                    waiting_for: format!(
                        "rank {} to map this rank's exported FIFO of channel {}",
                        hop.sender, hop.channel
                    ),
                    after: t0.elapsed(),
                });
            }
            std::thread::sleep(NAP);
        }
        Ok(Box::new(IpcRecv::new(inbox, peer)))
    }
}
