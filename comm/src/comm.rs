//! The per-rank [`Communicator`].

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ringcc_core::fifo::FifoGeometry;
use ringcc_core::{Call, Collective, DataType, Rank, ReduceOp};
use tracing::{debug, warn};

use crate::abort::AbortState;
use crate::connect::{connect, gather};
use crate::drive::{DriveConfig, Ring};
use crate::element::Element;
use crate::error::{Error, Result};
use crate::launch::Launch;
use crate::options::Options;
use crate::store::tcp::TcpStoreServer;
use crate::store::{abort as notice, PrefixStore, Store, ABORT_KEY};
use crate::transport::{PeerInfo, Transport};
use crate::work::{lock, Job, Queue, RawBufs, Work};

/// Makes the transports a communicator may use, in order of preference
/// (the first that reaches a hop carries it). Called once per
/// communicator (a split makes new ones).
pub type Transports = Arc<dyn Fn() -> Vec<Box<dyn Transport>> + Send + Sync>;

/// The counter of ranks that closed the communicator.
const CLOSED_KEY: &str = "closed";

/// Where a rank lands in a split ([`split_place`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SplitPlace {
    /// Its rank in the new group.
    pub rank: Rank,
    /// The new group's size.
    pub world: u32,
    /// The store prefix (and token suffix) that keeps the new group's
    /// keys apart from every other group's.
    pub prefix: String,
}

/// Split number `n` of a job (`ncclCommSplit`): every rank of `world`
/// posts its `(color, key)` under the store's `split/{n}` keys and reads
/// everyone's; the ranks of one color form a group, ordered by key, then
/// by old rank. `None` for a rank without a color (it joins no group).
/// Every rank calls it with the same `n`; nothing waits past `deadline`.
pub fn split_place(
    store: &dyn Store,
    n: u64,
    (rank, world): (Rank, u32),
    (color, key): (Option<u32>, u32),
    deadline: Instant,
) -> Result<Option<SplitPlace>> {
    let mine = format!("{}:{key}", color.map_or(-1, i64::from));
    let all = gather(
        store,
        &format!("split/{n}"),
        (rank, mine.as_bytes()),
        world,
        deadline,
    )?;
    let Some(color) = color else {
        return Ok(None);
    };
    let mut members = Vec::new();
    for (r, v) in all.iter().enumerate() {
        let s = String::from_utf8_lossy(v);
        let (c, k) = s
            .split_once(':')
            .and_then(|(c, k)| Some((c.parse::<i64>().ok()?, k.parse::<u32>().ok()?)))
            .ok_or_else(|| Error::Store {
                call: "get",
                key: format!("split/{n}/{r}"),
                source: format!("not a split request: {s:?}").into(),
            })?;
        if c == i64::from(color) {
            members.push((k, r as u32));
        }
    }
    members.sort_unstable();
    let new_rank = members
        .iter()
        .position(|&(_, r)| r == rank.0)
        .ok_or_else(|| Error::Internal("this rank is missing from its split".into()))?;
    Ok(Some(SplitPlace {
        rank: Rank(new_rank as u32),
        world: members.len() as u32,
        prefix: format!("split{n}/c{color}"),
    }))
}

/// How often the watcher looks for the job's abort notice: each look is
/// a round trip to the store and a wake-up of its serving thread in rank
/// 0's process. Every 20 ms, those cost a 2-rank AllReduce over verbs in
/// the Soft-RoCE VM (where each rank's CPU is also its NIC) 4–8 % of its
/// bandwidth; every 100 ms an abort still reaches every rank within a
/// tenth of a second, far inside any call's deadline. (A closing
/// communicator wakes its watcher at once: it parks, it does not sleep.)
const WATCH_EVERY: Duration = Duration::from_millis(100);

/// How often the rank serving the store looks whether every rank has
/// closed (only while it closes).
const CLOSE_POLL: Duration = Duration::from_millis(20);

/// Store failures in a row after which the watcher takes the store (rank
/// 0's process, for the built-in one) for dead and aborts.
const STORE_FAILURES: u32 = 5;

