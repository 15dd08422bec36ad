//! The pages themselves: view models built from the fleet summary and the rollouts,
//! rendered with minijinja templates (HTML autoescaped). Pure apart from the
//! templates compiled into the binary, so a benchmark can build the fleet page of
//! 10,000 clusters without a server.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, OnceLock};

use minijinja::value::Serde;
use minijinja::{Environment, context};
use serde::{Deserialize, Serialize};

use crate::fleet::{
    ClusterState, ClusterSummary, Counts, Drift, InstallErrorSummary, Line, RenderStatus,
    RenderWarnings,
};
use crate::scope::TenantView;
use flotilla_core::access::ScopedBundle;
use flotilla_core::bundle::ResourceKey;
use flotilla_core::rollout::view::RolloutView;
use flotilla_core::secret;
use flotilla_core::status::{ResourceState, ResourceStatus, StatusReport};

/// Who is logged in: shown in the page's header, and deciding what the page offers
/// (the server refuses the rest regardless).
#[derive(Clone, Debug, Serialize)]
pub struct Visitor {
    /// The session's form token.
    pub csrf: String,
    /// The id of the token that logged in.
    pub token: String,
    /// Its role: `viewer`, `operator`, `admin`, or `operator@TENANT`.
    pub role: String,
    /// Whether it pauses, resumes, promotes and aborts rollouts.
    pub steers: bool,
    /// Whether it reads bundles.
    pub reads_bundles: bool,
}

/// Clusters per page of the cluster list.
pub const PAGE_SIZE: usize = 100;

/// Why a page could not be built (a template error: a defect, never user input).
#[derive(Debug, thiserror::Error)]
#[error("the web page's template {template} failed: {source}")]
pub struct PageError {
    template: &'static str,
    source: minijinja::Error,
}

fn environment() -> &'static Environment<'static> {
    static ENV: OnceLock<Environment<'static>> = OnceLock::new();
    ENV.get_or_init(|| {
        let mut env = Environment::new();
        env.add_filter("urlencode", |text: String| encode(&text));
        env.add_filter("short_digest", |digest: String| short(&digest));
        // Autoescape by file name: every template here ends in .html.
        for (name, source) in [
            ("base.html", include_str!("templates/base.html")),
            ("bars.html", include_str!("templates/bars.html")),
            ("login.html", include_str!("templates/login.html")),
            ("fleet.html", include_str!("templates/fleet.html")),
            ("cluster.html", include_str!("templates/cluster.html")),
            ("rollout.html", include_str!("templates/rollout.html")),
            ("bundle.html", include_str!("templates/bundle.html")),
            ("error.html", include_str!("templates/error.html")),
        ] {
            if let Err(err) = env.add_template(name, source) {
                // The templates are compiled in and tested; say which one broke.
                tracing::error!("the web page's template {name} does not parse: {err}");
            }
        }
        env
    })
}

/// The stylesheet and script, served from the hub itself (no external assets).
pub const STYLE: &str = include_str!("templates/style.css");
pub const SCRIPT: &str = include_str!("templates/ui.js");

pub fn render(template: &'static str, ctx: minijinja::Value) -> Result<String, PageError> {
    environment()
        .get_template(template)
        .and_then(|t| t.render(ctx))
        .map_err(|source| PageError { template, source })
}

/// The cluster list's filters and page, from the query string.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
pub struct FleetQuery {
    #[serde(default)]
    pub state: String,
    #[serde(default)]
    pub group: String,
    /// A part of the cluster's name.
    #[serde(default)]
    pub name: String,
    /// `true`: only drifted clusters (a checkbox; any other value is no filter).
    #[serde(default)]
    pub drifted: String,
    #[serde(default)]
    pub page: Option<usize>,
}

impl FleetQuery {
    fn drifted_only(&self) -> bool {
        self.drifted == "true"
    }

