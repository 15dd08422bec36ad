//! Sites: stand-ins for string values that a template may carry but never inspect.
//!
//! A release rendered for many clusters whose values differ only in a few strings
//! (a cluster's name in a label) can be rendered once, with a stand-in — [`SITE_START`],
//! the site's number, [`SITE_END`] — in place of each such string, and each cluster's
//! output then made by putting its strings where the stand-ins are. That output is
//! the one the cluster's own render gives only if the templates never looked at the
//! strings, only carried them along. A host that asks for it ([`Host::sites`]) has
//! every function call checked by [`check_call`] before it runs: a call that could
//! behave differently for a stand-in than for a cluster's string fails the render,
//! and the caller renders each cluster on its own instead.
//!
//! What the check lets through relies on what a cluster's string is (checked by the
//! caller for each cluster before its output is filled in): non-empty, only ASCII
//! letters, digits, `.`, `_` and `-`, starting with a letter or digit, read as that
//! same string by every YAML reader and written as itself by `toYaml`. With such a
//! string in place of a stand-in:
//!
//! - truthiness is the same (both are non-empty strings), so `if`, `with`, `and`,
//!   `or`, `not`, `default`, `empty`, `coalesce`, `ternary`, `required` decide alike;
//!   so do `typeOf`, `typeIs`, `kindOf`, `kindIs` (both are strings);
//! - printing (`print`, `println`, `printf` with only `%s` and `%v`, the template's
//!   own output), `quote`, `squote`, `toString`, `toJson` and its variants, `toYaml`,
//!   `indent` and `nindent` write the string as it is, with nothing around it that
//!   depends on what it is (no escaping, quoting or folding for such strings); and
//!   `fromYaml`, `fromJson` read it back as the same string;
//! - maps and lists carry it along (`dict`, `list`, `merge`, `set`, `get`, `pick`,
//!   `deepCopy`, `append`, ... and `index`), as long as no key is a stand-in;
//! - `include` and `tpl` run templates on it (a template's name is never a stand-in;
//!   the string holds no `{{`);
//! - `contains`, `hasPrefix` and `hasSuffix` with a needle made only of other
//!   characters (none of the string's alphabet, no white space, no marker) find it
//!   in neither.
//!
//! Any other function given a stand-in (anywhere in its arguments, inside maps and
//! lists too) fails, as do methods of Helm's objects given one.

use super::value::Value;

/// Where a stand-in starts: `⟦`, a printable character Go's `%q` keeps as it is.
pub const SITE_START: char = '\u{27E6}';
/// Where a stand-in ends: `⟧`.
pub const SITE_END: char = '\u{27E7}';

/// The stand-in for site `index`.
pub fn stand_in(index: usize) -> String {
    format!("{SITE_START}{index}{SITE_END}")
}

/// Whether a text holds a marker.
pub fn marked_text(text: &str) -> bool {
    text.contains(SITE_START) || text.contains(SITE_END)
}

