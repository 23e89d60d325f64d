//! The job's abort notice, as stored under [`ABORT_KEY`](super::ABORT_KEY):
//! a JSON object `{"rank": r or null, "reason": "…"}`.

use ringcc_core::Rank;

use crate::error::Error;

/// The notice's bytes.
pub fn notice(rank: Option<Rank>, reason: &str) -> Vec<u8> {
    serde_json::json!({ "rank": rank.map(|r| r.0), "reason": reason })
        .to_string()
        .into_bytes()
}

/// The notice as the error every rank reports ([`Error::Aborted`]); bytes
/// that are not a notice still abort, with the bytes as the reason.
pub fn parse_notice(bytes: &[u8]) -> Error {
    let v: Option<serde_json::Value> = serde_json::from_slice(bytes).ok();
    let rank = v
        .as_ref()
        .and_then(|v| v.get("rank"))
        .and_then(serde_json::Value::as_u64)
        .and_then(|r| u32::try_from(r).ok())
        .map(Rank);
    let reason = v
        .as_ref()
        .and_then(|v| v.get("reason"))
        .and_then(serde_json::Value::as_str)
        .map_or_else(
            || String::from_utf8_lossy(bytes).into_owned(),
            str::to_owned,
        );
    Error::Aborted { rank, reason }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_notice_round_trips_and_garbage_still_aborts() {
        match parse_notice(&notice(Some(Rank(3)), "boom")) {
            Error::Aborted { rank, reason } => {
                assert_eq!(rank, Some(Rank(3)));
                assert_eq!(reason, "boom");
            }
            e => panic!("{e}"),
        }
        assert!(matches!(
            parse_notice(b"\xff junk"),
            Error::Aborted { rank: None, .. }
        ));
    }
}
