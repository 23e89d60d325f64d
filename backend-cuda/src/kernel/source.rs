//! CUDA C++ source of the fused kernels, generated per (type, op).
//!
//! The source needs no header: f16 converts with the PTX `cvt` instructions
//! (round to nearest even, as the core's `half` conversions), bf16 with the
//! same bit arithmetic as the `half` crate. Integer arithmetic goes through
//! the unsigned type of the same width, so it wraps exactly like the core's
//! `wrapping_add` / `wrapping_mul` without signed-overflow undefined
//! behaviour. Every reduction is computed as the core's kernels compute it:
//! f16/bf16 are widened to f32, combined, and rounded back after each step;
//! `Avg` sums and divides once, where the primitive finalizes.
//!
//! Defining [`HOST_EMULATION_DEFINE`] turns the same source into plain C++
//! for the host (`_Float16` conversions, the grid position passed as two
//! extra arguments), so the tests can run every kernel on the CPU against
//! the core's reference.

use std::fmt::Write as _;

use ringcc_core::{DataType, Primitive, ReduceOp};

use super::{storage_type, KernelKey, ModuleKey, PRIMITIVES};

/// The preprocessor symbol that selects the host emulation.
pub const HOST_EMULATION_DEFINE: &str = "RINGCC_HOST_EMULATION";

pub(crate) const PRELUDE: &str = r#"#if defined(RINGCC_HOST_EMULATION)
#include <math.h>
#include <string.h>
#define RC_FN static inline
#define RC_KERNEL(name) extern "C" void name
#define RC_GRID_PARAMS , unsigned long long rc_tid, unsigned long long rc_stride
#define RC_GRID
#define RC_VEC_CHECK(p) do { if (((unsigned long long)(p)) & 15ull) __builtin_trap(); } while (0)
typedef struct { unsigned int x, y, z, w; } __attribute__((aligned(16))) uint4;
RC_FN float rc_h2f(unsigned short h) { _Float16 v; memcpy(&v, &h, 2); return (float)v; }
RC_FN unsigned short rc_f2h(float f) { _Float16 v = (_Float16)f; unsigned short h; memcpy(&h, &v, 2); return h; }
RC_FN float rc_bits2f(unsigned int u) { float f; memcpy(&f, &u, 4); return f; }
RC_FN unsigned int rc_f2bits(float f) { unsigned int u; memcpy(&u, &f, 4); return u; }
#else
#define RC_FN static __device__ __forceinline__
#define RC_KERNEL(name) extern "C" __global__ void __launch_bounds__(512) name
#define RC_GRID_PARAMS
#define RC_VEC_CHECK(p) do { } while (0)
#define RC_GRID \
    const unsigned long long rc_tid = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; \
    const unsigned long long rc_stride = (unsigned long long)gridDim.x * blockDim.x;
