//! Connecting a communicator: publish, learn every rank, pick a transport
//! per hop, and join every channel's ring in three phases (listen,
//! connect, accept) separated by store barriers.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Instant;

use ringcc_core::fifo::FifoGeometry;
use ringcc_core::{ChannelId, Rank};

use crate::bell::LocalBell;
use crate::drive::Link;
use crate::error::{Error, Result};
use crate::options::Options;
use crate::ring::RingOrderOf;
use crate::store::Store;
use crate::transport::{Bell, FifoMemory, Hop, HopEnd, Job, PeerInfo, RecvEnd, SendEnd, Transport};

/// What connecting produced.
pub(crate) struct Connected {
    pub(crate) order: RingOrderOf,
    pub(crate) links: Vec<Link>,
    pub(crate) peers: Vec<PeerInfo>,
    /// Per channel: the transport of this rank's outgoing and incoming hop.
    pub(crate) hops: Vec<(&'static str, &'static str)>,
    /// The bell this rank sleeps on.
    pub(crate) bell: Arc<dyn Bell>,
    /// Every connection's FIFO: the options', else the ring's transports'
    /// (the largest slot of its hops'); the same on every rank.
    pub(crate) geometry: FifoGeometry,
    /// Bytes of a call's larger buffer per channel it uses: the options'
    /// override, else what the ring's transports ask for (the largest of
    /// its hops'); the same on every rank.
    pub(crate) channel_bytes: u64,
}

/// Waits until every rank has reached barrier `name` (a counter in the
/// store, then a key set by the last to arrive).
pub(crate) fn barrier(store: &dyn Store, name: &str, world: u32, deadline: Instant) -> Result<()> {
    let n = store.add(&format!("barrier/{name}"), 1)?;
    let done = format!("barrier/{name}/done");
    if n >= i64::from(world) {
        store.set(&done, b"1")?;
    }
    store.get(&done, deadline.saturating_duration_since(Instant::now()))?;
    Ok(())
}

/// Every rank's published `key/{rank}` value, in rank order.
pub(crate) fn gather(
    store: &dyn Store,
    key: &str,
    mine: (Rank, &[u8]),
    world: u32,
    deadline: Instant,
) -> Result<Vec<Vec<u8>>> {
    store.set(&format!("{key}/{}", mine.0), mine.1)?;
    (0..world)
        .map(|r| {
            store.get(
                &format!("{key}/{r}"),
                deadline.saturating_duration_since(Instant::now()),
            )
        })
        .collect()
}

/// Publishes what every transport `allows` admits can publish (node, pid
/// and each one's address), picks the rank's bell — the first such
/// transport's that offers one (peers can ring it through shared memory),
/// else one of this process — and gathers every rank's info under `key`,
/// in rank order.
fn introduce(
    store: &dyn Store,
    token: &str,
    (rank, world): (Rank, u32),
    node: &str,
    transports: &mut [Box<dyn Transport>],
    allows: impl Fn(&str) -> bool,
    (key, deadline): (&str, Instant),
) -> Result<(Vec<PeerInfo>, Arc<dyn Bell>)> {
    let mut published = BTreeMap::new();
    for t in transports.iter_mut() {
        if !allows(t.name()) {
            continue;
        }
        if let Some(v) = t.publish(token, rank)? {
            published.insert(t.name().to_owned(), v);
        }
    }
    let bell = transports
        .iter_mut()
        .filter(|t| published.contains_key(t.name()))
        .find_map(|t| t.bell())
        .unwrap_or_else(|| Arc::new(LocalBell::new()));
    let me = PeerInfo {
        rank: rank.0,
        node: node.to_owned(),
        pid: std::process::id(),
        transports: published,
    };
    let mine = serde_json::to_vec(&me).map_err(|e| Error::Internal(e.to_string()))?;
    let peers = gather(store, key, (rank, &mine), world, deadline)?
        .into_iter()
        .enumerate()
        .map(|(r, v)| {
            let p: PeerInfo = serde_json::from_slice(&v).map_err(|e| Error::Store {
                call: "get",
                key: format!("{key}/{r}"),
                source: e.into(),
            })?;
            if p.rank as usize != r {
                return Err(Error::BadConfig(format!(
                    "store key {key}/{r} holds rank {}'s info",
                    p.rank
                )));
            }
            Ok(p)
        })
        .collect::<Result<Vec<_>>>()?;
    Ok((peers, bell))
}

/// Per channel, the sending ends and the receiving ends of a rank's hops.
type Ends = (Vec<Box<dyn SendEnd>>, Vec<Box<dyn RecvEnd>>);

