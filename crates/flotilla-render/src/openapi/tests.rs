use serde_json::{Value, json};

use super::*;

/// What checking `resource` against Kubernetes 1.36 (and the CRDs `crds`) finds,
/// as printed.
fn check(resource: Value, crds: &[Value]) -> Vec<String> {
    match check_resource(&resource, 36, &CustomKinds::of(crds)) {
        Outcome::Checked(findings) => findings.iter().map(ToString::to_string).collect(),
        other => panic!("not checked: {other:?}"),
    }
}

fn deployment(spec: Value) -> Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "labels": {"app.kubernetes.io/name": "web"}},
        "spec": spec,
    })
}

fn pod_template() -> Value {
    json!({
        "metadata": {"labels": {"app": "web"}},
        "spec": {"containers": [{
            "name": "web",
            "image": "nginx:1.27",
            "ports": [{"containerPort": 80}],
            "resources": {"limits": {"cpu": "500m", "memory": 1073741824_u64}, "requests": {"cpu": 0.5}},
            "livenessProbe": {"httpGet": {"port": "http", "path": "/"}},
            "readinessProbe": {"httpGet": {"port": 8080}},
        }]}
    })
}

#[test]
fn every_minor_version_is_compiled_in() {
    assert_eq!(known_minors(), (25..=37).collect::<Vec<_>>());
}

#[test]
fn a_valid_deployment_has_no_findings() {
    let spec = json!({
        "replicas": 3,
        "selector": {"matchLabels": {"app": "web"}},
        "strategy": {"rollingUpdate": {"maxSurge": "25%", "maxUnavailable": 0}},
        "template": pod_template(),
    });
    assert_eq!(check(deployment(spec), &[]), Vec::<String>::new());
}

#[test]
fn the_replica_typo_is_an_unknown_field() {
    let spec = json!({
        "replica": 3,
        "selector": {"matchLabels": {"app": "web"}},
        "template": pod_template(),
    });
    assert_eq!(
        check(deployment(spec), &[]),
        ["spec.replica: unknown field (did you mean \"replicas\"?)"]
    );
}

#[test]
fn wrong_types_and_missing_fields_name_their_path() {
    let spec = json!({
        "replicas": "3",
        "selector": {"matchLabels": {"app": "web"}},
        "template": {"spec": {"containers": [{"image": "nginx", "env": [{"name": "A", "value": 1}]}]}},
    });
    assert_eq!(
        check(deployment(spec), &[]),
        [
            "spec.replicas: expected an integer, found a string",
            "spec.template.spec.containers[0].env[0].value: expected a string, found an integer",
            "spec.template.spec.containers[0].name: required field missing",
        ]
    );
}

#[test]
fn what_the_api_server_accepts_is_not_reported() {
    // null for optional and required fields, 3.0 for an integer, a number for a
    // quantity, an integer for an IntOrString, and free-form maps.
    let spec = json!({
        "replicas": 3.0,
        "paused": null,
        "selector": {"matchLabels": {"app": "web"}},
        "template": {
            "metadata": {"annotations": {"a": "1"}, "creationTimestamp": null},
            "spec": {"containers": [{"name": "web", "image": null,
                "resources": {"limits": {"cpu": 2}}}]},
        },
    });
    assert_eq!(check(deployment(spec), &[]), Vec::<String>::new());
    assert_eq!(
        check(
            deployment(json!({"replicas": 2.5, "selector": {}, "template": {}})),
            &[]
        ),
        ["spec.replicas: expected an integer, found a number"]
    );
}

#[test]
fn a_required_field_of_an_older_version_is_judged_by_that_version() {
    // StatefulSet's spec.serviceName is required up to 1.32 and optional since.
    let set = json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "db"},
        "spec": {"selector": {}, "template": {}},
    });
    let at = |minor| match check_resource(&set, minor, &CustomKinds::default()) {
        Outcome::Checked(f) => f.iter().map(ToString::to_string).collect::<Vec<_>>(),
        other => panic!("{other:?}"),
    };
    assert_eq!(at(25), ["spec.serviceName: required field missing"]);
    assert_eq!(at(33), Vec::<String>::new());
}

fn crd() -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "backups.example.com"},
        "spec": {
            "group": "example.com",
            "names": {"kind": "Backup", "plural": "backups"},
            "scope": "Namespaced",
            "versions": [{"name": "v1", "served": true, "storage": true, "schema": {"openAPIV3Schema": {
                "type": "object",
                "properties": {"spec": {
                    "type": "object",
                    "required": ["schedule"],
                    "properties": {
                        "schedule": {"type": "string"},
                        "keep": {"type": "integer"},
                        "port": {"x-kubernetes-int-or-string": true},
                        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                        "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                        "template": {"type": "object", "x-kubernetes-embedded-resource": true,
                            "properties": {"spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}},
                    },
                }},
            }}}],
        },
    })
}

