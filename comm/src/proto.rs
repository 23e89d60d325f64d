//! Which [`Protocol`] a call runs under — the one place a tuner plugs in.
//!
//! Every rank must choose alike, or the ring hangs (a sender writing
//! lines to a receiver that waits for a slice of another size): the
//! choice is a pure function of the call, the communicator's shape and
//! its settings, and the settings (`RINGCC_PROTO` among them) are
//! compared across ranks when the communicator connects.

use ringcc_core::{Call, Protocol};

/// Calls whose larger buffer is at most this many bytes run under LL
/// when no protocol is forced: on shared memory a small call's time is
/// its hand-offs, and LL's flags save the separate `tail` store and the
/// cache line it lives on at every hop (one cross-core transfer, ~75 ns).
/// Each byte costs LL about 0.35 ns more than Simple's copy (the 8-byte
/// atomic units written and read one by one), so the gain is gone at a
/// few hundred bytes per hop.
pub const LL_MAX_BYTES: usize = 1 << 10;

/// The protocol of `call` on a communicator of `ranks` ranks: `forced`
/// (`RINGCC_PROTO`, NCCL's `NCCL_PROTO`) when set, else LL up to
/// [`LL_MAX_BYTES`] of the larger buffer, else Simple. LL128 runs only
/// when forced: on a CPU it moves no more bytes per second than Simple.
pub fn choose_protocol(call: &Call, ranks: u32, forced: Option<Protocol>) -> Protocol {
    if let Some(p) = forced {
        return p;
    }
    let (i, o) = call.buffer_bytes(ranks);
    if i.max(o) <= LL_MAX_BYTES {
        Protocol::Ll
    } else {
        Protocol::Simple
    }
}

/// Parses `RINGCC_PROTO`'s value: one protocol name, any case (`LL`,
/// `ll128`, `Simple`); empty means none forced.
pub fn parse_forced(value: &str) -> Result<Option<Protocol>, String> {
    if value.trim().is_empty() {
        return Ok(None);
    }
    Protocol::parse(value)
        .map(Some)
        .ok_or_else(|| format!("{value:?} is not a protocol (LL, LL128, Simple)"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringcc_core::{DataType, ReduceOp};

    #[test]
    fn small_calls_take_ll_large_ones_simple_and_forcing_wins() {
        let small = Call::all_reduce(2, DataType::F32, ReduceOp::Sum);
        let big = Call::all_reduce(1 << 20, DataType::F32, ReduceOp::Sum);
        assert_eq!(choose_protocol(&small, 4, None), Protocol::Ll);
        assert_eq!(choose_protocol(&big, 4, None), Protocol::Simple);
        // AllGather's output is the larger buffer: ranks count.
        let ag = Call::all_gather(64, DataType::F32);
        assert_eq!(choose_protocol(&ag, 2, None), Protocol::Ll);
        assert_eq!(choose_protocol(&ag, 8, None), Protocol::Simple);
        for p in Protocol::ALL {
            assert_eq!(choose_protocol(&big, 2, Some(p)), p);
        }
        assert_eq!(parse_forced("ll128"), Ok(Some(Protocol::Ll128)));
        assert_eq!(parse_forced(" "), Ok(None));
        assert!(parse_forced("LL256").is_err());
    }
}