    /// This query's link with another page number.
    fn link(&self, page: usize) -> String {
        let mut parts = Vec::new();
        for (key, value) in [
            ("state", &self.state),
            ("group", &self.group),
            ("name", &self.name),
        ] {
            if !value.is_empty() {
                parts.push(format!("{key}={}", encode(value)));
            }
        }
        if self.drifted_only() {
            parts.push("drifted=true".to_string());
        }
        if page > 1 {
            parts.push(format!("page={page}"));
        }
        if parts.is_empty() {
            "/ui/".to_string()
        } else {
            format!("/ui/?{}", parts.join("&"))
        }
    }
}

/// Percent-encodes a query value or path segment (unreserved characters kept).
pub fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~') {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[derive(Serialize)]
struct Segment {
    state: &'static str,
    count: usize,
    /// Width in percent of the bar, to one decimal.
    percent: String,
}

fn segments(counts: &Counts) -> Vec<Segment> {
    let total = counts.total();
    ClusterState::BY_URGENCY
        .iter()
        .map(|s| (s.as_str(), counts.get(*s)))
        .filter(|(_, count)| *count > 0)
        .map(|(state, count)| Segment {
            state,
            count,
            percent: format!("{:.1}", count as f64 * 100.0 / total.max(1) as f64),
        })
        .collect()
}

/// One part of a wave's bar: the wave's clusters in sync, failed, or not there yet.
#[derive(Serialize)]
struct WaveSegment {
    /// `in-sync`, `failed` or `to-go` (the CSS class `s-…` colours it).
    kind: &'static str,
    /// What the legend calls it.
    label: &'static str,
    count: usize,
    percent: String,
}

/// A wave's bar and its numbers, as the fleet page and a rollout's page draw them.
#[derive(Serialize)]
struct WaveBar {
    name: String,
    state: &'static str,
    clusters: usize,
    in_sync: usize,
    failed: usize,
    offline: usize,
    never_seen: usize,
    bake: String,
    /// In sync, failed, not there yet: they add up to the wave's clusters.
    segments: Vec<WaveSegment>,
}

/// What the legend of the wave bars says, in the order of the bar.
const WAVE_LEGEND: [(&str, &str); 3] = [
    ("in-sync", "in sync (healthy on the new digest)"),
    ("failed", "failed"),
    ("to-go", "not there yet"),
];

/// A wave's clusters in sync, failed and not there yet, adding up to `clusters`. The
/// counts come from separate flags (a failed cluster may be healthy on the new digest
/// again before the rollout clears its mark): the parts stay within the wave
/// whatever they say, in sync first.
fn wave_parts(clusters: usize, in_sync: usize, failed: usize) -> [usize; 3] {
    let in_sync = in_sync.min(clusters);
    let failed = failed.min(clusters - in_sync);
    [in_sync, failed, clusters - in_sync - failed]
}

fn wave_bars(rollout: &RolloutView) -> Vec<WaveBar> {
    rollout
        .waves
        .iter()
        .map(|w| {
            let segments = wave_parts(w.clusters, w.in_sync, w.failed)
                .into_iter()
                .zip(WAVE_LEGEND)
                .filter(|(count, _)| *count > 0)
                .map(|(count, (kind, label))| WaveSegment {
                    kind,
                    label,
                    count,
                    percent: format!("{:.1}", count as f64 * 100.0 / w.clusters.max(1) as f64),
                })
                .collect();
            WaveBar {
                name: w.name.clone(),
                state: w.state.as_str(),
                clusters: w.clusters,
                in_sync: w.in_sync,
                failed: w.failed,
                offline: w.offline,
                never_seen: w.never_seen,
                bake: w.bake.clone(),
                segments,
            }
        })
        .collect()
}

#[derive(Serialize)]
struct GroupBar {
    name: String,
    total: usize,
    segments: Vec<Segment>,
}

#[derive(Serialize)]
struct Row {
    name: String,
    link: String,
    state: &'static str,
    drifted: bool,
    wave: Option<String>,
    groups: Vec<String>,
    applied: Option<String>,
    last_seen: String,
    detail: String,
}

