//! The generic RDMA work request and work completion.
//!
//! These are the verbs' own shapes (`struct ibv_send_wr`, `struct ibv_wc`)
//! without pointers: opcode, status and flag values are exactly those of
//! rdma-core's `libibverbs/verbs.h` (`enum ibv_wr_opcode`,
//! `enum ibv_send_flags`, `enum ibv_wc_status`, `enum ibv_wc_opcode`), so a
//! verbs backend converts with `code()` / `from_code()` and no table of its
//! own. The scatter/gather list holds up to `N` entries (a const generic);
//! small payloads may instead travel *inline*, copied into the request.

use heapless::Vec;

use super::types::{RemoteAddr, Sge};
use super::Error;

code_enum! {
    /// `enum ibv_wr_opcode` (rdma-core `libibverbs/verbs.h`).
    pub enum WrOpcode: u32 {
        /// `IBV_WR_RDMA_WRITE`
        RdmaWrite = 0,
        /// `IBV_WR_RDMA_WRITE_WITH_IMM`
        RdmaWriteWithImm = 1,
        /// `IBV_WR_SEND`
        Send = 2,
        /// `IBV_WR_SEND_WITH_IMM`
        SendWithImm = 3,
        /// `IBV_WR_RDMA_READ`
        RdmaRead = 4,
        /// `IBV_WR_ATOMIC_CMP_AND_SWP`
        AtomicCmpAndSwp = 5,
        /// `IBV_WR_ATOMIC_FETCH_AND_ADD`
        AtomicFetchAndAdd = 6,
        /// `IBV_WR_LOCAL_INV`
        LocalInv = 7,
        /// `IBV_WR_BIND_MW`
        BindMw = 8,
        /// `IBV_WR_SEND_WITH_INV`
        SendWithInv = 9,
        /// `IBV_WR_TSO`
        Tso = 10,
        /// `IBV_WR_DRIVER1`
        Driver1 = 11,
    }
}

impl WrOpcode {
    /// Whether the opcode carries an immediate (`*_WITH_IMM`).
    pub const fn has_imm(self) -> bool {
        matches!(self, WrOpcode::RdmaWriteWithImm | WrOpcode::SendWithImm)
    }

    /// Whether the opcode addresses remote memory (RDMA WRITE / READ).
    pub const fn is_rdma(self) -> bool {
        matches!(
            self,
            WrOpcode::RdmaWrite | WrOpcode::RdmaWriteWithImm | WrOpcode::RdmaRead
        )
    }

    /// Whether [`WorkRequest`] supports the opcode: the two-sided SEND and
    /// one-sided WRITE / READ operations a collective uses.
    pub const fn is_supported(self) -> bool {
        matches!(
            self,
            WrOpcode::RdmaWrite
                | WrOpcode::RdmaWriteWithImm
                | WrOpcode::Send
                | WrOpcode::SendWithImm
                | WrOpcode::RdmaRead
        )
    }
}

bitflags::bitflags! {
    /// `enum ibv_send_flags` (rdma-core `libibverbs/verbs.h`).
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
    pub struct SendFlags: u32 {
        /// `IBV_SEND_FENCE = 1 << 0`: wait for prior RDMA READs / atomics.
        const FENCE = 1 << 0;
        /// `IBV_SEND_SIGNALED = 1 << 1`: generate a completion.
        const SIGNALED = 1 << 1;
        /// `IBV_SEND_SOLICITED = 1 << 2`: set the solicited-event bit.
        const SOLICITED = 1 << 2;
        /// `IBV_SEND_INLINE = 1 << 3`: the payload is copied into the
        /// request ([`Payload::Inline`]).
        const INLINE = 1 << 3;
    }
}

#[cfg(feature = "defmt")]
impl defmt::Format for SendFlags {
    fn format(&self, f: defmt::Formatter) {
        defmt::write!(f, "SendFlags({=u32:#x})", self.bits())
    }
}

