//! Sprig's string functions: case, trimming, cutting, quoting, joining and splitting.

use std::collections::BTreeMap;

use super::args::{
    arity, check_list_len, check_string_len, go_quote, go_sprint, int_param, slice_items,
    string_list, string_param, strval,
};
use crate::helm::gotmpl::value::{FuncError, FuncResult, Host, Value};

/// Go's `unicode.ToUpper` rune by rune: a rune whose upper case is several runes
/// (`ß`) stays as it is, as in Go.
fn upper_rune(c: char) -> char {
    let mut up = c.to_uppercase();
    match (up.next(), up.next()) {
        (Some(u), None) => u,
        _ => c,
    }
}

fn lower_rune(c: char) -> char {
    let mut low = c.to_lowercase();
    match (low.next(), low.next()) {
        (Some(l), None) => l,
        _ => c,
    }
}

fn one_string(name: &str, args: &[Value]) -> Result<std::sync::Arc<str>, FuncError> {
    arity(name, args, 1)?;
    string_param(&args[0])
}

fn two_strings(
    name: &str,
    args: &[Value],
) -> Result<(std::sync::Arc<str>, std::sync::Arc<str>), FuncError> {
    arity(name, args, 2)?;
    Ok((string_param(&args[0])?, string_param(&args[1])?))
}

pub fn upper(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    let s = one_string("upper", args)?;
    Ok(Value::string(s.chars().map(upper_rune).collect::<String>()))
}

pub fn lower(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    let s = one_string("lower", args)?;
    Ok(Value::string(s.chars().map(lower_rune).collect::<String>()))
}

/// Go's `strings.Title` word boundaries: ASCII letters, digits and `_` are inside a
/// word, other ASCII is a separator; beyond ASCII, only spaces separate.
fn title_separator(c: char) -> bool {
    if c.is_ascii() {
        !(c.is_ascii_alphanumeric() || c == '_')
    } else {
        c.is_whitespace()
    }
}

pub fn title(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    let s = one_string("title", args)?;
    let mut previous_separates = true;
    let out: String = s
        .chars()
        .map(|c| {
            let mapped = if previous_separates { upper_rune(c) } else { c };
            previous_separates = title_separator(c);
            mapped
        })
        .collect();
    Ok(Value::string(out))
}

/// goutils' `Uncapitalize`: the first letter of each space-separated word lowered.
pub fn untitle(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    let s = one_string("untitle", args)?;
    let mut after_space = true;
    let out: String = s
        .chars()
        .map(|c| {
            let mapped = if after_space { lower_rune(c) } else { c };
            after_space = c.is_whitespace();
            mapped
        })
        .collect();
    Ok(Value::string(out))
}

pub fn swapcase(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    let s = one_string("swapcase", args)?;
    let out: String = s
        .chars()
        .map(|c| {
            if c.is_uppercase() {
                lower_rune(c)
            } else if c.is_lowercase() {
                upper_rune(c)
            } else {
                c
            }
        })
        .collect();
    Ok(Value::string(out))
}

pub fn trim(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    let s = one_string("trim", args)?;
    Ok(Value::string(s.trim()))
}

fn trim_all_named(name: &str, args: &[Value]) -> FuncResult {
    let (cutset, s) = two_strings(name, args)?;
    Ok(Value::string(s.trim_matches(|c| cutset.contains(c))))
}

pub fn trim_all(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    trim_all_named("trimAll", args)
}

pub fn trimall(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    trim_all_named("trimall", args)
}

pub fn trim_suffix(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    let (suffix, s) = two_strings("trimSuffix", args)?;
    Ok(Value::string(s.strip_suffix(&*suffix).unwrap_or(&s)))
}

pub fn trim_prefix(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    let (prefix, s) = two_strings("trimPrefix", args)?;
    Ok(Value::string(s.strip_prefix(&*prefix).unwrap_or(&s)))
}

pub fn nospace(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    let s = one_string("nospace", args)?;
    Ok(Value::string(
        s.chars().filter(|c| !c.is_whitespace()).collect::<String>(),
    ))
}

pub fn initials(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    let s = one_string("initials", args)?;
    let mut after_space = true;
    let mut out = String::new();
    for c in s.chars() {
        if c.is_whitespace() {
            after_space = true;
        } else if after_space {
            out.push(c);
            after_space = false;
        }
    }
    Ok(Value::string(out))
}

/// Cuts a string at byte offsets as Go slices do; a cut inside a multi-byte rune keeps
/// the broken bytes as U+FFFD (a Rust string must stay UTF-8).
fn byte_slice(s: &str, start: usize, end: usize) -> String {
    String::from_utf8_lossy(&s.as_bytes()[start..end]).into_owned()
}

