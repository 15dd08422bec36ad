//! What can go wrong with one request to the Kubernetes API, what it means for the
//! apply under way, and how to say it to an operator.

use std::time::Duration;

use serde_json::Value;

/// A request that did not succeed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Failure {
    /// No answer: the connection was refused or cut, TLS failed.
    Transport(String),
    /// No answer within the request timeout.
    Timeout(Duration),
    /// The agent is stopping; the request was abandoned.
    Stopped,
    /// An answer with an error status.
    Api(ApiStatus),
}

/// The `Status` document of an error answer, read leniently: a 500 may carry only a
/// message, a proxy in between may answer with plain text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ApiStatus {
    pub code: u16,
    pub reason: String,
    pub message: String,
    /// `details.causes[].reason` (NamespaceTerminating, FieldManagerConflict, ...).
    pub causes: Vec<String>,
}

impl ApiStatus {
    pub fn from_body(code: u16, body: &[u8]) -> ApiStatus {
        let parsed: Option<Value> = serde_json::from_slice(body).ok();
        let text = |v: &Value, key: &str| v.get(key).and_then(Value::as_str).map(str::to_string);
        match parsed {
            Some(status) if status.get("message").is_some() => ApiStatus {
                code,
                reason: text(&status, "reason").unwrap_or_default(),
                message: text(&status, "message").unwrap_or_default(),
                causes: status
                    .pointer("/details/causes")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(|c| text(c, "reason"))
                    .collect(),
            },
            _ => ApiStatus {
                code,
                reason: String::new(),
                message: String::from_utf8_lossy(body)
                    .trim()
                    .chars()
                    .take(500)
                    .collect(),
                causes: Vec::new(),
            },
        }
    }
}

/// The fewest `500` answers in a row after which the apply stops: one object's 500 (a
/// typed-patch error, an admission webhook down) fails that object alone, but many in
/// a row say the API server itself is in trouble.
pub(crate) const SERVER_ERRORS_BEFORE_STOP: u32 = 5;

impl Failure {
    pub fn from_kube(err: kube::Error) -> Failure {
        match err {
            kube::Error::Api(response) => Failure::Api(ApiStatus {
                code: response.code,
                reason: response.reason,
                message: response.message,
                causes: Vec::new(),
            }),
            other => Failure::Transport(other.to_string()),
        }
    }

    pub fn code(&self) -> Option<u16> {
        match self {
            Failure::Api(status) => Some(status.code),
            _ => None,
        }
    }

    pub fn is_not_found(&self) -> bool {
        self.code() == Some(404)
    }

    /// Whether the API server refused a change of `field` as immutable (422,
    /// `<field>: Invalid value: …: field is immutable`).
    pub fn is_immutable(&self, field: &str) -> bool {
        match self {
            Failure::Api(status) => {
                status.code == 422
                    && status.message.contains(&format!("{field}: Invalid value"))
                    && status.message.contains("field is immutable")
            }
            _ => false,
        }
    }

    /// Whether the apply must stop here: every later request would most likely fail
    /// the same way (no answer, bad credentials, an overloaded or unavailable server).
    /// Any other error fails only the object it was about.
    pub fn stops_run(&self) -> bool {
        match self {
            Failure::Transport(_) | Failure::Timeout(_) | Failure::Stopped => true,
            Failure::Api(status) => matches!(status.code, 401 | 429 | 502 | 503 | 504),
        }
    }

