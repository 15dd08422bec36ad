//! `configMapGenerator` and `secretGenerator` (and their builtin configurations under
//! `generators:`), and the content hash kustomize puts at the end of a generated name.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use super::builtin::{self, Generator};
use super::file::{GeneratorDoc, GeneratorOptions, Kustomization};
use super::{Accumulator, Behavior, Error, Resource};
use flotilla_core::snapshot::FleetSnapshot;

pub fn run(
    snapshot: &FleetSnapshot,
    kustomization: &Kustomization,
    accumulator: &mut Accumulator,
    build_folder: builtin::BuildFolder,
) -> Result<(), Error> {
    let doc = &kustomization.doc;
    let builtins = builtin::generators(snapshot, kustomization, build_folder)?;
    let global = doc.generator_options.as_ref();
    let fields = [
        (&doc.config_map_generator, "ConfigMap"),
        (&doc.secret_generator, "Secret"),
    ];
    // Literals written in a SOPS-encrypted kustomization are decrypted values.
    let own_keys = kustomization.sops_keys(snapshot, None);
    let own_keys = own_keys.as_slice();
    let from_fields = fields.into_iter().flat_map(|(entries, kind)| {
        entries.iter().map(move |entry| Generation {
            doc: &entry.value,
            line: entry.referenced.line(),
            label: field_name(kind),
            kind,
            global,
            hash_keys: own_keys,
        })
    });
    // kustomize runs the generators configured under `generators:` after those of
    // the fields; the kustomization's generatorOptions do not apply to them.
    let from_configs = builtins.iter().map(|config| {
        let (doc, kind) = match &config.value {
            Generator::ConfigMap(doc) => (doc, "ConfigMap"),
            Generator::Secret(doc) => (doc, "Secret"),
        };
        Generation {
            doc,
            line: config.line,
            label: config.label.as_str(),
            kind,
            global: None,
            hash_keys: &config.hash_keys,
        }
    });
    for generation in from_fields.chain(from_configs) {
        let resource = generate(snapshot, kustomization, &generation)?;
        absorb(kustomization, generation.line, resource, accumulator).map_err(|err| Error {
            message: format!("{}: {}", generation.label, err.message),
            ..err
        })?;
    }
    Ok(())
}

/// One generator to run: its entry, where it is, and the options that apply.
struct Generation<'a> {
    doc: &'a GeneratorDoc,
    line: u64,
    /// The field or configuration, for messages.
    label: &'a str,
    /// `ConfigMap` or `Secret`.
    kind: &'static str,
    global: Option<&'a GeneratorOptions>,
    /// The hash keys of the SOPS files its entry was written in.
    hash_keys: &'a [[u8; 32]],
}

fn field_name(kind: &str) -> &'static str {
    if kind == "ConfigMap" {
        "configMapGenerator"
    } else {
        "secretGenerator"
    }
}

/// Local options, with the global ones added where the local ones say nothing.
fn merged_options(
    local: Option<&GeneratorOptions>,
    global: Option<&GeneratorOptions>,
) -> GeneratorOptions {
    let mut options = local.cloned().unwrap_or_default();
    if let Some(global) = global {
        for (key, value) in &global.labels {
            options
                .labels
                .entry(key.clone())
                .or_insert_with(|| value.clone());
        }
        for (key, value) in &global.annotations {
            options
                .annotations
                .entry(key.clone())
                .or_insert_with(|| value.clone());
        }
        options.disable_name_suffix_hash |= global.disable_name_suffix_hash;
        options.immutable |= global.immutable;
    }
    options
}

