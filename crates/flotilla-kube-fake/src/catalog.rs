//! The kinds the fake serves and the discovery documents that describe them.
//!
//! Built-in groups follow a current Kubernetes release (1.33): core/v1, apps/v1,
//! batch/v1, autoscaling/v2 and v1 (v2beta2 is no longer served since 1.26),
//! rbac.authorization.k8s.io/v1, apiextensions.k8s.io/v1 and
//! admissionregistration.k8s.io/v1. Custom resources are served, for every version of a
//! CustomResourceDefinition marked `served: true`, once the definition is Established,
//! as `staging/src/k8s.io/apiextensions-apiserver/pkg/apiserver/customresource_discovery_controller.go`
//! publishes them. Documents have the shapes of
//! `staging/src/k8s.io/apiserver/pkg/endpoints/discovery/{legacy,root,group,version}.go`.

use serde_json::{Value, json};

/// When `metadata.generation` goes up (each kind's registry strategy decides).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Generation {
    /// The kind has no generation (ConfigMap, Secret, Namespace, RBAC, ...).
    Untracked,
    /// On a change of `spec` (StatefulSet, DaemonSet, Job, CRD:
    /// `pkg/registry/apps/statefulset/strategy.go` and friends).
    Spec,
    /// On a change of `spec` or of the annotations, which are copied to the ReplicaSets
    /// (`pkg/registry/apps/deployment/strategy.go`, `PrepareForUpdate`).
    SpecAndAnnotations,
    /// On any change but `metadata` and `status`: a custom resource with a status
    /// subresource (`apiextensions-apiserver/pkg/registry/customresource/strategy.go`).
    AllButMetadataAndStatus,
    /// On any change but `metadata`: a custom resource without one.
    AllButMetadata,
}

/// One kind at one version.
#[derive(Debug, Clone)]
pub struct KindInfo {
    pub group: String,
    pub version: String,
    pub kind: String,
    pub plural: String,
    pub namespaced: bool,
    /// Has a `status` subresource: `status` is reset on writes to the main resource
    /// and cleared at creation.
    pub status: bool,
    pub generation: Generation,
    /// The top-level fields the kind's schema declares (besides apiVersion, kind,
    /// metadata); `None` for custom resources, whose schema the fake does not check.
    pub fields: Option<&'static [&'static str]>,
}

impl KindInfo {
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }
}

struct Builtin {
    group: &'static str,
    served: &'static [&'static str],
    kind: &'static str,
    plural: &'static str,
    namespaced: bool,
    status: bool,
    generation: Generation,
    fields: &'static [&'static str],
}

const SPEC_STATUS: &[&str] = &["spec", "status"];

