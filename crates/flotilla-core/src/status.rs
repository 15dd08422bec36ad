//! The agent's status report, as it travels in `POST /v1/clusters/{cluster}/status`
//! (see docs/api.md): what the cluster applied, what the agent last attempted, the
//! state of every resource, and a message for humans. The one wire type of the report:
//! the agent builds and sends it, the hub parses, stores and judges it.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::bundle::{Digest, ResourceKey};

/// What an agent reports after each apply.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct StatusReport {
    /// The digest the cluster now runs, fully applied (and pruned); `null` before the
    /// first apply.
    #[serde(default)]
    pub applied: Option<Digest>,
    /// The digest the agent last tried to apply, or refused (equal to `applied` when
    /// that worked).
    #[serde(default)]
    pub attempted: Option<Digest>,
    /// The state of each resource of the attempted bundle, and of those pruned.
    #[serde(default)]
    pub resources: Vec<ResourceStatus>,
    /// One line for humans: what happened, and what to do if it went wrong.
    #[serde(default)]
    pub message: String,
    /// The agent's version, e.g. `0.1.0`.
    #[serde(default)]
    pub agent_version: String,
    /// Resources changed on the cluster since flotilla applied them, and what the
    /// agent did about it (never the values).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub drift: Vec<DriftedResource>,
    /// The bundle features this agent understands (`meta`, `phases`, `drift`,
    /// `sealed`; docs/api.md); empty from an agent older than features.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub features: Vec<String>,
}

/// One resource of the applied bundle that was changed on the cluster by someone
/// other than flotilla, in a field flotilla applied, or deleted.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DriftedResource {
    /// API group, `""` for the core group.
    #[serde(default)]
    pub group: String,
    pub kind: String,
    /// `""` for cluster-scoped resources.
    #[serde(default)]
    pub namespace: String,
    pub name: String,
    /// The paths of the fields that differ from what flotilla applied, such as
    /// `spec.replicas` or `spec.template.spec.containers[name=web].image`; empty when
    /// the resource was deleted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fields: Vec<String>,
    /// The field managers that changed them (from the object's managed fields), when
    /// known.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub managers: Vec<String>,
    /// The resource was deleted out of band.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deleted: bool,
    pub action: DriftAction,
}

/// What the agent did about a drifted resource.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DriftAction {
    /// Put back (the workload's drift policy is `correct`).
    Corrected,
    /// Left as it is (the workload's drift policy is `report`).
    Reported,
    /// Changed back by another manager after every correction: no longer corrected,
    /// reported once.
    Fighting,
    /// A word named by a newer agent.
    #[serde(other)]
    Unknown,
}

impl fmt::Display for DriftAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DriftAction::Corrected => "corrected",
            DriftAction::Reported => "reported",
            DriftAction::Fighting => "fighting",
            DriftAction::Unknown => "unknown",
        })
    }
}

impl DriftedResource {
    pub fn key(&self) -> ResourceKey {
        ResourceKey::new(&self.group, &self.kind, &self.namespace, &self.name)
    }

    /// Whether the drift is still on the cluster (it was not put back).
    pub fn remains(&self) -> bool {
        self.action != DriftAction::Corrected
    }
}

/// One resource's line in a report. Its identity is shared with the bundle's resource
/// (an agent reports every resource of a bundle after each apply, so a copy of each
/// identity would cost more than the resource's bytes for a bundle of many small ones).
/// On the wire the identity's four fields are the line's own: `group`, `kind`,
/// `namespace`, `name`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResourceStatus {
    pub key: Arc<ResourceKey>,
    pub state: ResourceState,
    pub message: String,
}

/// A [`ResourceStatus`] as it travels.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ResourceStatusWire<K, S> {
    /// API group, `""` for the core group.
    #[serde(default)]
    group: K,
    kind: K,
    /// `""` for cluster-scoped resources.
    #[serde(default)]
    namespace: K,
    name: K,
    state: ResourceState,
    #[serde(default)]
    message: S,
}

