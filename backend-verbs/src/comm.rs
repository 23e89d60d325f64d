//! The public communicator: one rank of a job, collectives on host
//! buffers.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use ringcc_comm::store::tcp::{TcpStore, TcpStoreServer};
use ringcc_core::{Collective, DataType, Plan, Rank, ReduceOp};
use tracing::{debug, info, warn};

use crate::abort::{send_abort, AbortState, Watcher};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::exec::{Bufs, CallCtx};
use crate::ib::mem::{NicMrs, UserMr};
use crate::launch::Launch;
use crate::setup::{build, MAX_RANKS};
use crate::transport::{rank_engine, RankEngine, Transport};

pub use ringcc_core::Call;

/// Aborts a communicator from any thread: its current or next call fails
/// with [`Error::Aborted`], and every other rank of the job is told.
/// Never blocks for long (a socket write with a timeout).
#[derive(Clone)]
pub struct AbortHandle {
    rank: Rank,
    state: Arc<AbortState>,
    watcher: Option<Arc<Watcher>>,
}

impl AbortHandle {
    /// Aborts with `reason`.
    pub fn abort(&self, reason: &str) {
        if self.state.set(Some(self.rank.0), reason.to_owned()) {
            warn!(rank = self.rank.0, "abort: {reason}");
            if let Some(w) = &self.watcher {
                w.send_abort(&format!("rank {}: {reason}", self.rank));
            }
        }
    }
}

/// A caller's buffer registered once with every NIC of one communicator,
/// as NCCL's `ncclCommRegister` does: calls given it through
/// [`Communicator::run_registered`] skip the per-call `ibv_reg_mr` and
/// `ibv_dereg_mr` (which pin and unpin every page, and on a hardware NIC
/// can cost more than the transfer). The registration allows local access
/// only and lasts while this value lives; it borrows the buffer for as
/// long, so the memory cannot be freed or moved under it. Between calls
/// the caller reads and writes the bytes through
/// [`as_slice`](Registered::as_slice) and
/// [`as_mut_slice`](Registered::as_mut_slice).
pub struct Registered<'a> {
    // Field order: the registrations go before the borrow ends.
    mrs: NicMrs<'a>,
    buf: &'a mut [u8],
    owner: u64,
}

impl Registered<'_> {
    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        self.buf
    }

    /// The bytes, for writing between calls.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        self.buf
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// Whether the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }
}

/// Each communicator's identity, for a [`Registered`]'s owner.
static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// One rank of a job: queue pairs to its ring neighbours on every
/// channel, and the collectives over them.
///
/// Every rank must make the same calls in the same order (the call header
/// on each connection checks it: a mismatch fails with
/// [`Error::Core`] `MismatchedCall` on the rank that sees it, and the job
/// aborts). After any error the communicator is unusable
/// ([`Error::Poisoned`]) and the other ranks' calls fail too.
///
/// Buffers are host memory. Out of place ([`run`](Communicator::run)),
/// `input` is only read and `output` only written; their lengths follow
/// NCCL's layout (see [`Plan`]): AllReduce `count` in and out;
/// ReduceScatter `n·count` in, `count` out; AllGather `count` in,
/// `n·count` out; Broadcast and Reduce `count` in and out, where a
/// Broadcast non-root may pass an empty input and a Reduce non-root an
/// empty output. In place ([`run_in_place`](Communicator::run_in_place))
/// one buffer holds both, as NCCL lays them out
/// ([`Call::in_place_offsets`]).
///
/// The schedule is the core's: one [`Engine`](ringcc_core::Engine) per
/// communicator drives every channel's machine, numbers the calls and
/// carries each connection's counters from one call to the next.
pub struct Communicator {
    id: u64,
    rank: Rank,
    world: u32,
    config: Config,
    poisoned: Option<String>,
    abort: Arc<AbortState>,
    engine: RankEngine,
    // Drop order: queue pairs first, then this rank's store connection
    // (a clean goodbye), then the store itself (rank 0).
    transport: Transport,
    watcher: Option<Arc<Watcher>>,
    _server: Option<TcpStoreServer>,
}

