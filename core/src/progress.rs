//! The progress engine: one rank's call over all its channels — the drive
//! loop, written once.
//!
//! A backend owns one [`Engine`] per rank and does three things only: it
//! turns what its hardware reports into [`Event`]s ([`Engine::handle`]),
//! carries out the [`Action`]s the engine hands out ([`Engine::poll`]; or,
//! driving one channel at a time, [`Engine::poll_channel`], with an
//! event's first poll in [`Engine::handle_poll`], or an event's whole
//! loop on its channel in one [`Engine::drive`]), and
//! waits — until its next completion or the engine's deadline
//! ([`Engine::poll_timeout`], then [`Engine::handle_timeout`]). Everything
//! else lives here: a [`Machine`] per channel (the only place one is
//! created), sequence numbers, the connection counters carried from one
//! call to the next, early call headers, poisoning after the first
//! failure, the deadline, and the stall report that names rank, channel
//! and what the channel waits for.
//!
//! Sans-IO in the quinn-proto sense: time is an opaque, monotonic `u64`
//! the caller passes in (nanoseconds on hardware, picoseconds in the
//! simulator: the engine only compares and adds). Storage is the caller's:
//! `S` is anything that derefs to a slice of [`Channel`]s (an array for
//! firmware, giving a const-generic capacity; a boxed slice on a host).
//!
//! ```text
//! start(call, plan, …)          one Machine per channel, seq assigned
//! loop {
//!     while let Some((c, a)) = poll()?   carry out `a` on channel `c`
//!     wait until an event or poll_timeout()
//!     handle(now, c, event)? / handle_timeout(now)?
//! }                              until poll() hands out the last Done
//! ```
//!
//! A tree AllReduce (an engine built [`with_trees`](Engine::with_trees))
//! runs the same loop with [`start_tree`](Engine::start_tree),
//! [`poll_tree`](Engine::poll_tree) and
//! [`handle_tree`](Engine::handle_tree), whose events name the
//! connection ([`TreeConn`]: up, or child 0–2). While a tree call runs,
//! poll with `poll_tree` only: `poll` and `poll_channel` see the ring
//! machines, which have nothing, and would take the channels' marks.

use crate::call::Call;
use crate::error::Error;
use crate::fifo::{FifoGeometry, STEPS};
use crate::id::{ChannelId, Rank};
use crate::plan::{CallDesc, Plan};
use crate::prim::{
    Action, Blocked, Exec, LinkState, Machine, Next, TreeAction, TreeBlocked, TreeConn, TreeExec,
    TreeLinks, TreeMachine, TREE_CONNS,
};
use crate::topology::RingOrder;
use crate::tree::{TreeDir, TreeOrder, TreePlan};
use crate::ProtocolViolation;

/// The most channels one engine drives (the plan's limit).
pub const MAX_CHANNELS: usize = crate::topology::MAX_CHANNELS as usize;

/// What a transport reports for one channel of this rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Event {
    /// The exec last handed out on this channel is complete.
    ExecDone,
    /// The predecessor's `tail` moved to this value.
    Tail(u64),
    /// The predecessor's call header for the message at FIFO step `step`
    /// (delivered no later than the `Tail` that covers `step`).
    Header {
        /// FIFO step the header precedes.
        step: u64,
        /// The predecessor's call.
        desc: CallDesc,
    },
    /// The successor's `head` moved to this value (a value already known
    /// is ignored: a counter read may show it twice).
    Head(u64),
}

/// A machine's action as the engine's poll loop sees it (the ring's
/// [`Action`], the tree's [`TreeAction`]).
trait Polled {
    /// An exec: the machine has nothing more until it completes.
    fn is_exec(&self) -> bool;
    /// The machine's last action of the call.
    fn is_done(&self) -> bool;
}

impl Polled for Action {
    #[inline(always)]
    fn is_exec(&self) -> bool {
        matches!(self, Action::Exec(_))
    }
    #[inline(always)]
    fn is_done(&self) -> bool {
        matches!(self, Action::Done)
    }
}

impl Polled for TreeAction {
    /// Never: a non-root tree rank's other stream may still have an exec
    /// to hand out, so the channel stays marked until a poll finds nothing.
    #[inline(always)]
    fn is_exec(&self) -> bool {
        false
    }
    #[inline(always)]
    fn is_done(&self) -> bool {
        matches!(self, TreeAction::Done)
    }
}

impl Exec {
    /// What the successor must be told once this exec is done: the call
    /// header (first slice of a call) and the new `tail`, in that order.
    /// Empty for an exec that sends nothing. Transports that deliver
    /// events themselves (memory, shared memory, a simulated link) feed
    /// these to the successor's engine.
    pub fn successor_events(&self) -> impl Iterator<Item = Event> {
        let header = match (self.header, self.send) {
            (Some(desc), Some(s)) => Some(Event::Header { step: s.step, desc }),
            _ => None,
        };
        let tail = self.send.map(|s| Event::Tail(s.end()));
        header.into_iter().chain(tail)
    }
}

/// One channel's slot in an engine's storage: the current (or last)
/// call's machine and the counters carried between calls. `repr(C)`: the
/// machine's hot fields open the slot (what a backend prefetches), and
/// the slot starts a cache line, so that they fill as few lines as they
/// can (unaligned, three lines' worth spanned four).
#[derive(Clone, Debug)]
#[repr(C, align(64))]
pub struct Channel<M> {
    machine: Option<Machine<M>>,
    link: LinkState,
}

impl<M> Default for Channel<M> {
    fn default() -> Self {
        Channel::new()
    }
}

impl<M> Channel<M> {
    /// An unused channel (counters at zero).
    pub const fn new() -> Self {
        Channel {
            machine: None,
            link: LinkState {
                recv_tail: 0,
                recv_next: 0,
                send_head: 0,
                send_next: 0,
                early_header: None,
            },
        }
    }

    /// The channel's machine (the current call's, or the last one's).
    pub fn machine(&self) -> Option<&Machine<M>> {
        self.machine.as_ref()
    }
}

impl<M: RingOrder> Channel<M> {
    /// The connection counters: the machine's while it lives.
    pub fn link(&self) -> LinkState {
        self.machine.as_ref().map_or(self.link, Machine::link)
    }

