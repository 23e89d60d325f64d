//! The receiving end: a reader thread that checks every frame before it
//! touches memory and reads payloads straight into the slots, and the
//! [`RecvEnd`] the drive loop polls.
//!
//! The slots are shared without locks; the credit protocol keeps the two
//! sides apart. The reader writes step `s` (its slot `slot_of(s)`) only
//! when `s` is the next step in order, so `s >= tail` it published, and
//! `s < head + STEPS` for the `head` the consumer posted. The consumer
//! reads only steps in `[head, tail_seen)` (checked by [`RecvEnd::slot`]),
//! with `tail_seen` a tail the reader published. Those steps lie within
//! `STEPS` below `s`, so none shares its slot; the consumer moves `head`
//! only through `&mut self`, when no slot borrow is alive.

use std::collections::VecDeque;
use std::net::{Shutdown, TcpStream};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use ringcc_comm::transport::{Bell, RecvEnd};
use ringcc_comm::{Error, Result};
use ringcc_core::fifo::{slot_of, FifoGeometry, StepCounter, STEPS};
use ringcc_core::progress::Event;
use ringcc_core::wire::call_header::{CallHeader, CallHeaderRepr, CALL_HEADER_LEN};
use ringcc_core::{CallDesc, SlotIndex};

use super::frame::{FrameRepr, Kind, FRAME_LEN};
use super::io::{fill, send, transport_error, Peer, GOODBYE_TIMEOUT, READ_TICK};
use super::NAME;

/// `STEPS` slots of `slot_bytes` each, in one allocation written by the
/// reader thread and read by the consumer under the credit protocol (see
/// the module's doc).
struct Slots {
    ptr: NonNull<u8>,
    len: usize,
    slot_bytes: usize,
}

// SAFETY: `Slots` owns its allocation (freed once, in `Drop`); the bytes
// are plain `u8`s. Concurrent access from the reader thread and the
// consumer goes through `slot` / `slot_mut`, whose callers keep to
// disjoint slots by the credit protocol (the module's doc).
unsafe impl Send for Slots {}
// SAFETY: as for `Send`: shared access never overlaps a write.
unsafe impl Sync for Slots {}

impl Slots {
    /// `STEPS` slots of `slot_bytes` bytes, each byte `fill`.
    fn new(slot_bytes: usize, fill: u8) -> Option<Slots> {
        let len = slot_bytes.checked_mul(STEPS as usize)?;
        let raw = Box::into_raw(vec![fill; len].into_boxed_slice());
        let ptr = NonNull::new(raw.cast::<u8>())?;
        Some(Slots {
            ptr,
            len,
            slot_bytes,
        })
    }

    /// Where `slot`'s first `len` bytes are, or `None` beyond the slots.
    fn at(&self, slot: SlotIndex, len: usize) -> Option<usize> {
        let start = usize::from(slot.0).checked_mul(self.slot_bytes)?;
        let within = u64::from(slot.0) < STEPS && len <= self.slot_bytes;
        within.then_some(start)
    }

    /// The first `len` bytes of `slot`, to read.
    ///
    /// # Safety
    /// No `slot_mut` of the same slot may be alive while the result is.
    unsafe fn slot(&self, slot: SlotIndex, len: usize) -> Option<&[u8]> {
        let start = self.at(slot, len)?;
        // SAFETY: `start + len <= STEPS * slot_bytes = self.len` (checked
        // by `at`), inside the live allocation; no writer of this slot
        // exists meanwhile (the caller's promise).
        Some(unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(start), len) })
    }

    /// The first `len` bytes of `slot`, to write.
    ///
    /// # Safety
    /// No other reference to the same slot may be alive while the result
    /// is.
    #[expect(
        clippy::mut_from_ref,
        reason = "the slots are shared by design; the caller keeps borrows of one slot apart"
    )]
    unsafe fn slot_mut(&self, slot: SlotIndex, len: usize) -> Option<&mut [u8]> {
        let start = self.at(slot, len)?;
        // SAFETY: in bounds as in `slot`; exclusive by the caller's promise.
        Some(unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(start), len) })
    }

    /// A copy of every byte (tests, once the reader has stopped).
    #[cfg(test)]
    fn snapshot(&self) -> Vec<u8> {
        // SAFETY: the range is the whole allocation; the caller has joined
        // the reader thread, so nothing writes.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }.to_vec()
    }
}

