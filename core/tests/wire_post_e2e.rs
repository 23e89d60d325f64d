//! End to end through every wire format: ranks on a ring run the core's
//! state machines; every SEND slice becomes work requests
//! ([`SliceWrites`]), every credit a [`credit_write`]; each request is
//! formatted as an mlx5 WQE and parsed back, cut into RoCEv2 packets,
//! framed, parsed (ICRC checked), PSN-checked by the responder, and only
//! then written into the receiver's registered memory — with key and
//! bounds checks like an RNIC's. Receivers learn their `tail` from the
//! immediates and their call header from the mailbox. The test checks
//! that every slice arrives intact in the right slot, that every machine
//! finishes, and that nothing ever writes outside a region.

use std::collections::{HashMap, VecDeque};

use proptest::prelude::*;
use ringcc_core::fifo::FifoGeometry;
use ringcc_core::prim::Machine;
use ringcc_core::protocol::post::{
    credit_write, decode_credit, tail_from_completion, widen_step, LocalBuf, RemoteCounter,
    RemoteFifo, RemoteHeader, SliceWrites,
};
use ringcc_core::wire::mlx5::{Wqe, WqeRepr};
use ringcc_core::wire::roce::{EthernetRepr, ImmDtRepr, Ipv4Repr, Opcode, RocePacketRepr, UdpRepr};
use ringcc_core::wire::segment::{PathMtu, PsnChecker, PsnVerdict, Segmenter};
use ringcc_core::wire::{
    CallHeader, CallHeaderRepr, Completion, Lkey, Payload, Psn, Qpn, Rkey, WcOpcode, WcStatus,
    WorkRequest, WrOpcode,
};
use ringcc_core::{
    Action, CallDesc, ChannelId, Collective, DataType, InOrderRing, Plan, Rank, ReduceOp,
};

const FIFO: u64 = 1;
const MAILBOX: u64 = 2;
const COUNTER: u64 = 3;
const STAGING: u64 = 4;

fn base(rank: u32, kind: u64) -> u64 {
    (u64::from(rank) + 1) << 40 | kind << 32
}

fn key(rank: u32, kind: u64) -> u32 {
    rank * 16 + kind as u32
}

/// Registered memory of all ranks, addressed like an RNIC would.
struct Memory {
    regions: HashMap<u32, (u32, u64, Vec<u8>)>, // key -> (owner, base, bytes)
}

impl Memory {
    fn region(&mut self, k: u32, addr: u64, len: usize) -> (u32, &mut [u8]) {
        let (owner, base, bytes) = self.regions.get_mut(&k).expect("unknown key");
        let off = addr.checked_sub(*base).expect("address below region") as usize;
        assert!(off + len <= bytes.len(), "write past the region");
        (*owner, &mut bytes[off..off + len])
    }
}

enum Event {
    Imm { rank: u32, imm: u32 },
    Credit { rank: u32 },
}

struct RankState {
    machine: Machine<InOrderRing>,
    call: usize,
    last_tail: u64,
    header_seq: Option<u64>,
    wqe_index: u16,
}

struct World {
    n: u32,
    calls: Vec<CallDesc>,
    plans: Vec<Plan>,
    g: FifoGeometry,
    mem: Memory,
    ranks: Vec<RankState>,
    /// Per queue pair (sender, target): the requester's next PSN and the
    /// responder's checker.
    qps: HashMap<(u32, u32), (Psn, PsnChecker)>,
    events: VecDeque<Event>,
    sent: HashMap<(u32, u64), Vec<u8>>,
    slices: u64,
}