    /// What the channel waits for ([`Blocked::Done`] without a call).
    pub fn blocked_on(&self) -> Blocked {
        self.machine
            .as_ref()
            .map_or(Blocked::Done, Machine::blocked_on)
    }
}

/// One channel's slot for tree calls in an engine's tree storage: the
/// current (or last) tree call's machine and the tree connections'
/// counters carried between tree calls.
#[derive(Clone, Debug, Default)]
pub struct TreeChannel {
    machine: Option<TreeMachine>,
    links: TreeLinks,
}

impl TreeChannel {
    /// An unused tree channel (counters at zero).
    pub const fn new() -> Self {
        const L: LinkState = LinkState {
            recv_tail: 0,
            recv_next: 0,
            send_head: 0,
            send_next: 0,
            early_header: None,
        };
        TreeChannel {
            machine: None,
            links: [L; TREE_CONNS],
        }
    }

    /// The channel's tree machine (the current tree call's, or the last).
    pub fn machine(&self) -> Option<&TreeMachine> {
        self.machine.as_ref()
    }

    /// The tree connections' counters: the machine's while it lives.
    pub fn links(&self) -> TreeLinks {
        self.machine.as_ref().map_or(self.links, TreeMachine::links)
    }
}

/// Tree storage for an engine that runs no tree calls: empty, no bytes.
/// The default third parameter of [`Engine`], so a ring-only engine's
/// size and layout are what they were.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NoTrees;

impl AsRef<[TreeChannel]> for NoTrees {
    fn as_ref(&self) -> &[TreeChannel] {
        &[]
    }
}

impl AsMut<[TreeChannel]> for NoTrees {
    fn as_mut(&mut self) -> &mut [TreeChannel] {
        &mut []
    }
}

/// Why a rank made no progress: the first channel still open, what it
/// waits for, and for how long nothing happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Stall {
    /// The rank.
    pub rank: Rank,
    /// The call's sequence number.
    pub seq: u64,
    /// The first channel not done.
    pub channel: ChannelId,
    /// What it waits for.
    pub blocked: Blocked,
    /// Channels not done.
    pub open: u32,
    /// Time without progress, in the caller's unit.
    pub waited: u64,
}

impl core::fmt::Display for Stall {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "rank {} call {}: channel {} waits for {} ({} channel(s) open, nothing for {} ticks)",
            self.rank.0, self.seq, self.channel.0, self.blocked, self.open, self.waited
        )
    }
}

/// Why the engine refused or failed. After any of these but
/// [`Busy`](EngineError::Busy), [`BadChannel`](EngineError::BadChannel)
/// and a refused [`start`](Engine::start) the engine is poisoned: every later call returns
/// [`Poisoned`](EngineError::Poisoned), and [`Engine::failure`] says why.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum EngineError {
    /// A channel's machine refused an event or failed (`during`: the
    /// machine operation).
    Machine {
        /// The channel.
        channel: ChannelId,
        /// What the engine was doing (`"start"`, `"handle_tail"`, …).
        during: &'static str,
        /// The core error.
        source: Error,
    },
    /// No progress before the deadline.
    Timeout(Stall),
    /// [`Engine::abort`] was called.
    Aborted,
    /// The engine failed earlier ([`Engine::failure`]).
    Poisoned,
    /// A call is running: [`Engine::start`] must wait for it.
    Busy,
    /// An event or a plan for a channel the engine does not have.
    BadChannel {
        /// The channel.
        channel: u32,
        /// Channels in the engine's storage.
        capacity: u32,
    },
}

impl EngineError {
    /// The core error underneath, if any.
    pub fn core(&self) -> Option<Error> {
        match self {
            EngineError::Machine { source, .. } => Some(*source),
            _ => None,
        }
    }

    /// The channel concerned, if one is.
    pub fn channel(&self) -> Option<ChannelId> {
        match self {
            EngineError::Machine { channel, .. } => Some(*channel),
            EngineError::Timeout(s) => Some(s.channel),
            _ => None,
        }
    }
}

impl core::fmt::Display for EngineError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            EngineError::Machine {
                channel,
                during,
                source,
            } => write!(f, "channel {} ({during}): {source}", channel.0),
            EngineError::Timeout(s) => write!(f, "no progress: {s}"),
            EngineError::Aborted => f.write_str("aborted"),
            EngineError::Poisoned => f.write_str("the engine failed earlier"),
            EngineError::Busy => f.write_str("a call is still running"),
            EngineError::BadChannel { channel, capacity } => {
                write!(f, "channel {channel} out of range (engine has {capacity})")
            }
        }
    }
}

impl core::error::Error for EngineError {}

/// How one channel's loop ended in [`Engine::drive`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Drove {
    /// Carry out the exec [`Engine::pending`] describes (outstanding
    /// until its `ExecDone`; not carried here: a hundred bytes copied
    /// through the answer cost more than reading them where they are).
    Exec,
    /// The channel is done with the call (after the last channel's, the
    /// engine is idle).
    Done,
    /// The channel waits for an event; `credit`: for its successor's
    /// credit (FIFO room, or its sends consumed), as
    /// [`Engine::waits_for_credit`] says.
    Wait {
        /// It waits for credit.
        credit: bool,
    },
    /// A second credit is due: return it, then drive the channel again
    /// (with no event).
    Credit {
        /// The new `head`.
        head: u64,
    },
    /// Polling failed (after the credit, which is still to be returned):
    /// the engine is poisoned, and [`Engine::failure`] says why.
    Failed,
}

/// [`Engine::drive`]'s answer: a credit to return first, if one was due,
/// then how the channel's loop ended (a failure, too, comes after the
/// credit, as it would from polling one action at a time).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[must_use = "the credit and the exec must be carried out"]
pub struct Driven {
    /// Return this `head` to the predecessor first.
    pub credit: Option<u64>,
    /// Then this.
    pub then: Drove,
}

