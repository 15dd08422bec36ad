//! Reading: go-yaml v2's YAML 1.1 resolution over serde-saphyr's event parser, then
//! the JSON step of `sigs.k8s.io/yaml` (map keys become strings, every number a
//! float64 for Helm, an integer or a float for Kubernetes).

use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::Arc;

use serde_saphyr::granit_parser::{Event, Options, Parser, ScalarStyle, Tag};

use super::floats::format_g;
use super::{MAX_DEPTH, MAX_NODES, YamlError};
use crate::helm::gotmpl::Value;

/// A plain scalar as go-yaml v2 resolves it.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Scalar {
    Null,
    Bool(bool),
    Int(i64),
    Uint(u64),
    Float(f64),
    /// A timestamp: go-yaml gives `interface{}` its text.
    Timestamp(String),
    Merge,
    Str(String),
}

/// A parsed node, aliases shared.
enum Node {
    Scalar {
        text: String,
        style: ScalarStyle,
        tag: Option<Tag>,
    },
    Seq(Vec<Rc<Node>>),
    Map(Vec<(Rc<Node>, Rc<Node>)>),
}

/// A value after go-yaml and before JSON, map keys already strings.
#[derive(Debug, Clone)]
enum Decoded {
    Null,
    Bool(bool),
    Int(i64),
    Uint(u64),
    Float(f64),
    Str(String),
    Seq(Vec<Decoded>),
    Map(BTreeMap<String, Decoded>),
}

/// `sigs.k8s.io/yaml.Unmarshal` into `interface{}`: the first document of the text
/// (null when there is none), numbers as float64.
pub fn from_yaml(text: &str) -> Result<Value, YamlError> {
    Ok(match first_document(text)? {
        Some(decoded) => to_value(decoded),
        None => Value::Nil,
    })
}

/// `sigs.k8s.io/yaml.Unmarshal` into `map[string]interface{}`, as Helm reads values
/// files and `fromYaml` reads its argument: an empty document is an empty map.
pub fn from_yaml_map(text: &str) -> Result<BTreeMap<String, Value>, YamlError> {
    match from_yaml(text)? {
        Value::Nil => Ok(BTreeMap::new()),
        Value::Map(map) => Ok(map.snapshot()),
        other => Err(cannot_unmarshal(&other, "map[string]interface {}")),
    }
}

/// `sigs.k8s.io/yaml.Unmarshal` into `[]interface{}`, as `fromYamlArray` reads.
pub fn from_yaml_array(text: &str) -> Result<Vec<Value>, YamlError> {
    match from_yaml(text)? {
        Value::Nil => Ok(Vec::new()),
        Value::List(items) => Ok(Arc::unwrap_or_clone(items)),
        other => Err(cannot_unmarshal(&other, "[]interface {}")),
    }
}

fn cannot_unmarshal(value: &Value, into: &str) -> YamlError {
    let what = match value {
        Value::Map(_) => "object",
        Value::List(_) => "array",
        Value::String(_) => "string",
        Value::Bool(_) => "bool",
        _ => "number",
    };
    YamlError::new(format!(
        "error unmarshaling JSON: while decoding JSON: json: cannot unmarshal {what} into Go value of type {into}"
    ))
}

/// Helm's `releaseutil.SplitManifests`: the text cut at every line that starts with
/// `---` (what follows the dashes on that line stays, so `---# note` keeps a comment),
/// each part without its leading white space, blank parts dropped, in order.
pub fn split_manifests(text: &str) -> Vec<String> {
    let text = text.trim_start();
    let mut parts = Vec::new();
    let mut current = String::new();
    let mut at_line_start = true;
    let mut rest = text;
    while !rest.is_empty() {
        if at_line_start && rest.starts_with("---") {
            parts.push(std::mem::take(&mut current));
            rest = rest[3..].trim_start_matches([' ', '\t']);
            at_line_start = false;
            continue;
        }
        let line_end = rest.find('\n').map_or(rest.len(), |at| at + 1);
        current.push_str(&rest[..line_end]);
        at_line_start = rest[..line_end].ends_with('\n');
        rest = &rest[line_end..];
    }
    parts.push(current);
    parts
        .into_iter()
        .filter(|part| !part.trim().is_empty())
        .map(|part| part.trim_start().to_string())
        .collect()
}

