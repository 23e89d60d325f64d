//! The shared-memory transport: the ranks of one host, one process each,
//! joined channel by channel through [`Segment`]s, each rank's call driven
//! by the core's progress [`Engine`].
//!
//! Every rank owns, per channel, the segment its ring predecessor writes
//! into (its *inbox*) and opens its successor's (its *outbox*). What this
//! module keeps is the transport alone:
//!
//! - an [`Action::Exec`] reads the slice from the inbox's slots, reduces
//!   or copies it with the caller's buffers (the core's
//!   [`slice_result`]), writes the output, and writes the result into the
//!   outbox's slots: the call header first (the mailbox, on a call's first
//!   slice), then the bytes, then the outbox's `tail` (release);
//! - [`Action::ReturnCredit`] posts the inbox's `head`;
//! - events are what the counters show that was not reported yet: the
//!   predecessor's header and `tail` (acquire), the successor's `head`;
//!   an exec is done when it returns (the copies are synchronous).
//!
//! Waits spin briefly, then nap; the engine's deadline (wall-clock
//! nanoseconds) bounds every call, and a peer that stops moving its
//! counters is reported by the engine's stall report.
//!
//! Segments are named by the job token (see [`SegmentName`]) and unlinked
//! as soon as the peer has mapped them, during [`ShmRank::connect`]: a
//! crashed job leaves no names behind once it has connected.

use std::time::{Duration, Instant};

use ringcc_core::fifo::{slot_of, FifoGeometry};
use ringcc_core::prim::{slice_result, Action, Exec};
use ringcc_core::progress::{Channel, Engine, Event};
use ringcc_core::topology::InOrderRing;
use ringcc_core::wire::call_header::{CallHeader, CallHeaderRepr};
use ringcc_core::{Call, ChannelId, Primitive, Rank};

use crate::error::{Error, Result};
use crate::{Segment, SegmentName};

/// How a shared-memory rank is set up. Every rank of a job must use the
/// same values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShmConfig {
    /// Channels (rings), `1..=64`.
    pub channels: u8,
    /// The FIFO of every connection.
    pub geometry: FifoGeometry,
    /// The plan's chunk (bytes per rank and step, before the last loop
    /// shrinks it).
    pub chunk_bytes: u64,
    /// A call (and the connection at start) fails when nothing moves for
    /// this long.
    pub timeout: Duration,
    /// Idle polls spent spinning and then yielding the core before a wait
    /// starts to nap.
    pub spin: u32,
}

impl Default for ShmConfig {
    /// Two channels, 128 KiB slots with one slot per slice (1 MiB of FIFO
    /// per connection), 512 KiB chunks (half the FIFO, as NCCL's Simple
    /// protocol), a 30 s deadline.
    fn default() -> Self {
        ShmConfig {
            channels: 2,
            geometry: FifoGeometry::new(128 << 10, 1).unwrap_or_default(),
            chunk_bytes: 512 << 10,
            timeout: Duration::from_secs(30),
            spin: 2000,
        }
    }
}

/// Idle polls that only spin (a peer's counter typically moves within
/// them when every rank has a core), before a wait yields the core.
const SPIN_HOT: u32 = 64;

/// The longest nap of an idle wait.
const NAP: Duration = Duration::from_micros(50);

type RankEngine = Engine<InOrderRing, Box<[Channel<InOrderRing>]>>;

/// One channel of a rank: the connection into it and the one out of it,
/// and what was reported of their counters.
struct Link {
    inbox: Segment,
    outbox: Segment,
    tail_seen: u64,
    head_seen: u64,
    /// The mailbox sequence (header step + 1) last reported.
    header_seen: u64,
}

