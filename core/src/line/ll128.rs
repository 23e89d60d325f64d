//! LL128: 128-byte lines of 15 data words (120 bytes) and a flag word.
//!
//! A slot of this format is a run of lines of [`LINE_WORDS`] 64-bit
//! words: line 0 carries the byte count of the data in word 0, lines
//! `1..` carry the data, 120 bytes each (15 little-endian words, the last
//! zero-padded); word 15 of every line is the step's flag
//! ([`flag_of`](super::flag_of), all 64 bits). The writer stores the data
//! lines in order, then line 0 (as LL, so that a reader polling line 0
//! does not chase the writer through the slot); each line's data words
//! (relaxed), then its flag word with release; the reader
//! loads the flag with acquire and, when it is this step's, the data
//! words — the writes before the flag's release. (On a GPU NCCL relies on
//! 128-byte stores reaching the peer whole; on a CPU the release/acquire
//! pair is what makes a line whole.)

use crate::error::{Error, ProtocolViolation};
use crate::math::div_up;
use crate::sync::{AtomicU64, Ordering};

/// Bytes of one line (`NCCL_LL128_LINESIZE`).
pub const LINE_BYTES: usize = 128;
/// Words of one line (`NCCL_LL128_LINEELEMS`).
pub const LINE_WORDS: usize = LINE_BYTES / 8;
/// Data words of one line (`NCCL_LL128_DATAELEMS`); the last is the flag.
pub const DATA_WORDS: usize = LINE_WORDS - 1;
/// Data bytes of one line.
pub const LINE_DATA: usize = DATA_WORDS * 8;

/// Lines of a slot that carries `data_bytes` (the length line included;
/// saturating).
pub const fn lines_for(data_bytes: u64) -> u64 {
    super::units(data_bytes, LINE_DATA as u64)
}

/// Data bytes a slot of `words` words holds (whole lines only, 0 without
/// a length line).
pub const fn capacity(words: usize) -> usize {
    (words / LINE_WORDS)
        .saturating_sub(1)
        .saturating_mul(LINE_DATA)
}

/// Line `i` of a slot (its [`LINE_WORDS`] words), `None` beyond.
fn line(words: &[AtomicU64], i: usize) -> Option<&[AtomicU64]> {
    let at = i.checked_mul(LINE_WORDS)?;
    words.get(at..at.checked_add(LINE_WORDS)?)
}

/// Stores one line: `data` words (relaxed), then `flag` (release).
fn store_line(line: &[AtomicU64], data: impl Iterator<Item = u64>, flag: u64) {
    let (flag_word, words) = match line.split_last() {
        Some(x) => x,
        None => return,
    };
    for (w, v) in words.iter().zip(data) {
        w.store(v, Ordering::Relaxed);
    }
    flag_word.store(flag, Ordering::Release);
}

/// Writes `data` as the slot of FIFO step `step` into `words` (sender
/// side; the receiver has credited the step). More data than the slot
/// holds is [`Error::BadLength`], and nothing is written.
pub fn write(words: &[AtomicU64], step: u64, data: &[u8]) -> Result<(), Error> {
    let cap = capacity(words.len());
    let head = line(words, 0).filter(|_| data.len() <= cap);
    let Some(head) = head else {
        return Err(Error::BadLength {
            dst: cap,
            src: data.len(),
        });
    };
    let f = super::flag_of(step);
    for (i, chunk) in data.chunks(LINE_DATA).enumerate() {
        let Some(l) = line(words, i.saturating_add(1)) else {
            break; // unreachable: the length fits the lines
        };
        let values = chunk.chunks(8).map(|c| match <[u8; 8]>::try_from(c) {
            Ok(b) => u64::from_le_bytes(b),
            Err(_) => {
                let mut b = [0u8; 8];
                for (d, s) in b.iter_mut().zip(c) {
                    *d = *s;
                }
                u64::from_le_bytes(b)
            }
        });
        store_line(l, values, f);
    }
    store_line(head, core::iter::once(data.len() as u64), f);
    Ok(())
}

/// The receiver of one slot of one step (see [`ll::Reader`](super::ll::Reader)):
/// remembers the lines already taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reader {
    step: u64,
    len: Option<usize>,
    done: usize,
}

