//! LL: 8-byte units of 4 bytes of data and a 4-byte flag, each stored with
//! one 8-byte atomic store, so a unit is seen whole or not at all.
//!
//! A slot of this format is a run of units: unit 0 carries the byte count
//! of the data (in its data half) under the step's flag, units `1..`
//! carry the data, 4 bytes each (little-endian, the last zero-padded).
//! The writer stores the data units in order, then unit 0; every store is
//! a release, so whatever the writer did before (a call header in a
//! mailbox) is visible to a reader that loaded any unit of the slot with
//! acquire. The reader needs no order among the units: each proves its
//! own arrival by its flag ([`flag`]). The order is for speed: a reader
//! polls unit 0 until the length is there and only then reads the data,
//! so it does not pull the lines the writer is still filling from under
//! it (on a CPU a reader that chases the writer unit by unit makes each
//! cache line bounce between the two cores several times: 4× slower at
//! 4 KiB).

use crate::error::{Error, ProtocolViolation};
use crate::math::div_up;
use crate::sync::{AtomicU64, Ordering};

/// Bytes of one unit.
pub const UNIT_BYTES: usize = 8;
/// Data bytes of one unit.
pub const UNIT_DATA: usize = 4;

/// Units of a slot that carries `data_bytes` (the length unit included;
/// saturating).
pub const fn units_for(data_bytes: u64) -> u64 {
    super::units(data_bytes, UNIT_DATA as u64)
}

/// The 32-bit flag of FIFO step `step` (the low half of
/// [`flag_of`](super::flag_of)).
#[inline]
pub const fn flag(step: u64) -> u32 {
    super::flag_of(step) as u32
}

/// One unit: `data` in the low half, `flag` in the high half.
#[inline]
pub const fn pack(data: u32, flag: u32) -> u64 {
    ((flag as u64) << 32) | data as u64
}

/// A unit's `(data, flag)`.
#[inline]
pub const fn unpack(unit: u64) -> (u32, u32) {
    (unit as u32, (unit >> 32) as u32)
}

/// Data bytes a slot of `units` units holds (0 without a length unit).
pub const fn capacity(units: usize) -> usize {
    units.saturating_sub(1).saturating_mul(UNIT_DATA)
}

/// Writes `data` as the slot of FIFO step `step` into `units` (sender
/// side; the receiver has credited the step). More data than the slot
/// holds (or than a `u32` counts) is [`Error::BadLength`], and nothing is
/// written.
pub fn write(units: &[AtomicU64], step: u64, data: &[u8]) -> Result<(), Error> {
    let cap = capacity(units.len());
    let len = u32::try_from(data.len()).ok().filter(|_| data.len() <= cap);
    let (Some(len), Some((first, rest))) = (len, units.split_first()) else {
        return Err(Error::BadLength {
            dst: cap,
            src: data.len(),
        });
    };
    let f = flag(step);
    let mut units = rest.iter();
    let mut chunks = data.chunks_exact(UNIT_DATA);
    // Chunks first: `zip` takes from its first iterator before it knows
    // the second is done, and no unit may be lost for the remainder.
    for (c, unit) in chunks.by_ref().zip(units.by_ref()) {
        let v = <[u8; UNIT_DATA]>::try_from(c).map_or(0, u32::from_le_bytes);
        unit.store(pack(v, f), Ordering::Release);
    }
    let last = chunks.remainder();
    if let (false, Some(unit)) = (last.is_empty(), units.next()) {
        let mut b = [0u8; UNIT_DATA];
        for (d, s) in b.iter_mut().zip(last) {
            *d = *s;
        }
        unit.store(pack(u32::from_le_bytes(b), f), Ordering::Release);
    }
    first.store(pack(len, f), Ordering::Release);
    Ok(())
}

