//! Tenants (`tenants/<name>.yaml`) at render: each rule refused with an error that
//! names the tenant, the rule, the file and the line; one tenant's broken workload
//! failing only the clusters it targets; and the bundle's `meta.tenants`.

use flotilla_core::diagnostic::Diagnostic;
use flotilla_core::snapshot::FleetSnapshot;
use flotilla_render::{RenderOutput, render};

fn cluster(name: &str, site: &str) -> (String, String) {
    (
        format!("clusters/{name}.yaml"),
        format!(
            "apiVersion: flotilla.dev/v1alpha1\nkind: Cluster\nmetadata:\n  name: {name}\n  labels:\n    site: {site}\n"
        ),
    )
}

/// A workload targeting the cluster `target`, in namespace `namespace`, with one
/// manifest file holding `manifest`.
fn workload(name: &str, target: &str, namespace: &str, manifest: &str) -> Vec<(String, String)> {
    vec![
        (
            format!("workloads/{name}/workload.yaml"),
            format!(
                "apiVersion: flotilla.dev/v1alpha1\nkind: Workload\nmetadata:\n  name: {name}\nspec:\n  namespace: {namespace}\n  targets:\n    - cluster: {target}\n"
            ),
        ),
        (
            format!("workloads/{name}/manifests/{name}.yaml"),
            manifest.to_string(),
        ),
    ]
}

fn config_map(name: &str) -> String {
    format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\ndata:\n  a: b\n")
}

fn tenant(name: &str, spec: &str) -> (String, String) {
    (
        format!("tenants/{name}.yaml"),
        format!(
            "apiVersion: flotilla.dev/v1alpha1\nkind: Tenant\nmetadata:\n  name: {name}\nspec:\n{spec}"
        ),
    )
}

/// Two tenants and the platform on three clusters: team-a's `shop` on `north`,
/// team-b's `till` on `south`, the platform's `agent` everywhere it is pointed.
fn base() -> Vec<(String, String)> {
    let mut files = vec![
        cluster("north", "a"),
        cluster("south", "b"),
        cluster("east", "c"),
        tenant(
            "team-a",
            "  workloads: [shop, shop-*]\n  clusterSelector:\n    matchLabels: {site: a}\n  namespaces: [team-a, team-a-*]\n",
        ),
        tenant("team-b", "  workloads: [till]\n  namespaces: [team-b]\n"),
    ];
    files.extend(workload("shop", "north", "team-a", &config_map("shop")));
    files.extend(workload("till", "south", "team-b", &config_map("till")));
    files.extend(workload(
        "agent",
        "east",
        "kube-system",
        &config_map("agent"),
    ));
    files
}

fn with(mut files: Vec<(String, String)>, more: Vec<(String, String)>) -> Vec<(String, String)> {
    for (path, text) in more {
        files.retain(|(p, _)| *p != path);
        files.push((path, text));
    }
    files
}

fn rendered(files: &[(String, String)]) -> RenderOutput {
    let snapshot = FleetSnapshot::from_files(files.iter().map(|(p, t)| (p.as_str(), t.as_str())));
    render(&snapshot)
}

fn errors(output: &RenderOutput) -> Vec<&Diagnostic> {
    output.diagnostics.iter().filter(|d| d.is_error()).collect()
}

/// The one error of a render, which must fail `cluster` only.
fn only_error(output: &RenderOutput, cluster: &str) -> Diagnostic {
    let errors = errors(output);
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert!(
        !output.bundles.contains_key(cluster),
        "{cluster} has a bundle"
    );
    let others = ["north", "south", "east"]
        .into_iter()
        .filter(|c| *c != cluster);
    for other in others {
        assert!(
            output.bundles.contains_key(other),
            "{other} lost its bundle"
        );
    }
    errors[0].clone()
}

#[test]
fn tenants_render_and_the_bundle_names_each_tenant_with_its_rules() {
    let output = rendered(&base());
    assert!(errors(&output).is_empty(), "{:#?}", output.diagnostics);
    let north = output.bundles["north"]
        .meta
        .as_ref()
        .expect("north has meta");
    let mark = &north.tenants["team-a"];
    assert_eq!(mark.workloads, ["shop"]);
    assert_eq!(mark.namespaces, ["team-a", "team-a-*"]);
    assert!(mark.cluster_scoped.is_empty());
    assert_eq!(north.tenant_of("shop").map(|(t, _)| t), Some("team-a"));
    // The platform's workload alone needs no metadata: its digest is as before.
    assert!(output.bundles["east"].meta.is_none());
}

#[test]
fn a_resource_outside_the_tenants_namespaces_is_refused_at_its_line() {
    let files = with(
        base(),
        workload(
            "shop",
            "north",
            "team-a",
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: shop\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: sneaky\n  namespace: kube-system\n",
        ),
    );
    let error = only_error(&rendered(&files), "north");
    assert_eq!(
        error.message,
        "tenant \"team-a\": ConfigMap kube-system/sneaky is in namespace \"kube-system\", which is not the tenant's (spec.namespaces of tenants/team-a.yaml: team-a, team-a-*)"
    );
    assert_eq!(
        error.file.as_deref(),
        Some("workloads/shop/manifests/shop.yaml")
    );
    assert_eq!(error.line, Some(6));
    assert_eq!(error.cluster.as_deref(), Some("north"));
}

#[test]
fn a_cluster_scoped_kind_needs_the_tenants_leave_and_its_own_namespaces_are_allowed() {
    let cluster_role = "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  name: shop-reader\nrules: []\n---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: team-a-extra\n";
    let files = with(base(), workload("shop", "north", "team-a", cluster_role));
    let error = only_error(&rendered(&files), "north");
    assert!(
        error.message.contains(
            "is cluster-scoped, and spec.clusterScoped of tenants/team-a.yaml does not list ClusterRole (none)"
        ),
        "{}",
        error.message
    );
    assert_eq!(error.line, Some(1));
    // Allowed, beside a namespaced object (which gives the tenant a ServiceAccount
    // on the cluster to apply its cluster-scoped objects as).
    let mut more = workload(
        "shop",
        "north",
        "team-a",
        &format!("{cluster_role}---\n{}", config_map("shop")),
    );
    more.push(tenant(
        "team-a",
        "  workloads: [shop]\n  namespaces: [team-a, team-a-*]\n  clusterScoped: [ClusterRole.rbac.authorization.k8s.io]\n",
    ));
    let allowed = with(files, more);
    let output = rendered(&allowed);
    assert!(errors(&output).is_empty(), "{:#?}", output.diagnostics);
    let meta = output.bundles["north"].meta.as_ref().expect("meta");
    assert_eq!(
        meta.tenants["team-a"].cluster_scoped,
        ["ClusterRole.rbac.authorization.k8s.io"]
    );
}

