//! Sprig's and Helm's encodings: base64 and base32 (with Go's decoding errors),
//! the checksums, and JSON written as Go's `encoding/json` writes it and read as Helm
//! reads it (every number a `float64`).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use sha1::Digest as _;

use super::args::{arity, format_float_json, string_list, string_param};
use crate::helm::gotmpl::value::{FuncError, FuncResult, Host, Value};

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
const B32: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";

pub(crate) fn base64_encode(data: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(data)
}

/// Go's `base64.StdEncoding.DecodeString`: newlines skipped, padding required, and
/// the error names the offending byte's offset.
fn base64_decode(src: &[u8]) -> Result<Vec<u8>, usize> {
    let value = |c: u8| B64.iter().position(|&a| a == c).map(|p| p as u32);
    let mut out = Vec::with_capacity(src.len() / 4 * 3);
    let mut si = 0;
    loop {
        let mut quantum = [0u32; 4];
        let mut j = 0;
        let mut finished = false;
        while j < 4 {
            if si == src.len() {
                if j == 0 {
                    return Ok(out);
                }
                return Err(si - j);
            }
            let c = src[si];
            si += 1;
            if let Some(v) = value(c) {
                quantum[j] = v;
                j += 1;
                continue;
            }
            if c == b'\n' || c == b'\r' {
                continue;
            }
            if c != b'=' || j < 2 {
                return Err(si - 1);
            }
            if j == 2 {
                while si < src.len() && (src[si] == b'\n' || src[si] == b'\r') {
                    si += 1;
                }
                if si == src.len() {
                    return Err(src.len());
                }
                if src[si] != b'=' {
                    return Err(si - 1);
                }
                si += 1;
            }
            while si < src.len() && (src[si] == b'\n' || src[si] == b'\r') {
                si += 1;
            }
            if si < src.len() {
                return Err(si);
            }
            finished = true;
            break;
        }
        let bits = quantum[0] << 18 | quantum[1] << 12 | quantum[2] << 6 | quantum[3];
        let bytes = [(bits >> 16) as u8, (bits >> 8) as u8, bits as u8];
        out.extend_from_slice(&bytes[..j - 1]);
        if finished {
            return Ok(out);
        }
    }
}

