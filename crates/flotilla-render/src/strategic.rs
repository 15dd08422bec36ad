//! Strategic merge patches, as kustomize applies them.
//!
//! A strategic merge patch is a partial object merged into a resource. Maps merge key
//! by key and a `null` deletes; a list is replaced, unless the Kubernetes API marks
//! it as merged by key (`containers` and `env` by `name`, `ports` by `containerPort`
//! and `protocol`, `volumeMounts` by `mountPath`, …, see [`schema`]): then elements
//! with the same key merge, new ones are added, and `$patch: delete` in an element
//! removes it. A list of strings marked for merging (`finalizers`) takes the union.
//! Only the built-in kinds have merge keys; every list of any other kind is replaced.
//!
//! Order follows kustomize: in a merged list, the patch's elements come first in the
//! patch's order, then the resource's other elements in their order.
//!
//! Directives:
//! - `$patch: delete` in a map removes it (the whole resource at the top), in a list
//!   element removes that element; `$patch: replace` replaces instead of merging;
//!   a list element `{$patch: replace}` or `{$patch: delete}` acts on the whole list.
//! - `$setElementOrder/<list>: [...]` puts the named elements of `<list>` in that
//!   order (the others follow in their merged order).
//! - `$deleteFromPrimitiveList/<list>: [...]` removes those values from a merged
//!   list of strings.
//! - `$retainKeys: [...]` keeps only the named keys of the map it is in.
//!
//! kustomize itself ignores the last three (it copies them into the output as fields,
//! which the API server refuses); flotilla applies them as Kubernetes defines them.

pub mod schema;

use std::collections::BTreeSet;

use serde_json::{Map, Value};

use schema::{ListMerge, Node};

/// Why a strategic merge patch could not be applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{message}", if path.is_empty() { String::new() } else { format!("at {path}: ") })]
pub struct StrategicError {
    /// Where in the resource, as a dotted path (`spec.template.spec.containers`).
    pub path: String,
    pub message: String,
}

/// What became of the resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Patched,
    /// The patch said `$patch: delete` at its top.
    Deleted,
}

const DIRECTIVE: &str = "$patch";
const SET_ELEMENT_ORDER: &str = "$setElementOrder/";
const DELETE_FROM_PRIMITIVE_LIST: &str = "$deleteFromPrimitiveList/";
const RETAIN_KEYS: &str = "$retainKeys";

/// Applies `patch` to `resource`, with the merge keys of the resource's kind (or, for
/// a resource without `apiVersion` and `kind`, of the patch's). On error the
/// resource is left as it was.
pub fn apply(resource: &mut Value, patch: &Value) -> Result<Outcome, StrategicError> {
    let root = schema::for_resource(resource).or_else(|| schema::for_resource(patch));
    let mut walker = Walker { path: Vec::new() };
    let work = resource.clone();
    match walker.walk(Some(work), Some(patch.clone()), root)? {
        Some(value) => {
            *resource = value;
            Ok(Outcome::Patched)
        }
        None => Ok(Outcome::Deleted),
    }
}

struct Walker {
    path: Vec<String>,
}

#[derive(PartialEq, Eq, Clone, Copy, Debug)]
enum Directive {
    Merge,
    Replace,
    Delete,
}

fn kind_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a map",
    }
}

fn is_scalar(value: &Value) -> bool {
    !matches!(value, Value::Array(_) | Value::Object(_) | Value::Null)
}

impl Walker {
    fn error(&self, message: impl Into<String>) -> StrategicError {
        StrategicError {
            path: self.path.join("."),
            message: message.into(),
        }
    }

