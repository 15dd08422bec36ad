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
    /// Files that are not fleet files and could not be held as text (binary, too big,
    /// a symlink out of the root), with the reason. They matter only if a
    /// kustomization refers to them, which then says why it cannot use them.
    pub skipped: BTreeMap<String, String>,
    /// Binary files a Helm chart may be made of (packed charts: `.tgz`), by path; no
    /// other binary file is held.
    pub binaries: BTreeMap<String, Arc<[u8]>>,
    /// For each file decrypted from SOPS (set only by the renderer, which opens
    /// them): a key derived from the file's own data key, which a hash that is
    /// published over its values (kustomize's `secretGenerator` name suffix, Helm's
    /// `sha256sum`) is keyed with, so that the hash lets nobody test a guess.
    pub hash_keys: BTreeMap<String, [u8; 32]>,
    /// The files read through a symlink: each link's path and the path (in the
    /// fleet) of the file it leads to, whose content the link's path holds. Whose
    /// file it is (a tenant's, the platform's) is the target's as well as the link's.
    pub links: BTreeMap<String, String>,
    /// Whether reading stopped early at a budget (the fleet's bytes): `files` are then
    /// only some of the fleet's, and rendering them would report errors that are not
    /// in the fleet (files missing, or read in part), so the renderer reports
    /// `problems` alone.
    pub incomplete: bool,
}

/// Whether a binary file is one the renderer may read: a packed Helm chart.
pub fn is_packed_chart(path: &str) -> bool {
    path.ends_with(".tgz") || path.ends_with(".tar.gz")
}

impl FleetSnapshot {
    /// A snapshot from in-memory files, for tests and tools.
    pub fn from_files<'a>(files: impl IntoIterator<Item = (&'a str, &'a str)>) -> FleetSnapshot {
        FleetSnapshot {
            incomplete: false,
            files: files
                .into_iter()
                .map(|(path, text)| (path.to_string(), Arc::from(text)))
                .collect(),
            revision: "memory".to_string(),
            problems: Vec::new(),
            skipped: BTreeMap::new(),
            binaries: BTreeMap::new(),
            hash_keys: BTreeMap::new(),
            links: BTreeMap::new(),
        }
    }
}

/// The names kustomize looks for in a folder, in its order.
pub const KUSTOMIZATION_FILE_NAMES: [&str; 3] =
    ["kustomization.yaml", "kustomization.yml", "Kustomization"];

/// Whether a path (relative to the fleet root) is one the renderer reads by its path:
/// such a file must be readable text, or the fleet does not render. The snapshot also
/// holds every other text file of the fleet root, for kustomizations to refer to.
pub fn is_fleet_file(path: &str) -> bool {
    let yaml = |p: &str| p.ends_with(".yaml") || p.ends_with(".yml");
    let parts: Vec<&str> = path.split('/').collect();
    match parts.as_slice() {
        ["flotilla.yaml"] => true,
        ["clusters", file] | ["groups", file] | ["rollouts", file] => yaml(file),
        ["workloads", _, "workload.yaml"] => true,
        ["workloads", _, file] => KUSTOMIZATION_FILE_NAMES.contains(file),
        ["workloads", _, "manifests", .., file] => {
            yaml(file) || file.ends_with(".yaml.j2") || file.ends_with(".yml.j2")
        }
        ["overlays", .., file] => yaml(file),
        _ => false,
    }
}
