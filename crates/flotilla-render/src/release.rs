//! Helm workloads: a workload's `spec.helm` read once per render (its chart, from
//! the snapshot's files, parsed once; its static values files parsed once), and its
//! release rendered per cluster through [`ReleaseCache`], which renders each distinct
//! input once: the merged values, the release, the capabilities, and the cluster only
//! for a chart that called a generating function (`randAlphaNum`, `genCA`, ...).
//!
//! What a release becomes: the `crds/` files of the enabled charts (when
//! `includeCRDs`), then every template's documents, parsed as the API server reads
//! YAML; `NOTES.txt` and empty documents make nothing, test hooks are left out (when
//! `skipTests`). The documents then take the release namespace as their default
//! namespace and every overlay like any manifest (the caller does that).

use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, OnceLock};

use hmac::{Hmac, Mac};
use serde_json::{Map, Value as Json};
use sha2::{Digest as _, Sha256};

use flotilla_core::diagnostic::Diagnostic;
use flotilla_core::model::{HelmSpec, KubernetesSpec};
use flotilla_core::snapshot::FleetSnapshot;

use crate::fleet::SourcedDocument;
pub use crate::fleet::{HelmRelease, ValuesFile};
use crate::helm::chart::{Chart, ChartError};
use crate::helm::gotmpl::{Budget, Host, Value, sites};
use crate::helm::render::{Capabilities, PreparedChart, Release};
use crate::helm::yaml::{from_yaml_map, parse_manifest, split_manifests};

/// The seed generating functions derive from when the caller gives none (`render`,
/// `validate` and `diff` without the hub's store): public, so what it makes is not
/// secret.
pub const PUBLIC_SEED: [u8; 32] = *b"flotilla public helm seed v1....";

/// What `now` returns (seconds since the Unix epoch) when the caller gives no time:
/// 2026-01-01T00:00:00Z.
pub const DEFAULT_NOW: i64 = 1_767_225_600;

/// Helm v4's default Kubernetes version, for clusters that declare none.
pub const DEFAULT_KUBE_VERSION: &str = "v1.36.0";

/// The API versions Helm v4 offers in `.Capabilities.APIVersions` by default: the
/// built-in groups of its Kubernetes client.
pub const DEFAULT_API_VERSIONS: &[&str] = &[
    "v1",
    "admissionregistration.k8s.io/v1",
    "admissionregistration.k8s.io/v1alpha1",
    "admissionregistration.k8s.io/v1beta1",
    "internal.apiserver.k8s.io/v1alpha1",
    "apps/v1",
    "apps/v1beta1",
    "apps/v1beta2",
    "authentication.k8s.io/v1",
    "authentication.k8s.io/v1alpha1",
    "authentication.k8s.io/v1beta1",
    "authorization.k8s.io/v1",
    "authorization.k8s.io/v1beta1",
    "autoscaling/v1",
    "autoscaling/v2",
    "batch/v1",
    "batch/v1beta1",
    "certificates.k8s.io/v1",
    "certificates.k8s.io/v1beta1",
    "certificates.k8s.io/v1alpha1",
    "coordination.k8s.io/v1alpha2",
    "coordination.k8s.io/v1beta1",
    "coordination.k8s.io/v1",
    "discovery.k8s.io/v1",
    "discovery.k8s.io/v1beta1",
    "events.k8s.io/v1",
    "events.k8s.io/v1beta1",
    "extensions/v1beta1",
    "flowcontrol.apiserver.k8s.io/v1",
    "flowcontrol.apiserver.k8s.io/v1beta1",
    "flowcontrol.apiserver.k8s.io/v1beta2",
    "flowcontrol.apiserver.k8s.io/v1beta3",
    "networking.k8s.io/v1",
    "networking.k8s.io/v1beta1",
    "node.k8s.io/v1",
    "node.k8s.io/v1alpha1",
    "node.k8s.io/v1beta1",
    "policy/v1",
    "policy/v1beta1",
    "rbac.authorization.k8s.io/v1",
    "rbac.authorization.k8s.io/v1beta1",
    "rbac.authorization.k8s.io/v1alpha1",
    "resource.k8s.io/v1",
    "resource.k8s.io/v1beta2",
    "resource.k8s.io/v1beta1",
    "resource.k8s.io/v1alpha3",
    "scheduling.k8s.io/v1alpha2",
    "scheduling.k8s.io/v1beta1",
    "scheduling.k8s.io/v1",
    "storage.k8s.io/v1beta1",
    "storage.k8s.io/v1",
    "storage.k8s.io/v1alpha1",
    "storagemigration.k8s.io/v1beta1",
    "apiextensions.k8s.io/v1beta1",
    "apiextensions.k8s.io/v1",
];

/// `a/b/../c` as `a/c`; `None` when it climbs out of the root.
fn normalize(path: &str) -> Option<String> {
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            part => parts.push(part),
        }
    }
    Some(parts.join("/"))
}

/// The line of `key:` under `helm:` in a workload file's text (the typed spec no
/// longer knows it), for errors that name a field of `spec.helm`.
fn helm_key_line(text: Option<&str>, key: &str) -> Option<u64> {
    let indent = |line: &str| line.len() - line.trim_start().len();
    let mut lines = text?.lines().enumerate();
    let (_, helm) = lines.find(|(_, line)| line.trim_start().starts_with("helm:"))?;
    let helm_indent = indent(helm);
    // `helm:`'s own keys: the lines one level under it, up to the next line that is
    // not under it; a key of the same name deeper down (in `values:`) is not one.
    let mut field_indent = None;
    for (index, line) in lines {
        let trimmed = line.trim_start();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let at = indent(line);
        if at <= helm_indent {
            return None;
        }
        if *field_indent.get_or_insert(at) == at
            && trimmed
                .strip_prefix(key)
                .is_some_and(|rest| rest.trim_start().starts_with(':'))
        {
            return Some(index as u64 + 1);
        }
    }
    None
}