RC_FN float rc_h2f(unsigned short h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
RC_FN unsigned short rc_f2h(float f) { unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
RC_FN float rc_bits2f(unsigned int u) { return __uint_as_float(u); }
RC_FN unsigned int rc_f2bits(float f) { return __float_as_uint(f); }
#endif
RC_FN float rc_bf2f(unsigned short b) { return rc_bits2f((unsigned int)b << 16); }
RC_FN unsigned short rc_f2bf(float f) {
    unsigned int x = rc_f2bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((x >> 16) | 0x40u);
    if ((x & 0x8000u) != 0u && (x & 0x17fffu) != 0u) return (unsigned short)((x >> 16) + 1u);
    return (unsigned short)(x >> 16);
}
"#;

/// The unsigned type integer arithmetic wraps in.
fn unsigned_type(dtype: DataType) -> &'static str {
    match dtype {
        DataType::I8 | DataType::U8 => "unsigned char",
        DataType::I32 | DataType::U32 => "unsigned int",
        _ => "unsigned long long",
    }
}

/// `rc_op(a, b)`: one reduction step (`Avg` sums), on stored elements.
fn op_body(dtype: DataType, op: ReduceOp) -> String {
    let op = op.step_op();
    let float = |load: &str, store: &str, min: &str, max: &str| {
        let e = match op {
            ReduceOp::Prod => format!("{load}(a) * {load}(b)"),
            ReduceOp::Min => format!("{min}({load}(a), {load}(b))"),
            ReduceOp::Max => format!("{max}({load}(a), {load}(b))"),
            ReduceOp::Sum | ReduceOp::Avg => format!("{load}(a) + {load}(b)"),
        };
        format!("return {store}({e});")
    };
    match dtype {
        DataType::F32 => float("", "", "fminf", "fmaxf"),
        DataType::F64 => float("", "", "fmin", "fmax"),
        DataType::F16 => float("rc_h2f", "rc_f2h", "fminf", "fmaxf"),
        DataType::Bf16 => float("rc_bf2f", "rc_f2bf", "fminf", "fmaxf"),
        _ => {
            let u = unsigned_type(dtype);
            match op {
                ReduceOp::Prod => format!("return (T)(({u})a * ({u})b);"),
                ReduceOp::Min => "return a < b ? a : b;".to_owned(),
                ReduceOp::Max => "return a > b ? a : b;".to_owned(),
                ReduceOp::Sum | ReduceOp::Avg => format!("return (T)(({u})a + ({u})b);"),
            }
        }
    }
}

/// `rc_fin(x, n)`: the division by the rank count of `Avg`, as the core's
/// `finalize` does it (integers truncate toward zero).
fn finalize_body(dtype: DataType) -> &'static str {
    match dtype {
        DataType::I8 | DataType::I32 | DataType::I64 => "return (T)((long long)x / (long long)n);",
        DataType::U8 | DataType::U32 | DataType::U64 => {
            "return (T)((unsigned long long)x / (unsigned long long)n);"
        }
        DataType::F32 => "return x / (float)n;",
        DataType::F64 => "return x / (double)n;",
        DataType::F16 => "return rc_f2h(rc_h2f(x) / (float)n);",
        DataType::Bf16 => "return rc_f2bf(rc_bf2f(x) / (float)n);",
    }
}

/// The value one element of a primitive produces, from `r` (incoming) and
/// `x` (local input).
fn elem_expr(p: Primitive, op: ReduceOp) -> String {
    let v = if p.contains(Primitive::REDUCE) {
        "rc_op(r, x)"
    } else if p.contains(Primitive::RECV) {
        "r"
    } else {
        "x"
    };
    if p.finalizes() && op == ReduceOp::Avg {
        format!("rc_fin({v}, nranks)")
    } else {
        v.to_owned()
    }
}

/// The name of the device function that carries out one slice of `p`
/// (`rc_body_<primitive>`): the fused kernels and the device loop
/// ([`super::loop_source()`]) both call it. `None` for a primitive no plan
/// emits.
pub fn body_symbol(p: Primitive) -> Option<String> {
    super::primitive_index(p)?;
    Some(format!("rc_body_{}", p.name()))
}

