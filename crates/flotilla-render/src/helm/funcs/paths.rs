//! Go's `path` functions (slash-separated; Sprig's `os...` forms are the same here,
//! since flotilla renders for Linux hosts as Helm does on them).

use super::args::{arity, string_param};
use crate::helm::gotmpl::value::{FuncResult, Host, Value};

/// Go's `path.Clean`: the shortest equivalent path.
pub(crate) fn clean_path(p: &str) -> String {
    if p.is_empty() {
        return ".".to_string();
    }
    let rooted = p.starts_with('/');
    let mut parts: Vec<&str> = Vec::new();
    for part in p.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                if parts.last().is_some_and(|l| *l != "..") {
                    parts.pop();
                } else if !rooted {
                    parts.push("..");
                }
            }
            other => parts.push(other),
        }
    }
    let joined = parts.join("/");
    match (rooted, joined.is_empty()) {
        (true, _) => format!("/{joined}"),
        (false, true) => ".".to_string(),
        (false, false) => joined,
    }
}

fn one(name: &str, args: &[Value]) -> Result<String, crate::helm::gotmpl::value::FuncError> {
    arity(name, args, 1)?;
    Ok(string_param(&args[0])?.to_string())
}

pub fn base(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    let p = one("base", args)?;
    if p.is_empty() {
        return Ok(Value::string("."));
    }
    let trimmed = p.trim_end_matches('/');
    if trimmed.is_empty() {
        return Ok(Value::string("/"));
    }
    Ok(Value::string(trimmed.rsplit('/').next().unwrap_or(trimmed)))
}

pub fn dir(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    let p = one("dir", args)?;
    let head = match p.rfind('/') {
        Some(i) => &p[..=i],
        None => "",
    };
    Ok(Value::string(clean_path(head)))
}

pub fn clean(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    let p = one("clean", args)?;
    Ok(Value::string(clean_path(&p)))
}

pub fn ext(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    let p = one("ext", args)?;
    let last = p.rsplit('/').next().unwrap_or("");
    Ok(Value::string(last.rfind('.').map_or("", |i| &last[i..])))
}

pub fn is_abs(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    let p = one("isAbs", args)?;
    Ok(Value::Bool(p.starts_with('/')))
}
