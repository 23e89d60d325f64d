//! RDMA verbs backend for ringcc.
