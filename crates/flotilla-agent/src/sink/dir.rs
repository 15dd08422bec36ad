//! The `dir:PATH` sink: one YAML file per resource in a folder that a cluster's own
//! auto-deploy mechanism reads (k3s `/var/lib/rancher/k3s/server/manifests`, MicroShift
//! `/etc/microshift/manifests.d/<name>/`).
//!
//! The sink keeps a manifest of the files it wrote in the agent's state folder, and it
//! only ever replaces or removes files listed there: files it did not write are never
//! touched. A resource whose file name is taken by such a file fails with a message
//! saying so. The manifest first records every file an apply may write (old and new),
//! then the files are written, then the files of resources that left are removed, and
//! only then does the manifest shrink to the new set; an agent killed at any point
//! therefore never forgets a file it wrote.

mod drift;
mod names;

use std::collections::BTreeSet;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use names::{Listed, Names, union};

use flotilla_fs::Mode;

use super::{ApplyOutcome, Sink, apply_phases, apply_rank, prune_phases, with_flotilla_metadata};
use crate::cache::InventoryEntry;
use flotilla_core::bundle::{Bundle, Digest, Resource, ResourceKey};
use flotilla_core::status::{ResourceState, ResourceStatus};

/// The manifest of written files, in the agent's state folder.
const MANIFEST_FILE: &str = "dir-sink.json";
/// The file a MicroShift-style kustomize loader reads.
pub const KUSTOMIZATION_FILE: &str = "kustomization.yaml";
/// Temporary files of earlier versions in the target folder: `.flotilla-<name>.tmp`.
/// Today's are [`flotilla_fs`]'s hidden `.flotilla-tmp-…` names. Neither k3s (which
/// reads `.yaml`, `.yml` and `.json`) nor kustomize (which reads what it is told)
/// picks either up.
const OLD_TMP_PREFIX: &str = ".flotilla-";
const OLD_TMP_SUFFIX: &str = ".tmp";
/// File names longer than this are shortened and made unique with a hash.
const MAX_NAME_BYTES: usize = 200;

/// Writes resources as files into one folder.
#[derive(Debug)]
pub struct DirSink {
    target: PathBuf,
    state_dir: PathBuf,
    kustomization: bool,
    /// What past drift checks corrected (see [`drift`]).
    memory: super::drift::Memory,
    /// The bundle last applied completely, when it has metadata: the files of what
    /// left the bundle are removed in reverse of its apply phases.
    last_applied: Option<std::sync::Arc<Bundle>>,
}

/// The files an apply wants. Their contents are made one file at a time as each is
/// written or compared ([`DirSink::content`]), never all held together: a bundle's
/// YAML is larger than the bundle.
#[derive(Default)]
struct DesiredFiles<'b> {
    /// Their names, in the order to write them: the bundle's apply phases one after
    /// the other, each in apply order, and the kustomization last. There is no health
    /// to wait for here, but a reader that picks files up as they come sees them in
    /// that order.
    names: Names,
    /// What each of them holds, in the same order: a resource, or `None` for the
    /// kustomization.
    held: Vec<Option<&'b Arc<Resource>>>,
}

/// What writing the desired files did.
#[derive(Default)]
struct Writes {
    written: usize,
    unchanged: usize,
    /// A failure of a file that holds no resource (the kustomization).
    other_failure: Option<String>,
}

/// What removing the files of resources that left did.
#[derive(Default)]
struct Removal {
    /// The files removed, in the order they were.
    removed: Vec<String>,
    /// Files that could not be removed (they stay in the manifest).
    kept: BTreeSet<String>,
    /// Files of resources to prune that the manifest did not list (it was lost) and
    /// that do not carry this cluster's header: not flotilla's, left in place.
    foreign: BTreeSet<String>,
    failure: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
struct Manifest {
    target: PathBuf,
    files: Names,
}

impl DirSink {
    /// A sink writing into `target`, keeping its manifest in the agent's `state_dir`.
    /// With `kustomization`, it also writes a `kustomization.yaml` listing its files,
    /// which is what MicroShift's manifest loader needs.
    pub fn new(target: &Path, state_dir: &Path, kustomization: bool) -> DirSink {
        DirSink {
            target: target.to_path_buf(),
            state_dir: state_dir.to_path_buf(),
            kustomization,
            memory: super::drift::Memory::default(),
            last_applied: None,
        }
    }

    pub fn target(&self) -> &Path {
        &self.target
    }

    fn load_manifest(&self) -> Manifest {
        let path = self.state_dir.join(MANIFEST_FILE);
        // Read as it is parsed: the names go straight into one buffer.
        let manifest: Manifest = match fs::File::open(&path) {
            Ok(file) => match serde_json::from_reader(io::BufReader::new(file)) {
                Ok(manifest) => manifest,
                Err(err) => {
                    tracing::error!(path = %path.display(), error = %err,
                        "the dir sink's manifest is damaged; files written before will not be removed");
                    Manifest::default()
                }
            },
            Err(_) => Manifest::default(),
        };
        if manifest.target != self.target {
            if !manifest.files.is_empty() {
                tracing::warn!(
                    previous = %manifest.target.display(), now = %self.target.display(),
                    "the dir sink now writes to another folder; files in the previous one are left as they are"
                );
            }
            return Manifest {
                target: self.target.clone(),
                files: Names::default(),
            };
        }
        manifest
    }