fn generate(
    snapshot: &FleetSnapshot,
    kustomization: &Kustomization,
    generation: &Generation,
) -> Result<Resource, Error> {
    let Generation {
        doc,
        line,
        label,
        kind,
        global,
        hash_keys: written_in,
    } = *generation;
    let error = |message: String| kustomization.error(Some(line), format!("{label}: {message}"));
    let Some(name) = doc.name.as_deref().filter(|n| !n.is_empty()) else {
        return Err(error("a generated object needs a name".into()));
    };
    let behavior = match doc.behavior.as_deref().unwrap_or("create") {
        "" | "create" => Behavior::Create,
        "merge" => Behavior::Merge,
        "replace" => Behavior::Replace,
        other => {
            return Err(error(format!(
                "behavior {other:?} is none of create, merge or replace"
            )));
        }
    };
    let hash_keys = std::cell::RefCell::new(written_in.to_vec());
    let read = |path: &str| -> Result<String, Error> {
        let resolved = kustomization.resolve(Some(line), path)?;
        if let Some(key) = snapshot.hash_keys.get(&resolved) {
            hash_keys.borrow_mut().push(*key);
        }
        match snapshot.files.get(&resolved) {
            Some(text) => Ok(text.to_string()),
            None => Err(error(format!(
                "{path} cannot be read: {}",
                snapshot
                    .skipped
                    .get(&resolved)
                    .map_or("it does not exist in the fleet", String::as_str)
            ))),
        }
    };
    let mut pairs: Vec<(String, String)> = Vec::new();
    for path in doc.envs.iter().chain(&doc.env) {
        let text = read(path)?;
        for (number, raw) in text.split('\n').enumerate() {
            let raw = if number == 0 {
                raw.trim_start_matches('\u{feff}')
            } else {
                raw
            };
            let line_text = raw.trim_start();
            if line_text.is_empty() || line_text.starts_with('#') {
                continue;
            }
            let (key, value) = line_text.split_once('=').unwrap_or((line_text, ""));
            if !is_env_var_name(key) {
                return Err(error(format!(
                    "{path}:{}: {key:?} is not a valid environment variable name",
                    number + 1
                )));
            }
            pairs.push((key.to_string(), value.to_string()));
        }
    }
    for literal in &doc.literals {
        let Some((key, value)) = literal.split_once('=').filter(|(k, _)| !k.is_empty()) else {
            return Err(error(format!("literal {literal:?} is not key=value")));
        };
        pairs.push((key.to_string(), remove_quotes(value).to_string()));
    }
    for source in &doc.files {
        let (key, path) = match source.matches('=').count() {
            0 => (
                source.rsplit('/').next().unwrap_or(source).to_string(),
                source.as_str(),
            ),
            1 => {
                let (key, path) = source.split_once('=').unwrap_or_default();
                if key.is_empty() || path.is_empty() {
                    return Err(error(format!(
                        "file source {source:?} needs both a key and a path (key=path)"
                    )));
                }
                (key.to_string(), path)
            }
            _ => {
                return Err(error(format!(
                    "file source {source:?}: the key or the path contains '='"
                )));
            }
        };
        pairs.push((key, read(path)?));
    }
    let mut data = Map::new();
    for (key, value) in pairs {
        if !is_config_map_key(&key) {
            return Err(error(format!(
                "{key:?} is not a valid key (letters, digits, '-', '_' and '.')"
            )));
        }
        if data.contains_key(&key) {
            return Err(error(format!("the key {key:?} is given twice")));
        }
        let value = if kind == "Secret" {
            secret_value(value.as_bytes())
        } else {
            value
        };
        data.insert(key, Value::String(value));
    }
    let options = merged_options(doc.options.as_ref(), global);
    let mut metadata = Map::new();
    metadata.insert("name".into(), Value::String(name.to_string()));
    if let Some(namespace) = doc.namespace.as_deref().filter(|n| !n.is_empty()) {
        metadata.insert("namespace".into(), Value::String(namespace.to_string()));
    }
    if !options.labels.is_empty() {
        metadata.insert("labels".into(), string_map(&options.labels));
    }
    if !options.annotations.is_empty() {
        metadata.insert("annotations".into(), string_map(&options.annotations));
    }
    let mut object = Map::new();
    object.insert("apiVersion".into(), Value::String("v1".into()));
    object.insert("kind".into(), Value::String(kind.to_string()));
    object.insert("metadata".into(), Value::Object(metadata));
    if kind == "Secret" {
        let secret_type = doc.secret_type.as_deref().filter(|t| !t.is_empty());
        object.insert(
            "type".into(),
            Value::String(secret_type.unwrap_or("Opaque").to_string()),
        );
    }
    // kustomize always gives a Secret its data, and a ConfigMap only when it has some.
    if !data.is_empty() || kind == "Secret" {
        object.insert("data".into(), Value::Object(data));
    }
    if options.immutable {
        object.insert("immutable".into(), Value::Bool(true));
    }
    let mut resource = Resource::new(
        Value::Object(object),
        Arc::from(kustomization.file.as_str()),
        line,
    );
    resource.needs_hash = !options.disable_name_suffix_hash;
    resource.hash_keys = hash_keys.into_inner();
    resource.hash_keys.sort_unstable();
    resource.hash_keys.dedup();
    resource.behavior = behavior;
    Ok(resource)
}

