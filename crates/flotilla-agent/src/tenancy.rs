//! Tenant rules checked at the edge, before a bundle is applied.
//!
//! The bundle's `meta.tenants` says which workloads belong to which tenant and where
//! their resources may go; a bundle that puts a tenant's resource outside them is
//! refused whole (the last-known-good bundle stays) and the refusal reported. That
//! guards against a hub that renders without the rule, or a mirror that was
//! tampered with. It cannot guard against a hub (or signing key) that is itself
//! compromised, since that hub writes the marks: for that the agent takes its rules
//! from a local policy file (`--tenant-policy`), which then replaces the bundle's
//! marks and can also name the platform's own workloads, so that a resource
//! attributed to any other workload is refused too.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use flotilla_core::bundle::{
    BUILT_IN_CLUSTER_SCOPED, Bundle, Resource, TENANCY_WORKLOAD, TENANT_CLUSTER_ROLE, TENANT_VERBS,
    TenantMark, TenantRules, is_built_in_group, is_tenancy_object, names_kind,
    tenant_service_account,
};
use flotilla_core::names::glob_matches;
use flotilla_core::signing::PublicKey;
use serde_json::Value;

/// `--tenant-policy FILE`: the tenant rules the agent enforces instead of the marks
/// a bundle carries.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TenantPolicy {
    /// Always `flotilla.dev/v1alpha1`.
    pub api_version: String,
    /// Always `TenantPolicy`.
    pub kind: String,
    /// The workloads (names or globs) that are the platform's own, without limits.
    /// When given, a resource of a workload that is neither the platform's nor a
    /// tenant's is refused.
    #[serde(default)]
    pub platform_workloads: Option<Vec<String>>,
    /// Each tenant's rules; `workloads` are names or globs here.
    #[serde(default)]
    pub tenants: BTreeMap<String, TenantMark>,
}

impl TenantPolicy {
    /// Reads and checks a policy file.
    pub fn read(path: &Path) -> Result<TenantPolicy, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|err| format!("cannot read {}: {err}", path.display()))?;
        let policy: TenantPolicy = serde_saphyr::from_str(&text)
            .map_err(|err| format!("{}: not a TenantPolicy: {err}", path.display()))?;
        if policy.api_version != flotilla_core::bundle::API_VERSION || policy.kind != "TenantPolicy"
        {
            return Err(format!(
                "{}: expected apiVersion {} and kind TenantPolicy, found {} and {}",
                path.display(),
                flotilla_core::bundle::API_VERSION,
                policy.api_version,
                policy.kind
            ));
        }
        for (name, tenant) in &policy.tenants {
            if tenant.namespaces.is_empty() {
                return Err(format!(
                    "{}: tenant {name:?} has no namespaces",
                    path.display()
                ));
            }
        }
        Ok(policy)
    }

    /// The rules the platform signed, as a policy.
    pub fn from_rules(rules: &TenantRules) -> TenantPolicy {
        TenantPolicy {
            api_version: flotilla_core::bundle::API_VERSION.to_string(),
            kind: "TenantPolicy".to_string(),
            platform_workloads: rules.platform_workloads.clone(),
            tenants: rules.tenants.clone(),
        }
    }

    fn tenant_of(&self, workload: &str) -> Option<(&str, &TenantMark)> {
        self.tenants
            .iter()
            .find(|(_, t)| t.workloads.iter().any(|w| glob_matches(w, workload)))
            .map(|(name, mark)| (name.as_str(), mark))
    }

    fn is_platforms(&self, workload: &str) -> bool {
        self.platform_workloads
            .as_ref()
            .is_none_or(|names| names.iter().any(|w| glob_matches(w, workload)))
    }
}

