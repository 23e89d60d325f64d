//! Reliable-connected queue pairs with their states in the type:
//! `Qp<Reset>` → `Qp<Init>` → `Qp<Rtr>` → `Qp<Rts>`; only a `Qp<Rts>`
//! can post sends, and receives can be posted from `Init` on.

use std::marker::PhantomData;
use std::sync::Arc;

use ringcc_core::wire::{Payload, SendFlags, WorkRequest, WrOpcode};
use serde::{Deserialize, Serialize};
use sideway::ibverbs::address::{AddressHandleAttribute, Gid};
use sideway::ibverbs::completion::BasicCompletionQueue;
use sideway::ibverbs::device_context::Mtu;
use sideway::ibverbs::queue_pair::{
    BasicQueuePair, PostSendGuard, QueuePair, QueuePairAttribute, QueuePairState, SetInlineData,
    SetScatterGatherEntry, WorkRequestFlags,
};
use sideway::ibverbs::AccessFlags;

use super::nic::Nic;
use crate::error::{Error, Result};

/// Typestate: just created.
pub(crate) struct Reset;
/// Typestate: initialized, receives may be posted.
pub(crate) struct Init;
/// Typestate: ready to receive.
pub(crate) struct Rtr;
/// Typestate: ready to send.
pub(crate) struct Rts;

/// States in which receives may be posted.
pub(crate) trait Receiving {}
impl Receiving for Init {}
impl Receiving for Rtr {}
impl Receiving for Rts {}

/// What the other end needs to connect to a queue pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct QpAddr {
    pub qpn: u32,
    pub psn: u32,
    pub lid: u16,
    pub gid: [u8; 16],
    /// `enum ibv_mtu` of the port.
    pub mtu: u32,
}

/// Retry and timeout parameters of the RTR/RTS transitions.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RetryParams {
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
}

/// Send / receive queue depths.
pub(crate) const SQ_DEPTH: u32 = 128;
pub(crate) const RQ_DEPTH: u32 = 64;
/// Bytes a request may carry inline (call header, credit counter).
pub(crate) const MAX_INLINE: u32 = 64;

pub(crate) struct Qp<S> {
    qp: BasicQueuePair,
    device: String,
    port: u8,
    gid_index: u8,
    psn: u32,
    _state: PhantomData<S>,
}

impl<S> Qp<S> {
    pub fn qpn(&self) -> u32 {
        self.qp.qp_number()
    }

    fn modify<T>(mut self, attr: &QueuePairAttribute, call: &'static str) -> Result<Qp<T>> {
        self.qp
            .modify(attr)
            .map_err(Error::verbs(call, &self.device))?;
        Ok(Qp {
            qp: self.qp,
            device: self.device,
            port: self.port,
            gid_index: self.gid_index,
            psn: self.psn,
            _state: PhantomData,
        })
    }
}

impl Qp<Reset> {
    /// An RC queue pair on `nic` completing into `send_cq` / `recv_cq`.
    pub fn create(
        nic: &Nic,
        send_cq: &Arc<BasicCompletionQueue>,
        recv_cq: &Arc<BasicCompletionQueue>,
        psn: u32,
    ) -> Result<Qp<Reset>> {
        let qp = nic
            .pd
            .create_qp_builder()
            .setup_max_send_wr(SQ_DEPTH)
            .setup_max_recv_wr(RQ_DEPTH)
            .setup_max_send_sge(1)
            .setup_max_recv_sge(1)
            .setup_max_inline_data(MAX_INLINE)
            .setup_send_cq(Arc::clone(send_cq))
            .setup_recv_cq(Arc::clone(recv_cq))
            .build()
            .map_err(Error::verbs("ibv_create_qp", &nic.name))?;
        Ok(Qp {
            qp,
            device: nic.name.clone(),
            port: nic.port,
            gid_index: nic.gid_index,
            psn: psn & 0x00ff_ffff,
            _state: PhantomData,
        })
    }

    /// This end's address, to send to the peer.
    pub fn addr(&self, nic: &Nic) -> QpAddr {
        QpAddr {
            qpn: self.qpn(),
            psn: self.psn,
            lid: nic.lid,
            gid: nic.gid.raw,
            mtu: nic.active_mtu,
        }
    }

    /// RESET → INIT, allowing remote writes.
    pub fn init(self) -> Result<Qp<Init>> {
        let mut a = QueuePairAttribute::new();
        a.setup_state(QueuePairState::Init)
            .setup_pkey_index(0)
            .setup_port(self.port)
            .setup_access_flags(AccessFlags::LocalWrite | AccessFlags::RemoteWrite);
        self.modify(&a, "ibv_modify_qp(INIT)")
    }
}

