//! The device loop with one rank per process: each rank's loop memory is
//! exported to its two ring neighbours, which write into it.
//!
//! Per channel a rank's memory holds the four 128-byte lines the loop
//! uses (the `tail` its predecessor posts, the predecessor's call words,
//! the `head` its successor posts, its own `recv_next`/`send_next`) — laid
//! out as the CUDA device loop lays them for the ranks of one process — and
//! its FIFO. A rank's channel table ([`RcChan`]) then points into three
//! memories: its own, its predecessor's (where it posts `head`) and its
//! successor's (where it writes slices, `tail` and call words).
//!
//! [`LoopPeers::connect`] does the exchange: export this rank's memory,
//! publish the handle in the job's store under `cuda-ipc-loop/<rank>`,
//! import both neighbours' and build the table. On the host fake device
//! the memories are memfds and the table holds host addresses, which is
//! what the host-C++ build of the loop kernel runs on; on a GPU the same
//! table holds the device addresses CUDA IPC maps.

use std::time::{Duration, Instant};

use ringcc_comm::store::abort::parse_notice;
use ringcc_comm::store::{Store, ABORT_KEY};
use ringcc_core::fifo::{FifoGeometry, STEPS};
use ringcc_core::Rank;

use ringcc_comm::transport::{HopEnd, Transport};

use super::abi::RcChan;
use super::proxy::{PlanShape, Proxy, Region, Staging};
use crate::error::{Error, Result};
use crate::ipc::memory::{ExportedMemory, ImportedMemory, IpcHandle};

/// Bytes of one 128-byte line.
const LINE: u64 = 128;
/// Per channel: tail, call words, head, state (as `gpu`'s word offsets).
const TAIL: u64 = 0;
const CALL: u64 = LINE;
const HEAD: u64 = 2 * LINE;
const STATE: u64 = 3 * LINE;
const CHANNEL_BYTES: u64 = 4 * LINE;

/// How long one look for a store key may block before the abort notice
/// is looked at.
const ABORT_POLL: Duration = Duration::from_millis(100);

/// Where a rank's loop memory keeps each channel's lines and FIFO.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegionLayout {
    channels: u8,
    slot_bytes: u64,
    fifo_stride: u64,
}

impl RegionLayout {
    /// The layout for `channels` channels of FIFOs of `geometry`.
    pub fn new(channels: u8, geometry: FifoGeometry) -> Result<RegionLayout> {
        if channels == 0 || u32::from(channels) > ringcc_core::topology::MAX_CHANNELS {
            return Err(Error::BadConfig {
                what: "channels must be in 1..=64",
            });
        }
        let fifo_stride = geometry
            .slot_bytes()
            .checked_mul(STEPS)
            .and_then(|b| b.checked_next_multiple_of(LINE))
            .ok_or(Error::BadConfig {
                what: "a FIFO beyond memory",
            })?;
        Ok(RegionLayout {
            channels,
            slot_bytes: geometry.slot_bytes(),
            fifo_stride,
        })
    }

    fn flags(&self, c: u8) -> u64 {
        u64::from(c) * CHANNEL_BYTES
    }

    fn fifo(&self, c: u8) -> u64 {
        u64::from(self.channels) * CHANNEL_BYTES + u64::from(c) * self.fifo_stride
    }

    /// Bytes of a rank's memory.
    pub fn total(&self) -> u64 {
        self.fifo(self.channels)
    }

    /// The channel table of a rank whose memory starts at `own`, its
    /// predecessor's at `prev` and its successor's at `next` (addresses as
    /// the loop sees them).
    pub fn table(&self, own: u64, prev: u64, next: u64) -> Vec<RcChan> {
        (0..self.channels)
            .map(|c| {
                let f = self.flags(c);
                RcChan {
                    recv_tail: own + f + TAIL,
                    recv_head: prev + f + HEAD,
                    send_head: own + f + HEAD,
                    send_tail: next + f + TAIL,
                    recv_call: own + f + CALL,
                    send_call: next + f + CALL,
                    state: own + f + STATE,
                    recv_fifo: own + self.fifo(c),
                    send_fifo: next + self.fifo(c),
                    slot_bytes: self.slot_bytes,
                }
            })
            .collect()
    }

