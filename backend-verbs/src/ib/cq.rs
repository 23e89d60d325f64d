//! Completion queues, each bound to its NIC's completion channel, so that
//! a thread can sleep until one of them completes something (see
//! [`crate::wake`]).
//!
//! Layers: `raw` (rdma-core's `ibv_req_notify_cq`, `ibv_get_cq_event`,
//! `ibv_ack_cq_events`, which sideway does not wrap) → checked functions
//! returning `Result` → the safe [`CqChannel`], which creates every CQ
//! of its channel and keeps it alive as long as it lives, so an event's
//! CQ is always one it can still arm.

use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ringcc_core::wire::{Completion, WcOpcode, WcStatus};
use sideway::ibverbs::completion::{BasicCompletionQueue, CompletionChannel, CompletionQueue};

use super::nic::Nic;
use crate::error::{Error, Result};

mod raw {
    pub use rdma_mummy_sys::{ibv_ack_cq_events, ibv_cq, ibv_get_cq_event, ibv_req_notify_cq};
}

/// Checked `ibv_req_notify_cq`: the next completion on `cq` raises an
/// event on its channel.
///
/// # Safety
/// `cq` is a live CQ.
unsafe fn req_notify(cq: *mut raw::ibv_cq, device: &str) -> Result<()> {
    // SAFETY: the caller's promise; solicited_only = 0.
    let rc = unsafe { raw::ibv_req_notify_cq(cq, 0) };
    if rc != 0 {
        return Err(Error::Verbs {
            call: "ibv_req_notify_cq",
            device: device.to_owned(),
            source: std::io::Error::from_raw_os_error(rc.abs()).into(),
        });
    }
    Ok(())
}

/// Checked `ibv_get_cq_event` on a non-blocking channel: the CQ of the
/// event taken, if there was one. The event still has to be acknowledged.
fn get_event(channel: &CompletionChannel, device: &str) -> Result<Option<*mut raw::ibv_cq>> {
    let mut cq = std::ptr::null_mut();
    let mut ctx = std::ptr::null_mut();
    // SAFETY: the channel is live; `cq` and `ctx` are out-parameters.
    let rc = unsafe { raw::ibv_get_cq_event(channel.comp_channel().as_ptr(), &mut cq, &mut ctx) };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        if e.kind() == std::io::ErrorKind::WouldBlock {
            return Ok(None);
        }
        return Err(Error::Verbs {
            call: "ibv_get_cq_event",
            device: device.to_owned(),
            source: e.into(),
        });
    }
    Ok(Some(cq))
}

/// One NIC's completion channel and every CQ bound to it.
///
/// Field order: the CQs go before the channel they are bound to.
pub(crate) struct CqChannel {
    device: String,
    cqs: Mutex<Vec<Arc<BasicCompletionQueue>>>,
    channel: Arc<CompletionChannel>,
}

impl CqChannel {
    /// A non-blocking completion channel on `nic`.
    pub fn new(nic: &Nic) -> Result<CqChannel> {
        let dev = nic.name.as_str();
        let channel = nic
            .ctx
            .create_comp_channel()
            .map_err(Error::verbs("ibv_create_comp_channel", dev))?;
        channel
            .set_nonblocking(true)
            .map_err(Error::verbs("fcntl(O_NONBLOCK)", dev))?;
        Ok(CqChannel {
            device: dev.to_owned(),
            cqs: Mutex::new(Vec::new()),
            channel,
        })
    }

    /// A CQ of `cqe` entries on `nic` (this channel's), bound to this
    /// channel and armed: its next completion raises an event.
    pub fn cq(&self, nic: &Nic, cqe: u32) -> Result<Arc<BasicCompletionQueue>> {
        let mut b = nic.ctx.create_cq_builder();
        b.setup_comp_channel(&self.channel, 0);
        let cq = b
            .setup_cqe(cqe.max(1))
            .build()
            .map_err(Error::verbs("ibv_create_cq", &self.device))?;
        // SAFETY: `cq` is alive (we hold it).
        unsafe { req_notify(cq.cq().as_ptr(), &self.device)? };
        self.cqs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Arc::clone(&cq));
        Ok(cq)
    }

    /// Takes every pending event: re-arms its CQ, then acknowledges it.
    /// Whether any was taken.
    pub fn take_events(&self) -> Result<bool> {
        let mut any = false;
        while let Some(cq) = get_event(&self.channel, &self.device)? {
            any = true;
            // SAFETY: the event names a CQ bound to this channel; every
            // such CQ was made by `cq` and is kept alive by `self.cqs`
            // as long as `self` lives.
            let armed = unsafe { req_notify(cq, &self.device) };
            // SAFETY: as above; one event taken, one acknowledged.
            unsafe { raw::ibv_ack_cq_events(cq, 1) };
            armed?;
        }
        Ok(any)
    }

    fn fd(&self) -> i32 {
        self.channel.as_raw_fd()
    }
}

