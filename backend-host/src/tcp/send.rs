//! The sending end: staging slots with room for the frame headers in
//! front (one `write` per slot), and a thread that reads the receiver's
//! credit frames into a `head` counter.

use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use ringcc_comm::transport::{Bell, SendEnd};
use ringcc_comm::{Error, Result};
use ringcc_core::fifo::{slot_of, FifoGeometry, StepCounter, STEPS};
use ringcc_core::prim::SlotSpan;
use ringcc_core::progress::Event;
use ringcc_core::wire::call_header::CALL_HEADER_LEN;
use ringcc_core::SlotIndex;

use super::frame::{FrameRepr, Kind, FRAME_LEN};
use super::io::{fill, send, transport_error, Peer, GOODBYE_TIMEOUT, READ_TICK};
use super::NAME;

/// Bytes in front of each staging slot's payload: a call header frame
/// (header and payload) and the data frame's header.
const FRONT: usize = FRAME_LEN + CALL_HEADER_LEN + FRAME_LEN;
/// Where the data frame's header starts in a staging slot.
const DATA_HEADER: usize = FRAME_LEN + CALL_HEADER_LEN;

/// What the credit reader and the end share.
struct Outbox {
    /// The receiver's latest credit (release by the credit reader).
    head: StepCounter,
    /// The tail of everything `post` started to send (a credit beyond it
    /// is a lie).
    sent: StepCounter,
    failure: Mutex<Option<Error>>,
    failed: AtomicBool,
    /// The receiver closed its end in order.
    goodbye: AtomicBool,
    stop: AtomicBool,
    /// The rank's bell, rung after the credit reader publishes.
    bell: Arc<dyn Bell>,
}

/// The sending end of one hop over TCP.
pub(super) struct TcpSendEnd {
    outbox: Arc<Outbox>,
    stream: TcpStream,
    thread: Option<JoinHandle<()>>,
    peer: Peer,
    timeout: Duration,
    slot_bytes: usize,
    /// `STEPS` staging slots of `FRONT + slot_bytes` bytes.
    staging: Box<[u8]>,
    head_seen: u64,
    /// The step the next span must start at.
    next: u64,
    last_seq: u64,
    /// A failed write: the stream may hold half a frame; no more posts.
    broken: Option<Error>,
}

impl TcpSendEnd {
    /// The end over `stream` (accepted by `peer`), writes bounded by
    /// `timeout`.
    pub(super) fn start(
        stream: TcpStream,
        peer: Peer,
        geometry: FifoGeometry,
        timeout: Duration,
        bell: Arc<dyn Bell>,
    ) -> Result<TcpSendEnd> {
        let slot_bytes = usize::try_from(geometry.slot_bytes())
            .map_err(|_| Error::BadConfig(format!("{NAME}: slots beyond memory")))?;
        let staging_len = slot_bytes
            .checked_add(FRONT)
            .and_then(|s| s.checked_mul(STEPS as usize))
            .ok_or_else(|| Error::BadConfig(format!("{NAME}: slots beyond memory")))?;
        let setup = |call| move |e| transport_error(call, e);
        stream.set_nodelay(true).map_err(setup("set_nodelay"))?;
        stream
            .set_read_timeout(Some(READ_TICK))
            .map_err(setup("set_read_timeout"))?;
        stream
            .set_write_timeout(Some(timeout))
            .map_err(setup("set_write_timeout"))?;
        let outbox = Arc::new(Outbox {
            head: StepCounter::new(0),
            sent: StepCounter::new(0),
            failure: Mutex::new(None),
            failed: AtomicBool::new(false),
            goodbye: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            bell,
        });
        let reader = CreditReader {
            outbox: Arc::clone(&outbox),
            stream: stream.try_clone().map_err(setup("dup"))?,
            peer,
            head: 0,
        };
        let thread = std::thread::Builder::new()
            .name(format!(
                "ringcc-tcp-credit-r{}-c{}",
                peer.rank, peer.channel
            ))
            .spawn(move || reader.run())
            .map_err(setup("spawn the credit thread"))?;
        Ok(TcpSendEnd {
            outbox,
            stream,
            thread: Some(thread),
            peer,
            timeout,
            slot_bytes,
            staging: vec![0u8; staging_len].into_boxed_slice(),
            head_seen: 0,
            next: 0,
            last_seq: 0,
            broken: None,
        })
    }

