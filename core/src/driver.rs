//! A blocking driver for firmware (feature `embedded-hal`).
//!
//! Firmware without an OS runs one [`Machine`] to completion by polling a
//! completion source — a NIC's completion queue, a doorbell page, a
//! mailbox — and sleeping briefly between polls with an
//! [`embedded_hal::delay::DelayNs`] it provides. The core has no clock of
//! its own; every wait is bounded by counting the nanoseconds it asked the
//! delay for: when nothing happens for `timeout_ns`, the driver returns
//! [`DriverError::Timeout`] instead of spinning forever.

use embedded_hal::delay::DelayNs;

use crate::error::Error;
use crate::plan::CallDesc;
use crate::prim::{Action, LinkState, Machine};
use crate::topology::RingOrder;

/// What the completion source reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Event {
    /// The exec last handed to [`Transport::execute`] is complete.
    ExecDone,
    /// The predecessor's `tail` moved.
    Tail(u64),
    /// The predecessor's call header for the message at `step`.
    Header {
        /// FIFO step the header precedes.
        step: u64,
        /// The predecessor's call.
        desc: CallDesc,
    },
    /// The successor's `head` moved.
    Head(u64),
}

/// The hardware side of one (channel, rank): carries out actions and
/// reports what happened. Both calls must return promptly.
pub trait Transport {
    /// The transport's own error.
    type Error;

    /// Starts carrying out `action` (an exec or a credit return). Exec
    /// completion is reported later by [`poll`](Transport::poll).
    fn execute(&mut self, action: &Action) -> Result<(), Self::Error>;

    /// Reports one event if one is ready.
    fn poll(&mut self) -> Result<Option<Event>, Self::Error>;
}

/// Why the driver stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum DriverError<E> {
    /// The state machine failed (mismatched call, protocol violation, …).
    Machine(Error),
    /// The transport failed.
    Transport(E),
    /// Nothing happened for this many nanoseconds.
    Timeout {
        /// Nanoseconds waited without progress.
        waited_ns: u64,
    },
}

impl<E: core::fmt::Debug> core::fmt::Display for DriverError<E> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            DriverError::Machine(e) => write!(f, "state machine: {e}"),
            DriverError::Transport(e) => write!(f, "transport: {e:?}"),
            DriverError::Timeout { waited_ns } => write!(f, "no progress for {waited_ns} ns"),
        }
    }
}

impl<E: core::fmt::Debug> core::error::Error for DriverError<E> {}

impl<E> From<Error> for DriverError<E> {
    fn from(e: Error) -> Self {
        DriverError::Machine(e)
    }
}

/// Runs machines to completion with bounded waits.
#[derive(Debug)]
pub struct BlockingDriver<D> {
    delay: D,
    poll_interval_ns: u32,
    timeout_ns: u64,
}

impl<D: DelayNs> BlockingDriver<D> {
    /// A driver that sleeps `poll_interval_ns` between idle polls and gives
    /// up after `timeout_ns` without progress.
    pub fn new(delay: D, poll_interval_ns: u32, timeout_ns: u64) -> Self {
        BlockingDriver {
            delay,
            poll_interval_ns: poll_interval_ns.max(1),
            timeout_ns,
        }
    }

    /// Gives the delay back.
    pub fn into_inner(self) -> D {
        self.delay
    }

    /// Runs `machine` until it is done; returns its final connection
    /// counters (for the next collective's machine).
    pub fn run<M: RingOrder, T: Transport>(
        &mut self,
        machine: &mut Machine<M>,
        transport: &mut T,
    ) -> Result<LinkState, DriverError<T::Error>> {
        if machine.is_done() {
            return Ok(machine.link());
        }
        let mut waited: u64 = 0;
        loop {
            let mut progressed = false;
            while let Some(action) = machine.poll_action()? {
                progressed = true;
                if action == Action::Done {
                    return Ok(machine.link());
                }
                transport.execute(&action).map_err(DriverError::Transport)?;
            }
            while let Some(event) = transport.poll().map_err(DriverError::Transport)? {
                progressed = true;
                match event {
                    Event::ExecDone => machine.handle_exec_done()?,
                    Event::Tail(t) => machine.handle_tail(t)?,
                    Event::Header { step, desc } => machine.handle_header(step, desc)?,
                    Event::Head(h) => machine.handle_head(h)?,
                }
            }
            if progressed {
                waited = 0;
                continue;
            }
            if waited >= self.timeout_ns {
                return Err(DriverError::Timeout { waited_ns: waited });
            }
            self.delay.delay_ns(self.poll_interval_ns);
            waited = waited.saturating_add(u64::from(self.poll_interval_ns));
        }
    }
}
