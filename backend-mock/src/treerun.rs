//! Tree AllReduce on the simulated cluster: each rank's core engine runs
//! the call's [`TreeMachine`](ringcc_core::prim::TreeMachine)s
//! ([`Engine::start_tree`](ringcc_core::Engine::start_tree) /
//! [`handle_tree`](ringcc_core::Engine::handle_tree) /
//! [`poll_tree`](ringcc_core::Engine::poll_tree)) inside the same run
//! loop, watchdog, abort and lane states as a ring call; this module only
//! carries out the tree's actions.
//!
//! The tree of channel `c` is the core's [`UniformTree`] (tree `c mod 2`
//! of the double binary tree across nodes, a chain inside each node). A
//! hop inside a node is NVLink, one between nodes the channel's NIC
//! ([`tree_nic`]: `(c / 2) mod nics` of the sending node, a channel of
//! each tree on every NIC), with the run's protocol latencies:
//! a slice's bytes (the protocol's wire bytes) take the link's calibrated
//! bandwidth on a serial resource ([`Tx`]: a GPU's NVLink, shared by its
//! peers as behind an NVSwitch, or a NIC port; transmit sides), then the
//! hop latency; a NIC hop also pays the
//! doorbell and the per-message overhead. Credits return after one hop
//! latency. NIC hops are flows, not queue pairs and packets.
//!
//! Payload mode: each exec reads its incoming slices out of the rank's
//! FIFO slots of the connections it receives on (from the children going
//! up, from the parent going down), reduces them with the rank's input
//! where the primitive says so ([`tree_slice_result`]), writes the output
//! where it says so, and sends the result to each connection's peer: the
//! bytes travel with the peer's `tail` event and land in the peer's slot
//! (FIFO step mod [`STEPS`]) when it arrives. A slot is emptied when
//! read; landing on a full slot or reading an empty one is an overrun the
//! run reports. The bytes never change an event's time: a payload run
//! takes exactly the simulated time of a timing-only one.

use std::collections::HashMap;

use ringcc_core::fifo::STEPS;
use ringcc_core::prim::{tree_slice_result, TreeAction, TreeConn, TreeExec, TREE_CONNS};
use ringcc_core::progress::Event;
use ringcc_core::tree::{tree_nic, TreeDir, TreeOrder, UniformTree};
use ringcc_core::{ChannelId, NicId, Primitive, Rank};

use crate::error::Error;
use crate::events::{Ev, Ps, Rate, Slab, NONE};
use crate::exec::payload_missing;
use crate::fabric::nic_port;
use crate::lane::LaneState;
use crate::sim::Sim;

/// An event for one (channel, rank) of a tree call.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TreeMsg {
    pub rank: u32,
    pub channel: u8,
    /// The connection the event arrives on (ignored for `ExecDone`).
    pub conn: TreeConn,
    /// For `ExecDone`: the finished exec's direction (its stream: a
    /// non-root rank runs its up and down streams concurrently).
    pub dir: TreeDir,
    pub event: Event,
    /// Payload mode, on the slice's `Tail` event: the slice's bytes
    /// ([`TreeState::landing`]), else [`NONE`].
    pub data: u32,
}

/// A FIFO slot of a tree connection: the receiving rank, channel,
/// connection ([`TreeConn::index`]) and slot (FIFO step mod [`STEPS`]).
type SlotKey = (u32, u8, u8, u64);

/// A peer on one connection: its rank and its connection back to us.
type Peer = Option<(u32, TreeConn)>;

/// A resource that sends one transfer at a time.
///
/// A GPU's NVLink is one: behind an NVSwitch (every preset's node) its
/// bandwidth is shared by all its peers, and a chain's inner rank sends
/// to two of them at once (up to its parent, down to its child). Keyed by
/// GPU pair, each direction got the whole line rate: a one-node 1 GiB
/// tree ran at 333 GB/s, its inner ranks sending 667 GB/s over a 450 GB/s
/// NVLink.
/// (A ring's rank sends to one peer of its node on every channel, so the
/// fabric's per-pair NVLinks are per GPU there.)
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Tx {
    /// The NVLink transmit side of a GPU (its rank).
    Nvlink(u32),
    /// A NIC port's transmit side.
    Nic(u32),
}