/// Most bytes a request carries inline. Enough for a call header
/// (32 bytes) or a credit counter (8 bytes); mlx5 devices commonly allow
/// 60–256.
pub const MAX_INLINE: usize = 64;

/// Bytes carried inside a request.
pub type InlineData = Vec<u8, MAX_INLINE>;

/// Where a request's local bytes are.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Payload<const N: usize> {
    /// Gathered from (or, for READ, scattered to) registered memory. Every
    /// entry has a non-zero length; an empty list is a zero-length message.
    Gather(Vec<Sge, N>),
    /// Copied into the request itself (requires [`SendFlags::INLINE`]).
    Inline(InlineData),
}

impl<const N: usize> Payload<N> {
    /// Total bytes.
    pub fn len(&self) -> u64 {
        match self {
            Payload::Gather(sgl) => sgl
                .iter()
                .fold(0u64, |a, s| a.saturating_add(u64::from(s.length))),
            Payload::Inline(data) => data.len() as u64,
        }
    }

    /// Whether the payload is empty (a zero-length message).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Largest message an RC queue pair carries (`2^31` bytes: the IBTA
/// maximum message size, and what the 32-bit DMA length field allows).
pub const MAX_MESSAGE: u32 = 1 << 31;

/// A send-queue work request (`struct ibv_send_wr` without pointers).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct WorkRequest<const N: usize> {
    /// The caller's tag, returned in the completion.
    pub wr_id: u64,
    /// What to do.
    pub opcode: WrOpcode,
    /// Completion, fence, solicited and inline flags.
    pub flags: SendFlags,
    /// The local bytes.
    pub payload: Payload<N>,
    /// The remote memory, for RDMA WRITE / READ (and `None` for SEND).
    pub remote: Option<RemoteAddr>,
    /// The immediate, for `*_WITH_IMM`: a host-order value, big-endian on
    /// the wire (verbs' `imm_data` is this value already in network order).
    /// Zero for other opcodes.
    pub imm: u32,
}

impl<const N: usize> WorkRequest<N> {
    /// An RDMA WRITE of `local` to `remote`.
    pub fn rdma_write(wr_id: u64, local: &[Sge], remote: RemoteAddr) -> Result<Self, Error> {
        Self::gather(wr_id, WrOpcode::RdmaWrite, local, Some(remote), 0)
    }

    /// An RDMA WRITE WITH IMMEDIATE of `local` to `remote`.
    pub fn rdma_write_imm(
        wr_id: u64,
        local: &[Sge],
        remote: RemoteAddr,
        imm: u32,
    ) -> Result<Self, Error> {
        Self::gather(wr_id, WrOpcode::RdmaWriteWithImm, local, Some(remote), imm)
    }

    /// An RDMA READ of `remote` into `local`.
    pub fn rdma_read(wr_id: u64, local: &[Sge], remote: RemoteAddr) -> Result<Self, Error> {
        Self::gather(wr_id, WrOpcode::RdmaRead, local, Some(remote), 0)
    }

    /// A SEND of `local`.
    pub fn send(wr_id: u64, local: &[Sge]) -> Result<Self, Error> {
        Self::gather(wr_id, WrOpcode::Send, local, None, 0)
    }

    /// A SEND WITH IMMEDIATE of `local`.
    pub fn send_imm(wr_id: u64, local: &[Sge], imm: u32) -> Result<Self, Error> {
        Self::gather(wr_id, WrOpcode::SendWithImm, local, None, imm)
    }

    /// An RDMA WRITE of `data`, carried inline (`IBV_SEND_INLINE`).
    pub fn inline_write(wr_id: u64, data: &[u8], remote: RemoteAddr) -> Result<Self, Error> {
        let wr = WorkRequest {
            wr_id,
            opcode: WrOpcode::RdmaWrite,
            flags: SendFlags::INLINE,
            payload: Payload::Inline(InlineData::from_slice(data).map_err(|_| Error::Exhausted)?),
            remote: Some(remote),
            imm: 0,
        };
        wr.validate()?;
        Ok(wr)
    }