    /// Merges `patch` into `dest` under `schema`. `None` on either side means the field
    /// is absent; a `None` result removes the field.
    fn walk(
        &mut self,
        dest: Option<Value>,
        patch: Option<Value>,
        schema: Option<Node>,
    ) -> Result<Option<Value>, StrategicError> {
        let shape = [dest.as_ref(), patch.as_ref()]
            .into_iter()
            .flatten()
            .find(|v| !v.is_null());
        match shape {
            Some(Value::Object(_)) | None => {
                self.check_same_shape(&dest, &patch, "a map", |v| v.is_object())?;
                self.walk_map(dest, patch, schema)
            }
            Some(Value::Array(_)) => {
                self.check_same_shape(&dest, &patch, "a list", |v| v.is_array())?;
                self.walk_list(dest, patch, schema)
            }
            Some(_) => {
                self.check_same_shape(&dest, &patch, "a single value", is_scalar)?;
                Ok(match patch {
                    Some(Value::Null) => None,
                    Some(value) => Some(value),
                    None => dest,
                })
            }
        }
    }

    fn check_same_shape(
        &self,
        dest: &Option<Value>,
        patch: &Option<Value>,
        what: &str,
        fits: impl Fn(&Value) -> bool,
    ) -> Result<(), StrategicError> {
        for (side, value) in [("resource", dest), ("patch", patch)] {
            if let Some(value) = value
                && !value.is_null()
                && !fits(value)
            {
                return Err(self.error(format!(
                    "the {side} has {} where the other side has {what}",
                    kind_name(value)
                )));
            }
        }
        Ok(())
    }

    fn walk_map(
        &mut self,
        dest: Option<Value>,
        patch: Option<Value>,
        schema: Option<Node>,
    ) -> Result<Option<Value>, StrategicError> {
        let mut patch = match patch {
            Some(Value::Object(map)) => Some(map),
            Some(Value::Null) => {
                // An explicit null deletes.
                return Ok(None);
            }
            _ => None,
        };
        let directive = match &mut patch {
            Some(map) => self.take_map_directive(map)?,
            None => Directive::Merge,
        };
        let mut dest = match dest {
            Some(Value::Object(map)) => Some(map),
            Some(Value::Null) if patch.is_none() => return Ok(Some(Value::Null)),
            _ => None,
        };
        if directive == Directive::Delete {
            return Ok(None);
        }
        let Some(mut patch) = patch else {
            return Ok(dest.map(Value::Object));
        };
        let order = take_prefixed(&mut patch, SET_ELEMENT_ORDER);
        let removals = take_prefixed(&mut patch, DELETE_FROM_PRIMITIVE_LIST);
        let retain = patch.remove(RETAIN_KEYS);
        if directive == Directive::Replace || dest.is_none() {
            // kustomize starts from the patch itself, then merges the patch into it,
            // which takes its directives out at every level.
            dest = Some(patch.clone());
        }
        let mut dest = dest.unwrap_or_default();
        let keys: BTreeSet<String> = dest.keys().chain(patch.keys()).cloned().collect();
        for key in keys {
            let child_schema = schema.and_then(|s| s.field(&key));
            let before = dest.remove(&key);
            let incoming = patch.remove(&key);
            self.path.push(key.clone());
            let merged = self.walk(before, incoming, child_schema)?;
            self.path.pop();
            if let Some(value) = merged {
                dest.insert(key, value);
            }
        }
        for (field, values) in removals {
            self.delete_from_primitive_list(&mut dest, &field, &values)?;
        }
        for (field, order) in order {
            self.set_element_order(&mut dest, &field, &order, schema)?;
        }
        if let Some(retain) = retain {
            let Value::Array(names) = retain else {
                return Err(self.error("$retainKeys must be a list of keys"));
            };
            let keep: BTreeSet<&str> = names.iter().filter_map(Value::as_str).collect();
            dest.retain(|key, _| keep.contains(key.as_str()));
        }
        Ok(Some(Value::Object(dest)))
    }

    fn take_map_directive(
        &self,
        map: &mut Map<String, Value>,
    ) -> Result<Directive, StrategicError> {
        let Some(value) = map.remove(DIRECTIVE) else {
            return Ok(Directive::Merge);
        };
        self.directive(&value)
    }

    fn directive(&self, value: &Value) -> Result<Directive, StrategicError> {
        match value.as_str() {
            Some("merge") => Ok(Directive::Merge),
            Some("replace") => Ok(Directive::Replace),
            Some("delete") => Ok(Directive::Delete),
            _ => Err(self.error(format!(
                "unknown patch strategy {value}: $patch takes merge, replace or delete"
            ))),
        }
    }

