//! Helm's YAML functions (`toYaml`, `mustToYaml`, `fromYaml`, `fromYamlArray`), on
//! [`crate::helm::yaml`], with Helm's error forms: `toYaml` of what cannot be
//! written is an empty string, `fromYaml` of bad text a map holding the message
//! under `Error`, `fromYamlArray` a list holding the message.

use std::collections::BTreeMap;

use super::args::{arity, string_param};
use crate::helm::gotmpl::value::{FuncError, FuncResult, Host, Value};
use crate::helm::yaml;

pub fn to_yaml(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity("toYaml", args, 1)?;
    Ok(Value::string(yaml::to_yaml(&args[0]).unwrap_or_default()))
}

pub fn must_to_yaml(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity("mustToYaml", args, 1)?;
    yaml::to_yaml(&args[0])
        .map(Value::string)
        .map_err(|e| FuncError::new(e.message))
}

pub fn from_yaml(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity("fromYaml", args, 1)?;
    let text = string_param(&args[0])?;
    Ok(match yaml::from_yaml_map(&text) {
        Ok(map) => Value::map(map),
        Err(e) => {
            let mut map = BTreeMap::new();
            map.insert("Error".to_string(), Value::string(e.message));
            Value::map(map)
        }
    })
}

pub fn from_yaml_array(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity("fromYamlArray", args, 1)?;
    let text = string_param(&args[0])?;
    Ok(match yaml::from_yaml_array(&text) {
        Ok(items) => Value::list(items),
        Err(e) => Value::list(vec![Value::string(e.message)]),
    })
}
