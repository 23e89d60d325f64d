//! Slice posting on arbitrary spans, geometries and advertised capacities:
//! either a typed error, or requests that stay inside what the receiver
//! registered and carry the slice's bytes exactly once.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ringcc_core::fifo::FifoGeometry;
use ringcc_core::prim::SlotSpan;
use ringcc_core::protocol::post::{LocalBuf, RemoteFifo, RemoteHeader, SliceWrites};
use ringcc_core::wire::{Lkey, Rkey, SendFlags, WrOpcode};
use ringcc_core::{CallDesc, ChunkId, Collective, DataType, Exec, Primitive, ReduceOp};

fuzz_target!(
    |input: (u64, u64, u64, u8, u16, u8, u64, u64, u64, bool, u32)| {
        let (
            step,
            slots,
            count,
            dtype,
            slot_units,
            sps,
            fifo_addr,
            capacity,
            mailbox_cap,
            header,
            max_write,
        ) = input;
        let Ok(g) = FifoGeometry::new(u64::from(slot_units) * 16, u64::from(sps)) else {
            return;
        };
        let dtype = DataType::ALL[usize::from(dtype) % DataType::ALL.len()];
        let desc = CallDesc::new(0, Collective::AllReduce, 1, dtype, ReduceOp::Sum);
        let exec = Exec {
            primitive: Primitive::SEND,
            chunk: ChunkId(0),
            loop_index: 0,
            step_index: 0,
            slice: 0,
            input_offset: 0,
            output_offset: 0,
            count,
            recv: None,
            send: Some(SlotSpan { step, slots }),
            header: header.then_some(desc),
        };
        let fifo = RemoteFifo {
            addr: fifo_addr,
            rkey: Rkey(1),
            capacity,
        };
        let mailbox = RemoteHeader {
            addr: 0x10,
            rkey: Rkey(2),
            capacity: mailbox_cap,
        };
        let local = LocalBuf {
            addr: 0x1000,
            lkey: Lkey(3),
        };
        let Ok(w) = SliceWrites::<1>::new(&exec, &g, dtype, local, &fifo, &mailbox, 0) else {
            return;
        };
        let len = w.data_len();
        let offset = w.remote_offset();
        assert!(offset + len <= capacity);
        let Ok(w) = w.with_max_write(max_write.max(1) % (1 << 31) + 1) else {
            return;
        };
        let mut at = fifo_addr + offset;
        let mut imm_seen = false;
        for wr in w {
            assert_eq!(wr.validate(), Ok(()));
            if wr.flags.contains(SendFlags::INLINE) {
                assert!(mailbox_cap >= 32);
                continue;
            }
            assert!(!imm_seen);
            let r = wr.remote.expect("a write has a remote address");
            assert_eq!(r.addr, at);
            at += wr.len();
            assert!(at - fifo_addr <= capacity);
            imm_seen = wr.opcode == WrOpcode::RdmaWriteWithImm;
        }
        assert!(imm_seen);
        assert_eq!(at, fifo_addr + offset + len);
    }
);
