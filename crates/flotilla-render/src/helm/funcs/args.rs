//! What every family shares: Go's argument checks (arity, typed parameters), Sprig's
//! loose conversions (`cast.ToInt64`, `cast.ToFloat64`, `strval`), Go's "empty", Go's
//! `reflect.DeepEqual`, and Go's `%v` and `%q` printing of values.

use std::sync::Arc;

use crate::helm::gotmpl::value::{FuncError, MapRef, Value};

/// The largest string a function may build (`repeat`, `indent`, `cat`, `join`, ...).
pub const MAX_STRING_BYTES: usize = 16 << 20;
/// The most items a function may build in one list (`until`, `seq`, `splitList`, ...).
pub const MAX_LIST_ITEMS: usize = 1 << 20;

/// Prefixes of the errors Go's executor itself reports at the call site (without
/// `error calling NAME: `): a wrong count or type of arguments.
pub(crate) const CALL_SITE_PREFIXES: [&str; 2] =
    ["wrong number of args for ", "wrong type for value; "];

pub(crate) fn arity(name: &str, args: &[Value], want: usize) -> Result<(), FuncError> {
    if args.len() == want {
        Ok(())
    } else {
        Err(FuncError::new(format!(
            "wrong number of args for {name}: want {want} got {}",
            args.len()
        )))
    }
}

pub(crate) fn arity_at_least(name: &str, args: &[Value], want: usize) -> Result<(), FuncError> {
    if args.len() >= want {
        Ok(())
    } else {
        Err(FuncError::new(format!(
            "wrong number of args for {name}: want at least {want} got {}",
            args.len()
        )))
    }
}

/// The type Go's executor names when a value cannot be passed to a typed parameter:
/// a nil from a map or a function is an `interface {}`.
fn got_type(v: &Value) -> String {
    match v {
        Value::Nil | Value::Missing => "interface {}".to_string(),
        other => other.type_name(),
    }
}

pub(crate) fn wrong_type(expected: &str, v: &Value) -> FuncError {
    FuncError::new(format!(
        "wrong type for value; expected {expected}; got {}",
        got_type(v)
    ))
}

/// A Go `string` parameter: only a string is accepted, or the bytes of a binary file
/// `.Files.Get` gave (a Go string holds any bytes), as text.
pub(crate) fn string_param(v: &Value) -> Result<Arc<str>, FuncError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Bytes(b) => Ok(Arc::from(String::from_utf8_lossy(b).as_ref())),
        other => Err(wrong_type("string", other)),
    }
}

/// A Go `int` parameter: only a Go `int` (template literals, `len`, `atoi`, `int`).
pub(crate) fn int_param(v: &Value) -> Result<i64, FuncError> {
    match v {
        Value::Int(i) => Ok(*i),
        other => Err(wrong_type("int", other)),
    }
}

pub(crate) fn bool_param(v: &Value) -> Result<bool, FuncError> {
    match v {
        Value::Bool(b) => Ok(*b),
        other => Err(wrong_type("bool", other)),
    }
}

pub(crate) type GoMap = MapRef;

/// A Go `map[string]interface{}` parameter. No value (a variable holding a missing
/// key, as `$s := (lookup ...).data` does) becomes Go's nil map, which reads as empty.
pub(crate) fn map_param(v: &Value) -> Result<GoMap, FuncError> {
    match v {
        Value::Map(m) => Ok(m.clone()),
        Value::Missing => Ok(GoMap::default()),
        other => Err(wrong_type("map[string]interface {}", other)),
    }
}

/// The items of a slice argument Sprig reads with reflection, or None when the value
/// is no slice.
pub(crate) fn slice_items(v: &Value) -> Option<Vec<Value>> {
    match v {
        Value::List(items) => Some(items.as_ref().clone()),
        Value::Bytes(bytes) => Some(bytes.iter().map(|b| Value::Int(i64::from(*b))).collect()),
        _ => None,
    }
}

/// The error Go raises when reflection is asked for the kind of a nil interface.
pub(crate) fn nil_dereference() -> FuncError {
    FuncError::new("runtime error: invalid memory address or nil pointer dereference")
}

/// Go's `reflect.Kind` name of a value, for Sprig's "Cannot X on type KIND" errors.
pub(crate) fn kind_of(v: &Value) -> &'static str {
    v.kind_name()
}

