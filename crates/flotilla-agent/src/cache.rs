//! The agent's state folder: the last-known-good bundle, the inventory of what was
//! applied, and the latest status report.
//!
//! Every file is replaced atomically (a temporary file is written and fsynced, renamed
//! over the old one, and the folder is fsynced), so an agent killed at any moment
//! leaves either the old or the new version of each file, never a torn one. A
//! temporary file left behind by such a kill is removed at the next start.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use flotilla_fs::Mode;

use serde::{Deserialize, Serialize};

use flotilla_core::bundle::{
    self, Bundle, Digest, Resource, ResourceKey, VerifiedDocument, VerifyError,
};
use flotilla_core::status::StatusReport;

const LOCK_FILE: &str = "lock";
const BUNDLE_FILE: &str = "bundle.json";
const INVENTORY_FILE: &str = "inventory.json";
const STATUS_FILE: &str = "status.json";
const APPLIED_FILE: &str = "applied.json";
const HELD_FILE: &str = "held.json";
/// Earlier versions named temporary files in the state folder `.<final name>.tmp`;
/// today's are [`flotilla_fs`]'s.
const OLD_TMP_SUFFIX: &str = ".tmp";

/// Why the state folder cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("cannot use state folder {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "state folder {path} is in use by another flotilla agent (it holds the lock on {path}/lock); \
         stop that agent or give this one its own --state-dir"
    )]
    Locked { path: PathBuf },
    #[error(
        "state folder {path} holds the bundle of cluster {found:?}, not {expected:?}; \
         give each cluster its own --state-dir"
    )]
    WrongCluster {
        path: PathBuf,
        expected: String,
        found: String,
    },
}

/// The agent's state folder, locked for the lifetime of this value.
#[derive(Debug)]
pub struct StateDir {
    path: PathBuf,
    // Holding the file keeps the advisory lock; the kernel releases it if we die.
    _lock: File,
}

