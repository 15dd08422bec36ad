//! A fleet snapshot: the files of a fleet root at one revision, already read.
//!
//! The renderer takes a snapshot and never touches the filesystem or Git itself;
//! the hub crate's `source` module builds snapshots from a commit or a folder.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::diagnostic::Diagnostic;

/// The largest file a fleet may hold; larger ones are refused, not read.
pub const MAX_FILE_BYTES: u64 = 4 * 1024 * 1024;

#[derive(Clone, Debug, Default)]
pub struct FleetSnapshot {
    /// File contents by path relative to the fleet root, with `/` separators.
    pub files: BTreeMap<String, Arc<str>>,
    /// What was read: `<branch>@sha1:<commit>` for a commit, `folder:<path>` for a folder.
    pub revision: String,
    /// Problems met while reading (paths escaping the root, oversized files, ...).
    pub problems: Vec<Diagnostic>,
}

impl FleetSnapshot {
    /// A snapshot from in-memory files, for tests and tools.
    pub fn from_files<'a>(files: impl IntoIterator<Item = (&'a str, &'a str)>) -> FleetSnapshot {
        FleetSnapshot {
            files: files
                .into_iter()
                .map(|(path, text)| (path.to_string(), Arc::from(text)))
                .collect(),
            revision: "memory".to_string(),
            problems: Vec::new(),
        }
    }
}

/// Whether a path (relative to the fleet root) is one the renderer reads.
pub fn is_fleet_file(path: &str) -> bool {
    let yaml = |p: &str| p.ends_with(".yaml") || p.ends_with(".yml");
    let parts: Vec<&str> = path.split('/').collect();
    match parts.as_slice() {
        ["clusters", file] | ["groups", file] | ["rollouts", file] => yaml(file),
        ["workloads", _, "workload.yaml"] => true,
        ["workloads", _, "manifests", .., file] => {
            yaml(file) || file.ends_with(".yaml.j2") || file.ends_with(".yml.j2")
        }
        ["overlays", .., file] => yaml(file),
        _ => false,
    }
}
