//! Tenants (`tenants/<name>.yaml`): which workloads and overlays a team owns, and the
//! rules its resources must keep, enforced as the fleet renders.
//!
//! - A tenant's workloads may target only clusters its `spec.clusterSelector`
//!   selects.
//! - Its resources may be only in namespaces `spec.namespaces` names (names or
//!   globs), or be those `Namespace` objects; cluster-scoped kinds only those
//!   `spec.clusterScoped` lists.
//! - Its RoleBindings and ClusterRoleBindings may refer only to ClusterRoles its own
//!   workloads ship on the cluster or `spec.clusterRoles` lists: `cluster-admin`,
//!   `admin` and `edit` are refused unless listed.
//! - Its workloads may read files only in their own folders, its overlays' folders
//!   and `spec.sharedPaths`: a kustomization's reference to another tenant's file
//!   (a SOPS file above all) is an error at its line, and so is a Helm chart or
//!   values file elsewhere, or a template its templates load (the tenant's
//!   templates render in an engine of their own, see
//!   [`crate::template::Templates::confine`]).
//! - Its overlays act only on its workloads.
//!
//! Each broken rule is an error naming the tenant, the rule, the file and the line.
//! An error of a tenant's workload fails only the clusters that workload targets
//! (they keep their last good bundle), so one tenant's mistake does not hold the
//! others' clusters. The bundle's `meta.tenants` carries the rules on to the agent,
//! which enforces them again.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use serde_json::{Value, json};

use flotilla_core::bundle::{
    BUILT_IN_CLUSTER_SCOPED, POD_SECURITY_LABEL, Resource, ResourceKey, SignedTenantRules,
    TENANT_CLUSTER_ROLE, TENANT_VERBS, TenantMark, TenantRefusal, TenantRules, names_kind,
    tenant_service_account,
};
use flotilla_core::diagnostic::Diagnostic;
use flotilla_core::model::{Located, PodSecurityLevel};
use flotilla_core::names::glob_matches;
use flotilla_core::snapshot::FleetSnapshot;

use crate::fleet::{Cluster, Fleet, Tenant};
use crate::scope::{CrdPlurals, crd_plural};

fn any_matches(patterns: &[Located<String>], text: &str) -> bool {
    patterns.iter().any(|p| glob_matches(&p.value, text))
}