    fn walk_list(
        &mut self,
        dest: Option<Value>,
        patch: Option<Value>,
        schema: Option<Node>,
    ) -> Result<Option<Value>, StrategicError> {
        let mut patch = match patch {
            Some(Value::Array(items)) => Some(items),
            Some(Value::Null) => return Ok(None),
            _ => None,
        };
        let directive = match &mut patch {
            Some(items) => self.take_list_directive(items)?,
            None => Directive::Merge,
        };
        let dest = match dest {
            Some(Value::Array(items)) => Some(items),
            _ => None,
        };
        let Some(patch) = patch else {
            return Ok(dest.map(Value::Array));
        };
        let merge = schema.and_then(Node::list_merge);
        match (directive, merge) {
            (Directive::Delete, _) => Ok(None),
            (Directive::Replace, _) | (_, None) => Ok(Some(Value::Array(patch))),
            (Directive::Merge, Some(merge)) => {
                let dest = dest.unwrap_or_default();
                let elements = schema.and_then(Node::elements);
                match merge {
                    ListMerge::Primitive => Ok(Some(Value::Array(merge_primitive(dest, patch)))),
                    ListMerge::Keys(keys) => {
                        self.merge_keyed(dest, patch, keys, elements).map(Some)
                    }
                }
            }
        }
    }

    /// A list element that is only `{$patch: ...}` acts on the whole list.
    fn take_list_directive(&self, items: &mut Vec<Value>) -> Result<Directive, StrategicError> {
        let Some(at) = items.iter().position(|item| {
            item.as_object()
                .is_some_and(|map| map.len() == 1 && map.contains_key(DIRECTIVE))
        }) else {
            return Ok(Directive::Merge);
        };
        let item = items.remove(at);
        self.directive(&item[DIRECTIVE])
    }

    fn merge_keyed(
        &mut self,
        dest: Vec<Value>,
        patch: Vec<Value>,
        keys: &[&str],
        elements: Option<Node>,
    ) -> Result<Value, StrategicError> {
        for item in patch.iter().chain(&dest) {
            if !item.is_object() {
                return Err(self.error(format!(
                    "this list is merged by {}, but an element is {}",
                    keys.join(" and "),
                    kind_name(item)
                )));
            }
        }
        let identity = |item: &Value| -> Vec<String> {
            keys.iter()
                .map(|key| match item.get(*key) {
                    None | Some(Value::Null) => String::new(),
                    Some(Value::String(s)) => s.clone(),
                    Some(other) => other.to_string(),
                })
                .collect()
        };
        // The identities in kustomize's order: the patch's, then the resource's.
        let mut order: Vec<Vec<String>> = Vec::new();
        for item in patch.iter().chain(&dest) {
            let id = identity(item);
            if !order.iter().any(|seen| compatible(seen, &id)) {
                order.push(id);
            }
        }
        // With more than one key in use (ports by containerPort and protocol),
        // kustomize moves the resource's elements after the patch's new ones, in the
        // resource's order.
        let keys_in_use = (0..keys.len())
            .filter(|&k| order.iter().any(|id| !id[k].is_empty()))
            .count();
        let mut dest: Vec<Option<Value>> = dest.into_iter().map(Some).collect();
        let mut patch: Vec<Option<Value>> = patch.into_iter().map(Some).collect();
        let mut merged = Vec::with_capacity(order.len());
        let mut from_dest: Vec<(usize, Value)> = Vec::new();
        for id in &order {
            let take = |items: &mut Vec<Option<Value>>| {
                items
                    .iter_mut()
                    .enumerate()
                    .find(|(_, item)| item.as_ref().is_some_and(|v| compatible(&identity(v), id)))
                    .and_then(|(index, item)| Some((index, item.take()?)))
            };
            let (position, before) = match take(&mut dest) {
                Some((index, value)) => (Some(index), Some(value)),
                None => (None, None),
            };
            let incoming = take(&mut patch).map(|(_, value)| value);
            self.path.push(format!(
                "[{}]",
                keys.iter()
                    .zip(id)
                    .filter(|(_, v)| !v.is_empty())
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(",")
            ));
            let result = self.walk_map(before, incoming, elements)?;
            self.path.pop();
            match result {
                Some(Value::Object(mut map)) if !map.is_empty() => {
                    for (key, value) in keys.iter().zip(id) {
                        if !value.is_empty() && !map.contains_key(*key) {
                            map.insert((*key).to_string(), Value::String(value.clone()));
                        }
                    }
                    match position {
                        Some(index) if keys_in_use > 1 => {
                            from_dest.push((index, Value::Object(map)))
                        }
                        _ => merged.push(Value::Object(map)),
                    }
                }
                _ => {}
            }
        }
        from_dest.sort_by_key(|(index, _)| *index);
        merged.extend(from_dest.into_iter().map(|(_, value)| value));
        Ok(Value::Array(merged))
    }

