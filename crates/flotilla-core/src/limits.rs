//! Budgets that keep a fleet repository from exhausting whoever reads it: a hub, a
//! `flotilla validate` in CI, a reviewer's `flotilla diff`. A fleet that breaks one
//! is reported with the file (and line) that did, like any other error; nothing is
//! read, rendered or served past a budget. docs/security.md lists them all.
//!
//! The nesting depth of values is not here: it is the fixed
//! [`MAX_NESTING_DEPTH`](crate::bundle::MAX_NESTING_DEPTH), shared with the agent,
//! which must agree with the hub about it.

use std::time::Duration;

use crate::snapshot::MAX_FILE_BYTES;

/// The budgets of reading and rendering one fleet snapshot. [`Limits::default`]
/// gives the documented defaults.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Limits {
    /// The largest fleet file read; larger ones are refused, not read.
    pub max_file_bytes: u64,
    /// The most bytes read across all fleet files of one snapshot. Every path
    /// counts, even when Git stores its content once for many paths.
    pub max_fleet_bytes: u64,
    /// The most fuel one template may use for one cluster: minijinja charges one for
    /// each instruction and one for each 64 bytes of data built or written.
    pub template_fuel: u64,
    /// The most bytes one template may write for one cluster.
    pub max_template_output_bytes: usize,
    /// The largest rendered resource, as canonical JSON; a patch may not make a
    /// resource larger than this either.
    pub max_resource_bytes: usize,
    /// How long a whole render may take before it is abandoned and reported.
    pub render_timeout: Duration,
}

impl Limits {
    /// 256 MiB: a fleet of 10,000 clusters and 100 workloads reads about 10 MB.
    pub const DEFAULT_MAX_FLEET_BYTES: u64 = 256 * 1024 * 1024;
    /// One million: about 20 ms of template work for one cluster (or 64 MB of data
    /// built), a hundred times what a template of the example fleet uses.
    pub const DEFAULT_TEMPLATE_FUEL: u64 = 1_000_000;
    /// As large as a fleet file may be.
    pub const DEFAULT_MAX_TEMPLATE_OUTPUT_BYTES: usize = MAX_FILE_BYTES as usize;
    /// 3 MiB: the Kubernetes API server refuses larger requests, so a larger
    /// resource could never be applied.
    pub const DEFAULT_MAX_RESOURCE_BYTES: usize = 3 * 1024 * 1024;
    /// 30 seconds: the full render of 10,000 clusters takes about 1.3 s.
    pub const DEFAULT_RENDER_TIMEOUT: Duration = Duration::from_secs(30);
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_file_bytes: MAX_FILE_BYTES,
            max_fleet_bytes: Limits::DEFAULT_MAX_FLEET_BYTES,
            template_fuel: Limits::DEFAULT_TEMPLATE_FUEL,
            max_template_output_bytes: Limits::DEFAULT_MAX_TEMPLATE_OUTPUT_BYTES,
            max_resource_bytes: Limits::DEFAULT_MAX_RESOURCE_BYTES,
            render_timeout: Limits::DEFAULT_RENDER_TIMEOUT,
        }
    }
}
