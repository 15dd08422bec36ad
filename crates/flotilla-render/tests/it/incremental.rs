//! `render_since` against a full render: random edits to a generated fleet (cluster
//! labels and variables, clusters added and removed, group selectors and variables,
//! overlay patches and selections, manifests, an imported template, a kustomize
//! base outside its workload, a CRD that changes other workloads' scopes, rollout
//! policies, files the renderer does not read, edits that break one cluster, and
//! Secrets on clusters with and without an agent key, which warn for one cluster,
//! and a CRD's schema that some clusters' resources break, a warning of each
//! cluster that depends on another workload's CRD, and a tenant's Helm chart whose
//! releases warn on some clusters and ship a Widget, cluster-scoped where the CRD is),
//! each commit rendered both ways: the same bundles, diagnostics, memberships,
//! labels, rollout plan and inputs, while rendering fewer clusters.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};

use proptest::prelude::*;

use flotilla_core::bundle::Bundle;
use flotilla_core::snapshot::FleetSnapshot;
use flotilla_render::{
    RenderOptions, RenderOutput, render_since, render_since_fetching, render_with,
};

const HEADER: &str = "apiVersion: flotilla.dev/v1alpha1\n";

/// A small deterministic generator (xorshift), seeded by proptest.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

#[derive(Clone)]
struct ClusterSpec {
    region: usize,
    canary: bool,
    site: usize,
    big: bool,
    /// Without `siteId` its templates fail: an error of this one cluster.
    broken: bool,
    /// With `spec.agentKey`: a big cluster's Secret is then no warning of its own.
    keyed: bool,
}

/// An agent's public key, as `age-keygen` prints it.
const AGENT_KEY: &str = "age1saxr9k92hutdtlw48l79eaa2ew9p8u9zy77r4flnh2nf48y8hersq7yrux";

fn cluster_file(name: &str, c: &ClusterSpec) -> String {
    let tier = if c.canary { "canary" } else { "stable" };
    let site = if c.broken {
        String::new()
    } else {
        format!("    siteId: site-{}\n", c.site)
    };
    let key = if c.keyed {
        format!("  agentKey: {AGENT_KEY}\n")
    } else {
        String::new()
    };
    format!(
        "{HEADER}kind: Cluster\nmetadata:\n  name: {name}\n  labels:\n    region: r{}\n    tier: {tier}\nspec:\n{key}  vars:\n{site}    big: {}\n",
        c.region, c.big
    )
}

/// The fleet's files other than clusters, each editable by name.
struct Fleet {
    clusters: BTreeMap<String, ClusterSpec>,
    next_cluster: usize,
    mirror: [usize; 3],
    r2_selects: usize,
    replicas: usize,
    stable_target: &'static str,
    image: usize,
    macro_suffix: usize,
    base_value: usize,
    crd_group: usize,
    wave_group: &'static str,
    readme: usize,
    site_overlay_cluster: String,
    plain_port: usize,
    plain_crd: bool,
    /// The chart workload's `spec.helm.values.note`.
    chart_note: usize,
    /// Whether the chart's template prints a value the values do not hold (a
    /// warning of every release).
    chart_missing: bool,
    /// Whether the tenant that owns the chart may ship cluster-scoped Widgets
    /// (the chart's Widget is cluster-scoped where the crd workload is).
    tenant_widgets: bool,
    /// Whether crd's Widget schema wants an integer `spec.size` (web's Widget has a
    /// string there): a schema warning on every cluster, from a CRD that only some
    /// clusters' workloads carry.
    widget_size_integer: bool,
}