impl Drop for Slots {
    fn drop(&mut self) {
        let raw = std::ptr::slice_from_raw_parts_mut(self.ptr.as_ptr(), self.len);
        // SAFETY: `raw` is exactly what `Box::into_raw` gave in `new`, and
        // it is freed only here.
        drop(unsafe { Box::from_raw(raw) });
    }
}

/// What the reader thread and the end share.
struct Inbox {
    slots: Slots,
    /// Published by the reader after a slice's bytes (release).
    tail: StepCounter,
    /// Posted by the consumer before its credit frame leaves (release).
    head: StepCounter,
    /// Call headers received, by the step they precede, in order.
    headers: Mutex<VecDeque<(u64, CallDesc)>>,
    /// Headers pushed so far (after the push; release).
    pushed: StepCounter,
    /// The reader's error, set once before `failed`.
    failure: Mutex<Option<Error>>,
    failed: AtomicBool,
    /// The sender closed its end in order, at a slice boundary.
    goodbye: AtomicBool,
    stop: AtomicBool,
    /// The rank's bell, rung after each of the above is published.
    bell: Arc<dyn Bell>,
}

/// The receiving end of one hop over TCP.
pub(super) struct TcpRecvEnd {
    inbox: Arc<Inbox>,
    /// The connection: credit frames leave here; shut down on drop.
    stream: TcpStream,
    thread: Option<JoinHandle<()>>,
    peer: Peer,
    timeout: Duration,
    tail_seen: u64,
    head_posted: u64,
    popped: u64,
    /// A failed credit write: the end takes no more.
    broken: Option<Error>,
}

impl TcpRecvEnd {
    /// Starts the reader on `stream` (the hop from `peer`), every slot
    /// byte first set to `fill` (tests use a guard pattern); credit
    /// writes time out after `timeout`.
    pub(super) fn start(
        stream: TcpStream,
        peer: Peer,
        geometry: FifoGeometry,
        timeout: Duration,
        fill: u8,
        bell: Arc<dyn Bell>,
    ) -> Result<TcpRecvEnd> {
        let slot_bytes = usize::try_from(geometry.slot_bytes())
            .map_err(|_| Error::BadConfig(format!("{NAME}: slots beyond memory")))?;
        let slots = Slots::new(slot_bytes, fill)
            .ok_or_else(|| Error::BadConfig(format!("{NAME}: slots beyond memory")))?;
        let setup = |call| move |e| transport_error(call, e);
        stream.set_nodelay(true).map_err(setup("set_nodelay"))?;
        stream
            .set_read_timeout(Some(READ_TICK))
            .map_err(setup("set_read_timeout"))?;
        stream
            .set_write_timeout(Some(timeout))
            .map_err(setup("set_write_timeout"))?;
        let inbox = Arc::new(Inbox {
            slots,
            tail: StepCounter::new(0),
            head: StepCounter::new(0),
            headers: Mutex::new(VecDeque::with_capacity(STEPS as usize + 1)),
            pushed: StepCounter::new(0),
            failure: Mutex::new(None),
            failed: AtomicBool::new(false),
            goodbye: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            bell,
        });
        let reader = Reader {
            inbox: Arc::clone(&inbox),
            stream: stream.try_clone().map_err(setup("dup"))?,
            peer,
            slot_bytes: geometry.slot_bytes(),
            next: 0,
            tail: 0,
            last_seq: 0,
            header_seq: None,
            header_at: None,
        };
        let thread = std::thread::Builder::new()
            .name(format!("ringcc-tcp-recv-r{}-c{}", peer.rank, peer.channel))
            .spawn(move || reader.run())
            .map_err(setup("spawn the reader thread"))?;
        Ok(TcpRecvEnd {
            inbox,
            stream,
            thread: Some(thread),
            peer,
            timeout,
            tail_seen: 0,
            head_posted: 0,
            popped: 0,
            broken: None,
        })
    }

