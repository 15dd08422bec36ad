//! `/metrics`, in the OpenMetrics text format (which Prometheus reads), through
//! `prometheus-client`.
//!
//! Two kinds of figures: counters and gauges the request path moves as things happen
//! ([`Metrics`], registered once), and figures derived from the hub's state at scrape
//! time (the render, the fleet's states, tokens), written into a registry made for
//! each scrape.

use std::sync::atomic::AtomicU64;

use http::StatusCode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::{encode_eof, encode_registry};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::fleet::{ClusterState, Counts, RenderStatus};
use flotilla_core::rollout::RolloutState;
use flotilla_core::rollout::view::RolloutView;

/// The rollout figures of one scrape.
pub struct RolloutFigures<'a> {
    /// The rollouts that have not ended.
    pub active: &'a [RolloutView],
    pub superseded: u64,
    pub decisions: u64,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RolloutLabels {
    policy: String,
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WaveLabels {
    policy: String,
    rollout: String,
    wave: String,
    state: &'static str,
}

/// The content type of the exposition.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The status codes the bundle endpoints count separately; anything else is "other".
const CODES: [u16; 8] = [200, 304, 400, 401, 403, 404, 500, 503];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CodeLabel {
    code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: &'static str,
}

/// A label value written as the text format requires: backslash, double quote and
/// newline escaped. prometheus-client (0.24) writes label values as they are, so a
/// value that may hold those characters (a revision, a file name, an error message
/// from the fleet repository) goes through this first.
fn label_value(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CommitLabels {
    revision: String,
    role: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    file: String,
    line: String,
    message: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: &'static str,
}

type F64Gauge = Gauge<f64, AtomicU64>;

/// What the request path counts as it goes.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    bundle_responses: Family<CodeLabel, Counter>,
    long_polls_held: Gauge,
    statuses_received: Counter,
    webhooks: Family<ResultLabel, Counter>,
    objects_written: Counter,
    /// 1 while the last look at the database (several hubs) failed.
    database_unreachable: Gauge,
    rollout_lease_held: Gauge,
    bundle_bytes: Family<EncodingLabel, Counter>,
    deltas: Family<ResultLabel, Counter>,
    deltas_made: Counter,
    cluster_bytes: Family<ClusterBytesLabel, Counter>,
}

/// A cluster, and whether its bundle went whole (`full`, compressed or not) or as a
/// delta (`delta`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClusterBytesLabel {
    cluster: String,
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EncodingLabel {
    encoding: &'static str,
}

/// The content encodings of bundle bodies: the full document as it is or compressed,
/// or a delta (RFC 9842 `dcz`).
const ENCODINGS: [&str; 4] = ["identity", "gzip", "zstd", "dcz"];

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let bundle_responses = Family::<CodeLabel, Counter>::default();
        // Every code is shown from the start, at zero, so rates work from the first scrape.
        for code in CODES.iter().map(u16::to_string).chain(["other".into()]) {
            let _ = bundle_responses.get_or_create(&CodeLabel { code });
        }
        registry.register(
            "flotilla_bundle_responses",
            "Responses to bundle requests, by status code",
            bundle_responses.clone(),
        );
        let long_polls_held = Gauge::default();
        registry.register(
            "flotilla_long_polls_held",
            "Bundle requests waiting for a change right now",
            long_polls_held.clone(),
        );
        let statuses_received = Counter::default();
        registry.register(
            "flotilla_status_reports",
            "Agent status reports stored",
            statuses_received.clone(),
        );
        let webhooks = Family::<ResultLabel, Counter>::default();
        for result in ["accepted", "rejected"] {
            let _ = webhooks.get_or_create(&ResultLabel { result });
        }
        registry.register(
            "flotilla_webhooks",
            "Webhook calls, by result",
            webhooks.clone(),
        );
        let objects_written = Counter::default();
        registry.register(
            "flotilla_objects_written",
            "Bundle objects written to the store",
            objects_written.clone(),
        );
        let database_unreachable = Gauge::default();
        registry.register(
            "flotilla_database_unreachable",
            "1 while this hub cannot reach the database it shares with other hubs (it serves what it has)",
            database_unreachable.clone(),
        );
        let rollout_lease_held = Gauge::default();
        registry.register(
            "flotilla_rollout_lease_held",
            "1 while this hub holds the lease to record renders and decide rollouts",
            rollout_lease_held.clone(),
        );
        let bundle_bytes = Family::<EncodingLabel, Counter>::default();
        for encoding in ENCODINGS {
            let _ = bundle_bytes.get_or_create(&EncodingLabel { encoding });
        }
        registry.register(
            "flotilla_bundle_bytes_sent",
            "Bytes of bundle bodies sent, by content encoding (dcz: deltas against the digest the agent runs)",
            bundle_bytes.clone(),
        );
        let deltas = Family::<ResultLabel, Counter>::default();
        for result in ["hit", "miss"] {
            let _ = deltas.get_or_create(&ResultLabel { result });
        }
        registry.register(
            "flotilla_bundle_deltas",
            "Changed bundles asked for as a delta: sent as one (hit) or as the full document (miss)",
            deltas.clone(),
        );
        let deltas_made = Counter::default();
        registry.register(
            "flotilla_bundle_deltas_made",
            "Deltas made: ahead of the polls, when what a cluster is served changes, or for a request that found none",
            deltas_made.clone(),
        );
        let cluster_bytes = Family::<ClusterBytesLabel, Counter>::default();
        registry.register(
            "flotilla_cluster_bundle_bytes_sent",
            "Bytes of bundle bodies sent to each cluster that fetched one since the hub started: the whole document (full) or a delta against what it runs (delta)",
            cluster_bytes.clone(),
        );
        Metrics {
            bundle_bytes,
            deltas,
            deltas_made,
            cluster_bytes,
            database_unreachable,
            rollout_lease_held,
            registry,
            bundle_responses,
            long_polls_held,
            statuses_received,
            webhooks,
            objects_written,
        }
    }
}

