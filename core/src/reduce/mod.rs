//! Element types, reduction operations and the host reduction kernels.
//!
//! The kernels work on byte slices in the machine's native byte order, of
//! any alignment (the RDMA and simulator backends hand over slot memory
//! that is only byte-aligned), in place (`acc = acc ⊕ src`) or out of place
//! (`dst = a ⊕ b`). They are the reference the device kernels are tested
//! against. They are written as straight loops over fixed-size element
//! arrays so that the compiler vectorizes them.
//!
//! `Avg` is a sum along the ring followed, once, by a division by the rank
//! count at the step that completes the reduction ([`finalize`]); the
//! reduce steps themselves use [`ReduceOp::step_op`].

mod kernels;

pub use kernels::{finalize, reduce, reduce_in_place};

use crate::error::Error;

/// An element type, with nccl-tests' names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[repr(u8)]
pub enum DataType {
    /// `int8`
    I8 = 0,
    /// `uint8`
    U8 = 1,
    /// `int32`
    I32 = 2,
    /// `uint32`
    U32 = 3,
    /// `int64`
    I64 = 4,
    /// `uint64`
    U64 = 5,
    /// `half` (IEEE binary16)
    F16 = 6,
    /// `float`
    F32 = 7,
    /// `double`
    F64 = 8,
    /// `bfloat16`
    Bf16 = 9,
}

impl DataType {
    /// Every data type, in code order.
    pub const ALL: [DataType; 10] = [
        DataType::I8,
        DataType::U8,
        DataType::I32,
        DataType::U32,
        DataType::I64,
        DataType::U64,
        DataType::F16,
        DataType::F32,
        DataType::F64,
        DataType::Bf16,
    ];

    /// Size of one element in bytes.
    #[inline]
    pub const fn size(self) -> u8 {
        match self {
            DataType::I8 | DataType::U8 => 1,
            DataType::F16 | DataType::Bf16 => 2,
            DataType::I32 | DataType::U32 | DataType::F32 => 4,
            DataType::I64 | DataType::U64 | DataType::F64 => 8,
        }
    }

    /// Whether this is a floating-point type.
    #[inline]
    pub const fn is_float(self) -> bool {
        matches!(
            self,
            DataType::F16 | DataType::Bf16 | DataType::F32 | DataType::F64
        )
    }

    /// nccl-tests' name (`float`, `bfloat16`, `int8`, …).
    pub const fn name(self) -> &'static str {
        match self {
            DataType::I8 => "int8",
            DataType::U8 => "uint8",
            DataType::I32 => "int32",
            DataType::U32 => "uint32",
            DataType::I64 => "int64",
            DataType::U64 => "uint64",
            DataType::F16 => "half",
            DataType::F32 => "float",
            DataType::F64 => "double",
            DataType::Bf16 => "bfloat16",
        }
    }

    /// Parses nccl-tests' names and the common aliases (`f32`, `fp16`, …).
    pub fn from_name(name: &str) -> Option<DataType> {
        Some(match name {
            "int8" | "i8" | "char" => DataType::I8,
            "uint8" | "u8" => DataType::U8,
            "int32" | "i32" | "int" => DataType::I32,
            "uint32" | "u32" => DataType::U32,
            "int64" | "i64" => DataType::I64,
            "uint64" | "u64" => DataType::U64,
            "half" | "f16" | "fp16" | "float16" => DataType::F16,
            "float" | "f32" | "fp32" | "float32" => DataType::F32,
            "double" | "f64" | "fp64" | "float64" => DataType::F64,
            "bfloat16" | "bf16" => DataType::Bf16,
            _ => return None,
        })
    }

    /// The code used on the wire (the `repr(u8)` value).
    #[inline]
    pub const fn code(self) -> u8 {
        self as u8
    }

    /// The inverse of [`DataType::code`].
    pub const fn from_code(code: u8) -> Result<DataType, Error> {
        Ok(match code {
            0 => DataType::I8,
            1 => DataType::U8,
            2 => DataType::I32,
            3 => DataType::U32,
            4 => DataType::I64,
            5 => DataType::U64,
            6 => DataType::F16,
            7 => DataType::F32,
            8 => DataType::F64,
            9 => DataType::Bf16,
            c => return Err(Error::UnknownCode(c)),
        })
    }
}

impl core::fmt::Display for DataType {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
    }
}

/// A reduction operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[repr(u8)]
pub enum ReduceOp {
    /// Sum (wrapping for integers).
    Sum = 0,
    /// Product (wrapping for integers).
    Prod = 1,
    /// Minimum.
    Min = 2,
    /// Maximum.
    Max = 3,
    /// Average: sum, then one division by the rank count (truncating for
    /// integers).
    Avg = 4,
}

impl ReduceOp {
    /// Every operation, in code order.
    pub const ALL: [ReduceOp; 5] = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Min,
        ReduceOp::Max,
        ReduceOp::Avg,
    ];

    /// nccl-tests' name.
    pub const fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
            ReduceOp::Avg => "avg",
        }
    }

    /// Parses nccl-tests' names.
    pub fn from_name(name: &str) -> Option<ReduceOp> {
        Some(match name {
            "sum" => ReduceOp::Sum,
            "prod" => ReduceOp::Prod,
            "min" => ReduceOp::Min,
            "max" => ReduceOp::Max,
            "avg" => ReduceOp::Avg,
            _ => return None,
        })
    }

    /// The operation the intermediate reduce steps apply (`Avg` sums).
    #[inline]
    pub const fn step_op(self) -> ReduceOp {
        match self {
            ReduceOp::Avg => ReduceOp::Sum,
            op => op,
        }
    }

    /// The code used on the wire.
    #[inline]
    pub const fn code(self) -> u8 {
        self as u8
    }

    /// The inverse of [`ReduceOp::code`].
    pub const fn from_code(code: u8) -> Result<ReduceOp, Error> {
        Ok(match code {
            0 => ReduceOp::Sum,
            1 => ReduceOp::Prod,
            2 => ReduceOp::Min,
            3 => ReduceOp::Max,
            4 => ReduceOp::Avg,
            c => return Err(Error::UnknownCode(c)),
        })
    }
}

impl core::fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
    }
}