/// `rc_body_<primitive>`: one slice, by thread `rc_tid` of `rc_stride`
/// (a grid-stride loop over 16-byte vectors, then a scalar tail).
fn body(out: &mut String, p: Primitive, op: ReduceOp, epv: u64) {
    let Some(name) = body_symbol(p) else { return };
    let reads_recv = p.contains(Primitive::RECV);
    let reads_in = p.reads_input();
    let mut used = Vec::new();
    for (flag, ptr) in [
        (reads_recv, "recv"),
        (reads_in, "in"),
        (p.contains(Primitive::COPY), "out"),
        (p.contains(Primitive::SEND), "send"),
    ] {
        if flag {
            used.push(ptr);
        }
    }
    let align = used
        .iter()
        .map(|p| format!("(unsigned long long){p}"))
        .collect::<Vec<_>>()
        .join(" | ");
    let expr = elem_expr(p, op);
    let _ = writeln!(
        out,
        "RC_FN void {name}(const T* recv, const T* in, T* out, T* send, unsigned long long n, unsigned int nranks, unsigned long long rc_tid, unsigned long long rc_stride) {{"
    );
    let _ = writeln!(
        out,
        "    (void)recv; (void)in; (void)out; (void)send; (void)nranks;"
    );
    let _ = writeln!(
        out,
        "    const unsigned long long nvec = (({align}) & 15ull) == 0ull ? n / {epv}ull : 0ull;"
    );
    let _ = writeln!(
        out,
        "    for (unsigned long long i = rc_tid; i < nvec; i += rc_stride) {{"
    );
    let _ = writeln!(out, "        union rc_vec vr, vx, vv;");
    if reads_recv {
        let _ = writeln!(out, "        RC_VEC_CHECK(recv);");
        let _ = writeln!(out, "        vr.u = ((const uint4*)recv)[i];");
    }
    if reads_in {
        let _ = writeln!(out, "        RC_VEC_CHECK(in);");
        let _ = writeln!(out, "        vx.u = ((const uint4*)in)[i];");
    }
    let _ = writeln!(out, "        for (int k = 0; k < {epv}; ++k) {{");
    let _ = writeln!(out, "            const T r = vr.e[k], x = vx.e[k];");
    let _ = writeln!(out, "            (void)r; (void)x;");
    let _ = writeln!(out, "            vv.e[k] = {expr};");
    let _ = writeln!(out, "        }}");
    if p.contains(Primitive::COPY) {
        let _ = writeln!(out, "        RC_VEC_CHECK(out);");
        let _ = writeln!(out, "        ((uint4*)out)[i] = vv.u;");
    }
    if p.contains(Primitive::SEND) {
        let _ = writeln!(out, "        RC_VEC_CHECK(send);");
        let _ = writeln!(out, "        ((uint4*)send)[i] = vv.u;");
    }
    let _ = writeln!(out, "    }}");
    let _ = writeln!(
        out,
        "    for (unsigned long long i = nvec * {epv}ull + rc_tid; i < n; i += rc_stride) {{"
    );
    let r = if reads_recv { "recv[i]" } else { "(T)0" };
    let x = if reads_in { "in[i]" } else { "(T)0" };
    let _ = writeln!(out, "        const T r = {r}, x = {x};");
    let _ = writeln!(out, "        (void)r; (void)x;");
    let _ = writeln!(out, "        const T v = {expr};");
    if p.contains(Primitive::COPY) {
        let _ = writeln!(out, "        out[i] = v;");
    }
    if p.contains(Primitive::SEND) {
        let _ = writeln!(out, "        send[i] = v;");
    }
    let _ = writeln!(out, "    }}");
    let _ = writeln!(out, "}}");
}

/// The fused kernel of `key`: the grid's position, then its body.
fn kernel(out: &mut String, key: KernelKey) {
    let (Some(name), Some(body)) = (key.symbol(), body_symbol(key.primitive)) else {
        return;
    };
    let _ = writeln!(
        out,
        "RC_KERNEL({name})(const T* recv, const T* in, T* out, T* send, unsigned long long n, unsigned int nranks RC_GRID_PARAMS) {{"
    );
    let _ = writeln!(out, "    RC_GRID");
    let _ = writeln!(
        out,
        "    {body}(recv, in, out, send, n, nranks, rc_tid, rc_stride);"
    );
    let _ = writeln!(out, "}}");
}

/// What every module of (type, op) starts with: the prelude, the element
/// type, `rc_op`, `rc_fin` and the slice bodies of [`PRIMITIVES`].
pub(crate) fn common_source(module: ModuleKey, s: &mut String) {
    let ModuleKey { dtype, op } = module;
    let epv = super::VECTOR_BYTES / u64::from(dtype.size());
    s.push_str(PRELUDE);
    let _ = writeln!(s, "typedef {} T;", storage_type(dtype));
    let _ = writeln!(s, "union rc_vec {{ uint4 u; T e[{epv}]; }};");
    let _ = writeln!(s, "RC_FN T rc_op(T a, T b) {{ {} }}", op_body(dtype, op));
    let _ = writeln!(
        s,
        "RC_FN T rc_fin(T x, unsigned int n) {{ {} }}",
        finalize_body(dtype)
    );
    for p in PRIMITIVES {
        body(s, p, op, epv);
    }
}

