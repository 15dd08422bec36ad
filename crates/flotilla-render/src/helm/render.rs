//! A release rendered as Helm v4's engine renders it: values planned and coalesced
//! ([`crate::helm::values::plan`]), every template of the chart and its enabled
//! subcharts parsed into one template set (defines are global; the deepest charts
//! first, so the parent's defines win), each template that Helm writes executed with
//! its chart's data (`.Values`, `.Release`, `.Chart`, `.Capabilities`, `.Files`,
//! `.Template`, `.Subcharts`) and its output cleaned of `<no value>`.
//!
//! # Public API
//!
//! - [`render_release`]`(chart, release, user_values, host, budget) ->
//!   Result<RenderedRelease, HelmError>`: one render.
//! - [`PreparedChart::new`]`(chart)` and [`PreparedChart::render`]`(...)`: the same,
//!   with the parsed templates kept for the next release of the same chart (one parse
//!   per set of enabled subcharts, shared between threads).
//! - [`Release`], [`Capabilities`], [`RenderedRelease`], [`HelmError`].
//!
//! Each render works on its own deep copy of the values: `set` in a template changes
//! that render's maps only, never the chart's parsed values.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex};

use crate::helm::chart::{Chart, File, ImportValue};
use crate::helm::funcs;
use crate::helm::gotmpl::{
    Budget, FuncError, FuncResult, Funcs, Host, Object, TemplateSet, Value, helm_clean_output,
};
use crate::helm::values::{RenderPlan, ValuesError, plan};
use crate::helm::yaml;

/// Who and where a release is, as `.Release` and `.Capabilities` show it.
#[derive(Clone, Debug)]
pub struct Release {
    pub name: String,
    pub namespace: String,
    pub revision: i64,
    pub is_install: bool,
    pub capabilities: Capabilities,
}

/// The cluster a release renders for, as `.Capabilities` shows it.
#[derive(Clone, Debug)]
pub struct Capabilities {
    /// `v1.36.0`: `.Capabilities.KubeVersion` (and its Major and Minor).
    pub kube_version: String,
    /// What `.Capabilities.APIVersions.Has` finds: `apps/v1`, `apps/v1/Deployment`, ...
    pub api_versions: Vec<String>,
}

/// What a render wrote.
#[derive(Clone, Debug, Default)]
pub struct RenderedRelease {
    /// Every template Helm writes (partials and library charts' excepted), empty
    /// ones and NOTES.txt included, in the order Helm's engine renders them.
    pub templates: Vec<(String, String)>,
    /// The `crds/` files of the enabled charts, named like templates, as they are.
    pub crds: Vec<(String, String)>,
    /// Helm's value-coalescing warnings.
    pub warnings: Vec<String>,
}

/// Why a release did not render; the message is Helm's.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HelmError {
    #[error(transparent)]
    Values(#[from] ValuesError),
    /// A template does not parse (Helm's `parse error at (FILE:LINE): ...`).
    #[error("{0}")]
    Parse(String),
    /// A template failed while executing (`fail`, `required`, a function's error, a
    /// budget), with Helm's wording.
    #[error("{message}")]
    Exec { template: String, message: String },
    /// The values do not satisfy a chart's values.schema.json (Helm's report).
    #[error("{0}")]
    Schema(String),
}

/// A chart ready to render many releases: its templates parsed once per set of
/// enabled subcharts, its functions resolved once.
pub struct PreparedChart {
    chart: Chart,
    funcs: Funcs,
    /// Parsed template sets, by the paths of the enabled charts.
    sets: Mutex<HashMap<Vec<String>, Arc<TemplateSet>>>,
    sites: bool,
}

