//! Authorization as the RBAC authorizer decides it, for one user holding a list of
//! rules (`plugin/pkg/auth/authorizer/rbac/rbac.go`, `RuleAllows`, and the matchers of
//! `pkg/apis/rbac/v1/evaluation_helpers.go`: `*` matches anything, `resources` may name
//! `resource/subresource`, `resourceNames` restricts by name), and the two checks that
//! keep RBAC objects from escalating privileges
//! (`pkg/registry/rbac/escalation_check.go`: writing a Role or ClusterRole needs the
//! `escalate` verb on it or every permission it grants; a binding needs `bind` on the
//! role it references or every permission of that role; documented under "Privilege
//! escalation prevention" in https://kubernetes.io/docs/reference/access-authn-authz/rbac/).

use serde_json::Value;

/// One rule of a Role or ClusterRole.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rule {
    pub api_groups: Vec<String>,
    pub resources: Vec<String>,
    pub verbs: Vec<String>,
    pub resource_names: Vec<String>,
}

impl Rule {
    /// Reads one element of a role's `rules` (the Kubernetes JSON form).
    pub fn from_json(value: &Value) -> Rule {
        let strings = |key: &str| -> Vec<String> {
            value[key]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        };
        Rule {
            api_groups: strings("apiGroups"),
            resources: strings("resources"),
            verbs: strings("verbs"),
            resource_names: strings("resourceNames"),
        }
    }

    /// The rules of a Role or ClusterRole object.
    pub fn of_role(role: &Value) -> Vec<Rule> {
        role["rules"]
            .as_array()
            .into_iter()
            .flatten()
            .map(Rule::from_json)
            .collect()
    }
}

/// What a request asks to do, as the authorizer sees it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Attributes {
    pub verb: String,
    pub group: String,
    /// `resource` or `resource/subresource`.
    pub resource: String,
    pub name: String,
    pub namespace: String,
}

fn matches(allowed: &[String], wanted: &str) -> bool {
    allowed.iter().any(|a| a == "*" || a == wanted)
}

fn resource_matches(rule: &Rule, resource: &str) -> bool {
    rule.resources.iter().any(|r| {
        r == "*"
            || r == resource
            || resource
                .split_once('/')
                .is_some_and(|(_, sub)| r.strip_prefix("*/") == Some(sub))
    })
}

/// True when one of `rules` allows the request.
pub fn allows(rules: &[Rule], attributes: &Attributes) -> Option<usize> {
    rules.iter().position(|rule| {
        matches(&rule.verbs, &attributes.verb)
            && matches(&rule.api_groups, &attributes.group)
            && resource_matches(rule, &attributes.resource)
            && (rule.resource_names.is_empty() || rule.resource_names.contains(&attributes.name))
    })
}

/// The permissions of `wanted` that `held` does not cover, printed as the API server
/// prints them (`{APIGroups:["apps"], Resources:["deployments"], Verbs:["list"]}`).
/// A `*` in a wanted rule is covered only by a `*` held.
pub fn missing(held: &[Rule], wanted: &[Rule]) -> Vec<String> {
    let mut missing = Vec::new();
    for rule in wanted {
        let names: Vec<String> = if rule.resource_names.is_empty() {
            vec![String::new()]
        } else {
            rule.resource_names.clone()
        };
        for group in &rule.api_groups {
            for resource in &rule.resources {
                for verb in &rule.verbs {
                    for name in &names {
                        // A literal `*` wanted is only equal to a `*` held.
                        let covered = held.iter().any(|h| {
                            matches(&h.verbs, verb)
                                && matches(&h.api_groups, group)
                                && matches(&h.resources, resource)
                                && (h.resource_names.is_empty()
                                    || (!name.is_empty() && h.resource_names.contains(name)))
                        });
                        if !covered {
                            missing.push(format!(
                                "{{APIGroups:[{group:?}], Resources:[{resource:?}], Verbs:[{verb:?}]}}"
                            ));
                        }
                    }
                }
            }
        }
    }
    missing.sort();
    missing.dedup();
    missing
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rules(value: Value) -> Vec<Rule> {
        Rule::of_role(&json!({"rules": value}))
    }

    fn attrs(verb: &str, group: &str, resource: &str) -> Attributes {
        Attributes {
            verb: verb.into(),
            group: group.into(),
            resource: resource.into(),
            name: "x".into(),
            namespace: "demo".into(),
        }
    }

    #[test]
    fn rules_match_as_rbac_matches_them() {
        let held = rules(json!([
            {"apiGroups": ["*"], "resources": ["*"], "verbs": ["get", "patch"]},
            {"apiGroups": ["apps"], "resources": ["deployments/status"], "verbs": ["update"]},
            {"apiGroups": [""], "resources": ["secrets"], "verbs": ["delete"], "resourceNames": ["y"]}
        ]));
        assert_eq!(allows(&held, &attrs("get", "", "configmaps")), Some(0));
        assert_eq!(allows(&held, &attrs("create", "", "configmaps")), None);
        assert_eq!(
            allows(&held, &attrs("update", "apps", "deployments/status")),
            Some(1)
        );
        assert_eq!(allows(&held, &attrs("update", "apps", "deployments")), None);
        assert_eq!(
            allows(&held, &attrs("delete", "", "secrets")),
            None,
            "the name is x, not y"
        );
    }

    #[test]
    fn a_role_escalates_when_it_grants_what_its_writer_does_not_hold() {
        let held =
            rules(json!([{"apiGroups": ["*"], "resources": ["*"], "verbs": ["get", "patch"]}]));
        assert!(
            missing(
                &held,
                &rules(json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]))
            )
            .is_empty()
        );
        assert_eq!(
            missing(
                &held,
                &rules(
                    json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}])
                )
            ),
            ["{APIGroups:[\"\"], Resources:[\"pods\"], Verbs:[\"list\"]}"]
        );
        let narrow = rules(json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["*"]}]));
        assert_eq!(
            missing(
                &narrow,
                &rules(json!([{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]))
            )
            .len(),
            1
        );
    }
}