impl Serialize for ResourceStatus {
    fn serialize<Ser: serde::Serializer>(&self, serializer: Ser) -> Result<Ser::Ok, Ser::Error> {
        ResourceStatusWire {
            group: &self.key.group(),
            kind: &self.key.kind(),
            namespace: &self.key.namespace(),
            name: &self.key.name(),
            state: self.state,
            message: &self.message,
        }
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for ResourceStatus {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let wire = ResourceStatusWire::<String, String>::deserialize(deserializer)?;
        Ok(ResourceStatus {
            key: Arc::new(ResourceKey::new(
                wire.group,
                wire.kind,
                wire.namespace,
                wire.name,
            )),
            state: wire.state,
            message: wire.message,
        })
    }
}

/// The state of one resource after an apply. Only [`ResourceState::Failed`] counts as
/// an error. A word this version does not know (from a newer agent) reads as
/// [`ResourceState::Unknown`], so a hub never refuses a report for it.
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
    /// A state named by a newer agent.
    #[serde(other)]
    Unknown,
}

impl fmt::Display for ResourceState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ResourceState::Applied => "applied",
            ResourceState::Healthy => "healthy",
            ResourceState::Progressing => "progressing",
            ResourceState::Failed => "failed",
            ResourceState::Pruned => "pruned",
            ResourceState::Unknown => "unknown",
        })
    }
}

impl ResourceStatus {
    /// A line for the resource `key`, sharing the identity (`&resource.key`), or
    /// taking it (`ResourceKey`).
    pub fn new(
        key: impl Into<SharedKey>,
        state: ResourceState,
        message: impl Into<String>,
    ) -> Self {
        ResourceStatus {
            key: key.into().0,
            state,
            message: message.into(),
        }
    }

    pub fn key(&self) -> &ResourceKey {
        &self.key
    }
}

/// A resource's identity as [`ResourceStatus::new`] takes it: shared from an
/// `&Arc<ResourceKey>`, or made from a `ResourceKey` or a `&ResourceKey`.
pub struct SharedKey(Arc<ResourceKey>);

impl From<&Arc<ResourceKey>> for SharedKey {
    fn from(key: &Arc<ResourceKey>) -> Self {
        SharedKey(Arc::clone(key))
    }
}

impl From<Arc<ResourceKey>> for SharedKey {
    fn from(key: Arc<ResourceKey>) -> Self {
        SharedKey(key)
    }
}

impl From<ResourceKey> for SharedKey {
    fn from(key: ResourceKey) -> Self {
        SharedKey(Arc::new(key))
    }
}

impl From<&ResourceKey> for SharedKey {
    fn from(key: &ResourceKey) -> Self {
        SharedKey(Arc::new(key.clone()))
    }
}

impl StatusReport {
    /// A report with no bundle yet (a fresh agent that has not reached its hub).
    pub fn empty(message: impl Into<String>, agent_version: impl Into<String>) -> StatusReport {
        StatusReport {
            applied: None,
            attempted: None,
            resources: Vec::new(),
            message: message.into(),
            agent_version: agent_version.into(),
            drift: Vec::new(),
            features: Vec::new(),
        }
    }

    fn any_resource_failed(&self) -> bool {
        self.resources
            .iter()
            .any(|r| r.state == ResourceState::Failed)
    }

    /// Whether the cluster differs from what flotilla applied: some drift was left in
    /// place (reported, or fought over by another manager).
    pub fn is_drifted(&self) -> bool {
        self.drift.iter().any(DriftedResource::remains)
    }

    /// True when the attempted bundle is the applied one and no resource failed.
    pub fn is_success(&self) -> bool {
        self.attempted.is_some() && self.attempted == self.applied && !self.any_resource_failed()
    }

