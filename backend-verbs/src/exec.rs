//! Carrying out one `Exec` (one slice of one step) and one credit return.
//!
//! The host does the arithmetic with the core's kernels; the NIC moves
//! the bytes. Where the result of a slice lives, and so where its RDMA
//! WRITE reads from:
//!
//! | primitive | result | send reads |
//! |---|---|---|
//! | send | — | input |
//! | copySend | input → output | input |
//! | recvReduceSend | slot ⊕ input → staging | staging |
//! | recvReduceCopy(Send) | slot ⊕ input → output (finalized) | output |
//! | recv / recvCopySend | slot → output | output |
//!
//! Nothing reads a FIFO slot after its `Exec` is done, so the credit that
//! follows may let the predecessor overwrite it at once; staging slot `s`
//! is reused only once the write that read it (8 steps earlier) completed.

use ringcc_core::prim::Exec;
use ringcc_core::protocol::post::{credit_write, LocalBuf, SliceWrites};
use ringcc_core::reduce::{finalize, reduce};
use ringcc_core::wire::{Lkey, WorkRequest};
use ringcc_core::Primitive;

use crate::conn::staging_free;
use crate::engine::{CallCtx, Engine};
use crate::error::{Error, Result};
use crate::ib::qp::SQ_DEPTH;
use crate::rendezvous::AbortState;
use ringcc_core::protocol::{Kind, WrId};

/// Most requests one slice posts: the call header and one write.
const SLICE_REQUESTS: u32 = 2;

/// Where a slice's result is, for the send.
#[derive(Clone, Copy)]
enum Src {
    Input(usize),
    Output(usize),
    Staging(u64),
}

fn bad(what: String) -> Error {
    Error::Internal(what)
}

fn range(off: u64, len: usize, what: &str) -> Result<std::ops::Range<usize>> {
    let start = usize::try_from(off).map_err(|_| bad(format!("{what} offset {off}")))?;
    let end = start
        .checked_add(len)
        .ok_or_else(|| bad(format!("{what} range overflows")))?;
    Ok(start..end)
}