    /// Says goodbye (best effort, briefly), shuts the connection down and
    /// joins the reader.
    fn stop(&mut self) {
        let Some(t) = self.thread.take() else {
            return;
        };
        self.inbox.stop.store(true, Ordering::Release);
        if self.broken.is_none() {
            let bye = FrameRepr::goodbye(self.head_posted).emit();
            let _ = self
                .stream
                .set_write_timeout(Some(GOODBYE_TIMEOUT))
                .and_then(|()| send(&self.stream, &bye));
        }
        // Wakes the reader blocked in `read` (it sees EOF); the peer's
        // credit reader sees EOF after the goodbye.
        let _ = self.stream.shutdown(Shutdown::Both);
        if t.join().is_err() {
            tracing::warn!(peer = %self.peer.rank, channel = %self.peer.channel,
                "tcp: the reader thread panicked");
        }
    }

    /// Stops the reader and copies every slot byte (tests' guard checks).
    #[cfg(test)]
    pub(super) fn stop_and_snapshot(&mut self) -> Vec<u8> {
        self.stop();
        self.inbox.slots.snapshot()
    }
}

impl Drop for TcpRecvEnd {
    fn drop(&mut self) {
        self.stop();
    }
}

impl RecvEnd for TcpRecvEnd {
    /// Headers come before the `Tail` that covers their step; a `Tail`
    /// stops at a header's step so that each is reported just where the
    /// sender put it. The reader's error comes once everything it
    /// received before has been reported, and stays. After the sender's
    /// goodbye nothing more comes, and nothing is reported.
    fn poll(&mut self) -> Result<Option<Event>> {
        if let Some(e) = &self.broken {
            return Err(e.duplicate());
        }
        // `failed` first: once it shows, every tail the reader published
        // is visible to the load below.
        let failed = self.inbox.failed.load(Ordering::Acquire);
        let tail = self.inbox.tail.load();
        if tail > self.tail_seen {
            if self.inbox.pushed.load() > self.popped {
                let mut q = self
                    .inbox
                    .headers
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                match q.front().copied() {
                    Some((step, desc)) if step <= self.tail_seen => {
                        q.pop_front();
                        self.popped = self.popped.saturating_add(1);
                        return Ok(Some(Event::Header { step, desc }));
                    }
                    Some((step, _)) if step < tail => {
                        self.tail_seen = step;
                        return Ok(Some(Event::Tail(step)));
                    }
                    _ => {}
                }
            }
            self.tail_seen = tail;
            return Ok(Some(Event::Tail(tail)));
        }
        if failed {
            let f = self
                .inbox
                .failure
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            return Err(match f.as_ref() {
                Some(e) => e.duplicate(),
                None => Error::Internal(format!("{NAME}: a reader failed without an error")),
            });
        }
        Ok(None)
    }

    fn slot(&self, slot: SlotIndex, len: usize) -> Result<&[u8]> {
        let bad = |e: crate::Error| Error::Transport {
            transport: NAME,
            call: "RecvEnd::slot",
            source: Box::new(e),
        };
        if u64::from(slot.0) >= STEPS {
            return Err(bad(crate::Error::NoSuchSlot {
                slot: u64::from(slot.0),
            }));
        }
        if len > self.inbox.slots.slot_bytes {
            return Err(bad(crate::Error::SlotOverflow {
                slot: u64::from(slot.0),
                len,
                capacity: self.inbox.slots.slot_bytes as u64,
            }));
        }
        // The slot must hold a step of `[head_posted, tail_seen)`.
        let first = slot_of(self.head_posted).0;
        let ahead = (u64::from(slot.0) + STEPS - u64::from(first)) % STEPS;
        if ahead >= self.tail_seen.saturating_sub(self.head_posted) {
            return Err(Error::Internal(format!(
                "{NAME}: slot {slot} read while it holds no received step \
                 (head {}, tail {})",
                self.head_posted, self.tail_seen
            )));
        }
        // SAFETY: the slot holds a step in `[head_posted, tail_seen)`; the
        // reader writes only steps `>= tail_seen` and `< head_posted +
        // STEPS`, never this slot (the module's doc), until `post_head`,
        // which needs `&mut self` and so outlives no borrow handed out here.
        unsafe { self.inbox.slots.slot(slot, len) }.ok_or_else(|| {
            bad(crate::Error::NoSuchSlot {
                slot: u64::from(slot.0),
            })
        })
    }