    /// Records the names `files` gives (in order, each once) as the manifest (what
    /// [`Manifest`] reads back), written as they come.
    fn save_manifest<'a, I: Iterator<Item = &'a str>>(
        &self,
        files: impl Fn() -> I,
    ) -> io::Result<()> {
        #[derive(Serialize)]
        #[serde(bound(serialize = "Listed<F>: Serialize"))]
        struct Written<'t, F> {
            target: &'t Path,
            files: Listed<F>,
        }
        let manifest = Written {
            target: &self.target,
            files: Listed(files),
        };
        flotilla_fs::write_atomically_with(
            &self.state_dir.join(MANIFEST_FILE),
            Mode::Private,
            |file| serde_json::to_writer_pretty(file, &manifest).map_err(io::Error::from),
        )
    }

    /// Replaces one file (readable by its owner only: bundles may hold Secrets, and
    /// k3s and MicroShift read their folders as root); the folder is synced once after
    /// all of them.
    fn write_file(&self, name: &str, content: &[u8]) -> io::Result<()> {
        flotilla_fs::replace_file(&self.target.join(name), content, Mode::Private)
    }

    /// Writes the bundle's files, then removes the files of resources that left it.
    /// Nothing is removed while the new bundle is not fully in place, so the folder
    /// never holds less than the old bundle did.
    fn apply_files(&mut self, bundle: &Bundle, prune: &[InventoryEntry]) -> ApplyOutcome {
        let failed_everything = |message: String| {
            let resources = bundle
                .resources
                .iter()
                .map(|r| ResourceStatus::new(&r.key, ResourceState::Failed, message.clone()))
                .collect();
            ApplyOutcome {
                resources,
                complete: false,
                message,
                kept: Vec::new(),
            }
        };
        if let Err(err) = prepare_target(&self.target) {
            return failed_everything(format!(
                "cannot use the folder {}: {err}",
                self.target.display()
            ));
        }
        let old = self.load_manifest();
        let header = header(&bundle.cluster);
        let desired = self.desired_files(bundle);
        let foreign: BTreeSet<String> = desired
            .names
            .sorted()
            .filter(|name| !old.files.contains(name) && self.is_foreign(name, &header))
            .map(String::from)
            .collect();

        // Record intent: every file this apply may write, plus the old ones.
        let intent = || {
            union(
                old.files.sorted(),
                desired.names.sorted().filter(|n| !foreign.contains(*n)),
            )
        };
        if let Err(err) = self.save_manifest(intent) {
            return failed_everything(format!(
                "cannot record the dir sink's manifest in {}: {err}",
                self.state_dir.display()
            ));
        }

        // One line per resource, in the order they are written (apply order), which is
        // the report's order: no map from identities to lines. Sized once: grown by
        // doubling, 100,000 statuses held a third more than they need, and twice that
        // while the last doubling copied them.
        let mut resources: Vec<ResourceStatus> =
            Vec::with_capacity(bundle.resources.len() + prune.len());
        let writes = self.write_desired(bundle, &header, &desired, &foreign, &mut resources);
        let failures = resources
            .iter()
            .filter(|s| s.state == ResourceState::Failed)
            .count();
        let synced = flotilla_fs::sync_dir(&self.target);
        if failures > 0 || writes.other_failure.is_some() {
            let mut message = format!(
                "{failures} of {} resources could not be written to {}",
                bundle.resources.len(),
                self.target.display()
            );
            if let Some(other) = writes.other_failure {
                message = format!("{message}; {other}");
            }
            return ApplyOutcome {
                resources,
                complete: false,
                message,
                kept: Vec::new(),
            };
        }

        let removal = self.remove_left(&old, &desired, prune, &header);
        let sync = synced.and_then(|()| flotilla_fs::sync_dir(&self.target));
        let previous = self.last_applied.as_deref();
        for entry in prune_phases(prune, previous)
            .into_iter()
            .flat_map(|(_, group)| group)
        {
            let key = entry.key();
            let name = file_name(key);
            let (state, message) = if removal.kept.contains(&name) {
                (ResourceState::Failed, "its file could not be removed")
            } else if removal.foreign.contains(&name) {
                (
                    ResourceState::Pruned,
                    "its file no longer carries this cluster's flotilla header: left in place",
                )
            } else {
                (ResourceState::Pruned, "its file was removed")
            };
            resources.push(ResourceStatus::new(entry.shared_key(), state, message));
        }
        let committed = self.save_manifest(|| {
            union(
                desired.names.sorted(),
                removal.kept.iter().map(String::as_str),
            )
        });
        let problem = removal
            .failure
            .or_else(|| {
                sync.err()
                    .map(|e| format!("cannot sync {}: {e}", self.target.display()))
            })
            .or_else(|| {
                committed
                    .err()
                    .map(|e| format!("cannot record the dir sink's manifest: {e}"))
            });
        if problem.is_none() {
            self.last_applied = super::worth_keeping(bundle);
        }
        match problem {
            Some(message) => ApplyOutcome {
                resources,
                complete: false,
                message,
                kept: Vec::new(),
            },
            None => ApplyOutcome {
                resources,
                complete: true,
                message: format!(
                    "{} resources in {}: {} written, {} unchanged, {} removed",
                    bundle.resources.len(),
                    self.target.display(),
                    writes.written,
                    writes.unchanged,
                    removal.removed.len()
                ),
                kept: Vec::new(),
            },
        }
    }