    /// The byte offset of channel `c`'s `recv_next`/`send_next` words.
    pub fn state(&self, c: u8) -> u64 {
        self.flags(c) + STATE
    }

    /// The channel table of a rank whose memory starts at `own`, with
    /// each neighbour's memory either mapped (inside the node) or a
    /// staging [`Region`] its proxy serves (on
    /// another node). A staged successor's words all live in its region —
    /// the FIFO, `tail` and call words the loop writes and the `head` the
    /// proxy returns credit into —, and so do a staged predecessor's.
    pub fn table_with(&self, own: u64, prev: Neighbour, next: Neighbour) -> Vec<RcChan> {
        let (pb, nb) = (prev.base(), next.base());
        let mut t = self.table(own, pb, nb);
        for (c, ch) in (0..self.channels).zip(t.iter_mut()) {
            let f = self.flags(c);
            if let Neighbour::Staged { words, fifos } = prev {
                ch.recv_tail = words + f + TAIL;
                ch.recv_call = words + f + CALL;
                ch.recv_head = words + f + HEAD;
                ch.recv_fifo = fifos + self.fifo(c);
            }
            if let Neighbour::Staged { words, fifos } = next {
                ch.send_head = words + f + HEAD;
                ch.send_fifo = fifos + self.fifo(c);
            }
        }
        t
    }

    /// Channels of the layout.
    pub fn channels(&self) -> u8 {
        self.channels
    }

    /// Byte offset of channel `c`'s `tail` word.
    pub fn tail_offset(&self, c: u8) -> u64 {
        self.flags(c) + TAIL
    }

    /// Byte offset of channel `c`'s three call words.
    pub fn call_offset(&self, c: u8) -> u64 {
        self.flags(c) + CALL
    }

    /// Byte offset of channel `c`'s `head` word.
    pub fn head_offset(&self, c: u8) -> u64 {
        self.flags(c) + HEAD
    }

    /// Byte offset of channel `c`'s FIFO.
    pub fn fifo_offset(&self, c: u8) -> u64 {
        self.fifo(c)
    }

    /// Bytes of one channel's FIFO (`STEPS` slots).
    pub fn fifo_bytes(&self) -> u64 {
        self.slot_bytes * STEPS
    }
}

/// Where a rank's loop reaches a ring neighbour (addresses as the loop
/// sees them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Neighbour {
    /// The neighbour's own loop memory, mapped (CUDA IPC; or this rank's
    /// own memory in a ring of one).
    Mapped(u64),
    /// Staging that this rank's proxy serves (`Staging`): the words
    /// in host memory at `words`, the FIFOs laid out from `fifos` (the
    /// same region, or device memory a NIC registers).
    Staged {
        /// The words' region.
        words: u64,
        /// The FIFOs' region.
        fifos: u64,
    },
}

impl Neighbour {
    /// A neighbour staged at `staged` (words, FIFOs) where given, else
    /// the mapped memory at `mapped`, else (a ring of one) this rank's
    /// own at `own`.
    pub(crate) fn of(mapped: Option<u64>, staged: Option<(u64, u64)>, own: u64) -> Neighbour {
        match (staged, mapped) {
            (Some((words, fifos)), _) => Neighbour::Staged { words, fifos },
            (None, Some(m)) => Neighbour::Mapped(m),
            (None, None) => Neighbour::Mapped(own),
        }
    }

    fn base(self) -> u64 {
        match self {
            Neighbour::Mapped(b) | Neighbour::Staged { words: b, .. } => b,
        }
    }
}

/// This rank's exported loop memory and its neighbours', mapped (fake
/// device). See the module documentation.
#[derive(Debug)]
pub struct LoopPeers {
    layout: RegionLayout,
    // The proxy (and its staging regions) stops before the memories go.
    proxy: Option<Proxy>,
    own: ExportedMemory,
    prev: Option<ImportedMemory>,
    next: Option<ImportedMemory>,
    table: Vec<RcChan>,
}

