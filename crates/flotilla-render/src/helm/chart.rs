//! A Helm chart read from bytes, as Helm's loader reads it: from a folder's files
//! ([`Chart::from_files`], `.helmignore` applied) or from a `.tgz` ([`Chart::from_tgz`],
//! with budgets against archive bombs and refusing links and paths out of the chart).
//!
//! Public API: [`Chart`] (`metadata`, `values`, `schema`, `templates`, `files`,
//! `subcharts`), [`Metadata`], [`Dependency`], [`ImportValue`], [`ChartType`], [`File`],
//! [`ChartError`], and the budgets [`MAX_FILES`], [`MAX_FILE_BYTES`], [`MAX_TOTAL_BYTES`].
//!
//! As in Helm, `Chart.yaml`, `values.yaml`, `values.schema.json`, `Chart.lock`,
//! `requirements.lock`, `templates/**` and `charts/**` are not in [`Chart::files`]
//! (what `.Files` holds); everything else is, `crds/**` included; `requirements.yaml` is
//! there only for an apiVersion v1 chart. In `charts/`, names starting with `_` or `.`
//! are skipped, each folder is a subchart and each `.tgz` a packed one.

use std::collections::BTreeMap;
use std::io::Read;
use std::sync::Arc;

use crate::helm::gotmpl::{MapRef, Value};
use crate::helm::yaml;

/// Files an archive (with its subcharts' archives) may hold.
pub const MAX_FILES: usize = 10_000;
/// Bytes one file of an archive may unpack to.
pub const MAX_FILE_BYTES: u64 = 16 << 20;
/// Bytes an archive may unpack to in all.
pub const MAX_TOTAL_BYTES: u64 = 64 << 20;
/// How deep subcharts may nest.
pub const MAX_SUBCHART_DEPTH: usize = 16;

/// A chart problem, naming the file it is in.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChartError {
    #[error("{file}: {message}")]
    Invalid { file: String, message: String },
    #[error(
        "{chart}/Chart.yaml: found in Chart.yaml, but missing in charts/ directory: {missing}; run `helm dependency build` (or `helm pull --untar` each into charts/) and commit the result"
    )]
    MissingDependencies { chart: String, missing: String },
    #[error("{archive}: {message}")]
    Archive { archive: String, message: String },
}

fn invalid(file: impl Into<String>, message: impl Into<String>) -> ChartError {
    ChartError::Invalid {
        file: file.into(),
        message: message.into(),
    }
}

/// A file of the chart, its name relative to the chart's root (`templates/x.yaml`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct File {
    pub name: String,
    pub data: Arc<[u8]>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ChartType {
    #[default]
    Application,
    /// Its templates are only partials for other charts to include.
    Library,
}

/// `import-values` of a dependency.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImportValue {
    /// `{child: a.b, parent: c}`: the child's `a.b` copied to the parent's `c`.
    Map { child: String, parent: String },
    /// `data`: the child's `exports.data` merged into the parent's values.
    Exports(String),
}

/// An entry of `dependencies` (Chart.yaml, or requirements.yaml for apiVersion v1).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Dependency {
    pub name: String,
    pub version: String,
    pub repository: String,
    /// Comma-separated value paths; the first that holds a boolean decides.
    pub condition: String,
    pub tags: Vec<String>,
    pub enabled: Option<bool>,
    pub import_values: Vec<ImportValue>,
    pub alias: Option<String>,
}

/// What Chart.yaml says.
#[derive(Debug, Clone, Default)]
pub struct Metadata {
    pub api_version: String,
    pub name: String,
    pub version: String,
    pub app_version: Option<String>,
    pub description: Option<String>,
    pub kube_version: Option<String>,
    pub chart_type: ChartType,
    pub dependencies: Vec<Dependency>,
    /// The whole file as read, for `.Chart`'s other fields.
    pub raw: BTreeMap<String, Value>,
}

