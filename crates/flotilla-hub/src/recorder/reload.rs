//! Reading the store into memory: at start, so a restarted hub serves at once with the
//! same digests, revisions and so ETags, and its rollouts go on where they were; and
//! whenever the database moved on beside this hub (another hub's decision, an
//! operator's action written straight into it). One reading for both.

use std::collections::HashMap;

use super::{Recorder, Served};
use crate::HubError;
use crate::store::StoredStatus;

/// Why the store is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reload {
    /// The hub starts: nothing is in memory yet.
    Start,
    /// The database moved on: keep what did not change.
    Changed,
}

impl Recorder {
    /// Brings the view in step with the store: when clusters were last seen, the
    /// reports, what each cluster is served (a cluster whose entry did not change
    /// keeps it, so its ETag and cached bytes stay; one whose object this hub does not
    /// have keeps what it had, or is left out until a render writes it), what HEAD
    /// renders and the revision served; then, at start or on a hub without the lease,
    /// the rollouts, and on the lease's holder a decision on each report another hub
    /// received. Returns how many clusters are served.
    pub async fn reload(&self, why: Reload) -> Result<usize, HubError> {
        for (cluster, at) in self.store.seen().await? {
            self.view.pulse(&cluster).see(at);
        }
        let new_reports = self.reload_statuses().await?;
        let served = self.reload_served(why).await?;
        self.load_latest().await?;
        let revision = self.store.revision().await?;
        self.view.update_render_status(|r| {
            if r.force_push.as_ref().map(|f| &f.revision) == revision.as_ref() {
                // The force-pushed tip was recorded (by the lease holder).
                r.force_push = None;
            }
            r.served_revision = revision;
        });
        if why == Reload::Start || !self.lease.holds() {
            self.load_rollouts().await?;
        } else {
            for status in new_reports {
                self.report_to_rollouts(&status.cluster, &status.report, status.received_at_ms)
                    .await?;
            }
        }
        Ok(served)
    }

    /// Reads the reports, and returns those that are new to this hub.
    async fn reload_statuses(&self) -> Result<Vec<StoredStatus>, HubError> {
        let statuses = self.store.statuses().await?;
        let mut known = self.view.statuses_mut();
        let mut new_reports = Vec::new();
        for status in &statuses {
            if known.get(&status.cluster) != Some(status) {
                new_reports.push(status.clone());
            }
            self.view.pulse(&status.cluster).see(status.received_at_ms);
        }
        *known = statuses
            .into_iter()
            .map(|s| (s.cluster.clone(), s))
            .collect::<HashMap<_, _>>();
        Ok(new_reports)
    }

    /// Reads what each cluster is served, and swaps it in if it changed.
    async fn reload_served(&self, why: Reload) -> Result<usize, HubError> {
        let recorded = self.store.clusters().await?;
        let since = self.store.served_since().await?;
        let current = self.view.served();
        let mut next = Served::default();
        let mut changed = why == Reload::Start;
        for cluster in recorded {
            let existing = current.clusters.get(&cluster.name);
            let same = existing.is_some_and(|e| {
                e.digest == cluster.digest
                    && e.hold == cluster.hold
                    && e.revision == cluster.revision
                    && e.sequence == cluster.sequence
            });
            // On disk a missing object is cheap to see; in a remote store the digests
            // the database records are there (only unreferenced ones are deleted), and
            // asking for each would be one request per cluster.
            let missing = !same && self.store.objects.known_missing(&cluster.digest);
            if missing && existing.is_none() && why == Reload::Start {
                tracing::warn!(
                    cluster = %cluster.name,
                    digest = %cluster.digest,
                    "the store has no object for this cluster's digest; it is served again after the next render"
                );
            }
            if same || missing {
                if let Some(entry) = existing {
                    next.clusters.insert(cluster.name.clone(), entry.clone());
                }
                continue;
            }
            changed = true;
            let since = since.get(&cluster.name).copied();
            next.clusters
                .insert(cluster.name.clone(), self.serve_stored(cluster, since));
        }
        if why == Reload::Start {
            // Temporary files of a crashed earlier run; nothing else writes objects yet.
            self.store.objects.clean_temporaries();
        }
        let count = next.clusters.len();
        if changed || count != current.clusters.len() {
            self.view.swap(next);
        }
        Ok(count)
    }
}
