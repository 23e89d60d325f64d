//! The connection protocol between neighbours over RDMA: what a work
//! request id says — which channel and what for — written once for every
//! transport that posts work requests (the verbs backend, the simulator's
//! RNICs, firmware).
//!
//! ```text
//! bits 56..64  kind
//! bits 48..56  channel
//! bits  0..32  low 32 bits of a step (data: the slice's end)
//! ```

pub mod post;

/// What a request (or a posted receive) is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Kind {
    /// A slice's writes to the successor.
    Data = 1,
    /// A credit return to the predecessor.
    Credit = 2,
    /// A receive on the predecessor connection: a slice arrived.
    TailRecv = 3,
    /// A receive on the successor connection: credit arrived.
    CreditRecv = 4,
}

impl Kind {
    /// What the kind is called in error messages.
    pub fn what(self) -> &'static str {
        match self {
            Kind::Data => "data write",
            Kind::Credit => "credit return",
            Kind::TailRecv => "data receive",
            Kind::CreditRecv => "credit receive",
        }
    }
}

/// A work request id: kind, channel and a step's low half in one `u64`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct WrId {
    /// What the request is for.
    pub kind: Kind,
    /// The channel of its connection.
    pub channel: u8,
    /// The low 32 bits of a step: a slice's end, a credit's head.
    pub low: u32,
}

impl WrId {
    /// An id.
    pub const fn new(kind: Kind, channel: u8, low: u32) -> WrId {
        WrId { kind, channel, low }
    }

    /// The id as the `wr_id` of a work request or receive.
    pub const fn encode(self) -> u64 {
        ((self.kind as u64) << 56) | ((self.channel as u64) << 48) | self.low as u64
    }

    /// `None` for an id [`encode`](WrId::encode) did not make.
    pub const fn decode(v: u64) -> Option<WrId> {
        let kind = match v >> 56 {
            1 => Kind::Data,
            2 => Kind::Credit,
            3 => Kind::TailRecv,
            4 => Kind::CreditRecv,
            _ => return None,
        };
        if (v >> 32) & 0xffff != 0 {
            return None;
        }
        Some(WrId {
            kind,
            channel: (v >> 48) as u8,
            low: v as u32,
        })
    }
}

/// What a slice's receive completion tells the receiver: its new `tail`,
/// and the call header its mailbox holds when that header belongs to
/// this slice (a header arrives with the first slice of each call).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Arrival {
    /// The new `tail`: the immediate widened against the last one known.
    pub tail: u64,
    /// `(step, call)` where the mailbox's header is this slice's.
    pub header: Option<(u64, crate::CallDesc)>,
}

/// Decodes a slice's arrival: the WRITE_WITH_IMM's immediate (the low half
/// of the slice's end step), the tail the receiver knew, the FIFO's
/// slots per slice and the mailbox's bytes. A mailbox that holds no valid
/// header, or the header of an earlier slice, gives no header.
pub fn arrival(imm: u32, last_tail: u64, slots_per_slice: u64, mailbox: &[u8]) -> Arrival {
    let tail = post::widen_step(imm, last_tail);
    let step = tail.saturating_sub(slots_per_slice);
    let header = crate::wire::CallHeader::new_checked(mailbox)
        .and_then(|h| crate::wire::CallHeaderRepr::parse(&h))
        .ok()
        .filter(|h| u64::from(h.step) == step & 0xffff_ffff)
        .map(|h| (step, h.desc));
    Arrival { tail, header }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        for kind in [Kind::Data, Kind::Credit, Kind::TailRecv, Kind::CreditRecv] {
            for channel in [0u8, 1, 63, 255] {
                for low in [0u32, 1, 0xdead_beef, u32::MAX] {
                    let w = WrId::new(kind, channel, low);
                    assert_eq!(WrId::decode(w.encode()), Some(w));
                }
            }
        }
    }

    #[test]
    fn an_arrival_carries_its_own_header_only() {
        use crate::wire::CallHeaderRepr;
        use crate::{CallDesc, Collective, DataType, ReduceOp};
        let desc = CallDesc::new(3, Collective::AllReduce, 9, DataType::F32, ReduceOp::Sum);
        let mut mailbox = [0u8; crate::wire::call_header::CALL_HEADER_LEN];
        let repr = CallHeaderRepr { desc, step: 4 };
        repr.emit(&mut mailbox).unwrap();
        // The slice of steps 4..6 (2 slots per slice) ends at 6.
        let a = arrival(6, 4, 2, &mailbox);
        assert_eq!(
            a,
            Arrival {
                tail: 6,
                header: Some((4, desc))
            }
        );
        // A later slice: the same mailbox is an old header.
        assert_eq!(arrival(8, 6, 2, &mailbox).header, None);
        // The immediate's low half widens across 2^32.
        assert_eq!(arrival(2, 0xffff_fffe, 2, &mailbox).tail, 0x1_0000_0002);
        // No header at all, or garbage.
        assert_eq!(arrival(6, 4, 2, &[0u8; 3]).header, None);
    }

    #[test]
    fn foreign_ids_are_refused() {
        assert_eq!(WrId::decode(0), None);
        assert_eq!(WrId::decode(5 << 56), None);
        assert_eq!(WrId::decode((1 << 56) | (1 << 40)), None);
    }
}
