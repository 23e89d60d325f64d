//! CUDA C++ of the device loop: one persistent kernel per rank, one block
//! per channel, that walks the whole plan on the device (the formula of
//! [`plan_source`](mod@super::plan_source)), waits on the FIFO's `tail` and
//! `head` counters in memory, and carries out every slice with the fused
//! kernels' bodies. See [`crate::device_loop`] for the design; this file
//! only writes the source.
//!
//! # Memory ordering (the core FIFO's: release on publish, acquire on wait)
//!
//! Only thread 0 of a block touches the counters:
//! - **wait**: it polls with `ld.acquire.sys` until the counter is high
//!   enough, then `__syncthreads()`; the acquire synchronizes with the
//!   peer's release, and the barrier orders it before every thread's loads
//!   of the slot (NCCL's `waitPeer` + barrier).
//! - **publish**: every thread stores its part of the slice, then
//!   `__syncthreads()`, then thread 0 issues `fence.acq_rel.sys` and a
//!   `st.relaxed.sys` of the new counter — the release pattern of the PTX
//!   memory model, exactly NCCL's `postPeer` (`fence_acq_rel_sys` +
//!   `st_relaxed_sys_global`). `.sys` scope because the peer may be another
//!   GPU (peer access) and the abort word is host memory.
//! - the same for credit: the `head` is published after the slot's reads,
//!   so the predecessor's next write of that slot cannot overtake them.
//!
//! Under [`HOST_EMULATION_DEFINE`](super::HOST_EMULATION_DEFINE) the same
//! source is host C++: the counters are `__atomic` loads (acquire) and
//! stores (release) — the core's `StepCounter` — the clock is
//! `CLOCK_MONOTONIC`, a block is as many host threads as the caller starts
//! with a generation barrier for `__syncthreads()`, and the block's shared
//! words live in memory the caller passes.

use std::fmt::Write as _;

use super::plan_source::{plan_source, prim_macro};
use super::source::{body_symbol, common_source};
use super::{ModuleKey, BLOCK_THREADS, PRIMITIVES};
use crate::device_loop::abi;

/// The host-emulation layer, the codes, and the structures the host shares
/// with the loop (mirrored by [`crate::device_loop::abi`]).
pub fn loop_types_source() -> String {
    let mut s = String::with_capacity(8 * 1024);
    for (name, v) in [
        ("RC_ST_IDLE", abi::STATUS_IDLE),
        ("RC_ST_DONE", abi::STATUS_DONE),
        ("RC_ST_TIMEOUT", abi::STATUS_TIMEOUT),
        ("RC_ST_ABORTED", abi::STATUS_ABORTED),
        ("RC_ST_PEER_FAILED", abi::STATUS_PEER_FAILED),
        ("RC_ST_MISMATCH", abi::STATUS_MISMATCH),
        ("RC_ST_PROTOCOL", abi::STATUS_PROTOCOL),
        ("RC_W_DATA", abi::WAIT_DATA),
        ("RC_W_CREDIT", abi::WAIT_CREDIT),
        ("RC_W_FINISH", abi::WAIT_FINISH),
        ("RC_ABORT_HOST", abi::ABORT_HOST),
        ("RC_ABORT_PEER", abi::ABORT_PEER),
    ] {
        let _ = writeln!(s, "#define {name} {v}ull");
    }
    s.push_str(LOOP_TYPES);
    s
}

