//! What the transports over memory both ends map (shared memory, CUDA
//! IPC) need of the other end: a cheap look at whether its process still
//! lives, and the call header its mailbox carries as the engine's event.

use std::time::Duration;

use ringcc_core::progress::Event;
use ringcc_core::wire::call_header::{CallHeader, CallHeaderRepr};
use ringcc_core::{ChannelId, Rank};

use crate::{Error, Result};

/// Idle polls between two looks at the clock.
const LIVENESS_POLLS: u32 = 16;
/// The least time between two looks at the process table.
const LIVENESS_EVERY: Duration = Duration::from_millis(200);

/// This process's PID namespace (`/proc/self/ns/pid`'s target; empty
/// where it cannot be read), which a transport publishes so two ranks
/// know whether each other's pids mean anything to them.
pub fn pid_namespace() -> String {
    std::fs::read_link("/proc/self/ns/pid")
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Whether process `pid` is gone: exited, or a zombie not yet reaped (a
/// `kill -9`'d rank whose parent has not waited for it yet).
pub fn process_gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(s) => s
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state == "Z" || state == "X"),
    }
}

/// The other end of a hop — its rank and channel for errors, its process
/// when this rank can see it — with a look at that process now and then,
/// so a killed peer fails the wait at once instead of at the deadline.
#[derive(Debug)]
pub struct PeerProcess {
    transport: &'static str,
    /// The peer's rank.
    pub rank: Rank,
    /// The hop's channel.
    pub channel: ChannelId,
    /// The peer's process id, where it is in this PID namespace.
    pub pid: Option<u32>,
    idle: u32,
    /// When the process was last looked at (coarse clock, ns).
    last_look: u64,
    /// A receiving end's last `tail` reported.
    tail_seen: u64,
    /// A receiving end's last mailbox sequence (header step + 1) reported.
    header_seen: u64,
    /// A sending end's last `head` reported.
    head_seen: u64,
}

impl PeerProcess {
    /// The peer `rank` on `channel` of a `transport` hop; `pid` where it
    /// can be watched.
    pub fn new(
        transport: &'static str,
        rank: Rank,
        channel: ChannelId,
        pid: Option<u32>,
    ) -> PeerProcess {
        PeerProcess {
            transport,
            rank,
            channel,
            pid,
            idle: 0,
            last_look: crate::clock::coarse_nanos(),
            tail_seen: 0,
            header_seen: 0,
            head_seen: 0,
        }
    }

    /// A receiving end's last `tail` reported: the next step it waits for.
    pub fn tail_seen(&self) -> u64 {
        self.tail_seen
    }

    /// The peer did something: the idle count starts over.
    pub fn seen(&mut self) {
        self.idle = 0;
    }

    /// A receiving end's next event, its FIFO's `tail` reading `tail`
    /// (loaded with acquire, which makes the mailbox written before it
    /// visible): the call header when the mailbox (`seq()`: its sequence
    /// word, `header()`: its bytes) holds a new one for a step below
    /// `tail`, else the new `tail`; none (after an idle look at the
    /// peer's process) when nothing moved.
    pub fn poll_tail<H: AsRef<[u8]>>(
        &mut self,
        tail: u64,
        seq: impl FnOnce() -> u64,
        header: impl FnOnce() -> H,
    ) -> Result<Option<Event>> {
        if tail > self.tail_seen {
            self.seen();
            let seq = seq();
            if seq != self.header_seen && seq != 0 && seq - 1 < tail {
                self.header_seen = seq;
                return self.header_event(seq, header().as_ref()).map(Some);
            }
            self.tail_seen = tail;
            return Ok(Some(Event::Tail(tail)));
        }
        self.idle_check()?;
        Ok(None)
    }

    /// A sending end's next event, the receiver's `head` reading `head`:
    /// the new `head`, or none (after an idle look at the peer's process).
    pub fn poll_head(&mut self, head: u64) -> Result<Option<Event>> {
        if head > self.head_seen {
            self.seen();
            self.head_seen = head;
            return Ok(Some(Event::Head(head)));
        }
        self.idle_check()?;
        Ok(None)
    }

    /// Counts an idle poll: on the first after news, and every
    /// `LIVENESS_POLLS`-th, at most every `LIVENESS_EVERY`, looks at the
    /// peer's process ([`check_now`](PeerProcess::check_now)).
    pub fn idle_check(&mut self) -> Result<()> {
        self.idle = self.idle.wrapping_add(1);
        if !self.idle.is_multiple_of(LIVENESS_POLLS) && self.idle > 1 {
            return Ok(());
        }
        let now = crate::clock::coarse_nanos();
        if Duration::from_nanos(now.saturating_sub(self.last_look)) < LIVENESS_EVERY {
            return Ok(());
        }
        self.last_look = now;
        self.check_now()
    }

    /// [`Error::PeerGone`] if the peer's process has exited.
    pub fn check_now(&self) -> Result<()> {
        match self.pid {
            Some(pid) if process_gone(pid) => Err(Error::PeerGone {
                transport: self.transport,
                peer: self.rank,
                channel: self.channel,
                reason: format!("its process {pid} has exited"),
            }),
            _ => Ok(()),
        }
    }

    /// The engine's event for the call header in a mailbox whose sequence
    /// word reads `seq` (the header's step + 1): `bytes` parsed, a
    /// malformed header a typed core error on this hop's channel.
    pub fn header_event(&self, seq: u64, bytes: &[u8]) -> Result<Event> {
        let repr =
            CallHeaderRepr::parse(&CallHeader::new_unchecked(bytes)).map_err(|e| Error::Core {
                channel: Some(self.channel),
                call: "CallHeaderRepr::parse",
                source: ringcc_core::Error::Wire(e),
            })?;
        Ok(Event::Header {
            step: seq - 1,
            desc: repr.desc,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_lives_and_a_reaped_child_is_gone() {
        assert!(!process_gone(std::process::id()));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        assert!(process_gone(pid));
        let p = PeerProcess::new("shm", Rank(1), ChannelId(2), Some(pid));
        match p.check_now() {
            Err(Error::PeerGone {
                transport: "shm",
                peer: Rank(1),
                channel: ChannelId(2),
                ..
            }) => {}
            other => panic!("{other:?}"),
        }
        assert!(PeerProcess::new("shm", Rank(1), ChannelId(0), None)
            .check_now()
            .is_ok());
    }

    #[test]
    fn a_zombie_is_gone() {
        let child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        // Not waited for: a zombie once it has exited.
        let t0 = std::time::Instant::now();
        while !process_gone(pid) {
            assert!(t0.elapsed() < Duration::from_secs(10), "never seen gone");
            std::thread::sleep(Duration::from_millis(5));
        }
        drop(child);
    }

    #[test]
    fn a_malformed_header_is_a_core_error_on_the_channel() {
        let p = PeerProcess::new("shm", Rank(0), ChannelId(3), None);
        match p.header_event(1, &[0xff; 8]) {
            Err(Error::Core {
                channel: Some(ChannelId(3)),
                ..
            }) => {}
            other => panic!("{other:?}"),
        }
    }
}
