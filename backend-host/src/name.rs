//! Segment names: which job, which receiving rank, which channel.

use std::fmt;

use ringcc_core::{ChannelId, Rank};

/// 64-bit FNV-1a of `domain` then `token`. Not a cryptographic hash: the
/// segments are owner-only (mode 0600), the hash only keeps jobs apart and
/// the token out of names visible in `/dev/shm`.
fn fnv1a(domain: &[u8], token: &[u8]) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    domain
        .iter()
        .chain(token)
        .fold(OFFSET, |h, &b| (h ^ u64::from(b)).wrapping_mul(PRIME))
}

/// The hash a segment's header carries for the job `token` (domain
/// separated from the one in the name, so the name does not reveal it).
pub fn token_hash(token: &str) -> u64 {
    fnv1a(b"ringcc-shm-header\0", token.as_bytes())
}

/// The POSIX shared-memory name of one connection's FIFO:
/// `/ringcc-<16 hex digits>-r<rank>-c<channel>`, owned by the receiving
/// rank. The hex digits hash the job token (the token itself never
/// appears); the name is at most [`SegmentName::MAX_LEN`] bytes, one
/// leading `/`, no other.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SegmentName(String);

impl SegmentName {
    /// The longest name: `/ringcc-` (8) + 16 hex + `-r` + 10 digits + `-c`
    /// + 3 digits.
    pub const MAX_LEN: usize = 8 + 16 + 2 + 10 + 2 + 3;

    /// The name of the FIFO that `receiver` owns on `channel` in the job
    /// of `token`.
    pub fn new(token: &str, receiver: Rank, channel: ChannelId) -> SegmentName {
        let h = fnv1a(b"ringcc-shm-name\0", token.as_bytes());
        SegmentName(format!("/ringcc-{h:016x}-r{receiver}-c{channel}"))
    }

    /// The name of `rank`'s bell (the word it sleeps on when idle) in the
    /// job of `token`: `/ringcc-<16 hex digits>-r<rank>-bell`.
    pub fn bell(token: &str, rank: Rank) -> SegmentName {
        let h = fnv1a(b"ringcc-shm-name\0", token.as_bytes());
        SegmentName(format!("/ringcc-{h:016x}-r{rank}-bell"))
    }

    /// The name as passed to `shm_open`.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for SegmentName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn longest_name_fits() {
        let n = SegmentName::new("t", Rank(u32::MAX), ChannelId(u8::MAX));
        assert_eq!(n.as_str().len(), SegmentName::MAX_LEN);
        assert_eq!(n.as_str().matches('/').count(), 1);
        assert!(n.as_str().starts_with('/'));
    }

    #[test]
    fn fnv_reference_value() {
        // FNV-1a 64 of "a" (the published test vector).
        assert_eq!(fnv1a(b"", b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}
