//! What a communicator remembers between calls, whatever its device: the
//! layout, every connection's counters, the call sequence number, and
//! whether a failed call poisoned it.

use ringcc_core::{CallDesc, LinkState, Plan};

use crate::config::Config;
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::layout::Layout;
use crate::progress;

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
    fn in_place(&self, ranks: u32, rank: u32, config: &Config) -> Result<BufferPlan>;
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
    fn in_place(&self, ranks: u32, rank: u32, config: &Config) -> Result<BufferPlan> {
        let (ib, ob) = self.bytes(ranks, config)?;
        let e = u64::from(self.dtype.size());
        let (i, o) = self.in_place_offsets(rank);
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
    links: Vec<LinkState>,
    seq: u64,
    /// Why the communicator is unusable: the first failure.
    poisoned: Option<String>,
}

impl CommState {
    /// A fresh communicator state.
    pub fn new(layout: Layout, config: Config) -> Result<CommState> {
        config.validate()?;
        Ok(CommState {
            links: vec![LinkState::default(); layout.pairs()],
            layout,
            config,
            seq: 0,
            poisoned: None,
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

    /// The sequence number the next call gets.
    pub fn seq(&self) -> u64 {
        self.seq
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

    /// Enqueues one call (`specs[r]` from rank `r`) on `engine`. A failure
    /// poisons the communicator.
    pub fn run<E: Engine>(&mut self, engine: &mut E, specs: &[Call]) -> Result<()> {
        self.check_live()?;
        let calls: Vec<CallDesc> = specs.iter().map(|s| s.desc(self.seq)).collect();
        let r = progress::run_call(
            engine,
            &self.layout,
            &mut self.links,
            &calls,
            self.config.chunk_bytes,
            self.config.timeout,
        );
        match r {
            Ok(()) => {
                self.seq += 1;
                Ok(())
            }
            Err(e) => {
                tracing::warn!(error = %e, seq = self.seq, "ringcc-cuda: collective failed; communicator poisoned");
                self.poisoned = Some(e.to_string());
                Err(e)
            }
        }
    }

    /// Marks the communicator failed (a device error after enqueueing).
    pub fn poison(&mut self, cause: &Error) {
        if self.poisoned.is_none() {
            self.poisoned = Some(cause.to_string());
        }
    }
}
