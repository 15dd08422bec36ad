//! What a tenant's token sees, gathered once per request: the clusters whose served
//! bundle names the tenant, read from the stored bodies, and the fleet summary and
//! rollouts cut down to them. The decisions are `flotilla_core::access`'s; this
//! module reads their inputs and applies them.
//!
//! What a stored bundle says of its tenants (a [`TenantIndex`]: names, workloads and
//! resource identities, no content) is kept per digest, for the digests served (and
//! a few more, such as those rollouts name): an object is named by its content, so what it says never changes, and a
//! page that refreshes itself reads no object twice. Whole bundles are read only to
//! decide whether a tenant may steer a rollout.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, OnceLock};

use flotilla_core::access::{
    MemberBundles, RolloutAccess, ScopedBundle, TenantIndex, rollout_access,
};
use flotilla_core::bundle::{Digest, ResourceKey};
use flotilla_core::rollout::view::RolloutView;

use crate::fleet::{
    ClusterState, ClusterSummary, Counts, FleetSummary, ForcePush, InstallErrorSummary,
    RenderStatus, RenderWarnings,
};
use crate::recorder::Shared;

/// How many more indexes than digests served the cache holds before it forgets the
/// others.
const SPARE_INDEXES: usize = 256;

/// A stored bundle's tenant index; `None`: unreadable or not a bundle.
type Indexed = Option<Arc<TenantIndex>>;

fn indexes() -> &'static Mutex<HashMap<Digest, Indexed>> {
    static INDEXES: OnceLock<Mutex<HashMap<Digest, Indexed>>> = OnceLock::new();
    INDEXES.get_or_init(Mutex::default)
}

/// Reads and parses a stored bundle (call it off the async threads).
fn read_blocking(shared: &Shared, digest: &Digest) -> Option<ScopedBundle> {
    read_stored(shared, digest).ok().flatten()
}

/// A stored bundle, parsed (`Ok(None)`: not a bundle); `Err` when it cannot be read
/// now (not written yet, or no longer there), which a later read may change.
fn read_stored(shared: &Shared, digest: &Digest) -> Result<Option<ScopedBundle>, ()> {
    match shared.view.reads().object_blocking(digest) {
        Ok(body) => Ok(ScopedBundle::parse(&body)),
        // Deleted once unused (the target of a superseded rollout never served):
        // what it held of the tenant is no longer known.
        Err(err) if err.is_not_found() => {
            tracing::debug!(%digest, "a bundle to scope a tenant's view is gone: {err}");
            Err(())
        }
        Err(err) => {
            tracing::warn!(%digest, "cannot read a bundle to scope a tenant's view: {err}");
            Err(())
        }
    }
}

/// The tenant indexes of `digests`, from the cache or read (call it off the async
/// threads); the cache keeps only what `in_use` names once it has grown.
fn indexes_blocking(
    shared: &Shared,
    digests: &BTreeSet<Digest>,
    in_use: Option<&BTreeSet<Digest>>,
) -> HashMap<Digest, Indexed> {
    let mut found = HashMap::with_capacity(digests.len());
    let mut missing = Vec::new();
    {
        let cache = indexes().lock().unwrap_or_else(|e| e.into_inner());
        for digest in digests {
            match cache.get(digest) {
                Some(indexed) => {
                    found.insert(digest.clone(), indexed.clone());
                }
                None => missing.push(digest.clone()),
            }
        }
    }
    let read: Vec<(Digest, Result<Indexed, ()>)> = missing
        .into_iter()
        .map(|digest| {
            let indexed = read_stored(shared, &digest).map(|b| b.map(|b| Arc::new(b.index())));
            (digest, indexed)
        })
        .collect();
    let mut cache = indexes().lock().unwrap_or_else(|e| e.into_inner());
    for (digest, indexed) in read {
        // A bundle that could not be read is not remembered as such: a rollout is
        // recorded a moment before its bundles are written, and a tenant asking in
        // between would otherwise never see it.
        if let Ok(indexed) = &indexed {
            cache.insert(digest.clone(), indexed.clone());
        }
        found.insert(digest, indexed.unwrap_or(None));
    }
    if let Some(in_use) = in_use
        && cache.len() > in_use.len() + SPARE_INDEXES
    {
        cache.retain(|digest, _| in_use.contains(digest));
    }
    found
}

