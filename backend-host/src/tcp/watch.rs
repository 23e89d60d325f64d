//! An end's watcher: a thread that, once its end has been idle a while,
//! waits in `poll(2)` for the end's socket and, when the socket becomes
//! ready, tells the end and rings the rank's bell — so that a rank asleep
//! on its bell wakes for TCP traffic, and an idle end costs its drive
//! thread no system call.
//!
//! The data path needs no thread: the drive thread reads and writes the
//! sockets itself, without blocking, in the ends' `poll` and `post`. The
//! watcher stands in only for an end that has found nothing to do for
//! [`ARM_AFTER`] (the drive loop spins, yields and naps for longer than
//! that before it sleeps on the bell; a busy transfer never waits that
//! long, so it costs no wake-up per frame): armed, it fires once, and the
//! end skips its socket until then ([`Watch::armed`]).
//!
//! The lost-wake-up race is closed as the bell's handshake closes it: the
//! rank arms its bell, polls every end (an idle end arms its watcher
//! then, at the latest), and sleeps; bytes that arrive after the end's
//! last read make the socket ready, which `poll(2)` reports however late
//! the watcher gets there.

use std::io;
use std::net::TcpStream;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ringcc_comm::transport::Bell;
use rustix::event::{eventfd, poll, EventfdFlags, PollFd, PollFlags};
use rustix::io::Errno;

/// How long an end finds nothing to do before its watcher is armed:
/// longer than the gaps of a busy transfer (each arming costs the
/// watcher a wake-up), shorter than the drive loop's spinning, yielding
/// and napping before it sleeps on the bell (a millisecond or more).
pub(super) const ARM_AFTER: Duration = Duration::from_micros(500);

/// Idle calls between two looks at the clock.
const CLOCK_EVERY: u32 = 8;

/// The watcher waits for its end to arm it; the end reads its socket.
const IDLE: u8 = 0;
/// The watcher waits for the socket; the end skips it.
const ARMED: u8 = 1;
/// The socket became ready: the end reads it again.
const FIRED: u8 = 2;
/// The watcher ends.
const STOP: u8 = 3;

/// What an end and its watcher share.
#[derive(Debug)]
struct Shared {
    state: AtomicU8,
    /// Also wait for room to write (the end has bytes queued).
    out: AtomicBool,
    stream: Arc<TcpStream>,
    /// An eventfd that makes the watcher look at `state` and `out` again.
    kick: OwnedFd,
    bell: Arc<dyn Bell>,
}

impl Shared {
    fn kick(&self) {
        // An eventfd write fails only when the counter would overflow, and
        // then it is non-zero: the watcher wakes anyway.
        let _ = rustix::io::write(&self.kick, &1u64.to_ne_bytes());
    }
}

/// One end's watcher thread; stopped (and joined) by [`Watch::stop`] or
/// on drop.
#[derive(Debug)]
pub(super) struct Watch {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    /// Since when the end has found nothing to do.
    idle_since: Option<Instant>,
    /// Idle calls since the clock was last read.
    idle_calls: u32,
}

impl Watch {
    /// Starts the watcher of `stream`, ringing `bell`; `name` names the
    /// thread.
    pub(super) fn start(
        stream: Arc<TcpStream>,
        bell: Arc<dyn Bell>,
        name: String,
    ) -> io::Result<Watch> {
        let kick = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?;
        let shared = Arc::new(Shared {
            state: AtomicU8::new(IDLE),
            out: AtomicBool::new(false),
            stream,
            kick,
            bell,
        });
        let s = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name(name)
            .spawn(move || run(&s))?;
        Ok(Watch {
            shared,
            thread: Some(thread),
            idle_since: None,
            idle_calls: 0,
        })
    }

    /// The end moved (read, wrote, reported, was given work): no need to
    /// watch; an armed watcher is called off (it may have to wait for
    /// other things the next time).
    pub(super) fn busy(&mut self) {
        self.idle_since = None;
        let s = &self.shared;
        if s.state.load(Ordering::Acquire) == ARMED
            && s.state
                .compare_exchange(ARMED, IDLE, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            s.kick();
        }
    }

    /// The watcher waits for the socket: nothing has come since the end
    /// last found it empty (but what arrived while the watcher was on its
    /// way), so the end need not look.
    pub(super) fn armed(&self) -> bool {
        self.shared.state.load(Ordering::Acquire) == ARMED
    }

    /// The end found nothing to do; `out`: it has bytes that wait for
    /// room in the socket. Arms the watcher once this has lasted
    /// [`ARM_AFTER`].
    pub(super) fn idle(&mut self, out: bool) {
        // The clock is read once in a while: a drive loop polls its ends
        // every microsecond or so.
        self.idle_calls = self.idle_calls.wrapping_add(1);
        if self.idle_since.is_some() && !self.idle_calls.is_multiple_of(CLOCK_EVERY) {
            return;
        }
        let now = Instant::now();
        let since = *self.idle_since.get_or_insert(now);
        if now.duration_since(since) < ARM_AFTER {
            return;
        }
        let s = &self.shared;
        match s.state.load(Ordering::Acquire) {
            IDLE | FIRED => {
                s.out.store(out, Ordering::Relaxed);
                s.state.store(ARMED, Ordering::Release);
                if let Some(t) = &self.thread {
                    t.thread().unpark();
                }
            }
            // Armed for reading only while bytes now wait to be written:
            // make it poll for room too.
            ARMED if out && !s.out.load(Ordering::Relaxed) => {
                s.out.store(true, Ordering::Relaxed);
                s.kick();
            }
            _ => {}
        }
    }

    /// Stops and joins the watcher.
    pub(super) fn stop(&mut self) {
        let Some(t) = self.thread.take() else {
            return;
        };
        self.shared.state.store(STOP, Ordering::Release);
        self.shared.kick();
        t.thread().unpark();
        if t.join().is_err() {
            tracing::warn!("tcp: a watcher thread panicked");
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The watcher thread.
fn run(s: &Shared) {
    loop {
        match s.state.load(Ordering::Acquire) {
            STOP => return,
            ARMED => {}
            _ => {
                std::thread::park();
                continue;
            }
        }
        let mut want = PollFlags::IN | PollFlags::RDHUP;
        if s.out.load(Ordering::Relaxed) {
            want |= PollFlags::OUT;
        }
        let mut fds = [
            PollFd::new(&*s.stream, want),
            PollFd::new(&s.kick, PollFlags::IN),
        ];
        match poll(&mut fds, None) {
            Ok(_) | Err(Errno::INTR) => {}
            Err(e) => {
                // Never seen (the descriptors live as long as the thread):
                // wake the rank, which finds whatever is wrong itself.
                tracing::warn!(error = %e, "tcp: a watcher's poll failed");
                if s.state
                    .compare_exchange(ARMED, FIRED, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    s.bell.ring();
                }
                continue;
            }
        }
        let [sock, kick] = &fds;
        let ready = !sock.revents().is_empty();
        if !kick.revents().is_empty() {
            let _ = rustix::io::read(&s.kick, &mut [0u8; 8]);
        }
        if ready
            && s.state
                .compare_exchange(ARMED, FIRED, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            s.bell.ring();
        }
    }
}
