//! `--impersonate-tenants` against the fake API server, authorizing with the RBAC of
//! `deploy/agent.yaml`: a tenant's namespaced objects are applied and pruned as the
//! tenant's ServiceAccount, which the bundle binds to the ClusterRole
//! `flotilla-tenant`; the platform's objects (and those bindings) as the agent.

use crate::support as agent_support;

use std::path::PathBuf;

use agent_support::kube::*;
use flotilla_agent::sink::Sink;
use flotilla_agent::sink::kube::KubeOptions;
use flotilla_core::status::ResourceState;
use flotilla_kube_fake::{DEFAULT_USER, FakeApiServer};
use serde_json::Value;

const TENANT_USER: &str = "system:serviceaccount:shop:flotilla-tenant-shop";

/// The ClusterRoles of `deploy/agent.yaml`, by name.
fn shipped_role(name: &str) -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy/agent.yaml");
    let text = std::fs::read_to_string(&path).expect("reads deploy/agent.yaml");
    let documents: Vec<Value> = serde_saphyr::from_multiple(&text).expect("YAML");
    documents
        .into_iter()
        .find(|d| d["kind"] == "ClusterRole" && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no ClusterRole {name} in deploy/agent.yaml"))
}

/// A fake that authorizes the agent with its shipped ClusterRole (`agent_rules`
/// replaces its rules when given), with the ClusterRole `flotilla-tenant` installed.
fn cluster(agent_rules: Option<Value>) -> FakeApiServer {
    let rules = agent_rules.unwrap_or_else(|| shipped_role("flotilla-agent")["rules"].clone());
    let fake = FakeApiServer::new().with_rules(&rules);
    fake.insert(shipped_role("flotilla-tenant"), "kubectl");
    fake
}

fn impersonating() -> KubeOptions {
    KubeOptions {
        impersonate_tenants: true,
        ..options()
    }
}

