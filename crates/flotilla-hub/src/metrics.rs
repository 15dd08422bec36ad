//! Counters for `/metrics`, written in the Prometheus text format by hand.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use http::StatusCode;

use super::fleet::{ClusterState, FleetSummary, RenderStatus};

/// The status codes the bundle endpoints count separately; anything else is "other".
const CODES: [u16; 8] = [200, 304, 400, 401, 403, 404, 500, 503];

#[derive(Debug, Default)]
pub struct Metrics {
    bundle_responses: [AtomicU64; CODES.len() + 1],
    long_polls_held: AtomicI64,
    pub statuses_received: AtomicU64,
    pub webhooks_accepted: AtomicU64,
    pub webhooks_rejected: AtomicU64,
    pub objects_written: AtomicU64,
}

impl Metrics {
    pub fn count_bundle_response(&self, status: StatusCode) {
        let index = CODES
            .iter()
            .position(|&c| c == status.as_u16())
            .unwrap_or(CODES.len());
        self.bundle_responses[index].fetch_add(1, Ordering::Relaxed);
    }

    fn bundle_responses(&self, code: u16) -> u64 {
        CODES
            .iter()
            .position(|&c| c == code)
            .map(|i| self.bundle_responses[i].load(Ordering::Relaxed))
            .unwrap_or(0)
    }

    pub fn long_poll_started(&self) -> LongPollGuard<'_> {
        self.long_polls_held.fetch_add(1, Ordering::Relaxed);
        LongPollGuard(self)
    }

    pub fn long_polls_held(&self) -> i64 {
        self.long_polls_held.load(Ordering::Relaxed)
    }

    /// The whole exposition.
    pub fn render(&self, render: &RenderStatus, fleet: &FleetSummary, tokens: usize) -> String {
        let mut out = String::with_capacity(4096);
        let mut family = |name: &str, kind: &str, help: &str| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        };
        family(
            "flotilla_commit_info",
            "gauge",
            "The commit whose bundles are served (value 1), and the last one attempted.",
        );
        let mut lines = String::new();
        if let Some(revision) = &render.served_revision {
            let _ = writeln!(
                lines,
                "flotilla_commit_info{{revision=\"{}\",role=\"served\"}} 1",
                escape(revision)
            );
        }
        if let Some(revision) = &render.attempted_revision {
            let _ = writeln!(
                lines,
                "flotilla_commit_info{{revision=\"{}\",role=\"attempted\"}} 1",
                escape(revision)
            );
        }
        out.push_str(&lines);

        let mut push = |name: &str, kind: &str, help: &str, samples: &[(String, f64)]| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for (labels, value) in samples {
                if labels.is_empty() {
                    let _ = writeln!(out, "{name} {value}");
                } else {
                    let _ = writeln!(out, "{name}{{{labels}}} {value}");
                }
            }
        };
        push(
            "flotilla_render_duration_seconds",
            "gauge",
            "How long the last render took.",
            &[(
                String::new(),
                render.duration.map(|d| d.as_secs_f64()).unwrap_or(0.0),
            )],
        );
        push(
            "flotilla_renders_total",
            "counter",
            "Renders since the hub started, by result.",
            &[
                ("result=\"clean\"".into(), render.renders_clean as f64),
                ("result=\"failed\"".into(), render.renders_failed as f64),
            ],
        );
        push(
            "flotilla_render_errors",
            "gauge",
            "Errors in the last render attempt (0 when it was clean).",
            &[(String::new(), render.errors.len() as f64)],
        );
        let error_samples: Vec<(String, f64)> = render
            .errors
            .iter()
            .take(100)
            .map(|d| {
                (
                    format!(
                        "file=\"{}\",line=\"{}\",message=\"{}\"",
                        escape(d.file.as_deref().unwrap_or("")),
                        d.line.map(|l| l.to_string()).unwrap_or_default(),
                        escape(&d.to_string())
                    ),
                    1.0,
                )
            })
            .collect();
        push(
            "flotilla_render_error_info",
            "gauge",
            "One sample per error of the last render attempt (the first 100).",
            &error_samples,
        );
        push(
            "flotilla_source_up",
            "gauge",
            "1 when the repository was last read or fetched without error.",
            &[(
                String::new(),
                if render.source_error.is_some() {
                    0.0
                } else {
                    1.0
                },
            )],
        );
        let mut responses: Vec<(String, f64)> = CODES
            .iter()
            .map(|c| (format!("code=\"{c}\""), self.bundle_responses(*c) as f64))
            .collect();
        responses.push((
            "code=\"other\"".into(),
            self.bundle_responses[CODES.len()].load(Ordering::Relaxed) as f64,
        ));
        push(
            "flotilla_bundle_responses_total",
            "counter",
            "Responses to bundle requests, by status code.",
            &responses,
        );
        let ok = self.bundle_responses(200) as f64;
        let not_modified = self.bundle_responses(304) as f64;
        let ratio = if ok + not_modified > 0.0 {
            not_modified / (ok + not_modified)
        } else {
            0.0
        };
        push(
            "flotilla_bundle_not_modified_ratio",
            "gauge",
            "304 responses as a share of 200 and 304 responses since the hub started.",
            &[(String::new(), ratio)],
        );
        let states: Vec<(String, f64)> = ClusterState::ALL
            .iter()
            .map(|s| {
                (
                    format!("state=\"{}\"", s.as_str()),
                    fleet.counts.get(s.as_str()).copied().unwrap_or(0) as f64,
                )
            })
            .collect();
        push(
            "flotilla_clusters",
            "gauge",
            "Served clusters by state.",
            &states,
        );
        push(
            "flotilla_long_polls_held",
            "gauge",
            "Bundle requests waiting for a change right now.",
            &[(String::new(), self.long_polls_held() as f64)],
        );
        push(
            "flotilla_status_reports_total",
            "counter",
            "Agent status reports stored.",
            &[(
                String::new(),
                self.statuses_received.load(Ordering::Relaxed) as f64,
            )],
        );
        push(
            "flotilla_webhooks_total",
            "counter",
            "Webhook calls, by result.",
            &[
                (
                    "result=\"accepted\"".into(),
                    self.webhooks_accepted.load(Ordering::Relaxed) as f64,
                ),
                (
                    "result=\"rejected\"".into(),
                    self.webhooks_rejected.load(Ordering::Relaxed) as f64,
                ),
            ],
        );
        push(
            "flotilla_objects_written_total",
            "counter",
            "Bundle objects written to the store.",
            &[(
                String::new(),
                self.objects_written.load(Ordering::Relaxed) as f64,
            )],
        );
        push(
            "flotilla_tokens",
            "gauge",
            "Tokens that are not revoked.",
            &[(String::new(), tokens as f64)],
        );
        out
    }
}

/// Counts a long-poll as held until it is dropped, however the request ends.
pub struct LongPollGuard<'a>(&'a Metrics);

impl Drop for LongPollGuard<'_> {
    fn drop(&mut self) {
        self.0.long_polls_held.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Escapes a label value: backslash, double quote and newline.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}
