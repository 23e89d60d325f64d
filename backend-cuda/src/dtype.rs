//! Rust element types ↔ the core's [`DataType`].

use cudarc::driver::DeviceRepr;
use ringcc_core::DataType;

/// An element type collectives can move: a device-representable Rust type
/// and its [`DataType`].
pub trait CollType: DeviceRepr + Copy + Send + Sync + 'static {
    /// The core's name for it.
    const DTYPE: DataType;
}

macro_rules! coll_type {
    ($($t:ty => $d:ident),* $(,)?) => {
        $(impl CollType for $t {
            const DTYPE: DataType = DataType::$d;
        })*
    };
}

coll_type!(
    i8 => I8,
    u8 => U8,
    i32 => I32,
    u32 => U32,
    i64 => I64,
    u64 => U64,
    half::f16 => F16,
    f32 => F32,
    f64 => F64,
    half::bf16 => Bf16,
);

#[cfg(test)]
mod tests {
    use super::*;

    fn size_matches<T: CollType>() {
        assert_eq!(std::mem::size_of::<T>(), usize::from(T::DTYPE.size()));
    }

    #[test]
    fn sizes_match_the_core() {
        size_matches::<i8>();
        size_matches::<u8>();
        size_matches::<i32>();
        size_matches::<u32>();
        size_matches::<i64>();
        size_matches::<u64>();
        size_matches::<half::f16>();
        size_matches::<f32>();
        size_matches::<f64>();
        size_matches::<half::bf16>();
    }
}