/// A path of `spec.helm`, relative to the workload's folder, as a fleet path.
fn resolve(workload: &str, relative: &str) -> Result<String, String> {
    if relative.starts_with('/') {
        return Err(format!(
            "{relative:?} is an absolute path: give a path relative to workloads/{workload}/"
        ));
    }
    normalize(&format!("workloads/{workload}/{relative}")).ok_or_else(|| {
        format!("{relative:?} leads out of the fleet root: a chart must be inside the fleet")
    })
}

/// Reads a workload's `spec.helm`: the chart and the static values files. Problems
/// are reported in `diagnostics` (naming `file`, the workload.yaml, or the chart's
/// file), and a release whose chart could not be read has `chart: None`.
pub fn read(
    snapshot: &FleetSnapshot,
    workload: &str,
    file: &str,
    default_namespace: Option<&str>,
    spec: &HelmSpec,
    diagnostics: &mut Vec<Diagnostic>,
) -> HelmRelease {
    let text = snapshot.files.get(file).map(|text| &**text);
    let error = |key: &str, message: String| {
        Diagnostic::error(message)
            .in_file(file)
            .at_line(helm_key_line(text, key))
            .for_workload(workload)
    };
    let mut release = HelmRelease {
        chart_path: String::new(),
        chart: None,
        release_name: spec
            .release_name
            .clone()
            .unwrap_or_else(|| workload.to_string()),
        namespace: spec
            .namespace
            .clone()
            .or_else(|| default_namespace.map(str::to_string))
            .unwrap_or_else(|| "default".to_string()),
        values: spec.values.clone(),
        values_files: Vec::new(),
        include_crds: spec.include_crds,
        skip_tests: spec.skip_tests,
        inputs: Vec::new(),
    };
    if let Some(repo) = &spec.repo {
        diagnostics.push(error("repo", format!(
            "spec.helm.repo {repo:?}: flotilla never fetches charts at render; vendor the chart into the repository (`helm pull --repo {repo} {chart} --untar --untardir charts`) and set spec.helm.chart to its folder",
            chart = spec.chart
        )));
        return release;
    }
    if spec.chart.contains("://") {
        diagnostics.push(error("chart", format!(
            "spec.helm.chart {:?} is a remote chart: flotilla never fetches charts at render; vendor it into the repository (`helm pull {} --untar --untardir charts`) and name its folder",
            spec.chart, spec.chart
        )));
        return release;
    }
    for values_file in &spec.values_files {
        match resolve(workload, values_file) {
            Err(message) => diagnostics.push(error(
                "valuesFiles",
                format!("spec.helm.valuesFiles: {message}"),
            )),
            Ok(path) if path.ends_with(".j2") => {
                release.inputs.push(path.clone());
                release.values_files.push(ValuesFile::Template { path });
            }
            Ok(path) => {
                release.inputs.push(path.clone());
                match snapshot.files.get(&path) {
                    None => diagnostics.push(error(
                        "valuesFiles",
                        format!(
                            "spec.helm.valuesFiles: {path} {}",
                            missing_reason(snapshot, &path)
                        ),
                    )),
                    Some(text) => match values_map(text) {
                        Ok(values) => release
                            .values_files
                            .push(ValuesFile::Static { path, values }),
                        Err(message) => diagnostics.push(
                            Diagnostic::error(format!("values file: {message}"))
                                .in_file(path)
                                .for_workload(workload),
                        ),
                    },
                }
            }
        }
    }
    let chart_path = match resolve(workload, &spec.chart) {
        Ok(path) => path,
        Err(message) => {
            diagnostics.push(error("chart", format!("spec.helm.chart: {message}")));
            return release;
        }
    };
    release.chart_path = chart_path.clone();
    let loaded = if chart_path.ends_with(".tgz") || chart_path.ends_with(".tar.gz") {
        release.inputs.push(chart_path.clone());
        match snapshot.binaries.get(&chart_path) {
            Some(bytes) => Chart::from_tgz(bytes).map_err(|e| chart_error(&chart_path, e)),
            None => Err(format!(
                "spec.helm.chart: {chart_path} {}",
                missing_reason(snapshot, &chart_path)
            )),
        }
    } else {
        let prefix = format!("{chart_path}/");
        let mut files: BTreeMap<String, Vec<u8>> = BTreeMap::new();
        for (path, text) in snapshot.files.range(prefix.clone()..) {
            let Some(inside) = path.strip_prefix(&prefix) else {
                break;
            };
            release.inputs.push(path.clone());
            files.insert(inside.to_string(), text.as_bytes().to_vec());
        }
        for (path, bytes) in snapshot.binaries.range(prefix.clone()..) {
            let Some(inside) = path.strip_prefix(&prefix) else {
                break;
            };
            release.inputs.push(path.clone());
            files.insert(inside.to_string(), bytes.to_vec());
        }
        let skipped: Vec<&String> = snapshot
            .skipped
            .keys()
            .filter(|p| p.starts_with(&prefix))
            .collect();
        if !files.contains_key("Chart.yaml") {
            Err(format!(
                "spec.helm.chart: {chart_path} holds no Chart.yaml: name a chart folder (or a packed .tgz) inside the fleet"
            ))
        } else if let Some(first) = skipped.first() {
            Err(format!(
                "{first} of the chart could not be read: {}",
                snapshot.skipped[*first]
            ))
        } else {
            Chart::from_files(files).map_err(|e| chart_error(&chart_path, e))
        }
    };
    match loaded {
        Ok(chart) => release.chart = Some(Arc::new(PreparedChart::new(chart))),
        Err(message) => diagnostics.push(error("chart", message)),
    }
    release
}