const LOOP_TYPES: &str = r#"
#if defined(RINGCC_HOST_EMULATION)
#include <time.h>
#include <sched.h>
/* A block's shared words; the barrier's count and generation. */
struct rc_block_shared { unsigned int bar_count; unsigned int bar_gen; int ok; int go; };
#define RC_LOOP_KERNEL(name) extern "C" void name
#define RC_LOOP_PARAMS , unsigned int rc_block, unsigned int rc_thread, unsigned int rc_threads, struct rc_block_shared* rc_sh
#define RC_LOOP_SETUP
RC_FN rc_u64 rc_acquire(const rc_u64* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
RC_FN void rc_release(rc_u64* p, rc_u64 v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
RC_FN rc_u64 rc_relaxed(const rc_u64* p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
RC_FN void rc_put(rc_u64* p, rc_u64 v) { __atomic_store_n(p, v, __ATOMIC_RELAXED); }
RC_FN rc_u64 rc_now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (rc_u64)t.tv_sec * 1000000000ull + (rc_u64)t.tv_nsec;
}
RC_FN void rc_pause(void) { sched_yield(); }
/* __syncthreads(): a generation barrier over the block's host threads
   (acquire-release, so it orders their plain loads and stores too). */
RC_FN void rc_sync(struct rc_block_shared* s, unsigned int n) {
    if (n <= 1u) return;
    const unsigned int gen = __atomic_load_n(&s->bar_gen, __ATOMIC_ACQUIRE);
    if (__atomic_add_fetch(&s->bar_count, 1u, __ATOMIC_ACQ_REL) == n) {
        __atomic_store_n(&s->bar_count, 0u, __ATOMIC_RELAXED);
        __atomic_store_n(&s->bar_gen, gen + 1u, __ATOMIC_RELEASE);
    } else {
        while (__atomic_load_n(&s->bar_gen, __ATOMIC_ACQUIRE) == gen) sched_yield();
    }
}
#define RC_SYNC() rc_sync(rc_sh, rc_threads)
#else
struct rc_block_shared { int ok; int go; };
#define RC_LOOP_KERNEL(name) extern "C" __global__ void __launch_bounds__(RC_LOOP_THREADS, 1) name
#define RC_LOOP_PARAMS
#define RC_LOOP_SETUP \
    __shared__ struct rc_block_shared rc_sh_store; \
    struct rc_block_shared* const rc_sh = &rc_sh_store; \
    const unsigned int rc_block = blockIdx.x, rc_thread = threadIdx.x, rc_threads = blockDim.x;
RC_FN rc_u64 rc_acquire(const rc_u64* p) {
    rc_u64 v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
RC_FN void rc_release(rc_u64* p, rc_u64 v) {
    asm volatile("fence.acq_rel.sys;\n\tst.relaxed.sys.global.u64 [%0], %1;" :: "l"(p), "l"(v) : "memory");
}
RC_FN rc_u64 rc_relaxed(const rc_u64* p) {
    rc_u64 v;
    asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
RC_FN void rc_put(rc_u64* p, rc_u64 v) {
    asm volatile("st.relaxed.sys.global.u64 [%0], %1;" :: "l"(p), "l"(v) : "memory");
}
RC_FN rc_u64 rc_now_ns(void) {
    rc_u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
RC_FN void rc_pause(void) { }
#define RC_SYNC() __syncthreads()
#endif

/* One channel of one rank: where its counters, call words and FIFOs are.
   "ours" lives in this rank's memory, the others in a neighbour's. */
struct rc_chan {
    rc_u64* recv_tail;         /* ours: the predecessor publishes its tail here */
    rc_u64* recv_head;         /* the predecessor's: we publish our head (credit) */
    rc_u64* send_head;         /* ours: the successor publishes its head here */
    rc_u64* send_tail;         /* the successor's: we publish our tail */
    rc_u64* recv_call;         /* ours: the predecessor's call words */
    rc_u64* send_call;         /* the successor's: our call words */
    rc_u64* state;             /* ours: recv_next, send_next from call to call */
    unsigned char* recv_fifo;  /* ours: STEPS slots */
    unsigned char* send_fifo;  /* the successor's */
    rc_u64 slot_bytes;
};

/* What a block says when it ends (host-visible memory). */
struct rc_status {
    rc_u64 code;        /* RC_ST_* */
    rc_u64 seq;         /* the call it ran */
    rc_u64 waiting;     /* RC_W_*: what a failed wait waited for */
    rc_u64 seen;        /* the counter's value last seen */
    rc_u64 need;        /* the value needed */
    rc_u64 loop_index;
    rc_u64 step_index;
    rc_u64 slice;
    rc_u64 got_seq;     /* RC_ST_MISMATCH: the predecessor's call words */
    rc_u64 got_count;
    rc_u64 got_desc;
    rc_u64 recv_next;
    rc_u64 send_next;
    rc_u64 own_count;   /* RC_ST_MISMATCH: this rank's */
    rc_u64 own_desc;
    rc_u64 spare;
};

/* One rank's launch: its buffers, its channels, the call. */
struct rc_loop_args {
    const void* input;
    void* output;
    const struct rc_chan* chans;   /* `channels` entries */
    struct rc_status* status;      /* `channels` entries */
    rc_u64* abort_flag;            /* 0, or RC_ABORT_HOST / RC_ABORT_PEER */
    const rc_u32* ring;            /* rank at each ring index; 0: in order */
    rc_u64 seq;
    rc_u64 count;
    rc_u64 chunk_elems;
    rc_u64 slice_elems;
    rc_u64 timeout_ns;             /* the longest a wait may see nothing */
    rc_u64 desc;                   /* collective | dtype << 8 | op << 16 | root << 32 */
    rc_u32 collective;
    rc_u32 nranks;
    rc_u32 channels;
    rc_u32 ring_index;
    rc_u32 root_index;
    rc_u32 slots_per_slice;
};

/* Waits (thread 0) until *p >= need: 0, or a failure code. A value above
   `limit` breaks the protocol. Bounded: the abort word and the clock are
   checked every 256 polls; `timeout_ns` without the counter reaching `need`
   is a timeout. `seen` caches the last value (counters only grow). */
RC_FN rc_u64 rc_wait(const rc_u64* p, rc_u64 need, rc_u64 limit, rc_u64* seen, const struct rc_loop_args* a) {
    rc_u64 v = *seen;
    if (v >= need) return 0ull;
    const rc_u64 start = rc_now_ns();
    for (unsigned int spins = 1u;; ++spins) {
        v = rc_acquire(p);
        *seen = v;
        if (v > limit) return RC_ST_PROTOCOL;
        if (v >= need) return 0ull;
        if ((spins & 255u) == 0u) {
            const rc_u64 ab = rc_relaxed(a->abort_flag);
            if (ab != 0ull) return ab == RC_ABORT_HOST ? RC_ST_ABORTED : RC_ST_PEER_FAILED;
            if (rc_now_ns() - start > a->timeout_ns) return RC_ST_TIMEOUT;
        }
        rc_pause();
    }
}

/* Records a failure (thread 0) and, unless it is an abort itself, raises
   the abort word so every other block stops at once. */
RC_FN void rc_fail(const struct rc_loop_args* a, struct rc_status* st, rc_u64 code, rc_u64 waiting, rc_u64 seen, rc_u64 need, const struct rc_exec* e, rc_u64 recv_next, rc_u64 send_next) {
    rc_put(&st->seq, a->seq);
    rc_put(&st->waiting, waiting);
    rc_put(&st->seen, seen);
    rc_put(&st->need, need);
    rc_put(&st->loop_index, e != 0 ? e->loop_index : 0ull);
    rc_put(&st->step_index, e != 0 ? (rc_u64)e->step_index : 0ull);
    rc_put(&st->slice, e != 0 ? e->slice : 0ull);
    rc_put(&st->recv_next, recv_next);
    rc_put(&st->send_next, send_next);
    rc_put(&st->code, code);
    if (code != RC_ST_ABORTED && code != RC_ST_PEER_FAILED && rc_relaxed(a->abort_flag) == 0ull)
        rc_put(a->abort_flag, RC_ABORT_PEER);
}
"#;

/// The kernel's symbol: `ringcc_loop_<type>_<op>`.
pub fn loop_symbol(module: ModuleKey) -> String {
    format!("ringcc_loop_{}_{}", module.dtype.name(), module.op.name())
}

/// Threads per block of the device loop (its `__launch_bounds__`).
pub const LOOP_THREADS: u32 = BLOCK_THREADS;

const KERNEL_HEAD: &str = r#"
RC_LOOP_KERNEL(RC_LOOP_NAME)(struct rc_loop_args a RC_LOOP_PARAMS) {
    RC_LOOP_SETUP
    if (rc_block >= a.channels) return;
    const struct rc_chan ch = a.chans[rc_block];
    struct rc_status* const st = a.status + rc_block;
    const rc_u64 sps = (rc_u64)a.slots_per_slice;
    /* Thread 0 alone touches counters and status; rc_sh->go (at the
       start) and rc_sh->ok (per slice) tell the block whether to go on,
       after a barrier. Two words: a thread still reading `go` cannot see
       the first slice's `ok`. */
    rc_u64 recv_start = 0ull, send_start = 0ull;
    if (rc_thread == 0u) {
        int ok = 1;
        if (rc_relaxed(&st->code) >= RC_ST_TIMEOUT) {
            ok = 0; /* an earlier call failed here: its record stays */
        } else {
            const rc_u64 ab = rc_relaxed(a.abort_flag);
            if (ab != 0ull) {
                rc_fail(&a, st, ab == RC_ABORT_HOST ? RC_ST_ABORTED : RC_ST_PEER_FAILED, 0ull, 0ull, 0ull, 0, ch.state[0], ch.state[1]);
                ok = 0;
            }
        }
        rc_sh->go = ok;
    }
    RC_SYNC();
    if (!rc_sh->go) return;
    recv_start = ch.state[0];
    send_start = ch.state[1];
    struct rc_plan p;
    p.count = a.count;
    p.chunk_elems = a.chunk_elems;
    p.align_elems = RC_CHUNK_ALIGN / (rc_u64)sizeof(T);
    p.slice_elems = a.slice_elems;
    p.ring = a.ring;
    p.collective = a.collective;
    p.nranks = a.nranks;
    p.channels = a.channels;
    p.channel = rc_block;
    p.ring_index = a.ring_index;
    p.root_index = a.root_index;
    p.elem_bytes = (rc_u32)sizeof(T);
    p.slots_per_slice = a.slots_per_slice;
    struct rc_cursor cur;
    struct rc_exec e = {};
    rc_cursor_init(&cur, &p, recv_start, send_start);
    rc_u64 tail_seen = 0ull, head_seen = 0ull;
    while (rc_cursor_next(&cur, &e)) {
        const rc_u32 prim = e.primitive;
        if (rc_thread == 0u) {
            rc_u64 code = 0ull, waiting = 0ull, need = 0ull, seen = 0ull;
            if (prim & RC_P_RECV) {
                need = e.recv_step + sps;
                code = rc_wait(ch.recv_tail, need, e.recv_step + RC_STEPS, &tail_seen, &a);
                waiting = RC_W_DATA;
                seen = tail_seen;
                if (code == 0ull && e.recv_step == recv_start) {
                    /* The call check: the predecessor's call words, written
                       before the tail we just acquired. */
                    const rc_u64 gs = rc_relaxed(ch.recv_call + 0), gc = rc_relaxed(ch.recv_call + 1), gd = rc_relaxed(ch.recv_call + 2);
                    if (gs != a.seq || gc != a.count || gd != a.desc) {
                        rc_put(&st->got_seq, gs);
                        rc_put(&st->got_count, gc);
                        rc_put(&st->got_desc, gd);
                        rc_put(&st->own_count, a.count);
                        rc_put(&st->own_desc, a.desc);
                        code = RC_ST_MISMATCH;
                    }
                }
            }
            if (code == 0ull && (prim & RC_P_SEND)) {
                /* Room for the slice: head + STEPS >= send_step + sps. */
                need = e.send_step + sps > RC_STEPS ? e.send_step + sps - RC_STEPS : 0ull;
                code = rc_wait(ch.send_head, need, e.send_step, &head_seen, &a);
                waiting = RC_W_CREDIT;
                seen = head_seen;
                if (code == 0ull && e.send_step == send_start) {
                    rc_put(ch.send_call + 0, a.seq);
                    rc_put(ch.send_call + 1, a.count);
                    rc_put(ch.send_call + 2, a.desc);
                }
            }
            if (code != 0ull) rc_fail(&a, st, code, waiting, seen, need, &e, e.recv_step, e.send_step);
            rc_sh->ok = code == 0ull;
        }
        RC_SYNC();
        if (!rc_sh->ok) return;
        const T* const recv = (prim & RC_P_RECV) ? (const T*)(ch.recv_fifo + (e.recv_step % RC_STEPS) * ch.slot_bytes) : (const T*)0;
        const T* const in = ((prim & RC_P_REDUCE) || !(prim & RC_P_RECV)) ? (const T*)a.input + e.input_offset : (const T*)0;
        T* const out = (prim & RC_P_COPY) ? (T*)a.output + e.output_offset : (T*)0;
        T* const send = (prim & RC_P_SEND) ? (T*)(ch.send_fifo + (e.send_step % RC_STEPS) * ch.slot_bytes) : (T*)0;
        switch (prim) {
"#;

const KERNEL_TAIL: &str = r#"        default: break;
        }
        RC_SYNC();
        if (rc_thread == 0u) {
            if (prim & RC_P_SEND) rc_release(ch.send_tail, e.send_step + sps);
            if (prim & RC_P_RECV) rc_release(ch.recv_head, e.recv_step + sps);
        }
    }
    if (rc_thread == 0u) {
        /* Finished when every slice sent was consumed (Machine: Done). */
        const rc_u64 code = cur.send_next > send_start
            ? rc_wait(ch.send_head, cur.send_next, cur.send_next, &head_seen, &a) : 0ull;
        if (code != 0ull) {
            rc_fail(&a, st, code, RC_W_FINISH, head_seen, cur.send_next, &e, cur.recv_next, cur.send_next);
        } else {
            ch.state[0] = cur.recv_next;
            ch.state[1] = cur.send_next;
            rc_put(&st->seq, a.seq);
            rc_put(&st->recv_next, cur.recv_next);
            rc_put(&st->send_next, cur.send_next);
            rc_put(&st->code, RC_ST_DONE);
        }
    }
}
"#;

/// The device loop of one (type, op): the fused kernels' bodies, the plan
/// formula, the loop's types, and the kernel [`loop_symbol`].
pub fn loop_source(module: ModuleKey) -> String {
    let mut s = String::with_capacity(48 * 1024);
    let _ = writeln!(
        s,
        "/* ringcc device loop, module {}: generated, do not edit. */",
        module.name()
    );
    common_source(module, &mut s);
    s.push_str(&plan_source());
    let _ = writeln!(s, "#define RC_LOOP_THREADS {LOOP_THREADS}");
    s.push_str(&loop_types_source());
    let _ = writeln!(s, "#define RC_LOOP_NAME {}", loop_symbol(module));
    s.push_str(KERNEL_HEAD);
    for p in PRIMITIVES {
        if let Some(body) = body_symbol(p) {
            let _ = writeln!(
                s,
                "        case {}: {body}(recv, in, out, send, e.count, a.nranks, rc_thread, rc_threads); break;",
                prim_macro(p)
            );
        }
    }
    s.push_str(KERNEL_TAIL);
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringcc_core::{DataType, ReduceOp};

    #[test]
    fn every_module_has_one_loop_kernel_dispatching_every_primitive() {
        for m in ModuleKey::all() {
            let src = loop_source(m);
            assert_eq!(src.matches("RC_LOOP_KERNEL(RC_LOOP_NAME)").count(), 1);
            assert!(src.contains(&format!("#define RC_LOOP_NAME {}", loop_symbol(m))));
            for p in PRIMITIVES {
                let case = format!("case {}: {}(", prim_macro(p), body_symbol(p).unwrap());
                assert_eq!(src.matches(&case).count(), 1, "{}: {case}", m.name());
            }
        }
    }

    #[test]
    fn counters_are_waited_with_acquire_and_published_with_release() {
        let src = loop_source(ModuleKey {
            dtype: DataType::F32,
            op: ReduceOp::Sum,
        });
        assert!(src.contains("ld.acquire.sys.global.u64"));
        assert!(src.contains("fence.acq_rel.sys;\\n\\tst.relaxed.sys.global.u64"));
        assert!(src.contains("__atomic_load_n(p, __ATOMIC_ACQUIRE)"));
        assert!(src.contains("__atomic_store_n(p, v, __ATOMIC_RELEASE)"));
        // Both counters are published only through rc_release.
        assert!(src.contains("rc_release(ch.send_tail, e.send_step + sps)"));
        assert!(src.contains("rc_release(ch.recv_head, e.recv_step + sps)"));
        // Every wait is rc_wait, which is bounded by the abort word and the clock.
        assert_eq!(src.matches("rc_wait(ch.").count(), 3);
        assert!(src.contains("if (rc_now_ns() - start > a->timeout_ns) return RC_ST_TIMEOUT;"));
    }

    #[test]
    fn status_codes_come_from_the_abi() {
        let src = loop_types_source();
        assert!(src.contains(&format!("#define RC_ST_TIMEOUT {}ull", abi::STATUS_TIMEOUT)));
        assert!(src.contains(&format!("#define RC_ABORT_HOST {}ull", abi::ABORT_HOST)));
    }
}
