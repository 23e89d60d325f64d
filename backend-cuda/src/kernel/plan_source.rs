//! The plan's step formula as C++ for the device loop: what
//! [`ringcc_core::plan`] computes, per step in O(1), and how the core's
//! `prim::Machine` cuts a step into slices and moves the FIFO counters.
//!
//! - `rc_plan_step(plan, loop, s)`: the step `s` of loop `loop` of one
//!   (channel, rank) — primitive, chunk, offsets, count — in closed form
//!   (the core's iterator computes the same values incrementally).
//! - `rc_cursor_*`: the walk the device loop takes — every slice of every
//!   step in order, with the FIFO step each slice receives from and sends
//!   to. The loop-level values (the divisions) are computed once per loop.
//!
//! The source needs `RC_FN` from the fused kernels' prelude and nothing
//! else; the constants (primitive bits, collective codes, `STEPS`, the
//! chunk alignment) are written from the core's own values. Under the host
//! emulation, [`plan_test_source`] adds `extern "C"` entry points that the
//! tests call to compare every answer with the core's `Plan` and `Machine`.

use std::fmt::Write as _;

use ringcc_core::fifo::STEPS;
use ringcc_core::plan::CHUNK_ALIGN;
use ringcc_core::{Collective, Primitive, Rank};

use super::PRIMITIVES;

/// The C macro name of a primitive's bits (`RC_PRIM_recvReduceSend`).
pub(crate) fn prim_macro(p: Primitive) -> String {
    format!("RC_PRIM_{}", p.name())
}

/// The constants the formula and the loop share with the core.
fn constants(s: &mut String) {
    let _ = writeln!(s, "typedef unsigned long long rc_u64;");
    let _ = writeln!(s, "typedef unsigned int rc_u32;");
    let _ = writeln!(s, "#define RC_U64_MAX 0xffffffffffffffffull");
    let _ = writeln!(s, "#define RC_STEPS {STEPS}ull");
    let _ = writeln!(s, "#define RC_CHUNK_ALIGN {CHUNK_ALIGN}ull");
    for (name, bit) in [
        ("RECV", Primitive::RECV),
        ("REDUCE", Primitive::REDUCE),
        ("COPY", Primitive::COPY),
        ("SEND", Primitive::SEND),
    ] {
        let _ = writeln!(s, "#define RC_P_{name} {}u", bit.bits());
    }
    for p in PRIMITIVES {
        let _ = writeln!(s, "#define {} {}u", prim_macro(p), p.bits());
    }
    let r = Rank(0);
    for (name, c) in [
        ("ALLREDUCE", Collective::AllReduce),
        ("REDUCESCATTER", Collective::ReduceScatter),
        ("ALLGATHER", Collective::AllGather),
        ("BROADCAST", Collective::Broadcast { root: r }),
        ("REDUCE", Collective::Reduce { root: r }),
    ] {
        let _ = writeln!(s, "#define RC_C_{name} {}u", c.code());
    }
}

const FORMULA: &str = r#"
/* One (call, channel, rank): everything the formula needs. */
struct rc_plan {
    rc_u64 count;          /* the user's element count (per block for RS/AG) */
    rc_u64 chunk_elems;    /* chunk size in elements */
    rc_u64 align_elems;    /* RC_CHUNK_ALIGN in elements */
    rc_u64 slice_elems;    /* FIFO slice in elements */
    const rc_u32* ring;    /* rank at each ring index; 0: in rank order */
    rc_u32 collective;     /* RC_C_* */
    rc_u32 nranks;
    rc_u32 channels;
    rc_u32 channel;
    rc_u32 ring_index;     /* this rank's position on the ring */
    rc_u32 root_index;     /* the root's position (rooted collectives) */
    rc_u32 elem_bytes;
    rc_u32 slots_per_slice;
};

/* One step, as the core's plan::Step. */
struct rc_step {
    rc_u64 loop_index;
    rc_u64 input_offset;
    rc_u64 output_offset;
    rc_u64 count;
    rc_u32 index;
    rc_u32 chunk;
    rc_u32 primitive;
    rc_u32 pad;
};

/* One slice, as the core's prim::Exec (FIFO steps as counter values). */
struct rc_exec {
    rc_u64 loop_index;
    rc_u64 slice;
    rc_u64 input_offset;
    rc_u64 output_offset;
    rc_u64 count;
    rc_u64 recv_step;      /* RECV: the first FIFO step of the slice */
    rc_u64 send_step;      /* SEND: the first FIFO step of the slice */
    rc_u32 step_index;
    rc_u32 primitive;
};

