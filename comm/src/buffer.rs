//! The caller's buffers of one call, as the executor sees them: apart
//! (out of place) or one buffer in place, with NCCL's layout.

use ringcc_core::Call;

use crate::error::{Error, Result};
use crate::exec::Payload;

/// The buffers of one running call.
#[derive(Debug)]
pub(crate) enum Buffers<'a> {
    /// Out of place: `input` and `output` are distinct memory.
    Apart {
        input: &'a [u8],
        output: &'a mut [u8],
    },
    /// In place: the input starts at byte `input`, the output at byte
    /// `output` of `buf` (see [`Call::in_place_offsets`]).
    InPlace {
        buf: &'a mut [u8],
        input: usize,
        output: usize,
    },
}

impl<'a> Buffers<'a> {
    /// Out of place, checked against the call's sizes.
    pub(crate) fn apart(
        call: &Call,
        ranks: u32,
        input: &'a [u8],
        output: &'a mut [u8],
    ) -> Result<Buffers<'a>> {
        let (i, o) = call.buffer_bytes(ranks);
        for (which, expected, got) in [("input", i, input.len()), ("output", o, output.len())] {
            if expected != got {
                return Err(Error::BadBuffer {
                    which,
                    expected,
                    got,
                });
            }
        }
        Ok(Buffers::Apart { input, output })
    }

    /// In place in `buf` (the larger of the input and the output), checked.
    pub(crate) fn in_place(
        call: &Call,
        ranks: u32,
        rank: u32,
        buf: &'a mut [u8],
    ) -> Result<Buffers<'a>> {
        let (i, o) = call.buffer_bytes(ranks);
        let expected = i.max(o);
        if buf.len() != expected {
            return Err(Error::BadBuffer {
                which: "in-place",
                expected,
                got: buf.len(),
            });
        }
        let (ie, oe) = call.in_place_offsets(rank);
        let at = |e: u64| {
            usize::try_from(e)
                .unwrap_or(usize::MAX)
                .saturating_mul(call.elem())
        };
        Ok(Buffers::InPlace {
            buf,
            input: at(ie),
            output: at(oe),
        })
    }

    /// `len` input bytes from byte `off` of the input.
    pub(crate) fn input(&self, off: usize, len: usize) -> Option<&[u8]> {
        match self {
            Buffers::Apart { input, .. } => input.get(off..off.checked_add(len)?),
            Buffers::InPlace { buf, input, .. } => {
                let at = input.checked_add(off)?;
                buf.get(at..at.checked_add(len)?)
            }
        }
    }

    /// Copies `src` to byte `off` of the output.
    pub(crate) fn write_output(&mut self, off: usize, src: &[u8]) -> Option<()> {
        self.output(off, src.len())?.copy_from_slice(src);
        Some(())
    }

    /// The bytes a slice sends from the caller's buffers (`p`'s range of
    /// the input or of the output); `None` for a staged payload or a
    /// range beyond the buffers.
    pub(crate) fn sent(&self, p: Payload) -> Option<&[u8]> {
        let (off, len) = match p {
            Payload::Staged(_) => return None,
            Payload::Input { at, len } => return self.input(at, len),
            Payload::Output { at, len } => (at, len),
        };
        match self {
            Buffers::Apart { output, .. } => output.get(off..off.checked_add(len)?),
            Buffers::InPlace { buf, output, .. } => {
                let at = output.checked_add(off)?;
                buf.get(at..at.checked_add(len)?)
            }
        }
    }

    /// The call's memory as a send end may be lent it
    /// ([`SendEnd::lend`](crate::transport::SendEnd::lend)): the input
    /// and the output, or the one buffer in place (and an empty region).
    pub(crate) fn regions(&self) -> [&[u8]; 2] {
        match self {
            Buffers::Apart { input, output } => [input, output],
            Buffers::InPlace { buf, .. } => [buf, &[]],
        }
    }

    /// `len` output bytes from byte `off` of the output.
    pub(crate) fn output_mut(&mut self, off: usize, len: usize) -> Option<&mut [u8]> {
        self.output(off, len)
    }

    /// `len` output bytes from byte `off` of the output, to read.
    pub(crate) fn output_ref(&self, off: usize, len: usize) -> Option<&[u8]> {
        self.sent(Payload::Output { at: off, len })
    }

    fn output(&mut self, off: usize, len: usize) -> Option<&mut [u8]> {
        match self {
            Buffers::Apart { output, .. } => output.get_mut(off..off.checked_add(len)?),
            Buffers::InPlace { buf, output, .. } => {
                let at = output.checked_add(off)?;
                buf.get_mut(at..at.checked_add(len)?)
            }
        }
    }

    /// The local input (when `need_local`) and the output of one part, at
    /// once. Out of place they are distinct memory; in place the input
    /// is first copied to `scratch`, since the two may be the same bytes.
    pub(crate) fn local_and_output<'s>(
        &'s mut self,
        in_off: usize,
        out_off: usize,
        len: usize,
        need_local: bool,
        scratch: &'s mut Vec<u8>,
    ) -> Option<(Option<&'s [u8]>, &'s mut [u8])> {
        match self {
            Buffers::Apart { input, output } => {
                let local = if need_local {
                    Some(input.get(in_off..in_off.checked_add(len)?)?)
                } else {
                    None
                };
                Some((local, output.get_mut(out_off..out_off.checked_add(len)?)?))
            }
            Buffers::InPlace { .. } => {
                if need_local {
                    let src = self.input(in_off, len)?;
                    scratch.clear();
                    scratch.extend_from_slice(src);
                }
                let out = self.output(out_off, len)?;
                Some((need_local.then_some(&scratch[..]), out))
            }
        }
    }
}