fn shown_list(patterns: &[Located<String>]) -> String {
    if patterns.is_empty() {
        return "none".into();
    }
    patterns
        .iter()
        .map(|p| p.value.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Gives each workload and overlay its tenant. A workload or overlay two tenants
/// claim is an error at both claims; an overlay of a tenant that names a workload
/// of someone else's in `spec.workloads` is an error at that name.
pub(crate) fn assign(fleet: &mut Fleet, diagnostics: &mut Vec<Diagnostic>) {
    if fleet.tenants.is_empty() {
        return;
    }
    let tenants = &fleet.tenants;
    let owner = |name: &str,
                 claims: fn(&Tenant) -> &[Located<String>],
                 what: &str,
                 diagnostics: &mut Vec<Diagnostic>|
     -> Option<usize> {
        let claiming: Vec<usize> = (0..tenants.len())
            .filter(|&t| any_matches(claims(&tenants[t]), name))
            .collect();
        if let [first, second, ..] = claiming[..] {
            let line = |t: usize| {
                claims(&tenants[t])
                    .iter()
                    .find(|p| glob_matches(&p.value, name))
                    .map(|p| p.referenced.line())
            };
            diagnostics.push(
                Diagnostic::error(format!(
                    "{what} {name:?} is claimed by two tenants, {:?} (here) and {:?} ({}:{}): a {what} belongs to one tenant at most",
                    tenants[first].name,
                    tenants[second].name,
                    tenants[second].file,
                    line(second).unwrap_or(0),
                ))
                .in_file(&tenants[first].file)
                .at_line(line(first)),
            );
        }
        claiming.first().copied()
    };
    let mut found = Vec::new();
    let workload_tenants: Vec<Option<usize>> = fleet
        .workloads
        .iter()
        .map(|w| owner(&w.name, |t| &t.workloads, "workload", &mut found))
        .collect();
    let overlay_tenants: Vec<Option<usize>> = fleet
        .overlays
        .iter()
        .map(|o| owner(&o.name, |t| &t.overlays, "overlay", &mut found))
        .collect();
    diagnostics.extend(found);
    for (workload, tenant) in fleet.workloads.iter_mut().zip(workload_tenants) {
        workload.tenant = tenant;
    }
    for (overlay, tenant) in fleet.overlays.iter_mut().zip(overlay_tenants) {
        overlay.tenant = tenant;
        let Some(t) = tenant else { continue };
        for named in overlay.workloads.iter().flatten() {
            let theirs = fleet
                .workloads
                .iter()
                .find(|w| w.name == named.value)
                .is_none_or(|w| w.tenant == Some(t));
            if !theirs {
                diagnostics.push(
                    Diagnostic::error(format!(
                        "tenant {:?}: overlay {:?} names workload {:?}, which is not the tenant's: a tenant's overlay acts only on its own workloads (spec.workloads of {})",
                        fleet.tenants[t].name, overlay.name, named.value, fleet.tenants[t].file
                    ))
                    .in_file(&overlay.file)
                    .at_line(Some(named.referenced.line())),
                );
            }
        }
    }
}

/// The folders and files a tenant's workloads may read: its workloads' folders, its
/// overlays' folders (or files, for overlays at the top of `overlays/`) and its
/// `spec.sharedPaths`. It owns what it needs, so that the template engine of the
/// tenant's templates can keep it (see [`crate::template::Templates::confine`]).
#[derive(Clone, Debug)]
pub(crate) struct Fence {
    prefixes: Vec<String>,
    shared: Vec<String>,
    tenant: String,
    /// The end of every refusal: the rule, the Tenant file and its shared paths.
    rule: String,
}

impl Fence {
    pub(crate) fn of(fleet: &Fleet, tenant: usize) -> Fence {
        let workloads = fleet
            .workloads
            .iter()
            .filter(|w| w.tenant == Some(tenant))
            .map(|w| format!("workloads/{}/", w.name));
        let overlays = fleet
            .overlays
            .iter()
            .filter(|o| o.tenant == Some(tenant))
            .map(|o| match o.file.rsplit_once('/') {
                Some((dir, _)) if dir != "overlays" => format!("{dir}/"),
                _ => o.file.clone(),
            });
        let owner = &fleet.tenants[tenant];
        Fence {
            prefixes: workloads.chain(overlays).collect(),
            shared: owner.shared_paths.iter().map(|p| p.value.clone()).collect(),
            tenant: owner.name.clone(),
            rule: format!(
                "a tenant's files may refer only to its own workloads' and overlays' folders and to spec.sharedPaths of {} ({})",
                owner.file,
                shown_list(&owner.shared_paths)
            ),
        }
    }

    /// Whether `path` is in the tenant's own folders (its workloads' and overlays'),
    /// not merely one it may read.
    pub(crate) fn owns(&self, path: &str) -> bool {
        self.prefixes.iter().any(|p| path.starts_with(p.as_str()))
    }

    pub(crate) fn allows(&self, path: &str) -> bool {
        self.prefixes.iter().any(|p| path.starts_with(p.as_str()))
            || self.shared.iter().any(|p| glob_matches(p, path))
    }

    /// Why a file outside the fence cannot be read.
    pub(crate) fn refusal(&self, path: &str) -> String {
        format!(
            "tenant {:?} may not read {path}: {}",
            self.tenant, self.rule
        )
    }

    /// The snapshot as this tenant's kustomizations may see it: every file outside
    /// the fence is skipped, with the reason.
    pub(crate) fn snapshot(&self, snapshot: &FleetSnapshot) -> FleetSnapshot {
        let mut fenced = FleetSnapshot {
            revision: snapshot.revision.clone(),
            ..FleetSnapshot::default()
        };
        for (path, text) in &snapshot.files {
            match snapshot.links.get(path) {
                // A symlink inside the fence to a file outside it: the file's, not
                // the link's, place decides.
                Some(target) if self.allows(path) && !self.allows(target) => {
                    fenced.skipped.insert(
                        path.clone(),
                        format!("{path} is a symlink to {target}; {}", self.refusal(target)),
                    );
                }
                _ if self.allows(path) => {
                    fenced.files.insert(path.clone(), text.clone());
                }
                _ => {
                    fenced.skipped.insert(path.clone(), self.refusal(path));
                }
            }
        }
        for (path, bytes) in &snapshot.binaries {
            if self.allows(path) {
                fenced.binaries.insert(path.clone(), bytes.clone());
            } else {
                fenced.skipped.insert(path.clone(), self.refusal(path));
            }
        }
        for (path, reason) in &snapshot.skipped {
            fenced
                .skipped
                .entry(path.clone())
                .or_insert_with(|| reason.clone());
        }
        // Only the keys of the SOPS files the tenant may read: another tenant's
        // keys must not key (and so rename) what this tenant's kustomizations make.
        fenced.hash_keys = snapshot
            .hash_keys
            .iter()
            .filter(|(path, _)| fenced.files.contains_key(*path))
            .map(|(path, key)| (path.clone(), *key))
            .collect();
        fenced
    }
}

/// What a tenant's rules say of one of its resources, where no other resource of
/// the cluster matters. A render judges each resource of a unit of work once, for
/// every cluster that shares the unit, and each resource of a stencil by its
/// identity (which every cluster filling it in shares): per cluster, only the
/// cluster selector and the ClusterRoles the tenant ships there are left to check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Within the rules.
    Allowed,
    /// Outside them: the whole error message.
    Refused(String),
    /// It binds `role`, which `spec.clusterRoles` does not list: allowed only on a
    /// cluster where the tenant ships that ClusterRole; `message` otherwise.
    Binds { role: String, message: String },
    /// A binding judged by its identity alone: its role is read on each cluster,
    /// whose filled-in values may name another.
    PerCluster,
}

/// The verdict of `tenant`'s rules on `resource` (see [`Verdict`]).
pub(crate) fn judge(tenant: &Tenant, resource: &Resource) -> Verdict {
    if let Some(message) = refusal(tenant, &resource.key) {
        return Verdict::Refused(message);
    }
    match bound_cluster_role(resource) {
        Some(role) if !any_matches(&tenant.cluster_roles, &role) => Verdict::Binds {
            message: format!(
                "tenant {:?}: {} binds ClusterRole {role:?}, which the tenant neither ships nor may bind (spec.clusterRoles of {}: {})",
                tenant.name,
                resource.key,
                tenant.file,
                shown_list(&tenant.cluster_roles)
            ),
            role,
        },
        _ => Verdict::Allowed,
    }
}

/// The verdict of `tenant`'s rules on a resource known by its identity `key` only:
/// [`Verdict::PerCluster`] for a binding its identity allows.
pub(crate) fn judge_key(tenant: &Tenant, key: &ResourceKey) -> Verdict {
    if let Some(message) = refusal(tenant, key) {
        return Verdict::Refused(message);
    }
    if is_binding(key) {
        Verdict::PerCluster
    } else {
        Verdict::Allowed
    }
}

/// The error of a resource outside the tenant's namespaces or of a cluster-scoped
/// kind it may not write.
fn refusal(tenant: &Tenant, key: &ResourceKey) -> Option<String> {
    let refusal = TenantRefusal::of(
        tenant.namespaces.iter().map(|n| n.value.as_str()),
        tenant.cluster_scoped.iter().map(|k| k.value.as_str()),
        key,
    )?;
    let broken = match refusal {
        TenantRefusal::OtherNamespace => format!(
            "{key} is in namespace {:?}, which is not the tenant's (spec.namespaces of {}: {})",
            key.namespace(),
            tenant.file,
            shown_list(&tenant.namespaces)
        ),
        TenantRefusal::NotItsNamespace => format!(
            "{key} is not one of the tenant's namespaces (spec.namespaces of {}: {})",
            tenant.file,
            shown_list(&tenant.namespaces)
        ),
        TenantRefusal::ClusterScoped => format!(
            "{key} is cluster-scoped, and spec.clusterScoped of {} does not list {} ({})",
            tenant.file,
            key.kind(),
            shown_list(&tenant.cluster_scoped)
        ),
    };
    Some(format!("tenant {:?}: {broken}", tenant.name))
}

/// A resource of a cluster for [`check_cluster`]: the resource, the file and line
/// it came from, its workload (a fleet index) and its verdict if one was found
/// before.
pub(crate) type Judged<'r> = (&'r Resource, &'r str, u64, usize, Option<&'r Verdict>);

