//! The synthetic fleet used by `examples/gen_fleet.rs` and `benches/render.rs`.
//!
//! Clusters spread over 10 regions with 5% canaries; one group per region and per
//! tier; workloads of `resources` resources each (Deployments, Services,
//! ConfigMaps), one in four with a template that uses cluster variables; overlays:
//! an image mirror per region, a patch per tier, and a cluster-specific overlay for
//! 1% of clusters.

#![allow(dead_code)]

use std::fmt::Write as _;

/// Files by path relative to the fleet root, in the order they were made.
#[derive(Default)]
pub struct Files(pub Vec<(String, String)>);

impl Files {
    fn add(&mut self, path: String, text: &str) {
        self.0.push((path, text.to_string()));
    }
}

const REGIONS: usize = 10;

fn region(index: usize) -> String {
    format!("r{:02}", index % REGIONS)
}

fn tier(index: usize) -> &'static str {
    if index.is_multiple_of(20) {
        "canary"
    } else {
        "stable"
    }
}

fn cluster_name(index: usize) -> String {
    format!("edge-{index:05}")
}

fn deployment(workload: usize, index: usize) -> String {
    format!(
        r#"apiVersion: apps/v1
kind: Deployment
metadata:
  name: w{workload:02}-app{index}
  labels:
    app: w{workload:02}-app{index}
    tier: backend
spec:
  replicas: 2
  selector:
    matchLabels:
      app: w{workload:02}-app{index}
  template:
    metadata:
      labels:
        app: w{workload:02}-app{index}
    spec:
      containers:
        - name: main
          image: registry.example.com/team/w{workload:02}-app:1.{index}.0
          ports:
            - containerPort: 8080
          env:
            - name: LOG_LEVEL
              value: info
            - name: FEATURE_FLAGS
              value: "a,b,c"
          resources:
            requests:
              cpu: 50m
              memory: 64Mi
"#
    )
}

fn service(workload: usize, index: usize) -> String {
    format!(
        r#"apiVersion: v1
kind: Service
metadata:
  name: w{workload:02}-svc{index}
  labels:
    app: w{workload:02}-app{index}
spec:
  selector:
    app: w{workload:02}-app{index}
  ports:
    - port: 80
      targetPort: 8080
"#
    )
}

fn config_map(workload: usize, index: usize) -> String {
    format!(
        r#"apiVersion: v1
kind: ConfigMap
metadata:
  name: w{workload:02}-config{index}
data:
  settings.yaml: |
    cache: 256
    upstream: https://api.example.com/w{workload:02}
    retries: 3
"#
    )
}

fn resource(workload: usize, index: usize) -> String {
    match index % 3 {
        0 => deployment(workload, index),
        1 => service(workload, index),
        _ => config_map(workload, index),
    }
}

