//! A blocking driver for firmware (feature `embedded-hal`).
//!
//! Firmware without an OS runs one rank's call to completion by polling a
//! completion source — a NIC's completion queue, a doorbell page, a
//! mailbox — and sleeping briefly between polls with an
//! [`embedded_hal::delay::DelayNs`] it provides. It is a thin loop over
//! the [`Engine`]: all channels together, the engine's deadline measured
//! by counting the nanoseconds the driver asked the delay for.

use embedded_hal::delay::DelayNs;

use crate::id::ChannelId;
use crate::prim::Action;
pub use crate::progress::Event;
use crate::progress::{Channel, Engine, EngineError};
use crate::topology::RingOrder;

/// The hardware side of one rank: carries out actions and reports what
/// happened. Both calls must return promptly.
pub trait Transport {
    /// The transport's own error.
    type Error;

    /// Starts carrying out `action` on `channel` (an exec or a credit
    /// return; `Done` needs nothing). Exec completion is reported later
    /// by [`poll`](Transport::poll).
    fn execute(&mut self, channel: ChannelId, action: &Action) -> Result<(), Self::Error>;

    /// Reports one event if one is ready.
    fn poll(&mut self) -> Result<Option<(ChannelId, Event)>, Self::Error>;
}

/// Why the driver stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum DriverError<E> {
    /// The engine failed (mismatched call, protocol violation, deadline,
    /// …: the [`EngineError`] says which, on which channel).
    Engine(EngineError),
    /// The transport failed.
    Transport(E),
}

impl<E: core::fmt::Debug> core::fmt::Display for DriverError<E> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            DriverError::Engine(e) => write!(f, "engine: {e}"),
            DriverError::Transport(e) => write!(f, "transport: {e:?}"),
        }
    }
}

impl<E: core::fmt::Debug> core::error::Error for DriverError<E> {}

impl<E> From<EngineError> for DriverError<E> {
    fn from(e: EngineError) -> Self {
        DriverError::Engine(e)
    }
}

/// Runs an engine's call to completion with bounded waits.
#[derive(Debug)]
pub struct BlockingDriver<D> {
    delay: D,
    poll_interval_ns: u32,
    /// Nanoseconds slept so far: the engine's clock.
    now: u64,
}

impl<D: DelayNs> BlockingDriver<D> {
    /// A driver that sleeps `poll_interval_ns` between idle polls. The
    /// deadline is the engine's ([`Engine::new`]'s timeout, in
    /// nanoseconds of sleep).
    pub fn new(delay: D, poll_interval_ns: u32) -> Self {
        BlockingDriver {
            delay,
            poll_interval_ns: poll_interval_ns.max(1),
            now: 0,
        }
    }

    /// The driver's clock (nanoseconds slept): the `now` to start calls at.
    pub fn now(&self) -> u64 {
        self.now
    }

    /// Gives the delay back.
    pub fn into_inner(self) -> D {
        self.delay
    }

    /// Drives the engine's running call until every channel is done.
    pub fn run<M, S, T>(
        &mut self,
        engine: &mut Engine<M, S>,
        transport: &mut T,
    ) -> Result<(), DriverError<T::Error>>
    where
        M: RingOrder,
        S: AsRef<[Channel<M>]> + AsMut<[Channel<M>]>,
        T: Transport,
    {
        while !engine.is_idle() {
            let mut progressed = false;
            while let Some((c, action)) = engine.poll()? {
                progressed = true;
                if let Err(e) = transport.execute(c, &action) {
                    engine.abort();
                    return Err(DriverError::Transport(e));
                }
            }
            if engine.is_idle() {
                break;
            }
            loop {
                match transport.poll() {
                    Ok(Some((c, event))) => {
                        progressed = true;
                        engine.handle(self.now, c, event)?;
                    }
                    Ok(None) => break,
                    Err(e) => {
                        engine.abort();
                        return Err(DriverError::Transport(e));
                    }
                }
            }
            if !progressed {
                engine.handle_timeout(self.now)?;
                self.delay.delay_ns(self.poll_interval_ns);
                self.now = self.now.saturating_add(u64::from(self.poll_interval_ns));
            }
        }
        Ok(())
    }
}