fn binding(role: &str) -> String {
    format!(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata:\n  name: shop-admins\nroleRef:\n  apiGroup: rbac.authorization.k8s.io\n  kind: ClusterRole\n  name: {role}\nsubjects:\n  - kind: Group\n    name: shop\n    apiGroup: rbac.authorization.k8s.io\n"
    )
}

#[test]
fn binding_a_cluster_role_the_tenant_does_not_own_is_refused() {
    let files = with(
        base(),
        workload("shop", "north", "team-a", &binding("cluster-admin")),
    );
    let error = only_error(&rendered(&files), "north");
    assert_eq!(
        error.message,
        "tenant \"team-a\": RoleBinding.rbac.authorization.k8s.io team-a/shop-admins binds ClusterRole \"cluster-admin\", which the tenant neither ships nor may bind (spec.clusterRoles of tenants/team-a.yaml: none)"
    );
    // A role it is given, and one it ships itself, may be bound.
    let given = with(
        files.clone(),
        vec![tenant(
            "team-a",
            "  workloads: [shop]\n  namespaces: [team-a]\n  clusterRoles: [view, cluster-admin]\n",
        )],
    );
    assert!(errors(&rendered(&given)).is_empty());
    let shipped = format!(
        "{}---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  name: shop-operator\nrules: []\n",
        binding("shop-operator")
    );
    let own = with(
        with(base(), workload("shop", "north", "team-a", &shipped)),
        vec![tenant(
            "team-a",
            "  workloads: [shop]\n  namespaces: [team-a]\n  clusterScoped: [ClusterRole]\n",
        )],
    );
    let output = rendered(&own);
    assert!(errors(&output).is_empty(), "{:#?}", output.diagnostics);
}

/// team-a's `shop` on `north` and `west` (both site a) binding `manifest`'s
/// ClusterRole, and its `shop-roles` shipping ClusterRoles `shipped` on `north` only.
fn bindings_on_two_clusters(manifest: &str, shipped: &[&str]) -> Vec<(String, String)> {
    let mut roles: String = shipped
        .iter()
        .map(|role| {
            format!(
                "---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  name: {role}\nrules: []\n"
            )
        })
        .collect();
    if roles.is_empty() {
        roles = config_map("roles");
    }
    let mut files = with(
        base(),
        vec![
            cluster("west", "a"),
            tenant(
                "team-a",
                "  workloads: [shop, shop-*]\n  namespaces: [team-a]\n  clusterScoped: [ClusterRole]\n",
            ),
            file(
                "workloads/shop/workload.yaml",
                "apiVersion: flotilla.dev/v1alpha1\nkind: Workload\nmetadata:\n  name: shop\nspec:\n  namespace: team-a\n  targets:\n    - cluster: north\n    - cluster: west\n",
            ),
        ],
    );
    files.retain(|(path, _)| !path.starts_with("workloads/shop/manifests/"));
    files.push(file("workloads/shop/manifests/binding.yaml.j2", manifest));
    files.extend(workload("shop-roles", "north", "team-a", &roles));
    files
}

#[test]
fn a_binding_every_cluster_shares_is_judged_on_each_by_the_roles_the_tenant_ships_there() {
    let message = |role: &str| {
        format!(
            "tenant \"team-a\": RoleBinding.rbac.authorization.k8s.io team-a/shop-admins binds ClusterRole \"{role}\", which the tenant neither ships nor may bind (spec.clusterRoles of tenants/team-a.yaml: none)"
        )
    };
    // One binding for both clusters, its role shipped on north only.
    let output = rendered(&bindings_on_two_clusters(
        &binding("shop-operator"),
        &["shop-operator"],
    ));
    let found = errors(&output);
    assert_eq!(found.len(), 1, "{found:#?}");
    assert_eq!(found[0].message, message("shop-operator"));
    assert_eq!(found[0].cluster.as_deref(), Some("west"));
    assert_eq!(found[0].line, Some(1));
    assert!(output.bundles.contains_key("north"));
    assert!(!output.bundles.contains_key("west"));

    // A binding whose role each cluster fills in: north's is shipped, west's is not.
    let per_cluster = binding("shop-{{ cluster.name }}");
    let output = rendered(&bindings_on_two_clusters(&per_cluster, &["shop-north"]));
    let found = errors(&output);
    assert_eq!(found.len(), 1, "{found:#?}");
    assert_eq!(found[0].message, message("shop-west"));
    assert_eq!(found[0].cluster.as_deref(), Some("west"));
    assert!(output.bundles.contains_key("north"));

    // A resource outside the namespaces in a unit both clusters share: an error on
    // each, folded into one line naming both.
    let outside =
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: sneaky\n  namespace: kube-system\n";
    let output = rendered(&bindings_on_two_clusters(outside, &[]));
    let found = errors(&output);
    assert_eq!(found.len(), 1, "{found:#?}");
    assert_eq!(
        found[0].message,
        "tenant \"team-a\": ConfigMap kube-system/sneaky is in namespace \"kube-system\", which is not the tenant's (spec.namespaces of tenants/team-a.yaml: team-a)"
    );
    assert_eq!(
        found[0].cluster.as_deref(),
        Some("north and 1 other cluster")
    );
}