struct Shared {
    rank: Rank,
    world: u32,
    ring: Mutex<Ring>,
    queue: Mutex<Queue>,
    queued: Condvar,
    abort: Arc<AbortState>,
    store: Arc<dyn Store>,
}

impl Shared {
    /// Runs queued calls front to back, until `until` is done (or the
    /// queue is empty). The caller holds the ring.
    fn run_queue(&self, ring: &mut Ring, until: Option<&Arc<Job>>) {
        loop {
            if until.is_some_and(|j| j.is_done()) {
                return;
            }
            let Some(job) = lock(&self.queue).jobs.pop_front() else {
                return;
            };
            // SAFETY: the queue's contract (`RawBufs`): whoever queued the
            // job keeps its memory valid and untouched until it is done,
            // which is after this returns.
            let r = match unsafe { job.bufs.buffers(&job.call, self.world, self.rank.0) } {
                Ok(mut bufs) => std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    ring.run(&job.call, &mut bufs)
                }))
                .unwrap_or_else(|_| {
                    let e = Error::Internal("a call panicked".into());
                    ring.poison(e.to_string());
                    Err(e)
                }),
                Err(e) => Err(e),
            };
            if let Err(e) = &r {
                self.tell_everyone(e);
            }
            job.finish(r);
        }
    }

    /// A failure of this rank's call becomes the job's abort notice (so
    /// every rank stops within a watcher period, not at its deadline),
    /// unless it is a refused buffer (nothing started) or an abort
    /// already.
    fn tell_everyone(&self, e: &Error) {
        if matches!(
            e,
            Error::Aborted { .. } | Error::BadBuffer { .. } | Error::Poisoned { .. }
        ) {
            return;
        }
        let reason = format!("rank {} failed: {e}", self.rank);
        self.abort.set(Some(self.rank), reason.clone());
        if let Err(se) = self
            .store
            .set(ABORT_KEY, &notice::notice(Some(self.rank), &reason))
        {
            warn!(
                "rank {}: could not publish the abort notice: {se}",
                self.rank
            );
        }
    }
}

/// One rank of a job. Calls may come from any thread; they run in the
/// order they were issued. See the crate docs.
pub struct Communicator {
    shared: Arc<Shared>,
    token: String,
    options: Options,
    transports: Transports,
    peers: Vec<PeerInfo>,
    hops: Vec<(&'static str, &'static str)>,
    /// Every connection's FIFO (the options', else the ring's
    /// transports').
    geometry: FifoGeometry,
    /// Bytes of a call's larger buffer per channel it uses (the
    /// options', else the ring's transports').
    channel_bytes: u64,
    splits: AtomicU64,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    /// Rank 0's store, when this communicator serves it (dropped last).
    server: Option<TcpStoreServer>,
    /// Whether the store is the built-in one (served by rank 0's
    /// `server`, or by the parent of a split): then only the serving
    /// rank waits at close for the others to count out. With a store
    /// handed in (torch's, say), rank 0 waits: frameworks serve the
    /// store there.
    builtin_store: bool,
}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Communicator")
            .field("rank", &self.shared.rank)
            .field("world", &self.shared.world)
            .field("hops", &self.hops)
            .finish_non_exhaustive()
    }
}