impl Metrics {
    pub fn count_bundle_response(&self, status: StatusCode) {
        let code = if CODES.contains(&status.as_u16()) {
            status.as_u16().to_string()
        } else {
            "other".to_string()
        };
        self.bundle_responses
            .get_or_create(&CodeLabel { code })
            .inc();
    }

    /// Counts the bytes of a bundle body sent to `cluster` with `encoding`
    /// (`identity`, `gzip`, `zstd` or `dcz`).
    pub fn bundle_bytes_sent(&self, cluster: &str, encoding: &'static str, bytes: usize) {
        self.bundle_bytes
            .get_or_create(&EncodingLabel { encoding })
            .inc_by(bytes as u64);
        let kind = if encoding == flotilla_core::dcz::ENCODING {
            "delta"
        } else {
            "full"
        };
        self.cluster_bytes
            .get_or_create(&ClusterBytesLabel {
                cluster: cluster.to_string(),
                kind,
            })
            .inc_by(bytes as u64);
    }

    /// Counts a delta made.
    pub fn delta_made(&self) {
        self.deltas_made.inc();
    }

    /// Counts a changed bundle asked for as a delta: sent as one, or not.
    pub fn delta(&self, hit: bool) {
        let result = if hit { "hit" } else { "miss" };
        self.deltas.get_or_create(&ResultLabel { result }).inc();
    }

    fn bundle_responses(&self, code: u16) -> u64 {
        self.bundle_responses
            .get_or_create(&CodeLabel {
                code: code.to_string(),
            })
            .get()
    }

    pub fn long_poll_started(&self) -> LongPollGuard<'_> {
        self.long_polls_held.inc();
        LongPollGuard(self)
    }

    pub fn long_polls_held(&self) -> i64 {
        self.long_polls_held.get()
    }

    pub fn database_ok(&self) {
        self.database_unreachable.set(0);
    }

    pub fn database_error(&self) {
        self.database_unreachable.set(1);
    }

    pub fn database_is_unreachable(&self) -> bool {
        self.database_unreachable.get() != 0
    }

    pub fn lease_held(&self, held: bool) {
        self.rollout_lease_held.set(i64::from(held));
    }

    pub fn status_received(&self) {
        self.statuses_received.inc();
    }

    pub fn webhook(&self, accepted: bool) {
        let result = if accepted { "accepted" } else { "rejected" };
        self.webhooks.get_or_create(&ResultLabel { result }).inc();
    }

    /// Shows the count of requests the hub's objects make to a remote store as
    /// `flotilla_object_store_requests`.
    pub fn count_object_store_requests(&mut self, requests: Counter) {
        self.registry.register(
            "flotilla_object_store_requests",
            "Requests this hub made to the S3 object store (an unchanged poll makes none)",
            requests,
        );
    }

    pub fn objects_written(&self, count: u64) {
        self.objects_written.inc_by(count);
    }

    /// The whole exposition: the live figures, then those derived from the hub's state.
    pub fn render(
        &self,
        render: &RenderStatus,
        fleet: &Counts,
        tokens: usize,
        rollouts: &RolloutFigures<'_>,
    ) -> String {
        let mut derived = Registry::default();
        register_render(&mut derived, render);
        register_fleet(&mut derived, fleet, tokens);
        register_rollouts(&mut derived, rollouts);
        register_not_modified_ratio(
            &mut derived,
            self.bundle_responses(200),
            self.bundle_responses(304),
        );
        let mut out = String::with_capacity(4096);
        // Writing into a String cannot fail.
        let _ = encode_registry(&mut out, &self.registry)
            .and_then(|()| encode_registry(&mut out, &derived))
            .and_then(|()| encode_eof(&mut out));
        out
    }
}