    fn gather(
        wr_id: u64,
        opcode: WrOpcode,
        local: &[Sge],
        remote: Option<RemoteAddr>,
        imm: u32,
    ) -> Result<Self, Error> {
        let wr = WorkRequest {
            wr_id,
            opcode,
            flags: SendFlags::empty(),
            payload: Payload::Gather(Vec::from_slice(local).map_err(|_| Error::Exhausted)?),
            remote,
            imm,
        };
        wr.validate()?;
        Ok(wr)
    }

    /// The same request with `flags` added.
    #[must_use]
    pub fn with_flags(mut self, flags: SendFlags) -> Self {
        self.flags |= flags;
        self
    }

    /// The same request, asking for a completion.
    #[must_use]
    pub fn signaled(self) -> Self {
        self.with_flags(SendFlags::SIGNALED)
    }

    /// Bytes the request moves.
    pub fn len(&self) -> u64 {
        self.payload.len()
    }

    /// Whether the request moves no bytes.
    pub fn is_empty(&self) -> bool {
        self.payload.is_empty()
    }

    /// Checks that the request is one this crate can format: a supported
    /// opcode; a remote address exactly for RDMA opcodes; `INLINE` set
    /// exactly for an inline payload, which only writes and sends may use;
    /// no zero-length gather entry; no immediate without `*_WITH_IMM`; at
    /// most [`MAX_MESSAGE`] bytes.
    pub fn validate(&self) -> Result<(), Error> {
        if !self.opcode.is_supported() {
            return Err(Error::Unsupported);
        }
        if self.opcode.is_rdma() != self.remote.is_some() {
            return Err(Error::Malformed);
        }
        if !self.opcode.has_imm() && self.imm != 0 {
            return Err(Error::Malformed);
        }
        let inline = matches!(self.payload, Payload::Inline(_));
        if inline != self.flags.contains(SendFlags::INLINE) {
            return Err(Error::Malformed);
        }
        if inline && self.opcode == WrOpcode::RdmaRead {
            return Err(Error::Malformed);
        }
        if let Payload::Gather(sgl) = &self.payload {
            if sgl.iter().any(|s| s.length == 0) {
                return Err(Error::Malformed);
            }
        }
        if self.len() > u64::from(MAX_MESSAGE) {
            return Err(Error::Malformed);
        }
        Ok(())
    }
}

code_enum! {
    /// `enum ibv_wc_status` (rdma-core `libibverbs/verbs.h`).
    pub enum WcStatus: u32 {
        /// `IBV_WC_SUCCESS`
        Success = 0,
        /// `IBV_WC_LOC_LEN_ERR`
        LocLenErr = 1,
        /// `IBV_WC_LOC_QP_OP_ERR`
        LocQpOpErr = 2,
        /// `IBV_WC_LOC_EEC_OP_ERR`
        LocEecOpErr = 3,
        /// `IBV_WC_LOC_PROT_ERR`
        LocProtErr = 4,
        /// `IBV_WC_WR_FLUSH_ERR`
        WrFlushErr = 5,
        /// `IBV_WC_MW_BIND_ERR`
        MwBindErr = 6,
        /// `IBV_WC_BAD_RESP_ERR`
        BadRespErr = 7,
        /// `IBV_WC_LOC_ACCESS_ERR`
        LocAccessErr = 8,
        /// `IBV_WC_REM_INV_REQ_ERR`
        RemInvReqErr = 9,
        /// `IBV_WC_REM_ACCESS_ERR`
        RemAccessErr = 10,
        /// `IBV_WC_REM_OP_ERR`
        RemOpErr = 11,
        /// `IBV_WC_RETRY_EXC_ERR`
        RetryExcErr = 12,
        /// `IBV_WC_RNR_RETRY_EXC_ERR`
        RnrRetryExcErr = 13,
        /// `IBV_WC_LOC_RDD_VIOL_ERR`
        LocRddViolErr = 14,
        /// `IBV_WC_REM_INV_RD_REQ_ERR`
        RemInvRdReqErr = 15,
        /// `IBV_WC_REM_ABORT_ERR`
        RemAbortErr = 16,
        /// `IBV_WC_INV_EECN_ERR`
        InvEecnErr = 17,
        /// `IBV_WC_INV_EEC_STATE_ERR`
        InvEecStateErr = 18,
        /// `IBV_WC_FATAL_ERR`
        FatalErr = 19,
        /// `IBV_WC_RESP_TIMEOUT_ERR`
        RespTimeoutErr = 20,
        /// `IBV_WC_GENERAL_ERR`
        GeneralErr = 21,
        /// `IBV_WC_TM_ERR`
        TmErr = 22,
        /// `IBV_WC_TM_RNDV_INCOMPLETE`
        TmRndvIncomplete = 23,
    }
}

