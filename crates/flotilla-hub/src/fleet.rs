//! The fleet summary of `GET /v1/fleet`: per cluster the digest it is served
//! (`desired`), the one HEAD renders for it (`latest`), its rollout wave, what it
//! applied, its state and its drift; counts per state and of drifted clusters, and the
//! render status. Pure: it takes the time as an argument, so tests move time without
//! sleeping.
//!
//! Drift is a flag beside the state, never a state: a drifted cluster keeps the state
//! its digests give it, and rollouts judge it by that state alone.

use std::cmp::Reverse;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::store::StoredStatus;
use flotilla_core::bundle::Digest;
use flotilla_core::diagnostic::Diagnostic;
use flotilla_core::status::{DriftAction, DriftedResource};

use super::clock::rfc3339;

/// Where a cluster stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ClusterState {
    /// The agent applied the desired digest and reported no failed resource.
    InSync,
    /// The agent was seen recently, has not applied the desired digest, and has
    /// reported no error for it.
    Pending,
    /// In sync with the digest it is served, which is older than what HEAD renders:
    /// its rollout wave is not released yet (or the rollout stopped).
    Waiting,
    /// `spec.paused`: it keeps what it is served, and is in sync with it or on its way.
    Paused,
    /// The agent reported an error for the desired digest.
    Failed,
    /// The agent has not reported for longer than the offline threshold.
    Offline,
    /// No report ever arrived.
    NeverSeen,
}

impl ClusterState {
    pub const ALL: [ClusterState; 7] = [
        ClusterState::InSync,
        ClusterState::Pending,
        ClusterState::Waiting,
        ClusterState::Paused,
        ClusterState::Failed,
        ClusterState::Offline,
        ClusterState::NeverSeen,
    ];

    /// The states in the order an operator should look at them: failed first, then
    /// offline, pending, never seen, paused, waiting, and in sync last.
    pub const BY_URGENCY: [ClusterState; 7] = [
        ClusterState::Failed,
        ClusterState::Offline,
        ClusterState::Pending,
        ClusterState::NeverSeen,
        ClusterState::Paused,
        ClusterState::Waiting,
        ClusterState::InSync,
    ];

    /// 0 for the most urgent state (see [`ClusterState::BY_URGENCY`]).
    pub fn urgency(self) -> usize {
        ClusterState::BY_URGENCY
            .iter()
            .position(|s| *s == self)
            .unwrap_or(ClusterState::BY_URGENCY.len())
    }

    /// Whether an operator should look at a cluster in this state.
    pub fn needs_attention(self) -> bool {
        matches!(
            self,
            ClusterState::Failed
                | ClusterState::Offline
                | ClusterState::Pending
                | ClusterState::NeverSeen
        )
    }

    pub fn parse(text: &str) -> Option<ClusterState> {
        ClusterState::ALL.into_iter().find(|s| s.as_str() == text)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ClusterState::InSync => "in-sync",
            ClusterState::Pending => "pending",
            ClusterState::Waiting => "waiting",
            ClusterState::Paused => "paused",
            ClusterState::Failed => "failed",
            ClusterState::Offline => "offline",
            ClusterState::NeverSeen => "never-seen",
        }
    }
}

/// The state of one cluster. Offline is decided first, so a cluster that is out of
/// reach is never counted as failed. A cluster is seen by its reports and by its
/// authenticated polls (`seen_ms`), so an idle agent need not resend its report.
pub fn state_of(
    desired: &Digest,
    status: Option<&StoredStatus>,
    now_ms: i64,
    offline_after: Duration,
    seen_ms: Option<i64>,
) -> ClusterState {
    let Some(status) = status else {
        return ClusterState::NeverSeen;
    };
    let last_seen = seen_ms.map_or(status.received_at_ms, |s| s.max(status.received_at_ms));
    let silent_ms = now_ms.saturating_sub(last_seen);
    if silent_ms > i64::try_from(offline_after.as_millis()).unwrap_or(i64::MAX) {
        return ClusterState::Offline;
    }
    if status.report.failed_for(desired) {
        return ClusterState::Failed;
    }
    if status.report.applied.as_ref() == Some(desired) {
        ClusterState::InSync
    } else {
        ClusterState::Pending
    }
}

/// The outcome of the last render attempt.
#[derive(Clone, Debug, Default)]
pub struct RenderStatus {
    /// The commit of the last clean render, whose bundles are served.
    pub served_revision: Option<String>,
    /// The last commit rendered, clean or not.
    pub attempted_revision: Option<String>,
    pub attempted_at_ms: Option<i64>,
    pub duration: Option<Duration>,
    /// The errors of the last attempt; empty when it was clean.
    pub errors: Vec<Diagnostic>,
    /// The warnings of the last attempt, clean or not.
    pub warnings: Arc<[Diagnostic]>,
    /// Why the repository could not be read or fetched, if it could not.
    pub source_error: Option<String>,
    /// Why the newest clean render could not be installed, until one installs.
    pub install_error: Option<InstallError>,
    pub renders_clean: u64,
    pub renders_failed: u64,
    /// Several hubs: a tip of the followed branch that does not descend from the
    /// recorded commit, waiting for every live hub to see it for three polls in a row.
    pub force_push: Option<ForcePush>,
    /// Per Helm workload of the served render, its chart (`name version (path)`).
    pub charts: BTreeMap<String, String>,
    /// The subject and author of the commits last read from Git, newest last (at most
    /// [`KNOWN_COMMITS`]); see [`RenderStatus::served_commit`].
    pub commits: Vec<CommitSummary>,
}