    fn post_head(&mut self, head: u64) -> Result<()> {
        if let Some(e) = &self.broken {
            return Err(e.duplicate());
        }
        if head < self.head_posted || head > self.tail_seen {
            return Err(Error::Internal(format!(
                "{NAME}: credit {head} outside [{}, {}] (head posted, tail seen)",
                self.head_posted, self.tail_seen
            )));
        }
        if head == self.head_posted {
            return Ok(());
        }
        // The reader may use the slots before the sender hears of them.
        self.inbox.head.post(head);
        self.head_posted = head;
        if self.inbox.goodbye.load(Ordering::Acquire) {
            // The sender has closed its end: nobody waits for the credit.
            return Ok(());
        }
        if let Err(e) = send(&self.stream, &FrameRepr::credit(head).emit()) {
            let e = self.peer.io(e, "write", self.timeout);
            self.broken = Some(e.duplicate());
            return Err(e);
        }
        Ok(())
    }
}

/// The reader thread's state: where the stream stands.
struct Reader {
    inbox: Arc<Inbox>,
    stream: TcpStream,
    peer: Peer,
    slot_bytes: u64,
    /// The step the next header or data frame must carry.
    next: u64,
    /// The tail published last.
    tail: u64,
    /// The highest call sequence number seen.
    last_seq: u64,
    /// The last call header's sequence number.
    header_seq: Option<u64>,
    /// The step of a header not yet followed by data.
    header_at: Option<u64>,
}

impl Reader {
    fn run(mut self) {
        if let Some(e) = self.serve() {
            tracing::debug!(peer = %self.peer.rank, channel = %self.peer.channel, error = %e,
                "tcp: reader stopped");
            *self
                .inbox
                .failure
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = Some(e);
            self.inbox.failed.store(true, Ordering::Release);
            self.inbox.bell.ring();
        }
    }

    /// Reads frames until the stream ends, breaks the protocol or is
    /// stopped (`None`).
    fn serve(&mut self) -> Option<Error> {
        let inbox = Arc::clone(&self.inbox);
        let stop = &inbox.stop;
        loop {
            let mut b = [0u8; FRAME_LEN];
            if let Err(f) = fill(&self.stream, &mut b, stop) {
                return self.peer.read_error(f, "frame header", FRAME_LEN);
            }
            let f = match FrameRepr::parse(&b) {
                Ok(f) => f,
                Err(e) => return Some(self.peer.protocol(format!("frame header: {e}"))),
            };
            if f.kind == Kind::Goodbye {
                return self.goodbye(&f);
            }
            if let Err(e) = self.check(&f) {
                return Some(e);
            }
            self.last_seq = f.seq;
            if f.kind == Kind::CallHeader {
                let mut h = [0u8; CALL_HEADER_LEN];
                if let Err(r) = fill(&self.stream, &mut h, stop) {
                    return self.peer.read_error(r, "call header", CALL_HEADER_LEN);
                }
                if let Err(e) = self.push_header(&f, &h) {
                    return Some(e);
                }
                continue;
            }
            // A data frame, checked: `len <= slot_bytes` and the step in
            // order and inside the window.
            let len = f.length as usize;
            // SAFETY: `f.step` is the next step (`>= tail` published) and
            // `< head + STEPS` for the head posted so far (`check`): the
            // consumer reads no step of this slot until the tail passes it
            // (the module's doc). Only this thread writes.
            let slot = unsafe { inbox.slots.slot_mut(slot_of(f.step), len) };
            let Some(slot) = slot else {
                return Some(self.peer.protocol(format!("data frame of {len} bytes")));
            };
            if let Err(r) = fill(&self.stream, slot, stop) {
                return self.peer.read_error(r, "data frame", len);
            }
            self.next = self.next.saturating_add(1);
            self.header_at = None;
            if f.last {
                self.tail = self.next;
                inbox.tail.post(self.next);
                inbox.bell.ring();
            }
        }
    }