/// How a job's ranks on several nodes reach each other's loops: the hops
/// inside a node over (fake) CUDA IPC, the hops between nodes staged
/// through host memory by each rank's [`Proxy`] over `transports`.
pub struct NodeNet {
    /// The job token (the transports' hellos).
    pub token: String,
    /// This rank's node (`RINGCC_NODE`, else the host name).
    pub node: String,
    /// The transports for hops between nodes, in preference order.
    pub transports: Vec<Box<dyn Transport>>,
    /// The chunk size of every call's plan (the proxy cuts slices from
    /// it).
    pub chunk_bytes: u64,
    /// Rank 0 prints the init banner (ranks, nodes, channels, how each
    /// hop travels), as `RINGCC_DEBUG=INFO` asks of the communicator.
    pub banner: bool,
    /// On the fake device: each staged hop's FIFOs in host memory of
    /// their own, apart from its counters — the layout GPUDirect RDMA
    /// gives a GPU rank (its FIFOs in device memory), run without a GPU.
    /// A GPU rank decides for itself (see `GpuRank::init_on_nodes`).
    pub fifos_apart: bool,
}

impl std::fmt::Debug for NodeNet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeNet")
            .field("node", &self.node)
            .field(
                "transports",
                &self.transports.iter().map(|t| t.name()).collect::<Vec<_>>(),
            )
            .field("chunk_bytes", &self.chunk_bytes)
            .finish_non_exhaustive()
    }
}

fn key(rank: Rank) -> String {
    format!("cuda-ipc-loop/{}", rank.0)
}

/// `key`'s value, waiting until `deadline` (or the job's abort notice).
pub(crate) fn wait_key(
    store: &dyn Store,
    key: &str,
    deadline: Instant,
    what: &str,
) -> Result<Vec<u8>> {
    let comm = Error::comm;
    let t0 = Instant::now();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match store.get(key, left.min(ABORT_POLL)) {
            Ok(v) => return Ok(v),
            Err(ringcc_comm::Error::Timeout { .. }) if left <= ABORT_POLL => {
                return Err(Error::Timeout {
                    waiting_for: format!("{what} (store key {key:?})"),
                    after: t0.elapsed(),
                })
            }
            Err(ringcc_comm::Error::Timeout { .. }) => {}
            Err(e) => return Err(comm("Store::get")(e)),
        }
        if store.check(ABORT_KEY).map_err(comm("Store::check"))? {
            let notice = store
                .get(ABORT_KEY, ABORT_POLL)
                .map_err(comm("Store::get"))?;
            return Err(comm("the job's abort notice")(parse_notice(&notice)));
        }
    }
}