/// Sleeps until one of `channels` has an event, or `timeout`; takes the
/// events (re-arming their CQs). Whether any was taken.
pub(crate) fn wait_any(channels: &[Arc<CqChannel>], timeout: Duration) -> Result<bool> {
    let mut fds: Vec<libc::pollfd> = channels
        .iter()
        .map(|c| libc::pollfd {
            fd: c.fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let ms = i32::try_from(timeout.as_millis().max(1)).unwrap_or(i32::MAX);
    // SAFETY: `fds` is a valid array of `fds.len()` pollfd structures.
    let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
    if rc < 0 {
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(Error::Verbs {
                call: "poll(completion channel)",
                device: channels
                    .first()
                    .map(|c| c.device.clone())
                    .unwrap_or_default(),
                source: e.into(),
            });
        }
    }
    let mut any = false;
    for c in channels {
        any |= c.take_events()?;
    }
    Ok(any)
}

/// The completions of `cq`, appended to `out`.
fn poll(cq: &BasicCompletionQueue, device: &str, out: &mut Vec<Completion>) -> Result<()> {
    use sideway::ibverbs::completion::PollCompletionQueueError as E;
    let poller = match cq.start_poll() {
        Ok(p) => p,
        Err(E::CompletionQueueEmpty) => return Ok(()),
        Err(e) => return Err(Error::verbs("ibv_poll_cq", device)(e)),
    };
    for wc in poller {
        // The basic ibv_wc carries wc_flags only through the opcode: a
        // receive of a WRITE WITH IMMEDIATE is RECV_RDMA_WITH_IMM.
        let opcode = WcOpcode::from_code(wc.opcode());
        let imm = match opcode {
            WcOpcode::RecvRdmaWithImm => Some(u32::from_be(wc.imm_data())),
            _ => None,
        };
        out.push(Completion {
            wr_id: wc.wr_id(),
            status: WcStatus::from_code(wc.status()),
            opcode,
            byte_len: wc.byte_len(),
            imm,
            qp_num: 0,
        });
    }
    Ok(())
}

/// rdma-core's name of a completion status.
pub(crate) fn status_name(s: WcStatus) -> &'static str {
    match s {
        WcStatus::Success => "IBV_WC_SUCCESS",
        WcStatus::LocLenErr => "IBV_WC_LOC_LEN_ERR",
        WcStatus::LocQpOpErr => "IBV_WC_LOC_QP_OP_ERR",
        WcStatus::LocProtErr => "IBV_WC_LOC_PROT_ERR",
        WcStatus::WrFlushErr => "IBV_WC_WR_FLUSH_ERR",
        WcStatus::BadRespErr => "IBV_WC_BAD_RESP_ERR",
        WcStatus::LocAccessErr => "IBV_WC_LOC_ACCESS_ERR",
        WcStatus::RemInvReqErr => "IBV_WC_REM_INV_REQ_ERR",
        WcStatus::RemAccessErr => "IBV_WC_REM_ACCESS_ERR",
        WcStatus::RemOpErr => "IBV_WC_REM_OP_ERR",
        WcStatus::RetryExcErr => "IBV_WC_RETRY_EXC_ERR",
        WcStatus::RnrRetryExcErr => "IBV_WC_RNR_RETRY_EXC_ERR",
        WcStatus::RemAbortErr => "IBV_WC_REM_ABORT_ERR",
        WcStatus::FatalErr => "IBV_WC_FATAL_ERR",
        WcStatus::RespTimeoutErr => "IBV_WC_RESP_TIMEOUT_ERR",
        WcStatus::GeneralErr => "IBV_WC_GENERAL_ERR",
        _ => "an unexpected status",
    }
}

/// One end's two CQs: its queue pair's send queue's and receive queue's,
/// both bound to the NIC's [`CqChannel`].
pub(crate) struct Cqs {
    pub send: Arc<BasicCompletionQueue>,
    pub recv: Arc<BasicCompletionQueue>,
    device: String,
}

impl Cqs {
    /// CQs of `send_cqe` and `recv_cqe` entries on `nic`, bound to
    /// `channel` (`nic`'s).
    pub fn new(nic: &Nic, channel: &CqChannel, send_cqe: u32, recv_cqe: u32) -> Result<Cqs> {
        Ok(Cqs {
            send: channel.cq(nic, send_cqe)?,
            recv: channel.cq(nic, recv_cqe)?,
            device: nic.name.clone(),
        })
    }

    /// Completions of the send queue, appended to `out`.
    pub fn poll_send(&self, out: &mut Vec<Completion>) -> Result<()> {
        poll(&self.send, &self.device, out)
    }

    /// Completions of the receive queue, appended to `out`.
    pub fn poll_recv(&self, out: &mut Vec<Completion>) -> Result<()> {
        poll(&self.recv, &self.device, out)
    }
}
