//! A CustomResourceDefinition that a template renders makes its kind cluster-scoped
//! for the cluster, however the template spells `kind`: the renderer finds such CRDs
//! before it renders the units, without parsing every template output.

use flotilla_core::snapshot::FleetSnapshot;
use flotilla_render::render;

const CLUSTER: &str = "apiVersion: flotilla.dev/v1alpha1\nkind: Cluster\nmetadata:\n  name: edge\nspec:\n  vars:\n    site: s1\n";
const WORKLOAD: &str = "apiVersion: flotilla.dev/v1alpha1\nkind: Workload\nmetadata:\n  name: app\nspec:\n  namespace: shop\n  targets:\n    - cluster: edge\n";

/// Renders `template` as the workload's one template; the namespace of its `Site`.
fn site_namespace(template: &str) -> Option<String> {
    let output = render(&FleetSnapshot::from_files([
        ("clusters/edge.yaml", CLUSTER),
        ("workloads/app/workload.yaml", WORKLOAD),
        ("workloads/app/manifests/site.yaml.j2", template),
    ]));
    let messages: Vec<String> = output.diagnostics.iter().map(ToString::to_string).collect();
    assert!(output.is_clean(), "{messages:?}");
    let site = output.bundles["edge"]
        .resources
        .iter()
        .find(|r| r.key.kind() == "Site")
        .expect("a Site");
    if site.key.namespace().is_empty() {
        None
    } else {
        Some(site.key.namespace().to_string())
    }
}

fn template(kind: &str, scope: &str) -> String {
    format!(
        "apiVersion: apiextensions.k8s.io/v1\nkind: {kind}\nmetadata: {{name: sites.edge.example.com}}\nspec:\n  group: edge.example.com\n  scope: {scope}\n  names: {{kind: Site, plural: sites}}\n---\napiVersion: edge.example.com/v1\nkind: Site\nmetadata:\n  name: '{{{{ cluster.vars.site }}}}'\n"
    )
}

#[test]
fn a_crd_rendered_by_a_template_makes_its_kind_cluster_scoped() {
    assert_eq!(
        site_namespace(&template("CustomResourceDefinition", "Cluster")),
        None
    );
    assert_eq!(
        site_namespace(&template("CustomResourceDefinition", "Namespaced")),
        Some("shop".to_string())
    );
}

#[test]
fn a_crd_kind_written_with_a_yaml_escape_counts_too() {
    // `\u0052` is `R`: the text never holds the word, the parsed value does.
    assert_eq!(
        site_namespace(&template("\"Custom\\u0052esourceDefinition\"", "Cluster")),
        None
    );
}
