//! Name references: after prefixes, suffixes, namespaces and hashes have renamed
//! objects, every field that names one of them (a volume's ConfigMap, a Pod's
//! ServiceAccount, a RoleBinding's Role, an Ingress backend's Service, ...) is made
//! to name it as it is now. The table of such fields is kustomize's built-in one.

use serde_json::Value;

use super::fieldspec::{self, Create, FieldSpec};
use super::{PreviousId, Resource, TopError};

/// A kind that can be referred to, by group and version (empty: any).
#[derive(Clone, Copy)]
struct Target {
    kind: &'static str,
    group: &'static str,
    version: &'static str,
}

/// A field of a referring kind that names a target.
struct Referrer {
    kind: &'static str,
    group: &'static str,
    version: &'static str,
    path: String,
}

/// The workload kinds that carry a pod spec, with the path to it.
const POD_SPECS: &[(&str, &str, &str)] = &[
    ("PodTemplate", "", "template/spec"),
    ("Deployment", "", "spec/template/spec"),
    ("ReplicaSet", "", "spec/template/spec"),
    ("DaemonSet", "", "spec/template/spec"),
    ("StatefulSet", "", "spec/template/spec"),
    ("Job", "", "spec/template/spec"),
    ("CronJob", "", "spec/jobTemplate/spec/template/spec"),
];

/// Kinds with a pod template whose `serviceAccountName`, claims and priority class
/// kustomize follows (a different set from the ConfigMap and Secret one).
const TEMPLATED: &[(&str, &str)] = &[
    ("StatefulSet", "spec/template/spec"),
    ("Deployment", "spec/template/spec"),
    ("ReplicationController", "spec/template/spec"),
    ("CronJob", "spec/jobTemplate/spec/template/spec"),
    ("Job", "spec/template/spec"),
    ("DaemonSet", "spec/template/spec"),
];

fn referrer(
    kind: &'static str,
    group: &'static str,
    version: &'static str,
    path: &str,
) -> Referrer {
    Referrer {
        kind,
        group,
        version,
        path: path.to_string(),
    }
}

/// Fields of pod specs, in Pods (`spec/...`, API version v1) and in every kind of
/// [`POD_SPECS`].
fn in_pod_specs(fields: &[&str]) -> Vec<Referrer> {
    let mut referrers = Vec::new();
    for field in fields {
        referrers.push(referrer("Pod", "", "v1", &format!("spec/{field}")));
    }
    for (kind, group, prefix) in POD_SPECS {
        for field in fields {
            referrers.push(referrer(kind, group, "", &format!("{prefix}/{field}")));
        }
    }
    referrers
}

/// A field of Pods (`spec/...`) and of every kind of [`TEMPLATED`].
fn in_templates(field: &str) -> Vec<Referrer> {
    let mut referrers = vec![referrer("Pod", "", "", &format!("spec/{field}"))];
    for (kind, prefix) in TEMPLATED {
        referrers.push(referrer(kind, "", "", &format!("{prefix}/{field}")));
    }
    referrers
}