/// Sprig's `trunc`: the first N bytes, or with a negative N the last -N.
pub fn trunc(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity("trunc", args, 2)?;
    let count = int_param(&args[0])?;
    let s = string_param(&args[1])?;
    let len = s.len() as i64;
    if count < 0 && len + count > 0 {
        return Ok(Value::string(byte_slice(
            &s,
            (len + count) as usize,
            s.len(),
        )));
    }
    if count >= 0 && len > count {
        return Ok(Value::string(byte_slice(&s, 0, count as usize)));
    }
    Ok(Value::String(s))
}

/// Go's panic for a slice expression out of range, as the template reports it.
fn slice_panic(message: String) -> FuncError {
    FuncError::new(format!(
        "runtime error: slice bounds out of range {message}"
    ))
}

/// Sprig's `substr START END S` in bytes, with Go's panics where Go's slicing panics.
pub fn substr(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity("substr", args, 3)?;
    let start = int_param(&args[0])?;
    let end = int_param(&args[1])?;
    let s = string_param(&args[2])?;
    let len = s.len() as i64;
    let (from, to) = if start < 0 {
        if end < 0 {
            return Err(slice_panic(format!("[:{end}]")));
        }
        if end > len {
            return Err(slice_panic(format!("[:{end}] with length {len}")));
        }
        (0, end)
    } else if end < 0 || end > len {
        if start > len {
            return Err(slice_panic(format!("[{start}:{len}]")));
        }
        (start, len)
    } else {
        if start > end {
            return Err(slice_panic(format!("[{start}:{end}]")));
        }
        (start, end)
    };
    Ok(Value::string(byte_slice(&s, from as usize, to as usize)))
}

pub fn repeat(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity("repeat", args, 2)?;
    let count = int_param(&args[0])?;
    let s = string_param(&args[1])?;
    if count < 0 {
        return Err(FuncError::new("strings: negative Repeat count"));
    }
    check_string_len(s.len().saturating_mul(count as usize), "repeat")?;
    Ok(Value::string(s.repeat(count as usize)))
}

pub fn contains(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    let (needle, s) = two_strings("contains", args)?;
    Ok(Value::Bool(s.contains(&*needle)))
}

pub fn has_prefix(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    let (prefix, s) = two_strings("hasPrefix", args)?;
    Ok(Value::Bool(s.starts_with(&*prefix)))
}

pub fn has_suffix(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    let (suffix, s) = two_strings("hasSuffix", args)?;
    Ok(Value::Bool(s.ends_with(&*suffix)))
}

fn is_nil(v: &Value) -> bool {
    matches!(v, Value::Nil | Value::Missing)
}

/// Sprig's `quote`: each non-nil argument as Go's `%q` of its string form, joined by
/// spaces (so a nil or missing value quotes to nothing, not `""`).
pub fn quote(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    let quoted: Vec<String> = args
        .iter()
        .filter(|v| !is_nil(v))
        .map(|v| go_quote(&strval(v)))
        .collect();
    Ok(Value::string(quoted.join(" ")))
}

/// Sprig's `squote`: each non-nil argument as `'%v'`, with no escaping.
pub fn squote(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    let quoted: Vec<String> = args
        .iter()
        .filter(|v| !is_nil(v))
        .map(|v| format!("'{}'", go_sprint(v)))
        .collect();
    Ok(Value::string(quoted.join(" ")))
}

pub fn cat(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    let parts: Vec<String> = args.iter().filter(|v| !is_nil(v)).map(go_sprint).collect();
    let total: usize = parts.iter().map(String::len).sum();
    check_string_len(total, "cat")?;
    Ok(Value::string(parts.join(" ")))
}

fn indented(name: &str, args: &[Value], leading_newline: bool) -> FuncResult {
    arity(name, args, 2)?;
    let spaces = int_param(&args[0])?;
    let s = string_param(&args[1])?;
    let pad = " ".repeat(usize::try_from(spaces).unwrap_or(0));
    let lines = s.matches('\n').count() + 1;
    check_string_len(
        s.len().saturating_add(lines.saturating_mul(pad.len())),
        name,
    )?;
    let mut out = String::with_capacity(s.len() + lines * pad.len() + 1);
    if leading_newline {
        out.push('\n');
    }
    out.push_str(&pad);
    out.push_str(&s.replace('\n', &format!("\n{pad}")));
    Ok(Value::string(out))
}

pub fn indent(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    indented("indent", args, false)
}

pub fn nindent(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    indented("nindent", args, true)
}