/// The errors of one cluster's tenant rules: a tenant's workload that targets it
/// outside the tenant's clusters, and each resource of a tenant's workload outside
/// its namespaces, of a cluster-scoped kind it may not write, or binding a
/// ClusterRole it does not own. A resource without a verdict is judged here.
pub(crate) fn check_cluster<'r>(
    fleet: &Fleet,
    cluster: &Cluster,
    targeted: &[usize],
    resources: impl Iterator<Item = Judged<'r>> + Clone,
) -> Vec<Diagnostic> {
    let mut errors = Vec::new();
    if fleet.tenants.is_empty() {
        return errors;
    }
    // Whether each tenant's spec.clusterSelector selects the cluster, looked at once.
    let mut selected: Vec<Option<bool>> = vec![None; fleet.tenants.len()];
    for &w in targeted {
        let workload = &fleet.workloads[w];
        let Some(t) = workload.tenant else { continue };
        let tenant = &fleet.tenants[t];
        let Some(selector) = &tenant.cluster_selector else {
            continue;
        };
        if !*selected[t].get_or_insert_with(|| selector.matches(&cluster.labels)) {
            let line = workload.targets.first().map(|t| t.referenced.line());
            errors.push(
                Diagnostic::error(format!(
                    "tenant {:?}: workload {:?} targets cluster {:?}, which spec.clusterSelector of {} does not select",
                    tenant.name, workload.name, cluster.name, tenant.file
                ))
                .in_file(&workload.file)
                .at_line(line)
                .for_cluster(&cluster.name)
                .for_workload(&workload.name),
            );
        }
    }
    // The ClusterRoles each tenant ships on this cluster are its own to bind.
    let shipped = |t: usize, role: &str| {
        resources.clone().any(|(resource, _, _, w, _)| {
            fleet.workloads[w].tenant == Some(t)
                && resource.key.kind() == "ClusterRole"
                && resource.key.group() == RBAC
                && resource.key.name() == role
        })
    };
    for (resource, file, line, w, verdict) in resources.clone() {
        let Some(t) = fleet.workloads[w].tenant else {
            continue;
        };
        let judged;
        let verdict = match verdict {
            Some(verdict) if *verdict != Verdict::PerCluster => verdict,
            _ => {
                judged = judge(&fleet.tenants[t], resource);
                &judged
            }
        };
        let message = match verdict {
            Verdict::Allowed | Verdict::PerCluster => continue,
            Verdict::Refused(message) => message,
            Verdict::Binds { role, message } => {
                if shipped(t, role) {
                    continue;
                }
                message
            }
        };
        errors.push(
            Diagnostic::error(message.clone())
                .in_file(file)
                .at_line(Some(line))
                .for_cluster(&cluster.name)
                .for_workload(&fleet.workloads[w].name),
        );
    }
    errors
}