impl Row {
    /// A cluster's row; with a tenant's view, as [`FleetModel::new`] says.
    fn of(line: &Line<'_>, now_ms: i64, tenant: Option<&TenantView>) -> Row {
        let status = line.status;
        let failed = match tenant {
            None => line.failed_resources(),
            Some(tenant) => tenant
                .failures(line.name, line.failed_resources())
                .unwrap_or_default(),
        };
        let message = || match tenant {
            None => message(line),
            Some(tenant) => tenant.message(line.state, failed.len()),
        };
        Row {
            name: line.name.to_string(),
            link: format!("/ui/clusters/{}", encode(line.name)),
            state: line.state.as_str(),
            drifted: drifted(line, tenant),
            wave: line.wave.map(str::to_string),
            groups: line.groups.to_vec(),
            applied: status
                .and_then(|s| s.report.applied.as_ref())
                .map(|d| d.to_string()),
            last_seen: ago(line.silent_for_seconds(now_ms)),
            detail: match line.state {
                ClusterState::Failed => {
                    if failed.is_empty() {
                        message()
                    } else {
                        failed.join("; ")
                    }
                }
                ClusterState::Pending => match line.pending_for_seconds(now_ms) {
                    Some(seconds) => format!(
                        "to apply {}, pending for {}",
                        short(line.desired.as_str()),
                        duration(seconds)
                    ),
                    None => format!("to apply {}", short(line.desired.as_str())),
                },
                ClusterState::NeverSeen => "no report yet".to_string(),
                _ => message(),
            },
        }
    }
}

/// Whether a cluster is drifted; for a tenant, whether one of its resources is.
fn drifted(line: &Line<'_>, tenant: Option<&TenantView>) -> bool {
    match tenant {
        None => line.drifted(),
        Some(tenant) => line
            .drift()
            .iter()
            .any(|drift| tenant.owns_remaining(line.name, drift)),
    }
}

fn message(line: &Line<'_>) -> String {
    line.status
        .map(|s| s.report.message.clone())
        .unwrap_or_default()
}

/// `3m`, `2h5m`, `4d1h`: a duration, to the minute.
fn duration(seconds: i64) -> String {
    let seconds = seconds.max(0);
    let (d, h, m) = (seconds / 86_400, seconds / 3600 % 24, seconds / 60 % 60);
    match (d, h, m) {
        (0, 0, 0) => format!("{seconds}s"),
        (0, 0, m) => format!("{m}m"),
        (0, h, m) => format!("{h}h{m}m"),
        (d, h, _) => format!("{d}d{h}h"),
    }
}

/// `3m ago`, `2h5m ago`, `4d1h ago`: how long ago, to the minute.
pub fn ago(seconds: Option<i64>) -> String {
    match seconds {
        Some(seconds) => format!("{} ago", duration(seconds)),
        None => "never".to_string(),
    }
}

fn short(digest: &str) -> String {
    digest.chars().take("sha256:".len() + 12).collect()
}

/// One drifted resource of a drifted cluster, as the fleet page lists them.
#[derive(Serialize)]
struct DriftRow {
    cluster: String,
    link: String,
    drift: Drift,
}

/// What makes the self-refresh reload: a change of any count (drifted clusters
/// included), of the served or attempted revision, of the number of render errors or
/// warnings, or of any active rollout's progress.
pub fn stamp(
    render: &RenderStatus,
    counts: &Counts,
    drifted: usize,
    rollouts: &[RolloutView],
) -> String {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    render.served_revision.hash(&mut hasher);
    render.served_commit().is_some().hash(&mut hasher);
    render.attempted_revision.hash(&mut hasher);
    render.errors.len().hash(&mut hasher);
    render.warnings.len().hash(&mut hasher);
    render
        .install_error
        .as_ref()
        .map(|e| &e.revision)
        .hash(&mut hasher);
    counts.hash(&mut hasher);
    drifted.hash(&mut hasher);
    for r in rollouts {
        (r.id, r.state.to_string()).hash(&mut hasher);
        for w in &r.waves {
            (
                w.in_sync,
                w.failed,
                w.offline,
                w.never_seen,
                w.state.as_str(),
            )
                .hash(&mut hasher);
        }
    }
    format!("{:016x}", hasher.finish())
}