impl Link {
    /// What the counters show that was not reported yet: the
    /// predecessor's header (once a `tail` covering it is visible), its
    /// `tail`, the successor's `head`.
    fn poll(&mut self, channel: ChannelId) -> Result<Option<Event>> {
        let tail = self.inbox.tail().load();
        if tail > self.tail_seen {
            // The acquire load of `tail` makes the mailbox written before
            // it visible.
            let seq = self.inbox.call_header_seq().load();
            if seq != self.header_seen && seq != 0 && seq - 1 < tail {
                self.header_seen = seq;
                let bytes = self.inbox.read_call_header();
                let repr =
                    CallHeaderRepr::parse(&CallHeader::new_unchecked(&bytes[..])).map_err(|e| {
                        Error::Core {
                            channel: Some(channel),
                            call: "CallHeaderRepr::parse",
                            source: ringcc_core::Error::Wire(e),
                        }
                    })?;
                return Ok(Some(Event::Header {
                    step: seq - 1,
                    desc: repr.desc,
                }));
            }
            self.tail_seen = tail;
            return Ok(Some(Event::Tail(tail)));
        }
        let head = self.outbox.head().load();
        if head > self.head_seen {
            self.head_seen = head;
            return Ok(Some(Event::Head(head)));
        }
        Ok(None)
    }
}

/// The caller's buffers of one call.
enum Buffers<'a> {
    Apart {
        input: &'a [u8],
        output: &'a mut [u8],
    },
    InPlace {
        buf: &'a mut [u8],
        input: usize,
        output: usize,
    },
}

impl Buffers<'_> {
    fn input(&self, off: usize, len: usize) -> Option<&[u8]> {
        match self {
            Buffers::Apart { input, .. } => input.get(off..off.checked_add(len)?),
            Buffers::InPlace { buf, input, .. } => {
                let at = input.checked_add(off)?;
                buf.get(at..at.checked_add(len)?)
            }
        }
    }

    fn output(&mut self, off: usize, len: usize) -> Option<&mut [u8]> {
        match self {
            Buffers::Apart { output, .. } => output.get_mut(off..off.checked_add(len)?),
            Buffers::InPlace { buf, output, .. } => {
                let at = output.checked_add(off)?;
                buf.get_mut(at..at.checked_add(len)?)
            }
        }
    }
}

/// One rank of a job on one host, connected to its ring neighbours over
/// shared memory on every channel.
pub struct ShmRank {
    rank: Rank,
    ranks: u32,
    config: ShmConfig,
    engine: RankEngine,
    /// Per channel (empty for a job of one rank).
    links: Vec<Link>,
    t0: Instant,
    incoming: Vec<u8>,
    result: Vec<u8>,
    /// The first failure: the rank takes no more calls.
    failed: Option<String>,
}

impl std::fmt::Debug for ShmRank {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmRank")
            .field("rank", &self.rank)
            .field("ranks", &self.ranks)
            .field("config", &self.config)
            .field("failed", &self.failed)
            .finish_non_exhaustive()
    }
}

impl ShmRank {
    /// Joins the job of `token` as `rank` of `ranks` (all on this host):
    /// creates this rank's inboxes, opens the successors' (waiting up to
    /// the configured timeout for them to appear), waits until every
    /// predecessor has mapped this rank's inboxes and unlinks their names.
    pub fn connect(token: &str, rank: Rank, ranks: u32, config: ShmConfig) -> Result<ShmRank> {
        if ranks == 0 || rank.0 >= ranks {
            return Err(Error::BadConfig(format!(
                "rank {rank} is not one of {ranks} ranks"
            )));
        }
        if !(1..=64).contains(&config.channels) {
            return Err(Error::BadConfig(format!(
                "{} channels: a job has 1 to 64",
                config.channels
            )));
        }
        if config.chunk_bytes == 0 || config.chunk_bytes > config.geometry.max_chunk_bytes() {
            return Err(Error::BadConfig(format!(
                "a {} B chunk does not fit a {} B FIFO (at most {} B: one slice stays free)",
                config.chunk_bytes,
                config.geometry.fifo_bytes(),
                config.geometry.max_chunk_bytes()
            )));
        }
        let deadline = Instant::now() + config.timeout;
        let mut links = Vec::new();
        if ranks > 1 {
            let next = Rank((rank.0 + 1) % ranks);
            let channels = 0..config.channels;
            let inboxes = channels
                .clone()
                .map(|c| {
                    Segment::create(
                        &SegmentName::new(token, rank, ChannelId(c)),
                        config.geometry,
                        token,
                    )
                })
                .collect::<Result<Vec<_>>>()?;
            for (c, inbox) in channels.zip(inboxes) {
                let name = SegmentName::new(token, next, ChannelId(c));
                let outbox = Segment::open(&name, token, config.geometry, deadline)?;
                links.push(Link {
                    inbox,
                    outbox,
                    tail_seen: 0,
                    head_seen: 0,
                    header_seen: 0,
                });
            }
            for link in &mut links {
                let inbox = &link.inbox;
                crate::wait::poll_until(
                    deadline,
                    NAP,
                    || Ok(inbox.peer_mapped().then_some(())),
                    || format!("rank {rank}'s predecessor to map {}", inbox.name()),
                )?;
                link.inbox.unlink()?;
            }
        }
        let storage = vec![Channel::new(); usize::from(config.channels)].into_boxed_slice();
        let timeout = u64::try_from(config.timeout.as_nanos()).unwrap_or(u64::MAX);
        Ok(ShmRank {
            rank,
            ranks,
            config,
            engine: Engine::new(rank, storage, timeout),
            links,
            t0: Instant::now(),
            incoming: Vec::new(),
            result: Vec::new(),
            failed: None,
        })
    }

