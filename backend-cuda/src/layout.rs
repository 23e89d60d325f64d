//! Where everything of a communicator lives: ranks on devices, streams,
//! events, FIFO buffers and slot addresses. Pure bookkeeping, shared by the
//! CUDA device and the host fake device.
//!
//! Ring: rank `r` sends to `(r + 1) mod n` on every channel (one process,
//! one node: the core's [`InOrderRing`](ringcc_core::InOrderRing)). A
//! *connection* `(channel, receiver)` is the FIFO into `receiver` on
//! `channel`; its slots live in the receiver's device memory. The sender
//! writes them directly when both ranks share a device or peer access is
//! enabled ([`LinkKind::Direct`]); otherwise it writes a staging copy in its
//! own memory and copies it across ([`LinkKind::Staged`]).

use ringcc_core::fifo::FifoGeometry;
use ringcc_core::fifo::STEPS;
use ringcc_core::prim::SlotSpan;
use ringcc_core::{ChannelId, Rank, SlotIndex};

use crate::error::{Error, Result};

/// How a sender reaches its receiver's FIFO.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkKind {
    /// The sender's kernel writes the receiver's slots: same device, or
    /// peer access enabled (NVLink or PCIe peer writes).
    Direct,
    /// No peer access: the kernel writes a staging FIFO on the sender's
    /// device, then a peer copy moves the slice across.
    Staged,
}

/// The FIFO into `receiver` on `channel`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConnId {
    /// The channel.
    pub channel: ChannelId,
    /// The rank whose FIFO it is.
    pub receiver: Rank,
}

/// A stream of the communicator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StreamId {
    /// The rank's user stream: the stream its buffers are ordered on.
    User(Rank),
    /// The stream of one channel on one rank.
    Channel(ChannelId, Rank),
}

/// An event of the communicator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventId {
    /// Recorded on the user stream when a call starts; the channel streams
    /// wait for it.
    Begin(Rank),
    /// Recorded on a channel stream when its part of a call is enqueued;
    /// the user stream waits for it.
    End(ChannelId, Rank),
    /// The last write of a slot (recorded by the sender).
    Written(ConnId, SlotIndex),
    /// The last read of a slot (recorded by the receiver).
    Read(ConnId, SlotIndex),
}

/// A device buffer of the communicator (or of the current call).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BufId {
    /// The rank's send buffer of the current call.
    Input(Rank),
    /// The rank's receive buffer of the current call.
    Output(Rank),
    /// A connection's FIFO, on the receiver's device.
    Fifo(ConnId),
    /// A connection's staging FIFO, on the sender's device
    /// ([`LinkKind::Staged`] only).
    Staging(ConnId),
}

/// A byte address inside a buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MemRef {
    /// The buffer.
    pub buf: BufId,
    /// Byte offset.
    pub offset: u64,
}

/// The static shape of a communicator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    devices: Vec<usize>,
    channels: u8,
    geometry: FifoGeometry,
    links: Vec<LinkKind>,
}

impl Layout {
    /// `devices[r]` is rank `r`'s device (several ranks may share one);
    /// `channels` in `1..=64`; `peer(a, b)` says whether device `a` can
    /// write device `b`'s memory (asked only for `a != b`).
    pub fn new(
        devices: Vec<usize>,
        channels: u8,
        geometry: FifoGeometry,
        mut peer: impl FnMut(usize, usize) -> bool,
    ) -> Result<Layout> {
        if devices.is_empty() {
            return Err(Error::BadConfig {
                what: "a communicator needs at least one rank",
            });
        }
        if u32::try_from(devices.len()).is_err() {
            return Err(Error::BadConfig {
                what: "too many ranks",
            });
        }
        if channels == 0 || u32::from(channels) > ringcc_core::topology::MAX_CHANNELS {
            return Err(Error::BadConfig {
                what: "channels must be in 1..=64",
            });
        }
        let n = devices.len();
        let links = (0..n)
            .map(|r| {
                let (a, b) = (devices[r], devices[(r + 1) % n]);
                if a == b || peer(a, b) {
                    LinkKind::Direct
                } else {
                    LinkKind::Staged
                }
            })
            .collect();
        Ok(Layout {
            devices,
            channels,
            geometry,
            links,
        })
    }

    /// Number of ranks.
    pub fn ranks(&self) -> u32 {
        self.devices.len() as u32
    }

    /// Number of channels.
    pub fn channels(&self) -> u8 {
        self.channels
    }

    /// The FIFO geometry.
    pub fn geometry(&self) -> FifoGeometry {
        self.geometry
    }

    /// Rank `r`'s device.
    pub fn device(&self, rank: Rank) -> Result<usize> {
        self.devices
            .get(rank.0 as usize)
            .copied()
            .ok_or(Error::RankOutOfRange {
                rank,
                ranks: self.ranks(),
            })
    }

    /// Every rank's device.
    pub fn devices(&self) -> &[usize] {
        &self.devices
    }

    /// The distinct devices, in first-use order.
    pub fn distinct_devices(&self) -> Vec<usize> {
        let mut out: Vec<usize> = Vec::new();
        for &d in &self.devices {
            if !out.contains(&d) {
                out.push(d);
            }
        }
        out
    }