/// What the fleet page shows of the clusters: the counts, a bar per group and one
/// page of the cluster list, filtered and sorted by urgency. Made from the borrowed
/// lines while the hub's state is held, so only the 100 rows shown are copied and
/// formatted; owned, so the page is rendered after the state is let go.
pub struct FleetModel {
    pub counts: Counts,
    /// How many clusters are drifted.
    pub drifted: usize,
    /// The drift left on the first drifted clusters (by name, at most a page of
    /// them), a row per resource.
    drift: Vec<DriftRow>,
    groups: Vec<GroupBar>,
    rows: Vec<Row>,
    /// Clusters that match the filters.
    matching: usize,
    page: usize,
    pages: usize,
    /// The first and last row shown, counting from 1 (0, 0 when none).
    first: usize,
    last: usize,
}

impl FleetModel {
    /// The page of `lines`; with a tenant's view, as the tenant sees them: each
    /// cluster's failures and drift only those of its resources (a cluster is drifted
    /// when one of them is), and the tenant's message in place of the agent's
    /// ([`TenantView::message`]).
    pub fn new(
        lines: &[Line<'_>],
        query: &FleetQuery,
        now_ms: i64,
        tenant: Option<&TenantView>,
    ) -> FleetModel {
        let drifted_line = |line: &Line<'_>| drifted(line, tenant);
        let counts = Counts::of(lines);
        let mut by_group: BTreeMap<&str, Counts> = BTreeMap::new();
        for line in lines {
            for group in line.groups {
                by_group.entry(group.as_str()).or_default().add(line.state);
            }
        }
        let groups = by_group
            .iter()
            .map(|(name, counts)| GroupBar {
                name: name.to_string(),
                total: counts.total(),
                segments: segments(counts),
            })
            .collect();
        // An unknown state matches nothing, as a state no cluster is in would.
        let state = (!query.state.is_empty()).then(|| ClusterState::parse(&query.state));
        let name = query.name.trim();
        let mut matching: Vec<_> = lines
            .iter()
            .filter(|l| state.is_none_or(|s| s == Some(l.state)))
            .filter(|l| query.group.is_empty() || l.groups.contains(&query.group))
            .filter(|l| name.is_empty() || l.name.contains(name))
            .filter(|l| !query.drifted_only() || drifted_line(l))
            .map(|l| (l.attention_key(now_ms), l))
            .collect();
        let pages = matching.len().div_ceil(PAGE_SIZE).max(1);
        let page = query.page.unwrap_or(1).clamp(1, pages);
        let start = ((page - 1) * PAGE_SIZE).min(matching.len());
        let end = (start + PAGE_SIZE).min(matching.len());
        // Only the page shown needs to be in order: select it, then sort just that part.
        if start > 0 {
            matching.select_nth_unstable_by(start, |a, b| a.0.cmp(&b.0));
        }
        let rest = &mut matching[start..];
        if end - start < rest.len() {
            rest.select_nth_unstable_by(end - start, |a, b| a.0.cmp(&b.0));
        }
        rest[..end - start].sort_unstable_by(|a, b| a.0.cmp(&b.0));
        let rows = matching[start..end]
            .iter()
            .map(|(_, line)| Row::of(line, now_ms, tenant))
            .collect();
        let mut drifted: Vec<&Line<'_>> = lines.iter().filter(|l| drifted_line(l)).collect();
        drifted.sort_unstable_by_key(|l| l.name);
        let drift = drifted
            .iter()
            .take(PAGE_SIZE)
            .flat_map(|line| {
                let link = format!("/ui/clusters/{}", encode(line.name));
                line.drift()
                    .into_iter()
                    .filter(Drift::remains)
                    .filter(|drift| tenant.is_none_or(|t| t.owns(line.name, drift)))
                    .map(move |drift| DriftRow {
                        cluster: line.name.to_string(),
                        link: link.clone(),
                        drift,
                    })
            })
            .collect();
        FleetModel {
            counts,
            drifted: drifted.len(),
            drift,
            groups,
            rows,
            matching: matching.len(),
            page,
            pages,
            first: if end > start { start + 1 } else { 0 },
            last: end,
        }
    }
}

/// The fleet page: counts, groups, render status, active rollouts, and one page of
/// the cluster list.
pub fn fleet_page(
    model: &FleetModel,
    status: &RenderStatus,
    rollouts: &[RolloutView],
    query: &FleetQuery,
    visitor: &Visitor,
) -> Result<String, PageError> {
    let all_groups: Vec<&str> = model.groups.iter().map(|g| g.name.as_str()).collect();
    let states: Vec<&str> = ClusterState::BY_URGENCY
        .iter()
        .map(|s| s.as_str())
        .collect();
    let (page, pages) = (model.page, model.pages);
    render(
        "fleet.html",
        context! {
            title => "Fleet",
            csrf => &visitor.csrf,
            who => Serde(visitor),
            stamp => stamp(status, &model.counts, model.drifted, rollouts),
            revision => status.served_revision.as_deref(),
            commit => status.served_commit().map(Serde),
            attempted_revision => status.attempted_revision.as_deref(),
            render_errors => status.errors.iter().map(ToString::to_string).collect::<Vec<_>>(),
            render_warnings => status
                .warnings
                .iter()
                .take(RenderWarnings::SHOWN)
                .map(ToString::to_string)
                .collect::<Vec<_>>(),
            render_warnings_total => status.warnings.len(),
            source_error => status.source_error.as_deref(),
            install_error => status.install_error.as_ref().map(|e| Serde(InstallErrorSummary::from(e))),
            charts => Serde(&status.charts),
            total => model.counts.total(),
            counts => Serde(segments(&model.counts)),
            drifted => model.drifted,
            drift => Serde(&model.drift),
            drift_shown => model.drifted.min(PAGE_SIZE),
            groups => Serde(&model.groups),
            rollouts => rollouts
                .iter()
                .map(|r| context! { rollout => Serde(r), waves => Serde(wave_bars(r)) })
                .collect::<Vec<_>>(),
            wave_legend => Serde(WAVE_LEGEND),
            rows => Serde(&model.rows),
            matching => model.matching,
            first => model.first,
            last => model.last,
            page,
            pages,
            previous => (page > 1).then(|| query.link(page - 1)),
            next => (page < pages).then(|| query.link(page + 1)),
            query => Serde(query),
            states,
            all_groups => Serde(&all_groups),
        },
    )
}

/// The id of a resource's part of the bundle view, and so the fragment that links to
/// it: from its identity, so a link still finds it after the bundle changed.
pub fn resource_anchor(key: &ResourceKey) -> String {
    format!("r-{}", encode(&key.to_string()))
}

/// One resource a cluster is served, as its page lists it: who it is and its state,
/// never its content (a Secret is listed by its name only).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ServedResource {
    /// The workload it comes from (`None` when neither the bundle nor the hub's
    /// renders name it).
    pub workload: Option<String>,
    /// `Kind.group`, or `Kind` in the core group.
    pub kind: String,
    /// `None` when cluster-scoped.
    pub namespace: Option<String>,
    pub name: String,
    /// Its state in the agent's last report (`None`: not in it).
    pub state: Option<ResourceState>,
    pub message: String,
    /// See [`resource_anchor`].
    pub anchor: String,
}