    /// This rank.
    pub fn rank(&self) -> Rank {
        self.rank
    }

    /// The job's ranks.
    pub fn ranks(&self) -> u32 {
        self.ranks
    }

    /// Runs `call` out of place: `input` and `output` of NCCL's sizes
    /// ([`Call::buffer_bytes`]).
    pub fn run(&mut self, call: &Call, input: &[u8], output: &mut [u8]) -> Result<()> {
        let (i, o) = call.buffer_bytes(self.ranks);
        for (which, expected, got) in [("input", i, input.len()), ("output", o, output.len())] {
            if expected != got {
                return Err(Error::BadBuffer {
                    which,
                    expected,
                    got,
                });
            }
        }
        self.call(call, Buffers::Apart { input, output })
    }

    /// Runs `call` in place in `buf` (NCCL's in-place layout:
    /// [`Call::in_place_offsets`]; `buf` holds the larger of the input and
    /// the output).
    pub fn run_in_place(&mut self, call: &Call, buf: &mut [u8]) -> Result<()> {
        let (i, o) = call.buffer_bytes(self.ranks);
        let expected = i.max(o);
        if buf.len() != expected {
            return Err(Error::BadBuffer {
                which: "in-place",
                expected,
                got: buf.len(),
            });
        }
        let (ie, oe) = call.in_place_offsets(self.rank.0);
        let at = |e: u64| {
            usize::try_from(e)
                .unwrap_or(usize::MAX)
                .saturating_mul(call.elem())
        };
        let (input, output) = (at(ie), at(oe));
        self.call(call, Buffers::InPlace { buf, input, output })
    }