const RBAC: &str = "rbac.authorization.k8s.io";

/// Whether `key` is a RoleBinding's or a ClusterRoleBinding's.
fn is_binding(key: &ResourceKey) -> bool {
    key.group() == RBAC && matches!(key.kind(), "RoleBinding" | "ClusterRoleBinding")
}

/// The ClusterRole a RoleBinding or ClusterRoleBinding refers to.
fn bound_cluster_role(resource: &Resource) -> Option<String> {
    if !is_binding(&resource.key) {
        return None;
    }
    let value = resource.value();
    let role_ref = value.get("roleRef")?;
    (role_ref.get("kind")?.as_str()? == "ClusterRole")
        .then(|| role_ref.get("name")?.as_str().map(str::to_string))
        .flatten()
}

/// `meta.tenants` for a cluster: each tenant with workloads among `targeted`, with
/// the rules the agent checks.
pub(crate) fn marks(fleet: &Fleet, targeted: &[usize]) -> BTreeMap<String, TenantMark> {
    let mut marks: BTreeMap<String, TenantMark> = BTreeMap::new();
    for &w in targeted {
        let workload = &fleet.workloads[w];
        let Some(t) = workload.tenant else { continue };
        let tenant = &fleet.tenants[t];
        let mark = marks
            .entry(tenant.name.clone())
            .or_insert_with(|| TenantMark {
                workloads: Vec::new(),
                namespaces: tenant.namespaces.iter().map(|n| n.value.clone()).collect(),
                cluster_scoped: tenant
                    .cluster_scoped
                    .iter()
                    .map(|k| k.value.clone())
                    .collect(),
            });
        mark.workloads.push(workload.name.clone());
    }
    for mark in marks.values_mut() {
        mark.workloads.sort();
    }
    marks
}

/// Where the signed tenant rules live in a fleet.
pub(crate) const SIGNED_RULES_FILE: &str = "tenants/rules.signed.json";

/// The tenant rules the Tenant files give, as `flotilla key sign-tenants` signs them
/// (workloads and namespaces as written: names or globs).
pub fn rules_of(tenants: &[Tenant], platform_workloads: Option<Vec<String>>) -> TenantRules {
    let values = |list: &[Located<String>]| list.iter().map(|v| v.value.clone()).collect();
    TenantRules {
        platform_workloads,
        tenants: tenants
            .iter()
            .map(|t| {
                (
                    t.name.clone(),
                    TenantMark {
                        workloads: values(&t.workloads),
                        namespaces: values(&t.namespaces),
                        cluster_scoped: values(&t.cluster_scoped),
                    },
                )
            })
            .collect(),
    }
}

/// Reads `tenants/rules.signed.json` and checks that it signs the rules the Tenant
/// files say: a change to a Tenant file needs the platform's signature again.
pub(crate) fn signed_rules(
    text: &str,
    tenants: &[Tenant],
    diagnostics: &mut Vec<Diagnostic>,
) -> Option<SignedTenantRules> {
    let signed: SignedTenantRules = match serde_json::from_str(text) {
        Ok(signed) => signed,
        Err(err) => {
            diagnostics.push(
                Diagnostic::error(format!(
                    "not signed tenant rules as `flotilla key sign-tenants` writes them: {err}"
                ))
                .in_file(SIGNED_RULES_FILE)
                .at_line(Some(err.line() as u64)),
            );
            return None;
        }
    };
    let files = rules_of(tenants, signed.rules.platform_workloads.clone());
    if files.tenants != signed.rules.tenants {
        let differing: Vec<&str> = files
            .tenants
            .keys()
            .chain(signed.rules.tenants.keys())
            .filter(|name| files.tenants.get(*name) != signed.rules.tenants.get(*name))
            .map(String::as_str)
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        diagnostics.push(
            Diagnostic::error(format!(
                "the signed tenant rules differ from the Tenant files for {}: the platform signs them again with `flotilla key sign-tenants --key KEY` after any change to tenants/",
                differing.join(", ")
            ))
            .in_file(SIGNED_RULES_FILE),
        );
        return None;
    }
    Some(signed)
}