/// What a cluster runs: every resource of `bundle` that `keep` accepts, in bundle
/// order, with its workload and its state in `report` where the report names it.
/// The workload is the one the bundle names (what its agent sees), else the one
/// `rendered` gives for that place in the bundle (the hub's render of it).
pub fn served_resources(
    bundle: &ScopedBundle,
    rendered: Option<&[Arc<str>]>,
    report: Option<&StatusReport>,
    mut keep: impl FnMut(&ResourceKey) -> bool,
) -> Vec<ServedResource> {
    let reported: HashMap<&ResourceKey, &ResourceStatus> = report
        .map(|r| r.resources.iter().map(|s| (&*s.key, s)).collect())
        .unwrap_or_default();
    // A list for another number of resources is not this bundle's.
    let rendered = rendered.filter(|names| names.len() == bundle.identities().count());
    bundle
        .identities()
        .enumerate()
        .filter(|(_, (key, _))| keep(key))
        .map(|(index, (key, workload))| {
            let status = reported.get(key);
            let workload =
                workload.or_else(|| rendered.and_then(|names| names.get(index)).map(|n| &**n));
            ServedResource {
                workload: workload.map(str::to_string),
                kind: if key.group().is_empty() {
                    key.kind().to_string()
                } else {
                    format!("{}.{}", key.kind(), key.group())
                },
                namespace: (!key.namespace().is_empty()).then(|| key.namespace().to_string()),
                name: key.name().to_string(),
                state: status.map(|s| s.state),
                message: status.map(|s| s.message.clone()).unwrap_or_default(),
                anchor: resource_anchor(key),
            }
        })
        .collect()
}

