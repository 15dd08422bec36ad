//! Differential check against kustomize: for overlays both can express (images,
//! RFC 6902 ops with targets, merge patches on non-list fields, a namespace for
//! resources that name none, labels and annotations on metadata), flotilla and
//! `kubectl kustomize` produce the same set of resources.
//!
//! Each case is one set of manifests with a flotilla overlay and the equivalent
//! kustomization. flotilla renders in memory; kustomize runs on a temporary folder.
//! Both outputs are compared as sets of JSON values. Without `kubectl` the tests
//! print that they skip and why, and pass; in CI (`FLOTILLA_CI=1`) they fail instead.
//!
//! Where the two deliberately differ, `known_differences` pins both sides, so the
//! list in the documentation stays true.

use std::path::Path;
use std::process::Command;

use flotilla_core::bundle::ResourceKey;
use flotilla_core::snapshot::FleetSnapshot;
use flotilla_render::render;
use pretty_assertions::assert_eq;
use serde_json::Value;

struct Case {
    /// Multi-document YAML, given to both as `resources.yaml`.
    manifests: &'static str,
    /// flotilla's `spec.namespace` of the workload.
    namespace: Option<&'static str>,
    /// The overlay's spec after `clusters: [edge]`, indented by two spaces.
    overlay: &'static str,
    /// The kustomization after `resources: [resources.yaml]`.
    kustomization: &'static str,
}

fn kubectl_available(test: &str) -> bool {
    flotilla_testkit::can_run(
        test,
        flotilla_testkit::command_works("kubectl", &["version", "--client"]).err(),
    )
}

fn flotilla_output(case: &Case) -> Vec<Value> {
    let workload = format!(
        "apiVersion: flotilla.dev/v1alpha1\nkind: Workload\nmetadata:\n  name: app\nspec:\n{}  targets:\n    - cluster: edge\n",
        case.namespace
            .map(|ns| format!("  namespace: {ns}\n"))
            .unwrap_or_default()
    );
    let overlay = format!(
        "apiVersion: flotilla.dev/v1alpha1\nkind: Overlay\nmetadata:\n  name: case\nspec:\n  clusters: [edge]\n{}",
        case.overlay
    );
    // The cases hold what kustomize's tests hold, not always valid Kubernetes
    // (integers among a container's args): builds are compared, the schema check is off.
    let snapshot = FleetSnapshot::from_files([
        (
            "flotilla.yaml",
            "apiVersion: flotilla.dev/v1alpha1\nkind: FleetSettings\nspec:\n  validation: off\n",
        ),
        (
            "clusters/edge.yaml",
            "apiVersion: flotilla.dev/v1alpha1\nkind: Cluster\nmetadata:\n  name: edge\n",
        ),
        ("workloads/app/workload.yaml", workload.as_str()),
        ("workloads/app/manifests/resources.yaml", case.manifests),
        ("overlays/case.yaml", overlay.as_str()),
    ]);
    let output = render(&snapshot);
    assert!(
        output.diagnostics.is_empty(),
        "flotilla: {:#?}",
        output.diagnostics
    );
    output.bundles["edge"]
        .resources
        .iter()
        .map(|r| r.value())
        .collect()
}

fn kustomize_output(case: &Case) -> Vec<Value> {
    let dir = tempfile::tempdir().expect("temp dir");
    write(dir.path(), "resources.yaml", case.manifests);
    write(
        dir.path(),
        "kustomization.yaml",
        &format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - resources.yaml\n{}",
            case.kustomization
        ),
    );
    let output = Command::new("kubectl")
        .arg("kustomize")
        .arg(dir.path())
        .output()
        .expect("kubectl runs");
    assert!(
        output.status.success(),
        "kubectl kustomize failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8(output.stdout).expect("kustomize prints UTF-8");
    // Read as kustomize reads YAML (`- tRUE` is a string there).
    flotilla_render::yaml::parse_documents(&text)
        .unwrap_or_else(|err| panic!("kustomize's output is not YAML: {}\n{text}", err.message))
        .into_iter()
        .map(|d| d.value)
        .collect()
}