/// A chart's problem with the fleet path of the file it is in.
fn chart_error(chart_path: &str, error: ChartError) -> String {
    match error {
        ChartError::Invalid { file, message } => format!("{chart_path}/{file}: {message}"),
        ChartError::MissingDependencies { chart, missing } => {
            let folder = match chart.split_once("/charts/") {
                Some((_, _)) => format!(
                    "{chart_path}/{}",
                    chart.split_once('/').map_or("", |(_, rest)| rest)
                ),
                None if chart.starts_with("charts/") => format!("{chart_path}/{chart}"),
                None => chart_path.to_string(),
            };
            format!(
                "{folder}/Chart.yaml: found in Chart.yaml, but missing in charts/ directory: {missing}; run `helm dependency build {folder}` (or `helm pull --untar` each into {folder}/charts/) and commit the result"
            )
        }
        ChartError::Archive { archive, message } => format!("{chart_path}: {archive}: {message}"),
    }
}

fn missing_reason(snapshot: &FleetSnapshot, path: &str) -> String {
    match snapshot.skipped.get(path) {
        Some(reason) => format!("could not be read: {reason}"),
        None => "does not exist".to_string(),
    }
}

/// A values file's text as Helm reads it (YAML 1.1, numbers as Go's JSON reads
/// them), as JSON values; an empty file is no values.
pub fn values_map(text: &str) -> Result<Map<String, Json>, String> {
    let map = from_yaml_map(text).map_err(|e| e.to_string())?;
    Ok(map.iter().map(|(k, v)| (k.clone(), to_json(v))).collect())
}

/// A value read from YAML as JSON (numbers are Go's float64s already).
fn to_json(value: &Value) -> Json {
    match value {
        Value::Nil | Value::Missing | Value::Object(_) => Json::Null,
        Value::Bool(b) => Json::Bool(*b),
        Value::Int(i) | Value::Int64(i) => Json::from(*i),
        Value::Float(f) => serde_json::Number::from_f64(*f).map_or(Json::Null, Json::Number),
        Value::String(s) => Json::String(s.to_string()),
        Value::Bytes(bytes) => Json::Array(bytes.iter().map(|b| Json::from(*b)).collect()),
        Value::List(items) => Json::Array(items.iter().map(to_json).collect()),
        Value::Map(map) => Json::Object(
            map.snapshot()
                .iter()
                .map(|(k, v)| (k.clone(), to_json(v)))
                .collect(),
        ),
    }
}

/// Merges `later` into `base` as Helm merges values files: maps merge deeply, any
/// other value (null included) replaces.
pub fn merge_values(base: &mut Map<String, Json>, later: &Map<String, Json>) {
    for (key, value) in later {
        match (base.get_mut(key), value) {
            (Some(Json::Object(into)), Json::Object(from)) => merge_values(into, from),
            _ => {
                base.insert(key.clone(), value.clone());
            }
        }
    }
}

/// The capabilities a cluster's charts see: its own `spec.kubernetes`, else the
/// fleet's, else Helm's defaults; API versions named are added to the built-in ones.
pub fn capabilities(
    cluster: Option<&KubernetesSpec>,
    fleet: Option<&KubernetesSpec>,
) -> Capabilities {
    let spec = cluster.or(fleet);
    // As Helm reads `--kube-version`: `1.31` is `v1.31.0`. A version that does not
    // read is an error of the file that gives it (see `load`); kept as written here.
    let version = spec
        .and_then(|s| s.version.as_deref())
        .map(|v| {
            crate::helm::funcs::kube_version(v).unwrap_or_else(|| {
                if v.starts_with('v') {
                    v.to_string()
                } else {
                    format!("v{v}")
                }
            })
        })
        .unwrap_or_else(|| DEFAULT_KUBE_VERSION.to_string());
    let mut api_versions: Vec<String> =
        DEFAULT_API_VERSIONS.iter().map(|s| s.to_string()).collect();
    for extra in spec.map(|s| s.api_versions.as_slice()).unwrap_or_default() {
        if !api_versions.contains(extra) {
            api_versions.push(extra.clone());
        }
    }
    Capabilities {
        kube_version: version,
        api_versions,
    }
}

/// What a release rendered to: its documents, with the chart file each came from,
/// and the warnings its render met. Two outputs are equal when their documents are
/// (compared by a digest).
pub struct ReleaseOutput {
    digest: [u8; 32],
    body: Body,
    /// The warnings of this release's render (each once, for the workload, without
    /// a cluster): every cluster given this output reports them as its own, so a
    /// render since this one that keeps a cluster keeps its release's warnings.
    warnings: Arc<[Diagnostic]>,
}

/// A release's documents as rendered, or as a stencil and the strings to fill in
/// (made into documents only when they are read, so that a fleet's releases are
/// not all held at once as trees).
enum Body {
    Rendered(Vec<SourcedDocument>),
    Filled {
        stencil: Arc<StencilRelease>,
        /// Each site's string, then each derived site's.
        strings: Box<[String]>,
    },
}

impl std::fmt::Debug for ReleaseOutput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReleaseOutput")
            .field("digest", &self.digest)
            .finish_non_exhaustive()
    }
}

impl ReleaseOutput {
    /// The warnings its render met, each for the workload, without a cluster.
    pub fn warnings(&self) -> &Arc<[Diagnostic]> {
        &self.warnings
    }

    /// The release's documents.
    pub fn documents(&self) -> Vec<SourcedDocument> {
        match &self.body {
            Body::Rendered(documents) => documents.clone(),
            Body::Filled { stencil, strings } => stencil
                .documents()
                .iter()
                .map(|document| filled(document, strings))
                .collect(),
        }
    }

