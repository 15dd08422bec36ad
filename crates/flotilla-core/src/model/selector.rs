//! Kubernetes label selectors: the structured form used by groups, targets and
//! overlays, and the string form (`app=web,tier in (a,b),!legacy`) used by patch
//! targets, both with the semantics of `metav1.LabelSelector`.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A label selector. Every term must hold; an empty selector selects everything.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LabelSelector {
    /// Labels a cluster must carry with exactly these values.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub match_labels: BTreeMap<String, String>,
    /// Further requirements on labels; every one must hold.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_expressions: Vec<Requirement>,
}

/// One requirement on a label: `In` and `NotIn` need values, `Exists` and
/// `DoesNotExist` take none.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[schemars(extend("anyOf" = [
    {
        "properties": {
            "operator": {"enum": ["In", "NotIn"]},
            "values": {"minItems": 1}
        },
        "required": ["values"]
    },
    {
        "properties": {
            "operator": {"enum": ["Exists", "DoesNotExist"]},
            "values": {"maxItems": 0}
        }
    }
]))]
pub struct Requirement {
    /// The label key.
    pub key: String,
    pub operator: Operator,
    /// The values for `In` and `NotIn`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
}

/// How a requirement compares the label: `In` (the value is one of `values`), `NotIn`
/// (the label is absent or its value is none of `values`), `Exists`, `DoesNotExist`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Deserialize, Serialize, JsonSchema)]
pub enum Operator {
    In,
    NotIn,
    Exists,
    DoesNotExist,
}

impl LabelSelector {
    /// Whether a set of labels satisfies every term of the selector.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.match_labels
            .iter()
            .all(|(key, value)| labels.get(key) == Some(value))
            && self
                .match_expressions
                .iter()
                .all(|requirement| requirement.matches(labels))
    }

    /// The problems Kubernetes would refuse the selector for: `In` and `NotIn` need
    /// values, `Exists` and `DoesNotExist` take none.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        for requirement in &self.match_expressions {
            let needs_values = matches!(requirement.operator, Operator::In | Operator::NotIn);
            if needs_values && requirement.values.is_empty() {
                problems.push(format!(
                    "matchExpressions key {:?}: operator {:?} needs at least one value",
                    requirement.key, requirement.operator
                ));
            }
            if !needs_values && !requirement.values.is_empty() {
                problems.push(format!(
                    "matchExpressions key {:?}: operator {:?} takes no values",
                    requirement.key, requirement.operator
                ));
            }
        }
        problems
    }
}

impl Requirement {
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let value = labels.get(&self.key);
        match self.operator {
            Operator::In => value.is_some_and(|v| self.values.contains(v)),
            // Kubernetes: NotIn also matches objects that lack the label.
            Operator::NotIn => value.is_none_or(|v| !self.values.contains(v)),
            Operator::Exists => value.is_some(),
            Operator::DoesNotExist => value.is_none(),
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid label selector {selector:?}: {reason}")]
pub struct SelectorParseError {
    pub selector: String,
    pub reason: String,
}

/// Parses the string form of a selector: comma-separated terms, each `key`, `!key`,
/// `key=value`, `key==value`, `key!=value`, `key in (a,b)` or `key notin (a,b)`.
pub fn parse_selector(text: &str) -> Result<LabelSelector, SelectorParseError> {
    let fail = |reason: String| SelectorParseError {
        selector: text.to_string(),
        reason,
    };
    let mut selector = LabelSelector::default();
    for term in split_terms(text) {
        let term = term.trim();
        if term.is_empty() {
            continue;
        }
        let requirement = if let Some(key) = term.strip_prefix('!') {
            Requirement {
                key: checked_key(key.trim()).map_err(fail)?,
                operator: Operator::DoesNotExist,
                values: vec![],
            }
        } else if let Some((key, value)) = term.split_once("!=") {
            Requirement {
                key: checked_key(key.trim()).map_err(fail)?,
                operator: Operator::NotIn,
                values: vec![value.trim().to_string()],
            }
        } else if let Some((key, value)) = term.split_once('=') {
            let value = value.strip_prefix('=').unwrap_or(value);
            Requirement {
                key: checked_key(key.trim()).map_err(fail)?,
                operator: Operator::In,
                values: vec![value.trim().to_string()],
            }
        } else if let Some((key, rest)) = split_set_term(term) {
            let (operator, list) = rest;
            let values = list
                .split(',')
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
                .collect::<Vec<_>>();
            if values.is_empty() {
                return Err(fail(format!("{term:?} lists no values")));
            }
            Requirement {
                key: checked_key(key).map_err(fail)?,
                operator,
                values,
            }
        } else {
            Requirement {
                key: checked_key(term).map_err(fail)?,
                operator: Operator::Exists,
                values: vec![],
            }
        };
        selector.match_expressions.push(requirement);
    }
    Ok(selector)
}

/// Splits on commas that are not inside parentheses.
fn split_terms(text: &str) -> Vec<&str> {
    let mut terms = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (index, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                terms.push(&text[start..index]);
                start = index + 1;
            }
            _ => {}
        }
    }
    terms.push(&text[start..]);
    terms
}

fn split_set_term(term: &str) -> Option<(&str, (Operator, &str))> {
    let open = term.find('(')?;
    let inner = term[open + 1..].strip_suffix(')')?;
    let head = term[..open].trim();
    let (key, word) = head.rsplit_once(char::is_whitespace)?;
    let operator = match word {
        "in" => Operator::In,
        "notin" => Operator::NotIn,
        _ => return None,
    };
    Some((key.trim(), (operator, inner)))
}

fn checked_key(key: &str) -> Result<String, String> {
    let valid = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'));
    if valid {
        Ok(key.to_string())
    } else {
        Err(format!("{key:?} is not a valid label key"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn check(selector: &str, pairs: &[(&str, &str)], expect: bool) {
        let parsed = parse_selector(selector).expect("selector parses");
        assert_eq!(
            parsed.matches(&labels(pairs)),
            expect,
            "{selector} on {pairs:?}"
        );
    }

    #[test]
    fn string_selectors_follow_kubernetes_semantics() {
        check("", &[], true);
        check("app=web", &[("app", "web")], true);
        check("app==web", &[("app", "db")], false);
        check("app!=web", &[], true);
        check("tier in (canary, stable)", &[("tier", "stable")], true);
        check("tier notin (canary)", &[], true);
        check("tier notin (canary)", &[("tier", "canary")], false);
        check("gpu", &[("gpu", "")], true);
        check("!gpu", &[("gpu", "x")], false);
        check(
            "app=web,tier in (a,b),!legacy",
            &[("app", "web"), ("tier", "b")],
            true,
        );
    }

    #[test]
    fn bad_string_selectors_are_refused() {
        assert!(parse_selector("tier in ()").is_err());
        assert!(parse_selector("a b").is_err());
    }

    #[test]
    fn structured_selector_checks_values() {
        let selector = LabelSelector {
            match_labels: BTreeMap::new(),
            match_expressions: vec![Requirement {
                key: "region".into(),
                operator: Operator::In,
                values: vec![],
            }],
        };
        assert_eq!(
            selector.problems(),
            vec![
                "matchExpressions key \"region\": operator In needs at least one value".to_string()
            ]
        );
    }
}