#[test]
fn a_tenants_workload_may_target_only_the_tenants_clusters() {
    let files = with(
        base(),
        workload("shop", "south", "team-a", &config_map("shop")),
    );
    let output = rendered(&files);
    let errors = errors(&output);
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert_eq!(
        errors[0].message,
        "tenant \"team-a\": workload \"shop\" targets cluster \"south\", which spec.clusterSelector of tenants/team-a.yaml does not select"
    );
    assert_eq!(
        errors[0].file.as_deref(),
        Some("workloads/shop/workload.yaml")
    );
    assert_eq!(errors[0].line, Some(8));
    assert!(!output.bundles.contains_key("south"));
    assert!(output.bundles.contains_key("east"));
}

#[test]
fn a_kustomization_may_not_read_another_tenants_files() {
    let secret =
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: till-key\nstringData:\n  key: hunter2\n";
    let mut files = with(
        base(),
        vec![
            (
                "workloads/till/manifests/key.yaml".to_string(),
                secret.to_string(),
            ),
            (
                "workloads/shop/kustomization.yaml".to_string(),
                "resources:\n  - ../till/manifests/key.yaml\n".to_string(),
            ),
        ],
    );
    let error = only_error(&rendered(&files), "north");
    assert!(
        error.message.contains("tenant \"team-a\" may not read workloads/till/manifests/key.yaml: a tenant's files may refer only to its own workloads' and overlays' folders and to spec.sharedPaths of tenants/team-a.yaml (none)"),
        "{}",
        error.message
    );
    assert_eq!(
        error.file.as_deref(),
        Some("workloads/shop/kustomization.yaml")
    );
    assert_eq!(error.line, Some(2));
    // A shared path may be read (the file then renders into team-a's namespace).
    files = with(
        files,
        vec![tenant(
            "team-a",
            "  workloads: [shop]\n  namespaces: [team-a]\n  sharedPaths: [\"workloads/till/manifests/**\"]\n",
        )],
    );
    let output = rendered(&files);
    assert!(errors(&output).is_empty(), "{:#?}", output.diagnostics);
}

/// A file of the fleet, as (path, text).
fn file(path: &str, text: &str) -> (String, String) {
    (path.to_string(), text.to_string())
}

/// A ConfigMap template of `name` whose data is `data`, a line or a tag of its own.
fn config_map_template(name: &str, data: &str) -> String {
    format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\ndata:\n{data}\n")
}

/// team-b's template `workloads/till/manifests/key.yaml.j2` (its Secret, and a macro
/// that writes it), the platform's template `workloads/agent/manifests/lib.j2` (a
/// macro only), and team-a's `shop` with the template `steal.yaml.j2` holding `data`.
fn templates_with(data: &str) -> Vec<(String, String)> {
    with(
        base(),
        vec![
            file(
                "workloads/till/manifests/key.yaml.j2",
                "{% macro key() %}  key: hunter2{% endmacro %}apiVersion: v1\nkind: Secret\nmetadata:\n  name: till-key\nstringData:\n{{ key() }}\n",
            ),
            file(
                "workloads/agent/manifests/lib.j2",
                "{% macro entry() %}  a: b{% endmacro %}",
            ),
            file(
                "workloads/shop/manifests/steal.yaml.j2",
                &config_map_template("steal", data),
            ),
        ],
    )
}

/// The refusal of team-a's reading `path`, as the render words it.
fn refusal(path: &str) -> String {
    format!(
        "tenant \"team-a\" may not read {path}: a tenant's files may refer only to its own workloads' and overlays' folders and to spec.sharedPaths of tenants/team-a.yaml (none)"
    )
}

#[test]
fn a_tenants_template_may_not_load_another_tenants_or_the_platforms_template() {
    let key = "workloads/till/manifests/key.yaml.j2";
    let lib = "workloads/agent/manifests/lib.j2";
    let loads = [
        (format!("{{% include \"{key}\" %}}"), key),
        (
            format!(
                "{{% include [\"{key}\", \"workloads/shop/manifests/steal.yaml.j2\"] ignore missing %}}"
            ),
            key,
        ),
        (
            format!("{{% import \"{key}\" as till %}}{{{{ till.key() }}}}"),
            key,
        ),
        (
            format!("{{% from \"{lib}\" import entry %}}{{{{ entry() }}}}"),
            lib,
        ),
        (format!("{{% extends \"{lib}\" %}}"), lib),
        // A name that is no template at all: refused for where it points, not missing.
        (
            "{% include \"workloads/till/secret.sops.yaml\" %}".to_string(),
            "workloads/till/secret.sops.yaml",
        ),
        // A name made as the template runs.
        (
            "{% include \"workloads/\" ~ \"till\" ~ \"/manifests/key.yaml.j2\" %}".to_string(),
            key,
        ),
    ];
    for (data, path) in loads {
        let output = rendered(&templates_with(&data));
        // team-b's and the platform's clusters render, their templates as before.
        let error = only_error(&output, "north");
        assert_eq!(error.message, refusal(path), "{data}");
        assert_eq!(
            error.file.as_deref(),
            Some("workloads/shop/manifests/steal.yaml.j2"),
            "{data}"
        );
        assert_eq!(error.line, Some(6), "{data}");
        assert_eq!(error.cluster.as_deref(), Some("north"), "{data}");
        let till = contents(&output, "south");
        assert!(
            till.contains(&row("till", "Secret", "team-b", "till-key")),
            "{till:?}"
        );
    }
}