    fn ticks(&self) -> u64 {
        u64::try_from(self.t0.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    fn call(&mut self, call: &Call, mut bufs: Buffers<'_>) -> Result<()> {
        if let Some(cause) = &self.failed {
            return Err(Error::Poisoned {
                cause: cause.clone(),
            });
        }
        let plan = call
            .plan(
                self.ranks,
                u32::from(self.config.channels),
                self.config.chunk_bytes,
            )
            .map_err(|source| Error::Core {
                channel: None,
                call: "Plan::new",
                source,
            })?;
        let ring = InOrderRing { ranks: self.ranks };
        let now = self.ticks();
        self.engine
            .start(now, call, &plan, self.config.geometry, |_| ring)
            .map_err(Error::engine)?;
        match self.drive(call, &mut bufs) {
            Ok(()) => Ok(()),
            Err(e) => {
                self.engine.abort();
                self.failed = Some(e.to_string());
                Err(e)
            }
        }
    }

    /// The drive loop's backend half: actions to copies and counter
    /// posts, counters to events, and the wait.
    fn drive(&mut self, call: &Call, bufs: &mut Buffers<'_>) -> Result<()> {
        let mut idle = 0u32;
        let mut cursor = 0usize;
        loop {
            let mut progressed = false;
            while let Some((c, action)) = self.engine.poll().map_err(Error::engine)? {
                progressed = true;
                match action {
                    Action::Exec(e) => {
                        self.exec(c, &e, call, bufs)?;
                        let now = self.ticks();
                        self.engine
                            .handle(now, c, Event::ExecDone)
                            .map_err(Error::engine)?;
                    }
                    Action::ReturnCredit { head } => {
                        if let Some(link) = self.links.get(usize::from(c.0)) {
                            link.inbox.head().post(head);
                        }
                    }
                    Action::Done => {}
                }
            }
            if self.engine.is_idle() {
                return Ok(());
            }
            let n = self.links.len();
            for k in 0..n {
                let i = (cursor + k) % n;
                let c = ChannelId(i as u8);
                while let Some(event) = self.links[i].poll(c)? {
                    progressed = true;
                    let now = self.ticks();
                    self.engine.handle(now, c, event).map_err(Error::engine)?;
                }
            }
            cursor = cursor.wrapping_add(1);
            if progressed {
                idle = 0;
                continue;
            }
            idle = idle.saturating_add(1);
            let now = self.ticks();
            self.engine.handle_timeout(now).map_err(Error::engine)?;
            if idle <= SPIN_HOT {
                std::hint::spin_loop();
            } else if idle <= self.config.spin {
                // More ranks than cores (a laptop, a CI machine): let the
                // rank that has work run.
                std::thread::yield_now();
            } else {
                let left = self
                    .engine
                    .poll_timeout()
                    .map_or(NAP, |due| Duration::from_nanos(due.saturating_sub(now)));
                std::thread::sleep(left.min(NAP));
            }
        }
    }

    /// One slice: incoming bytes from the inbox, the local input, the
    /// result into the output and the outbox.
    fn exec(&mut self, c: ChannelId, e: &Exec, call: &Call, bufs: &mut Buffers<'_>) -> Result<()> {
        let internal = |what: &str| Error::Internal(format!("channel {c}: {what}"));
        let es = call.elem();
        let bytes = usize::try_from(e.count)
            .ok()
            .and_then(|n| n.checked_mul(es))
            .ok_or_else(|| internal("slice size beyond memory"))?;
        let p = e.primitive;
        let slot_bytes = usize::try_from(self.config.geometry.slot_bytes()).unwrap_or(usize::MAX);
        let at = |elems: u64| usize::try_from(elems).ok().and_then(|v| v.checked_mul(es));
        if let Some(span) = e.recv {
            let link = self
                .links
                .get(usize::from(c.0))
                .ok_or_else(|| internal("a receive without a predecessor"))?;
            self.incoming.resize(bytes, 0);
            for (k, part) in self.incoming.chunks_mut(slot_bytes).enumerate() {
                link.inbox
                    .slot(slot_of(span.step + k as u64))?
                    .read_into(part)?;
            }
        }
        self.result.resize(bytes, 0);
        {
            let local = if p.reads_input() {
                let off = at(e.input_offset).ok_or_else(|| internal("input offset"))?;
                Some(
                    bufs.input(off, bytes)
                        .ok_or_else(|| internal("input slice out of the buffer"))?,
                )
            } else {
                None
            };
            slice_result(
                p,
                call.dtype,
                call.op,
                self.ranks,
                e.recv.map(|_| self.incoming.as_slice()),
                local,
                &mut self.result,
            )
            .map_err(|source| Error::Core {
                channel: Some(c),
                call: "slice_result",
                source,
            })?;
        }
        if p.contains(Primitive::COPY) {
            let off = at(e.output_offset).ok_or_else(|| internal("output offset"))?;
            bufs.output(off, bytes)
                .ok_or_else(|| internal("output slice out of the buffer"))?
                .copy_from_slice(&self.result);
        }
        if let Some(span) = e.send {
            let link = self
                .links
                .get(usize::from(c.0))
                .ok_or_else(|| internal("a send without a successor"))?;
            if let Some(desc) = e.header {
                let header = CallHeaderRepr {
                    desc,
                    step: span.step as u32,
                }
                .to_bytes();
                link.outbox.post_call_header(span.step + 1, &header);
            }
            for (k, part) in self.result.chunks(slot_bytes).enumerate() {
                link.outbox
                    .slot(slot_of(span.step + k as u64))?
                    .write_from(part)?;
            }
            // Release: the header and the bytes before the counter.
            link.outbox.tail().post(span.end());
        }
        Ok(())
    }
}
