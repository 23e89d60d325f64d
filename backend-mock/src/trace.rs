//! The timeline, in Chrome's trace-event JSON (what `chrome://tracing`
//! and Perfetto open): one process per rank with one thread per channel
//! for the primitives (NCCL's names, with chunk / step / slice / bytes),
//! and one "links" process with one thread per link for the transfers.

use std::io::{self, Write};

use ringcc_core::Primitive;

use crate::events::Ps;
use crate::fabric::Fabric;

/// One recorded span.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Rec {
    /// A slice carried out by lane `lane`'s GPU.
    Exec {
        lane: u32,
        start: Ps,
        end: Ps,
        prim: Primitive,
        chunk: u32,
        step: u32,
        slice: u64,
        loop_index: u64,
        bytes: u64,
    },
    /// A transfer on link `link` (an NVLink copy, an RDMA message).
    Xfer {
        link: u32,
        start: Ps,
        end: Ps,
        bytes: u64,
        from: u32,
        to: u32,
        channel: u32,
    },
}

/// The recorded timeline.
#[derive(Debug, Default)]
pub(crate) struct Trace {
    pub on: bool,
    recs: Vec<Rec>,
}

/// Picoseconds as microseconds with six decimals (exact).
fn us(t: Ps) -> String {
    format!("{}.{:06}", t / 1_000_000, t % 1_000_000)
}

/// A JSON string literal (names here are ASCII, but escape anyway).
fn json_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

impl Trace {
    pub fn new(on: bool) -> Trace {
        Trace {
            on,
            recs: Vec::new(),
        }
    }

    #[inline]
    pub fn push(&mut self, r: Rec) {
        self.recs.push(r);
    }

    pub fn len(&self) -> usize {
        self.recs.len()
    }

    /// Writes the trace-event JSON.
    pub fn write(&self, fab: &Fabric, w: impl Write) -> io::Result<()> {
        let mut w = io::BufWriter::new(w);
        let links_pid = fab.ranks;
        writeln!(w, "{{\"displayTimeUnit\":\"ns\",\"traceEvents\":[")?;
        let mut first = true;
        let mut sep = |w: &mut io::BufWriter<_>| -> io::Result<()> {
            if first {
                first = false;
                Ok(())
            } else {
                writeln!(w, ",")
            }
        };
        for r in 0..fab.ranks {
            sep(&mut w)?;
            let name = format!("rank {r} (node {})", fab.node_of[r as usize]);
            write!(
                w,
                "{{\"ph\":\"M\",\"pid\":{r},\"name\":\"process_name\",\"args\":{{\"name\":{}}}}}",
                json_str(&name)
            )?;
            sep(&mut w)?;
            write!(
                w,
                "{{\"ph\":\"M\",\"pid\":{r},\"name\":\"process_sort_index\",\"args\":{{\"sort_index\":{r}}}}}"
            )?;
            for c in 0..fab.channels {
                sep(&mut w)?;
                write!(
                    w,
                    "{{\"ph\":\"M\",\"pid\":{r},\"tid\":{c},\"name\":\"thread_name\",\"args\":{{\"name\":\"channel {c}\"}}}}"
                )?;
            }
        }
        sep(&mut w)?;
        write!(
            w,
            "{{\"ph\":\"M\",\"pid\":{links_pid},\"name\":\"process_name\",\"args\":{{\"name\":\"links\"}}}}"
        )?;
        for (i, l) in fab.links.iter().enumerate() {
            sep(&mut w)?;
            write!(
                w,
                "{{\"ph\":\"M\",\"pid\":{links_pid},\"tid\":{i},\"name\":\"thread_name\",\"args\":{{\"name\":{}}}}}",
                json_str(&l.kind.name())
            )?;
        }
        for r in &self.recs {
            sep(&mut w)?;
            match *r {
                Rec::Exec {
                    lane,
                    start,
                    end,
                    prim,
                    chunk,
                    step,
                    slice,
                    loop_index,
                    bytes,
                } => {
                    let t = fab.lanes[lane as usize];
                    write!(
                        w,
                        "{{\"ph\":\"X\",\"cat\":\"primitive\",\"name\":{},\"pid\":{},\"tid\":{},\"ts\":{},\"dur\":{},\
                         \"args\":{{\"chunk\":{chunk},\"step\":{step},\"slice\":{slice},\"loop\":{loop_index},\"bytes\":{bytes}}}}}",
                        json_str(prim.name()),
                        t.rank,
                        t.channel,
                        us(start),
                        us(end.saturating_sub(start)),
                    )?;
                }
                Rec::Xfer {
                    link,
                    start,
                    end,
                    bytes,
                    from,
                    to,
                    channel,
                } => {
                    write!(
                        w,
                        "{{\"ph\":\"X\",\"cat\":\"transfer\",\"name\":\"{from}->{to}\",\"pid\":{links_pid},\"tid\":{link},\"ts\":{},\"dur\":{},\
                         \"args\":{{\"bytes\":{bytes},\"channel\":{channel},\"from\":{from},\"to\":{to}}}}}",
                        us(start),
                        us(end.saturating_sub(start)),
                    )?;
                }
            }
        }
        writeln!(w, "\n]}}")?;
        w.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        assert_eq!(us(1_234_567_890), "1234.567890");
        assert_eq!(us(5), "0.000005");
        assert_eq!(json_str("a\"b\\c\n"), "\"a\\\"b\\\\c\\u000a\"");
    }
}