#[test]
fn a_tenants_template_loads_its_own_templates_and_its_shared_paths() {
    let own = with(
        templates_with("{% from \"workloads/shop/manifests/lib.j2\" import entry %}{{ entry() }}"),
        vec![file(
            "workloads/shop/manifests/lib.j2",
            "{% macro entry() %}  a: b{% endmacro %}",
        )],
    );
    let output = rendered(&own);
    assert!(errors(&output).is_empty(), "{:#?}", output.diagnostics);
    assert!(contents(&output, "north").contains(&row("shop", "ConfigMap", "team-a", "steal")));

    // What its own template loads is held to the same fence, at that template's line.
    let nested = with(
        templates_with("{% include \"workloads/shop/manifests/lib.j2\" %}"),
        vec![file(
            "workloads/shop/manifests/lib.j2",
            "{# team-b's #}\n{% include \"workloads/till/manifests/key.yaml.j2\" %}",
        )],
    );
    let output = rendered(&nested);
    let found = errors(&output);
    assert!(!output.bundles.contains_key("north"));
    assert!(output.bundles.contains_key("south"));
    assert!(!found.is_empty());
    assert!(
        found.iter().all(
            |e| e.message == refusal("workloads/till/manifests/key.yaml.j2")
                && e.file.as_deref() == Some("workloads/shop/manifests/lib.j2")
                && e.line == Some(2)
        ),
        "{found:#?}"
    );

    // A template in spec.sharedPaths may be loaded.
    let shared = with(
        templates_with("{% from \"workloads/agent/manifests/lib.j2\" import entry %}{{ entry() }}"),
        vec![tenant(
            "team-a",
            "  workloads: [shop]\n  namespaces: [team-a]\n  sharedPaths: [\"workloads/agent/manifests/lib.j2\"]\n",
        )],
    );
    let output = rendered(&shared);
    assert!(errors(&output).is_empty(), "{:#?}", output.diagnostics);
}

#[test]
fn the_platforms_templates_load_any_template_as_before() {
    let mut files = templates_with("  a: b");
    files.push(file(
        "workloads/agent/manifests/all.yaml.j2",
        &config_map_template(
            "all",
            "{% from \"workloads/till/manifests/key.yaml.j2\" import key %}{{ key() }}",
        ),
    ));
    let output = rendered(&files);
    assert!(errors(&output).is_empty(), "{:#?}", output.diagnostics);
    assert!(contents(&output, "east").contains(&row("", "ConfigMap", "kube-system", "all")));
}

#[test]
fn a_tenants_overlay_acts_only_on_its_own_workloads() {
    let overlay = |workloads: &str| {
        (
            "overlays/team-a/label.yaml".to_string(),
            format!(
                "apiVersion: flotilla.dev/v1alpha1\nkind: Overlay\nmetadata:\n  name: label\nspec:\n  clusterSelector: {{}}\n{workloads}  labels:\n    touched: \"yes\"\n"
            ),
        )
    };
    let files = with(
        base(),
        vec![
            overlay(""),
            tenant(
                "team-a",
                "  workloads: [shop]\n  overlays: [label]\n  namespaces: [team-a]\n",
            ),
        ],
    );
    let output = rendered(&files);
    assert!(errors(&output).is_empty(), "{:#?}", output.diagnostics);
    let labelled = |cluster: &str| {
        output.bundles[cluster].resources[0].value()["metadata"]["labels"]["touched"] == "yes"
    };
    assert!(labelled("north"));
    assert!(!labelled("south"));
    assert!(!labelled("east"));
    let naming_another = with(files, vec![overlay("  workloads: [shop, till]\n")]);
    let output = rendered(&naming_another);
    let errors = errors(&output);
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert_eq!(
        errors[0].message,
        "tenant \"team-a\": overlay \"label\" names workload \"till\", which is not the tenant's: a tenant's overlay acts only on its own workloads (spec.workloads of tenants/team-a.yaml)"
    );
    assert_eq!(errors[0].line, Some(7));
}

#[test]
fn a_workload_two_tenants_claim_is_an_error() {
    let files = with(
        base(),
        vec![tenant(
            "team-b",
            "  workloads: [till, shop-*, shop]\n  namespaces: [team-b]\n",
        )],
    );
    let output = rendered(&files);
    let errors = errors(&output);
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert!(
        errors[0].message.starts_with(
            "workload \"shop\" is claimed by two tenants, \"team-a\" (here) and \"team-b\" (tenants/team-b.yaml:6)"
        ),
        "{}",
        errors[0].message
    );
    assert_eq!(errors[0].file.as_deref(), Some("tenants/team-a.yaml"));
}

#[test]
fn a_tenants_broken_manifest_holds_only_the_clusters_it_targets() {
    let files = with(
        base(),
        workload("shop", "north", "team-a", "kind: [unclosed\n"),
    );
    let output = rendered(&files);
    assert!(!errors(&output).is_empty());
    assert!(!output.bundles.contains_key("north"));
    assert!(output.bundles.contains_key("south"));
    assert!(output.bundles.contains_key("east"));
    // The platform's broken workload still holds every cluster, as it always did.
    let platform = with(
        base(),
        workload("agent", "east", "kube-system", "kind: [unclosed\n"),
    );
    assert!(rendered(&platform).bundles.is_empty());
}

/// A SOPS Secret for `workload`'s folder, encrypted to `recipient` as sops writes it.
fn sops_secret(workload: &str, namespace: &str, recipient: &str) -> (String, String) {
    let writer = flotilla_render::sops::SopsWriter::new([9; 32], 1_700_000_000);
    let key = flotilla_render::seal::AgentKey::parse(recipient).expect("a recipient");
    let secret = serde_json::json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": format!("{workload}-key"), "namespace": namespace},
        "stringData": {"key": format!("{workload}-secret-value")}});
    let text = writer.encrypt(&secret, &key, workload).expect("encrypts");
    (format!("workloads/{workload}/manifests/key.yaml"), text)
}

fn identity() -> (String, String) {
    use age::secrecy::ExposeSecret as _;
    let identity = age::x25519::Identity::generate();
    (
        identity.to_string().expose_secret().to_string(),
        identity.to_public().to_string(),
    )
}