impl NodeNet {
    /// Connects `rank`'s ring hops that leave its node (every rank of the
    /// job calls this): the loop's ring is in rank order, so a node's
    /// ranks must be consecutive. Each staged direction gets [`Staging`]:
    /// its words in a region made by `region`, its FIFOs where `fifos`
    /// says for the transport that carries the hop — `Ok(region)` apart
    /// (device memory for GPUDirect RDMA), `Err(why)` in the words'
    /// region (why GPUDirect is not used, for the banner). Each channel's
    /// FIFO is lent to its end ([`FifoMemory`]): where a transport takes
    /// it (RDMA), the NIC reads and writes the loop's FIFOs itself and
    /// the proxy copies nothing.
    pub(crate) fn connect(
        mut self,
        store: &dyn Store,
        (rank, world): (Rank, u32),
        layout: RegionLayout,
        (geometry, staging): (FifoGeometry, &str),
        deadline: Instant,
        (region, fifos): (&dyn Fn() -> Result<Region>, &FifosAt<'_>),
    ) -> Result<NetLinks> {
        // Declared before the transports, so that they (and anything they
        // hold that was lent a region) drop first.
        let (mut out, mut inc): (Option<Staging>, Option<Staging>) = (None, None);
        let mut why_not = None;
        let mut transports = std::mem::take(&mut self.transports);
        let internal = |what: &str| {
            let what = what.to_owned();
            move |e: Error| ringcc_comm::Error::Internal(format!("{what}: {e}"))
        };
        let links = ringcc_comm::connect_between_nodes(
            store,
            &self.token,
            rank,
            world,
            &self.node,
            layout.channels(),
            geometry,
            deadline,
            &mut transports,
            &mut |hop, end, t| {
                let side = match end {
                    HopEnd::Send => &mut out,
                    HopEnd::Recv => &mut inc,
                };
                if side.is_none() {
                    let words = region().map_err(internal("a staging region"))?;
                    let apart = match fifos(t).map_err(internal("the FIFOs' memory"))? {
                        Ok(r) => Some(r),
                        Err(why) => {
                            why_not.get_or_insert(why);
                            None
                        }
                    };
                    *side = Some(Staging::new(words, apart));
                }
                side.as_ref()
                    .map(|s| s.fifo(&layout, hop.channel.0))
                    .transpose()
                    .map_err(internal("a staging FIFO"))
            },
        );
        let links = links.map_err(Error::comm("connect_between_nodes"))?;
        if links.order.ranks_in_order().iter().copied().ne(0..world) {
            return Err(Error::BadConfig {
                what: "the device loop's ring is in rank order: a node's ranks must be consecutive",
            });
        }
        let links = NetLinks {
            links,
            shape: PlanShape {
                ranks: world,
                channels: u32::from(layout.channels()),
                chunk_bytes: self.chunk_bytes,
                geometry,
            },
            layout,
            why_not,
            out: out.take(),
            inc: inc.take(),
        };
        if self.banner && rank == Rank(0) {
            eprintln!("{}", links.banner(staging));
        }
        Ok(links)
    }
}

/// Where a staged hop's FIFOs go, asked with the transport that carries
/// it: `Ok(region)` apart from the words (device memory a NIC registers:
/// GPUDirect RDMA), `Err(why)` with the words (why GPUDirect is not
/// used).
pub(crate) type FifosAt<'a> =
    dyn Fn(&dyn Transport) -> Result<std::result::Result<Region, String>> + 'a;

/// A rank's ring neighbours as its loop reaches them: each either mapped
/// (`prev` / `next`: memory of type `M`, `None` in a ring of one) or
/// staged through a region (`inc` / `out`: where the loop reaches it).
pub(crate) struct Sides<M> {
    pub(crate) prev: Option<M>,
    /// Where the loop reaches the staged side: its words, its FIFOs.
    pub(crate) inc: Option<(u64, u64)>,
    pub(crate) next: Option<M>,
    pub(crate) out: Option<(u64, u64)>,
}

/// A rank's hops between nodes, connected, with the staging regions lent
/// to them, before its proxy starts.
pub(crate) struct NetLinks {
    // Field order is drop order: the ends go before the regions they may
    // have been lent.
    links: ringcc_comm::NodeLinks,
    shape: PlanShape,
    layout: RegionLayout,
    /// Why the FIFOs are not in device memory (GPUDirect RDMA), where
    /// they are not.
    why_not: Option<String>,
    out: Option<Staging>,
    inc: Option<Staging>,
}

impl NetLinks {
    /// A rank's two neighbours: where `links` has a hop leave the node,
    /// its staging region; else the neighbour's memory, imported by
    /// `import` (of `prev` and `next`).
    pub(crate) fn sides<M>(
        links: Option<&NetLinks>,
        mut import: impl FnMut(Rank) -> Result<Option<M>>,
        (prev, next): (Rank, Rank),
    ) -> Result<Sides<M>> {
        type Side<M> = (Option<M>, Option<(u64, u64)>);
        let mut side = |staged: Option<&Staging>, peer: Rank| -> Result<Side<M>> {
            Ok(match staged {
                Some(s) => (None, Some(s.addrs())),
                None => (import(peer)?, None),
            })
        };
        let (prev, inc) = side(links.and_then(|l| l.inc.as_ref()), prev)?;
        let (next, out) = side(links.and_then(|l| l.out.as_ref()), next)?;
        Ok(Sides {
            prev,
            inc,
            next,
            out,
        })
    }

