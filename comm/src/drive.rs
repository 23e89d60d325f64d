//! The drive loop: one rank's connected ring and the core's progress
//! engine, turned by the backend's three jobs — the ends' news into
//! events, the engine's actions into the host executor's work and
//! counter posts, and the wait.
//!
//! Waits spin (a peer's counter typically moves within a few polls when
//! every rank has a core), then yield the core (more ranks than cores),
//! then nap; the engine's deadline bounds every call, and a peer that
//! stops moving is named by the engine's stall report. A job-wide abort
//! notice (set by the communicator's watcher) fails the call at the next
//! idle turn.

use std::sync::Arc;
use std::time::Duration;

use ringcc_core::fifo::FifoGeometry;
use ringcc_core::prim::Action;
use ringcc_core::progress::{Channel, Engine, Event};
use ringcc_core::wire::call_header::CallHeaderRepr;
use ringcc_core::{Call, ChannelId, Protocol, Rank};

use crate::abort::AbortState;
use crate::buffer::Buffers;
use crate::error::{Error, Result};
use crate::exec::{exec, Payload};
use crate::land::{ChannelLanding, Lands};
use crate::ring::RingOrderOf;
use crate::transport::{Bell, RecvEnd, SendEnd};

/// Idle polls that only spin before a wait yields the core, when every
/// rank of the node has a core of its own.
pub(crate) const SPIN_HOT: u32 = 64;

/// The same when the node's ranks outnumber its cores: the rank it waits
/// for may need this core, so it yields almost at once (8 B AllReduce, 4
/// ranks on 2 cores: 29 µs with 64 polls, 14 µs with 4; 2 ranks: alike).
pub(crate) const SPIN_HOT_SHARED: u32 = 4;

/// How many idle polls spin before yielding, for a rank with `local`
/// ranks on its node (itself included) and `cores` cores.
pub(crate) fn spin_hot(local: usize, cores: usize) -> u32 {
    if local > cores {
        SPIN_HOT_SHARED
    } else {
        SPIN_HOT
    }
}

/// The longest nap of an idle wait without a bell.
const NAP: Duration = Duration::from_micros(50);

/// Naps before an idle wait sleeps on the bell: a futex wake-up costs
/// the poster a system call and the sleeper a trip through the
/// scheduler, more than a short nap when the peer is only a little late.
const NAPS_FIRST: u32 = 20;

/// The longest sleep on the bell (the abort notice is looked at in
/// between).
const BELL_SLEEP: Duration = Duration::from_millis(5);

/// The channels `call` uses out of the `available` connected ones: one
/// per `channel_bytes` of its larger buffer, at least one. The same on
/// every rank (it depends on the call and the job's settings only).
pub(crate) fn channels_for(call: &Call, ranks: u32, available: usize, channel_bytes: u64) -> u32 {
    let (i, o) = call.buffer_bytes(ranks);
    let per = usize::try_from(channel_bytes.max(1)).unwrap_or(usize::MAX);
    (i.max(o) / per).clamp(1, available.max(1)) as u32
}

/// One channel's two ends.
pub(crate) struct Link {
    pub(crate) recv: Box<dyn RecvEnd>,
    pub(crate) send: Box<dyn SendEnd>,
}

/// How the loop runs; the same on every rank.
#[derive(Clone, Copy, Debug)]
pub(crate) struct DriveConfig {
    pub(crate) geometry: FifoGeometry,
    pub(crate) chunk_bytes: u64,
    pub(crate) channel_bytes: u64,
    /// The tuner that picks each call's protocol (the same on every rank).
    pub(crate) tuner: ringcc_core::tune::Tuner,
    pub(crate) timeout: Duration,
    /// Idle polls spent spinning and yielding before napping.
    pub(crate) spin: u32,
    /// Idle polls of those that only spin ([`spin_hot`]).
    pub(crate) hot: u32,
}