/// How many commits' subjects and authors the render status keeps.
pub const KNOWN_COMMITS: usize = 4;

/// A commit as people read it: its subject and author beside its revision.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CommitSummary {
    /// `branch@sha1:<commit>`, as `revision` names it.
    pub revision: String,
    /// The first line of its message.
    pub subject: String,
    pub author: String,
    pub author_email: String,
}

impl RenderStatus {
    /// The subject and author of the served commit, when the hub has read them from
    /// its repository (never for a folder, nor for a commit it has not fetched).
    pub fn served_commit(&self) -> Option<&CommitSummary> {
        let served = self.served_revision.as_ref()?;
        self.commits.iter().rev().find(|c| &c.revision == served)
    }

    /// Keeps `commit` (once), forgetting the oldest beyond [`KNOWN_COMMITS`].
    pub fn know_commit(&mut self, commit: CommitSummary) {
        self.commits.retain(|c| c.revision != commit.revision);
        self.commits.push(commit);
        let extra = self.commits.len().saturating_sub(KNOWN_COMMITS);
        self.commits.drain(..extra);
    }
}

/// A clean render the hub could not install: its objects could not be written or its
/// record could not be made (a full or read-only state dir, an unreachable database).
/// The last good bundles stay served, and the hub tries again at its next look.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstallError {
    /// The commit whose render could not be installed (the newest that failed).
    pub revision: String,
    /// Why, naming the path and the operating system's error where there is one.
    pub message: String,
    /// When installing started failing: kept while later attempts fail too, whatever
    /// their commit, since nothing was installed in between.
    pub since_ms: i64,
}

impl InstallError {
    /// The install error after installing `revision` failed with `message` at `now_ms`,
    /// given the one shown before (`None` when the last install succeeded).
    pub fn after(
        previous: Option<&InstallError>,
        revision: &str,
        message: String,
        now_ms: i64,
    ) -> InstallError {
        InstallError {
            revision: revision.to_string(),
            message,
            since_ms: previous.map_or(now_ms, |p| p.since_ms),
        }
    }
}

/// [`InstallError`] as `GET /v1/fleet` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InstallErrorSummary {
    pub revision: String,
    pub message: String,
    /// RFC 3339.
    pub since: String,
}

impl From<&InstallError> for InstallErrorSummary {
    fn from(error: &InstallError) -> InstallErrorSummary {
        InstallErrorSummary {
            revision: error.revision.clone(),
            message: error.message.clone(),
            since: rfc3339(error.since_ms),
        }
    }
}

/// A force-pushed tip waiting to be recorded (several hubs), as `GET /v1/fleet` shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ForcePush {
    /// The tip this hub follows, which does not descend from `recorded`.
    pub revision: String,
    /// The commit the database records (still served).
    pub recorded: String,
    /// How many polls in a row every live hub must see `revision`.
    pub polls_needed: i64,
    /// Every live hub, and how many of its polls in a row saw `revision` (0 for a hub
    /// that sees another tip, or none yet).
    pub hubs: Vec<ForcePushHub>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ForcePushHub {
    /// The hub's name in the database (random per process).
    pub hub: String,
    pub polls: i64,
    /// Whether it is the hub that answered.
    pub this_hub: bool,
}

/// How many clusters are in each state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Counts([usize; ClusterState::ALL.len()]);

impl Counts {
    /// The counts of these clusters.
    pub fn of(lines: &[Line<'_>]) -> Counts {
        let mut counts = Counts::default();
        for line in lines {
            counts.add(line.state);
        }
        counts
    }

    pub fn add(&mut self, state: ClusterState) {
        self.0[state as usize] += 1;
    }

    pub fn get(&self, state: ClusterState) -> usize {
        self.0[state as usize]
    }

    pub fn total(&self) -> usize {
        self.0.iter().sum()
    }

    /// Every state by name, zeros included, as `GET /v1/fleet` gives them.
    pub fn by_name(&self) -> BTreeMap<&'static str, usize> {
        ClusterState::ALL
            .iter()
            .map(|s| (s.as_str(), self.get(*s)))
            .collect()
    }
}