impl Communicator {
    /// Joins the job of `token` as `rank` of `world`, bootstrapping over
    /// `store` (every rank hands in a store reaching the same keys).
    pub fn new(
        rank: Rank,
        world: u32,
        store: Arc<dyn Store>,
        token: &str,
        options: Options,
        transports: Transports,
    ) -> Result<Communicator> {
        options.validate()?;
        if world == 0 || rank.0 >= world || world as usize > ringcc_core::MAX_RANKS {
            return Err(Error::BadConfig(format!(
                "rank {rank} of {world} ranks (at most {})",
                ringcc_core::MAX_RANKS
            )));
        }
        let mut ts = transports();
        let connected = match connect(&*store, token, rank, world, &options, &mut ts) {
            Ok(c) => c,
            Err(e) => {
                let reason = format!("rank {rank} failed to connect: {e}");
                let _ = store.set(ABORT_KEY, &notice::notice(Some(rank), &reason));
                return Err(e);
            }
        };
        let abort = Arc::new(AbortState::default());
        let mut nodes: Vec<&str> = connected.peers.iter().map(|p| p.node.as_str()).collect();
        let local_ranks = nodes.iter().filter(|&&n| n == options.node).count();
        nodes.sort_unstable();
        nodes.dedup();
        let protos = crate::proto::job_protocols(
            connected
                .peers
                .iter()
                .flat_map(|p| p.transports.keys().map(String::as_str)),
            options.protos,
        )?;
        let tuner = crate::proto::host_tuner(
            world,
            u32::try_from(nodes.len()).unwrap_or(u32::MAX),
            options.channels,
            options.algos,
            protos,
        )?;
        let channel_bytes = connected.channel_bytes;
        let geometry = connected.geometry;
        let drive = DriveConfig {
            geometry,
            chunk_bytes: options.chunk_bytes,
            channel_bytes,
            tuner,
            timeout: options.timeout,
            spin: options.spin,
            hot: crate::drive::spin_hot(
                local_ranks,
                std::thread::available_parallelism().map_or(1, |n| n.get()),
            ),
        };
        let ring = Ring::new(
            rank,
            connected.order,
            drive,
            options.channels,
            connected.links,
            Arc::clone(&abort),
            connected.bell,
        );
        // The transports' listeners are no longer needed.
        drop(ts);
        let shared = Arc::new(Shared {
            rank,
            world,
            ring: Mutex::new(ring),
            queue: Mutex::new(Queue::default()),
            queued: Condvar::new(),
            abort,
            store,
        });
        let stop = Arc::new(AtomicBool::new(false));
        let threads = vec![
            spawn("ringcc-progress", {
                let s = Arc::clone(&shared);
                move || progress(&s)
            })?,
            spawn("ringcc-watch", {
                let (s, stop) = (Arc::clone(&shared), Arc::clone(&stop));
                move || watch(&s, &stop)
            })?,
        ];
        debug!(rank = rank.0, world, hops = ?connected.hops, "communicator ready");
        Ok(Communicator {
            shared,
            token: token.to_owned(),
            options,
            transports,
            peers: connected.peers,
            hops: connected.hops,
            geometry,
            channel_bytes,
            splits: AtomicU64::new(0),
            stop,
            threads,
            server: None,
            builtin_store: false,
        })
    }

    /// Joins the job a launcher described (see [`Launch`]): rank 0
    /// serves the built-in TCP store at the launch address (on that
    /// address, not on every interface), every rank connects to it
    /// with the job token, and the communicator bootstraps over it.
    pub fn from_launch(
        launch: Launch,
        options: Options,
        transports: Transports,
    ) -> Result<Communicator> {
        let (server, store) = launch.join_store(options.timeout)?;
        let mut c = Communicator::new(
            launch.rank,
            launch.world_size,
            Arc::new(store),
            &launch.token,
            options,
            transports,
        )?;
        c.server = server;
        c.builtin_store = true;
        Ok(c)
    }

    /// This rank.
    pub fn rank(&self) -> Rank {
        self.shared.rank
    }

    /// Number of ranks.
    pub fn world_size(&self) -> u32 {
        self.shared.world
    }

    /// The settings in use.
    pub fn options(&self) -> &Options {
        &self.options
    }

    /// Every connection's FIFO: [`Options::geometry`] when set, else
    /// what the ring's transports ask for (512 KiB slots on a ring with
    /// a TCP hop, 128 KiB otherwise).
    pub fn geometry(&self) -> FifoGeometry {
        self.geometry
    }

    /// Bytes of a call's larger buffer per channel it uses:
    /// [`Options::channel_bytes`] when set, else what the ring's
    /// transports ask for (one channel on a ring with a TCP hop).
    pub fn channel_bytes(&self) -> u64 {
        self.channel_bytes
    }

    /// Every rank's published info (node, pid, transports), by rank.
    pub fn peers(&self) -> &[PeerInfo] {
        &self.peers
    }