impl Fleet {
    fn new(rng: &mut Rng) -> Fleet {
        let count = 4 + rng.below(8);
        let clusters = (0..count)
            .map(|i| {
                (
                    format!("c{i:02}"),
                    ClusterSpec {
                        region: rng.below(3),
                        canary: rng.below(4) == 0,
                        site: rng.below(5),
                        big: rng.below(3) == 0,
                        broken: false,
                        keyed: rng.below(2) == 0,
                    },
                )
            })
            .collect();
        Fleet {
            clusters,
            next_cluster: count,
            mirror: [0; 3],
            r2_selects: 2,
            replicas: 2,
            stable_target: "Deployment",
            image: 1,
            macro_suffix: 0,
            base_value: 0,
            crd_group: 0,
            wave_group: "canary",
            readme: 0,
            site_overlay_cluster: "c01".into(),
            plain_port: 80,
            plain_crd: false,
            chart_note: 0,
            chart_missing: false,
            tenant_widgets: true,
            widget_size_integer: false,
        }
    }

    fn files(&self) -> BTreeMap<String, String> {
        let mut files = BTreeMap::new();
        let mut add = |path: &str, text: String| {
            files.insert(path.to_string(), text);
        };
        for (name, spec) in &self.clusters {
            add(&format!("clusters/{name}.yaml"), cluster_file(name, spec));
        }
        for r in 0..3 {
            let selects = if r == 2 { self.r2_selects } else { r };
            add(
                &format!("groups/r{r}.yaml"),
                format!(
                    "{HEADER}kind: Group\nmetadata:\n  name: r{r}\nspec:\n  selector:\n    matchLabels:\n      region: r{selects}\n  vars:\n    mirror: m{}.r{r}.example.com\n",
                    self.mirror[r]
                ),
            );
        }
        for tier in ["canary", "stable"] {
            add(
                &format!("groups/{tier}.yaml"),
                format!(
                    "{HEADER}kind: Group\nmetadata:\n  name: {tier}\nspec:\n  selector:\n    matchLabels:\n      tier: {tier}\n"
                ),
            );
        }
        // web: every cluster; a Deployment, a Widget (namespaced unless the crd
        // workload is on the cluster), and a template that imports crd's macros.
        add(
            "workloads/web/workload.yaml",
            format!(
                "{HEADER}kind: Workload\nmetadata:\n  name: web\nspec:\n  namespace: web\n  targets:\n    - clusterSelector: {{}}\n  vars:\n    mirror: none\n"
            ),
        );
        add(
            "workloads/web/manifests/app.yaml",
            format!(
                "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\n  labels: {{app: web}}\nspec:\n  replicas: 1\n  selector: {{matchLabels: {{app: web}}}}\n  template:\n    spec:\n      containers:\n        - name: web\n          image: example.com/web:{}\n---\napiVersion: example.com/v1\nkind: Widget\nmetadata:\n  name: w\nspec:\n  size: large\n---\napiVersion: example.com/v1\nkind: Gadget\nmetadata:\n  name: g\n",
                self.image
            ),
        );
        add(
            "workloads/web/manifests/config.yaml.j2",
            "{% import 'workloads/crd/manifests/macros.j2' as m %}apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: web-config\ndata:\n  site: \"{{ m.tag(cluster.vars.siteId) }}\"\n  mirror: \"{{ vars.mirror }}\"\n{% if cluster.vars.big %}---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: big-config\ndata:\n  size: large\n---\napiVersion: v1\nkind: Secret\nmetadata:\n  name: big-secret\nstringData:\n  size: large\n{% endif %}".into(),
        );
        add(
            "workloads/crd/manifests/macros.j2",
            format!(
                "{{% macro tag(x) %}}{{{{ x }}}}-v{}{{% endmacro %}}",
                self.macro_suffix
            ),
        );
        // crd: defines the cluster-scoped Widget on one region's clusters, and holds
        // the macros web's template imports (so web depends on another workload's
        // template).
        add(
            "workloads/crd/workload.yaml",
            format!(
                "{HEADER}kind: Workload\nmetadata:\n  name: crd\nspec:\n  targets:\n    - group: r{}\n",
                self.crd_group
            ),
        );
        add(
            "workloads/crd/manifests/crd.yaml",
            format!(
                "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n  name: widgets.example.com\nspec:\n  group: example.com\n  scope: Cluster\n  names:\n    kind: Widget\n    plural: widgets\n  versions:\n    - name: v1\n      served: true\n      storage: true\n      schema:\n        openAPIV3Schema:\n          type: object\n          properties:\n            spec:\n              type: object\n              properties:\n                size: {{type: {}}}\n",
                if self.widget_size_integer {
                    "integer"
                } else {
                    "string"
                }
            ),
        );
        // plain: every cluster; a Service, and at times a CRD that makes web's
        // Gadget cluster-scoped.
        add(
            "workloads/plain/workload.yaml",
            format!(
                "{HEADER}kind: Workload\nmetadata:\n  name: plain\nspec:\n  namespace: plain\n  targets:\n    - clusterSelector: {{}}\n"
            ),
        );
        let mut plain = format!(
            "apiVersion: v1\nkind: Service\nmetadata:\n  name: plain\nspec:\n  ports:\n    - port: {}\n",
            self.plain_port
        );
        if self.plain_crd {
            plain.push_str("---\napiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n  name: gadgets.example.com\nspec:\n  group: example.com\n  scope: Cluster\n  names:\n    kind: Gadget\n    plural: gadgets\n  versions:\n    - name: v1\n      served: true\n      storage: true\n");
        }
        add("workloads/plain/manifests/service.yaml", plain);
        // A template read as values and filled in from stencils: clusters of one
        // site and region share their output (a unit), the others have their own.
        add(
            "workloads/plain/manifests/site.yaml.j2",
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: plain-site\n  annotations:\n    site: \"{{ cluster.vars.siteId }}\"\ndata:\n  region: {{ cluster.labels.region }}\n".into(),
        );
        // kbase: a kustomization whose base lies outside the workload's folder.
        add(
            "workloads/kbase/workload.yaml",
            format!(
                "{HEADER}kind: Workload\nmetadata:\n  name: kbase\nspec:\n  namespace: kb\n  targets:\n    - group: canary\n"
            ),
        );
        add(
            "workloads/kbase/kustomization.yaml",
            "resources:\n  - ../../bases/app\n".into(),
        );
        add(
            "bases/app/kustomization.yaml",
            "resources:\n  - cm.yaml\n".into(),
        );
        add(
            "bases/app/cm.yaml",
            format!(
                "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: base\ndata:\n  v: \"{}\"\n",
                self.base_value
            ),
        );
        add(
            "overlays/mirror.yaml",
            format!(
                "{HEADER}kind: Overlay\nmetadata:\n  name: mirror\nspec:\n  groups: [r0]\n  priority: 100\n  images:\n    - name: example.com/web\n      newName: m{}.example.com/web\n",
                self.mirror[0]
            ),
        );
        add(
            "overlays/stable.yaml",
            format!(
                "{HEADER}kind: Overlay\nmetadata:\n  name: stable\nspec:\n  groups: [stable]\n  workloads: [web]\n  priority: 10\n  patches:\n    - target: {{kind: {}}}\n      ops:\n        - {{op: add, path: /metadata/labels/replicas, value: \"{}\"}}\n",
                self.stable_target, self.replicas
            ),
        );
        // Matches only where a cluster is big: whether it matches anywhere changes
        // as clusters change.
        add(
            "overlays/big.yaml",
            format!(
                "{HEADER}kind: Overlay\nmetadata:\n  name: big\nspec:\n  clusterSelector:\n    matchLabels:\n      tier: stable\n  priority: 20\n  patches:\n    - target: {{kind: ConfigMap, name: big-config}}\n      merge:\n        metadata:\n          labels:\n            big: \"yes\"\n"
            ),
        );
        // Patches what plain and kbase carry, on every cluster.
        add(
            "overlays/services.yaml",
            format!(
                "{HEADER}kind: Overlay\nmetadata:\n  name: services\nspec:\n  clusterSelector: {{}}\n  priority: 40\n  patches:\n    - target: {{kind: Service}}\n      ops:\n        - {{op: add, path: /metadata/labels, value: {{svc: x}}}}\n    - target: {{kind: ConfigMap, name: base}}\n      ops:\n        - {{op: add, path: /metadata/labels, value: {{base: x}}}}\n    - target: {{kind: ConfigMap, name: plain-site}}\n      ops:\n        - {{op: add, path: /data/patched, value: \"yes\"}}\n"
            ),
        );
        add(
            "overlays/site.yaml",
            format!(
                "{HEADER}kind: Overlay\nmetadata:\n  name: site\nspec:\n  clusters: [{}]\n  priority: 30\n  labels:\n    site: special\n",
                self.site_overlay_cluster
            ),
        );
        add(
            "rollouts/edge.yaml",
            format!(
                "{HEADER}kind: RolloutPolicy\nmetadata:\n  name: edge\nspec:\n  clusterSelector:\n    matchExpressions:\n      - {{key: region, operator: Exists}}\n  waves:\n    - name: first\n      groups: [{}]\n      bake: 5m\n    - name: rest\n      bake: 5m\n",
                self.wave_group
            ),
        );
        // chart: a Helm chart on region r1's clusters, its values from a template of
        // the cluster's variables: a big cluster's release calls `lookup`, which
        // warns, and at times every release prints a value it does not have.
        add(
            "workloads/chart/workload.yaml",
            format!(
                "{HEADER}kind: Workload\nmetadata:\n  name: chart\nspec:\n  namespace: chart\n  targets:\n    - group: r1\n  helm:\n    chart: ../../charts/mini\n    valuesFiles: [site.yaml.j2]\n    values: {{note: \"n{}\"}}\n",
                self.chart_note
            ),
        );
        add(
            "workloads/chart/site.yaml.j2",
            "look: {{ 'true' if cluster.vars.big else 'false' }}\nsite: \"{{ cluster.vars.siteId }}\"\n".into(),
        );
        add(
            "tenants/team.yaml",
            format!(
                "{HEADER}kind: Tenant\nmetadata:\n  name: team\nspec:\n  workloads: [chart]\n  namespaces: [chart]\n  sharedPaths: [\"charts/mini/**\"]\n  clusterScoped: [{}]\n",
                if self.tenant_widgets {
                    "Widget.example.com"
                } else {
                    ""
                }
            ),
        );
        add(
            "charts/mini/templates/widget.yaml",
            "apiVersion: example.com/v1\nkind: Widget\nmetadata:\n  name: mini\nspec:\n  size: small\n".into(),
        );
        add(
            "charts/mini/Chart.yaml",
            "apiVersion: v2\nname: mini\nversion: 0.1.0\n".into(),
        );
        add(
            "charts/mini/templates/cm.yaml",
            format!(
                "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: mini\ndata:\n  site: {{{{ .Values.site | quote }}}}\n  note: {{{{ .Values.note | quote }}}}\n{{{{- if .Values.look }}}}\n  found: {{{{ len (lookup \"v1\" \"Secret\" \"chart\" \"db\") | quote }}}}\n{{{{- end }}}}\n{}",
                if self.chart_missing {
                    "  missing: \"{{ .Values.missing }}\"\n"
                } else {
                    ""
                }
            ),
        );
        add("README.md", format!("notes {}\n", self.readme));
        files
    }

