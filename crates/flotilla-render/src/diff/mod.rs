//! The pure diff of two renders of a fleet, and its reports.
//!
//! [`diff`] takes the render of BASE and the render of HEAD and returns a
//! [`FleetDiff`]: every cluster's status (added, removed, changed, unchanged, or not
//! rendered on HEAD), its digest before and after, and the changes grouped so that
//! clusters whose change reads the same are shown once. The reports ([`text`],
//! [`markdown`], [`json`]) only format a `FleetDiff`.
//!
//! Digests are compared first: a cluster whose digest is the same on both sides is
//! unchanged, and its resources are never looked at. For a changed cluster the sorted
//! resource lists are merged by [`ResourceKey`]; identical content is recognised by
//! the shared `Arc` the renderer hands out or, failing that, by its canonical bytes.
//! A resource diff is computed once per distinct (before, after) content, however
//! many clusters share it.
//!
//! This module reads no files and imports nothing from `source`, `hub`, `store` or
//! `agent`.

pub mod content;
pub mod json;
pub mod markdown;
pub mod text;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use rayon::prelude::*;

use crate::RenderOutput;
use flotilla_core::bundle::{Bundle, BundleMeta, Digest, DriftPolicy, Resource, ResourceKey};
use flotilla_core::diagnostic::Diagnostic;
use flotilla_core::rollout::Budget;

/// How to compute a diff.
#[derive(Clone, Copy, Debug)]
pub struct DiffOptions {
    /// Lines of unchanged YAML shown around each change.
    pub context: usize,
}

impl Default for DiffOptions {
    fn default() -> Self {
        DiffOptions { context: 3 }
    }
}

/// What happened to one cluster between BASE and HEAD.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ClusterStatus {
    /// On both sides, with a different digest (or BASE did not render it).
    Changed,
    /// Only on HEAD.
    Added,
    /// Only on BASE.
    Removed,
    /// On HEAD, but HEAD did not render it; what it would get is unknown.
    Failed,
    /// The same digest on both sides.
    Unchanged,
}

impl ClusterStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            ClusterStatus::Changed => "changed",
            ClusterStatus::Added => "added",
            ClusterStatus::Removed => "removed",
            ClusterStatus::Failed => "failed",
            ClusterStatus::Unchanged => "unchanged",
        }
    }
}

/// What happened to one resource of a cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ResourceChangeKind {
    Added,
    Removed,
    Changed,
}

impl ResourceChangeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ResourceChangeKind::Added => "added",
            ResourceChangeKind::Removed => "removed",
            ResourceChangeKind::Changed => "changed",
        }
    }
}

/// One resource's change as a reviewer sees it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ResourceChange {
    pub key: ResourceKey,
    pub kind: ResourceChangeKind,
    /// The unified diff of its YAML (Secret values redacted). `None` for the
    /// resources of a removed cluster and of one BASE did not render.
    pub diff: Option<Arc<str>>,
}

/// How a changed cluster gets its change, by HEAD's rollout plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rollout {
    /// In this wave of this policy's rollout.
    Wave { policy: String, wave: String },
    /// No policy governs it: the hub serves it HEAD's render at once.
    AtOnce,
    /// `spec.paused`: it keeps what it runs until unpaused.
    Paused,
}

impl Rollout {
    /// `edge-sites/canary`, `at once`, `paused`.
    pub fn label(&self) -> String {
        match self {
            Rollout::Wave { policy, wave } => format!("{policy}/{wave}"),
            Rollout::AtOnce => "at once".to_string(),
            Rollout::Paused => "paused".to_string(),
        }
    }
}

/// One wave of a policy, with the changed clusters it would take.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanWave {
    pub policy: String,
    /// The policy's file.
    pub file: String,
    pub name: String,
    /// The changed (or new) clusters in it, sorted.
    pub clusters: Vec<String>,
    pub bake: std::time::Duration,
    pub max_failed: Budget,
    /// `None`: every cluster of the wave at once.
    pub max_parallel: Option<Budget>,
}