fn string_map(map: &BTreeMap<String, String>) -> Value {
    Value::Object(
        map.iter()
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect(),
    )
}

/// A generated object joins the others: created, or merged into (or replacing) the
/// one of the same identity a base made.
fn absorb(
    kustomization: &Kustomization,
    line: u64,
    mut resource: Resource,
    accumulator: &mut Accumulator,
) -> Result<(), Error> {
    let id = resource.current_id();
    let found: Vec<usize> = accumulator
        .resources
        .iter()
        .enumerate()
        .filter(|(_, r)| {
            r.api_version() == resource.api_version() && r.all_ids().any(|other| other == id)
        })
        .map(|(index, _)| index)
        .collect();
    let error = |message: String| kustomization.error(Some(line), message);
    match (found.as_slice(), resource.behavior) {
        ([], Behavior::Create) => {
            accumulator.resources.push(resource);
            Ok(())
        }
        ([], _) => Err(error(format!(
            "{} {:?}: behavior merge or replace needs one from a base to change, and there is none",
            id.kind, id.name
        ))),
        ([index], Behavior::Merge | Behavior::Replace) => {
            let old = &accumulator.resources[*index];
            merge_metadata(&mut resource, old);
            if resource.behavior == Behavior::Merge {
                for field in ["data", "binaryData"] {
                    let mut merged = old
                        .value
                        .get(field)
                        .and_then(Value::as_object)
                        .cloned()
                        .unwrap_or_default();
                    if let Some(new) = resource.value.get(field).and_then(Value::as_object) {
                        for (key, value) in new {
                            merged.insert(key.clone(), value.clone());
                        }
                    }
                    if let Some(map) = resource.value.as_object_mut()
                        && !merged.is_empty()
                    {
                        map.insert(field.into(), Value::Object(merged));
                    }
                }
            }
            accumulator.resources[*index] = resource;
            Ok(())
        }
        ([_], Behavior::Create) => Err(error(format!(
            "{} {:?} already exists (from a base); give it behavior: merge or replace",
            id.kind, id.name
        ))),
        (_, _) => Err(error(format!(
            "more than one {} {:?} could take this generator's data",
            id.kind, id.name
        ))),
    }
}

/// What a merged or replacing generator keeps of the object it changes: its labels
/// and annotations (the new ones win), its name and namespace, and the history of
/// its names. It keeps a hash suffix only if both want one.
fn merge_metadata(resource: &mut Resource, old: &Resource) {
    for field in ["labels", "annotations"] {
        let mut merged = old.string_map(field);
        merged.extend(resource.string_map(field));
        if let Some(metadata) = resource
            .value
            .get_mut("metadata")
            .and_then(Value::as_object_mut)
        {
            if merged.is_empty() {
                metadata.remove(field);
            } else {
                metadata.insert(field.into(), string_map(&merged));
            }
        }
    }
    if let Some(metadata) = resource
        .value
        .get_mut("metadata")
        .and_then(Value::as_object_mut)
    {
        metadata.insert("name".into(), Value::String(old.name().to_string()));
        match old.value.pointer("/metadata/namespace") {
            Some(namespace) => {
                metadata.insert("namespace".into(), namespace.clone());
            }
            None => {
                metadata.remove("namespace");
            }
        }
    }
    resource.previous = old.previous.clone();
    resource.prefixes = old.prefixes.clone();
    resource.suffixes = old.suffixes.clone();
    resource.needs_hash = resource.needs_hash && old.needs_hash;
    resource.hash_keys.extend_from_slice(&old.hash_keys);
    resource.hash_keys.sort_unstable();
    resource.hash_keys.dedup();
    resource.file = old.file.clone();
    resource.line = old.line;
}

