//! The edge agent: pulls its cluster's bundle, verifies it, keeps it, applies it,
//! prunes what left it, and reports.

pub mod backoff;
pub mod cache;
pub mod client;
pub mod sink;
pub mod status;
#[cfg(test)]
pub(crate) mod testing;