/// With `--decryption-key TENANT=FILE`, each tenant's SOPS files open with its own
/// identities only: a file encrypted to another tenant's key, copied into a
/// tenant's folder, is an error naming the tenant, and the platform's identity
/// opens no tenant's file.
#[test]
fn each_tenants_sops_files_open_only_with_its_own_identities() {
    use flotilla_render::sops::{DecryptionKeys, SopsKeys};
    let (a_identity, a_recipient) = identity();
    let (b_identity, b_recipient) = identity();
    let (platform_identity, _) = identity();
    let mut keys = DecryptionKeys::default();
    keys.add_identity_file(&platform_identity)
        .expect("platform");
    keys.add_tenant_identity_file("team-a", &a_identity)
        .expect("team-a");
    keys.add_tenant_identity_file("team-b", &b_identity)
        .expect("team-b");
    // Handed to the render worker and back, the tenants' identities stay theirs.
    let keys = DecryptionKeys::from_lines(&keys.identity_lines()).expect("read back");
    let options = flotilla_render::RenderOptions {
        sops: SopsKeys::Open(std::sync::Arc::new(keys)),
        ..Default::default()
    };
    let render = |files: &[(String, String)]| {
        let snapshot =
            FleetSnapshot::from_files(files.iter().map(|(p, t)| (p.as_str(), t.as_str())));
        flotilla_render::render_with(&snapshot, &options)
    };
    let files = with(
        base(),
        vec![
            sops_secret("shop", "team-a", &a_recipient),
            sops_secret("till", "team-b", &b_recipient),
        ],
    );
    let output = render(&files);
    assert!(errors(&output).is_empty(), "{:#?}", output.diagnostics);
    let shop = output.bundles["north"]
        .resources
        .iter()
        .find(|r| r.key.kind() == "Secret");
    assert!(
        shop.is_some_and(|r| String::from_utf8_lossy(&r.canonical).contains("shop-secret-value"))
    );

    // team-b's Secret, encrypted to team-b's key, copied into team-a's folder.
    let stolen = with(files, vec![sops_secret("shop", "team-a", &b_recipient)]);
    let output = render(&stolen);
    let errors = errors(&output);
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert!(
        errors[0]
            .message
            .contains("a file of tenant \"team-a\" opens only with its identities"),
        "{}",
        errors[0].message
    );
    assert_eq!(
        errors[0].file.as_deref(),
        Some("workloads/shop/manifests/key.yaml")
    );
    // Only the cluster team-a's workload targets is held.
    assert!(!output.bundles.contains_key("north"));
    assert!(output.bundles.contains_key("south") && output.bundles.contains_key("east"));
}

/// Render options that open SOPS files with a new platform identity, and that
/// identity's recipient.
fn platform_opens() -> (flotilla_render::RenderOptions<'static>, String) {
    use flotilla_render::sops::{DecryptionKeys, SopsKeys};
    let (identity, recipient) = identity();
    let mut keys = DecryptionKeys::default();
    keys.add_identity_file(&identity).expect("platform");
    let options = flotilla_render::RenderOptions {
        sops: SopsKeys::Open(std::sync::Arc::new(keys)),
        ..Default::default()
    };
    (options, recipient)
}

/// The warning that a decrypted value is outside a Secret looks, in a tenant's
/// resources, only for the values of that tenant's own SOPS files (and the
/// platform's): one about another tenant's value would tell the tenant, field by
/// field, whether a guess of it was right. The platform's resources are looked at
/// for every value.
#[test]
fn a_tenants_resources_are_not_searched_for_another_tenants_decrypted_values() {
    let (options, recipient) = platform_opens();
    // team-a's Secret holds `shop-secret-value`; team-b's ConfigMap and the
    // platform's hold the same text, as a guess would.
    let guess = |name: &str| {
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\ndata:\n  guess: shop-secret-value\n"
        )
    };
    let files = with(
        base(),
        vec![
            sops_secret("shop", "team-a", &recipient),
            ("workloads/till/manifests/till.yaml".into(), guess("till")),
            (
                "workloads/agent/manifests/agent.yaml".into(),
                guess("agent"),
            ),
        ],
    );
    let snapshot = FleetSnapshot::from_files(files.iter().map(|(p, t)| (p.as_str(), t.as_str())));
    let output = flotilla_render::render_with(&snapshot, &options);
    assert!(errors(&output).is_empty(), "{:#?}", output.diagnostics);
    let about_shops_value: Vec<&Diagnostic> = output
        .warnings()
        .filter(|w| w.message.contains("workloads/shop/manifests/key.yaml"))
        .collect();
    assert!(
        about_shops_value
            .iter()
            .all(|w| w.cluster.as_deref() != Some("south")),
        "team-b is told nothing of team-a's value: {about_shops_value:#?}"
    );
    assert!(
        about_shops_value
            .iter()
            .any(|w| w.cluster.as_deref() == Some("east")),
        "the platform's ConfigMap is warned about: {about_shops_value:#?}"
    );
}

/// A tenant's warning that its own decrypted value is outside a Secret names its
/// workload, so that it is cleared of that tenant's values (and the platform's) only:
/// a phrase of the warning that is another tenant's value stays as it is (clearing
/// it would tell the tenant that the phrase is that value).
#[test]
fn a_tenants_warning_is_not_cleared_of_another_tenants_values() {
    let (options, recipient) = platform_opens();
    let writer = flotilla_render::sops::SopsWriter::new([9; 32], 1_700_000_000);
    let key = flotilla_render::seal::AgentKey::parse(&recipient).expect("a recipient");
    // team-a's value happens to be words of the warning's own text.
    let shops = serde_json::json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "shop-key", "namespace": "team-a"},
        "stringData": {"key": "stored in plain"}});
    let files = with(
        base(),
        vec![
            (
                "workloads/shop/manifests/key.yaml".into(),
                writer.encrypt(&shops, &key, "shop").expect("encrypts"),
            ),
            sops_secret("till", "team-b", &recipient),
            (
                "workloads/till/manifests/leak.yaml".into(),
                "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: leak\ndata:\n  copy: till-secret-value\n".into(),
            ),
        ],
    );
    let snapshot = FleetSnapshot::from_files(files.iter().map(|(p, t)| (p.as_str(), t.as_str())));
    let output = flotilla_render::render_with(&snapshot, &options);
    assert!(errors(&output).is_empty(), "{:#?}", output.diagnostics);
    let warning = output
        .warnings()
        .find(|w| w.message.contains("workloads/till/manifests/key.yaml"))
        .unwrap_or_else(|| panic!("a warning about till's value: {:#?}", output.diagnostics));
    assert_eq!(warning.workload.as_deref(), Some("till"), "{warning:?}");
    assert!(
        warning
            .message
            .ends_with("it travels and is stored in plain text"),
        "{}",
        warning.message
    );
}