/// Memory the caller lends a hop's end for its FIFO (see
/// [`FifoMemory`]), asked once per end made, with the transport that will
/// make it (device memory only where it
/// [takes it](Transport::device_memory)); `None`: the end uses its
/// own.
pub type Lend<'a> = &'a mut dyn FnMut(Hop, HopEnd, &dyn Transport) -> Result<Option<FifoMemory>>;

/// Per channel, whether the end took the memory lent to it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Lent {
    /// The sending ends': the caller posts from the lent staging.
    pub send: Vec<bool>,
    /// The receiving ends': arrivals land in the lent FIFO.
    pub recv: Vec<bool>,
}

/// The ends of ring hops, per channel of `channels`, in the three phases
/// every rank of `job` goes through together (store barriers named with
/// `prefix`): listen on the hop from `prev` (with transport `t_in`), then
/// connect the hop to `next` (with `t_out`), then accept; a hop without a
/// transport is left alone. Each end made is offered the memory `lend`
/// gives it.
fn join(
    transports: &mut [Box<dyn Transport>],
    job: &Job<'_>,
    (channels, prefix): (u8, &str),
    (t_in, prev): (Option<usize>, Rank),
    (t_out, next): (Option<usize>, Rank),
    lend: Lend<'_>,
) -> Result<(Ends, Lent)> {
    let rank = job.rank;
    let hop_in = |c: u8| Hop {
        channel: ChannelId(c),
        sender: prev,
        receiver: rank,
    };
    let hop_out = |c: u8| Hop {
        channel: ChannelId(c),
        sender: rank,
        receiver: next,
    };
    let mut lent = Lent::default();
    if let Some(t) = t_in {
        for c in 0..channels {
            let t = nth(transports, t)?;
            lent.recv.push(match lend(hop_in(c), HopEnd::Recv, &**t)? {
                Some(fifo) => t.listen_in(job, hop_in(c), fifo)?,
                None => t.listen(job, hop_in(c)).map(|()| false)?,
            });
        }
    }
    barrier(
        job.store,
        &format!("{prefix}listen"),
        job.world,
        job.deadline,
    )?;
    let mut sends = Vec::new();
    if let Some(t) = t_out {
        for c in 0..channels {
            let t = nth(transports, t)?;
            let (end, took) = match lend(hop_out(c), HopEnd::Send, &**t)? {
                Some(staging) => t.connect_from(job, hop_out(c), staging)?,
                None => (t.connect(job, hop_out(c))?, false),
            };
            sends.push(end);
            lent.send.push(took);
        }
    }
    let mut recvs = Vec::new();
    if let Some(t) = t_in {
        for c in 0..channels {
            recvs.push(nth(transports, t)?.accept(job, hop_in(c))?);
        }
    }
    barrier(
        job.store,
        &format!("{prefix}connected"),
        job.world,
        job.deadline,
    )?;
    Ok(((sends, recvs), lent))
}

/// The transport for a hop between `a` and `b`: the first, in preference
/// order, that both published and that reaches between them.
fn choose(transports: &[Box<dyn Transport>], a: &PeerInfo, b: &PeerInfo) -> Option<usize> {
    transports.iter().position(|t| {
        a.transports.contains_key(t.name())
            && b.transports.contains_key(t.name())
            && t.reaches(a, b)
    })
}

/// Transport `t` of the list (an index `pick` returned).
fn nth(transports: &mut [Box<dyn Transport>], t: usize) -> Result<&mut Box<dyn Transport>> {
    transports
        .get_mut(t)
        .ok_or_else(|| Error::Internal(format!("no transport {t}")))
}

/// The transport of the hop from `a` to `b`, as an error when none
/// reaches.
fn pick(transports: &[Box<dyn Transport>], peers: &[PeerInfo], a: Rank, b: Rank) -> Result<usize> {
    let (Some(pa), Some(pb)) = (peers.get(a.0 as usize), peers.get(b.0 as usize)) else {
        return Err(Error::Internal(format!("no info for rank {a} or {b}")));
    };
    choose(transports, pa, pb).ok_or_else(|| {
        Error::BadConfig(format!(
            "no transport reaches from rank {a} (node {}, {:?}) to rank {b} (node {}, {:?})",
            pa.node,
            pa.transports.keys().collect::<Vec<_>>(),
            pb.node,
            pb.transports.keys().collect::<Vec<_>>()
        ))
    })
}

/// What every rank must agree on, compared across ranks at connect.
fn settings(o: &Options) -> String {
    format!(
        "channels={} geometry={:?} chunk_bytes={} channel_bytes={:?} protos={:?} algos={:?}",
        o.channels,
        o.geometry.map(|g| (g.slot_bytes(), g.slots_per_slice())),
        o.chunk_bytes,
        o.channel_bytes,
        o.protos,
        o.algos
    )
}