/// Whether a string may stand where a stand-in stood (see the module's
/// documentation; the YAML checks are the caller's).
pub fn plain_site_value(text: &str) -> bool {
    let mut chars = text.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

/// Whether a value holds a marker anywhere (strings, map keys and values, list
/// items). A structure nested deeper than this looks is taken as marked.
pub fn marked(value: &Value) -> bool {
    marked_within(value, 0)
}

fn marked_within(value: &Value, depth: usize) -> bool {
    if depth > 100 {
        return true;
    }
    match value {
        Value::String(s) => marked_text(s),
        Value::List(items) => items.iter().any(|v| marked_within(v, depth + 1)),
        Value::Map(map) => map
            .entries()
            .iter()
            .any(|(k, v)| marked_text(k) || marked_within(v, depth + 1)),
        _ => false,
    }
}

/// Functions that only carry their arguments along, print them or read them back
/// (see the module's documentation).
const CARRIERS: &[&str] = &[
    "print",
    "println",
    "toYaml",
    "mustToYaml",
    "toJson",
    "mustToJson",
    "toRawJson",
    "mustToRawJson",
    "toPrettyJson",
    "mustToPrettyJson",
    "fromYaml",
    "fromYamlArray",
    "fromJson",
    "fromJsonArray",
    "mustFromJson",
    "indent",
    "nindent",
    "quote",
    "squote",
    "toString",
    "list",
    "deepCopy",
    "mustDeepCopy",
    "default",
    "empty",
    "coalesce",
    "ternary",
    "required",
    "typeOf",
    "typeIs",
    "kindOf",
    "kindIs",
    "not",
    "and",
    "or",
    "merge",
    "mustMerge",
    "mergeOverwrite",
    "mustMergeOverwrite",
    "append",
    "mustAppend",
    "prepend",
    "mustPrepend",
    "concat",
    "tpl",
];

/// Whether a call of `name` with `argv` may run in a render with stand-ins: `Err`
/// with the reason when it could tell a stand-in from a cluster's string.
pub fn check_call(name: &str, argv: &[Value]) -> Result<(), String> {
    if CARRIERS.contains(&name) {
        return Ok(());
    }
    let unmarked = |values: &[Value]| !values.iter().any(marked);
    let ok = match name {
        // Keys and names are never stand-ins.
        "include" => argv.first().is_some_and(|v| !marked(v)),
        "dict" => argv.iter().step_by(2).all(|k| !marked(k)),
        "set" | "unset" | "hasKey" | "get" => argv.get(1).is_some_and(|k| !marked(k)),
        "pick" | "omit" => argv.get(1..).is_none_or(unmarked),
        "index" => {
            let (first, rest) = argv.split_at(argv.len().min(1));
            (!matches!(first.first(), Some(Value::String(_))) || unmarked(first)) && unmarked(rest)
        }
        // How many keys or items: the structure, never a string's length.
        "len" => matches!(argv.first(), Some(Value::Map(_) | Value::List(_))) || unmarked(argv),
        "keys" => argv.iter().all(|m| match m {
            Value::Map(map) => map.keys().iter().all(|k| !marked_text(k)),
            other => !marked(other),
        }),
        "printf" => {
            unmarked(argv)
                || matches!(argv.first(), Some(Value::String(format))
                    if !marked_text(format) && only_plain_verbs(format))
        }
        "contains" | "hasPrefix" | "hasSuffix" => {
            unmarked(argv)
                || matches!(argv.first(), Some(Value::String(needle))
                if !needle.is_empty() && needle.chars().all(|c| {
                    !(c.is_ascii_alphanumeric()
                        || matches!(c, '.' | '_' | '-' | SITE_START | SITE_END)
                        || c.is_whitespace())
                }))
        }
        _ => unmarked(argv),
    };
    if ok {
        Ok(())
    } else {
        Err(format!("{name} is given a site's stand-in"))
    }
}

/// The text of a call whose result can be worked out for each cluster instead of
/// failing the render: `sha256sum` of a text that holds stand-ins (a chart's
/// `checksum/config` annotation over a file that carries a cluster's string). Its
/// result becomes a stand-in of its own, a *derived site*, and each cluster's value
/// of it is `sha256sum` of the text with the cluster's strings in it — the text the
/// cluster's own render hashes, since every function before it only carried the
/// strings along and wrote them as they are.
pub fn deferred_text<'a>(name: &str, argv: &'a [Value]) -> Option<&'a str> {
    match (name, argv) {
        ("sha256sum", [Value::String(text)]) => Some(text),
        _ => None,
    }
}

/// `text` with each stand-in replaced by its site's string; `None` when a marker is
/// not part of a stand-in of one of `strings`.
pub fn substitute(text: &str, strings: &[String]) -> Option<String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find([SITE_START, SITE_END]) {
        out.push_str(&rest[..at]);
        let inside = rest[at..].strip_prefix(SITE_START)?;
        let end = inside.find(SITE_END)?;
        let index: usize = inside[..end].parse().ok()?;
        out.push_str(strings.get(index)?);
        rest = &inside[end + SITE_END.len_utf8()..];
    }
    out.push_str(rest);
    Some(out)
}