/// A connected rank: its engine over every channel and the channels'
/// ends.
pub(crate) struct Ring {
    ranks: u32,
    order: RingOrderOf,
    config: DriveConfig,
    engine: Engine<RingOrderOf, Box<[Channel<RingOrderOf>]>>,
    /// Per channel (empty for a job of one rank).
    links: Vec<Link>,
    /// The channels the current call uses (the first ones): only their
    /// ends are polled. A call ends only once everything it sent was
    /// credited, so an unused channel has nothing of this call's to
    /// report; what a faster peer sends on it for a later call waits in
    /// the end until that call polls it.
    used: usize,
    t0: u64,
    /// The clock's last reading ([`Ring::ticks`]): events take it rather
    /// than reading the clock each (a small call's whole time is a
    /// handful of events, and a clock read costs as much as one). Read
    /// again at every exec and every 16th idle poll, so it is never
    /// older than the last exec or a few microseconds of idling.
    now: u64,
    scratch: Vec<u8>,
    /// The tuner's last answers.
    choices: crate::proto::ChoiceCache,
    /// The first failure: the ring takes no more calls.
    failed: Option<String>,
    abort: Arc<AbortState>,
    /// The bell this rank sleeps on.
    bell: Arc<dyn Bell>,
    /// The running call's slices that land straight in its output
    /// ([`Lands`]), where an end can put them there.
    lands: Option<Lands>,
    /// Bytes landed by the calls before the running one.
    landed: u64,
    /// Per link, whether its send end holds the running call's buffers
    /// ([`SendEnd::lend`]) and sends from them.
    lent: Vec<bool>,
}

impl Ring {
    pub(crate) fn new(
        rank: Rank,
        order: RingOrderOf,
        config: DriveConfig,
        channels: u8,
        links: Vec<Link>,
        abort: Arc<AbortState>,
        bell: Arc<dyn Bell>,
    ) -> Ring {
        let storage = vec![Channel::new(); usize::from(channels)].into_boxed_slice();
        let timeout = u64::try_from(config.timeout.as_nanos()).unwrap_or(u64::MAX);
        Ring {
            ranks: ringcc_core::RingOrder::ranks(&order),
            order,
            config,
            engine: Engine::new(rank, storage, timeout),
            used: links.len(),
            links,
            t0: crate::clock::coarse_nanos(),
            now: 0,
            scratch: Vec::new(),
            choices: crate::proto::ChoiceCache::default(),
            failed: None,
            abort,
            bell,
            lands: None,
            landed: 0,
            lent: Vec::new(),
        }
    }

    /// Payload bytes received straight into the calls' outputs so far.
    pub(crate) fn landed_bytes(&self) -> u64 {
        self.landed
            .saturating_add(self.lands.as_ref().map_or(0, Lands::bytes))
    }

    /// Calls completed so far.
    pub(crate) fn calls(&self) -> u64 {
        self.engine.seq()
    }

    /// Marks the ring failed (abort): later calls are refused.
    pub(crate) fn poison(&mut self, cause: String) {
        self.engine.abort();
        self.failed.get_or_insert(cause);
    }

    /// Drops the ends (closing connections and unmapping segments).
    pub(crate) fn close(&mut self) {
        self.links.clear();
    }

    /// Reads the (coarse) clock — nanoseconds since the ring was made —
    /// and keeps the reading for the events that follow.
    fn ticks(&mut self) -> u64 {
        self.now = crate::clock::coarse_nanos().saturating_sub(self.t0);
        self.now
    }

    /// Runs one call to completion (or to its first failure, which
    /// poisons the ring).
    pub(crate) fn run(&mut self, call: &Call, bufs: &mut Buffers<'_>) -> Result<()> {
        if let Some(cause) = &self.failed {
            return Err(Error::Poisoned {
                cause: cause.clone(),
            });
        }
        // An aborted job takes no new call, even one that would finish
        // without an idle turn (one rank, or data already there).
        if let Some(e) = self.abort.error() {
            self.poison(e.to_string());
            return Err(e);
        }
        // The protocol, its FIFO geometry and chunk: the same on every
        // rank (a pure function of the call and the shared settings).
        let proto = self.choices.choose(&self.config.tuner, call, self.ranks)?;
        let geometry = proto
            .fifo_geometry(self.config.geometry)
            .map_err(|source| Error::Core {
                channel: None,
                call: "Protocol::fifo_geometry",
                source,
            })?;
        let plan = call
            .plan(
                self.ranks,
                channels_for(
                    call,
                    self.ranks,
                    self.links.len(),
                    self.config.channel_bytes,
                ),
                proto.chunk_bytes(geometry, self.config.chunk_bytes),
            )
            .map_err(|source| Error::Core {
                channel: None,
                call: "Plan::new",
                source,
            })?;
        let now = self.ticks();
        let order = self.order.clone();
        self.engine
            .start(now, call, &plan, geometry, |_| order.clone())
            .map_err(Error::engine)?;
        self.used = (plan.channels() as usize).min(self.links.len());
        for l in &mut self.links {
            l.send.begin(proto);
        }
        // Simple's slots hold the bytes as they are; LL's lines do not.
        let lands =
            proto == Protocol::Simple && self.links.iter().take(self.used).any(|l| l.recv.lands());
        self.landed = self.landed_bytes();
        self.lands = match self.engine.call().filter(|_| lands) {
            Some(desc) => Lands::new(
                desc,
                &plan,
                geometry,
                self.engine.rank(),
                &self.order,
                self.used,
                |c| self.engine.link(c).recv_next,
            ),
            None => None,
        };
        let run = self
            .lend(bufs)
            .and_then(|()| self.drive(call, bufs, geometry));
        // The loans end before the buffers go back to the caller: drained
        // after a call that succeeded, dropped at once after a failure.
        let settled = self.settle(run.is_ok());
        match run.and(settled) {
            Ok(()) => Ok(()),
            Err(e) => {
                self.poison(e.to_string());
                Err(e)
            }
        }
    }

