//! Sprig's `urlParse`: a URL's parts as Go's `net/url` splits them.

use std::collections::BTreeMap;

use super::args::{arity, string_param};
use crate::helm::gotmpl::value::{FuncResult, Host, Value};

/// `urlParse URL`: a dict of `scheme`, `host`, `hostname`, `path`, `query`,
/// `opaque`, `fragment` and `userinfo`. Percent-escapes in the path stay as written
/// (Go decodes them).
pub fn url_parse(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity("urlParse", args, 1)?;
    let text = string_param(&args[0])?;
    let (rest, fragment) = match text.split_once('#') {
        Some((r, f)) => (r, f),
        None => (&*text, ""),
    };
    let (rest, query) = match rest.split_once('?') {
        Some((r, q)) => (r, q),
        None => (rest, ""),
    };
    let (scheme, rest) = match rest.split_once(':') {
        Some((s, r))
            if s.starts_with(|c: char| c.is_ascii_alphabetic())
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')) =>
        {
            (s, r)
        }
        _ => ("", rest),
    };
    let (mut userinfo, mut host, mut path, mut opaque) = ("", "", rest, "");
    if let Some(after) = rest.strip_prefix("//") {
        let end = after.find('/').unwrap_or(after.len());
        let authority = &after[..end];
        path = &after[end..];
        match authority.rsplit_once('@') {
            Some((user, h)) => (userinfo, host) = (user, h),
            None => host = authority,
        }
    } else if !scheme.is_empty() && !rest.starts_with('/') {
        (opaque, path) = (rest, "");
    }
    let hostname = if let Some(inner) = host.strip_prefix('[') {
        inner.split(']').next().unwrap_or_default()
    } else {
        host.rsplit_once(':').map_or(host, |(h, _)| h)
    };
    let entries = [
        ("scheme", scheme.to_ascii_lowercase()),
        ("host", host.to_string()),
        ("hostname", hostname.to_string()),
        ("path", path.to_string()),
        ("query", query.to_string()),
        ("opaque", opaque.to_string()),
        ("fragment", fragment.to_string()),
        ("userinfo", userinfo.to_string()),
    ];
    let map: BTreeMap<String, Value> = entries
        .into_iter()
        .map(|(k, v)| (k.to_string(), Value::string(v)))
        .collect();
    Ok(Value::map(map))
}