/// See [`PreparedChart::takes_sites`].
fn takes_sites(chart: &Chart) -> bool {
    use crate::helm::gotmpl::sites::{SITE_END, SITE_START, marked};
    let mut start = [0u8; 4];
    let mut end = [0u8; 4];
    let start = SITE_START.encode_utf8(&mut start).as_bytes();
    let end = SITE_END.encode_utf8(&mut end).as_bytes();
    let holds = |data: &[u8]| data.windows(start.len()).any(|w| w == start || w == end);
    chart.schema.is_none()
        && !chart
            .templates
            .iter()
            .chain(&chart.files)
            .any(|f| holds(&f.data) || holds(f.name.as_bytes()))
        && !chart
            .values
            .iter()
            .any(|(k, v)| holds(k.as_bytes()) || marked(v))
        && !holds(format!("{:?}", chart.metadata).as_bytes())
        && chart.subcharts.iter().all(takes_sites)
}

impl fmt::Debug for PreparedChart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PreparedChart")
            .field("chart", &self.chart.name())
            .finish_non_exhaustive()
    }
}

/// Renders one release of `chart` (parsing its templates; see [`PreparedChart`] to
/// parse once for many releases).
pub fn render_release(
    chart: &Chart,
    release: &Release,
    user_values: &Value,
    host: &mut dyn Host,
    budget: &Budget,
) -> Result<RenderedRelease, HelmError> {
    PreparedChart::new(chart.clone()).render(release, user_values, host, budget)
}

impl PreparedChart {
    pub fn new(chart: Chart) -> PreparedChart {
        let sites = takes_sites(&chart);
        PreparedChart {
            chart,
            funcs: funcs::all(),
            sets: Mutex::new(HashMap::new()),
            sites,
        }
    }

    /// Whether a release of this chart may be rendered with sites' stand-ins in its
    /// values (see [`crate::helm::gotmpl::sites`]): no chart of it has a values
    /// schema (whose checks could tell a stand-in from a value), and no file,
    /// default value or metadata of it holds a stand-in's markers.
    pub fn takes_sites(&self) -> bool {
        self.sites
    }

    pub fn chart(&self) -> &Chart {
        &self.chart
    }

    /// Renders one release; `user_values` is the release's values map (anything
    /// else counts as no values).
    pub fn render(
        &self,
        release: &Release,
        user_values: &Value,
        host: &mut dyn Host,
        budget: &Budget,
    ) -> Result<RenderedRelease, HelmError> {
        // Helm refuses, before anything is rendered, a chart whose `kubeVersion`
        // the cluster's version does not meet.
        if let Some(constraint) = self.chart.metadata.kube_version.as_deref()
            && !constraint.trim().is_empty()
        {
            let kube = &release.capabilities.kube_version;
            match funcs::kube_version_meets(constraint, kube) {
                Ok(true) => {}
                Ok(false) => {
                    return Err(HelmError::Parse(format!(
                        "chart requires kubeVersion: {constraint} which is incompatible with Kubernetes {kube}"
                    )));
                }
                Err(reason) => {
                    return Err(HelmError::Parse(format!(
                        "Chart.yaml: kubeVersion {constraint:?} is not a version constraint: {reason}"
                    )));
                }
            }
        }
        let user = match user_values {
            Value::Map(map) => user_values_copy(&map.snapshot()),
            _ => BTreeMap::new(),
        };
        let planned = plan(&self.chart, user)?;
        crate::helm::schema::validate_plan(&planned).map_err(HelmError::Schema)?;
        let set = self.template_set(&planned)?;
        let order = helm_order(&planned);
        let data = chart_data(&planned, release);
        let mut out = RenderedRelease {
            warnings: planned.warnings.clone(),
            ..RenderedRelease::default()
        };
        for index in order {
            let template = &planned.templates[index];
            if !template.rendered {
                continue;
            }
            let chart_data = &data[template.chart];
            let base_path = format!("{}/templates", planned.charts[template.chart].path);
            let mut template_entry = BTreeMap::new();
            template_entry.insert("Name".to_string(), Value::string(template.name.as_str()));
            template_entry.insert("BasePath".to_string(), Value::string(base_path));
            if let Value::Map(map) = chart_data {
                map.insert("Template".to_string(), Value::map(template_entry));
            }
            host.begin_template(&template.name);
            let mut scoped = TemplateHost {
                inner: &mut *host,
                name: &template.name,
            };
            let text = set
                .execute(&template.name, chart_data, &self.funcs, &mut scoped, budget)
                .map_err(|e| HelmError::Exec {
                    template: template.name.clone(),
                    message: e.helm_message(),
                })?;
            if text.contains("<no value>") {
                host.warn(format!(
                    "{}: a value the template prints is missing, so Helm prints nothing there (Go's <no value>); set it in the values, or check its name",
                    template.name
                ));
            }
            out.templates
                .push((template.name.clone(), helm_clean_output(&text)));
        }
        out.crds = planned
            .crds
            .iter()
            .map(|(name, file)| {
                (
                    name.clone(),
                    String::from_utf8_lossy(&file.data).into_owned(),
                )
            })
            .collect();
        Ok(out)
    }