/// The tree call's transport state.
#[derive(Debug)]
pub(crate) struct TreeState {
    /// Per lane (`channel · ranks + rank`), per connection: the peer.
    pub peers: Vec<[Peer; TREE_CONNS]>,
    /// Events in flight ([`Ev::Tree`] names one).
    pub msgs: Slab<TreeMsg>,
    /// When a transmit resource is free.
    pub busy: HashMap<Tx, Ps>,
    /// Payload mode: slices in flight, each with its FIFO step.
    pub landing: Slab<(u64, Vec<u8>)>,
    /// Payload mode: the slices landed and not yet read.
    pub slots: HashMap<SlotKey, Vec<u8>>,
}

impl Default for TreeState {
    fn default() -> Self {
        TreeState {
            peers: Vec::new(),
            msgs: Slab::new(),
            busy: HashMap::new(),
            landing: Slab::new(),
            slots: HashMap::new(),
        }
    }
}

impl<const N: usize> Sim<N> {
    /// Whether the cluster's hop from `a` to `b` stays inside a node.
    fn same_node(&self, a: u32, b: u32) -> bool {
        let g = self.cfg.gpus_per_node.max(1);
        a / g == b / g
    }

    /// Builds every (channel, rank)'s peers for `channels` tree channels.
    pub(crate) fn tree_peers(&mut self, channels: u32) -> Result<(), Error> {
        let (n, nodes, gpus) = (self.fab.ranks, self.cfg.nodes, self.cfg.gpus_per_node);
        let mut peers = vec![[None; TREE_CONNS]; (self.fab.channels * n) as usize];
        for c in 0..channels {
            let tree =
                UniformTree::for_channel(nodes, gpus, self.cfg.nics_per_node, ChannelId(c as u8));
            for r in 0..n {
                let p = tree
                    .peers(Rank(r))
                    .map_err(|source| Error::Topology { source })?;
                let mut row = [None; TREE_CONNS];
                if let Some(up) = p.up {
                    let back = tree
                        .peers(up)
                        .map_err(|source| Error::Topology { source })?
                        .down
                        .iter()
                        .position(|d| *d == Some(Rank(r)))
                        .ok_or(Error::BadConfig {
                            what: format!("tree {c}: rank {r} is not a child of its parent"),
                        })?;
                    row[0] = Some((up.0, TreeConn::Down(back as u8)));
                }
                for (i, d) in p.down.iter().enumerate() {
                    if let Some(d) = d {
                        row[1 + i] = Some((d.0, TreeConn::Up));
                    }
                }
                peers[self.fab.lane(c, r) as usize] = row;
            }
        }
        self.tree.peers = peers;
        // What an earlier, failed call left in flight is not this call's.
        self.tree.slots.clear();
        self.tree.landing = Slab::new();
        Ok(())
    }

    /// Schedules `event` for `rank`'s channel `channel` on `conn` at `at`.
    fn tree_at(&mut self, at: Ps, rank: u32, channel: u8, conn: TreeConn, event: Event) {
        self.tree_at_with(at, rank, channel, conn, event, NONE);
    }

    /// Schedules the end of `rank`'s exec going `dir` on `channel` at `at`.
    fn tree_exec_done_at(&mut self, at: Ps, rank: u32, channel: u8, dir: TreeDir) {
        let m = TreeMsg {
            rank,
            channel,
            conn: TreeConn::Up,
            dir,
            event: Event::ExecDone,
            data: NONE,
        };
        self.schedule_tree(at, m);
    }

    /// Schedules tree message `m` at `at`.
    fn schedule_tree(&mut self, at: Ps, m: TreeMsg) {
        let id = self.tree.msgs.insert(m);
        self.events.at(at, Ev::Tree { id });
    }

    /// [`tree_at`](Sim::tree_at) carrying payload `data` (a
    /// [`TreeState::landing`] index, or [`NONE`]).
    fn tree_at_with(
        &mut self,
        at: Ps,
        rank: u32,
        channel: u8,
        conn: TreeConn,
        event: Event,
        data: u32,
    ) {
        let m = TreeMsg {
            rank,
            channel,
            conn,
            dir: TreeDir::Turn,
            event,
            data,
        };
        self.schedule_tree(at, m);
    }

