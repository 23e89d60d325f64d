//! Failures and their propagation: a lane fails, its rank stops and
//! broadcasts an abort over the control network; every rank that receives
//! it fails; a rank dies; the watchdog enforces every rank engine's
//! deadline.

use ringcc_core::Rank;

use crate::error::Error;
use crate::events::{secs, Ev, Ps};
use crate::lane::LaneState;
use crate::sim::{RankState, Sim};

impl<const N: usize> Sim<N> {
    pub(crate) fn aborted_error(&self, rank: u32, origin: u32) -> Error {
        let cause = match &self.ranks[origin as usize] {
            RankState { error: Some(e), .. } => e.clone(),
            RankState { died: Some(t), .. } => Error::RankDied {
                rank: Rank(origin),
                at: secs(*t),
            },
            _ => Error::BadConfig {
                what: "unknown cause".into(),
            },
        };
        Error::Aborted {
            rank: Rank(rank),
            origin: Rank(origin),
            cause: Box::new(cause),
        }
    }

    /// Lane `l` fails with `err`; a first failure of its rank stops the
    /// rank and aborts the others.
    pub(crate) fn fail_lane(&mut self, l: u32, err: Error) {
        let lane = &mut self.lanes[l];
        if lane.state != LaneState::Running {
            return;
        }
        lane.state = LaneState::Failed;
        self.run.finished += 1;
        let rank = self.fab.lanes[l as usize].rank;
        self.lanes.engines[rank as usize].abort();
        let primary = !matches!(err, Error::Aborted { .. });
        if primary {
            tracing::debug!(%err, "lane failed");
        }
        let rs = &mut self.ranks[rank as usize];
        if rs.error.is_none() {
            rs.error = Some(err);
        }
        if primary && !rs.abort_sent {
            rs.abort_sent = true;
            let cause = Box::new(rs.error.clone().unwrap_or_else(|| Error::BadConfig {
                what: "unknown cause".into(),
            }));
            for c in 0..self.fab.channels {
                let other = self.fab.lane(c, rank);
                self.fail_lane(
                    other,
                    Error::Aborted {
                        rank: Rank(rank),
                        origin: Rank(rank),
                        cause: cause.clone(),
                    },
                );
            }
            for j in 0..self.fab.ranks {
                if j != rank && self.ranks[j as usize].died.is_none() {
                    self.run.aborts_in_flight += 1;
                    self.events.after(
                        self.time.control,
                        Ev::Abort {
                            rank: j,
                            origin: rank,
                        },
                    );
                }
            }
        }
    }

    pub(crate) fn fail_all(&mut self, err: impl Fn(Rank) -> Error) {
        for l in 0..self.lanes.len() {
            let rank = self.fab.lanes[l as usize].rank_id();
            self.fail_lane(l, err(rank));
        }
        self.run.aborts_in_flight = 0;
    }

    pub(crate) fn on_abort(&mut self, rank: u32, origin: u32) {
        self.run.aborts_in_flight = self.run.aborts_in_flight.saturating_sub(1);
        if !self.run.active || self.ranks[rank as usize].died.is_some() {
            return;
        }
        let rs = &mut self.ranks[rank as usize];
        if rs.aborted.is_some() {
            return;
        }
        rs.aborted = Some(origin);
        for c in 0..self.fab.channels {
            let l = self.fab.lane(c, rank);
            if self.running(l) {
                let err = self.aborted_error(rank, origin);
                self.fail_lane(l, err);
            }
        }
    }

    pub(crate) fn on_death(&mut self, rank: u32) {
        let now = self.events.now();
        let rs = &mut self.ranks[rank as usize];
        if rs.died.is_none() {
            tracing::debug!(rank, "rank died");
            rs.died = Some(now);
        }
        self.lanes.engines[rank as usize].abort();
        for c in 0..self.fab.channels {
            let l = self.fab.lane(c, rank);
            if self.running(l) {
                self.lanes[l].state = LaneState::Dead;
                self.run.finished += 1;
            }
        }
    }

    /// Every rank's engine deadline (no progress for `deadline` on any of
    /// its channels): a rank past it fails with the engine's stall report.
    pub(crate) fn on_watchdog(&mut self, epoch: u32) {
        if epoch != self.run.epoch || !self.run.active {
            return;
        }
        let now = self.events.now();
        let mut next: Option<Ps> = None;
        for r in 0..self.fab.ranks {
            let running = (0..self.fab.channels).any(|c| self.running(self.fab.lane(c, r)));
            if !running {
                continue;
            }
            let engine = &mut self.lanes.engines[r as usize];
            match engine.handle_timeout(now) {
                Ok(()) => {
                    if let Some(due) = engine.poll_timeout() {
                        next = Some(next.map_or(due, |n| n.min(due)));
                    }
                }
                Err(e) => {
                    let channel = e.channel().map_or(0, |c| u32::from(c.0));
                    let err = self.engine_error(r, e);
                    self.fail_lane(self.fab.lane(channel, r), err);
                }
            }
        }
        if let Some(t) = next {
            self.events.at(t, Ev::Watchdog { epoch });
        }
    }
}
