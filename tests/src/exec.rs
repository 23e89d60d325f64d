//! An in-memory executor: runs a collective over `n` ranks' buffers through
//! the core's state machines, one per (channel, rank), with a seeded random
//! interleaving of every event (machine polls, exec completions, counter
//! notifications).
//!
//! It models a connection as the receiver's FIFO memory plus the two posted
//! counters; a notification hands the receiver the *latest* posted value,
//! as a reader of shared memory would see it. It checks, independently of
//! the machines, that no slot is overwritten before it was read and that
//! every slot read holds the step the reader expects.

use ringcc_core::fifo::{FifoGeometry, STEPS};
use ringcc_core::prim::{slice_result, Action, Exec, LinkState, Machine};
use ringcc_core::topology::{Ring, Topology};
use ringcc_core::{CallDesc, ChannelId, Error, Plan, Primitive, Rank, ReduceOp};

/// Capacity of the executor's topologies.
pub use ringcc_core::MAX_RANKS;

/// Shape of a run.
#[derive(Clone, Debug)]
pub struct Config {
    /// Nodes.
    pub nodes: u32,
    /// GPUs (ranks) per node.
    pub gpus_per_node: u32,
    /// NICs per node.
    pub nics_per_node: u16,
    /// Rings may leave a node through another NIC.
    pub cross_nic: bool,
    /// Channels.
    pub channels: u32,
    /// Chunk size in bytes.
    pub chunk_bytes: u64,
    /// FIFO geometry.
    pub geometry: FifoGeometry,
    /// Input and output share one buffer (NCCL's in-place layouts).
    pub in_place: bool,
    /// Interleaving seed.
    pub seed: u64,
    /// Bound on events: a livelock fails instead of hanging.
    pub max_events: u64,
}

impl Config {
    /// `ranks` ranks on one node, one channel, small slots.
    pub fn single_node(ranks: u32) -> Config {
        Config {
            nodes: 1,
            gpus_per_node: ranks,
            nics_per_node: 1,
            cross_nic: false,
            channels: 1,
            chunk_bytes: 64,
            geometry: FifoGeometry::new(32, 1).unwrap_or_default(),
            in_place: false,
            seed: 1,
            max_events: 50_000_000,
        }
    }

    /// Number of ranks.
    pub fn ranks(&self) -> u32 {
        self.nodes * self.gpus_per_node
    }
}

/// One rank's call (the core's). Ranks normally share one; tests give
/// one rank a different call to provoke a mismatch.
pub use ringcc_core::Call;

/// What a run produced.
#[derive(Debug)]
pub struct Report {
    /// Per rank: its output buffer if every one of its machines finished.
    pub outputs: Vec<Option<Vec<u8>>>,
    /// Per rank: the first error one of its machines failed with.
    pub errors: Vec<Option<Error>>,
    /// Nothing could progress while some machines were unfinished.
    pub stalled: bool,
    /// Events processed.
    pub events: u64,
    /// Exec actions carried out.
    pub execs: u64,
}

impl Report {
    /// Every rank finished without error.
    pub fn ok(&self) -> bool {
        !self.stalled
            && self.errors.iter().all(Option::is_none)
            && self.outputs.iter().all(Option::is_some)
    }
}

/// The receiving side of one connection (channel, rank ← predecessor).
struct Inbox {
    fifo: Vec<u8>,
    /// Which step each slot holds, `None` when free.
    slot_step: [Option<u64>; STEPS as usize],
    tail: u64,
    header: Option<(u64, CallDesc)>,
    notify_tail: bool,
    head: u64,
    notify_head: bool,
}

struct Node<'t> {
    machine: Machine<Ring<'t, MAX_RANKS>>,
    pending: Option<Exec>,
    rank: u32,
    channel: u32,
    next: u32,
    prev: u32,
}

/// The core's seeded generator.
pub use ringcc_core::rng::Rng;

/// Buffer geometry of one rank: where input and output live in its memory.
#[derive(Clone, Copy, Debug)]
pub struct Layout {
    /// Bytes of the rank's memory.
    pub len: usize,
    /// Byte offset of the input.
    pub input: usize,
    /// Byte offset of the output.
    pub output: usize,
}