fn write(dir: &Path, name: &str, text: &str) {
    std::fs::write(dir.join(name), text).expect("write");
}

fn sorted(mut resources: Vec<Value>) -> Vec<Value> {
    resources.sort_by_key(|r| ResourceKey::of(r).expect("resources have identities"));
    resources
}

/// Pretty JSON of the canonical form, so that `8` and `8.0` compare equal, as they
/// are in a bundle.
fn pretty(resources: &[Value]) -> Vec<String> {
    resources
        .iter()
        .map(|r| {
            let mut bytes = Vec::new();
            flotilla_core::bundle::write_canonical(&mut bytes, r);
            let normal: Value = serde_json::from_slice(&bytes).expect("canonical JSON parses");
            serde_json::to_string_pretty(&normal).expect("serialisable")
        })
        .collect()
}

/// Both produce the same set of resources.
fn check(case: &Case) {
    if !kubectl_available("kustomize_diff: a case compared with `kubectl kustomize`") {
        return;
    }
    let ours = sorted(flotilla_output(case));
    let theirs = sorted(kustomize_output(case));
    assert!(!ours.is_empty());
    assert_eq!(
        pretty(&ours),
        pretty(&theirs),
        "flotilla (left), kustomize (right)"
    );
}

const DEPLOYMENT: &str = "\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  labels: {app: web, tier: front}
spec:
  replicas: 1
  selector: {matchLabels: {app: web}}
  strategy: {type: RollingUpdate, rollingUpdate: {maxSurge: 1, maxUnavailable: 0}}
  template:
    metadata: {labels: {app: web}}
    spec:
      initContainers:
        - {name: init, image: 'busybox:1.36'}
      containers:
        - {name: web, image: 'nginx:1.25', ports: [{containerPort: 80}]}
        - {name: pinned, image: 'nginx@sha256:1111111111111111111111111111111111111111111111111111111111111111'}
        - {name: sidecar, image: 'registry.local:5000/team/sidecar:v1@sha256:2222222222222222222222222222222222222222222222222222222222222222'}
        - {name: cache, image: redis}
        - {name: both, image: 'memcached:1.6'}
";

#[test]
fn images_new_name_new_tag_and_digest() {
    let manifests: &str = &format!(
        "{DEPLOYMENT}---
apiVersion: batch/v1
kind: CronJob
metadata: {{name: nightly}}
spec:
  schedule: '0 3 * * *'
  jobTemplate:
    spec:
      template:
        spec:
          restartPolicy: Never
          containers: [{{name: job, image: 'nginx:1.25'}}]
---
apiVersion: example.com/v1
kind: Runner
metadata: {{name: custom}}
spec:
  image: 'nginx:1.25'
  pod:
    containers: [{{name: a, image: 'redis:7'}}]
"
    );
    let images = "
  - {name: nginx, newTag: '1.27'}
  - {name: registry.local:5000/team/sidecar, newName: mirror.local/sidecar}
  - {name: redis, newName: mirror.local/redis, newTag: '7.2'}
  - {name: busybox, digest: 'sha256:3333333333333333333333333333333333333333333333333333333333333333'}
  - {name: memcached, newTag: '1.7', digest: 'sha256:4444444444444444444444444444444444444444444444444444444444444444'}
";
    check(&Case {
        manifests: Box::leak(manifests.to_string().into_boxed_str()),
        namespace: None,
        overlay: Box::leak(format!("  images:{}", indent(images, 2)).into_boxed_str()),
        kustomization: Box::leak(format!("images:{images}").into_boxed_str()),
    });
}