    /// The parsed templates of the planned charts, parsed on first use.
    fn template_set(&self, planned: &RenderPlan) -> Result<Arc<TemplateSet>, HelmError> {
        let key: Vec<String> = planned.charts.iter().map(|c| c.path.clone()).collect();
        if let Some(set) = self.lock_sets().get(&key) {
            return Ok(Arc::clone(set));
        }
        let mut set = TemplateSet::new();
        for index in helm_order(planned) {
            let template = &planned.templates[index];
            let text = String::from_utf8_lossy(&template.data);
            set.parse(&template.name, &text, &self.funcs)
                .map_err(|e| HelmError::Parse(e.helm_message()))?;
        }
        let set = Arc::new(set);
        self.lock_sets().insert(key, Arc::clone(&set));
        Ok(set)
    }

    fn lock_sets(&self) -> std::sync::MutexGuard<'_, HashMap<Vec<String>, Arc<TemplateSet>>> {
        // A panic while inserting leaves a consistent map (insert is one step).
        self.sets
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The user's values, copied so no map of the caller's is shared with the render.
fn user_values_copy(map: &BTreeMap<String, Value>) -> BTreeMap<String, Value> {
    map.iter()
        .map(|(k, v)| (k.clone(), v.deep_copy()))
        .collect()
}

/// Helm's `sortTemplates`: the deepest paths first, and among paths of one depth
/// the reverse of their byte order. Templates are parsed and executed in it.
fn helm_order(planned: &RenderPlan) -> Vec<usize> {
    let mut order: Vec<usize> = (0..planned.templates.len()).collect();
    order.sort_by(|&a, &b| {
        let (a, b) = (&planned.templates[a].name, &planned.templates[b].name);
        let depth = |s: &str| s.matches('/').count();
        depth(b).cmp(&depth(a)).then_with(|| b.cmp(a))
    });
    order
}

/// The data of each planned chart (dot for its templates): `Values`, `Release`,
/// `Chart`, `Capabilities`, `Files`, `Subcharts`. Values are deep-copied once for
/// the release, and a subchart's `.Values` is the same map as its parent's
/// `.Values.<name>`, as in Helm.
fn chart_data(planned: &RenderPlan, release: &Release) -> Vec<Value> {
    let mut values: Vec<Value> = Vec::with_capacity(planned.charts.len());
    for scoped in &planned.charts {
        let name = scoped.path.rsplit('/').next().unwrap_or(&scoped.path);
        let shared = scoped.parent.and_then(|p| match values.get(p) {
            Some(Value::Map(parent)) => match parent.get(name) {
                Some(v @ Value::Map(_)) => Some(v),
                _ => None,
            },
            _ => None,
        });
        values.push(shared.unwrap_or_else(|| scoped.values.deep_copy()));
    }
    let release_value = release_map(release);
    let capabilities = Value::Object(Arc::new(CapabilitiesObject::new(&release.capabilities)));
    let data: Vec<Value> = planned
        .charts
        .iter()
        .zip(values)
        .enumerate()
        .map(|(index, (scoped, values))| {
            let mut top = BTreeMap::new();
            top.insert("Values".to_string(), values);
            top.insert("Release".to_string(), release_value.clone());
            top.insert("Capabilities".to_string(), capabilities.clone());
            top.insert("Chart".to_string(), chart_map(planned, index));
            top.insert(
                "Files".to_string(),
                Value::Object(Arc::new(FilesObject::new(&scoped.files))),
            );
            Value::map(top)
        })
        .collect();
    for (index, scoped) in planned.charts.iter().enumerate() {
        let mut subcharts = BTreeMap::new();
        for (child_index, child) in planned.charts.iter().enumerate() {
            if child.parent == Some(index) {
                let name = child.path.rsplit('/').next().unwrap_or(&child.path);
                subcharts.insert(name.to_string(), data[child_index].clone());
            }
        }
        let _ = scoped;
        if let Value::Map(map) = &data[index] {
            map.insert("Subcharts".to_string(), Value::map(subcharts));
        }
    }
    data
}

fn release_map(release: &Release) -> Value {
    let mut map = BTreeMap::new();
    map.insert("Name".to_string(), Value::string(release.name.as_str()));
    map.insert(
        "Namespace".to_string(),
        Value::string(release.namespace.as_str()),
    );
    map.insert("Revision".to_string(), Value::Int(release.revision));
    map.insert("IsInstall".to_string(), Value::Bool(release.is_install));
    map.insert("IsUpgrade".to_string(), Value::Bool(!release.is_install));
    map.insert("Service".to_string(), Value::string("Helm"));
    Value::map(map)
}

/// The host a template runs with: the caller's, naming the template.
struct TemplateHost<'a> {
    inner: &'a mut dyn Host,
    name: &'a str,
}

