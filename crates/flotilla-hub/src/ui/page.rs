//! The pages themselves: view models built from the fleet summary and the rollouts,
//! rendered with minijinja templates (HTML autoescaped). Pure apart from the
//! templates compiled into the binary, so a benchmark can build the fleet page of
//! 10,000 clusters without a server.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use minijinja::{Environment, context};
use serde::{Deserialize, Serialize};

use crate::fleet::{ClusterState, ClusterSummary, FleetSummary};
use flotilla_core::rollout::view::RolloutView;

/// Clusters per page of the cluster list.
pub const PAGE_SIZE: usize = 100;

/// Why a page could not be built (a template error: a defect, never user input).
#[derive(Debug, thiserror::Error)]
#[error("the web page's template {template} failed: {source}")]
pub struct PageError {
    template: &'static str,
    source: minijinja::Error,
}

fn environment() -> &'static Environment<'static> {
    static ENV: OnceLock<Environment<'static>> = OnceLock::new();
    ENV.get_or_init(|| {
        let mut env = Environment::new();
        env.add_filter("urlencode", |text: String| encode(&text));
        // Autoescape by file name: every template here ends in .html.
        for (name, source) in [
            ("base.html", include_str!("templates/base.html")),
            ("login.html", include_str!("templates/login.html")),
            ("fleet.html", include_str!("templates/fleet.html")),
            ("cluster.html", include_str!("templates/cluster.html")),
            ("rollout.html", include_str!("templates/rollout.html")),
            ("bundle.html", include_str!("templates/bundle.html")),
            ("error.html", include_str!("templates/error.html")),
        ] {
            if let Err(err) = env.add_template(name, source) {
                // The templates are compiled in and tested; say which one broke.
                tracing::error!("the web page's template {name} does not parse: {err}");
            }
        }
        env
    })
}

/// The stylesheet and script, served from the hub itself (no external assets).
pub const STYLE: &str = include_str!("templates/style.css");
pub const SCRIPT: &str = include_str!("templates/ui.js");

pub fn render(template: &'static str, ctx: minijinja::Value) -> Result<String, PageError> {
    environment()
        .get_template(template)
        .and_then(|t| t.render(ctx))
        .map_err(|source| PageError { template, source })
}

/// The cluster list's filters and page, from the query string.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
pub struct FleetQuery {
    #[serde(default)]
    pub state: String,
    #[serde(default)]
    pub group: String,
    /// A part of the cluster's name.
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub page: Option<usize>,
}

impl FleetQuery {
    fn matches(&self, cluster: &ClusterSummary) -> bool {
        (self.state.is_empty() || cluster.state.as_str() == self.state)
            && (self.group.is_empty() || cluster.groups.contains(&self.group))
            && (self.name.is_empty() || cluster.name.contains(self.name.trim()))
    }

    /// This query's link with another page number.
    fn link(&self, page: usize) -> String {
        let mut parts = Vec::new();
        for (key, value) in [
            ("state", &self.state),
            ("group", &self.group),
            ("name", &self.name),
        ] {
            if !value.is_empty() {
                parts.push(format!("{key}={}", encode(value)));
            }
        }
        if page > 1 {
            parts.push(format!("page={page}"));
        }
        if parts.is_empty() {
            "/ui/".to_string()
        } else {
            format!("/ui/?{}", parts.join("&"))
        }
    }
}

/// Percent-encodes a query value or path segment (unreserved characters kept).
pub fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~') {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[derive(Serialize)]
struct Segment {
    state: &'static str,
    count: usize,
    /// Width in percent of the bar, to one decimal.
    percent: String,
}

fn segments(counts: &BTreeMap<&'static str, usize>) -> (usize, Vec<Segment>) {
    let total: usize = counts.values().sum();
    let segments = ClusterState::BY_URGENCY
        .iter()
        .map(|s| (s.as_str(), counts.get(s.as_str()).copied().unwrap_or(0)))
        .filter(|(_, count)| *count > 0)
        .map(|(state, count)| Segment {
            state,
            count,
            percent: format!("{:.1}", count as f64 * 100.0 / total.max(1) as f64),
        })
        .collect();
    (total, segments)
}

#[derive(Serialize)]
struct GroupBar {
    name: String,
    total: usize,
    segments: Vec<Segment>,
}

#[derive(Serialize)]
struct Row<'a> {
    name: &'a str,
    link: String,
    state: &'static str,
    wave: Option<&'a str>,
    groups: &'a [String],
    applied: Option<String>,
    last_seen: String,
    detail: String,
}