/// `--tenant-key`: the tenant rules a bundle carries signed by the platform's key
/// (`meta.tenantRules`), as a policy; why not, when they are missing or the
/// signature does not verify with `key`.
pub fn signed_policy(bundle: &Bundle, key: &PublicKey) -> Result<TenantPolicy, String> {
    let Some(signed) = bundle.meta.as_ref().and_then(|m| m.tenant_rules.as_ref()) else {
        return Err(format!(
            "it carries no tenant rules signed by the platform key {} (--tenant-key): sign them with `flotilla key sign-tenants` and commit tenants/rules.signed.json",
            key.key_id()
        ));
    };
    if signed.key_id != key.key_id()
        || !key.verifies_tenant_rules(&signed.rules.canonical(), &signed.sig)
    {
        return Err(format!(
            "its tenant rules are not signed by the platform key {} (--tenant-key), or were changed after signing",
            key.key_id()
        ));
    }
    Ok(TenantPolicy::from_rules(&signed.rules))
}

/// Why a bundle breaks its tenants' rules (the first resource that does), if it
/// does: by `policy` when given, else by the bundle's own `meta.tenants`.
pub fn refusal(bundle: &Bundle, policy: Option<&TenantPolicy>) -> Option<String> {
    let meta = bundle.meta.as_ref();
    if policy.is_none() && meta.is_none_or(|m| m.tenants.is_empty()) {
        return None;
    }
    for (index, resource) in bundle.resources.iter().enumerate() {
        let workload = meta
            .and_then(|m| m.workloads.get(index))
            .map_or("", String::as_str);
        if workload == TENANCY_WORKLOAD {
            let tenants = match policy {
                Some(policy) => Some(&policy.tenants),
                None => meta.map(|m| &m.tenants),
            };
            if let Some(why) = tenancy_refusal(bundle, resource, tenants) {
                return Some(format!(
                    "{} (workload {TENANCY_WORKLOAD:?}) is not what flotilla makes for a tenant: {why}",
                    resource.key
                ));
            }
            continue;
        }
        let tenant = match policy {
            Some(policy) => match policy.tenant_of(workload) {
                Some(tenant) => Some(tenant),
                None if policy.is_platforms(workload) => None,
                None => {
                    return Some(format!(
                        "{} comes from workload {workload:?}, which the tenant policy names neither a tenant's nor the platform's",
                        resource.key
                    ));
                }
            },
            None => meta.and_then(|m| m.tenant_of(workload)),
        };
        if let Some((name, mark)) = tenant
            && let Some(why) = mark.refusal(&resource.key)
        {
            return Some(format!(
                "{} of tenant {name:?} (workload {workload:?}) breaks the tenant's rules: {why}",
                resource.key
            ));
        }
    }
    None
}