/// A call's buffers as the caller gave them.
enum UserBufs<'b> {
    Apart(&'b [u8], &'b mut [u8]),
    InPlace(&'b mut [u8]),
}

/// Registrations the caller made ([`Communicator::register`]).
enum UserMrs<'b> {
    Apart(NicMrs<'b>, NicMrs<'b>),
    InPlace(NicMrs<'b>),
}

/// Where rank 0's store listens: every address of the family of `addr`
/// (`host:port`), on its port.
fn bind_addr(addr: &str) -> Result<SocketAddr> {
    let bad = |why: String| Error::Env {
        var: "RINGCC_ADDR".into(),
        reason: format!("{addr:?} is not host:port ({why})"),
    };
    let (host, port) = addr.rsplit_once(':').ok_or_else(|| bad("no port".into()))?;
    let port: u16 = port.parse().map_err(|e| bad(format!("{e}")))?;
    Ok(if host.starts_with('[') {
        SocketAddr::from((Ipv6Addr::UNSPECIFIED, port))
    } else {
        SocketAddr::from((Ipv4Addr::UNSPECIFIED, port))
    })
}

/// Registers `buf` with every NIC of `transport`.
///
/// # Safety
/// `buf` stays allocated and in place for `'b`, and the registrations are
/// dropped before it is freed.
unsafe fn register_all<'b>(transport: &Transport, buf: &[u8]) -> Result<NicMrs<'b>> {
    let mut mrs = Vec::with_capacity(transport.nics.len());
    for nic in &transport.nics {
        // SAFETY: the caller's promise.
        mrs.push(unsafe { UserMr::register(&nic.pd, buf.as_ptr(), buf.len(), &nic.name)? });
    }
    Ok(mrs)
}

impl Communicator {
    /// Rank, world size and address from the launcher's environment (see
    /// [`Launch`]), tunables from `RINGCC_*` (see [`Config`]).
    pub fn init_from_env() -> Result<Communicator> {
        Communicator::new(Launch::from_env()?, Config::from_env()?)
    }

    /// Joins the job described by `launch`: rank 0 serves the store; every
    /// rank connects, opens its devices and connects its queue pairs.
    pub fn new(launch: Launch, config: Config) -> Result<Communicator> {
        config.validate()?;
        let (rank, world) = (launch.rank, launch.world_size);
        if world as usize > MAX_RANKS {
            return Err(Error::BadConfig(format!(
                "{world} ranks exceed the maximum of {MAX_RANKS}"
            )));
        }
        let server = if rank == Rank(0) {
            Some(TcpStoreServer::start(
                bind_addr(&launch.addr)?,
                &launch.token,
                world,
            )?)
        } else {
            None
        };
        let store = TcpStore::connect(
            &launch.addr,
            &launch.token,
            rank,
            world,
            config.connect_timeout,
        )?;
        let built = match build(&store, rank, world, &config) {
            Ok(b) => b,
            Err(e) => {
                send_abort(
                    &store,
                    rank,
                    &format!("rank {rank} failed during setup: {e}"),
                );
                return Err(e);
            }
        };
        let abort = Arc::new(AbortState::default());
        let watcher = Arc::new(Watcher::start(store, Arc::clone(&abort))?);
        info!(
            rank = rank.0,
            world,
            channels = config.channels,
            "verbs: communicator ready"
        );
        let engine = rank_engine(rank, built.transport.chans.len(), config.timeout);
        Ok(Communicator {
            id: NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            rank,
            world,
            config,
            poisoned: None,
            abort,
            engine,
            transport: built.transport,
            watcher: Some(watcher),
            _server: server,
        })
    }

    /// This rank.
    pub fn rank(&self) -> Rank {
        self.rank
    }

    /// Number of ranks.
    pub fn world_size(&self) -> u32 {
        self.world
    }

    /// Number of channels (rings).
    pub fn channels(&self) -> u32 {
        self.config.channels
    }

    /// The settings in use.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Collectives completed so far (the next call's sequence number).
    pub fn calls(&self) -> u64 {
        self.engine.seq()
    }