/// The position in a bundle's workload list
/// ([`crate::ClusterProvenance::resource_workloads`]) of the objects the render adds
/// for tenants' namespaces (`with_platform_objects`): they belong to no fleet
/// workload, and are named [`flotilla_core::bundle::TENANCY_WORKLOAD`] in the
/// bundle's metadata.
pub const TENANCY_POSITION: u32 = u32::MAX - 1;

/// A bundle's resources and, for each, its workload's position.
type BundleLists = (Vec<Arc<Resource>>, Vec<u32>);

/// A cluster's resources with what tenants need on it: per tenant, in each
/// namespace its resources are in (the concrete namespaces, not `spec.namespaces`'
/// globs), the ServiceAccount `flotilla-tenant-<tenant>` the agent impersonates to
/// apply them (`--impersonate-tenants`) and a RoleBinding of it to the ClusterRole
/// `flotilla-tenant`; and the tenant's `Namespace` objects labelled with its Pod
/// Security level. RBAC cannot match namespace globs, hence one binding per namespace.
///
/// A tenant that ships cluster-scoped objects (other than its `Namespace`s) also gets
/// a ClusterRole `flotilla-tenant-<tenant>` on the kinds of its `spec.clusterScoped`
/// and a ClusterRoleBinding of it to its ServiceAccount in the first (by name) of its
/// namespaces on the cluster, the one the agent impersonates for those objects. A
/// tenant without any namespaced object on the cluster has no ServiceAccount there:
/// its cluster-scoped objects are then an error for the cluster, naming the Tenant
/// file, as is a kind of `spec.clusterScoped` whose resource name cannot be known.
///
/// The added objects are the platform's (position [`TENANCY_POSITION`]); those of a
/// previous render kept in `resources` are made again. `resources` are sorted by key
/// and `resource_workloads` gives each one's workload as a position in `targeted`.
/// A resource with the identity of an added object is an error for the cluster.
/// Without tenants' resources on the cluster, the lists come back as they were.
pub(crate) fn with_platform_objects(
    fleet: &Fleet,
    cluster: &Cluster,
    targeted: &[usize],
    (resources, resource_workloads): BundleLists,
    made: &PlatformObjects,
) -> Result<BundleLists, Vec<Diagnostic>> {
    if fleet.tenants.is_empty() {
        return Ok((resources, resource_workloads));
    }
    let tenant_of = |p: u32| {
        targeted
            .get(p as usize)
            .and_then(|&w| fleet.workloads[w].tenant)
    };
    let mut namespaces: BTreeSet<(usize, &str)> = BTreeSet::new();
    // Per tenant shipping cluster-scoped objects, the first of them.
    let mut cluster_scoped: BTreeMap<usize, &ResourceKey> = BTreeMap::new();
    // Tenants' Namespaces, labelled with their Pod Security level, by position.
    let mut labelled: Vec<(usize, Arc<Resource>)> = Vec::new();
    for (i, (resource, &p)) in resources.iter().zip(&resource_workloads).enumerate() {
        match tenant_of(p) {
            _ if p == TENANCY_POSITION => {}
            Some(t) if resource.key.group().is_empty() && resource.key.kind() == "Namespace" => {
                let namespace = labelled_namespace(resource, fleet.tenants[t].pod_security);
                if !Arc::ptr_eq(&namespace, resource) {
                    labelled.push((i, namespace));
                }
            }
            Some(t) if !resource.key.namespace().is_empty() => {
                namespaces.insert((t, resource.key.namespace()));
            }
            // One its rules refuse is an error of its own (see `check_cluster`).
            Some(t) if refusal(&fleet.tenants[t], &resource.key).is_none() => {
                cluster_scoped.entry(t).or_insert(&resource.key);
            }
            _ => {}
        }
    }
    let mut added: Vec<Arc<Resource>> = Vec::new();
    if !namespaces.is_empty() || !cluster_scoped.is_empty() {
        added = made.of_namespaces(fleet, &namespaces).to_vec();
        let mut errors = Vec::new();
        for (&t, first) in &cluster_scoped {
            let tenant = &fleet.tenants[t];
            // `namespaces` is sorted: the tenant's first namespace on the cluster.
            let Some(&(_, namespace)) = namespaces.range((t, "")..).find(|(of, _)| *of == t) else {
                errors.push(
                    Diagnostic::error(format!(
                        "tenant {:?}: it ships {first} on cluster {:?} but nothing in any of its namespaces there, so it has no ServiceAccount on the cluster to apply its cluster-scoped objects as (spec.namespaces of {}: {}): ship them beside a namespaced object of the tenant's, or in a workload of the platform's",
                        tenant.name,
                        cluster.name,
                        tenant.file,
                        shown_list(&tenant.namespaces)
                    ))
                    .in_file(&tenant.file)
                    .for_cluster(&cluster.name),
                );
                continue;
            };
            match made.cluster_role(fleet, t, &resources) {
                Ok(role) => {
                    added.push(role);
                    added.push(Arc::new(cluster_role_binding(&tenant.name, namespace)));
                }
                Err(unknown) => errors.extend(
                    unknown
                        .into_iter()
                        .map(|error| error.for_cluster(&cluster.name)),
                ),
            }
        }
        if !errors.is_empty() {
            return Err(errors);
        }
        if added.len() > 2 * namespaces.len() {
            // The cluster roles and their bindings, after the namespaces' sorted objects.
            added.sort_by(|a, b| a.key.cmp(&b.key));
        }
    }
    // The resources' own, kept where they are: tenants' Namespaces labelled, what a
    // previous render added dropped.
    let (mut kept, mut kept_workloads) = (resources, resource_workloads);
    for (i, namespace) in labelled {
        kept[i] = namespace;
    }
    if kept_workloads.contains(&TENANCY_POSITION) {
        let mut positions = kept_workloads.iter();
        kept.retain(|_| positions.next() != Some(&TENANCY_POSITION));
        kept_workloads.retain(|&p| p != TENANCY_POSITION);
    }
    if added.is_empty() {
        return Ok((kept, kept_workloads));
    }
    merge_added(fleet, cluster, targeted, (kept, kept_workloads), added)
}

