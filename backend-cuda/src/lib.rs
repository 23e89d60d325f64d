//! CUDA backend for ringcc.