    /// The init banner: ranks, nodes, channels, and each hop of the ring
    /// with how it travels (`cuda-ipc` inside a node; between nodes this
    /// rank's transport, staged through `staging`).
    pub(crate) fn banner(&self, staging: &str) -> String {
        let peers = &self.links.peers;
        let mut nodes: Vec<&str> = peers.iter().map(|p| p.node.as_str()).collect();
        nodes.sort_unstable();
        nodes.dedup();
        let net = self.transport().unwrap_or("none");
        let lent = &self.links.lent;
        let all_lent = lent.send.iter().chain(&lent.recv).all(|&l| l);
        let how =
            if self.gpudirect() {
                format!(
                    "{net} between nodes with GPUDirect RDMA: the NIC reads and writes the loop's \
                 FIFOs in device memory (dma-buf), the counters staged through {staging} by each \
                 rank's proxy"
                )
            } else {
                let registered = if all_lent {
                    ", registered with the NIC (no copies)"
                } else {
                    ""
                };
                let apart = [&self.out, &self.inc]
                    .into_iter()
                    .flatten()
                    .any(Staging::fifos_apart);
                format!(
                "{net} between nodes staged through {staging}{registered}{} by each rank's proxy \
                 (GPUDirect RDMA: not used: {})",
                if apart { ", the FIFOs apart from the counters" } else { "" },
                self.why_not.as_deref().unwrap_or("the FIFOs are in host memory"),
            )
            };
        let mut s = format!(
            "ringcc INFO: {} ranks on {} node(s), {} channel(s), the device loop; CUDA IPC inside a \
             node, {how}\nringcc INFO: ring",
            peers.len(),
            nodes.len(),
            self.layout.channels(),
        );
        for (r, p) in peers.iter().enumerate() {
            let next = &peers[(r + 1) % peers.len()];
            let hop = if p.node == next.node { "cuda-ipc" } else { net };
            s.push_str(&format!(" {r}[{}] -{hop}->", p.node));
        }
        s.push_str(" 0");
        s
    }

    /// Whether every staged side keeps its FIFOs in device memory, taken
    /// by every end (GPUDirect RDMA).
    pub(crate) fn gpudirect(&self) -> bool {
        let lent = &self.links.lent;
        let sides: Vec<&Staging> = [&self.out, &self.inc].into_iter().flatten().collect();
        !sides.is_empty()
            && sides.iter().all(|s| s.fifos_on_device())
            && lent.send.iter().chain(&lent.recv).all(|&l| l)
    }

    /// The transport between the nodes, if a hop leaves this one.
    pub(crate) fn transport(&self) -> Option<&'static str> {
        self.links.transports.0.or(self.links.transports.1)
    }

    /// Starts `me`'s proxy over the staging regions; `None` when no hop
    /// leaves the node.
    pub(crate) fn start(self, me: Rank, abort_also: Option<usize>) -> Result<Option<Proxy>> {
        if self.out.is_none() && self.inc.is_none() {
            return Ok(None);
        }
        let prev = Rank((me.0 + self.shape.ranks - 1) % self.shape.ranks);
        let ringcc_comm::NodeLinks {
            send,
            recv,
            lent,
            bell,
            ..
        } = self.links;
        Proxy::start(
            me,
            prev,
            self.shape,
            self.layout,
            (self.out, send, lent.send),
            (self.inc, recv, lent.recv),
            bell,
            abort_also,
        )
        .map(Some)
    }
}

impl LoopPeers {
    /// Exports `rank`'s loop memory (zeroed fake device memory) for
    /// `channels` channels of `geometry`, publishes its handle in `store`,
    /// and imports both ring neighbours' (rank order), waiting until
    /// `deadline` for them.
    pub fn connect(
        store: &dyn Store,
        rank: Rank,
        world: u32,
        channels: u8,
        geometry: FifoGeometry,
        deadline: Instant,
    ) -> Result<LoopPeers> {
        Self::connect_nodes(store, rank, world, channels, geometry, deadline, None)
    }

