//! Ranks as real threads, connected by the core's shared-memory FIFOs
//! ([`ShmFifo`]: atomics, release on post, acquire on wait). Each rank is
//! one [`Engine`] over all its channels, driven by the core's firmware
//! [`BlockingDriver`] with bounded waits: the same engine as every
//! backend; here the concurrency is real. What this file keeps is the
//! transport only: an exec's memory and FIFO work, credit posts, and the
//! counters it reads back as events.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use embedded_hal::delay::DelayNs;
use ringcc_core::driver::{BlockingDriver, DriverError, Transport};
use ringcc_core::fifo::{FifoGeometry, ShmFifo};
use ringcc_core::prim::{slice_result, Action, Exec};
use ringcc_core::progress::Channel;
use ringcc_core::topology::Topology;
use ringcc_core::wire::call_header::{CallHeader, CallHeaderRepr, CALL_HEADER_LEN};
use ringcc_core::{ChannelId, Engine, Event, Primitive, Rank};

use crate::exec::{layout, Call, Layout, MAX_RANKS};

/// Words per slot: slots of 64 bytes.
pub const WORDS: usize = 8;
/// The geometry the threads use: 64-byte slots, one slot per slice.
pub fn geometry() -> FifoGeometry {
    FifoGeometry::new((WORDS * 8) as u64, 1).unwrap()
}

const NO_HEADER: u64 = u64::MAX;

/// One connection in shared memory: the receiver's FIFO and a call-header
/// mailbox, published by the sender's `tail` store.
pub struct Conn {
    fifo: ShmFifo<WORDS>,
    header: [AtomicU64; CALL_HEADER_LEN / 8],
    header_step: AtomicU64,
}

impl Conn {
    fn new() -> Self {
        Conn {
            fifo: ShmFifo::new(),
            header: std::array::from_fn(|_| AtomicU64::new(0)),
            header_step: AtomicU64::new(NO_HEADER),
        }
    }

    fn read_span(&self, step: u64, slots: u64, bytes: usize) -> Result<Vec<u8>, ShmError> {
        let mut out = Vec::with_capacity(bytes);
        let mut words = [0u64; WORDS];
        for k in 0..slots {
            let n = self
                .fifo
                .read_slot(step + k, &mut words)
                .map_err(ShmError::Slot)?;
            for w in &words[..n] {
                out.extend_from_slice(&w.to_ne_bytes());
            }
        }
        out.truncate(bytes);
        Ok(out)
    }

    fn write_span(
        &self,
        step: u64,
        slots: u64,
        slot_bytes: usize,
        data: &[u8],
    ) -> Result<(), ShmError> {
        for k in 0..slots as usize {
            let lo = (k * slot_bytes).min(data.len());
            let hi = ((k + 1) * slot_bytes).min(data.len());
            let words = bytes_to_words(&data[lo..hi]);
            self.fifo
                .write_slot(step + k as u64, &words)
                .map_err(ShmError::Slot)?;
        }
        Ok(())
    }
}

/// A `DelayNs` that really sleeps: the driver's clock counts the sleeps it
/// asked for, so its deadline is at least that much wall time.
pub struct Sleep;

impl DelayNs for Sleep {
    fn delay_ns(&mut self, ns: u32) {
        std::thread::sleep(Duration::from_nanos(u64::from(ns)));
    }
}

/// One channel of a rank: the connection into it (from its predecessor)
/// and the one out of it (into its successor), and what was seen of them.
struct Link<'a> {
    inbox: &'a Conn,
    outbox: &'a Conn,
    tail_seen: u64,
    head_seen: u64,
    header_seen: u64,
}

/// One rank over all its channels.
struct RankTransport<'a> {
    links: Vec<Link<'a>>,
    call: Call,
    ranks: u32,
    layout: Layout,
    mem: &'a mut [u8],
    geometry: FifoGeometry,
    /// Channels whose exec completed, in order, not yet reported.
    done: VecDeque<ChannelId>,
    /// The channel `poll` looks at first (round robin).
    cursor: usize,
}

/// What a transport can fail with.
#[derive(Debug)]
pub enum ShmError {
    /// A slot access failed.
    Slot(ringcc_core::fifo::TryError),
}

fn bytes_to_words(b: &[u8]) -> Vec<u64> {
    b.chunks(8)
        .map(|c| {
            let mut w = [0u8; 8];
            w[..c.len()].copy_from_slice(c);
            u64::from_ne_bytes(w)
        })
        .collect()
}

impl RankTransport<'_> {
    fn exec(&mut self, c: usize, e: &Exec) -> Result<(), ShmError> {
        let (inbox, outbox) = (self.links[c].inbox, self.links[c].outbox);
        let es = self.call.dtype.size() as usize;
        let bytes = e.count as usize * es;
        let p = e.primitive;
        let incoming = match e.recv {
            Some(span) => Some(inbox.read_span(span.step, span.slots, bytes)?),
            None => None,
        };
        let local = p.reads_input().then(|| {
            let off = self.layout.input + e.input_offset as usize * es;
            self.mem[off..off + bytes].to_vec()
        });
        let mut result = vec![0u8; bytes];
        slice_result(
            p,
            self.call.dtype,
            self.call.op,
            self.ranks,
            incoming.as_deref(),
            local.as_deref(),
            &mut result,
        )
        .expect("slice result");
        if p.contains(Primitive::COPY) {
            let off = self.layout.output + e.output_offset as usize * es;
            self.mem[off..off + bytes].copy_from_slice(&result);
        }
        if let Some(span) = e.send {
            let slot_bytes = self.geometry.slot_bytes() as usize;
            outbox.write_span(span.step, span.slots, slot_bytes, &result)?;
            if let Some(desc) = e.header {
                let buf = CallHeaderRepr {
                    desc,
                    step: span.step as u32,
                }
                .to_bytes();
                for (w, v) in outbox.header.iter().zip(bytes_to_words(&buf)) {
                    w.store(v, Ordering::Relaxed);
                }
                outbox.header_step.store(span.step, Ordering::Relaxed);
            }
            // Release: data and header before the counter.
            outbox.fifo.tail().post(span.end());
        }
        Ok(())
    }
}