    /// What happened and what to do, for a request with `verb` on `resource` (a
    /// plural, with its group: `deployments.apps`).
    pub fn describe(&self, verb: &str, resource: &str) -> String {
        let status = match self {
            Failure::Transport(err) => return format!("no answer from the Kubernetes API: {err}"),
            Failure::Timeout(after) => {
                return format!(
                    "no answer from the Kubernetes API within {}s (--kube-timeout)",
                    after.as_secs()
                );
            }
            Failure::Stopped => return "not finished: the agent is stopping".into(),
            Failure::Api(status) => status,
        };
        let message = &status.message;
        match status.code {
            401 => format!(
                "the Kubernetes API refused the agent's credentials (401 {message}); check its service \
                 account token or kubeconfig"
            ),
            403 if status.causes.iter().any(|c| c == "NamespaceTerminating") => {
                format!("403 {message}; it is applied once the namespace is gone and created again")
            }
            403 if message.contains("attempting to grant RBAC permissions not currently held") => {
                let needed = if resource.starts_with("rolebindings")
                    || resource.starts_with("clusterrolebindings")
                {
                    "`bind` on roles and clusterroles"
                } else {
                    "`escalate` on roles and clusterroles"
                };
                format!(
                    "403 {message}; the agent's service account needs {needed}, or every permission \
                     the role grants (see the RBAC section of docs/agent.md)"
                )
            }
            403 => {
                // The API server names the verb it refused, which for an apply that
                // creates is `create`, not `patch`.
                let refused = message
                    .split_once("cannot ")
                    .and_then(|(_, rest)| rest.split_whitespace().next())
                    .unwrap_or(verb);
                format!(
                    "403 {message}; the agent's service account needs `{refused}` on {resource} \
                     (see the RBAC section of docs/agent.md)"
                )
            }
            409 if message.starts_with("Apply failed with") => format!(
                "conflict with another field manager: {message}; take the fields over with --force-conflicts"
            ),
            409 => format!("409 conflict: {message}"),
            429 => format!("429 the API server is overloaded: {message}"),
            code => format!("{code} {message}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16, body: &str) -> Failure {
        Failure::Api(ApiStatus::from_body(code, body.as_bytes()))
    }

    #[test]
    fn only_answers_that_concern_every_object_stop_the_apply() {
        for stops in [401, 429, 502, 503, 504] {
            assert!(api(stops, "{}").stops_run(), "{stops}");
        }
        for object_only in [400, 403, 404, 409, 422, 500] {
            assert!(!api(object_only, "{}").stops_run(), "{object_only}");
        }
        assert!(Failure::Transport("reset".into()).stops_run());
        assert!(Failure::Timeout(Duration::from_secs(30)).stops_run());
    }

    #[test]
    fn messages_say_what_to_do() {
        let check = |failure: Failure, verb: &str, resource: &str, says: &str| {
            let text = failure.describe(verb, resource);
            assert!(text.contains(says), "{text}");
        };
        check(
            api(
                403,
                r#"{"message": "configmaps \"c\" is forbidden: User \"u\" cannot create resource \"configmaps\" in API group \"\" in the namespace \"demo\"", "reason": "Forbidden"}"#,
            ),
            "patch",
            "configmaps",
            "needs `create` on configmaps",
        );
        check(
            api(
                403,
                r#"{"message": "roles.rbac.authorization.k8s.io \"r\" is forbidden: user \"u\" (groups=[]) is attempting to grant RBAC permissions not currently held:\n{APIGroups:[\"\"], Resources:[\"pods\"], Verbs:[\"list\"]}"}"#,
            ),
            "patch",
            "roles.rbac.authorization.k8s.io",
            "`escalate` on roles and clusterroles",
        );
        check(
            api(
                409,
                r#"{"message": "Apply failed with 1 conflict: conflict with \"kubectl\" using v1: .data.k"}"#,
            ),
            "patch",
            "configmaps",
            "--force-conflicts",
        );
        let stale = api(
            409,
            r#"{"message": "Operation cannot be fulfilled on configmaps \"c\": the object has been modified; please apply your changes to the latest version and try again"}"#,
        );
        assert!(
            !stale
                .describe("patch", "configmaps")
                .contains("--force-conflicts")
        );
        check(
            api(401, r#"{"message": "Unauthorized"}"#),
            "get",
            "configmaps",
            "credentials",
        );
        check(
            api(502, "Bad Gateway"),
            "get",
            "configmaps",
            "502 Bad Gateway",
        );
    }
}
