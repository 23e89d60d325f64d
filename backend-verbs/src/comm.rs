//! The public communicator: one rank of a job, collectives on host
//! buffers.

use std::sync::Arc;

use ringcc_core::topology::Topology;
use ringcc_core::{ChannelId, Collective, DataType, Machine, Plan, Rank, ReduceOp};
use tracing::{debug, info, warn};

use crate::config::Config;
use crate::engine::{CallCtx, Engine};
use crate::error::{Error, Result};
use crate::ib::mem::UserMr;
use crate::launch::Launch;
use crate::rendezvous::{AbortState, StoreClient, StoreServer, Watcher};
use crate::setup::{build, MAX_RANKS};

pub use ringcc_core::Call;

/// Aborts a communicator from any thread: its current or next call fails
/// with [`Error::Aborted`], and every other rank of the job is told.
/// Never blocks for long (a socket write with a timeout).
#[derive(Clone)]
pub struct AbortHandle {
    rank: u32,
    state: Arc<AbortState>,
    watcher: Option<Arc<Watcher>>,
}

impl AbortHandle {
    /// Aborts with `reason`.
    pub fn abort(&self, reason: &str) {
        if self.state.set(Some(self.rank), reason.to_owned()) {
            warn!(rank = self.rank, "abort: {reason}");
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

/// One buffer's registration on each NIC (`None`: empty buffer).
type NicMrs<'a> = Vec<Option<UserMr<'a>>>;

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
/// Buffers are host memory: `input` is only read, `output` only written.
/// Their lengths follow NCCL's layout (see [`Plan`]): AllReduce `count`
/// in and out; ReduceScatter `n·count` in, `count` out; AllGather `count`
/// in, `n·count` out; Broadcast and Reduce `count` in and out, where a
/// Broadcast non-root may pass an empty input and a Reduce non-root an
/// empty output.
pub struct Communicator {
    id: u64,
    rank: u32,
    world: u32,
    config: Config,
    seq: u64,
    poisoned: Option<String>,
    abort: Arc<AbortState>,
    topo: Box<Topology<MAX_RANKS>>,
    // Drop order: queue pairs first, then this rank's store connection
    // (a clean goodbye), then the store itself (rank 0).
    engine: Engine,
    watcher: Option<Arc<Watcher>>,
    _server: Option<StoreServer>,
}

fn bind_addr(addr: &str) -> Result<String> {
    let (host, port) = addr.rsplit_once(':').ok_or_else(|| Error::Env {
        var: "RINGCC_ADDR".into(),
        reason: format!("{addr:?} is not host:port"),
    })?;
    Ok(if host.starts_with('[') {
        format!("[::]:{port}")
    } else {
        format!("0.0.0.0:{port}")
    })
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
        let server = if rank == 0 {
            Some(StoreServer::start(
                &bind_addr(&launch.addr)?,
                &launch.token,
                world,
            )?)
        } else {
            None
        };
        let mut client = StoreClient::connect(
            &launch.addr,
            &launch.token,
            rank,
            world,
            config.connect_timeout,
        )?;
        let built = match build(&mut client, rank, world, &config) {
            Ok(b) => b,
            Err(e) => {
                client.send_abort(&format!("rank {rank} failed during setup: {e}"));
                return Err(e);
            }
        };
        let abort = Arc::new(AbortState::default());
        let watcher = Arc::new(client.into_watcher(Arc::clone(&abort))?);
        info!(
            rank,
            world,
            channels = config.channels,
            "verbs: communicator ready"
        );
        Ok(Communicator {
            id: NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            rank,
            world,
            config,
            seq: 0,
            poisoned: None,
            abort,
            topo: built.topo,
            engine: built.engine,
            watcher: Some(watcher),
            _server: server,
        })
    }

    /// This rank.
    pub fn rank(&self) -> u32 {
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
        self.seq
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
        self.run(call(Collective::AllReduce, count, dtype, op), input, output)
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
        self.run(
            call(Collective::ReduceScatter, count, dtype, op),
            input,
            output,
        )
    }

    /// AllGather: block `b` of every output is rank `b`'s input.
    pub fn all_gather(&mut self, input: &[u8], output: &mut [u8], dtype: DataType) -> Result<()> {
        let count = self.checked(elements(input.len(), dtype, "input"))?;
        self.run(
            call(Collective::AllGather, count, dtype, ReduceOp::Sum),
            input,
            output,
        )
    }

    /// Broadcast: every output is `root`'s input.
    pub fn broadcast(
        &mut self,
        input: &[u8],
        output: &mut [u8],
        dtype: DataType,
        root: u32,
    ) -> Result<()> {
        let count = self.checked(elements(output.len(), dtype, "output"))?;
        let c = Collective::Broadcast { root: Rank(root) };
        self.run(call(c, count, dtype, ReduceOp::Sum), input, output)
    }

    /// Reduce: `root`'s output is the reduction of every input.
    pub fn reduce(
        &mut self,
        input: &[u8],
        output: &mut [u8],
        dtype: DataType,
        op: ReduceOp,
        root: u32,
    ) -> Result<()> {
        let count = self.checked(elements(input.len(), dtype, "input"))?;
        let c = Collective::Reduce { root: Rank(root) };
        self.run(call(c, count, dtype, op), input, output)
    }

    /// Registers `buf` with every NIC of this communicator, for
    /// [`run_registered`](Communicator::run_registered). Local access only.
    /// A failure here (out of pinnable memory, say) is this rank's alone:
    /// it neither aborts the job nor poisons the communicator.
    pub fn register<'a>(&self, buf: &'a mut [u8]) -> Result<Registered<'a>> {
        let mut mrs = Vec::with_capacity(self.engine.nics.len());
        for nic in &self.engine.nics {
            // SAFETY: `buf` is borrowed by the `Registered` for `'a`, so
            // it stays allocated and in place while the registration
            // lives; the registration is dropped with the `Registered`
            // (field order) or, for the clones a call holds, before that
            // call returns.
            mrs.push(unsafe { UserMr::register(&nic.pd, buf.as_ptr(), buf.len(), &nic.name)? });
        }
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
        let foreign = [("input", input.owner), ("output", output.owner)]
            .into_iter()
            .find(|&(_, owner)| owner != self.id);
        if let (Some((what, _)), None) = (foreign, &self.poisoned) {
            return Err(self.fail(Error::ForeignRegistration { what }));
        }
        let mrs = Some((input.mrs.clone(), output.mrs.clone()));
        self.run_guarded(call, input.buf, output.buf, mrs)
    }