    fn delete_from_primitive_list(
        &self,
        dest: &mut Map<String, Value>,
        field: &str,
        values: &Value,
    ) -> Result<(), StrategicError> {
        let Value::Array(values) = values else {
            return Err(self.error(format!(
                "{DELETE_FROM_PRIMITIVE_LIST}{field} must be a list"
            )));
        };
        if let Some(Value::Array(items)) = dest.get_mut(field) {
            items.retain(|item| !values.contains(item));
        }
        Ok(())
    }

    fn set_element_order(
        &self,
        dest: &mut Map<String, Value>,
        field: &str,
        order: &Value,
        schema: Option<Node>,
    ) -> Result<(), StrategicError> {
        let Value::Array(order) = order else {
            return Err(self.error(format!("{SET_ELEMENT_ORDER}{field} must be a list")));
        };
        let Some(Value::Array(items)) = dest.get_mut(field) else {
            return Ok(());
        };
        let keys: &[&str] = match schema
            .and_then(|s| s.field(field))
            .and_then(Node::list_merge)
        {
            Some(ListMerge::Keys(keys)) => keys,
            _ => &[],
        };
        // The position of an element in the order list: by its merge keys, or by
        // value for a list of strings.
        let rank = |item: &Value| {
            order.iter().position(|wanted| {
                if keys.is_empty() {
                    wanted == item
                } else {
                    keys.iter()
                        .all(|key| wanted.get(*key).is_none() || wanted.get(*key) == item.get(*key))
                        && keys.iter().any(|key| wanted.get(*key).is_some())
                }
            })
        };
        let mut ranked: Vec<(usize, Value)> = std::mem::take(items)
            .into_iter()
            .enumerate()
            .map(|(index, item)| (rank(&item).unwrap_or(order.len() + index), item))
            .collect();
        ranked.sort_by_key(|(rank, _)| *rank);
        *items = ranked.into_iter().map(|(_, item)| item).collect();
        Ok(())
    }
}

/// Two identities match when they agree wherever both name a value, and share one.
fn compatible(a: &[String], b: &[String]) -> bool {
    let mut common = false;
    for (x, y) in a.iter().zip(b) {
        if x == y {
            common = true;
        } else if !x.is_empty() && !y.is_empty() {
            return false;
        }
    }
    common
}

/// The union of two lists of scalars: the patch's first, then the resource's others.
fn merge_primitive(dest: Vec<Value>, patch: Vec<Value>) -> Vec<Value> {
    let mut result: Vec<Value> = Vec::with_capacity(dest.len() + patch.len());
    for item in patch.into_iter().chain(dest) {
        if !result.contains(&item) {
            result.push(item);
        }
    }
    result
}