/// `(workload, kind, namespace, name)` of each resource of a cluster's bundle.
fn contents(output: &RenderOutput, cluster: &str) -> Vec<(String, String, String, String)> {
    let bundle = &output.bundles[cluster];
    let workloads = bundle
        .meta
        .as_ref()
        .map(|m| m.workloads.clone())
        .unwrap_or_default();
    bundle
        .resources
        .iter()
        .enumerate()
        .map(|(i, r)| {
            (
                workloads.get(i).cloned().unwrap_or_default(),
                r.key.kind().to_string(),
                r.key.namespace().to_string(),
                r.key.name().to_string(),
            )
        })
        .collect()
}

fn row(
    workload: &str,
    kind: &str,
    namespace: &str,
    name: &str,
) -> (String, String, String, String) {
    (workload.into(), kind.into(), namespace.into(), name.into())
}

fn value_of(
    output: &RenderOutput,
    cluster: &str,
    kind: &str,
    namespace: &str,
    name: &str,
) -> serde_json::Value {
    output.bundles[cluster]
        .resources
        .iter()
        .find(|r| r.key.kind() == kind && r.key.namespace() == namespace && r.key.name() == name)
        .unwrap_or_else(|| panic!("no {kind} {namespace}/{name}"))
        .value()
}

#[test]
fn each_namespace_a_tenant_writes_gets_its_service_account_and_role_binding_from_the_platform() {
    let shop = "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: team-a-x\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: shop\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: extra\n  namespace: team-a-x\n";
    let output = rendered(&with(base(), workload("shop", "north", "team-a", shop)));
    assert!(errors(&output).is_empty(), "{:#?}", output.diagnostics);
    // Per concrete namespace (team-a and team-a-x, not the glob team-a-*), a
    // ServiceAccount and a RoleBinding, marked as the reserved workload.
    assert_eq!(
        contents(&output, "north"),
        [
            row("shop", "ConfigMap", "team-a", "shop"),
            row("shop", "ConfigMap", "team-a-x", "extra"),
            row("shop", "Namespace", "", "team-a-x"),
            row(
                "flotilla-tenancy",
                "ServiceAccount",
                "team-a",
                "flotilla-tenant-team-a"
            ),
            row(
                "flotilla-tenancy",
                "ServiceAccount",
                "team-a-x",
                "flotilla-tenant-team-a"
            ),
            row(
                "flotilla-tenancy",
                "RoleBinding",
                "team-a",
                "flotilla-tenant-team-a"
            ),
            row(
                "flotilla-tenancy",
                "RoleBinding",
                "team-a-x",
                "flotilla-tenant-team-a"
            ),
        ]
    );
    assert_eq!(
        value_of(
            &output,
            "north",
            "RoleBinding",
            "team-a-x",
            "flotilla-tenant-team-a"
        ),
        serde_json::json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "flotilla-tenant-team-a", "namespace": "team-a-x",
                         "labels": {"flotilla.dev/tenant": "team-a"}},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "flotilla-tenant"},
            "subjects": [{"kind": "ServiceAccount", "name": "flotilla-tenant-team-a", "namespace": "team-a-x"}],
        })
    );
    // The tenant's Namespace enforces the restricted Pod Security level.
    assert_eq!(
        value_of(&output, "north", "Namespace", "", "team-a-x")["metadata"]["labels"],
        serde_json::json!({"pod-security.kubernetes.io/enforce": "restricted"})
    );
    // team-b's cluster gets team-b's; the platform's cluster none.
    assert_eq!(
        contents(&output, "south"),
        [
            row("till", "ConfigMap", "team-b", "till"),
            row(
                "flotilla-tenancy",
                "ServiceAccount",
                "team-b",
                "flotilla-tenant-team-b"
            ),
            row(
                "flotilla-tenancy",
                "RoleBinding",
                "team-b",
                "flotilla-tenant-team-b"
            ),
        ]
    );
    assert_eq!(
        contents(&output, "east"),
        [row("", "ConfigMap", "kube-system", "agent")]
    );
    assert!(output.bundles["east"].meta.is_none());
}

#[test]
fn the_tenants_pod_security_level_replaces_the_one_its_namespace_sets() {
    let namespace = "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: team-a-x\n  labels:\n    pod-security.kubernetes.io/enforce: privileged\n    team: a\n";
    let files = with(
        base(),
        workload("shop", "north", "team-a", namespace)
            .into_iter()
            .chain([tenant(
                "team-a",
                "  workloads: [shop]\n  namespaces: [team-a, team-a-*]\n  podSecurity: baseline\n",
            )])
            .collect(),
    );
    let output = rendered(&files);
    assert!(errors(&output).is_empty(), "{:#?}", output.diagnostics);
    assert_eq!(
        value_of(&output, "north", "Namespace", "", "team-a-x")["metadata"]["labels"],
        serde_json::json!({"pod-security.kubernetes.io/enforce": "baseline", "team": "a"})
    );
    // A Namespace only: no namespaced resource, so no ServiceAccount.
    assert_eq!(
        contents(&output, "north"),
        [row("shop", "Namespace", "", "team-a-x")]
    );
    let wrong = with(
        files,
        vec![tenant(
            "team-a",
            "  workloads: [shop]\n  namespaces: [team-a]\n  podSecurity: loose\n",
        )],
    );
    let output = rendered(&wrong);
    assert!(
        errors(&output).iter().any(
            |e| e.file.as_deref() == Some("tenants/team-a.yaml") && e.message.contains("loose")
        ),
        "{:#?}",
        output.diagnostics
    );
}