impl Host for TemplateHost<'_> {
    fn template_name(&self) -> &str {
        self.name
    }
    fn generated_bytes(&mut self, function: &str, args: &[Value], len: usize) -> Vec<u8> {
        self.inner.generated_bytes(function, args, len)
    }
    fn now_unix(&self) -> i64 {
        self.inner.now_unix()
    }
    fn sha256_hex(&self, text: &str) -> String {
        self.inner.sha256_hex(text)
    }
    fn secret_key_for(&self, text: &str) -> Option<[u8; 32]> {
        self.inner.secret_key_for(text)
    }
    fn warn(&mut self, message: String) {
        self.inner.warn(message);
    }
    fn sites(&self) -> bool {
        self.inner.sites()
    }
    fn defer(&mut self, name: &str, args: &[Value]) -> Option<Value> {
        self.inner.defer(name, args)
    }
}

/// Helm v4's `.Chart`: a map of chart.Metadata's fields under their Go names, every
/// field present (empty strings, empty lists), `IsRoot` true for the chart released.
fn chart_map(planned: &RenderPlan, index: usize) -> Value {
    let scoped = &planned.charts[index];
    let m = &scoped.metadata;
    let raw = |key: &str| m.raw.get(key).cloned();
    let text = |key: &str| match raw(key) {
        Some(Value::String(s)) => Value::String(s),
        Some(Value::Nil) | None => Value::string(""),
        Some(other) => Value::string(crate::helm::gotmpl::fmt::display(&other)),
    };
    let list = |key: &str| match raw(key) {
        Some(v @ Value::List(_)) => v,
        _ => Value::list(Vec::new()),
    };
    let opt = |s: &Option<String>| Value::string(s.clone().unwrap_or_default());
    let fields = |entry: &Value, names: &[(&str, &str)]| {
        let get = |key: &str| match entry {
            Value::Map(map) => map.get(key),
            _ => None,
        };
        let map: BTreeMap<String, Value> = names
            .iter()
            .map(|(go, yaml)| {
                let value = match get(yaml) {
                    Some(Value::Nil) | None => Value::string(""),
                    Some(v) => v,
                };
                (go.to_string(), value)
            })
            .collect();
        Value::map(map)
    };
    let maintainers = match raw("maintainers") {
        Some(Value::List(items)) => Value::list(
            items
                .iter()
                .map(|e| fields(e, &[("Name", "name"), ("Email", "email"), ("URL", "url")]))
                .collect(),
        ),
        _ => Value::list(Vec::new()),
    };
    let dependencies = Value::list(
        m.dependencies
            .iter()
            .map(|d| {
                let name = d.alias.clone().unwrap_or_else(|| d.name.clone());
                let path = format!("{}/charts/{name}", scoped.path);
                let enabled = planned.charts.iter().any(|c| c.path == path);
                let imports = d
                    .import_values
                    .iter()
                    .map(|i| match i {
                        ImportValue::Exports(s) => Value::string(s.as_str()),
                        ImportValue::Map { child, parent } => {
                            let mut map = BTreeMap::new();
                            map.insert("child".to_string(), Value::string(child.as_str()));
                            map.insert("parent".to_string(), Value::string(parent.as_str()));
                            Value::map(map)
                        }
                    })
                    .collect();
                let mut map = BTreeMap::new();
                map.insert("Name".to_string(), Value::string(d.name.as_str()));
                map.insert("Version".to_string(), Value::string(d.version.as_str()));
                map.insert(
                    "Repository".to_string(),
                    Value::string(d.repository.as_str()),
                );
                map.insert("Condition".to_string(), Value::string(d.condition.as_str()));
                map.insert(
                    "Tags".to_string(),
                    Value::list(d.tags.iter().map(|t| Value::string(t.as_str())).collect()),
                );
                map.insert("Enabled".to_string(), Value::Bool(enabled));
                map.insert("ImportValues".to_string(), Value::list(imports));
                map.insert(
                    "Alias".to_string(),
                    Value::string(d.alias.clone().unwrap_or_default()),
                );
                Value::map(map)
            })
            .collect(),
    );
    let annotations = match raw("annotations") {
        Some(v @ Value::Map(_)) => v,
        _ => Value::map(BTreeMap::new()),
    };
    let entries = [
        ("APIVersion", Value::string(m.api_version.as_str())),
        ("Annotations", annotations),
        ("AppVersion", opt(&m.app_version)),
        ("Condition", text("condition")),
        ("Dependencies", dependencies),
        (
            "Deprecated",
            Value::Bool(matches!(raw("deprecated"), Some(Value::Bool(true)))),
        ),
        ("Description", opt(&m.description)),
        ("Home", text("home")),
        ("Icon", text("icon")),
        ("IsRoot", Value::Bool(scoped.parent.is_none())),
        ("Keywords", list("keywords")),
        ("KubeVersion", opt(&m.kube_version)),
        ("Maintainers", maintainers),
        ("Name", Value::string(m.name.as_str())),
        ("Sources", list("sources")),
        ("Tags", text("tags")),
        ("Type", text("type")),
        ("Version", Value::string(m.version.as_str())),
    ];
    Value::map(
        entries
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
    )
}

