//! What the hub serves, held in memory: one immutable [`Served`] snapshot of every
//! cluster's current bundle, swapped atomically after each clean render. Requests
//! read it without locks; long-polls wait on a generation counter that every swap
//! bumps.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use bytes::Bytes;
use http::HeaderValue;
use tokio::sync::{Notify, watch};

use super::HubError;
use super::auth::TokenTable;
use super::clock::Clock;
use super::fleet::{Desired, FleetSummary, RenderStatus, summarize};
use super::metrics::Metrics;
use crate::store::{ObjectError, RenderCommit, Store, StoredCluster, StoredStatus};
use flotilla_core::bundle::{Digest, document_bytes};
use flotilla_render::RenderOutput;

/// One cluster's current bundle. The document itself stays on disk (read through the
/// page cache when an agent needs it); compressed forms are made once per digest, on
/// the first request that asks for them.
#[derive(Debug)]
pub struct ClusterBundle {
    pub name: String,
    pub digest: Digest,
    /// `"<digest>"`, ready to send.
    pub etag: HeaderValue,
    /// The commit that first produced this digest for this cluster.
    pub revision: String,
    pub revision_header: HeaderValue,
    gzip: OnceLock<Bytes>,
    zstd: OnceLock<Bytes>,
}

impl ClusterBundle {
    pub fn new(name: String, digest: Digest, revision: String) -> ClusterBundle {
        let etag = HeaderValue::from_str(&format!("\"{digest}\""))
            .unwrap_or_else(|_| HeaderValue::from_static("\"\""));
        let revision_header = HeaderValue::from_bytes(revision.as_bytes())
            .unwrap_or_else(|_| HeaderValue::from_static("unknown"));
        ClusterBundle {
            name,
            digest,
            etag,
            revision,
            revision_header,
            gzip: OnceLock::new(),
            zstd: OnceLock::new(),
        }
    }

    /// The served document, read from the store and checked against its digest.
    pub fn document(&self, store: &Store) -> Result<Vec<u8>, ObjectError> {
        let canonical = store.objects.read(&self.digest)?;
        Ok(document_bytes(
            &self.name,
            &self.digest,
            &self.revision,
            &canonical,
        ))
    }

    pub fn encoded(&self, encoding: Encoding, document: &[u8]) -> Bytes {
        match encoding {
            Encoding::Identity => Bytes::copy_from_slice(document),
            Encoding::Gzip => self.gzip.get_or_init(|| gzip(document)).clone(),
            Encoding::Zstd => self.zstd.get_or_init(|| zstd(document)).clone(),
        }
    }