#[test]
fn a_custom_resource_is_checked_against_its_crd() {
    let backup = |spec: Value| {
        json!({"apiVersion": "example.com/v1", "kind": "Backup",
            "metadata": {"name": "nightly", "labels": {"a": "b"}}, "spec": spec})
    };
    let good = backup(json!({
        "schedule": "@daily", "keep": 7, "port": "http", "labels": {"a": "b"},
        "extra": {"anything": [1, 2]},
        "template": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}, "spec": {"y": 1}},
    }));
    assert_eq!(check(good, &[crd()]), Vec::<String>::new());
    let bad = backup(json!({"schedul": "@daily", "keep": "7", "labels": {"a": 1}}));
    assert_eq!(
        check(bad, &[crd()]),
        [
            "spec.keep: expected an integer, found a string",
            "spec.labels.a: expected a string, found an integer",
            "spec.schedul: unknown field (did you mean \"schedule\"?)",
            "spec.schedule: required field missing",
        ]
    );
}

#[test]
fn a_custom_resource_without_its_crd_is_not_checked() {
    let monitor = json!({"apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor", "spec": {"x": 1}});
    assert_eq!(
        check_resource(&monitor, 36, &CustomKinds::default()),
        Outcome::NoDefinition("monitoring.coreos.com/v1/ServiceMonitor".into())
    );
}

