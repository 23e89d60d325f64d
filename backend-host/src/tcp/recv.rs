//! The receiving end: the drive thread reads the stream itself, without
//! blocking, in [`RecvEnd::poll`] — frame headers and small payloads
//! through a read-ahead buffer (one `recv` brings many small frames), the
//! rest of a large payload straight into its slot — and writes credit
//! frames from [`RecvEnd::post_head`]. The frames are checked by
//! `inbound`; a watcher (`watch`) wakes a rank asleep on its bell.
//!
//! The slots belong to the end: `poll` (`&mut self`) writes them, `slot`
//! (`&self`) lends them, so a lent slot is never written. `slot` lends
//! only steps in `[head_posted, tail_seen)`, which the stream cannot
//! overwrite before `post_head` moves the window (`inbound`'s checks).

use std::collections::VecDeque;
use std::io::IoSlice;
use std::net::{Shutdown, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ringcc_comm::transport::{Bell, Landing, NoLanding, RecvEnd};
use ringcc_comm::{Error, Result};
use ringcc_core::fifo::{slot_of, FifoGeometry, STEPS};
use ringcc_core::progress::Event;
use ringcc_core::SlotIndex;

use super::frame::{FrameRepr, FRAME_LEN};
use super::inbound::{Direct, Inbound};
use super::io::{recv_now, send, send_now, Peer, ReadFail, GOODBYE_TIMEOUT};
use super::watch::Watch;
use super::NAME;

/// Bytes of the read-ahead buffer: whole frames of small slices, and the
/// first bytes of a large payload, arrive through it.
const READ_AHEAD: usize = 8 << 10;

/// A payload rest at least this long is read straight into its slot
/// (shorter ones come through the read-ahead buffer, with the frames
/// behind them).
const DIRECT: usize = 2 << 10;

/// The receiving end of one hop over TCP.
pub(super) struct TcpRecvEnd {
    stream: Arc<TcpStream>,
    watch: Watch,
    peer: Peer,
    timeout: Duration,
    slot_bytes: usize,
    /// `STEPS` slots of `slot_bytes`.
    slots: Box<[u8]>,
    inbound: Inbound,
    /// Bytes read ahead; `ahead[at..end]` are not taken yet.
    ahead: Box<[u8]>,
    at: usize,
    end: usize,
    /// The stream's first failure, reported once everything that came
    /// before it has been.
    failure: Option<Error>,
    tail_seen: u64,
    head_posted: u64,
    /// The credit frame being written: `credit[credit_at..]` is still to
    /// go (nothing when `credit_at == FRAME_LEN`).
    credit: [u8; FRAME_LEN],
    credit_at: usize,
    /// A newer head to send (once the frame being written is out).
    credit_due: Option<u64>,
    /// The due credit may wait for the next: the call receives again
    /// (`post_credit`'s `more`).
    credit_held: bool,
    /// The last read took less than it had room for (the socket was
    /// empty after it) and everything it brought may since have been
    /// reported: the next poll with nothing buffered reads no sooner
    /// than the one after it.
    short_read: bool,
    /// Reads attempted (tests count the system calls a poll makes).
    #[cfg(test)]
    pub(super) reads: u64,
    /// The head of the last credit frame begun.
    credit_sent: u64,
    /// Since when credit waits for room in the socket.
    stuck_since: Option<Instant>,
    /// A failed credit write: the end takes no more.
    broken: Option<Error>,
    /// Said goodbye and shut down.
    stopped: bool,
}

impl TcpRecvEnd {
    /// The end of `stream` (the hop from `peer`), every slot byte first
    /// set to `fill` (tests use a guard pattern); a credit write that
    /// makes no progress for `timeout` fails.
    pub(super) fn start(
        stream: TcpStream,
        peer: Peer,
        geometry: FifoGeometry,
        timeout: Duration,
        fill: u8,
        bell: Arc<dyn Bell>,
    ) -> Result<TcpRecvEnd> {
        let super::Opened {
            stream,
            watch,
            slot_bytes,
            fifo_bytes: len,
        } = super::open_end(stream, &peer, geometry, bell, "recv")?;
        Ok(TcpRecvEnd {
            stream,
            watch,
            peer,
            timeout,
            slot_bytes,
            slots: vec![fill; len].into_boxed_slice(),
            inbound: Inbound::new(peer, slot_bytes),
            ahead: vec![0; READ_AHEAD].into_boxed_slice(),
            at: 0,
            end: 0,
            failure: None,
            tail_seen: 0,
            head_posted: 0,
            credit: [0; FRAME_LEN],
            credit_at: FRAME_LEN,
            credit_due: None,
            credit_held: false,
            short_read: false,
            #[cfg(test)]
            reads: 0,
            credit_sent: 0,
            stuck_since: None,
            broken: None,
            stopped: false,
        })
    }

    /// The next event for `poll`, from what has arrived: headers come
    /// before the `Tail` that covers their step; a `Tail` stops at a
    /// header's step so that each is reported just where the sender put
    /// it.
    fn report(&mut self) -> Option<Event> {
        let tail = self.inbound.tail();
        if tail <= self.tail_seen {
            return None;
        }
        let q: &mut VecDeque<_> = self.inbound.headers();
        match q.front().copied() {
            Some((step, desc)) if step <= self.tail_seen => {
                q.pop_front();
                return Some(Event::Header { step, desc });
            }
            Some((step, _)) if step < tail => {
                self.tail_seen = step;
                return Some(Event::Tail(step));
            }
            _ => {}
        }
        self.tail_seen = tail;
        Some(Event::Tail(tail))
    }

    /// Reads and takes what the socket holds until the tail moves, the
    /// sender says goodbye or nothing more is there: whether anything
    /// was read, and whether the socket was found empty.
    fn pump(&mut self, landing: &mut dyn Landing) -> Result<(bool, bool)> {
        let tail = self.inbound.tail();
        let mut moved = false;
        loop {
            let buffered = self.ahead.get(self.at..self.end).unwrap_or_default();
            let used = self
                .inbound
                .take(buffered, &mut self.slots, self.head_posted, landing)?;
            self.at += used;
            if self.at == self.end {
                self.at = 0;
                self.end = 0;
            }
            if self.inbound.tail() > tail || self.inbound.closed() {
                return Ok((true, false));
            }
            if self.short_read && moved {
                // The socket was empty after this pump's read.
                return Ok((true, true));
            }
            let direct = self.inbound.direct(DIRECT).filter(|_| self.at == self.end);
            let is_direct = direct.is_some();
            let dst = match direct {
                // Everything buffered was taken: the payload's rest comes
                // next in the stream.
                Some(Direct::Slot(range)) => self.slots.get_mut(range).unwrap_or_default(),
                Some(Direct::Landed {
                    call,
                    step,
                    len,
                    got,
                }) => landing
                    .dest(&call, step, len)
                    .and_then(|d| d.get_mut(got..))
                    .unwrap_or_default(),
                None => {
                    // The start of a frame header: to the front.
                    self.ahead.copy_within(self.at..self.end, 0);
                    self.end -= self.at;
                    self.at = 0;
                    // Large slices: read just up to the end of the header
                    // (or call header), so that the payload behind it is
                    // read where it goes, not through this buffer.
                    let room = if self.inbound.last_data() >= DIRECT {
                        self.inbound.owed().saturating_sub(self.end).max(1)
                    } else {
                        READ_AHEAD
                    };
                    let to = self.end.saturating_add(room).min(READ_AHEAD);
                    self.ahead.get_mut(self.end..to).unwrap_or_default()
                }
            };
            if dst.is_empty() {
                return Err(Error::Internal(format!("{NAME}: a read into no room")));
            }
            let room = dst.len();
            self.short_read = false;
            #[cfg(test)]
            {
                self.reads += 1;
            }
            match recv_now(&self.stream, dst) {
                Ok(None) => return Ok((moved, true)),
                Ok(Some(0)) => return Err(self.inbound.eof(self.end - self.at)),
                Ok(Some(n)) if is_direct => self.inbound.took_direct(n),
                Ok(Some(n)) => {
                    // A payload read where it goes is often short while
                    // the rest is on its way: only the read-ahead
                    // buffer's short reads say the socket was empty.
                    self.short_read = n < room;
                    self.end += n;
                }
                Err(e) => return Err(self.peer.read_error(ReadFail::Io(e), "frame", 0)),
            }
            moved = true;
        }
    }

    /// Writes what credit is due without blocking: whether anything
    /// went. Credit that makes no progress for the timeout breaks the end.
    fn flush_credit(&mut self) -> Result<bool> {
        let mut moved = false;
        loop {
            if self.credit_at == FRAME_LEN {
                let Some(head) = self.credit_due.take() else {
                    self.stuck_since = None;
                    return Ok(moved);
                };
                FrameRepr::credit(head).emit_into(&mut self.credit);
                self.credit_at = 0;
                self.credit_sent = head;
            }
            let rest = self.credit.get(self.credit_at..).unwrap_or_default();
            let sent = send_now(&self.stream, &[IoSlice::new(rest)]);
            match sent {
                Ok(0) => {
                    self.stuck_since.get_or_insert_with(Instant::now);
                    self.check_credit_stuck()?;
                    return Ok(moved);
                }
                Ok(n) => {
                    self.credit_at += n;
                    self.stuck_since = None;
                    moved = true;
                }
                Err(e) => return Err(self.break_with(e, Duration::ZERO)),
            }
        }
    }

    /// Credit that has waited for room in the socket for the timeout
    /// breaks the end.
    fn check_credit_stuck(&mut self) -> Result<()> {
        let Some(since) = self.stuck_since.filter(|_| self.credit_at < FRAME_LEN) else {
            return Ok(());
        };
        let waited = since.elapsed();
        if waited < self.timeout {
            return Ok(());
        }
        let e = std::io::Error::from(std::io::ErrorKind::TimedOut);
        Err(self.break_with(e, waited))
    }

    /// A failed credit write: the end is broken for good.
    fn break_with(&mut self, e: std::io::Error, after: Duration) -> Error {
        let e = self.peer.io(e, "write", after);
        self.broken = Some(e.duplicate());
        e
    }

    /// Says goodbye (best effort, briefly, after the credit frame being
    /// written), shuts the connection down and stops the watcher.
    fn stop(&mut self) {
        if std::mem::replace(&mut self.stopped, true) {
            return;
        }
        self.watch.stop();
        if self.broken.is_none() {
            let rest = self.credit.get(self.credit_at..).unwrap_or_default();
            // Credit that waited goes first: the sender learns what was
            // consumed.
            let due = self.credit_due.map(|h| FrameRepr::credit(h).emit());
            let bye = FrameRepr::goodbye(self.head_posted).emit();
            let _ = self
                .stream
                .set_write_timeout(Some(GOODBYE_TIMEOUT))
                .and_then(|()| send(&self.stream, rest))
                .and_then(|()| due.map_or(Ok(()), |d| send(&self.stream, &d)))
                .and_then(|()| send(&self.stream, &bye));
        }
        // The peer's credit reader sees EOF after the goodbye.
        let _ = self.stream.shutdown(Shutdown::Both);
    }

    /// Stops the end and copies every slot byte (tests' guard checks).
    #[cfg(test)]
    pub(super) fn stop_and_snapshot(&mut self) -> Vec<u8> {
        self.stop();
        self.slots.to_vec()
    }
}

impl Drop for TcpRecvEnd {
    fn drop(&mut self) {
        self.stop();
    }
}

impl RecvEnd for TcpRecvEnd {
    /// Reads what the stream holds (unless the end is idle and its
    /// watcher waits for the socket), and writes credit that waited.
    /// Headers come before the `Tail` that covers their step. The
    /// stream's error comes once everything received before it has been
    /// reported, and stays. After the sender's goodbye nothing more
    /// comes, and nothing is reported.
    fn poll(&mut self) -> Result<Option<Event>> {
        self.poll_landing(&mut NoLanding)
    }

    fn lands(&self) -> bool {
        true
    }

    /// [`poll`](RecvEnd::poll), reading each payload the call takes
    /// unchanged straight into its output (decided when its frame header
    /// is checked; the slot of such a step is left alone).
    fn poll_landing(&mut self, landing: &mut dyn Landing) -> Result<Option<Event>> {
        if let Some(e) = &self.broken {
            return Err(e.duplicate());
        }
        if let Some(ev) = self.report() {
            self.watch.busy();
            return Ok(Some(ev));
        }
        if let Some(e) = &self.failure {
            return Err(e.duplicate());
        }
        if self.inbound.closed() {
            return Ok(None);
        }
        if self.watch.armed() {
            // Nothing came since the last read: the watcher waits for it.
            self.check_credit_stuck()?;
            return Ok(None);
        }
        // The socket was empty after the last read and its bytes are all
        // reported: a read now would most likely find nothing (a system
        // call on a small call's critical path, before the engine acts on
        // what came). This poll skips it, as if it had found nothing; the
        // next one reads.
        let skip = std::mem::take(&mut self.short_read) && self.at == self.end;
        // Credit goes out once the stream pauses (below), so that a burst
        // of slices is credited by one frame; a frame begun is finished.
        let mut moved = self.credit_at < FRAME_LEN && self.flush_credit()?;
        let pumped = if skip {
            Ok((false, true))
        } else {
            self.pump(landing)
        };
        match pumped {
            Ok((m, drained)) => {
                moved |= m;
                if drained && self.credit_due.is_some() && !self.credit_held {
                    moved |= self.flush_credit()?;
                }
            }
            Err(e) => {
                tracing::debug!(peer = %self.peer.rank, channel = %self.peer.channel,
                    error = %e, "tcp: the stream failed");
                self.failure = Some(e);
            }
        }
        if let Some(ev) = self.report() {
            self.watch.busy();
            return Ok(Some(ev));
        }
        if let Some(e) = &self.failure {
            return Err(e.duplicate());
        }
        if moved {
            self.watch.busy();
        } else if !self.inbound.closed() && !skip {
            self.watch.idle(self.credit_at < FRAME_LEN);
        }
        Ok(None)
    }

    fn slot(&self, slot: SlotIndex, len: usize) -> Result<&[u8]> {
        let range = super::slot_bytes_of(
            "RecvEnd::slot",
            slot,
            len,
            self.slot_bytes,
            self.slots.len(),
        )?;
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
        Ok(&self.slots[range])
    }

    /// Returns credit: at once when nothing past `head` has come (the
    /// call's last credit, or the sender waits for it), else with the
    /// next credit, at the latest from the next `poll` that finds the
    /// stream paused or once half the window waits for it — so that a
    /// burst of slices is credited by one frame.
    fn post_head(&mut self, head: u64) -> Result<()> {
        self.post_credit(head, false)
    }

    /// `post_head`; while the call receives again (`more`) the credit
    /// waits for a later one even with nothing in flight — up to half
    /// the window, which the sender may need — since that later credit
    /// covers it: an 8 B AllReduce of 2 ranks sends one credit frame per
    /// call instead of two.
    fn post_credit(&mut self, head: u64, more: bool) -> Result<()> {
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
        self.head_posted = head;
        if self.inbound.closed() {
            // The sender has closed its end: nobody waits for the credit.
            return Ok(());
        }
        self.credit_due = Some(head);
        self.credit_held = more;
        self.watch.busy();
        // While more of this call's slices are on their way (bytes past
        // `head` came), the credit may wait for the next `post_head` or
        // for a `poll` that finds the stream paused: the engine polls
        // until those slices are in. Else (this call's last credit, or the
        // sender waits for it) it goes now, as when half the window waits.
        let more =
            more || self.inbound.tail() > head || self.inbound.mid_frame() || self.end > self.at;
        if !more || head - self.credit_sent >= STEPS / 2 {
            self.flush_credit()?;
        }
        Ok(())
    }
}