/// A loaded chart.
#[derive(Debug, Clone, Default)]
pub struct Chart {
    pub metadata: Metadata,
    /// values.yaml (its documents merged, as Helm merges them).
    pub values: BTreeMap<String, Value>,
    /// values.schema.json, as bytes.
    pub schema: Option<Arc<[u8]>>,
    /// templates/**, sorted by name.
    pub templates: Vec<File>,
    /// What `.Files` holds, sorted by name.
    pub files: Vec<File>,
    /// The charts in charts/, sorted by name.
    pub subcharts: Vec<Chart>,
}

impl Chart {
    /// The chart's name as templates and template names use it.
    pub fn name(&self) -> &str {
        &self.metadata.name
    }

    /// The files of `crds/` (Helm installs them as they are, before the templates).
    pub fn crds(&self) -> impl Iterator<Item = &File> {
        self.files.iter().filter(|f| f.name.starts_with("crds/"))
    }

    /// A chart from a folder's files (paths relative to its root, `/`-separated), its
    /// `.helmignore` applied as Helm applies it to a folder.
    pub fn from_files(files: BTreeMap<String, Vec<u8>>) -> Result<Chart, ChartError> {
        let ignore = match files.get(".helmignore") {
            Some(data) => Ignore::parse(&String::from_utf8_lossy(data))?,
            None => Ignore::default(),
        };
        let mut kept = BTreeMap::new();
        for (path, data) in files {
            let path = check_path(&path, "the chart folder")?;
            if ignore.ignores(&path) {
                continue;
            }
            kept.insert(path, Arc::<[u8]>::from(data));
        }
        let mut budget = Budget::default();
        load(kept, "", 0, &mut budget)
    }

    /// A chart from a `.tgz` as `helm package` makes it (one top folder, the chart).
    pub fn from_tgz(bytes: &[u8]) -> Result<Chart, ChartError> {
        let mut budget = Budget::default();
        from_tgz_within(bytes, "the chart archive", 0, &mut budget)
    }
}

#[derive(Default)]
struct Budget {
    files: usize,
    bytes: u64,
}

fn archive_error(archive: &str, message: impl Into<String>) -> ChartError {
    ChartError::Archive {
        archive: archive.to_string(),
        message: message.into(),
    }
}

fn from_tgz_within(
    bytes: &[u8],
    archive: &str,
    depth: usize,
    budget: &mut Budget,
) -> Result<Chart, ChartError> {
    if depth > MAX_SUBCHART_DEPTH {
        return Err(archive_error(
            archive,
            format!("subcharts nest deeper than {MAX_SUBCHART_DEPTH} levels"),
        ));
    }
    let gzip = flate2::read::GzDecoder::new(bytes);
    let mut tar = tar::Archive::new(gzip);
    let entries = tar
        .entries()
        .map_err(|err| archive_error(archive, format!("not a gzipped tar archive: {err}")))?;
    let mut files: BTreeMap<String, Arc<[u8]>> = BTreeMap::new();
    for entry in entries {
        let entry = entry
            .map_err(|err| archive_error(archive, format!("cannot read the archive: {err}")))?;
        let kind = entry.header().entry_type();
        let path = entry
            .path()
            .map_err(|err| {
                archive_error(archive, format!("an entry has an unreadable name: {err}"))
            })?
            .to_string_lossy()
            .replace('\\', "/");
        if kind.is_dir() || kind.is_pax_global_extensions() || kind.is_pax_local_extensions() {
            continue;
        }
        if kind.is_symlink() || kind.is_hard_link() {
            return Err(archive_error(
                archive,
                format!("{path} is a link; flotilla reads no links from a chart"),
            ));
        }
        if !kind.is_file() {
            return Err(archive_error(
                archive,
                format!("{path} is not a regular file"),
            ));
        }
        let path = check_path(&path, archive)?;
        // Helm drops the archive's top folder: the chart's files are below it.
        let Some((_, inside)) = path.split_once('/') else {
            return Err(archive_error(
                archive,
                format!("{path} is not inside the chart's folder"),
            ));
        };
        budget.files += 1;
        if budget.files > MAX_FILES {
            return Err(archive_error(
                archive,
                format!("holds more than {MAX_FILES} files"),
            ));
        }
        let size = entry.header().size().unwrap_or(u64::MAX);
        if size > MAX_FILE_BYTES {
            return Err(archive_error(
                archive,
                format!("{path} unpacks to more than {MAX_FILE_BYTES} bytes"),
            ));
        }
        let mut data = Vec::new();
        entry
            .take(MAX_FILE_BYTES + 1)
            .read_to_end(&mut data)
            .map_err(|err| archive_error(archive, format!("cannot read {path}: {err}")))?;
        budget.bytes += data.len() as u64;
        if budget.bytes > MAX_TOTAL_BYTES {
            return Err(archive_error(
                archive,
                format!("unpacks to more than {MAX_TOTAL_BYTES} bytes"),
            ));
        }
        files.insert(inside.to_string(), data.into());
    }
    if files.is_empty() {
        return Err(archive_error(archive, "holds no chart"));
    }
    load(files, "", depth, budget)
}

