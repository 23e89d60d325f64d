//! [`VerbsTransport`]: RDMA reliable connections as a transport of the
//! communicator ([`ringcc_comm::transport::Transport`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ringcc_comm::launch::fnv1a;
use ringcc_comm::transport::{FifoMemory, Hop, Job, PeerInfo, RecvEnd, SendEnd, Transport};
use ringcc_comm::Error as CommError;
use ringcc_core::Rank;
use tracing::{debug, info};

use crate::config::VerbsConfig;
use crate::exchange::{self, RecvRecord, SendRecord, Side};
use crate::ib::cq::CqChannel;
use crate::ib::nic::{device_names, Nic};
use crate::ib::qp::RetryParams;
use crate::recv::RecvHalf;
use crate::send::SendHalf;
use crate::wake::Waker;

type Result<T> = std::result::Result<T, CommError>;

/// RDMA verbs between ranks: per hop, one RC queue pair from the sender
/// to the receiver, on NIC `channel mod nics` of each side.
///
/// The receiver registers its FIFO (the job's geometry; memory of its own,
/// or memory lent to it with [`Transport::listen_in`]) and a call-header
/// mailbox for remote write; the sender writes slices into it with RDMA
/// WRITE from a registered staging copy (its own, or lent with
/// [`Transport::connect_from`]: the caller's slices leave from where it
/// wrote them), the last write of each slice
/// WITH IMMEDIATE (the new `tail`); the receiver returns credit as a small
/// RDMA WRITE WITH IMMEDIATE into the sender's counter — the core's
/// connection protocol ([`ringcc_core::protocol`]), unpatched. What the
/// two ends of a hop need from each other (queue pair address, FIFO and
/// counter addresses and keys) goes through the job's store
/// ([`Job::store`]) in the connecting phases.
///
/// One value per communicator: [`publish`](Transport::publish) opens the
/// devices (none found, or no rdma-core: the transport is simply not
/// offered), the phases make the ends, and a thread per communicator
/// rings the rank's bell when a NIC completes something, so an idle rank
/// sleeps instead of spinning.
pub struct VerbsTransport {
    config: VerbsConfig,
    /// NIC `i`, with its completion channel.
    nics: Vec<(Nic, Arc<CqChannel>)>,
    rank: Rank,
    waker: Option<Arc<Waker>>,
    /// Receiving halves made by `listen`, waiting for `accept`.
    listening: HashMap<Hop, RecvHalf>,
}