    /// Per channel, the transports of this rank's outgoing and incoming
    /// hops (`("shm", "tcp")`, …); empty for a job of one rank.
    pub fn hops(&self) -> &[(&'static str, &'static str)] {
        &self.hops
    }

    /// Calls completed so far.
    pub fn calls(&self) -> u64 {
        lock(&self.shared.ring).calls()
    }

    /// Payload bytes received straight into the calls' outputs so far:
    /// slices the call takes unchanged (a receive-only step, a receive
    /// copied out and sent on), read by an end that reads a stream (TCP)
    /// into the output instead of a slot the executor would copy from
    /// ([`Landing`](crate::transport::Landing)).
    pub fn landed_bytes(&self) -> u64 {
        lock(&self.shared.ring).landed_bytes()
    }

    /// Runs `call` out of place on bytes (`input` and `output` of
    /// [`Call::buffer_bytes`]), blocking until it is done.
    pub fn run(&self, call: &Call, input: &[u8], output: &mut [u8]) -> Result<()> {
        self.blocking(*call, RawBufs::apart(input, output))
    }

    /// Runs `call` in place in `buf` (NCCL's layout:
    /// [`Call::in_place_offsets`]), blocking until it is done.
    pub fn run_in_place(&self, call: &Call, buf: &mut [u8]) -> Result<()> {
        self.blocking(*call, RawBufs::in_place(buf))
    }

    fn blocking(&self, call: Call, bufs: RawBufs) -> Result<()> {
        let job = Job::new(call, bufs, None);
        lock(&self.shared.queue).jobs.push_back(Arc::clone(&job));
        {
            let mut ring = lock(&self.shared.ring);
            self.shared.run_queue(&mut ring, Some(&job));
        }
        // Done: by this thread or, before it got the ring, by another.
        job.wait()
    }

    /// Queues `call` out of place on owned buffers; [`Work::wait`] hands
    /// them back.
    pub fn submit<T: Element>(
        &self,
        call: Call,
        input: Vec<T>,
        mut output: Vec<T>,
    ) -> Result<Work<(Vec<T>, Vec<T>)>> {
        let bufs = RawBufs::apart(
            bytemuck::cast_slice(&input),
            bytemuck::cast_slice_mut(&mut output),
        );
        // Moving the vectors moves no element: the pointers stay valid.
        Ok(self.queue(call, bufs, Box::new((input, output))))
    }

    /// Queues `call` in place on an owned buffer; [`Work::wait`] hands
    /// it back.
    pub fn submit_in_place<T: Element>(&self, call: Call, mut buf: Vec<T>) -> Result<Work<Vec<T>>> {
        let bufs = RawBufs::in_place(bytemuck::cast_slice_mut(&mut buf));
        Ok(self.queue(call, bufs, Box::new(buf)))
    }

    /// Queues `call` out of place on memory the caller owns through
    /// `keep` (a binding's handle on a foreign buffer: a Python object,
    /// a framework's tensor); [`Work::wait`] hands `keep` back once the
    /// call is done. The lengths are checked against the call when it
    /// runs ([`Error::BadBuffer`] from the `Work`).
    ///
    /// # Safety
    /// `input .. input + input_len` must be readable and
    /// `output .. output + output_len` writable, the two ranges must not
    /// overlap, and both must stay valid — and untouched by anyone else —
    /// from this call until the `Work` reports the call done
    /// ([`Work::is_completed`], [`Work::wait`], or a
    /// [`Work::wait_timeout`] that returned `Ok(true)` or an error), or,
    /// if nobody waits, until `keep` is dropped (the communicator drops
    /// it only after the call is done). Keeping the memory alive through
    /// `keep` meets the first half of this.
    pub unsafe fn submit_raw<K: std::any::Any + Send>(
        &self,
        call: Call,
        input: *const u8,
        input_len: usize,
        output: *mut u8,
        output_len: usize,
        keep: K,
    ) -> Work<K> {
        let bufs = RawBufs {
            input,
            input_len,
            output,
            output_len,
            in_place: false,
        };
        self.queue(call, bufs, Box::new(keep))
    }