    fn pick_cluster(&self, rng: &mut Rng) -> Option<String> {
        let names: Vec<&String> = self.clusters.keys().collect();
        (!names.is_empty()).then(|| names[rng.below(names.len())].clone())
    }

    fn pick_spec(&mut self, rng: &mut Rng) -> Option<&mut ClusterSpec> {
        let name = self.pick_cluster(rng)?;
        self.clusters.get_mut(&name)
    }

    /// Makes one random edit; true when it changed one cluster's own file only.
    fn edit(&mut self, rng: &mut Rng) -> bool {
        let kind = rng.below(17);
        match kind {
            0 | 1 => {
                if let Some(c) = self.pick_spec(rng) {
                    c.site += 1;
                }
            }
            2 => {
                let region = rng.below(3);
                if let Some(c) = self.pick_spec(rng) {
                    c.region = region;
                }
            }
            3 | 4 => {
                if let Some(c) = self.pick_spec(rng) {
                    c.big = !c.big;
                }
            }
            5 => {
                let key = rng.below(2) == 0;
                if let Some(c) = self.pick_spec(rng) {
                    if key {
                        c.keyed = !c.keyed;
                    } else {
                        c.canary = !c.canary;
                    }
                }
            }
            6 => {
                let name = format!("c{:02}", self.next_cluster);
                self.next_cluster += 1;
                self.clusters.insert(
                    name,
                    ClusterSpec {
                        region: rng.below(3),
                        canary: rng.below(2) == 0,
                        site: 0,
                        big: rng.below(2) == 0,
                        broken: false,
                        keyed: false,
                    },
                );
            }
            7 => {
                if self.clusters.len() > 1
                    && let Some(name) = self.pick_cluster(rng)
                {
                    self.clusters.remove(&name);
                }
            }
            8 => {
                if let Some(c) = self.pick_spec(rng) {
                    c.broken = !c.broken;
                }
            }
            9 => self.mirror[rng.below(3)] += 1,
            10 => self.r2_selects = rng.below(3),
            11 => self.replicas += 1,
            12 => {
                self.stable_target = if self.stable_target == "Deployment" {
                    "Job"
                } else {
                    "Deployment"
                }
            }
            13 => match rng.below(9) {
                0 => self.image += 1,
                1 => self.macro_suffix += 1,
                2 => self.plain_port += 1,
                3 => self.plain_crd = !self.plain_crd,
                4 => self.widget_size_integer = !self.widget_size_integer,
                5 => self.chart_note += 1,
                6 => self.chart_missing = !self.chart_missing,
                7 => self.tenant_widgets = !self.tenant_widgets,
                _ => self.base_value += 1,
            },
            14 => self.crd_group = rng.below(3),
            15 => {
                self.wave_group = if self.wave_group == "canary" {
                    "r1"
                } else {
                    "canary"
                }
            }
            _ => match rng.below(2) {
                0 => self.readme += 1,
                _ => {
                    if let Some(name) = self.pick_cluster(rng) {
                        self.site_overlay_cluster = name;
                    }
                }
            },
        }
        matches!(kind, 0..=5)
    }
}