/// The documents of a stream as Kubernetes' `YAMLReader` cuts them (Helm reads a
/// values file so): at every line that is `---` and white space.
pub fn split_documents(text: &str) -> Vec<&str> {
    let mut documents = Vec::new();
    let mut start = 0;
    let mut at = 0;
    for line in text.split_inclusive('\n') {
        if line.trim_end() == "---" {
            documents.push(&text[start..at]);
            start = at + line.len();
        }
        at += line.len();
    }
    documents.push(&text[start..]);
    documents
}

/// One document as Kubernetes reads YAML (`sigs.k8s.io/yaml` into JSON): `None` for a
/// document of comments or nothing; whole numbers become integers as the JSON a
/// cluster receives carries them.
pub fn parse_manifest(text: &str) -> Result<Option<serde_json::Value>, YamlError> {
    Ok(first_document(text)?.map(to_json))
}

fn to_value(decoded: Decoded) -> Value {
    match decoded {
        Decoded::Null => Value::Nil,
        Decoded::Bool(b) => Value::Bool(b),
        Decoded::Int(i) => Value::Float(i as f64),
        Decoded::Uint(u) => Value::Float(u as f64),
        Decoded::Float(f) => Value::Float(f),
        Decoded::Str(s) => Value::string(s),
        Decoded::Seq(items) => Value::list(items.into_iter().map(to_value).collect()),
        Decoded::Map(entries) => {
            Value::map(entries.into_iter().map(|(k, v)| (k, to_value(v))).collect())
        }
    }
}

fn to_json(decoded: Decoded) -> serde_json::Value {
    use serde_json::Value as J;
    match decoded {
        Decoded::Null => J::Null,
        Decoded::Bool(b) => J::Bool(b),
        Decoded::Int(i) => J::from(i),
        Decoded::Uint(u) => J::from(u),
        Decoded::Float(f) => {
            // Go's JSON writes a whole float below 1e21 without a fraction, and a
            // cluster reads that as an integer.
            if f == f.trunc() && f.abs() < 9.2e18 {
                J::from(f as i64)
            } else {
                serde_json::Number::from_f64(f).map_or(J::Null, J::Number)
            }
        }
        Decoded::Str(s) => J::String(s),
        Decoded::Seq(items) => J::Array(items.into_iter().map(to_json).collect()),
        Decoded::Map(entries) => {
            J::Object(entries.into_iter().map(|(k, v)| (k, to_json(v))).collect())
        }
    }
}

fn parse_error(line: u64, message: &str) -> YamlError {
    if line > 0 {
        YamlError::new(format!(
            "error converting YAML to JSON: yaml: line {line}: {message}"
        ))
    } else {
        YamlError::new(format!("error converting YAML to JSON: yaml: {message}"))
    }
}

fn convert_error(message: impl std::fmt::Display) -> YamlError {
    YamlError::new(format!("error converting YAML to JSON: {message}"))
}

/// The first document of a stream, decoded (go-yaml v2 reads no further).
fn first_document(text: &str) -> Result<Option<Decoded>, YamlError> {
    let Some(root) = parse_first(text)? else {
        return Ok(None);
    };
    let mut budget = MAX_NODES;
    let decoded = decode(&root, 0, &mut budget)?;
    check_json(&decoded)?;
    Ok(match decoded {
        Decoded::Null => None,
        other => Some(other),
    })
}

/// A collection being built from events.
enum Frame {
    Seq(Vec<Rc<Node>>, usize),
    Map(Vec<(Rc<Node>, Rc<Node>)>, Option<Rc<Node>>, usize),
}