impl StateDir {
    /// Creates (mode 0700) and locks the folder, and removes temporary files a killed
    /// agent may have left.
    pub fn open(path: &Path) -> Result<StateDir, StateError> {
        let io_error = |source| StateError::Io {
            path: path.to_path_buf(),
            source,
        };
        flotilla_fs::create_dir(path, Mode::Private).map_err(io_error)?;
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path.join(LOCK_FILE))
            .map_err(io_error)?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(fs::TryLockError::WouldBlock) => {
                return Err(StateError::Locked {
                    path: path.to_path_buf(),
                });
            }
            Err(fs::TryLockError::Error(source)) => return Err(io_error(source)),
        }
        flotilla_fs::remove_temporary_files(path, |name| {
            flotilla_fs::is_temporary(name)
                || (name.starts_with('.') && name.ends_with(OLD_TMP_SUFFIX))
        })
        .map_err(io_error)?;
        Ok(StateDir {
            path: path.to_path_buf(),
            _lock: lock,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads and re-verifies the last-known-good bundle. A bundle that no longer
    /// verifies (a damaged disk) is moved aside to `bundle.json.damaged` and ignored,
    /// so the agent starts as if it had none and fetches a fresh one.
    pub fn load_bundle(&self, cluster: &str) -> Result<Option<Bundle>, StateError> {
        Ok(self
            .load_document(cluster)?
            .map(|(_, document)| document.bundle))
    }

    /// [`StateDir::load_bundle`], with the document's bytes (which the bundle's
    /// resources are parts of) and its revision and signature: the stored document is
    /// the one received, so its signature's sequence is the one the agent holds, kept
    /// atomically with the bundle it came with.
    pub fn load_document(&self, cluster: &str) -> Result<Option<StoredDocument>, StateError> {
        let path = self.path.join(BUNDLE_FILE);
        let Some(bytes) = self.load_document_bytes()? else {
            return Ok(None);
        };
        let bytes = Arc::new(bytes);
        match bundle::verify_shared_document(&bytes, Some(cluster)) {
            Ok(document) => Ok(Some((bytes, document))),
            Err(VerifyError::WrongCluster { expected, found }) => Err(StateError::WrongCluster {
                path: self.path.clone(),
                expected,
                found,
            }),
            Err(err) => {
                let aside = self.path.join(format!("{BUNDLE_FILE}.damaged"));
                tracing::error!(
                    path = %path.display(),
                    error = %err,
                    "the last-known-good bundle does not verify; moved it to {} and starting without it",
                    aside.display()
                );
                fs::rename(&path, &aside).map_err(|source| StateError::Io {
                    path: path.clone(),
                    source,
                })?;
                Ok(None)
            }
        }
    }

    /// The last-known-good document's bytes as stored, not verified (for a delta's
    /// base, whose digest the caller checks).
    pub fn load_document_bytes(&self) -> Result<Option<Vec<u8>>, StateError> {
        let path = self.path.join(BUNDLE_FILE);
        match fs::read(&path) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(StateError::Io { path, source }),
        }
    }

    /// Stores a verified bundle document as the last-known-good, atomically.
    pub fn save_bundle(&self, document: &[u8]) -> Result<(), StateError> {
        self.write(BUNDLE_FILE, document)
    }

    /// Keeps the bundle just applied completely, as it was received, for the next
    /// prune: it says which apply phase each object that leaves had, and holds the
    /// delete hooks of a Helm release that leaves. Only a bundle with metadata has
    /// anything to say; for another the file is removed.
    pub fn save_applied(&self, bundle: &Bundle) -> Result<(), StateError> {
        if bundle.meta.is_some() {
            return self.write(APPLIED_FILE, &bundle.document("applied"));
        }
        let path = self.path.join(APPLIED_FILE);
        match fs::remove_file(&path) {
            Err(err) if err.kind() != io::ErrorKind::NotFound => {
                Err(StateError::Io { path, source: err })
            }
            _ => Ok(()),
        }
    }

    /// The bundle [`StateDir::save_applied`] kept, if it is the one the inventory says
    /// was applied last (`digest`) and still verifies; `None` otherwise (prune then
    /// goes in one step, without delete hooks).
    pub fn load_applied(&self, cluster: &str, digest: Option<&Digest>) -> Option<Bundle> {
        let path = self.path.join(APPLIED_FILE);
        let bytes = fs::read(&path).ok()?;
        match bundle::verify_document(&bytes, Some(cluster)) {
            Ok(bundle) if Some(&bundle.digest) == digest => Some(bundle),
            Ok(_) => None,
            Err(err) => {
                tracing::warn!(path = %path.display(), error = %err,
                    "the bundle last applied does not verify; ignoring it (the next prune goes in one step)");
                None
            }
        }
    }

    /// Reads the inventory; a missing or unreadable one is empty (nothing will be pruned).
    pub fn load_inventory(&self) -> Inventory {
        self.read_json(INVENTORY_FILE).unwrap_or_default()
    }

    pub fn save_inventory(&self, inventory: &Inventory) -> Result<(), StateError> {
        self.write_json(INVENTORY_FILE, inventory)
    }

    /// The latest status report and whether the hub has it.
    pub fn load_status(&self) -> Option<PendingReport> {
        self.read_json(STATUS_FILE)
    }

    /// Keeps `report` as a [`PendingReport`] (written from the report where it is,
    /// not a copy of it: a report lists every resource).
    pub fn save_status(&self, sent: bool, report: &StatusReport) -> Result<(), StateError> {
        #[derive(Serialize)]
        struct Kept<'a> {
            sent: bool,
            report: &'a StatusReport,
        }
        self.write_json(STATUS_FILE, &Kept { sent, report })
    }

    /// The sequence and digest of the last signed bundle taken, as kept beside the
    /// bundle: what stays held when `bundle.json` is damaged and set aside, so that an
    /// older signed bundle is refused then too.
    pub fn load_held(&self) -> Option<flotilla_core::signing::Held> {
        #[derive(Deserialize)]
        struct Kept {
            sequence: u64,
            digest: Digest,
        }
        let kept: Kept = self.read_json(HELD_FILE)?;
        Some(flotilla_core::signing::Held {
            sequence: kept.sequence,
            digest: kept.digest,
        })
    }

    /// Keeps `held` (see [`StateDir::load_held`]).
    pub fn save_held(&self, held: &flotilla_core::signing::Held) -> Result<(), StateError> {
        #[derive(Serialize)]
        struct Kept<'a> {
            sequence: u64,
            digest: &'a Digest,
        }
        self.write_json(
            HELD_FILE,
            &Kept {
                sequence: held.sequence,
                digest: &held.digest,
            },
        )
    }

    /// Removes what [`StateDir::save_held`] kept (a bundle taken unsigned holds none).
    pub fn forget_held(&self) -> Result<(), StateError> {
        match fs::remove_file(self.path.join(HELD_FILE)) {
            Err(err) if err.kind() != io::ErrorKind::NotFound => Err(StateError::Io {
                path: self.path.join(HELD_FILE),
                source: err,
            }),
            _ => Ok(()),
        }
    }

    /// Reads a JSON file of the state folder; a damaged one is logged and ignored.
    pub fn read_json<T: for<'de> Deserialize<'de>>(&self, name: &str) -> Option<T> {
        let path = self.path.join(name);
        let bytes = match fs::read(&path) {
            Ok(bytes) => bytes,
            Err(err) if err.kind() == io::ErrorKind::NotFound => return None,
            Err(err) => {
                tracing::error!(path = %path.display(), error = %err, "cannot read state file; ignoring it");
                return None;
            }
        };
        match serde_json::from_slice(&bytes) {
            Ok(value) => Some(value),
            Err(err) => {
                tracing::error!(path = %path.display(), error = %err, "state file is not valid; ignoring it");
                None
            }
        }
    }

    /// Writes `value` as JSON into the file as it is serialised (an inventory or a report
    /// of 100,000 resources is never held whole as text).
    pub fn write_json<T: Serialize>(&self, name: &str, value: &T) -> Result<(), StateError> {
        flotilla_fs::write_atomically_with(&self.path.join(name), Mode::Private, |file| {
            serde_json::to_writer_pretty(file, value).map_err(io::Error::from)
        })
        .map_err(|source| StateError::Io {
            path: self.path.join(name),
            source,
        })
    }

    fn write(&self, name: &str, bytes: &[u8]) -> Result<(), StateError> {
        flotilla_fs::write_atomically(&self.path.join(name), bytes, Mode::Private).map_err(
            |source| StateError::Io {
                path: self.path.join(name),
                source,
            },
        )
    }
}