fn snapshot(files: &BTreeMap<String, String>, revision: usize) -> FleetSnapshot {
    let mut snapshot =
        FleetSnapshot::from_files(files.iter().map(|(p, t)| (p.as_str(), t.as_str())));
    snapshot.revision = format!("r{revision}");
    snapshot
}

/// Renders and counts the clusters rendered (from the progress reports).
fn counted(
    helm_seed: Option<[u8; 32]>,
    render: impl FnOnce(&RenderOptions<'_>) -> RenderOutput,
) -> (RenderOutput, usize) {
    let rendered = AtomicUsize::new(0);
    let progress = |_: usize, _: usize| {
        rendered.fetch_add(1, Ordering::Relaxed);
    };
    let options = RenderOptions {
        progress: Some(&progress),
        helm_seed,
        ..RenderOptions::default()
    };
    let output = render(&options);
    (output, rendered.load(Ordering::Relaxed))
}

fn digests(output: &RenderOutput) -> BTreeMap<&str, String> {
    output
        .bundles
        .iter()
        .map(|(name, bundle)| (name.as_str(), bundle.digest.to_string()))
        .collect()
}

fn assert_same(incremental: &RenderOutput, full: &RenderOutput, context: &str) {
    assert_eq!(digests(incremental), digests(full), "{context}");
    assert_eq!(incremental.diagnostics, full.diagnostics, "{context}");
    assert_eq!(incremental.memberships, full.memberships, "{context}");
    assert_eq!(incremental.labels, full.labels, "{context}");
    assert_eq!(incremental.rollouts, full.rollouts, "{context}");
    assert_eq!(incremental.provenance, full.provenance, "{context}");
    assert_eq!(incremental.revision, full.revision, "{context}");
}

/// Over the steps of one case that edited only clusters' own files, from a clean
/// render to a clean render: clusters rendered incrementally, bundles in all, and
/// how many such steps; and the steps with a warning.
#[derive(Default)]
struct Tally {
    rendered: usize,
    clusters: usize,
    clean_steps: usize,
    warned_steps: usize,
}

fn check_seed(seed: u64, steps: usize) -> Tally {
    let mut tally = Tally::default();
    let mut rng = Rng(seed | 1);
    // Every other case renders as a hub does, with its own seed: Secrets of clusters
    // with an agent key are sealed to it.
    let helm_seed = (seed & 2 != 0).then_some([9; 32]);
    let options = RenderOptions {
        helm_seed,
        ..RenderOptions::default()
    };
    let mut fleet = Fleet::new(&mut rng);
    let mut previous = render_with(&snapshot(&fleet.files(), 0), &options);
    assert!(previous.is_clean(), "{:?}", previous.diagnostics);
    for step in 1..=steps {
        let mut local = true;
        for _ in 0..1 + rng.below(2) {
            local &= fleet.edit(&mut rng);
        }
        let snapshot = snapshot(&fleet.files(), step);
        let (full, _) = counted(helm_seed, |options| render_with(&snapshot, options));
        let (incremental, rendered) = counted(helm_seed, |options| {
            render_since(&previous, &snapshot, options)
        });
        assert_same(&incremental, &full, &format!("seed {seed}, step {step}"));
        // The same from a previous render that holds digests only, the bundles to
        // merge with asked for once (as the hub's render process does).
        let stubbed = RenderOutput {
            bundles: previous
                .bundles
                .iter()
                .map(|(name, b)| {
                    let stub = Bundle {
                        cluster: b.cluster.clone(),
                        digest: b.digest.clone(),
                        resources: Vec::new(),
                        meta: b.meta.clone(),
                    };
                    (name.clone(), stub)
                })
                .collect(),
            diagnostics: previous.diagnostics.clone(),
            provenance: previous.provenance.clone(),
            ..RenderOutput::default()
        };
        let mut asked = 0;
        let fetched = render_since_fetching(&stubbed, &snapshot, &options, &mut |names| {
            asked += 1;
            names
                .iter()
                .map(|n| previous.bundles.get(n).cloned())
                .collect()
        });
        assert!(asked <= 1);
        assert_same(
            &fetched,
            &full,
            &format!("fetching: seed {seed}, step {step}"),
        );
        if local && previous.is_clean() && full.is_clean() {
            tally.rendered += rendered;
            tally.clusters += full.bundles.len();
            tally.clean_steps += 1;
        }
        if full.warnings().next().is_some() {
            tally.warned_steps += 1;
        }
        previous = incremental;
    }
    tally
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 160, ..ProptestConfig::default() })]

    #[test]
    fn incremental_render_equals_full_render(seed in any::<u64>()) {
        check_seed(seed, 6);
    }
}

