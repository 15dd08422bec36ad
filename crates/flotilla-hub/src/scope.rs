//! What a tenant's token sees, gathered once per request: the clusters whose served
//! bundle names the tenant, read from the stored bodies, and the fleet summary and
//! rollouts cut down to them. The decisions are `flotilla_core::access`'s; this
//! module reads their inputs and applies them.
//!
//! Stored bodies are parsed once per digest and kept in a small cache shared by the
//! process: an object is named by its content, so what it says never changes.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, OnceLock};

use flotilla_core::access::{MemberBundles, RolloutAccess, ScopedBundle, rollout_access};
use flotilla_core::bundle::Digest;
use flotilla_core::rollout::view::RolloutView;

use crate::fleet::{ClusterSummary, Counts, FleetSummary, RenderStatus};
use crate::recorder::Shared;

/// How many parsed bundles the cache keeps before it starts again.
const CACHED_BUNDLES: usize = 512;

/// A parsed stored bundle; `None`: unreadable or not a bundle.
type Parsed = Option<Arc<ScopedBundle>>;

fn cache() -> &'static Mutex<HashMap<Digest, Parsed>> {
    static CACHE: OnceLock<Mutex<HashMap<Digest, Parsed>>> = OnceLock::new();
    CACHE.get_or_init(Mutex::default)
}

/// Reads and parses the stored bodies of `digests` (call it off the async threads).
fn bundles_blocking(shared: &Shared, digests: BTreeSet<Digest>) -> HashMap<Digest, Parsed> {
    let mut found = HashMap::with_capacity(digests.len());
    for digest in digests {
        let cached = cache()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&digest)
            .cloned();
        let parsed = match cached {
            Some(parsed) => parsed,
            None => {
                let parsed = match shared.view.reads().object_blocking(&digest) {
                    Ok(body) => ScopedBundle::parse(&body).map(Arc::new),
                    Err(err) => {
                        tracing::warn!(%digest, "cannot read a bundle to scope a tenant's view: {err}");
                        None
                    }
                };
                let mut cache = cache().lock().unwrap_or_else(|e| e.into_inner());
                if cache.len() >= CACHED_BUNDLES {
                    cache.clear();
                }
                cache.insert(digest.clone(), parsed.clone());
                parsed
            }
        };
        found.insert(digest, parsed);
    }
    found
}

async fn bundles(shared: &Arc<Shared>, digests: BTreeSet<Digest>) -> HashMap<Digest, Parsed> {
    let shared = shared.clone();
    tokio::task::spawn_blocking(move || bundles_blocking(&shared, digests))
        .await
        .unwrap_or_default()
}

/// What one tenant's token sees of the fleet now.
pub struct TenantView {
    pub tenant: Arc<str>,
    /// The clusters whose served bundle names the tenant, with that bundle.
    clusters: HashMap<String, Arc<ScopedBundle>>,
}

impl TenantView {
    /// Reads the bundle served to every cluster and keeps those that name the tenant.
    pub async fn read(shared: &Arc<Shared>, tenant: Arc<str>) -> TenantView {
        let served = shared.view.served();
        let digests = served.clusters.values().map(|c| c.digest.clone()).collect();
        let parsed = bundles(shared, digests).await;
        let clusters = served
            .clusters
            .values()
            .filter_map(|c| {
                let bundle = parsed.get(&c.digest)?.as_ref()?;
                bundle
                    .has_tenant(&tenant)
                    .then(|| (c.name.clone(), bundle.clone()))
            })
            .collect();
        TenantView { tenant, clusters }
    }

    pub fn sees(&self, cluster: &str) -> bool {
        self.clusters.contains_key(cluster)
    }

    /// One cluster's summary with only the tenant's resources in its failures and
    /// drift; `None` for a cluster the tenant is not on.
    pub fn cluster(&self, mut summary: ClusterSummary) -> Option<ClusterSummary> {
        let bundle = self.clusters.get(&summary.name)?;
        let theirs: Vec<String> = bundle
            .resources_of(&self.tenant)
            .map(ToString::to_string)
            .collect();
        // A failure reads `Kind.group namespace/name: message`.
        summary.failed_resources.retain(|failure| {
            theirs.iter().any(|name| {
                failure
                    .strip_prefix(name.as_str())
                    .is_some_and(|rest| rest.starts_with(':'))
            })
        });
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
        Some(summary)
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
        self.clusters.get(cluster).is_some_and(|bundle| {
            bundle.resources_of(&self.tenant).any(|key| {
                key.group == drift.group
                    && key.kind == drift.kind
                    && key.namespace == drift.namespace
                    && key.name == drift.name
            })
        })
    }