/// The fleet repository's files.
pub fn fleet(clusters: usize, workloads: usize, resources: usize) -> Files {
    let mut files = Files::default();
    let header = |kind: &str| format!("apiVersion: flotilla.dev/v1alpha1\nkind: {kind}\n");
    for c in 0..clusters {
        let name = cluster_name(c);
        files.add(format!("clusters/{name}.yaml"),
            &format!(
                "{}metadata:\n  name: {name}\n  labels:\n    region: {}\n    tier: {}\nspec:\n  vars:\n    site: \"{c}\"\n",
                header("Cluster"),
                region(c),
                tier(c)
            ),
        );
    }
    for r in 0..REGIONS {
        let region = region(r);
        files.add(format!("groups/{region}.yaml"),
            &format!(
                "{}metadata:\n  name: {region}\nspec:\n  selector:\n    matchLabels:\n      region: {region}\n  vars:\n    mirror: mirror.{region}.example.com\n",
                header("Group")
            ),
        );
        files.add(format!("overlays/regions/{region}.yaml"),
            &format!(
                "{}metadata:\n  name: mirror-{region}\nspec:\n  groups: [{region}]\n  priority: 100\n  images:\n{}",
                header("Overlay"),
                (0..workloads)
                    .map(|w| format!("    - name: registry.example.com/team/w{w:02}-app\n      newName: mirror.{region}.example.com/team/w{w:02}-app\n"))
                    .collect::<String>()
            ),
        );
    }
    for tier in ["canary", "stable"] {
        files.add(format!("groups/{tier}.yaml"),
            &format!(
                "{}metadata:\n  name: {tier}\nspec:\n  selector:\n    matchLabels:\n      tier: {tier}\n",
                header("Group")
            ),
        );
        let replicas = if tier == "canary" { 1 } else { 3 };
        files.add(format!("overlays/tiers/{tier}.yaml"),
            &format!(
                "{}metadata:\n  name: tier-{tier}\nspec:\n  groups: [{tier}]\n  priority: 10\n  labels:\n    example.com/tier: {tier}\n  patches:\n    - target: {{kind: Deployment}}\n      ops:\n        - {{op: replace, path: /spec/replicas, value: {replicas}}}\n",
                header("Overlay")
            ),
        );
    }
    for c in (0..clusters).step_by(100) {
        let name = cluster_name(c);
        files.add(format!("overlays/sites/{name}.yaml"),
            &format!(
                "{}metadata:\n  name: site-{name}\nspec:\n  clusters: [{name}]\n  priority: 20\n  patches:\n    - target: {{kind: ConfigMap}}\n      merge:\n        data:\n          site-override: \"true\"\n",
                header("Overlay")
            ),
        );
    }
    for w in 0..workloads {
        let dir = format!("workloads/w{w:02}");
        files.add(
            format!("{dir}/workload.yaml"),
            &format!(
                "{}metadata:\n  name: w{w:02}\nspec:\n  namespace: ns-w{w:02}\n  targets:\n    - clusterSelector: {{}}\n  vars:\n    cacheSize: 256\n",
                header("Workload")
            ),
        );
        let templated = w.is_multiple_of(4);
        for r in 0..resources {
            if templated && r == resources - 1 {
                files.add(format!("{dir}/manifests/r{r}.yaml.j2"),
                    &format!(
                        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: w{w:02}-site\ndata:\n  site: \"{{{{ cluster.vars.site }}}}\"\n  cluster: {{{{ cluster.name }}}}\n  mirror: {{{{ vars.mirror }}}}\n  cache: \"{{{{ vars.cacheSize }}}}\"\n"
                    ),
                );
            } else {
                files.add(format!("{dir}/manifests/r{r}.yaml"), &resource(w, r));
            }
        }
    }
    files
}

/// The fleet of [`fleet`] with `percent` of its manifests per-cluster templates and
/// the rest literal, to compare templated and shared rendering on the same shapes.
/// Every manifest is the plain resource of [`fleet`] with one more annotation,
/// `example.com/site`: in a template it is the cluster's own `site` variable (so each
/// cluster's copy differs), in a literal manifest it is `"all"` (so clusters share
/// it). `percent = 0` and `percent = 100` give the literal and the templated fleet
/// of the same resources; manifest `i` (counting workload by workload) is a
/// template when `i % 100 < percent`.
pub fn fleet_templated(
    clusters: usize,
    workloads: usize,
    resources: usize,
    percent: usize,
) -> Files {
    let base = fleet(clusters, workloads, resources);
    let mut files = Files::default();
    for (path, text) in base.0 {
        let parts: Vec<&str> = path.split('/').collect();
        let ["workloads", workload, "manifests", file] = parts.as_slice() else {
            files.0.push((path, text));
            continue;
        };
        let w: usize = workload
            .trim_start_matches('w')
            .parse()
            .expect("workload number");
        let r: usize = file
            .trim_start_matches('r')
            .split('.')
            .next()
            .and_then(|n| n.parse().ok())
            .expect("manifest number");
        let templated = (w * resources + r) % 100 < percent;
        let site = if templated {
            "\"{{ cluster.vars.site }}\""
        } else {
            "\"all\""
        };
        let text = resource(w, r).replacen(
            "\nmetadata:\n",
            &format!("\nmetadata:\n  annotations:\n    example.com/site: {site}\n"),
            1,
        );
        let extension = if templated { "yaml.j2" } else { "yaml" };
        files.0.push((
            format!("workloads/{workload}/manifests/r{r}.{extension}"),
            text,
        ));
    }
    files
}