/* One loop's values: the channel's range, the loop's start and chunk. */
struct rc_loopv {
    rc_u64 start;
    rc_u64 end;
    rc_u64 ls;
    rc_u64 lc;
};

/* The walk of one (channel, rank) through a call, slice by slice. */
struct rc_cursor {
    struct rc_plan p;
    struct rc_loopv L;
    struct rc_step step;
    rc_u64 loops;
    rc_u64 loop;
    rc_u64 slice_bytes;
    rc_u64 recv_next;
    rc_u64 send_next;
    rc_u32 spl;
    rc_u32 s;
    rc_u32 slices;
    rc_u32 slice;
    rc_u32 chain_pos;
    rc_u32 pad;
};

/* Saturating arithmetic, as the core's. */
RC_FN rc_u64 rc_min(rc_u64 a, rc_u64 b) { return a < b ? a : b; }
RC_FN rc_u64 rc_sat_add(rc_u64 a, rc_u64 b) { const rc_u64 s = a + b; return s < a ? RC_U64_MAX : s; }
RC_FN rc_u64 rc_sat_mul(rc_u64 a, rc_u64 b) {
    if (a == 0ull || b == 0ull) return 0ull;
    return a > RC_U64_MAX / b ? RC_U64_MAX : a * b;
}
RC_FN rc_u64 rc_sat_sub(rc_u64 a, rc_u64 b) { return a > b ? a - b : 0ull; }
/* ceil(a / b); 0 when b is 0 (math::div_up). */
RC_FN rc_u64 rc_div_up(rc_u64 a, rc_u64 b) {
    if (b == 0ull) return 0ull;
    const rc_u64 q = a / b;
    return a - q * b == 0ull ? q : q + 1ull;
}
/* a rounded up to a multiple of b, saturating (math::align_up). */
RC_FN rc_u64 rc_align_up(rc_u64 a, rc_u64 b) {
    if (b == 0ull) return a;
    const rc_u64 q = rc_div_up(a, b);
    if (q != 0ull && q > RC_U64_MAX / b) return (RC_U64_MAX / b) * b;
    return q * b;
}

/* Plan::channel_range. */
RC_FN void rc_channel_range(const struct rc_plan* p, rc_u64* start, rc_u64* end) {
    const rc_u64 per = rc_align_up(rc_div_up(p->count, (rc_u64)p->channels), p->align_elems);
    const rc_u64 c = (rc_u64)p->channel;
    *start = rc_min(rc_sat_mul(c, per), p->count);
    *end = rc_min(rc_sat_mul(c + 1ull, per), p->count);
}

/* Elements one loop spans before shrinking (Plan::loop_span). */
RC_FN rc_u64 rc_loop_span(const struct rc_plan* p) {
    return p->collective == RC_C_ALLREDUCE ? rc_sat_mul(p->chunk_elems, (rc_u64)p->nranks) : p->chunk_elems;
}

/* Plan::loops: at least 1. */
RC_FN rc_u64 rc_loops(const struct rc_plan* p) {
    rc_u64 start, end;
    rc_channel_range(p, &start, &end);
    const rc_u64 l = rc_div_up(end - start, rc_loop_span(p));
    return l == 0ull ? 1ull : l;
}

/* Plan::steps_per_loop. */
RC_FN rc_u32 rc_steps_per_loop(const struct rc_plan* p) {
    if (p->nranks == 1u) return 1u;
    switch (p->collective) {
    case RC_C_ALLREDUCE: return p->nranks * 2u - 1u;
    case RC_C_REDUCESCATTER:
    case RC_C_ALLGATHER: return p->nranks;
    default: return 1u;
    }
}

/* Position along a rooted collective's chain (Plan::chain_pos). */
RC_FN rc_u32 rc_chain_pos(const struct rc_plan* p) {
    const rc_u32 n = p->nranks;
    if (n == 0u) return 0u;
    const rc_u32 from_root = (p->ring_index + n - p->root_index) % n;
    if (p->collective == RC_C_BROADCAST) return from_root;
    if (p->collective == RC_C_REDUCE) return (from_root + n - 1u) % n;
    return 0u;
}

