//! RoCEv2: InfiniBand transport headers over UDP/IP.
//!
//! - [`bth`]: the Base Transport Header and the RC opcodes;
//! - [`ext`]: the RETH, AETH and ImmDt extension headers;
//! - [`icrc`]: the invariant CRC that ends every packet;
//! - [`ip`]: Ethernet, IPv4 and UDP framing;
//! - [`packet`]: a whole packet, built and parsed in one call (what the
//!   simulator writes to pcap files).
//!
//! Everything is big-endian except the ICRC (little-endian; see [`icrc`]).

pub mod bth;
pub mod ext;
pub mod icrc;
pub mod ip;
pub mod packet;

pub use bth::{Bth, BthRepr, Layout, Opcode, BTH_LEN};
pub use ext::{
    Aeth, AethRepr, ImmDt, ImmDtRepr, NakCode, Reth, RethRepr, Syndrome, AETH_LEN, IMMDT_LEN,
    RETH_LEN,
};
pub use icrc::{check_icrc_ipv4, crc32, fill_icrc_ipv4, icrc_ipv4, icrc_ipv6, Crc32, ICRC_LEN};
pub use ip::{internet_checksum, EthernetRepr, Ipv4Repr, UdpRepr};
pub use packet::{pad_for, RocePacketRepr};

/// The UDP destination port of RoCEv2 (IANA "roce", IBTA vol. 1 Annex
/// A17; Linux `ROCE_V2_UDP_DPORT`).
pub const ROCE_V2_PORT: u16 = 4791;