/// A workload on a cluster and how many of its resources are listed.
#[derive(Serialize)]
struct WorkloadLine<'a> {
    name: &'a str,
    resources: usize,
}

fn workloads_of(resources: &[ServedResource]) -> Vec<WorkloadLine<'_>> {
    let mut lines: Vec<WorkloadLine<'_>> = Vec::new();
    for resource in resources {
        let Some(name) = resource.workload.as_deref() else {
            continue;
        };
        match lines.iter_mut().find(|l| l.name == name) {
            Some(line) => line.resources += 1,
            None => lines.push(WorkloadLine { name, resources: 1 }),
        }
    }
    lines
}

/// What the cluster page says of what runs there.
pub struct Runs<'a> {
    pub resources: &'a [ServedResource],
    /// The digest the agent's last report is about, when it is not the one served.
    pub reported_on: Option<String>,
}

/// One cluster: its summary line, the recent digests it was served, its wave, and
/// what runs there (`None` when its bundle could not be read).
pub fn cluster_page(
    cluster: &ClusterSummary,
    history: &[(String, String)],
    runs: Option<Runs<'_>>,
    visitor: &Visitor,
) -> Result<String, PageError> {
    let bundle_link = visitor
        .reads_bundles
        .then(|| format!("/ui/clusters/{}/bundle", encode(&cluster.name)));
    render(
        "cluster.html",
        context! {
            title => cluster.name.clone(),
            csrf => &visitor.csrf,
            who => Serde(visitor),
            cluster => Serde(cluster),
            state => cluster.state.as_str(),
            last_seen => ago(cluster.silent_for_seconds),
            pending_for => cluster.pending_for_seconds.map(duration),
            bundle_link,
            history => history.iter().map(|(d, r)| context! { digest => d, revision => r }).collect::<Vec<_>>(),
            runs => runs.as_ref().map(|runs| context! {
                resources => Serde(runs.resources),
                workloads => Serde(workloads_of(runs.resources)),
                reported_on => runs.reported_on.as_deref(),
            }),
        },
    )
}

/// One resource of the bundle view: its anchor, its name and its JSON.
#[derive(Serialize)]
pub struct BundleSection {
    pub anchor: String,
    pub title: String,
    pub text: String,
}

/// Splits a bundle document (`{"resources": [...], ...}`, Secret values already
/// hidden) into a part per resource and the rest of the document, each as indented
/// JSON.
pub fn bundle_sections(mut document: serde_json::Value) -> (Vec<BundleSection>, String) {
    let resources = document
        .get_mut("resources")
        .and_then(|r| r.as_array_mut())
        .map(std::mem::take)
        .unwrap_or_default();
    let count = resources.len();
    let sections = resources
        .into_iter()
        .enumerate()
        .map(|(index, resource)| {
            let (anchor, title) = match ResourceKey::of(&resource) {
                Some(key) => (resource_anchor(&key), key.to_string()),
                None => (format!("r-{index}"), format!("resource {}", index + 1)),
            };
            let text = serde_json::to_string_pretty(&resource).unwrap_or_default();
            BundleSection {
                anchor,
                title,
                text,
            }
        })
        .collect();
    if let Some(rest) = document.as_object_mut()
        && rest.contains_key("resources")
    {
        rest.insert(
            "resources".into(),
            serde_json::Value::String(format!("({count} resources, above)")),
        );
    }
    let rest = serde_json::to_string_pretty(&document).unwrap_or_default();
    (sections, rest)
}

