//! The fused kernels: which exist, what they are called, how they are
//! launched, and their CUDA C++ source.
//!
//! One kernel per [`Primitive`] and per ([`DataType`], [`ReduceOp`]): it
//! reads the incoming FIFO slice and/or the local input, reduces, and writes
//! the local output and/or the successor's FIFO slice in one pass. The eight
//! kernels of one (type, op) form one NVRTC module, compiled once per
//! architecture and loaded once per device.
//!
//! The device loop ([`loop_source()`]) is a second module per (type, op): one
//! persistent kernel that walks the whole plan on the device with the same
//! slice bodies and the plan's step formula ([`plan_source()`]).

mod geometry;
pub mod loop_source;
pub mod plan_source;
mod source;

pub use geometry::{LaunchGeometry, BLOCK_THREADS, VECTOR_BYTES};
pub use loop_source::{loop_source, loop_symbol, LOOP_THREADS};
pub use plan_source::{plan_source, plan_test_source};
pub use source::{body_symbol, module_source, HOST_EMULATION_DEFINE};

use ringcc_core::{DataType, Primitive, ReduceOp};

/// Every primitive a plan can emit, in a fixed order (the order of the
/// kernels in a module).
pub const PRIMITIVES: [Primitive; 8] = [
    Primitive::SEND_ONLY,
    Primitive::RECV_REDUCE_SEND,
    Primitive::RECV_REDUCE_COPY_SEND,
    Primitive::RECV_COPY_SEND,
    Primitive::RECV_ONLY,
    Primitive::COPY_SEND,
    Primitive::RECV_REDUCE_COPY,
    Primitive::COPY_ONLY,
];

/// The position of a primitive in [`PRIMITIVES`], `None` for a combination
/// no plan emits.
pub fn primitive_index(p: Primitive) -> Option<usize> {
    PRIMITIVES.iter().position(|&q| q == p)
}

/// Identifies one NVRTC module: the kernels of one element type and one
/// reduction operation. The cache key of compiled code (with the target
/// architecture) and of loaded modules (with the device).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ModuleKey {
    /// Element type.
    pub dtype: DataType,
    /// The collective's reduction operation (`Avg` divides where a
    /// primitive finalizes; collectives that do not reduce use `Sum`).
    pub op: ReduceOp,
}

impl ModuleKey {
    /// The module's name, `ringcc_<type>_<op>`.
    pub fn name(&self) -> String {
        format!("ringcc_{}_{}", self.dtype.name(), self.op.name())
    }

    /// Every (type, op) module, in code order.
    pub fn all() -> impl Iterator<Item = ModuleKey> {
        DataType::ALL.into_iter().flat_map(|dtype| {
            ReduceOp::ALL
                .into_iter()
                .map(move |op| ModuleKey { dtype, op })
        })
    }
}

/// Identifies one kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KernelKey {
    /// What the kernel does.
    pub primitive: Primitive,
    /// Its module.
    pub module: ModuleKey,
}

impl KernelKey {
    /// The kernel's symbol: `ringcc_<primitive>_<type>_<op>`, e.g.
    /// `ringcc_recvReduceCopySend_float_sum`. `None` for a primitive no
    /// plan emits.
    pub fn symbol(&self) -> Option<String> {
        primitive_index(self.primitive)?;
        Some(format!(
            "ringcc_{}_{}_{}",
            self.primitive.name(),
            self.module.dtype.name(),
            self.module.op.name()
        ))
    }
}

/// The C type that stores one element in a kernel (f16 and bf16 travel as
/// their 16-bit patterns).
pub fn storage_type(dtype: DataType) -> &'static str {
    match dtype {
        DataType::I8 => "signed char",
        DataType::U8 => "unsigned char",
        DataType::I32 => "int",
        DataType::U32 => "unsigned int",
        DataType::I64 => "long long",
        DataType::U64 => "unsigned long long",
        DataType::F16 | DataType::Bf16 => "unsigned short",
        DataType::F32 => "float",
        DataType::F64 => "double",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn every_kernel_has_a_distinct_symbol() {
        let mut seen = HashSet::new();
        for module in ModuleKey::all() {
            for primitive in PRIMITIVES {
                let s = KernelKey { primitive, module }.symbol().unwrap();
                assert!(s.is_ascii() && !s.contains(' '), "{s}");
                assert!(seen.insert(s));
            }
        }
        assert_eq!(seen.len(), 8 * 10 * 5);
        assert_eq!(ModuleKey::all().count(), 50);
    }

    #[test]
    fn symbol_spelling() {
        let k = KernelKey {
            primitive: Primitive::RECV_REDUCE_COPY_SEND,
            module: ModuleKey {
                dtype: DataType::Bf16,
                op: ReduceOp::Avg,
            },
        };
        assert_eq!(
            k.symbol().as_deref(),
            Some("ringcc_recvReduceCopySend_bfloat16_avg")
        );
        assert_eq!(k.module.name(), "ringcc_bfloat16_avg");
    }

    #[test]
    fn unknown_primitives_have_no_kernel() {
        let module = ModuleKey {
            dtype: DataType::F32,
            op: ReduceOp::Sum,
        };
        for bits in 0u8..16 {
            let p = Primitive::from_bits_truncate(bits);
            let known = PRIMITIVES.contains(&p);
            assert_eq!(primitive_index(p).is_some(), known);
            assert_eq!(
                KernelKey {
                    primitive: p,
                    module
                }
                .symbol()
                .is_some(),
                known
            );
        }
    }
}