/// How the change travels through the fleet: every wave of every policy (in order),
/// and the changed clusters that no wave holds back.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub waves: Vec<PlanWave>,
    /// Changed clusters no policy governs: they change at once.
    pub at_once: Vec<String>,
    /// Changed clusters that are paused: they do not change.
    pub paused: Vec<String>,
}

impl Plan {
    /// Whether any policy governs the fleet (otherwise everything changes at once and
    /// the plan has nothing to say).
    pub fn has_policies(&self) -> bool {
        !self.waves.is_empty()
    }
}

/// One cluster's line in the report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterDiff {
    pub name: String,
    pub status: ClusterStatus,
    /// The digest on BASE, if BASE rendered it.
    pub before: Option<Digest>,
    /// The digest on HEAD, if HEAD rendered it.
    pub after: Option<Digest>,
    /// The fleet groups it belongs to (on HEAD, or on BASE if it is not on HEAD).
    pub fleet_groups: Vec<String>,
    /// Index into [`FleetDiff::groups`] for added, removed and changed clusters.
    pub group: Option<usize>,
    /// How an added or changed cluster gets its change.
    pub rollout: Option<Rollout>,
}

/// Apply phases, each the names of its workloads.
pub type Phases = Vec<Vec<String>>;

/// What changed in a cluster's bundle metadata: its apply order (`spec.dependsOn`)
/// and its workloads' drift policies.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct MetaChange {
    /// The phases before and after, when they differ (empty: one phase, no order).
    pub phases: Option<(Phases, Phases)>,
    /// Each workload whose drift policy differs: its name, before and after.
    pub drift: Vec<(String, DriftPolicy, DriftPolicy)>,
}

impl MetaChange {
    /// What differs between two bundles' metadata (`None` for a bundle not rendered),
    /// or `None` when nothing does.
    pub fn between(before: Option<&Bundle>, after: Option<&Bundle>) -> Option<MetaChange> {
        let empty = BundleMeta::default();
        let meta = |b: Option<&Bundle>| -> BundleMeta {
            b.and_then(|b| b.meta.as_deref()).unwrap_or(&empty).clone()
        };
        let (old, new) = (meta(before), meta(after));
        let phases = (old.phases != new.phases).then(|| (old.phases.clone(), new.phases.clone()));
        let names: BTreeSet<&String> = old.drift.keys().chain(new.drift.keys()).collect();
        let drift: Vec<(String, DriftPolicy, DriftPolicy)> = names
            .into_iter()
            .filter_map(|name| {
                let was = old.drift.get(name).copied().unwrap_or_default();
                let is = new.drift.get(name).copied().unwrap_or_default();
                (was != is).then(|| (name.clone(), was, is))
            })
            .collect();
        (phases.is_some() || !drift.is_empty()).then_some(MetaChange { phases, drift })
    }

    /// The lines a report shows: `apply order: cert-manager → ingress → app (was: all
    /// at once)`, `drift of app: correct → report`.
    pub fn lines(&self) -> Vec<String> {
        let mut lines = Vec::new();
        if let Some((before, after)) = &self.phases {
            lines.push(format!(
                "apply order: {} (was: {})",
                order_text(after),
                order_text(before)
            ));
        }
        for (workload, was, is) in &self.drift {
            lines.push(format!(
                "drift of {workload}: {} → {}",
                was.as_str(),
                is.as_str()
            ));
        }
        lines
    }
}

/// Phases as people read them: `a, b → c → d`, or `all at once`.
pub fn order_text(phases: &[Vec<String>]) -> String {
    if phases.len() < 2 {
        return "all at once".to_string();
    }
    phases
        .iter()
        .map(|phase| phase.join(", "))
        .collect::<Vec<_>>()
        .join(" → ")
}

/// Clusters whose change reads the same, shown once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChangeGroup {
    /// [`ClusterStatus::Changed`], [`ClusterStatus::Added`] or [`ClusterStatus::Removed`].
    pub status: ClusterStatus,
    /// BASE did not render these clusters, so their resources are shown as they are
    /// on HEAD, without a "before".
    pub before_unknown: bool,
    /// Sorted by name.
    pub clusters: Vec<String>,
    /// The fleet groups every member belongs to.
    pub shared_groups: Vec<String>,
    /// Those of `shared_groups` whose every cluster is in this change group.
    pub whole_groups: Vec<String>,
    pub resources: Vec<ResourceChange>,
    /// What changed in the bundle's metadata (apply order, drift policies).
    pub meta: Option<MetaChange>,
}