#[test]
fn a_fleet_without_tenants_renders_byte_for_byte_as_before() {
    let mut files = base();
    files.retain(|(path, _)| !path.starts_with("tenants/"));
    let output = rendered(&files);
    assert!(errors(&output).is_empty(), "{:#?}", output.diagnostics);
    for cluster in ["north", "south", "east"] {
        let bundle = &output.bundles[cluster];
        assert!(bundle.meta.is_none(), "{cluster}");
        assert_eq!(bundle.resources.len(), 1, "{cluster}");
        // The digest of the resources alone, as before flotilla knew of tenants.
        let plain = flotilla_core::bundle::Bundle::new(cluster, bundle.resources.clone());
        assert_eq!(bundle.digest, plain.digest, "{cluster}");
    }
    // The same namespace written by a workload no tenant owns gets nothing either.
    let north = contents(&output, "north");
    assert_eq!(north, [row("", "ConfigMap", "team-a", "shop")]);
}

#[test]
fn flotilla_tenancy_is_a_reserved_workload_name() {
    let files = with(
        base(),
        workload("flotilla-tenancy", "east", "kube-system", &config_map("x")),
    );
    let output = rendered(&files);
    let found = errors(&output);
    assert!(
        found.iter().any(
            |e| e.file.as_deref() == Some("workloads/flotilla-tenancy/workload.yaml")
                && e.message
                    .contains("the workload name flotilla-tenancy is reserved")
                && e.line == Some(4)
        ),
        "{found:#?}"
    );
}

#[test]
fn a_tenants_object_named_as_its_service_account_is_an_error() {
    let account =
        "apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: flotilla-tenant-team-a\n";
    let output = rendered(&with(base(), workload("shop", "north", "team-a", account)));
    let error = only_error(&output, "north");
    assert!(
        error.message.contains("ServiceAccount team-a/flotilla-tenant-team-a (workload shop) has the identity of the object flotilla adds"),
        "{}",
        error.message
    );
}

#[test]
fn with_dependencies_the_tenancy_objects_come_in_the_first_phase() {
    let mut files = with(
        base(),
        workload("shop-db", "north", "team-a", &config_map("db")),
    );
    files.retain(|(path, _)| path != "workloads/shop/workload.yaml");
    files.push((
        "workloads/shop/workload.yaml".into(),
        "apiVersion: flotilla.dev/v1alpha1\nkind: Workload\nmetadata:\n  name: shop\nspec:\n  namespace: team-a\n  targets:\n    - cluster: north\n  dependsOn: [shop-db]\n".into(),
    ));
    let output = rendered(&files);
    assert!(errors(&output).is_empty(), "{:#?}", output.diagnostics);
    let meta = output.bundles["north"].meta.as_ref().expect("meta");
    assert_eq!(
        meta.phases,
        [
            vec!["flotilla-tenancy".to_string(), "shop-db".into()],
            vec!["shop".into()]
        ]
    );
}

const WIDGET_CRD: &str = "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n  name: widgets.example.com\nspec:\n  group: example.com\n  scope: Cluster\n  names:\n    kind: Widget\n    plural: widgets\n  versions:\n    - name: v1\n      served: true\n      storage: true\n";

/// team-a may write ClusterRoles and the fleet's Widgets (whose CRD the platform's
/// `crds` ships to `north`), and ships one of each beside ConfigMaps in two of its
/// namespaces.
fn cluster_scoped_fleet(cluster_scoped: &str, shop: &str) -> Vec<(String, String)> {
    let mut more = workload("shop", "north", "team-a", shop);
    more.extend(workload("crds", "north", "kube-system", WIDGET_CRD));
    more.push(tenant(
        "team-a",
        &format!(
            "  workloads: [shop]\n  namespaces: [team-a, team-a-*]\n  clusterScoped: {cluster_scoped}\n"
        ),
    ));
    with(base(), more)
}

const SHOP_WITH_CLUSTER_OBJECTS: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: shop\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: extra\n  namespace: team-a-x\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  name: shop-reader\nrules: []\n---\napiVersion: example.com/v1\nkind: Widget\nmetadata:\n  name: big\n";

#[test]
fn a_tenant_shipping_cluster_scoped_objects_gets_a_cluster_role_on_its_kinds_bound_in_its_first_namespace()
 {
    let files = cluster_scoped_fleet(
        "[Widget.example.com, ClusterRole.rbac.authorization.k8s.io, Namespace]",
        SHOP_WITH_CLUSTER_OBJECTS,
    );
    let output = rendered(&files);
    assert!(errors(&output).is_empty(), "{:#?}", output.diagnostics);
    let tenancy: Vec<_> = contents(&output, "north")
        .into_iter()
        .filter(|row| row.0 == "flotilla-tenancy")
        .collect();
    assert_eq!(
        tenancy,
        [
            row(
                "flotilla-tenancy",
                "ServiceAccount",
                "team-a",
                "flotilla-tenant-team-a"
            ),
            row(
                "flotilla-tenancy",
                "ServiceAccount",
                "team-a-x",
                "flotilla-tenant-team-a"
            ),
            row(
                "flotilla-tenancy",
                "ClusterRole",
                "",
                "flotilla-tenant-team-a"
            ),
            row(
                "flotilla-tenancy",
                "ClusterRoleBinding",
                "",
                "flotilla-tenant-team-a"
            ),
            row(
                "flotilla-tenancy",
                "RoleBinding",
                "team-a",
                "flotilla-tenant-team-a"
            ),
            row(
                "flotilla-tenancy",
                "RoleBinding",
                "team-a-x",
                "flotilla-tenant-team-a"
            ),
        ]
    );
    // Exactly the kinds of spec.clusterScoped, by resource name; not Namespace.
    let verbs = [
        "get", "list", "watch", "create", "update", "patch", "delete",
    ];
    assert_eq!(
        value_of(
            &output,
            "north",
            "ClusterRole",
            "",
            "flotilla-tenant-team-a"
        ),
        serde_json::json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "flotilla-tenant-team-a", "labels": {"flotilla.dev/tenant": "team-a"}},
            "rules": [
                {"apiGroups": ["example.com"], "resources": ["widgets"], "verbs": verbs},
                {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"], "verbs": verbs},
            ],
        })
    );
    // Bound to the ServiceAccount in team-a, the first of its namespaces there.
    assert_eq!(
        value_of(
            &output,
            "north",
            "ClusterRoleBinding",
            "",
            "flotilla-tenant-team-a"
        ),
        serde_json::json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "flotilla-tenant-team-a", "labels": {"flotilla.dev/tenant": "team-a"}},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "flotilla-tenant-team-a"},
            "subjects": [{"kind": "ServiceAccount", "name": "flotilla-tenant-team-a", "namespace": "team-a"}],
        })
    );
    // Only agents that know these objects are served the bundle.
    use flotilla_core::bundle::features;
    let needs = |output: &RenderOutput| {
        features::needed_by_body(&output.bundles["north"].canonical_body()).expect("a bundle")
    };
    assert_eq!(
        needs(&output),
        [
            features::META,
            features::TENANTS,
            features::TENANT_CLUSTER_ROLES
        ]
    );
    // Without the ConfigMap in team-a, the binding moves to team-a-x.
    let moved = cluster_scoped_fleet(
        "[Widget.example.com, ClusterRole]",
        &SHOP_WITH_CLUSTER_OBJECTS
            .replace("  name: shop\n", "  name: shop\n  namespace: team-a-x\n"),
    );
    let output = rendered(&moved);
    assert!(errors(&output).is_empty(), "{:#?}", output.diagnostics);
    assert_eq!(
        value_of(
            &output,
            "north",
            "ClusterRoleBinding",
            "",
            "flotilla-tenant-team-a"
        )["subjects"][0]["namespace"],
        "team-a-x"
    );
    // A tenant with only namespaced objects gets neither.
    let namespaced_only = cluster_scoped_fleet("[ClusterRole]", &config_map("shop"));
    let output = rendered(&namespaced_only);
    assert!(errors(&output).is_empty(), "{:#?}", output.diagnostics);
    assert_eq!(needs(&output), [features::META, features::TENANTS]);
    assert!(
        !contents(&output, "north")
            .iter()
            .any(|row| row.1.starts_with("Cluster")),
        "{:#?}",
        contents(&output, "north")
    );
}

