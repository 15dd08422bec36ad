//! flotilla's core: the fleet repository's types, the bundle and its digest, the
//! status report, the API's paths and the rollout decisions — what every other part
//! of flotilla shares.
//!
//! Pure and small by construction: no async runtime, Git, database, HTTP, Kubernetes,
//! template engine or thread pool is a dependency of this crate (ARCHITECTURE.md).

pub mod access;
pub mod api;
pub mod bundle;
pub mod dcz;
pub mod diagnostic;
pub mod limits;
pub mod model;
pub mod names;
pub mod rollout;
pub mod secret;
pub mod signing;
pub mod snapshot;
pub mod status;