/// Connects `rank` of `world` to its ring neighbours on every channel.
pub(crate) fn connect(
    store: &dyn Store,
    token: &str,
    rank: Rank,
    world: u32,
    options: &Options,
    transports: &mut [Box<dyn Transport>],
) -> Result<Connected> {
    let deadline = Instant::now() + options.timeout;
    let (peers, bell) = introduce(
        store,
        token,
        (rank, world),
        &options.node,
        transports,
        |t| options.allows(t),
        ("peer", deadline),
    )?;
    // Every rank must run the same settings.
    let ours = settings(options);
    let all = gather(store, "settings", (rank, ours.as_bytes()), world, deadline)?;
    for (r, s) in all.iter().enumerate() {
        if s.as_slice() != ours.as_bytes() {
            return Err(Error::BadConfig(format!(
                "rank {r} runs {}, rank {rank} runs {ours}",
                String::from_utf8_lossy(s)
            )));
        }
    }
    let order = RingOrderOf::by_node(&peers.iter().map(|p| p.node.as_str()).collect::<Vec<_>>());
    let channels = if world > 1 { options.channels } else { 0 };
    let (next, prev) = (order.next(rank), order.prev(rank));
    let (t_out, t_in) = if world > 1 {
        (
            pick(transports, &peers, rank, next)?,
            pick(transports, &peers, prev, rank)?,
        )
    } else {
        (0, 0)
    };
    // The FIFO: the options', else the ring's transports' (the largest
    // slot any hop asks for); the same on every rank.
    let geometry = match options.geometry {
        Some(g) => g,
        None => {
            let slot = ring_hops(transports, &peers, &order)
                .filter_map(|(_, t)| t.and_then(|t| t.slot_bytes()))
                .fold(crate::transport::SLOT_BYTES, u64::max);
            geometry(slot, 1)?
        }
    };
    let job = Job {
        token,
        rank,
        world,
        geometry,
        deadline,
        peers: &peers,
        bell: &bell,
        store,
    };
    let ((sends, recvs), _) = join(
        transports,
        &job,
        (channels, ""),
        (Some(t_in), prev),
        (Some(t_out), next),
        &mut |_, _, _| Ok(None),
    )?;
    let links = recvs
        .into_iter()
        .zip(sends)
        .map(|(recv, send)| Link { recv, send })
        .collect();
    let name = |t: usize| transports.get(t).map_or("none", |t| t.name());
    let names = (name(t_out), name(t_in));
    let channel_bytes = options.channel_bytes.unwrap_or_else(|| {
        ring_hops(transports, &peers, &order)
            .filter_map(|(_, t)| t.map(|t| t.channel_bytes()))
            .max()
            .unwrap_or(crate::transport::CHANNEL_BYTES)
    });
    if rank == Rank(0) && options.debug_info {
        eprintln!(
            "{}",
            banner(
                &peers,
                &order,
                options,
                (geometry, channel_bytes),
                transports
            )
        );
    }
    Ok(Connected {
        order,
        links,
        peers,
        hops: vec![names; usize::from(channels)],
        bell,
        geometry,
        channel_bytes,
    })
}