#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FleetSummary {
    /// The commit whose bundles are served.
    pub revision: Option<String>,
    /// Its subject and author, when the hub has read them from Git (absent otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub commit: Option<CommitSummary>,
    /// The last commit the hub tried to render.
    pub attempted_revision: Option<String>,
    pub attempted_at: Option<String>,
    /// Errors of the last render attempt, each with file and line: while this is not
    /// empty the hub keeps serving the last good bundles.
    pub render_errors: Vec<RenderError>,
    /// Warnings of the last render attempt (absent when it had none): what renders,
    /// but is worth a look (see [`RenderWarnings`]).
    #[serde(skip_serializing_if = "RenderWarnings::is_empty")]
    pub render_warnings: RenderWarnings,
    pub source_error: Option<String>,
    /// The newest clean render could not be installed: the served revision stays.
    pub install_error: Option<InstallErrorSummary>,
    pub counts: BTreeMap<&'static str, usize>,
    /// How many clusters are drifted (whatever their state).
    pub drifted: usize,
    /// Several hubs: a force-pushed tip not recorded yet (absent when there is none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub force_push: Option<ForcePush>,
    /// Per Helm workload of the served render, the chart it renders (`name version
    /// (path)`); absent when the fleet has none.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub charts: BTreeMap<String, String>,
    pub clusters: Vec<ClusterSummary>,
}

impl FleetSummary {
    /// Every cluster's summary, by name, with the render status.
    pub fn of(lines: &[Line<'_>], render: &RenderStatus, now_ms: i64) -> FleetSummary {
        let mut clusters: Vec<ClusterSummary> = lines.iter().map(|l| l.summary(now_ms)).collect();
        clusters.sort_by(|a, b| a.name.cmp(&b.name));
        FleetSummary {
            revision: render.served_revision.clone(),
            commit: render.served_commit().cloned(),
            attempted_revision: render.attempted_revision.clone(),
            attempted_at: render.attempted_at_ms.map(rfc3339),
            render_errors: render
                .errors
                .iter()
                .map(|d| RenderError {
                    text: d.to_string(),
                    diagnostic: d.clone(),
                })
                .collect(),
            render_warnings: RenderWarnings(render.warnings.clone()),
            source_error: render.source_error.clone(),
            install_error: render.install_error.as_ref().map(InstallErrorSummary::from),
            counts: Counts::of(lines).by_name(),
            drifted: lines.iter().filter(|l| l.drifted()).count(),
            force_push: render.force_push.clone(),
            charts: render.charts.clone(),
            clusters,
        }
    }
}

/// The filters of `GET /v1/fleet` (its query string): they narrow the cluster list;
/// the counts stay those of the whole fleet.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct FleetFilter {
    /// `drifted=true`: only drifted clusters; `drifted=false`: only the others.
    #[serde(default)]
    pub drifted: Option<bool>,
}

impl FleetFilter {
    pub fn matches(&self, cluster: &ClusterSummary) -> bool {
        self.drifted.is_none_or(|d| d == cluster.drifted)
    }

    /// Keeps the clusters of `summary` that match.
    pub fn apply(&self, summary: &mut FleetSummary) {
        summary.clusters.retain(|c| self.matches(c));
    }
}

/// The warnings of a render as `GET /v1/fleet` gives them: `{"total": N, "shown":
/// [...]}`, the first [`RenderWarnings::SHOWN`] written as render errors are (`text`,
/// then the diagnostic's fields). A fleet whose every cluster warns has as many
/// warnings as clusters; `flotilla validate` lists them all.
#[derive(Clone, Debug, Default)]
pub struct RenderWarnings(pub Arc<[Diagnostic]>);

