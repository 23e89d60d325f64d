//! An in-memory executor: runs a collective over `n` ranks' buffers through
//! the core's progress engine — one [`Engine`] per rank over all its
//! channels — with a seeded random interleaving of everything a transport
//! may reorder: which rank acts next, when each outstanding exec
//! completes, and when each event arrives. Events travel in order per
//! connection and direction and in any order across connections, channels
//! and ranks; consecutive counter updates may merge into the latest (what
//! a reader of shared memory sees) and a counter may be read twice.
//!
//! What it keeps of its own is only the transport: completions → events,
//! actions → memory work, and the random choice of what happens next. It
//! checks, independently of the engine, that no slot is overwritten before
//! it was read, that every slot read holds the step the reader expects,
//! that no counter goes backwards and, after a clean run, that every slot
//! sent was read.

use std::collections::VecDeque;

use ringcc_core::fifo::{FifoGeometry, STEPS};
use ringcc_core::prim::{slice_result, Action, Exec};
use ringcc_core::progress::Channel;
use ringcc_core::topology::{Ring, Topology};
use ringcc_core::{ChannelId, Engine, EngineError, Event, Plan, Primitive, Rank, ReduceOp, Stall};

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
    /// Per rank: its output buffer if its engine finished the call.
    pub outputs: Vec<Option<Vec<u8>>>,
    /// Per rank: the error its engine failed with.
    pub errors: Vec<Option<EngineError>>,
    /// Nothing could progress while some rank had neither finished nor
    /// failed (or the event bound was reached).
    pub stalled: bool,
    /// Per rank that neither finished nor failed: what it waits for.
    pub stalls: Vec<Option<Stall>>,
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