impl Link<'_> {
    /// What this channel's counters show that was not reported yet: the
    /// predecessor's header (once the `tail` covering it is visible), its
    /// `tail`, the successor's `head`.
    fn poll(&mut self) -> Option<Event> {
        let tail = self.inbox.fifo.tail().load();
        if tail > self.tail_seen {
            // The acquire above makes the header written before it visible.
            let hs = self.inbox.header_step.load(Ordering::Relaxed);
            if hs != NO_HEADER && hs != self.header_seen && hs < tail {
                self.header_seen = hs;
                let mut buf = Vec::with_capacity(CALL_HEADER_LEN);
                for w in &self.inbox.header {
                    buf.extend_from_slice(&w.load(Ordering::Relaxed).to_ne_bytes());
                }
                let repr = CallHeaderRepr::parse(&CallHeader::new_unchecked(&buf[..]))
                    .expect("call header");
                return Some(Event::Header {
                    step: hs,
                    desc: repr.desc,
                });
            }
            self.tail_seen = tail;
            return Some(Event::Tail(tail));
        }
        let head = self.outbox.fifo.head().load();
        if head > self.head_seen {
            self.head_seen = head;
            return Some(Event::Head(head));
        }
        None
    }
}

impl Transport for RankTransport<'_> {
    type Error = ShmError;

    fn execute(&mut self, channel: ChannelId, action: &Action) -> Result<(), ShmError> {
        let c = usize::from(channel.0);
        match action {
            Action::Exec(e) => {
                self.exec(c, e)?;
                self.done.push_back(channel);
            }
            Action::ReturnCredit { head } => self.links[c].inbox.fifo.head().post(*head),
            Action::Done => {}
        }
        Ok(())
    }

    fn poll(&mut self) -> Result<Option<(ChannelId, Event)>, ShmError> {
        if let Some(c) = self.done.pop_front() {
            return Ok(Some((c, Event::ExecDone)));
        }
        let n = self.links.len();
        for i in 0..n {
            let c = (self.cursor + i) % n;
            if let Some(event) = self.links[c].poll() {
                self.cursor = (c + 1) % n;
                return Ok(Some((ChannelId(c as u8), event)));
            }
        }
        Ok(None)
    }
}

/// Result of one rank's thread.
pub type RankResult = Result<Vec<u8>, DriverError<ShmError>>;

/// Runs one collective with a thread per rank on `nodes × gpus` ranks and
/// `channels` channels; `calls[r]`, `inputs[r]` as for the executor.
/// `absent` ranks never start (their peers must time out after `timeout`
/// of the driver's sleep).
pub fn run_threads(
    nodes: u32,
    gpus: u32,
    channels: u32,
    calls: &[Call],
    inputs: &[Vec<u8>],
    timeout: Duration,
    absent: &[u32],
) -> Vec<Option<RankResult>> {
    let topo = Arc::new(Topology::<MAX_RANKS>::uniform(nodes, gpus, 1).unwrap());
    let n = topo.ranks();
    let conns: Arc<Vec<Conn>> = Arc::new((0..channels * n).map(|_| Conn::new()).collect());
    let geometry = geometry();
    let handles: Vec<_> = (0..n)
        .map(|r| {
            if absent.contains(&r) {
                return None;
            }
            let (topo, conns, call, input) = (
                topo.clone(),
                conns.clone(),
                calls[r as usize],
                inputs[r as usize].clone(),
            );
            Some(std::thread::spawn(move || -> RankResult {
                let plan = call.plan(n, channels, 64).unwrap();
                let lay = layout(&plan, r, false);
                let mut mem = vec![0u8; lay.len];
                mem[lay.input..lay.input + input.len()].copy_from_slice(&input);
                let ring = |c: ChannelId| topo.ring(c).unwrap();
                let storage = vec![Channel::new(); channels as usize].into_boxed_slice();
                let mut engine = Engine::new(Rank(r), storage, timeout.as_nanos() as u64);
                let mut driver = BlockingDriver::new(Sleep, 20_000);
                engine.start(driver.now(), &call, &plan, geometry, ring)?;
                let links = (0..channels)
                    .map(|c| {
                        let next = ring(ChannelId(c as u8)).next(Rank(r)).unwrap().0;
                        Link {
                            inbox: &conns[(c * n + r) as usize],
                            outbox: &conns[(c * n + next) as usize],
                            tail_seen: 0,
                            head_seen: 0,
                            header_seen: NO_HEADER,
                        }
                    })
                    .collect();
                let mut t = RankTransport {
                    links,
                    call,
                    ranks: n,
                    layout: lay,
                    mem: &mut mem,
                    geometry,
                    done: VecDeque::new(),
                    cursor: 0,
                };
                driver.run(&mut engine, &mut t)?;
                let out = plan.output_len() as usize * call.elem();
                Ok(mem[lay.output..lay.output + out].to_vec())
            }))
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.map(|h| h.join().expect("rank thread panicked")))
        .collect()
}