impl World {
    fn new(n: u32, calls: Vec<CallDesc>, chunk: u64, g: FifoGeometry) -> World {
        let plans: Vec<Plan> = calls
            .iter()
            .map(|c| Plan::new(c.collective, c.count, c.dtype, n, 1, chunk).unwrap())
            .collect();
        let mut regions = HashMap::new();
        for r in 0..n {
            let sizes = [
                (FIFO, g.fifo_bytes() as usize),
                (MAILBOX, 32),
                (COUNTER, 8),
                (STAGING, g.slice_bytes() as usize),
            ];
            for (kind, size) in sizes {
                regions.insert(key(r, kind), (r, base(r, kind), vec![0u8; size]));
            }
        }
        let ranks = (0..n)
            .map(|r| RankState {
                machine: Self::machine(&plans[0], calls[0], r, n, g, Default::default()),
                call: 0,
                last_tail: 0,
                header_seq: None,
                wqe_index: 0,
            })
            .collect();
        let mut qps = HashMap::new();
        for r in 0..n {
            for t in [(r + 1) % n, (r + n - 1) % n] {
                // Start near the top so that PSNs wrap.
                let first = Psn::new(0xff_ff00 + 16 * r + t);
                qps.insert((r, t), (first, PsnChecker::new(first)));
            }
        }
        World {
            n,
            calls,
            plans,
            g,
            mem: Memory { regions },
            ranks,
            qps,
            events: VecDeque::new(),
            sent: HashMap::new(),
            slices: 0,
        }
    }

    fn machine(
        plan: &Plan,
        call: CallDesc,
        r: u32,
        n: u32,
        g: FifoGeometry,
        link: ringcc_core::LinkState,
    ) -> Machine<InOrderRing> {
        let steps = plan
            .steps(ChannelId(0), Rank(r), InOrderRing { ranks: n })
            .unwrap();
        Machine::new(call, steps, g, link).unwrap()
    }

    /// Posts `wr` on rank `r`'s send queue: WQE round trip, packets,
    /// frames, responder, memory.
    fn post(&mut self, r: u32, wr: WorkRequest<1>) {
        let st = &mut self.ranks[r as usize];
        let wqe = WqeRepr::from_request(&wr, Qpn::new(r), st.wqe_index).unwrap();
        let mut sq = vec![0u8; wqe.buffer_len().unwrap()];
        wqe.emit(&mut sq).unwrap();
        st.wqe_index = st.wqe_index.wrapping_add((sq.len() / 64) as u16);
        let parsed = WqeRepr::<1>::parse(&Wqe::new_checked(&sq[..]).unwrap()).unwrap();
        let wr = parsed.to_request(wr.wr_id).unwrap();

        let data: Vec<u8> = match &wr.payload {
            Payload::Inline(d) => d.to_vec(),
            Payload::Gather(sgl) => sgl
                .iter()
                .flat_map(|s| {
                    let (owner, b) = self.mem.region(s.lkey.get(), s.addr, s.length as usize);
                    assert_eq!(owner, r, "lkey of another rank");
                    b.to_vec()
                })
                .collect(),
        };
        let remote = wr.remote.unwrap();
        let imm = (wr.opcode == WrOpcode::RdmaWriteWithImm).then_some(wr.imm);
        let target = self.mem.regions[&remote.rkey.get()].0;
        let qp = self.qps.get_mut(&(r, target)).expect("no queue pair");
        let seg = Segmenter::write(remote, data.len() as u32, PathMtu::Mtu256, qp.0, imm).unwrap();
        qp.0 = seg.next_psn();
        let mut va = 0;
        for d in seg {
            let payload = &data[d.offset as usize..(d.offset + d.len) as usize];
            let frame_repr = RocePacketRepr {
                eth: EthernetRepr::default(),
                ip: Ipv4Repr {
                    src: [10, 0, 0, r as u8],
                    dst: [10, 0, 0, target as u8],
                    ttl: 64,
                    dont_frag: true,
                    ..Default::default()
                },
                udp: UdpRepr {
                    src_port: 0xc000 | r as u16,
                    ..Default::default()
                },
                bth: d.bth(Qpn::new(target), 0xffff),
                reth: d.reth,
                aeth: None,
                imm: d.imm.map(|imm| ImmDtRepr { imm }),
                payload,
            }
            .normalize();
            let mut frame = vec![0u8; frame_repr.buffer_len()];
            frame_repr.emit(&mut frame).unwrap();
            // The responder's side.
            let p = RocePacketRepr::parse(&frame).unwrap();
            let responder = &mut self.qps.get_mut(&(r, target)).unwrap().1;
            assert_eq!(responder.receive(p.bth.psn), PsnVerdict::Accept);
            let rkey = match p.reth {
                Some(reth) => {
                    va = reth.va;
                    reth.rkey
                }
                None => remote.rkey,
            };
            let (owner, dst) = self.mem.region(rkey.get(), va, p.payload.len());
            assert_eq!(owner, target);
            dst.copy_from_slice(p.payload);
            va += p.payload.len() as u64;
            if let Some(ImmDtRepr { imm }) = p.imm {
                assert_eq!(
                    p.bth.opcode,
                    if d.reth.is_some() {
                        Opcode::WriteOnlyWithImm
                    } else {
                        Opcode::WriteLastWithImm
                    }
                );
                // A credit's immediate lands on the sender's own queue
                // pair (a wake-up: the counter holds the value); a
                // slice's is the receiver's new tail.
                if rkey_kind(remote.rkey) == COUNTER {
                    assert_eq!(imm, decode_credit(dst.try_into().unwrap()) as u32);
                } else {
                    self.events.push_back(Event::Imm { rank: target, imm });
                }
            }
        }
        if rkey_kind(remote.rkey) == COUNTER {
            self.events.push_back(Event::Credit { rank: target });
        }
    }