fn table() -> Vec<(Target, Vec<Referrer>)> {
    let target = |kind, group, version| Target {
        kind,
        group,
        version,
    };
    let scale_target = || {
        vec![referrer(
            "HorizontalPodAutoscaler",
            "",
            "",
            "spec/scaleTargetRef/name",
        )]
    };
    let mut config_map = in_pod_specs(&[
        "volumes/configMap/name",
        "containers/env/valueFrom/configMapKeyRef/name",
        "initContainers/env/valueFrom/configMapKeyRef/name",
        "containers/envFrom/configMapRef/name",
        "initContainers/envFrom/configMapRef/name",
        "volumes/projected/sources/configMap/name",
    ]);
    config_map.extend([
        referrer("Node", "", "", "spec/configSource/configMap"),
        referrer("Role", "", "", "rules/resourceNames"),
        referrer("ClusterRole", "", "", "rules/resourceNames"),
        referrer(
            "Ingress",
            "",
            "",
            "metadata/annotations/nginx.ingress.kubernetes.io\\/fastcgi-params-configmap",
        ),
    ]);
    let mut secret = in_pod_specs(&[
        "volumes/secret/secretName",
        "containers/env/valueFrom/secretKeyRef/name",
        "initContainers/env/valueFrom/secretKeyRef/name",
        "containers/envFrom/secretRef/name",
        "initContainers/envFrom/secretRef/name",
        "imagePullSecrets/name",
        "volumes/projected/sources/secret/name",
    ]);
    secret.extend([
        referrer("Ingress", "", "", "spec/tls/secretName"),
        referrer(
            "Ingress",
            "",
            "",
            "metadata/annotations/ingress.kubernetes.io\\/auth-secret",
        ),
        referrer(
            "Ingress",
            "",
            "",
            "metadata/annotations/nginx.ingress.kubernetes.io\\/auth-secret",
        ),
        referrer(
            "Ingress",
            "",
            "",
            "metadata/annotations/nginx.ingress.kubernetes.io\\/auth-tls-secret",
        ),
        referrer("ServiceAccount", "", "", "imagePullSecrets/name"),
        referrer("StorageClass", "", "", "parameters/secretName"),
        referrer("StorageClass", "", "", "parameters/adminSecretName"),
        referrer("StorageClass", "", "", "parameters/userSecretName"),
        referrer("StorageClass", "", "", "parameters/secretRef"),
        referrer("Role", "", "", "rules/resourceNames"),
        referrer("ClusterRole", "", "", "rules/resourceNames"),
        referrer(
            "Service",
            "serving.knative.dev",
            "v1",
            "spec/template/spec/containers/env/valueFrom/secretKeyRef/name",
        ),
        referrer("PersistentVolume", "", "", "spec/azureFile/secretName"),
    ]);
    let service = vec![
        referrer("StatefulSet", "apps", "", "spec/serviceName"),
        referrer(
            "Ingress",
            "",
            "",
            "spec/rules/http/paths/backend/serviceName",
        ),
        referrer("Ingress", "", "", "spec/backend/serviceName"),
        referrer(
            "Ingress",
            "",
            "",
            "spec/rules/http/paths/backend/service/name",
        ),
        referrer("Ingress", "", "", "spec/defaultBackend/service/name"),
        referrer(
            "APIService",
            "apiregistration.k8s.io",
            "",
            "spec/service/name",
        ),
        referrer(
            "ValidatingWebhookConfiguration",
            "admissionregistration.k8s.io",
            "",
            "webhooks/clientConfig/service",
        ),
        referrer(
            "MutatingWebhookConfiguration",
            "admissionregistration.k8s.io",
            "",
            "webhooks/clientConfig/service",
        ),
    ];
    let rbac = "rbac.authorization.k8s.io";
    let mut service_account = vec![
        referrer("RoleBinding", rbac, "", "subjects"),
        referrer("ClusterRoleBinding", rbac, "", "subjects"),
    ];
    service_account.extend(in_templates("serviceAccountName"));
    let mut storage_class_referrers = vec![
        referrer("PersistentVolume", "", "", "spec/storageClassName"),
        referrer("PersistentVolumeClaim", "", "", "spec/storageClassName"),
    ];
    storage_class_referrers.push(referrer(
        "StatefulSet",
        "",
        "",
        "spec/volumeClaimTemplates/spec/storageClassName",
    ));
    vec![
        (target("Deployment", "", ""), scale_target()),
        (target("ReplicationController", "", ""), scale_target()),
        (target("ReplicaSet", "", ""), scale_target()),
        (target("StatefulSet", "", ""), scale_target()),
        (target("ConfigMap", "", "v1"), config_map),
        (target("Secret", "", "v1"), secret),
        (target("Service", "", "v1"), service),
        (
            target("Role", rbac, ""),
            vec![referrer("RoleBinding", rbac, "", "roleRef/name")],
        ),
        (
            target("ClusterRole", rbac, ""),
            vec![
                referrer("RoleBinding", rbac, "", "roleRef/name"),
                referrer("ClusterRoleBinding", rbac, "", "roleRef/name"),
            ],
        ),
        (target("ServiceAccount", "", "v1"), service_account),
        (
            target("PersistentVolumeClaim", "", "v1"),
            in_templates("volumes/persistentVolumeClaim/claimName"),
        ),
        (
            target("PersistentVolume", "", "v1"),
            vec![
                referrer("PersistentVolumeClaim", "", "", "spec/volumeName"),
                referrer("ClusterRole", "", "", "rules/resourceNames"),
            ],
        ),
        (
            target("StorageClass", "storage.k8s.io", "v1"),
            storage_class_referrers,
        ),
        (
            target("PriorityClass", "scheduling.k8s.io", "v1"),
            in_templates("priorityClassName"),
        ),
        (
            target(
                "ValidatingAdmissionPolicy",
                "admissionregistration.k8s.io",
                "",
            ),
            vec![referrer(
                "ValidatingAdmissionPolicyBinding",
                "admissionregistration.k8s.io",
                "",
                "spec/policyName",
            )],
        ),
    ]
}

/// What the selection needs to know of a possible referral.
struct Candidate {
    group: String,
    version: String,
    name: String,
    namespace: String,
    effective_namespace: String,
    original_namespace: String,
    cluster_scoped: bool,
    kind: String,
    previous: Vec<PreviousId>,
    prefixes: Vec<String>,
    suffixes: Vec<String>,
}

