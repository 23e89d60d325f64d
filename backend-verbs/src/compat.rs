//! The 0.1 API (`Communicator::new(launch, config)`, `run(call, …)` on
//! `&mut self`, [`Registered`] buffers) over the communicator, for code
//! that has not moved to [`ringcc_comm::Communicator`] with
//! [`VerbsTransport`] yet (the `ringcc perf --backend verbs` command).
//! New code uses those two directly; see the crate documentation.
//!
//! What changed underneath: the communicator is `ringcc-comm`'s (its
//! settings are [`Options`], its errors `ringcc_comm::Error`, carried here
//! in [`Error::Comm`]); buffers are never registered with a NIC any more
//! (the executor writes into registered staging), so [`register`]
//! only borrows the buffer.
//!
//! [`register`]: Communicator::register

use ringcc_comm::launch::Launch;
use ringcc_comm::Options;
use ringcc_core::Rank;

pub use ringcc_core::Call;

use crate::config::VerbsConfig;
use crate::error::{Error, Result};

/// The settings of a [`Communicator`]: the communicator's [`Options`]
/// and the transport's [`VerbsConfig`], with the three fields 0.1's
/// callers set by hand.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Config {
    /// Channels (rings), `1..=64`; overrides `options.channels`.
    pub channels: u32,
    /// The plan's chunk; overrides `options.chunk_bytes`.
    pub chunk_bytes: u64,
    /// No effect: a ring enters and leaves a node through the same NIC
    /// (channel `c`'s on both sides).
    pub cross_nic: bool,
    /// Everything else of the communicator.
    pub options: Options,
    /// The transport's settings.
    pub verbs: VerbsConfig,
}

impl Config {
    /// [`Options::from_env`] and [`VerbsConfig::from_env`].
    pub fn from_env() -> Result<Config> {
        let options = Options::from_env()?;
        Ok(Config {
            channels: u32::from(options.channels),
            chunk_bytes: options.chunk_bytes,
            cross_nic: false,
            options,
            verbs: VerbsConfig::from_env()?,
        })
    }

    /// The communicator's options with `channels` and `chunk_bytes`
    /// applied, checked.
    pub fn options(&self) -> Result<Options> {
        let mut o = self.options.clone();
        o.channels = u8::try_from(self.channels)
            .map_err(|_| Error::BadConfig(format!("{} channels (1..=64)", self.channels)))?;
        o.chunk_bytes = self.chunk_bytes;
        o.validate()?;
        Ok(o)
    }
}

/// A buffer handed to [`Communicator::run_registered`]: 0.1 registered it
/// with every NIC once; now the NIC never reads a caller's buffer, and
/// this only borrows it.
#[derive(Debug)]
pub struct Registered<'a> {
    buf: &'a mut [u8],
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

/// One rank of a job over verbs alone: a [`ringcc_comm::Communicator`]
/// whose only transport is [`VerbsTransport`](crate::VerbsTransport).
#[derive(Debug)]
pub struct Communicator {
    comm: ringcc_comm::Communicator,
}

impl Communicator {
    /// Rank, world size and address from the launcher's environment,
    /// settings from `RINGCC_*` ([`Config::from_env`]).
    pub fn init_from_env() -> Result<Communicator> {
        Communicator::new(Launch::from_env()?, Config::from_env()?)
    }

    /// Joins the job `launch` describes (rank 0 serves the store).
    pub fn new(launch: Launch, config: Config) -> Result<Communicator> {
        let options = config.options()?;
        let comm = ringcc_comm::Communicator::from_launch(
            launch,
            options,
            crate::transports(config.verbs),
        )?;
        Ok(Communicator { comm })
    }

    /// The communicator underneath.
    pub fn into_inner(self) -> ringcc_comm::Communicator {
        self.comm
    }

    /// This rank.
    pub fn rank(&self) -> Rank {
        self.comm.rank()
    }

    /// Number of ranks.
    pub fn world_size(&self) -> u32 {
        self.comm.world_size()
    }

    /// Number of channels (rings).
    pub fn channels(&self) -> u32 {
        u32::from(self.comm.options().channels)
    }

    /// Collectives completed so far.
    pub fn calls(&self) -> u64 {
        self.comm.calls()
    }

    /// Runs `call` out of place.
    pub fn run(&mut self, call: Call, input: &[u8], output: &mut [u8]) -> Result<()> {
        Ok(self.comm.run(&call, input, output)?)
    }

    /// Runs `call` in place (NCCL's layout, [`Call::in_place_offsets`]).
    pub fn run_in_place(&mut self, call: Call, buf: &mut [u8]) -> Result<()> {
        Ok(self.comm.run_in_place(&call, buf)?)
    }

    /// Borrows `buf` for [`run_registered`](Communicator::run_registered)
    /// (no NIC registration any more: see [`Registered`]).
    pub fn register<'a>(&self, buf: &'a mut [u8]) -> Result<Registered<'a>> {
        Ok(Registered { buf })
    }

    /// [`run`](Communicator::run) on borrowed buffers.
    pub fn run_registered(
        &mut self,
        call: Call,
        input: &Registered<'_>,
        output: &mut Registered<'_>,
    ) -> Result<()> {
        self.run(call, input.buf, output.buf)
    }

    /// [`run_in_place`](Communicator::run_in_place) on a borrowed buffer.
    pub fn run_registered_in_place(&mut self, call: Call, buf: &mut Registered<'_>) -> Result<()> {
        self.run_in_place(call, buf.buf)
    }

    /// Aborts the job: every rank's calls fail.
    pub fn abort(self, reason: &str) {
        self.comm.abort(reason);
    }
}