fn parse_first(text: &str) -> Result<Option<Rc<Node>>, YamlError> {
    let mut options = Options::default();
    // libyaml, and with it go-yaml, ends a block scalar that ends the input without a
    // line break without one.
    options.block_scalar_eof_without_line_feed = true;
    let mut parser = Parser::new_from_str_with_options(text, options);
    let mut stack: Vec<Frame> = Vec::new();
    let mut anchors: BTreeMap<usize, Rc<Node>> = BTreeMap::new();
    let mut events = 0usize;
    while let Some(next) = parser.next_event() {
        let (event, span) =
            next.map_err(|err| parse_error(err.marker().line() as u64, &err.info()))?;
        events += 1;
        if events > MAX_NODES {
            return Err(convert_error("yaml: document contains excessive aliasing"));
        }
        let line = span.start.line() as u64;
        let (node, anchor) = match event {
            Event::StreamStart | Event::StreamEnd | Event::DocumentStart(..) => continue,
            Event::DocumentEnd => return Ok(None),
            Event::Scalar(text, style, anchor, tag) => (
                Rc::new(Node::Scalar {
                    text: text.to_string(),
                    style,
                    tag: tag.as_deref().cloned(),
                }),
                anchor,
            ),
            Event::Alias(id) => match anchors.get(&id) {
                Some(node) => (Rc::clone(node), 0),
                None => return Err(parse_error(line, "unknown anchor referenced")),
            },
            Event::SequenceStart(_, anchor, _) => {
                if stack.len() >= MAX_DEPTH {
                    return Err(parse_error(line, "exceeded max depth"));
                }
                stack.push(Frame::Seq(Vec::new(), anchor));
                continue;
            }
            Event::MappingStart(_, anchor, _) => {
                if stack.len() >= MAX_DEPTH {
                    return Err(parse_error(line, "exceeded max depth"));
                }
                stack.push(Frame::Map(Vec::new(), None, anchor));
                continue;
            }
            Event::SequenceEnd | Event::MappingEnd => match stack.pop() {
                Some(Frame::Seq(items, anchor)) => (Rc::new(Node::Seq(items)), anchor),
                Some(Frame::Map(entries, _, anchor)) => (Rc::new(Node::Map(entries)), anchor),
                None => continue,
            },
            _ => continue,
        };
        if anchor != 0 {
            anchors.insert(anchor, Rc::clone(&node));
        }
        match stack.last_mut() {
            None => return Ok(Some(node)),
            Some(Frame::Seq(items, _)) => items.push(node),
            Some(Frame::Map(entries, key, _)) => match key.take() {
                None => *key = Some(node),
                Some(k) => entries.push((k, node)),
            },
        }
    }
    Ok(None)
}

fn is_core(tag: &Tag) -> bool {
    tag.handle() == "tag:yaml.org,2002:"
}

fn decode(node: &Node, depth: usize, budget: &mut usize) -> Result<Decoded, YamlError> {
    if *budget == 0 {
        return Err(convert_error("yaml: document contains excessive aliasing"));
    }
    *budget -= 1;
    if depth > MAX_DEPTH {
        return Err(convert_error("yaml: exceeded max depth"));
    }
    match node {
        Node::Scalar {
            text, style, tag, ..
        } => decode_scalar(text, *style, tag.as_ref()),
        Node::Seq(items) => Ok(Decoded::Seq(
            items
                .iter()
                .map(|item| decode(item, depth + 1, budget))
                .collect::<Result<_, _>>()?,
        )),
        Node::Map(entries) => {
            let mut map = BTreeMap::new();
            for (key, value) in entries {
                if is_merge_key(key) {
                    merge(value, &mut map, depth, budget)?;
                    continue;
                }
                let key_text = key_string(decode(key, depth + 1, budget)?, value)?;
                let value = decode(value, depth + 1, budget)?;
                map.insert(key_text, value);
            }
            Ok(Decoded::Map(map))
        }
    }
}

fn is_merge_key(node: &Node) -> bool {
    match node {
        Node::Scalar {
            text, style, tag, ..
        } => match tag {
            Some(tag) => is_core(tag) && tag.suffix() == "merge",
            None => *style == ScalarStyle::Plain && text == "<<",
        },
        _ => false,
    }
}

const MERGE_ERROR: &str = "yaml: map merge requires map or sequence of maps as the value";

/// go-yaml v2 merges in order: merged keys replace the keys before `<<`, later keys
/// replace merged ones, and of a list of maps the earlier wins.
fn merge(
    value: &Node,
    map: &mut BTreeMap<String, Decoded>,
    depth: usize,
    budget: &mut usize,
) -> Result<(), YamlError> {
    let sources: Vec<&Node> = match value {
        Node::Map(_) => vec![value],
        Node::Seq(items) => items.iter().rev().map(|item| item.as_ref()).collect(),
        Node::Scalar { .. } => return Err(convert_error(MERGE_ERROR)),
    };
    for source in sources {
        match decode(source, depth + 1, budget)? {
            Decoded::Map(entries) if matches!(source, Node::Map(_)) => map.extend(entries),
            _ => return Err(convert_error(MERGE_ERROR)),
        }
    }
    Ok(())
}