pub(crate) fn check_string_len(len: usize, what: &str) -> Result<(), FuncError> {
    if len > MAX_STRING_BYTES {
        Err(FuncError::new(format!(
            "{what} would build a string of {len} bytes, above flotilla's limit of {MAX_STRING_BYTES} bytes"
        )))
    } else {
        Ok(())
    }
}

pub(crate) fn check_list_len(len: usize, what: &str) -> Result<(), FuncError> {
    if len > MAX_LIST_ITEMS {
        Err(FuncError::new(format!(
            "{what} would build a list of {len} items, above flotilla's limit of {MAX_LIST_ITEMS} items"
        )))
    } else {
        Ok(())
    }
}

/// A list of Go strings (`[]string`), as a list of string values.
pub(crate) fn string_list<I: IntoIterator<Item = S>, S: Into<Arc<str>>>(items: I) -> Value {
    Value::list(items.into_iter().map(|s| Value::String(s.into())).collect())
}

/// Go's "empty" as Sprig's `empty` and `default` see it: nil, false, zero, and empty
/// strings, lists and maps. Structs (Helm's objects) are never empty.
pub(crate) fn is_empty(v: &Value) -> bool {
    !v.truthy()
}

/// Go's `reflect.DeepEqual` on template values: types must match (`1` is not `1.0`).
pub(crate) fn deep_equal(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Nil | Value::Missing, Value::Nil | Value::Missing) => true,
        (Value::Bool(x), Value::Bool(y)) => x == y,
        (Value::Int(x), Value::Int(y)) | (Value::Int64(x), Value::Int64(y)) => x == y,
        (Value::Float(x), Value::Float(y)) => x == y,
        (Value::String(x), Value::String(y)) => x == y,
        (Value::Bytes(x), Value::Bytes(y)) => x == y,
        (Value::List(x), Value::List(y)) => {
            x.len() == y.len() && x.iter().zip(y.iter()).all(|(p, q)| deep_equal(p, q))
        }
        (Value::Map(x), Value::Map(y)) => {
            if x.same(y) {
                return true;
            }
            let (Some(_vx), Some(_vy)) = (x.visit(), y.visit()) else {
                return false;
            };
            let (x, y) = (x.entries(), y.entries());
            x.len() == y.len()
                && x.iter()
                    .zip(y.iter())
                    .all(|((k1, v1), (k2, v2))| k1 == k2 && deep_equal(v1, v2))
        }
        (Value::Object(x), Value::Object(y)) => Arc::ptr_eq(x, y),
        _ => false,
    }
}

/// Go's `strconv.ParseInt(s, 0, 64)`: an optional sign, then decimal, `0x` hex, `0o`
/// or leading-`0` octal, `0b` binary, with `_` allowed between digits after a prefix
/// or in decimal.
pub(crate) fn parse_go_int(s: &str) -> Option<i64> {
    let (negative, body) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let lower = body.to_ascii_lowercase();
    let (radix, digits, prefixed) = if let Some(rest) = lower.strip_prefix("0x") {
        (16, rest.to_string(), true)
    } else if let Some(rest) = lower.strip_prefix("0b") {
        (2, rest.to_string(), true)
    } else if let Some(rest) = lower.strip_prefix("0o") {
        (8, rest.to_string(), true)
    } else if lower.len() > 1 && lower.starts_with('0') {
        (8, lower[1..].to_string(), true)
    } else {
        (10, lower.clone(), false)
    };
    if !underscores_ok(&digits, prefixed) {
        return None;
    }
    let clean: String = digits.chars().filter(|c| *c != '_').collect();
    if clean.is_empty() || clean.starts_with('+') || clean.starts_with('-') {
        return None;
    }
    let magnitude = u64::from_str_radix(&clean, radix).ok()?;
    if negative {
        if magnitude <= i64::MAX as u64 + 1 {
            Some((magnitude as i128).wrapping_neg() as i64)
        } else {
            None
        }
    } else {
        i64::try_from(magnitude).ok()
    }
}

/// Go's rule for `_` in base-prefixed literals: only between digits (or right after
/// the prefix).
fn underscores_ok(digits: &str, prefixed: bool) -> bool {
    if !digits.contains('_') {
        return true;
    }
    let bytes = digits.as_bytes();
    if bytes.last() == Some(&b'_') || digits.contains("__") {
        return false;
    }
    prefixed || bytes.first() != Some(&b'_')
}