/// Appends the content hash to the name of every generated object that wants one.
pub fn add_hashes(resources: &mut [Resource]) {
    for resource in resources.iter_mut().filter(|r| r.needs_hash) {
        let hash = content_hash_keyed(&resource.value, &resource.hash_keys);
        resource.store_previous_id();
        let name = format!("{}-{hash}", resource.name());
        resource.set_name(name);
    }
}

/// kustomize's hash: sha256 of Go's JSON of `{data, kind, name}` (ConfigMap, with
/// `binaryData` when it has some) or `{data, kind, name, type}` (Secret, with
/// `stringData`), where `name` is always empty, the first ten hex digits with 0, 1,
/// 3, a and e swapped for letters that cannot spell words.
#[cfg(test)]
pub fn content_hash(value: &Value) -> String {
    content_hash_keyed(value, &[])
}

/// [`content_hash`], except that with `keys` (the hash keys of the SOPS files the
/// object was made from) the sha256 is an HMAC-SHA256 keyed with them: kustomize's
/// plain hash of decrypted values would let anyone who reads the name test a guess
/// of them.
pub fn content_hash_keyed(value: &Value, keys: &[[u8; 32]]) -> String {
    let kind = value.get("kind").and_then(Value::as_str).unwrap_or("");
    let field = |name: &str| match value.get(name) {
        None => Value::String(String::new()),
        Some(Value::Null) => Value::Null,
        Some(other) => other.clone(),
    };
    // kustomize looks the name up as one key called "metadata/name", which no object
    // has, so the name is always empty and never changes the hash.
    let name = Value::String(String::new());
    let mut encoded = BTreeMap::new();
    encoded.insert("kind", Value::String(kind.to_string()));
    encoded.insert("name", name);
    encoded.insert("data", field("data"));
    match kind {
        "ConfigMap" => {
            if value.get("binaryData").is_some_and(Value::is_object) {
                encoded.insert("binaryData", field("binaryData"));
            }
        }
        "Secret" => {
            encoded.insert("type", field("type"));
            if value.get("stringData").is_some_and(Value::is_object) {
                encoded.insert("stringData", field("stringData"));
            }
        }
        _ => {
            encoded.clear();
        }
    }
    let text = if encoded.is_empty() {
        go_json(value)
    } else {
        let mut text = String::from("{");
        for (index, (key, value)) in encoded.iter().enumerate() {
            if index > 0 {
                text.push(',');
            }
            go_string(&mut text, key);
            text.push(':');
            text.push_str(&go_json(value));
        }
        text.push('}');
        text
    };
    let hex = match crate::seal::combined_hash_key(keys) {
        None => crate::seal::hex_lower(&Sha256::digest(text.as_bytes())),
        Some(key) => crate::seal::keyed_hex(&key, text.as_bytes()),
    };
    hex[..10]
        .chars()
        .map(|c| match c {
            '0' => 'g',
            '1' => 'h',
            '3' => 'k',
            'a' => 'm',
            'e' => 't',
            other => other,
        })
        .collect()
}

/// JSON as Go's `encoding/json` writes it: map keys sorted, no spaces, and `<`, `>`,
/// `&`, U+2028 and U+2029 escaped.
fn go_json(value: &Value) -> String {
    let mut out = String::new();
    write_go_json(&mut out, value);
    out
}

fn write_go_json(out: &mut String, value: &Value) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => out.push_str(&go_number(n)),
        Value::String(s) => go_string(out, s),
        Value::Array(items) => {
            out.push('[');
            for (index, item) in items.iter().enumerate() {
                if index > 0 {
                    out.push(',');
                }
                write_go_json(out, item);
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (index, key) in keys.into_iter().enumerate() {
                if index > 0 {
                    out.push(',');
                }
                go_string(out, key);
                out.push(':');
                write_go_json(out, &map[key]);
            }
            out.push('}');
        }
    }
}