impl std::fmt::Debug for VerbsTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsTransport")
            .field("config", &self.config)
            .field(
                "nics",
                &self.nics.iter().map(|(n, _)| &n.name).collect::<Vec<_>>(),
            )
            .field("rank", &self.rank)
            .field("listening", &self.listening.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl VerbsTransport {
    /// A transport with `config`'s settings; nothing is opened before
    /// [`publish`](Transport::publish).
    pub fn new(config: VerbsConfig) -> VerbsTransport {
        VerbsTransport {
            config,
            nics: Vec::new(),
            rank: Rank(0),
            waker: None,
            listening: HashMap::new(),
        }
    }

    /// The names of the devices opened (NIC `i` at `i`).
    pub fn devices(&self) -> Vec<String> {
        self.nics.iter().map(|(n, _)| n.name.clone()).collect()
    }

    fn nic_for(&self, hop: Hop) -> Result<&(Nic, Arc<CqChannel>)> {
        let n = self.nics.len().max(1);
        self.nics
            .get(usize::from(hop.channel.0) % n)
            .ok_or_else(|| CommError::Internal(format!("verbs: {hop:?} without a device")))
    }

    fn retry(&self) -> RetryParams {
        RetryParams {
            timeout: self.config.ib_timeout,
            retry_cnt: self.config.retry_cnt,
            rnr_retry: self.config.rnr_retry,
        }
    }

    /// The waker of this communicator's ends, started at the first use.
    fn waker(&mut self, job: &Job<'_>) -> Result<Arc<Waker>> {
        if let Some(w) = &self.waker {
            return Ok(Arc::clone(w));
        }
        let channels = self.nics.iter().map(|(_, c)| Arc::clone(c)).collect();
        let w = Arc::new(
            Waker::start(channels, Arc::clone(job.bell)).map_err(|source| CommError::Io {
                call: "spawn(ringcc-verbs-wake)",
                source,
            })?,
        );
        self.waker = Some(Arc::clone(&w));
        Ok(w)
    }

    /// A queue pair's first packet sequence number: distinct per rank,
    /// hop, side and run.
    fn psn(&self, hop: Hop, side: u8) -> u32 {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let mut b = Vec::with_capacity(24);
        b.extend_from_slice(&self.rank.0.to_le_bytes());
        b.extend_from_slice(&hop.sender.0.to_le_bytes());
        b.extend_from_slice(&[hop.channel.0, side]);
        b.extend_from_slice(&nanos.to_le_bytes());
        (fnv1a(&b) as u32) & 0x00ff_ffff
    }

    /// `listen`, with the FIFO in `lent` where given.
    ///
    /// # Safety
    /// `lent`'s contract ([`FifoMemory::new`]).
    unsafe fn listen_with(
        &mut self,
        job: &Job<'_>,
        hop: Hop,
        lent: Option<FifoMemory>,
    ) -> Result<()> {
        let psn = self.psn(hop, 1);
        let (nic, channel) = self.nic_for(hop)?;
        // SAFETY: the caller's contract.
        let half = unsafe { RecvHalf::new(nic, channel, job.geometry, hop, psn, lent) }
            .map_err(|e| e.into_comm("listen"))?;
        exchange::put(job.store, hop, Side::Recv, &half.record(self.config.fault))?;
        self.listening.insert(hop, half);
        Ok(())
    }

    /// `connect`, with the staging in `lent` where given.
    ///
    /// # Safety
    /// `lent`'s contract ([`FifoMemory::new`]).
    unsafe fn connect_with(
        &mut self,
        job: &Job<'_>,
        hop: Hop,
        lent: Option<FifoMemory>,
    ) -> Result<Box<dyn SendEnd>> {
        let waker = self.waker(job)?;
        let (psn, retry, slot_wait) = (self.psn(hop, 0), self.retry(), self.slot_wait());
        let (nic, channel) = self.nic_for(hop)?;
        // SAFETY: the caller's contract.
        let half = unsafe { SendHalf::new(nic, channel, job.geometry, hop, psn, lent) }
            .map_err(|e| e.into_comm("connect"))?;
        let theirs: RecvRecord = exchange::take(job, hop, Side::Recv)?;
        let mine = half.record();
        let end = half.connect(&theirs, nic.active_mtu, retry, waker, slot_wait)?;
        exchange::put(job.store, hop, Side::Send, &mine)?;
        debug!(
            channel = hop.channel.0,
            to = hop.receiver.0,
            device = %nic.name,
            lent = lent.is_some(),
            "verbs: connected"
        );
        Ok(Box::new(end))
    }

    /// How long a credited staging slot may still be read by its write:
    /// past the NIC's own retry budget, the write has failed (and says
    /// so).
    fn slot_wait(&self) -> Duration {
        self.config.retry_budget() + Duration::from_secs(1)
    }
}

impl Transport for VerbsTransport {
    fn name(&self) -> &'static str {
        "verbs"
    }

    /// Opens the devices: `devices` as configured (each must open), else
    /// every device found that opens. `None` when rdma-core is missing
    /// or no device is present (or none found opens).
    fn publish(&mut self, _token: &str, rank: Rank) -> Result<Option<serde_json::Value>> {
        self.rank = rank;
        self.nics.clear();
        let found = match device_names() {
            Ok(found) if !found.is_empty() => found,
            Ok(_) => {
                debug!("verbs: no RDMA device");
                return Ok(None);
            }
            Err(e) => {
                debug!("verbs: not offered: {e}");
                return Ok(None);
            }
        };
        let explicit = !self.config.devices.is_empty();
        let names = if explicit {
            self.config.devices.clone()
        } else {
            found
        };
        for name in names {
            let opened = Nic::open(&name, self.config.port, self.config.gid_index)
                .and_then(|nic| CqChannel::new(&nic).map(|c| (nic, Arc::new(c))));
            match opened {
                Ok(nic) => self.nics.push(nic),
                Err(e) if explicit => return Err(e.into_comm("publish")),
                Err(e) => info!("verbs: skipping device {name}: {e}"),
            }
        }
        if self.nics.is_empty() {
            return Ok(None);
        }
        Ok(Some(serde_json::json!({ "devices": self.devices() })))
    }

    /// Every pair that both offer verbs: one host's ranks included (the
    /// NIC loops back).
    fn reaches(&self, _a: &PeerInfo, _b: &PeerInfo) -> bool {
        true
    }

    fn listen(&mut self, job: &Job<'_>, hop: Hop) -> Result<()> {
        // SAFETY: nothing is lent.
        unsafe { self.listen_with(job, hop, None) }
    }

    fn connect(&mut self, job: &Job<'_>, hop: Hop) -> Result<Box<dyn SendEnd>> {
        // SAFETY: nothing is lent.
        unsafe { self.connect_with(job, hop, None) }
    }

    /// Registers `fifo` as the hop's FIFO: the predecessor's writes land
    /// in it.
    fn listen_in(&mut self, job: &Job<'_>, hop: Hop, fifo: FifoMemory) -> Result<bool> {
        // SAFETY: `FifoMemory::new`'s contract, which its maker keeps.
        unsafe { self.listen_with(job, hop, Some(fifo)) }.map(|()| true)
    }

    /// Registers `staging` as the end's staging: each slice's writes
    /// gather from it.
    fn connect_from(
        &mut self,
        job: &Job<'_>,
        hop: Hop,
        staging: FifoMemory,
    ) -> Result<(Box<dyn SendEnd>, bool)> {
        // SAFETY: `FifoMemory::new`'s contract, which its maker keeps.
        unsafe { self.connect_with(job, hop, Some(staging)) }.map(|end| (end, true))
    }

    /// Every device opened registers dma-buf memory (asked at
    /// [`publish`](Transport::publish) as NCCL asks it); Soft-RoCE, for
    /// one, does not.
    fn device_memory(&self) -> std::result::Result<(), String> {
        if self.nics.is_empty() {
            return Err("verbs: no device opened".into());
        }
        self.nics.iter().try_for_each(|(nic, _)| {
            nic.dma_buf
                .clone()
                .map_err(|why| format!("verbs on {}: {why}", nic.name))
        })
    }

    fn accept(&mut self, job: &Job<'_>, hop: Hop) -> Result<Box<dyn RecvEnd>> {
        let waker = self.waker(job)?;
        let retry = self.retry();
        let half = self.listening.remove(&hop).ok_or_else(|| {
            CommError::Internal(format!("verbs: accept of {hop:?} without listen"))
        })?;
        let mtu = self.nic_for(hop)?.0.active_mtu;
        let theirs: SendRecord = exchange::take(job, hop, Side::Send)?;
        let end = half.connect(&theirs, mtu, retry, waker)?;
        debug!(
            channel = hop.channel.0,
            from = hop.sender.0,
            "verbs: accepted"
        );
        Ok(Box::new(end))
    }
}