/// Go's `*chartutil.Capabilities`.
#[derive(Debug)]
struct CapabilitiesObject {
    kube: Value,
    api_versions: Value,
    helm: Value,
}

impl CapabilitiesObject {
    fn new(caps: &Capabilities) -> CapabilitiesObject {
        CapabilitiesObject {
            kube: Value::Object(Arc::new(KubeVersion::parse(&caps.kube_version))),
            api_versions: Value::Object(Arc::new(ApiVersions(caps.api_versions.clone()))),
            helm: Value::Object(Arc::new(HelmVersion)),
        }
    }
}

impl Object for CapabilitiesObject {
    fn type_name(&self) -> &str {
        "*common.Capabilities"
    }
    fn field(&self, name: &str) -> Option<Value> {
        match name {
            "KubeVersion" => Some(self.kube.clone()),
            "APIVersions" => Some(self.api_versions.clone()),
            "HelmVersion" => Some(self.helm.clone()),
            _ => None,
        }
    }
    fn display(&self) -> String {
        format!(
            "&{{{} {} {}}}",
            crate::helm::gotmpl::fmt::display(&self.kube),
            crate::helm::gotmpl::fmt::display(&self.api_versions),
            crate::helm::gotmpl::fmt::display(&self.helm)
        )
    }
}

