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
    fn foreign_ids_are_refused() {
        assert_eq!(WrId::decode(0), None);
        assert_eq!(WrId::decode(5 << 56), None);
        assert_eq!(WrId::decode((1 << 56) | (1 << 40)), None);
    }
}
