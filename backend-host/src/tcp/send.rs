//! The sending end: staging slots the executor writes into, and a queue
//! of frames (headers in the queue, payloads left in their staging slots)
//! that the drive thread writes without blocking, many frames to one
//! `sendmsg`, from [`SendEnd::post`] and [`SendEnd::poll`]; `poll` also
//! reads the receiver's credit frames. A slice that lies in the caller's
//! memory anyway (`post_from`: a send of the input, or of what the slice
//! wrote to the output) goes from there when nothing is queued before it,
//! and only what the socket does not take at once is copied into its
//! staging slots: at 1 MiB between two namespaces that copy was an eighth
//! of a rank's time. A watcher (`watch`) wakes a rank asleep on its bell.
//!
//! A staging slot is written again only for a step the receiver has
//! credited, that is received whole: its frame has left the queue by then.
//! So the queue holds at most `STEPS` frames, and a call ends (all of its
//! steps credited) with the queue empty.

use std::collections::VecDeque;
use std::io::IoSlice;
use std::net::{Shutdown, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ringcc_comm::transport::{Bell, SendEnd};
use ringcc_comm::{Error, Result};
use ringcc_core::fifo::{slot_of, FifoGeometry, STEPS};
use ringcc_core::prim::SlotSpan;
use ringcc_core::progress::Event;
use ringcc_core::wire::call_header::CALL_HEADER_LEN;
use ringcc_core::SlotIndex;

use super::frame::{FrameRepr, Kind, FRAME_LEN};
use super::io::{recv_now, send, send_now, Peer, ReadFail, GOODBYE_TIMEOUT};
use super::watch::Watch;
use super::NAME;

/// The most header bytes before a payload: a call header frame (header
/// and payload) and the data frame's header.
const FRONT: usize = FRAME_LEN + CALL_HEADER_LEN + FRAME_LEN;

/// The most pieces one `sendmsg` gathers (each frame is two: its headers
/// and its payload).
const MAX_IOV: usize = 2 * STEPS as usize;

/// Credit frames read at once.
const CREDITS_AHEAD: usize = 32 * FRAME_LEN;

/// One data frame waiting to leave, with the call header frame before it
/// when it has one.
#[derive(Debug)]
struct Queued {
    /// The header bytes: `front[..front_len]`.
    front: [u8; FRONT],
    front_len: usize,
    /// The payload: `len` bytes at `at` in the staging slots.
    at: usize,
    len: usize,
    /// Bytes of the front and then the payload written so far.
    done: usize,
}

/// The sending end of one hop over TCP.
pub(super) struct TcpSendEnd {
    stream: Arc<TcpStream>,
    watch: Watch,
    peer: Peer,
    timeout: Duration,
    slot_bytes: usize,
    /// `STEPS` staging slots of `slot_bytes`.
    staging: Box<[u8]>,
    /// Frames posted and not yet written whole, in stream order.
    queue: VecDeque<Queued>,
    /// Credit frames read ahead: `ahead[at..end]` are not taken yet.
    ahead: [u8; CREDITS_AHEAD],
    at: usize,
    end: usize,
    /// The receiver's latest credit.
    head: u64,
    /// The credit reported by `poll`.
    head_seen: u64,
    /// The step the next span must start at (every step below was
    /// posted: a credit beyond it is a lie).
    next: u64,
    last_seq: u64,
    /// The receiver closed its end in order.
    goodbye: bool,
    /// The credit stream's failure.
    failure: Option<Error>,
    /// Since when queued bytes wait for room in the socket.
    stuck_since: Option<Instant>,
    /// A failed write: the stream may hold half a frame; no more posts.
    broken: Option<Error>,
    /// Shut down.
    stopped: bool,
}

impl TcpSendEnd {
    /// The end over `stream` (accepted by `peer`); queued bytes that make
    /// no progress for `timeout` fail the end.
    pub(super) fn start(
        stream: TcpStream,
        peer: Peer,
        geometry: FifoGeometry,
        timeout: Duration,
        bell: Arc<dyn Bell>,
    ) -> Result<TcpSendEnd> {
        let super::Opened {
            stream,
            watch,
            slot_bytes,
            fifo_bytes: staging_len,
        } = super::open_end(stream, &peer, geometry, bell, "send")?;
        Ok(TcpSendEnd {
            stream,
            watch,
            peer,
            timeout,
            slot_bytes,
            staging: vec![0u8; staging_len].into_boxed_slice(),
            queue: VecDeque::with_capacity(STEPS as usize),
            ahead: [0; CREDITS_AHEAD],
            at: 0,
            end: 0,
            head: 0,
            head_seen: 0,
            next: 0,
            last_seq: 0,
            goodbye: false,
            failure: None,
            stuck_since: None,
            broken: None,
            stopped: false,
        })
    }

    fn failure(&self) -> Option<Error> {
        self.broken
            .as_ref()
            .or(self.failure.as_ref())
            .map(Error::duplicate)
    }

    /// Queues the frames of `span`, as `post` documents.
    fn queue_span(
        &mut self,
        seq: u64,
        span: SlotSpan,
        header: Option<&[u8; CALL_HEADER_LEN]>,
        bytes: usize,
    ) {
        let mut left = bytes;
        for k in 0..span.slots {
            let step = span.step.saturating_add(k);
            let len = left.min(self.slot_bytes);
            left -= len;
            let mut q = Queued {
                front: [0; FRONT],
                front_len: FRAME_LEN,
                at: usize::from(slot_of(step).0) * self.slot_bytes,
                len,
                done: 0,
            };
            let data = FrameRepr {
                kind: Kind::Data,
                last: k + 1 == span.slots,
                length: len as u32,
                seq,
                step,
            };
            if let (0, Some(h)) = (k, header) {
                let frame = FrameRepr {
                    kind: Kind::CallHeader,
                    last: false,
                    length: CALL_HEADER_LEN as u32,
                    seq,
                    step,
                };
                frame.emit_into(&mut q.front[..FRAME_LEN]);
                q.front[FRAME_LEN..FRAME_LEN + CALL_HEADER_LEN].copy_from_slice(h);
                q.front_len = FRONT;
            }
            data.emit_into(&mut q.front[q.front_len - FRAME_LEN..q.front_len]);
            self.queue.push_back(q);
        }
    }

    /// Writes what the socket takes of the queue, without blocking:
    /// whether anything went. Bytes that make no progress for the
    /// timeout break the end.
    fn flush(&mut self) -> Result<bool> {
        let mut moved = false;
        while !self.queue.is_empty() {
            let sent = {
                let mut iov = [IoSlice::new(&[]); MAX_IOV];
                let mut k = 0;
                for q in self.queue.iter().take(MAX_IOV / 2) {
                    let payload = self.staging.get(q.at..q.at + q.len).unwrap_or_default();
                    if let Some(front) = q.front.get(q.done..q.front_len) {
                        iov[k] = IoSlice::new(front);
                        k += 1;
                        iov[k] = IoSlice::new(payload);
                    } else {
                        iov[k] =
                            IoSlice::new(payload.get(q.done - q.front_len..).unwrap_or_default());
                    }
                    k += 1;
                }
                send_now(&self.stream, &iov[..k])
            };
            match sent {
                Ok(0) => {
                    self.stuck_since.get_or_insert_with(Instant::now);
                    self.check_stuck()?;
                    return Ok(moved);
                }
                Ok(n) => {
                    self.wrote(n);
                    self.stuck_since = None;
                    moved = true;
                }
                Err(e) => return Err(self.break_with(e, Duration::ZERO)),
            }
        }
        self.stuck_since = None;
        Ok(moved)
    }

    /// Queued bytes that have waited for room in the socket for the
    /// timeout break the end.
    fn check_stuck(&mut self) -> Result<()> {
        let Some(since) = self.stuck_since.filter(|_| !self.queue.is_empty()) else {
            return Ok(());
        };
        let waited = since.elapsed();
        if waited < self.timeout {
            return Ok(());
        }
        let e = std::io::Error::from(std::io::ErrorKind::TimedOut);
        Err(self.break_with(e, waited))
    }

    /// `n` bytes of the queue's front went.
    fn wrote(&mut self, mut n: usize) {
        while let Some(q) = self.queue.front_mut() {
            let rest = q.front_len + q.len - q.done;
            if n < rest {
                q.done += n;
                return;
            }
            n -= rest;
            self.queue.pop_front();
        }
    }

    /// A failed write: the end is broken for good.
    fn break_with(&mut self, e: std::io::Error, after: Duration) -> Error {
        let e = self.peer.io(e, "write", after);
        self.broken = Some(e.duplicate());
        e
    }

    /// Reads the credit frames the socket holds, without blocking:
    /// whether anything came. Stops at the receiver's goodbye.
    fn read_credits(&mut self) -> Result<bool> {
        let mut moved = false;
        loop {
            while let Some(b) = self
                .ahead
                .get(self.at..self.end)
                .and_then(|r| r.first_chunk::<FRAME_LEN>())
            {
                let f = FrameRepr::parse(b)
                    .map_err(|e| self.peer.protocol(format!("credit frame: {e}")))?;
                self.at += FRAME_LEN;
                self.credit(&f)?;
                if self.goodbye {
                    return Ok(true);
                }
            }
            self.ahead.copy_within(self.at..self.end, 0);
            self.end -= self.at;
            self.at = 0;
            let dst = self.ahead.get_mut(self.end..).unwrap_or_default();
            match recv_now(&self.stream, dst) {
                Ok(None) => return Ok(moved),
                Ok(Some(0)) => {
                    let got = ReadFail::Eof { got: self.end };
                    return Err(self.peer.read_error(got, "frame header", FRAME_LEN));
                }
                Ok(Some(n)) => {
                    self.end += n;
                    moved = true;
                }
                Err(e) => return Err(self.peer.read_error(ReadFail::Io(e), "frame", 0)),
            }
        }
    }

    /// One frame from the receiver: a credit within what was sent, or its
    /// goodbye.
    fn credit(&mut self, f: &FrameRepr) -> Result<()> {
        if f.kind == Kind::Goodbye && f.length == 0 && !f.last {
            tracing::debug!(peer = %self.peer.rank, channel = %self.peer.channel,
                head = f.step, "tcp: the receiver closed its end");
            self.goodbye = true;
            return Ok(());
        }
        if f.kind != Kind::Credit || f.length != 0 || f.last || f.seq != 0 {
            return Err(self.peer.protocol(format!(
                "expected a credit frame, got {:?} of {} bytes",
                f.kind, f.length
            )));
        }
        if f.step < self.head || f.step > self.next {
            return Err(self.peer.protocol(format!(
                "credit {} outside [{}, {}] (last credit, steps sent)",
                f.step, self.head, self.next
            )));
        }
        self.head = f.step;
        Ok(())
    }

    /// Says goodbye (best effort, briefly, and only between whole frames:
    /// not with frames still queued, which only a call cut short leaves),
    /// shuts the connection down and stops the watcher.
    fn stop(&mut self) {
        if std::mem::replace(&mut self.stopped, true) {
            return;
        }
        self.watch.stop();
        if self.broken.is_none() && self.queue.is_empty() {
            let bye = FrameRepr::goodbye(self.next).emit();
            let _ = self
                .stream
                .set_write_timeout(Some(GOODBYE_TIMEOUT))
                .and_then(|()| send(&self.stream, &bye));
        }
        // The receiver sees EOF after the goodbye.
        let _ = self.stream.shutdown(Shutdown::Both);
    }
}

impl Drop for TcpSendEnd {
    fn drop(&mut self) {
        self.stop();
    }
}

impl SendEnd for TcpSendEnd {
    /// Writes what is queued, then reads credit: new credit first; then
    /// the credit stream's error; after the receiver's goodbye, an error
    /// only while steps it never consumed are outstanding (else the next
    /// `post` reports it).
    fn poll(&mut self) -> Result<Option<Event>> {
        if let Some(e) = &self.broken {
            return Err(e.duplicate());
        }
        let mut moved = false;
        if self.watch.armed() {
            // Nothing came and no room was made since the last look: the
            // watcher waits for it.
            self.check_stuck()?;
        } else if self.failure.is_none() && !self.goodbye {
            moved = self.flush()?;
            match self.read_credits() {
                Ok(m) => moved |= m,
                Err(e) => {
                    tracing::debug!(peer = %self.peer.rank, channel = %self.peer.channel,
                        error = %e, "tcp: the credit stream failed");
                    self.failure = Some(e);
                }
            }
        }
        if self.head > self.head_seen {
            self.head_seen = self.head;
            self.watch.busy();
            return Ok(Some(Event::Head(self.head)));
        }
        if let Some(e) = &self.failure {
            return Err(e.duplicate());
        }
        if self.goodbye && self.head < self.next {
            return Err(self.peer.gone(format!(
                "it closed its end with steps {}..{} not consumed",
                self.head, self.next
            )));
        }
        if moved {
            self.watch.busy();
        } else if !self.goodbye {
            self.watch.idle(!self.queue.is_empty());
        }
        Ok(None)
    }

    fn slot_mut(&mut self, slot: SlotIndex, len: usize) -> Result<&mut [u8]> {
        let range = super::slot_bytes_of(
            "SendEnd::slot_mut",
            slot,
            len,
            self.slot_bytes,
            self.staging.len(),
        )?;
        Ok(&mut self.staging[range])
    }

    /// Queues the call header frame (when given) and one data frame per
    /// slot of `span`, the last flagged (the receiver publishes
    /// `tail = span.end()` once its bytes are in), and writes what the
    /// socket takes now; `poll` writes the rest. A span must follow the
    /// previous one and be credited; a failed write, or queued bytes that
    /// make no progress for the timeout, leave the end broken (every
    /// later call returns the error).
    fn post(
        &mut self,
        seq: u64,
        span: SlotSpan,
        header: Option<&[u8; CALL_HEADER_LEN]>,
        bytes: usize,
    ) -> Result<()> {
        self.check_post(seq, span, bytes)?;
        self.queue_span(seq, span, header, bytes);
        self.posted(seq, span);
        self.flush().map(|_| ())
    }

    /// Bytes queued to write; credit is read when the engine needs it.
    fn needs_poll(&self) -> bool {
        !self.queue.is_empty()
    }

    /// Staging slots cost a copy per byte: a slice already in the
    /// caller's memory goes from there.
    fn prefers_post_from(&self) -> bool {
        true
    }

    /// As `post`, with the payload taken from `data`: when nothing is
    /// queued before the span, as much of it as the socket takes now goes
    /// straight from `data` in one `sendmsg`; only what it did not take is
    /// copied into the staging slots (and queued as `post` queues it, for
    /// `poll` to write: the socket has just refused it).
    fn post_from(
        &mut self,
        seq: u64,
        span: SlotSpan,
        header: Option<&[u8; CALL_HEADER_LEN]>,
        data: &[u8],
        slot_bytes: usize,
    ) -> Result<()> {
        if slot_bytes != self.slot_bytes {
            return Err(Error::Internal(format!(
                "{NAME}: post of {slot_bytes} B slots to an end of {} B slots",
                self.slot_bytes
            )));
        }
        self.check_post(seq, span, data.len())?;
        let behind = !self.queue.is_empty();
        self.queue_span(seq, span, header, data.len());
        self.posted(seq, span);
        let mut off = 0;
        if !behind {
            let sent = {
                let mut iov = [IoSlice::new(&[]); MAX_IOV];
                let mut k = 0;
                for q in self.queue.iter().take(MAX_IOV / 2) {
                    iov[k] = IoSlice::new(&q.front[..q.front_len]);
                    iov[k + 1] = IoSlice::new(data.get(off..off + q.len).unwrap_or_default());
                    off += q.len;
                    k += 2;
                }
                send_now(&self.stream, &iov[..k])
            };
            match sent {
                Ok(n) => self.wrote(n),
                Err(e) => return Err(self.break_with(e, Duration::ZERO)),
            }
        }
        // The frames still queued are this span's last ones: their
        // payloads (the rest of `data`) move into their staging slots.
        let left = self
            .queue
            .len()
            .min(usize::try_from(span.slots).unwrap_or(usize::MAX));
        let first = self.queue.len() - left;
        let mut at = data.len();
        for q in self.queue.iter().skip(first).rev() {
            at -= q.len;
            let (dst, src) = (q.at..q.at + q.len, at..at + q.len);
            if let (Some(d), Some(s)) = (self.staging.get_mut(dst), data.get(src)) {
                d.copy_from_slice(s);
            }
        }
        if behind {
            self.flush()?;
        }
        Ok(())
    }
}

impl TcpSendEnd {
    /// Refuses a post that does not follow the last one, is not credited,
    /// or overflows its span; and any post to a failed end.
    fn check_post(&self, seq: u64, span: SlotSpan, bytes: usize) -> Result<()> {
        if let Some(e) = self.failure() {
            return Err(e);
        }
        if self.goodbye {
            return Err(self.peer.gone("it closed its end (goodbye)"));
        }
        let head = self.head;
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
        Ok(())
    }

    /// Frames not yet written whole (tests: the copy path is taken).
    #[cfg(test)]
    pub(super) fn queued(&self) -> usize {
        self.queue.len()
    }

    /// The span of call `seq` is queued.
    fn posted(&mut self, seq: u64, span: SlotSpan) {
        self.next = span.end();
        self.last_seq = seq;
        self.watch.busy();
    }
}