const BUILTINS: &[Builtin] = &[
    Builtin {
        group: "",
        served: &["v1"],
        kind: "Namespace",
        plural: "namespaces",
        namespaced: false,
        status: true,
        generation: Generation::Untracked,
        fields: SPEC_STATUS,
    },
    Builtin {
        group: "",
        served: &["v1"],
        kind: "ConfigMap",
        plural: "configmaps",
        namespaced: true,
        status: false,
        generation: Generation::Untracked,
        fields: &["data", "binaryData", "immutable"],
    },
    Builtin {
        group: "",
        served: &["v1"],
        kind: "Secret",
        plural: "secrets",
        namespaced: true,
        status: false,
        generation: Generation::Untracked,
        fields: &["data", "stringData", "type", "immutable"],
    },
    Builtin {
        group: "",
        served: &["v1"],
        kind: "Service",
        plural: "services",
        namespaced: true,
        status: true,
        generation: Generation::Untracked,
        fields: SPEC_STATUS,
    },
    Builtin {
        group: "",
        served: &["v1"],
        kind: "ServiceAccount",
        plural: "serviceaccounts",
        namespaced: true,
        status: false,
        generation: Generation::Untracked,
        fields: &[
            "secrets",
            "imagePullSecrets",
            "automountServiceAccountToken",
        ],
    },
    Builtin {
        group: "apps",
        served: &["v1"],
        kind: "Deployment",
        plural: "deployments",
        namespaced: true,
        status: true,
        generation: Generation::SpecAndAnnotations,
        fields: SPEC_STATUS,
    },
    Builtin {
        group: "apps",
        served: &["v1"],
        kind: "StatefulSet",
        plural: "statefulsets",
        namespaced: true,
        status: true,
        generation: Generation::Spec,
        fields: SPEC_STATUS,
    },
    Builtin {
        group: "apps",
        served: &["v1"],
        kind: "DaemonSet",
        plural: "daemonsets",
        namespaced: true,
        status: true,
        generation: Generation::Spec,
        fields: SPEC_STATUS,
    },
    Builtin {
        group: "batch",
        served: &["v1"],
        kind: "Job",
        plural: "jobs",
        namespaced: true,
        status: true,
        generation: Generation::Spec,
        fields: SPEC_STATUS,
    },
    Builtin {
        group: "batch",
        served: &["v1"],
        kind: "CronJob",
        plural: "cronjobs",
        namespaced: true,
        status: true,
        generation: Generation::Spec,
        fields: SPEC_STATUS,
    },
    Builtin {
        group: "autoscaling",
        served: &["v2", "v1"],
        kind: "HorizontalPodAutoscaler",
        plural: "horizontalpodautoscalers",
        namespaced: true,
        status: true,
        generation: Generation::Spec,
        fields: SPEC_STATUS,
    },
    Builtin {
        group: "rbac.authorization.k8s.io",
        served: &["v1"],
        kind: "Role",
        plural: "roles",
        namespaced: true,
        status: false,
        generation: Generation::Untracked,
        fields: &["rules"],
    },
    Builtin {
        group: "rbac.authorization.k8s.io",
        served: &["v1"],
        kind: "RoleBinding",
        plural: "rolebindings",
        namespaced: true,
        status: false,
        generation: Generation::Untracked,
        fields: &["subjects", "roleRef"],
    },
    Builtin {
        group: "rbac.authorization.k8s.io",
        served: &["v1"],
        kind: "ClusterRole",
        plural: "clusterroles",
        namespaced: false,
        status: false,
        generation: Generation::Untracked,
        fields: &["rules", "aggregationRule"],
    },
    Builtin {
        group: "rbac.authorization.k8s.io",
        served: &["v1"],
        kind: "ClusterRoleBinding",
        plural: "clusterrolebindings",
        namespaced: false,
        status: false,
        generation: Generation::Untracked,
        fields: &["subjects", "roleRef"],
    },
    Builtin {
        group: "apiextensions.k8s.io",
        served: &["v1"],
        kind: "CustomResourceDefinition",
        plural: "customresourcedefinitions",
        namespaced: false,
        status: true,
        generation: Generation::Spec,
        fields: SPEC_STATUS,
    },
    Builtin {
        group: "admissionregistration.k8s.io",
        served: &["v1"],
        kind: "ValidatingWebhookConfiguration",
        plural: "validatingwebhookconfigurations",
        namespaced: false,
        status: false,
        generation: Generation::Untracked,
        fields: &["webhooks"],
    },
    Builtin {
        group: "admissionregistration.k8s.io",
        served: &["v1"],
        kind: "MutatingWebhookConfiguration",
        plural: "mutatingwebhookconfigurations",
        namespaced: false,
        status: false,
        generation: Generation::Untracked,
        fields: &["webhooks"],
    },
];

/// Every kind served now: the built-in ones and those of Established CRDs.
pub fn served_kinds(crds: &[Value]) -> Vec<KindInfo> {
    let mut kinds: Vec<KindInfo> = BUILTINS
        .iter()
        .flat_map(|b| {
            b.served.iter().map(move |version| KindInfo {
                group: b.group.to_string(),
                version: version.to_string(),
                kind: b.kind.to_string(),
                plural: b.plural.to_string(),
                namespaced: b.namespaced,
                status: b.status,
                generation: b.generation,
                fields: Some(b.fields),
            })
        })
        .collect();
    for crd in crds {
        kinds.extend(crd_kinds(crd));
    }
    kinds
}

/// The kinds an Established CRD serves, one per served version.
pub fn crd_kinds(crd: &Value) -> Vec<KindInfo> {
    if !condition_true(crd, "Established") {
        return Vec::new();
    }
    let spec = &crd["spec"];
    let (Some(group), Some(kind), Some(plural)) = (
        spec["group"].as_str(),
        spec["names"]["kind"].as_str(),
        spec["names"]["plural"].as_str(),
    ) else {
        return Vec::new();
    };
    let namespaced = spec["scope"].as_str() != Some("Cluster");
    spec["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| v["served"].as_bool() == Some(true))
        .filter_map(|v| {
            let status = v.pointer("/subresources/status").is_some();
            Some(KindInfo {
                group: group.to_string(),
                version: v["name"].as_str()?.to_string(),
                kind: kind.to_string(),
                plural: plural.to_string(),
                namespaced,
                status,
                generation: if status {
                    Generation::AllButMetadataAndStatus
                } else {
                    Generation::AllButMetadata
                },
                fields: None,
            })
        })
        .collect()
}

pub fn condition_true(object: &Value, kind: &str) -> bool {
    object["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"].as_str() == Some(kind) && c["status"].as_str() == Some("True"))
}