    /// The documents that are CustomResourceDefinitions (a stencil's are filled in
    /// only where its `kind` is one, or a stand-in).
    pub fn definitions(&self) -> Vec<Json> {
        let is_definition =
            |d: &Json| d.get("kind").and_then(Json::as_str) == Some("CustomResourceDefinition");
        match &self.body {
            Body::Rendered(documents) => documents
                .iter()
                .filter(|d| is_definition(&d.value))
                .map(|d| d.value.clone())
                .collect(),
            Body::Filled { stencil, strings } => stencil
                .documents()
                .iter()
                .filter(|d| {
                    is_definition(&d.value)
                        || d.value
                            .get("kind")
                            .and_then(Json::as_str)
                            .is_some_and(sites::marked_text)
                })
                .map(|d| fill_sites(&d.value, strings))
                .filter(is_definition)
                .collect(),
        }
    }
}

/// A stencil's document with a cluster's strings filled in.
fn filled(document: &SourcedDocument, strings: &[String]) -> SourcedDocument {
    SourcedDocument {
        value: fill_sites(&document.value, strings),
        file: document.file.clone(),
        line: document.line,
    }
}

impl PartialEq for ReleaseOutput {
    fn eq(&self, other: &ReleaseOutput) -> bool {
        self.digest == other.digest
    }
}

impl Eq for ReleaseOutput {}

impl Hash for ReleaseOutput {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.digest.hash(state);
    }
}

/// What rendering one input gave: shared between the clusters with that input.
type Outcome = Result<Arc<ReleaseOutput>, Diagnostic>;

/// One distinct input's render; `generated` when the chart called a generating
/// function, so its output is the first cluster's own and every cluster renders
/// its own.
struct Entry {
    outcome: Outcome,
    generated: bool,
}

/// A release rendered with sites' stand-ins in its values: its documents, in which
/// every string holding a marker is exactly one site's stand-in, or `None` when
/// such a render is refused (see [`ReleaseCache::render`]).
type Stencil = Option<Arc<StencilRelease>>;

/// A stencil's documents, and the texts whose `sha256sum` its derived sites are
/// (see [`sites::deferred_text`]), in the order of their numbers (after the
/// sites').
struct StencilRelease {
    output: ReleaseOutput,
    derived: Vec<Arc<str>>,
}

impl StencilRelease {
    fn documents(&self) -> &[SourcedDocument] {
        match &self.output.body {
            Body::Rendered(documents) => documents,
            Body::Filled { .. } => &[],
        }
    }
}

/// The releases a render made, by input, shared between clusters and threads.
#[derive(Default)]
pub struct ReleaseCache {
    entries: Mutex<HashMap<[u8; 32], Arc<OnceLock<Entry>>>>,
    /// Per workload, the values of its first release asked for, against which the
    /// sites of the others are found.
    references: Mutex<HashMap<String, Arc<Map<String, Json>>>>,
    /// Stencils by their input (the reference's values with stand-ins at the
    /// sites, the release, the capabilities).
    stencils: Mutex<HashMap<[u8; 32], Arc<OnceLock<Stencil>>>>,
    /// Render every release on its own, never from a stencil.
    without_stencils: bool,
    /// How many releases were filled in from a stencil.
    filled: std::sync::atomic::AtomicUsize,
    /// Warnings of the releases that failed (`lookup`, values coalescing), once
    /// each; those of a release that rendered are in its output.
    warnings: Mutex<Vec<Diagnostic>>,
    /// Whether any chart called a generating function.
    generated: std::sync::atomic::AtomicBool,
}

/// Whether two warnings of a release say the same of the same file.
fn same_warning(a: &Diagnostic, b: &Diagnostic) -> bool {
    a.message == b.message && a.file == b.file
}

/// The end of the warning about a value generated from the public seed, after the
/// generating function's name.
const PUBLIC_SEED_WARNING: &str = " generates a value here, from flotilla's public seed (the hub uses its own secret seed): to choose the value yourself, set the chart value this template reads";

/// Whether `diagnostic` warns of a value a chart generated from the public seed.
pub fn generated_from_public_seed(diagnostic: &Diagnostic) -> bool {
    !diagnostic.is_error() && diagnostic.message.ends_with(PUBLIC_SEED_WARNING)
}

/// What a render gives every release.
pub struct ReleaseSettings<'a> {
    pub seed: &'a [u8; 32],
    /// What `sha256sum` keys its digest with over decrypted values.
    pub hashing: &'a crate::seal::SecretHashing,
    /// The hash keys of the SOPS files whose decrypted values the release's values
    /// hold, and of those in its chart folder
    /// ([`crate::seal::SecretHashing::release_keys`]): every digest its templates
    /// write is keyed with them. Empty for a render's settings; each release's are
    /// found when it is rendered.
    pub release_keys: &'a [[u8; 32]],
    pub now: i64,
    pub budget: Budget,
}

impl<'a> ReleaseSettings<'a> {
    /// These settings for a release whose values hold decrypted values of the files
    /// with hash keys `keys`.
    fn with_release_keys<'b>(&self, keys: &'b [[u8; 32]]) -> ReleaseSettings<'b>
    where
        'a: 'b,
    {
        ReleaseSettings {
            seed: self.seed,
            hashing: self.hashing,
            release_keys: keys,
            now: self.now,
            budget: self.budget.clone(),
        }
    }
}

impl ReleaseCache {
    /// An empty cache; with `stencils`, releases that differ only in strings are
    /// filled in from one render where they can be (see [`ReleaseCache::render`]).
    pub fn new(stencils: bool) -> ReleaseCache {
        ReleaseCache {
            without_stencils: !stencils,
            ..ReleaseCache::default()
        }
    }

