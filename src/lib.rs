//! flotilla: a GitOps fleet reconciler for edge Kubernetes.
//!
//! See ARCHITECTURE.md for the map of modules and the invariants they keep.

pub mod agent;
pub mod bundle;
pub mod cli;
pub mod diagnostic;
pub mod diff;
pub mod hub;
pub mod model;
pub mod render;
pub mod snapshot;
pub mod source;
pub mod status;
pub mod store;