/// Edits of one or two clusters' files render few clusters again; and the
/// generator makes warnings often enough to test them too.
#[test]
fn incremental_render_renders_fewer_clusters() {
    let mut total = Tally::default();
    for seed in 1..=60u64 {
        let tally = check_seed(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15), 6);
        total.rendered += tally.rendered;
        total.clusters += tally.clusters;
        total.clean_steps += tally.clean_steps;
        total.warned_steps += tally.warned_steps;
    }
    let Tally {
        rendered,
        clusters,
        clean_steps,
        warned_steps,
    } = total;
    eprintln!(
        "rendered {rendered} of {clusters} clusters in {clean_steps} steps; {warned_steps} steps warned"
    );
    assert!(clean_steps > 40, "{clean_steps} clean steps");
    assert!(warned_steps > 20, "{warned_steps} steps with warnings");
    assert!(
        rendered * 3 < clusters,
        "rendered {rendered} of {clusters} clusters"
    );
}

/// Cases found by review, each once a difference between the two renders.
mod cases {
    use super::*;

    fn cluster(name: &str) -> String {
        format!("{HEADER}kind: Cluster\nmetadata:\n  name: {name}\nspec: {{}}\n")
    }

    fn workload(name: &str, cluster: &str) -> String {
        format!(
            "{HEADER}kind: Workload\nmetadata:\n  name: {name}\nspec:\n  namespace: default\n  targets:\n    - cluster: {cluster}\n"
        )
    }