    /// A handle that aborts this communicator from any thread.
    pub fn abort_handle(&self) -> AbortHandle {
        AbortHandle {
            rank: self.rank,
            state: Arc::clone(&self.abort),
            watcher: self.watcher.clone(),
        }
    }

    /// Aborts the job (every rank's calls fail) and closes this rank.
    pub fn abort(self, reason: &str) {
        self.abort_handle().abort(reason);
    }

    /// AllReduce: `output = input₀ ⊕ … ⊕ inputₙ₋₁`.
    pub fn all_reduce(
        &mut self,
        input: &[u8],
        output: &mut [u8],
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<()> {
        let count = self.checked(elements(input.len(), dtype, "input"))?;
        self.run(Call::all_reduce(count, dtype, op), input, output)
    }

    /// ReduceScatter: rank `b` gets block `b` of the reduction.
    pub fn reduce_scatter(
        &mut self,
        input: &[u8],
        output: &mut [u8],
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<()> {
        let count = self.checked(elements(output.len(), dtype, "output"))?;
        self.run(Call::reduce_scatter(count, dtype, op), input, output)
    }

    /// AllGather: block `b` of every output is rank `b`'s input.
    pub fn all_gather(&mut self, input: &[u8], output: &mut [u8], dtype: DataType) -> Result<()> {
        let count = self.checked(elements(input.len(), dtype, "input"))?;
        self.run(Call::all_gather(count, dtype), input, output)
    }

    /// Broadcast: every output is `root`'s input.
    pub fn broadcast(
        &mut self,
        input: &[u8],
        output: &mut [u8],
        dtype: DataType,
        root: Rank,
    ) -> Result<()> {
        let count = self.checked(elements(output.len(), dtype, "output"))?;
        self.run(Call::broadcast(count, dtype, root), input, output)
    }

    /// Reduce: `root`'s output is the reduction of every input.
    pub fn reduce(
        &mut self,
        input: &[u8],
        output: &mut [u8],
        dtype: DataType,
        op: ReduceOp,
        root: Rank,
    ) -> Result<()> {
        let count = self.checked(elements(input.len(), dtype, "input"))?;
        self.run(Call::reduce(count, dtype, op, root), input, output)
    }

    /// Registers `buf` with every NIC of this communicator, for
    /// [`run_registered`](Communicator::run_registered) and
    /// [`run_registered_in_place`](Communicator::run_registered_in_place).
    /// Local access only. A failure here (out of pinnable memory, say) is
    /// this rank's alone: it neither aborts the job nor poisons the
    /// communicator.
    pub fn register<'a>(&self, buf: &'a mut [u8]) -> Result<Registered<'a>> {
        // SAFETY: `buf` is borrowed by the `Registered` for `'a`, so it
        // stays allocated and in place while the registration lives; the
        // registrations are dropped with the `Registered` (field order)
        // or, for the clones a call holds, before that call returns.
        let mrs = unsafe { register_all(&self.transport, buf)? };
        Ok(Registered {
            mrs,
            buf,
            owner: self.id,
        })
    }

    /// Runs `call` on buffers registered with this communicator
    /// ([`register`](Communicator::register)): the same as
    /// [`run`](Communicator::run) without registering them again.
    pub fn run_registered(
        &mut self,
        call: Call,
        input: &Registered<'_>,
        output: &mut Registered<'_>,
    ) -> Result<()> {
        self.check_owner(&[("input", input.owner), ("output", output.owner)])?;
        let mrs = UserMrs::Apart(input.mrs.clone(), output.mrs.clone());
        self.run_guarded(call, UserBufs::Apart(input.buf, output.buf), Some(mrs))
    }

    /// Runs `call` on this rank's buffers. Any error aborts the job and
    /// leaves the communicator unusable.
    pub fn run(&mut self, call: Call, input: &[u8], output: &mut [u8]) -> Result<()> {
        self.run_guarded(call, UserBufs::Apart(input, output), None)
    }