impl Qp<Init> {
    /// INIT → RTR towards `remote`, path MTU the smaller of both ends'.
    pub fn rtr(self, remote: &QpAddr, local_mtu: u32) -> Result<Qp<Rtr>> {
        let mtu = mtu_of(local_mtu.min(remote.mtu)).ok_or_else(|| Error::Verbs {
            call: "ibv_modify_qp(RTR)",
            device: self.device.clone(),
            source: format!("no path MTU for {local_mtu} / {}", remote.mtu).into(),
        })?;
        let mut av = AddressHandleAttribute::new();
        av.setup_dest_lid(remote.lid)
            .setup_port(self.port)
            .setup_service_level(0)
            .setup_grh_src_gid_index(self.gid_index)
            .setup_grh_dest_gid(&Gid { raw: remote.gid })
            .setup_grh_hop_limit(255);
        let mut a = QueuePairAttribute::new();
        a.setup_state(QueuePairState::ReadyToReceive)
            .setup_path_mtu(mtu)
            .setup_dest_qp_num(remote.qpn)
            .setup_rq_psn(remote.psn)
            .setup_max_dest_read_atomic(1)
            .setup_min_rnr_timer(12)
            .setup_address_vector(&av);
        self.modify(&a, "ibv_modify_qp(RTR)")
    }
}

impl Qp<Rtr> {
    /// RTR → RTS.
    pub fn rts(self, t: RetryParams) -> Result<Qp<Rts>> {
        let mut a = QueuePairAttribute::new();
        a.setup_state(QueuePairState::ReadyToSend)
            .setup_sq_psn(self.psn)
            .setup_timeout(t.timeout)
            .setup_retry_cnt(t.retry_cnt)
            .setup_rnr_retry(t.rnr_retry)
            .setup_max_read_atomic(1);
        self.modify(&a, "ibv_modify_qp(RTS)")
    }
}

impl<S: Receiving> Qp<S> {
    /// Posts zero-SGE receives (each consumed by one WRITE WITH
    /// IMMEDIATE), with these `wr_id`s.
    pub fn post_recvs(&mut self, wr_ids: impl IntoIterator<Item = u64>) -> Result<()> {
        let mut guard = self.qp.start_post_recv();
        for id in wr_ids {
            guard.construct_wr(id);
        }
        guard
            .post()
            .map_err(Error::verbs("ibv_post_recv", &self.device))
    }
}

impl Qp<Rts> {
    /// Posts `wrs` (RDMA WRITE / WRITE WITH IMMEDIATE only) as one list;
    /// returns how many were posted.
    ///
    /// # Safety
    /// Every gather entry must name registered memory (its `lkey`) that
    /// stays valid, and is not written, until the request completes or the
    /// queue pair is flushed.
    pub unsafe fn post_writes<const N: usize>(
        &mut self,
        wrs: impl IntoIterator<Item = WorkRequest<N>>,
    ) -> Result<u32> {
        let device = &self.device;
        let bad = |why: String| Error::Verbs {
            call: "ibv_post_send",
            device: device.clone(),
            source: why.into(),
        };
        let mut guard = self.qp.start_post_send();
        let mut n = 0u32;
        for wr in wrs {
            wr.validate()
                .map_err(Error::core("WorkRequest::validate"))?;
            let remote = wr
                .remote
                .ok_or_else(|| bad("an RDMA write without a remote address".into()))?;
            let handle = guard.construct_wr(wr.wr_id, send_flags(wr.flags));
            let (rkey, addr) = (remote.rkey.get(), remote.addr);
            let local = match wr.opcode {
                WrOpcode::RdmaWrite => handle.setup_write(rkey, addr),
                // verbs' imm_data is in network order.
                WrOpcode::RdmaWriteWithImm => handle.setup_write_imm(rkey, addr, wr.imm.to_be()),
                op => return Err(bad(format!("opcode {op:?} is not posted by this backend"))),
            };
            match &wr.payload {
                Payload::Inline(data) => local.setup_inline_data(data),
                Payload::Gather(sgl) => match sgl.as_slice() {
                    [] => {}
                    // SAFETY: the caller guarantees the memory behind the
                    // entry (registered under its lkey) outlives the request.
                    [s] => unsafe { local.setup_sge(s.lkey.get(), s.addr, s.length) },
                    _ => return Err(bad("more than one gather entry".into())),
                },
            }
            n = n.saturating_add(1);
        }
        guard
            .post()
            .map_err(Error::verbs("ibv_post_send", device))?;
        Ok(n)
    }
}

fn send_flags(f: SendFlags) -> WorkRequestFlags {
    let mut w = WorkRequestFlags::none();
    for (ours, theirs) in [
        (SendFlags::SIGNALED, WorkRequestFlags::Signaled),
        (SendFlags::INLINE, WorkRequestFlags::Inline),
        (SendFlags::FENCE, WorkRequestFlags::Fence),
        (SendFlags::SOLICITED, WorkRequestFlags::Solicited),
    ] {
        if f.contains(ours) {
            w |= theirs;
        }
    }
    w
}

fn mtu_of(v: u32) -> Option<Mtu> {
    Some(match v {
        1 => Mtu::Mtu256,
        2 => Mtu::Mtu512,
        3 => Mtu::Mtu1024,
        4 => Mtu::Mtu2048,
        5 => Mtu::Mtu4096,
        _ => return None,
    })
}