    /// Every file's name, with the resource it holds (`None` for the kustomization),
    /// in the order to write them.
    fn desired_files<'b>(&self, bundle: &'b Bundle) -> DesiredFiles<'b> {
        let mut desired = DesiredFiles::default();
        desired.held.reserve_exact(bundle.resources.len() + 1);
        for resource in apply_phases(bundle).into_iter().flatten() {
            desired.held.push(Some(resource));
            desired.names.push(&file_name(&resource.key));
        }
        if self.kustomization {
            desired.held.push(None);
            desired.names.push(KUSTOMIZATION_FILE);
        }
        desired.names.index();
        desired
    }

    /// The content of a resource's file: the header, the resource's identity and the
    /// resource as YAML.
    fn content(bundle: &Bundle, resource: &Resource, header: &str) -> Result<Vec<u8>, String> {
        let value = with_flotilla_metadata(resource.value(), &bundle.cluster, None);
        let yaml = serde_saphyr::to_string(&value)
            .map_err(|err| format!("cannot write it as YAML: {err}"))?;
        let identity = comment_safe(&resource.key.to_string());
        Ok(format!("{header}\n# {identity}\n{yaml}").into_bytes())
    }

    /// Writes the files that changed, never one that is `foreign`, and appends each
    /// resource's outcome to `statuses`, in the order written. Each file's content is
    /// made just before it is written and dropped after.
    fn write_desired(
        &self,
        bundle: &Bundle,
        header: &str,
        desired: &DesiredFiles,
        foreign: &BTreeSet<String>,
        statuses: &mut Vec<ResourceStatus>,
    ) -> Writes {
        let mut writes = Writes::default();
        // Resources that cannot be written as YAML have no file, so the kustomization
        // (written last) does not list one.
        let mut unwritable = BTreeSet::new();
        for (index, &resource) in desired.held.iter().enumerate() {
            let name = desired.names.get(index);
            let content = match resource {
                Some(resource) => match Self::content(bundle, resource, header) {
                    Ok(content) => content,
                    Err(message) => {
                        statuses.push(ResourceStatus::new(
                            &resource.key,
                            ResourceState::Failed,
                            message,
                        ));
                        unwritable.insert(name);
                        continue;
                    }
                },
                None => {
                    let listed: Vec<&str> = desired
                        .names
                        .sorted()
                        .filter(|name| *name != KUSTOMIZATION_FILE && !unwritable.contains(name))
                        .collect();
                    kustomization(header, &listed)
                }
            };
            let outcome = if foreign.contains(name) {
                Err(format!(
                    "{} already exists and was not written by flotilla; it is left alone: \
                     move it away to let flotilla manage this resource",
                    self.target.join(name).display()
                ))
            } else if fs::read(self.target.join(name)).is_ok_and(|existing| existing == content) {
                // Unchanged files are not rewritten: k3s re-applies a file whenever
                // its modification time changes.
                writes.unchanged += 1;
                Ok(())
            } else {
                match self.write_file(name, &content) {
                    Ok(()) => {
                        writes.written += 1;
                        Ok(())
                    }
                    Err(err) => Err(format!(
                        "cannot write {}: {err}",
                        self.target.join(name).display()
                    )),
                }
            };
            match (resource.map(|r| &r.key), outcome) {
                (Some(key), Ok(())) => {
                    statuses.push(ResourceStatus::new(key, ResourceState::Applied, ""));
                }
                (Some(key), Err(message)) => {
                    statuses.push(ResourceStatus::new(key, ResourceState::Failed, message));
                }
                (None, Ok(())) => {}
                (None, Err(message)) => writes.other_failure = Some(message),
            }
        }
        writes
    }

    /// Removes the files of the old manifest that the new bundle does not hold: those of
    /// the resources that left it (`prune`) in reverse phase order, as the kube sink
    /// deletes them ([`prune_phases`]), and before them any other (a file whose resource
    /// flotilla no longer knows).
    fn remove_left(
        &self,
        old: &Manifest,
        desired: &DesiredFiles,
        prune: &[InventoryEntry],
        header: &str,
    ) -> Removal {
        let ordered: Vec<String> = prune_phases(prune, self.last_applied.as_deref())
            .into_iter()
            .flat_map(|(_, group)| group)
            .map(|entry| file_name(entry.key()))
            .collect();
        let mut left: BTreeSet<&str> = old
            .files
            .sorted()
            .filter(|n| !desired.names.contains(n))
            .collect();
        let mut removal = Removal::default();
        // A resource to prune whose file the manifest does not list (the manifest was
        // lost or damaged, while the inventory was not): its file is removed when it
        // carries this cluster's header, as such files are adopted for writing.
        for name in &ordered {
            if left.contains(name.as_str()) || desired.names.contains(name) {
                continue;
            }
            match self.carries_header(name, header) {
                Some(true) => {
                    left.insert(name);
                }
                Some(false) => {
                    removal.foreign.insert(name.clone());
                }
                None => {}
            }
        }
        let known: BTreeSet<&str> = ordered.iter().map(String::as_str).collect();
        let unknown = left.iter().copied().filter(|n| !known.contains(n));
        let in_order = ordered
            .iter()
            .map(String::as_str)
            .filter(|n| left.contains(n));
        for name in unknown.chain(in_order) {
            match fs::remove_file(self.target.join(name)) {
                Ok(()) => removal.removed.push(name.to_string()),
                Err(err) if err.kind() == io::ErrorKind::NotFound => {}
                Err(err) => {
                    removal.kept.insert(name.to_string());
                    removal.failure = Some(format!(
                        "cannot remove {}: {err}",
                        self.target.join(name).display()
                    ));
                }
            }
        }
        removal
    }

    /// A file not in the manifest may still be ours if the manifest was lost (a wiped
    /// state folder): a file that starts with this cluster's flotilla header is adopted.
    fn is_foreign(&self, name: &str, header: &str) -> bool {
        self.carries_header(name, header) == Some(false)
    }

    /// Whether the file `name` starts with `header`; `None` if it cannot be read.
    fn carries_header(&self, name: &str, header: &str) -> Option<bool> {
        use std::io::Read as _;
        let mut start = Vec::with_capacity(header.len());
        fs::File::open(self.target.join(name))
            .and_then(|file| file.take(header.len() as u64).read_to_end(&mut start))
            .ok()?;
        Some(start == header.as_bytes())
    }
}