/// NCCL's buffer layout for a call, out of place (input then output) or in
/// place (ReduceScatter's output is block `rank` of its input, AllGather's
/// input is block `rank` of its output).
pub fn layout(plan: &Plan, rank: u32, in_place: bool) -> Layout {
    let e = plan.dtype().size() as usize;
    let inb = plan.input_len() as usize * e;
    let outb = plan.output_len() as usize * e;
    if !in_place {
        return Layout {
            len: inb + outb,
            input: 0,
            output: inb,
        };
    }
    let call = Call::new(plan.collective(), plan.count(), plan.dtype(), ReduceOp::Sum);
    let (i, o) = call.in_place_offsets(rank);
    Layout {
        len: inb.max(outb),
        input: i as usize * e,
        output: o as usize * e,
    }
}

/// Runs one collective. `calls[r]` is rank `r`'s call (all equal for a
/// correct program); `inputs[r]` its input bytes. Panics only on executor
/// misuse or on a flow-control violation (the property under test).
pub fn run(cfg: &Config, calls: &[Call], inputs: &[Vec<u8>]) -> Report {
    let topo = Topology::<MAX_RANKS>::uniform(cfg.nodes, cfg.gpus_per_node, cfg.nics_per_node)
        .expect("topology")
        .with_cross_nic(cfg.cross_nic);
    run_on(&topo, cfg, calls, inputs)
}

