//! Helpers for the agent's unit tests.

use std::sync::Arc;

use serde_json::Value;

use flotilla_core::bundle::{Bundle, Resource, ResourceKey};

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