impl RenderWarnings {
    /// How many warnings the summary writes out.
    pub const SHOWN: usize = 100;

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Those `keep` keeps (a tenant's own, say), counted anew.
    pub fn retain(&self, mut keep: impl FnMut(&Diagnostic) -> bool) -> RenderWarnings {
        RenderWarnings(self.0.iter().filter(|d| keep(d)).cloned().collect())
    }
}

impl Serialize for RenderWarnings {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let shown: Vec<RenderError> = self
            .0
            .iter()
            .take(Self::SHOWN)
            .map(|d| RenderError {
                text: d.to_string(),
                diagnostic: d.clone(),
            })
            .collect();
        let mut out = serializer.serialize_struct("RenderWarnings", 2)?;
        out.serialize_field("total", &self.0.len())?;
        out.serialize_field("shown", &shown)?;
        out.end()
    }
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RenderError {
    /// `file:line: message (cluster c, workload w)`, as `flotilla validate` prints it.
    pub text: String,
    #[serde(flatten)]
    pub diagnostic: Diagnostic,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterSummary {
    pub name: String,
    pub state: ClusterState,
    /// The digest served to it now.
    pub desired: Digest,
    pub desired_revision: String,
    /// The digest HEAD renders for it (differs from `desired` while a rollout has not
    /// reached it, or while it is paused).
    pub latest: Option<Digest>,
    /// The rollout policy that governs it, and its wave in that policy.
    pub policy: Option<String>,
    pub wave: Option<String>,
    pub applied: Option<Digest>,
    pub attempted: Option<Digest>,
    pub last_seen: Option<String>,
    pub message: Option<String>,
    pub agent_version: Option<String>,
    /// Resources the agent reported as failed.
    pub failed_resources: Vec<String>,
    /// Whether its last report says the cluster differs from what flotilla applied
    /// (some drift was left in place). Not a state: `state` stays what it is.
    pub drifted: bool,
    /// The drift of its last report, corrected drift included: what was changed on
    /// the cluster and what the agent did about it (never values).
    pub drift: Vec<Drift>,
    /// The bundle features what it is served needs and its agent did not name at
    /// its last poll: it keeps what it runs until its agent is upgraded.
    pub needs_newer_agent: Vec<&'static str>,
    /// The fleet groups it belongs to (from the last clean render).
    pub groups: Vec<String>,
    /// Its labels (from the last clean render).
    pub labels: BTreeMap<String, String>,
    /// How long since it was last seen, in seconds on the hub's clock.
    pub silent_for_seconds: Option<i64>,
    /// When the digest served to it last changed.
    pub served_since: Option<String>,
    /// While pending: how long since it was served the digest it has not applied yet.
    pub pending_for_seconds: Option<i64>,
}

/// One resource changed on a cluster, as `GET /v1/fleet` shows it: every field
/// present, so a reader need not guess defaults.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Drift {
    /// `Kind.group namespace/name` (`Kind/name` when cluster-scoped).
    pub resource: String,
    pub group: String,
    pub kind: String,
    pub namespace: String,
    pub name: String,
    /// The paths of the fields that differ from what flotilla applied.
    pub fields: Vec<String>,
    /// The field managers that changed them, when known.
    pub managers: Vec<String>,
    /// The resource was deleted out of band.
    pub deleted: bool,
    pub action: DriftAction,
}

impl Drift {
    pub fn of(d: &DriftedResource) -> Drift {
        Drift {
            resource: resource_name(&d.group, &d.kind, &d.namespace, &d.name),
            group: d.group.clone(),
            kind: d.kind.clone(),
            namespace: d.namespace.clone(),
            name: d.name.clone(),
            fields: d.fields.clone(),
            managers: d.managers.clone(),
            deleted: d.deleted,
            action: d.action,
        }
    }

    /// Whether it is still on the cluster (not put back).
    pub fn remains(&self) -> bool {
        self.action != DriftAction::Corrected
    }

    /// `spec.replicas, spec.paused` or `deleted`: what changed, for one line of text.
    pub fn what(&self) -> String {
        match (self.deleted, self.fields.is_empty()) {
            (true, true) => "deleted".to_string(),
            (true, false) => format!("deleted; {}", self.fields.join(", ")),
            (false, _) => self.fields.join(", "),
        }
    }
}

/// `Kind.group namespace/name`, or `Kind/name` for a cluster-scoped resource.
pub fn resource_name(group: &str, kind: &str, namespace: &str, name: &str) -> String {
    let kind = if group.is_empty() {
        kind.to_string()
    } else {
        format!("{kind}.{group}")
    };
    if namespace.is_empty() {
        format!("{kind}/{name}")
    } else {
        format!("{kind} {namespace}/{name}")
    }
}

/// One served cluster, as the summary needs it.
pub struct Desired<'a> {
    pub name: &'a str,
    pub digest: &'a Digest,
    pub revision: &'a str,
    /// A new cluster held on what its agent runs until its wave is released.
    pub hold: bool,
    /// Its last authenticated poll or report.
    pub seen_ms: Option<i64>,
    /// When what it is served last changed.
    pub served_since_ms: Option<i64>,
    /// The bundle features its agent did not name at its last poll that what it is
    /// served needs (a bit set, `flotilla_core::bundle::features::bits`): it keeps
    /// what it runs until its agent is upgraded.
    pub lacking: u8,
    pub latest: Option<&'a Digest>,
    pub policy: Option<&'a str>,
    pub wave: Option<&'a str>,
    pub paused: bool,
    /// The fleet groups it belongs to.
    pub groups: &'a [String],
    /// Its labels.
    pub labels: &'a BTreeMap<String, String>,
}

/// No labels, for a cluster the last clean render did not describe.
pub static NO_LABELS: BTreeMap<String, String> = BTreeMap::new();

/// One cluster's place in the fleet, borrowed from what the hub holds: its state is
/// decided, nothing is copied or formatted. The fleet page counts, filters and sorts
/// these and turns only the rows it shows into text; `GET /v1/fleet` turns each into
/// a [`ClusterSummary`].
#[derive(Clone, Copy, Debug)]
pub struct Line<'a> {
    pub name: &'a str,
    pub state: ClusterState,
    /// The digest served to it now (for a held cluster, the one its agent runs).
    pub desired: &'a Digest,
    pub desired_revision: &'a str,
    pub latest: Option<&'a Digest>,
    pub policy: Option<&'a str>,
    pub wave: Option<&'a str>,
    pub groups: &'a [String],
    pub labels: &'a BTreeMap<String, String>,
    /// Its agent's last report.
    pub status: Option<&'a StoredStatus>,
    /// Its last report or authenticated poll.
    pub last_seen_ms: Option<i64>,
    /// When what it is served last changed.
    pub served_since_ms: Option<i64>,
    /// See [`Desired::lacking`].
    pub lacking: u8,
}