/// One rank's progress engine over the channels in `S` (and, for tree
/// calls, the tree channels in `T`).
///
/// See the [module documentation](self) for the loop a backend writes
/// around it. A tree AllReduce runs through the same engine — sequence
/// numbers, deadline, poisoning and stall report are shared with ring
/// calls — with [`start_tree`](Engine::start_tree),
/// [`handle_tree`](Engine::handle_tree) (events name their
/// [`TreeConn`]) and [`poll_tree`](Engine::poll_tree); its storage comes
/// from [`Engine::with_trees`].
///
/// `repr(C)`, cache-line aligned: what every event and poll touches (the
/// channel masks, the clock, the flags) fills the first line, followed by
/// the storage; the call and the failure come after. Storage held inline
/// (an array: [`ArrayEngine`]) therefore starts at the second line, and a
/// channel's address is the engine's plus a constant offset: finding a
/// channel loads nothing from the engine, so its machine's lines (which a
/// backend may prefetch) need not wait for the engine's own line. A
/// storage handle (a slice, a `Box`) sits in the first line with the
/// flags. The capacity is the storage's length (a constant for an array),
/// not a field: a field would put the engine's line back on that path.
#[derive(Clone, Debug)]
#[repr(C, align(64))]
pub struct Engine<M, S, T = NoTrees> {
    /// Channels that may have an action (bit per channel).
    dirty: u64,
    /// Channels not yet `Done` (bit per channel).
    open: u64,
    last_progress: u64,
    timeout: u64,
    rank: Rank,
    /// Channels of the running call (the plan's).
    used: u8,
    /// Where `poll` looks first (the channel that acted last).
    cursor: u8,
    /// `failure` is set.
    poisoned: bool,
    /// The channels (at most [`MAX_CHANNELS`] of them used).
    channels: S,
    /// Sequence number of the running call, or of the next one.
    seq: u64,
    /// The running call.
    call: Option<CallDesc>,
    failure: Option<EngineError>,
    /// The running (or last) call is a tree call.
    tree_call: bool,
    trees: T,
    _ring: core::marker::PhantomData<fn() -> M>,
}

/// An engine whose storage is an array: a const-generic capacity, no
/// allocation (firmware's shape).
pub type ArrayEngine<M, const C: usize> = Engine<M, [Channel<M>; C]>;

impl<M: RingOrder, S: AsRef<[Channel<M>]> + AsMut<[Channel<M>]>> Engine<M, S> {
    /// An engine for `rank` over `channels` (all unused), giving up on a
    /// call when nothing happens for `timeout` ticks. Capacity beyond
    /// [`MAX_CHANNELS`] is never used. It runs ring calls only; see
    /// [`Engine::with_trees`].
    pub fn new(rank: Rank, channels: S, timeout: u64) -> Self {
        Engine::with_trees(rank, channels, NoTrees, timeout)
    }
}