type RankEngine<'t> = Engine<Ring<'t, MAX_RANKS>, Box<[Channel<Ring<'t, MAX_RANKS>>]>>;

/// One connection (channel, rank ← predecessor): the receiver's FIFO
/// memory, what both sides posted, and the events on their way.
struct Conn {
    fifo: Vec<u8>,
    /// Which step each slot holds, `None` when free.
    slot_step: [Option<u64>; STEPS as usize],
    /// The sender's latest `tail`.
    tail: u64,
    /// The receiver's latest `head`.
    head: u64,
    /// To the receiver: headers and tails.
    data: VecDeque<Event>,
    /// To the sender: heads.
    credit: VecDeque<Event>,
    /// The sender's exec whose completion is not yet reported.
    pending: Option<Exec>,
}

/// What may happen next. Connection `k = channel * n + rank` is the one
/// into `rank` on `channel`.
#[derive(Clone, Copy)]
enum Work {
    /// Take one action from rank `r`'s engine.
    Poll(usize),
    /// Complete the exec outstanding on rank `k % n`, channel `k / n`
    /// (kept with the connection into that rank).
    Complete(usize),
    /// Deliver connection `k`'s next data event to its receiver.
    Data(usize),
    /// Deliver connection `k`'s next credit event to its sender.
    Credit(usize),
}

/// The work that may happen next, with uniform random picks.
struct Ready {
    n: usize,
    items: Vec<usize>,
    /// Where each work id is in `items`.
    pos: Vec<Option<usize>>,
}

impl Ready {
    fn new(n: usize, conns: usize) -> Ready {
        Ready {
            n,
            items: Vec::new(),
            pos: vec![None; n + 3 * conns],
        }
    }

    fn id(&self, w: Work) -> usize {
        match w {
            Work::Poll(r) => r,
            Work::Complete(k) => self.n + 3 * k,
            Work::Data(k) => self.n + 3 * k + 1,
            Work::Credit(k) => self.n + 3 * k + 2,
        }
    }

    fn work(&self, id: usize) -> Work {
        if id < self.n {
            return Work::Poll(id);
        }
        let k = (id - self.n) / 3;
        match (id - self.n) % 3 {
            0 => Work::Complete(k),
            1 => Work::Data(k),
            _ => Work::Credit(k),
        }
    }

    fn insert(&mut self, w: Work) {
        let id = self.id(w);
        if self.pos[id].is_none() {
            self.pos[id] = Some(self.items.len());
            self.items.push(id);
        }
    }

    fn remove(&mut self, w: Work) {
        let id = self.id(w);
        if let Some(p) = self.pos[id].take() {
            self.items.swap_remove(p);
            if let Some(&moved) = self.items.get(p) {
                self.pos[moved] = Some(p);
            }
        }
    }

    fn pick(&self, rng: &mut Rng) -> Option<Work> {
        if self.items.is_empty() {
            return None;
        }
        Some(self.work(self.items[rng.below(self.items.len() as u64) as usize]))
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
    let n = topo.ranks() as usize;
    assert_eq!(calls.len(), n);
    assert_eq!(inputs.len(), n);
    let plans: Vec<Plan> = calls
        .iter()
        .map(|c| {
            c.plan(n as u32, cfg.channels, cfg.chunk_bytes)
                .expect("plan")
        })
        .collect();
    let layouts: Vec<Layout> = (0..n)
        .map(|r| layout(&plans[r], r as u32, cfg.in_place))
        .collect();
    let mut mem: Vec<Vec<u8>> = (0..n)
        .map(|r| {
            let l = layouts[r];
            let mut m = vec![0xEEu8; l.len];
            assert_eq!(
                inputs[r].len(),
                plans[r].input_len() as usize * calls[r].elem()
            );
            m[l.input..l.input + inputs[r].len()].copy_from_slice(&inputs[r]);
            m
        })
        .collect();
    let channels = cfg.channels as usize;
    let ring = |c: ChannelId| topo.ring(c).expect("ring");
    // Connection k = c * n + r: into rank r on channel c; next[k] and
    // prev[k]: the connections into r's successor and predecessor.
    let (mut next, mut prev) = (vec![0usize; channels * n], vec![0usize; channels * n]);
    for c in 0..channels {
        let ring = ring(ChannelId(c as u8));
        for r in 0..n {
            next[c * n + r] = c * n + ring.next(Rank(r as u32)).expect("next").0 as usize;
            prev[c * n + r] = c * n + ring.prev(Rank(r as u32)).expect("prev").0 as usize;
        }
    }
    let fifo_bytes = cfg.geometry.fifo_bytes() as usize;
    let mut conns: Vec<Conn> = (0..channels * n)
        .map(|_| Conn {
            fifo: vec![0u8; fifo_bytes],
            slot_step: [None; STEPS as usize],
            tail: 0,
            head: 0,
            data: VecDeque::new(),
            credit: VecDeque::new(),
            pending: None,
        })
        .collect();
    let mut ready = Ready::new(n, conns.len());
    let mut engines: Vec<RankEngine<'_>> = (0..n)
        .map(|r| {
            let storage = (0..channels).map(|_| Channel::new()).collect();
            Engine::new(Rank(r as u32), storage, u64::MAX)
        })
        .collect();
    for (r, e) in engines.iter_mut().enumerate() {
        // A failure here poisons the engine: it stays in the report.
        if e.start(0, &calls[r], &plans[r], cfg.geometry, ring).is_ok() {
            ready.insert(Work::Poll(r));
        }
    }
    let mut rng = Rng::new(cfg.seed);
    let (mut events, mut execs) = (0u64, 0u64);
    let mut stalled = false;
    while let Some(work) = ready.pick(&mut rng) {
        // A failed rank does nothing more and hears nothing.
        let owner = match work {
            Work::Poll(r) => r,
            Work::Complete(k) | Work::Data(k) => k % n,
            Work::Credit(k) => prev[k] % n,
        };
        if engines[owner].failure().is_some() {
            ready.remove(work);
            continue;
        }
        events += 1;
        if events > cfg.max_events {
            stalled = true;
            break;
        }
        let now = events;
        // The channel and rank an event goes to.
        let (to, c, event) = match work {
            Work::Poll(r) => {
                match engines[r].poll() {
                    Ok(Some((c, action))) => {
                        let k = usize::from(c.0) * n + r;
                        match action {
                            Action::Exec(e) => {
                                assert!(conns[k].pending.is_none(), "two execs outstanding");
                                conns[k].pending = Some(e);
                                ready.insert(Work::Complete(k));
                            }
                            Action::ReturnCredit { head } => {
                                assert!(head >= conns[k].head, "credit went backwards");
                                conns[k].head = head;
                                conns[k].credit.push_back(Event::Head(head));
                                ready.insert(Work::Credit(k));
                            }
                            Action::Done => {}
                        }
                    }
                    // Waits for an event, or failed (the engine keeps why).
                    Ok(None) | Err(_) => ready.remove(work),
                }
                continue;
            }
            Work::Complete(k) => {
                ready.remove(work);
                let e = conns[k].pending.take().expect("pending exec");
                execs += 1;
                let r = k % n;
                carry_out(
                    &e,
                    &calls[r],
                    n as u32,
                    &layouts[r],
                    &mut mem[r],
                    &mut conns,
                    k,
                    next[k],
                    &cfg.geometry,
                );
                conns[next[k]].data.extend(e.successor_events());
                if !conns[next[k]].data.is_empty() {
                    ready.insert(Work::Data(next[k]));
                }
                (r, k / n, Event::ExecDone)
            }
            Work::Data(k) => {
                let event = take(&mut conns[k].data, &mut rng);
                if conns[k].data.is_empty() {
                    ready.remove(work);
                }
                (k % n, k / n, event)
            }
            Work::Credit(k) => {
                let event = take(&mut conns[k].credit, &mut rng);
                if conns[k].credit.is_empty() {
                    ready.remove(work);
                }
                (prev[k] % n, k / n, event)
            }
        };
        if engines[to].handle(now, ChannelId(c as u8), event).is_ok() {
            ready.insert(Work::Poll(to));
        }
    }
    let now = events;
    let open = |e: &RankEngine<'_>| !e.is_idle() && e.failure().is_none();
    stalled |= engines.iter().any(open);
    let errors: Vec<Option<EngineError>> = engines.iter().map(Engine::failure).collect();
    let stalls = engines
        .iter()
        .map(|e| open(e).then(|| e.stall(now)))
        .collect();
    if !stalled && errors.iter().all(Option::is_none) {
        for (k, conn) in conns.iter().enumerate() {
            assert!(
                conn.slot_step.iter().all(Option::is_none),
                "connection {k}: a slot sent was never read"
            );
        }
    }
    let outputs = (0..n)
        .map(|r| {
            if !engines[r].is_idle() || errors[r].is_some() {
                return None;
            }
            let l = layouts[r];
            let outb = plans[r].output_len() as usize * calls[r].elem();
            Some(mem[r][l.output..l.output + outb].to_vec())
        })
        .collect();
    Report {
        outputs,
        errors,
        stalled,
        stalls,
        events,
        execs,
    }
}

/// The next event of a connection's queue (not empty), as a transport may
/// present it: consecutive counter updates sometimes merged into the
/// latest, and a counter sometimes read twice (left in the queue). A
/// header is never merged, repeated or overtaken.
fn take(queue: &mut VecDeque<Event>, rng: &mut Rng) -> Event {
    let counter = |e: &Event| matches!(e, Event::Tail(_) | Event::Head(_));
    let mut event = queue.pop_front().expect("queued event");
    while counter(&event) && queue.front().is_some_and(counter) && rng.chance(0.5) {
        event = queue.pop_front().expect("queued event");
    }
    if counter(&event) && rng.chance(0.125) {
        queue.push_front(event);
    }
    event
}

/// Carries out one exec of the rank whose connection is `conns[me]`,
/// sending into `conns[succ]`.
#[allow(clippy::too_many_arguments)]
fn carry_out(
    e: &Exec,
    call: &Call,
    ranks: u32,
    layout: &Layout,
    mem: &mut [u8],
    conns: &mut [Conn],
    me: usize,
    succ: usize,
    geometry: &FifoGeometry,
) {
    let es = call.elem();
    let bytes = e.count as usize * es;
    let p = e.primitive;
    let mut result = vec![0u8; bytes];
    let incoming = e.recv.map(|span| {
        let conn = &mut conns[me];
        for k in 0..span.slots {
            let s = span.step + k;
            let slot = (s % STEPS) as usize;
            assert_eq!(
                conn.slot_step[slot],
                Some(s),
                "slot {slot} does not hold step {s}: lost or duplicated data"
            );
            conn.slot_step[slot] = None;
        }
        let off = span.byte_offset(geometry) as usize;
        conn.fifo[off..off + bytes].to_vec()
    });
    let local = p.reads_input().then(|| {
        let off = layout.input + e.input_offset as usize * es;
        mem[off..off + bytes].to_vec()
    });
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
        let conn = &mut conns[succ];
        for k in 0..span.slots {
            let s = span.step + k;
            let slot = (s % STEPS) as usize;
            assert_eq!(
                conn.slot_step[slot], None,
                "slot {slot} overwritten before it was read (step {s})"
            );
            conn.slot_step[slot] = Some(s);
        }
        let off = span.byte_offset(geometry) as usize;
        assert!(
            off + bytes <= conn.fifo.len(),
            "slice larger than its slots"
        );
        conn.fifo[off..off + bytes].copy_from_slice(&result);
        assert!(span.end() >= conn.tail, "tail went backwards");
        conn.tail = span.end();
    }
}