impl Sink for DirSink {
    fn id(&self) -> String {
        format!("dir:{}", self.target.display())
    }

    fn apply<'a>(
        &'a mut self,
        bundle: &'a Bundle,
        prune: &'a [InventoryEntry],
    ) -> impl std::future::Future<Output = ApplyOutcome> + Send + 'a {
        // The files are small and few; writing them in place keeps the agent on one
        // thread.
        std::future::ready(self.apply_files(bundle, prune))
    }

    fn health<'a>(
        &'a mut self,
        _bundle: &'a Bundle,
    ) -> impl std::future::Future<Output = Option<Vec<ResourceStatus>>> + Send + 'a {
        // The folder's reader applies the files; their health is not visible here.
        std::future::ready(None)
    }

    fn recall_applied(&mut self, bundle: Option<std::sync::Arc<Bundle>>) {
        self.last_applied = bundle;
    }

    fn check_drift<'a>(
        &'a mut self,
        bundle: &'a Bundle,
    ) -> impl std::future::Future<Output = super::drift::DriftCheck> + Send + 'a {
        std::future::ready(self.detect_drift(bundle))
    }
}

fn prepare_target(target: &Path) -> io::Result<()> {
    fs::create_dir_all(target)?;
    flotilla_fs::remove_temporary_files(target, |name| {
        flotilla_fs::is_temporary(name)
            || (name.starts_with(OLD_TMP_PREFIX) && name.ends_with(OLD_TMP_SUFFIX))
    })
    .map(drop)
}

/// The first line of every file the sink writes.
fn header(cluster: &str) -> String {
    format!(
        "# Written by the flotilla agent for cluster {}. Do not edit: the agent replaces this file.",
        comment_safe(cluster)
    )
}

/// Text that is safe inside a `#` comment line: printable ASCII stays, anything else
/// (a line break, which would end the comment and let the rest be read as YAML, or
/// U+0085, U+2028 and U+2029, which YAML 1.1 readers also take for line breaks) is
/// written as a `\u{…}` escape, and `\` as `\\`.
fn comment_safe(text: &str) -> String {
    let mut safe = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\\' => safe.push_str("\\\\"),
            ' '..='~' => safe.push(c),
            other => safe.push_str(&format!("\\u{{{:x}}}", other as u32)),
        }
    }
    safe
}

fn kustomization(header: &str, files: &[&str]) -> Vec<u8> {
    let mut text = format!(
        "{header}\napiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n"
    );
    for file in files {
        text.push_str(&format!("- {file}\n"));
    }
    if files.is_empty() {
        text = format!(
            "{header}\napiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: []\n"
        );
    }
    text.into_bytes()
}