impl<'a> Line<'a> {
    pub fn new(
        d: Desired<'a>,
        status: Option<&'a StoredStatus>,
        now_ms: i64,
        offline_after: Duration,
    ) -> Line<'a> {
        // A held cluster is served what its agent runs (its polls get a 304).
        let desired = match status.and_then(|s| s.report.applied.as_ref()) {
            Some(applied) if d.hold && !status.is_some_and(|s| s.report.failed_for(applied)) => {
                applied
            }
            _ => d.digest,
        };
        let mut state = state_of(desired, status, now_ms, offline_after, d.seen_ms);
        if d.paused && matches!(state, ClusterState::InSync | ClusterState::Pending) {
            state = ClusterState::Paused;
        } else if state == ClusterState::InSync && d.latest.is_some_and(|l| l != desired) {
            state = ClusterState::Waiting;
        }
        let last_seen_ms = match (status.map(|s| s.received_at_ms), d.seen_ms) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        Line {
            name: d.name,
            state,
            desired,
            desired_revision: d.revision,
            latest: d.latest,
            policy: d.policy,
            wave: d.wave,
            groups: d.groups,
            labels: d.labels,
            status,
            last_seen_ms,
            served_since_ms: d.served_since_ms,
            lacking: d.lacking,
        }
    }

    /// The bundle features its agent lacks for what it is served (see
    /// [`Desired::lacking`]).
    pub fn needs_newer_agent(&self) -> Vec<&'static str> {
        flotilla_core::bundle::features::names(self.lacking)
    }

    /// How long since it was last seen, in seconds.
    pub fn silent_for_seconds(&self, now_ms: i64) -> Option<i64> {
        self.last_seen_ms.map(|at| seconds_since(at, now_ms))
    }

    /// While pending: how long since it was served the digest it has not applied.
    pub fn pending_for_seconds(&self, now_ms: i64) -> Option<i64> {
        (self.state == ClusterState::Pending)
            .then_some(self.served_since_ms)
            .flatten()
            .map(|at| seconds_since(at, now_ms))
    }

    /// Where it stands in the order an operator should look at clusters (see
    /// [`attention_key`]).
    pub fn attention_key(&self, now_ms: i64) -> (usize, Reverse<i64>, &'a str) {
        attention_key(
            self.state,
            self.silent_for_seconds(now_ms),
            self.pending_for_seconds(now_ms),
            self.name,
        )
    }

    /// `Kind.group namespace/name: message` of each resource its agent reported failed.
    pub fn failed_resources(&self) -> Vec<String> {
        let Some(status) = self.status else {
            return Vec::new();
        };
        status
            .report
            .resources
            .iter()
            .filter(|r| r.state == flotilla_core::status::ResourceState::Failed)
            .map(|r| {
                format!(
                    "{}: {}",
                    resource_name(r.key.group(), r.key.kind(), r.key.namespace(), r.key.name()),
                    r.message
                )
            })
            .collect()
    }

    /// Whether its last report left drift in place (see [`StatusReport::is_drifted`]).
    ///
    /// [`StatusReport::is_drifted`]: flotilla_core::status::StatusReport::is_drifted
    pub fn drifted(&self) -> bool {
        self.status.is_some_and(|s| s.report.is_drifted())
    }

    /// The drift of its last report, corrected drift included.
    pub fn drift(&self) -> Vec<Drift> {
        self.status
            .map(|s| s.report.drift.iter().map(Drift::of).collect())
            .unwrap_or_default()
    }

    /// The owned summary `GET /v1/fleet` and the cluster page show.
    pub fn summary(&self, now_ms: i64) -> ClusterSummary {
        let status = self.status;
        ClusterSummary {
            name: self.name.to_string(),
            state: self.state,
            desired: self.desired.clone(),
            desired_revision: self.desired_revision.to_string(),
            latest: self.latest.cloned(),
            policy: self.policy.map(str::to_string),
            wave: self.wave.map(str::to_string),
            applied: status.and_then(|s| s.report.applied.clone()),
            attempted: status.and_then(|s| s.report.attempted.clone()),
            last_seen: self.last_seen_ms.map(rfc3339),
            message: status.map(|s| s.report.message.clone()),
            agent_version: status.map(|s| s.report.agent_version.clone()),
            failed_resources: self.failed_resources(),
            drifted: self.drifted(),
            drift: self.drift(),
            needs_newer_agent: self.needs_newer_agent(),
            groups: self.groups.to_vec(),
            labels: self.labels.clone(),
            silent_for_seconds: self.silent_for_seconds(now_ms),
            served_since: self.served_since_ms.map(rfc3339),
            pending_for_seconds: self.pending_for_seconds(now_ms),
        }
    }
}