    /// Queues `call` in place (NCCL's layout,
    /// [`Call::in_place_offsets`]) on `buf .. buf + len`, memory the caller
    /// owns through `keep`; as [`submit_raw`](Self::submit_raw).
    ///
    /// # Safety
    /// `buf .. buf + len` must be readable and writable and stay valid
    /// and untouched by anyone else until the call is done, as for
    /// [`submit_raw`](Self::submit_raw).
    pub unsafe fn submit_raw_in_place<K: std::any::Any + Send>(
        &self,
        call: Call,
        buf: *mut u8,
        len: usize,
        keep: K,
    ) -> Work<K> {
        let bufs = RawBufs {
            input: buf.cast_const(),
            input_len: 0,
            output: buf,
            output_len: len,
            in_place: true,
        };
        self.queue(call, bufs, Box::new(keep))
    }

    fn queue<B: 'static>(
        &self,
        call: Call,
        bufs: RawBufs,
        owned: Box<dyn std::any::Any + Send>,
    ) -> Work<B> {
        let job = Job::new(call, bufs, Some(owned));
        lock(&self.shared.queue).jobs.push_back(Arc::clone(&job));
        self.shared.queued.notify_one();
        Work::new(job)
    }

    /// Several calls started together and waited for together (NCCL's
    /// `ncclGroupStart` … `ncclGroupEnd`): `f` adds calls to the group;
    /// they are queued at once when it returns, and this returns when all
    /// are done, with the first failure.
    pub fn group<'b>(&self, f: impl FnOnce(&mut Group<'b>) -> Result<()>) -> Result<()> {
        let mut g = Group {
            world: self.shared.world,
            rank: self.shared.rank.0,
            jobs: Vec::new(),
            _buffers: std::marker::PhantomData,
        };
        f(&mut g)?;
        let Some(last) = g.jobs.last().cloned() else {
            return Ok(());
        };
        lock(&self.shared.queue).jobs.extend(g.jobs.iter().cloned());
        {
            let mut ring = lock(&self.shared.ring);
            self.shared.run_queue(&mut ring, Some(&last));
        }
        let mut first = Ok(());
        for j in &g.jobs {
            let r = j.wait();
            if first.is_ok() {
                first = r;
            }
        }
        first
    }

    /// Waits until every rank has reached this point (an AllReduce of
    /// one byte).
    pub fn barrier(&self) -> Result<()> {
        let mut b = [0u8; 1];
        self.run_in_place(&Call::all_reduce(1, DataType::U8, ReduceOp::Sum), &mut b)
    }

    /// Splits the ranks by `color` (as `ncclCommSplit` / MPI_Comm_split):
    /// the ranks that give the same color form a new communicator, ranked
    /// by `(key, old rank)`; `None` joins none and gets `None`. Every rank
    /// must call it.
    pub fn split(&self, color: Option<u32>, key: u32) -> Result<Option<Communicator>> {
        let n = self.splits.fetch_add(1, Ordering::Relaxed);
        let deadline = Instant::now() + self.options.timeout;
        let Some(SplitPlace {
            rank,
            world,
            prefix,
        }) = split_place(
            &*self.shared.store,
            n,
            (self.rank(), self.world_size()),
            (color, key),
            deadline,
        )?
        else {
            return Ok(None);
        };
        let store = Arc::new(PrefixStore::new(Arc::clone(&self.shared.store), &prefix));
        Communicator::new(
            rank,
            world,
            store,
            &format!("{}/{prefix}", self.token),
            self.options.clone(),
            Arc::clone(&self.transports),
        )
        .map(|mut c| {
            c.builtin_store = self.builtin_store;
            Some(c)
        })
    }

    /// Aborts the job: every rank's current and later calls fail with
    /// [`Error::Aborted`] naming this rank and `reason` (within the
    /// watcher's period, through the store). Returns at once.
    pub fn abort(&self, reason: &str) {
        let reason = format!("rank {} aborted: {reason}", self.rank());
        self.shared.abort.set(Some(self.rank()), reason.clone());
        if let Err(e) = self
            .shared
            .store
            .set(ABORT_KEY, &notice::notice(Some(self.rank()), &reason))
        {
            warn!("rank {}: could not publish the abort: {e}", self.rank());
        }
    }

    /// Finishes the queued calls, stops the progress and watcher threads
    /// and closes every connection. The first failure of a queued call
    /// nobody waited for is returned.
    pub fn close(mut self) -> Result<()> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> Result<()> {
        let mut first = Ok(());
        {
            let mut ring = lock(&self.shared.ring);
            let pending: Vec<_> = lock(&self.shared.queue).jobs.iter().cloned().collect();
            self.shared.run_queue(&mut ring, None);
            for j in pending {
                if let (Err(e), true) = (j.wait(), first.is_ok()) {
                    first = Err(e);
                }
            }
            ring.close();
        }
        lock(&self.shared.queue).stop = true;
        self.shared.queued.notify_all();
        self.stop.store(true, Ordering::Release);
        for t in &self.threads {
            // The watcher parks between looks: wake it to see the stop.
            t.thread().unpark();
        }
        for t in self.threads.drain(..) {
            if t.join().is_err() {
                first = first.and(Err(Error::Internal(
                    "a communicator thread panicked".into(),
                )));
            }
        }
        // Count this rank out; the rank serving the store waits (bounded)
        // until every rank has, so no watcher sees the store vanish while
        // its rank still runs. A store handed in is served where the
        // framework put it — torch's `env://` and `tcp://` on rank 0 —
        // so there rank 0 waits: every other rank's count is its last
        // use of the store, and rank 0 leaves (taking a store it serves
        // with it) only after all of them. (Had every rank waited, the
        // others' last polls would race rank 0's exit.)
        let wait = self.server.is_some() || (!self.builtin_store && self.rank() == Rank(0));
        if self.shared.store.add(CLOSED_KEY, 1).is_ok() && wait && !self.shared.abort.is_set() {
            let deadline = Instant::now() + self.options.timeout;
            while Instant::now() < deadline && !self.shared.abort.is_set() {
                match self.shared.store.add(CLOSED_KEY, 0) {
                    Ok(n) if n >= i64::from(self.shared.world) => break,
                    Ok(_) => std::thread::sleep(CLOSE_POLL),
                    Err(_) => break,
                }
            }
        }
        self.server.take();
        first
    }
}

