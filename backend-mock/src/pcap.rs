//! A capture of the simulated RoCEv2 traffic in the libpcap format with
//! nanosecond timestamps (magic `0xa1b23c4d`), `LINKTYPE_ETHERNET`:
//! Wireshark dissects the frames as Ethernet / IPv4 / UDP 4791 /
//! InfiniBand. Timestamps are virtual time (seconds since the cluster was
//! built, shown as 1970). Frames are captured as they start onto the wire
//! at the sending port, so lost packets appear too, duplicates once.

use std::io::{self, Write};

use crate::events::Ps;

/// libpcap magic for nanosecond-resolution files.
pub(crate) const MAGIC_NS: u32 = 0xa1b2_3c4d;
/// `LINKTYPE_ETHERNET`.
pub(crate) const LINKTYPE_ETHERNET: u32 = 1;
const SNAPLEN: u32 = 65_535;

/// The captured frames.
#[derive(Debug, Default)]
pub(crate) struct Capture {
    pub on: bool,
    pub frames: Vec<(Ps, Vec<u8>)>,
}

impl Capture {
    pub fn new(on: bool) -> Capture {
        Capture {
            on,
            frames: Vec::new(),
        }
    }

    /// Writes the capture file.
    pub fn write(&self, w: impl Write) -> io::Result<()> {
        let mut w = io::BufWriter::new(w);
        w.write_all(&MAGIC_NS.to_le_bytes())?;
        w.write_all(&2u16.to_le_bytes())?;
        w.write_all(&4u16.to_le_bytes())?;
        w.write_all(&0i32.to_le_bytes())?; // thiszone
        w.write_all(&0u32.to_le_bytes())?; // sigfigs
        w.write_all(&SNAPLEN.to_le_bytes())?;
        w.write_all(&LINKTYPE_ETHERNET.to_le_bytes())?;
        for (t, f) in &self.frames {
            let ns = t / 1000;
            let sec = u32::try_from(ns / 1_000_000_000).unwrap_or(u32::MAX);
            let nsec = (ns % 1_000_000_000) as u32;
            let len = u32::try_from(f.len()).unwrap_or(u32::MAX);
            let incl = len.min(SNAPLEN);
            w.write_all(&sec.to_le_bytes())?;
            w.write_all(&nsec.to_le_bytes())?;
            w.write_all(&incl.to_le_bytes())?;
            w.write_all(&len.to_le_bytes())?;
            w.write_all(f.get(..incl as usize).unwrap_or(f))?;
        }
        w.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_and_records() {
        let c = Capture {
            on: true,
            frames: vec![(1_500_000_000_123_000, vec![1, 2, 3])],
        };
        let mut out = Vec::new();
        c.write(&mut out).unwrap();
        assert_eq!(out.len(), 24 + 16 + 3);
        assert_eq!(&out[..4], &[0x4d, 0x3c, 0xb2, 0xa1]);
        assert_eq!(u32::from_le_bytes(out[20..24].try_into().unwrap()), 1);
        assert_eq!(u32::from_le_bytes(out[24..28].try_into().unwrap()), 1500);
        assert_eq!(u32::from_le_bytes(out[28..32].try_into().unwrap()), 123);
        assert_eq!(&out[40..], &[1, 2, 3]);
    }
}