async fn indexes_of(
    shared: &Arc<Shared>,
    digests: BTreeSet<Digest>,
    in_use: Option<BTreeSet<Digest>>,
) -> HashMap<Digest, Indexed> {
    let shared = shared.clone();
    tokio::task::spawn_blocking(move || indexes_blocking(&shared, &digests, in_use.as_ref()))
        .await
        .unwrap_or_default()
}

/// Whole stored bundles, read and parsed.
async fn bundles_of(
    shared: &Arc<Shared>,
    digests: BTreeSet<Digest>,
) -> HashMap<Digest, ScopedBundle> {
    let shared = shared.clone();
    tokio::task::spawn_blocking(move || {
        digests
            .into_iter()
            .filter_map(|digest| Some((digest.clone(), read_blocking(&shared, &digest)?)))
            .collect()
    })
    .await
    .unwrap_or_default()
}

/// What one tenant's token sees of the fleet now.
pub struct TenantView {
    pub tenant: Arc<str>,
    /// The clusters whose served bundle names the tenant, with that bundle's index.
    clusters: HashMap<String, Arc<TenantIndex>>,
}

impl TenantView {
    /// Reads what the bundle served to every cluster says of its tenants and keeps the
    /// clusters that name this one.
    pub async fn read(shared: &Arc<Shared>, tenant: Arc<str>) -> TenantView {
        let served = shared.view.served();
        let digests: BTreeSet<Digest> =
            served.clusters.values().map(|c| c.digest.clone()).collect();
        let in_use = digests.clone();
        let indexed = indexes_of(shared, digests, Some(in_use)).await;
        let clusters = served
            .clusters
            .values()
            .filter_map(|c| {
                let index = indexed.get(&c.digest)?.as_ref()?;
                index
                    .has_tenant(&tenant)
                    .then(|| (c.name.clone(), index.clone()))
            })
            .collect();
        TenantView { tenant, clusters }
    }

    pub fn sees(&self, cluster: &str) -> bool {
        self.clusters.contains_key(cluster)
    }

    /// One cluster's summary with only the tenant's resources in its failures and
    /// drift, and the tenant's message for it ([`TenantView::message`]) in place of
    /// its agent's; `None` for a cluster the tenant is not on.
    pub fn cluster(&self, mut summary: ClusterSummary) -> Option<ClusterSummary> {
        summary.failed_resources =
            self.failures(&summary.name, std::mem::take(&mut summary.failed_resources))?;
        let theirs: std::collections::HashSet<String> =
            self.resource_names(&summary.name)?.into_iter().collect();
        summary.drift.retain(|drift| {
            let name = crate::fleet::resource_name(
                &drift.group,
                &drift.kind,
                &drift.namespace,
                &drift.name,
            );
            theirs.contains(&name)
        });
        summary.drifted = summary.drifted && !summary.drift.is_empty();
        let message = self.message(summary.state, summary.failed_resources.len());
        summary.message = (!message.is_empty()).then_some(message);
        Some(summary)
    }

    /// Of a cluster's failed resources (each `Kind.group namespace/name: message`),
    /// those of the tenant's resources; `None` for a cluster the tenant is not on.
    pub fn failures(&self, cluster: &str, mut failures: Vec<String>) -> Option<Vec<String>> {
        let theirs = self.resource_names(cluster)?;
        // The name ends where `: ` begins: a name may hold a `:` (RBAC's do), so
        // `x` must not take the failure of `x:admin`.
        failures.retain(|failure| {
            theirs.iter().any(|name| {
                failure
                    .strip_prefix(name.as_str())
                    .is_some_and(|rest| rest.starts_with(": ") || rest == ":")
            })
        });
        Some(failures)
    }

