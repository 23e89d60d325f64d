//! The GPU communicator: ranks of one process on one or more GPUs.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use ringcc_core::{Collective, Rank, ReduceOp};

use crate::config::{Config, LaunchMode};
use crate::device::cuda::CudaDevice;
use crate::driver;
use crate::dtype::CollType;
use crate::error::{Error, Result};
use crate::group::Group;
use crate::kernel::ModuleKey;
use crate::layout::{Layout, StreamId};
use crate::state::CommState;

/// A communicator over the GPUs of this process, like one built by
/// `ncclCommInitAll`: rank `r` runs on the device of its stream, several
/// ranks may share a device.
///
/// Calls are asynchronous, as in NCCL and cudarc: they enqueue the
/// collective on each rank's stream ([`Comm::stream`]) and return; the
/// buffers are ordered against other work through cudarc's stream and
/// event tracking. [`Comm::synchronize`] waits (with the configured
/// deadline).
///
/// [`Comm::close`] ends it and reports what a drop can only log: work
/// that did not finish, a device error, or a communicator an earlier
/// failure poisoned.
#[derive(Debug)]
pub struct Comm {
    pub(crate) state: CommState,
    pub(crate) device: CudaDevice,
    contexts: HashMap<usize, Arc<CudaContext>>,
    /// [`Comm::close`] ran: the drop has nothing left to do.
    closed: bool,
}

impl Comm {
    /// One rank per entry of `ordinals`, on that device (repeat an ordinal
    /// to put several ranks on one GPU), each with a new stream.
    pub fn init_all(ordinals: &[usize], config: Config) -> Result<Comm> {
        driver::probe()?;
        let mut contexts: HashMap<usize, Arc<CudaContext>> = HashMap::new();
        let mut streams = Vec::with_capacity(ordinals.len());
        for &o in ordinals {
            let ctx = match contexts.entry(o) {
                std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::hash_map::Entry::Vacant(e) => e.insert(driver::context(o)?),
            };
            streams.push(ctx.new_stream().map_err(Error::driver("cuStreamCreate"))?);
        }
        Self::build(contexts, streams, config)
    }

    /// One rank per stream, on the stream's device; the rank's calls are
    /// ordered on that stream (cudarc's `Comm::from_devices` shape).
    pub fn from_streams(streams: Vec<Arc<CudaStream>>, config: Config) -> Result<Comm> {
        driver::probe()?;
        let mut contexts = HashMap::new();
        for s in &streams {
            contexts
                .entry(s.context().ordinal())
                .or_insert_with(|| s.context().clone());
        }
        Self::build(contexts, streams, config)
    }

    fn build(
        contexts: HashMap<usize, Arc<CudaContext>>,
        streams: Vec<Arc<CudaStream>>,
        config: Config,
    ) -> Result<Comm> {
        config.validate()?;
        let ordinals: Vec<usize> = streams.iter().map(|s| s.context().ordinal()).collect();
        let mut peer_error = None;
        let layout = Layout::new(ordinals, config.channels, config.geometry, |a, b| {
            let (Some(x), Some(y)) = (contexts.get(&a), contexts.get(&b)) else {
                return false;
            };
            config.peer_access
                && driver::can_access_peer(x, y).unwrap_or_else(|e| {
                    peer_error = Some(e);
                    false
                })
        })?;
        if let Some(e) = peer_error {
            return Err(e);
        }
        tracing::info!(
            ranks = layout.ranks(),
            channels = layout.channels(),
            devices = ?layout.distinct_devices(),
            "ringcc-cuda: communicator"
        );
        let device = CudaDevice::new(
            layout.clone(),
            contexts.clone(),
            streams,
            config.waves,
            config.launch,
            config.timeout,
        )?;
        tracing::info!(launch = %device.launch_mode(), "ringcc-cuda: launch mode");
        Ok(Comm {
            state: CommState::new(layout, config)?,
            device,
            contexts,
            closed: false,
        })
    }

    /// Number of ranks.
    pub fn ranks(&self) -> u32 {
        self.state.layout().ranks()
    }

    /// The layout (rank → device, links).
    pub fn layout(&self) -> &Layout {
        self.state.layout()
    }

    /// The settings.
    pub fn config(&self) -> &Config {
        self.state.config()
    }

