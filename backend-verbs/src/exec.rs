//! Carrying out one `Exec` (one slice of one step) and one credit return.
//!
//! The host does the arithmetic with the core's kernels; the NIC moves
//! the bytes. Where the result of a slice lives, and so where its RDMA
//! WRITE reads from:
//!
//! | primitive | result | send reads |
//! |---|---|---|
//! | send | — | input (in place: a staging copy) |
//! | copySend | input → output | input (in place: a staging copy) |
//! | recvReduceSend | slot ⊕ input → staging | staging |
//! | recvReduceCopy(Send) | slot ⊕ input → output (finalized) | output |
//! | recv / recvCopySend | slot → output | output |
//!
//! In place (one buffer, NCCL's layout: [`Call::in_place_offsets`]) the
//! input and the output of a slice are either the same bytes or apart,
//! and an input slice is overwritten only by its own reduction; a send
//! of input bytes goes through staging there, so that no write still
//! reading them (a retransmission) sees the result written over them.
//!
//! Nothing reads a FIFO slot after its `Exec` is done, so the credit that
//! follows may let the predecessor overwrite it at once; staging slot `s`
//! is reused only once the write that read it (8 steps earlier) completed.
//!
//! [`Call::in_place_offsets`]: ringcc_core::Call::in_place_offsets

use std::ops::Range;
use std::time::Duration;

use ringcc_core::fifo::FifoGeometry;
use ringcc_core::prim::Exec;
use ringcc_core::protocol::post::{credit_write, LocalBuf, SliceWrites};
use ringcc_core::protocol::{Kind, WrId};
use ringcc_core::reduce::{finalize, reduce, reduce_in_place};
use ringcc_core::wire::{Lkey, WorkRequest};
use ringcc_core::{CallDesc, Primitive};

use crate::conn::staging_free;
use crate::error::{Error, Result};
use crate::ib::mem::NicMrs;
use crate::ib::qp::SQ_DEPTH;
use crate::transport::{Chan, Transport};

/// Most requests one slice posts: the call header and one write.
const SLICE_REQUESTS: u32 = 2;

/// One call's buffers and their registrations (per NIC).
pub(crate) struct CallCtx<'a> {
    pub call: CallDesc,
    pub nranks: u32,
    pub bufs: Bufs<'a>,
    /// Time spent reducing and copying on the host (for the debug log).
    pub host_time: Duration,
    /// Time spent in `ibv_post_send` for data writes (for the debug log):
    /// on a software device (Soft-RoCE) the kernel moves the bytes in the
    /// poster's context, so this is where its transfer work shows.
    pub post_time: Duration,
}

/// The caller's buffers of one call.
pub(crate) enum Bufs<'a> {
    /// Two buffers: the input only read, the output only written.
    Apart {
        input: &'a [u8],
        output: &'a mut [u8],
        input_mr: NicMrs<'a>,
        output_mr: NicMrs<'a>,
    },
    /// One buffer holding the input from byte `input_at` and the output
    /// from byte `output_at`.
    InPlace {
        buf: &'a mut [u8],
        input_at: usize,
        output_at: usize,
        mr: NicMrs<'a>,
    },
}

/// A slice's input and output bytes, for `output = f(input)`.
enum Pair<'b> {
    /// Different bytes.
    Apart(&'b [u8], &'b mut [u8]),
    /// The same bytes (in place).
    Same(&'b mut [u8]),
}

/// Which of a call's buffers a send reads.
#[derive(Clone, Copy)]
enum Side {
    Input,
    Output,
}

fn shift(r: Range<usize>, by: usize) -> Result<Range<usize>> {
    match (r.start.checked_add(by), r.end.checked_add(by)) {
        (Some(s), Some(e)) => Ok(s..e),
        _ => Err(bad("in-place range overflows".into())),
    }
}

impl<'a> Bufs<'a> {
    pub fn in_place(&self) -> bool {
        matches!(self, Bufs::InPlace { .. })
    }

    /// Input bytes `r` (offsets in the input).
    fn input(&self, r: Range<usize>) -> Result<&[u8]> {
        let b = match self {
            Bufs::Apart { input, .. } => input.get(r.clone()),
            Bufs::InPlace { buf, input_at, .. } => buf.get(shift(r.clone(), *input_at)?),
        };
        b.ok_or_else(|| too_short("input", &r))
    }