/// Like [`run`] on a given topology.
pub fn run_on(
    topo: &Topology<MAX_RANKS>,
    cfg: &Config,
    calls: &[Call],
    inputs: &[Vec<u8>],
) -> Report {
    let n = topo.ranks();
    assert_eq!(calls.len(), n as usize);
    assert_eq!(inputs.len(), n as usize);
    let plans: Vec<Plan> = calls
        .iter()
        .map(|c| {
            Plan::new(
                c.collective,
                c.count,
                c.dtype,
                n,
                cfg.channels,
                cfg.chunk_bytes,
            )
            .expect("plan")
        })
        .collect();
    let layouts: Vec<Layout> = (0..n)
        .map(|r| layout(&plans[r as usize], r, cfg.in_place))
        .collect();
    let mut mem: Vec<Vec<u8>> = (0..n as usize)
        .map(|r| {
            let l = layouts[r];
            let mut m = vec![0xEEu8; l.len];
            assert_eq!(
                inputs[r].len(),
                plans[r].input_len() as usize * calls[r].dtype.size() as usize
            );
            m[l.input..l.input + inputs[r].len()].copy_from_slice(&inputs[r]);
            m
        })
        .collect();
    let fifo_bytes = cfg.geometry.fifo_bytes() as usize;
    let idx = |c: u32, r: u32| (c * n + r) as usize;
    let mut inbox: Vec<Inbox> = (0..cfg.channels * n)
        .map(|_| Inbox {
            fifo: vec![0u8; fifo_bytes],
            slot_step: [None; STEPS as usize],
            tail: 0,
            header: None,
            notify_tail: false,
            head: 0,
            notify_head: false,
        })
        .collect();
    let mut nodes: Vec<Node<'_>> = Vec::new();
    for c in 0..cfg.channels {
        let ring = topo.ring(ChannelId(c as u8)).expect("ring");
        for r in 0..n {
            let call = calls[r as usize];
            let desc = call.desc(0);
            let steps = plans[r as usize]
                .steps(ChannelId(c as u8), Rank(r), ring)
                .expect("steps");
            let machine =
                Machine::new(desc, steps, cfg.geometry, LinkState::default()).expect("machine");
            nodes.push(Node {
                machine,
                pending: None,
                rank: r,
                channel: c,
                next: ring.next(Rank(r)).expect("next").0,
                prev: ring.prev(Rank(r)).expect("prev").0,
            });
        }
    }
    let mut errors: Vec<Option<Error>> = vec![None; n as usize];
    let mut rng = Rng::new(cfg.seed);
    let mut events = 0u64;
    let mut execs = 0u64;
    let stalled;
    let mut idle = 0usize;
    // Event kinds: 0 = poll a machine, 1 = complete its exec, 2 = deliver
    // its tail notification, 3 = deliver its head notification. Pick a
    // random machine, then a random event it has; a full scan only when
    // many picks in a row found nothing (to tell a stall from bad luck).
    let mut kinds: Vec<u8> = Vec::with_capacity(4);
    let mut misses = 0usize;
    loop {
        let i = rng.below(nodes.len() as u64) as usize;
        kinds.clear();
        let node = &nodes[i];
        if node.machine.error().is_none() {
            let inb = &inbox[i];
            if node.pending.is_some() {
                kinds.push(1);
            } else if !node.machine.is_done() {
                kinds.push(0);
            }
            if inb.notify_tail {
                kinds.push(2);
            }
            if inb.notify_head {
                kinds.push(3);
            }
        }
        if kinds.is_empty() {
            misses += 1;
            if misses > 4 * nodes.len() {
                misses = 0;
                let any = nodes.iter().enumerate().any(|(j, nd)| {
                    nd.machine.error().is_none()
                        && (nd.pending.is_some()
                            || !nd.machine.is_done()
                            || inbox[j].notify_tail
                            || inbox[j].notify_head)
                });
                if !any {
                    stalled = false;
                    break;
                }
            }
            continue;
        }
        misses = 0;
        events += 1;
        if events > cfg.max_events {
            stalled = true;
            break;
        }
        let kind = kinds[rng.below(kinds.len() as u64) as usize];
        // The rank an error belongs to (a head goes to the predecessor).
        let mut who = nodes[i].rank as usize;
        let result: Result<bool, Error> = match kind {
            0 => {
                // Poll until the machine waits; a poll that yields nothing
                // while others can move is what makes the schedule random.
                let mut progressed = false;
                let mut r = Ok(false);
                loop {
                    match nodes[i].machine.poll_action() {
                        Ok(Some(Action::Exec(e))) => {
                            nodes[i].pending = Some(e);
                            progressed = true;
                            break;
                        }
                        Ok(Some(Action::ReturnCredit { head })) => {
                            let ib = &mut inbox[i];
                            assert!(head >= ib.head, "credit went backwards");
                            ib.head = head;
                            // The predecessor's outbox is this inbox.
                            ib.notify_head = true;
                            progressed = true;
                        }
                        Ok(Some(Action::Done)) => {
                            progressed = true;
                            break;
                        }
                        Ok(None) => break,
                        Err(e) => {
                            r = Err(e);
                            break;
                        }
                    }
                }
                r.map(|_| progressed)
            }
            1 => {
                let e = nodes[i].pending.take().expect("pending exec");
                execs += 1;
                let (c, r, next) = (nodes[i].channel, nodes[i].rank, nodes[i].next);
                carry_out(
                    &e,
                    &calls[r as usize],
                    n,
                    &layouts[r as usize],
                    &mut mem[r as usize],
                    &mut inbox,
                    i,
                    idx(c, next),
                    &cfg.geometry,
                );
                nodes[i].machine.handle_exec_done().map(|_| true)
            }
            2 => {
                let ib = &mut inbox[i];
                ib.notify_tail = false;
                let tail = ib.tail;
                let header = ib.header.take();
                let m = &mut nodes[i].machine;
                let hr = match header {
                    Some((step, desc)) => m.handle_header(step, desc),
                    None => Ok(()),
                };
                hr.and_then(|_| m.handle_tail(tail)).map(|_| true)
            }
            _ => {
                // inbox[i] belongs to node i; its head goes to node i's
                // predecessor on the same channel.
                let ib = &mut inbox[i];
                ib.notify_head = false;
                let head = ib.head;
                let (c, prev) = (nodes[i].channel, nodes[i].prev);
                who = prev as usize;
                let target = &mut nodes[idx(c, prev)];
                if target.machine.error().is_some() {
                    // A dead machine hears nothing; its own error stands.
                    Ok(true)
                } else {
                    target.machine.handle_head(head).map(|_| true)
                }
            }
        };
        match result {
            Ok(true) => idle = 0,
            Ok(false) => {
                // Polls that yield nothing: after enough of them in a row
                // with no delivery or completion possible, the ring is
                // stuck.
                idle += 1;
                if idle > 64 * nodes.len() && !progress_possible(&nodes, &inbox) {
                    stalled = true;
                    break;
                }
            }
            Err(e) => {
                errors[who].get_or_insert(e);
            }
        }
        // Machines that failed are dead; record their errors too.
        for nd in &nodes {
            if let Some(e) = nd.machine.error() {
                errors[nd.rank as usize].get_or_insert(e);
            }
        }
    }
    let outputs = (0..n as usize)
        .map(|r| {
            let all_done = nodes
                .iter()
                .filter(|nd| nd.rank as usize == r)
                .all(|nd| nd.machine.is_done());
            if !all_done || errors[r].is_some() {
                return None;
            }
            let l = layouts[r];
            let outb = plans[r].output_len() as usize * calls[r].dtype.size() as usize;
            Some(mem[r][l.output..l.output + outb].to_vec())
        })
        .collect();
    Report {
        outputs,
        errors,
        stalled,
        events,
        execs,
    }
}