    /// How calls run: the device loop ([`LaunchMode::Persistent`], the
    /// default) or one launch per slice ([`LaunchMode::Slice`], asked for
    /// or fallen back to; see [`Config::launch`]).
    pub fn launch_mode(&self) -> LaunchMode {
        self.device.launch_mode()
    }

    /// Rank `rank`'s stream: allocate its buffers and order its work there.
    pub fn stream(&self, rank: Rank) -> Result<&Arc<CudaStream>> {
        self.check_rank(rank)?;
        self.device.stream(StreamId::User(rank))
    }

    pub(crate) fn check_rank(&self, rank: Rank) -> Result<()> {
        if rank.0 >= self.ranks() {
            return Err(Error::RankOutOfRange {
                rank,
                ranks: self.ranks(),
            });
        }
        Ok(())
    }

    /// Compiles and loads the kernels of (`dtype`, `op`) on every device
    /// now rather than at the first call that needs them.
    pub fn prepare(&mut self, dtype: ringcc_core::DataType, op: ReduceOp) -> Result<()> {
        self.device.prepare(ModuleKey { dtype, op })
    }

    /// Starts a group: one call per rank, then [`Group::launch`].
    pub fn group(&mut self) -> Group<'_> {
        Group::new(self)
    }

    /// AllReduce: `recv[r]` gets the reduction of every `send`.
    pub fn all_reduce<T: CollType>(
        &mut self,
        send: &[CudaSlice<T>],
        recv: &mut [CudaSlice<T>],
        op: ReduceOp,
    ) -> Result<()> {
        self.each(send, recv, |g, r, s, d| g.all_reduce(r, s, d, op))
    }

    /// ReduceScatter: `recv[r]` (`count` elements) gets block `r` of the
    /// reduction of every `send` (`ranks × count`).
    pub fn reduce_scatter<T: CollType>(
        &mut self,
        send: &[CudaSlice<T>],
        recv: &mut [CudaSlice<T>],
        op: ReduceOp,
    ) -> Result<()> {
        self.each(send, recv, |g, r, s, d| g.reduce_scatter(r, s, d, op))
    }

    /// AllGather: `recv[r]` (`ranks × count`) gets every `send`, by rank.
    pub fn all_gather<T: CollType>(
        &mut self,
        send: &[CudaSlice<T>],
        recv: &mut [CudaSlice<T>],
    ) -> Result<()> {
        self.each(send, recv, |g, r, s, d| g.all_gather(r, s, d))
    }

    /// Broadcast: every `recv` gets `send[root]`.
    pub fn broadcast<T: CollType>(
        &mut self,
        send: &[CudaSlice<T>],
        recv: &mut [CudaSlice<T>],
        root: Rank,
    ) -> Result<()> {
        self.each(send, recv, |g, r, s, d| g.broadcast(r, s, d, root))
    }

    /// Reduce: `recv[root]` gets the reduction of every `send`.
    pub fn reduce<T: CollType>(
        &mut self,
        send: &[CudaSlice<T>],
        recv: &mut [CudaSlice<T>],
        op: ReduceOp,
        root: Rank,
    ) -> Result<()> {
        self.each(send, recv, |g, r, s, d| g.reduce(r, s, d, op, root))
    }

    /// The same collective, in place, on one buffer per rank laid out as
    /// NCCL's in-place calls are (see [`CallBuffers::in_place`](crate::CallBuffers::in_place)).
    pub fn in_place<T: CollType>(
        &mut self,
        bufs: &mut [CudaSlice<T>],
        collective: Collective,
        count: u64,
        op: ReduceOp,
    ) -> Result<()> {
        if bufs.len() != self.ranks() as usize {
            return Err(Error::RankCount {
                expected: self.ranks() as usize,
                got: bufs.len(),
            });
        }
        let mut g = self.group();
        for (r, b) in bufs.iter_mut().enumerate() {
            g.in_place(Rank(r as u32), b, collective, count, op)?;
        }
        g.launch()
    }

    fn each<'a, T: CollType>(
        &'a mut self,
        send: &'a [CudaSlice<T>],
        recv: &'a mut [CudaSlice<T>],
        call: impl Fn(&mut Group<'a>, Rank, &'a CudaSlice<T>, &'a mut CudaSlice<T>) -> Result<()>,
    ) -> Result<()> {
        let n = self.ranks() as usize;
        if send.len() != n || recv.len() != n {
            return Err(Error::RankCount {
                expected: n,
                got: send.len().min(recv.len()),
            });
        }
        let mut g = self.group();
        for (r, (s, d)) in send.iter().zip(recv.iter_mut()).enumerate() {
            call(&mut g, Rank(r as u32), s, d)?;
        }
        g.launch()
    }

    /// Waits until every rank's stream has finished all work enqueued so
    /// far, polling with the configured deadline; reports device errors
    /// and, on the device loop, the failure a block recorded (a timeout
    /// with what it waited for, a mismatched call). When the deadline
    /// passes on the device loop, it raises the abort word and waits (as
    /// long again, at least a second) for the kernels to stop before it
    /// returns.
    pub fn synchronize(&self) -> Result<()> {
        let timeout = self.state.config().timeout;
        let mut deadline = Instant::now() + timeout;
        let mut events = Vec::new();
        for r in 0..self.ranks() {
            let s = self.device.stream(StreamId::User(Rank(r)))?;
            events.push(
                s.record_event(None)
                    .map_err(Error::driver("cuEventRecord"))?,
            );
        }
        for s in self.device.channel_streams() {
            events.push(
                s.record_event(None)
                    .map_err(Error::driver("cuEventRecord"))?,
            );
        }
        let mut aborted = false;
        for e in &events {
            loop {
                if e.try_is_complete().map_err(Error::driver("cuEventQuery"))? {
                    break;
                }
                let now = Instant::now();
                if now > deadline {
                    match self.device.loops() {
                        // Stop the loops; give them as long again (at
                        // least a second) to see it: the FIFOs must not be
                        // freed under a running kernel.
                        Some(l) if !aborted => {
                            l.abort();
                            aborted = true;
                            deadline = now + timeout.max(std::time::Duration::from_secs(1));
                        }
                        _ => {
                            return Err(Error::Timeout {
                                waiting_for: "the device to finish the enqueued collectives".into(),
                                after: timeout,
                            })
                        }
                    }
                }
                std::thread::sleep(std::time::Duration::from_micros(20));
            }
        }
        for ctx in self.contexts.values() {
            ctx.check_err()
                .map_err(Error::driver("deferred CUDA call"))?;
        }
        let failure = self.device.loops().and_then(|l| l.failure());
        match (failure, aborted) {
            // A block's own report says more than our deadline.
            (Some(e @ (Error::Timeout { .. } | Error::Core { .. })), _) | (Some(e), false) => {
                Err(e)
            }
            (_, true) => Err(Error::Timeout {
                waiting_for: "the device loops to finish the enqueued collectives (aborted)".into(),
                after: timeout,
            }),
            (None, false) => Ok(()),
        }
    }

    /// The first failure of this communicator, if one poisoned it.
    pub fn failure(&self) -> Option<&str> {
        self.state.failure()
    }

    /// Ends the communicator: waits for the enqueued work (with the
    /// configured deadline), then frees the FIFOs. Reports what a drop can
    /// only log: a communicator an earlier failure poisoned
    /// ([`Error::Poisoned`] with its cause, and what finishing the work
    /// then said, if it failed too), or a device error or deadline while
    /// finishing (the [`synchronize`](Comm::synchronize) error).
    pub fn close(mut self) -> Result<()> {
        self.closed = true;
        let finished = self.synchronize();
        closing(self.state.failure(), finished)
    }
}

impl Drop for Comm {
    /// Best effort: waits for the enqueued work, and logs what
    /// [`Comm::close`] would have returned.
    fn drop(&mut self) {
        if self.closed {
            return;
        }
        // The FIFOs are freed after this; nothing may still use them.
        if let Err(e) = self.synchronize() {
            tracing::error!(error = %e, "ringcc-cuda: communicator dropped with unfinished work");
        } else if let Some(cause) = self.state.failure() {
            tracing::warn!(cause, "ringcc-cuda: poisoned communicator dropped");
        }
    }
}

/// What [`Comm::close`] and [`HostComm::close`](crate::HostComm::close)
/// report: the poisoning failure first, else how finishing went.
pub(crate) fn closing(poisoned: Option<&str>, finished: Result<()>) -> Result<()> {
    match (poisoned, finished) {
        (Some(cause), Ok(())) => Err(Error::Poisoned {
            cause: cause.to_owned(),
        }),
        (Some(cause), Err(e)) => Err(Error::Poisoned {
            cause: format!("{cause}; then, closing: {e}"),
        }),
        (None, finished) => finished,
    }
}