impl Candidate {
    fn of(resource: &Resource) -> Candidate {
        Candidate {
            group: resource.group().to_string(),
            version: resource.version().to_string(),
            name: resource.name().to_string(),
            namespace: resource.namespace().to_string(),
            effective_namespace: resource.effective_namespace(),
            original_namespace: resource.original_id().namespace,
            cluster_scoped: resource.cluster_scoped(),
            kind: resource.kind().to_string(),
            previous: resource.previous.clone(),
            prefixes: resource.prefixes.clone(),
            suffixes: resource.suffixes.clone(),
        }
    }

    fn previously_selected(&self, kind: &str, group: &str, version: &str) -> bool {
        self.previous.iter().any(|id| {
            (kind.is_empty() || id.kind == kind)
                && (group.is_empty() || self.group == group)
                && (version.is_empty() || self.version == version)
        })
    }
}

fn selects(kind: &str, group: &str, version: &str, (k, g, v): (&str, &str, &str)) -> bool {
    (kind.is_empty() || kind == k)
        && (group.is_empty() || group == g)
        && (version.is_empty() || version == v)
}

/// The shorter list is the end of the longer one.
fn same_ending(a: &[String], b: &[String]) -> bool {
    let (short, long) = if a.len() <= b.len() { (a, b) } else { (b, a) };
    if short.is_empty() {
        return long.is_empty();
    }
    long[long.len() - short.len()..] == *short
}

fn prefixes_suffixes_equal(a: &Candidate, b: &Candidate, allow_empty: bool) -> bool {
    if allow_empty {
        let prefixes =
            a.prefixes.is_empty() || b.prefixes.is_empty() || same_ending(&a.prefixes, &b.prefixes);
        let suffixes =
            a.suffixes.is_empty() || b.suffixes.is_empty() || same_ending(&a.suffixes, &b.suffixes);
        prefixes && suffixes
    } else {
        same_ending(&a.prefixes, &b.prefixes) && same_ending(&a.suffixes, &b.suffixes)
    }
}

/// Updates every name reference in `resources`.
pub fn fix(resources: &mut [Resource]) -> Result<(), TopError> {
    if resources.iter().all(|r| r.previous.is_empty()) {
        return Ok(());
    }
    let candidates: Vec<Candidate> = resources.iter().map(Candidate::of).collect();
    let table = table();
    for index in 0..resources.len() {
        let referrer = &candidates[index];
        let original = resources[index].original_id();
        let gvk = (
            original.kind.as_str(),
            referrer.group.as_str(),
            referrer.version.as_str(),
        );
        let role_ref = resources[index].value.get("roleRef").map(|r| {
            (
                r.get("apiGroup")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
                r.get("kind")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
            )
        });
        let reachable: Vec<usize> = reachable_from(referrer, &resources[index].value, &candidates);
        for (target, referrers) in &table {
            for spec in referrers
                .iter()
                .filter(|s| selects(s.kind, s.group, s.version, gvk))
            {
                let mut chooser = Chooser {
                    referrer,
                    candidates: &candidates,
                    reachable: &reachable,
                    target: *target,
                    role_ref: spec
                        .path
                        .ends_with("roleRef/name")
                        .then(|| role_ref.clone())
                        .flatten(),
                };
                let field = FieldSpec::new(&spec.path, None, None, None, false);
                let description = format!(
                    "{} (from {})",
                    resources[index].describe(),
                    resources[index].origin()
                );
                fieldspec::visit(
                    &mut resources[index].value,
                    &field,
                    Create::Nothing,
                    &mut |value| chooser.set(value),
                )
                .map_err(|message| {
                    TopError(format!(
                        "after renaming, the names {description} refers to cannot be updated: {message}"
                    ))
                })?;
            }
        }
    }
    Ok(())
}

/// The resources a referrer may refer to: cluster-scoped ones, those in its
/// namespace, and for a RoleBinding those in its subjects' namespaces.
fn reachable_from(referrer: &Candidate, value: &Value, candidates: &[Candidate]) -> Vec<usize> {
    if referrer.cluster_scoped {
        return (0..candidates.len()).collect();
    }
    let subject_namespaces: Vec<&str> = if referrer.kind == "RoleBinding" {
        value
            .get("subjects")
            .and_then(Value::as_array)
            .map(|subjects| {
                subjects
                    .iter()
                    .filter_map(|s| s.get("namespace").and_then(Value::as_str))
                    .collect()
            })
            .unwrap_or_default()
    } else {
        Vec::new()
    };
    candidates
        .iter()
        .enumerate()
        .filter(|(_, c)| {
            c.cluster_scoped
                || c.effective_namespace == referrer.effective_namespace
                || subject_namespaces.contains(&c.namespace.as_str())
        })
        .map(|(index, _)| index)
        .collect()
}