/// The file name of a resource: `<rank>-<kind>[-<namespace>]-<name>-<hash>.yaml`, in
/// lowercase letters, digits and `-` only. k3s names the AddOn object that tracks a
/// manifest after its file's base name, which must be a lowercase RFC 1123 name (an
/// underscore or a capital letter fails there), so nothing else may appear. The rank
/// (0 CRDs, 1 Namespaces, 2 the rest) makes a folder listing follow apply order. The
/// hash (40 bits of the SHA-256 of the exact identity, group included) keeps names
/// unique where lowercasing and replacing characters could make two identities look
/// alike, and is stable, so a resource keeps its file from bundle to bundle. The file
/// itself names the resource in full in its second line.
pub fn file_name(key: &ResourceKey) -> String {
    let identity = format!(
        "{}\0{}\0{}\0{}",
        key.group(),
        key.kind(),
        key.namespace(),
        key.name()
    );
    let hash = Digest::of(identity.as_bytes());
    let mut readable = format!("{}-{}", apply_rank(key), sanitise(key.kind()));
    if !key.namespace().is_empty() {
        readable.push('-');
        readable.push_str(&sanitise(key.namespace()));
    }
    readable.push('-');
    readable.push_str(&sanitise(key.name()));
    // The readable part is ASCII after sanitising, so any byte index is a boundary.
    readable.truncate(MAX_NAME_BYTES - 11);
    format!("{readable}-{}.yaml", &hash.hex()[..10])
}

