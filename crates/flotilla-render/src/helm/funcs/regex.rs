//! Sprig's regular expressions, Go's RE2 syntax on the `regex` crate. The two
//! agree on syntax and leftmost-first semantics; where they differ flotilla makes the
//! crate behave as Go: `\d`, `\w`, `\s` and `\b` are ASCII-only in Go (the crate's
//! are Unicode), and Go skips an empty match right after the previous match in the
//! `All` functions. Compile errors say `error parsing regexp: ...` as Go's do, in
//! the crate's words.

use regex::Regex;

use super::args::{arity, check_list_len, check_string_len, int_param, string_list, string_param};
use crate::helm::gotmpl::value::{FuncError, FuncResult, Host, Value};

/// Rewrites Go's ASCII-only Perl classes for the crate, inside and outside brackets.
fn go_pattern(pattern: &str) -> String {
    let mut out = String::with_capacity(pattern.len() + 16);
    let mut chars = pattern.chars().peekable();
    let mut in_class = false;
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                let Some(next) = chars.next() else {
                    out.push('\\');
                    break;
                };
                let replacement = match (next, in_class) {
                    ('d', _) => Some(if in_class { "0-9" } else { "[0-9]" }),
                    ('w', _) => Some(if in_class {
                        "0-9A-Za-z_"
                    } else {
                        "[0-9A-Za-z_]"
                    }),
                    ('s', _) => Some(if in_class {
                        "\\t\\n\\f\\r "
                    } else {
                        "[\\t\\n\\f\\r ]"
                    }),
                    ('D', false) => Some("[^0-9]"),
                    ('W', false) => Some("[^0-9A-Za-z_]"),
                    ('S', false) => Some("[^\\t\\n\\f\\r ]"),
                    ('b', false) => Some("(?-u:\\b)"),
                    ('B', false) => Some("(?-u:\\B)"),
                    _ => None,
                };
                match replacement {
                    Some(r) => out.push_str(r),
                    None => {
                        out.push('\\');
                        out.push(next);
                    }
                }
            }
            '[' if !in_class => {
                in_class = true;
                out.push('[');
                // A `]` or `^]` right after the bracket is a literal in both syntaxes.
                if chars.peek() == Some(&'^') {
                    out.push('^');
                    chars.next();
                }
                if chars.peek() == Some(&']') {
                    out.push_str("\\]");
                    chars.next();
                }
            }
            '[' if in_class && chars.peek() == Some(&':') => {
                // A POSIX class `[:alpha:]` inside brackets.
                out.push('[');
                for p in chars.by_ref() {
                    out.push(p);
                    if p == ']' {
                        break;
                    }
                }
            }
            ']' if in_class => {
                in_class = false;
                out.push(']');
            }
            c => out.push(c),
        }
    }
    out
}

/// Patterns compiled so far on this thread, at most [`COMPILED_KEPT`]: charts call the
/// same few patterns for every label and image of every release (Bitnami's `common`),
/// and compiling one costs more than the rest of the call.
const COMPILED_KEPT: usize = 256;

thread_local! {
    static COMPILED: std::cell::RefCell<std::collections::HashMap<String, Regex>> =
        std::cell::RefCell::new(std::collections::HashMap::new());
}

fn compile(pattern: &str) -> Result<Regex, FuncError> {
    if let Some(re) = COMPILED.with(|kept| kept.borrow().get(pattern).cloned()) {
        return Ok(re);
    }
    let re = compile_anew(pattern)?;
    COMPILED.with(|kept| {
        let mut kept = kept.borrow_mut();
        if kept.len() >= COMPILED_KEPT {
            kept.clear();
        }
        kept.insert(pattern.to_string(), re.clone());
    });
    Ok(re)
}

fn compile_anew(pattern: &str) -> Result<Regex, FuncError> {
    Regex::new(&go_pattern(pattern)).map_err(|e| {
        let detail = match &e {
            regex::Error::Syntax(text) => text
                .lines()
                .rev()
                .find(|l| l.starts_with("error: "))
                .map(|l| l.trim_start_matches("error: ").to_string())
                .unwrap_or_else(|| "invalid syntax".to_string()),
            regex::Error::CompiledTooBig(limit) => {
                format!("expression too large (above {limit} bytes compiled)")
            }
            _ => "invalid syntax".to_string(),
        };
        FuncError::new(format!("error parsing regexp: {detail}: `{pattern}`"))
    })
}

/// Go's `regexp.MustCompile` panics; the template reports the panic.
fn must_compile(pattern: &str) -> Result<Regex, FuncError> {
    compile(pattern).map_err(|e| FuncError::new(format!("regexp: Compile(`{pattern}`): {}", e.0)))
}

/// Go's successive non-overlapping matches: an empty match right where the previous
/// match ended is skipped; `n < 0` means all.
fn go_find_all(re: &Regex, s: &str, n: i64) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    if n == 0 {
        return out;
    }
    let limit = if n < 0 { usize::MAX } else { n as usize };
    let mut pos = 0;
    let mut previous_end: Option<usize> = None;
    while pos <= s.len() && out.len() < limit {
        let Some(m) = re.find_at(s, pos) else { break };
        let (start, end) = (m.start(), m.end());
        let accept = !(start == end && previous_end == Some(end));
        if end == start {
            pos = end + s[end..].chars().next().map_or(1, char::len_utf8);
        } else {
            pos = end;
        }
        if accept {
            out.push((start, end));
            previous_end = Some(end);
        }
    }
    out
}