/// The complete source of one module: its element functions and the
/// eight fused kernels of [`PRIMITIVES`].
pub fn module_source(module: ModuleKey) -> String {
    let mut s = String::with_capacity(16 * 1024);
    let _ = writeln!(
        s,
        "/* ringcc fused kernels, module {}: generated, do not edit. */",
        module.name()
    );
    common_source(module, &mut s);
    for primitive in PRIMITIVES {
        kernel(&mut s, KernelKey { primitive, module });
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn module(dtype: DataType, op: ReduceOp) -> ModuleKey {
        ModuleKey { dtype, op }
    }

    #[test]
    fn every_module_defines_its_eight_kernels() {
        for m in ModuleKey::all() {
            let src = module_source(m);
            for primitive in PRIMITIVES {
                let name = KernelKey {
                    primitive,
                    module: m,
                }
                .symbol()
                .unwrap();
                assert_eq!(
                    src.matches(&format!("RC_KERNEL({name})")).count(),
                    1,
                    "{name}"
                );
            }
            assert!(src.contains(&format!("typedef {} T;", storage_type(m.dtype))));
            // No header beyond the host emulation's libc ones.
            assert_eq!(src.matches("#include").count(), 2);
        }
    }

    #[test]
    fn vector_width_is_sixteen_bytes() {
        assert!(module_source(module(DataType::I8, ReduceOp::Sum)).contains("T e[16]"));
        assert!(module_source(module(DataType::Bf16, ReduceOp::Sum)).contains("T e[8]"));
        assert!(module_source(module(DataType::F32, ReduceOp::Sum)).contains("T e[4]"));
        assert!(module_source(module(DataType::F64, ReduceOp::Sum)).contains("T e[2]"));
    }

    #[test]
    fn avg_divides_only_where_the_primitive_finalizes() {
        let src = module_source(module(DataType::F32, ReduceOp::Avg));
        // recvReduceCopySend and recvReduceCopy, vector and scalar loop each.
        assert_eq!(src.matches("rc_fin(rc_op(r, x), nranks)").count(), 4);
        assert_eq!(src.matches(", nranks)").count(), 4);
        let sum = module_source(module(DataType::F32, ReduceOp::Sum));
        assert_eq!(sum.matches(", nranks)").count(), 0);
        // Avg reduces with a sum.
        assert!(src.contains("RC_FN T rc_op(T a, T b) { return ((a) + (b)); }"));
    }

    #[test]
    fn integer_arithmetic_wraps_through_unsigned() {
        let src = module_source(module(DataType::I32, ReduceOp::Prod));
        assert!(src.contains("return (T)((unsigned int)a * (unsigned int)b);"));
        let src = module_source(module(DataType::I64, ReduceOp::Avg));
        assert!(src.contains("(unsigned long long)a + (unsigned long long)b"));
        assert!(src.contains("(long long)x / (long long)n"));
    }

    #[test]
    fn primitives_touch_only_their_buffers() {
        let src = module_source(module(DataType::F32, ReduceOp::Sum));
        let body = |p: Primitive| {
            let name = body_symbol(p).unwrap();
            let start = src.find(&format!("RC_FN void {name}(")).unwrap();
            let rest = &src[start..];
            rest[..rest.find("\n}\n").unwrap()].to_owned()
        };
        let send = body(Primitive::SEND_ONLY);
        assert!(send.contains("send[i] = v") && !send.contains("out[i] = v"));
        assert!(!send.contains("recv[i]") && send.contains("in[i]"));
        let recv = body(Primitive::RECV_ONLY);
        assert!(recv.contains("out[i] = v") && !recv.contains("send[i] = v"));
        assert!(recv.contains("recv[i]") && !recv.contains("in[i]"));
        let rrcs = body(Primitive::RECV_REDUCE_COPY_SEND);
        assert!(rrcs.contains("out[i] = v") && rrcs.contains("send[i] = v"));
        assert!(rrcs.contains("rc_op(r, x)"));
        let copy = body(Primitive::COPY_ONLY);
        assert!(copy.contains("out[i] = v") && copy.contains("in[i]"));
    }
}