/// A number as Go writes a float64 read from JSON.
fn go_number(n: &serde_json::Number) -> String {
    if let Some(i) = n.as_i64() {
        return i.to_string();
    }
    if let Some(u) = n.as_u64() {
        return u.to_string();
    }
    let f = n.as_f64().unwrap_or(0.0);
    if f.fract() == 0.0 && f.abs() < 1e21 {
        return format!("{f:.0}");
    }
    let abs = f.abs();
    if (1e-6..1e21).contains(&abs) {
        format!("{f}")
    } else {
        // Go: 1e+21, 1e-07.
        let text = format!("{f:e}");
        match text.split_once('e') {
            Some((mantissa, exponent)) => {
                let (sign, digits) = match exponent.strip_prefix('-') {
                    Some(d) => ('-', d),
                    None => ('+', exponent),
                };
                format!("{mantissa}e{sign}{digits:0>2}")
            }
            None => text,
        }
    }
}

fn go_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '<' => out.push_str("\\u003c"),
            '>' => out.push_str("\\u003e"),
            '&' => out.push_str("\\u0026"),
            '\u{2028}' => out.push_str("\\u2028"),
            '\u{2029}' => out.push_str("\\u2029"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A Secret's value as kustomize writes it: base64, broken into lines of 70
/// characters (each ended by a line break) once it is 70 characters or longer.
fn secret_value(bytes: &[u8]) -> String {
    const LINE: usize = 70;
    let encoded = base64(bytes);
    if encoded.len() < LINE {
        return encoded;
    }
    let mut out = String::with_capacity(encoded.len() + encoded.len() / LINE + 1);
    for chunk in encoded.as_bytes().chunks(LINE) {
        out.push_str(std::str::from_utf8(chunk).unwrap_or_default());
        out.push('\n');
    }
    out
}

/// Standard base64 with padding.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        out.push(ALPHABET[(n >> 18) as usize & 63] as char);
        out.push(ALPHABET[(n >> 12) as usize & 63] as char);
        out.push(if chunk.len() > 1 {
            ALPHABET[(n >> 6) as usize & 63] as char
        } else {
            '='
        });
        out.push(if chunk.len() > 2 {
            ALPHABET[n as usize & 63] as char
        } else {
            '='
        });
    }
    out
}

/// kustomize strips one pair of matching quotes around a literal's value.
fn remove_quotes(value: &str) -> &str {
    let bytes = value.as_bytes();
    if bytes.len() >= 2
        && bytes[0] == bytes[bytes.len() - 1]
        && (bytes[0] == b'"' || bytes[0] == b'\'')
    {
        &value[1..value.len() - 1]
    } else {
        value
    }
}

/// A C identifier-like name, with `-` and `.` allowed too (Kubernetes'
/// `IsEnvVarName`).
fn is_env_var_name(key: &str) -> bool {
    let mut chars = key.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == '-' || c == '.')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.')
        && !key.starts_with("..")
        && key != "."
}

/// Kubernetes' `IsConfigMapKey`: letters, digits, `-`, `_` and `.`, at most 253,
/// not `.` or `..` or starting with `..`.
fn is_config_map_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= 253
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
        && key != "."
        && !key.starts_with("..")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn base64_pads() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"a"), "YQ==");
        assert_eq!(base64(b"ab"), "YWI=");
        assert_eq!(base64(b"abc"), "YWJj");
        assert_eq!(base64(b"secret\n"), "c2VjcmV0Cg==");
    }

    #[test]
    fn go_escapes_html_characters() {
        let mut out = String::new();
        go_string(&mut out, "a<b>&\"\n\u{1}");
        assert_eq!(out, "\"a\\u003cb\\u003e\\u0026\\\"\\n\\u0001\"");
    }

    #[test]
    fn hash_is_ten_letters_of_the_swapped_alphabet() {
        let hash = content_hash(
            &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"a": "b"}}),
        );
        assert_eq!(hash.len(), 10);
        assert!(!hash.contains(['0', '1', '3', 'a', 'e']));
    }
}