/// `cast.ToInt64`, as Sprig's arithmetic converts each argument: numbers truncated,
/// strings parsed as Go integer literals (a `.0...` tail dropped first), bools 1 or 0,
/// anything else 0.
pub(crate) fn to_int64(v: &Value) -> i64 {
    match v {
        Value::Int(i) | Value::Int64(i) => *i,
        Value::Float(f) => float_to_int(*f),
        Value::Bool(b) => i64::from(*b),
        Value::String(s) => parse_go_int(trim_zero_decimal(s)).unwrap_or(0),
        _ => 0,
    }
}

/// Go's conversion of a float64 to int64 truncates; out of range it gives the minimum
/// on amd64, which is what Helm's releases run on.
pub(crate) fn float_to_int(f: f64) -> i64 {
    if f.is_nan() || !(-9.223_372_036_854_776e18..9.223_372_036_854_776e18).contains(&f) {
        i64::MIN
    } else {
        f.trunc() as i64
    }
}

/// `cast`'s trimZeroDecimal: "3.000" is "3", "3.5" stays.
fn trim_zero_decimal(s: &str) -> &str {
    match s.find('.') {
        Some(dot) if dot > 0 && s[dot + 1..].bytes().all(|b| b == b'0') => &s[..dot],
        _ => s,
    }
}

/// `cast.ToFloat64`: numbers widened, strings parsed as Go float literals, bools 1 or
/// 0, anything else 0.
pub(crate) fn to_float64(v: &Value) -> f64 {
    match v {
        Value::Int(i) | Value::Int64(i) => *i as f64,
        Value::Float(f) => *f,
        Value::Bool(b) => f64::from(u8::from(*b)),
        Value::String(s) => parse_go_float(s).unwrap_or(0.0),
        _ => 0.0,
    }
}

/// Go's `strconv.ParseFloat(s, 64)` for decimal input, with `_` between digits, and
/// Go's spellings of infinity and NaN.
pub(crate) fn parse_go_float(s: &str) -> Option<f64> {
    let unsigned = s.trim_start_matches(['+', '-']);
    let lower = unsigned.to_ascii_lowercase();
    if matches!(lower.as_str(), "inf" | "infinity" | "nan") {
        return s.parse::<f64>().ok();
    }
    if lower.starts_with("0x")
        || !lower
            .bytes()
            .all(|b| b.is_ascii_digit() || b"._e+-".contains(&b))
    {
        return None;
    }
    if s.contains('_') {
        if s.contains("__") || s.ends_with('_') || s.starts_with('_') {
            return None;
        }
        return s.replace('_', "").parse::<f64>().ok();
    }
    s.parse::<f64>().ok()
}

/// Sprig's `strval` (what `toString`, `quote`, `join`, `dict` keys use): strings as
/// they are, bytes as text, anything else as `%v` prints it.
pub(crate) fn strval(v: &Value) -> String {
    match v {
        Value::String(s) => s.to_string(),
        Value::Bytes(b) => String::from_utf8_lossy(b).into_owned(),
        other => go_sprint(other),
    }
}

/// Go's `fmt.Sprint` (`%v`) of one value. A nil (or missing) value is `<nil>` here:
/// `<no value>` is only what the template printer writes for a missing value.
pub(crate) fn go_sprint(v: &Value) -> String {
    let mut out = String::new();
    write_value(&mut out, v);
    out
}

fn write_value(out: &mut String, v: &Value) {
    match v {
        Value::Nil | Value::Missing => out.push_str("<nil>"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Int(i) | Value::Int64(i) => out.push_str(&i.to_string()),
        Value::Float(f) => out.push_str(&format_float_v(*f)),
        Value::String(s) => out.push_str(s),
        Value::Bytes(b) => {
            out.push('[');
            for (i, byte) in b.iter().enumerate() {
                if i > 0 {
                    out.push(' ');
                }
                out.push_str(&byte.to_string());
            }
            out.push(']');
        }
        Value::List(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(' ');
                }
                write_value(out, item);
            }
            out.push(']');
        }
        Value::Map(map) => {
            let Some(_visit) = map.visit() else {
                out.push_str(crate::helm::gotmpl::CYCLE_TEXT);
                return;
            };
            let map = map.entries();
            out.push_str("map[");
            for (i, (k, item)) in map.iter().enumerate() {
                if i > 0 {
                    out.push(' ');
                }
                out.push_str(k);
                out.push(':');
                write_value(out, item);
            }
            out.push(']');
        }
        Value::Object(o) => out.push_str(&o.display()),
    }
}