    fn deliver(&mut self, e: Event) {
        match e {
            Event::Imm { rank, imm } => {
                let mailbox = self.mem.regions[&key(rank, MAILBOX)].2.clone();
                let st = &mut self.ranks[rank as usize];
                if let Ok(h) =
                    CallHeaderRepr::parse(&CallHeader::new_checked(&mailbox[..]).unwrap())
                {
                    if st.header_seq != Some(h.desc.seq) {
                        st.header_seq = Some(h.desc.seq);
                        let step = widen_step(h.step, st.last_tail);
                        st.machine.handle_header(step, h.desc).unwrap();
                    }
                }
                let c = Completion {
                    wr_id: 0,
                    status: WcStatus::Success,
                    opcode: WcOpcode::RecvRdmaWithImm,
                    byte_len: 0,
                    imm: Some(imm),
                    qp_num: rank,
                };
                let tail = tail_from_completion(&c, st.last_tail).unwrap();
                st.last_tail = tail;
                st.machine.handle_tail(tail).unwrap();
            }
            Event::Credit { rank } => {
                let word = self.mem.regions[&key(rank, COUNTER)].2.clone();
                let head = decode_credit(word.try_into().unwrap());
                self.ranks[rank as usize].machine.handle_head(head).unwrap();
            }
        }
    }