/* The chunk of step s (Plan::chunk_at): (r - s - 1) mod n for AllReduce
   and ReduceScatter, (r - s) mod n for AllGather, 0 for the chains. */
RC_FN rc_u32 rc_chunk_at(const struct rc_plan* p, rc_u32 s) {
    const rc_u64 n = (rc_u64)p->nranks;
    rc_u64 k;
    if (p->nranks <= 1u) return 0u;
    switch (p->collective) {
    case RC_C_ALLREDUCE:
    case RC_C_REDUCESCATTER: k = 1ull; break;
    case RC_C_ALLGATHER: k = 0ull; break;
    default: return 0u;
    }
    return (rc_u32)(((rc_u64)p->ring_index + 3ull * n - (rc_u64)s - k) % n);
}

/* The primitive of step s (Plan::primitive_at). */
RC_FN rc_u32 rc_primitive_at(const struct rc_plan* p, rc_u32 s, rc_u32 chain_pos) {
    const rc_u32 n = p->nranks;
    if (n <= 1u) return RC_PRIM_copy;
    const rc_u32 last = n - 1u;
    switch (p->collective) {
    case RC_C_ALLREDUCE:
        if (s == 0u) return RC_PRIM_send;
        if (s < last) return RC_PRIM_recvReduceSend;
        if (s == last) return RC_PRIM_recvReduceCopySend;
        if (s < 2u * n - 2u) return RC_PRIM_recvCopySend;
        return RC_PRIM_recv;
    case RC_C_REDUCESCATTER:
        if (s == 0u) return RC_PRIM_send;
        if (s < last) return RC_PRIM_recvReduceSend;
        return RC_PRIM_recvReduceCopy;
    case RC_C_ALLGATHER:
        if (s == 0u) return RC_PRIM_copySend;
        if (s < last) return RC_PRIM_recvCopySend;
        return RC_PRIM_recv;
    case RC_C_BROADCAST:
        if (chain_pos == 0u) return RC_PRIM_copySend;
        if (chain_pos < last) return RC_PRIM_recvCopySend;
        return RC_PRIM_recv;
    default:
        if (chain_pos == 0u) return RC_PRIM_send;
        if (chain_pos < last) return RC_PRIM_recvReduceSend;
        return RC_PRIM_recvReduceCopy;
    }
}

/* The values of loop `loop` (Steps::enter_loop): where it starts, and its
   chunk, which AllReduce shrinks in the last loop to an aligned n-th of
   the rest. The divisions of a step live here, once per loop. */
RC_FN void rc_loop_values(const struct rc_plan* p, rc_u64 loop, struct rc_loopv* L) {
    rc_channel_range(p, &L->start, &L->end);
    L->ls = rc_min(rc_sat_add(L->start, rc_sat_mul(loop, rc_loop_span(p))), L->end);
    const rc_u64 rem = L->end - L->ls;
    if (p->collective == RC_C_ALLREDUCE)
        L->lc = rc_min(p->chunk_elems, rc_align_up(rc_div_up(rem, (rc_u64)p->nranks), p->align_elems));
    else
        L->lc = rc_min(p->chunk_elems, rem);
}

/* Step s of a loop whose values are L: O(1), no division but mod n. */
RC_FN void rc_step_of(const struct rc_plan* p, const struct rc_loopv* L, rc_u64 loop, rc_u32 s, rc_u32 chain_pos, struct rc_step* out) {
    const rc_u32 chunk = rc_chunk_at(p, s);
    const rc_u64 ls = L->ls, lc = L->lc, end = L->end;
    out->loop_index = loop;
    out->index = s;
    out->chunk = chunk;
    out->pad = 0u;
    out->primitive = rc_primitive_at(p, s, chain_pos);
    if (p->nranks <= 1u) {
        /* One rank: a copy; AllReduce's aligned chunk may overhang. */
        out->input_offset = ls;
        out->output_offset = ls;
        out->count = rc_min(lc, end - ls);
    } else if (p->collective == RC_C_ALLREDUCE) {
        const rc_u64 cs = rc_min(rc_sat_add(ls, rc_sat_mul((rc_u64)chunk, lc)), end);
        const rc_u64 ce = rc_min(rc_sat_add(cs, lc), end);
        out->input_offset = cs;
        out->output_offset = cs;
        out->count = ce - cs;
    } else if (p->collective == RC_C_REDUCESCATTER || p->collective == RC_C_ALLGATHER) {
        const rc_u32 rank = p->ring != 0 ? p->ring[chunk] : chunk;
        const rc_u64 block = rc_sat_add(rc_sat_mul((rc_u64)rank, p->count), ls);
        out->input_offset = p->collective == RC_C_REDUCESCATTER ? block : ls;
        out->output_offset = p->collective == RC_C_REDUCESCATTER ? ls : block;
        out->count = lc;
    } else {
        out->input_offset = ls;
        out->output_offset = ls;
        out->count = lc;
    }
}