    /// Output bytes `r` (offsets in the output).
    fn output(&mut self, r: Range<usize>) -> Result<&mut [u8]> {
        let b = match self {
            Bufs::Apart { output, .. } => output.get_mut(r.clone()),
            Bufs::InPlace { buf, output_at, .. } => buf.get_mut(shift(r.clone(), *output_at)?),
        };
        b.ok_or_else(|| too_short("output", &r))
    }

    /// Input bytes `ri` and output bytes `ro` together.
    fn pair(&mut self, ri: Range<usize>, ro: Range<usize>) -> Result<Pair<'_>> {
        let (buf, i, o) = match self {
            Bufs::Apart { input, output, .. } => {
                let local = input
                    .get(ri.clone())
                    .ok_or_else(|| too_short("input", &ri))?;
                let dst = output
                    .get_mut(ro.clone())
                    .ok_or_else(|| too_short("output", &ro))?;
                return Ok(Pair::Apart(local, dst));
            }
            Bufs::InPlace {
                buf,
                input_at,
                output_at,
                ..
            } => (buf, shift(ri, *input_at)?, shift(ro, *output_at)?),
        };
        if i.end > buf.len() || o.end > buf.len() {
            return Err(too_short(
                "in-place",
                if i.end > buf.len() { &i } else { &o },
            ));
        }
        if i == o {
            return Ok(Pair::Same(&mut buf[o]));
        }
        if i.end <= o.start {
            let (lo, hi) = buf.split_at_mut(o.start);
            return Ok(Pair::Apart(&lo[i], &mut hi[..o.len()]));
        }
        if o.end <= i.start {
            let (lo, hi) = buf.split_at_mut(i.start);
            return Ok(Pair::Apart(&hi[..i.len()], &mut lo[o]));
        }
        Err(bad(format!(
            "in-place input {i:?} and output {o:?} overlap in part"
        )))
    }

    /// Where byte `off` of the input or the output is for the NIC
    /// `nic`.
    fn local(&self, side: Side, off: usize, nic: usize) -> Result<LocalBuf> {
        let (mrs, off, what) = match (self, side) {
            (Bufs::Apart { input_mr, .. }, Side::Input) => (input_mr, off, "input"),
            (Bufs::Apart { output_mr, .. }, Side::Output) => (output_mr, off, "output"),
            (Bufs::InPlace { mr, input_at, .. }, Side::Input) => {
                (mr, off.saturating_add(*input_at), "in-place buffer")
            }
            (Bufs::InPlace { mr, output_at, .. }, Side::Output) => {
                (mr, off.saturating_add(*output_at), "in-place buffer")
            }
        };
        mrs.get(nic)
            .and_then(Option::as_ref)
            .map(|mr| LocalBuf {
                addr: mr.addr().wrapping_add(off as u64),
                lkey: Lkey(mr.lkey()),
            })
            .ok_or_else(|| bad(format!("{what} not registered on NIC {nic}")))
    }
}

/// Where a slice's result is, for the send.
#[derive(Clone, Copy)]
enum Src {
    Input(usize),
    Output(usize),
    Staging(u64),
}

/// Whether `e`'s send reads a staging slot: a partial reduction's, or
/// (in place) a copy of input bytes.
fn staged(e: &Exec, in_place: bool) -> bool {
    let p = e.primitive;
    e.send.is_some()
        && if p.contains(Primitive::RECV) {
            p.contains(Primitive::REDUCE) && !p.contains(Primitive::COPY)
        } else {
            in_place
        }
}

fn bad(what: String) -> Error {
    Error::Internal(what)
}

fn range(off: u64, len: usize, what: &str) -> Result<Range<usize>> {
    let start = usize::try_from(off).map_err(|_| bad(format!("{what} offset {off}")))?;
    let end = start
        .checked_add(len)
        .ok_or_else(|| bad(format!("{what} range overflows")))?;
    Ok(start..end)
}