    /// The compressed form, if it was made already (then the document need not be read).
    pub fn cached(&self, encoding: Encoding) -> Option<Bytes> {
        match encoding {
            Encoding::Identity => None,
            Encoding::Gzip => self.gzip.get().cloned(),
            Encoding::Zstd => self.zstd.get().cloned(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encoding {
    Identity,
    Gzip,
    Zstd,
}

impl Encoding {
    pub fn header(self) -> Option<HeaderValue> {
        match self {
            Encoding::Identity => None,
            Encoding::Gzip => Some(HeaderValue::from_static("gzip")),
            Encoding::Zstd => Some(HeaderValue::from_static("zstd")),
        }
    }
}

fn gzip(bytes: &[u8]) -> Bytes {
    use std::io::Write as _;
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(6));
    // Writing into a Vec cannot fail.
    let _ = encoder.write_all(bytes);
    Bytes::from(encoder.finish().unwrap_or_default())
}

fn zstd(bytes: &[u8]) -> Bytes {
    Bytes::from(zstd::bulk::compress(bytes, 3).unwrap_or_default())
}

/// Every served cluster, as of one clean render (or the store, after a restart).
#[derive(Debug, Default)]
pub struct Served {
    pub clusters: HashMap<String, Arc<ClusterBundle>>,
}

/// Settings the request handlers need.
pub struct Settings {
    pub offline_after: Duration,
    pub max_wait: Duration,
    pub history: usize,
    pub webhook_secret: Option<Vec<u8>>,
    pub clock: Arc<dyn Clock>,
}

/// State shared by the request handlers and the background tasks.
pub struct Shared {
    pub served: ArcSwap<Served>,
    /// Bumped on every change of [`Shared::served`]; long-polls wait on it.
    pub generation: watch::Sender<u64>,
    /// Set once on shutdown; held long-polls return at once.
    pub shutdown: watch::Sender<bool>,
    pub tokens: ArcSwap<TokenTable>,
    pub ready: AtomicBool,
    pub metrics: Metrics,
    pub render: Mutex<RenderStatus>,
    pub statuses: RwLock<HashMap<String, StoredStatus>>,
    pub store: Store,
    pub settings: Settings,
    /// Wakes the follower: a webhook, a file-system event.
    pub look_now: Arc<Notify>,
}

impl Shared {
    pub fn render_status(&self) -> RenderStatus {
        self.render
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn update_render_status(&self, update: impl FnOnce(&mut RenderStatus)) {
        update(&mut self.render.lock().unwrap_or_else(|e| e.into_inner()));
    }

    pub fn fleet_summary(&self) -> FleetSummary {
        let served = self.served.load();
        let statuses = self.statuses.read().unwrap_or_else(|e| e.into_inner());
        summarize(
            served.clusters.values().map(|c| Desired {
                name: &c.name,
                digest: &c.digest,
                revision: &c.revision,
            }),
            &statuses,
            &self.render_status(),
            self.settings.clock.now_ms(),
            self.settings.offline_after,
        )
    }

    pub fn is_shutting_down(&self) -> bool {
        *self.shutdown.borrow()
    }

    fn swap(&self, served: Served) {
        self.served.store(Arc::new(served));
        self.generation.send_modify(|g| *g += 1);
    }

    /// Loads what the store holds, so the hub serves at once after a restart with the
    /// same digests, revisions and so ETags. Clusters whose object is missing are left
    /// out (the next render writes them again).
    pub async fn load_from_store(&self) -> Result<usize, HubError> {
        let clusters = self.store.clusters().await?;
        let mut served = Served::default();
        for cluster in clusters {
            if !self.store.objects.contains(&cluster.digest) {
                tracing::warn!(
                    cluster = %cluster.name,
                    digest = %cluster.digest,
                    "the store has no object for this cluster's digest; it is served again after the next render"
                );
                continue;
            }
            served.clusters.insert(
                cluster.name.clone(),
                Arc::new(ClusterBundle::new(
                    cluster.name,
                    cluster.digest,
                    cluster.revision,
                )),
            );
        }
        let count = served.clusters.len();
        // Temporary files of a crashed earlier run; nothing else writes objects yet.
        self.store.objects.clean_temporaries();
        let revision = self.store.revision().await?;
        let statuses = self.store.statuses().await?;
        *self.statuses.write().unwrap_or_else(|e| e.into_inner()) = statuses
            .into_iter()
            .map(|s| (s.cluster.clone(), s))
            .collect();
        self.update_render_status(|r| r.served_revision = revision);
        self.swap(served);
        Ok(count)
    }

    /// Reads every served object back and deletes any that no longer hashes to its
    /// digest, so the next render writes it again (until then its cluster answers 500,
    /// never the damaged bytes). Runs before the follower starts.
    pub async fn verify_objects(&self) {
        let digests: Vec<Digest> = self
            .served
            .load()
            .clusters
            .values()
            .map(|c| c.digest.clone())
            .collect();
        let objects = self.store.objects.clone();
        let checked = tokio::task::spawn_blocking(move || {
            for digest in digests {
                if let Err(err @ ObjectError::Corrupt { .. }) = objects.read(&digest) {
                    tracing::error!("{err}");
                    let _ = objects.remove(&digest);
                }
            }
        });
        if let Err(err) = checked.await {
            tracing::warn!("could not check the stored objects: {err}");
        }
    }

    /// Records a render attempt that had errors: nothing served changes.
    pub fn record_failed_render(&self, output: &RenderOutput, duration: Duration) {
        let errors: Vec<_> = output.errors().cloned().collect();
        for error in &errors {
            tracing::error!(revision = %output.revision, "render error: {error}");
        }
        tracing::error!(
            revision = %output.revision,
            errors = errors.len(),
            "the commit does not render; the last good bundles stay served"
        );
        let now = self.settings.clock.now_ms();
        self.update_render_status(|r| {
            r.attempted_revision = Some(output.revision.clone());
            r.attempted_at_ms = Some(now);
            r.duration = Some(duration);
            r.errors = errors;
            r.warnings = output.warnings().count();
            r.renders_failed += 1;
        });
    }

    /// Installs a clean render: writes the objects of changed bundles, records the
    /// new digests in one transaction, then swaps what is served. Clusters whose digest
    /// did not change keep their entry (and its revision), so their ETag and bytes stay
    /// the same.
    pub async fn install(
        &self,
        output: RenderOutput,
        duration: Duration,
    ) -> Result<InstallReport, HubError> {
        debug_assert!(output.is_clean());
        let started = Instant::now();
        let current = self.served.load_full();
        let changed: Vec<&flotilla_core::bundle::Bundle> = output
            .bundles
            .values()
            .filter(|b| {
                current
                    .clusters
                    .get(&b.cluster)
                    .is_none_or(|c| c.digest != b.digest)
            })
            .collect();
        let removed: Vec<String> = current
            .clusters
            .keys()
            .filter(|name| !output.bundles.contains_key(*name))
            .cloned()
            .collect();

        // One object per distinct digest, assembled and written off the async threads.
        // Unchanged bundles whose object went missing (deleted, or found corrupt at
        // start) are written again too.
        let objects_to_write: Vec<(Digest, Arc<flotilla_core::bundle::Bundle>)> = {
            let mut seen = std::collections::BTreeSet::new();
            let missing = output.bundles.values().filter(|b| {
                current
                    .clusters
                    .get(&b.cluster)
                    .is_some_and(|c| c.digest == b.digest)
                    && !self.store.objects.contains(&b.digest)
            });
            changed
                .iter()
                .copied()
                .chain(missing)
                .filter(|b| seen.insert(b.digest.clone()))
                .map(|b| (b.digest.clone(), Arc::new((*b).clone())))
                .collect()
        };
        let store_objects = self.store.objects.clone();
        let writing = tokio::task::spawn_blocking(move || {
            let objects: BTreeMap<&Digest, Vec<u8>> = objects_to_write
                .iter()
                .map(|(digest, bundle)| (digest, bundle.canonical_resources()))
                .collect();
            let pairs: Vec<(&Digest, &[u8])> =
                objects.iter().map(|(d, b)| (*d, b.as_slice())).collect();
            store_objects.write_all(&pairs)
        });
        // While the objects are written: a digest this cluster had before keeps the
        // revision it had then, so one ETag always stands for the same bytes.
        let revisions = async {
            let mut entries = Vec::with_capacity(changed.len());
            for bundle in &changed {
                let revision = self
                    .store
                    .revision_in_history(&bundle.cluster, &bundle.digest)
                    .await?
                    .unwrap_or_else(|| output.revision.clone());
                entries.push(StoredCluster {
                    name: bundle.cluster.clone(),
                    digest: bundle.digest.clone(),
                    revision,
                });
            }
            Ok::<_, HubError>(entries)
        };
        let (written, entries) = tokio::join!(writing, revisions);
        let written = written.map_err(|e| HubError::Task(e.to_string()))??;
        let entries = entries?;
        self.metrics.objects_written(written as u64);

        let now = self.settings.clock.now_ms();
        let unreferenced = self
            .store
            .commit_render(&RenderCommit {
                revision: output.revision.clone(),
                changed: entries.clone(),
                removed: removed.clone(),
                history: self.settings.history,
                now_ms: now,
            })
            .await?;

        let mut next = Served {
            clusters: current.clusters.clone(),
        };
        for name in &removed {
            next.clusters.remove(name);
        }
        for entry in entries {
            next.clusters.insert(
                entry.name.clone(),
                Arc::new(ClusterBundle::new(entry.name, entry.digest, entry.revision)),
            );
        }
        if !changed.is_empty() || !removed.is_empty() {
            self.swap(next);
        }
        if !removed.is_empty() {
            let mut statuses = self.statuses.write().unwrap_or_else(|e| e.into_inner());
            for name in &removed {
                statuses.remove(name);
            }
        }
        for digest in &unreferenced {
            if let Err(err) = self.store.objects.remove(digest) {
                tracing::warn!(%digest, "cannot delete an object no bundle uses: {err}");
            }
        }
        let report = InstallReport {
            revision: output.revision.clone(),
            clusters: output.bundles.len(),
            changed: changed.len(),
            removed: removed.len(),
            objects_written: written,
            render_duration: duration,
            install_duration: started.elapsed(),
        };
        self.update_render_status(|r| {
            r.served_revision = Some(output.revision.clone());
            r.attempted_revision = Some(output.revision.clone());
            r.attempted_at_ms = Some(now);
            r.duration = Some(duration);
            r.errors.clear();
            r.warnings = output.warnings().count();
            r.renders_clean += 1;
        });
        Ok(report)
    }
}

/// What one install did, for the log.
#[derive(Debug)]
pub struct InstallReport {
    pub revision: String,
    pub clusters: usize,
    pub changed: usize,
    pub removed: usize,
    pub objects_written: usize,
    pub render_duration: Duration,
    pub install_duration: Duration,
}