/// `3m`, `2h5m`, `4d1h`: how long ago, to the minute.
pub fn ago(seconds: Option<i64>) -> String {
    let Some(seconds) = seconds else {
        return "never".to_string();
    };
    let seconds = seconds.max(0);
    let (d, h, m) = (seconds / 86_400, seconds / 3600 % 24, seconds / 60 % 60);
    let text = match (d, h, m) {
        (0, 0, 0) => format!("{seconds}s"),
        (0, 0, m) => format!("{m}m"),
        (0, h, m) => format!("{h}h{m}m"),
        (d, h, _) => format!("{d}d{h}h"),
    };
    format!("{text} ago")
}

fn short(digest: &str) -> String {
    digest.chars().take("sha256:".len() + 12).collect()
}

/// What makes the self-refresh reload: a change of any count, of the served or
/// attempted revision, or of any active rollout's progress.
pub fn stamp(summary: &FleetSummary, rollouts: &[RolloutView]) -> String {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    summary.revision.hash(&mut hasher);
    summary.attempted_revision.hash(&mut hasher);
    summary.render_errors.len().hash(&mut hasher);
    summary.counts.hash(&mut hasher);
    for r in rollouts {
        (r.id, r.state.to_string()).hash(&mut hasher);
        for w in &r.waves {
            (w.in_sync, w.failed, w.offline, w.state.as_str()).hash(&mut hasher);
        }
    }
    format!("{:016x}", hasher.finish())
}

/// The fleet page: counts, groups, render status, active rollouts, and one page of
/// the cluster list, filtered and sorted by urgency.
pub fn fleet_page(
    summary: &FleetSummary,
    rollouts: &[RolloutView],
    query: &FleetQuery,
    csrf: &str,
) -> Result<String, PageError> {
    let (total, counts) = segments(&summary.counts);
    let mut by_group: BTreeMap<&str, BTreeMap<&'static str, usize>> = BTreeMap::new();
    for cluster in &summary.clusters {
        for group in &cluster.groups {
            *by_group
                .entry(group.as_str())
                .or_default()
                .entry(cluster.state.as_str())
                .or_default() += 1;
        }
    }
    let groups: Vec<GroupBar> = by_group
        .iter()
        .map(|(name, counts)| {
            let (total, segments) = segments(counts);
            GroupBar {
                name: name.to_string(),
                total,
                segments,
            }
        })
        .collect();
    let mut matching: Vec<&ClusterSummary> = summary
        .clusters
        .iter()
        .filter(|c| query.matches(c))
        .collect();
    let pages = matching.len().div_ceil(PAGE_SIZE).max(1);
    let page = query.page.unwrap_or(1).clamp(1, pages);
    let start = (page - 1) * PAGE_SIZE;
    // Only the page shown needs to be in order: select it, then sort just that part.
    let key = urgency_key;
    let end = (start + PAGE_SIZE).min(matching.len());
    if start < matching.len() {
        if start > 0 {
            matching.select_nth_unstable_by_key(start, key);
        }
        let rest = &mut matching[start..];
        if end - start < rest.len() {
            rest.select_nth_unstable_by_key(end - start, key);
        }
        rest[..end - start].sort_unstable_by_key(key);
    }
    let rows: Vec<Row<'_>> = matching[start.min(matching.len())..end]
        .iter()
        .map(|c| Row {
            name: &c.name,
            link: format!("/ui/clusters/{}", encode(&c.name)),
            state: c.state.as_str(),
            wave: c.wave.as_deref(),
            groups: &c.groups,
            applied: c.applied.as_ref().map(|d| short(d.as_str())),
            last_seen: ago(c.silent_for_seconds),
            detail: match c.state {
                ClusterState::Failed if !c.failed_resources.is_empty() => {
                    c.failed_resources.join("; ")
                }
                ClusterState::NeverSeen => "no report yet".to_string(),
                _ => c.message.clone().unwrap_or_default(),
            },
        })
        .collect();
    let all_groups: Vec<&str> = by_group.keys().copied().collect();
    let states: Vec<&str> = ClusterState::BY_URGENCY
        .iter()
        .map(|s| s.as_str())
        .collect();
    render(
        "fleet.html",
        context! {
            title => "Fleet",
            csrf,
            stamp => stamp(summary, rollouts),
            revision => summary.revision,
            attempted_revision => summary.attempted_revision,
            render_errors => summary.render_errors.iter().map(|e| e.text.as_str()).collect::<Vec<_>>(),
            source_error => summary.source_error,
            total,
            counts,
            groups,
            rollouts,
            rows,
            matching => matching.len(),
            first => if rows_empty(start, end) { 0 } else { start + 1 },
            last => end,
            page,
            pages,
            previous => (page > 1).then(|| query.link(page - 1)),
            next => (page < pages).then(|| query.link(page + 1)),
            query,
            states,
            all_groups,
        },
    )
}