    /// A tree event arrived: hand it to the rank's engine, then drive it.
    pub(crate) fn on_tree(&mut self, id: u32) {
        let Some(m) = self.tree.msgs.take(id) else {
            return;
        };
        let l = self.fab.lane(u32::from(m.channel), m.rank);
        if self.lanes[l].state != LaneState::Running {
            return;
        }
        if m.data != NONE {
            if let Err(err) = self.land_tree(&m) {
                self.fail_lane(l, err);
                return;
            }
        }
        let now = self.events.now();
        let engine = &mut self.lanes.engines[m.rank as usize];
        let handled = match m.event {
            Event::ExecDone => {
                self.run.last_exec = self.run.last_exec.max(now);
                engine.handle_tree_exec_done(now, ChannelId(m.channel), m.dir)
            }
            ev => engine.handle_tree(now, ChannelId(m.channel), m.conn, ev),
        };
        if let Err(e) = handled {
            let err = self.engine_error(m.rank, e);
            self.fail_lane(l, err);
            return;
        }
        self.drive_tree(m.rank);
    }

    /// Polls `rank`'s engine until it waits, carrying out its tree actions.
    pub(crate) fn drive_tree(&mut self, rank: u32) {
        if self.run.before_launch(rank, self.events.now()) {
            return;
        }
        loop {
            let polled = self.lanes.engines[rank as usize].poll_tree();
            match polled {
                Ok(Some((c, TreeAction::Exec(e)))) => {
                    if let Err(err) = self.start_tree_exec(rank, c, &e) {
                        let l = self.fab.lane(u32::from(c.0), rank);
                        self.fail_lane(l, err);
                        return;
                    }
                }
                Ok(Some((c, TreeAction::ReturnCredit { conn, head }))) => {
                    self.stats.credits += 1;
                    let l = self.fab.lane(u32::from(c.0), rank);
                    if let Some((peer, back)) = self.tree.peers[l as usize][conn.index()] {
                        let at = self
                            .events
                            .now()
                            .saturating_add(self.hop_latency(rank, peer));
                        self.tree_at(at, peer, c.0, back, Event::Head(head));
                    }
                }
                Ok(Some((c, TreeAction::Done))) => {
                    self.lane_done(self.fab.lane(u32::from(c.0), rank));
                }
                Ok(None) => return,
                Err(e) => {
                    // The first running lane fails; `fail_lane` aborts
                    // the rank's others.
                    let err = self.engine_error(rank, e);
                    let running = (0..self.fab.channels)
                        .map(|c| self.fab.lane(c, rank))
                        .find(|&l| self.running(l));
                    if let Some(l) = running {
                        self.fail_lane(l, err);
                    }
                    return;
                }
            }
        }
    }

    /// One hop's latency under the run's protocol (a NIC hop with its
    /// doorbell): what a credit or a slice's last byte takes.
    fn hop_latency(&self, from: u32, to: u32) -> Ps {
        let (nvlink, nic) = self.protocol_latencies();
        if self.same_node(from, to) {
            crate::events::ps(nvlink)
        } else {
            crate::events::ps(nic).saturating_add(self.time.doorbell)
        }
    }