impl<
        M: RingOrder,
        S: AsRef<[Channel<M>]> + AsMut<[Channel<M>]>,
        T: AsRef<[TreeChannel]> + AsMut<[TreeChannel]>,
    > Engine<M, S, T>
{
    /// [`Engine::new`] with storage for tree calls too: `trees` holds one
    /// [`TreeChannel`] per channel a tree call may use.
    pub fn with_trees(rank: Rank, channels: S, trees: T, timeout: u64) -> Self {
        Engine {
            dirty: 0,
            open: 0,
            last_progress: 0,
            timeout,
            seq: 0,
            used: 0,
            cursor: 0,
            rank,
            poisoned: false,
            channels,
            call: None,
            failure: None,
            tree_call: false,
            trees,
            _ring: core::marker::PhantomData,
        }
    }

    /// The rank.
    pub fn rank(&self) -> Rank {
        self.rank
    }

    /// The running call, if one is.
    pub fn call(&self) -> Option<CallDesc> {
        self.call
    }

    /// The sequence number of the running call, or of the next one.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// Whether no call is running (the last one finished, or none began).
    pub fn is_idle(&self) -> bool {
        self.call.is_none()
    }

    /// The first failure, if the engine is poisoned.
    pub fn failure(&self) -> Option<EngineError> {
        self.failure
    }

    /// The deadline in ticks.
    pub fn timeout(&self) -> u64 {
        self.timeout
    }

    /// Sets the deadline (for the running call too).
    pub fn set_timeout(&mut self, timeout: u64) {
        self.timeout = timeout;
    }

    /// The channels' storage.
    pub fn channels(&self) -> &[Channel<M>] {
        self.channels.as_ref()
    }

    /// Channel `c`, if the storage has it.
    #[inline]
    pub fn channel(&self, c: ChannelId) -> Option<&Channel<M>> {
        self.channels.as_ref().get(usize::from(c.0))
    }

    /// The connection counters of channel `c` (zero for one never used).
    pub fn link(&self, c: ChannelId) -> LinkState {
        self.channel(c).map(Channel::link).unwrap_or_default()
    }

    /// What channel `c` waits for ([`Blocked::Done`] when it is not part
    /// of a running call).
    pub fn blocked_on(&self, c: ChannelId) -> Blocked {
        if self.tree_call {
            return self.tree_blocked_on(c).blocked;
        }
        match self.channel(c) {
            Some(ch) if self.open & bit(u32::from(c.0)) != 0 => ch.blocked_on(),
            Some(ch) if ch.machine.as_ref().is_some_and(|m| m.error().is_some()) => Blocked::Failed,
            _ => Blocked::Done,
        }
    }

    /// The machine of channel `c` (the running call's or the last one's).
    #[inline]
    pub fn machine(&self, c: ChannelId) -> Option<&Machine<M>> {
        self.channel(c).and_then(Channel::machine)
    }

    /// The outstanding exec of channel `c`, if one is.
    #[inline]
    pub fn pending(&self, c: ChannelId) -> Option<Exec> {
        self.machine(c).and_then(Machine::pending)
    }

    #[inline]
    fn check(&self) -> Result<(), EngineError> {
        if self.poisoned {
            return Err(EngineError::Poisoned);
        }
        Ok(())
    }

    #[cold]
    fn poison(&mut self, e: EngineError) -> EngineError {
        if self.failure.is_none() {
            crate::log::warning!("ringcc: engine failed");
            self.failure = Some(e);
            self.poisoned = true;
        }
        e
    }

    /// Stops the running call (and every later one): what a backend does
    /// when its transport failed or a peer asked to abort. The backend
    /// keeps the cause; the engine answers [`EngineError::Poisoned`] from
    /// now on, with [`EngineError::Aborted`] as its failure.
    pub fn abort(&mut self) {
        self.poison(EngineError::Aborted);
    }

    /// Starts `call` (the `plan` built for it on this rank) at time `now`:
    /// one machine per channel of the plan, walking `ring(channel)`, from
    /// the counters the previous call left. Returns the call's descriptor
    /// (with its sequence number) — the header both neighbours check.
    ///
    /// A refusal (a plan that does not match the call, a geometry the
    /// plan's chunks do not fit, too few channels) leaves the engine as it
    /// was; an early header of the predecessor's that differs from this
    /// call poisons it (the peers disagree).
    pub fn start(
        &mut self,
        now: u64,
        call: &Call,
        plan: &Plan,
        geometry: FifoGeometry,
        mut ring: impl FnMut(ChannelId) -> M,
    ) -> Result<CallDesc, EngineError> {
        let used = plan.channels();
        let capacity = self.capacity();
        let desc = self.admit(call, used, capacity)?;
        let rank = self.rank;
        let r = install(self.channels.as_mut(), used, capacity, |id, ch| {
            let link = ch.link();
            let steps = plan
                .steps(id, rank, ring(id))
                .map_err(|e| machine_error(id, "Plan::steps", e))?;
            let m = Machine::new(desc, steps, geometry, link)
                .map_err(|e| machine_error(id, "Machine::new", e))?;
            ch.link = link;
            ch.machine = Some(m);
            Ok(())
        });
        r.map_err(|e| self.refuse(e))?;
        self.begin(desc, used, false, now);
        Ok(desc)
    }

    /// What every start checks first: a healthy, idle engine with room for
    /// `used` of its `capacity` channels; the call's descriptor.
    fn admit(&self, call: &Call, used: u32, capacity: u32) -> Result<CallDesc, EngineError> {
        self.check()?;
        if self.call.is_some() {
            return Err(EngineError::Busy);
        }
        if used > capacity {
            return Err(EngineError::BadChannel {
                channel: used.saturating_sub(1),
                capacity,
            });
        }
        Ok(call.desc(self.seq))
    }

    /// A start that failed: a predecessor's header that differs from this
    /// call is the peers' failure, not a refusal, and poisons; anything
    /// else leaves the engine as it was.
    fn refuse(&mut self, e: EngineError) -> EngineError {
        let peer = matches!(
            e.core(),
            Some(Error::MismatchedCall { .. } | Error::Protocol(_))
        );
        if peer {
            self.poison(e)
        } else {
            e
        }
    }

    /// The call `desc` runs on the first `used` channels from `now`.
    fn begin(&mut self, desc: CallDesc, used: u32, tree: bool, now: u64) {
        self.call = Some(desc);
        self.tree_call = tree;
        self.used = u8::try_from(used).unwrap_or(u8::MAX);
        self.open = mask(used);
        self.dirty = self.open;
        self.cursor = 0;
        self.last_progress = now;
    }

    /// Channels in the storage that calls may use.
    #[inline]
    fn capacity(&self) -> u32 {
        capacity(self.channels.as_ref())
    }

    /// Feeds channel `c` what its transport reported at time `now`.
    /// (Always inlined: it is most of a backend's per-event work, and a
    /// call per event cost the simulator a sixth of its speed.)
    ///
    /// Events may come for a channel whose machine is done, and between
    /// calls: a faster predecessor's next header and data are kept for the
    /// next call.
    #[inline(always)]
    pub fn handle(&mut self, now: u64, c: ChannelId, event: Event) -> Result<(), EngineError> {
        self.check()?;
        let capacity = self.capacity();
        // The first call an early header on a channel without a machine
        // may belong to: the next one (the running call leaves the channel
        // out), or the one about to start. A later one is fine too when the
        // calls in between leave the channel out.
        let next_seq = match self.call {
            Some(_) => self.seq.wrapping_add(1),
            None => self.seq,
        };
        let i = u32::from(c.0);
        let Some(ch) = self
            .channels
            .as_mut()
            .get_mut(i as usize)
            .filter(|_| i < capacity)
        else {
            return Err(EngineError::BadChannel {
                channel: i,
                capacity,
            });
        };
        let r = match ch.machine.as_mut() {
            Some(m) => machine_event(m, event),
            None => idle_event(&mut ch.link, next_seq, event),
        };
        if let Err((during, source)) = r {
            return Err(self.poison(EngineError::Machine {
                channel: c,
                during,
                source,
            }));
        }
        // `i` is below the capacity, at most 64: no check needed.
        self.dirty |= 1u64.wrapping_shl(i) & self.open;
        self.last_progress = now;
        Ok(())
    }

    /// The next action: `(channel, action)` to carry out, or `None` when
    /// every channel waits for an event (or no call runs). An
    /// [`Action::Done`] is handed out once per channel; after the last
    /// channel's the call is over ([`is_idle`](Engine::is_idle)) and the
    /// next may start.
    #[must_use = "actions must be carried out"]
    #[inline(always)]
    pub fn poll(&mut self) -> Result<Option<(ChannelId, Action)>, EngineError> {
        self.check()?;
        self.poll_marked(|e, c| match e.channels.as_mut().get_mut(c) {
            Some(Channel {
                machine: Some(m), ..
            }) => m.poll_action(),
            _ => Ok(None),
        })
    }

    /// The next action of channel `c` alone, as a [`Next`]: what
    /// [`poll`](Engine::poll) hands out for it, with the same
    /// bookkeeping, but without building the exec (after [`Next::Exec`],
    /// [`pending`](Engine::pending) has it). For a backend that drives one
    /// channel at a time — each event followed by polling its channel
    /// until it waits — this skips the search over the others and the
    /// copies of a hundred-byte action. A channel with no event since it
    /// last answered `None` is not asked again; one out of range, or not
    /// part of the running call, has no action.
    #[must_use = "actions must be carried out"]
    #[inline(always)]
    pub fn poll_channel(&mut self, c: ChannelId) -> Result<Option<Next>, EngineError> {
        self.check()?;
        let i = u32::from(c.0);
        let b = bit(i);
        if self.dirty & b == 0 {
            return Ok(None);
        }
        let polled = match self.channels.as_mut().get_mut(i as usize) {
            Some(Channel {
                machine: Some(m), ..
            }) => m.poll_next(),
            _ => Ok(None),
        };
        self.polled(c, b, polled)
    }

    /// [`handle`](Engine::handle) then [`poll_channel`](Engine::poll_channel)
    /// on the same channel, with the same results and bookkeeping, the
    /// channel looked up once: what a backend that drives one channel at
    /// a time does with nearly every event (its first poll comes with the
    /// event; it polls on with `poll_channel` until `None`).
    #[must_use = "actions must be carried out"]
    #[inline(always)]
    pub fn handle_poll(
        &mut self,
        now: u64,
        c: ChannelId,
        event: Event,
    ) -> Result<Option<Next>, EngineError> {
        self.check()?;
        let i = u32::from(c.0);
        let b = bit(i);
        let open = self.open & b != 0;
        let Some(m) = machine_at(self.channels.as_mut(), i) else {
            // No machine (or no such channel): the event only moves the
            // link's counters, or is refused.
            self.handle(now, c, event)?;
            return self.poll_channel(c);
        };
        if let Err(e) = feed(m, c, event) {
            return Err(self.poison(e));
        }
        self.last_progress = now;
        // A channel outside the running call has no action (and is never
        // marked).
        if !open {
            return Ok(None);
        }
        let polled = m.poll_next();
        self.polled(c, b, polled)
    }

    /// The bookkeeping after channel `c` (bit `b`) was polled: marked
    /// while it has actions, unmarked once it waits, closed when done.
    #[inline(always)]
    fn polled(
        &mut self,
        c: ChannelId,
        b: u64,
        polled: Result<Option<Next>, Error>,
    ) -> Result<Option<Next>, EngineError> {
        match polled {
            Ok(Some(Next::ReturnCredit { head })) => {
                self.dirty |= b;
                Ok(Some(Next::ReturnCredit { head }))
            }
            Ok(Some(Next::Exec)) => {
                // An exec outstanding: nothing more until an event.
                self.dirty &= !b;
                Ok(Some(Next::Exec))
            }
            Ok(Some(Next::Done)) => {
                self.dirty &= !b;
                self.open &= !b;
                if self.open == 0 {
                    self.finish();
                }
                Ok(Some(Next::Done))
            }
            Ok(None) => {
                self.dirty &= !b;
                Ok(None)
            }
            Err(source) => Err(self.poison(EngineError::Machine {
                channel: c,
                during: "poll_action",
                source,
            })),
        }
    }

    /// One event's whole loop on channel `c`, in one call: hands the
    /// machine `head` (the newest credit that arrived, if any) and `event`
    /// (if any), then polls until an exec, `Done` or a wait, returning the
    /// credit that comes due on the way. The same results and bookkeeping
    /// as [`handle`](Engine::handle) for `head` and
    /// [`handle_poll`](Engine::handle_poll) for `event`, followed by
    /// [`poll_channel`](Engine::poll_channel) until it answers anything
    /// but a credit, [`waits_for_credit`](Engine::waits_for_credit) for a wait — with
    /// the checks, the channel lookup and the deadline's clock done once,
    /// not on every call: what a backend that drives one channel at a
    /// time pays per event. (The simulator, which drives every event so,
    /// runs 1.5 % fewer instructions with it than with those calls.)
    ///
    /// A second credit due before the loop ends comes back as
    /// [`Drove::Credit`]: return both, then call again with no event.
    /// (A machine owes one credit at a time, so today's never does; the
    /// variant keeps the call right if one ever may.) Refused events and
    /// channels fail as with `handle` (the `Err`).
    #[must_use = "the credit and the exec must be carried out"]
    #[inline(always)]
    pub fn drive(
        &mut self,
        now: u64,
        c: ChannelId,
        head: Option<u64>,
        event: Option<Event>,
    ) -> Result<Driven, EngineError> {
        self.check()?;
        let i = u32::from(c.0);
        let b = bit(i);
        let open = self.open & b != 0;
        let Some(m) = machine_at(self.channels.as_mut(), i) else {
            // No machine (or no such channel): the events only move the
            // link's counters, or are refused; nothing to poll.
            if let Some(h) = head {
                self.handle(now, c, Event::Head(h))?;
            }
            if let Some(ev) = event {
                self.handle(now, c, ev)?;
            }
            return Ok(Driven {
                credit: None,
                then: Drove::Wait { credit: false },
            });
        };
        if let Some(h) = head {
            if let Err(e) = feed(m, c, Event::Head(h)) {
                return Err(self.poison(e));
            }
            self.last_progress = now;
        }
        if let Some(ev) = event {
            if let Err(e) = feed(m, c, ev) {
                return Err(self.poison(e));
            }
            self.last_progress = now;
        }
        // A channel outside the running call has no action.
        if !open {
            return Ok(Driven {
                credit: None,
                then: Drove::Wait { credit: false },
            });
        }
        let mut credit = None;
        let then = loop {
            match m.poll_next() {
                Ok(Some(Next::ReturnCredit { head })) if credit.is_none() => credit = Some(head),
                Ok(Some(Next::ReturnCredit { head })) => {
                    self.dirty |= b;
                    break Drove::Credit { head };
                }
                Ok(Some(Next::Exec)) => {
                    self.dirty &= !b;
                    break Drove::Exec;
                }
                Ok(Some(Next::Done)) => {
                    self.dirty &= !b;
                    self.open &= !b;
                    if self.open == 0 {
                        self.finish();
                    }
                    break Drove::Done;
                }
                Ok(None) => {
                    self.dirty &= !b;
                    break Drove::Wait {
                        credit: m.waits_for_credit(),
                    };
                }
                Err(source) => {
                    self.poison(EngineError::Machine {
                        channel: c,
                        during: "poll_action",
                        source,
                    });
                    break Drove::Failed;
                }
            }
        };
        Ok(Driven { credit, then })
    }

    /// Whether channel `c` waits for credit from its successor:
    /// [`blocked_on`](Engine::blocked_on) is [`Blocked::Credit`], without
    /// building the report.
    #[inline]
    pub fn waits_for_credit(&self, c: ChannelId) -> bool {
        match self.channel(c) {
            Some(ch) if self.open & bit(u32::from(c.0)) != 0 => {
                ch.machine.as_ref().is_some_and(Machine::waits_for_credit)
            }
            _ => false,
        }
    }

    /// Whether channel `c`'s running call will receive again
    /// ([`Machine::receives_ahead`]): asked after an
    /// [`Action::ReturnCredit`], false means the credit is the call's last
    /// on the channel. False for a channel not in the running call.
    #[inline]
    pub fn receives_ahead(&self, c: ChannelId) -> bool {
        match self.channel(c) {
            Some(ch) if self.open & bit(u32::from(c.0)) != 0 => {
                ch.machine.as_ref().is_some_and(Machine::receives_ahead)
            }
            _ => false,
        }
    }

    /// The tree storage.
    pub fn tree_channels(&self) -> &[TreeChannel] {
        self.trees.as_ref()
    }

    /// Hands the engine new tree storage while no call runs, returning
    /// the old: for a backend that allocates it at a rank's first tree
    /// call rather than for every engine that may never run one. The tree
    /// connections' counters live in the storage, so a backend swaps only
    /// storage that never ran a call (or starts the new over with counters
    /// at zero on every rank). [`Busy`](EngineError::Busy) while a call
    /// runs, with the storage left as it was.
    pub fn replace_trees(&mut self, trees: T) -> Result<T, EngineError> {
        if self.call.is_some() {
            return Err(EngineError::Busy);
        }
        Ok(core::mem::replace(&mut self.trees, trees))
    }

    /// The tree machine of channel `c` (the running tree call's or the
    /// last one's).
    pub fn tree_machine(&self, c: ChannelId) -> Option<&TreeMachine> {
        self.trees
            .as_ref()
            .get(usize::from(c.0))
            .and_then(TreeChannel::machine)
    }

    /// The outstanding tree exec of channel `c`, if one is (the up
    /// stream's first; see [`pending_tree_execs`](Engine::pending_tree_execs)).
    pub fn pending_tree(&self, c: ChannelId) -> Option<TreeExec> {
        self.tree_machine(c).and_then(TreeMachine::pending)
    }

    /// The outstanding tree execs of channel `c`: the up stream's (a
    /// root's only stream) and the down stream's, which run concurrently.
    pub fn pending_tree_execs(&self, c: ChannelId) -> [Option<TreeExec>; 2] {
        self.tree_machine(c)
            .map_or([None, None], TreeMachine::pending_execs)
    }

    /// Whether the running (or last) call is a tree call.
    pub fn is_tree_call(&self) -> bool {
        self.tree_call
    }

    /// What channel `c` of the running tree call waits for, naming the
    /// connection ([`Blocked::Done`] when it is not part of one).
    pub fn tree_blocked_on(&self, c: ChannelId) -> TreeBlocked {
        let open = self.tree_call && self.open & bit(u32::from(c.0)) != 0;
        match self.tree_machine(c) {
            Some(m) if open => m.blocked_on(),
            Some(m) if m.error().is_some() => TreeBlocked {
                blocked: Blocked::Failed,
                conn: None,
            },
            _ => TreeBlocked {
                blocked: Blocked::Done,
                conn: None,
            },
        }
    }

    /// Starts a tree AllReduce `call` (the `plan` built for it) at time
    /// `now`: one [`TreeMachine`] per channel of the plan, channel `c`
    /// over `tree(c)` (tree `c mod 2` of the double binary tree), from the
    /// counters the previous tree call left. Returns the call's descriptor,
    /// the header every tree neighbour checks. Refusals and failures as
    /// [`start`](Engine::start)'s; a call that is not an AllReduce, or a
    /// tree that does not have the plan's ranks, is refused.
    pub fn start_tree<O: TreeOrder>(
        &mut self,
        now: u64,
        call: &Call,
        plan: &TreePlan,
        geometry: FifoGeometry,
        mut tree: impl FnMut(ChannelId) -> O,
    ) -> Result<CallDesc, EngineError> {
        let used = plan.channels();
        let capacity = self.capacity().min(capacity(self.trees.as_ref()));
        let desc = self.admit(call, used, capacity)?;
        let rank = self.rank;
        let r = install(self.trees.as_mut(), used, capacity, |id, ch| {
            let links = ch.links();
            let t = tree(id);
            let p = if t.ranks() == plan.ranks() {
                t.peers(rank)
            } else {
                Err(Error::BadTopology)
            }
            .map_err(|e| machine_error(id, "TreeOrder::peers", e))?;
            let steps = plan
                .steps(id, p)
                .map_err(|e| machine_error(id, "TreePlan::steps", e))?;
            let present = p
                .down
                .iter()
                .enumerate()
                .filter(|(_, d)| d.is_some())
                .fold(u8::from(p.up.is_some()), |m, (i, _)| {
                    m | 2u8.checked_shl(i as u32).unwrap_or(0)
                });
            let m = TreeMachine::new(desc, plan, steps, present, geometry, &links)
                .map_err(|e| machine_error(id, "TreeMachine::new", e))?;
            ch.links = links;
            ch.machine = Some(m);
            Ok(())
        });
        r.map_err(|e| self.refuse(e))?;
        self.begin(desc, used, true, now);
        Ok(desc)
    }

    /// Feeds channel `c`'s tree connection `conn` what its transport
    /// reported at time `now` ([`Event::Tail`] / [`Event::Header`] from
    /// the peer on `conn`, [`Event::Head`] its credit; `conn` is ignored
    /// for [`Event::ExecDone`], which completes the channel's one
    /// outstanding exec — with both of a non-root rank's streams running,
    /// say which with [`handle_tree_exec_done`](Engine::handle_tree_exec_done)).
    /// As with [`handle`](Engine::handle), events may come between tree
    /// calls and are kept for the next one.
    pub fn handle_tree(
        &mut self,
        now: u64,
        c: ChannelId,
        conn: TreeConn,
        event: Event,
    ) -> Result<(), EngineError> {
        self.handle_tree_inner(now, c, conn, event, None)
    }

    /// Channel `c`'s outstanding tree exec going `dir` ([`TreeExec::dir`])
    /// completed at time `now`: a non-root rank runs its up and down
    /// streams concurrently, one exec each.
    pub fn handle_tree_exec_done(
        &mut self,
        now: u64,
        c: ChannelId,
        dir: TreeDir,
    ) -> Result<(), EngineError> {
        self.handle_tree_inner(now, c, TreeConn::Up, Event::ExecDone, Some(dir))
    }

    fn handle_tree_inner(
        &mut self,
        now: u64,
        c: ChannelId,
        conn: TreeConn,
        event: Event,
        dir: Option<TreeDir>,
    ) -> Result<(), EngineError> {
        self.check()?;
        let next_seq = match self.call {
            Some(_) => self.seq.wrapping_add(1),
            None => self.seq,
        };
        let i = u32::from(c.0);
        let capacity = capacity(self.trees.as_ref());
        let Some(ch) = self
            .trees
            .as_mut()
            .get_mut(i as usize)
            .filter(|_| i < capacity)
        else {
            return Err(EngineError::BadChannel {
                channel: i,
                capacity,
            });
        };
        let r = match ch.machine.as_mut() {
            Some(m) => match event {
                Event::ExecDone => match dir {
                    Some(d) => m.handle_exec_done_dir(d),
                    None => m.handle_exec_done(),
                }
                .map_err(|e| ("handle_exec_done", e)),
                Event::Tail(t) => m.handle_tail(conn, t).map_err(|e| ("handle_tail", e)),
                Event::Header { step, desc } => m
                    .handle_header(conn, step, desc)
                    .map_err(|e| ("handle_header", e)),
                Event::Head(h) => m.handle_head(conn, h).map_err(|e| ("handle_head", e)),
            },
            None => match ch.links.get_mut(conn.index()) {
                Some(link) => idle_event(link, next_seq, event),
                None => Err(("handle_tree", Error::BadTopology)),
            },
        };
        if let Err((during, source)) = r {
            return Err(self.poison(EngineError::Machine {
                channel: c,
                during,
                source,
            }));
        }
        if self.tree_call {
            self.dirty |= bit(i) & self.open;
        }
        self.last_progress = now;
        Ok(())
    }

    /// The next action of the running tree call: `(channel, action)`, or
    /// `None` when every channel waits for an event (or no tree call
    /// runs). [`TreeAction::Done`] comes once per channel; after the last
    /// one the call is over.
    #[must_use = "actions must be carried out"]
    pub fn poll_tree(&mut self) -> Result<Option<(ChannelId, TreeAction)>, EngineError> {
        self.check()?;
        if !self.tree_call {
            return Ok(None);
        }
        self.poll_marked(|e, c| match e.trees.as_mut().get_mut(c) {
            Some(TreeChannel {
                machine: Some(m), ..
            }) => m.poll_action(),
            _ => Ok(None),
        })
    }

    /// What [`poll`](Engine::poll) and [`poll_tree`](Engine::poll_tree)
    /// share: the marked channels, round robin from the cursor, each asked
    /// once by `machine` (its machine's `poll_action`) until one has an
    /// action. A channel with an exec outstanding, or done, is unmarked
    /// (an event marks it again); the last `Done` finishes the call.
    #[inline(always)]
    fn poll_marked<A: Polled>(
        &mut self,
        mut machine: impl FnMut(&mut Self, usize) -> Result<Option<A>, Error>,
    ) -> Result<Option<(ChannelId, A)>, EngineError> {
        while self.dirty != 0 {
            let c = next_bit(self.dirty, u32::from(self.cursor));
            let id = ChannelId(u8::try_from(c).unwrap_or(u8::MAX));
            match machine(self, c as usize) {
                Ok(Some(action)) => {
                    self.cursor = u8::try_from(c).unwrap_or(0);
                    // A machine with an exec outstanding has nothing more
                    // until an event (which marks it again).
                    if action.is_exec() {
                        self.dirty &= !bit(c);
                    }
                    if action.is_done() {
                        self.dirty &= !bit(c);
                        self.open &= !bit(c);
                        if self.open == 0 {
                            self.finish();
                        }
                    }
                    return Ok(Some((id, action)));
                }
                Ok(None) => self.dirty &= !bit(c),
                Err(source) => {
                    return Err(self.poison(EngineError::Machine {
                        channel: id,
                        during: "poll_action",
                        source,
                    }))
                }
            }
        }
        Ok(None)
    }

    fn finish(&mut self) {
        self.call = None;
        self.seq = self.seq.wrapping_add(1);
        self.dirty = 0;
    }

    /// When [`handle_timeout`](Engine::handle_timeout) must be called if
    /// nothing happens before: `None` without a running call.
    pub fn poll_timeout(&self) -> Option<u64> {
        match self.call {
            Some(_) if !self.poisoned => Some(self.last_progress.saturating_add(self.timeout)),
            _ => None,
        }
    }

    /// Time passed: at or past the deadline with a call still running,
    /// the engine is poisoned with a [`Stall`] report.
    pub fn handle_timeout(&mut self, now: u64) -> Result<(), EngineError> {
        self.check()?;
        match self.poll_timeout() {
            Some(deadline) if now >= deadline => {
                let stall = self.stall(now);
                Err(self.poison(EngineError::Timeout(stall)))
            }
            _ => Ok(()),
        }
    }

    /// What the rank waits for at `now`: the first open channel that is
    /// blocked (or the first open one).
    pub fn stall(&self, now: u64) -> Stall {
        let mut first = None;
        for c in 0..u32::from(self.used) {
            if self.open & bit(c) == 0 {
                continue;
            }
            let id = ChannelId(u8::try_from(c).unwrap_or(u8::MAX));
            let b = self.blocked_on(id);
            if first.is_none() || b != Blocked::Ready {
                first = Some((id, b));
                if b != Blocked::Ready {
                    break;
                }
            }
        }
        let (channel, blocked) = first.unwrap_or((ChannelId(0), Blocked::Done));
        Stall {
            rank: self.rank,
            seq: self.seq,
            channel,
            blocked,
            open: self.open.count_ones(),
            waited: now.saturating_sub(self.last_progress),
        }
    }
}