    /// Runs `call` on this rank's buffers. Any error aborts the job and
    /// leaves the communicator unusable.
    pub fn run(&mut self, call: Call, input: &[u8], output: &mut [u8]) -> Result<()> {
        self.run_guarded(call, input, output, None)
    }

    /// [`run_inner`](Communicator::run_inner) on a usable communicator;
    /// counts the call, or records the failure.
    fn run_guarded<'b>(
        &mut self,
        call: Call,
        input: &'b [u8],
        output: &'b mut [u8],
        mrs: Option<(NicMrs<'b>, NicMrs<'b>)>,
    ) -> Result<()> {
        if let Some(p) = &self.poisoned {
            return Err(Error::Poisoned { cause: p.clone() });
        }
        match self.run_inner(call, input, output, mrs) {
            Ok(()) => {
                self.seq = self.seq.wrapping_add(1);
                Ok(())
            }
            Err(e) => Err(self.fail(e)),
        }
    }

    /// `mrs`: the buffers' registrations (per NIC), when the caller
    /// registered them; `None` registers them for this call.
    fn run_inner<'b>(
        &mut self,
        call: Call,
        input: &'b [u8],
        output: &'b mut [u8],
        mrs: Option<(NicMrs<'b>, NicMrs<'b>)>,
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
        let elem = u64::from(call.dtype.size());
        let need_in = plan.input_len().saturating_mul(elem);
        let need_out = plan.output_len().saturating_mul(elem);
        let root = call.collective.root().map(|r| r.0);
        let may_skip_in =
            matches!(call.collective, Collective::Broadcast { .. }) && root != Some(self.rank);
        let may_skip_out =
            matches!(call.collective, Collective::Reduce { .. }) && root != Some(self.rank);
        if input.len() as u64 != need_in && !(may_skip_in && input.is_empty()) {
            return Err(Error::BadBuffer {
                which: "input",
                expected: need_in,
                got: input.len() as u64,
            });
        }
        if output.len() as u64 != need_out && !(may_skip_out && output.is_empty()) {
            return Err(Error::BadBuffer {
                which: "output",
                expected: need_out,
                got: output.len() as u64,
            });
        }
        let desc = call.desc(self.seq);
        let geometry = self.engine.geometry;
        let me = Rank(self.rank);
        let mut machines = Vec::with_capacity(self.engine.chans.len());
        for chan in &self.engine.chans {
            let id = ChannelId(chan.id);
            let ring = self.topo.ring(id).map_err(Error::core("Topology::ring"))?;
            let steps = plan
                .steps(id, me, ring)
                .map_err(Error::core("Plan::steps"))?;
            machines.push(
                Machine::new(desc, steps, geometry, chan.link)
                    .map_err(Error::core("Machine::new"))?,
            );
        }
        // Register the caller's buffers on every device that sends,
        // unless the caller did.
        let t_reg = std::time::Instant::now();
        let (input_mr, output_mr) = match mrs {
            Some(m) => m,
            None => {
                let nics = &self.engine.nics;
                let mut input_mr = Vec::with_capacity(nics.len());
                let mut output_mr = Vec::with_capacity(nics.len());
                for nic in nics {
                    // SAFETY: both buffers outlive `ctx`, which holds the
                    // registrations and is dropped before this function
                    // returns; the engine returns only when no request
                    // reads them.
                    input_mr.push(unsafe {
                        UserMr::register(&nic.pd, input.as_ptr(), input.len(), &nic.name)?
                    });
                    output_mr.push(unsafe {
                        UserMr::register(&nic.pd, output.as_ptr(), output.len(), &nic.name)?
                    });
                }
                (input_mr, output_mr)
            }
        };
        let reg_us = t_reg.elapsed().as_micros();
        let t_run = std::time::Instant::now();
        let mut ctx = CallCtx {
            call: desc,
            nranks: self.world,
            input,
            output,
            input_mr,
            output_mr,
            host_time: std::time::Duration::ZERO,
            post_time: std::time::Duration::ZERO,
        };
        let r = self.engine.run_call(&mut machines, &mut ctx, &self.abort);
        debug!(
            call = %desc,
            register_us = reg_us,
            run_us = t_run.elapsed().as_micros(),
            host_us = ctx.host_time.as_micros(),
            post_us = ctx.post_time.as_micros(),
            "verbs: call done"
        );
        if r.is_err() {
            // Stop the NIC reading the caller's buffers before their
            // registrations go.
            self.engine.shut_down();
        }
        drop(ctx);
        r
    }

    fn checked<T>(&mut self, r: Result<T>) -> Result<T> {
        r.map_err(|e| self.fail(e))
    }

    /// Records a failure: the job is told (unless the failure is another
    /// rank's abort), the queue pairs are stopped, later calls refused.
    fn fail(&mut self, e: Error) -> Error {
        warn!(rank = self.rank, "collective failed: {e}");
        if !matches!(e, Error::Aborted { .. }) && self.abort.set(Some(self.rank), e.to_string()) {
            if let Some(w) = &self.watcher {
                w.send_abort(&format!("rank {}: {e}", self.rank));
            }
        }
        self.engine.shut_down();
        self.poisoned = Some(e.to_string());
        e
    }
}

fn call(collective: Collective, count: u64, dtype: DataType, op: ReduceOp) -> Call {
    Call {
        collective,
        count,
        dtype,
        op,
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
