//! Helm's `toToml`: TOML as the BurntSushi encoder (v1) Helm uses writes it. Plain
//! values first, then tables (`[a]`, nested ones indented two spaces a level) and
//! arrays of tables (`[[a.b]]`), keys sorted, every float64 with a fraction
//! (`1.0`), a blank line before each top-level table and each array-of-tables entry.
//! An error comes back as the function's text, as in Helm.

use super::args::arity;
use crate::helm::gotmpl::value::{FuncResult, Host, Value};

pub fn to_toml(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity("toToml", args, 1)?;
    let mut encoder = Encoder::default();
    match &args[0] {
        Value::Map(_) => {
            if let Err(message) = encoder.table(&[], &args[0]) {
                return Ok(Value::string(message));
            }
        }
        other => match inline(other) {
            Ok(text) => encoder.out.push_str(&text),
            Err(message) => return Ok(Value::string(message)),
        },
    }
    Ok(Value::string(encoder.out))
}

#[derive(Default)]
struct Encoder {
    out: String,
}

/// How deep tables may nest (a map holding itself ends here).
const MAX_DEPTH: usize = 100;

fn entries(value: &Value) -> Vec<(String, Value)> {
    match value {
        Value::Map(map) => map.entries(),
        Value::Object(o) => o.json_fields().unwrap_or_default(),
        _ => Vec::new(),
    }
}

fn is_table(value: &Value) -> bool {
    matches!(value, Value::Map(_)) || matches!(value, Value::Object(o) if o.json_fields().is_some())
}

fn is_array_of_tables(value: &Value) -> bool {
    matches!(value, Value::List(items) if !items.is_empty() && items.iter().all(is_table))
}

fn bare_key(key: &str) -> bool {
    !key.is_empty()
        && key
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'-')
}

fn key_text(key: &str) -> String {
    if bare_key(key) {
        key.to_string()
    } else {
        quote(key)
    }
}

fn quote(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\u{:04X}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn float_text(f: f64) -> String {
    if f.is_nan() {
        return "nan".to_string();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf" } else { "-inf" }.to_string();
    }
    // Go's strconv 'f' with the shortest precision, then a ".0" where it has none.
    let mut text = format!("{f}");
    if !text.contains('.') {
        text.push_str(".0");
    }
    text
}

/// A value written inline (after `key = `, or inside an array).
fn inline(value: &Value) -> Result<String, String> {
    Ok(match value {
        Value::Bool(b) => b.to_string(),
        Value::Int(i) | Value::Int64(i) => i.to_string(),
        Value::Float(f) => float_text(*f),
        Value::String(s) => quote(s),
        Value::Bytes(b) => quote(&String::from_utf8_lossy(b)),
        Value::List(items) => {
            let parts: Vec<String> = items
                .iter()
                .filter(|v| !matches!(v, Value::Nil | Value::Missing))
                .map(inline)
                .collect::<Result<_, _>>()?;
            format!("[{}]", parts.join(", "))
        }
        Value::Map(_) | Value::Object(_) if is_table(value) => {
            let Value::Map(map) = value else {
                return Ok(String::new());
            };
            let Some(_visit) = map.visit() else {
                return Err("toml: a map holds itself".to_string());
            };
            let parts: Vec<String> = entries(value)
                .iter()
                .filter(|(_, v)| !matches!(v, Value::Nil | Value::Missing))
                .map(|(k, v)| Ok(format!("{} = {}", key_text(k), inline(v)?)))
                .collect::<Result<_, String>>()?;
            format!("{{{}}}", parts.join(", "))
        }
        Value::Object(o) => quote(&o.display()),
        Value::Nil | Value::Missing | Value::Map(_) => String::new(),
    })
}

impl Encoder {
    fn newline(&mut self) {
        if !self.out.is_empty() {
            self.out.push('\n');
        }
    }

    fn indent(path: &[String]) -> String {
        "  ".repeat(path.len().saturating_sub(1))
    }

    fn header(path: &[String]) -> String {
        path.iter()
            .map(|k| key_text(k))
            .collect::<Vec<_>>()
            .join(".")
    }

    /// The contents of the table at `path`: plain keys, then tables and arrays of tables.
    fn table(&mut self, path: &[String], value: &Value) -> Result<(), String> {
        if path.len() > MAX_DEPTH {
            return Err("toml: tables nest too deep".to_string());
        }
        let mut all = entries(value);
        all.retain(|(_, v)| !matches!(v, Value::Nil | Value::Missing));
        all.sort_by(|a, b| a.0.cmp(&b.0));
        let (subs, direct): (Vec<_>, Vec<_>) = all
            .into_iter()
            .partition(|(_, v)| is_table(v) || is_array_of_tables(v));
        for (key, item) in &direct {
            let mut full = path.to_vec();
            full.push(key.clone());
            let text = inline(item)?;
            self.out.push_str(&format!(
                "{}{} = {text}\n",
                Self::indent(&full),
                key_text(key)
            ));
        }
        for (key, item) in &subs {
            let mut full = path.to_vec();
            full.push(key.clone());
            if let Value::List(items) = item {
                for entry in items.iter() {
                    self.newline();
                    self.out.push_str(&format!(
                        "{}[[{}]]\n",
                        Self::indent(&full),
                        Self::header(&full)
                    ));
                    self.table(&full, entry)?;
                }
            } else {
                if full.len() == 1 {
                    self.newline();
                }
                self.out.push_str(&format!(
                    "{}[{}]\n",
                    Self::indent(&full),
                    Self::header(&full)
                ));
                self.table(&full, item)?;
            }
        }
        Ok(())
    }
}