/// Every hop of the ring, in ring order from its first rank: the sender
/// and the transport to its successor (`None` where none reaches). Every
/// rank computes the same from what all published.
fn ring_hops<'t>(
    transports: &'t [Box<dyn Transport>],
    peers: &'t [PeerInfo],
    order: &'t RingOrderOf,
) -> impl Iterator<Item = (u32, Option<&'t dyn Transport>)> + 't {
    let ring = order.ranks_in_order();
    ring.iter()
        .zip(ring.iter().cycle().skip(1))
        .map(move |(&r, &next)| {
            let t = pick(transports, peers, Rank(r), Rank(next))
                .ok()
                .and_then(|k| transports.get(k))
                .map(|t| &**t);
            (r, t)
        })
}

/// The init banner (`RINGCC_DEBUG=INFO`): ranks, nodes, channels, the
/// ring and each hop's transport.
fn banner(
    peers: &[PeerInfo],
    order: &RingOrderOf,
    options: &Options,
    (geometry, channel_bytes): (FifoGeometry, u64),
    transports: &[Box<dyn Transport>],
) -> String {
    let mut nodes: Vec<&str> = Vec::new();
    for p in peers {
        if !nodes.contains(&p.node.as_str()) {
            nodes.push(&p.node);
        }
    }
    let per = match channel_bytes {
        u64::MAX => "one per call".to_string(),
        b => format!("one per {b} B"),
    };
    let mut s = format!(
        "ringcc INFO: {} ranks on {} node(s), {} channel(s) ({per}), FIFO {} x {} B, chunk {} B, \
         timeout {:?}\n\
         ringcc INFO: ring",
        peers.len(),
        nodes.len(),
        options.channels,
        ringcc_core::fifo::STEPS,
        geometry.slot_bytes(),
        options.chunk_bytes,
        options.timeout,
    );
    for (r, t) in ring_hops(transports, peers, order) {
        let t = t.map_or("none", |t| t.name());
        let node = peers.get(r as usize).map_or("?", |p| p.node.as_str());
        let _ = write!(s, " {r}[{node}] -{t}->");
    }
    if let Some(first) = order.ranks_in_order().first() {
        let _ = write!(s, " {first}");
    }
    s
}

/// A FIFO geometry from slot size and slots per slice, as a config error.
pub(crate) fn geometry(slot_bytes: u64, slots_per_slice: u64) -> Result<FifoGeometry> {
    FifoGeometry::new(slot_bytes, slots_per_slice).map_err(|source| Error::Core {
        channel: None,
        call: "FifoGeometry::new",
        source,
    })
}

/// A job's ring hops that leave a node, connected outside a
/// [`Communicator`](crate::Communicator): for a device whose data path
/// inside a node is its own (a GPU's persistent loop writing its
/// neighbours' memory over CUDA IPC) and whose host only proxies the
/// network, as NCCL's proxy thread does. See [`connect_between_nodes`].
pub struct NodeLinks {
    /// Every rank's published info, by rank.
    pub peers: Vec<PeerInfo>,
    /// The ring: the ranks of a node next to each other.
    pub order: RingOrderOf,
    /// Per channel, the end toward the successor when it runs on another
    /// node (else empty).
    pub send: Vec<Box<dyn SendEnd>>,
    /// Per channel, the end from the predecessor when it runs on another
    /// node (else empty).
    pub recv: Vec<Box<dyn RecvEnd>>,
    /// Per channel, whether the ends took the memory lent to them.
    pub lent: Lent,
    /// The transports of the outgoing and incoming hop, where they leave
    /// the node.
    pub transports: (Option<&'static str>, Option<&'static str>),
    /// Where this rank's ends ring when something arrives (sleep on it).
    pub bell: Arc<dyn Bell>,
}

impl std::fmt::Debug for NodeLinks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeLinks")
            .field("peers", &self.peers)
            .field("order", &self.order)
            .field("send", &self.send.len())
            .field("recv", &self.recv.len())
            .field("lent", &self.lent)
            .field("transports", &self.transports)
            .finish_non_exhaustive()
    }
}

/// Connects `channels` channels of this rank's ring hops that leave its
/// node (`node`), with the first of `transports` that reaches each,
/// in the communicator's three phases; hops inside a node are left to the
/// caller. Every rank of the job calls it (it meets the others at store
/// barriers, under the `nodes/` keys) with the same `channels` and
/// `geometry`; nothing waits past `deadline`. Each end made is offered
/// the FIFO memory `lend` gives it (the caller's staging, where the
/// transport can use it in place: [`Transport::listen_in`],
/// [`Transport::connect_from`]); [`NodeLinks::lent`] says which took it.
#[allow(clippy::too_many_arguments)]
pub fn connect_between_nodes(
    store: &dyn Store,
    token: &str,
    rank: Rank,
    world: u32,
    node: &str,
    channels: u8,
    geometry: FifoGeometry,
    deadline: Instant,
    transports: &mut [Box<dyn Transport>],
    lend: Lend<'_>,
) -> Result<NodeLinks> {
    if world == 0 || rank.0 >= world {
        return Err(Error::BadConfig(format!("rank {rank} of {world} ranks")));
    }
    let (peers, bell) = introduce(
        store,
        token,
        (rank, world),
        node,
        transports,
        |_| true,
        ("nodes/peer", deadline),
    )?;
    let order = RingOrderOf::by_node(&peers.iter().map(|p| p.node.as_str()).collect::<Vec<_>>());
    let (next, prev) = (order.next(rank), order.prev(rank));
    let remote =
        |other: Rank| world > 1 && peers.get(other.0 as usize).is_some_and(|p| p.node != node);
    let t_out = remote(next)
        .then(|| pick(transports, &peers, rank, next))
        .transpose()?;
    let t_in = remote(prev)
        .then(|| pick(transports, &peers, prev, rank))
        .transpose()?;
    let job = Job {
        token,
        rank,
        world,
        geometry,
        deadline,
        peers: &peers,
        bell: &bell,
        store,
    };
    let ((send, recv), lent) = join(
        transports,
        &job,
        (channels, "nodes/"),
        (t_in, prev),
        (t_out, next),
        lend,
    )?;
    let name = |t: Option<usize>| t.and_then(|t| transports.get(t)).map(|t| t.name());
    Ok(NodeLinks {
        transports: (name(t_out), name(t_in)),
        peers,
        order,
        send,
        recv,
        lent,
        bell,
    })
}
