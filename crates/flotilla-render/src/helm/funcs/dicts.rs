//! Sprig's dictionary functions.
//!
//! Go's maps are shared references: `set`, `unset`, `merge` and `mergeOverwrite`
//! change the map they are given, and templates rely on it (`$_ := set $ctx "k" v`).
//! [`Value::Map`] is such a reference ([`crate::helm::gotmpl::MapRef`]), so these
//! functions change it in place and return it, as Sprig does.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::args::{
    GoMap, arity, arity_at_least, is_empty, map_param, string_list, string_param, strval,
};
use crate::helm::gotmpl::value::{FuncError, FuncResult, Host, Value};

pub fn dict(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    let mut map = BTreeMap::new();
    for pair in args.chunks(2) {
        let value = pair.get(1).cloned().unwrap_or_else(|| Value::string(""));
        map.insert(strval(&pair[0]), value);
    }
    Ok(Value::map(map))
}

pub fn get(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity("get", args, 2)?;
    let map = map_param(&args[0])?;
    let key = string_param(&args[1])?;
    Ok(map.get(&key).unwrap_or_else(|| Value::string("")))
}

pub fn set(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity("set", args, 3)?;
    let map = map_param(&args[0])?;
    let key = string_param(&args[1])?;
    map.insert(key.to_string(), args[2].clone());
    Ok(Value::Map(map))
}

pub fn unset(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity("unset", args, 2)?;
    let map = map_param(&args[0])?;
    let key = string_param(&args[1])?;
    map.remove(&key);
    Ok(Value::Map(map))
}

pub fn has_key(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity("hasKey", args, 2)?;
    let map = map_param(&args[0])?;
    let key = string_param(&args[1])?;
    Ok(Value::Bool(map.contains_key(&key)))
}

pub fn pluck(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity_at_least("pluck", args, 1)?;
    let key = string_param(&args[0])?;
    let mut out = Vec::new();
    for arg in &args[1..] {
        if let Some(v) = map_param(arg)?.get(&key) {
            out.push(v.clone());
        }
    }
    Ok(Value::list(out))
}

/// Sprig's `keys`: Go gives them in random order; flotilla gives them sorted, so a
/// render is reproducible (charts sort them with `sortAlpha` anyway).
pub fn keys(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    let mut out: Vec<String> = Vec::new();
    for arg in args {
        out.extend(map_param(arg)?.keys());
    }
    out.sort();
    Ok(string_list(out))
}

/// Sprig's `values`: in key order here (Go's order is random).
pub fn values(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity("values", args, 1)?;
    Ok(Value::list(
        map_param(&args[0])?.read().values().cloned().collect(),
    ))
}

fn key_strings(args: &[Value]) -> Result<Vec<Arc<str>>, FuncError> {
    args.iter().map(string_param).collect()
}

pub fn pick(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity_at_least("pick", args, 1)?;
    let map = map_param(&args[0])?;
    let wanted = key_strings(&args[1..])?;
    let out: BTreeMap<String, Value> = wanted
        .iter()
        .filter_map(|k| map.get(k).map(|v| (k.to_string(), v)))
        .collect();
    Ok(Value::map(out))
}

pub fn omit(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity_at_least("omit", args, 1)?;
    let map = map_param(&args[0])?;
    let unwanted = key_strings(&args[1..])?;
    let out: BTreeMap<String, Value> = map
        .read()
        .iter()
        .filter(|(k, _)| !unwanted.iter().any(|u| &**u == k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    Ok(Value::map(out))
}

/// mergo's `Merge` of maps: a key the destination lacks, or holds an empty value
/// for, takes the source's (non-empty) value; maps on both sides merge deeply; any
/// other destination value stays.
///
/// The source is read as a snapshot first, so a map merged into itself (or into a
/// map it contains) changes nothing unexpected and takes no second lock.
fn merge_into(dst: &GoMap, src: &GoMap, overwrite: bool) {
    if dst.same(src) {
        return;
    }
    for (key, src_value) in src.entries() {
        match (dst.get(&key), &src_value) {
            (Some(Value::Map(dst_inner)), Value::Map(src_inner)) => {
                merge_into(&dst_inner, src_inner, overwrite);
            }
            (Some(dst_value), _) => {
                if overwrite || (is_empty(&dst_value) && !is_empty(&src_value)) {
                    dst.insert(key, src_value);
                }
            }
            (None, _) => {
                if overwrite || !is_empty(&src_value) {
                    dst.insert(key, src_value);
                }
            }
        }
    }
}

fn merge_named(name: &str, args: &[Value], overwrite: bool) -> FuncResult {
    arity_at_least(name, args, 1)?;
    let dst = map_param(&args[0])?;
    for src in &args[1..] {
        let src = map_param(src)?;
        merge_into(&dst, &src, overwrite);
    }
    Ok(Value::Map(dst))
}

pub fn merge(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    merge_named("merge", args, false)
}
pub fn must_merge(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    merge_named("mustMerge", args, false)
}
pub fn merge_overwrite(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    merge_named("mergeOverwrite", args, true)
}
pub fn must_merge_overwrite(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    merge_named("mustMergeOverwrite", args, true)
}

/// Sprig's `deepCopy`: a copy sharing no map with the original, so `set` on it
/// leaves the original as it was.
pub fn deep_copy(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity("deepCopy", args, 1)?;
    Ok(args[0].deep_copy())
}
pub fn must_deep_copy(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity("mustDeepCopy", args, 1)?;
    Ok(args[0].deep_copy())
}

/// The Go type name in a failed interface conversion (`interface {} is int, not ...`).
fn dynamic_type(v: &Value) -> String {
    match v {
        Value::Nil | Value::Missing => "nil".to_string(),
        other => other.type_name(),
    }
}

fn conversion_panic(v: &Value, want: &str) -> FuncError {
    FuncError::new(format!(
        "interface conversion: interface {{}} is {}, not {want}",
        dynamic_type(v)
    ))
}

/// Sprig's `dig KEY... DEFAULT DICT`: the value at the path of keys, or the default
/// where a key is missing; a step that is no map fails as Go's type assertion does.
pub fn dig(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    if args.len() < 3 {
        return Err(FuncError::new("dig needs at least three arguments"));
    }
    let (path, rest) = args.split_at(args.len() - 2);
    let default = &rest[0];
    let mut current = match &rest[1] {
        Value::Map(m) => m.clone(),
        other => return Err(conversion_panic(other, "map[string]interface {}")),
    };
    let keys = path
        .iter()
        .map(|k| {
            k.as_str()
                .map(str::to_string)
                .ok_or_else(|| conversion_panic(k, "string"))
        })
        .collect::<Result<Vec<String>, _>>()?;
    for (i, key) in keys.iter().enumerate() {
        let Some(step) = current.get(key) else {
            return Ok(default.clone());
        };
        if i + 1 == keys.len() {
            return Ok(step);
        }
        current = match step {
            Value::Map(m) => m,
            other => return Err(conversion_panic(&other, "map[string]interface {}")),
        };
    }
    Ok(default.clone())
}