/// A cluster's bundle, with Secret values hidden: a part per resource, then the rest
/// of the document.
pub fn bundle_page(
    cluster: &str,
    digest: &str,
    (sections, rest): (&[BundleSection], &str),
    visitor: &Visitor,
) -> Result<String, PageError> {
    render(
        "bundle.html",
        context! {
            title => format!("{cluster}: bundle"),
            csrf => &visitor.csrf,
            who => Serde(visitor),
            cluster,
            cluster_link => format!("/ui/clusters/{}", encode(cluster)),
            digest,
            sections => Serde(sections),
            rest,
        },
    )
}

/// One rollout, with its controls when the visitor may steer it (`steerable`: a
/// tenant's token only when everything the rollout changes is the tenant's).
pub fn rollout_page(
    rollout: &RolloutView,
    visitor: &Visitor,
    steerable: bool,
) -> Result<String, PageError> {
    let ended = rollout.ended_at.is_some() || !(visitor.steers && steerable);
    let state = rollout.state.to_string();
    let actions: Vec<&str> = if ended {
        vec![]
    } else {
        match state.as_str() {
            "paused" | "halted" => vec!["resume", "abort"],
            _ => vec!["pause", "promote", "abort"],
        }
    };
    render(
        "rollout.html",
        context! {
            title => format!("Rollout {}", rollout.id),
            csrf => &visitor.csrf,
            who => Serde(visitor),
            rollout => Serde(rollout),
            waves => Serde(wave_bars(rollout)),
            wave_legend => Serde(WAVE_LEGEND),
            state,
            actions,
            action_base => format!("/ui/rollouts/{}", rollout.id),
        },
    )
}

pub fn login_page(error: Option<&str>) -> Result<String, PageError> {
    render("login.html", context! { title => "Log in", error })
}

pub fn error_page(message: &str, csrf: Option<&str>) -> Result<String, PageError> {
    render("error.html", context! { title => "Error", message, csrf })
}