fn gauge_f64(registry: &mut Registry, name: &str, help: &str, value: f64) {
    let gauge = F64Gauge::default();
    gauge.set(value);
    registry.register(name, help, gauge);
}

fn gauge_i64(registry: &mut Registry, name: &str, help: &str, value: i64) {
    let gauge: Gauge = Gauge::default();
    gauge.set(value);
    registry.register(name, help, gauge);
}

fn register_render(registry: &mut Registry, render: &RenderStatus) {
    let commits = Family::<CommitLabels, Gauge>::default();
    for (role, revision) in [
        ("served", &render.served_revision),
        ("attempted", &render.attempted_revision),
    ] {
        if let Some(revision) = revision {
            commits
                .get_or_create(&CommitLabels {
                    revision: label_value(revision),
                    role,
                })
                .set(1);
        }
    }
    registry.register(
        "flotilla_commit_info",
        "The commit whose bundles are served (value 1), and the last one attempted",
        commits,
    );
    gauge_f64(
        registry,
        "flotilla_render_duration_seconds",
        "How long the last render took",
        render.duration.map(|d| d.as_secs_f64()).unwrap_or(0.0),
    );
    let renders = Family::<ResultLabel, Counter>::default();
    renders
        .get_or_create(&ResultLabel { result: "clean" })
        .inc_by(render.renders_clean);
    renders
        .get_or_create(&ResultLabel { result: "failed" })
        .inc_by(render.renders_failed);
    registry.register(
        "flotilla_renders",
        "Renders since the hub started, by result",
        renders,
    );
    gauge_i64(
        registry,
        "flotilla_render_errors",
        "Errors in the last render attempt (0 when it was clean)",
        render.errors.len() as i64,
    );
    gauge_i64(
        registry,
        "flotilla_render_warnings",
        "Warnings of the last render attempt, clean or not",
        render.warnings.len() as i64,
    );
    let error_info = Family::<ErrorLabels, Gauge>::default();
    for diagnostic in render.errors.iter().take(100) {
        error_info
            .get_or_create(&ErrorLabels {
                file: label_value(diagnostic.file.as_deref().unwrap_or_default()),
                line: diagnostic.line.map(|l| l.to_string()).unwrap_or_default(),
                message: label_value(&diagnostic.to_string()),
            })
            .set(1);
    }
    registry.register(
        "flotilla_render_error_info",
        "One sample per error of the last render attempt (the first 100)",
        error_info,
    );
    gauge_i64(
        registry,
        "flotilla_source_up",
        "1 when the repository was last read or fetched without error",
        i64::from(render.source_error.is_none()),
    );
    gauge_i64(
        registry,
        "flotilla_install_up",
        "1 unless the newest clean render could not be installed (the last good bundles stay served)",
        i64::from(render.install_error.is_none()),
    );
}

fn register_fleet(registry: &mut Registry, fleet: &Counts, tokens: usize) {
    let states = Family::<StateLabel, Gauge>::default();
    for state in ClusterState::ALL {
        let count = fleet.get(state);
        states
            .get_or_create(&StateLabel {
                state: state.as_str(),
            })
            .set(count as i64);
    }
    registry.register("flotilla_clusters", "Served clusters by state", states);
    gauge_i64(
        registry,
        "flotilla_tokens",
        "Tokens that are not revoked",
        tokens as i64,
    );
}

fn register_rollouts(registry: &mut Registry, figures: &RolloutFigures<'_>) {
    let rollouts = Family::<RolloutLabels, Gauge>::default();
    for view in figures.active {
        rollouts
            .get_or_create(&RolloutLabels {
                policy: label_value(&view.policy),
                state: view.state.as_str(),
            })
            .inc();
    }
    // Every active state is shown, at zero too, so alerts can test for it.
    for state in RolloutState::ALL.into_iter().filter(|s| s.is_active()) {
        for view in figures.active {
            let _ = rollouts.get_or_create(&RolloutLabels {
                policy: label_value(&view.policy),
                state: state.as_str(),
            });
        }
    }
    registry.register(
        "flotilla_rollouts",
        "Rollouts that have not ended, by policy and state",
        rollouts,
    );
    let waves = Family::<WaveLabels, Gauge>::default();
    let wave_state = Family::<WaveLabels, Gauge>::default();
    for view in figures.active {
        for wave in &view.waves {
            let labels = |state: &'static str| WaveLabels {
                policy: label_value(&view.policy),
                rollout: view.id.to_string(),
                wave: label_value(&wave.name),
                state,
            };
            for (state, count) in [
                ("changing", wave.clusters),
                ("in-sync", wave.in_sync),
                ("failed", wave.failed),
                ("offline", wave.offline),
                ("never-seen", wave.never_seen),
            ] {
                waves.get_or_create(&labels(state)).set(count as i64);
            }
            wave_state
                .get_or_create(&labels(wave.state.as_str()))
                .set(1);
        }
    }
    registry.register(
        "flotilla_rollout_wave_clusters",
        "Changing clusters of each wave of the active rollouts: all of them, and those in sync, failed, offline and never seen",
        waves,
    );
    registry.register(
        "flotilla_rollout_wave_info",
        "The state of each wave of the active rollouts (value 1)",
        wave_state,
    );
    let superseded: Counter = Counter::default();
    superseded.inc_by(figures.superseded);
    registry.register(
        "flotilla_rollouts_superseded",
        "Rollouts a newer commit superseded since the hub started (a repository committing faster than its waves bake)",
        superseded,
    );
    let decisions: Counter = Counter::default();
    decisions.inc_by(figures.decisions);
    registry.register(
        "flotilla_rollout_decisions",
        "Rollout decisions taken since the hub started",
        decisions,
    );
}