pub fn replace(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity("replace", args, 3)?;
    let old = string_param(&args[0])?;
    let new = string_param(&args[1])?;
    let src = string_param(&args[2])?;
    let matches = if old.is_empty() {
        src.chars().count() + 1
    } else {
        src.matches(&*old).count()
    };
    let len = (src.len() - matches.saturating_mul(old.len()).min(src.len()))
        .saturating_add(matches.saturating_mul(new.len()));
    check_string_len(len, "replace")?;
    Ok(Value::string(src.replace(&*old, &new)))
}

pub fn plural(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity("plural", args, 3)?;
    let one = string_param(&args[0])?;
    let many = string_param(&args[1])?;
    let count = int_param(&args[2])?;
    Ok(Value::String(if count == 1 { one } else { many }))
}

pub fn to_string(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity("toString", args, 1)?;
    Ok(Value::string(strval(&args[0])))
}

/// Sprig's `strslice`: a list's non-nil items as strings; a nil is no items, any
/// other value one.
pub(crate) fn strslice(v: &Value) -> Vec<String> {
    match slice_items(v) {
        Some(items) => items.iter().filter(|i| !is_nil(i)).map(strval).collect(),
        None if is_nil(v) => Vec::new(),
        None => vec![strval(v)],
    }
}

pub fn to_strings(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity("toStrings", args, 1)?;
    Ok(string_list(strslice(&args[0])))
}

pub fn join(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity("join", args, 2)?;
    let sep = string_param(&args[0])?;
    let parts = strslice(&args[1]);
    let total = parts.iter().map(String::len).sum::<usize>()
        + sep.len().saturating_mul(parts.len().saturating_sub(1));
    check_string_len(total, "join")?;
    Ok(Value::string(parts.join(&sep)))
}

/// Go's `strings.SplitN` (`n < 0`: all parts; an empty separator splits runes).
fn go_split(s: &str, sep: &str, n: i64) -> Vec<String> {
    if n == 0 {
        return Vec::new();
    }
    let limit = if n < 0 { usize::MAX } else { n as usize };
    if sep.is_empty() {
        let chars: Vec<char> = s.chars().collect();
        let mut out: Vec<String> = Vec::new();
        for (i, c) in chars.iter().enumerate() {
            if out.len() + 1 == limit {
                out.push(chars[i..].iter().collect());
                return out;
            }
            out.push(c.to_string());
        }
        return out;
    }
    s.splitn(limit, sep).map(str::to_string).collect()
}

pub fn split_list(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    let (sep, s) = two_strings("splitList", args)?;
    let parts = go_split(&s, &sep, -1);
    check_list_len(parts.len(), "splitList")?;
    Ok(string_list(parts))
}

fn numbered_parts(parts: Vec<String>) -> Value {
    let map: BTreeMap<String, Value> = parts
        .into_iter()
        .enumerate()
        .map(|(i, p)| (format!("_{i}"), Value::string(p)))
        .collect();
    Value::map(map)
}

/// Sprig's `split`: a map from `_0`, `_1`, ... to the parts.
pub fn split(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    let (sep, s) = two_strings("split", args)?;
    let parts = go_split(&s, &sep, -1);
    check_list_len(parts.len(), "split")?;
    Ok(numbered_parts(parts))
}

pub fn splitn(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity("splitn", args, 3)?;
    let sep = string_param(&args[0])?;
    let n = int_param(&args[1])?;
    let s = string_param(&args[2])?;
    let parts = go_split(&s, &sep, n);
    check_list_len(parts.len(), "splitn")?;
    Ok(numbered_parts(parts))
}

/// goutils' `Abbreviate`/`AbbreviateFull`, in bytes as Go counts them.
fn abbreviate_full(s: &str, offset: i64, max_width: i64) -> String {
    let len = s.len() as i64;
    if len <= max_width {
        return s.to_string();
    }
    let mut offset = offset.min(len);
    if len - offset < max_width - 3 {
        offset = len - (max_width - 3);
    }
    if offset <= 4 {
        return format!("{}...", byte_slice(s, 0, (max_width - 3) as usize));
    }
    if offset + max_width - 3 < len {
        let tail = byte_slice(s, offset as usize, s.len());
        return format!("...{}", abbreviate_full(&tail, 0, max_width - 3));
    }
    format!(
        "...{}",
        byte_slice(s, (len - (max_width - 3)) as usize, s.len())
    )
}

pub fn abbrev(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity("abbrev", args, 2)?;
    let width = int_param(&args[0])?;
    let s = string_param(&args[1])?;
    if width < 4 {
        return Ok(Value::String(s));
    }
    Ok(Value::string(abbreviate_full(&s, 0, width)))
}