/// Removes the keys that start with `prefix` and returns them without it.
fn take_prefixed(map: &mut Map<String, Value>, prefix: &str) -> Vec<(String, Value)> {
    let names: Vec<String> = map
        .keys()
        .filter(|key| key.starts_with(prefix))
        .cloned()
        .collect();
    names
        .into_iter()
        .filter_map(|name| {
            let value = map.remove(&name)?;
            Some((name[prefix.len()..].to_string(), value))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn check(resource: Value, patch: Value, expected: Value) {
        let mut patched = resource;
        apply(&mut patched, &patch).expect("applies");
        assert_eq!(patched, expected);
    }

    fn deployment(spec: Value) -> Value {
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
               "spec": {"template": {"spec": spec}}})
    }

    #[test]
    fn containers_merge_by_name_patch_order_first() {
        check(
            deployment(json!({"containers": [
                {"name": "a", "image": "a", "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]},
                {"name": "b", "image": "b"}]})),
            deployment(json!({"containers": [
                {"name": "new", "image": "n"},
                {"name": "a", "env": [{"name": "C", "value": "3"}, {"name": "A", "value": "9"}]}]})),
            deployment(json!({"containers": [
                {"name": "new", "image": "n"},
                {"name": "a", "image": "a", "env": [{"name": "C", "value": "3"}, {"name": "A", "value": "9"}, {"name": "B", "value": "2"}]},
                {"name": "b", "image": "b"}]})),
        );
    }

    #[test]
    fn lists_without_a_merge_key_are_replaced() {
        check(
            deployment(
                json!({"tolerations": [{"key": "a"}], "containers": [{"name": "x", "args": ["1", "2"]}]}),
            ),
            deployment(
                json!({"tolerations": [{"key": "b"}], "containers": [{"name": "x", "args": ["3"]}]}),
            ),
            deployment(
                json!({"tolerations": [{"key": "b"}], "containers": [{"name": "x", "args": ["3"]}]}),
            ),
        );
    }

    #[test]
    fn directives() {
        check(
            deployment(
                json!({"volumes": [{"name": "a", "emptyDir": {}}, {"name": "b", "emptyDir": {}}],
                               "containers": [{"name": "x", "resources": {"limits": {"cpu": "1"}}}]}),
            ),
            deployment(json!({"volumes": [{"name": "a", "$patch": "delete"}],
                               "containers": [{"name": "x", "resources": {"$patch": "replace", "requests": {"cpu": "2"}}}]})),
            deployment(json!({"volumes": [{"name": "b", "emptyDir": {}}],
                               "containers": [{"name": "x", "resources": {"requests": {"cpu": "2"}}}]})),
        );
        check(
            deployment(json!({"containers": [{"name": "a"}, {"name": "b"}, {"name": "c"}]})),
            deployment(
                json!({"$setElementOrder/containers": [{"name": "c"}, {"name": "a"}, {"name": "b"}],
                               "containers": [{"name": "b", "image": "new"}]}),
            ),
            deployment(
                json!({"containers": [{"name": "c"}, {"name": "a"}, {"name": "b", "image": "new"}]}),
            ),
        );
        check(
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "finalizers": ["a", "x", "b"]}}),
            json!({"metadata": {"finalizers": ["y"], "$deleteFromPrimitiveList/finalizers": ["a"]}}),
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "finalizers": ["y", "x", "b"]}}),
        );
        let mut resource = deployment(json!({}));
        assert_eq!(
            apply(&mut resource, &json!({"$patch": "delete"})),
            Ok(Outcome::Deleted)
        );
    }

    #[test]
    fn custom_kinds_replace_lists_and_shape_errors_name_the_path() {
        check(
            json!({"apiVersion": "example.com/v1", "kind": "Widget", "spec": {"containers": [{"name": "a"}]}}),
            json!({"spec": {"containers": [{"name": "b"}]}}),
            json!({"apiVersion": "example.com/v1", "kind": "Widget", "spec": {"containers": [{"name": "b"}]}}),
        );
        let mut resource = deployment(json!({"containers": [{"name": "a"}]}));
        let err = apply(
            &mut resource,
            &deployment(json!({"containers": {"name": "a"}})),
        )
        .expect_err("a map for a list");
        assert_eq!(
            err.to_string(),
            "at spec.template.spec.containers: the patch has a map where the other side has a list"
        );
    }
}