/// The fleet of [`fleet`] with every workload a kustomize base: its plain resources
/// listed by `workloads/<w>/kustomization.yaml` (from `base/`) with a name prefix,
/// a ConfigMap generator the Deployments read, a strategic merge patch (the
/// Deployments' `envFrom`) and a JSON patch (a label on the Services). Templates
/// stay under `manifests/`, beside the kustomization.
pub fn fleet_with_kustomize_bases(clusters: usize, workloads: usize, resources: usize) -> Files {
    let plain = fleet(clusters, workloads, resources);
    let mut files = Files::default();
    for (path, text) in plain.0 {
        let parts: Vec<&str> = path.split('/').collect();
        match parts.as_slice() {
            ["workloads", workload, "manifests", file] if !file.ends_with(".j2") => {
                files.add(format!("workloads/{workload}/base/{file}"), &text);
            }
            _ => files.0.push((path, text)),
        }
    }
    for w in 0..workloads {
        let templated = w.is_multiple_of(4);
        let mut text = String::from(
            "namePrefix: k-
resources:
",
        );
        for r in 0..resources {
            if templated && r == resources - 1 {
                continue;
            }
            let _ = writeln!(text, "  - base/r{r}.yaml");
        }
        let _ = write!(
            text,
            r#"configMapGenerator:
  - name: w{w:02}-settings
    literals:
      - LOG_LEVEL=info
      - UPSTREAM=https://api.example.com/w{w:02}
      - RETRIES=3
patches:
  - target:
      kind: Deployment
    patch: |-
      apiVersion: apps/v1
      kind: Deployment
      metadata:
        name: any
      spec:
        template:
          spec:
            containers:
              - name: main
                envFrom:
                  - configMapRef:
                      name: w{w:02}-settings
  - target:
      kind: Service
    patch: |-
      - op: add
        path: /metadata/labels/exposed
        value: "true"
"#
        );
        files.add(format!("workloads/w{w:02}/kustomization.yaml"), &text);
    }
    files
}

/// The same fleet for the first K clusters as kustomize sees it: one base per
/// workload, one overlay folder per cluster with the region's images, the tier's
/// patch and labels. Template manifests have no kustomize equivalent and are
/// written as plain ConfigMaps with the values filled in.
pub fn kustomize(clusters: usize, workloads: usize, resources: usize, count: usize) -> Files {
    let mut files = Files::default();
    for w in 0..workloads {
        let dir = format!("bases/w{w:02}");
        let mut kustomization = format!("namespace: ns-w{w:02}\nresources:\n");
        for r in 0..resources {
            if w.is_multiple_of(4) && r == resources - 1 {
                continue;
            }
            files.add(format!("{dir}/r{r}.yaml"), &resource(w, r));
            let _ = writeln!(kustomization, "  - r{r}.yaml");
        }
        files.add(format!("{dir}/kustomization.yaml"), &kustomization);
    }
    for c in 0..count.min(clusters) {
        let name = cluster_name(c);
        let region = region(c);
        let tier = tier(c);
        let replicas = if tier == "canary" { 1 } else { 3 };
        let mut text = String::from("resources:\n");
        for w in 0..workloads {
            let _ = writeln!(text, "  - ../../bases/w{w:02}");
            if w.is_multiple_of(4) {
                let _ = writeln!(text, "  - site-w{w:02}.yaml");
                files.add(format!("clusters/{name}/site-w{w:02}.yaml"),
                    &format!(
                        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: w{w:02}-site\n  namespace: ns-w{w:02}\ndata:\n  site: \"{c}\"\n  cluster: {name}\n  mirror: mirror.{region}.example.com\n  cache: \"256\"\n"
                    ),
                );
            }
        }
        let _ = write!(
            text,
            "labels:\n  - pairs:\n      example.com/tier: {tier}\npatches:\n  - target: {{kind: Deployment}}\n    patch: |\n      - {{op: replace, path: /spec/replicas, value: {replicas}}}\n"
        );
        if c % 100 == 0 {
            // kustomize wants a strategic-merge patch to name its object, so the
            // same change is written as a JSON patch.
            text.push_str("  - target: {kind: ConfigMap}\n    patch: |\n      - {op: add, path: /data/site-override, value: \"true\"}\n");
        }
        text.push_str("images:\n");
        for w in 0..workloads {
            let _ = writeln!(
                text,
                "  - name: registry.example.com/team/w{w:02}-app\n    newName: mirror.{region}.example.com/team/w{w:02}-app"
            );
        }
        files.add(format!("clusters/{name}/kustomization.yaml"), &text);
    }
    files
}
