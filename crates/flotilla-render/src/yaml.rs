//! Reading YAML with limits, and turning parser errors into one-line messages with
//! a line number (and a did-you-mean for misspelt fields).

use serde::de::DeserializeOwned;
use serde_json::Value;

use flotilla_core::bundle::MAX_NESTING_DEPTH;
use flotilla_core::diagnostic::did_you_mean;

/// A YAML problem: the message and the 1-based line it concerns, if known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct YamlError {
    pub line: Option<u64>,
    pub message: String,
}

/// Parser options: the budget refuses alias bombs ("billion laughs") and absurd
/// nesting, and duplicate keys are errors rather than silently overwritten.
pub(crate) fn options() -> serde_saphyr::Options {
    let mut options = serde_saphyr::Options::default();
    let mut budget = serde_saphyr::Budget::default();
    budget.max_aliases = 1_000;
    budget.max_events = 2_000_000;
    // The depth every rendered resource must keep (and the agent checks): no
    // document deeper than that is read, so nothing built from one can be either.
    budget.max_depth = MAX_NESTING_DEPTH;
    options.budget = Some(budget);
    options.duplicate_keys = serde_saphyr::DuplicateKeyPolicy::Error;
    // Read flotilla's own files with the scalar rules kustomize applies to manifests:
    // `yes`/`on` stay strings and `0755` is octal.
    options.strict_booleans = true;
    options.legacy_octal_numbers = true;
    options
}

/// Parses one YAML document into `T`. Empty documents around it (a `---` at the end
/// of the file, or one followed only by comments) are allowed; two documents are an
/// error at the line of the second.
pub fn parse<T: DeserializeOwned>(text: &str) -> Result<T, YamlError> {
    let err = match serde_saphyr::from_str_with_options(text, options()) {
        Ok(value) => return Ok(value),
        Err(err) => err,
    };
    if !plain_message(&err).starts_with("multiple YAML documents detected") {
        return Err(convert(&err));
    }
    let mut documents: Vec<T> =
        serde_saphyr::from_multiple_with_options(text, options()).map_err(|err| convert(&err))?;
    match documents.len() {
        1 => Ok(documents.remove(0)),
        count => Err(YamlError {
            line: second_document_line(text),
            message: format!(
                "the file holds {count} YAML documents, and a fleet file describes one object: \
                 move the others into files of their own"
            ),
        }),
    }
}

/// The line of the `---` that starts a file's second document (after one with
/// content), if there is one.
fn second_document_line(text: &str) -> Option<u64> {
    let mut content = false;
    for (index, line) in text.lines().enumerate() {
        let trimmed = line.trim_end();
        if trimmed == "---" || trimmed.starts_with("--- ") {
            if content {
                return Some(index as u64 + 1);
            }
        } else if !trimmed.trim_start().is_empty() && !trimmed.trim_start().starts_with('#') {
            content = true;
        }
    }
    None
}

/// One document of a multi-document YAML file, with the line it starts on.
#[derive(Debug, Clone)]
pub struct YamlDocument {
    pub value: Value,
    pub line: u64,
}

/// Parses every document of a multi-document stream of manifests, reading scalars
/// as kustomize does (see [`crate::kyaml`]); empty documents are skipped.
pub fn parse_documents(text: &str) -> Result<Vec<YamlDocument>, YamlError> {
    crate::kyaml::read_documents(text)
        .map(|documents| {
            documents
                .into_iter()
                .map(|d| YamlDocument {
                    value: d.value,
                    line: d.line,
                })
                .collect()
        })
        .map_err(|err| YamlError {
            line: err.line,
            message: err.message,
        })
}

fn convert(err: &serde_saphyr::Error) -> YamlError {
    let line = err
        .location()
        .map(|location| location.line())
        .filter(|&line| line > 0);
    YamlError {
        line,
        message: improve_message(&plain_message(err)),
    }
}

/// The parser's message without its own location suffix or source snippet, since
/// flotilla prints `file:line:` itself.
fn plain_message(err: &serde_saphyr::Error) -> String {
    let text = err.without_snippet().to_string();
    let first = text.lines().next().unwrap_or("").trim();
    let first = match first.find(" at line ") {
        Some(index) => &first[..index],
        None => first,
    };
    first.trim_end_matches('.').to_string()
}