    fn failure(&self) -> Option<Error> {
        if let Some(e) = &self.broken {
            return Some(e.duplicate());
        }
        if !self.outbox.failed.load(Ordering::Acquire) {
            return None;
        }
        let f = self
            .outbox
            .failure
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        Some(match f.as_ref() {
            Some(e) => e.duplicate(),
            None => Error::Internal(format!("{NAME}: a credit reader failed without an error")),
        })
    }

    /// Writes the frames of `span`, as `post` documents.
    fn write_span(
        &mut self,
        seq: u64,
        span: SlotSpan,
        header: Option<&[u8; CALL_HEADER_LEN]>,
        bytes: usize,
    ) -> std::io::Result<()> {
        let stride = FRONT + self.slot_bytes;
        let mut left = bytes;
        for k in 0..span.slots {
            let step = span.step.saturating_add(k);
            let len = left.min(self.slot_bytes);
            left -= len;
            let base = usize::from(slot_of(step).0) * stride;
            let Some(buf) = self.staging.get_mut(base..base + FRONT + len) else {
                return Err(std::io::Error::other("staging slot out of range"));
            };
            let data = FrameRepr {
                kind: Kind::Data,
                last: k + 1 == span.slots,
                length: len as u32,
                seq,
                step,
            };
            data.emit_into(&mut buf[DATA_HEADER..FRONT]);
            let mut from = DATA_HEADER;
            if let (0, Some(h)) = (k, header) {
                let frame = FrameRepr {
                    kind: Kind::CallHeader,
                    last: false,
                    length: CALL_HEADER_LEN as u32,
                    seq,
                    step,
                };
                frame.emit_into(&mut buf[..FRAME_LEN]);
                buf[FRAME_LEN..DATA_HEADER].copy_from_slice(h);
                from = 0;
            }
            send(&self.stream, &buf[from..])?;
        }
        Ok(())
    }

    /// Says goodbye (best effort, briefly, and only between whole
    /// frames), shuts the connection down and joins the credit reader.
    fn stop(&mut self) {
        let Some(t) = self.thread.take() else {
            return;
        };
        self.outbox.stop.store(true, Ordering::Release);
        if self.broken.is_none() {
            let bye = FrameRepr::goodbye(self.next).emit();
            let _ = self
                .stream
                .set_write_timeout(Some(GOODBYE_TIMEOUT))
                .and_then(|()| send(&self.stream, &bye));
        }
        // The receiver's reader sees EOF after the goodbye; ours wakes
        // from `read`.
        let _ = self.stream.shutdown(Shutdown::Both);
        if t.join().is_err() {
            tracing::warn!(peer = %self.peer.rank, channel = %self.peer.channel,
                "tcp: the credit thread panicked");
        }
    }
}

impl Drop for TcpSendEnd {
    fn drop(&mut self) {
        self.stop();
    }
}

impl SendEnd for TcpSendEnd {
    /// New credit first; then the credit reader's error; after the
    /// receiver's goodbye, an error only while steps it never consumed
    /// are outstanding (else the next `post` reports it).
    fn poll(&mut self) -> Result<Option<Event>> {
        // Flags first: the credit posted before them is visible below.
        let failure = self.failure();
        let goodbye = self.outbox.goodbye.load(Ordering::Acquire);
        let head = self.outbox.head.load();
        if head > self.head_seen {
            self.head_seen = head;
            return Ok(Some(Event::Head(head)));
        }
        if let Some(e) = failure {
            return Err(e);
        }
        if goodbye && head < self.next {
            return Err(self.peer.gone(format!(
                "it closed its end with steps {head}..{} not consumed",
                self.next
            )));
        }
        Ok(None)
    }