    /// The render status with only the errors of the tenant's workloads, and no chart
    /// list.
    pub fn render_status(&self, mut status: RenderStatus) -> RenderStatus {
        let workloads = self.workloads();
        status.errors.retain(|d| theirs(&workloads, d));
        status.charts.clear();
        status
    }

    /// The fleet summary cut down to the tenant: its clusters (counted anew), the
    /// render errors of its workloads, no chart list.
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
        FleetSummary {
            render_errors,
            counts: counts.by_name(),
            drifted: clusters.iter().filter(|c| c.drifted).count(),
            charts: Default::default(),
            clusters,
            ..summary
        }
    }

    /// What the tenant may do with a rollout (a detailed view, with its clusters).
    pub async fn rollout(&self, shared: &Arc<Shared>, rollout: &RolloutView) -> RolloutScope {
        self.rollouts(shared, std::slice::from_ref(rollout))
            .await
            .pop()
            .unwrap_or_default()
    }

    /// What the tenant may do with each rollout (detailed views, with their clusters).
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
        let parsed = bundles(shared, digests).await;
        let empty = ScopedBundle::default();
        rollouts
            .iter()
            .map(|rollout| {
                let members: Vec<MemberBundles<'_>> = rollout
                    .clusters
                    .iter()
                    .map(|m| MemberBundles {
                        cluster: &m.name,
                        before: match &m.previous {
                            // A new cluster had nothing before.
                            None => Some(&empty),
                            Some(digest) => parsed.get(digest).and_then(|p| p.as_deref()),
                        },
                        after: parsed.get(&m.target).and_then(|p| p.as_deref()),
                    })
                    .collect();
                RolloutScope {
                    access: rollout_access(&self.tenant, &members),
                    theirs: members
                        .iter()
                        .filter(|m| m.touches(&self.tenant))
                        .map(|m| m.cluster.to_string())
                        .collect(),
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
}

impl Default for RolloutScope {
    fn default() -> RolloutScope {
        RolloutScope {
            access: RolloutAccess::Hidden,
            theirs: BTreeSet::new(),
        }
    }
}

impl RolloutScope {
    /// The rollout as the tenant sees it: only the clusters it is on, and only the
    /// events that name none of the others.
    pub fn cut(&self, mut rollout: RolloutView) -> RolloutView {
        let hidden: Vec<String> = rollout
            .clusters
            .iter()
            .filter(|m| !self.theirs.contains(&m.name))
            .map(|m| m.name.clone())
            .collect();
        rollout.clusters.retain(|m| self.theirs.contains(&m.name));
        rollout
            .events
            .retain(|e| !hidden.iter().any(|name| e.message.contains(name.as_str())));
        rollout
    }
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
            message: None,
            agent_version: None,
            failed_resources: vec![
                "ConfigMap kube-system/dns: invalid".into(),
                "ConfigMap shop/web: invalid".into(),
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

    #[test]
    fn a_tenant_sees_its_clusters_and_on_them_its_own_resources() {
        let view = TenantView {
            tenant: Arc::from("shop"),
            clusters: HashMap::from([("edge-1".to_string(), Arc::new(shared_cluster()))]),
        };
        let fleet = FleetSummary {
            render_errors: vec![error("web"), error("dns")],
            charts: [("dns".to_string(), "coredns 1.0".to_string())].into(),
            clusters: vec![
                summary("edge-1", ClusterState::Failed),
                summary("edge-2", ClusterState::Failed),
            ],
            ..FleetSummary::default()
        };
        let cut = view.fleet(fleet);
        assert_eq!(
            cut.clusters
                .iter()
                .map(|c| c.name.as_str())
                .collect::<Vec<_>>(),
            ["edge-1"]
        );
        let edge = &cut.clusters[0];
        assert_eq!(edge.failed_resources, ["ConfigMap shop/web: invalid"]);
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
            theirs: ["edge-1".to_string()].into(),
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
            reason: None,
            forced: false,
            started_at: "2025-01-15T00:00:00Z".into(),
            ended_at: None,
            settling_until: None,
            waves: Vec::new(),
            events: vec![
                event("wave canary released"),
                event("edge-2 left the rollout"),
            ],
            clusters: vec![member("edge-1"), member("edge-2")],
        };
        let cut = view.cut(rollout);
        assert_eq!(
            cut.clusters
                .iter()
                .map(|m| m.name.as_str())
                .collect::<Vec<_>>(),
            ["edge-1"]
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
