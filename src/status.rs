//! The agent's status report, as it travels in `POST /v1/clusters/{cluster}/status`
//! (see docs/api.md). Shared by the hub, which stores it, and the agent, which sends it.

use serde::{Deserialize, Serialize};

use crate::bundle::Digest;

/// The resource state that means "this resource did not reach its desired state".
pub const RESOURCE_FAILED: &str = "failed";

/// What an agent reports after each apply.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct StatusReport {
    /// The digest the cluster now runs, fully applied; `null` before the first apply.
    #[serde(default)]
    pub applied: Option<Digest>,
    /// The digest the agent last tried to apply (equal to `applied` when that worked).
    #[serde(default)]
    pub attempted: Option<Digest>,
    /// Per-resource outcome of the last attempt.
    #[serde(default)]
    pub resources: Vec<ResourceStatus>,
    /// A sentence for humans: what happened, what went wrong.
    #[serde(default)]
    pub message: String,
    /// The agent's version, e.g. `0.1.0`.
    #[serde(default)]
    pub agent_version: String,
}

/// One resource's state after an apply.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResourceStatus {
    /// API group, `""` for the core group.
    #[serde(default)]
    pub group: String,
    pub kind: String,
    /// `""` for cluster-scoped resources.
    #[serde(default)]
    pub namespace: String,
    pub name: String,
    /// `applied`, `healthy`, `progressing`, `failed` or `pruned` (the agent's words;
    /// any string is accepted); only `failed` counts as an error.
    pub state: String,
    #[serde(default)]
    pub message: String,
}

impl StatusReport {
    /// Whether this report says something went wrong with `digest`: the agent tried it
    /// and could not apply it, or applied it and a resource failed.
    pub fn failed_for(&self, digest: &Digest) -> bool {
        let any_resource_failed = self.resources.iter().any(|r| r.state == RESOURCE_FAILED);
        let attempted_it = self.attempted.as_ref() == Some(digest);
        let applied_it = self.applied.as_ref() == Some(digest);
        if attempted_it && !applied_it {
            return true;
        }
        (attempted_it || applied_it) && any_resource_failed
    }

    /// Checks sizes a well-behaved agent never exceeds, so one report cannot bloat the store.
    pub fn check_limits(&self) -> Result<(), String> {
        const MAX_RESOURCES: usize = 10_000;
        const MAX_TEXT: usize = 4_096;
        if self.resources.len() > MAX_RESOURCES {
            return Err(format!(
                "the report lists {} resources; at most {MAX_RESOURCES} are accepted",
                self.resources.len()
            ));
        }
        if self.message.len() > MAX_TEXT || self.agent_version.len() > 256 {
            return Err(format!(
                "message is limited to {MAX_TEXT} bytes and agentVersion to 256"
            ));
        }
        for r in &self.resources {
            if r.message.len() > MAX_TEXT || r.state.len() > 64 {
                return Err(format!(
                    "resource {}/{}: message is limited to {MAX_TEXT} bytes and state to 64",
                    r.kind, r.name
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest(c: char) -> Digest {
        Digest::parse(&format!("sha256:{}", c.to_string().repeat(64))).expect("digest")
    }

    fn report(
        applied: Option<char>,
        attempted: Option<char>,
        failed_resource: bool,
    ) -> StatusReport {
        StatusReport {
            applied: applied.map(digest),
            attempted: attempted.map(digest),
            resources: vec![ResourceStatus {
                group: "apps".into(),
                kind: "Deployment".into(),
                namespace: "x".into(),
                name: "y".into(),
                state: if failed_resource { "failed" } else { "ok" }.into(),
                message: String::new(),
            }],
            message: String::new(),
            agent_version: "test".into(),
        }
    }

    #[test]
    fn failure_is_judged_against_the_digest_in_question() {
        let a = digest('a');
        let b = digest('b');
        assert!(report(Some('b'), Some('a'), false).failed_for(&a));
        assert!(!report(Some('b'), Some('a'), false).failed_for(&b));
        assert!(report(Some('a'), Some('a'), true).failed_for(&a));
        assert!(!report(Some('a'), Some('a'), false).failed_for(&a));
        assert!(!report(Some('b'), Some('b'), true).failed_for(&a));
    }

    #[test]
    fn parses_the_documented_shape() {
        let text = r#"{"applied":null,"attempted":"sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
            "resources":[{"group":"","kind":"ConfigMap","namespace":"d","name":"c","state":"failed","message":"denied"}],
            "message":"apply failed","agentVersion":"0.1.0"}"#;
        let parsed: StatusReport = serde_json::from_str(text).expect("parses");
        assert!(parsed.failed_for(&digest('a')));
        assert!(serde_json::from_str::<StatusReport>(r#"{"aplied":null}"#).is_err());
    }
}