#[test]
fn a_kind_its_builtin_group_does_not_serve_is_a_finding() {
    let of = |api_version: &str, kind: &str| {
        check(
            json!({"apiVersion": api_version, "kind": kind, "metadata": {"name": "x"}}),
            &[],
        )
    };
    assert_eq!(
        of("apps/v1", "Deploymnt"),
        ["kind: apps/v1 has no kind \"Deploymnt\" (did you mean \"Deployment\"?)"]
    );
    assert_eq!(
        of("v1", "Servce"),
        ["kind: v1 has no kind \"Servce\" (did you mean \"Service\"?)"]
    );
    // A removed API version, and a misspelt group.
    assert_eq!(
        of("extensions/v1beta1", "Deployment"),
        ["apiVersion: Deployment is not served as extensions/v1beta1; it is served as apps/v1"]
    );
    assert_eq!(
        of("batch/v1beta1", "CronJob"),
        ["apiVersion: CronJob is not served as batch/v1beta1; it is served as batch/v1"]
    );
    assert_eq!(
        of("app/v1", "Deployment"),
        ["apiVersion: Deployment is not served as app/v1; it is served as apps/v1"]
    );
    assert_eq!(
        of("policy/v1beta1", "PodSecurityPolicy"),
        ["kind: no kind \"PodSecurityPolicy\" is served (nor is policy/v1beta1)"]
    );
    // Served by 1.25 as written (removed in 1.26): judged by each version's schemas.
    let hpa = json!({"apiVersion": "autoscaling/v2beta2", "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "x"}, "spec": {"maxReplicas": 3,
        "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "x"}}});
    assert_eq!(
        check_resource(&hpa, 25, &CustomKinds::default()),
        Outcome::Checked(Vec::new())
    );
    assert_eq!(
        check(hpa, &[]),
        [
            "apiVersion: HorizontalPodAutoscaler is not served as autoscaling/v2beta2; it is served as autoscaling/v1 and autoscaling/v2"
        ]
    );
    // A group of another API (aggregated, or a SIG's CRD) is not judged.
    for (api_version, kind) in [
        ("metrics.k8s.io/v1beta1", "PodMetrics"),
        ("gateway.networking.k8s.io/v1", "HTTPRoute"),
    ] {
        let resource = json!({"apiVersion": api_version, "kind": kind, "metadata": {"name": "x"}});
        assert_eq!(
            check_resource(&resource, 36, &CustomKinds::default()),
            Outcome::Unchecked,
            "{api_version}"
        );
    }
}

#[test]
fn an_unknown_version_takes_the_nearest() {
    let choose = |version: &str| {
        let spec = KubernetesSpec {
            version: Some(version.into()),
            api_versions: Vec::new(),
        };
        let choice = minor_for(Some(&spec), "v1.36.0");
        (choice.minor, choice.instead_of)
    };
    assert_eq!(choose("v1.31.4"), (31, None));
    assert_eq!(choose("1.29"), (29, None));
    assert_eq!(choose("v1.45.0"), (37, Some("v1.45.0".into())));
    assert_eq!(choose("1.19.2"), (25, Some("1.19.2".into())));
    assert_eq!(choose("latest"), (36, Some("latest".into())));
    assert_eq!(minor_for(None, "v1.36.0").minor, 36);
}

/// Findings in the Helm corpus that the API server would refuse too, as
/// `render file: finding`, each with why.
const KNOWN_INVALID: &[(&str, &str)] = &[
    (
        "kustomize-krusty-test-chart/default/rendered/test/templates/deployment.yaml: spec.template.spec.containers[0].name: required field missing",
        "kustomize's test chart names no container: the API server refuses it (containers[0].name: Required value)",
    ),
    (
        "kustomize-krusty-test-chart/default/rendered/test/templates/tests/test-pod.yaml: apiVersion: Pod is not served as apps/v1; it is served as v1",
        "the chart's test Pod says apiVersion: apps/v1: the API server refuses it (no matches for kind Pod in version apps/v1)",
    ),
    (
        "kustomize-krusty-test-chart/custom/rendered/test/templates/deployment.yaml: spec.template.spec.containers[0].name: required field missing",
        "the same chart with its custom values",
    ),
    (
        "kustomize-krusty-test-chart/custom/rendered/test/templates/tests/test-pod.yaml: apiVersion: Pod is not served as apps/v1; it is served as v1",
        "the same chart with its custom values",
    ),
    (
        "prometheus-adapter/default/rendered/prometheus-adapter/templates/custom-metrics-apiservice.yaml: apiVersion: APIService is not served as apiregistration.k8s.io/v1beta1; it is served as apiregistration.k8s.io/v1",
        "the chart writes apiregistration.k8s.io/v1 only when .Capabilities.APIVersions has it, which Helm's offline render does not list: it falls back to v1beta1, removed in Kubernetes 1.22 and refused by 1.36's API server",
    ),
    (
        "prometheus-adapter/custom/rendered/prometheus-adapter/templates/custom-metrics-apiservice.yaml: apiVersion: APIService is not served as apiregistration.k8s.io/v1beta1; it is served as apiregistration.k8s.io/v1",
        "the same chart with its custom values",
    ),
];

/// Every resource of Helm's reference renders in ../shared/testdata/helm-charts
/// (47 charts, default and custom values, rendered for Kubernetes 1.36) is checked
/// with the CRDs each render ships, and nothing is found but [`KNOWN_INVALID`]
/// (which must still be found).
#[test]
fn the_helm_corpus_has_no_findings() {
    let corpus = match flotilla_testkit::shared_testdata("helm-charts") {
        Ok(path) => path,
        Err(reason) => {
            flotilla_testkit::can_run("the_helm_corpus_has_no_findings", Some(reason));
            return;
        }
    };
    let mut renders = 0;
    let mut resources = 0;
    let mut problems = Vec::new();
    let mut charts: Vec<_> = std::fs::read_dir(&corpus)
        .expect("the corpus folder")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    charts.sort();
    for chart in charts {
        for values in ["default", "custom"] {
            let rendered = chart.join(values).join("rendered");
            if !rendered.is_dir() {
                continue;
            }
            renders += 1;
            let mut documents = Vec::new();
            for file in files_under(&rendered) {
                if file.ends_with("NOTES.txt") {
                    continue;
                }
                let text = std::fs::read_to_string(&file).expect("a rendered file");
                for doc in crate::helm::yaml::split_manifests(&text) {
                    if let Ok(Some(value)) = crate::helm::yaml::parse_manifest(&doc)
                        && value.get("kind").is_some()
                    {
                        documents.push((file.clone(), value));
                    }
                }
            }
            let custom = CustomKinds::of(documents.iter().map(|(_, v)| v));
            for (file, value) in &documents {
                resources += 1;
                if let Outcome::Checked(findings) = check_resource(value, 36, &custom) {
                    for finding in findings {
                        problems.push(format!(
                            "{}: {finding}",
                            file.strip_prefix(&corpus).unwrap_or(file).display(),
                        ));
                    }
                }
            }
        }
    }
    assert!(
        renders >= 90 && resources > 1000,
        "{renders} renders, {resources} resources"
    );
    let known: Vec<&str> = KNOWN_INVALID.iter().map(|(finding, _)| *finding).collect();
    let unexpected: Vec<&String> = problems
        .iter()
        .filter(|p| !known.contains(&p.as_str()))
        .collect();
    assert!(
        unexpected.is_empty(),
        "findings in valid charts: {unexpected:#?}"
    );
    assert_eq!(
        problems, known,
        "every known invalid manifest is still found"
    );
}

fn files_under(folder: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(folder).expect("a folder").flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(files_under(&path));
        } else {
            found.push(path);
        }
    }
    found.sort();
    found
}