    /// The release of `workload` for `cluster`, with `values` the user's values
    /// merged for it; and whether it is the cluster's own (a chart that generated a
    /// value), not to be shared with other clusters of the same input.
    pub fn render(
        &self,
        settings: &ReleaseSettings<'_>,
        (workload, release): (&str, &HelmRelease),
        cluster: &str,
        values: &Map<String, Json>,
        capabilities: &Capabilities,
    ) -> (Outcome, bool) {
        let Some(chart) = &release.chart else {
            let error = Diagnostic::error(format!(
                "the chart {} could not be read (reported above)",
                release.chart_path
            ));
            return (Err(error), false);
        };
        let key = input_key(workload, values, capabilities);
        let cell = {
            let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
            Arc::clone(entries.entry(key).or_default())
        };
        // A release whose values hold a decrypted value, or whose chart holds a SOPS
        // file, keys every digest it writes (looked for only when it is rendered).
        let release_keys = if cell.get().is_some_and(|entry| !entry.generated) {
            Vec::new()
        } else {
            settings.hashing.release_keys(values, &release.chart_path)
        };
        let keyed;
        let settings = if release_keys.is_empty() {
            settings
        } else {
            keyed = settings.with_release_keys(&release_keys);
            &keyed
        };
        // The first cluster with these values fills them in from a stencil where it
        // can; the others share its output, as they share a rendered one.
        if cell.get().is_none()
            && !self.without_stencils
            && chart.takes_sites()
            && let Some(output) =
                self.fill_from_stencil(settings, (workload, release, chart), values, capabilities)
        {
            let entry = cell.get_or_init(|| Entry {
                outcome: Ok(output),
                generated: false,
            });
            if !entry.generated {
                return (entry.outcome.clone(), false);
            }
        }
        let mut mine: Option<Outcome> = None;
        let entry = cell.get_or_init(|| {
            let (outcome, generated) = self.render_one(
                settings,
                (workload, release, chart),
                cluster,
                values,
                capabilities,
            );
            mine = Some(outcome.clone());
            Entry { outcome, generated }
        });
        let outcome = match (mine, entry.generated) {
            (Some(outcome), _) => outcome,
            (None, false) => entry.outcome.clone(),
            (None, true) => {
                self.render_one(
                    settings,
                    (workload, release, chart),
                    cluster,
                    values,
                    capabilities,
                )
                .0
            }
        };
        (outcome, entry.generated)
    }

    /// The release for `values` filled in from a stencil, when it differs from its
    /// workload's reference values only in strings (its *sites*) that may stand
    /// where stand-ins stood (see [`crate::helm::gotmpl::sites`]) and the stencil
    /// for those sites was taken. `None` otherwise: the caller renders it on its own.
    ///
    /// A stencil is refused (and every release of its input rendered on its own)
    /// when its render fails, generates a value, warns, or gives documents in which
    /// a marker is anything but a whole string that is one site's stand-in (a key, a
    /// part of a longer string, a test hook's annotation); so its documents with each
    /// stand-in replaced by the cluster's string are the cluster's own render's.
    fn fill_from_stencil(
        &self,
        settings: &ReleaseSettings<'_>,
        (workload, release, chart): (&str, &HelmRelease, &PreparedChart),
        values: &Map<String, Json>,
        capabilities: &Capabilities,
    ) -> Option<Arc<ReleaseOutput>> {
        let reference = {
            let mut references = self.references.lock().unwrap_or_else(|e| e.into_inner());
            Arc::clone(
                references
                    .entry(workload.to_string())
                    .or_insert_with(|| Arc::new(values.clone())),
            )
        };
        let mut sites: Vec<(Vec<String>, &str)> = Vec::new();
        let mut path = Vec::new();
        if !differing_strings(&reference, values, &mut path, &mut sites) || sites.is_empty() {
            return None;
        }
        if !sites.iter().all(|(_, value)| site_value(value)) {
            return None;
        }
        let mut skeleton = (*reference).clone();
        for (index, (path, _)) in sites.iter().enumerate() {
            *place_in(&mut skeleton, path)? = Json::String(sites::stand_in(index));
        }
        let written = serde_json::to_string(&skeleton).unwrap_or_default();
        let mut key = input_key_of(workload, &written, capabilities);
        // The stand-ins may stand where decrypted values stood: a stencil keys its
        // digests as the releases it fills do.
        if !settings.release_keys.is_empty() {
            let mut hasher = Sha256::new();
            hasher.update(key);
            for release_key in settings.release_keys {
                hasher.update(release_key);
            }
            key = hasher.finalize().into();
        }
        let cell = {
            let mut stencils = self.stencils.lock().unwrap_or_else(|e| e.into_inner());
            Arc::clone(stencils.entry(key).or_default())
        };
        let stencil = cell.get_or_init(|| {
            // Markers anywhere in the reference's values but at the sites would be
            // taken for stand-ins.
            if written.matches(sites::SITE_START).count() != sites.len()
                || written.matches(sites::SITE_END).count() != sites.len()
            {
                return None;
            }
            render_stencil(
                settings,
                (release, chart),
                &skeleton,
                sites.len(),
                capabilities,
            )
        });
        let stencil = stencil.as_ref()?;
        let mut strings: Vec<String> = sites.iter().map(|(_, value)| value.to_string()).collect();
        for text in &stencil.derived {
            let text = sites::substitute(text, &strings)?;
            let hashed = settings.hashing.sha256_hex_in(&text, settings.release_keys);
            if !site_value(&hashed) {
                return None;
            }
            strings.push(hashed);
        }
        self.filled
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut digest = Sha256::new();
        digest.update(stencil.output.digest);
        for value in &strings[..sites.len()] {
            digest.update((value.len() as u64).to_le_bytes());
            digest.update(value.as_bytes());
        }
        Some(Arc::new(ReleaseOutput {
            digest: digest.finalize().into(),
            body: Body::Filled {
                stencil: Arc::clone(stencil),
                strings: strings.into_boxed_slice(),
            },
            // A stencil that warns is refused.
            warnings: Arc::from([]),
        }))
    }

