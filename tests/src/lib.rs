//! Workspace-level test support.