/// Why a resource of the reserved workload `flotilla-tenancy` is not one of the
/// objects the render makes for a tenant: the ServiceAccount `flotilla-tenant-<tenant>`
/// or its RoleBinding to the ClusterRole `flotilla-tenant`, in one of that tenant's
/// namespaces; or, for a tenant that may write cluster-scoped kinds, the ClusterRole
/// `flotilla-tenant-<tenant>` on those kinds only and its ClusterRoleBinding to the
/// tenant's ServiceAccount in the first namespace the bundle gives it one in. So the
/// name cannot carry anything else past the tenant rules (with a tenant policy, not
/// even from a compromised hub).
fn tenancy_refusal(
    bundle: &Bundle,
    resource: &Resource,
    tenants: Option<&BTreeMap<String, TenantMark>>,
) -> Option<String> {
    let key = &resource.key;
    if !is_tenancy_object(key) {
        return Some(
            "only ServiceAccounts, RoleBindings, ClusterRoles and ClusterRoleBindings named flotilla-tenant-<tenant> are".into(),
        );
    }
    let tenant = key
        .name()
        .strip_prefix("flotilla-tenant-")
        .unwrap_or_default();
    let Some(mark) = tenants.and_then(|t| t.get(tenant)) else {
        return Some(format!("there is no tenant {tenant:?}"));
    };
    match key.kind() {
        "ClusterRole" => return cluster_role_refusal(bundle, &resource.value(), tenant, mark),
        "ClusterRoleBinding" => {
            let value = resource.value();
            let namespace = cluster_binding_namespace(bundle, tenant);
            let expected_subjects = serde_json::json!([{
                "kind": "ServiceAccount",
                "name": key.name(),
                "namespace": namespace,
            }]);
            let role = &value["roleRef"];
            if namespace.is_none()
                || role["apiGroup"] != "rbac.authorization.k8s.io"
                || role["kind"] != "ClusterRole"
                || role["name"] != key.name()
                || value["subjects"] != expected_subjects
            {
                return Some(format!(
                    "a ClusterRoleBinding binds the ClusterRole {0} to the tenant's ServiceAccount {0} in the first namespace the bundle gives it one in ({1}) and nothing else",
                    key.name(),
                    namespace.unwrap_or("none")
                ));
            }
            return None;
        }
        _ => {}
    }
    if !mark
        .namespaces
        .iter()
        .any(|n| glob_matches(n, key.namespace()))
    {
        return Some(format!(
            "namespace {:?} is not tenant {tenant:?}'s",
            key.namespace()
        ));
    }
    if key.kind() == "RoleBinding" {
        let value = resource.value();
        let expected_subjects = serde_json::json!([{
            "kind": "ServiceAccount",
            "name": key.name(),
            "namespace": key.namespace(),
        }]);
        let role = &value["roleRef"];
        if role["kind"] != "ClusterRole"
            || role["name"] != TENANT_CLUSTER_ROLE
            || value["subjects"] != expected_subjects
        {
            return Some(format!(
                "a RoleBinding binds the ClusterRole {TENANT_CLUSTER_ROLE} to the tenant's ServiceAccount {} and nothing else",
                key.name()
            ));
        }
    }
    None
}

/// The namespace of the ServiceAccount a tenant's cluster-scoped objects are applied
/// as: the first (by name) of those the bundle's `flotilla-tenancy` objects give the
/// tenant a ServiceAccount in, as the render chooses it.
pub(crate) fn cluster_binding_namespace<'b>(bundle: &'b Bundle, tenant: &str) -> Option<&'b str> {
    let meta = bundle.meta.as_deref()?;
    let name = tenant_service_account(tenant);
    bundle
        .resources
        .iter()
        .zip(&meta.workloads)
        .filter(|(r, workload)| {
            *workload == TENANCY_WORKLOAD
                && r.key.group().is_empty()
                && r.key.kind() == "ServiceAccount"
                && r.key.name() == name
        })
        .map(|(r, _)| r.key.namespace())
        .min()
}

