//! The TCP transport (being written).