fn sanitise(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{bundle_of, phased_bundle_of};
    use serde_json::{Value, json};

    fn config_map(name: &str, data: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": name, "namespace": "demo"}, "data": data})
    }

    fn namespace(name: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    }

    fn cm(name: &str) -> String {
        file_name(&ResourceKey::new("", "ConfigMap", "demo", name))
    }

    fn ns_file(name: &str) -> String {
        file_name(&ResourceKey::new("", "Namespace", "", name))
    }

    struct Fixture {
        target: tempfile::TempDir,
        state: tempfile::TempDir,
    }

    impl Fixture {
        fn new() -> Fixture {
            Fixture {
                target: tempfile::tempdir().expect("tempdir"),
                state: tempfile::tempdir().expect("tempdir"),
            }
        }

        fn sink(&self, kustomization: bool) -> DirSink {
            DirSink::new(self.target.path(), self.state.path(), kustomization)
        }

        fn files(&self) -> Vec<String> {
            let mut names: Vec<String> = fs::read_dir(self.target.path())
                .expect("lists")
                .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
                .collect();
            names.sort();
            names
        }

        fn read(&self, name: &str) -> String {
            fs::read_to_string(self.target.path().join(name)).expect("reads")
        }
    }

    fn apply(sink: &mut DirSink, bundle: &Bundle, prune: &[InventoryEntry]) -> ApplyOutcome {
        sink.apply_files(bundle, prune)
    }

    #[test]
    fn writes_one_file_per_resource_that_reads_back_as_the_resource() {
        let fixture = Fixture::new();
        let tricky = json!({"yes": "yes", "on": "on", "zero": "0123", "multi": "a\nb: c\n",
                            "empty": "", "null": "null", "num": "1e3"});
        let bundle = bundle_of(
            "edge-1",
            vec![config_map("settings", tricky.clone()), namespace("demo")],
        );
        let outcome = apply(&mut fixture.sink(false), &bundle, &[]);
        assert!(outcome.complete, "{outcome:?}");
        assert_eq!(outcome.count(ResourceState::Applied), 2);
        assert_eq!(fixture.files(), [ns_file("demo"), cm("settings")]);
        let text = fixture.read(&cm("settings"));
        assert!(text.starts_with("# Written by the flotilla agent for cluster edge-1."));
        let parsed: Value = serde_saphyr::from_str(&text).expect("valid YAML");
        assert_eq!(parsed["data"], tricky);
        assert_eq!(
            parsed["metadata"]["labels"]["flotilla.dev/cluster"],
            "edge-1"
        );
    }

    #[test]
    fn no_name_can_break_out_of_the_comment_and_add_an_object() {
        // The payload from the issue tracker: a name that ends the comment line and
        // starts a second YAML document, a Secret in kube-system that is in no bundle.
        let payload = "innocent\n---\napiVersion: v1\nkind: Secret\nmetadata:\n  name: planted\n  namespace: kube-system\ndata:\n  token: aGk=\n";
        let fixture = Fixture::new();
        let resources = vec![
            config_map(payload, json!({"k": "v"})),
            config_map("line\u{2028}separator\u{85}next\rreturn", json!({})),
        ];
        let bundle = bundle_of("edge-1\n---\nkind: Secret", resources);
        let outcome = apply(&mut fixture.sink(false), &bundle, &[]);
        assert!(outcome.complete, "{outcome:?}");
        for file in fixture.files() {
            let text = fixture.read(&file);
            let lines: Vec<&str> = text.lines().collect();
            assert!(
                lines[0].starts_with("# Written by the flotilla agent"),
                "{text}"
            );
            assert!(lines[1].starts_with("# "), "{text}");
            assert!(
                lines[..2]
                    .iter()
                    .all(|l| l.bytes().all(|b| (b' '..=b'~').contains(&b))),
                "the comment lines hold printable ASCII only: {text}"
            );
            let documents: Vec<Value> =
                serde_saphyr::from_multiple(&text).expect("the file is YAML");
            assert_eq!(documents.len(), 1, "one object per file: {text}");
            assert_eq!(documents[0]["kind"], "ConfigMap", "{text}");
        }
        let text = fixture.read(&cm(payload));
        assert!(
            text.starts_with(
                "# Written by the flotilla agent for cluster edge-1\\u{a}---\\u{a}kind: Secret. \
                 Do not edit: the agent replaces this file.\n# ConfigMap demo/innocent\\u{a}---\\u{a}apiVersion: v1"
            ),
            "{text}"
        );
        let parsed: Value = serde_saphyr::from_str(&text).expect("valid YAML");
        assert_eq!(parsed["metadata"]["name"], payload);
    }

    #[test]
    fn removes_only_files_it_wrote_and_never_touches_others() {
        let fixture = Fixture::new();
        let mut sink = fixture.sink(false);
        fs::write(
            fixture.target.path().join("traefik.yaml"),
            "kind: HelmChart\n",
        )
        .expect("writes a file of the operator");
        let first = bundle_of(
            "edge-1",
            vec![config_map("a", json!({})), config_map("b", json!({}))],
        );
        assert!(apply(&mut sink, &first, &[]).complete);
        let second = bundle_of("edge-1", vec![config_map("b", json!({"k": "v"}))]);
        let prune: Vec<InventoryEntry> = InventoryEntry::of_bundle(&first)
            .into_iter()
            .filter(|e| e.name() == "a")
            .collect();
        let outcome = apply(&mut sink, &second, &prune);
        assert!(outcome.complete, "{outcome:?}");
        assert_eq!(fixture.files(), [cm("b"), "traefik.yaml".to_string()]);
        assert_eq!(fixture.read("traefik.yaml"), "kind: HelmChart\n");
        assert_eq!(outcome.count(ResourceState::Pruned), 1);
        assert!(fixture.read(&cm("b")).contains("k: v"));
    }

    #[test]
    fn a_file_it_did_not_write_is_not_overwritten_and_the_resource_fails() {
        let fixture = Fixture::new();
        let mut sink = fixture.sink(false);
        let name = &cm("a");
        fs::write(fixture.target.path().join(name), "hand written\n").expect("writes");
        let old = bundle_of("edge-1", vec![config_map("old", json!({}))]);
        assert!(apply(&mut sink, &old, &[]).complete);
        let bundle = bundle_of(
            "edge-1",
            vec![config_map("a", json!({})), config_map("b", json!({}))],
        );
        let prune: Vec<InventoryEntry> = InventoryEntry::of_bundle(&old);
        let outcome = apply(&mut sink, &bundle, &prune);
        assert!(!outcome.complete);
        assert_eq!(fixture.read(name), "hand written\n");
        let failed: Vec<&ResourceStatus> = outcome
            .resources
            .iter()
            .filter(|r| r.state == ResourceState::Failed)
            .collect();
        assert_eq!(failed.len(), 1);
        assert!(
            failed[0].message.contains("not written by flotilla"),
            "{failed:?}"
        );
        // Nothing is removed until the whole bundle is in place, and the failed name
        // is never recorded as flotilla's.
        assert!(fixture.files().contains(&cm("old")));
        let manifest = sink.load_manifest();
        assert!(!manifest.files.contains(name));
        assert!(manifest.files.contains(&cm("b")));
    }

    #[test]
    fn unchanged_files_are_not_rewritten() {
        let fixture = Fixture::new();
        let mut sink = fixture.sink(false);
        let bundle = bundle_of("edge-1", vec![config_map("a", json!({"k": "v"}))]);
        assert!(apply(&mut sink, &bundle, &[]).complete);
        let path = fixture.target.path().join(cm("a"));
        let before = fs::metadata(&path)
            .expect("stat")
            .modified()
            .expect("mtime");
        let old_time = before - std::time::Duration::from_secs(3600);
        fs::File::options()
            .write(true)
            .open(&path)
            .expect("opens")
            .set_modified(old_time)
            .expect("sets mtime");
        let outcome = apply(&mut sink, &bundle, &[]);
        assert!(
            outcome.message.contains("0 written, 1 unchanged"),
            "{outcome:?}"
        );
        let after = fs::metadata(&path)
            .expect("stat")
            .modified()
            .expect("mtime");
        assert_eq!(after, old_time);
        // A hand edit (drift) is undone by the next apply.
        fs::write(&path, "edited").expect("edits");
        assert!(apply(&mut sink, &bundle, &[]).message.contains("1 written"));
        assert!(fixture.read(&cm("a")).contains("k: v"));
    }

    #[test]
    fn each_line_of_the_report_shares_its_resources_identity() {
        // A report line per resource, each a copy of the resource's identity, cost
        // more than the resources themselves in a bundle of many small ones.
        let fixture = Fixture::new();
        let bundle = bundle_of(
            "edge-1",
            vec![
                config_map("a", json!({})),
                config_map("b", json!({})),
                namespace("demo"),
            ],
        );
        let outcome = apply(&mut fixture.sink(false), &bundle, &[]);
        assert!(outcome.complete, "{outcome:?}");
        assert_eq!(outcome.resources.len(), bundle.resources.len());
        for line in &outcome.resources {
            let resource = bundle
                .resources
                .iter()
                .find(|r| r.key == line.key)
                .expect("a line per resource of the bundle");
            assert!(
                Arc::ptr_eq(&resource.key, &line.key),
                "{} has a copy of its identity",
                line.key
            );
        }
    }

    #[test]
    fn resources_are_written_phase_by_phase_without_waiting() {
        let fixture = Fixture::new();
        let mut sink = fixture.sink(false);
        // `app` depends on `db`: its Namespace comes after db's ConfigMap, although
        // Namespaces come first within a phase.
        let bundle = phased_bundle_of(
            "edge-1",
            vec![
                ("app", namespace("app")),
                ("app", config_map("web", json!({}))),
                ("db", config_map("pg", json!({}))),
                ("db", namespace("demo")),
            ],
            &[&["db"], &["app"]],
        );
        let outcome = apply(&mut sink, &bundle, &[]);
        assert!(outcome.complete, "{outcome:?}");
        let order: Vec<(&str, ResourceState)> = outcome
            .resources
            .iter()
            .map(|r| (r.key.name(), r.state))
            .collect();
        use ResourceState::Applied;
        assert_eq!(
            order,
            [
                ("demo", Applied),
                ("pg", Applied),
                ("app", Applied),
                ("web", Applied)
            ]
        );
        let mut written = vec![ns_file("demo"), ns_file("app"), cm("pg"), cm("web")];
        written.sort();
        assert_eq!(fixture.files(), written);
    }

    #[test]
    fn files_that_leave_are_removed_in_reverse_phase_order() {
        let fixture = Fixture::new();
        let mut sink = fixture.sink(false);
        // `app` depends on `db`, which depends on `base`.
        let applied = phased_bundle_of(
            "edge-1",
            vec![
                ("base", namespace("demo")),
                ("db", namespace("db")),
                ("db", config_map("pg", json!({}))),
                ("app", namespace("app")),
                ("app", config_map("web", json!({}))),
            ],
            &[&["base"], &["db"], &["app"]],
        );
        assert!(apply(&mut sink, &applied, &[]).complete);
        let next = phased_bundle_of("edge-1", vec![("base", namespace("demo"))], &[&["base"]]);
        let prune = crate::cache::Inventory {
            sink: sink.id(),
            applied: Some(applied.digest.clone()),
            entries: InventoryEntry::of_bundle(&applied),
        }
        .left_out_of(&next);
        let old = sink.load_manifest();
        let desired = sink.desired_files(&next);
        let removal = sink.remove_left(&old, &desired, &prune, &header("edge-1"));
        // The last phase first, each in reverse apply order (its objects before its
        // Namespace); by name alone `pg` would go before `web`.
        assert_eq!(
            removal.removed,
            [cm("web"), ns_file("app"), cm("pg"), ns_file("db")]
        );
        assert_eq!(fixture.files(), [ns_file("demo")]);

        // The apply reports them in that order too.
        let fixture = Fixture::new();
        let mut sink = fixture.sink(false);
        assert!(apply(&mut sink, &applied, &[]).complete);
        let outcome = apply(&mut sink, &next, &prune);
        assert!(outcome.complete, "{outcome:?}");
        let pruned: Vec<&str> = outcome
            .resources
            .iter()
            .filter(|r| r.state == ResourceState::Pruned)
            .map(|r| r.key.name())
            .collect();
        assert_eq!(pruned, ["web", "app", "pg", "db"]);
        assert!(
            outcome.message.ends_with("4 removed"),
            "{}",
            outcome.message
        );
    }

    #[test]
    fn writes_a_kustomization_listing_its_files_when_asked() {
        let fixture = Fixture::new();
        let mut sink = fixture.sink(true);
        let bundle = bundle_of(
            "edge-1",
            vec![config_map("a", json!({})), namespace("demo")],
        );
        assert!(apply(&mut sink, &bundle, &[]).complete);
        let parsed: Value =
            serde_saphyr::from_str(&fixture.read(KUSTOMIZATION_FILE)).expect("valid YAML");
        assert_eq!(parsed["kind"], "Kustomization");
        assert_eq!(parsed["resources"], json!([ns_file("demo"), cm("a")]));
        // An empty bundle still leaves a valid kustomization.
        let empty = bundle_of("edge-1", vec![]);
        let prune = InventoryEntry::of_bundle(&bundle);
        assert!(apply(&mut sink, &empty, &prune).complete);
        assert_eq!(fixture.files(), [KUSTOMIZATION_FILE]);
        let parsed: Value =
            serde_saphyr::from_str(&fixture.read(KUSTOMIZATION_FILE)).expect("valid YAML");
        assert_eq!(parsed["resources"], json!([]));
    }

    #[test]
    fn files_left_by_a_lost_manifest_are_adopted_by_their_header() {
        let fixture = Fixture::new();
        let bundle = bundle_of("edge-1", vec![config_map("a", json!({}))]);
        assert!(apply(&mut fixture.sink(false), &bundle, &[]).complete);
        fs::remove_file(fixture.state.path().join(MANIFEST_FILE)).expect("loses manifest");
        let changed = bundle_of("edge-1", vec![config_map("a", json!({"k": "2"}))]);
        let outcome = apply(&mut fixture.sink(false), &changed, &[]);
        assert!(outcome.complete, "{outcome:?}");
        // Another cluster's file is not adopted.
        let other = bundle_of("edge-2", vec![config_map("a", json!({}))]);
        let state = tempfile::tempdir().expect("tempdir");
        let mut sink = DirSink::new(fixture.target.path(), state.path(), false);
        assert!(!apply(&mut sink, &other, &[]).complete);
    }

    #[test]
    fn files_to_prune_after_a_lost_manifest_are_removed_by_their_header() {
        let fixture = Fixture::new();
        let bundle = bundle_of(
            "edge-1",
            vec![
                config_map("a", json!({})),
                config_map("b", json!({})),
                config_map("c", json!({})),
            ],
        );
        assert!(apply(&mut fixture.sink(false), &bundle, &[]).complete);
        fs::remove_file(fixture.state.path().join(MANIFEST_FILE)).expect("loses manifest");
        // c's file was replaced by someone else's since: not flotilla's any more.
        fs::write(fixture.target.path().join(cm("c")), "kind: ConfigMap\n").expect("writes");
        let next = bundle_of("edge-1", vec![config_map("a", json!({}))]);
        let prune = crate::cache::Inventory {
            sink: fixture.sink(false).id(),
            applied: Some(bundle.digest.clone()),
            entries: InventoryEntry::of_bundle(&bundle),
        }
        .left_out_of(&next);
        let outcome = apply(&mut fixture.sink(false), &next, &prune);
        assert!(outcome.complete, "{outcome:?}");
        assert_eq!(fixture.files(), [cm("a"), cm("c")]);
        let message = |name: &str| {
            outcome
                .resources
                .iter()
                .find(|r| r.key().name() == name)
                .map(|r| (r.state, r.message.clone()))
        };
        assert_eq!(
            message("b"),
            Some((ResourceState::Pruned, "its file was removed".to_string()))
        );
        assert_eq!(
            message("c").map(|(_, m)| m),
            Some("its file no longer carries this cluster's flotilla header: left in place".into())
        );
    }

    #[test]
    fn leftover_temporary_files_of_the_sink_are_cleared() {
        let fixture = Fixture::new();
        fs::write(
            fixture
                .target
                .path()
                .join(format!(".flotilla-{}.tmp", cm("a"))),
            "half",
        )
        .expect("writes");
        fs::write(fixture.target.path().join(".other.tmp"), "not ours").expect("writes");
        let bundle = bundle_of("edge-1", vec![config_map("a", json!({}))]);
        assert!(apply(&mut fixture.sink(false), &bundle, &[]).complete);
        assert_eq!(fixture.files(), [".other.tmp".to_string(), cm("a")]);
    }

    #[test]
    fn file_names_are_valid_k3s_addon_names_unique_and_stable() {
        let key =
            |group: &str, kind: &str, ns: &str, name: &str| ResourceKey::new(group, kind, ns, name);
        let crd = file_name(&key(
            "apiextensions.k8s.io",
            "CustomResourceDefinition",
            "",
            "widgets.example.com",
        ));
        assert!(
            crd.starts_with("0-customresourcedefinition-widgets-example-com-"),
            "{crd}"
        );
        assert!(cm("settings").starts_with("2-configmap-demo-settings-"));
        assert!(ns_file("demo").starts_with("1-namespace-demo-"));
        // The base name is what k3s names its AddOn after: a lowercase RFC 1123
        // subdomain of at most 253 characters.
        let rbac = file_name(&key(
            "rbac.authorization.k8s.io",
            "ClusterRole",
            "",
            "system:Foo/bar_x",
        ));
        let long = file_name(&key("g", "K", "ns", &"x".repeat(300)));
        for name in [&crd, &rbac, &long, &cm("a")] {
            let base = name.strip_suffix(".yaml").expect("a .yaml file");
            assert!(
                base.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'),
                "{name}"
            );
            assert!(base.as_bytes()[0].is_ascii_digit() && base.as_bytes()[base.len() - 1] != b'-');
            assert!(name.len() <= MAX_NAME_BYTES + 5, "{}", name.len());
        }
        // Identities that read alike once lowercased and sanitised still differ.
        let alike = [
            file_name(&key("", "ConfigMap", "team-a", "web")),
            file_name(&key("", "ConfigMap", "team", "a-web")),
            file_name(&key("", "Configmap", "team-a", "web")),
            file_name(&key("example.com", "ConfigMap", "team-a", "web")),
        ];
        let distinct: BTreeSet<&String> = alike.iter().collect();
        assert_eq!(distinct.len(), alike.len(), "{alike:?}");
        // And a resource keeps its file name.
        assert_eq!(cm("a"), cm("a"));
        assert_eq!(
            cm("a"),
            "2-configmap-demo-a-".to_string() + &cm("a")[19..],
            "stable layout"
        );
    }
}