impl Reader {
    /// Waits for the slot of FIFO step `step`.
    pub const fn new(step: u64) -> Reader {
        Reader {
            step,
            len: None,
            done: 0,
        }
    }

    /// The step it waits for.
    pub const fn step(&self) -> u64 {
        self.step
    }

    /// Takes the lines that arrived into `out`: `Some(len)` once all `len`
    /// bytes are in `out[..len]`, `None` while a line's flag is another
    /// step's. A length beyond the slot is the sender's
    /// [`ProtocolViolation::Overrun`]; beyond `out`, [`Error::BadLength`].
    pub fn poll(&mut self, words: &[AtomicU64], out: &mut [u8]) -> Result<Option<usize>, Error> {
        let f = super::flag_of(self.step);
        let overrun = Error::Protocol(ProtocolViolation::Overrun);
        let len = match self.len {
            Some(len) => len,
            None => {
                let head = line(words, 0).ok_or(overrun)?;
                let (Some(flag), Some(len)) = (head.last(), head.first()) else {
                    return Err(overrun);
                };
                if flag.load(Ordering::Acquire) != f {
                    return Ok(None);
                }
                let len = usize::try_from(len.load(Ordering::Relaxed)).unwrap_or(usize::MAX);
                if len > capacity(words.len()) {
                    return Err(overrun);
                }
                if len > out.len() {
                    return Err(Error::BadLength {
                        dst: out.len(),
                        src: len,
                    });
                }
                self.len = Some(len);
                len
            }
        };
        let n = div_up(len as u64, LINE_DATA as u64) as usize;
        while self.done < n {
            let l = line(words, self.done.saturating_add(1)).ok_or(overrun)?;
            let Some((flag, data)) = l.split_last() else {
                return Err(overrun);
            };
            if flag.load(Ordering::Acquire) != f {
                return Ok(None);
            }
            let at = self.done.saturating_mul(LINE_DATA);
            let end = at.saturating_add(LINE_DATA).min(len);
            let out_len = out.len();
            let dst = out.get_mut(at..end).ok_or(Error::BadLength {
                dst: out_len,
                src: len,
            })?;
            for (d, w) in dst.chunks_mut(8).zip(data) {
                let b = w.load(Ordering::Relaxed).to_le_bytes();
                match <&mut [u8; 8]>::try_from(&mut *d) {
                    Ok(whole) => *whole = b,
                    Err(_) => {
                        for (x, y) in d.iter_mut().zip(b) {
                            *x = y;
                        }
                    }
                }
            }
            self.done = self.done.saturating_add(1);
        }
        Ok(Some(len))
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn slot(lines: usize) -> Vec<AtomicU64> {
        (0..lines * LINE_WORDS).map(|_| AtomicU64::new(0)).collect()
    }

    #[test]
    fn round_trip_and_stale_lines() {
        assert_eq!(LINE_DATA, 120);
        assert_eq!(lines_for(0), 1);
        assert_eq!(lines_for(121), 3);
        let s = slot(3);
        assert_eq!(capacity(s.len()), 240);
        let data: Vec<u8> = (0..200u8).collect();
        let mut out = vec![0u8; 240];
        assert_eq!(Reader::new(5).poll(&s, &mut out), Ok(None));
        write(&s, 5, &data).unwrap();
        assert_eq!(Reader::new(5).poll(&s, &mut out), Ok(Some(200)));
        assert_eq!(&out[..200], &data[..]);
        // 8 steps later only the length line has come: the old data line
        // is not taken.
        s[0].store(7, Ordering::Relaxed);
        s[LINE_WORDS - 1].store(super::super::flag_of(13), Ordering::Release);
        let mut r = Reader::new(13);
        assert_eq!(r.poll(&s, &mut out), Ok(None));
        write(&s, 13, &data[100..107]).unwrap();
        assert_eq!(r.poll(&s, &mut out), Ok(Some(7)));
        assert_eq!(&out[..7], &data[100..107]);
        assert_eq!(
            write(&s, 0, &[0; 241]),
            Err(Error::BadLength { dst: 240, src: 241 })
        );
    }
}