/// The receiver of one slot of one step: polled until the whole slot has
/// arrived; it remembers the units already taken, so a poll costs one
/// load when nothing new came.
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

    /// Takes what arrived of the slot in `units` into `out`: `Some(len)`
    /// once all `len` bytes are in `out[..len]`, `None` while some unit
    /// still carries another step's flag (not written yet, or left from an
    /// earlier use of the slot: never taken as data). A length beyond the
    /// slot is the sender's [`ProtocolViolation::Overrun`]; beyond `out`,
    /// [`Error::BadLength`].
    pub fn poll(&mut self, units: &[AtomicU64], out: &mut [u8]) -> Result<Option<usize>, Error> {
        let f = flag(self.step);
        let Some((first, rest)) = units.split_first() else {
            return Err(Error::Protocol(ProtocolViolation::Overrun));
        };
        let len = match self.len {
            Some(len) => len,
            None => {
                let (v, fl) = unpack(first.load(Ordering::Acquire));
                if fl != f {
                    return Ok(None);
                }
                let len = v as usize;
                if len > capacity(units.len()) {
                    return Err(Error::Protocol(ProtocolViolation::Overrun));
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
        let n = div_up(len as u64, UNIT_DATA as u64) as usize;
        if rest.len() < n {
            return Err(Error::Protocol(ProtocolViolation::Overrun));
        }
        let out_len = out.len();
        let start = self.done;
        let at = start.saturating_mul(UNIT_DATA).min(len);
        let (Some(units), Some(dst)) = (rest.get(start..n), out.get_mut(at..len)) else {
            return Err(Error::BadLength {
                dst: out_len,
                src: len,
            });
        };
        let mut taken = 0usize;
        let mut chunks = dst.chunks_exact_mut(UNIT_DATA);
        let mut units = units.iter();
        for (d, unit) in chunks.by_ref().zip(units.by_ref()) {
            let (v, fl) = unpack(unit.load(Ordering::Acquire));
            if fl != f {
                self.done = start.saturating_add(taken);
                return Ok(None);
            }
            d.copy_from_slice(&v.to_le_bytes());
            taken = taken.saturating_add(1);
        }
        let last = chunks.into_remainder();
        if let (false, Some(unit)) = (last.is_empty(), units.next()) {
            let (v, fl) = unpack(unit.load(Ordering::Acquire));
            if fl != f {
                self.done = start.saturating_add(taken);
                return Ok(None);
            }
            for (x, y) in last.iter_mut().zip(v.to_le_bytes()) {
                *x = y;
            }
        }
        self.done = n;
        Ok(Some(len))
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn slot(units: usize) -> Vec<AtomicU64> {
        (0..units).map(|_| AtomicU64::new(0)).collect()
    }

    #[test]
    fn units_pack_and_a_zero_slot_has_not_arrived() {
        assert_eq!(unpack(pack(0xdead_beef, 7)), (0xdead_beef, 7));
        assert_eq!(units_for(0), 1);
        assert_eq!(units_for(5), 3);
        let s = slot(4);
        let mut out = [0u8; 12];
        assert_eq!(Reader::new(0).poll(&s, &mut out), Ok(None));
    }

    #[test]
    fn round_trip_partial_arrival_and_stale_units() {
        let s = slot(4);
        write(&s, 3, b"abcdefghij").unwrap();
        let mut out = [0u8; 12];
        assert_eq!(Reader::new(3).poll(&s, &mut out), Ok(Some(10)));
        assert_eq!(&out[..10], b"abcdefghij");
        // The same slot 8 steps later: only the length unit has come.
        s[0].store(pack(9, flag(11)), Ordering::Release);
        let mut r = Reader::new(11);
        assert_eq!(r.poll(&s, &mut out), Ok(None));
        write(&s, 11, b"012345678").unwrap();
        assert_eq!(r.poll(&s, &mut out), Ok(Some(9)));
        assert_eq!(&out[..9], b"012345678");
        assert_eq!(
            write(&s, 0, &[0; 13]),
            Err(Error::BadLength { dst: 12, src: 13 })
        );
        s[0].store(pack(13, flag(19)), Ordering::Release);
        assert_eq!(
            Reader::new(19).poll(&s, &mut out),
            Err(Error::Protocol(ProtocolViolation::Overrun))
        );
        assert!(Reader::new(0).poll(&[], &mut out).is_err());
    }
}