impl Engine {
    /// Carries out `e` on channel `c`: the arithmetic now, the send posted
    /// (its completion is awaited later, before the call returns).
    pub(crate) fn exec(
        &mut self,
        c: usize,
        e: &Exec,
        ctx: &mut CallCtx<'_>,
        abort: &AbortState,
    ) -> Result<()> {
        let dtype = ctx.call.dtype;
        let op = ctx.call.op;
        let elem = u64::from(dtype.size());
        let len = e
            .count
            .checked_mul(elem)
            .and_then(|b| usize::try_from(b).ok())
            .ok_or_else(|| bad(format!("slice of {} elements", e.count)))?;
        let in_range = range(e.input_offset.saturating_mul(elem), len, "input")?;
        let out_range = range(e.output_offset.saturating_mul(elem), len, "output")?;
        let p = e.primitive;
        let geometry = self.geometry;
        let staged = p.contains(Primitive::RECV)
            && p.contains(Primitive::REDUCE)
            && !p.contains(Primitive::COPY);

        if let Some(span) = e.send {
            let nic = self.send_nic(c)?;
            self.wait_until(nic, abort, "room on the send queue", |eng| {
                eng.chans
                    .get(c)
                    .and_then(|ch| ch.send.as_ref())
                    .is_some_and(|s| {
                        s.out.in_flight.saturating_add(SLICE_REQUESTS) <= SQ_DEPTH
                            && (!staged || staging_free(s.sent_done, span.step, span.slots))
                    })
            })?;
        }

        let t_host = std::time::Instant::now();
        let chan = self
            .chans
            .get(c)
            .ok_or_else(|| bad(format!("channel {c}")))?;
        let incoming: Option<&[u8]> = match e.recv {
            Some(span) => {
                let r = chan
                    .recv
                    .as_ref()
                    .ok_or_else(|| bad("recv without a predecessor".into()))?;
                // SAFETY: the machine hands out a receive span only once
                // the predecessor's tail covers it, and the predecessor
                // writes the slot again only after our credit for it,
                // which the machine emits after this exec is done.
                let b = unsafe { r.fifo.bytes(span.byte_offset(&geometry), len) };
                Some(b.ok_or_else(|| bad("slice beyond the FIFO".into()))?)
            }
            None => None,
        };
        let src = if let Some(inc) = incoming {
            if p.contains(Primitive::REDUCE) {
                let local = ctx
                    .input
                    .get(in_range.clone())
                    .ok_or_else(|| too_short("input", &in_range))?;
                if p.contains(Primitive::COPY) {
                    let dst = ctx
                        .output
                        .get_mut(out_range.clone())
                        .ok_or_else(|| too_short("output", &out_range))?;
                    reduce(dtype, op, dst, inc, local).map_err(Error::core("reduce"))?;
                    if p.finalizes() {
                        finalize(dtype, op, dst, ctx.nranks).map_err(Error::core("finalize"))?;
                    }
                    Src::Output(out_range.start)
                } else {
                    let span = e
                        .send
                        .ok_or_else(|| bad("recvReduce without send".into()))?;
                    let s = chan
                        .send
                        .as_ref()
                        .ok_or_else(|| bad("send without a successor".into()))?;
                    let at = span.byte_offset(&geometry);
                    // SAFETY: staging has no remote access; the write that
                    // last read these slots has completed (checked above)
                    // and no other slice of them is alive.
                    let dst = unsafe { s.staging.bytes_mut(at, len) }
                        .ok_or_else(|| bad("slice beyond staging".into()))?;
                    reduce(dtype, op, dst, inc, local).map_err(Error::core("reduce"))?;
                    Src::Staging(at)
                }
            } else {
                let dst = ctx
                    .output
                    .get_mut(out_range.clone())
                    .ok_or_else(|| too_short("output", &out_range))?;
                dst.copy_from_slice(inc);
                Src::Output(out_range.start)
            }
        } else {
            let local = ctx
                .input
                .get(in_range.clone())
                .ok_or_else(|| too_short("input", &in_range))?;
            if p.contains(Primitive::COPY) {
                let dst = ctx
                    .output
                    .get_mut(out_range.clone())
                    .ok_or_else(|| too_short("output", &out_range))?;
                dst.copy_from_slice(local);
            }
            Src::Input(in_range.start)
        };

        ctx.host_time += t_host.elapsed();
        let Some(span) = e.send else {
            return Ok(());
        };
        let s = self
            .chans
            .get_mut(c)
            .and_then(|ch| ch.send.as_mut())
            .ok_or_else(|| bad("send without a successor".into()))?;
        let local = if len == 0 {
            LocalBuf::default()
        } else {
            let user = |mrs: &[Option<crate::ib::mem::UserMr<'_>>], off: usize, what: &str| {
                mrs.get(s.nic)
                    .and_then(Option::as_ref)
                    .map(|mr| LocalBuf {
                        addr: mr.addr().wrapping_add(off as u64),
                        lkey: Lkey(mr.lkey()),
                    })
                    .ok_or_else(|| bad(format!("{what} not registered on NIC {}", s.nic)))
            };
            match src {
                Src::Input(off) => user(&ctx.input_mr, off, "input")?,
                Src::Output(off) => user(&ctx.output_mr, off, "output")?,
                Src::Staging(at) => LocalBuf {
                    addr: s.staging.addr().wrapping_add(at),
                    lkey: Lkey(s.staging.lkey()),
                },
            }
        };
        let wr_id = WrId::new(Kind::Data, s_channel(c), span.end() as u32).encode();
        let writes = SliceWrites::<1>::new(e, &geometry, dtype, local, &s.fifo, &s.mailbox, wr_id)
            .map_err(Error::core("SliceWrites::new"))?;
        // SAFETY: the gather entry names the caller's input or output
        // (registered for this call, which returns only after every data
        // write completed or every queue pair was flushed) or a staging
        // slot (not rewritten before this write completes).
        let t_post = std::time::Instant::now();
        let n = unsafe { s.qp.post_writes(writes)? };
        ctx.post_time += t_post.elapsed();
        s.out.posted(wr_id, n);
        Ok(())
    }

    /// Posts credit `head` to channel `c`'s predecessor: the counter as an
    /// inline RDMA WRITE WITH IMMEDIATE, so that a sender sleeping on its
    /// completion channel wakes up.
    pub(crate) fn post_credit(&mut self, c: usize, head: u64, abort: &AbortState) -> Result<()> {
        let nic = self
            .chans
            .get(c)
            .and_then(|ch| ch.recv.as_ref())
            .map(|r| r.nic)
            .ok_or_else(|| bad("credit without a predecessor".into()))?;
        self.wait_until(nic, abort, "room on the send queue (credit)", |eng| {
            eng.chans
                .get(c)
                .and_then(|ch| ch.recv.as_ref())
                .is_some_and(|r| r.out.in_flight < SQ_DEPTH)
        })?;
        let r = self
            .chans
            .get_mut(c)
            .and_then(|ch| ch.recv.as_mut())
            .ok_or_else(|| bad("credit without a predecessor".into()))?;
        let wr_id = WrId::new(Kind::Credit, s_channel(c), head as u32).encode();
        let wr: WorkRequest<1> =
            credit_write(head, &r.counter, wr_id).map_err(Error::core("credit_write"))?;
        // SAFETY: the payload is inline; no local memory is referenced.
        let n = unsafe { r.qp.post_writes([wr])? };
        r.out.posted(wr_id, n);
        Ok(())
    }

    fn send_nic(&self, c: usize) -> Result<usize> {
        self.chans
            .get(c)
            .and_then(|ch| ch.send.as_ref())
            .map(|s| s.nic)
            .ok_or_else(|| bad("send without a successor".into()))
    }
}

fn s_channel(c: usize) -> u8 {
    u8::try_from(c).unwrap_or(u8::MAX)
}

fn too_short(what: &str, r: &std::ops::Range<usize>) -> Error {
    Error::Internal(format!("{what} bytes {r:?} outside the buffer"))
}