/// The JSON key `sigs.k8s.io/yaml` makes of a decoded YAML key.
fn key_string(key: Decoded, value: &Node) -> Result<String, YamlError> {
    Ok(match key {
        Decoded::Str(s) => s,
        Decoded::Int(i) => i.to_string(),
        Decoded::Bool(b) => b.to_string(),
        Decoded::Float(f) if f.is_nan() => ".nan".into(),
        Decoded::Float(f) if f.is_infinite() => if f > 0.0 { ".inf" } else { "-.inf" }.into(),
        Decoded::Float(f) => format_g(f, true),
        Decoded::Null => {
            let shown = match value {
                Node::Scalar { text, .. } => text.clone(),
                _ => "...".into(),
            };
            return Err(convert_error(format!(
                "unsupported map key of type: %!s(<nil>), key: <nil>, value: {shown}"
            )));
        }
        Decoded::Uint(u) => {
            return Err(convert_error(format!(
                "unsupported map key of type: uint64, key: 0x{u:x}, value: ..."
            )));
        }
        Decoded::Seq(_) | Decoded::Map(_) => {
            return Err(convert_error(
                "yaml: invalid map key: a mapping or sequence",
            ));
        }
    })
}

/// JSON cannot hold NaN or the infinities.
fn check_json(decoded: &Decoded) -> Result<(), YamlError> {
    match decoded {
        Decoded::Float(f) if f.is_nan() => Err(convert_error("json: unsupported value: NaN")),
        Decoded::Float(f) if f.is_infinite() => Err(convert_error(format!(
            "json: unsupported value: {}Inf",
            if *f > 0.0 { "+" } else { "-" }
        ))),
        Decoded::Seq(items) => items.iter().try_for_each(check_json),
        Decoded::Map(entries) => entries.values().try_for_each(check_json),
        _ => Ok(()),
    }
}

fn decode_scalar(text: &str, style: ScalarStyle, tag: Option<&Tag>) -> Result<Decoded, YamlError> {
    let want = match tag {
        None if style == ScalarStyle::Plain => None,
        None => return Ok(Decoded::Str(text.to_string())),
        Some(tag) if !is_core(tag) => return Ok(Decoded::Str(text.to_string())),
        Some(tag) => Some(tag.suffix().to_string()),
    };
    match want.as_deref() {
        Some("str") => return Ok(Decoded::Str(text.to_string())),
        Some("binary") => {
            return decode_base64(text)
                .map(|bytes| Decoded::Str(String::from_utf8_lossy(&bytes).into_owned()))
                .ok_or_else(|| convert_error("yaml: !!binary value contains invalid base64 data"));
        }
        _ => {}
    }
    let resolved = resolve_plain(text);
    let decoded = match (&resolved, want.as_deref()) {
        (Scalar::Timestamp(t), None | Some("timestamp")) => Decoded::Str(t.clone()),
        (Scalar::Null, None | Some("null")) => Decoded::Null,
        (Scalar::Bool(b), None | Some("bool")) => Decoded::Bool(*b),
        (Scalar::Int(i), None | Some("int")) => Decoded::Int(*i),
        (Scalar::Uint(u), None | Some("int")) => Decoded::Uint(*u),
        (Scalar::Int(i), Some("float")) => Decoded::Float(*i as f64),
        (Scalar::Uint(u), Some("float")) => Decoded::Float(*u as f64),
        (Scalar::Float(f), None | Some("float")) => Decoded::Float(*f),
        (Scalar::Merge | Scalar::Str(_), None) => Decoded::Str(text.to_string()),
        (_, Some(wanted)) => {
            let found = match resolved {
                Scalar::Null => "null",
                Scalar::Bool(_) => "bool",
                Scalar::Int(_) | Scalar::Uint(_) => "int",
                Scalar::Float(_) => "float",
                Scalar::Timestamp(_) => "timestamp",
                Scalar::Merge => "merge",
                Scalar::Str(_) => "str",
            };
            return Err(convert_error(format!(
                "yaml: cannot decode !!{found} `{text}` as a !!{wanted}"
            )));
        }
    };
    Ok(decoded)
}