/// Go's `common.KubeVersion`: prints as its `Version`.
#[derive(Debug)]
struct KubeVersion {
    version: String,
    major: String,
    minor: String,
}

impl KubeVersion {
    fn parse(version: &str) -> KubeVersion {
        let bare = version.trim_start_matches('v');
        let mut parts = bare.split('.');
        KubeVersion {
            version: version.to_string(),
            major: parts.next().unwrap_or_default().to_string(),
            minor: parts.next().unwrap_or_default().to_string(),
        }
    }
}

impl Object for KubeVersion {
    fn type_name(&self) -> &str {
        "common.KubeVersion"
    }
    fn kind(&self) -> &'static str {
        "struct"
    }
    fn field(&self, name: &str) -> Option<Value> {
        match name {
            "Version" | "GitVersion" | "String" => Some(Value::string(self.version.as_str())),
            "Major" => Some(Value::string(self.major.as_str())),
            "Minor" => Some(Value::string(self.minor.as_str())),
            _ => None,
        }
    }
    fn display(&self) -> String {
        self.version.clone()
    }
}

/// Go's `common.VersionSet` with its `Has` method.
#[derive(Debug)]
struct ApiVersions(Vec<String>);

impl Object for ApiVersions {
    fn type_name(&self) -> &str {
        "common.VersionSet"
    }
    fn kind(&self) -> &'static str {
        "slice"
    }
    fn field(&self, _: &str) -> Option<Value> {
        None
    }
    fn call(&self, name: &str, args: &[Value]) -> Option<FuncResult> {
        if name != "Has" {
            return None;
        }
        Some(match args {
            [Value::String(s)] => Ok(Value::Bool(self.0.iter().any(|v| v == &**s))),
            [_] => Err(FuncError::wrong_type(0, "string")),
            _ => Err(FuncError::new(format!(
                "wrong number of args for Has: want 1 got {}",
                args.len()
            ))),
        })
    }
    fn display(&self) -> String {
        format!("[{}]", self.0.join(" "))
    }
    fn range_items(&self) -> Option<Vec<(Value, Value)>> {
        Some(
            self.0
                .iter()
                .enumerate()
                .map(|(i, v)| (Value::Int(i as i64), Value::string(v.as_str())))
                .collect(),
        )
    }
}

/// Helm v4's `version.BuildInfo` as the reference renders carry it.
#[derive(Debug)]
struct HelmVersion;

impl Object for HelmVersion {
    fn type_name(&self) -> &str {
        "version.BuildInfo"
    }
    fn kind(&self) -> &'static str {
        "struct"
    }
    fn field(&self, name: &str) -> Option<Value> {
        match name {
            "Version" => Some(Value::string("v4.2")),
            "GitCommit" | "GitTreeState" => Some(Value::string("")),
            "GoVersion" => Some(Value::string("go1.26.6")),
            "KubeClientVersion" => Some(Value::string("v1.36")),
            _ => None,
        }
    }
    fn display(&self) -> String {
        "{v4.2   go1.26.6 v1.36}".to_string()
    }
}

/// Helm's `files` (`.Files`): the chart's non-template files by path.
#[derive(Debug)]
struct FilesObject(BTreeMap<String, Arc<[u8]>>);

impl FilesObject {
    fn new(files: &[File]) -> FilesObject {
        FilesObject(
            files
                .iter()
                .map(|f| (f.name.clone(), Arc::clone(&f.data)))
                .collect(),
        )
    }

    fn string_arg(name: &str, args: &[Value]) -> Result<String, FuncError> {
        match args {
            [Value::String(s)] => Ok(s.to_string()),
            [_] => Err(FuncError::wrong_type(0, "string")),
            _ => Err(FuncError::new(format!(
                "wrong number of args for {name}: want 1 got {}",
                args.len()
            ))),
        }
    }