    /// The names (`Kind.group namespace/name`) of the tenant's resources on a
    /// cluster; `None` for a cluster the tenant is not on.
    fn resource_names(&self, cluster: &str) -> Option<Vec<String>> {
        let index = self.clusters.get(cluster)?;
        Some(
            index
                .resources_of(&self.tenant)
                .iter()
                .map(ToString::to_string)
                .collect(),
        )
    }

    /// What the tenant reads as a cluster's message. Never its agent's own: that
    /// summarises the whole apply and may name any workload's resource (the first
    /// failure, a Secret it could not open, a rule another tenant broke). The
    /// tenant's own failures are listed with their messages; this says how many,
    /// or that the cluster failed on resources outside the tenant's workloads.
    pub fn message(&self, state: ClusterState, theirs_failed: usize) -> String {
        match (state, theirs_failed) {
            (ClusterState::Failed, 0) => format!(
                "the last apply failed, on none of {}'s resources (the fleet's operators see why)",
                self.tenant
            ),
            (_, 0) => String::new(),
            (_, n) => format!(
                "{n} of {}'s resources failed in the last apply",
                self.tenant
            ),
        }
    }

    /// Whether a drifted resource of a cluster is the tenant's and still drifted.
    pub fn owns_remaining(&self, cluster: &str, drift: &crate::fleet::Drift) -> bool {
        drift.remains() && self.owns(cluster, drift)
    }

    /// The tenant's workloads on the clusters it is on.
    fn workloads(&self) -> BTreeSet<&str> {
        self.clusters
            .values()
            .flat_map(|b| b.workloads_of(&self.tenant))
            .map(String::as_str)
            .collect()
    }

    /// Whether a drifted resource of a cluster is the tenant's.
    pub fn owns(&self, cluster: &str, drift: &crate::fleet::Drift) -> bool {
        self.clusters.get(cluster).is_some_and(|index| {
            index.resources_of(&self.tenant).iter().any(|key| {
                key.group() == drift.group
                    && key.kind() == drift.kind
                    && key.namespace() == drift.namespace
                    && key.name() == drift.name
            })
        })
    }

    /// Whether a resource served to a cluster is the tenant's.
    pub fn owns_resource(&self, cluster: &str, resource: &ResourceKey) -> bool {
        self.clusters
            .get(cluster)
            .is_some_and(|index| index.resources_of(&self.tenant).contains(resource))
    }

    /// The render status with only the errors and warnings of the tenant's workloads,
    /// and no chart list.
    pub fn render_status(&self, mut status: RenderStatus) -> RenderStatus {
        let workloads = self.workloads();
        status.errors.retain(|d| theirs(&workloads, d));
        status.warnings = RenderWarnings(status.warnings)
            .retain(|d| theirs(&workloads, d))
            .0;
        status.charts.clear();
        // A commit's subject may speak of other tenants' workloads.
        status.commits.clear();
        status
    }

    /// The fleet summary cut down to the tenant: its clusters (counted anew), the
    /// render errors and warnings of its workloads, no chart list.
    pub fn fleet(&self, summary: FleetSummary) -> FleetSummary {
        let clusters: Vec<ClusterSummary> = summary
            .clusters
            .into_iter()
            .filter_map(|c| self.cluster(c))
            .collect();
        let mut counts = Counts::default();
        for cluster in &clusters {
            counts.add(cluster.state);
        }
        let workloads = self.workloads();
        let render_errors = summary
            .render_errors
            .into_iter()
            .filter(|e| theirs(&workloads, &e.diagnostic))
            .collect();
        let render_warnings = summary.render_warnings.retain(|d| theirs(&workloads, d));
        // The hub's own troubles are said, without what names its host (paths,
        // the repository's address, the other hubs): its operators see those.
        let source_error = summary
            .source_error
            .map(|_| "the hub cannot read the fleet's repository; its operators see why".into());
        let install_error = summary.install_error.map(|error| InstallErrorSummary {
            message: "the hub cannot install this render; its operators see why".into(),
            ..error
        });
        let force_push = summary.force_push.map(|push| ForcePush {
            hubs: Vec::new(),
            ..push
        });
        FleetSummary {
            render_errors,
            render_warnings,
            counts: counts.by_name(),
            drifted: clusters.iter().filter(|c| c.drifted).count(),
            charts: Default::default(),
            commit: None,
            clusters,
            source_error,
            install_error,
            force_push,
            ..summary
        }
    }