impl ChangeGroup {
    /// A one-line label: `the same change on 4 clusters (eu, stable)`.
    pub fn title(&self) -> String {
        let groups = self.groups_label();
        match (self.clusters.as_slice(), self.status) {
            ([one], ClusterStatus::Added) => format!("new cluster {one}{groups}"),
            ([one], ClusterStatus::Removed) => format!("removed cluster {one}{groups}"),
            ([one], _) if self.before_unknown => {
                format!("{one}{groups}, which BASE did not render")
            }
            ([one], _) => format!("{one}{groups}"),
            (many, ClusterStatus::Added) => {
                format!(
                    "{} new clusters with the same resources{groups}",
                    many.len()
                )
            }
            (many, ClusterStatus::Removed) => {
                format!("{} clusters removed{groups}", many.len())
            }
            (many, _) if self.before_unknown => {
                format!("{} clusters{groups} that BASE did not render", many.len())
            }
            (many, _) => format!("the same change on {} clusters{groups}", many.len()),
        }
    }

    fn groups_label(&self) -> String {
        if self.shared_groups.is_empty() {
            return String::new();
        }
        let mut label = format!(" ({}", self.shared_groups.join(", "));
        if !self.whole_groups.is_empty() && self.clusters.len() > 1 {
            label.push_str("; every cluster of ");
            label.push_str(&self.whole_groups.join(", "));
        }
        label.push(')');
        label
    }

    /// A short count of its resource changes: `1 resource changed, 2 resources added`.
    pub fn resource_summary(&self) -> String {
        if self.before_unknown {
            let count = self.resources.len();
            return format!("{count} resource{} on HEAD", plural(count));
        }
        let mut parts = Vec::new();
        for kind in [
            ResourceChangeKind::Changed,
            ResourceChangeKind::Added,
            ResourceChangeKind::Removed,
        ] {
            let count = self.resources.iter().filter(|r| r.kind == kind).count();
            if count > 0 {
                parts.push(format!(
                    "{count} resource{} {}",
                    plural(count),
                    kind.as_str()
                ));
            }
        }
        if let Some(meta) = &self.meta {
            if meta.phases.is_some() {
                parts.push("apply order changed".to_string());
            }
            if !meta.drift.is_empty() {
                parts.push("drift policy changed".to_string());
            }
        }
        if parts.is_empty() {
            "no resources".to_string()
        } else {
            parts.join(", ")
        }
    }
}

/// Cluster counts for one fleet group (or for the whole fleet).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub clusters: usize,
    pub changed: usize,
    pub added: usize,
    pub removed: usize,
    pub unchanged: usize,
    pub failed: usize,
}

impl Counts {
    fn add(&mut self, status: ClusterStatus) {
        self.clusters += 1;
        match status {
            ClusterStatus::Changed => self.changed += 1,
            ClusterStatus::Added => self.added += 1,
            ClusterStatus::Removed => self.removed += 1,
            ClusterStatus::Unchanged => self.unchanged += 1,
            ClusterStatus::Failed => self.failed += 1,
        }
    }

    /// Whether anything in it changed, was added, removed, or failed.
    pub fn touched(&self) -> bool {
        self.changed + self.added + self.removed + self.failed > 0
    }
}

/// One side of the diff.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Side {
    pub revision: String,
    pub errors: Vec<Diagnostic>,
    pub warnings: Vec<Diagnostic>,
    /// Per Helm workload, its chart (`name version (path)`).
    pub charts: BTreeMap<String, String>,
}

impl Side {
    fn of(output: &RenderOutput) -> Side {
        Side {
            revision: output.revision.clone(),
            errors: output.errors().cloned().collect(),
            warnings: output.warnings().cloned().collect(),
            charts: output.charts.clone(),
        }
    }