fn decode_base64(text: &str) -> Option<Vec<u8>> {
    let mut bits = 0u32;
    let mut count = 0;
    let mut out = Vec::new();
    for c in text.chars().filter(|c| !c.is_whitespace()) {
        let v = match c {
            'A'..='Z' => c as u32 - 'A' as u32,
            'a'..='z' => c as u32 - 'a' as u32 + 26,
            '0'..='9' => c as u32 - '0' as u32 + 52,
            '+' => 62,
            '/' => 63,
            '=' => continue,
            _ => return None,
        };
        bits = (bits << 6) | v;
        count += 1;
        if count == 4 {
            out.extend_from_slice(&[(bits >> 16) as u8, (bits >> 8) as u8, bits as u8]);
            bits = 0;
            count = 0;
        }
    }
    match count {
        0 => {}
        2 => out.push((bits >> 4) as u8),
        3 => out.extend_from_slice(&[(bits >> 10) as u8, (bits >> 2) as u8]),
        _ => return None,
    }
    Some(out)
}

/// go-yaml v2's `resolve` for an untagged plain scalar (YAML 1.1).
pub(super) fn resolve_plain(text: &str) -> Scalar {
    match text {
        "y" | "Y" | "yes" | "Yes" | "YES" | "true" | "True" | "TRUE" | "on" | "On" | "ON" => {
            return Scalar::Bool(true);
        }
        "n" | "N" | "no" | "No" | "NO" | "false" | "False" | "FALSE" | "off" | "Off" | "OFF" => {
            return Scalar::Bool(false);
        }
        "" | "~" | "null" | "Null" | "NULL" => return Scalar::Null,
        ".nan" | ".NaN" | ".NAN" => return Scalar::Float(f64::NAN),
        ".inf" | ".Inf" | ".INF" | "+.inf" | "+.Inf" | "+.INF" => {
            return Scalar::Float(f64::INFINITY);
        }
        "-.inf" | "-.Inf" | "-.INF" => return Scalar::Float(f64::NEG_INFINITY),
        "<<" => return Scalar::Merge,
        _ => {}
    }
    let first = text.as_bytes()[0];
    match first {
        b'.' => {
            if go_float_after_dot(text)
                && let Ok(f) = text.parse::<f64>()
            {
                return Scalar::Float(f);
            }
            Scalar::Str(text.to_string())
        }
        b'0'..=b'9' | b'+' | b'-' => {
            if is_timestamp(text) {
                return Scalar::Timestamp(text.to_string());
            }
            let plain: String = text.chars().filter(|&c| c != '_').collect();
            if let Some(number) = go_int(&plain) {
                return number;
            }
            if is_yaml_float(&plain)
                && let Ok(f) = plain.parse::<f64>()
                && f.is_finite()
            {
                return Scalar::Float(f);
            }
            Scalar::Str(text.to_string())
        }
        _ => Scalar::Str(text.to_string()),
    }
}

/// After a leading dot Go's `ParseFloat` takes digits and an optional exponent.
fn go_float_after_dot(text: &str) -> bool {
    let rest = &text[1..];
    let (mantissa, exponent) = match rest.find(['e', 'E']) {
        Some(at) => (&rest[..at], Some(&rest[at + 1..])),
        None => (rest, None),
    };
    !mantissa.is_empty()
        && mantissa.bytes().all(|b| b.is_ascii_digit())
        && exponent.is_none_or(|e| {
            let digits = e.strip_prefix(['+', '-']).unwrap_or(e);
            !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
        })
}