/// An event for a channel without a machine yet (never used): only the
/// predecessor's header for call `seq` or a later one and its data may
/// come early.
/// A channel's machine failed to build during `during`.
fn machine_error(channel: ChannelId, during: &'static str, source: Error) -> EngineError {
    EngineError::Machine {
        channel,
        during,
        source,
    }
}

/// Gives the first `used` of `slots` a new call's machine with `build`.
/// On a failure the slots already given one go back to none (their
/// carried counters untouched: a refused start loses nothing).
fn install<C: Unset>(
    slots: &mut [C],
    used: u32,
    capacity: u32,
    mut build: impl FnMut(ChannelId, &mut C) -> Result<(), EngineError>,
) -> Result<(), EngineError> {
    for c in 0..used {
        let id = ChannelId(u8::try_from(c).unwrap_or(u8::MAX));
        let r = match slots.get_mut(c as usize) {
            Some(slot) => build(id, slot),
            None => Err(EngineError::BadChannel {
                channel: c,
                capacity,
            }),
        };
        if let Err(e) = r {
            for slot in slots.iter_mut().take(c as usize) {
                slot.unset();
            }
            return Err(e);
        }
    }
    Ok(())
}

/// A channel slot whose machine can be taken away.
trait Unset {
    fn unset(&mut self);
}