    /// How many releases were filled in from a stencil.
    pub fn stencil_releases(&self) -> usize {
        self.filled.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether any release called a generating function.
    pub fn generated_any(&self) -> bool {
        self.generated.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The warnings of the releases that failed, each once (those of a release that
    /// rendered are in its output, for the clusters given it).
    pub fn take_warnings(&self) -> Vec<Diagnostic> {
        std::mem::take(&mut *self.warnings.lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn warn(&self, diagnostic: Diagnostic) {
        let mut warnings = self.warnings.lock().unwrap_or_else(|e| e.into_inner());
        if !warnings.iter().any(|w| same_warning(w, &diagnostic)) {
            warnings.push(diagnostic);
        }
    }

    fn render_one(
        &self,
        settings: &ReleaseSettings<'_>,
        (workload, release, chart): (&str, &HelmRelease, &PreparedChart),
        cluster: &str,
        values: &Map<String, Json>,
        capabilities: &Capabilities,
    ) -> (Outcome, bool) {
        let mut host = SeededHost::new(settings, cluster, release);
        let (helm_warnings, rendered) =
            render_documents(&mut host, settings, (release, chart), values, capabilities);
        let generated = host.generated;
        if generated {
            self.generated
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
        let mut warnings: Vec<Diagnostic> = Vec::new();
        let mut warn = |diagnostic: Diagnostic| {
            if !warnings.iter().any(|w| same_warning(w, &diagnostic)) {
                warnings.push(diagnostic.for_workload(workload));
            }
        };
        if settings.seed == &PUBLIC_SEED {
            for (template, function) in &host.generators {
                warn(
                    Diagnostic::warning(format!("{function}{PUBLIC_SEED_WARNING}"))
                        .in_file(fleet_path(release, template)),
                );
            }
        }
        for (template, message) in host.warnings {
            warn(Diagnostic::warning(message).in_file(fleet_path(release, &template)));
        }
        for warning in &helm_warnings {
            warn(
                Diagnostic::warning(format!("helm: {warning}"))
                    .in_file(release.chart_path.as_str()),
            );
        }
        let outcome = match rendered {
            Ok((documents, digest)) => Ok(Arc::new(ReleaseOutput {
                digest,
                body: Body::Rendered(documents),
                warnings: warnings.into(),
            })),
            // The cluster fails, and the render reports these once for the fleet.
            Err(error) => {
                for warning in warnings {
                    self.warn(warning);
                }
                Err(error)
            }
        };
        (outcome, generated)
    }
}

/// A release's documents and their digest, or the error that stopped its render.
type Rendered = Result<(Vec<SourcedDocument>, [u8; 32]), Diagnostic>;

/// The documents and digest of a release under `values` (and Helm's warnings, when
/// the chart rendered), with the host given.
fn render_documents(
    host: &mut SeededHost<'_>,
    settings: &ReleaseSettings<'_>,
    (release, chart): (&HelmRelease, &PreparedChart),
    values: &Map<String, Json>,
    capabilities: &Capabilities,
) -> (Vec<String>, Rendered) {
    let helm_release = Release {
        name: release.release_name.clone(),
        namespace: release.namespace.clone(),
        revision: 1,
        is_install: true,
        capabilities: capabilities.clone(),
    };
    let user = Value::from_json(&Json::Object(values.clone()));
    let rendered = match chart.render(&helm_release, &user, host, &settings.budget) {
        Ok(rendered) => rendered,
        Err(err) => {
            let file = match &err {
                crate::helm::render::HelmError::Exec { template, .. } => {
                    fleet_path(release, template)
                }
                _ => release.chart_path.clone(),
            };
            return (
                Vec::new(),
                Err(Diagnostic::error(err.to_string()).in_file(file)),
            );
        }
    };
    let mut documents = Vec::new();
    let mut warnings = rendered.warnings;
    let mut digest = Sha256::new();
    let crds = rendered.crds.iter().filter(|_| release.include_crds);
    for (name, text) in crds.chain(rendered.templates.iter()) {
        if name.ends_with("/NOTES.txt") || name == "NOTES.txt" {
            continue;
        }
        let file: Arc<str> = Arc::from(fleet_path(release, name));
        for document in split_manifests(text) {
            let value = match parse_manifest(&document) {
                Ok(Some(value)) => value,
                Ok(None) => continue,
                Err(err) => {
                    return (
                        warnings,
                        Err(Diagnostic::error(format!(
                            "the chart's output is not valid YAML: {err}"
                        ))
                        .in_file(&*file)),
                    );
                }
            };
            if release.skip_tests && is_test_hook(&value) {
                continue;
            }
            if let Some(why) = left_out_hook(&value) {
                let name = value
                    .pointer("/metadata/name")
                    .and_then(Json::as_str)
                    .unwrap_or_default();
                let kind = value.get("kind").and_then(Json::as_str).unwrap_or_default();
                warnings.push(format!(
                    "{file}: {kind} {name} is left out, as Helm leaves it out: {why}"
                ));
                continue;
            }
            let bytes = serde_json::to_vec(&value).unwrap_or_default();
            digest.update((file.len() as u64).to_le_bytes());
            digest.update(file.as_bytes());
            digest.update((bytes.len() as u64).to_le_bytes());
            digest.update(&bytes);
            documents.push(SourcedDocument {
                value,
                file: file.clone(),
                line: 1,
            });
        }
    }
    (warnings, Ok((documents, digest.finalize().into())))
}

/// Why Helm leaves a hook out of a release that is installed or upgraded, if it does:
/// its `helm.sh/hook` names an event Helm does not know (a typo, Helm 2's
/// `crd-install`), which Helm skips whole, or only rollback events, which run on
/// `helm rollback` alone (flotilla never rolls a release back that way).
fn left_out_hook(value: &Json) -> Option<String> {
    // Helm's events: those flotilla runs, and those it never runs.
    const OTHERS: [&str; 4] = ["pre-rollback", "post-rollback", "test", "test-success"];
    let known = |event: &str| {
        flotilla_core::bundle::HookMark::EVENTS.contains(&event) || OTHERS.contains(&event)
    };
    let hooks = value
        .pointer("/metadata/annotations/helm.sh~1hook")
        .and_then(Json::as_str)?;
    let events: Vec<String> = hooks.split(',').map(|e| e.trim().to_lowercase()).collect();
    if let Some(unknown) = events.iter().find(|e| !known(e)) {
        return Some(format!(
            "its helm.sh/hook names the unknown event {unknown:?}"
        ));
    }
    events
        .iter()
        .all(|e| e.ends_with("-rollback"))
        .then(|| format!("its helm.sh/hook ({hooks}) runs only on helm rollback"))
}

/// What identifies one release's input: the workload, the values, the capabilities.
fn input_key(workload: &str, values: &Map<String, Json>, capabilities: &Capabilities) -> [u8; 32] {
    let written = serde_json::to_string(values).unwrap_or_default();
    input_key_of(workload, &written, capabilities)
}

/// [`input_key`] of values already written as JSON.
fn input_key_of(workload: &str, values: &str, capabilities: &Capabilities) -> [u8; 32] {
    let mut hasher = Sha256::new();
    for part in [
        workload.as_bytes(),
        values.as_bytes(),
        capabilities.kube_version.as_bytes(),
        capabilities.api_versions.join(",").as_bytes(),
    ] {
        hasher.update((part.len() as u64).to_le_bytes());
        hasher.update(part);
    }
    hasher.finalize().into()
}

/// Renders a stencil: the release under `skeleton`, whose strings at `sites` sites
/// are stand-ins, with every call checked (see [`ReleaseCache::fill_from_stencil`]).
fn render_stencil(
    settings: &ReleaseSettings<'_>,
    (release, chart): (&HelmRelease, &PreparedChart),
    skeleton: &Map<String, Json>,
    sites: usize,
    capabilities: &Capabilities,
) -> Stencil {
    let mut host = SeededHost::new(settings, "", release);
    host.sites = Some(sites);
    let (helm_warnings, rendered) = render_documents(
        &mut host,
        settings,
        (release, chart),
        skeleton,
        capabilities,
    );
    if host.generated || !host.warnings.is_empty() || !helm_warnings.is_empty() {
        return None;
    }
    let (documents, digest) = rendered.ok()?;
    let derived = std::mem::take(&mut host.derived);
    for document in &documents {
        let hook = document
            .value
            .pointer("/metadata/annotations/helm.sh~1hook");
        if hook.and_then(Json::as_str).is_some_and(sites::marked_text)
            || !stand_ins_whole(&document.value, sites + derived.len())
        {
            return None;
        }
    }
    Some(Arc::new(StencilRelease {
        output: ReleaseOutput {
            digest,
            body: Body::Rendered(documents),
            warnings: Arc::from([]),
        },
        derived,
    }))
}

/// Finds the strings of `values` that differ from `reference`'s, with their paths
/// (as keys); false when anything else differs (a key, a type, a number, a list).
fn differing_strings<'v>(
    reference: &Map<String, Json>,
    values: &'v Map<String, Json>,
    path: &mut Vec<String>,
    sites: &mut Vec<(Vec<String>, &'v str)>,
) -> bool {
    if reference.len() != values.len() {
        return false;
    }
    for (key, theirs) in values {
        let Some(ours) = reference.get(key) else {
            return false;
        };
        match (ours, theirs) {
            (Json::Object(ours), Json::Object(theirs)) => {
                path.push(key.clone());
                let same = differing_strings(ours, theirs, path, sites);
                path.pop();
                if !same {
                    return false;
                }
            }
            (Json::String(ours), Json::String(theirs)) if ours != theirs => {
                let mut at = path.clone();
                at.push(key.clone());
                sites.push((at, theirs));
            }
            (ours, theirs) if ours == theirs => {}
            _ => return false,
        }
    }
    true
}

/// Whether a cluster's string may stand where a stand-in stood: a plain word (see
/// [`sites::plain_site_value`]) that Helm's YAML reader, the manifest reader and
/// `toYaml` all take as that string.
fn site_value(text: &str) -> bool {
    if !sites::plain_site_value(text) {
        return false;
    }
    let line = format!("k: {text}\n");
    let as_string = Value::string(text);
    crate::helm::yaml::to_yaml(&as_string).is_ok_and(|written| written == text)
        && from_yaml_map(&line)
            .is_ok_and(|map| matches!(map.get("k"), Some(Value::String(s)) if &**s == text))
        && parse_manifest(&line).is_ok_and(|value| {
            value.and_then(|v| v.get("k").cloned()) == Some(Json::String(text.to_string()))
        })
}

/// The value at `path` (keys) in `values`.
fn place_in<'v>(values: &'v mut Map<String, Json>, path: &[String]) -> Option<&'v mut Json> {
    let (last, within) = path.split_last()?;
    let mut map = values;
    for key in within {
        map = map.get_mut(key)?.as_object_mut()?;
    }
    map.get_mut(last)
}

/// A stencil's document with each stand-in replaced by its site's string.
fn fill_sites(value: &Json, strings: &[String]) -> Json {
    match value {
        Json::String(s) if s.starts_with(sites::SITE_START) => {
            let index = s
                .trim_start_matches(sites::SITE_START)
                .trim_end_matches(sites::SITE_END)
                .parse::<usize>()
                .ok();
            match index.and_then(|i| strings.get(i)) {
                Some(string) => Json::String(string.clone()),
                None => value.clone(),
            }
        }
        Json::Array(items) => Json::Array(items.iter().map(|v| fill_sites(v, strings)).collect()),
        Json::Object(map) => Json::Object(
            map.iter()
                .map(|(k, v)| (k.clone(), fill_sites(v, strings)))
                .collect(),
        ),
        _ => value.clone(),
    }
}

/// Whether every string of `value` that holds a marker is a whole stand-in of one
/// of the `sites`, and no key holds one.
fn stand_ins_whole(value: &Json, sites: usize) -> bool {
    match value {
        Json::String(s) => !sites::marked_text(s) || (0..sites).any(|i| *s == sites::stand_in(i)),
        Json::Array(items) => items.iter().all(|v| stand_ins_whole(v, sites)),
        Json::Object(map) => map
            .iter()
            .all(|(k, v)| !sites::marked_text(k) && stand_ins_whole(v, sites)),
        _ => true,
    }
}

/// Whether a document is one of Helm's test hooks (`helm.sh/hook: test`, or the
/// older `test-success`/`test-failure`).
fn is_test_hook(value: &Json) -> bool {
    value
        .pointer("/metadata/annotations/helm.sh~1hook")
        .and_then(Json::as_str)
        .is_some_and(|hooks| {
            hooks
                .split(',')
                .map(str::trim)
                .any(|h| matches!(h, "test" | "test-success" | "test-failure"))
        })
}

/// The fleet path of a template Helm names `chart/templates/x.yaml` (or
/// `chart/charts/sub/templates/y.yaml`): below the chart's folder (or, for a packed
/// chart, `chart.tgz:` and the name).
fn fleet_path(release: &HelmRelease, template: &str) -> String {
    let inside = template.split_once('/').map_or(template, |(_, rest)| rest);
    if release.chart_path.ends_with(".tgz") || release.chart_path.ends_with(".tar.gz") {
        format!("{}:{inside}", release.chart_path)
    } else {
        format!("{}/{inside}", release.chart_path)
    }
}

/// The host of a release's templates: generated bytes from the seed, the cluster,
/// the release, the template, the function with its arguments, and how many times
/// the same call was made in the template before; `now` as given; warnings kept.
struct SeededHost<'a> {
    /// In a stencil's render, how many sites the values hold stand-ins for.
    sites: Option<usize>,
    /// The texts of the calls deferred to each cluster (derived sites).
    derived: Vec<Arc<str>>,
    seed: &'a [u8; 32],
    hashing: &'a crate::seal::SecretHashing,
    /// See [`ReleaseSettings::release_keys`].
    release_keys: &'a [[u8; 32]],
    now: i64,
    scope: String,
    template: String,
    calls: HashMap<String, u64>,
    generated: bool,
    /// The (template, function) pairs that generated a value.
    generators: Vec<(String, String)>,
    warnings: Vec<(String, String)>,
}

impl<'a> SeededHost<'a> {
    fn new(settings: &ReleaseSettings<'a>, cluster: &str, release: &HelmRelease) -> SeededHost<'a> {
        SeededHost {
            sites: None,
            derived: Vec::new(),
            seed: settings.seed,
            hashing: settings.hashing,
            release_keys: settings.release_keys,
            now: settings.now,
            scope: [cluster, &release.release_name, &release.namespace]
                .map(str::to_string)
                .join("\u{0}"),
            template: String::new(),
            calls: HashMap::new(),
            generated: false,
            generators: Vec::new(),
            warnings: Vec::new(),
        }
    }
}

impl Host for SeededHost<'_> {
    fn sites(&self) -> bool {
        self.sites.is_some()
    }

    fn defer(&mut self, name: &str, args: &[Value]) -> Option<Value> {
        let sites = self.sites?;
        let text = sites::deferred_text(name, args)?;
        self.derived.push(Arc::from(text));
        Some(Value::string(sites::stand_in(
            sites + self.derived.len() - 1,
        )))
    }

    fn template_name(&self) -> &str {
        &self.template
    }

    fn generated_bytes(&mut self, function: &str, args: &[Value], len: usize) -> Vec<u8> {
        self.generated = true;
        let pair = (self.template.clone(), function.to_string());
        if !self.generators.contains(&pair) {
            self.generators.push(pair);
        }
        let call = format!("{function}\u{0}{args:?}");
        let occurrence = {
            let count = self.calls.entry(call.clone()).or_insert(0);
            *count += 1;
            *count
        };
        let mut out = Vec::with_capacity(len + 32);
        let mut block: u64 = 0;
        while out.len() < len {
            let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(self.seed) else {
                break;
            };
            for part in [
                self.scope.as_bytes(),
                self.template.as_bytes(),
                call.as_bytes(),
                &occurrence.to_le_bytes(),
                &block.to_le_bytes(),
            ] {
                mac.update(&(part.len() as u64).to_le_bytes());
                mac.update(part);
            }
            out.extend_from_slice(&mac.finalize().into_bytes());
            block += 1;
        }
        out.truncate(len);
        out
    }

    fn now_unix(&self) -> i64 {
        self.now
    }

    fn sha256_hex(&self, text: &str) -> String {
        self.hashing.sha256_hex_in(text, self.release_keys)
    }

    fn secret_key_for(&self, text: &str) -> Option<[u8; 32]> {
        self.hashing.key_for_in(text, self.release_keys)
    }

    fn warn(&mut self, message: String) {
        self.warnings.push((self.template.clone(), message));
    }

    fn begin_template(&mut self, name: &str) {
        self.template = name.to_string();
        self.calls.clear();
    }
}
