//! Which kinds are cluster-scoped: the built-in Kubernetes ones, and any
//! CustomResourceDefinition in the same bundle whose `spec.scope` is `Cluster`.

use std::collections::BTreeSet;

use serde_json::Value;

/// (API group, kind) of the built-in cluster-scoped Kubernetes kinds.
const BUILT_IN: &[(&str, &str)] = &[
    ("", "ComponentStatus"),
    ("", "Namespace"),
    ("", "Node"),
    ("", "PersistentVolume"),
    ("admissionregistration.k8s.io", "MutatingAdmissionPolicy"),
    (
        "admissionregistration.k8s.io",
        "MutatingAdmissionPolicyBinding",
    ),
    (
        "admissionregistration.k8s.io",
        "MutatingWebhookConfiguration",
    ),
    ("admissionregistration.k8s.io", "ValidatingAdmissionPolicy"),
    (
        "admissionregistration.k8s.io",
        "ValidatingAdmissionPolicyBinding",
    ),
    (
        "admissionregistration.k8s.io",
        "ValidatingWebhookConfiguration",
    ),
    ("apiextensions.k8s.io", "CustomResourceDefinition"),
    ("apiregistration.k8s.io", "APIService"),
    ("certificates.k8s.io", "CertificateSigningRequest"),
    ("certificates.k8s.io", "ClusterTrustBundle"),
    ("flowcontrol.apiserver.k8s.io", "FlowSchema"),
    ("flowcontrol.apiserver.k8s.io", "PriorityLevelConfiguration"),
    ("networking.k8s.io", "IPAddress"),
    ("networking.k8s.io", "IngressClass"),
    ("networking.k8s.io", "ServiceCIDR"),
    ("node.k8s.io", "RuntimeClass"),
    ("rbac.authorization.k8s.io", "ClusterRole"),
    ("rbac.authorization.k8s.io", "ClusterRoleBinding"),
    ("resource.k8s.io", "DeviceClass"),
    ("scheduling.k8s.io", "PriorityClass"),
    ("storage.k8s.io", "CSIDriver"),
    ("storage.k8s.io", "CSINode"),
    ("storage.k8s.io", "StorageClass"),
    ("storage.k8s.io", "VolumeAttachment"),
    ("storage.k8s.io", "VolumeAttributesClass"),
    ("storagemigration.k8s.io", "StorageVersionMigration"),
];

/// The cluster-scoped kinds defined by CRDs in one cluster's bundle.
pub type CustomScopes = BTreeSet<(String, String)>;

pub fn is_cluster_scoped(group: &str, kind: &str, custom: &CustomScopes) -> bool {
    BUILT_IN
        .binary_search_by(|(g, k)| (*g, *k).cmp(&(group, kind)))
        .is_ok()
        || custom.iter().any(|(g, k)| g == group && k == kind)
}

/// If `value` is a CRD with `spec.scope: Cluster`, the (group, kind) it defines.
pub fn cluster_scoped_crd(value: &Value) -> Option<(String, String)> {
    let api_version = value.get("apiVersion")?.as_str()?;
    if value.get("kind")?.as_str()? != "CustomResourceDefinition"
        || !api_version.starts_with("apiextensions.k8s.io/")
    {
        return None;
    }
    let spec = value.get("spec")?;
    if spec.get("scope")?.as_str()? != "Cluster" {
        return None;
    }
    let group = spec.get("group")?.as_str()?;
    let kind = spec.get("names")?.get("kind")?.as_str()?;
    Some((group.to_string(), kind.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_in_table_is_sorted_for_binary_search() {
        assert!(BUILT_IN.windows(2).all(|pair| pair[0] < pair[1]));
        assert!(is_cluster_scoped(
            "rbac.authorization.k8s.io",
            "ClusterRole",
            &CustomScopes::new()
        ));
        assert!(!is_cluster_scoped(
            "apps",
            "Deployment",
            &CustomScopes::new()
        ));
    }
}