fn base32_encode(data: &[u8]) -> String {
    let mut out = String::with_capacity(data.len().div_ceil(5) * 8);
    for chunk in data.chunks(5) {
        let mut block = [0u8; 5];
        block[..chunk.len()].copy_from_slice(chunk);
        let bits = block.iter().fold(0u64, |acc, b| acc << 8 | u64::from(*b));
        let symbols = match chunk.len() {
            1 => 2,
            2 => 4,
            3 => 5,
            4 => 7,
            _ => 8,
        };
        for i in 0..8 {
            if i < symbols {
                out.push(B32[((bits >> (35 - 5 * i)) & 31) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Go's `base32.StdEncoding.DecodeString`: newlines removed first, then quanta of
/// eight with Go's padding rules and error offsets.
fn base32_decode(input: &[u8]) -> Result<Vec<u8>, usize> {
    let src: Vec<u8> = input
        .iter()
        .copied()
        .filter(|c| *c != b'\n' && *c != b'\r')
        .collect();
    let olen = src.len();
    let value = |c: u8| B32.iter().position(|&a| a == c).map(|p| p as u64);
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < olen {
        let mut quantum = [0u64; 8];
        let mut j = 0;
        let mut end = false;
        while j < 8 {
            let remaining = olen - pos;
            if remaining == 0 {
                return Err(olen - j);
            }
            let c = src[pos];
            pos += 1;
            let left = olen - pos;
            if c == b'=' && j >= 2 && left < 8 {
                if left + j < 7 {
                    return Err(olen);
                }
                for k in 0..(7 - j) {
                    if left > k && src[pos + k] != b'=' {
                        return Err(olen - left + k - 1);
                    }
                }
                if j == 1 || j == 3 || j == 6 {
                    return Err(olen - left - 1);
                }
                end = true;
                break;
            }
            match value(c) {
                Some(v) => quantum[j] = v,
                None => return Err(olen - left - 1),
            }
            j += 1;
        }
        let bits = quantum.iter().fold(0u64, |acc, v| acc << 5 | v);
        let bytes: [u8; 5] = [
            (bits >> 32) as u8,
            (bits >> 24) as u8,
            (bits >> 16) as u8,
            (bits >> 8) as u8,
            bits as u8,
        ];
        let n = match j {
            8 => 5,
            7 => 4,
            5 => 3,
            4 => 2,
            2 => 1,
            _ => 0,
        };
        out.extend_from_slice(&bytes[..n]);
        if end {
            break;
        }
    }
    Ok(out)
}

fn lossy(bytes: Vec<u8>) -> Value {
    Value::string(String::from_utf8_lossy(&bytes).into_owned())
}

pub fn b64enc(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity("b64enc", args, 1)?;
    // A binary file's `.Files.Get`, as its bytes (Go's string of them).
    if let Value::Bytes(bytes) = &args[0] {
        return Ok(Value::string(base64_encode(bytes)));
    }
    Ok(Value::string(base64_encode(
        string_param(&args[0])?.as_bytes(),
    )))
}

/// Sprig's `b64dec`: the decoded text, or Go's error message as the result.
pub fn b64dec(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity("b64dec", args, 1)?;
    let s = string_param(&args[0])?;
    Ok(match base64_decode(s.as_bytes()) {
        Ok(bytes) => lossy(bytes),
        Err(at) => Value::string(format!("illegal base64 data at input byte {at}")),
    })
}

pub fn b32enc(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity("b32enc", args, 1)?;
    Ok(Value::string(base32_encode(
        string_param(&args[0])?.as_bytes(),
    )))
}

pub fn b32dec(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity("b32dec", args, 1)?;
    let s = string_param(&args[0])?;
    Ok(match base32_decode(s.as_bytes()) {
        Ok(bytes) => lossy(bytes),
        Err(at) => Value::string(format!("illegal base32 data at input byte {at}")),
    })
}

use crate::seal::hex_lower as hex;

/// HMAC of `text` under `key` with the hash `D` (where a plain digest of a text
/// holding a decrypted value would let its reader test guesses of the value).
fn keyed<D>(key: &[u8; 32], text: &str) -> Vec<u8>
where
    D: sha2::Digest + sha2::digest::core_api::BlockSizeUser,
{
    use hmac::Mac as _;
    let mut mac = hmac::SimpleHmac::<D>::new_from_slice(key).expect("any key length");
    mac.update(text.as_bytes());
    mac.finalize().into_bytes().to_vec()
}

pub fn sha1sum(host: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity("sha1sum", args, 1)?;
    let text = string_param(&args[0])?;
    Ok(Value::string(match host.secret_key_for(&text) {
        Some(key) => hex(&keyed::<sha1::Sha1>(&key, &text)),
        None => hex(&sha1::Sha1::digest(text.as_bytes())),
    }))
}

pub fn sha256sum(host: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity("sha256sum", args, 1)?;
    // A binary file's `.Files.Get`, hashed as its bytes (no SOPS value is binary).
    if let Value::Bytes(bytes) = &args[0] {
        return Ok(Value::string(crate::seal::sha256_hex(bytes)));
    }
    Ok(Value::string(host.sha256_hex(&string_param(&args[0])?)))
}

pub fn sha512sum(host: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity("sha512sum", args, 1)?;
    let text = string_param(&args[0])?;
    Ok(Value::string(match host.secret_key_for(&text) {
        Some(key) => hex(&keyed::<sha2::Sha512>(&key, &text)),
        None => hex(&sha2::Sha512::digest(text.as_bytes())),
    }))
}

/// Sprig's `adler32sum`: the Adler-32 checksum in decimal (over a text holding a
/// decrypted value, the first 32 bits of a keyed SHA-256 instead, in decimal too).
pub fn adler32sum(host: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity("adler32sum", args, 1)?;
    let s = string_param(&args[0])?;
    if let Some(key) = host.secret_key_for(&s) {
        let mac = keyed::<sha2::Sha256>(&key, &s);
        let value = u32::from_be_bytes([mac[0], mac[1], mac[2], mac[3]]);
        return Ok(Value::string(value.to_string()));
    }
    let (mut a, mut b) = (1u32, 0u32);
    for byte in s.as_bytes() {
        a = (a + u32::from(*byte)) % 65521;
        b = (b + a) % 65521;
    }
    Ok(Value::string((b << 16 | a).to_string()))
}

/// Why a value has no JSON form (Go's `json: unsupported value: NaN`).
#[derive(Debug)]
struct JsonError(String);

/// Go's `encoding/json` string escaping: `<`, `>` and `&` only when `escape_html`;
/// U+2028 and U+2029 always.
fn write_json_string(out: &mut String, s: &str, escape_html: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '<' | '>' | '&' if escape_html => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            '\u{2028}' | '\u{2029}' => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

fn newline_indent(out: &mut String, indent: Option<usize>) {
    if let Some(depth) = indent {
        out.push('\n');
        for _ in 0..depth {
            out.push_str("  ");
        }
    }
}

fn write_json(
    out: &mut String,
    v: &Value,
    escape_html: bool,
    indent: Option<usize>,
) -> Result<(), JsonError> {
    let deeper = indent.map(|d| d + 1);
    match v {
        Value::Nil | Value::Missing => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Int(i) | Value::Int64(i) => out.push_str(&i.to_string()),
        Value::Float(f) => {
            if !f.is_finite() {
                return Err(JsonError(format!(
                    "json: unsupported value: {}",
                    super::args::format_float_v(*f)
                )));
            }
            out.push_str(&format_float_json(*f));
        }
        Value::String(s) => write_json_string(out, s, escape_html),
        Value::Bytes(b) => write_json_string(out, &base64_encode(b), escape_html),
        Value::List(items) => {
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                newline_indent(out, deeper);
                write_json(out, item, escape_html, deeper)?;
            }
            newline_indent(out, indent);
            out.push(']');
        }
        Value::Map(map) => {
            let Some(_visit) = map.visit() else {
                return Err(JsonError(
                    "json: unsupported value: encountered a cycle via map[string]interface {}"
                        .to_string(),
                ));
            };
            if map.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, (k, item)) in map.entries().iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                newline_indent(out, deeper);
                write_json_string(out, k, escape_html);
                out.push(':');
                if indent.is_some() {
                    out.push(' ');
                }
                write_json(out, item, escape_html, deeper)?;
            }
            newline_indent(out, indent);
            out.push('}');
        }
        Value::Object(o) => match o.json_fields() {
            Some(fields) => {
                let map = fields.into_iter().collect();
                write_json(out, &Value::map(map), escape_html, indent)?;
            }
            None => write_json_string(out, &o.display(), escape_html),
        },
    }
    Ok(())
}

/// JSON of a value as Go's `json.Marshal` (`escape_html`) or an encoder with HTML
/// escaping off writes it; `pretty` indents by two spaces as `json.MarshalIndent`.
pub fn to_json_text(v: &Value, escape_html: bool, pretty: bool) -> Result<String, FuncError> {
    let mut out = String::new();
    write_json(&mut out, v, escape_html, pretty.then_some(0)).map_err(|e| FuncError::new(e.0))?;
    Ok(out)
}

/// The non-`must` JSON writers return the empty string where Go's encoder fails.
fn json_or_empty(name: &str, args: &[Value], escape_html: bool, pretty: bool) -> FuncResult {
    arity(name, args, 1)?;
    Ok(Value::string(
        to_json_text(&args[0], escape_html, pretty).unwrap_or_default(),
    ))
}

fn json_or_error(name: &str, args: &[Value], escape_html: bool, pretty: bool) -> FuncResult {
    arity(name, args, 1)?;
    Ok(Value::string(to_json_text(&args[0], escape_html, pretty)?))
}

pub fn to_json(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    json_or_empty("toJson", args, true, false)
}
pub fn must_to_json(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    json_or_error("mustToJson", args, true, false)
}
pub fn to_pretty_json(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    json_or_empty("toPrettyJson", args, true, true)
}
pub fn must_to_pretty_json(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    json_or_error("mustToPrettyJson", args, true, true)
}
/// Sprig's `toRawJson` panics where the encoder fails, so it fails like the `must`
/// form.
pub fn to_raw_json(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    json_or_error("toRawJson", args, false, false)
}
pub fn must_to_raw_json(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    json_or_error("mustToRawJson", args, false, false)
}

/// Reads JSON as Go's `json.Unmarshal` into `interface{}`; errors in Go's words
/// where flotilla can tell them apart (end of input, text after the value), else a
/// message naming the offending character.
fn parse_json(s: &str) -> Result<Value, String> {
    match serde_json::from_str::<serde_json::Value>(s) {
        Ok(json) => Ok(Value::from_json(&json)),
        Err(e) => Err(go_json_error(s, &e)),
    }
}

fn go_json_error(s: &str, e: &serde_json::Error) -> String {
    if e.is_eof() || s.trim().is_empty() {
        return "unexpected end of JSON input".to_string();
    }
    let offset = line_col_offset(s, e.line(), e.column());
    let at = s[..offset.min(s.len())].chars().last().unwrap_or(' ');
    let message = e.to_string();
    if message.starts_with("trailing characters") {
        return format!("invalid character {} after top-level value", quote_char(at));
    }
    if message.starts_with("key must be a string") {
        return format!(
            "invalid character {} looking for beginning of object key string",
            quote_char(at)
        );
    }
    format!(
        "invalid character {} looking for beginning of value",
        quote_char(at)
    )
}

/// Go quotes the offending character as a rune literal (`'x'`).
fn quote_char(c: char) -> String {
    match c {
        '\'' => "'\\''".to_string(),
        '"' => "'\"'".to_string(),
        c if c.is_control() => format!("'\\x{:02x}'", c as u32),
        c => format!("'{c}'"),
    }
}

fn line_col_offset(s: &str, line: usize, column: usize) -> usize {
    let mut offset = 0;
    for (i, text) in s.split_inclusive('\n').enumerate() {
        if i + 1 == line {
            return offset + column;
        }
        offset += text.len();
    }
    offset
}

fn go_json_kind(v: &Value) -> &'static str {
    match v {
        Value::List(_) => "array",
        Value::Map(_) => "object",
        Value::String(_) => "string",
        Value::Float(_) => "number",
        Value::Bool(_) => "bool",
        _ => "null",
    }
}

/// Helm's `fromJson`: a JSON object as a map; on failure, a map whose `Error` key
/// holds Go's message.
pub fn from_json(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity("fromJson", args, 1)?;
    let s = string_param(&args[0])?;
    let error = |message: String| {
        let mut map = BTreeMap::new();
        map.insert("Error".to_string(), Value::string(message));
        Value::map(map)
    };
    Ok(match parse_json(&s) {
        Ok(map @ Value::Map(_)) => map,
        Ok(Value::Nil) => Value::map(BTreeMap::new()),
        Ok(other) => error(format!(
            "json: cannot unmarshal {} into Go value of type map[string]interface {{}}",
            go_json_kind(&other)
        )),
        Err(message) => error(message),
    })
}

/// Helm's `fromJsonArray`: a JSON array as a list; on failure, a one-item list of
/// Go's message.
pub fn from_json_array(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity("fromJsonArray", args, 1)?;
    let s = string_param(&args[0])?;
    Ok(match parse_json(&s) {
        Ok(list @ Value::List(_)) => list,
        Ok(Value::Nil) => Value::list(Vec::new()),
        Ok(other) => string_list([format!(
            "json: cannot unmarshal {} into Go value of type []interface {{}}",
            go_json_kind(&other)
        )]),
        Err(message) => string_list([message]),
    })
}

/// Sprig's `mustFromJson`: any JSON value, or the error.
pub fn must_from_json(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity("mustFromJson", args, 1)?;
    let s = string_param(&args[0])?;
    parse_json(&s).map_err(FuncError::new)
}