    /// What the tenant may do with a rollout (a detailed view, with its clusters),
    /// whether it may steer it included.
    pub async fn rollout(&self, shared: &Arc<Shared>, rollout: &RolloutView) -> RolloutScope {
        let mut scope = self
            .rollouts(shared, std::slice::from_ref(rollout))
            .await
            .pop()
            .unwrap_or_default();
        if scope.access == RolloutAccess::Hidden {
            return scope;
        }
        let digests = rollout
            .clusters
            .iter()
            .flat_map(|m| m.previous.iter().chain([&m.target]))
            .cloned()
            .collect();
        let bundles = bundles_of(shared, digests).await;
        let empty = ScopedBundle::default();
        let members: Vec<MemberBundles<'_>> = rollout
            .clusters
            .iter()
            .map(|m| MemberBundles {
                cluster: &m.name,
                before: match &m.previous {
                    // A new cluster had nothing before.
                    None => Some(&empty),
                    Some(digest) => bundles.get(digest),
                },
                after: bundles.get(&m.target),
            })
            .collect();
        scope.access = rollout_access(&self.tenant, &members);
        scope
    }

    /// The rollouts of a list (`GET /v1/rollouts`, the fleet page) the tenant sees, in
    /// the list's order and shape: those that change one of its clusters, before or
    /// after the change. Each is read in detail, for its clusters.
    pub async fn visible(
        &self,
        shared: &Arc<Shared>,
        listed: Vec<RolloutView>,
    ) -> Vec<RolloutView> {
        let mut details = Vec::with_capacity(listed.len());
        for rollout in &listed {
            match shared.recorder.rollout_detail(rollout.id).await {
                Ok(Some(detail)) => details.push(detail),
                Ok(None) => {}
                // Left out: a rollout that cannot be read is not shown to a tenant.
                Err(err) => tracing::error!("cannot read rollout {}: {err}", rollout.id),
            }
        }
        let scopes = self.rollouts(shared, &details).await;
        let visible: BTreeSet<i64> = details
            .iter()
            .zip(&scopes)
            .filter(|(_, scope)| scope.access != RolloutAccess::Hidden)
            .map(|(rollout, _)| rollout.id)
            .collect();
        let by_id: HashMap<i64, &RolloutScope> = details
            .iter()
            .zip(&scopes)
            .filter(|(rollout, _)| visible.contains(&rollout.id))
            .map(|(rollout, scope)| (rollout.id, scope))
            .collect();
        listed
            .into_iter()
            .filter_map(|r| Some(by_id.get(&r.id)?.cut(r)))
            .collect()
    }

    /// Whether the tenant sees each rollout (detailed views, with their clusters), and
    /// which of their clusters: a rollout it sees is `Visible` here, whether or not it
    /// may steer it (see [`TenantView::rollout`]).
    pub async fn rollouts(
        &self,
        shared: &Arc<Shared>,
        rollouts: &[RolloutView],
    ) -> Vec<RolloutScope> {
        let digests = rollouts
            .iter()
            .flat_map(|r| &r.clusters)
            .flat_map(|m| m.previous.iter().chain([&m.target]))
            .cloned()
            .collect();
        let indexed = indexes_of(shared, digests, None).await;
        let has_tenant = |digest: &Digest| {
            indexed
                .get(digest)
                .and_then(Option::as_ref)
                .is_some_and(|index| index.has_tenant(&self.tenant))
        };
        rollouts
            .iter()
            .map(|rollout| {
                let (theirs, others): (Vec<_>, Vec<_>) = rollout
                    .clusters
                    .iter()
                    .partition(|m| m.previous.iter().chain([&m.target]).any(has_tenant));
                let names = |members: Vec<&flotilla_core::rollout::view::MemberView>| {
                    members.into_iter().map(|m| m.name.clone()).collect()
                };
                RolloutScope {
                    access: if theirs.is_empty() {
                        RolloutAccess::Hidden
                    } else {
                        RolloutAccess::Visible
                    },
                    theirs: names(theirs),
                    others: names(others),
                }
            })
            .collect()
    }
}