fn register_not_modified_ratio(registry: &mut Registry, ok: u64, not_modified: u64) {
    let answered = ok + not_modified;
    gauge_f64(
        registry,
        "flotilla_bundle_not_modified_ratio",
        "304 responses as a share of 200 and 304 responses since the hub started",
        if answered > 0 {
            not_modified as f64 / answered as f64
        } else {
            0.0
        },
    );
}

/// Counts a long-poll as held until it is dropped, however the request ends.
pub struct LongPollGuard<'a>(&'a Metrics);

impl Drop for LongPollGuard<'_> {
    fn drop(&mut self) {
        self.0.long_polls_held.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample<'a>(text: &'a str, name: &str) -> Option<&'a str> {
        text.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
    }

    #[test]
    fn counts_and_derives_in_openmetrics_text() {
        let metrics = Metrics::default();
        metrics.count_bundle_response(StatusCode::OK);
        metrics.count_bundle_response(StatusCode::NOT_MODIFIED);
        metrics.count_bundle_response(StatusCode::NOT_MODIFIED);
        metrics.count_bundle_response(StatusCode::IM_A_TEAPOT);
        metrics.webhook(false);
        let held = metrics.long_poll_started();
        let render = RenderStatus {
            served_revision: Some("main@sha1:1".into()),
            errors: vec![
                flotilla_core::diagnostic::Diagnostic::error("bad \"quote\"\nnewline")
                    .in_file("clusters/red.yaml")
                    .at_line(Some(4)),
            ],
            warnings: std::sync::Arc::from([
                flotilla_core::diagnostic::Diagnostic::warning("a"),
                flotilla_core::diagnostic::Diagnostic::warning("b"),
            ]),
            renders_clean: 2,
            ..RenderStatus::default()
        };
        let text = metrics.render(
            &render,
            &crate::fleet::Counts::default(),
            3,
            &RolloutFigures {
                active: &[],
                superseded: 2,
                decisions: 0,
            },
        );
        drop(held);
        assert_eq!(
            sample(&text, "flotilla_bundle_responses_total{code=\"304\"}"),
            Some("2")
        );
        assert_eq!(
            sample(&text, "flotilla_bundle_responses_total{code=\"other\"}"),
            Some("1")
        );
        assert_eq!(
            sample(&text, "flotilla_bundle_responses_total{code=\"404\"}"),
            Some("0")
        );
        assert_eq!(
            sample(&text, "flotilla_webhooks_total{result=\"rejected\"}"),
            Some("1")
        );
        assert_eq!(sample(&text, "flotilla_long_polls_held"), Some("1"));
        assert_eq!(
            sample(&text, "flotilla_renders_total{result=\"clean\"}"),
            Some("2")
        );
        assert_eq!(sample(&text, "flotilla_render_errors"), Some("1"));
        assert_eq!(sample(&text, "flotilla_render_warnings"), Some("2"));
        assert_eq!(sample(&text, "flotilla_tokens"), Some("3"));
        assert_eq!(
            sample(&text, "flotilla_rollouts_superseded_total"),
            Some("2")
        );
        let ratio: f64 = sample(&text, "flotilla_bundle_not_modified_ratio")
            .and_then(|v| v.parse().ok())
            .expect("ratio");
        assert!((ratio - 2.0 / 3.0).abs() < 1e-9);
        // Label values are escaped, so one error message cannot break the exposition.
        assert!(
            text.contains(r#"message="clusters/red.yaml:4: bad \"quote\"\nnewline""#),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"));
        assert_eq!(metrics.long_polls_held(), 0);
    }
}