code_enum! {
    /// `enum ibv_wc_opcode` (rdma-core `libibverbs/verbs.h`).
    pub enum WcOpcode: u32 {
        /// `IBV_WC_SEND`
        Send = 0,
        /// `IBV_WC_RDMA_WRITE`
        RdmaWrite = 1,
        /// `IBV_WC_RDMA_READ`
        RdmaRead = 2,
        /// `IBV_WC_COMP_SWAP`
        CompSwap = 3,
        /// `IBV_WC_FETCH_ADD`
        FetchAdd = 4,
        /// `IBV_WC_BIND_MW`
        BindMw = 5,
        /// `IBV_WC_LOCAL_INV`
        LocalInv = 6,
        /// `IBV_WC_TSO`
        Tso = 7,
        /// `IBV_WC_RECV = 1 << 7`
        Recv = 128,
        /// `IBV_WC_RECV_RDMA_WITH_IMM`
        RecvRdmaWithImm = 129,
    }
}

impl WcOpcode {
    /// The completion a successful send-queue request of `op` produces
    /// (`None` for driver-specific or unknown opcodes).
    pub const fn of_request(op: WrOpcode) -> Option<WcOpcode> {
        Some(match op {
            WrOpcode::RdmaWrite | WrOpcode::RdmaWriteWithImm => WcOpcode::RdmaWrite,
            WrOpcode::Send | WrOpcode::SendWithImm | WrOpcode::SendWithInv => WcOpcode::Send,
            WrOpcode::RdmaRead => WcOpcode::RdmaRead,
            WrOpcode::AtomicCmpAndSwp => WcOpcode::CompSwap,
            WrOpcode::AtomicFetchAndAdd => WcOpcode::FetchAdd,
            WrOpcode::LocalInv => WcOpcode::LocalInv,
            WrOpcode::BindMw => WcOpcode::BindMw,
            WrOpcode::Tso => WcOpcode::Tso,
            WrOpcode::Driver1 | WrOpcode::Unknown(_) => return None,
        })
    }

    /// Whether this is a receive-side completion (`opcode & IBV_WC_RECV`).
    pub const fn is_recv(self) -> bool {
        self.code() & 0x80 != 0
    }
}

/// A work completion (`struct ibv_wc`, the fields a collective needs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Completion {
    /// The request's `wr_id` (for receives: the receive request's).
    pub wr_id: u64,
    /// Success or why not.
    pub status: WcStatus,
    /// What completed.
    pub opcode: WcOpcode,
    /// Bytes received (receive completions) or read.
    pub byte_len: u32,
    /// The immediate, host order, when the completion carries one
    /// (`IBV_WC_WITH_IMM`).
    pub imm: Option<u32>,
    /// The local queue pair the completion belongs to.
    pub qp_num: u32,
}

impl Completion {
    /// Whether the request succeeded.
    pub const fn is_ok(&self) -> bool {
        matches!(self.status, WcStatus::Success)
    }
}