/// The last-known-good document's bytes (which its bundle's resources are parts of) and
/// what verifying them gave.
pub type StoredDocument = (Arc<Vec<u8>>, VerifiedDocument);

/// The latest status report kept in the state dir, and whether the hub acknowledged it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingReport {
    pub sent: bool,
    pub report: StatusReport,
}

/// What flotilla may have created through a sink: everything it applied and has not
/// pruned since. An apply first records the union of the old entries and the new
/// bundle's, so that an apply cut short never leaves objects nobody will prune.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Inventory {
    /// The sink the entries belong to (`kube`, or `dir:PATH`).
    #[serde(default)]
    pub sink: String,
    /// The digest of the last bundle applied and pruned completely.
    pub applied: Option<Digest>,
    pub entries: Vec<InventoryEntry>,
}

impl Inventory {
    /// The entries of this inventory and of `bundle`, without repeating an identity
    /// (the bundle's apiVersion wins).
    pub fn union_with(&self, bundle: &Bundle) -> Vec<InventoryEntry> {
        let mut entries = InventoryEntry::of_bundle(bundle);
        // The bundle's entries have the identities of its resources.
        let keys: std::collections::HashSet<&ResourceKey> =
            bundle.resources.iter().map(|r| &*r.key).collect();
        entries.extend(
            self.entries
                .iter()
                .filter(|entry| !keys.contains(&entry.key()))
                .cloned(),
        );
        entries
    }