/* The whole formula: step s of loop `loop` of this (channel, rank). */
RC_FN void rc_plan_step(const struct rc_plan* p, rc_u64 loop, rc_u32 s, struct rc_step* out) {
    struct rc_loopv L;
    rc_loop_values(p, loop, &L);
    rc_step_of(p, &L, loop, s, rc_chain_pos(p), out);
}

/* A walk starting from the connection counters recv_next / send_next. */
RC_FN void rc_cursor_init(struct rc_cursor* c, const struct rc_plan* p, rc_u64 recv_next, rc_u64 send_next) {
    c->p = *p;
    c->loops = rc_loops(p);
    c->loop = 0ull;
    c->spl = rc_steps_per_loop(p);
    c->s = 0u;
    c->slices = 0u;
    c->slice = 0u;
    c->chain_pos = rc_chain_pos(p);
    c->pad = 0u;
    c->slice_bytes = rc_sat_mul(p->slice_elems, (rc_u64)p->elem_bytes);
    c->recv_next = recv_next;
    c->send_next = send_next;
    rc_loop_values(p, 0ull, &c->L);
}

/* The next slice (Machine::next_action / Machine::exec): 1 and `e` filled,
   or 0 at the end. A step is cut into max(1, ceil(bytes / slice)) slices;
   each slice takes slots_per_slice FIFO steps on the connections its
   primitive uses, even when it is empty. */
RC_FN int rc_cursor_next(struct rc_cursor* c, struct rc_exec* e) {
    if (c->slice >= c->slices) {
        if (c->s >= c->spl) {
            if (c->loop + 1ull >= c->loops) return 0;
            c->loop += 1ull;
            c->s = 0u;
            rc_loop_values(&c->p, c->loop, &c->L);
        }
        rc_step_of(&c->p, &c->L, c->loop, c->s, c->chain_pos, &c->step);
        c->s += 1u;
        const rc_u64 bytes = rc_sat_mul(c->step.count, (rc_u64)c->p.elem_bytes);
        const rc_u64 n = bytes <= c->slice_bytes ? 1ull : rc_div_up(bytes, c->slice_bytes);
        c->slices = n == 0ull ? 1u : (rc_u32)rc_min(n, 0xffffffffull);
        c->slice = 0u;
    }
    const rc_u64 lo = rc_min(rc_sat_mul((rc_u64)c->slice, c->p.slice_elems), c->step.count);
    const rc_u64 hi = rc_min(rc_sat_add(lo, c->p.slice_elems), c->step.count);
    const rc_u64 sps = (rc_u64)c->p.slots_per_slice;
    e->loop_index = c->step.loop_index;
    e->slice = (rc_u64)c->slice;
    e->step_index = c->step.index;
    e->primitive = c->step.primitive;
    e->input_offset = rc_sat_add(c->step.input_offset, lo);
    e->output_offset = rc_sat_add(c->step.output_offset, lo);
    e->count = hi - lo;
    e->recv_step = c->recv_next;
    e->send_step = c->send_next;
    if (c->step.primitive & RC_P_RECV) c->recv_next = rc_sat_add(c->recv_next, sps);
    if (c->step.primitive & RC_P_SEND) c->send_next = rc_sat_add(c->send_next, sps);
    c->slice += 1u;
    return 1;
}
"#;

/// The formula: constants, structures, `rc_plan_step` and the cursor.
/// Needs `RC_FN` (the prelude of [`module_source`](super::module_source)).
pub fn plan_source() -> String {
    let mut s = String::with_capacity(12 * 1024);
    s.push_str("/* ringcc plan formula: generated from ringcc_core::plan, do not edit. */\n");
    constants(&mut s);
    s.push_str(FORMULA);
    s
}

