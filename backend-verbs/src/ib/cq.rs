//! Completion queues with an event channel, so that an idle rank sleeps
//! instead of spinning (it shares its CPUs with other ranks and, on
//! Soft-RoCE, with the NIC itself).
//!
//! Layers: `raw` (rdma-core's `ibv_req_notify_cq`, `ibv_get_cq_event`,
//! `ibv_ack_cq_events`, which sideway does not wrap) → checked functions
//! returning `Result` → the safe [`EventCqs`].

use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Duration;

use ringcc_core::wire::{Completion, WcOpcode, WcStatus};
use sideway::ibverbs::completion::{BasicCompletionQueue, CompletionChannel, CompletionQueue};

use super::nic::Nic;
use crate::error::{Error, Result};

mod raw {
    pub use rdma_mummy_sys::{ibv_ack_cq_events, ibv_get_cq_event, ibv_req_notify_cq};
}

/// Checked `ibv_req_notify_cq`: the next completion on `cq` raises an
/// event on its channel.
fn req_notify(cq: &BasicCompletionQueue, device: &str) -> Result<()> {
    // SAFETY: `cq` is a live CQ (the reference keeps it alive for the
    // call); solicited_only = 0.
    let rc = unsafe { raw::ibv_req_notify_cq(cq.cq().as_ptr(), 0) };
    if rc != 0 {
        return Err(Error::Verbs {
            call: "ibv_req_notify_cq",
            device: device.to_owned(),
            source: std::io::Error::from_raw_os_error(rc.abs()).into(),
        });
    }
    Ok(())
}

/// Checked `ibv_get_cq_event` on a non-blocking channel: whether an event
/// was taken (and acknowledged).
fn take_event(channel: &CompletionChannel, device: &str) -> Result<bool> {
    let mut cq = std::ptr::null_mut();
    let mut ctx = std::ptr::null_mut();
    // SAFETY: the channel is live; `cq` and `ctx` are out-parameters.
    let rc = unsafe { raw::ibv_get_cq_event(channel.comp_channel().as_ptr(), &mut cq, &mut ctx) };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        if e.kind() == std::io::ErrorKind::WouldBlock {
            return Ok(false);
        }
        return Err(Error::Verbs {
            call: "ibv_get_cq_event",
            device: device.to_owned(),
            source: e.into(),
        });
    }
    // SAFETY: `cq` was just returned by ibv_get_cq_event and is one of
    // this channel's CQs, alive while the channel's owner lives; one event
    // acknowledged.
    unsafe { raw::ibv_ack_cq_events(cq, 1) };
    Ok(true)
}

/// A send CQ and a receive CQ sharing one event channel.
pub(crate) struct EventCqs {
    pub device: String,
    pub send: Arc<BasicCompletionQueue>,
    pub recv: Arc<BasicCompletionQueue>,
    channel: Arc<CompletionChannel>,
}

impl EventCqs {
    /// CQs of `send_cqe` / `recv_cqe` entries on `nic`.
    pub fn new(nic: &Nic, send_cqe: u32, recv_cqe: u32) -> Result<EventCqs> {
        let dev = nic.name.as_str();
        let channel = nic
            .ctx
            .create_comp_channel()
            .map_err(Error::verbs("ibv_create_comp_channel", dev))?;
        channel
            .set_nonblocking(true)
            .map_err(Error::verbs("fcntl(O_NONBLOCK)", dev))?;
        let mut b = nic.ctx.create_cq_builder();
        b.setup_comp_channel(&channel, 0);
        let send = b
            .setup_cqe(send_cqe.max(1))
            .build()
            .map_err(Error::verbs("ibv_create_cq", dev))?;
        let recv = b
            .setup_cqe(recv_cqe.max(1))
            .build()
            .map_err(Error::verbs("ibv_create_cq", dev))?;
        Ok(EventCqs {
            device: dev.to_owned(),
            send,
            recv,
            channel,
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

    /// Asks for an event on the next completion of either queue.
    pub fn arm(&self) -> Result<()> {
        req_notify(&self.send, &self.device)?;
        req_notify(&self.recv, &self.device)
    }

    /// Takes (and acknowledges) every pending event.
    pub fn drain_events(&self) -> Result<()> {
        while take_event(&self.channel, &self.device)? {}
        Ok(())
    }

    fn fd(&self) -> i32 {
        self.channel.as_raw_fd()
    }
}

/// Sleeps until one of `cqs` has an event, or `timeout`.
pub(crate) fn wait_any(cqs: &[EventCqs], timeout: Duration) -> Result<()> {
    let mut fds: Vec<libc::pollfd> = cqs
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
                device: cqs.first().map(|c| c.device.clone()).unwrap_or_default(),
                source: e.into(),
            });
        }
    }
    for c in cqs {
        c.drain_events()?;
    }
    Ok(())
}

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
