//! A communicator over the host [`FakeDevice`]: the CUDA communicator's
//! logic, end to end, on any machine.

use crate::state::CallBuffers;
use ringcc_core::Rank;

use crate::config::Config;
use crate::device::fake::FakeDevice;
use crate::error::{Error, Result};
use crate::layout::Layout;
use crate::state::{Call, CommState};

/// One rank's call with its data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostCall {
    /// The call.
    pub spec: Call,
    /// The rank's input bytes (for an in-place call: the whole buffer, as
    /// [`Call::in_place`] lays it out).
    pub input: Vec<u8>,
    /// Run in place.
    pub in_place: bool,
}

/// See the module documentation.
#[derive(Debug)]
pub struct HostComm {
    state: CommState,
    device: FakeDevice,
}

impl HostComm {
    /// Ranks on fake devices `devices[r]`; `peer(a, b)` says whether device
    /// `a` may write device `b` (else hops are staged); `seed` and
    /// `eagerness` pick the device's interleaving (see [`FakeDevice::new`]).
    pub fn new(
        devices: Vec<usize>,
        config: Config,
        peer: impl Fn(usize, usize) -> bool,
        seed: u64,
        eagerness: u32,
    ) -> Result<HostComm> {
        let layout = Layout::new(devices, config.channels, config.geometry, |a, b| {
            config.peer_access && peer(a, b)
        })?;
        let device = FakeDevice::new(layout.clone(), seed, eagerness);
        Ok(HostComm {
            state: CommState::new(layout, config)?,
            device,
        })
    }

    /// The communicator's layout.
    pub fn layout(&self) -> &Layout {
        self.state.layout()
    }

    /// The fake device.
    pub fn device(&self) -> &FakeDevice {
        &self.device
    }

    /// The fake device, to change its memory between calls (what `perf`'s
    /// test-only corruption does).
    pub fn device_mut(&mut self) -> &mut FakeDevice {
        &mut self.device
    }

    /// The communicator's settings.
    pub fn config(&self) -> &Config {
        self.state.config()
    }

    /// The ranks' engines and the communicator's first failure.
    pub fn state(&self) -> &CommState {
        &self.state
    }

    /// Ends the communicator as [`Comm::close`](crate::Comm::close) does:
    /// runs what is still enqueued, then reports a poisoned communicator
    /// ([`Error::Poisoned`] with its cause) or the device's failure.
    pub fn close(mut self) -> Result<()> {
        let finished = self.device.synchronize();
        crate::comm::closing(self.state.failure(), finished)
    }

    /// Runs one collective (one call per rank) and returns every rank's
    /// output bytes.
    pub fn run(&mut self, calls: &[HostCall]) -> Result<Vec<Vec<u8>>> {
        self.state.check_live()?;
        let n = self.state.layout().ranks();
        if calls.len() != n as usize {
            return Err(Error::RankCount {
                expected: n as usize,
                got: calls.len(),
            });
        }
        let config = *self.state.config();
        for (r, call) in calls.iter().enumerate() {
            let rank = Rank(r as u32);
            let (ib, ob) = call.spec.bytes(n, &config)?;
            let given = call.input.len() as u64;
            if call.in_place {
                let bp = call.spec.in_place(n, rank, &config)?;
                check(rank, "send", bp.total, given)?;
                self.device
                    .bind(rank, call.input.clone(), bp.input, bp.output, None);
            } else {
                check(rank, "send", ib, given)?;
                self.device.bind(
                    rank,
                    call.input.clone(),
                    (0, ib),
                    (0, ob),
                    Some(vec![0xA5; ob as usize]),
                );
            }
        }
        let specs: Vec<Call> = calls.iter().map(|c| c.spec).collect();
        self.state.run(&mut self.device, &specs)?;
        if let Err(e) = self.device.synchronize() {
            self.state.poison(&e);
            return Err(e);
        }
        (0..n)
            .map(|r| {
                self.device
                    .output(Rank(r))
                    .map(<[u8]>::to_vec)
                    .ok_or(Error::BadConfig {
                        what: "fake device lost an output buffer",
                    })
            })
            .collect()
    }
}

fn check(rank: Rank, which: &'static str, needed: u64, got: u64) -> Result<()> {
    if got < needed {
        return Err(Error::BadBuffer {
            rank,
            which,
            expected: needed,
            got,
        });
    }
    Ok(())
}