const TEST_EXPORTS: &str = r#"
#if defined(RINGCC_HOST_EMULATION)
extern "C" void rc_test_plan_step(const struct rc_plan* p, rc_u64 loop, rc_u32 s, struct rc_step* out) {
    rc_plan_step(p, loop, s, out);
}
extern "C" rc_u64 rc_test_plan_loops(const struct rc_plan* p) { return rc_loops(p); }
extern "C" rc_u32 rc_test_plan_steps_per_loop(const struct rc_plan* p) { return rc_steps_per_loop(p); }
/* The walk's first `cap` slices into `out`; returns how many there are,
   or cap + 1 when there are more. */
extern "C" rc_u64 rc_test_plan_walk(const struct rc_plan* p, rc_u64 recv_next, rc_u64 send_next, struct rc_exec* out, rc_u64 cap) {
    struct rc_cursor c;
    struct rc_exec e;
    rc_u64 n = 0ull;
    rc_cursor_init(&c, p, recv_next, send_next);
    while (n < cap && rc_cursor_next(&c, &e)) out[n++] = e;
    if (n == cap && rc_cursor_next(&c, &e)) n += 1ull;
    return n;
}
#define RC_ABI(s, f) (rc_u64)__builtin_offsetof(struct s, f)
/* Sizes and field offsets of the structures Rust shares (abi.rs). */
extern "C" rc_u64 rc_test_abi(rc_u64* out, rc_u64 cap) {
    const rc_u64 v[] = {
        sizeof(struct rc_plan), RC_ABI(rc_plan, ring), RC_ABI(rc_plan, collective), RC_ABI(rc_plan, slots_per_slice),
        sizeof(struct rc_step), RC_ABI(rc_step, count), RC_ABI(rc_step, primitive),
        sizeof(struct rc_exec), RC_ABI(rc_exec, send_step), RC_ABI(rc_exec, primitive),
        sizeof(struct rc_chan), RC_ABI(rc_chan, state), RC_ABI(rc_chan, send_fifo), RC_ABI(rc_chan, slot_bytes),
        sizeof(struct rc_status), RC_ABI(rc_status, need), RC_ABI(rc_status, got_desc), RC_ABI(rc_status, send_next),
        sizeof(struct rc_loop_args), RC_ABI(rc_loop_args, ring), RC_ABI(rc_loop_args, desc), RC_ABI(rc_loop_args, collective), RC_ABI(rc_loop_args, slots_per_slice),
    };
    const rc_u64 n = sizeof(v) / sizeof(v[0]);
    for (rc_u64 i = 0; i < n && i < cap; ++i) out[i] = v[i];
    return n;
}
#endif
"#;

/// [`plan_source`] with the loop's shared types and, under the host
/// emulation, the `rc_test_*` entry points the tests call (the formula
/// per step, the walk, the structures' layout). Compiles as host C++ with
/// [`HOST_EMULATION_DEFINE`](super::HOST_EMULATION_DEFINE).
pub fn plan_test_source() -> String {
    let mut s = String::with_capacity(24 * 1024);
    s.push_str(super::source::PRELUDE);
    s.push_str(&plan_source());
    s.push_str(&super::loop_source::loop_types_source());
    s.push_str(TEST_EXPORTS);
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constants_come_from_the_core() {
        let s = plan_source();
        assert!(s.contains("#define RC_PRIM_recvReduceCopySend 15u"));
        assert!(s.contains("#define RC_PRIM_send 8u"));
        assert!(s.contains("#define RC_P_RECV 1u"));
        assert!(s.contains("#define RC_STEPS 8ull"));
        assert!(s.contains("#define RC_C_REDUCE 4u"));
        assert!(s.contains("#define RC_CHUNK_ALIGN 16ull"));
        // Every primitive the formula names has a macro.
        for name in [
            "send",
            "recvReduceSend",
            "recvReduceCopySend",
            "recvCopySend",
            "recv",
            "copySend",
            "recvReduceCopy",
            "copy",
        ] {
            assert!(s.contains(&format!("#define RC_PRIM_{name} ")), "{name}");
        }
    }

    #[test]
    fn test_exports_only_under_the_host_emulation() {
        let s = plan_test_source();
        let guard = s
            .find("#if defined(RINGCC_HOST_EMULATION)\nextern \"C\" void rc_test_plan_step")
            .unwrap();
        assert!(s[guard..].contains("#endif"));
        assert!(!plan_source().contains("rc_test_"));
    }
}