    /// Carries out one tree slice on `rank`'s GPU: its time, then its
    /// sends, each peer told (header, then tail) when the slice arrives.
    /// A non-root rank's up and down streams each have their own exec
    /// (NCCL's split tree gives each its own group of threads), so two
    /// may run at once; a link still carries one transfer at a time.
    fn start_tree_exec(&mut self, rank: u32, c: ChannelId, e: &TreeExec) -> Result<(), Error> {
        let now = self.events.now();
        let elem = self.run.elem[rank as usize];
        let bytes = e.count.saturating_mul(elem);
        let p = e.primitive;
        let result = if self.cfg.payload {
            Some(self.tree_compute(rank, c, e, bytes as usize)?)
        } else {
            None
        };
        let recvs = e.recv_conns().count() as u64;
        let touched = recvs
            + u64::from(p.reads_input())
            + u64::from(p.contains(Primitive::COPY))
            + e.send_conns().count() as u64;
        let mut done = now
            .saturating_add(self.time.gpu_overhead)
            .saturating_add(self.time.gpu_rate.time(touched * bytes));
        let wire = self.time.wire_bytes(bytes);
        if let Some(r) = self.time.channel_rate {
            done = done.max(now.saturating_add(r.time(wire)));
        }
        let l = self.fab.lane(u32::from(c.0), rank);
        let (nvlink_lat, nic_lat) = self.protocol_latencies();
        let k = &self.cfg.calibration;
        let nvlink_rate = Rate::new(self.cfg.nvlink.bandwidth * k.nvlink_efficiency);
        let nic_rate = Rate::new(self.cfg.nic.bandwidth * k.nic_efficiency);
        let mut arrivals = [None; TREE_CONNS];
        // NVLink stores stream while the slice computes; the NIC sends
        // from staging once the slice is done.
        for (conn, _) in e.send_conns() {
            let Some((peer, back)) = self.tree.peers[l as usize][conn.index()] else {
                return Err(Error::BadConfig {
                    what: format!("rank {rank} channel {}: no peer on {conn:?}", c.0),
                });
            };
            let arrive = if self.same_node(rank, peer) {
                let busy = self.tree.busy.entry(Tx::Nvlink(rank)).or_insert(0);
                let start = now.max(*busy);
                let end = start.saturating_add(nvlink_rate.time(wire));
                *busy = end;
                done = done.max(end);
                end.saturating_add(crate::events::ps(nvlink_lat))
            } else {
                let nics = self.cfg.nics_per_node.max(1);
                let nic = tree_nic(c, nics).unwrap_or(NicId(0));
                let port = nic_port(rank / self.cfg.gpus_per_node.max(1), nics, nic);
                let busy = self.tree.busy.entry(Tx::Nic(port)).or_insert(0);
                let start = done.saturating_add(self.time.doorbell).max(*busy);
                let end = start.saturating_add(
                    nic_rate.time(wire.saturating_add(self.time.nic_overhead_bytes)),
                );
                *busy = end;
                end.saturating_add(crate::events::ps(nic_lat))
            };
            arrivals[conn.index()] = Some((peer, back, arrive));
        }
        self.tree_exec_done_at(done, rank, c.0, e.dir);
        for (conn, _) in e.send_conns() {
            if let Some((peer, back, at)) = arrivals[conn.index()] {
                for ev in e.peer_events(conn) {
                    let data = match (ev, &result) {
                        (Event::Tail(_), Some(r)) => {
                            self.tree.landing.insert((span_step(e, conn), r.clone()))
                        }
                        _ => NONE,
                    };
                    self.tree_at_with(at.max(done), peer, c.0, back, ev, data);
                }
            }
        }
        Ok(())
    }

    /// Payload mode: the slice of `m` (a `Tail` event) lands in the
    /// receiver's slot of the connection it arrives on.
    fn land_tree(&mut self, m: &TreeMsg) -> Result<(), Error> {
        let Some((step, data)) = self.tree.landing.take(m.data) else {
            return Ok(());
        };
        let key = (m.rank, m.channel, m.conn.index() as u8, step % STEPS);
        if self.tree.slots.insert(key, data).is_some() {
            return Err(Error::Reduce {
                rank: Rank(m.rank),
                call: "land in a full FIFO slot",
                source: ringcc_core::Error::Protocol(ringcc_core::ProtocolViolation::Overrun),
            });
        }
        Ok(())
    }

    /// Payload mode: one tree slice's bytes on `rank`: the incoming slots
    /// (emptied) reduced with the input where the primitive says so, the
    /// output written where it says so; returns what to send.
    fn tree_compute(
        &mut self,
        rank: u32,
        c: ChannelId,
        e: &TreeExec,
        bytes: usize,
    ) -> Result<Vec<u8>, Error> {
        let call = self.run.calls[rank as usize];
        let p = e.primitive;
        let mut incoming: [Option<Vec<u8>>; TREE_CONNS] = Default::default();
        for (conn, span) in e.recv_conns() {
            let key = (rank, c.0, conn.index() as u8, span.step % STEPS);
            let slice = self
                .tree
                .slots
                .remove(&key)
                .filter(|s| s.len() == bytes)
                .ok_or_else(payload_missing(rank, bytes, "read FIFO slot"))?;
            incoming[conn.index()] = Some(slice);
        }
        let local = if p.reads_input() {
            Some(self.run.payload_input(rank, e.input_offset, bytes)?)
        } else {
            None
        };
        let mut result = vec![0u8; bytes];
        tree_slice_result(
            p,
            call.dtype,
            call.op,
            self.fab.ranks,
            incoming.iter().flatten().map(Vec::as_slice),
            local,
            &mut result,
        )
        .map_err(|source| Error::Reduce {
            rank: Rank(rank),
            call: "tree_slice_result",
            source,
        })?;
        if p.contains(Primitive::COPY) {
            self.run.payload_output(rank, e.output_offset, &result)?;
        }
        Ok(result)
    }
}

/// The FIFO step of `e`'s slice sent on `conn` (0 if it sends none there).
fn span_step(e: &TreeExec, conn: TreeConn) -> u64 {
    e.send
        .get(conn.index())
        .copied()
        .flatten()
        .map_or(0, |s| s.step)
}
