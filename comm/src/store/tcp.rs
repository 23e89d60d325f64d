//! The built-in TCP store served by rank 0 (to be filled: see the crate docs).