impl Drop for Communicator {
    fn drop(&mut self) {
        if !self.threads.is_empty() {
            if let Err(e) = self.shutdown() {
                debug!("communicator dropped after a failure: {e}");
            }
        }
    }
}

/// The socket address of `host:port` (the first the resolver gives).
pub fn resolve(addr: &str) -> Result<std::net::SocketAddr> {
    use std::net::ToSocketAddrs;
    addr.to_socket_addrs()
        .map_err(|source| Error::Io {
            call: "resolve",
            source,
        })?
        .next()
        .ok_or_else(|| Error::BadConfig(format!("{addr} resolves to no address")))
}

fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(f)
        .map_err(|source| Error::Io {
            call: "spawn",
            source,
        })
}

/// The progress thread: runs queued asynchronous calls when no caller
/// holds the ring.
fn progress(s: &Shared) {
    loop {
        {
            let mut q = lock(&s.queue);
            while q.jobs.is_empty() && !q.stop {
                q = s.queued.wait(q).unwrap_or_else(|p| p.into_inner());
            }
            if q.stop {
                return;
            }
        }
        let mut ring = lock(&s.ring);
        s.run_queue(&mut ring, None);
    }
}

/// The watcher thread: turns the job's abort notice in the store (or the
/// store's disappearance) into this rank's abort state.
fn watch(s: &Shared, stop: &AtomicBool) {
    let mut failures = 0u32;
    while !stop.load(Ordering::Acquire) {
        match s.store.check(ABORT_KEY) {
            Ok(true) => {
                let e = s
                    .store
                    .get(ABORT_KEY, WATCH_EVERY)
                    .map_or_else(|e| e, |v| notice::parse_notice(&v));
                let (rank, reason) = match e {
                    Error::Aborted { rank, reason } => (rank, reason),
                    other => (None, other.to_string()),
                };
                s.abort.set(rank, reason);
                return;
            }
            Ok(false) => failures = 0,
            Err(e) => {
                failures += 1;
                if failures >= STORE_FAILURES {
                    s.abort
                        .set(None, format!("the job's store is unreachable: {e}"));
                    return;
                }
            }
        }
        // Woken early by `shutdown` (or spuriously: then it looks again).
        std::thread::park_timeout(WATCH_EVERY);
    }
}