    /// Two clusters, each with a workload of its own.
    fn base() -> BTreeMap<String, String> {
        BTreeMap::from([
            ("clusters/c1.yaml".into(), cluster("c1")),
            ("clusters/c2.yaml".into(), cluster("c2")),
            ("workloads/w1/workload.yaml".into(), workload("w1", "c1")),
            ("workloads/w2/workload.yaml".into(), workload("w2", "c2")),
        ])
    }

    /// Renders `after` in full and since a render of `before`.
    fn both(before: &BTreeMap<String, String>, after: &BTreeMap<String, String>) {
        let previous = render_with(&snapshot(before, 0), &RenderOptions::default());
        assert!(previous.is_clean(), "{:?}", previous.diagnostics);
        let full = render_with(&snapshot(after, 1), &RenderOptions::default());
        let incremental = render_since(&previous, &snapshot(after, 1), &RenderOptions::default());
        assert_same(&incremental, &full, "after the edit");
    }

    /// A cluster whose only warning depends on its own file alone (a Kubernetes
    /// version flotilla has no schema for) keeps its bundle and its warning when
    /// another cluster's workload changes.
    #[test]
    fn a_cluster_warned_of_its_kubernetes_version_is_not_rendered_again_for_another() {
        let mut before = base();
        before.insert(
            "clusters/c1.yaml".into(),
            format!(
                "{HEADER}kind: Cluster\nmetadata:\n  name: c1\nspec:\n  kubernetes: {{version: \"1.99.0\"}}\n"
            ),
        );
        let previous = render_with(&snapshot(&before, 0), &RenderOptions::default());
        assert!(previous.is_clean(), "{:?}", previous.diagnostics);
        assert!(
            previous
                .warnings()
                .any(|w| w.cluster.as_deref() == Some("c1") && w.message.contains("1.99")),
            "{:?}",
            previous.diagnostics
        );
        let mut after = before.clone();
        after.insert(
            "workloads/w2/manifests/config.yaml".into(),
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\ndata:\n  level: debug\n"
                .into(),
        );
        let full = render_with(&snapshot(&after, 1), &RenderOptions::default());
        let (incremental, rendered) = counted(None, |options| {
            render_since(&previous, &snapshot(&after, 1), options)
        });
        assert_same(&incremental, &full, "after the edit");
        assert_eq!(rendered, 1, "only c2 is rendered again");
    }