    pub fn is_clean(&self) -> bool {
        self.errors.is_empty()
    }
}

/// What a change does to every cluster of the fleet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FleetDiff {
    pub base: Side,
    pub head: Side,
    /// Every cluster on either side, sorted by name.
    pub clusters: Vec<ClusterDiff>,
    /// Change groups, largest first (changed, then added, then removed).
    pub groups: Vec<ChangeGroup>,
    /// Counts for the whole fleet.
    pub totals: Counts,
    /// Counts per fleet group; clusters in no group are not listed here.
    pub fleet_groups: BTreeMap<String, Counts>,
    /// The context the resource diffs were computed with.
    pub context: usize,
    /// How the change travels through the fleet (HEAD's rollout policies).
    pub plan: Plan,
}

/// A Helm workload whose chart differs between BASE and HEAD (or that has one on
/// one side only).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChartChange<'a> {
    pub workload: &'a str,
    pub base: Option<&'a str>,
    pub head: Option<&'a str>,
}

impl FleetDiff {
    /// The Helm workloads whose chart (name, version or path) changed.
    pub fn chart_changes(&self) -> Vec<ChartChange<'_>> {
        let workloads: std::collections::BTreeSet<&String> = self
            .base
            .charts
            .keys()
            .chain(self.head.charts.keys())
            .collect();
        workloads
            .into_iter()
            .filter_map(|workload| {
                let base = self.base.charts.get(workload).map(String::as_str);
                let head = self.head.charts.get(workload).map(String::as_str);
                (base != head).then_some(ChartChange {
                    workload,
                    base,
                    head,
                })
            })
            .collect()
    }

    pub fn with_status(&self, status: ClusterStatus) -> impl Iterator<Item = &ClusterDiff> {
        self.clusters.iter().filter(move |c| c.status == status)
    }

    /// Whether HEAD rendered with errors: the headline of the report, and exit code 2.
    pub fn head_is_broken(&self) -> bool {
        !self.head.is_clean()
    }

    /// The names of the clusters HEAD did not render, at most `limit` of them.
    pub fn failed_names(&self, limit: usize) -> String {
        let mut names: Vec<&str> = self
            .with_status(ClusterStatus::Failed)
            .take(limit)
            .map(|c| c.name.as_str())
            .collect();
        let more = self.totals.failed.saturating_sub(limit);
        let more_text = format!("and {more} more");
        if more > 0 {
            names.push(&more_text);
        }
        names.join(", ")
    }

    /// Whether any cluster was added, removed or changed.
    pub fn has_changes(&self) -> bool {
        self.totals.changed + self.totals.added + self.totals.removed > 0
    }
}

pub(crate) fn plural(count: usize) -> &'static str {
    if count == 1 { "" } else { "s" }
}

/// The clusters a render knows of: every cluster it loaded (rendered or not), and
/// every cluster whose own file failed to load, so that a cluster with a broken file
/// shows as "not rendered" rather than "removed".
fn known_clusters(output: &RenderOutput) -> BTreeSet<&str> {
    let mut names: BTreeSet<&str> = output.memberships.keys().map(String::as_str).collect();
    names.extend(output.bundles.keys().map(String::as_str));
    for diagnostic in output.errors() {
        let Some(file) = diagnostic.file.as_deref() else {
            continue;
        };
        let Some(name) = file.strip_prefix("clusters/") else {
            continue;
        };
        if let Some(stem) = name
            .strip_suffix(".yaml")
            .or_else(|| name.strip_suffix(".yml"))
            .filter(|stem| !stem.contains('/'))
        {
            names.insert(stem);
        }
    }
    names
}

/// One resource key on one or both sides.
#[derive(Clone, Copy)]
struct Pair<'a> {
    key: &'a ResourceKey,
    before: Option<&'a Arc<Resource>>,
    after: Option<&'a Arc<Resource>>,
}