fn seconds_since(at_ms: i64, now_ms: i64) -> i64 {
    now_ms.saturating_sub(at_ms).max(0) / 1000
}

/// The order in which an operator should look at clusters: the most urgent state
/// first (see [`ClusterState::BY_URGENCY`]); within a state the one waiting longest
/// (pending: pending longest; any other state: silent longest); then by name. The
/// web page and `flotilla status` both sort by it.
pub fn attention_key(
    state: ClusterState,
    silent_for_seconds: Option<i64>,
    pending_for_seconds: Option<i64>,
    name: &str,
) -> (usize, Reverse<i64>, &str) {
    let waiting = if state == ClusterState::Pending {
        pending_for_seconds
    } else {
        silent_for_seconds
    };
    (state.urgency(), Reverse(waiting.unwrap_or(0)), name)
}

/// Every served cluster's line, with its agent's last report.
pub fn lines<'a>(
    desired: impl IntoIterator<Item = Desired<'a>>,
    statuses: &'a HashMap<String, StoredStatus>,
    now_ms: i64,
    offline_after: Duration,
) -> Vec<Line<'a>> {
    desired
        .into_iter()
        .map(|d| {
            let status = statuses.get(d.name);
            Line::new(d, status, now_ms, offline_after)
        })
        .collect()
}