/// Replaces the values under `data` and `stringData` of every Secret in a bundle
/// document (`{"resources": [...]}`) with a placeholder, keeping the keys, and so
/// every annotation or label of a Secret that holds one of them (such as
/// `kubectl.kubernetes.io/last-applied-configuration`).
pub fn redact_secrets(document: &mut serde_json::Value) {
    const REDACTED: &str = "(redacted)";
    let Some(resources) = document.get_mut("resources").and_then(|r| r.as_array_mut()) else {
        return;
    };
    for resource in resources {
        if !secret::is_secret(resource) {
            continue;
        }
        for (map, key) in secret::revealing_metadata(resource) {
            if let Some(value) = resource
                .get_mut("metadata")
                .and_then(|m| m.get_mut(map))
                .and_then(|m| m.get_mut(&key))
            {
                *value = serde_json::Value::String(REDACTED.into());
            }
        }
        for field in secret::VALUE_FIELDS {
            if let Some(values) = resource.get_mut(field).and_then(|d| d.as_object_mut()) {
                for value in values.values_mut() {
                    *value = serde_json::Value::String(REDACTED.into());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn secret_values_are_hidden_and_their_keys_kept() {
        let mut document = json!({"resources": [
            {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"},
             "data": {"password": "aHVudGVyMg=="}, "stringData": {"token": "hunter2"}},
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"},
             "data": {"password": "visible"}},
        ]});
        redact_secrets(&mut document);
        let text = document.to_string();
        assert!(
            !text.contains("aHVudGVyMg==") && !text.contains("hunter2"),
            "{text}"
        );
        assert_eq!(document["resources"][0]["data"]["password"], "(redacted)");
        assert_eq!(
            document["resources"][0]["stringData"]["token"],
            "(redacted)"
        );
        assert_eq!(document["resources"][1]["data"]["password"], "visible");
    }

    #[test]
    fn a_last_applied_configuration_of_a_secret_is_hidden() {
        let last_applied = json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "s"}, "data": {"password": "aHVudGVyMg=="}})
        .to_string();
        let mut document = json!({"resources": [
            {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s", "annotations": {
                "kubectl.kubernetes.io/last-applied-configuration": last_applied,
                "team": "shop"}},
             "data": {"password": "aHVudGVyMg=="}},
        ]});
        redact_secrets(&mut document);
        let text = document.to_string();
        assert!(!text.contains("aHVudGVyMg=="), "{text}");
        let annotations = &document["resources"][0]["metadata"]["annotations"];
        assert_eq!(
            annotations["kubectl.kubernetes.io/last-applied-configuration"],
            "(redacted)"
        );
        assert_eq!(annotations["team"], "shop");
    }

    #[test]
    fn links_keep_the_filters_and_encode_them() {
        let query = FleetQuery {
            state: "failed".into(),
            group: "eu west".into(),
            name: "<x>".into(),
            drifted: "true".into(),
            page: Some(3),
        };
        assert_eq!(
            query.link(2),
            "/ui/?state=failed&group=eu%20west&name=%3Cx%3E&drifted=true&page=2"
        );
        assert_eq!(FleetQuery::default().link(1), "/ui/");
    }

    #[test]
    fn a_cluster_never_served_says_so_instead_of_an_empty_table() {
        let page = |history: Vec<minijinja::Value>| {
            environment()
                .get_template("cluster.html")
                .expect("template")
                .render(context! {
                    title => "edge-1",
                    cluster => context! { name => "edge-1" },
                    state => "never-seen",
                    history,
                })
                .expect("renders")
        };
        let empty = page(Vec::new());
        assert!(empty.contains("id=\"no-history\""), "{empty}");
        assert!(!empty.contains("<th scope=\"col\">Digest</th>"), "{empty}");
        let served = page(vec![
            context! { digest => "sha256:aa", revision => "main@sha1:bb" },
        ]);
        assert!(served.contains("<code>sha256:aa</code>"), "{served}");
        assert!(!served.contains("no-history"), "{served}");
    }

    #[test]
    fn a_waves_bar_parts_add_up_to_its_clusters() {
        // (clusters, in sync, failed) → (in sync, failed, not there yet)
        for (counts, parts) in [
            ((4, 1, 1), [1, 1, 2]),
            ((3, 3, 0), [3, 0, 0]),
            ((0, 0, 0), [0, 0, 0]),
            ((2, 1, 2), [1, 1, 0]),
            ((2, 5, 1), [2, 0, 0]),
        ] {
            let (clusters, in_sync, failed) = counts;
            assert_eq!(wave_parts(clusters, in_sync, failed), parts, "{counts:?}");
        }
    }

    #[test]
    fn a_bundle_view_has_a_part_per_resource_named_as_the_cluster_page_links_it() {
        let document = json!({"digest": "sha256:aa", "resources": [
            {"apiVersion": "apps/v1", "kind": "Deployment",
             "metadata": {"name": "web", "namespace": "shop"}},
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "shop"}},
        ]});
        let (sections, rest) = bundle_sections(document);
        let named: Vec<(&str, &str)> = sections
            .iter()
            .map(|s| (s.anchor.as_str(), s.title.as_str()))
            .collect();
        assert_eq!(
            named,
            [
                ("r-Deployment.apps%20shop%2Fweb", "Deployment.apps shop/web"),
                ("r-Namespace%2Fshop", "Namespace/shop"),
            ]
        );
        let key = ResourceKey::of(&json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "shop"}}))
        .expect("key");
        assert_eq!(resource_anchor(&key), sections[0].anchor);
        assert!(sections[0].text.contains("\"namespace\": \"shop\""));
        assert!(
            rest.contains("\"resources\": \"(2 resources, above)\""),
            "{rest}"
        );
        assert!(rest.contains("sha256:aa"), "{rest}");
    }

    #[test]
    fn every_template_parses() {
        for name in [
            "base.html",
            "bars.html",
            "login.html",
            "fleet.html",
            "cluster.html",
            "rollout.html",
            "bundle.html",
            "error.html",
        ] {
            assert!(environment().get_template(name).is_ok(), "{name}");
        }
    }
}