    /// The rank `rank` sends to.
    pub fn next(&self, rank: Rank) -> Rank {
        Rank((rank.0 + 1) % self.ranks())
    }

    /// The rank `rank` receives from.
    pub fn prev(&self, rank: Rank) -> Rank {
        Rank((rank.0 + self.ranks() - 1) % self.ranks())
    }

    /// How `sender` reaches its successor.
    pub fn link(&self, sender: Rank) -> LinkKind {
        self.links
            .get(sender.0 as usize)
            .copied()
            .unwrap_or(LinkKind::Staged)
    }

    /// The connection `sender` writes on `channel`.
    pub fn outgoing(&self, channel: ChannelId, sender: Rank) -> ConnId {
        ConnId {
            channel,
            receiver: self.next(sender),
        }
    }

    /// The connection `receiver` reads on `channel`.
    pub fn incoming(&self, channel: ChannelId, receiver: Rank) -> ConnId {
        ConnId { channel, receiver }
    }

    /// Every connection, in index order.
    pub fn connections(&self) -> impl Iterator<Item = ConnId> + '_ {
        (0..self.channels).flat_map(move |c| {
            (0..self.ranks()).map(move |r| ConnId {
                channel: ChannelId(c),
                receiver: Rank(r),
            })
        })
    }

    /// Dense index of a (channel, rank) pair: `channel * ranks + rank`.
    /// Machines, link states and channel streams are stored in this order.
    pub fn slot_index(&self, channel: ChannelId, rank: Rank) -> usize {
        usize::from(channel.0) * self.devices.len() + rank.0 as usize
    }

    /// Number of (channel, rank) pairs.
    pub fn pairs(&self) -> usize {
        usize::from(self.channels) * self.devices.len()
    }

    /// Dense index of a stream: user streams first, then channel streams
    /// in [`slot_index`](Self::slot_index) order.
    pub fn stream_index(&self, s: StreamId) -> usize {
        match s {
            StreamId::User(r) => r.0 as usize,
            StreamId::Channel(c, r) => self.devices.len() + self.slot_index(c, r),
        }
    }

    /// Number of streams.
    pub fn streams(&self) -> usize {
        self.devices.len() + self.pairs()
    }

    /// The device a stream runs on.
    pub fn stream_device(&self, s: StreamId) -> Result<usize> {
        match s {
            StreamId::User(r) | StreamId::Channel(_, r) => self.device(r),
        }
    }

    /// Dense index of an event.
    pub fn event_index(&self, e: EventId) -> usize {
        let n = self.devices.len();
        let pairs = self.pairs();
        let steps = STEPS as usize;
        match e {
            EventId::Begin(r) => r.0 as usize,
            EventId::End(c, r) => n + self.slot_index(c, r),
            EventId::Written(k, s) => {
                n + pairs + self.slot_index(k.channel, k.receiver) * steps + usize::from(s.0)
            }
            EventId::Read(k, s) => {
                n + pairs * (1 + steps)
                    + self.slot_index(k.channel, k.receiver) * steps
                    + usize::from(s.0)
            }
        }
    }

    /// Number of events.
    pub fn events(&self) -> usize {
        self.devices.len() + self.pairs() * (1 + 2 * STEPS as usize)
    }

    /// The device an event is recorded on (that of the stream recording it).
    pub fn event_device(&self, e: EventId) -> Result<usize> {
        match e {
            EventId::Begin(r) | EventId::End(_, r) => self.device(r),
            EventId::Written(k, _) => self.device(self.prev(k.receiver)),
            EventId::Read(k, _) => self.device(k.receiver),
        }
    }

    /// The stream that records an event.
    pub fn event_stream(&self, e: EventId) -> StreamId {
        match e {
            EventId::Begin(r) => StreamId::User(r),
            EventId::End(c, r) => StreamId::Channel(c, r),
            EventId::Written(k, _) => StreamId::Channel(k.channel, self.prev(k.receiver)),
            EventId::Read(k, _) => StreamId::Channel(k.channel, k.receiver),
        }
    }

    /// The device a connection's buffer lives on.
    pub fn buffer_device(&self, b: BufId) -> Result<usize> {
        match b {
            BufId::Input(r) | BufId::Output(r) => self.device(r),
            BufId::Fifo(k) => self.device(k.receiver),
            BufId::Staging(k) => self.device(self.prev(k.receiver)),
        }
    }

    /// The address of a slot span in a connection's FIFO (or in its
    /// staging copy).
    pub fn slot_ref(&self, buf: BufId, span: SlotSpan) -> MemRef {
        MemRef {
            buf,
            offset: span.byte_offset(&self.geometry),
        }
    }

    /// The slots a span covers, in order.
    pub fn span_slots(span: SlotSpan) -> impl Iterator<Item = SlotIndex> {
        (0..span.slots).map(move |i| ringcc_core::fifo::slot_of(span.step.wrapping_add(i)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn layout(devices: Vec<usize>, channels: u8) -> Layout {
        Layout::new(
            devices,
            channels,
            FifoGeometry::new(64, 2).unwrap(),
            |_, _| false,
        )
        .unwrap()
    }

    #[test]
    fn rejects_bad_shapes() {
        let g = FifoGeometry::NCCL;
        assert!(Layout::new(vec![], 1, g, |_, _| true).is_err());
        assert!(Layout::new(vec![0], 0, g, |_, _| true).is_err());
        assert!(Layout::new(vec![0], 65, g, |_, _| true).is_err());
        assert!(Layout::new(vec![0], 64, g, |_, _| true).is_ok());
    }

    #[test]
    fn ring_and_links() {
        // Ranks 0,1 on GPU 0, ranks 2,3 on GPU 1, no peer access.
        let l = layout(vec![0, 0, 1, 1], 2);
        assert_eq!(l.next(Rank(3)), Rank(0));
        assert_eq!(l.prev(Rank(0)), Rank(3));
        assert_eq!(l.link(Rank(0)), LinkKind::Direct);
        assert_eq!(l.link(Rank(1)), LinkKind::Staged);
        assert_eq!(l.link(Rank(2)), LinkKind::Direct);
        assert_eq!(l.link(Rank(3)), LinkKind::Staged);
        let p = Layout::new(vec![0, 0, 1, 1], 2, FifoGeometry::NCCL, |a, b| a != b).unwrap();
        assert!((0..4).all(|r| p.link(Rank(r)) == LinkKind::Direct));
        assert_eq!(l.distinct_devices(), vec![0, 1]);
        // FIFO on the receiver, staging on the sender.
        let k = l.outgoing(ChannelId(1), Rank(1));
        assert_eq!(k.receiver, Rank(2));
        assert_eq!(l.buffer_device(BufId::Fifo(k)).unwrap(), 1);
        assert_eq!(l.buffer_device(BufId::Staging(k)).unwrap(), 0);
        assert_eq!(l.incoming(ChannelId(1), Rank(2)), k);
        assert!(l.device(Rank(4)).is_err());
    }

    #[test]
    fn indices_are_dense_and_distinct() {
        for (devices, channels) in [(vec![0], 1), (vec![0, 0, 0], 3), (vec![0, 1, 2, 3, 4], 4)] {
            let l = layout(devices, channels);
            let n = l.ranks();
            let mut streams = HashSet::new();
            let mut events = HashSet::new();
            let mut pairs = HashSet::new();
            for r in 0..n {
                assert!(streams.insert(l.stream_index(StreamId::User(Rank(r)))));
                assert!(events.insert(l.event_index(EventId::Begin(Rank(r)))));
                for c in 0..channels {
                    let (c, r) = (ChannelId(c), Rank(r));
                    assert!(pairs.insert(l.slot_index(c, r)));
                    assert!(streams.insert(l.stream_index(StreamId::Channel(c, r))));
                    assert!(events.insert(l.event_index(EventId::End(c, r))));
                    let k = l.incoming(c, r);
                    for s in 0..STEPS as u8 {
                        assert!(events.insert(l.event_index(EventId::Written(k, SlotIndex(s)))));
                        assert!(events.insert(l.event_index(EventId::Read(k, SlotIndex(s)))));
                    }
                }
            }
            assert!(streams.iter().all(|&i| i < l.streams()));
            assert_eq!(streams.len(), l.streams());
            assert!(events.iter().all(|&i| i < l.events()));
            assert_eq!(events.len(), l.events());
            assert!(pairs.iter().all(|&i| i < l.pairs()));
            assert_eq!(l.connections().count(), l.pairs());
        }
    }

    #[test]
    fn events_are_recorded_where_their_writer_runs() {
        let l = layout(vec![3, 5, 7], 2);
        let k = l.incoming(ChannelId(1), Rank(0));
        // Rank 2 writes rank 0's FIFO; rank 0 reads it.
        let w = EventId::Written(k, SlotIndex(3));
        assert_eq!(l.event_stream(w), StreamId::Channel(ChannelId(1), Rank(2)));
        assert_eq!(l.event_device(w).unwrap(), 7);
        let r = EventId::Read(k, SlotIndex(3));
        assert_eq!(l.event_stream(r), StreamId::Channel(ChannelId(1), Rank(0)));
        assert_eq!(l.event_device(r).unwrap(), 3);
        assert_eq!(l.stream_device(StreamId::User(Rank(1))).unwrap(), 5);
    }

    #[test]
    fn slot_addresses() {
        let l = layout(vec![0, 0], 1);
        let k = l.incoming(ChannelId(0), Rank(1));
        let span = SlotSpan { step: 10, slots: 2 };
        let m = l.slot_ref(BufId::Fifo(k), span);
        assert_eq!(m.offset, 2 * 64);
        let slots: Vec<_> = Layout::span_slots(span).collect();
        assert_eq!(slots, vec![SlotIndex(2), SlotIndex(3)]);
        let wrap: Vec<_> = Layout::span_slots(SlotSpan { step: 7, slots: 2 }).collect();
        assert_eq!(wrap, vec![SlotIndex(7), SlotIndex(0)]);
    }
}