/// `^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$`
fn is_yaml_float(text: &str) -> bool {
    let bytes = text.as_bytes();
    let mut at = usize::from(matches!(bytes.first(), Some(b'+' | b'-')));
    let digits = |from: usize| {
        bytes[from.min(bytes.len())..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count()
    };
    if bytes.get(at) == Some(&b'.') {
        let n = digits(at + 1);
        if n == 0 {
            return false;
        }
        at += 1 + n;
    } else {
        let n = digits(at);
        if n == 0 {
            return false;
        }
        at += n;
        if bytes.get(at) == Some(&b'.') {
            at += 1 + digits(at + 1);
        }
    }
    if matches!(bytes.get(at), Some(b'e' | b'E')) {
        at += 1;
        if matches!(bytes.get(at), Some(b'+' | b'-')) {
            at += 1;
        }
        let n = digits(at);
        if n == 0 {
            return false;
        }
        at += n;
    }
    at == bytes.len()
}

/// Go's `strconv.ParseInt(s, 0, 64)`, then `ParseUint(s, 0, 64)`.
fn go_int(text: &str) -> Option<Scalar> {
    let (negative, signed, rest) = match text.as_bytes().first()? {
        b'-' => (true, true, &text[1..]),
        b'+' => (false, true, &text[1..]),
        _ => (false, false, text),
    };
    let (radix, digits) =
        if let Some(hex) = rest.strip_prefix("0x").or_else(|| rest.strip_prefix("0X")) {
            (16, hex)
        } else if let Some(octal) = rest.strip_prefix("0o").or_else(|| rest.strip_prefix("0O")) {
            (8, octal)
        } else if let Some(binary) = rest.strip_prefix("0b").or_else(|| rest.strip_prefix("0B")) {
            (2, binary)
        } else if rest.len() > 1 && rest.starts_with('0') {
            (8, &rest[1..])
        } else {
            (10, rest)
        };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    let magnitude = u64::from_str_radix(digits, radix).ok()?;
    if negative {
        return (magnitude <= i64::MAX as u64 + 1)
            .then(|| Scalar::Int((magnitude as i128).wrapping_neg() as i64));
    }
    if magnitude <= i64::MAX as u64 {
        return Some(Scalar::Int(magnitude as i64));
    }
    (!signed).then_some(Scalar::Uint(magnitude))
}

/// go-yaml v2's timestamp forms: `2006-1-2`, with `T`/`t`/space and a time, an
/// optional fraction and (after `T`) zone.
fn is_timestamp(text: &str) -> bool {
    let bytes = text.as_bytes();
    if bytes.len() < 6 || !bytes[..4].iter().all(u8::is_ascii_digit) || bytes[4] != b'-' {
        return false;
    }
    let mut at = 5;
    let number = |at: &mut usize, max: usize| -> Option<u32> {
        let start = *at;
        while *at < bytes.len() && *at - start < max && bytes[*at].is_ascii_digit() {
            *at += 1;
        }
        if *at == start {
            return None;
        }
        text[start..*at].parse().ok()
    };
    let Some(month) = number(&mut at, 2) else {
        return false;
    };
    if bytes.get(at) != Some(&b'-') {
        return false;
    }
    at += 1;
    let Some(day) = number(&mut at, 2) else {
        return false;
    };
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) {
        return false;
    }
    if at == bytes.len() {
        return true;
    }
    let zoned = match bytes[at] {
        b'T' | b't' => true,
        b' ' => false,
        _ => return false,
    };
    at += 1;
    let Some(hour) = number(&mut at, 2) else {
        return false;
    };
    if bytes.get(at) != Some(&b':') {
        return false;
    }
    at += 1;
    let Some(minute) = number(&mut at, 2) else {
        return false;
    };
    if bytes.get(at) != Some(&b':') {
        return false;
    }
    at += 1;
    let Some(second) = number(&mut at, 2) else {
        return false;
    };
    if hour > 23 || minute > 59 || second > 59 {
        return false;
    }
    if bytes.get(at) == Some(&b'.') {
        at += 1;
        let start = at;
        while at < bytes.len() && bytes[at].is_ascii_digit() {
            at += 1;
        }
        if at == start {
            return false;
        }
    }
    if !zoned {
        return at == bytes.len();
    }
    match bytes.get(at) {
        Some(b'Z') => at + 1 == bytes.len(),
        Some(b'+' | b'-') => {
            let zone = &text[at + 1..];
            zone.len() == 5
                && zone.as_bytes()[2] == b':'
                && zone
                    .bytes()
                    .enumerate()
                    .all(|(i, b)| i == 2 || b.is_ascii_digit())
        }
        _ => false,
    }
}