struct Chooser<'a> {
    referrer: &'a Candidate,
    candidates: &'a [Candidate],
    reachable: &'a [usize],
    target: Target,
    role_ref: Option<(String, String)>,
}

impl Chooser<'_> {
    fn set(&mut self, value: &mut Value) -> Result<(), String> {
        match value {
            Value::Null => Ok(()),
            Value::String(_) => self.set_scalar(value),
            Value::Object(_) => self.set_mapping(value),
            Value::Array(items) => {
                for item in items {
                    match item {
                        Value::String(_) => self.set_scalar(item)?,
                        Value::Object(_) => self.set_mapping(item)?,
                        _ => return Err("expected names or objects with a name".into()),
                    }
                }
                Ok(())
            }
            _ => Err("expected a name".into()),
        }
    }

    fn set_scalar(&self, value: &mut Value) -> Result<(), String> {
        let Value::String(old) = value else {
            return Ok(());
        };
        let pool: Vec<usize> = self.reachable.to_vec();
        if let Some(chosen) = self.select(old, pool, false)? {
            let name = self.candidates[chosen].name.clone();
            *value = Value::String(name);
        }
        Ok(())
    }

    fn set_mapping(&self, value: &mut Value) -> Result<(), String> {
        let Some(map) = value.as_object_mut() else {
            return Ok(());
        };
        let Some(old) = map.get("name").and_then(Value::as_str).map(String::from) else {
            return Ok(());
        };
        let pool: Vec<usize> = match map.get("namespace").and_then(Value::as_str) {
            None => self.reachable.to_vec(),
            Some(namespace) => {
                let by_original: Vec<usize> = self
                    .reachable
                    .iter()
                    .copied()
                    .filter(|&i| {
                        let c = &self.candidates[i];
                        !c.cluster_scoped && c.original_namespace == namespace
                    })
                    .collect();
                if by_original.is_empty() {
                    self.reachable
                        .iter()
                        .copied()
                        .filter(|&i| {
                            let c = &self.candidates[i];
                            !c.cluster_scoped && c.effective_namespace == namespace
                        })
                        .collect()
                } else {
                    by_original
                }
            }
        };
        let Some(chosen) = self.select(&old, pool, true)? else {
            return Ok(());
        };
        let referral = &self.candidates[chosen];
        if referral.name == old && referral.namespace.is_empty() {
            return Ok(());
        }
        map.insert("name".into(), Value::String(referral.name.clone()));
        if !referral.namespace.is_empty() {
            map.insert(
                "namespace".into(),
                Value::String(referral.namespace.clone()),
            );
        }
        Ok(())
    }

    /// kustomize's choice of the one object a name refers to.
    fn select(
        &self,
        old: &str,
        pool: Vec<usize>,
        with_namespace: bool,
    ) -> Result<Option<usize>, String> {
        let target = self.target;
        let mut chosen: Vec<usize> = pool
            .into_iter()
            .filter(|&i| {
                let c = &self.candidates[i];
                c.previous.iter().any(|id| id.name == old)
                    && c.previously_selected(target.kind, target.group, target.version)
                    && self
                        .role_ref
                        .as_ref()
                        .is_none_or(|(group, kind)| c.previously_selected(kind, group, ""))
                    && (self.referrer.cluster_scoped
                        || c.cluster_scoped
                        || c.kind == "ServiceAccount"
                        || c.effective_namespace == self.referrer.effective_namespace)
            })
            .collect();
        if chosen.len() == 1 {
            return Ok(chosen.pop());
        }
        chosen.retain(|&i| prefixes_suffixes_equal(&self.candidates[i], self.referrer, true));
        if chosen.len() > 1 {
            chosen.retain(|&i| prefixes_suffixes_equal(&self.candidates[i], self.referrer, false));
        }
        match chosen.len() {
            0 => Ok(None),
            1 => Ok(chosen.pop()),
            _ => {
                let first = &self.candidates[chosen[0]];
                let identical = chosen.iter().all(|&i| {
                    let c = &self.candidates[i];
                    c.name == first.name && (!with_namespace || c.namespace == first.namespace)
                });
                if identical {
                    Ok(Some(chosen[0]))
                } else {
                    Err(format!(
                        "{old:?} could mean any of {}",
                        chosen
                            .iter()
                            .map(|&i| {
                                let c = &self.candidates[i];
                                format!("{} {}/{}", c.kind, c.namespace, c.name)
                            })
                            .collect::<Vec<_>>()
                            .join(", ")
                    ))
                }
            }
        }
    }
}
