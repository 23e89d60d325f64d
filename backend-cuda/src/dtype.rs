//! Rust element types the device moves: the communicator's [`Element`]s
//! (each with its core [`DataType`](ringcc_core::DataType)) that cudarc
//! can hand to a kernel.

use cudarc::driver::DeviceRepr;
use ringcc_comm::Element;

/// An element type collectives can move on the device: an [`Element`]
/// (its `DTYPE` is the core's name for it) that is device-representable.
/// Every [`Element`] cudarc can pass is one: the ten types are listed once,
/// in `ringcc-comm`.
pub trait CollType: Element + DeviceRepr {}

impl<T: Element + DeviceRepr> CollType for T {}

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