    /// Helm's `toYAML` of a map of file base names: yaml.Marshal without the final
    /// line break, an empty string for no files.
    fn as_yaml(&self, encode: impl Fn(&[u8]) -> String) -> Value {
        if self.0.is_empty() {
            return Value::string("");
        }
        let map: BTreeMap<String, Value> = self
            .0
            .iter()
            .map(|(path, data)| {
                let base = path.rsplit('/').next().unwrap_or(path).to_string();
                (base, Value::string(encode(data)))
            })
            .collect();
        Value::string(yaml::to_yaml(&Value::map(map)).unwrap_or_default())
    }
}

impl Object for FilesObject {
    fn type_name(&self) -> &str {
        "engine.files"
    }
    fn kind(&self) -> &'static str {
        "map"
    }
    fn truthy(&self) -> bool {
        !self.0.is_empty()
    }
    fn field(&self, name: &str) -> Option<Value> {
        if matches!(name, "AsConfig" | "AsSecrets") {
            return self.call(name, &[]).and_then(Result::ok);
        }
        Some(match self.0.get(name) {
            Some(data) => Value::Bytes(Arc::clone(data)),
            None => Value::Nil,
        })
    }
    fn call(&self, name: &str, args: &[Value]) -> Option<FuncResult> {
        let result = match name {
            // Go's string holds any bytes; ours only text. A binary file (an image,
            // a keystore) is handed on as its bytes, which `b64enc` encodes as Helm
            // does, instead of text with its invalid bytes replaced.
            "Get" => Self::string_arg(name, args).map(|path| match self.0.get(&path) {
                Some(data) => match std::str::from_utf8(data) {
                    Ok(text) => Value::string(text),
                    Err(_) => Value::Bytes(Arc::clone(data)),
                },
                None => Value::string(""),
            }),
            "GetBytes" => Self::string_arg(name, args).map(|path| {
                Value::Bytes(
                    self.0
                        .get(&path)
                        .cloned()
                        .unwrap_or_else(|| Arc::from(&[][..])),
                )
            }),
            "Glob" => Self::string_arg(name, args).map(|pattern| {
                let matched = self
                    .0
                    .iter()
                    .filter(|(path, _)| glob_match(pattern.as_bytes(), path.as_bytes()))
                    .map(|(k, v)| (k.clone(), Arc::clone(v)))
                    .collect();
                Value::Object(Arc::new(FilesObject(matched)))
            }),
            "Lines" => Self::string_arg(name, args).map(|path| match self.0.get(&path) {
                None => Value::list(Vec::new()),
                Some(data) => {
                    let text = String::from_utf8_lossy(data);
                    let text = text.strip_suffix('\n').unwrap_or(&text);
                    Value::list(text.split('\n').map(Value::string).collect())
                }
            }),
            "AsConfig" => Ok(self.as_yaml(|d| String::from_utf8_lossy(d).into_owned())),
            "AsSecrets" => Ok(self.as_yaml(|d| {
                use base64::Engine as _;
                base64::engine::general_purpose::STANDARD.encode(d)
            })),
            _ => return None,
        };
        Some(result)
    }
    fn display(&self) -> String {
        let entries: Vec<String> = self
            .0
            .iter()
            .map(|(k, v)| {
                let bytes: Vec<String> = v.iter().map(u8::to_string).collect();
                format!("{k}:[{}]", bytes.join(" "))
            })
            .collect();
        format!("map[{}]", entries.join(" "))
    }
    /// A `map[string][]byte`: each path (sorted) and its bytes.
    fn range_items(&self) -> Option<Vec<(Value, Value)>> {
        Some(
            self.0
                .iter()
                .map(|(path, data)| (Value::string(path.as_str()), Value::Bytes(Arc::clone(data))))
                .collect(),
        )
    }
}

/// Brace alternatives a `.Files.Glob` pattern may expand to; more fails the match.
const MAX_GLOB_ALTERNATIVES: usize = 1024;

