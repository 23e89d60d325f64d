//! The host executor: one slice of the engine's [`Exec`] carried out on
//! the CPU with the core's kernels, reading straight from the incoming
//! slot and writing straight into the outgoing one (no staging copy).
//!
//! A slice spans `slots` consecutive FIFO slots; the work is elementwise,
//! so it is done slot by slot: part `k` reads slot `recv.step + k` and
//! writes slot `send.step + k`.

use ringcc_core::fifo::slot_of;
use ringcc_core::prim::{slice_result, Exec};
use ringcc_core::{Call, ChannelId, Primitive};

use crate::buffer::Buffers;
use crate::error::{Error, Result};
use crate::land::Lands;
use crate::transport::{RecvEnd, SendEnd};

/// Where the bytes of a slice's send are, for the caller to post.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Payload {
    /// Written into the send span's slots: post this many bytes.
    Staged(usize),
    /// `len` bytes from byte `at` of the input: post them from there.
    Input { at: usize, len: usize },
    /// `len` bytes from byte `at` of the output (just written by this
    /// slice): post them from there.
    Output { at: usize, len: usize },
}

/// Carries out `e` on channel `c` of `call` (among `ranks` ranks), with
/// the channel's ends. Returns where the slice's send bytes are (to be
/// posted by the caller; `Staged(0)` when it sends nothing).
///
/// When the send end posts from the caller's buffers (`from_buffers`:
/// it [prefers](SendEnd::prefers_post_from) it, or they are
/// [lent](SendEnd::lend) to it) and the bytes to send lie there anyway —
/// a send of the input, or a send of what the slice also writes to the
/// output — they are not copied into the send slots: the end sends them
/// from there.
#[expect(
    clippy::too_many_arguments,
    reason = "one slice's whole context; a struct would only rename it"
)]
pub(crate) fn exec(
    c: ChannelId,
    e: &Exec,
    call: &Call,
    ranks: u32,
    slot_bytes: usize,
    bufs: &mut Buffers,
    (recv, lands): (Option<&dyn RecvEnd>, Option<&Lands>),
    (mut send, from_buffers): (Option<&mut (dyn SendEnd + 'static)>, bool),
    scratch: &mut Vec<u8>,
) -> Result<Payload> {
    let internal = |what: &str| Error::Internal(format!("channel {c}: {what}"));
    let es = call.elem();
    let bytes = usize::try_from(e.count)
        .ok()
        .and_then(|n| n.checked_mul(es))
        .ok_or_else(|| internal("slice size beyond memory"))?;
    let at = |elems: u64| usize::try_from(elems).ok().and_then(|v| v.checked_mul(es));
    let p = e.primitive;
    let input_at = at(e.input_offset).ok_or_else(|| internal("input offset"))?;
    let output_at = at(e.output_offset).ok_or_else(|| internal("output offset"))?;
    if slot_bytes == 0 {
        return Err(internal("a FIFO of 0-byte slots"));
    }
    let core_err = |source| Error::Core {
        channel: Some(c),
        call: "slice_result",
        source,
    };
    // A send of the input (no receive), or of what the slice writes to
    // the output (COPY): from the buffers, when the end posts from them.
    let direct = e.send.is_some()
        && from_buffers
        && send.is_some()
        && (!p.contains(Primitive::RECV) || p.contains(Primitive::COPY));
    let send_span = if direct { None } else { e.send };
    let mut done = 0usize;
    let mut k = 0u64;
    while done < bytes {
        let len = slot_bytes.min(bytes - done);
        if let (Some(span), Some(l)) = (e.recv, lands) {
            if l.landed(c, span.step + k) {
                // The payload was read straight into the output (a step
                // the call takes unchanged): only a staged send is left.
                if let Some(span) = send_span {
                    let s = send
                        .as_deref_mut()
                        .ok_or_else(|| internal("a send without a successor"))?;
                    let out = bufs
                        .output_ref(output_at + done, len)
                        .ok_or_else(|| internal("output slice out of the buffer"))?;
                    s.slot_mut(slot_of(span.step + k), len)?
                        .copy_from_slice(out);
                }
                done += len;
                k += 1;
                continue;
            }
        }
        let incoming = match (e.recv, recv) {
            (Some(span), Some(r)) => Some(r.slot(slot_of(span.step + k), len)?),
            (Some(_), None) => return Err(internal("a receive without a predecessor")),
            (None, _) => None,
        };
        if let Some(span) = send_span {
            let local = if p.reads_input() {
                Some(
                    bufs.input(input_at + done, len)
                        .ok_or_else(|| internal("input slice out of the buffer"))?,
                )
            } else {
                None
            };
            let s = send
                .as_deref_mut()
                .ok_or_else(|| internal("a send without a successor"))?;
            let dest = s.slot_mut(slot_of(span.step + k), len)?;
            slice_result(p, call.dtype, call.op, ranks, incoming, local, dest).map_err(core_err)?;
            if p.contains(Primitive::COPY) {
                bufs.write_output(output_at + done, dest)
                    .ok_or_else(|| internal("output slice out of the buffer"))?;
            }
        } else if p.contains(Primitive::COPY) {
            let (local, out) = bufs
                .local_and_output(
                    input_at + done,
                    output_at + done,
                    len,
                    p.reads_input(),
                    scratch,
                )
                .ok_or_else(|| internal("slice out of the buffers"))?;
            slice_result(p, call.dtype, call.op, ranks, incoming, local, out).map_err(core_err)?;
        }
        done += len;
        k += 1;
    }
    Ok(match (e.send, direct) {
        (None, _) => Payload::Staged(0),
        (Some(_), false) => Payload::Staged(bytes),
        (Some(_), true) if p.contains(Primitive::COPY) => Payload::Output {
            at: output_at,
            len: bytes,
        },
        (Some(_), true) => Payload::Input {
            at: input_at,
            len: bytes,
        },
    })
}