fn two_strings(name: &str, args: &[Value], want: usize) -> Result<(String, String), FuncError> {
    arity(name, args, want)?;
    Ok((
        string_param(&args[0])?.to_string(),
        string_param(&args[1])?.to_string(),
    ))
}

pub fn regex_match(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    let (pattern, s) = two_strings("regexMatch", args, 2)?;
    Ok(Value::Bool(
        compile(&pattern).is_ok_and(|re| re.is_match(&s)),
    ))
}

pub fn must_regex_match(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    let (pattern, s) = two_strings("mustRegexMatch", args, 2)?;
    Ok(Value::Bool(compile(&pattern)?.is_match(&s)))
}

fn find(re: &Regex, s: &str) -> Value {
    Value::string(re.find(s).map_or("", |m| m.as_str()))
}

pub fn regex_find(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    let (pattern, s) = two_strings("regexFind", args, 2)?;
    Ok(find(&must_compile(&pattern)?, &s))
}

pub fn must_regex_find(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    let (pattern, s) = two_strings("mustRegexFind", args, 2)?;
    Ok(find(&compile(&pattern)?, &s))
}

fn find_all(name: &str, args: &[Value], must: bool) -> FuncResult {
    let (pattern, s) = two_strings(name, args, 3)?;
    let n = int_param(&args[2])?;
    let re = if must {
        compile(&pattern)?
    } else {
        must_compile(&pattern)?
    };
    let found = go_find_all(&re, &s, n);
    check_list_len(found.len(), name)?;
    Ok(string_list(
        found.into_iter().map(|(a, b)| s[a..b].to_string()),
    ))
}

pub fn regex_find_all(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    find_all("regexFindAll", args, false)
}

pub fn must_regex_find_all(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    find_all("mustRegexFindAll", args, true)
}

/// Go's `ReplaceAllString`: `$1`, `${1}`, `$name` expand (the crate's rules are
/// Go's); `literal` replaces with the text as it is.
fn replace_all(name: &str, args: &[Value], must: bool, literal: bool) -> FuncResult {
    arity(name, args, 3)?;
    let pattern = string_param(&args[0])?;
    let s = string_param(&args[1])?;
    let replacement = string_param(&args[2])?;
    let re = if must {
        compile(&pattern)?
    } else {
        must_compile(&pattern)?
    };
    let mut out = String::with_capacity(s.len());
    let mut last = 0;
    for (start, end) in go_find_all(&re, &s, -1) {
        out.push_str(&s[last..start]);
        if literal {
            out.push_str(&replacement);
        } else if let Some(caps) = re.captures_at(&s, start) {
            caps.expand(&replacement, &mut out);
        }
        last = end;
        check_string_len(out.len(), name)?;
    }
    out.push_str(&s[last..]);
    Ok(Value::string(out))
}

pub fn regex_replace_all(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    replace_all("regexReplaceAll", args, false, false)
}
pub fn must_regex_replace_all(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    replace_all("mustRegexReplaceAll", args, true, false)
}
pub fn regex_replace_all_literal(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    replace_all("regexReplaceAllLiteral", args, false, true)
}
pub fn must_regex_replace_all_literal(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    replace_all("mustRegexReplaceAllLiteral", args, true, true)
}

/// Go's `Regexp.Split`.
fn go_split(re: &Regex, s: &str, n: i64) -> Vec<String> {
    if n == 0 {
        return Vec::new();
    }
    if !re.as_str().is_empty() && s.is_empty() {
        return vec![String::new()];
    }
    let matches = go_find_all(re, s, n);
    let mut out = Vec::with_capacity(matches.len() + 1);
    let (mut begin, mut end) = (0, 0);
    for (start, stop) in matches {
        if n > 0 && out.len() as i64 == n - 1 {
            break;
        }
        end = start;
        if stop != 0 {
            out.push(s[begin..end].to_string());
        }
        begin = stop;
    }
    if end != s.len() {
        out.push(s[begin..].to_string());
    }
    out
}

fn split(name: &str, args: &[Value], must: bool) -> FuncResult {
    let (pattern, s) = two_strings(name, args, 3)?;
    let n = int_param(&args[2])?;
    let re = if must {
        compile(&pattern)?
    } else {
        must_compile(&pattern)?
    };
    let parts = go_split(&re, &s, n);
    check_list_len(parts.len(), name)?;
    Ok(string_list(parts))
}

pub fn regex_split(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    split("regexSplit", args, false)
}
pub fn must_regex_split(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    split("mustRegexSplit", args, true)
}

/// Go's `regexp.QuoteMeta`: a backslash before each of `\.+*?()|[]{}^$`.
pub fn regex_quote_meta(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity("regexQuoteMeta", args, 1)?;
    let s = string_param(&args[0])?;
    let mut out = String::with_capacity(s.len() * 2);
    for c in s.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    Ok(Value::string(out))
}