    /// [`connect`](LoopPeers::connect) for a job on several nodes: the
    /// neighbours on this rank's node are imported as there, a neighbour
    /// on another node is reached through a staging region that this
    /// rank's [`Proxy`] serves over `net`'s transports (every rank of the
    /// job calls this with `net` given). The loop's ring is in rank order,
    /// so a node's ranks must be consecutive (as launchers number them).
    pub fn connect_nodes(
        store: &dyn Store,
        rank: Rank,
        world: u32,
        channels: u8,
        geometry: FifoGeometry,
        deadline: Instant,
        net: Option<NodeNet>,
    ) -> Result<LoopPeers> {
        if world == 0 || rank.0 >= world {
            return Err(Error::RankOutOfRange { rank, ranks: world });
        }
        let layout = RegionLayout::new(channels, geometry)?;
        let own = ExportedMemory::fake(layout.total(), "ringcc-cuda-loop")
            .map_err(Error::comm("export the loop memory"))?;
        let handle = serde_json::to_vec(&own.handle()).map_err(|_| Error::BadConfig {
            what: "an IPC handle that does not serialize",
        })?;
        store
            .set(&key(rank), &handle)
            .map_err(Error::comm("Store::set"))?;
        let import = |peer: Rank| -> Result<Option<ImportedMemory>> {
            if peer == rank {
                return Ok(None);
            }
            let what = format!("rank {}'s exported loop memory", peer.0);
            let bytes = wait_key(store, &key(peer), deadline, &what)?;
            let h: IpcHandle = serde_json::from_slice(&bytes).map_err(|_| Error::BadConfig {
                what: "a store key that holds no IPC handle",
            })?;
            ImportedMemory::open(&h, layout.total())
                .map(Some)
                .map_err(Error::comm("import a neighbour's loop memory"))
        };
        let (prev_rank, next_rank) = (
            Rank((rank.0 + world - 1) % world),
            Rank((rank.0 + 1) % world),
        );
        let apart = net.as_ref().is_some_and(|n| n.fifos_apart);
        let links = match net {
            Some(net) => Some(net.connect(
                store,
                (rank, world),
                layout,
                (geometry, "host memory"),
                deadline,
                (&|| Region::host(layout.total()), &|_| {
                    Ok(if apart {
                        Ok(Region::host(layout.total())?)
                    } else {
                        Err("the fake device has no device memory".into())
                    })
                }),
            )?),
            None => None,
        };
        let Sides {
            prev,
            inc,
            next,
            out,
        } = NetLinks::sides(links.as_ref(), import, (prev_rank, next_rank))?;
        let own_base = own.mapping().base().as_ptr() as u64;
        let base =
            |m: &Option<ImportedMemory>| m.as_ref().map(|m| m.mapping().base().as_ptr() as u64);
        let table = layout.table_with(
            own_base,
            Neighbour::of(base(&prev), inc, own_base),
            Neighbour::of(base(&next), out, own_base),
        );
        let proxy = match links {
            Some(l) => l.start(rank, None)?,
            None => None,
        };
        Ok(LoopPeers {
            layout,
            proxy,
            own,
            prev,
            next,
            table,
        })
    }

    /// The proxy serving this rank's hops to other nodes, if any.
    pub fn proxy(&self) -> Option<&Proxy> {
        self.proxy.as_ref()
    }

    /// The channel table (host addresses of the three memories).
    pub fn table(&self) -> &[RcChan] {
        &self.table
    }

    /// The layout of every rank's memory.
    pub fn layout(&self) -> RegionLayout {
        self.layout
    }

    /// `(recv_next, send_next)` of channel `c` in this rank's memory
    /// (`own`) or its successor's: what the loop keeps between calls.
    pub fn state(&self, c: u8, of_successor: bool) -> (u64, u64) {
        if c >= self.layout.channels {
            return (0, 0);
        }
        let m = match (&self.next, of_successor) {
            (Some(n), true) => n.mapping(),
            _ => self.own.mapping(),
        };
        let off = self.layout.state(c) as usize;
        // SAFETY: `off` and `off + 8` are 8-aligned word offsets inside
        // the mapping (`total` bytes, checked at import); the loop writes
        // them with atomics, so they are read as atomics.
        let word = |i: usize| unsafe {
            (*m.base()
                .as_ptr()
                .add(off + 8 * i)
                .cast::<std::sync::atomic::AtomicU64>())
            .load(std::sync::atomic::Ordering::Acquire)
        };
        (word(0), word(1))
    }

    /// Whether the predecessor's memory is imported (a ring of more than
    /// one rank).
    pub fn has_neighbours(&self) -> bool {
        self.prev.is_some()
    }
}
