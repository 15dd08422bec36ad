//! The status report an agent sends to the hub (PRODUCT.md section 4): what it applied,
//! what it last attempted, the state of every resource, and a message for humans.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::bundle::{Digest, ResourceKey};

/// The version of this agent, sent with every report.
pub const AGENT_VERSION: &str = env!("CARGO_PKG_VERSION");

/// The body of `POST /v1/clusters/{cluster}/status`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusReport {
    /// The digest of the last bundle applied completely (and pruned), if any.
    pub applied: Option<Digest>,
    /// The digest of the last bundle the agent tried to apply, or refused.
    pub attempted: Option<Digest>,
    /// The state of each resource of the attempted bundle, and of those pruned.
    pub resources: Vec<ResourceStatus>,
    /// One line for humans: what happened, and what to do if it went wrong.
    pub message: String,
    pub agent_version: String,
}

impl StatusReport {
    /// A report with no bundle yet (a fresh agent that has not reached its hub).
    pub fn empty(message: impl Into<String>) -> StatusReport {
        StatusReport {
            applied: None,
            attempted: None,
            resources: Vec::new(),
            message: message.into(),
            agent_version: AGENT_VERSION.to_string(),
        }
    }

    /// True when the attempted bundle is the applied one and no resource failed.
    pub fn is_success(&self) -> bool {
        self.attempted.is_some()
            && self.attempted == self.applied
            && self
                .resources
                .iter()
                .all(|r| r.state != ResourceState::Failed)
    }
}

/// One resource's line in a report.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResourceStatus {
    pub group: String,
    pub kind: String,
    pub namespace: String,
    pub name: String,
    pub state: ResourceState,
    #[serde(default)]
    pub message: String,
}

impl ResourceStatus {
    pub fn new(key: &ResourceKey, state: ResourceState, message: impl Into<String>) -> Self {
        ResourceStatus {
            group: key.group.clone(),
            kind: key.kind.clone(),
            namespace: key.namespace.clone(),
            name: key.name.clone(),
            state,
            message: message.into(),
        }
    }

    pub fn key(&self) -> ResourceKey {
        ResourceKey {
            group: self.group.clone(),
            kind: self.kind.clone(),
            namespace: self.namespace.clone(),
            name: self.name.clone(),
        }
    }
}

/// The state of one resource after an apply.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ResourceState {
    /// Accepted by the sink; flotilla has no health rule for this kind.
    Applied,
    /// A workload whose status shows it ready at its current generation.
    Healthy,
    /// A workload still rolling out.
    Progressing,
    /// Refused by the sink, or a workload that failed (see the message).
    Failed,
    /// Deleted because the bundle no longer holds it.
    Pruned,
}

impl fmt::Display for ResourceState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ResourceState::Applied => "applied",
            ResourceState::Healthy => "healthy",
            ResourceState::Progressing => "progressing",
            ResourceState::Failed => "failed",
            ResourceState::Pruned => "pruned",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn serialises_with_the_field_names_the_hub_reads() {
        let digest = Digest::of(b"x");
        let report = StatusReport {
            applied: Some(digest.clone()),
            attempted: Some(digest.clone()),
            resources: vec![ResourceStatus::new(
                &ResourceKey {
                    group: "apps".into(),
                    kind: "Deployment".into(),
                    namespace: "web".into(),
                    name: "front".into(),
                },
                ResourceState::Progressing,
                "1 of 2 replicas ready",
            )],
            message: "applied".into(),
            agent_version: "1.2.3".into(),
        };
        assert_eq!(
            serde_json::to_value(&report).expect("serialises"),
            json!({
                "applied": digest.as_str(),
                "attempted": digest.as_str(),
                "resources": [{"group": "apps", "kind": "Deployment", "namespace": "web",
                               "name": "front", "state": "progressing",
                               "message": "1 of 2 replicas ready"}],
                "message": "applied",
                "agentVersion": "1.2.3"
            })
        );
        let empty = serde_json::to_value(StatusReport::empty("starting")).expect("serialises");
        assert_eq!(empty["applied"], json!(null));
        assert_eq!(empty["attempted"], json!(null));
    }

    /// The hub parses reports with its own types (`crate::status`, unknown fields
    /// refused): every report the agent makes must parse there, and mean the same.
    #[test]
    fn the_hub_reads_the_agents_reports_and_judges_failure_the_same_way() {
        let old = Digest::of(b"old");
        let new = Digest::of(b"new");
        let key = ResourceKey {
            group: String::new(),
            kind: "ConfigMap".into(),
            namespace: "demo".into(),
            name: "c".into(),
        };
        let report = |applied: &Digest, state: ResourceState| StatusReport {
            applied: Some(applied.clone()),
            attempted: Some(new.clone()),
            resources: vec![ResourceStatus::new(&key, state, "why")],
            message: "m".into(),
            agent_version: AGENT_VERSION.into(),
        };
        for (agent, failed) in [
            (report(&old, ResourceState::Failed), true),
            (report(&new, ResourceState::Failed), true),
            (report(&new, ResourceState::Applied), false),
            (report(&new, ResourceState::Healthy), false),
            (report(&new, ResourceState::Progressing), false),
            (report(&new, ResourceState::Pruned), false),
            (StatusReport::empty("starting"), false),
        ] {
            assert_eq!(agent.is_success(), !failed && agent.attempted.is_some());
            let bytes = serde_json::to_vec(&agent).expect("serialises");
            let hub: crate::status::StatusReport =
                serde_json::from_slice(&bytes).expect("the hub accepts the agent's report");
            assert!(hub.check_limits().is_ok());
            assert_eq!(hub.failed_for(&new), failed, "{agent:?}");
        }
    }
}