    /// Offers the call's buffers to the send ends of the channels it uses
    /// ([`SendEnd::lend`]), noting which ends took them.
    fn lend(&mut self, bufs: &Buffers<'_>) -> Result<()> {
        self.lent.clear();
        self.lent.resize(self.links.len(), false);
        let regions = bufs.regions();
        for (l, lent) in self.links.iter_mut().zip(&mut self.lent).take(self.used) {
            // SAFETY: the regions are the call's buffers, borrowed until
            // `run` returns, and `run` settles every loan before that
            // (`settle`, on success and failure alike). The executor
            // writes a byte it sent only as an element's final value,
            // which exists only after the successor took the slice that
            // carried this rank's contribution to it.
            *lent = unsafe { l.send.lend(&regions) }?;
        }
        Ok(())
    }

    /// Ends every loan of the running call ([`SendEnd::settle`]): the
    /// first failure, once every end let go.
    fn settle(&mut self, drain: bool) -> Result<()> {
        let mut first = Ok(());
        for (l, lent) in self.links.iter_mut().zip(&mut self.lent) {
            if std::mem::take(lent) {
                let r = l.send.settle(drain);
                if first.is_ok() {
                    first = r;
                }
            }
        }
        first
    }

    fn drive(&mut self, call: &Call, bufs: &mut Buffers<'_>, geometry: FifoGeometry) -> Result<()> {
        let slot_bytes = usize::try_from(geometry.slot_bytes())
            .map_err(|_| Error::Internal("slot size beyond memory".into()))?;
        let seq = self.engine.seq();
        let mut idle = 0u32;
        let mut cursor = 0usize;
        loop {
            let mut progressed = false;
            while let Some((c, action)) = self.engine.poll().map_err(Error::engine)? {
                progressed = true;
                match action {
                    Action::Exec(e) => {
                        let link = self.links.get_mut(usize::from(c.0));
                        let (recv, send) = match link {
                            Some(l) => (Some(&*l.recv), Some(&mut *l.send)),
                            None => (None, None),
                        };
                        let from_buffers = self.lent.get(usize::from(c.0)) == Some(&true)
                            || send.as_deref().is_some_and(|s| s.prefers_post_from());
                        let payload = exec(
                            c,
                            &e,
                            call,
                            self.ranks,
                            slot_bytes,
                            bufs,
                            (recv, self.lands.as_ref()),
                            (send, from_buffers),
                            &mut self.scratch,
                        )?;
                        if let (Some(span), Some(l)) =
                            (e.send, self.links.get_mut(usize::from(c.0)))
                        {
                            let header = e.header.map(|desc| {
                                CallHeaderRepr {
                                    desc,
                                    step: span.step as u32,
                                }
                                .to_bytes()
                            });
                            let header = header.as_ref();
                            if let Payload::Staged(bytes) = payload {
                                l.send.post(seq, span, header, bytes)?;
                            } else {
                                let data = bufs.sent(payload).ok_or_else(|| {
                                    Error::Internal(format!("channel {c}: send beyond the buffers"))
                                })?;
                                l.send.post_from(seq, span, header, data, slot_bytes)?;
                            }
                        }
                        let now = self.ticks();
                        self.engine
                            .handle(now, c, Event::ExecDone)
                            .map_err(Error::engine)?;
                    }
                    Action::ReturnCredit { head } => {
                        let more = self.engine.receives_ahead(c);
                        if let Some(l) = self.links.get_mut(usize::from(c.0)) {
                            l.recv.post_credit(head, more)?;
                        }
                    }
                    Action::Done => {}
                }
            }
            if self.engine.is_idle() {
                return Ok(());
            }
            // Every end at the first look after progress and at every 16th
            // idle one; between them a send end only when the engine
            // waits for its credit or the end has bytes to write.
            if self.news_from(cursor, idle.is_multiple_of(16), bufs)? {
                progressed = true;
            }
            cursor = cursor.wrapping_add(1);
            if progressed {
                idle = 0;
                continue;
            }
            idle = idle.saturating_add(1);
            // While spinning hot the clock (and the abort notice) is
            // looked at every 16th idle poll: a small call's whole time is
            // a few hundred polls of its peers' words.
            let hot = self.config.hot;
            if idle <= hot && !idle.is_multiple_of(16) {
                std::hint::spin_loop();
                continue;
            }
            if let Some(e) = self.abort.error() {
                return Err(e);
            }
            let now = self.ticks();
            self.engine.handle_timeout(now).map_err(Error::engine)?;
            if idle <= hot {
                std::hint::spin_loop();
            } else if idle <= self.config.spin {
                std::thread::yield_now();
            } else {
                let left = self
                    .engine
                    .poll_timeout()
                    .map_or(NAP, |due| Duration::from_nanos(due.saturating_sub(now)));
                match (idle > self.config.spin + NAPS_FIRST).then(|| Arc::clone(&self.bell)) {
                    Some(bell) => {
                        let ticket = bell.arm();
                        let news = self.news_from(0, true, bufs);
                        if !matches!(news, Ok(false)) {
                            bell.disarm();
                            news?;
                            idle = 0;
                            continue;
                        }
                        bell.sleep(ticket, left.min(BELL_SLEEP));
                        bell.disarm();
                    }
                    None => std::thread::sleep(left.min(NAP)),
                }
            }
        }
    }
}

