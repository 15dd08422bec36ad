//! Helpers for the agent's unit tests.

use std::sync::Arc;

use serde_json::Value;

use flotilla_core::bundle::{Bundle, BundleMeta, Resource, ResourceKey};

/// A bundle of the given resources (any order), as a hub would serve it.
pub fn bundle_of(cluster: &str, values: Vec<Value>) -> Bundle {
    let resources = values
        .into_iter()
        .map(|value| {
            let key = ResourceKey::of(&value).expect("test resources have an identity");
            Arc::new(Resource::new(key, &value))
        })
        .collect();
    Bundle::new(cluster, resources)
}

/// A bundle of `(workload, resource)` pairs (any order) with these apply phases, as
/// the renderer makes one for workloads with `spec.dependsOn`.
pub fn phased_bundle_of(cluster: &str, values: Vec<(&str, Value)>, phases: &[&[&str]]) -> Bundle {
    let mut pairs: Vec<(String, Arc<Resource>)> = values
        .into_iter()
        .map(|(workload, value)| {
            let key = ResourceKey::of(&value).expect("test resources have an identity");
            (workload.to_string(), Arc::new(Resource::new(key, &value)))
        })
        .collect();
    pairs.sort_by(|a, b| a.1.key.cmp(&b.1.key));
    let (workloads, resources) = pairs.into_iter().unzip();
    let meta = BundleMeta {
        workloads,
        phases: phases
            .iter()
            .map(|phase| phase.iter().map(|w| w.to_string()).collect())
            .collect(),
        ..BundleMeta::default()
    };
    Bundle::from_sorted_with_meta(cluster, resources, Some(meta))
}

/// Merges `extra` into `value`, maps key by key.
pub fn merge(value: &mut Value, extra: &Value) {
    match (value.as_object_mut(), extra.as_object()) {
        (Some(map), Some(extra)) => {
            for (key, child) in extra {
                merge(map.entry(key.clone()).or_insert(Value::Null), child);
            }
        }
        _ => *value = extra.clone(),
    }
}