impl<M> Unset for Channel<M> {
    fn unset(&mut self) {
        self.machine = None;
    }
}

impl Unset for TreeChannel {
    fn unset(&mut self) {
        self.machine = None;
    }
}

/// The channels of `channels` that calls may use: at most
/// [`MAX_CHANNELS`] (so the count fits a `u32`, and a channel's bit a
/// `u64`).
#[inline(always)]
fn capacity<C>(channels: &[C]) -> u32 {
    channels.len().min(MAX_CHANNELS) as u32
}

/// The machine of channel `i` of `channels`, when the storage has that
/// channel within the capacity and a call gave it one. A branch, not a
/// select: the machine's address must not wait for the storage's length
/// (which, for a storage handle, is in the engine's line).
#[inline(always)]
fn machine_at<M>(channels: &mut [Channel<M>], i: u32) -> Option<&mut Machine<M>> {
    if i >= capacity(channels) {
        return None;
    }
    channels
        .get_mut(i as usize)
        .and_then(|ch| ch.machine.as_mut())
}

/// [`machine_event`] on channel `c`, a refusal as the engine's error
/// (which the caller poisons the engine with).
#[inline(always)]
fn feed<M: RingOrder>(m: &mut Machine<M>, c: ChannelId, event: Event) -> Result<(), EngineError> {
    machine_event(m, event).map_err(|(during, source)| EngineError::Machine {
        channel: c,
        during,
        source,
    })
}

