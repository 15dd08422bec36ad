//! `rollouts/<name>.yaml`: a RolloutPolicy, the document form. What the fields mean
//! once checked (durations, budgets, windows) is [`crate::rollout::Policy`]; the
//! loader turns one into the other and reports every problem with file and line.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{LabelSelector, Located, Metadata};

/// `rollouts/<name>.yaml`: in which waves a change travels through the clusters it
/// governs, how long each wave must stay healthy, how many failures stop it, how many
/// clusters change at a time, and when.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[schemars(title = "RolloutPolicy")]
pub struct RolloutPolicyDoc {
    /// Always `flotilla.dev/v1alpha1`.
    #[schemars(extend("const" = "flotilla.dev/v1alpha1"))]
    pub api_version: String,
    /// Always `RolloutPolicy`.
    #[schemars(extend("const" = "RolloutPolicy"))]
    pub kind: String,
    pub metadata: Metadata,
    pub spec: RolloutPolicySpec,
}

/// The clusters a policy governs and how a change reaches them.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RolloutPolicySpec {
    /// The clusters this policy governs (`{}`: every cluster). A cluster may be
    /// governed by one policy at most.
    pub cluster_selector: LabelSelector,
    /// The waves, in order. A cluster belongs to the first wave that selects it;
    /// governed clusters no wave selects form a last wave of their own.
    #[schemars(with = "Vec<WaveSpec>", extend("minItems" = 1))]
    pub waves: Vec<Located<WaveSpec>>,
    /// What to do with a cluster that is offline when its wave is released: `skip`
    /// it (it neither blocks nor fails the wave, and gets the change when it comes
    /// back), or `wait` for it until it is healthy or the deadline passes.
    #[serde(default)]
    pub offline: OfflinePolicy,
    /// What to do when a wave fails: `halt` (no later wave is released) or
    /// `rollback` (halt, and serve the wave's clusters their previous digest again).
    #[serde(default)]
    pub on_failure: FailurePolicy,
    /// A released wave not complete within this long has failed (`1h`, `90m`).
    /// Absent: no deadline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "duration_schema")]
    pub progress_deadline: Option<Value>,
    /// When waves may be released; absent or empty: at any time. A wave is released
    /// only inside one of these windows (a forced rollout ignores them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(with = "Vec<WindowSpec>")]
    pub windows: Vec<Located<WindowSpec>>,
}

/// One wave. It selects clusters by `groups`, `clusters` and `clusterSelector` (any
/// match counts), or takes `percent` of the governed clusters not in an earlier wave;
/// a wave with no selection takes every governed cluster not in an earlier wave.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[schemars(extend("not" = {
    "required": ["percent"],
    "anyOf": [{"required": ["groups"]}, {"required": ["clusters"]}, {"required": ["clusterSelector"]}]
}))]
pub struct WaveSpec {
    /// The wave's name, unique within the policy (`canary`, `rest`).
    pub name: String,
    /// The members of these groups.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<Vec<String>>")]
    pub groups: Option<Vec<Located<String>>>,
    /// These clusters, by name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<Vec<String>>")]
    pub clusters: Option<Vec<Located<String>>>,
    /// The clusters whose labels match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_selector: Option<LabelSelector>,
    /// This share (1–100) of the governed clusters not in an earlier wave, rounded
    /// up, at least one. The same clusters are picked every time (by a hash of the
    /// policy's and the cluster's names).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("minimum" = 1, "maximum" = 100))]
    pub percent: Option<i64>,
    /// How long every changed cluster of the wave must stay healthy on the new
    /// digest before the next wave is released (`15m`; default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "duration_schema")]
    pub bake: Option<Value>,
    /// How many of the wave's changed clusters may fail before the rollout halts: a
    /// count (`2`) or a share of them (`"5%"`, rounded down). Default 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "budget_schema")]
    pub max_failed: Option<Value>,
    /// At most this many of the wave's clusters change at once (not yet healthy on
    /// the new digest): a count or a share (`"10%"`, at least one). Default: all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "budget_schema")]
    pub max_parallel: Option<Value>,
}

/// `offline: skip | wait`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum OfflinePolicy {
    /// A cluster offline when its wave is released neither blocks nor fails it.
    #[default]
    Skip,
    /// A cluster offline when its wave is released blocks it until it is healthy or
    /// the deadline passes.
    Wait,
}

/// `onFailure: halt | rollback`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum FailurePolicy {
    /// No later wave is released.
    #[default]
    Halt,
    /// No later wave is released, and the failed wave's clusters are served their
    /// previous digest again.
    Rollback,
}

/// A window in which waves may be released: `{days: [mon, tue], start: "02:00",
/// end: "05:00", tz: Europe/Berlin}`. A window whose end is before its start runs
/// past midnight and belongs to the day it starts on.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct WindowSpec {
    /// The days the window opens on; absent or empty: every day.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub days: Vec<Weekday>,
    /// When it opens, `HH:MM` local time.
    #[schemars(extend("pattern" = "^([01][0-9]|2[0-3]):[0-5][0-9]$"))]
    pub start: String,
    /// When it closes, `HH:MM` local time (`24:00` for midnight).
    #[schemars(extend("pattern" = "^(([01][0-9]|2[0-3]):[0-5][0-9]|24:00)$"))]
    pub end: String,
    /// An IANA time zone (`Europe/Berlin`); default UTC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tz: Option<String>,
}

/// A day of the week.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize, Serialize, JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Weekday {
    Mon,
    Tue,
    Wed,
    Thu,
    Fri,
    Sat,
    Sun,
}

fn duration_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "description": "A duration: `30s`, `15m`, `1h30m`, `2d` (or 0).",
        "anyOf": [
            {"type": "string", "pattern": "^\\s*[0-9]"},
            {"type": "integer", "minimum": 0}
        ]
    })
}

fn budget_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "description": "A count (`2`) or a share of the wave's clusters (`\"10%\"`).",
        "anyOf": [
            {"type": "integer", "minimum": 0},
            {"type": "string", "pattern": "^[0-9]+%$"}
        ]
    })
}