impl Ring {
    /// Polls every end once, channels from `first` on (round robin, so no
    /// channel's news waits behind another's), handing what arrived to the
    /// engine: whether anything did.
    fn news_from(&mut self, first: usize, all: bool, bufs: &mut Buffers<'_>) -> Result<bool> {
        let n = self.used.min(self.links.len());
        let mut news = false;
        for k in 0..n {
            let i = (first + k) % n;
            let c = ChannelId(i as u8);
            let Some(l) = self.links.get_mut(i) else {
                continue;
            };
            let mut arrived = false;
            loop {
                let event = match self.lands.as_mut() {
                    Some(lands) => l.recv.poll_landing(&mut ChannelLanding {
                        lands,
                        bufs,
                        channel: c,
                    })?,
                    None => l.recv.poll()?,
                };
                let Some(event) = event else { break };
                news = true;
                arrived = true;
                self.engine
                    .handle(self.now, c, event)
                    .map_err(Error::engine)?;
            }
            // A send end's credit is news only when the engine waits for
            // it: with data just in, the engine acts first (a small
            // call's reply leaves one system call sooner), and the look
            // at every end comes at the next turn without news.
            if !((all && !arrived) || l.send.needs_poll() || self.engine.waits_for_credit(c)) {
                continue;
            }
            while let Some(event) = l.send.poll()? {
                news = true;
                self.engine
                    .handle(self.now, c, event)
                    .map_err(Error::engine)?;
            }
        }
        Ok(news)
    }
}

#[cfg(test)]
mod spin_tests {
    use super::*;

    /// A node with more ranks than cores yields almost at once; one with a
    /// core per rank spins first.
    #[test]
    fn ranks_beyond_the_cores_spin_less() {
        assert_eq!(spin_hot(2, 2), SPIN_HOT);
        assert_eq!(spin_hot(1, 8), SPIN_HOT);
        assert_eq!(spin_hot(3, 2), SPIN_HOT_SHARED);
        assert_eq!(spin_hot(8, 2), SPIN_HOT_SHARED);
        const { assert!(SPIN_HOT_SHARED < SPIN_HOT) };
    }
}
