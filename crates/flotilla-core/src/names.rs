//! Which names are valid: flotilla's own (clusters, groups, workloads and overlays are
//! DNS-1123 labels, so a name is always safe as a file name, a URL path segment and a
//! Kubernetes label value) and Kubernetes' (resource names, namespaces and kinds, by
//! the rules the Kubernetes API server applies). A name that passes never holds `/`,
//! `..`, NUL or a line break. Label keys and values are checked by the API server's rules
//! too (`label_key`, `label_value`).

use std::fmt;

/// The longest DNS-1123 label (and DNS-1035 label).
pub const MAX_LABEL_LENGTH: usize = 63;
/// The longest DNS-1123 subdomain, and the longest resource name of any kind.
pub const MAX_SUBDOMAIN_LENGTH: usize = 253;

/// Why a name was refused: the rule it breaks, in words for the person who wrote it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvalidName {
    pub rule: &'static str,
}

impl fmt::Display for InvalidName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.rule)
    }
}

const LABEL_RULE: &str = "must be a DNS-1123 label: at most 63 characters, lowercase letters, \
     digits and '-', starting and ending with a letter or digit";
const SUBDOMAIN_RULE: &str = "must be a DNS-1123 subdomain: at most 253 characters, lowercase \
     letters, digits, '-' and '.', each part between dots starting and ending with a letter or digit";
const DNS1035_RULE: &str = "must be a DNS-1035 label: at most 63 characters, lowercase letters, \
     digits and '-', starting with a letter and ending with a letter or digit";
const PATH_SEGMENT_RULE: &str = "must be at most 253 characters, not \".\" or \"..\", and hold no \
     '/', '%' or control character";
const LABEL_VALUE_RULE: &str = "must be a Kubernetes label value: at most 63 characters, \
     letters, digits, '-', '_' and '.', starting and ending with a letter or digit (or empty)";
const LABEL_KEY_RULE: &str = "must be a Kubernetes label key: a name of at most 63 characters, \
     letters, digits, '-', '_' and '.', starting and ending with a letter or digit, with an \
     optional DNS-1123 subdomain prefix and '/' before it (example.com/tier)";
const KIND_RULE: &str = "must be at most 63 letters, digits and '-', starting with a letter and \
     ending with a letter or digit";

