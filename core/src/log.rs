//! The core's private logging shim.
//!
//! With the `defmt` feature, messages go to `defmt` (firmware); without it
//! they compile to nothing, but their arguments are still type-checked so a
//! message cannot rot. Format strings must therefore be valid for both
//! `defmt` and `core::fmt`: plain `{}` placeholders only.

macro_rules! debug {
    ($($arg:tt)*) => {{
        #[cfg(feature = "defmt")]
        {
            defmt::debug!($($arg)*);
        }
        #[cfg(not(feature = "defmt"))]
        {
            let _ = format_args!($($arg)*);
        }
    }};
}

macro_rules! warning {
    ($($arg:tt)*) => {{
        #[cfg(feature = "defmt")]
        {
            defmt::warn!($($arg)*);
        }
        #[cfg(not(feature = "defmt"))]
        {
            let _ = format_args!($($arg)*);
        }
    }};
}

pub(crate) use debug;
pub(crate) use warning;