/// Who was authorized for `verb` on `resource` `name`, in order.
fn callers(fake: &FakeApiServer, verb: &str, resource: &str, name: &str) -> Vec<(String, bool)> {
    fake.checks()
        .iter()
        .filter(|c| {
            c.attributes.verb == verb
                && c.attributes.resource == resource
                && c.attributes.name == name
        })
        .map(|c| (c.user.clone(), c.rule.is_some()))
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_tenants_objects_are_applied_and_pruned_as_its_service_account_the_platforms_as_the_agent()
 {
    let fake = cluster(None);
    let mut sink = sink(&fake, impersonating());
    let first = tenant_bundle(true, "1");
    let outcome = sink.apply(&first, &[]).await;
    assert!(outcome.complete, "{outcome:#?}");
    assert_eq!(
        fake.get("v1", "ConfigMap", "shop", "settings")
            .expect("applied")["data"]["k"],
        "1"
    );
    let tenant = (TENANT_USER.to_string(), true);
    let agent = (DEFAULT_USER.to_string(), true);
    assert_eq!(
        callers(&fake, "patch", "configmaps", "settings"),
        std::slice::from_ref(&tenant)
    );
    assert_eq!(
        callers(
            &fake,
            "impersonate",
            "serviceaccounts",
            "flotilla-tenant-shop"
        ),
        std::slice::from_ref(&agent)
    );
    for (resource, name) in [
        ("namespaces", "shop"),
        ("configmaps", "platform"),
        ("serviceaccounts", "flotilla-tenant-shop"),
        ("rolebindings", "flotilla-tenant-shop"),
    ] {
        assert_eq!(
            callers(&fake, "patch", resource, name),
            std::slice::from_ref(&agent),
            "{resource}/{name}"
        );
    }

    // The tenant's object leaves the bundle, and with it the last of its namespace:
    // it is deleted as the tenant, before its ServiceAccount and RoleBinding go.
    let platform_only = agent_support::bundle(
        "edge-tenants",
        vec![
            kube_namespace("shop"),
            kube_config_map(AGENT_NAMESPACE, "platform", "1"),
        ],
    );
    let outcome = sink
        .apply(&platform_only, &prune_list(&first, &platform_only))
        .await;
    assert!(outcome.complete, "{outcome:#?}");
    assert_eq!(outcome.count(ResourceState::Pruned), 3, "{outcome:#?}");
    assert!(fake.get("v1", "ConfigMap", "shop", "settings").is_none());
    let deletes: Vec<(String, String)> = fake
        .checks()
        .iter()
        .filter(|c| c.attributes.verb == "delete")
        .map(|c| (c.user.clone(), c.attributes.resource.clone()))
        .collect();
    assert_eq!(
        deletes,
        [
            (TENANT_USER.to_string(), "configmaps".to_string()),
            (DEFAULT_USER.to_string(), "rolebindings".to_string()),
            (DEFAULT_USER.to_string(), "serviceaccounts".to_string()),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn without_its_role_binding_a_tenants_object_is_refused_by_the_api_server_and_reported() {
    let fake = cluster(None);
    let mut sink = sink(&fake, impersonating());
    let outcome = sink.apply(&tenant_bundle(false, "1"), &[]).await;
    assert!(!outcome.complete, "{outcome:#?}");
    let (state, message) = line(&outcome, "ConfigMap", "settings");
    assert_eq!(state, ResourceState::Failed);
    assert!(
        message.contains(&format!(
            "User \"{TENANT_USER}\" cannot patch resource \"configmaps\""
        )),
        "{message}"
    );
    assert!(fake.get("v1", "ConfigMap", "shop", "settings").is_none());
    // The platform's objects were applied all the same, as the agent.
    assert_eq!(
        line(&outcome, "ConfigMap", "platform").0,
        ResourceState::Applied
    );
    assert_eq!(
        line(&outcome, "Namespace", "shop").0,
        ResourceState::Applied
    );
    assert_eq!(
        outcome
            .resources
            .iter()
            .filter(|r| r.state == ResourceState::Failed)
            .count(),
        1,
        "{outcome:#?}"
    );
}

#[tokio::test(start_paused = true)]
async fn an_agent_without_impersonate_cannot_apply_a_tenants_objects() {
    let mut rules = shipped_role("flotilla-agent")["rules"].clone();
    if let Some(list) = rules.as_array_mut() {
        list.retain(|rule| rule["verbs"] != serde_json::json!(["impersonate"]));
    }
    let fake = cluster(Some(rules));
    let mut sink = sink(&fake, impersonating());
    let outcome = sink.apply(&tenant_bundle(true, "1"), &[]).await;
    let (state, message) = line(&outcome, "ConfigMap", "settings");
    assert_eq!(state, ResourceState::Failed);
    assert!(
        message.contains("cannot impersonate resource \"serviceaccounts\""),
        "{message}"
    );
    assert_eq!(
        line(&outcome, "ServiceAccount", "flotilla-tenant-shop").0,
        ResourceState::Applied
    );
}

#[tokio::test(start_paused = true)]
async fn without_the_flag_every_object_is_applied_as_the_agent() {
    let fake = cluster(None);
    let mut sink = sink(&fake, options());
    let outcome = sink.apply(&tenant_bundle(false, "1"), &[]).await;
    assert!(outcome.complete, "{outcome:#?}");
    assert!(
        fake.checks().iter().all(|c| c.user == DEFAULT_USER),
        "{:#?}",
        fake.checks()
    );
}

/// The tenant `shop` of [`tenant_bundle`], which may also write CRDs and ClusterRoles
/// cluster-wide, shipping one of each beside its ConfigMap, with the ClusterRole and
/// ClusterRoleBinding `flotilla-tenant-shop` the render adds for them (when
/// `cluster_bound`).
fn cluster_scoped_bundle(cluster_bound: bool) -> flotilla_core::bundle::Bundle {
    use flotilla_core::bundle::{BundleMeta, TENANCY_WORKLOAD, TenantMark};
    use serde_json::json;
    let verbs = json!([
        "get", "list", "watch", "create", "update", "patch", "delete"
    ]);
    let mut values = vec![
        ("base", kube_namespace("shop")),
        ("base", kube_config_map(AGENT_NAMESPACE, "platform", "1")),
        ("shop-web", kube_config_map("shop", "settings", "1")),
        (
            "shop-web",
            crd(
                "example.com",
                "Widget",
                "widgets",
                json!([served("v1", true)]),
            ),
        ),
        (
            "shop-web",
            object(
                "rbac.authorization.k8s.io/v1",
                "ClusterRole",
                "",
                "shop-reader",
                json!({"rules": []}),
            ),
        ),
        (
            TENANCY_WORKLOAD,
            object(
                "v1",
                "ServiceAccount",
                "shop",
                "flotilla-tenant-shop",
                json!({}),
            ),
        ),
        (
            TENANCY_WORKLOAD,
            object(
                "rbac.authorization.k8s.io/v1",
                "RoleBinding",
                "shop",
                "flotilla-tenant-shop",
                json!({"roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "flotilla-tenant"},
                       "subjects": [{"kind": "ServiceAccount", "name": "flotilla-tenant-shop", "namespace": "shop"}]}),
            ),
        ),
    ];
    if cluster_bound {
        values.push((
            TENANCY_WORKLOAD,
            object(
                "rbac.authorization.k8s.io/v1",
                "ClusterRole",
                "",
                "flotilla-tenant-shop",
                json!({"rules": [
                    {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"], "verbs": verbs},
                    {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"], "verbs": verbs},
                ]}),
            ),
        ));
        values.push((
            TENANCY_WORKLOAD,
            object(
                "rbac.authorization.k8s.io/v1",
                "ClusterRoleBinding",
                "",
                "flotilla-tenant-shop",
                json!({"roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "flotilla-tenant-shop"},
                       "subjects": [{"kind": "ServiceAccount", "name": "flotilla-tenant-shop", "namespace": "shop"}]}),
            ),
        ));
    }
    let meta = BundleMeta {
        tenants: [(
            "shop".to_string(),
            TenantMark {
                workloads: vec!["shop-web".into()],
                namespaces: vec!["shop".into()],
                cluster_scoped: vec![
                    "CustomResourceDefinition.apiextensions.k8s.io".into(),
                    "ClusterRole.rbac.authorization.k8s.io".into(),
                ],
            },
        )]
        .into(),
        ..Default::default()
    };
    bundle_of_workloads("edge-tenants", values, meta)
}

#[tokio::test(start_paused = true)]
async fn a_tenants_cluster_scoped_objects_are_applied_and_pruned_as_its_service_account() {
    let fake = cluster(None);
    let mut sink = sink(&fake, impersonating());
    let first = cluster_scoped_bundle(true);
    let outcome = sink.apply(&first, &[]).await;
    assert!(outcome.complete, "{outcome:#?}");
    let tenant = (TENANT_USER.to_string(), true);
    let agent = (DEFAULT_USER.to_string(), true);
    // The tenant's CRD and ClusterRole, as the tenant: its ClusterRole and binding
    // were applied (by the agent) before them, CRDs included.
    assert_eq!(
        callers(
            &fake,
            "patch",
            "customresourcedefinitions",
            "widgets.example.com"
        ),
        std::slice::from_ref(&tenant)
    );
    assert_eq!(
        callers(&fake, "patch", "clusterroles", "shop-reader"),
        std::slice::from_ref(&tenant)
    );
    // Its Namespace stays the agent's, as do the objects made for the tenant; the
    // agent's ClusterRole escalates (the tenant's role grants list, watch and update,
    // which the agent does not hold) and binds it.
    for (verb, resource, name) in [
        ("patch", "namespaces", "shop"),
        ("patch", "clusterroles", "flotilla-tenant-shop"),
        ("escalate", "clusterroles", "flotilla-tenant-shop"),
        ("patch", "clusterrolebindings", "flotilla-tenant-shop"),
        ("bind", "clusterroles", "flotilla-tenant-shop"),
    ] {
        assert_eq!(
            callers(&fake, verb, resource, name),
            std::slice::from_ref(&agent),
            "{verb} {resource}/{name}"
        );
    }
    let order: Vec<String> = fake
        .checks()
        .iter()
        .filter(|c| {
            c.attributes.verb == "patch" && !c.attributes.name.starts_with("flotilla-inventory")
        })
        .map(|c| format!("{}/{}", c.attributes.resource, c.attributes.name))
        .collect();
    assert_eq!(
        order[..3],
        [
            "clusterroles/flotilla-tenant-shop",
            "clusterrolebindings/flotilla-tenant-shop",
            "customresourcedefinitions/widgets.example.com"
        ],
        "{order:#?}"
    );

    // The drift check reads them as the tenant too.
    let before = fake.checks().len();
    let checked = sink.check_drift(&first).await;
    assert!(
        matches!(
            checked,
            flotilla_agent::sink::drift::DriftCheck::Checked { .. }
        ),
        "{checked:?}"
    );
    let reads: Vec<(String, bool)> = fake.checks()[before..]
        .iter()
        .filter(|c| c.attributes.verb == "get" && c.attributes.name == "shop-reader")
        .map(|c| (c.user.clone(), c.rule.is_some()))
        .collect();
    assert_eq!(reads, std::slice::from_ref(&tenant));

    // The tenant's ClusterRole leaves the bundle, and with it the last of its
    // cluster-scoped objects (the CRD is kept: CRDs are not pruned by default): it
    // is deleted as the tenant, before the ClusterRoleBinding and ClusterRole go.
    let mut values: Vec<(&str, Value)> = Vec::new();
    let meta = first.meta.as_deref().cloned().expect("meta");
    for (resource, workload) in first.resources.iter().zip(&meta.workloads) {
        let key = &resource.key;
        if key.kind().starts_with("Cluster") {
            continue;
        }
        values.push((workload.as_str(), resource.value()));
    }
    let next = bundle_of_workloads(
        "edge-tenants",
        values,
        flotilla_core::bundle::BundleMeta {
            workloads: Vec::new(),
            ..meta.clone()
        },
    );
    fake.clear_exchanges();
    let outcome = sink.apply(&next, &prune_list(&first, &next)).await;
    assert!(outcome.complete, "{outcome:#?}");
    assert!(
        fake.get(
            "rbac.authorization.k8s.io/v1",
            "ClusterRole",
            "",
            "shop-reader"
        )
        .is_none()
    );
    let deletes: Vec<(String, String, String)> = fake
        .checks()
        .iter()
        .filter(|c| c.attributes.verb == "delete")
        .map(|c| {
            (
                c.user.clone(),
                c.attributes.resource.clone(),
                c.attributes.name.clone(),
            )
        })
        .collect();
    let delete = |user: &str, resource: &str, name: &str| {
        (user.to_string(), resource.to_string(), name.to_string())
    };
    assert_eq!(
        deletes,
        [
            delete(TENANT_USER, "clusterroles", "shop-reader"),
            delete(DEFAULT_USER, "clusterrolebindings", "flotilla-tenant-shop"),
            delete(DEFAULT_USER, "clusterroles", "flotilla-tenant-shop"),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn without_its_cluster_role_binding_a_tenants_cluster_scoped_object_is_refused_not_applied_as_the_agent()
 {
    let fake = cluster(None);
    let mut sink = sink(&fake, impersonating());
    let outcome = sink.apply(&cluster_scoped_bundle(false), &[]).await;
    assert!(!outcome.complete, "{outcome:#?}");
    let (state, message) = line(&outcome, "ClusterRole", "shop-reader");
    assert_eq!(state, ResourceState::Failed);
    assert!(
        message.contains(&format!(
            "User \"{TENANT_USER}\" cannot patch resource \"clusterroles\""
        )),
        "{message}"
    );
    assert!(
        fake.get(
            "rbac.authorization.k8s.io/v1",
            "ClusterRole",
            "",
            "shop-reader"
        )
        .is_none()
    );
}

#[tokio::test(start_paused = true)]
async fn an_agent_without_escalate_cannot_write_a_tenants_cluster_role() {
    let mut rules = shipped_role("flotilla-agent")["rules"].clone();
    if let Some(list) = rules.as_array_mut() {
        list.retain(|rule| rule["verbs"] != serde_json::json!(["escalate", "bind"]));
    }
    let fake = cluster(Some(rules));
    let mut sink = sink(&fake, impersonating());
    let outcome = sink.apply(&cluster_scoped_bundle(true), &[]).await;
    assert!(!outcome.complete, "{outcome:#?}");
    let (state, message) = line(&outcome, "ClusterRole", "flotilla-tenant-shop");
    assert_eq!(state, ResourceState::Failed);
    assert!(
        message.contains("is attempting to grant RBAC permissions not currently held"),
        "{message}"
    );
}

/// A tenant's Helm release that leaves the bundle: its delete hooks are applied (and
/// deleted) as the tenant's ServiceAccount, as its other objects were, never as the
/// agent, although the new bundle no longer names the release's tenant.
#[tokio::test(start_paused = true)]
async fn a_leaving_tenant_releases_delete_hooks_run_as_the_tenant() {
    leaving_tenant_release_runs_its_hook_as_the_tenant("pre-delete").await;
}

/// The same with a `post-delete` hook, which runs after the release's objects are
/// deleted: the tenant's ServiceAccount and RoleBinding, which leave with the tenant,
/// are pruned only after it (the hook was refused, the account being gone).
#[tokio::test(start_paused = true)]
async fn a_leaving_tenants_post_delete_hooks_run_before_its_service_account_goes() {
    leaving_tenant_release_runs_its_hook_as_the_tenant("post-delete").await;
}

/// [`tenant_bundle`] with a hook of the tenant's release `shop-web` on `event`: the
/// ConfigMap `farewell` in `namespace`.
fn tenant_release_with_hook(event: &str, namespace: &str) -> flotilla_core::bundle::Bundle {
    use flotilla_core::bundle::{Bundle, HookMark};
    let plain = tenant_bundle(true, "1");
    let mut farewell = kube_config_map(namespace, "farewell", "gone");
    farewell["metadata"]["annotations"] = serde_json::json!({"helm.sh/hook": event});
    let mut meta = plain.meta.as_deref().cloned().expect("meta");
    let mut values: Vec<(String, Value)> = plain
        .resources
        .iter()
        .zip(&meta.workloads)
        .map(|(r, w)| {
            let value: Value = serde_json::from_slice(&r.canonical).expect("JSON");
            (w.clone(), value)
        })
        .collect();
    values.push(("shop-web".into(), farewell));
    meta.workloads.clear();
    let bundle = bundle_of_workloads(
        "edge-tenants",
        values
            .iter()
            .map(|(w, v)| (w.as_str(), v.clone()))
            .collect(),
        meta,
    );
    let mut meta = bundle.meta.as_deref().cloned().expect("meta");
    let index = bundle
        .resources
        .iter()
        .position(|r| r.key.name() == "farewell")
        .expect("the hook");
    meta.hooks.push(HookMark {
        resource: index,
        events: vec![event.into()],
        weight: 0,
        delete_policies: vec!["hook-succeeded".into()],
    });
    Bundle::from_sorted_with_meta("edge-tenants", bundle.resources.clone(), Some(meta))
}

/// What is left when the tenant leaves the cluster: the platform's objects.
fn platform_only() -> flotilla_core::bundle::Bundle {
    agent_support::bundle(
        "edge-tenants",
        vec![
            kube_namespace("shop"),
            kube_config_map(AGENT_NAMESPACE, "platform", "1"),
        ],
    )
}

/// A leaving tenant's release whose object is still being deleted after
/// `--phase-timeout` holds its `post-delete` hook back to the next try, and with it
/// the tenant's ServiceAccount and RoleBinding, as which the hook then runs.
#[tokio::test(start_paused = true)]
async fn a_leaving_tenants_post_delete_hook_held_back_keeps_its_service_account() {
    let fake = cluster(None);
    let mut sink = sink(&fake, impersonating());
    let with_hook = tenant_release_with_hook("post-delete", "shop");
    assert!(sink.apply(&with_hook, &[]).await.complete);
    assert!(
        fake.update("v1", "ConfigMap", "shop", "settings", |settings| {
            settings["metadata"]["finalizers"] = serde_json::json!(["example.com/hold"]);
        })
    );
    let next = platform_only();
    let prune = prune_list(&with_hook, &next);
    let outcome = sink.apply(&next, &prune).await;
    assert!(!outcome.complete, "{outcome:#?}");
    assert!(callers(&fake, "patch", "configmaps", "farewell").is_empty());
    for (api_version, kind) in [
        ("v1", "ServiceAccount"),
        ("rbac.authorization.k8s.io/v1", "RoleBinding"),
    ] {
        assert!(
            fake.get(api_version, kind, "shop", "flotilla-tenant-shop")
                .is_some(),
            "{kind} kept: {outcome:#?}"
        );
    }

    fake.remove_finalizers("v1", "ConfigMap", "shop", "settings");
    let outcome = sink.apply(&next, &prune).await;
    assert!(outcome.complete, "{outcome:#?}");
    assert_eq!(
        callers(&fake, "patch", "configmaps", "farewell"),
        [(TENANT_USER.to_string(), true)],
        "{:#?}",
        fake.checks()
    );
    assert!(
        fake.get("v1", "ServiceAccount", "shop", "flotilla-tenant-shop")
            .is_none()
    );
}

/// A tenant's release whose `pre-delete` hook fails (refused: it is in a namespace
/// the tenant may not write) is kept, and so are the tenant's ServiceAccount and
/// RoleBinding, which the next try needs to delete the release as the tenant.
#[tokio::test(start_paused = true)]
async fn a_leaving_tenants_release_kept_by_its_hook_keeps_the_tenants_service_account() {
    let fake = cluster(None);
    let mut sink = sink(&fake, impersonating());
    let with_hook = tenant_release_with_hook("pre-delete", AGENT_NAMESPACE);
    assert!(sink.apply(&with_hook, &[]).await.complete);
    let next = platform_only();
    let outcome = sink.apply(&next, &prune_list(&with_hook, &next)).await;
    assert!(!outcome.complete, "{outcome:#?}");
    assert!(fake.get("v1", "ConfigMap", "shop", "settings").is_some());
    assert!(
        fake.get("v1", "ServiceAccount", "shop", "flotilla-tenant-shop")
            .is_some(),
        "{outcome:#?}"
    );
    assert!(
        fake.get(
            "rbac.authorization.k8s.io/v1",
            "RoleBinding",
            "shop",
            "flotilla-tenant-shop"
        )
        .is_some()
    );
}

async fn leaving_tenant_release_runs_its_hook_as_the_tenant(event: &str) {
    let fake = cluster(None);
    let mut sink = sink(&fake, impersonating());
    let with_hook = tenant_release_with_hook(event, "shop");
    let outcome = sink.apply(&with_hook, &[]).await;
    assert!(outcome.complete, "{outcome:#?}");
    assert!(callers(&fake, "patch", "configmaps", "farewell").is_empty());

    let platform_only = platform_only();
    let outcome = sink
        .apply(&platform_only, &prune_list(&with_hook, &platform_only))
        .await;
    assert!(outcome.complete, "{outcome:#?}");
    let tenant = (TENANT_USER.to_string(), true);
    assert_eq!(
        callers(&fake, "patch", "configmaps", "farewell"),
        std::slice::from_ref(&tenant),
        "{:#?}",
        fake.checks()
    );
    assert_eq!(
        callers(&fake, "delete", "configmaps", "farewell"),
        std::slice::from_ref(&tenant)
    );
}