/// Whether a diagnostic names one of these workloads.
fn theirs(workloads: &BTreeSet<&str>, diagnostic: &flotilla_core::diagnostic::Diagnostic) -> bool {
    diagnostic
        .workload
        .as_deref()
        .is_some_and(|w| workloads.contains(w))
}

/// What a tenant's token may do with one rollout, and which of its clusters it sees.
#[derive(Debug)]
pub struct RolloutScope {
    pub access: RolloutAccess,
    /// The clusters the tenant is on, before or after the change.
    theirs: BTreeSet<String>,
    /// The rollout's other clusters.
    others: BTreeSet<String>,
}

impl Default for RolloutScope {
    fn default() -> RolloutScope {
        RolloutScope {
            access: RolloutAccess::Hidden,
            theirs: BTreeSet::new(),
            others: BTreeSet::new(),
        }
    }
}

impl RolloutScope {
    /// The rollout as the tenant sees it: only the clusters it is on, only the
    /// events that name none of the others, and its reason (a halt lists failed
    /// clusters) with the others' names replaced. A list entry (no clusters) is cut
    /// by the clusters the scope was worked out from.
    pub fn cut(&self, mut rollout: RolloutView) -> RolloutView {
        let mut hidden: Vec<String> = rollout
            .clusters
            .iter()
            .filter(|m| !self.theirs.contains(&m.name))
            .map(|m| m.name.clone())
            .chain(self.others.iter().cloned())
            .collect();
        hidden.sort_unstable();
        hidden.dedup();
        rollout.clusters.retain(|m| self.theirs.contains(&m.name));
        rollout
            .events
            .retain(|e| !hidden.iter().any(|name| names(&e.message, name)));
        if let Some(reason) = &mut rollout.reason {
            for name in &hidden {
                *reason = replace_name(reason, name, "(another cluster)");
            }
        }
        rollout
    }
}

/// Whether `text` names the cluster `name`: holds it with no other character of a
/// name (a letter, a digit, `-` or `.`) on either side, so `shop-1` is not found in
/// `shop-10`.
fn names(text: &str, name: &str) -> bool {
    !name.is_empty()
        && text
            .match_indices(name)
            .any(|(at, _)| bounded(text, at, name.len()))
}

/// `text` with each place it names the cluster `name` ([`names`]) replaced by `with`.
fn replace_name(text: &str, name: &str, with: &str) -> String {
    if name.is_empty() {
        return text.to_string();
    }
    let mut out = String::with_capacity(text.len());
    let mut last = 0;
    for (at, _) in text.match_indices(name) {
        if at >= last && bounded(text, at, name.len()) {
            out.push_str(&text[last..at]);
            out.push_str(with);
            last = at + name.len();
        }
    }
    out.push_str(&text[last..]);
    out
}