    /// The entries that `bundle` no longer holds: what a complete apply prunes.
    pub fn left_out_of(&self, bundle: &Bundle) -> Vec<InventoryEntry> {
        let keys: std::collections::HashSet<&ResourceKey> =
            bundle.resources.iter().map(|r| &*r.key).collect();
        self.entries
            .iter()
            .filter(|entry| !keys.contains(&entry.key()))
            .cloned()
            .collect()
    }
}

/// One object in the inventory; the apiVersion is kept so it can be found to prune it.
/// The identity is shared with the bundle's resource when the entry is made from one
/// (an agent keeps an entry for every resource it applied, so a copy of each identity
/// would cost more than the resource's bytes for a bundle of many small ones), and the
/// apiVersion with the entries before it that have the same. On disk an entry is
/// `{"apiVersion", "kind", "namespace", "name"}`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct InventoryEntry {
    api_version: Arc<str>,
    /// Its group is always the apiVersion's.
    key: Arc<ResourceKey>,
}

/// An [`InventoryEntry`] as it is written down.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct InventoryEntryOnDisk<S> {
    api_version: S,
    kind: S,
    #[serde(default)]
    namespace: S,
    name: S,
}

impl Serialize for InventoryEntry {
    fn serialize<Ser: serde::Serializer>(&self, serializer: Ser) -> Result<Ser::Ok, Ser::Error> {
        InventoryEntryOnDisk {
            api_version: &*self.api_version,
            kind: self.key.kind(),
            namespace: self.key.namespace(),
            name: self.key.name(),
        }
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for InventoryEntry {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let entry = InventoryEntryOnDisk::<String>::deserialize(deserializer)?;
        Ok(InventoryEntry::new(
            &entry.api_version,
            entry.kind,
            entry.namespace,
            entry.name,
        ))
    }
}

impl InventoryEntry {
    pub fn new(
        api_version: &str,
        kind: impl AsRef<str>,
        namespace: impl AsRef<str>,
        name: impl AsRef<str>,
    ) -> InventoryEntry {
        InventoryEntry {
            api_version: Arc::from(api_version),
            key: Arc::new(ResourceKey::new(
                bundle::api_group(api_version),
                kind,
                namespace,
                name,
            )),
        }
    }

    pub fn of(resource: &Resource) -> InventoryEntry {
        InventoryEntry::sharing(resource, &mut None)
    }

    /// The entry of `resource`, its apiVersion taken from `last` when the same (and
    /// left there for the next).
    fn sharing(resource: &Resource, last: &mut Option<Arc<str>>) -> InventoryEntry {
        // A verified bundle's resources all have a string apiVersion.
        let api_version = resource.api_version().unwrap_or_default();
        let api_version = match last {
            Some(shared) if **shared == *api_version => Arc::clone(shared),
            _ => last.insert(Arc::from(api_version)).clone(),
        };
        InventoryEntry {
            api_version,
            key: Arc::clone(&resource.key),
        }
    }

    pub fn of_bundle(bundle: &Bundle) -> Vec<InventoryEntry> {
        let mut last = None;
        bundle
            .resources
            .iter()
            .map(|r| InventoryEntry::sharing(r, &mut last))
            .collect()
    }

    pub fn api_version(&self) -> &str {
        &self.api_version
    }

    pub fn key(&self) -> &ResourceKey {
        &self.key
    }

    /// The identity, to share.
    pub fn shared_key(&self) -> &Arc<ResourceKey> {
        &self.key
    }

    pub fn kind(&self) -> &str {
        self.key.kind()
    }