impl Transport {
    /// Whether channel `c` can carry out `e` now: room on its send queue
    /// and, for a staged send, its staging slots no longer read. (A
    /// channel without the connection `e` needs "has room": carrying it
    /// out reports the error.)
    pub(crate) fn has_room(&self, c: usize, e: &Exec, in_place: bool) -> bool {
        let Some(span) = e.send else {
            return true;
        };
        let staged = staged(e, in_place);
        self.chans
            .get(c)
            .and_then(|ch| ch.send.as_ref())
            .is_none_or(|s| {
                s.out.in_flight.saturating_add(SLICE_REQUESTS) <= SQ_DEPTH
                    && (!staged || staging_free(s.sent_done, span.step, span.slots))
            })
    }

    /// Whether channel `c` can post a credit return now.
    pub(crate) fn credit_room(&self, c: usize) -> bool {
        self.chans
            .get(c)
            .and_then(|ch| ch.recv.as_ref())
            .is_none_or(|r| r.out.in_flight < SQ_DEPTH)
    }

    /// Carries out `e` on channel `c` (which [has room](Self::has_room)):
    /// the arithmetic now, the send posted (its completion is awaited
    /// later, before the call returns).
    pub(crate) fn exec(&mut self, c: usize, e: &Exec, ctx: &mut CallCtx<'_>) -> Result<()> {
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
        let staged = staged(e, ctx.bufs.in_place());

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
        let src = match incoming {
            Some(inc) if p.contains(Primitive::REDUCE) && p.contains(Primitive::COPY) => {
                match ctx.bufs.pair(in_range.clone(), out_range.clone())? {
                    Pair::Apart(local, dst) => reduce(dtype, op, dst, inc, local),
                    Pair::Same(acc) => reduce_in_place(dtype, op, acc, inc),
                }
                .map_err(Error::core("reduce"))?;
                if p.finalizes() {
                    let dst = ctx.bufs.output(out_range.clone())?;
                    finalize(dtype, op, dst, ctx.nranks).map_err(Error::core("finalize"))?;
                }
                Src::Output(out_range.start)
            }
            Some(inc) if p.contains(Primitive::REDUCE) => {
                let local = ctx.bufs.input(in_range.clone())?;
                let (at, dst) = staging_slot(chan, e, &geometry, len)?;
                reduce(dtype, op, dst, inc, local).map_err(Error::core("reduce"))?;
                Src::Staging(at)
            }
            Some(inc) => {
                ctx.bufs.output(out_range.clone())?.copy_from_slice(inc);
                Src::Output(out_range.start)
            }
            None => {
                if p.contains(Primitive::COPY) {
                    match ctx.bufs.pair(in_range.clone(), out_range.clone())? {
                        Pair::Apart(local, dst) => dst.copy_from_slice(local),
                        // In place the input already is the output.
                        Pair::Same(_) => {}
                    }
                }
                if staged {
                    let local = ctx.bufs.input(in_range.clone())?;
                    let (at, dst) = staging_slot(chan, e, &geometry, len)?;
                    dst.copy_from_slice(local);
                    Src::Staging(at)
                } else {
                    Src::Input(in_range.start)
                }
            }
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
            match src {
                Src::Input(off) => ctx.bufs.local(Side::Input, off, s.nic)?,
                Src::Output(off) => ctx.bufs.local(Side::Output, off, s.nic)?,
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

    /// Posts credit `head` to channel `c`'s predecessor (which [has
    /// room](Self::credit_room)): the counter as an inline RDMA WRITE WITH
    /// IMMEDIATE, so that a sender sleeping on its completion channel
    /// wakes up.
    pub(crate) fn post_credit(&mut self, c: usize, head: u64) -> Result<()> {
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
}

/// The staging slots of `e`'s send span, `len` bytes, and their offset.
/// (Mutable from a shared channel as [`HostBuf::bytes_mut`] is: staging
/// is this rank's alone, and only one slice at a time uses a slot.)
///
/// [`HostBuf::bytes_mut`]: crate::ib::mem::HostBuf::bytes_mut
#[allow(clippy::mut_from_ref)]
fn staging_slot<'c>(
    chan: &'c Chan,
    e: &Exec,
    geometry: &FifoGeometry,
    len: usize,
) -> Result<(u64, &'c mut [u8])> {
    let span = e.send.ok_or_else(|| bad("staging without a send".into()))?;
    let s = chan
        .send
        .as_ref()
        .ok_or_else(|| bad("send without a successor".into()))?;
    let at = span.byte_offset(geometry);
    // SAFETY: staging has no remote access; the write that last read
    // these slots has completed (`has_room`) and no other slice of them
    // is alive.
    let dst = unsafe { s.staging.bytes_mut(at, len) }
        .ok_or_else(|| bad("slice beyond staging".into()))?;
    Ok((at, dst))
}

fn s_channel(c: usize) -> u8 {
    u8::try_from(c).unwrap_or(u8::MAX)
}

fn too_short(what: &str, r: &Range<usize>) -> Error {
    Error::Internal(format!("{what} bytes {r:?} outside the buffer"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn in_place(buf: &mut [u8], input_at: usize, output_at: usize) -> Bufs<'_> {
        Bufs::InPlace {
            buf,
            input_at,
            output_at,
            mr: Vec::new(),
        }
    }

    #[test]
    fn in_place_slices_are_the_same_bytes_or_apart() {
        let mut buf: Vec<u8> = (0..32).collect();
        // ReduceScatter's layout: the output is block 1 of the input.
        let mut b = in_place(&mut buf, 0, 8);
        assert!(b.in_place());
        assert!(matches!(b.pair(8..12, 0..4), Ok(Pair::Same(s)) if s == [8, 9, 10, 11]));
        match b.pair(0..4, 4..8) {
            Ok(Pair::Apart(i, o)) => {
                assert_eq!((i, &*o), (&[0, 1, 2, 3][..], &[12, 13, 14, 15][..]))
            }
            _ => panic!("input below the output"),
        }
        match b.pair(24..28, 0..4) {
            Ok(Pair::Apart(i, o)) => {
                assert_eq!((i, &*o), (&[24, 25, 26, 27][..], &[8, 9, 10, 11][..]))
            }
            _ => panic!("input above the output"),
        }
        assert!(matches!(b.pair(6..10, 0..4), Err(Error::Internal(_))));
        assert!(matches!(b.pair(30..34, 0..4), Err(Error::Internal(_))));
        assert_eq!(b.input(2..4).unwrap(), [2, 3]);
        assert_eq!(b.output(2..4).unwrap(), [10, 11]);
        assert!(b.output(30..34).is_err());
    }

    #[test]
    fn apart_buffers_are_input_and_output() {
        let input: Vec<u8> = (0..8).collect();
        let mut output = vec![0u8; 8];
        let mut b = Bufs::Apart {
            input: &input,
            output: &mut output,
            input_mr: Vec::new(),
            output_mr: Vec::new(),
        };
        assert!(!b.in_place());
        match b.pair(0..4, 0..4) {
            Ok(Pair::Apart(i, o)) => {
                o.copy_from_slice(i);
            }
            _ => panic!("two buffers are apart"),
        }
        assert_eq!(b.output(0..4).unwrap(), [0, 1, 2, 3]);
        assert!(b.local(Side::Input, 0, 0).is_err(), "nothing registered");
    }

    #[test]
    fn in_place_sends_of_input_are_staged() {
        use ringcc_core::prim::SlotSpan;
        use ringcc_core::ChunkId;
        let span = SlotSpan { step: 0, slots: 2 };
        let e = |primitive, send| Exec {
            primitive,
            chunk: ChunkId(0),
            loop_index: 0,
            step_index: 0,
            slice: 0,
            input_offset: 0,
            output_offset: 0,
            count: 4,
            recv: None,
            send,
            header: None,
        };
        let send = e(Primitive::SEND, Some(span));
        assert!(!staged(&send, false));
        assert!(staged(&send, true));
        let rrs = e(
            Primitive::RECV | Primitive::REDUCE | Primitive::SEND,
            Some(span),
        );
        assert!(staged(&rrs, false) && staged(&rrs, true));
        let rcs = e(
            Primitive::RECV | Primitive::COPY | Primitive::SEND,
            Some(span),
        );
        assert!(!staged(&rcs, true));
        assert!(!staged(&e(Primitive::COPY, None), true));
    }
}