/// The whole fleet summary of `GET /v1/fleet`.
pub fn summarize<'a>(
    desired: impl IntoIterator<Item = Desired<'a>>,
    statuses: &'a HashMap<String, StoredStatus>,
    render: &RenderStatus,
    now_ms: i64,
    offline_after: Duration,
) -> FleetSummary {
    FleetSummary::of(
        &lines(desired, statuses, now_ms, offline_after),
        render,
        now_ms,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use flotilla_core::status::{ResourceStatus, StatusReport};

    fn digest(c: char) -> Digest {
        Digest::parse(&format!("sha256:{}", c.to_string().repeat(64))).expect("digest")
    }

    fn seen(at_ms: i64, applied: Option<char>, attempted: Option<char>) -> StoredStatus {
        StoredStatus {
            cluster: "c".into(),
            report: StatusReport {
                applied: applied.map(digest),
                attempted: attempted.map(digest),
                resources: vec![],
                message: String::new(),
                agent_version: String::new(),
                drift: Vec::new(),
                features: Vec::new(),
            },
            received_at_ms: at_ms,
        }
    }

    const FIVE_MINUTES: Duration = Duration::from_secs(300);

    fn check(status: Option<StoredStatus>, now_ms: i64, expect: ClusterState) {
        assert_eq!(
            state_of(&digest('a'), status.as_ref(), now_ms, FIVE_MINUTES, None),
            expect
        );
    }

    #[test]
    fn states_follow_the_reports_and_the_clock() {
        check(None, 0, ClusterState::NeverSeen);
        check(
            Some(seen(0, Some('a'), Some('a'))),
            1_000,
            ClusterState::InSync,
        );
        check(
            Some(seen(0, Some('b'), Some('b'))),
            1_000,
            ClusterState::Pending,
        );
        check(
            Some(seen(0, Some('b'), Some('a'))),
            1_000,
            ClusterState::Failed,
        );
        // Exactly at the threshold it is still online; past it, offline, even when failed.
        check(
            Some(seen(0, Some('a'), Some('a'))),
            300_000,
            ClusterState::InSync,
        );
        check(
            Some(seen(0, Some('b'), Some('a'))),
            300_001,
            ClusterState::Offline,
        );
        let mut unhealthy = seen(0, Some('a'), Some('a'));
        unhealthy.report.resources.push(ResourceStatus {
            key: std::sync::Arc::new(flotilla_core::bundle::ResourceKey::new(
                "apps",
                "Deployment",
                "pos",
                "api",
            )),
            state: flotilla_core::status::ResourceState::Failed,
            message: "ImagePullBackOff".into(),
        });
        check(Some(unhealthy), 1_000, ClusterState::Failed);
    }

    fn summary_of(
        desired: Desired<'_>,
        status: Option<StoredStatus>,
        now_ms: i64,
    ) -> ClusterSummary {
        let statuses: HashMap<String, StoredStatus> =
            status.into_iter().map(|s| ("c".to_string(), s)).collect();
        summarize(
            [desired],
            &statuses,
            &RenderStatus::default(),
            now_ms,
            FIVE_MINUTES,
        )
        .clusters
        .pop()
        .expect("one cluster")
    }

    fn desired<'a>(digest: &'a Digest, latest: Option<&'a Digest>) -> Desired<'a> {
        Desired {
            name: "c",
            digest,
            revision: "main@sha1:1",
            hold: false,
            seen_ms: None,
            served_since_ms: None,
            lacking: 0,
            latest,
            policy: Some("stores"),
            wave: Some("rest"),
            paused: false,
            groups: &[],
            labels: &NO_LABELS,
        }
    }

    #[test]
    fn waiting_paused_held_and_seen_by_polls() {
        let (a, b) = (digest('a'), digest('b'));
        // In sync with an older digest than HEAD renders: waiting, in its wave.
        let waiting = summary_of(
            desired(&a, Some(&b)),
            Some(seen(0, Some('a'), Some('a'))),
            1_000,
        );
        assert_eq!(waiting.state, ClusterState::Waiting);
        assert_eq!(
            (waiting.latest.as_ref(), waiting.wave.as_deref()),
            (Some(&b), Some("rest"))
        );
        // A failure is never hidden behind waiting.
        let failed = summary_of(
            desired(&a, Some(&b)),
            Some(seen(0, Some('c'), Some('a'))),
            1_000,
        );
        assert_eq!(failed.state, ClusterState::Failed);
        // Paused: in sync or on its way.
        let mut paused = desired(&a, Some(&b));
        paused.paused = true;
        assert_eq!(
            summary_of(paused, Some(seen(0, Some('c'), Some('c'))), 1_000).state,
            ClusterState::Paused
        );
        // Held on what its agent runs: desired is what it applied.
        let mut held = desired(&b, Some(&b));
        held.hold = true;
        let summary = summary_of(held, Some(seen(0, Some('a'), Some('a'))), 1_000);
        assert_eq!(
            (summary.state, summary.desired),
            (ClusterState::Waiting, a.clone())
        );
        // An idle agent that polls stays online without resending its report.
        let mut polled = desired(&a, Some(&a));
        polled.seen_ms = Some(600_000);
        assert_eq!(
            summary_of(polled, Some(seen(0, Some('a'), Some('a'))), 650_000).state,
            ClusterState::InSync
        );
        assert_eq!(
            summary_of(
                desired(&a, Some(&a)),
                Some(seen(0, Some('a'), Some('a'))),
                650_000
            )
            .state,
            ClusterState::Offline
        );
    }

    #[test]
    fn pending_counts_from_the_change_of_what_it_is_served() {
        let a = digest('a');
        let mut served = desired(&a, Some(&a));
        served.served_since_ms = Some(10_000);
        // Seen at 60 s, still running b: pending for 50 s, since it was served a.
        let pending = summary_of(served, Some(seen(60_000, Some('b'), Some('b'))), 60_000);
        assert_eq!(pending.state, ClusterState::Pending);
        assert_eq!(pending.pending_for_seconds, Some(50));
        assert_eq!(
            pending.served_since.as_deref(),
            Some("1970-01-01T00:00:10Z")
        );
        // In sync: not pending, however long ago it was served.
        let mut served = desired(&a, Some(&a));
        served.served_since_ms = Some(10_000);
        let in_sync = summary_of(served, Some(seen(60_000, Some('a'), Some('a'))), 60_000);
        assert_eq!(
            (in_sync.state, in_sync.pending_for_seconds),
            (ClusterState::InSync, None)
        );
    }

    fn drifted(action: DriftAction) -> DriftedResource {
        DriftedResource {
            group: "apps".into(),
            kind: "Deployment".into(),
            namespace: "web".into(),
            name: "front".into(),
            fields: vec!["spec.replicas".into()],
            managers: vec!["kubectl-edit".into()],
            deleted: false,
            action,
        }
    }

    #[test]
    fn drift_is_a_flag_beside_the_state_and_the_filter_picks_by_it() {
        let a = digest('a');
        let mut left = seen(0, Some('a'), Some('a'));
        left.report.drift = vec![
            drifted(DriftAction::Corrected),
            drifted(DriftAction::Reported),
        ];
        let summary = summary_of(desired(&a, Some(&a)), Some(left), 1_000);
        assert_eq!(
            (summary.state, summary.drifted),
            (ClusterState::InSync, true)
        );
        assert_eq!(summary.drift.len(), 2, "corrected drift is shown too");
        assert_eq!(summary.drift[1].resource, "Deployment.apps web/front");
        assert_eq!(
            (&summary.drift[1].fields[..], &summary.drift[1].managers[..]),
            (
                &["spec.replicas".to_string()][..],
                &["kubectl-edit".to_string()][..]
            )
        );

        let mut put_back = seen(0, Some('a'), Some('a'));
        put_back.report.drift = vec![drifted(DriftAction::Corrected)];
        let corrected = summary_of(desired(&a, Some(&a)), Some(put_back), 1_000);
        assert_eq!(
            (corrected.state, corrected.drifted),
            (ClusterState::InSync, false)
        );
        assert_eq!(corrected.drift[0].action, DriftAction::Corrected);

        let only = FleetFilter {
            drifted: Some(true),
        };
        let mut drifted_only = FleetSummary {
            clusters: vec![summary, corrected],
            ..FleetSummary::default()
        };
        only.apply(&mut drifted_only);
        assert_eq!(drifted_only.clusters.len(), 1);
        assert!(drifted_only.clusters[0].drifted);
        assert!(FleetFilter::default().matches(&drifted_only.clusters[0]));
        assert!(
            !FleetFilter {
                drifted: Some(false)
            }
            .matches(&drifted_only.clusters[0])
        );
    }

    #[test]
    fn attention_puts_the_longest_waiting_first_within_a_state() {
        use ClusterState::*;
        let mut clusters = vec![
            (InSync, Some(900), None, "quiet"),
            (Pending, Some(1), Some(30), "pending-short"),
            (Pending, Some(500), Some(3_000), "pending-long"),
            (Pending, Some(9_000), None, "pending-unknown"),
            (Offline, Some(400), None, "offline-short"),
            (Offline, Some(4_000), None, "offline-long"),
            (Failed, Some(0), None, "failed-b"),
            (Failed, Some(0), None, "failed-a"),
            (NeverSeen, None, None, "fresh"),
        ];
        clusters.sort_by_key(|&(state, silent, pending, name)| {
            attention_key(state, silent, pending, name)
        });
        let names: Vec<&str> = clusters.iter().map(|c| c.3).collect();
        assert_eq!(
            names,
            [
                "failed-a",
                "failed-b",
                "offline-long",
                "offline-short",
                "pending-long",
                "pending-short",
                "pending-unknown",
                "fresh",
                "quiet"
            ]
        );
    }

    #[test]
    fn the_served_commit_is_told_only_when_its_subject_was_read() {
        let commit = |n: usize| CommitSummary {
            revision: format!("main@sha1:{n}"),
            subject: format!("change {n}"),
            author: "platform team".into(),
            author_email: "platform@example.invalid".into(),
        };
        let mut status = RenderStatus {
            served_revision: Some("main@sha1:1".into()),
            ..RenderStatus::default()
        };
        assert_eq!(status.served_commit(), None, "not read yet");
        status.know_commit(commit(1));
        status.know_commit(commit(1));
        assert_eq!(status.commits.len(), 1, "kept once");
        assert_eq!(status.served_commit(), Some(&commit(1)));
        // A newer commit read but not served (it does not render, say): the served
        // one is still told.
        status.know_commit(commit(2));
        assert_eq!(status.served_commit(), Some(&commit(1)));
        for n in 3..=(2 + KNOWN_COMMITS) {
            status.know_commit(commit(n));
        }
        assert_eq!(status.commits.len(), KNOWN_COMMITS);
        assert_eq!(
            status.served_commit(),
            None,
            "forgotten: the oldest go first"
        );
        status.served_revision = Some(format!("main@sha1:{}", 2 + KNOWN_COMMITS));
        assert_eq!(status.served_commit(), Some(&commit(2 + KNOWN_COMMITS)));
    }

    #[test]
    fn an_install_error_keeps_when_installing_started_failing() {
        let failed = |revision: &str, since_ms: i64| InstallError {
            revision: revision.into(),
            message: format!("cannot install {revision}"),
            since_ms,
        };
        // (shown before, the commit that failed now, now, the install error after)
        let cases = [
            (None, "main@sha1:b", 5_000, failed("main@sha1:b", 5_000)),
            (
                Some(failed("main@sha1:b", 5_000)),
                "main@sha1:b",
                9_000,
                failed("main@sha1:b", 5_000),
            ),
            // A newer commit that cannot be installed either: nothing was installed
            // in between, so the failure goes on since the first.
            (
                Some(failed("main@sha1:b", 5_000)),
                "main@sha1:c",
                12_000,
                failed("main@sha1:c", 5_000),
            ),
        ];
        for (previous, revision, now_ms, expect) in cases {
            let after = InstallError::after(
                previous.as_ref(),
                revision,
                format!("cannot install {revision}"),
                now_ms,
            );
            assert_eq!(after, expect, "after {previous:?}");
        }
    }

    #[test]
    fn the_fleet_summary_shows_the_install_error_with_its_time() {
        let clean = FleetSummary::of(&[], &RenderStatus::default(), 0);
        let json = serde_json::to_value(&clean).expect("json");
        assert_eq!(json["installError"], serde_json::Value::Null);
        let render = RenderStatus {
            served_revision: Some("main@sha1:a".into()),
            install_error: Some(InstallError {
                revision: "main@sha1:b".into(),
                message:
                    "cannot write object /state/objects/sha256/ab: Not a directory (os error 20)"
                        .into(),
                since_ms: 1_764_547_200_000,
            }),
            ..RenderStatus::default()
        };
        let json = serde_json::to_value(FleetSummary::of(&[], &render, 0)).expect("json");
        assert_eq!(
            json["installError"],
            serde_json::json!({
                "revision": "main@sha1:b",
                "message": "cannot write object /state/objects/sha256/ab: Not a directory (os error 20)",
                "since": rfc3339(1_764_547_200_000),
            })
        );
        assert_eq!(json["revision"], "main@sha1:a", "the served revision stays");
    }
}