/// The calls of one [`Communicator::group`], borrowing their buffers for
/// `'b`.
pub struct Group<'b> {
    world: u32,
    rank: u32,
    jobs: Vec<Arc<Job>>,
    _buffers: std::marker::PhantomData<&'b mut [u8]>,
}

impl std::fmt::Debug for Group<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Group")
            .field("calls", &self.jobs.len())
            .finish()
    }
}

impl<'b> Group<'b> {
    /// Adds `call` out of place on bytes.
    pub fn run(&mut self, call: Call, input: &'b [u8], output: &'b mut [u8]) -> Result<()> {
        let (i, o) = call.buffer_bytes(self.world);
        check_len("input", i, input.len())?;
        check_len("output", o, output.len())?;
        self.jobs
            .push(Job::new(call, RawBufs::apart(input, output), None));
        Ok(())
    }

    /// Adds `call` in place on bytes.
    pub fn run_in_place(&mut self, call: Call, buf: &'b mut [u8]) -> Result<()> {
        let (i, o) = call.buffer_bytes(self.world);
        check_len("in-place", i.max(o), buf.len())?;
        let _ = self.rank;
        self.jobs.push(Job::new(call, RawBufs::in_place(buf), None));
        Ok(())
    }

    /// Adds an AllReduce in place.
    pub fn all_reduce_in_place<T: Element>(
        &mut self,
        buf: &'b mut [T],
        op: ReduceOp,
    ) -> Result<()> {
        let call = Call::all_reduce(buf.len() as u64, T::DTYPE, op);
        self.run_in_place(call, bytemuck::cast_slice_mut(buf))
    }

    /// Adds a Broadcast in place from `root`.
    pub fn broadcast_in_place<T: Element>(&mut self, buf: &'b mut [T], root: Rank) -> Result<()> {
        let call = Call::broadcast(buf.len() as u64, T::DTYPE, root);
        self.run_in_place(call, bytemuck::cast_slice_mut(buf))
    }
}

fn check_len(which: &'static str, expected: usize, got: usize) -> Result<()> {
    if expected == got {
        Ok(())
    } else {
        Err(Error::BadBuffer {
            which,
            expected,
            got,
        })
    }
}

/// The typed collectives (the ten [`Element`] types).
impl Communicator {
    fn count_of(
        &self,
        len: usize,
        per_rank: bool,
        which: &'static str,
        elem: usize,
    ) -> Result<u64> {
        let w = self.world_size() as usize;
        if per_rank {
            if !len.is_multiple_of(w) {
                return Err(Error::BadBuffer {
                    which,
                    expected: (len / w + 1).saturating_mul(w).saturating_mul(elem),
                    got: len.saturating_mul(elem),
                });
            }
            Ok((len / w) as u64)
        } else {
            Ok(len as u64)
        }
    }

    /// AllReduce: `output = input₀ ⊕ … ⊕ inputₙ₋₁`.
    pub fn all_reduce<T: Element>(
        &self,
        input: &[T],
        output: &mut [T],
        op: ReduceOp,
    ) -> Result<()> {
        let call = Call::all_reduce(input.len() as u64, T::DTYPE, op);
        self.run(
            &call,
            bytemuck::cast_slice(input),
            bytemuck::cast_slice_mut(output),
        )
    }