/// Whether any exec completion or notification is pending (polls alone
/// cannot unblock a machine: only these events can).
fn progress_possible(nodes: &[Node<'_>], inbox: &[Inbox]) -> bool {
    nodes.iter().enumerate().any(|(j, nd)| {
        nd.machine.error().is_none()
            && (nd.pending.is_some() || inbox[j].notify_tail || inbox[j].notify_head)
    })
}

/// Carries out one exec of node `me` (whose inbox is `inbox[me]`), sending
/// into `inbox[succ]`.
#[allow(clippy::too_many_arguments)]
fn carry_out(
    e: &Exec,
    call: &Call,
    ranks: u32,
    layout: &Layout,
    mem: &mut [u8],
    inbox: &mut [Inbox],
    me: usize,
    succ: usize,
    geometry: &FifoGeometry,
) {
    let es = call.dtype.size() as usize;
    let bytes = e.count as usize * es;
    let p = e.primitive;
    let mut result = vec![0u8; bytes];
    let incoming = e.recv.map(|span| {
        let ib = &mut inbox[me];
        for k in 0..span.slots {
            let s = span.step + k;
            let slot = (s % STEPS) as usize;
            assert_eq!(
                ib.slot_step[slot],
                Some(s),
                "slot {slot} does not hold step {s}: lost or duplicated data"
            );
            ib.slot_step[slot] = None;
        }
        let off = span.byte_offset(geometry) as usize;
        ib.fifo[off..off + bytes].to_vec()
    });
    let local = if p.reads_input() {
        let off = layout.input + e.input_offset as usize * es;
        Some(mem[off..off + bytes].to_vec())
    } else {
        None
    };
    slice_result(
        p,
        call.dtype,
        call.op,
        ranks,
        incoming.as_deref(),
        local.as_deref(),
        &mut result,
    )
    .expect("slice result");
    if p.contains(Primitive::COPY) {
        let off = layout.output + e.output_offset as usize * es;
        mem[off..off + bytes].copy_from_slice(&result);
    }
    if let Some(span) = e.send {
        let ib = &mut inbox[succ];
        for k in 0..span.slots {
            let s = span.step + k;
            let slot = (s % STEPS) as usize;
            assert_eq!(
                ib.slot_step[slot], None,
                "slot {slot} overwritten before it was read (step {s})"
            );
            ib.slot_step[slot] = Some(s);
        }
        let off = span.byte_offset(geometry) as usize;
        assert!(off + bytes <= ib.fifo.len(), "slice larger than its slots");
        ib.fifo[off..off + bytes].copy_from_slice(&result);
        if let Some(h) = e.header {
            assert!(ib.header.is_none(), "header mailbox overwritten");
            ib.header = Some((span.step, h));
        }
        assert!(span.end() >= ib.tail, "tail went backwards");
        ib.tail = span.end();
        ib.notify_tail = true;
    }
}