/// Rewrites parser messages into flotilla's style: serde's `unknown field `lables`,
/// expected one of `name`, `labels`` (or serde-saphyr's form, whose candidates carry
/// no backticks) becomes `unknown field "lables" (did you mean "labels"?)`; a
/// duplicate key or a breached parser budget gets a message meant for a fleet author
/// rather than for the programmer calling the parser.
fn improve_message(message: &str) -> String {
    if let Some(key) = message.strip_prefix("duplicate mapping key: ").map(|rest| {
        rest.split(", set DuplicateKeyPolicy")
            .next()
            .unwrap_or(rest)
    }) {
        return format!("duplicate key {key:?}; each key may appear once in a mapping");
    }
    // The parser stops flow collections (`[[[...]]]`) at its own nesting limit, past
    // the budget's depth; both mean the same to a fleet author.
    if (message.starts_with("budget breached") && message.contains("depth"))
        || message.starts_with("recursion limit exceeded")
    {
        return format!(
            "the YAML nests sequences and mappings deeper than {MAX_NESTING_DEPTH} levels; \
             flotilla does not read it"
        );
    }
    if message.starts_with("budget breached") {
        return "the YAML grows past the parser's limits once its anchors and aliases are \
                expanded (an alias bomb?); flotilla does not read it"
            .to_string();
    }
    let Some(rest) = message.strip_prefix("unknown field `") else {
        return message.to_string();
    };
    let Some((field, expected)) = rest.split_once('`') else {
        return message.to_string();
    };
    let candidates: Vec<&str> = expected
        .trim_start_matches(',')
        .trim()
        .strip_prefix("expected one of ")
        .or_else(|| {
            expected
                .trim_start_matches(',')
                .trim()
                .strip_prefix("expected ")
        })
        .map(|list| {
            list.split(", ")
                .map(|c| c.trim().trim_matches('`'))
                .collect()
        })
        .unwrap_or_default();
    match did_you_mean(field, candidates.iter().copied()) {
        Some(best) => format!("unknown field \"{field}\" (did you mean \"{best}\"?)"),
        None if candidates.is_empty() => format!("unknown field \"{field}\""),
        None => format!(
            "unknown field \"{field}\" (expected one of {})",
            candidates
                .iter()
                .map(|c| format!("\"{c}\""))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_keep_their_starting_lines() {
        let text = "# header\na: 1\n---\n\n---\nb: 2\n---\n# only a comment\n";
        let documents = parse_documents(text).expect("parses");
        assert_eq!(documents.len(), 2);
        assert_eq!(documents[0].line, 2);
        assert_eq!(documents[1].line, 6);
    }

    #[test]
    fn errors_in_later_documents_name_the_right_line() {
        let text = "a: 1\n---\nb: [1, 2\nc: 3\n";
        let err = parse_documents(text).expect_err("unterminated flow sequence");
        assert!(err.line.is_some_and(|line| line >= 3), "{err:?}");
    }

    #[test]
    fn alias_bombs_are_refused() {
        let mut text = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for level in 1..12 {
            let previous = level - 1;
            text.push_str(&format!(
                "a{level}: &a{level} [*a{previous}, *a{previous}, *a{previous}, *a{previous}, *a{previous}, *a{previous}, *a{previous}, *a{previous}, *a{previous}, *a{previous}]\n"
            ));
        }
        assert!(parse::<Value>(&text).is_err());
    }

    #[test]
    fn nesting_deeper_than_the_shared_limit_is_refused() {
        let nested = |depth: usize| format!("{}1{}", "[".repeat(depth), "]".repeat(depth));
        let value: Value = parse(&nested(MAX_NESTING_DEPTH)).expect("at the limit");
        assert_eq!(
            flotilla_core::bundle::nesting_depth(&value),
            MAX_NESTING_DEPTH
        );
        let err = parse::<Value>(&nested(MAX_NESTING_DEPTH + 1)).expect_err("past the limit");
        assert_eq!(
            err.message,
            "the YAML nests sequences and mappings deeper than 100 levels; flotilla does not read it"
        );
        let mut block = String::new();
        for level in 0..=MAX_NESTING_DEPTH {
            block.push_str(&format!("{}k{level}:\n", "  ".repeat(level)));
        }
        block.push_str(&format!("{}leaf: 1\n", "  ".repeat(MAX_NESTING_DEPTH + 1)));
        let err = parse::<Value>(&block).expect_err("block mappings past the limit");
        assert!(err.message.contains("deeper than 100"), "{err:?}");
        // A stream thousands of levels deep is refused, not a stack overflow, with the
        // same message (the parser has a flow-nesting limit of its own at 256).
        for depth in [256, 100_000] {
            let err = parse::<Value>(&nested(depth)).expect_err("far past the limit");
            assert!(err.message.contains("deeper than 100"), "{depth}: {err:?}");
        }
    }

    #[test]
    fn one_object_files_allow_empty_documents_around_it_and_refuse_a_second() {
        #[derive(serde::Deserialize, Debug, PartialEq)]
        struct Named {
            name: String,
        }
        let named = |name: &str| Named { name: name.into() };
        for text in [
            "name: a\n---\n",
            "---\nname: a\n---\n# nothing more\n",
            "name: a\n---\n---\n",
        ] {
            assert_eq!(parse::<Named>(text), Ok(named("a")), "{text:?}");
        }
        let err = parse::<Named>("# one\nname: a\n---\nname: b\n").expect_err("two objects");
        assert_eq!(
            err,
            YamlError {
                line: Some(3),
                message: "the file holds 2 YAML documents, and a fleet file describes one \
                          object: move the others into files of their own"
                    .into()
            }
        );
        // A mistake in a later document is reported as such.
        let err = parse::<Named>("name: a\n---\nname: [b\n").expect_err("bad YAML");
        assert!(err.line.is_some_and(|line| line >= 3), "{err:?}");
    }

    #[test]
    fn unknown_fields_suggest_the_closest_name() {
        assert_eq!(
            improve_message(
                "unknown field `lables`, expected one of `name`, `labels`, `annotations`"
            ),
            "unknown field \"lables\" (did you mean \"labels\"?)"
        );
        // serde-saphyr lists the candidates without backticks.
        assert_eq!(
            improve_message("unknown field `lables`, expected one of name, labels, annotations"),
            "unknown field \"lables\" (did you mean \"labels\"?)"
        );
        assert_eq!(
            improve_message("unknown field `zzz`, expected `name`"),
            "unknown field \"zzz\" (expected one of \"name\")"
        );
    }
}