/// `added`, sorted, merged into the sorted `kept` lists: each added object is
/// placed after the kept ones that sort before it, found by galloping from where
/// the one before it went (the objects flotilla adds fall in a few runs: one per
/// kind), and the kept ones between moved at once. An object of the bundle with
/// the identity of one added is an error.
fn merge_added(
    fleet: &Fleet,
    cluster: &Cluster,
    targeted: &[usize],
    (kept, kept_workloads): BundleLists,
    added: Vec<Arc<Resource>>,
) -> Result<BundleLists, Vec<Diagnostic>> {
    // Where each added object goes (its place among the kept ones), and whether a
    // kept one there has its identity.
    let mut places = Vec::with_capacity(added.len());
    let mut errors = Vec::new();
    let mut from = 0;
    for object in &added {
        let at = from + gallop(&kept[from..], |r| r.key.cmp(&object.key).is_lt());
        from = at;
        let taken = kept.get(at).is_some_and(|same| same.key == object.key);
        if taken {
            let owner = targeted
                .get(kept_workloads[at] as usize)
                .map_or("?", |&w| fleet.workloads[w].name.as_str());
            errors.push(
                Diagnostic::error(format!(
                    "{} (workload {owner}) has the identity of the object flotilla adds for a tenant: the names flotilla-tenant-<tenant> of ServiceAccounts, RoleBindings, ClusterRoles and ClusterRoleBindings are reserved (docs/tenants.md)",
                    object.key
                ))
                .in_file(&cluster.file)
                .for_cluster(&cluster.name)
                .for_workload(owner),
            );
        }
        places.push(at);
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    // The kept resources moved, not cloned, in runs between the added ones.
    let mut resources = Vec::with_capacity(kept.len() + added.len());
    let mut workloads = Vec::with_capacity(kept.len() + added.len());
    let mut rest = kept.into_iter();
    let mut from = 0;
    for (object, at) in added.into_iter().zip(places) {
        resources.extend(rest.by_ref().take(at - from));
        workloads.extend_from_slice(&kept_workloads[from..at]);
        from = at;
        resources.push(object);
        workloads.push(TENANCY_POSITION);
    }
    resources.extend(rest);
    workloads.extend_from_slice(&kept_workloads[from..]);
    Ok((resources, workloads))
}

/// How many of `sorted` (in order, then not, as `before` says) come first: looked
/// at 1, 2, 4 … places on, then halved, so a short answer costs a comparison or two.
fn gallop<T>(sorted: &[T], before: impl Fn(&T) -> bool) -> usize {
    let mut bound = 1;
    while bound <= sorted.len() && before(&sorted[bound - 1]) {
        bound *= 2;
    }
    let low = bound / 2;
    let high = bound.min(sorted.len() + 1) - 1;
    low + sorted[low..high].partition_point(|item| before(item))
}

/// The objects [`with_platform_objects`] adds for each tenant and namespace, made
/// once per render for the namespaces of the tenants' shared units of work and
/// shared by every bundle that has them (40 of them on each of 10,000 clusters for
/// a fleet of 4 tenants with 5 namespaces each).
#[derive(Default)]
pub(crate) struct PlatformObjects {
    /// Per tenant, per namespace, its ServiceAccount and RoleBinding.
    made: Vec<HashMap<String, [Arc<Resource>; 2]>>,
    /// The plural names of the kinds the fleet's CRDs define.
    crds: CrdPlurals,
    /// Per tenant with `spec.clusterScoped`, its ClusterRole as the fleet's CRDs
    /// resolve it (or the errors of the kinds they do not).
    cluster_roles: Vec<Option<Result<Arc<Resource>, Vec<Diagnostic>>>>,
    /// The objects of each set of (tenant, namespace) clusters have, sorted by
    /// identity: clusters that share their workloads share the set.
    sorted: std::sync::Mutex<HashMap<Vec<(usize, String)>, SortedObjects>>,
}

/// The objects flotilla adds for a set of tenants' namespaces, sorted by identity.
type SortedObjects = Arc<[Arc<Resource>]>;

impl PlatformObjects {
    /// The objects of each (tenant, namespace) among `namespaces`, and each tenant's
    /// ClusterRole, its kinds resolved with the fleet's CRDs `crds`.
    pub(crate) fn new<'a>(
        fleet: &Fleet,
        namespaces: impl IntoIterator<Item = (usize, &'a str)>,
        crds: CrdPlurals,
    ) -> PlatformObjects {
        let mut made: Vec<HashMap<String, [Arc<Resource>; 2]>> =
            vec![HashMap::new(); fleet.tenants.len()];
        for (t, namespace) in namespaces {
            if let Some(of_tenant) = made.get_mut(t)
                && !of_tenant.contains_key(namespace)
            {
                let objects = tenant_objects(&fleet.tenants[t].name, namespace).map(Arc::new);
                of_tenant.insert(namespace.to_string(), objects);
            }
        }
        let cluster_roles = fleet
            .tenants
            .iter()
            .map(|tenant| {
                (!tenant.cluster_scoped.is_empty())
                    .then(|| tenant_cluster_role(tenant, &crds).map(Arc::new))
            })
            .collect();
        PlatformObjects {
            made,
            crds,
            cluster_roles,
            sorted: std::sync::Mutex::default(),
        }
    }

    /// The objects of every (tenant, namespace) of `namespaces`, sorted by identity:
    /// worked out once for each set, which the clusters that share their workloads
    /// share.
    fn of_namespaces(&self, fleet: &Fleet, namespaces: &BTreeSet<(usize, &str)>) -> SortedObjects {
        let set: Vec<(usize, String)> = namespaces
            .iter()
            .map(|&(t, namespace)| (t, namespace.to_string()))
            .collect();
        let lock = || self.sorted.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(found) = lock().get(&set) {
            return found.clone();
        }
        let mut objects: Vec<Arc<Resource>> = namespaces
            .iter()
            .flat_map(|&(t, namespace)| self.of(fleet, t, namespace))
            .collect();
        objects.sort_by(|a, b| a.key.cmp(&b.key));
        let objects: SortedObjects = objects.into();
        lock().entry(set).or_insert(objects).clone()
    }

    /// The ClusterRole of tenant `t`: the one made for the render, or, if a kind of
    /// its `spec.clusterScoped` was unknown to it (or none was made), made again with
    /// the CRDs among the cluster's `resources` too.
    fn cluster_role(
        &self,
        fleet: &Fleet,
        t: usize,
        resources: &[Arc<Resource>],
    ) -> Result<Arc<Resource>, Vec<Diagnostic>> {
        if let Some(Some(Ok(role))) = self.cluster_roles.get(t) {
            return Ok(role.clone());
        }
        let mut crds = self.crds.clone();
        crds.extend(
            resources
                .iter()
                .filter(|r| r.key.kind() == "CustomResourceDefinition")
                .filter_map(|r| crd_plural(&r.value())),
        );
        tenant_cluster_role(&fleet.tenants[t], &crds).map(Arc::new)
    }

    /// The objects of tenant `t` in `namespace`: the shared ones, or made now.
    fn of(&self, fleet: &Fleet, t: usize, namespace: &str) -> [Arc<Resource>; 2] {
        match self.made.get(t).and_then(|m| m.get(namespace)) {
            Some(objects) => objects.clone(),
            None => tenant_objects(&fleet.tenants[t].name, namespace).map(Arc::new),
        }
    }
}

/// A tenant's `Namespace` object with the label of its Pod Security level, which
/// replaces any the tenant set itself: the level is the platform's to choose.
fn labelled_namespace(resource: &Arc<Resource>, level: PodSecurityLevel) -> Arc<Resource> {
    let mut value = resource.value();
    let Some(metadata) = value.get_mut("metadata").and_then(Value::as_object_mut) else {
        return resource.clone();
    };
    let labels = metadata
        .entry("labels")
        .or_insert_with(|| Value::Object(serde_json::Map::new()));
    if !labels.is_object() {
        *labels = Value::Object(serde_json::Map::new());
    }
    if let Some(labels) = labels.as_object_mut() {
        if labels.get(POD_SECURITY_LABEL).and_then(Value::as_str) == Some(level.as_str()) {
            return resource.clone();
        }
        labels.insert(
            POD_SECURITY_LABEL.into(),
            Value::String(level.as_str().into()),
        );
    }
    Arc::new(Resource::new((*resource.key).clone(), &value))
}

/// The ServiceAccount of tenant `tenant` in `namespace` and its RoleBinding to the
/// ClusterRole `flotilla-tenant`.
fn tenant_objects(tenant: &str, namespace: &str) -> [Resource; 2] {
    let name = tenant_service_account(tenant);
    let metadata = json!({
        "name": name,
        "namespace": namespace,
        "labels": {"flotilla.dev/tenant": tenant},
    });
    let account = json!({
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": metadata,
    });
    let binding = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": metadata,
        "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": TENANT_CLUSTER_ROLE},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
    });
    let key = |group: &str, kind: &str| ResourceKey::new(group, kind, namespace, &name);
    [
        Resource::new(key("", "ServiceAccount"), &account),
        Resource::new(key(RBAC, "RoleBinding"), &binding),
    ]
}

