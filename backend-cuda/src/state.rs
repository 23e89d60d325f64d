//! What a communicator remembers between calls, whatever its device: the
//! layout, one core engine per rank (which carries every connection's
//! counters and the call sequence number from call to call), and whether
//! a failed call poisoned it.

use std::time::Instant;

use ringcc_core::{Plan, Rank};

use crate::config::Config;
use crate::device::Device;
use crate::device_loop::{self, LoopLauncher};
use crate::error::{Error, Result};
use crate::layout::Layout;
use crate::progress::{self, RankEngine};

pub use ringcc_core::Call;

/// Byte ranges of a rank's buffers inside one allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BufferPlan {
    /// Input: (byte offset, bytes).
    pub input: (u64, u64),
    /// Output: (byte offset, bytes).
    pub output: (u64, u64),
    /// Bytes of the allocation (in place) or of the larger buffer.
    pub total: u64,
}

/// A call's buffers under this backend's [`Config`].
pub trait CallBuffers {
    /// The plan of this call on `ranks` ranks with `config`.
    fn plan_with(&self, ranks: u32, config: &Config) -> Result<Plan>;
    /// Input and output sizes in bytes, `(input, output)`.
    fn bytes(&self, ranks: u32, config: &Config) -> Result<(u64, u64)>;
    /// Where rank `rank`'s input and output sit in one buffer when the
    /// call is in place.
    fn in_place(&self, ranks: u32, rank: Rank, config: &Config) -> Result<BufferPlan>;
}

impl CallBuffers for Call {
    fn plan_with(&self, ranks: u32, config: &Config) -> Result<Plan> {
        self.plan(ranks, u32::from(config.channels), config.chunk_bytes)
            .map_err(Error::core("Plan::new"))
    }

    fn bytes(&self, ranks: u32, config: &Config) -> Result<(u64, u64)> {
        let plan = self.plan_with(ranks, config)?;
        let e = u64::from(self.dtype.size());
        Ok((plan.input_len() * e, plan.output_len() * e))
    }

    /// As NCCL defines it ([`Call::in_place_offsets`]).
    fn in_place(&self, ranks: u32, rank: Rank, config: &Config) -> Result<BufferPlan> {
        let (ib, ob) = self.bytes(ranks, config)?;
        let e = u64::from(self.dtype.size());
        let (i, o) = self.in_place_offsets(rank.0);
        Ok(BufferPlan {
            input: (i.saturating_mul(e), ib),
            output: (o.saturating_mul(e), ob),
            total: ib.max(ob),
        })
    }
}

/// See the module documentation.
#[derive(Debug)]
pub struct CommState {
    layout: Layout,
    config: Config,
    engines: Vec<RankEngine>,
    /// Time zero of the engines' clock (nanoseconds).
    epoch: Instant,
    /// Why the communicator is unusable: the first failure.
    poisoned: Option<String>,
    /// Calls run on the device loop (which keeps its counters on the
    /// device; the engines then stay idle at sequence 0).
    loop_calls: u64,
}

impl CommState {
    /// A fresh communicator state.
    pub fn new(layout: Layout, config: Config) -> Result<CommState> {
        config.validate()?;
        Ok(CommState {
            engines: progress::engines(&layout, config.timeout),
            layout,
            config,
            epoch: Instant::now(),
            poisoned: None,
            loop_calls: 0,
        })
    }

    /// The layout.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The settings.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The ranks' engines (their connection counters, sequence numbers,
    /// failures).
    pub fn engines(&self) -> &[RankEngine] {
        &self.engines
    }

    /// The sequence number the next call gets (every rank's engine agrees
    /// while the communicator is live).
    pub fn seq(&self) -> u64 {
        self.engines
            .first()
            .map_or(0, RankEngine::seq)
            .saturating_add(self.loop_calls)
    }

    /// The first failure, if a call (or the device after it) failed.
    pub fn failure(&self) -> Option<&str> {
        self.poisoned.as_deref()
    }

    /// Fails with [`Error::Poisoned`] once a call has failed.
    pub fn check_live(&self) -> Result<()> {
        if let Some(cause) = &self.poisoned {
            return Err(Error::Poisoned {
                cause: cause.clone(),
            });
        }
        Ok(())
    }

    /// Enqueues one call (`calls[r]` from rank `r`) on `device`. A call
    /// refused before it starts (rank count, plan) changes nothing; a
    /// failure after it started poisons the communicator.
    pub fn run<D: Device>(&mut self, device: &mut D, calls: &[Call]) -> Result<()> {
        self.check_live()?;
        let plans = progress::plans(&self.layout, calls, self.config.chunk_bytes)?;
        let epoch = self.epoch;
        let clock = || u64::try_from(epoch.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let r = progress::run_call(
            device,
            &self.layout,
            &mut self.engines,
            calls,
            &plans,
            clock,
        );
        if let Err(e) = &r {
            tracing::warn!(error = %e, seq = self.seq(), "ringcc-cuda: collective failed; communicator poisoned");
            self.poison(e);
        }
        r
    }

    /// Enqueues one call (`calls[r]` from rank `r`) on the device loop:
    /// the checks the engines make when a call starts
    /// ([`device_loop::check_calls`]), then one launch per rank. A call
    /// refused before it starts (rank count, plan) changes nothing; a
    /// refusal by those checks or a failed launch poisons the
    /// communicator, as in [`run`](CommState::run). Failures on the device
    /// show when the caller synchronizes.
    pub fn run_loops<L: LoopLauncher>(&mut self, launcher: &mut L, calls: &[Call]) -> Result<()> {
        self.check_live()?;
        let plans = progress::plans(&self.layout, calls, self.config.chunk_bytes)?;
        let seq = self.seq();
        let r = device_loop::check_calls(&self.layout, calls, &plans, seq)
            .and_then(|()| launcher.launch_loops(seq, calls, &plans));
        match &r {
            Ok(()) => self.loop_calls = self.loop_calls.saturating_add(1),
            Err(e) => {
                tracing::warn!(error = %e, seq, "ringcc-cuda: collective failed; communicator poisoned");
                self.poison(e);
            }
        }
        r
    }

    /// Marks the communicator failed (a device error after enqueueing):
    /// every engine stops, later calls fail with [`Error::Poisoned`].
    pub fn poison(&mut self, cause: &Error) {
        if self.poisoned.is_none() {
            self.poisoned = Some(cause.to_string());
        }
        for e in &mut self.engines {
            e.abort();
        }
    }
}