/// Most urgent first; the longest silent first within a state; then by name.
fn urgency_key<'a>(c: &&'a ClusterSummary) -> (usize, std::cmp::Reverse<i64>, &'a str) {
    (
        c.state.urgency(),
        std::cmp::Reverse(c.silent_for_seconds.unwrap_or(0)),
        c.name.as_str(),
    )
}

fn rows_empty(start: usize, end: usize) -> bool {
    end <= start
}

/// One cluster: its summary line, the recent digests it was served, and its wave.
pub fn cluster_page(
    cluster: &ClusterSummary,
    history: &[(String, String)],
    csrf: &str,
) -> Result<String, PageError> {
    render(
        "cluster.html",
        context! {
            title => cluster.name.clone(),
            csrf,
            cluster,
            state => cluster.state.as_str(),
            last_seen => ago(cluster.silent_for_seconds),
            bundle_link => format!("/ui/clusters/{}/bundle", encode(&cluster.name)),
            history => history.iter().map(|(d, r)| context! { digest => d, revision => r }).collect::<Vec<_>>(),
        },
    )
}

/// A cluster's bundle, with Secret values hidden.
pub fn bundle_page(
    cluster: &str,
    digest: &str,
    text: &str,
    csrf: &str,
) -> Result<String, PageError> {
    render(
        "bundle.html",
        context! {
            title => format!("{cluster}: bundle"),
            csrf,
            cluster,
            cluster_link => format!("/ui/clusters/{}", encode(cluster)),
            digest,
            text,
        },
    )
}

/// One rollout with its controls.
pub fn rollout_page(rollout: &RolloutView, csrf: &str) -> Result<String, PageError> {
    let ended = rollout.ended_at.is_some();
    let state = rollout.state.to_string();
    let actions: Vec<&str> = if ended {
        vec![]
    } else {
        match state.as_str() {
            "paused" | "halted" => vec!["resume", "abort"],
            _ => vec!["pause", "promote", "abort"],
        }
    };
    render(
        "rollout.html",
        context! {
            title => format!("Rollout {}", rollout.id),
            csrf,
            rollout,
            state,
            actions,
            action_base => format!("/ui/rollouts/{}", rollout.id),
        },
    )
}

pub fn login_page(error: Option<&str>) -> Result<String, PageError> {
    render("login.html", context! { title => "Log in", error })
}

pub fn error_page(message: &str, csrf: Option<&str>) -> Result<String, PageError> {
    render("error.html", context! { title => "Error", message, csrf })
}

/// Replaces the values under `data` and `stringData` of every Secret in a bundle
/// document (`{"resources": [...]}`) with a placeholder, keeping the keys.
pub fn redact_secrets(document: &mut serde_json::Value) {
    let Some(resources) = document.get_mut("resources").and_then(|r| r.as_array_mut()) else {
        return;
    };
    for resource in resources {
        let is_secret = resource.get("kind").and_then(|k| k.as_str()) == Some("Secret")
            && resource.get("apiVersion").and_then(|v| v.as_str()) == Some("v1");
        if !is_secret {
            continue;
        }
        for field in ["data", "stringData"] {
            if let Some(values) = resource.get_mut(field).and_then(|d| d.as_object_mut()) {
                for value in values.values_mut() {
                    *value = serde_json::Value::String("(redacted)".into());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn secret_values_are_hidden_and_their_keys_kept() {
        let mut document = json!({"resources": [
            {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"},
             "data": {"password": "aHVudGVyMg=="}, "stringData": {"token": "hunter2"}},
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"},
             "data": {"password": "visible"}},
        ]});
        redact_secrets(&mut document);
        let text = document.to_string();
        assert!(
            !text.contains("aHVudGVyMg==") && !text.contains("hunter2"),
            "{text}"
        );
        assert_eq!(document["resources"][0]["data"]["password"], "(redacted)");
        assert_eq!(
            document["resources"][0]["stringData"]["token"],
            "(redacted)"
        );
        assert_eq!(document["resources"][1]["data"]["password"], "visible");
    }

    #[test]
    fn links_keep_the_filters_and_encode_them() {
        let query = FleetQuery {
            state: "failed".into(),
            group: "eu west".into(),
            name: "<x>".into(),
            page: Some(3),
        };
        assert_eq!(
            query.link(2),
            "/ui/?state=failed&group=eu%20west&name=%3Cx%3E&page=2"
        );
        assert_eq!(FleetQuery::default().link(1), "/ui/");
    }

    #[test]
    fn every_template_parses() {
        for name in [
            "base.html",
            "login.html",
            "fleet.html",
            "cluster.html",
            "rollout.html",
            "bundle.html",
            "error.html",
        ] {
            assert!(environment().get_template(name).is_ok(), "{name}");
        }
    }
}