    /// A value decrypted from one workload's SOPS file, found in plain text in
    /// another cluster's ConfigMap, is a warning of that cluster that depends on a
    /// file outside its inputs: once the value is rotated, the warning goes, though
    /// that cluster is not rendered again.
    #[test]
    fn a_warning_about_another_workloads_sops_value_goes_when_the_value_changes() {
        use age::secrecy::ExposeSecret as _;
        use flotilla_render::seal::AgentKey;
        use flotilla_render::sops::{DecryptionKeys, SopsKeys, SopsWriter};
        let identity = age::x25519::Identity::generate();
        let recipient = AgentKey::parse(&identity.to_public().to_string()).expect("a recipient");
        let keys = DecryptionKeys::from_identity_file(identity.to_string().expose_secret())
            .expect("an identity");
        let options = RenderOptions {
            sops: SopsKeys::Open(std::sync::Arc::new(keys)),
            ..RenderOptions::default()
        };
        let files = |password: &str| {
            let secret = serde_json::json!({
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": "db"},
                "stringData": {"password": password},
            });
            let mut files = base();
            files.insert(
                "workloads/w1/manifests/config.yaml".into(),
                "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: api\ndata:\n  password: s3cr3t-pw-one\n".into(),
            );
            files.insert(
                "workloads/w2/manifests/secret.yaml".into(),
                SopsWriter::new([1; 32], 1_700_000_000)
                    .encrypt(&secret, &recipient, "db")
                    .expect("encrypts"),
            );
            files
        };
        let warns_c1 = |output: &RenderOutput| {
            output
                .warnings()
                .any(|w| w.cluster.as_deref() == Some("c1"))
        };
        let previous = render_with(&snapshot(&files("s3cr3t-pw-one"), 0), &options);
        assert!(previous.is_clean(), "{:?}", previous.diagnostics);
        assert!(warns_c1(&previous), "{:?}", previous.diagnostics);
        let after = snapshot(&files("s3cr3t-pw-two"), 1);
        let full = render_with(&after, &options);
        assert!(!warns_c1(&full), "{:?}", full.diagnostics);
        assert_same(
            &render_since(&previous, &after, &options),
            &full,
            "after the rotation",
        );
    }