pub fn abbrevboth(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity("abbrevboth", args, 3)?;
    let left = int_param(&args[0])?;
    let right = int_param(&args[1])?;
    let s = string_param(&args[2])?;
    if right < 4 || left > 0 && right < 7 {
        return Ok(Value::String(s));
    }
    Ok(Value::string(abbreviate_full(&s, left, right)))
}

/// goutils' `WrapCustom`: lines broken at spaces so none is longer than the width
/// where a space allows; with `long_words`, words longer than the width are cut.
fn wrap_custom(s: &str, width: i64, newline: &str, long_words: bool) -> String {
    let width = width.max(1) as usize;
    let bytes = s.as_bytes();
    let len = bytes.len();
    let mut out = String::new();
    let mut offset = 0usize;
    while len - offset > width {
        if bytes[offset] == b' ' {
            offset += 1;
            continue;
        }
        let window_end = (offset + width + 1).min(len);
        let space = s[offset..window_end].rfind(' ').map(|i| i + offset);
        match space {
            Some(space) if space >= offset => {
                out.push_str(&s[offset..space]);
                out.push_str(newline);
                offset = space + 1;
            }
            _ if long_words => {
                let cut = floor_char_boundary(s, offset + width);
                out.push_str(&s[offset..cut]);
                out.push_str(newline);
                offset = cut;
            }
            _ => match s[offset + width..].find(' ') {
                Some(i) => {
                    let space = offset + width + i;
                    out.push_str(&s[offset..space]);
                    out.push_str(newline);
                    offset = space + 1;
                }
                None => {
                    out.push_str(&s[offset..]);
                    offset = len;
                }
            },
        }
    }
    out.push_str(&s[offset..]);
    out
}

fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

pub fn wrap(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity("wrap", args, 2)?;
    let width = int_param(&args[0])?;
    let s = string_param(&args[1])?;
    Ok(Value::string(wrap_custom(&s, width, "\n", false)))
}

pub fn wrap_with(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity("wrapWith", args, 3)?;
    let width = int_param(&args[0])?;
    let newline = string_param(&args[1])?;
    let s = string_param(&args[2])?;
    let breaks = s.len() / (width.max(1) as usize) + 1;
    check_string_len(s.len() + breaks.saturating_mul(newline.len()), "wrapWith")?;
    Ok(Value::string(wrap_custom(&s, width, &newline, true)))
}

/// xstrings' word splitting for `snakecase` and `kebabcase`: words end at a
/// separator, before an upper-case letter that follows a lower-case one or a digit,
/// and before the last upper-case letter of a run followed by a lower-case one.
fn case_words(s: &str) -> Vec<String> {
    let chars: Vec<char> = s.chars().collect();
    let mut words: Vec<String> = Vec::new();
    let mut current = String::new();
    for (i, &c) in chars.iter().enumerate() {
        if !c.is_alphanumeric() {
            if !current.is_empty() {
                words.push(std::mem::take(&mut current));
            }
            continue;
        }
        if c.is_uppercase() && !current.is_empty() {
            let prev = chars[i - 1];
            let next_lower = chars.get(i + 1).is_some_and(|n| n.is_lowercase());
            if prev.is_lowercase() || prev.is_ascii_digit() || (prev.is_uppercase() && next_lower) {
                words.push(std::mem::take(&mut current));
            }
        }
        current.push(c);
    }
    if !current.is_empty() {
        words.push(current);
    }
    words
}

fn joined_lower(s: &str, sep: &str) -> String {
    case_words(s)
        .iter()
        .map(|w| w.chars().map(lower_rune).collect::<String>())
        .collect::<Vec<_>>()
        .join(sep)
}

pub fn snakecase(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    let s = one_string("snakecase", args)?;
    Ok(Value::string(joined_lower(&s, "_")))
}

pub fn kebabcase(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    let s = one_string("kebabcase", args)?;
    Ok(Value::string(joined_lower(&s, "-")))
}

/// xstrings' `ToPascalCase` (Sprig's `camelcase`): `_`, `-` and spaces removed, the
/// letter after each upper-cased, the first one too.
pub fn camelcase(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    let s = one_string("camelcase", args)?;
    let mut out = String::with_capacity(s.len());
    let mut upper_next = true;
    for c in s.chars() {
        if c == '_' || c == '-' || c == ' ' {
            upper_next = true;
        } else if upper_next {
            out.push(upper_rune(c));
            upper_next = false;
        } else {
            out.push(c);
        }
    }
    Ok(Value::string(out))
}