fn indent(text: &str, by: usize) -> String {
    let pad = " ".repeat(by);
    text.lines()
        .map(|line| {
            if line.is_empty() {
                String::new()
            } else {
                format!("{pad}{line}")
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

const SERVICES: &str = "\
apiVersion: v1
kind: Service
metadata: {name: web-a, labels: {app: web, tier: front}}
spec: {ports: [{port: 80}], selector: {app: web}}
---
apiVersion: v1
kind: Service
metadata: {name: web-b, labels: {app: web, tier: back, legacy: 'true'}}
spec: {ports: [{port: 81}], selector: {app: web}}
---
apiVersion: v1
kind: Service
metadata: {name: xweb-a, labels: {app: other, tier: front}}
spec: {ports: [{port: 82}], selector: {app: other}}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: web-a, labels: {app: web}}
data: {mode: blue, list: '1,2'}
";

#[test]
fn json_patch_ops_with_kind_name_and_label_targets() {
    let manifests: &str = Box::leak(format!("{DEPLOYMENT}---\n{SERVICES}").into_boxed_str());
    check(&Case {
        manifests,
        namespace: None,
        overlay: "  patches:
    - target: {kind: Service, name: 'web-.*'}
      ops:
        - {op: add, path: /metadata/annotations, value: {patched: by-name}}
        - {op: replace, path: /spec/ports/0/port, value: 8080}
    - target: {labelSelector: 'tier in (front,back),!legacy'}
      ops:
        - {op: add, path: /metadata/labels/selected, value: 'yes'}
    - target: {group: apps, version: v1, kind: Deployment}
      ops:
        - {op: test, path: /spec/replicas, value: 1}
        - {op: replace, path: /spec/replicas, value: 3}
        - {op: add, path: /spec/template/spec/containers/0/ports/-, value: {containerPort: 443}}
        - {op: remove, path: /spec/strategy/rollingUpdate/maxSurge}
        - {op: copy, from: /metadata/labels/tier, path: /spec/template/metadata/labels/tier}
        - {op: move, from: /spec/template/spec/initContainers, path: /spec/template/spec/extraInit}
    - target: {version: v1, kind: ConfigMap, name: web-a}
      ops:
        - {op: add, path: /data/extra, value: '1'}
",
        kustomization: "patches:
  - target: {kind: Service, name: 'web-.*'}
    patch: |-
      - {op: add, path: /metadata/annotations, value: {patched: by-name}}
      - {op: replace, path: /spec/ports/0/port, value: 8080}
  - target: {labelSelector: 'tier in (front,back),!legacy'}
    patch: |-
      - {op: add, path: /metadata/labels/selected, value: 'yes'}
  - target: {group: apps, version: v1, kind: Deployment}
    patch: |-
      - {op: test, path: /spec/replicas, value: 1}
      - {op: replace, path: /spec/replicas, value: 3}
      - {op: add, path: /spec/template/spec/containers/0/ports/-, value: {containerPort: 443}}
      - {op: remove, path: /spec/strategy/rollingUpdate/maxSurge}
      - {op: copy, from: /metadata/labels/tier, path: /spec/template/metadata/labels/tier}
      - {op: move, from: /spec/template/spec/initContainers, path: /spec/template/spec/extraInit}
  - target: {version: v1, kind: ConfigMap, name: web-a}
    patch: |-
      - {op: add, path: /data/extra, value: '1'}
",
    });
}

/// A merge patch on fields that are not lists: RFC 7396 in flotilla, a strategic
/// merge patch in kustomize, which agree there (null deletes a key; but see
/// `known_differences` for labels and annotations).
#[test]
fn merge_patches_on_non_list_fields() {
    let manifests: &str = Box::leak(format!("{DEPLOYMENT}---\n{SERVICES}").into_boxed_str());
    check(&Case {
        manifests,
        namespace: None,
        overlay: "  patches:
    - target: {kind: Deployment, name: web}
      merge:
        metadata: {labels: {release: canary}}
        spec:
          replicas: 2
          strategy: {type: Recreate, rollingUpdate: null}
          template: {metadata: {annotations: {restarted: 'now'}}}
    - target: {kind: ConfigMap}
      merge: {data: {mode: green, list: null, added: 'x'}}
",
        kustomization: "patches:
  - target: {kind: Deployment, name: web}
    patch: |-
      apiVersion: apps/v1
      kind: Deployment
      metadata: {name: web, labels: {release: canary}}
      spec:
        replicas: 2
        strategy: {type: Recreate, rollingUpdate: null}
        template: {metadata: {annotations: {restarted: 'now'}}}
  - target: {kind: ConfigMap}
    patch: |-
      apiVersion: v1
      kind: ConfigMap
      metadata: {name: any}
      data: {mode: green, list: null, added: 'x'}
",
    });
}

/// A strategic merge patch in an overlay and the same patch in a kustomization agree,
/// lists merged by their keys included.
#[test]
fn strategic_merge_patches_on_lists() {
    let patch = "spec:
  replicas: 2
  template:
    spec:
      initContainers:
        - name: init
          $patch: delete
      containers:
        - name: web
          ports: [{containerPort: 8443, name: https}]
          env: [{name: MODE, value: edge}]
        - name: cache
          image: redis:7.2
        - name: logger
          image: fluent-bit:3
";
    check(&Case {
        manifests: DEPLOYMENT,
        namespace: None,
        overlay: Box::leak(
            format!(
                "  patches:\n    - target: {{kind: Deployment}}\n      strategic:\n{}",
                indent(patch, 8)
            )
            .into_boxed_str(),
        ),
        kustomization: Box::leak(
            format!(
                "patches:\n  - target: {{kind: Deployment}}\n    patch: |-\n      apiVersion: apps/v1\n      kind: Deployment\n      metadata: {{name: web}}\n{}",
                indent(patch, 6)
            )
            .into_boxed_str(),
        ),
    });
}

/// YAML scalars in manifests read as kustomize reads them: legacy octal numbers,
/// `yes`/`on` as strings, timestamps written as Go writes them.
#[test]
fn yaml_scalars_in_manifests() {
    check(&Case {
        manifests: "apiVersion: v1
kind: Pod
metadata: {name: scalars, annotations: {a: yes, b: on, c: 2024-01-02}}
spec:
  containers:
    - name: c
      image: busybox
      args: [yes, on, y, off, no, 0755, 012, 0o17, 0x1F, 1_000, 08, 1e3, .5, +12, 2001-12-14T21:59:43.10-05:00, tRUE, Null]
  volumes:
    - {name: a, configMap: {name: c, defaultMode: 0755}}
    - {name: b, secret: {secretName: s, defaultMode: 0644}}
",
        namespace: None,
        overlay: "  labels: {seen: 'true'}\n",
        kustomization: "labels:\n  - pairs: {seen: 'true'}\n",
    });
}

/// The workload's namespace and kustomize's `namespace:` agree on resources that
/// name none: namespaced kinds get it, built-in cluster-scoped kinds do not.
#[test]
fn namespace_for_resources_that_name_none() {
    let manifests: &str = Box::leak(
        format!(
            "{DEPLOYMENT}---\n{SERVICES}---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {{name: reader}}
rules: [{{apiGroups: [''], resources: [pods], verbs: [get]}}]
---
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {{name: local}}
provisioner: rancher.io/local-path
---
apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata: {{name: edge}}
spec: {{controller: example.com/ingress}}
---
apiVersion: example.com/v1
kind: Widget
metadata: {{name: gadget}}
spec: {{size: 3}}
"
        )
        .into_boxed_str(),
    );
    check(&Case {
        manifests,
        namespace: Some("shop"),
        overlay: "  labels: {unused: 'no'}\n",
        kustomization: "namespace: shop\nlabels:\n  - pairs: {unused: 'no'}\n",
    });
}

/// Labels and annotations on metadata only: kustomize `labels` without
/// `includeSelectors`, and `commonAnnotations` on kinds without a pod template.
#[test]
fn labels_and_annotations() {
    check(&Case {
        manifests: SERVICES,
        namespace: Some("shop"),
        overlay: "  labels: {team: edge, app.kubernetes.io/managed-by: flotilla}
  annotations: {owner: platform, example.com/source: 'https://git.example.com/fleet'}
",
        kustomization: "namespace: shop
labels:
  - pairs: {team: edge, app.kubernetes.io/managed-by: flotilla}
commonAnnotations: {owner: platform, example.com/source: 'https://git.example.com/fleet'}
",
    });
}

/// With a pod template, kustomize's `commonAnnotations` also annotates the template;
/// an AnnotationsTransformer limited to `metadata/annotations` is flotilla's
/// `annotations` exactly.
#[test]
fn annotations_on_metadata_only_with_a_pod_template() {
    check(&Case {
        manifests: DEPLOYMENT,
        namespace: None,
        overlay: "  annotations: {owner: platform}\n  labels: {team: edge}\n",
        kustomization: "labels:
  - pairs: {team: edge}
transformers:
  - |-
    apiVersion: builtin
    kind: AnnotationsTransformer
    metadata: {name: metadata-only}
    annotations: {owner: platform}
    fieldSpecs:
      - {path: metadata/annotations, create: true}
",
    });
}

/// Everything at once, in the order both apply it (namespace, patches, then labels,
/// annotations and images, which touch different fields).
#[test]
fn all_together() {
    let manifests: &str = Box::leak(format!("{DEPLOYMENT}---\n{SERVICES}").into_boxed_str());
    check(&Case {
        manifests,
        namespace: Some("shop"),
        overlay: "  images:
    - {name: nginx, newName: mirror.local/nginx, newTag: '1.27'}
  labels: {team: edge}
  patches:
    - target: {kind: Service, name: 'web-.*', labelSelector: tier=front}
      ops:
        - {op: replace, path: /spec/ports/0/port, value: 9090}
    - target: {kind: Deployment}
      merge: {spec: {replicas: 4}}
",
        kustomization: "namespace: shop
images:
  - {name: nginx, newName: mirror.local/nginx, newTag: '1.27'}
labels:
  - pairs: {team: edge}
patches:
  - target: {kind: Service, name: 'web-.*', labelSelector: tier=front}
    patch: |-
      - {op: replace, path: /spec/ports/0/port, value: 9090}
  - target: {kind: Deployment}
    patch: |-
      apiVersion: apps/v1
      kind: Deployment
      metadata: {name: web}
      spec: {replicas: 4}
",
    });
}

/// Where flotilla deliberately differs from kustomize. Each entry names a resource,
/// a field, flotilla's value and kustomize's; if either side changes, this fails and
/// the list (here and in the report) needs updating.
#[test]
fn known_differences() {
    if !kubectl_available("kustomize_diff::known_differences") {
        return;
    }
    struct Difference {
        why: &'static str,
        case: Case,
        kind: &'static str,
        pointer: &'static str,
        flotilla: Value,
        kustomize: Value,
    }
    let differences = [
        Difference {
            why: "commonAnnotations also annotates pod templates (a change restarts pods); \
                  flotilla's annotations touch metadata only",
            case: Case {
                manifests: DEPLOYMENT,
                namespace: None,
                overlay: "  annotations: {owner: platform}\n",
                kustomization: "commonAnnotations: {owner: platform}\n",
            },
            kind: "Deployment",
            pointer: "/spec/template/metadata/annotations",
            flotilla: Value::Null,
            kustomize: serde_json::json!({"owner": "platform"}),
        },
        Difference {
            why: "kustomize does not rewrite ephemeralContainers; flotilla rewrites every \
                  container list",
            case: Case {
                manifests: "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers: [{name: a, image: 'nginx:1'}]\n  ephemeralContainers: [{name: debug, image: 'nginx:1'}]\n",
                namespace: None,
                overlay: "  images: [{name: nginx, newTag: '2'}]\n",
                kustomization: "images: [{name: nginx, newTag: '2'}]\n",
            },
            kind: "Pod",
            pointer: "/spec/ephemeralContainers/0/image",
            flotilla: Value::from("nginx:2"),
            kustomize: Value::from("nginx:1"),
        },
        Difference {
            why: "kustomize's namespace transformer renames Namespace objects; flotilla \
                  only fills in empty namespaces",
            case: Case {
                manifests: "apiVersion: v1\nkind: Namespace\nmetadata: {name: other}\n",
                namespace: Some("shop"),
                overlay: "  labels: {a: b}\n",
                kustomization: "namespace: shop\nlabels: [{pairs: {a: b}}]\n",
            },
            kind: "Namespace",
            pointer: "/metadata/name",
            flotilla: Value::from("other"),
            kustomize: Value::from("shop"),
        },
        Difference {
            why: "a kind whose CRD in the same bundle says `scope: Cluster` is \
                  cluster-scoped for flotilla; kustomize gives it the namespace",
            case: Case {
                manifests: "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata: {name: sites.edge.example.com}\nspec:\n  group: edge.example.com\n  scope: Cluster\n  names: {kind: Site, plural: sites}\n  versions: [{name: v1, served: true, storage: true, schema: {openAPIV3Schema: {type: object}}}]\n---\napiVersion: edge.example.com/v1\nkind: Site\nmetadata: {name: s}\n",
                namespace: Some("shop"),
                overlay: "  labels: {a: b}\n",
                kustomization: "namespace: shop\nlabels: [{pairs: {a: b}}]\n",
            },
            kind: "Site",
            pointer: "/metadata/namespace",
            flotilla: Value::Null,
            kustomize: Value::from("shop"),
        },
        Difference {
            why: "kustomize's built-in schema does not know the newer cluster-scoped \
                  kinds IPAddress and DeviceClass",
            case: Case {
                manifests: "apiVersion: networking.k8s.io/v1\nkind: IPAddress\nmetadata: {name: 10.0.0.1}\nspec: {parentRef: {resource: services, name: web, namespace: shop}}\n",
                namespace: Some("shop"),
                overlay: "  labels: {a: b}\n",
                kustomization: "namespace: shop\nlabels: [{pairs: {a: b}}]\n",
            },
            kind: "IPAddress",
            pointer: "/metadata/namespace",
            flotilla: Value::Null,
            kustomize: Value::from("shop"),
        },
        Difference {
            why: "a kustomize patch target's namespace is matched against the namespace \
                  before `namespace:` applies (none counts as \"default\"); flotilla sets \
                  the workload's namespace before any overlay, so a target naming it matches",
            case: Case {
                manifests: "apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec: {ports: [{port: 80}]}\n",
                namespace: Some("shop"),
                overlay: "  patches:\n    - target: {kind: Service, namespace: shop}\n      ops: [{op: replace, path: /spec/ports/0/port, value: 8080}]\n",
                kustomization: "namespace: shop\npatches:\n  - target: {kind: Service, namespace: shop}\n    patch: |-\n      - {op: replace, path: /spec/ports/0/port, value: 8080}\n",
            },
            kind: "Service",
            pointer: "/spec/ports/0/port",
            flotilla: Value::from(8080),
            kustomize: Value::from(80),
        },
        Difference {
            why: "with a target, kustomize's strategic merge patch writes null label and \
                  annotation values as the string \"null\" (kubernetes-sigs/kustomize#5995); \
                  an RFC 7396 null deletes the key",
            case: Case {
                manifests: "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c, labels: {tier: front, app: c}}\n",
                namespace: None,
                overlay: "  patches:\n    - target: {kind: ConfigMap}\n      merge: {metadata: {labels: {tier: null}}}\n",
                kustomization: "patches:\n  - target: {kind: ConfigMap}\n    patch: |-\n      apiVersion: v1\n      kind: ConfigMap\n      metadata: {name: c, labels: {tier: null}}\n",
            },
            kind: "ConfigMap",
            pointer: "/metadata/labels/tier",
            flotilla: Value::Null,
            kustomize: Value::from("null"),
        },
    ];
    for difference in &differences {
        let field = |resources: Vec<Value>| {
            let resource = resources
                .into_iter()
                .find(|r| r["kind"] == difference.kind)
                .unwrap_or_else(|| panic!("{}: no {}", difference.why, difference.kind));
            resource
                .pointer(difference.pointer)
                .cloned()
                .unwrap_or(Value::Null)
        };
        assert_eq!(
            (
                field(flotilla_output(&difference.case)),
                field(kustomize_output(&difference.case))
            ),
            (difference.flotilla.clone(), difference.kustomize.clone()),
            "{}",
            difference.why
        );
    }
}