    /// `debug()` would show every template's name to every template, making a
    /// template's output depend on files that are not its inputs: it is not there.
    #[test]
    fn a_template_cannot_call_debug() {
        let mut files = base();
        files.insert(
            "workloads/w1/manifests/a.yaml.j2".into(),
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\ndata:\n  n: \"{{ debug() | length }}\"\n".into(),
        );
        let output = render_with(&snapshot(&files, 0), &RenderOptions::default());
        let errors: Vec<String> = output.errors().map(|d| d.message.clone()).collect();
        assert!(errors.iter().any(|m| m.contains("debug")), "{errors:?}");
    }

    /// A template includes another workload's template, and that workload stops
    /// loading: the include fails on the cluster, though no file of its own changed.
    #[test]
    fn an_include_whose_workload_stops_loading() {
        let mut before = base();
        before.insert(
            "workloads/w1/manifests/a.yaml.j2".into(),
            "{% include 'workloads/w2/manifests/b.yaml.j2' %}".into(),
        );
        before.insert(
            "workloads/w2/manifests/b.yaml.j2".into(),
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: b-{{ cluster.name }}\n".into(),
        );
        let mut after = before.clone();
        after.insert(
            "workloads/w2/workload.yaml".into(),
            workload("w2", "c2").replace("namespace: default", "namespace: Not_Valid"),
        );
        both(&before, &after);
    }

    /// `80` and `80.0` are one number in canonical JSON, but a strategic merge keys
    /// list items by the number as written: the edit changes the bundle.
    #[test]
    fn a_number_written_another_way() {
        let deployment = |port: &str| {
            format!(
                "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\nspec:\n  template:\n    spec:\n      containers:\n        - name: web\n          image: nginx\n          ports:\n            - containerPort: {port}\n              name: http\n"
            )
        };
        let mut before = base();
        before.insert(
            "workloads/w1/manifests/deploy.yaml".into(),
            deployment("80"),
        );
        before.insert(
            "overlays/ports.yaml".into(),
            format!(
                "{HEADER}kind: Overlay\nmetadata:\n  name: ports\nspec:\n  clusters: [c1]\n  patches:\n    - target:\n        kind: Deployment\n      strategic:\n        spec:\n          template:\n            spec:\n              containers:\n                - name: web\n                  ports:\n                    - containerPort: 80\n                      protocol: TCP\n"
            ),
        );
        let mut after = before.clone();
        after.insert(
            "workloads/w1/manifests/deploy.yaml".into(),
            deployment("80.0"),
        );
        both(&before, &after);
    }
}