    fn run(&mut self) {
        let n = self.n;
        let mut idle = 0;
        while idle < 3 {
            let mut progress = false;
            while let Some(e) = self.events.pop_front() {
                self.deliver(e);
                progress = true;
            }
            for r in 0..n {
                while let Some(a) = self.ranks[r as usize].machine.poll_action().unwrap() {
                    progress = true;
                    match a {
                        Action::Exec(e) => {
                            let dtype = self.calls[self.ranks[r as usize].call].dtype;
                            let len = (e.count * u64::from(dtype.size())) as usize;
                            if let Some(span) = e.recv {
                                let off = span.byte_offset(&self.g);
                                let fifo = &self.mem.regions[&key(r, FIFO)].2;
                                let want = self.sent.remove(&(r, span.step)).expect("nothing sent");
                                assert_eq!(
                                    &fifo[off as usize..off as usize + len],
                                    &want[..],
                                    "slot of step {}",
                                    span.step
                                );
                            }
                            if let Some(span) = e.send {
                                let succ = (r + 1) % n;
                                let step = span.step;
                                let bytes: Vec<u8> = (0..len)
                                    .map(|i| (i as u64 * 31 + step * 7 + u64::from(r)) as u8)
                                    .collect();
                                self.mem.regions.get_mut(&key(r, STAGING)).unwrap().2[..len]
                                    .copy_from_slice(&bytes);
                                self.sent.insert((succ, step), bytes);
                                let fifo = RemoteFifo {
                                    addr: base(succ, FIFO),
                                    rkey: Rkey(key(succ, FIFO)),
                                    capacity: self.g.fifo_bytes(),
                                };
                                let mailbox = RemoteHeader {
                                    addr: base(succ, MAILBOX),
                                    rkey: Rkey(key(succ, MAILBOX)),
                                    capacity: 32,
                                };
                                let local = LocalBuf {
                                    addr: base(r, STAGING),
                                    lkey: Lkey(key(r, STAGING)),
                                };
                                let wrs = SliceWrites::<1>::new(
                                    &e,
                                    &self.g,
                                    dtype,
                                    local,
                                    &fifo,
                                    &mailbox,
                                    self.slices,
                                )
                                .unwrap();
                                self.slices += 1;
                                for wr in wrs.with_max_write(300).unwrap() {
                                    self.post(r, wr);
                                }
                            }
                            self.ranks[r as usize].machine.handle_exec_done().unwrap();
                        }
                        Action::ReturnCredit { head } => {
                            let pred = (r + n - 1) % n;
                            let c = RemoteCounter {
                                addr: base(pred, COUNTER),
                                rkey: Rkey(key(pred, COUNTER)),
                            };
                            self.post(r, credit_write(head, &c, 0).unwrap());
                        }
                        Action::Done => {
                            let st = &mut self.ranks[r as usize];
                            if st.call + 1 < self.calls.len() {
                                st.call += 1;
                                let link = st.machine.link();
                                st.machine = Self::machine(
                                    &self.plans[st.call],
                                    self.calls[st.call],
                                    r,
                                    n,
                                    self.g,
                                    link,
                                );
                            }
                        }
                    }
                }
            }
            idle = if progress { 0 } else { idle + 1 };
        }
        for (r, st) in self.ranks.iter().enumerate() {
            assert!(
                st.machine.is_done() && st.call + 1 == self.calls.len(),
                "rank {r} stalled"
            );
        }
        assert!(self.sent.is_empty(), "slices never consumed");
    }
}

fn rkey_kind(k: Rkey) -> u64 {
    u64::from(k.get() % 16)
}

fn case() -> impl Strategy<Value = (u32, Vec<CallDesc>, u64, FifoGeometry)> {
    (
        2..=4u32,
        prop::sample::select(DataType::ALL.to_vec()),
        (0..600u64, 0..600u64),
        (1..=8u64, 1..=8u64, prop::sample::select(vec![1u64, 2, 4])),
        (0..5u8, 0..4u32),
    )
        .prop_map(
            |(n, dtype, (c0, c1), (chunk_units, slot_units, sps), (k, root))| {
                let second = Collective::from_code(k, Rank(root % n)).unwrap();
                let calls = vec![
                    CallDesc::new(0, Collective::AllReduce, c0, dtype, ReduceOp::Sum),
                    CallDesc::new(1, second, c1, dtype, ReduceOp::Max),
                ];
                // A chunk of at most half the FIFO, as NCCL's (4 of 8
                // slots): a chunk that fills the whole FIFO deadlocks the
                // ring, every rank waiting for credit from its successor.
                let g = FifoGeometry::new(slot_units * 16, sps).unwrap();
                let chunk = (chunk_units * 16).min(4 * g.slot_bytes());
                (n, calls, chunk, g)
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, .. ProptestConfig::default() })]

    #[test]
    fn slices_travel_intact_through_every_format((n, calls, chunk, g) in case()) {
        let mut w = World::new(n, calls, chunk, g);
        w.run();
    }
}

#[test]
fn nccl_geometry_two_ranks() {
    let calls = vec![CallDesc::new(
        7,
        Collective::AllReduce,
        100_000,
        DataType::F32,
        ReduceOp::Sum,
    )];
    let g = FifoGeometry::new(4096, 2).unwrap();
    let mut w = World::new(2, calls, 8192, g);
    w.run();
    assert!(w.slices > 10);
}