    /// AllReduce in place.
    pub fn all_reduce_in_place<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        let call = Call::all_reduce(buf.len() as u64, T::DTYPE, op);
        self.run_in_place(&call, bytemuck::cast_slice_mut(buf))
    }

    /// ReduceScatter: rank `b`'s output is block `b` of the reduction
    /// (`input` holds `world × output.len()` elements).
    pub fn reduce_scatter<T: Element>(
        &self,
        input: &[T],
        output: &mut [T],
        op: ReduceOp,
    ) -> Result<()> {
        let call = Call::reduce_scatter(output.len() as u64, T::DTYPE, op);
        self.run(
            &call,
            bytemuck::cast_slice(input),
            bytemuck::cast_slice_mut(output),
        )
    }

    /// ReduceScatter in place: `buf` holds `world` blocks; block `rank`
    /// ends with the result.
    pub fn reduce_scatter_in_place<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        let count = self.count_of(buf.len(), true, "in-place", size_of::<T>())?;
        let call = Call::reduce_scatter(count, T::DTYPE, op);
        self.run_in_place(&call, bytemuck::cast_slice_mut(buf))
    }

    /// AllGather: block `b` of every output is rank `b`'s input.
    pub fn all_gather<T: Element>(&self, input: &[T], output: &mut [T]) -> Result<()> {
        let call = Call::all_gather(input.len() as u64, T::DTYPE);
        self.run(
            &call,
            bytemuck::cast_slice(input),
            bytemuck::cast_slice_mut(output),
        )
    }

    /// AllGather in place: `buf` holds `world` blocks; this rank's input
    /// is block `rank`.
    pub fn all_gather_in_place<T: Element>(&self, buf: &mut [T]) -> Result<()> {
        let count = self.count_of(buf.len(), true, "in-place", size_of::<T>())?;
        let call = Call::all_gather(count, T::DTYPE);
        self.run_in_place(&call, bytemuck::cast_slice_mut(buf))
    }

    /// Broadcast: every output is `root`'s input (other ranks' inputs
    /// are not read).
    pub fn broadcast<T: Element>(&self, input: &[T], output: &mut [T], root: Rank) -> Result<()> {
        let call = Call::broadcast(output.len() as u64, T::DTYPE, root);
        self.run(
            &call,
            bytemuck::cast_slice(input),
            bytemuck::cast_slice_mut(output),
        )
    }

    /// Broadcast in place from `root`.
    pub fn broadcast_in_place<T: Element>(&self, buf: &mut [T], root: Rank) -> Result<()> {
        let call = Call::broadcast(buf.len() as u64, T::DTYPE, root);
        self.run_in_place(&call, bytemuck::cast_slice_mut(buf))
    }

    /// Reduce: `root`'s output is the reduction of every input (other
    /// ranks' outputs are left as they are).
    pub fn reduce<T: Element>(
        &self,
        input: &[T],
        output: &mut [T],
        op: ReduceOp,
        root: Rank,
    ) -> Result<()> {
        let call = Call::reduce(input.len() as u64, T::DTYPE, op, root);
        self.run(
            &call,
            bytemuck::cast_slice(input),
            bytemuck::cast_slice_mut(output),
        )
    }

    /// Reduce in place to `root`.
    pub fn reduce_in_place<T: Element>(
        &self,
        buf: &mut [T],
        op: ReduceOp,
        root: Rank,
    ) -> Result<()> {
        let call = Call::reduce(buf.len() as u64, T::DTYPE, op, root);
        self.run_in_place(&call, bytemuck::cast_slice_mut(buf))
    }

    /// AllReduce in place, asynchronously: [`Work::wait`] hands `buf`
    /// back with the result.
    pub fn all_reduce_async<T: Element>(&self, buf: Vec<T>, op: ReduceOp) -> Result<Work<Vec<T>>> {
        let call = Call::all_reduce(buf.len() as u64, T::DTYPE, op);
        self.submit_in_place(call, buf)
    }

    /// The collective a [`Collective`] names, in place and asynchronously,
    /// with the count derived from `buf` as the typed calls do.
    pub fn collective_async<T: Element>(
        &self,
        collective: Collective,
        buf: Vec<T>,
        op: ReduceOp,
    ) -> Result<Work<Vec<T>>> {
        let per_rank = matches!(
            collective,
            Collective::ReduceScatter | Collective::AllGather
        );
        let count = self.count_of(buf.len(), per_rank, "in-place", size_of::<T>())?;
        let call = Call::new(collective, count, T::DTYPE, op);
        self.submit_in_place(call, buf)
    }
}