fn alphanumeric(c: u8) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit()
}

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?` with a first character accepted by `first`.
fn label_shape(name: &str, first: fn(u8) -> bool) -> bool {
    let bytes = name.as_bytes();
    match (bytes.first(), bytes.last()) {
        (Some(&head), Some(&tail)) => {
            first(head) && alphanumeric(tail) && bytes.iter().all(|&c| alphanumeric(c) || c == b'-')
        }
        _ => false,
    }
}

/// A DNS-1123 label (RFC 1123): what cluster, group, workload, overlay and namespace
/// names must be.
pub fn dns1123_label(name: &str) -> Result<(), InvalidName> {
    if name.len() <= MAX_LABEL_LENGTH && label_shape(name, alphanumeric) {
        Ok(())
    } else {
        Err(InvalidName { rule: LABEL_RULE })
    }
}

/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`, at most 63 characters: a label
/// value that is not empty, and the name part of a label key.
fn qualified_name_part(name: &str) -> bool {
    let bytes = name.as_bytes();
    name.len() <= MAX_LABEL_LENGTH
        && bytes.first().is_some_and(u8::is_ascii_alphanumeric)
        && bytes.last().is_some_and(u8::is_ascii_alphanumeric)
        && bytes
            .iter()
            .all(|&c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// A label value as the Kubernetes API server accepts it: empty, or at most 63
/// letters, digits, `-`, `_` and `.`, beginning and ending with a letter or digit.
/// No line break, `---`, markup or non-ASCII character passes.
pub fn label_value(value: &str) -> Result<(), InvalidName> {
    if value.is_empty() || qualified_name_part(value) {
        Ok(())
    } else {
        Err(InvalidName {
            rule: LABEL_VALUE_RULE,
        })
    }
}

/// A label (or annotation) key as the Kubernetes API server accepts it: a name as
/// [`label_value`] has it but not empty, after an optional DNS-1123 subdomain prefix
/// and `/`.
pub fn label_key(key: &str) -> Result<(), InvalidName> {
    let valid = match key.split_once('/') {
        None => qualified_name_part(key),
        Some((prefix, name)) => dns1123_subdomain(prefix).is_ok() && qualified_name_part(name),
    };
    if valid {
        Ok(())
    } else {
        Err(InvalidName {
            rule: LABEL_KEY_RULE,
        })
    }
}

/// A DNS-1123 subdomain: what most Kubernetes resource names must be.
pub fn dns1123_subdomain(name: &str) -> Result<(), InvalidName> {
    if name.len() <= MAX_SUBDOMAIN_LENGTH
        && name.split('.').all(|part| label_shape(part, alphanumeric))
    {
        Ok(())
    } else {
        Err(InvalidName {
            rule: SUBDOMAIN_RULE,
        })
    }
}

/// A DNS-1035 label (RFC 1035): what a Service's name must be.
pub fn dns1035_label(name: &str) -> Result<(), InvalidName> {
    if name.len() <= MAX_LABEL_LENGTH && label_shape(name, |c| c.is_ascii_lowercase()) {
        Ok(())
    } else {
        Err(InvalidName { rule: DNS1035_RULE })
    }
}

/// A path segment name, the loosest rule the API server applies (RBAC names such as
/// `system:controller:x`), tightened by flotilla to at most 253 characters and no
/// control characters, which no Kubernetes name can hold either.
pub fn path_segment_name(name: &str) -> Result<(), InvalidName> {
    if !name.is_empty()
        && name.len() <= MAX_SUBDOMAIN_LENGTH
        && name != "."
        && name != ".."
        && !name.contains(['/', '%'])
        && !name.chars().any(char::is_control)
    {
        Ok(())
    } else {
        Err(InvalidName {
            rule: PATH_SEGMENT_RULE,
        })
    }
}

/// The name rule of a kind: a Namespace is a DNS-1123 label, a Service a DNS-1035
/// label, the four RBAC kinds path segments, and everything else (custom resources
/// included) a DNS-1123 subdomain, as the API server has it.
pub fn resource_name(group: &str, kind: &str, name: &str) -> Result<(), InvalidName> {
    match (group, kind) {
        ("", "Namespace") => dns1123_label(name),
        ("", "Service") => dns1035_label(name),
        (
            "rbac.authorization.k8s.io",
            "Role" | "ClusterRole" | "RoleBinding" | "ClusterRoleBinding",
        ) => path_segment_name(name),
        _ => dns1123_subdomain(name),
    }
}

/// A kind: the API server requires a custom kind, lowercased, to be a DNS-1035
/// label; every built-in kind is one too.
pub fn kind(kind: &str) -> Result<(), InvalidName> {
    let bytes = kind.as_bytes();
    let valid = kind.len() <= MAX_LABEL_LENGTH
        && bytes.first().is_some_and(u8::is_ascii_alphabetic)
        && bytes.last().is_some_and(u8::is_ascii_alphanumeric)
        && bytes
            .iter()
            .all(|&c| c.is_ascii_alphanumeric() || c == b'-');
    if valid {
        Ok(())
    } else {
        Err(InvalidName { rule: KIND_RULE })
    }
}

/// A name as shown in a message: quoted and escaped, and cut short when long, so a
/// 5,000-character name or one with line breaks stays on one readable line.
pub fn shown(name: &str) -> String {
    const SHOWN: usize = 60;
    match name.char_indices().nth(SHOWN) {
        Some((cut, _)) => format!("{:?}… ({} bytes)", &name[..cut], name.len()),
        None => format!("{name:?}"),
    }
}

/// Whether `text` matches `pattern`, where `*` stands for any characters but `/`,
/// `**` for any characters at all and `?` for one character but `/`. A pattern
/// without them is a plain name.
pub fn glob_matches(pattern: &str, text: &str) -> bool {
    fn at(p: &[u8], t: &[u8]) -> bool {
        match p.split_first() {
            None => t.is_empty(),
            Some((b'*', rest)) if rest.first() == Some(&b'*') => {
                let rest = &rest[1..];
                (0..=t.len()).any(|i| at(rest, &t[i..]))
            }
            Some((b'*', rest)) => {
                let mut i = 0;
                loop {
                    if at(rest, &t[i..]) {
                        return true;
                    }
                    if i == t.len() || t[i] == b'/' {
                        return false;
                    }
                    i += 1;
                }
            }
            Some((b'?', rest)) => t.first().is_some_and(|&c| c != b'/') && at(rest, &t[1..]),
            Some((c, rest)) => t.first() == Some(c) && at(rest, &t[1..]),
        }
    }
    at(pattern.as_bytes(), text.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_and_subdomains_follow_rfc_1123() {
        for good in ["a", "edge-7", "0", "a1-b2", &"a".repeat(63)] {
            assert!(dns1123_label(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "-a",
            "a-",
            "A",
            "a_b",
            "a.b",
            "..",
            "%2e%2e",
            "A B",
            "a/b",
            "a\nb",
            &"a".repeat(64),
        ] {
            assert!(dns1123_label(bad).is_err(), "{bad}");
        }
        for good in ["a.b", "kube-system", "x.example.com", &"a".repeat(253)] {
            assert!(dns1123_subdomain(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            ".",
            "..",
            "a..b",
            ".a",
            "a.",
            "a/b",
            "A",
            "a\0",
            &"a".repeat(254),
        ] {
            assert!(dns1123_subdomain(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn label_keys_and_values_follow_the_api_servers_rules() {
        for good in ["", "eu", "EU-west_1.a", "0", &"a".repeat(63)] {
            assert!(label_value(good).is_ok(), "{good:?}");
        }
        for bad in [
            "-a",
            "a-",
            ".a",
            "a_",
            "a b",
            "a\nb",
            "---",
            "a\u{2028}b",
            "<b>x</b>",
            "é",
            "a/b",
            &"a".repeat(64),
        ] {
            assert!(label_value(bad).is_err(), "{bad:?}");
        }
        for good in [
            "tier",
            "Tier_2.a-b",
            "example.com/tier",
            "app.kubernetes.io/name",
            &format!("{}/{}", "a".repeat(253), "b".repeat(63)),
        ] {
            assert!(label_key(good).is_ok(), "{good:?}");
        }
        for bad in [
            "",
            "/tier",
            "example.com/",
            "a/b/c",
            "Example.com/tier",
            "exa_mple.com/tier",
            "ti er",
            "tier\n---",
            "-tier",
            &"a".repeat(64),
            &format!("{}/b", "a".repeat(254)),
        ] {
            assert!(label_key(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn each_kind_has_the_api_servers_name_rule() {
        assert!(resource_name("", "Service", "9lives").is_err());
        assert!(resource_name("", "ConfigMap", "9lives").is_ok());
        assert!(resource_name("", "Namespace", "a.b").is_err());
        assert!(resource_name("", "ConfigMap", "a.b").is_ok());
        let rbac = "rbac.authorization.k8s.io";
        assert!(resource_name(rbac, "ClusterRole", "system:controller:x").is_ok());
        for bad in ["..", ".", "a/b", "a%2f", "a\nb", "a\0b", ""] {
            assert!(resource_name(rbac, "ClusterRole", bad).is_err(), "{bad:?}");
        }
        assert!(resource_name("example.com", "Widget", "system:x").is_err());
    }

    #[test]
    fn kinds_are_identifiers() {
        for good in ["ConfigMap", "Widget2", "A"] {
            assert!(kind(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "1Kind",
            "Config Map",
            "Kind\n---",
            "Kind-",
            &"K".repeat(64),
        ] {
            assert!(kind(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn long_names_are_shown_short_on_one_line() {
        assert_eq!(shown("a\nb"), "\"a\\nb\"");
        let long = shown(&"x".repeat(5000));
        assert!(
            long.ends_with("… (5000 bytes)") && long.len() < 90,
            "{long}"
        );
    }
}

#[cfg(test)]
mod glob_tests {
    use super::glob_matches;

    #[test]
    fn globs_match_names_and_paths() {
        assert!(glob_matches("team-a", "team-a"));
        assert!(!glob_matches("team-a", "team-ab"));
        assert!(glob_matches("team-a-*", "team-a-shop"));
        assert!(glob_matches("team-a-*", "team-a-"));
        assert!(!glob_matches("team-a-*", "team-b-shop"));
        assert!(glob_matches("*", "anything"));
        assert!(glob_matches("shop-?", "shop-1"));
        assert!(!glob_matches("shop-?", "shop-12"));
        assert!(glob_matches("charts/**", "charts/ingress/templates/a.yaml"));
        assert!(!glob_matches("charts/*", "charts/ingress/templates/a.yaml"));
        assert!(glob_matches(
            "charts/*/Chart.yaml",
            "charts/ingress/Chart.yaml"
        ));
        assert!(!glob_matches("charts/**", "workloads/x/charts/a"));
    }
}