impl Pair<'_> {
    /// Identities of the two contents, for deduplication while both renders live.
    fn identity(&self) -> (usize, usize) {
        let address = |r: Option<&Arc<Resource>>| r.map_or(0, |r| Arc::as_ptr(r) as usize);
        (address(self.before), address(self.after))
    }

    fn kind(&self) -> ResourceChangeKind {
        match (self.before, self.after) {
            (None, _) => ResourceChangeKind::Added,
            (_, None) => ResourceChangeKind::Removed,
            _ => ResourceChangeKind::Changed,
        }
    }
}

struct Classified<'a> {
    status: ClusterStatus,
    before_unknown: bool,
    before: Option<&'a Bundle>,
    after: Option<&'a Bundle>,
    pairs: Vec<Pair<'a>>,
    meta: Option<MetaChange>,
}

fn classify<'a>(
    name: &str,
    base: &'a RenderOutput,
    head: &'a RenderOutput,
    on_base: bool,
    on_head: bool,
) -> Classified<'a> {
    let before = base.bundles.get(name);
    let after = head.bundles.get(name);
    let mut classified = Classified {
        status: ClusterStatus::Unchanged,
        before_unknown: false,
        before,
        after,
        pairs: Vec::new(),
        meta: None,
    };
    let all = |bundle: Option<&'a Bundle>, side_is_after: bool| -> Vec<Pair<'a>> {
        bundle
            .map(|b| {
                b.resources
                    .iter()
                    .map(|r| Pair {
                        key: &r.key,
                        before: (!side_is_after).then_some(r),
                        after: side_is_after.then_some(r),
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    match (on_base, on_head, before, after) {
        (_, true, _, None) => classified.status = ClusterStatus::Failed,
        (false, true, _, Some(_)) => {
            classified.status = ClusterStatus::Added;
            classified.pairs = all(after, true);
            classified.meta = MetaChange::between(None, after);
        }
        // Known on neither side cannot happen: the name came from one of them.
        (_, false, _, _) => {
            classified.status = ClusterStatus::Removed;
            classified.pairs = all(before, false);
        }
        (true, true, Some(b), Some(a)) if b.digest == a.digest => {}
        (true, true, Some(b), Some(a)) => {
            classified.status = ClusterStatus::Changed;
            classified.pairs = changed_pairs(b, a);
            classified.meta = MetaChange::between(Some(b), Some(a));
        }
        (true, true, None, Some(_)) => {
            classified.status = ClusterStatus::Changed;
            classified.before_unknown = true;
            classified.pairs = all(after, true);
        }
    }
    classified
}

/// Merges two sorted resource lists, keeping the keys whose content differs.
fn changed_pairs<'a>(before: &'a Bundle, after: &'a Bundle) -> Vec<Pair<'a>> {
    let mut pairs = Vec::new();
    let (mut old, mut new) = (
        before.resources.iter().peekable(),
        after.resources.iter().peekable(),
    );
    loop {
        let order = match (old.peek(), new.peek()) {
            (None, None) => break,
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
            // The same resource on both sides (a render since the other shares
            // what it did not render again) has the same key.
            (Some(o), Some(n)) if Arc::ptr_eq(o, n) => std::cmp::Ordering::Equal,
            (Some(o), Some(n)) => o.key.cmp(&n.key),
        };
        match order {
            std::cmp::Ordering::Less => {
                if let Some(o) = old.next() {
                    pairs.push(Pair {
                        key: &o.key,
                        before: Some(o),
                        after: None,
                    });
                }
            }
            std::cmp::Ordering::Greater => {
                if let Some(n) = new.next() {
                    pairs.push(Pair {
                        key: &n.key,
                        before: None,
                        after: Some(n),
                    });
                }
            }
            std::cmp::Ordering::Equal => {
                if let (Some(o), Some(n)) = (old.next(), new.next())
                    && !Arc::ptr_eq(o, n)
                    && o.canonical != n.canonical
                {
                    pairs.push(Pair {
                        key: &n.key,
                        before: Some(o),
                        after: Some(n),
                    });
                }
            }
        }
    }
    pairs
}

/// Whether a cluster's resources are shown with their content. A removed cluster's
/// content is gone with it, and a cluster BASE did not render has no "before" to
/// compare with: printing whole bundles would bury the changes that can be read.
fn shows_content(status: ClusterStatus, before_unknown: bool) -> bool {
    status != ClusterStatus::Removed && !before_unknown
}

/// Compares the render of BASE with the render of HEAD.
pub fn diff(base: &RenderOutput, head: &RenderOutput, options: &DiffOptions) -> FleetDiff {
    let on_base = known_clusters(base);
    let on_head = known_clusters(head);
    let names: Vec<&str> = on_base.union(&on_head).copied().collect();

    // A side whose fleet was read in part rendered nothing: each cluster is unknown
    // there (failed on HEAD, not known before on BASE), not gone or new.
    let classified: Vec<Classified<'_>> = names
        .par_iter()
        .map(|name| {
            classify(
                name,
                base,
                head,
                base.incomplete || on_base.contains(name),
                head.incomplete || on_head.contains(name),
            )
        })
        .collect();
    let signatures = Signatures::of(&classified);
    let texts = diff_texts(&classified, &signatures.first_cluster, options);
    let (mut groups, group_of_signature) =
        change_groups(&classified, &signatures.first_cluster, &texts);
    let (mut clusters, totals, fleet_groups) = cluster_rows(
        &names,
        &classified,
        &signatures.of_cluster,
        &group_of_signature,
        &mut groups,
        base,
        head,
    );

    label_groups(&mut groups, &clusters, base, head);
    let order = sort_groups(&mut groups);
    for cluster in &mut clusters {
        cluster.group = cluster.group.map(|g| order[g]);
    }
    let plan = plan(&mut clusters, head);

    FleetDiff {
        base: Side::of(base),
        head: Side::of(head),
        clusters,
        groups,
        totals,
        fleet_groups,
        context: options.context,
        plan,
    }
}

/// Labels each added or changed cluster with how it gets its change, and lists every
/// wave of HEAD's policies with the clusters it would change.
fn plan(clusters: &mut [ClusterDiff], head: &RenderOutput) -> Plan {
    let rollouts = &head.rollouts;
    let mut out = Plan::default();
    let mut offsets = Vec::with_capacity(rollouts.policies.len());
    for policy in &rollouts.policies {
        offsets.push(out.waves.len());
        out.waves.extend(policy.waves.iter().map(|w| PlanWave {
            policy: policy.name.clone(),
            file: policy.file.clone(),
            name: w.name.clone(),
            clusters: Vec::new(),
            bake: w.bake,
            max_failed: w.max_failed,
            max_parallel: w.max_parallel,
        }));
    }
    for cluster in clusters.iter_mut() {
        if !matches!(
            cluster.status,
            ClusterStatus::Changed | ClusterStatus::Added
        ) {
            continue;
        }
        let rollout = if rollouts.paused.contains(&cluster.name) {
            out.paused.push(cluster.name.clone());
            Rollout::Paused
        } else if let Some(placement) = rollouts.placements.get(&cluster.name) {
            let wave = &mut out.waves[offsets[placement.policy] + placement.wave];
            wave.clusters.push(cluster.name.clone());
            Rollout::Wave {
                policy: wave.policy.clone(),
                wave: wave.name.clone(),
            }
        } else {
            out.at_once.push(cluster.name.clone());
            Rollout::AtOnce
        };
        cluster.rollout = Some(rollout);
    }
    out
}

/// Clusters whose changes are the very same resource objects share a signature;
/// each signature is turned into text once.
struct Signatures {
    /// Per signature, the index of the first cluster that has it.
    first_cluster: Vec<usize>,
    /// Per cluster, its signature (`None` when unchanged or not rendered).
    of_cluster: Vec<Option<usize>>,
}

impl Signatures {
    fn of(classified: &[Classified<'_>]) -> Signatures {
        type Signature = (ClusterStatus, bool, Vec<(usize, usize)>, Option<MetaChange>);
        let mut ids: HashMap<Signature, usize> = HashMap::new();
        let mut first_cluster = Vec::new();
        let mut of_cluster = Vec::with_capacity(classified.len());
        for (index, cluster) in classified.iter().enumerate() {
            if matches!(
                cluster.status,
                ClusterStatus::Unchanged | ClusterStatus::Failed
            ) {
                of_cluster.push(None);
                continue;
            }
            let signature = (
                cluster.status,
                cluster.before_unknown,
                cluster.pairs.iter().map(Pair::identity).collect(),
                cluster.meta.clone(),
            );
            let next = ids.len();
            let id = *ids.entry(signature).or_insert(next);
            if id == first_cluster.len() {
                first_cluster.push(index);
            }
            of_cluster.push(Some(id));
        }
        Signatures {
            first_cluster,
            of_cluster,
        }
    }
}

/// The diff text of every resource change shown, by pair identity. Every distinct
/// (before, after) content is diffed once: the two renders never share resource
/// objects, so pointers only deduplicate within a side; the canonical bytes
/// deduplicate across clusters.
fn diff_texts(
    classified: &[Classified<'_>],
    signatures: &[usize],
    options: &DiffOptions,
) -> HashMap<(usize, usize), Arc<str>> {
    type Content<'a> = (Option<&'a [u8]>, Option<&'a [u8]>);
    let mut content_ids: HashMap<Content<'_>, usize> = HashMap::new();
    let mut contents: Vec<Pair<'_>> = Vec::new();
    let mut text_of_pair: HashMap<(usize, usize), usize> = HashMap::new();
    for &index in signatures {
        let cluster = &classified[index];
        if !shows_content(cluster.status, cluster.before_unknown) {
            continue;
        }
        for pair in &cluster.pairs {
            text_of_pair.entry(pair.identity()).or_insert_with(|| {
                let content = (
                    pair.before.map(|r| &*r.canonical),
                    pair.after.map(|r| &*r.canonical),
                );
                *content_ids.entry(content).or_insert_with(|| {
                    contents.push(*pair);
                    contents.len() - 1
                })
            });
        }
    }
    let texts: Vec<Arc<str>> = contents
        .par_iter()
        .map(|pair| {
            let before = pair.before.map(|r| r.value());
            let after = pair.after.map(|r| r.value());
            Arc::from(content::resource_diff(
                before.as_ref(),
                after.as_ref(),
                options.context,
            ))
        })
        .collect();
    text_of_pair
        .into_iter()
        .map(|(pair, id)| (pair, texts[id].clone()))
        .collect()
}

/// Signatures whose shown change is the same form one change group. Returns the
/// groups (without clusters yet) and, per signature, its group.
fn change_groups(
    classified: &[Classified<'_>],
    signatures: &[usize],
    texts: &HashMap<(usize, usize), Arc<str>>,
) -> (Vec<ChangeGroup>, Vec<usize>) {
    type GroupKey = (ClusterStatus, bool, Vec<ResourceChange>, Option<MetaChange>);
    let mut group_ids: HashMap<GroupKey, usize> = HashMap::new();
    let mut group_of_signature: Vec<usize> = Vec::with_capacity(signatures.len());
    let mut groups: Vec<ChangeGroup> = Vec::new();
    for &index in signatures {
        let cluster = &classified[index];
        let shown = shows_content(cluster.status, cluster.before_unknown);
        let resources: Vec<ResourceChange> = cluster
            .pairs
            .iter()
            .map(|pair| ResourceChange {
                key: pair.key.clone(),
                kind: pair.kind(),
                diff: if shown {
                    texts.get(&pair.identity()).cloned()
                } else {
                    None
                },
            })
            .collect();
        let key = (
            cluster.status,
            cluster.before_unknown,
            resources,
            cluster.meta.clone(),
        );
        let next = group_ids.len();
        let id = *group_ids.entry(key.clone()).or_insert(next);
        if id == groups.len() {
            groups.push(ChangeGroup {
                status: key.0,
                before_unknown: key.1,
                clusters: Vec::new(),
                shared_groups: Vec::new(),
                whole_groups: Vec::new(),
                resources: key.2,
                meta: key.3,
            });
        }
        group_of_signature.push(id);
    }
    (groups, group_of_signature)
}

/// One row per cluster, the totals by status overall and per fleet group; each
/// changed cluster is added to its change group.
fn cluster_rows(
    names: &[&str],
    classified: &[Classified<'_>],
    cluster_signature: &[Option<usize>],
    group_of_signature: &[usize],
    groups: &mut [ChangeGroup],
    base: &RenderOutput,
    head: &RenderOutput,
) -> (Vec<ClusterDiff>, Counts, BTreeMap<String, Counts>) {
    let empty = Vec::new();
    let mut clusters: Vec<ClusterDiff> = Vec::with_capacity(names.len());
    let mut totals = Counts::default();
    let mut fleet_groups: BTreeMap<String, Counts> = BTreeMap::new();
    for ((name, cluster), signature) in names.iter().zip(classified).zip(cluster_signature) {
        let memberships = head
            .memberships
            .get(*name)
            .filter(|_| cluster.status != ClusterStatus::Removed)
            .or_else(|| base.memberships.get(*name))
            .unwrap_or(&empty);
        let group = signature.map(|s| group_of_signature[s]);
        if let Some(group) = group {
            groups[group].clusters.push(name.to_string());
        }
        totals.add(cluster.status);
        for fleet_group in memberships {
            fleet_groups
                .entry(fleet_group.clone())
                .or_default()
                .add(cluster.status);
        }
        clusters.push(ClusterDiff {
            name: name.to_string(),
            status: cluster.status,
            before: cluster.before.map(|b| b.digest.clone()),
            after: cluster.after.map(|b| b.digest.clone()),
            fleet_groups: memberships.clone(),
            group,
            rollout: None,
        });
    }
    (clusters, totals, fleet_groups)
}

/// Fills in the fleet groups every member of a change group shares, and which of
/// them the change group covers whole (on HEAD, or on BASE for removed clusters).
fn label_groups(
    groups: &mut [ChangeGroup],
    clusters: &[ClusterDiff],
    base: &RenderOutput,
    head: &RenderOutput,
) {
    let (base_sizes, head_sizes) = (group_sizes(base), group_sizes(head));
    let by_name: HashMap<&str, &ClusterDiff> =
        clusters.iter().map(|c| (c.name.as_str(), c)).collect();
    for group in groups {
        let mut members = group
            .clusters
            .iter()
            .filter_map(|c| by_name.get(c.as_str()));
        let mut shared: Vec<String> = members
            .next()
            .map(|c| c.fleet_groups.clone())
            .unwrap_or_default();
        for member in members {
            shared.retain(|g| member.fleet_groups.contains(g));
        }
        let sizes = if group.status == ClusterStatus::Removed {
            &base_sizes
        } else {
            &head_sizes
        };
        group.whole_groups = shared
            .iter()
            .filter(|g| sizes.get(g.as_str()) == Some(&group.clusters.len()))
            .cloned()
            .collect();
        group.shared_groups = shared;
    }
}

/// How many clusters each fleet group has in a render.
fn group_sizes(output: &RenderOutput) -> HashMap<&str, usize> {
    let mut sizes: HashMap<&str, usize> = HashMap::new();
    for memberships in output.memberships.values() {
        for group in memberships {
            *sizes.entry(group.as_str()).or_default() += 1;
        }
    }
    sizes
}

/// Sorts change groups (changed, added, removed; largest first; then by first
/// cluster) and returns where each old index went.
fn sort_groups(groups: &mut Vec<ChangeGroup>) -> Vec<usize> {
    let mut indexed: Vec<(usize, ChangeGroup)> =
        std::mem::take(groups).into_iter().enumerate().collect();
    indexed.sort_by(|(_, a), (_, b)| {
        (
            a.status,
            a.before_unknown,
            std::cmp::Reverse(a.clusters.len()),
            &a.clusters,
        )
            .cmp(&(
                b.status,
                b.before_unknown,
                std::cmp::Reverse(b.clusters.len()),
                &b.clusters,
            ))
    });
    let mut order = vec![0; indexed.len()];
    for (new_index, (old_index, group)) in indexed.into_iter().enumerate() {
        order[old_index] = new_index;
        groups.push(group);
    }
    order
}

#[cfg(test)]
mod tests;