/// Orders versions as Kubernetes prefers them: GA before beta before alpha, higher
/// numbers first, anything else last by name
/// (`staging/src/k8s.io/apimachinery/pkg/version/helpers.go`, CompareKubeAwareVersionStrings).
pub fn version_priority(version: &str) -> (u8, u64, u64, String) {
    let parsed = version.strip_prefix('v').and_then(|rest| {
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        let major: u64 = digits.parse().ok()?;
        let tail = &rest[digits.len()..];
        if tail.is_empty() {
            return Some((3u8, major, 0u64));
        }
        for (word, rank) in [("beta", 2u8), ("alpha", 1u8)] {
            if let Some(n) = tail.strip_prefix(word) {
                let minor: u64 = if n.is_empty() { 0 } else { n.parse().ok()? };
                return Some((rank, major, minor));
            }
        }
        None
    });
    match parsed {
        // Sorting ascending puts the preferred version first.
        Some((rank, major, minor)) => (3 - rank, u64::MAX - major, u64::MAX - minor, String::new()),
        None => (4, 0, 0, version.to_string()),
    }
}

/// The groups served, each with its versions in preference order (core excluded).
fn groups(kinds: &[KindInfo]) -> Vec<(String, Vec<String>)> {
    let mut groups: Vec<(String, Vec<String>)> = Vec::new();
    for kind in kinds.iter().filter(|k| !k.group.is_empty()) {
        match groups.iter_mut().find(|(g, _)| *g == kind.group) {
            Some((_, versions)) => {
                if !versions.contains(&kind.version) {
                    versions.push(kind.version.clone());
                }
            }
            None => groups.push((kind.group.clone(), vec![kind.version.clone()])),
        }
    }
    for (_, versions) in &mut groups {
        versions.sort_by_key(|v| version_priority(v));
    }
    groups
}

fn group_document(group: &str, versions: &[String]) -> Value {
    let entry = |v: &String| json!({"groupVersion": format!("{group}/{v}"), "version": v});
    json!({"name": group,
           "versions": versions.iter().map(entry).collect::<Vec<_>>(),
           "preferredVersion": entry(&versions[0])})
}

/// `GET /api`: the core group's versions.
pub fn core_versions() -> Value {
    json!({"kind": "APIVersions", "versions": ["v1"],
           "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1:6443"}]})
}

/// `GET /apis`.
pub fn group_list(kinds: &[KindInfo]) -> Value {
    let groups: Vec<Value> = groups(kinds)
        .iter()
        .map(|(g, versions)| group_document(g, versions))
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `GET /apis/GROUP`, if the group is served.
pub fn group(kinds: &[KindInfo], name: &str) -> Option<Value> {
    let (group, versions) = groups(kinds).into_iter().find(|(g, _)| g == name)?;
    let mut document = group_document(&group, &versions);
    document["kind"] = json!("APIGroup");
    document["apiVersion"] = json!("v1");
    Some(document)
}

/// `GET /api/v1` or `GET /apis/GROUP/VERSION`, if that version is served.
pub fn resource_list(kinds: &[KindInfo], group: &str, version: &str) -> Option<Value> {
    let mut resources = Vec::new();
    for kind in kinds
        .iter()
        .filter(|k| k.group == group && k.version == version)
    {
        let mut verbs = vec![
            "create",
            "delete",
            "deletecollection",
            "get",
            "list",
            "patch",
            "update",
            "watch",
        ];
        if kind.kind == "Namespace" {
            // Namespaces cannot be deleted as a collection.
            verbs.retain(|v| *v != "deletecollection");
        }
        resources.push(
            json!({"name": kind.plural, "singularName": kind.kind.to_lowercase(),
                              "namespaced": kind.namespaced, "kind": kind.kind, "verbs": verbs}),
        );
        if kind.status {
            resources.push(
                json!({"name": format!("{}/status", kind.plural), "singularName": "",
                                  "namespaced": kind.namespaced, "kind": kind.kind,
                                  "verbs": ["get", "patch", "update"]}),
            );
        }
    }
    if resources.is_empty() {
        return None;
    }
    let group_version = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version,
                "resources": resources}),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_preferred_as_kubernetes_prefers_them() {
        let mut versions = vec!["v1alpha1", "v2beta2", "v1", "v2", "v1beta1", "foo", "v10"];
        versions.sort_by_key(|v| version_priority(v));
        assert_eq!(
            versions,
            ["v10", "v2", "v1", "v2beta2", "v1beta1", "v1alpha1", "foo"]
        );
    }

    #[test]
    fn an_unestablished_definition_serves_nothing_and_unserved_versions_are_not_listed() {
        let mut crd = json!({"spec": {"group": "example.com", "scope": "Namespaced",
            "names": {"kind": "Widget", "plural": "widgets"},
            "versions": [{"name": "v1", "served": true}, {"name": "v1beta1", "served": false}]}});
        assert!(crd_kinds(&crd).is_empty());
        crd["status"] = json!({"conditions": [{"type": "Established", "status": "True"}]});
        let kinds = served_kinds(&[crd]);
        assert!(resource_list(&kinds, "example.com", "v1").is_some());
        assert!(resource_list(&kinds, "example.com", "v1beta1").is_none());
        assert!(resource_list(&kinds, "autoscaling", "v2beta2").is_none());
        assert_eq!(
            group(&kinds, "autoscaling").expect("served")["preferredVersion"]["version"],
            "v2"
        );
    }
}