/// Hands a running channel's machine `event`: the name of the handler
/// that refused it, with its error.
#[inline(always)]
fn machine_event<M: RingOrder>(
    m: &mut Machine<M>,
    event: Event,
) -> Result<(), (&'static str, Error)> {
    match event {
        Event::ExecDone => m.handle_exec_done().map_err(|e| ("handle_exec_done", e)),
        Event::Tail(t) => m.handle_tail(t).map_err(|e| ("handle_tail", e)),
        Event::Header { step, desc } => m
            .handle_header(step, desc)
            .map_err(|e| ("handle_header", e)),
        Event::Head(h) if h <= m.send_head() => Ok(()),
        Event::Head(h) => m.handle_head(h).map_err(|e| ("handle_head", e)),
    }
}

fn idle_event(link: &mut LinkState, seq: u64, event: Event) -> Result<(), (&'static str, Error)> {
    match event {
        Event::Tail(t) if t < link.recv_tail => Err((
            "handle_tail",
            Error::Protocol(ProtocolViolation::TailBackwards),
        )),
        Event::Tail(t) if t > link.recv_next.saturating_add(STEPS) => {
            Err(("handle_tail", Error::Protocol(ProtocolViolation::Overrun)))
        }
        Event::Tail(t) => {
            link.recv_tail = t;
            Ok(())
        }
        Event::Header { step, desc }
            if desc.seq >= seq && step == link.recv_next && link.early_header.is_none() =>
        {
            link.early_header = Some((step, desc));
            Ok(())
        }
        Event::Header { .. } => Err((
            "handle_header",
            Error::Protocol(ProtocolViolation::UnexpectedHeader),
        )),
        Event::Head(h) if h <= link.send_head => Ok(()),
        Event::Head(_) => Err(("handle_head", Error::Protocol(ProtocolViolation::HeadAhead))),
        Event::ExecDone => Err(("handle_exec_done", Error::NoExecPending)),
    }
}