    /// Whether this report says something went wrong with `digest`: the agent tried it
    /// and could not apply it, or applied it and a resource failed.
    pub fn failed_for(&self, digest: &Digest) -> bool {
        let attempted_it = self.attempted.as_ref() == Some(digest);
        let applied_it = self.applied.as_ref() == Some(digest);
        if attempted_it && !applied_it {
            return true;
        }
        (attempted_it || applied_it) && self.any_resource_failed()
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
        if self.drift.len() > MAX_RESOURCES || self.features.len() > 64 {
            return Err(format!(
                "the report lists {} drifted resources and {} features; at most {MAX_RESOURCES} and 64 are accepted",
                self.drift.len(),
                self.features.len()
            ));
        }
        let long_drift = self.drift.iter().any(|d| {
            d.fields.len() > 1_000
                || d.managers.len() > 100
                || d.fields
                    .iter()
                    .chain(&d.managers)
                    .any(|t| t.len() > MAX_TEXT)
        });
        if long_drift || self.features.iter().any(|f| f.len() > 64) {
            return Err(format!(
                "a drifted resource lists at most 1000 fields and 100 managers of at most {MAX_TEXT} bytes each, and a feature is at most 64 bytes"
            ));
        }
        for r in &self.resources {
            if r.message.len() > MAX_TEXT {
                return Err(format!(
                    "resource {}/{}: message is limited to {MAX_TEXT} bytes",
                    r.key.kind(),
                    r.key.name()
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn digest(c: char) -> Digest {
        Digest::parse(&format!("sha256:{}", c.to_string().repeat(64))).expect("digest")
    }

    fn key() -> ResourceKey {
        ResourceKey::new("apps", "Deployment", "web", "front")
    }

    fn report(
        applied: Option<char>,
        attempted: Option<char>,
        state: ResourceState,
    ) -> StatusReport {
        StatusReport {
            applied: applied.map(digest),
            attempted: attempted.map(digest),
            resources: vec![ResourceStatus::new(key(), state, "")],
            message: String::new(),
            agent_version: "test".into(),
            drift: Vec::new(),
            features: Vec::new(),
        }
    }

    #[test]
    fn failure_is_judged_against_the_digest_in_question() {
        use ResourceState::*;
        let a = digest('a');
        let b = digest('b');
        assert!(report(Some('b'), Some('a'), Applied).failed_for(&a));
        assert!(!report(Some('b'), Some('a'), Applied).failed_for(&b));
        assert!(report(Some('a'), Some('a'), Failed).failed_for(&a));
        assert!(!report(Some('a'), Some('a'), Applied).failed_for(&a));
        assert!(!report(Some('b'), Some('b'), Failed).failed_for(&a));
        for (state, failed) in [
            (Applied, false),
            (Healthy, false),
            (Progressing, false),
            (Pruned, false),
            (Unknown, false),
            (Failed, true),
        ] {
            let r = report(Some('a'), Some('a'), state);
            assert_eq!(r.failed_for(&a), failed, "{state}");
            assert_eq!(r.is_success(), !failed, "{state}");
        }
        assert!(!StatusReport::empty("starting", "test").is_success());
    }

    #[test]
    fn serialises_with_the_documented_field_names() {
        let digest = Digest::of(b"x");
        let report = StatusReport {
            applied: Some(digest.clone()),
            attempted: Some(digest.clone()),
            resources: vec![ResourceStatus::new(
                key(),
                ResourceState::Progressing,
                "1 of 2 replicas ready",
            )],
            message: "applied".into(),
            agent_version: "1.2.3".into(),
            drift: Vec::new(),
            features: Vec::new(),
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
        let empty = serde_json::to_value(StatusReport::empty("starting", "1")).expect("serialises");
        assert_eq!(empty["applied"], json!(null));
        assert_eq!(empty["attempted"], json!(null));
    }

    #[test]
    fn parses_the_documented_shape_and_refuses_misspelt_fields() {
        let text = r#"{"applied":null,"attempted":"sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
            "resources":[{"group":"","kind":"ConfigMap","namespace":"d","name":"c","state":"failed","message":"denied"}],
            "message":"apply failed","agentVersion":"0.1.0"}"#;
        let parsed: StatusReport = serde_json::from_str(text).expect("parses");
        assert!(parsed.failed_for(&digest('a')));
        assert!(parsed.check_limits().is_ok());
        assert!(serde_json::from_str::<StatusReport>(r#"{"aplied":null}"#).is_err());
    }

    #[test]
    fn a_state_from_a_newer_agent_is_read_as_unknown_not_refused() {
        let text = r#"{"resources":[{"kind":"Namespace","name":"n","state":"terminating"}]}"#;
        let parsed: StatusReport = serde_json::from_str(text).expect("parses");
        assert_eq!(parsed.resources[0].state, ResourceState::Unknown);
        assert!(!parsed.failed_for(&digest('a')));
    }
}
