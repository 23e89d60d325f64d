//! The ten element types a communicator reduces, as Rust types.

use ringcc_core::DataType;

/// A Rust type a collective can carry: plain bytes of one of the core's
/// [`DataType`]s.
pub trait Element: bytemuck::Pod + Send + Sync + 'static {
    /// Its element type.
    const DTYPE: DataType;
}

macro_rules! element {
    ($($t:ty => $d:ident),* $(,)?) => {
        $(impl Element for $t {
            const DTYPE: DataType = DataType::$d;
        })*
    };
}

element! {
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn size<T: Element>() -> (usize, u8) {
        (std::mem::size_of::<T>(), T::DTYPE.size())
    }

    #[test]
    fn every_type_has_its_dtype_size() {
        for (a, b) in [
            size::<i8>(),
            size::<u8>(),
            size::<i32>(),
            size::<u32>(),
            size::<i64>(),
            size::<u64>(),
            size::<half::f16>(),
            size::<f32>(),
            size::<f64>(),
            size::<half::bf16>(),
        ] {
            assert_eq!(a, usize::from(b));
        }
    }
}