/// Why a tenant's ClusterRole is not the one the render makes: only `rules` (no
/// aggregation), each one API group, the verbs [`TENANT_VERBS`] and resources of the
/// kinds `clusterScoped` allows, `Namespace` aside. A built-in kind's resource is
/// known; a custom kind's is its CRD's when the bundle ships one, else any plain
/// resource name of a group that is not Kubernetes' own and that the allowed kind
/// may be in (the agent cannot know a CRD's plural it does not see).
fn cluster_role_refusal(
    bundle: &Bundle,
    value: &Value,
    tenant: &str,
    mark: &TenantMark,
) -> Option<String> {
    let shape = format!(
        "a ClusterRole grants {} on the kinds tenant {tenant:?} may write cluster-wide ({}) and nothing else",
        TENANT_VERBS.join(", "),
        if mark.cluster_scoped.is_empty() {
            "none".to_string()
        } else {
            mark.cluster_scoped.join(", ")
        }
    );
    let only_rules = value.as_object().is_some_and(|object| {
        object
            .keys()
            .all(|k| matches!(k.as_str(), "apiVersion" | "kind" | "metadata" | "rules"))
    });
    let Some(rules) = value["rules"].as_array().filter(|_| only_rules) else {
        return Some(shape);
    };
    let crds: Vec<(String, String, String)> = bundle
        .resources
        .iter()
        .filter(|r| r.key.kind() == "CustomResourceDefinition")
        .filter_map(|r| {
            let value = r.value();
            let spec = &value["spec"];
            Some((
                spec["group"].as_str()?.to_string(),
                spec["names"]["kind"].as_str()?.to_string(),
                spec["names"]["plural"].as_str()?.to_string(),
            ))
        })
        .collect();
    let allowed = |group: &str, kind: &str| {
        kind != "Namespace"
            && mark
                .cluster_scoped
                .iter()
                .any(|e| names_kind(e, group, kind))
    };
    let grants = |group: &str, resource: &str| {
        if let Some((_, kind, _)) = BUILT_IN_CLUSTER_SCOPED
            .iter()
            .find(|(g, _, plural)| *g == group && *plural == resource)
        {
            return allowed(group, kind);
        }
        if is_built_in_group(group) {
            return false;
        }
        if let Some((_, kind, _)) = crds
            .iter()
            .find(|(g, _, plural)| g == group && plural == resource)
        {
            return allowed(group, kind);
        }
        let plain = !resource.is_empty()
            && resource
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.');
        plain
            && mark.cluster_scoped.iter().any(|e| match e.split_once('.') {
                Some((_, g)) => g == group,
                None => e != "Namespace",
            })
    };
    let verbs: Vec<Value> = TENANT_VERBS.iter().map(|v| Value::from(*v)).collect();
    for rule in rules {
        let keys_ok = rule.as_object().is_some_and(|object| {
            object.len() == 3
                && object.contains_key("apiGroups")
                && object.contains_key("resources")
                && object.contains_key("verbs")
        });
        let group = match rule["apiGroups"].as_array().map(Vec::as_slice) {
            Some([group]) => group.as_str(),
            _ => None,
        };
        let resources = rule["resources"].as_array().filter(|r| !r.is_empty());
        let (true, Some(group), Some(resources)) = (keys_ok, group, resources) else {
            return Some(shape);
        };
        if rule["verbs"].as_array() != Some(&verbs)
            || !resources
                .iter()
                .all(|r| r.as_str().is_some_and(|r| grants(group, r)))
        {
            return Some(shape);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use flotilla_core::bundle::{BundleMeta, Resource, ResourceKey};
    use serde_json::json;

    use super::*;

    fn resource(kind: &str, namespace: &str, name: &str) -> Arc<Resource> {
        let mut value = json!({"apiVersion": "v1", "kind": kind, "metadata": {"name": name}});
        if !namespace.is_empty() {
            value["metadata"]["namespace"] = json!(namespace);
        }
        Arc::new(Resource::new(ResourceKey::of(&value).expect("key"), &value))
    }

    fn mark(workloads: &[&str], namespaces: &[&str]) -> TenantMark {
        TenantMark {
            workloads: workloads.iter().map(|w| w.to_string()).collect(),
            namespaces: namespaces.iter().map(|n| n.to_string()).collect(),
            cluster_scoped: Vec::new(),
        }
    }

    /// team-a's `shop` writes `namespace`; the platform's `agent` writes kube-system.
    fn bundle(namespace: &str) -> Bundle {
        let resources = vec![
            resource("ConfigMap", "kube-system", "agent"),
            resource("ConfigMap", namespace, "shop"),
        ];
        let meta = BundleMeta {
            workloads: vec!["agent".into(), "shop".into()],
            tenants: [("team-a".to_string(), mark(&["shop"], &["team-a-*"]))].into(),
            ..BundleMeta::default()
        };
        Bundle::from_sorted_with_meta("c", resources, Some(meta))
    }

    #[test]
    fn a_tenants_resource_outside_its_namespaces_is_refused() {
        assert_eq!(refusal(&bundle("team-a-shop"), None), None);
        assert_eq!(
            refusal(&bundle("kube-system"), None).as_deref(),
            Some(
                "ConfigMap kube-system/shop of tenant \"team-a\" (workload \"shop\") breaks the tenant's rules: namespace \"kube-system\" is not the tenant's"
            )
        );
    }

    /// `--tenant-key`: only rules the platform's key signed count, and a bundle
    /// without them is refused.
    #[test]
    fn signed_rules_are_enforced_and_a_bundle_without_them_is_refused() {
        use flotilla_core::bundle::SignedTenantRules;
        use flotilla_core::signing::SigningKey;
        let platform = SigningKey::from_seed([3; 32]);
        let hub = SigningKey::from_seed([4; 32]);
        let rules = TenantRules {
            platform_workloads: Some(vec!["agent".into()]),
            tenants: [("team-a".to_string(), mark(&["shop"], &["team-a-*"]))].into(),
        };
        let signed_by = |key: &SigningKey, rules: &TenantRules| SignedTenantRules {
            sig: key.sign_tenant_rules(&rules.canonical()),
            key_id: key.key_id().to_string(),
            rules: rules.clone(),
        };
        let with_rules = |namespace: &str, signed: Option<SignedTenantRules>| {
            let mut bundle = bundle(namespace);
            if let Some(meta) = bundle.meta.as_mut().map(Arc::make_mut) {
                // The hub's own marks would allow anything.
                meta.tenants.clear();
                meta.tenant_rules = signed;
            }
            bundle
        };
        let key = platform.public_key();
        let good = with_rules("team-a-x", Some(signed_by(&platform, &rules)));
        let policy = signed_policy(&good, &key).expect("signed by the platform");
        assert_eq!(refusal(&good, Some(&policy)), None);
        let escaping = with_rules("kube-system", Some(signed_by(&platform, &rules)));
        let policy = signed_policy(&escaping, &key).expect("signed by the platform");
        assert!(refusal(&escaping, Some(&policy)).is_some());
        // Rules the hub signed, or widened after signing, or none at all: refused.
        let by_hub = with_rules("kube-system", Some(signed_by(&hub, &rules)));
        assert!(signed_policy(&by_hub, &key).is_err());
        let mut widened = signed_by(&platform, &rules);
        widened
            .rules
            .tenants
            .get_mut("team-a")
            .expect("team-a")
            .namespaces = vec!["*".into()];
        assert!(signed_policy(&with_rules("kube-system", Some(widened)), &key).is_err());
        let stripped = with_rules("team-a-x", None);
        assert!(
            signed_policy(&stripped, &key)
                .expect_err("refused")
                .contains("carries no tenant rules signed by the platform key")
        );
    }

    #[test]
    fn the_tenancy_workload_carries_only_a_tenants_service_account_and_its_binding() {
        let binding = |role: &str, subject: &str| {
            let value = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                "metadata": {"name": "flotilla-tenant-team-a", "namespace": "team-a-x"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                "subjects": [{"kind": "ServiceAccount", "name": subject, "namespace": "team-a-x"}]});
            Arc::new(Resource::new(ResourceKey::of(&value).expect("key"), &value))
        };
        let with = |extra: Vec<Arc<Resource>>| {
            let mut resources = vec![resource("ConfigMap", "team-a-x", "shop")];
            let mut workloads = vec!["shop".to_string()];
            for r in extra {
                resources.push(r);
                workloads.push(TENANCY_WORKLOAD.to_string());
            }
            let mut pairs: Vec<_> = resources.into_iter().zip(workloads).collect();
            pairs.sort_by(|a, b| a.0.key.cmp(&b.0.key));
            let (resources, workloads) = pairs.into_iter().unzip();
            let meta = BundleMeta {
                workloads,
                tenants: [("team-a".to_string(), mark(&["shop"], &["team-a-*"]))].into(),
                ..BundleMeta::default()
            };
            Bundle::from_sorted_with_meta("c", resources, Some(meta))
        };
        let good = with(vec![
            resource("ServiceAccount", "team-a-x", "flotilla-tenant-team-a"),
            binding("flotilla-tenant", "flotilla-tenant-team-a"),
        ]);
        assert_eq!(refusal(&good, None), None);
        let admin = with(vec![binding("cluster-admin", "flotilla-tenant-team-a")]);
        assert!(
            refusal(&admin, None)
                .is_some_and(|why| why.contains("binds the ClusterRole flotilla-tenant")),
        );
        let other = with(vec![binding("flotilla-tenant", "default")]);
        assert!(refusal(&other, None).is_some());
        let elsewhere = with(vec![resource(
            "ServiceAccount",
            "kube-system",
            "flotilla-tenant-team-a",
        )]);
        assert_eq!(
            refusal(&elsewhere, None).as_deref(),
            Some(
                "ServiceAccount kube-system/flotilla-tenant-team-a (workload \"flotilla-tenancy\") is not what flotilla makes for a tenant: namespace \"kube-system\" is not tenant \"team-a\"'s"
            )
        );
        let smuggled = with(vec![resource("ConfigMap", "kube-system", "anything")]);
        assert!(refusal(&smuggled, None).is_some());
    }

    /// team-a may write ClusterRoles and Widgets cluster-wide; its ServiceAccounts
    /// are in team-a-x and team-a-b, so its ClusterRoleBinding names team-a-b's.
    fn with_cluster_objects(role_rules: serde_json::Value, subject_namespace: &str) -> Bundle {
        let rbac = |kind: &str, namespace: &str, rest: serde_json::Value| {
            let mut value = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind,
                "metadata": {"name": "flotilla-tenant-team-a"}});
            if !namespace.is_empty() {
                value["metadata"]["namespace"] = json!(namespace);
            }
            for (k, v) in rest.as_object().into_iter().flatten() {
                value[k] = v.clone();
            }
            Arc::new(Resource::new(ResourceKey::of(&value).expect("key"), &value))
        };
        let tenancy = vec![
            resource("ServiceAccount", "team-a-x", "flotilla-tenant-team-a"),
            resource("ServiceAccount", "team-a-b", "flotilla-tenant-team-a"),
            rbac("ClusterRole", "", json!({"rules": role_rules})),
            rbac(
                "ClusterRoleBinding",
                "",
                json!({"roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "flotilla-tenant-team-a"},
                       "subjects": [{"kind": "ServiceAccount", "name": "flotilla-tenant-team-a", "namespace": subject_namespace}]}),
            ),
        ];
        let mut pairs: Vec<(Arc<Resource>, String)> = vec![
            (
                resource("ConfigMap", "team-a-x", "shop"),
                "shop".to_string(),
            ),
            (
                resource("ConfigMap", "team-a-b", "shop"),
                "shop".to_string(),
            ),
        ];
        pairs.extend(
            tenancy
                .into_iter()
                .map(|r| (r, TENANCY_WORKLOAD.to_string())),
        );
        pairs.sort_by(|a, b| a.0.key.cmp(&b.0.key));
        let (resources, workloads) = pairs.into_iter().unzip();
        let mut team_a = mark(&["shop"], &["team-a-*"]);
        team_a.cluster_scoped = vec![
            "ClusterRole.rbac.authorization.k8s.io".into(),
            "Widget.example.com".into(),
            "Namespace".into(),
        ];
        let meta = BundleMeta {
            workloads,
            tenants: [("team-a".to_string(), team_a)].into(),
            ..BundleMeta::default()
        };
        Bundle::from_sorted_with_meta("c", resources, Some(meta))
    }

    #[test]
    fn a_tenants_cluster_role_grants_only_its_cluster_scoped_kinds_and_binds_its_first_service_account()
     {
        let verbs = json!([
            "get", "list", "watch", "create", "update", "patch", "delete"
        ]);
        let rule = |group: &str, resources: serde_json::Value| json!({"apiGroups": [group], "resources": resources, "verbs": verbs});
        let good = json!([
            rule("example.com", json!(["widgets"])),
            rule("rbac.authorization.k8s.io", json!(["clusterroles"])),
        ]);
        assert_eq!(
            refusal(&with_cluster_objects(good.clone(), "team-a-b"), None),
            None
        );
        assert_eq!(
            refusal(&with_cluster_objects(good, "team-a-x"), None).as_deref(),
            Some(
                "ClusterRoleBinding.rbac.authorization.k8s.io/flotilla-tenant-team-a (workload \"flotilla-tenancy\") is not what flotilla makes for a tenant: a ClusterRoleBinding binds the ClusterRole flotilla-tenant-team-a to the tenant's ServiceAccount flotilla-tenant-team-a in the first namespace the bundle gives it one in (team-a-b) and nothing else"
            )
        );
        let refused = |rules: serde_json::Value| {
            let why = refusal(&with_cluster_objects(rules, "team-a-b"), None);
            assert!(
                why.as_deref().is_some_and(|why| why.contains(
                    "a ClusterRole grants get, list, watch, create, update, patch, delete on the kinds tenant \"team-a\" may write cluster-wide"
                )),
                "{why:?}"
            );
        };
        // A kind it may not write, a built-in resource in the allowed group, a
        // wildcard, Namespaces, another verb, a second group in one rule.
        refused(json!([rule(
            "rbac.authorization.k8s.io",
            json!(["clusterrolebindings"])
        )]));
        refused(json!([rule("rbac.authorization.k8s.io", json!(["*"]))]));
        refused(json!([rule("example.com", json!(["*"]))]));
        refused(json!([rule("", json!(["namespaces"]))]));
        refused(json!([rule("apps", json!(["deployments"]))]));
        refused(json!([{"apiGroups": ["example.com"], "resources": ["widgets"], "verbs": ["*"]}]));
        refused(
            json!([{"apiGroups": ["example.com", "rbac.authorization.k8s.io"], "resources": ["widgets"], "verbs": verbs}]),
        );
        refused(
            json!([{"apiGroups": ["example.com"], "resources": ["widgets"], "verbs": verbs, "resourceNames": ["a"]}]),
        );
        // Nor may it aggregate other roles' rules.
        let mut aggregating = with_cluster_objects(json!([]), "team-a-b");
        let index = aggregating
            .resources
            .iter()
            .position(|r| r.key.kind() == "ClusterRole")
            .expect("role");
        let mut value = aggregating.resources[index].value();
        value["aggregationRule"] =
            json!({"clusterRoleSelectors": [{"matchLabels": {"any": "thing"}}]});
        aggregating.resources[index] = Arc::new(Resource::new(
            (*aggregating.resources[index].key).clone(),
            &value,
        ));
        assert!(refusal(&aggregating, None).is_some());
    }

    #[test]
    fn a_local_policy_replaces_the_marks_the_bundle_carries() {
        // A hub that widened team-a's namespaces in the marks is not believed.
        let mut widened = bundle("kube-system");
        if let Some(meta) = widened.meta.as_mut().map(Arc::make_mut) {
            meta.tenants.get_mut("team-a").expect("team-a").namespaces = vec!["*".into()];
        }
        assert_eq!(refusal(&widened, None), None);
        let policy = TenantPolicy {
            api_version: "flotilla.dev/v1alpha1".into(),
            kind: "TenantPolicy".into(),
            platform_workloads: Some(vec!["agent".into()]),
            tenants: [("team-a".to_string(), mark(&["shop*"], &["team-a-*"]))].into(),
        };
        assert!(refusal(&widened, Some(&policy)).is_some());
        assert_eq!(refusal(&bundle("team-a-x"), Some(&policy)), None);
        // A hub that strips the marks, or calls the resource another workload's,
        // gains nothing either.
        let mut stripped = bundle("kube-system");
        if let Some(meta) = stripped.meta.as_mut().map(Arc::make_mut) {
            meta.tenants.clear();
            meta.workloads[1] = "sneaky".into();
        }
        assert_eq!(
            refusal(&stripped, Some(&policy)).as_deref(),
            Some(
                "ConfigMap kube-system/shop comes from workload \"sneaky\", which the tenant policy names neither a tenant's nor the platform's"
            )
        );
    }
}