/// The ClusterRole `flotilla-tenant-<tenant>` of a tenant that ships cluster-scoped
/// objects: the verbs [`TENANT_VERBS`] on exactly the kinds of its `spec.clusterScoped`
/// (one rule per API group, resources sorted), each resolved to its resource name by
/// the built-in kinds or the fleet's CRDs `crds`; `Namespace` is left out (the
/// tenant's namespaces are applied as the agent, which labels them). A kind whose
/// resource name cannot be known is an error at its line of the Tenant file.
fn tenant_cluster_role(tenant: &Tenant, crds: &CrdPlurals) -> Result<Resource, Vec<Diagnostic>> {
    let mut granted: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    let mut errors = Vec::new();
    for allowed in &tenant.cluster_scoped {
        let entry = allowed.value.as_str();
        if names_kind(entry, "", "Namespace") {
            continue;
        }
        let built_in = BUILT_IN_CLUSTER_SCOPED
            .iter()
            .filter(|(group, kind, _)| names_kind(entry, group, kind))
            .map(|(group, _, plural)| (*group, *plural));
        let custom = crds
            .iter()
            .filter(|((group, kind), _)| names_kind(entry, group, kind))
            .map(|((group, _), plural)| (group.as_str(), plural.as_str()));
        let mut found = false;
        for (group, plural) in built_in.chain(custom) {
            granted.entry(group).or_default().insert(plural);
            found = true;
        }
        if !found {
            errors.push(
                Diagnostic::error(format!(
                    "tenant {:?}: cannot know the resource name of {entry} (spec.clusterScoped of {}): it is neither a built-in Kubernetes kind nor one a CustomResourceDefinition of the fleet defines, so the ClusterRole {} flotilla adds for the tenant's cluster-scoped objects cannot grant it; write it as Kind.group of a CRD the fleet ships",
                    tenant.name,
                    tenant.file,
                    tenant_service_account(&tenant.name)
                ))
                .in_file(&tenant.file)
                .at_line(Some(allowed.referenced.line())),
            );
        }
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    let name = tenant_service_account(&tenant.name);
    let rules: Vec<Value> = granted
        .iter()
        .map(|(group, plurals)| {
            json!({"apiGroups": [group], "resources": plurals, "verbs": TENANT_VERBS})
        })
        .collect();
    let value = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": name, "labels": {"flotilla.dev/tenant": tenant.name}},
        "rules": rules,
    });
    let key = ResourceKey::new(RBAC, "ClusterRole", "", name);
    Ok(Resource::new(key, &value))
}

/// The ClusterRoleBinding of tenant `tenant`'s ClusterRole to its ServiceAccount in
/// `namespace`.
fn cluster_role_binding(tenant: &str, namespace: &str) -> Resource {
    let name = tenant_service_account(tenant);
    let value = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name, "labels": {"flotilla.dev/tenant": tenant}},
        "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
    });
    let key = ResourceKey::new(RBAC, "ClusterRoleBinding", "", name);
    Resource::new(key, &value)
}

#[cfg(test)]
mod tests {
    use super::gallop;

    #[test]
    fn galloping_finds_where_binary_search_does() {
        for len in 0..40usize {
            let sorted: Vec<usize> = (0..len).map(|i| i * 2).collect();
            for x in 0..=2 * len + 1 {
                assert_eq!(
                    gallop(&sorted, |&v| v < x),
                    sorted.partition_point(|&v| v < x),
                    "{x} in {len}"
                );
            }
        }
    }
}