    fn slot_mut(&mut self, slot: SlotIndex, len: usize) -> Result<&mut [u8]> {
        let bad = |e: crate::Error| Error::Transport {
            transport: NAME,
            call: "SendEnd::slot_mut",
            source: Box::new(e),
        };
        if u64::from(slot.0) >= STEPS {
            return Err(bad(crate::Error::NoSuchSlot {
                slot: u64::from(slot.0),
            }));
        }
        if len > self.slot_bytes {
            return Err(bad(crate::Error::SlotOverflow {
                slot: u64::from(slot.0),
                len,
                capacity: self.slot_bytes as u64,
            }));
        }
        let start = usize::from(slot.0) * (FRONT + self.slot_bytes) + FRONT;
        self.staging.get_mut(start..start + len).ok_or_else(|| {
            bad(crate::Error::NoSuchSlot {
                slot: u64::from(slot.0),
            })
        })
    }

    /// Writes the call header frame (when given) and one data frame per
    /// slot of `span`, the last flagged: the receiver publishes
    /// `tail = span.end()` once its bytes are in. A span must follow the
    /// previous one and be credited; a failed or timed-out write leaves
    /// the end broken (every later call returns the error).
    fn post(
        &mut self,
        seq: u64,
        span: SlotSpan,
        header: Option<&[u8; CALL_HEADER_LEN]>,
        bytes: usize,
    ) -> Result<()> {
        if let Some(e) = self.failure() {
            return Err(e);
        }
        if self.outbox.goodbye.load(Ordering::Acquire) {
            return Err(self.peer.gone("it closed its end (goodbye)"));
        }
        let head = self.outbox.head.load();
        let capacity = usize::try_from(span.slots)
            .ok()
            .and_then(|s| s.checked_mul(self.slot_bytes));
        let credited = head
            .checked_add(STEPS)
            .is_some_and(|limit| span.end() <= limit);
        if span.slots == 0
            || span.step != self.next
            || !credited
            || capacity.is_none_or(|c| bytes > c)
            || seq < self.last_seq
        {
            return Err(Error::Internal(format!(
                "{NAME}: post of call {seq}, {bytes} B at steps {}..{} \
                 (next step {}, head {head}, last call {})",
                span.step,
                span.end(),
                self.next,
                self.last_seq
            )));
        }
        // Before the bytes leave, so that an honest credit never exceeds it.
        self.outbox.sent.post(span.end());
        if let Err(e) = self.write_span(seq, span, header, bytes) {
            let e = self.peer.io(e, "write", self.timeout);
            self.broken = Some(e.duplicate());
            return Err(e);
        }
        self.next = span.end();
        self.last_seq = seq;
        Ok(())
    }
}

/// The credit reader thread.
struct CreditReader {
    outbox: Arc<Outbox>,
    stream: TcpStream,
    peer: Peer,
    head: u64,
}

impl CreditReader {
    fn run(mut self) {
        if let Some(e) = self.serve() {
            tracing::debug!(peer = %self.peer.rank, channel = %self.peer.channel, error = %e,
                "tcp: credit reader stopped");
            *self
                .outbox
                .failure
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = Some(e);
            self.outbox.failed.store(true, Ordering::Release);
            self.outbox.bell.ring();
        }
    }

    fn serve(&mut self) -> Option<Error> {
        loop {
            let mut b = [0u8; FRAME_LEN];
            if let Err(f) = fill(&self.stream, &mut b, &self.outbox.stop) {
                return self.peer.read_error(f, "frame header", FRAME_LEN);
            }
            let f = match FrameRepr::parse(&b) {
                Ok(f) => f,
                Err(e) => return Some(self.peer.protocol(format!("credit frame: {e}"))),
            };
            if f.kind == Kind::Goodbye && f.length == 0 && !f.last {
                tracing::debug!(peer = %self.peer.rank, channel = %self.peer.channel,
                    head = f.step, "tcp: the receiver closed its end");
                self.outbox.goodbye.store(true, Ordering::Release);
                self.outbox.bell.ring();
                return None;
            }
            if f.kind != Kind::Credit || f.length != 0 || f.last || f.seq != 0 {
                return Some(self.peer.protocol(format!(
                    "expected a credit frame, got {:?} of {} bytes",
                    f.kind, f.length
                )));
            }
            let sent = self.outbox.sent.load();
            if f.step < self.head || f.step > sent {
                return Some(self.peer.protocol(format!(
                    "credit {} outside [{}, {sent}] (last credit, steps sent)",
                    f.step, self.head
                )));
            }
            self.head = f.step;
            self.outbox.head.post(f.step);
            self.outbox.bell.ring();
        }
    }
}
