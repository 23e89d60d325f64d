//! Deterministic cluster simulator for ringcc.