    /// The sender's goodbye: fine at a slice boundary (`None`: the reader
    /// stops quietly), a lost peer in the middle of one.
    fn goodbye(&self, f: &FrameRepr) -> Option<Error> {
        if f.length != 0 || f.last || f.step != self.next {
            return Some(self.peer.protocol(format!(
                "a goodbye at step {} of {} bytes (next step {})",
                f.step, f.length, self.next
            )));
        }
        if self.header_at.is_some() || self.tail != self.next {
            return Some(self.peer.gone(format!(
                "it closed its end in the middle of a slice (step {}, tail {})",
                self.next, self.tail
            )));
        }
        tracing::debug!(peer = %self.peer.rank, channel = %self.peer.channel, step = f.step,
            "tcp: the sender closed its end");
        self.inbox.goodbye.store(true, Ordering::Release);
        self.inbox.bell.ring();
        None
    }

    /// Whether a frame may be taken, before any of its payload is read.
    fn check(&self, f: &FrameRepr) -> Result<()> {
        let p = &self.peer;
        match f.kind {
            Kind::CallHeader if f.length as usize != CALL_HEADER_LEN => {
                return Err(p.protocol(format!(
                    "a call header frame of {} bytes (not {CALL_HEADER_LEN})",
                    f.length
                )))
            }
            Kind::CallHeader if f.last => {
                return Err(p.protocol("a call header frame flagged as a slice's last"))
            }
            Kind::CallHeader if self.header_at == Some(f.step) => {
                return Err(p.protocol(format!("a second call header for step {}", f.step)))
            }
            Kind::CallHeader if self.header_seq.is_some_and(|s| f.seq <= s) => {
                return Err(p.protocol(format!(
                    "call header of call {} after one of call {}",
                    f.seq,
                    self.header_seq.unwrap_or(0)
                )))
            }
            Kind::CallHeader => {}
            Kind::Data if u64::from(f.length) > self.slot_bytes => {
                return Err(p.protocol(format!(
                    "a data frame of {} bytes for {}-byte slots",
                    f.length, self.slot_bytes
                )))
            }
            Kind::Data => {}
            Kind::Credit => return Err(p.protocol("a credit frame from the sender")),
            Kind::Goodbye => return Err(p.protocol("a goodbye with a payload")),
            Kind::Unknown(c) => return Err(p.protocol(format!("unknown frame kind {c}"))),
        }
        if f.step != self.next {
            return Err(p.protocol(format!(
                "step {} out of order (expected step {})",
                f.step, self.next
            )));
        }
        let head = self.inbox.head.load();
        if head.checked_add(STEPS).is_none_or(|end| f.step >= end) {
            return Err(p.protocol(format!(
                "step {} outside the window (head {head}, {STEPS} slots)",
                f.step
            )));
        }
        if f.seq < self.last_seq {
            return Err(p.protocol(format!(
                "call sequence went back from {} to {}",
                self.last_seq, f.seq
            )));
        }
        Ok(())
    }

    /// Parses a call header and queues it for `poll`.
    fn push_header(&mut self, f: &FrameRepr, h: &[u8; CALL_HEADER_LEN]) -> Result<()> {
        let repr =
            CallHeaderRepr::parse(&CallHeader::new_unchecked(&h[..])).map_err(|e| Error::Core {
                channel: Some(self.peer.channel),
                call: "CallHeaderRepr::parse",
                source: ringcc_core::Error::Wire(e),
            })?;
        if repr.desc.seq != f.seq || u64::from(repr.step) != f.step & 0xffff_ffff {
            return Err(self.peer.protocol(format!(
                "call header of call {} at step {} in a frame of call {} at step {}",
                repr.desc.seq, repr.step, f.seq, f.step
            )));
        }
        self.inbox
            .headers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push_back((f.step, repr.desc));
        self.inbox
            .pushed
            .post(self.inbox.pushed.load().saturating_add(1));
        self.header_seq = Some(f.seq);
        self.header_at = Some(f.step);
        Ok(())
    }
}