/// Whether `text[at..at + len]` has no character of a cluster name next to it.
fn bounded(text: &str, at: usize, len: usize) -> bool {
    let of_a_name = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '.';
    !text[..at].chars().next_back().is_some_and(of_a_name)
        && !text[at + len..].chars().next().is_some_and(of_a_name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::{ClusterState, Drift, RenderError};
    use flotilla_core::bundle::{BundleMeta, TenantMark};
    use flotilla_core::diagnostic::Diagnostic;
    use flotilla_core::status::DriftAction;
    use serde_json::json;

    fn config_map(name: &str, namespace: &str) -> serde_json::Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": name, "namespace": namespace}})
    }

    /// A cluster running the shop's `web` and the platform's `dns`.
    fn shared_cluster() -> ScopedBundle {
        let mut meta = BundleMeta {
            workloads: vec!["dns".into(), "web".into()],
            ..BundleMeta::default()
        };
        meta.tenants.insert(
            "shop".into(),
            TenantMark {
                workloads: vec!["web".into()],
                namespaces: vec!["shop".into()],
                cluster_scoped: Vec::new(),
            },
        );
        ScopedBundle::new(
            vec![config_map("dns", "kube-system"), config_map("web", "shop")],
            meta,
        )
        .expect("a bundle")
    }

    fn drift(name: &str, namespace: &str) -> Drift {
        Drift {
            resource: crate::fleet::resource_name("", "ConfigMap", namespace, name),
            group: String::new(),
            kind: "ConfigMap".into(),
            namespace: namespace.into(),
            name: name.into(),
            fields: vec!["data.v".into()],
            managers: vec!["kubectl-edit".into()],
            deleted: false,
            action: DriftAction::Reported,
        }
    }

    fn summary(name: &str, state: ClusterState) -> ClusterSummary {
        ClusterSummary {
            name: name.into(),
            state,
            desired: Digest::of(b"[]"),
            desired_revision: "main@sha1:1".into(),
            latest: None,
            policy: None,
            wave: None,
            applied: None,
            attempted: None,
            last_seen: None,
            message: Some("2 resources applied; failed: ConfigMap kube-system/dns: invalid".into()),
            agent_version: None,
            failed_resources: vec![
                "ConfigMap kube-system/dns: invalid".into(),
                "ConfigMap shop/web: invalid".into(),
                // Another resource whose name starts with the shop's and a `:`.
                "ConfigMap shop/web:admin: invalid".into(),
            ],
            drifted: true,
            drift: vec![drift("dns", "kube-system"), drift("web", "shop")],
            needs_newer_agent: Vec::new(),
            groups: Vec::new(),
            labels: Default::default(),
            silent_for_seconds: None,
            served_since: None,
            pending_for_seconds: None,
        }
    }

    fn error(workload: &str) -> RenderError {
        let diagnostic = Diagnostic {
            workload: Some(workload.into()),
            ..Diagnostic::error("bad").in_file(format!("workloads/{workload}/workload.yaml"))
        };
        RenderError {
            text: diagnostic.to_string(),
            diagnostic,
        }
    }

    fn warning(workload: &str) -> Diagnostic {
        Diagnostic {
            workload: Some(workload.into()),
            ..Diagnostic::warning("to look at")
                .in_file(format!("workloads/{workload}/workload.yaml"))
        }
    }

    #[test]
    fn a_tenant_sees_its_clusters_and_on_them_its_own_resources() {
        let view = TenantView {
            tenant: Arc::from("shop"),
            clusters: HashMap::from([("edge-1".to_string(), Arc::new(shared_cluster().index()))]),
        };
        let fleet = FleetSummary {
            render_errors: vec![error("web"), error("dns")],
            render_warnings: RenderWarnings(Arc::from([
                warning("dns"),
                warning("web"),
                warning("dns"),
            ])),
            charts: [("dns".to_string(), "coredns 1.0".to_string())].into(),
            clusters: vec![
                summary("edge-1", ClusterState::Failed),
                summary("edge-2", ClusterState::Failed),
            ],
            source_error: Some("cannot fetch /srv/git/fleet.git: timed out".into()),
            ..FleetSummary::default()
        };
        let cut = view.fleet(fleet);
        let source_error = cut.source_error.as_deref().expect("said");
        assert!(!source_error.contains("/srv"), "{source_error}");
        assert_eq!(
            cut.clusters
                .iter()
                .map(|c| c.name.as_str())
                .collect::<Vec<_>>(),
            ["edge-1"]
        );
        let edge = &cut.clusters[0];
        assert_eq!(edge.failed_resources, ["ConfigMap shop/web: invalid"]);
        // The agent's message names the platform's failure: the tenant reads its own.
        assert_eq!(
            edge.message.as_deref(),
            Some("1 of shop's resources failed in the last apply")
        );
        assert_eq!(
            view.message(ClusterState::Failed, 0),
            "the last apply failed, on none of shop's resources (the fleet's operators see why)"
        );
        assert_eq!(view.message(ClusterState::InSync, 0), "");
        assert_eq!(
            edge.drift
                .iter()
                .map(|d| d.name.as_str())
                .collect::<Vec<_>>(),
            ["web"]
        );
        assert_eq!(cut.counts["failed"], 1);
        assert_eq!(cut.counts.values().sum::<usize>(), 1);
        assert_eq!(cut.drifted, 1);
        assert_eq!(
            cut.render_errors
                .iter()
                .map(|e| e.diagnostic.workload.as_deref())
                .collect::<Vec<_>>(),
            [Some("web")]
        );
        assert_eq!(
            serde_json::to_value(&cut.render_warnings).expect("json"),
            serde_json::json!({
                "total": 1,
                "shown": [{
                    "text": "workloads/web/workload.yaml: warning: to look at (workload web)",
                    "severity": "warning",
                    "file": "workloads/web/workload.yaml",
                    "message": "to look at",
                    "workload": "web",
                }],
            }),
            "a tenant sees its own workloads' warnings, counted anew"
        );
        assert!(cut.charts.is_empty());
        assert!(view.owns("edge-1", &drift("web", "shop")));
        assert!(!view.owns("edge-1", &drift("dns", "kube-system")));
        assert!(!view.owns("edge-2", &drift("web", "shop")));

        // A tenant whose workloads are on no cluster sees an empty fleet.
        let nowhere = TenantView {
            tenant: Arc::from("bank"),
            clusters: HashMap::new(),
        };
        let empty = nowhere.fleet(FleetSummary {
            clusters: vec![summary("edge-1", ClusterState::InSync)],
            ..FleetSummary::default()
        });
        assert!(empty.clusters.is_empty() && empty.counts.values().all(|n| *n == 0));
    }

    #[test]
    fn a_tenant_sees_of_a_rollout_only_the_clusters_it_is_on() {
        let view = RolloutScope {
            access: RolloutAccess::Visible,
            theirs: ["edge-1".to_string(), "edge-10".to_string()].into(),
            others: ["edge-1x".to_string()].into(),
        };
        let member = |name: &str| flotilla_core::rollout::view::MemberView {
            name: name.into(),
            wave: "canary".into(),
            state: "serving".into(),
            previous: None,
            target: Digest::of(b"[]"),
        };
        let event = |message: &str| flotilla_core::rollout::view::EventView {
            at: "2025-01-15T00:00:00Z".into(),
            message: message.into(),
            by: None,
            role: None,
        };
        let rollout = RolloutView {
            id: 1,
            policy: "stores".into(),
            revision: "main@sha1:2".into(),
            state: flotilla_core::rollout::RolloutState::Progressing,
            reason: Some(
                "wave canary: 3 failed clusters (edge-1, edge-2, edge-10), more than maxFailed 1 allows (1)"
                    .into(),
            ),
            forced: false,
            started_at: "2025-01-15T00:00:00Z".into(),
            ended_at: None,
            settling_until: None,
            waves: Vec::new(),
            events: vec![
                event("wave canary released"),
                event("edge-2 left the rollout"),
            ],
            clusters: vec![member("edge-1"), member("edge-2"), member("edge-10")],
        };
        // A list entry (no clusters, no events) still has its reason cut, by the
        // clusters its scope was worked out from.
        let listed = view.cut(RolloutView {
            clusters: Vec::new(),
            events: Vec::new(),
            reason: Some("wave canary: 1 failed cluster (edge-1x), more".into()),
            ..rollout.clone()
        });
        assert_eq!(
            listed.reason.as_deref(),
            Some("wave canary: 1 failed cluster ((another cluster)), more")
        );
        let cut = view.cut(rollout);
        assert_eq!(
            cut.reason.as_deref(),
            Some(
                "wave canary: 3 failed clusters (edge-1, (another cluster), edge-10), more than maxFailed 1 allows (1)"
            ),
            "edge-2 is not the tenant's; edge-1 inside edge-10 is not taken for it"
        );
        assert_eq!(
            cut.clusters
                .iter()
                .map(|m| m.name.as_str())
                .collect::<Vec<_>>(),
            ["edge-1", "edge-10"]
        );
        assert_eq!(
            cut.events
                .iter()
                .map(|e| e.message.as_str())
                .collect::<Vec<_>>(),
            ["wave canary released"]
        );
    }
}