    /// Runs `call` in place: `buf` holds the larger of the call's input
    /// and output ([`Call::buffer_bytes`] on [`world_size`] ranks), the
    /// input from element `in_place_offsets(rank).0` on and the output
    /// from element `in_place_offsets(rank).1` on
    /// ([`Call::in_place_offsets`], NCCL's in-place layout: the same
    /// bytes for AllReduce, Broadcast and Reduce; the output is block
    /// `rank` of the input for ReduceScatter, the input block `rank` of
    /// the output for AllGather). Any error aborts the job and leaves the
    /// communicator unusable.
    ///
    /// [`world_size`]: Communicator::world_size
    pub fn run_in_place(&mut self, call: Call, buf: &mut [u8]) -> Result<()> {
        self.run_guarded(call, UserBufs::InPlace(buf), None)
    }

    /// [`run_in_place`](Communicator::run_in_place) on a buffer
    /// registered with this communicator.
    pub fn run_registered_in_place(&mut self, call: Call, buf: &mut Registered<'_>) -> Result<()> {
        self.check_owner(&[("in-place", buf.owner)])?;
        let mrs = UserMrs::InPlace(buf.mrs.clone());
        self.run_guarded(call, UserBufs::InPlace(buf.buf), Some(mrs))
    }

    /// Refuses registrations of another communicator (this one's
    /// poisoning, if any, is reported first).
    fn check_owner(&mut self, owners: &[(&'static str, u64)]) -> Result<()> {
        let foreign = owners.iter().find(|&&(_, owner)| owner != self.id);
        if let (Some(&(what, _)), None) = (foreign, &self.poisoned) {
            return Err(self.fail(Error::ForeignRegistration { what }));
        }
        Ok(())
    }

    /// [`run_inner`](Communicator::run_inner) on a usable communicator,
    /// or the failure recorded.
    fn run_guarded<'b>(
        &mut self,
        call: Call,
        bufs: UserBufs<'b>,
        mrs: Option<UserMrs<'b>>,
    ) -> Result<()> {
        if let Some(p) = &self.poisoned {
            return Err(Error::Poisoned { cause: p.clone() });
        }
        self.run_inner(call, bufs, mrs).map_err(|e| self.fail(e))
    }

    /// Checks the buffers' lengths against `plan`.
    fn check_lengths(&self, call: &Call, plan: &Plan, bufs: &UserBufs<'_>) -> Result<()> {
        let elem = u64::from(call.dtype.size());
        let need_in = plan.input_len().saturating_mul(elem);
        let need_out = plan.output_len().saturating_mul(elem);
        let bad = |which, expected, got: usize| Error::BadBuffer {
            which,
            expected,
            got: got as u64,
        };
        match bufs {
            UserBufs::Apart(input, output) => {
                let root = call.collective.root();
                let not_root = root.is_some() && root != Some(self.rank);
                let may_skip_in =
                    matches!(call.collective, Collective::Broadcast { .. }) && not_root;
                let may_skip_out = matches!(call.collective, Collective::Reduce { .. }) && not_root;
                if input.len() as u64 != need_in && !(may_skip_in && input.is_empty()) {
                    return Err(bad("input", need_in, input.len()));
                }
                if output.len() as u64 != need_out && !(may_skip_out && output.is_empty()) {
                    return Err(bad("output", need_out, output.len()));
                }
            }
            UserBufs::InPlace(buf) => {
                let need = need_in.max(need_out);
                if buf.len() as u64 != need {
                    return Err(bad("in-place", need, buf.len()));
                }
            }
        }
        Ok(())
    }

    /// `mrs`: the buffers' registrations (per NIC), when the caller
    /// registered them; `None` registers them for this call.
    fn run_inner<'b>(
        &mut self,
        call: Call,
        bufs: UserBufs<'b>,
        mrs: Option<UserMrs<'b>>,
    ) -> Result<()> {
        if let Some(e) = self.abort.error() {
            return Err(e);
        }
        let plan = Plan::new(
            call.collective,
            call.count,
            call.dtype,
            self.world,
            self.config.channels,
            self.config.chunk_bytes,
        )
        .map_err(Error::core("Plan::new"))?;
        self.check_lengths(&call, &plan, &bufs)?;
        if self.transport.rings.len() < plan.channels() as usize {
            return Err(Error::Internal(format!(
                "{} rings for {} channels",
                self.transport.rings.len(),
                plan.channels()
            )));
        }
        // Register the caller's buffers on every device that sends,
        // unless the caller did.
        let t_reg = std::time::Instant::now();
        let elem = usize::from(call.dtype.size());
        let bufs = match (bufs, mrs) {
            (UserBufs::Apart(input, output), mrs) => {
                let (input_mr, output_mr) = match mrs {
                    Some(UserMrs::Apart(i, o)) => (i, o),
                    // SAFETY: both buffers outlive `ctx`, which holds the
                    // registrations and is dropped before this function
                    // returns.
                    _ => unsafe {
                        (
                            register_all(&self.transport, input)?,
                            register_all(&self.transport, output)?,
                        )
                    },
                };
                Bufs::Apart {
                    input,
                    output,
                    input_mr,
                    output_mr,
                }
            }
            (UserBufs::InPlace(buf), mrs) => {
                let mr = match mrs {
                    Some(UserMrs::InPlace(m)) => m,
                    // SAFETY: as above.
                    _ => unsafe { register_all(&self.transport, buf)? },
                };
                let (i, o) = call.in_place_offsets(self.rank.0);
                let at = |e: u64| {
                    usize::try_from(e)
                        .unwrap_or(usize::MAX)
                        .saturating_mul(elem)
                };
                Bufs::InPlace {
                    buf,
                    input_at: at(i),
                    output_at: at(o),
                    mr,
                }
            }
        };
        let reg_us = t_reg.elapsed().as_micros();
        let t_run = std::time::Instant::now();
        let rings = &self.transport.rings;
        let desc = self
            .engine
            .start(
                self.transport.now(),
                &call,
                &plan,
                self.transport.geometry,
                |c| {
                    rings
                        .get(usize::from(c.0))
                        .cloned()
                        .unwrap_or_else(|| crate::transport::OwnedRing::new(Vec::new()))
                },
            )
            .map_err(|e| self.transport.engine_error(e))?;
        // The registrations in `ctx` are dropped before this function
        // returns; `run_call` returns only when no request reads the
        // buffers, or after `shut_down` flushed every queue pair.
        let mut ctx = CallCtx {
            call: desc,
            nranks: self.world,
            bufs,
            host_time: std::time::Duration::ZERO,
            post_time: std::time::Duration::ZERO,
        };
        let r = self
            .transport
            .run_call(&mut self.engine, &mut ctx, &self.abort);
        debug!(
            call = %desc,
            in_place = ctx.bufs.in_place(),
            register_us = reg_us,
            run_us = t_run.elapsed().as_micros(),
            host_us = ctx.host_time.as_micros(),
            post_us = ctx.post_time.as_micros(),
            "verbs: call done"
        );
        if r.is_err() {
            // Stop the NIC reading the caller's buffers before their
            // registrations go.
            self.transport.shut_down();
        }
        drop(ctx);
        r
    }

    fn checked<T>(&mut self, r: Result<T>) -> Result<T> {
        r.map_err(|e| self.fail(e))
    }

    /// Records a failure: the job is told (unless the failure is another
    /// rank's abort), the queue pairs are stopped, the engine and later
    /// calls refused.
    fn fail(&mut self, e: Error) -> Error {
        warn!(rank = self.rank.0, "collective failed: {e}");
        if !matches!(e, Error::Aborted { .. }) && self.abort.set(Some(self.rank.0), e.to_string()) {
            if let Some(w) = &self.watcher {
                w.send_abort(&format!("rank {}: {e}", self.rank));
            }
        }
        self.engine.abort();
        self.transport.shut_down();
        self.poisoned = Some(e.to_string());
        e
    }
}

fn elements(bytes: usize, dtype: DataType, what: &'static str) -> Result<u64> {
    let size = usize::from(dtype.size());
    if !bytes.is_multiple_of(size) {
        return Err(Error::BadBuffer {
            which: what,
            expected: (bytes - bytes % size) as u64,
            got: bytes as u64,
        });
    }
    Ok((bytes / size) as u64)
}