/// A relative `/`-separated path without `..`, refused otherwise.
fn check_path(path: &str, whole: &str) -> Result<String, ChartError> {
    let path = path.trim_start_matches("./");
    if path.starts_with('/')
        || path.split('/').any(|part| part == "..")
        || path.contains(':')
            && path.starts_with(|c: char| c.is_ascii_alphabetic())
            && path.as_bytes().get(1) == Some(&b':')
    {
        return Err(archive_error(
            whole,
            format!("{path} points outside the chart"),
        ));
    }
    Ok(path.to_string())
}

fn yaml_string(map: &BTreeMap<String, Value>, key: &str) -> Option<String> {
    match map.get(key)? {
        Value::String(s) => Some(s.to_string()),
        Value::Float(f) => Some(format!("{f}")),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// Loads one chart from its files; `prefix` names where it is, for errors.
fn load(
    files: BTreeMap<String, Arc<[u8]>>,
    prefix: &str,
    depth: usize,
    budget: &mut Budget,
) -> Result<Chart, ChartError> {
    let at = |name: &str| format!("{prefix}{name}");
    let Some(chart_yaml) = files.get("Chart.yaml") else {
        return Err(invalid(at("Chart.yaml"), "Chart.yaml file is missing"));
    };
    let raw = yaml::from_yaml_map(&String::from_utf8_lossy(chart_yaml))
        .map_err(|err| invalid(at("Chart.yaml"), format!("cannot load Chart.yaml: {err}")))?;
    let mut metadata = read_metadata(&raw).map_err(|message| invalid(at("Chart.yaml"), message))?;
    let mut chart = Chart::default();
    let mut subchart_files: BTreeMap<String, BTreeMap<String, Arc<[u8]>>> = BTreeMap::new();
    for (name, data) in files {
        match name.as_str() {
            "Chart.yaml" | "Chart.lock" | "requirements.lock" => {}
            "values.yaml" => {
                chart.values =
                    read_values(&data).map_err(|message| invalid(at("values.yaml"), message))?
            }
            "values.schema.json" => chart.schema = Some(data),
            "requirements.yaml" => {
                let requirements =
                    yaml::from_yaml_map(&String::from_utf8_lossy(&data)).map_err(|err| {
                        invalid(
                            at("requirements.yaml"),
                            format!("cannot load requirements.yaml: {err}"),
                        )
                    })?;
                if let Some(dependencies) = requirements.get("dependencies") {
                    metadata.dependencies = read_dependencies(dependencies)
                        .map_err(|message| invalid(at("requirements.yaml"), message))?;
                }
                if metadata.api_version == "v1" {
                    chart.files.push(File { name, data });
                }
            }
            _ if name.starts_with("templates/") => chart.templates.push(File { name, data }),
            _ if name.starts_with("charts/") && !name.ends_with(".prov") => {
                let rest = &name["charts/".len()..];
                let (sub, inner) = rest.split_once('/').unwrap_or((rest, ""));
                subchart_files
                    .entry(sub.to_string())
                    .or_default()
                    .insert(inner.to_string(), data);
            }
            _ => chart.files.push(File { name, data }),
        }
    }
    if depth >= MAX_SUBCHART_DEPTH && !subchart_files.is_empty() {
        return Err(invalid(
            at("charts/"),
            format!("subcharts nest deeper than {MAX_SUBCHART_DEPTH} levels"),
        ));
    }
    for (sub, files) in subchart_files {
        if sub.starts_with(['_', '.']) {
            continue;
        }
        let sub_prefix = format!("{prefix}charts/{sub}/");
        let subchart = if sub.ends_with(".tgz") {
            let Some(data) = files.get("") else {
                return Err(invalid(
                    at(&format!("charts/{sub}")),
                    "a subchart archive must be a file",
                ));
            };
            from_tgz_within(data, &at(&format!("charts/{sub}")), depth + 1, budget)?
        } else {
            load(
                files
                    .into_iter()
                    .filter(|(name, _)| !name.is_empty())
                    .collect(),
                &sub_prefix,
                depth + 1,
                budget,
            )?
        };
        chart.subcharts.push(subchart);
    }
    chart
        .subcharts
        .sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    chart.metadata = metadata;
    // Helm checks at install time that every dependency is in charts/.
    let missing: Vec<&str> = chart
        .metadata
        .dependencies
        .iter()
        .filter(|dependency| {
            !chart
                .subcharts
                .iter()
                .any(|sub| sub.metadata.name == dependency.name)
        })
        .map(|dependency| dependency.name.as_str())
        .collect();
    if !missing.is_empty() {
        return Err(ChartError::MissingDependencies {
            chart: if prefix.is_empty() {
                chart.metadata.name.clone()
            } else {
                prefix.trim_end_matches('/').to_string()
            },
            missing: missing.join(", "),
        });
    }
    Ok(chart)
}

/// values.yaml: every document merged into the one before it (Helm's `LoadValues`).
fn read_values(data: &[u8]) -> Result<BTreeMap<String, Value>, String> {
    let text = String::from_utf8_lossy(data);
    let mut values = BTreeMap::new();
    for document in yaml::split_documents(&text) {
        let current = yaml::from_yaml_map(document).map_err(|err| {
            format!("cannot load values.yaml: cannot unmarshal yaml document: {err}")
        })?;
        merge_maps(&mut values, current);
    }
    Ok(values)
}

/// Helm's `MergeMaps`: maps merged deeply, anything else replaced.
fn merge_maps(into: &mut BTreeMap<String, Value>, from: BTreeMap<String, Value>) {
    for (key, value) in from {
        match (into.get_mut(&key), value) {
            (Some(Value::Map(existing)), Value::Map(incoming)) => {
                let mut merged = existing.snapshot();
                merge_maps(&mut merged, incoming.snapshot());
                *existing = MapRef::new(merged);
            }
            (_, value) => {
                into.insert(key, value);
            }
        }
    }
}

fn read_metadata(raw: &BTreeMap<String, Value>) -> Result<Metadata, String> {
    let mut metadata = Metadata {
        api_version: yaml_string(raw, "apiVersion").unwrap_or_else(|| "v1".into()),
        name: yaml_string(raw, "name").unwrap_or_default(),
        version: yaml_string(raw, "version").unwrap_or_default(),
        app_version: yaml_string(raw, "appVersion"),
        description: yaml_string(raw, "description"),
        kube_version: yaml_string(raw, "kubeVersion"),
        chart_type: ChartType::Application,
        dependencies: Vec::new(),
        raw: raw.clone(),
    };
    // Helm's `Metadata.Validate`, in its order and words.
    if metadata.api_version != "v1" && metadata.api_version != "v2" {
        return Err(format!(
            "validation: chart.metadata.apiVersion is required or {:?} is not supported",
            metadata.api_version
        ));
    }
    if metadata.name.is_empty() {
        return Err("validation: chart.metadata.name is required".into());
    }
    if metadata.name.contains('/') || metadata.name.contains('\\') {
        return Err(format!(
            "validation: chart.metadata.name {:?} is invalid",
            metadata.name
        ));
    }
    if metadata.version.is_empty() {
        return Err("validation: chart.metadata.version is required".into());
    }
    match yaml_string(raw, "type").as_deref() {
        None | Some("") | Some("application") => {}
        Some("library") => metadata.chart_type = ChartType::Library,
        Some(other) => {
            return Err(format!(
                "validation: chart.metadata.type must be application or library, not {other:?}"
            ));
        }
    }
    if let Some(dependencies) = raw.get("dependencies") {
        metadata.dependencies = read_dependencies(dependencies)?;
    }
    Ok(metadata)
}

fn read_dependencies(value: &Value) -> Result<Vec<Dependency>, String> {
    let Value::List(items) = value else {
        return match value {
            Value::Nil => Ok(Vec::new()),
            _ => Err("dependencies must be a list".into()),
        };
    };
    let mut dependencies = Vec::new();
    for item in items.iter() {
        let Value::Map(entry) = item else {
            return Err("each dependency must be a mapping".into());
        };
        let entry = &*entry.read();
        let mut dependency = Dependency {
            name: yaml_string(entry, "name").unwrap_or_default(),
            version: yaml_string(entry, "version").unwrap_or_default(),
            repository: yaml_string(entry, "repository").unwrap_or_default(),
            condition: yaml_string(entry, "condition").unwrap_or_default(),
            alias: yaml_string(entry, "alias").filter(|a| !a.is_empty()),
            enabled: match entry.get("enabled") {
                Some(Value::Bool(b)) => Some(*b),
                _ => None,
            },
            ..Dependency::default()
        };
        if dependency.name.is_empty() {
            return Err("validation: dependencies must have a name".into());
        }
        if let Some(Value::List(tags)) = entry.get("tags") {
            dependency.tags = tags
                .iter()
                .filter_map(|t| t.as_str().map(str::to_string))
                .collect();
        }
        if let Some(Value::List(imports)) = entry.get("import-values") {
            for import in imports.iter() {
                match import {
                    Value::String(s) => dependency
                        .import_values
                        .push(ImportValue::Exports(s.to_string())),
                    Value::Map(m) => dependency.import_values.push(ImportValue::Map {
                        child: yaml_string(&m.read(), "child").unwrap_or_default(),
                        parent: yaml_string(&m.read(), "parent").unwrap_or_default(),
                    }),
                    _ => {
                        return Err(format!(
                            "dependency {}: import-values must be strings or child/parent mappings",
                            dependency.name
                        ));
                    }
                }
            }
        }
        dependencies.push(dependency);
    }
    Ok(dependencies)
}

/// `.helmignore` rules as Helm's `ignore` package applies them to a folder: each
/// pattern is Go's `filepath.Match`, against the whole path when it holds a `/`, else
/// against the last part; `!` negates, a trailing `/` matches only folders; a folder
/// that matches hides everything in it. Helm always adds `templates/.?*`.
#[derive(Debug, Clone)]
struct Ignore {
    patterns: Vec<Pattern>,
}

#[derive(Debug, Clone)]
struct Pattern {
    rule: String,
    negate: bool,
    must_dir: bool,
    whole_path: bool,
}

impl Default for Ignore {
    fn default() -> Ignore {
        Ignore {
            patterns: vec![Pattern {
                rule: "templates/.?*".into(),
                negate: false,
                must_dir: false,
                whole_path: true,
            }],
        }
    }
}

impl Ignore {
    fn parse(text: &str) -> Result<Ignore, ChartError> {
        let mut ignore = Ignore {
            patterns: Vec::new(),
        };
        for line in text.lines() {
            let mut rule = line.trim();
            if rule.is_empty() || rule.starts_with('#') {
                continue;
            }
            if rule.contains("**") {
                return Err(invalid(
                    ".helmignore",
                    "double-star (**) syntax is not supported",
                ));
            }
            let negate = rule.starts_with('!');
            if negate {
                rule = &rule[1..];
            }
            let must_dir = rule.ends_with('/');
            rule = rule.trim_end_matches('/');
            let (rule, whole_path) = match rule.strip_prefix('/') {
                Some(rest) => (rest, true),
                None => (rule, rule.contains('/')),
            };
            if glob_match(rule, "abc").is_none() {
                return Err(invalid(
                    ".helmignore",
                    format!("syntax error in pattern {rule:?}"),
                ));
            }
            ignore.patterns.push(Pattern {
                rule: rule.to_string(),
                negate,
                must_dir,
                whole_path,
            });
        }
        ignore.patterns.extend(Ignore::default().patterns);
        Ok(ignore)
    }

    /// Whether a file is left out: it, or a folder above it, is ignored.
    fn ignores(&self, path: &str) -> bool {
        let parts: Vec<&str> = path.split('/').collect();
        (1..parts.len()).any(|n| self.ignores_one(&parts[..n].join("/"), true))
            || self.ignores_one(path, false)
    }

    fn ignores_one(&self, path: &str, is_dir: bool) -> bool {
        for pattern in &self.patterns {
            let name = if pattern.whole_path {
                path
            } else {
                path.rsplit('/').next().unwrap_or(path)
            };
            let matched = glob_match(&pattern.rule, name).unwrap_or(false);
            if pattern.negate {
                // Helm's rule: a negated pattern ignores whatever it does not match.
                if (pattern.must_dir && !is_dir) || !matched {
                    return true;
                }
                continue;
            }
            if pattern.must_dir && !is_dir {
                continue;
            }
            if matched {
                return true;
            }
        }
        false
    }
}

/// Go's `filepath.Match` on `/`-separated names: `*`, `?`, `[...]` (ranges, `^`), `\`
/// escapes. `None` for a malformed pattern.
fn glob_match(pattern: &str, name: &str) -> Option<bool> {
    let p: Vec<char> = pattern.chars().collect();
    let n: Vec<char> = name.chars().collect();
    glob_at(&p, &n)
}

fn glob_at(p: &[char], n: &[char]) -> Option<bool> {
    let Some((&first, rest)) = p.split_first() else {
        return Some(n.is_empty());
    };
    match first {
        '*' => {
            for skip in 0..=n.len() {
                if skip > 0 && n[skip - 1] == '/' {
                    break;
                }
                if glob_at(rest, &n[skip..])? {
                    return Some(true);
                }
            }
            // Check the rest is well formed even when nothing matched.
            glob_at(rest, &[]).map(|_| false)
        }
        '?' => match n.split_first() {
            Some((&c, n_rest)) if c != '/' => glob_at(rest, n_rest),
            _ => Some(false),
        },
        '[' => {
            let mut at = 0;
            let negated = rest.first() == Some(&'^');
            if negated {
                at += 1;
            }
            let mut matched = false;
            let c = n.first().copied();
            let mut first_item = true;
            loop {
                let item = *rest.get(at)?;
                if item == ']' && !first_item {
                    at += 1;
                    break;
                }
                first_item = false;
                let mut low = item;
                if low == '\\' {
                    at += 1;
                    low = *rest.get(at)?;
                }
                at += 1;
                let mut high = low;
                if rest.get(at) == Some(&'-') && rest.get(at + 1).is_some_and(|c| *c != ']') {
                    high = rest[at + 1];
                    at += 2;
                    if high == '\\' {
                        high = *rest.get(at)?;
                        at += 1;
                    }
                }
                if let Some(c) = c
                    && low <= c
                    && c <= high
                {
                    matched = true;
                }
            }
            match c {
                Some(c) if c != '/' && matched != negated => glob_at(&rest[at..], &n[1..]),
                _ => glob_at(&rest[at..], &[]).map(|_| false),
            }
        }
        '\\' => {
            let (&literal, rest) = rest.split_first()?;
            match n.split_first() {
                Some((&c, n_rest)) if c == literal => glob_at(rest, n_rest),
                _ => Some(false),
            }
        }
        literal => match n.split_first() {
            Some((&c, n_rest)) if c == literal => glob_at(rest, n_rest),
            _ => Some(false),
        },
    }
}

#[cfg(test)]
mod tests;