#[test]
fn a_tenants_cluster_scoped_objects_without_a_namespace_of_its_on_the_cluster_are_an_error() {
    let only_cluster_scoped = "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  name: shop-reader\nrules: []\n";
    let files = cluster_scoped_fleet(
        "[ClusterRole.rbac.authorization.k8s.io]",
        only_cluster_scoped,
    );
    let error = only_error(&rendered(&files), "north");
    assert_eq!(error.file.as_deref(), Some("tenants/team-a.yaml"));
    assert_eq!(
        error.message,
        "tenant \"team-a\": it ships ClusterRole.rbac.authorization.k8s.io/shop-reader on cluster \"north\" but nothing in any of its namespaces there, so it has no ServiceAccount on the cluster to apply its cluster-scoped objects as (spec.namespaces of tenants/team-a.yaml: team-a, team-a-*): ship them beside a namespaced object of the tenant's, or in a workload of the platform's"
    );
}

#[test]
fn a_cluster_scoped_kind_whose_resource_name_cannot_be_known_is_an_error_at_its_line() {
    let files = cluster_scoped_fleet(
        "\n    - ClusterRole\n    - Gadget.example.com\n",
        SHOP_WITH_CLUSTER_OBJECTS
            .replace("kind: Widget", "kind: Gadget")
            .as_str(),
    );
    let error = only_error(&rendered(&files), "north");
    assert_eq!(error.file.as_deref(), Some("tenants/team-a.yaml"));
    assert_eq!(error.line, Some(10));
    assert!(
        error.message.starts_with(
            "tenant \"team-a\": cannot know the resource name of Gadget.example.com (spec.clusterScoped of tenants/team-a.yaml): it is neither a built-in Kubernetes kind nor one a CustomResourceDefinition of the fleet defines"
        ),
        "{}",
        error.message
    );
}

#[test]
fn a_fleet_object_named_as_a_tenants_cluster_role_is_an_error() {
    let mut files = cluster_scoped_fleet(
        "[ClusterRole, Widget.example.com]",
        SHOP_WITH_CLUSTER_OBJECTS,
    );
    files = with(
        files,
        workload(
            "crds",
            "north",
            "kube-system",
            &format!(
                "{WIDGET_CRD}---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  name: flotilla-tenant-team-a\nrules: []\n"
            ),
        ),
    );
    let error = only_error(&rendered(&files), "north");
    assert!(
        error.message.starts_with(
            "ClusterRole.rbac.authorization.k8s.io/flotilla-tenant-team-a (workload crds) has the identity of the object flotilla adds for a tenant"
        ),
        "{}",
        error.message
    );
}

/// A symlink counts as the file it leads to: team-a's manifest that is a link to
/// team-b's file fails team-a's cluster only, with the rule; a link within its own
/// folders is read.
#[test]
fn a_tenants_symlink_to_a_file_outside_its_fence_is_refused() {
    // team-a's `path`, holding `text`, read through a symlink to `target`.
    let linked = |path: &str, text: String, target: &str| {
        let files = with(base(), vec![(path.to_string(), text)]);
        let mut snapshot =
            FleetSnapshot::from_files(files.iter().map(|(p, t)| (p.as_str(), t.as_str())));
        snapshot.links.insert(path.into(), target.into());
        render(&snapshot)
    };
    let error = only_error(
        &linked(
            "workloads/shop/manifests/borrowed.yaml",
            config_map("till"),
            "workloads/till/manifests/till.yaml",
        ),
        "north",
    );
    assert_eq!(
        error.to_string(),
        "workloads/shop/manifests/borrowed.yaml: a symlink to workloads/till/manifests/till.yaml; \
         tenant \"team-a\" may not read workloads/till/manifests/till.yaml: a tenant's files \
         may refer only to its own workloads' and overlays' folders and to spec.sharedPaths of \
         tenants/team-a.yaml (none) (workload shop)"
    );
    // Within its own folders, a link is read as its file.
    let output = linked(
        "workloads/shop/manifests/again.yaml",
        config_map("shop-again"),
        "workloads/shop/manifests/shop.yaml",
    );
    assert!(errors(&output).is_empty(), "{:#?}", output.diagnostics);
}
