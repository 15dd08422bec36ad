//! Which kinds are cluster-scoped: the built-in Kubernetes ones, and any
//! CustomResourceDefinition in the same bundle whose `spec.scope` is `Cluster`.

use std::collections::BTreeSet;

use serde_json::Value;

use flotilla_core::bundle::BUILT_IN_CLUSTER_SCOPED;

/// The cluster-scoped kinds defined by CRDs in one cluster's bundle.
pub type CustomScopes = BTreeSet<(String, String)>;

pub fn is_cluster_scoped(group: &str, kind: &str, custom: &CustomScopes) -> bool {
    BUILT_IN_CLUSTER_SCOPED
        .binary_search_by(|(g, k, _)| (*g, *k).cmp(&(group, kind)))
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

/// The resource (plural) names of the kinds the fleet's CustomResourceDefinitions
/// define, by (API group, kind).
pub type CrdPlurals = std::collections::BTreeMap<(String, String), String>;

/// If `value` is a CRD, the (group, kind) it defines and its plural name.
pub fn crd_plural(value: &Value) -> Option<((String, String), String)> {
    let api_version = value.get("apiVersion")?.as_str()?;
    if value.get("kind")?.as_str()? != "CustomResourceDefinition"
        || !api_version.starts_with("apiextensions.k8s.io/")
    {
        return None;
    }
    let spec = value.get("spec")?;
    let group = spec.get("group")?.as_str()?;
    let names = spec.get("names")?;
    let kind = names.get("kind")?.as_str()?;
    let plural = names.get("plural")?.as_str()?;
    Some(((group.to_string(), kind.to_string()), plural.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_in_table_is_sorted_for_binary_search() {
        assert!(
            BUILT_IN_CLUSTER_SCOPED
                .windows(2)
                .all(|pair| (pair[0].0, pair[0].1) < (pair[1].0, pair[1].1))
        );
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