/// The shortest decimal digits of a finite, non-zero float and its decimal exponent
/// (the value is 0.d1d2... times 10^(exp+1), i.e. d1.d2... times 10^exp).
fn shortest_digits(f: f64) -> (String, i32) {
    let formatted = format!("{:e}", f.abs());
    let (mantissa, exponent) = formatted.split_once('e').unwrap_or((&formatted, "0"));
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    (digits, exponent.parse().unwrap_or(0))
}

fn e_form(negative: bool, digits: &str, exp: i32, min_exp_digits: usize) -> String {
    let mut out = String::new();
    if negative {
        out.push('-');
    }
    out.push_str(&digits[..1]);
    if digits.len() > 1 {
        out.push('.');
        out.push_str(&digits[1..]);
    }
    out.push('e');
    out.push(if exp < 0 { '-' } else { '+' });
    let magnitude = exp.unsigned_abs().to_string();
    for _ in magnitude.len()..min_exp_digits {
        out.push('0');
    }
    out.push_str(&magnitude);
    out
}

fn f_form(negative: bool, digits: &str, exp: i32) -> String {
    let mut out = String::new();
    if negative {
        out.push('-');
    }
    if exp < 0 {
        out.push_str("0.");
        for _ in 0..(-exp - 1) {
            out.push('0');
        }
        out.push_str(digits);
    } else {
        let int_len = exp as usize + 1;
        if digits.len() <= int_len {
            out.push_str(digits);
            for _ in digits.len()..int_len {
                out.push('0');
            }
        } else {
            out.push_str(&digits[..int_len]);
            out.push('.');
            out.push_str(&digits[int_len..]);
        }
    }
    out
}

/// Go's `%v` of a float64 (`strconv.FormatFloat(f, 'g', -1, 64)`): the shortest
/// digits that read back the same, in exponent form when the exponent is below -4 or
/// at least 6 (`1e+06`, `123456`, `1e-05`, `0.0001`).
pub(crate) fn format_float_v(f: f64) -> String {
    if f.is_nan() {
        return "NaN".to_string();
    }
    if f.is_infinite() {
        return if f > 0.0 { "+Inf" } else { "-Inf" }.to_string();
    }
    if f == 0.0 {
        return if f.is_sign_negative() { "-0" } else { "0" }.to_string();
    }
    let (digits, exp) = shortest_digits(f);
    if !(-4..6).contains(&exp) {
        e_form(f < 0.0, &digits, exp, 2)
    } else {
        f_form(f < 0.0, &digits, exp)
    }
}

/// `encoding/json`'s float64: plain decimals from 1e-6 up to 1e21, else exponent form
/// with Go's JSON spelling (`1e-7`, `1e+21`).
pub(crate) fn format_float_json(f: f64) -> String {
    if f == 0.0 {
        return if f.is_sign_negative() { "-0" } else { "0" }.to_string();
    }
    let (digits, exp) = shortest_digits(f);
    let abs = f.abs();
    if !(1e-6..1e21).contains(&abs) {
        e_form(f < 0.0, &digits, exp, 1)
    } else {
        f_form(f < 0.0, &digits, exp)
    }
}

/// Go's `strconv.Quote` (`%q`): a double-quoted string with Go's escapes.
pub(crate) fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{b}' => out.push_str("\\v"),
            c if is_go_printable(c) => out.push(c),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c if (c as u32) < 0x10000 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push_str(&format!("\\U{:08x}", c as u32)),
        }
    }
    out.push('"');
    out
}

/// Go's `unicode.IsPrint`, approximated: everything but controls, spaces other than
/// U+0020, line and paragraph separators, the common format characters, private use
/// and non-characters.
fn is_go_printable(c: char) -> bool {
    let u = c as u32;
    if c == ' ' {
        return true;
    }
    if c.is_control() {
        return false;
    }
    let not_printable = matches!(u,
        0xA0 | 0xAD | 0x1680 | 0x2000..=0x200F | 0x2028..=0x202F | 0x205F..=0x2064
        | 0x2066..=0x206F | 0x3000 | 0xFEFF | 0xFFF9..=0xFFFB | 0xFFFE | 0xFFFF
        | 0x600..=0x605 | 0x61C | 0x6DD | 0x70F | 0x180E | 0xE000..=0xF8FF
        | 0xF0000..=0x10FFFF | 0xE0000..=0xE007F);
    !not_printable
}