    pub fn namespace(&self) -> &str {
        self.key.namespace()
    }

    pub fn name(&self) -> &str {
        self.key.name()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::bundle_of;
    use serde_json::json;

    fn config_map(name: &str, value: &str) -> serde_json::Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": name, "namespace": "demo"}, "data": {"k": value}})
    }

    #[test]
    fn keeps_the_bundle_and_verifies_it_again_when_read_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let bundle = bundle_of("edge-1", vec![config_map("a", "1")]);
        {
            let state = StateDir::open(dir.path()).expect("opens");
            assert!(state.load_bundle("edge-1").expect("loads").is_none());
            state
                .save_bundle(&bundle.document("main@sha1:1"))
                .expect("saves");
        }
        let state = StateDir::open(dir.path()).expect("opens again");
        let loaded = state
            .load_bundle("edge-1")
            .expect("loads")
            .expect("present");
        assert_eq!(loaded.digest, bundle.digest);
        let names: Vec<String> = fs::read_dir(dir.path())
            .expect("lists")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .filter(|n| flotilla_fs::is_temporary(n) || n.ends_with(OLD_TMP_SUFFIX))
            .collect();
        assert!(names.is_empty(), "no temporary file remains: {names:?}");
    }

    #[test]
    fn a_damaged_bundle_is_set_aside_and_the_agent_starts_without_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let bundle = bundle_of("edge-1", vec![config_map("a", "1")]);
        let tampered = String::from_utf8(bundle.document("r"))
            .expect("utf-8")
            .replace("\"1\"", "\"2\"");
        fs::write(dir.path().join(BUNDLE_FILE), tampered).expect("writes");
        let state = StateDir::open(dir.path()).expect("opens");
        assert!(state.load_bundle("edge-1").expect("loads").is_none());
        assert!(dir.path().join("bundle.json.damaged").exists());
        assert!(!dir.path().join(BUNDLE_FILE).exists());
    }

    #[test]
    fn another_clusters_bundle_is_an_error_that_names_both() {
        let dir = tempfile::tempdir().expect("tempdir");
        let bundle = bundle_of("edge-2", vec![config_map("a", "1")]);
        fs::write(dir.path().join(BUNDLE_FILE), bundle.document("r")).expect("writes");
        let state = StateDir::open(dir.path()).expect("opens");
        let err = state.load_bundle("edge-1").expect_err("refused");
        let text = err.to_string();
        assert!(text.contains("edge-2") && text.contains("edge-1"), "{text}");
    }

    #[test]
    fn the_bundle_last_applied_is_kept_only_with_metadata_and_read_only_for_its_digest() {
        let dir = tempfile::tempdir().expect("tempdir");
        let state = StateDir::open(dir.path()).expect("opens");
        let phased = crate::testing::phased_bundle_of(
            "edge-1",
            vec![("db", config_map("a", "1")), ("app", config_map("b", "1"))],
            &[&["db"], &["app"]],
        );
        state.save_applied(&phased).expect("saves");
        let loaded = state
            .load_applied("edge-1", Some(&phased.digest))
            .expect("present");
        assert_eq!(loaded.digest, phased.digest);
        assert_eq!(loaded.resource_phases(), [0, 1]);
        // Another digest in the inventory (the file is older than it): not used.
        let plain = bundle_of("edge-1", vec![config_map("a", "1")]);
        assert!(state.load_applied("edge-1", Some(&plain.digest)).is_none());
        assert!(state.load_applied("edge-1", None).is_none());
        assert!(state.load_applied("edge-2", Some(&phased.digest)).is_none());
        // A bundle without metadata has nothing to say: the file goes.
        state.save_applied(&plain).expect("saves");
        assert!(!dir.path().join(APPLIED_FILE).exists());
        assert!(state.load_applied("edge-1", Some(&phased.digest)).is_none());
    }

    #[test]
    fn leftover_temporary_files_are_removed_at_start() {
        let dir = tempfile::tempdir().expect("tempdir");
        fs::write(dir.path().join(".bundle.json.tmp"), b"{half a bund").expect("writes");
        fs::write(dir.path().join("notes.txt"), b"mine").expect("writes");
        let _state = StateDir::open(dir.path()).expect("opens");
        assert!(!dir.path().join(".bundle.json.tmp").exists());
        assert!(dir.path().join("notes.txt").exists());
    }

    #[test]
    fn a_second_agent_on_the_same_folder_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let _first = StateDir::open(dir.path()).expect("opens");
        let err = StateDir::open(dir.path()).expect_err("locked");
        assert!(matches!(err, StateError::Locked { .. }), "{err}");
    }

    #[test]
    fn damaged_inventory_and_status_read_as_absent() {
        let dir = tempfile::tempdir().expect("tempdir");
        fs::write(dir.path().join(INVENTORY_FILE), b"{\"entries\": [").expect("writes");
        fs::write(dir.path().join(STATUS_FILE), b"null?").expect("writes");
        let state = StateDir::open(dir.path()).expect("opens");
        assert_eq!(state.load_inventory(), Inventory::default());
        assert_eq!(state.load_status(), None);
    }

    #[test]
    fn inventory_union_and_prune_set() {
        let old = bundle_of("edge-1", vec![config_map("a", "1"), config_map("b", "1")]);
        let new = bundle_of("edge-1", vec![config_map("b", "2"), config_map("c", "1")]);
        let inventory = Inventory {
            sink: "kube".into(),
            applied: Some(old.digest.clone()),
            entries: InventoryEntry::of_bundle(&old),
        };
        let names = |entries: Vec<InventoryEntry>| -> Vec<String> {
            entries.iter().map(|e| e.name().to_string()).collect()
        };
        assert_eq!(names(inventory.union_with(&new)), ["b", "c", "a"]);
        assert_eq!(names(inventory.left_out_of(&new)), ["a"]);
        let state_dir = tempfile::tempdir().expect("tempdir");
        let state = StateDir::open(state_dir.path()).expect("opens");
        state.save_inventory(&inventory).expect("saves");
        assert_eq!(state.load_inventory(), inventory);
    }

    #[test]
    fn inventory_entries_share_their_resources_identity_and_keep_their_form_on_disk() {
        let bundle = bundle_of(
            "edge-1",
            vec![
                config_map("a", "1"),
                config_map("b", "1"),
                json!({"apiVersion": "apps/v1", "kind": "Deployment",
                       "metadata": {"name": "web", "namespace": "demo"}}),
            ],
        );
        let entries = InventoryEntry::of_bundle(&bundle);
        for (entry, resource) in entries.iter().zip(&bundle.resources) {
            assert!(
                Arc::ptr_eq(entry.shared_key(), &resource.key),
                "{}",
                entry.name()
            );
        }
        // The two ConfigMaps, next to each other in the bundle, share their apiVersion.
        let v1: Vec<&InventoryEntry> = entries.iter().filter(|e| e.api_version() == "v1").collect();
        assert!(Arc::ptr_eq(&v1[0].api_version, &v1[1].api_version));
        // On disk, as an inventory written before identities were shared.
        let written = serde_json::to_value(&entries).expect("serialises");
        assert_eq!(
            written,
            json!([
                {"apiVersion": "v1", "kind": "ConfigMap", "namespace": "demo", "name": "a"},
                {"apiVersion": "v1", "kind": "ConfigMap", "namespace": "demo", "name": "b"},
                {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "demo", "name": "web"},
            ])
        );
        let older = json!([{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"}]);
        let read: Vec<InventoryEntry> = serde_json::from_value(older).expect("reads");
        assert_eq!(
            read,
            [InventoryEntry::new("apps/v1", "Deployment", "", "web")]
        );
        assert_eq!(read[0].key().group(), "apps");
    }
}