const fn bit(c: u32) -> u64 {
    match 1u64.checked_shl(c) {
        Some(b) => b,
        None => 0,
    }
}

const fn mask(n: u32) -> u64 {
    match 1u64.checked_shl(n) {
        Some(b) => b.wrapping_sub(1),
        None => u64::MAX,
    }
}

/// The first set bit of `bits` at or after `from`, wrapping around
/// (`bits` is not zero).
fn next_bit(bits: u64, from: u32) -> u32 {
    let high = bits & !mask(from);
    if high != 0 {
        high.trailing_zeros()
    } else {
        bits.trailing_zeros()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_bit_wraps() {
        assert_eq!(next_bit(0b1010, 0), 1);
        assert_eq!(next_bit(0b1010, 2), 3);
        assert_eq!(next_bit(0b1010, 4), 1);
        assert_eq!(next_bit(1 << 63, 63), 63);
        assert_eq!(mask(64), u64::MAX);
        assert_eq!(mask(0), 0);
    }

    /// What an event reads of the engine fills its first cache line, with
    /// a storage handle; inline storage starts at the second line, so that
    /// a channel's address is the engine's plus a constant (the backend
    /// that prefetches a channel computes it so).
    #[test]
    fn the_hot_fields_fill_the_first_line() {
        use crate::topology::InOrderRing;
        use core::mem::{align_of, offset_of, size_of};
        type Boxed = Engine<InOrderRing, std::boxed::Box<[Channel<InOrderRing>]>>;
        type Inline = ArrayEngine<InOrderRing, 4>;
        assert_eq!(align_of::<Boxed>(), 64);
        for end in [
            offset_of!(Boxed, dirty) + 8,
            offset_of!(Boxed, open) + 8,
            offset_of!(Boxed, last_progress) + 8,
            offset_of!(Boxed, poisoned) + 1,
            offset_of!(Boxed, rank) + size_of::<Rank>(),
            offset_of!(Boxed, channels) + size_of::<std::boxed::Box<[Channel<InOrderRing>]>>(),
        ] {
            assert!(end <= 64, "{end}");
        }
        assert_eq!(offset_of!(Inline, channels), 64);
        assert_eq!(offset_of!(Inline, poisoned), offset_of!(Boxed, poisoned));
        assert_eq!(size_of::<Channel<InOrderRing>>() % 64, 0);
    }
}