/// Whether a `printf` format has no verb but `%s`, `%v` and `%%`.
fn only_plain_verbs(format: &str) -> bool {
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c == '%' && !matches!(chars.next(), Some('s' | 'v' | '%')) {
            return false;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(text: &str) -> Value {
        Value::string(text)
    }

    #[test]
    fn calls_that_only_carry_stand_ins_pass_and_the_rest_fail() {
        let site = s(&stand_in(0));
        for (name, argv) in [
            ("toYaml", vec![site.clone()]),
            ("quote", vec![site.clone()]),
            ("printf", vec![s("%s-%v"), site.clone(), s("x")]),
            ("dict", vec![s("k"), site.clone()]),
            ("get", vec![Value::list(vec![]), s("k")]),
            ("contains", vec![s("{{"), site.clone()]),
            ("include", vec![s("name"), site.clone()]),
            ("upper", vec![s("x")]),
        ] {
            assert_eq!(check_call(name, &argv), Ok(()), "{name}");
        }
        for (name, argv) in [
            ("upper", vec![site.clone()]),
            ("sha256sum", vec![site.clone()]),
            ("trunc", vec![Value::Int(3), site.clone()]),
            ("eq", vec![site.clone(), s("x")]),
            ("len", vec![site.clone()]),
            ("printf", vec![s("%q"), site.clone()]),
            ("printf", vec![s("%.2s"), site.clone()]),
            ("dict", vec![site.clone(), s("v")]),
            ("get", vec![Value::list(vec![]), site.clone()]),
            ("index", vec![site.clone(), Value::Int(0)]),
            ("contains", vec![s("-r"), site.clone()]),
            ("contains", vec![s("{ {"), site.clone()]),
            ("include", vec![site.clone()]),
            ("regexReplaceAll", vec![s("a"), site.clone(), s("b")]),
        ] {
            assert!(check_call(name, &argv).is_err(), "{name} {argv:?}");
        }
    }

    /// The carriers write a stand-in as it is: were one escaped (`\u27e6`), what a
    /// later function does with the text would go unchecked.
    #[test]
    fn carriers_write_a_stand_in_as_it_is() {
        struct Quiet;
        impl super::super::value::Host for Quiet {
            fn template_name(&self) -> &str {
                "t"
            }
            fn generated_bytes(&mut self, _: &str, _: &[Value], len: usize) -> Vec<u8> {
                vec![0; len]
            }
            fn now_unix(&self) -> i64 {
                0
            }
            fn warn(&mut self, _: String) {}
        }
        let site = stand_in(7);
        let mut map = std::collections::BTreeMap::new();
        map.insert("k".to_string(), s(&site));
        let map = Value::map(map);
        for (name, argv) in [
            ("quote", vec![s(&site)]),
            ("squote", vec![s(&site)]),
            ("toJson", vec![map.clone()]),
            ("toPrettyJson", vec![map.clone()]),
            ("toRawJson", vec![map.clone()]),
            ("toYaml", vec![map.clone()]),
            ("toString", vec![s(&site)]),
            ("nindent", vec![Value::Int(2), s(&site)]),
        ] {
            let func = crate::helm::funcs::lookup(name)
                .or_else(|| crate::helm::funcs::all().get(name))
                .unwrap_or_else(|| panic!("{name} is a function"));
            let out = func(&mut Quiet, &argv).unwrap_or_else(|e| panic!("{name}: {e}"));
            let Value::String(text) = out else {
                panic!("{name} gave no string")
            };
            assert!(text.contains(&site), "{name} wrote {text:?}");
        }
        assert_eq!(
            crate::helm::gotmpl::fmt::quote_go(&site),
            format!("\"{site}\"")
        );
    }

    #[test]
    fn stand_ins_are_substituted_and_stray_markers_refused() {
        let strings = vec!["a".to_string(), "bc".to_string()];
        let text = format!("x: {}\ny: {}{}\n", stand_in(1), stand_in(0), stand_in(1));
        assert_eq!(
            substitute(&text, &strings).as_deref(),
            Some("x: bc\ny: abc\n")
        );
        for refused in [
            format!("{SITE_START}"),
            format!("{SITE_END}"),
            format!("{SITE_START}x{SITE_END}"),
            stand_in(2),
        ] {
            assert_eq!(substitute(&refused, &strings), None, "{refused}");
        }
        assert_eq!(deferred_text("sha256sum", &[s("t")]), Some("t"));
        assert_eq!(deferred_text("upper", &[s("t")]), None);
    }

    #[test]
    fn a_site_value_is_a_plain_word() {
        for ok in ["shop-1", "a", "eu.west_2", "9lives"] {
            assert!(plain_site_value(ok), "{ok}");
        }
        for refused in ["", "-a", ".a", "a b", "a:b", "{{x}}", "é", "a\n"] {
            assert!(!plain_site_value(refused), "{refused:?}");
        }
    }
}