/// gobwas/glob with `/` as the separator, as `.Files.Glob` matches: `*` any run
/// without `/`, `**` any run, `?` one character but `/`, `[abc]`, `[!a-z]`,
/// `{a,b}`, and `\` escaping the next character. Braces are expanded first, then
/// each pattern is matched with a table of (pattern, text) positions, so no pattern
/// takes more than their product in steps.
fn glob_match(pattern: &[u8], text: &[u8]) -> bool {
    let mut alternatives = vec![Vec::new()];
    if !expand_braces(pattern, &mut alternatives) {
        return false;
    }
    alternatives.iter().any(|p| glob_match_plain(p, text))
}

/// Appends every expansion of `pattern`'s `{a,b}` groups to each of `out`'s
/// prefixes; false when there would be too many.
fn expand_braces(pattern: &[u8], out: &mut Vec<Vec<u8>>) -> bool {
    let mut i = 0;
    while i < pattern.len() {
        match pattern[i] {
            b'\\' if i + 1 < pattern.len() => {
                for prefix in out.iter_mut() {
                    prefix.extend_from_slice(&pattern[i..i + 2]);
                }
                i += 2;
            }
            b'{' => {
                let Some(close) = pattern[i..].iter().position(|&c| c == b'}') else {
                    for prefix in out.iter_mut() {
                        prefix.push(b'{');
                    }
                    i += 1;
                    continue;
                };
                let options: Vec<&[u8]> = pattern[i + 1..i + close].split(|&c| c == b',').collect();
                if out.len() * options.len() > MAX_GLOB_ALTERNATIVES {
                    return false;
                }
                let mut next = Vec::with_capacity(out.len() * options.len());
                for prefix in out.iter() {
                    for option in &options {
                        let mut joined = prefix.clone();
                        joined.extend_from_slice(option);
                        next.push(joined);
                    }
                }
                *out = next;
                i += close + 1;
            }
            c => {
                for prefix in out.iter_mut() {
                    prefix.push(c);
                }
                i += 1;
            }
        }
    }
    true
}

/// One brace-free glob against the text, by dynamic programming over positions.
fn glob_match_plain(pattern: &[u8], text: &[u8]) -> bool {
    // reachable[t]: the pattern read so far can match text[..t].
    let mut reachable = vec![false; text.len() + 1];
    reachable[0] = true;
    let mut p = 0;
    while p < pattern.len() {
        let mut next = vec![false; text.len() + 1];
        match pattern[p] {
            b'*' => {
                let any = pattern.get(p + 1) == Some(&b'*');
                let mut on = false;
                for t in 0..=text.len() {
                    on |= reachable[t];
                    next[t] = on;
                    if !any && text.get(t) == Some(&b'/') {
                        on = false;
                    }
                }
                p += if any { 2 } else { 1 };
            }
            b'?' => {
                for t in 0..text.len() {
                    next[t + 1] = reachable[t] && text[t] != b'/';
                }
                p += 1;
            }
            b'[' if pattern[p + 1..].contains(&b']') => {
                let end = p
                    + 1
                    + pattern[p + 1..]
                        .iter()
                        .position(|&c| c == b']')
                        .unwrap_or(0);
                let mut class = &pattern[p + 1..end];
                let negated = class.first() == Some(&b'!');
                if negated {
                    class = &class[1..];
                }
                let in_class = |c: u8| {
                    let mut i = 0;
                    while i < class.len() {
                        if i + 2 < class.len() && class[i + 1] == b'-' {
                            if class[i] <= c && c <= class[i + 2] {
                                return true;
                            }
                            i += 3;
                        } else {
                            if class[i] == c {
                                return true;
                            }
                            i += 1;
                        }
                    }
                    false
                };
                for t in 0..text.len() {
                    next[t + 1] = reachable[t] && in_class(text[t]) != negated;
                }
                p = end + 1;
            }
            c => {
                let (literal, step) = match (c, pattern.get(p + 1)) {
                    (b'\\', Some(&escaped)) => (escaped, 2),
                    _ => (c, 1),
                };
                for t in 0..text.len() {
                    next[t + 1] = reachable[t] && text[t] == literal;
                }
                p += step;
            }
        }
        reachable = next;
    }
    reachable[text.len()]
}

#[cfg(test)]
mod tests;
