//! What the hub serves, held in memory: one immutable [`Served`] snapshot of every
//! cluster's current bundle, swapped atomically after each clean render. Requests
//! read it without locks; long-polls wait on a generation counter that every swap
//! bumps.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use bytes::Bytes;
use http::HeaderValue;
use tokio::sync::{Notify, watch};

use super::HubError;
use super::auth::{AuthError, Grant, TokenTable};
use super::clock::Clock;
use super::fleet::{
    Counts, Desired, FleetSummary, Line, NO_LABELS, RenderStatus, lines, summarize,
};
use super::metrics::Metrics;
use super::rollouts::Engine;
use crate::store::{ObjectError, Store, StoredStatus};
use flotilla_core::bundle::{Digest, signed_document_bytes};
use flotilla_core::signing::{BundleSignature, SigningKey};
use flotilla_render::RenderOutput;

/// When a cluster was last heard from, updated without locks on the request path: a
/// status report or an authenticated poll of its bundle marks it seen; a poll that
/// ends with the agent holding the served digest (a 200, or a 304 for that digest)
/// marks it fetched. Times are milliseconds on the hub's clock; 0 means never.
#[derive(Debug, Default)]
pub struct Pulse {
    seen: AtomicI64,
    fetched: AtomicI64,
}

impl Pulse {
    pub fn see(&self, now_ms: i64) {
        self.seen.fetch_max(now_ms, Ordering::Relaxed);
    }

    pub fn fetch(&self, now_ms: i64) {
        self.see(now_ms);
        self.fetched.fetch_max(now_ms, Ordering::Relaxed);
    }

    pub fn seen(&self) -> Option<i64> {
        Some(self.seen.load(Ordering::Relaxed)).filter(|&at| at > 0)
    }

    pub fn fetched(&self) -> Option<i64> {
        Some(self.fetched.load(Ordering::Relaxed)).filter(|&at| at > 0)
    }
}

pub use flotilla_core::rollout::render::Latest;

/// What the last clean render gives each cluster, as the store records it.
pub(crate) fn latest_of(
    rendered: Vec<crate::store::RenderedCluster>,
) -> HashMap<String, Arc<Latest>> {
    rendered
        .into_iter()
        .map(|r| {
            (
                r.cluster,
                Arc::new(Latest {
                    digest: r.digest,
                    revision: r.revision,
                    policy: r.policy,
                    wave: r.wave,
                    paused: r.paused,
                }),
            )
        })
        .collect()
}

/// Where the last clean render places a cluster in the fleet: its groups and labels.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Placement {
    pub groups: Vec<String>,
    pub labels: BTreeMap<String, String>,
}

impl Placement {
    /// Every cluster's placement in a render.
    pub fn of_render(output: &RenderOutput) -> HashMap<String, Placement> {
        let mut placement: HashMap<String, Placement> = output
            .memberships
            .iter()
            .map(|(cluster, groups)| {
                (
                    cluster.clone(),
                    Placement {
                        groups: groups.clone(),
                        labels: BTreeMap::new(),
                    },
                )
            })
            .collect();
        for (cluster, labels) in &output.labels {
            placement.entry(cluster.clone()).or_default().labels = labels.clone();
        }
        placement
    }
}

/// A served cluster as the fleet summary needs it.
fn desired<'a>(
    entry: &'a ClusterBundle,
    latest: Option<&'a Arc<Latest>>,
    placement: Option<&'a Placement>,
) -> Desired<'a> {
    Desired {
        seen_ms: entry.pulse.seen(),
        served_since_ms: entry.served_since_ms,
        ..stored_desired(
            &entry.name,
            &entry.digest,
            &entry.revision,
            entry.hold,
            latest,
            placement,
        )
    }
}

/// What is served to a cluster and what HEAD renders for it, as the fleet summary
/// needs them (not yet when it was seen and served).
fn stored_desired<'a>(
    name: &'a str,
    digest: &'a Digest,
    revision: &'a str,
    hold: bool,
    latest: Option<&'a Arc<Latest>>,
    placement: Option<&'a Placement>,
) -> Desired<'a> {
    Desired {
        name,
        digest,
        revision,
        hold,
        seen_ms: None,
        served_since_ms: None,
        latest: latest.map(|l| &l.digest),
        policy: latest.and_then(|l| l.policy.as_deref()),
        wave: latest.and_then(|l| l.wave.as_deref()),
        paused: latest.is_some_and(|l| l.paused),
        groups: placement.map_or(&[][..], |p| p.groups.as_slice()),
        labels: placement.map_or(&NO_LABELS, |p| &p.labels),
    }
}

/// The fleet summary of `GET /v1/fleet` read straight from the store, with no hub in
/// between (`flotilla status --database`): what each cluster is served, what HEAD
/// renders for it, its agent's last report and when it was last seen (as the hubs
/// last wrote it: they write polls every 30 s), judged on the database's clock. The
/// store records neither the fleet's groups and labels nor the last render's errors
/// (a hub keeps them in memory): they are left empty.
pub async fn fleet_summary_from_store(
    store: &Store,
    offline_after: Duration,
) -> Result<FleetSummary, crate::StoreError> {
    let clusters = store.clusters().await?;
    let since = store.served_since().await?;
    let latest = latest_of(store.rendered().await?);
    let seen: HashMap<String, i64> = store.seen().await?.into_iter().collect();
    let statuses = store.statuses_by_cluster().await?;
    let render = RenderStatus {
        served_revision: store.revision().await?,
        ..RenderStatus::default()
    };
    let now = store.database_now_ms().await?;
    let desired = clusters.iter().map(|c| Desired {
        seen_ms: seen.get(&c.name).copied(),
        served_since_ms: since.get(&c.name).copied(),
        ..stored_desired(
            &c.name,
            &c.digest,
            &c.revision,
            c.hold,
            latest.get(&c.name),
            None,
        )
    });
    Ok(summarize(desired, &statuses, &render, now, offline_after))
}

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
    /// A cluster new to the hub whose wave is not released: a poll naming any digest
    /// (the one the agent runs) is answered 304, so it keeps what it runs; a fresh
    /// agent gets `digest`.
    pub hold: bool,
    /// When the cluster was last seen and last fetched what it is served.
    pub pulse: Arc<Pulse>,
    /// The cluster's serve sequence for this entry (signed with the document). An entry
    /// is made for each change of what the cluster is served and never changes, so the
    /// document and its compressed forms below, signature included, are made once.
    pub sequence: u64,
    /// When what the cluster is served last changed (the store's record of this
    /// change), so a cluster that has not applied it is pending since then.
    pub served_since_ms: Option<i64>,
    signature: OnceLock<BundleSignature>,
    /// The canonical resources, kept once read when the objects are in a remote store
    /// (from disk they are read again through the page cache).
    canonical: OnceLock<Bytes>,
    gzip: OnceLock<Bytes>,
    zstd: OnceLock<Bytes>,
}

impl ClusterBundle {
    pub fn new(name: String, digest: Digest, revision: String) -> ClusterBundle {
        ClusterBundle::serving(name, digest, revision, false, Arc::default(), 0, None)
    }

    pub fn serving(
        name: String,
        digest: Digest,
        revision: String,
        hold: bool,
        pulse: Arc<Pulse>,
        sequence: u64,
        served_since_ms: Option<i64>,
    ) -> ClusterBundle {
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
            hold,
            pulse,
            sequence,
            served_since_ms,
            signature: OnceLock::new(),
            canonical: OnceLock::new(),
            gzip: OnceLock::new(),
            zstd: OnceLock::new(),
        }
    }

    /// The served document, read from the store and checked against its digest, and
    /// signed with the hub's key when it has one. Call it on a blocking thread
    /// (`spawn_blocking`): it reads a file or waits for the object store.
    pub fn document(
        &self,
        store: &Store,
        signer: Option<&SigningKey>,
    ) -> Result<Vec<u8>, ObjectError> {
        let canonical = match self.canonical.get() {
            Some(bytes) => bytes.clone(),
            None => {
                let bytes = store.objects.read_blocking(&self.digest)?;
                if !store.objects.is_local() {
                    let _ = self.canonical.set(bytes.clone());
                }
                bytes
            }
        };
        let signature = signer.map(|key| {
            self.signature
                .get_or_init(|| key.sign(&self.name, &self.digest, &self.revision, self.sequence))
        });
        Ok(signed_document_bytes(
            &self.name,
            &self.digest,
            &self.revision,
            &canonical,
            signature,
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

/// What every cluster is served now.
#[derive(Debug, Default)]
pub struct Served {
    pub clusters: HashMap<String, Arc<ClusterBundle>>,
}

impl flotilla_core::rollout::render::ServedState for Served {
    fn served(&self, cluster: &str) -> Option<flotilla_core::rollout::render::ServedRef<'_>> {
        self.clusters
            .get(cluster)
            .map(|c| flotilla_core::rollout::render::ServedRef {
                digest: &c.digest,
                revision: &c.revision,
                hold: c.hold,
            })
    }

    fn served_names(&self) -> Box<dyn Iterator<Item = &str> + '_> {
        Box::new(self.clusters.keys().map(String::as_str))
    }
}

/// Settings the request handlers need.
pub struct Settings {
    pub offline_after: Duration,
    pub max_wait: Duration,
    pub history: usize,
    pub webhook_secret: Option<Vec<u8>>,
    pub clock: Arc<dyn Clock>,
    /// Signs every served document (`serve --signing-key`).
    pub signing_key: Option<Arc<SigningKey>>,
    /// Several hubs: how long an object stays unreferenced before it is deleted.
    pub gc_grace: Duration,
    /// Several hubs: the lease's length (also how long a hub counts as live after its
    /// last heartbeat) and how often the database is looked at.
    pub peers: crate::peers::PeerTiming,
    /// Several hubs: `clock`, as the database's clock, sampled at every heartbeat.
    pub database_clock: Option<Arc<crate::clock::DatabaseClock>>,
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
    /// What the last clean render gives each cluster.
    pub latest: ArcSwap<HashMap<String, Arc<Latest>>>,
    /// The fleet groups and labels of each cluster, from the last clean render (for
    /// the fleet summary, `flotilla status --group` and the web page).
    pub placement: ArcSwap<HashMap<String, Placement>>,
    /// Per cluster, when it was last seen and fetched (kept across swaps of `served`).
    pub pulses: Mutex<HashMap<String, Arc<Pulse>>>,
    /// The rollouts: their state, decisions and timer.
    pub rollouts: Engine,
    /// Whether this hub records renders and decides rollouts (several hubs).
    pub lease: crate::peers::Lease,
    /// When the store was last asked for tokens because a request brought an
    /// unknown one (see [`Shared::grant`]).
    pub token_recheck: tokio::sync::Mutex<Option<tokio::time::Instant>>,
    /// How many documents are read and compressed at once for a first answer (see
    /// [`Shared::answer_permits`]): after a commit that changes every cluster, 10,000
    /// woken long-polls each make one.
    pub answering: tokio::sync::Semaphore,
}

/// The shortest time between two looks into the store for an unknown token.
const TOKEN_RECHECK: Duration = Duration::from_millis(250);
/// How many bundles' objects are made and written at a time after a render.
const OBJECTS_PER_BATCH: usize = 512;

impl Shared {
    /// How many first answers are made at once: one per core with objects in a
    /// folder (reading one is a page-cache copy; compressing it is the work), 16 with
    /// a remote object store (most of a read is waiting). Unbounded, 10,000 woken
    /// long-polls took up to the runtime's 512 blocking threads, each with a
    /// compressor's buffers of its own, on two cores.
    pub fn answer_permits(store: &Store) -> usize {
        if store.objects.is_local() {
            std::thread::available_parallelism().map_or(2, |n| n.get())
        } else {
            16
        }
    }

    /// What a request's token grants. A token the table does not know may have been
    /// made a moment ago by `flotilla token create`: the store is asked again before
    /// the token is refused (at most every 250 ms, however many unknown tokens
    /// arrive), so a new token works at once, not only after the next refresh.
    pub async fn grant(&self, header: Option<&HeaderValue>) -> Result<Grant, AuthError> {
        self.grant_with_id(header).await.map(|(grant, _)| grant)
    }

    /// [`Shared::grant`], with the token's id (recorded with operator actions).
    pub async fn grant_with_id(
        &self,
        header: Option<&HeaderValue>,
    ) -> Result<(Grant, String), AuthError> {
        fn owned((grant, id): (&Grant, &str)) -> (Grant, String) {
            (grant.clone(), id.to_string())
        }
        match self.tokens.load().check_with_id(header) {
            Err(AuthError::Unknown) => {}
            known => return known.map(owned),
        }
        {
            let mut last = self.token_recheck.lock().await;
            if last.is_none_or(|at| at.elapsed() >= TOKEN_RECHECK) {
                *last = Some(tokio::time::Instant::now());
                match self.store.tokens().await {
                    Ok(tokens) => self
                        .tokens
                        .store(Arc::new(TokenTable::from_stored(&tokens))),
                    Err(err) => tracing::warn!("cannot look for new tokens: {err}"),
                }
            }
        }
        self.tokens.load().check_with_id(header).map(owned)
    }

    /// Reads what the last clean render gives each cluster back from the store.
    pub async fn load_latest(&self) -> Result<(), crate::StoreError> {
        let latest = latest_of(self.store.rendered().await?);
        self.latest.store(Arc::new(latest));
        Ok(())
    }

    pub fn render_status(&self) -> RenderStatus {
        self.render
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn update_render_status(&self, update: impl FnOnce(&mut RenderStatus)) {
        update(&mut self.render.lock().unwrap_or_else(|e| e.into_inner()));
    }

    /// Calls `f` with every served cluster's line of the fleet (see [`Line`]) and the
    /// time they were judged at, borrowed from what the hub holds: nothing is copied.
    /// The agents' reports are read-locked meanwhile, so `f` must be short: pick what
    /// to show, copy that, and let go.
    pub fn with_fleet<R>(&self, f: impl FnOnce(&[Line<'_>], i64) -> R) -> R {
        let served = self.served.load();
        let latest = self.latest.load();
        let placement = self.placement.load();
        let statuses = self.statuses.read().unwrap_or_else(|e| e.into_inner());
        let now = self.settings.clock.now_ms();
        let lines = lines(
            served
                .clusters
                .values()
                .map(|c| desired(c, latest.get(&c.name), placement.get(&c.name))),
            &statuses,
            now,
            self.settings.offline_after,
        );
        f(&lines, now)
    }

    /// The whole fleet summary of `GET /v1/fleet`.
    pub fn fleet_summary(&self) -> FleetSummary {
        let render = self.render_status();
        self.with_fleet(|lines, now| FleetSummary::of(lines, &render, now))
    }

    /// How many clusters are in each state.
    pub fn fleet_counts(&self) -> Counts {
        self.with_fleet(|lines, _| Counts::of(lines))
    }

    /// One cluster's line of the fleet summary.
    pub fn fleet_summary_of(&self, cluster: &str) -> Option<super::fleet::ClusterSummary> {
        let served = self.served.load();
        let entry = served.clusters.get(cluster)?;
        let latest = self.latest.load();
        let placement = self.placement.load();
        let statuses = self.statuses.read().unwrap_or_else(|e| e.into_inner());
        let now = self.settings.clock.now_ms();
        let line = Line::new(
            desired(entry, latest.get(cluster), placement.get(cluster)),
            statuses.get(cluster),
            now,
            self.settings.offline_after,
        );
        Some(line.summary(now))
    }

    pub fn is_shutting_down(&self) -> bool {
        *self.shutdown.borrow()
    }

    pub(crate) fn swap(&self, served: Served) {
        self.served.store(Arc::new(served));
        self.generation.send_modify(|g| *g += 1);
    }

    /// The pulse of a cluster, made on first use and kept for as long as the hub runs.
    /// What is served to a cluster the store records (at start, or read back from a
    /// store several hubs share), `since` when it was first served.
    pub(crate) fn serve_stored(
        &self,
        cluster: crate::store::StoredCluster,
        since: Option<i64>,
    ) -> Arc<ClusterBundle> {
        let pulse = self.pulse(&cluster.name);
        Arc::new(ClusterBundle::serving(
            cluster.name,
            cluster.digest,
            cluster.revision,
            cluster.hold,
            pulse,
            cluster.sequence,
            since,
        ))
    }

    pub fn pulse(&self, cluster: &str) -> Arc<Pulse> {
        let mut pulses = self.pulses.lock().unwrap_or_else(|e| e.into_inner());
        pulses.entry(cluster.to_string()).or_default().clone()
    }

    /// Loads what the store holds, so the hub serves at once after a restart with the
    /// same digests, revisions and so ETags, and its rollouts go on where they were.
    /// Clusters whose object is missing are left out (the next render writes them
    /// again).
    pub async fn load_from_store(&self) -> Result<usize, HubError> {
        for (cluster, seen) in self.store.seen().await? {
            self.pulse(&cluster).see(seen);
        }
        let statuses = self.store.statuses().await?;
        for status in &statuses {
            self.pulse(&status.cluster).see(status.received_at_ms);
        }
        let clusters = self.store.clusters().await?;
        let since = self.store.served_since().await?;
        let mut served = Served::default();
        for cluster in clusters {
            // On disk a missing object is cheap to see; in a remote store the digests
            // the database records are there (only unreferenced ones are deleted), and
            // asking for each would be one request per cluster at every start.
            if self.store.objects.known_missing(&cluster.digest) {
                tracing::warn!(
                    cluster = %cluster.name,
                    digest = %cluster.digest,
                    "the store has no object for this cluster's digest; it is served again after the next render"
                );
                continue;
            }
            let since = since.get(&cluster.name).copied();
            served
                .clusters
                .insert(cluster.name.clone(), self.serve_stored(cluster, since));
        }
        let count = served.clusters.len();
        // Temporary files of a crashed earlier run; nothing else writes objects yet.
        self.store.objects.clean_temporaries();
        let revision = self.store.revision().await?;
        *self.statuses.write().unwrap_or_else(|e| e.into_inner()) = statuses
            .into_iter()
            .map(|s| (s.cluster.clone(), s))
            .collect();
        self.load_latest().await?;
        self.update_render_status(|r| r.served_revision = revision);
        self.swap(served);
        self.load_rollouts().await?;
        Ok(count)
    }

    /// Reads every served object back and deletes any that no longer hashes to its
    /// digest, so the next render writes it again (until then its cluster answers 500,
    /// never the damaged bytes). Runs before the follower starts. Objects in a remote
    /// store are checked as they are read instead (one request per cluster at every
    /// start would be too many).
    pub async fn verify_objects(&self) {
        if !self.store.objects.is_local() {
            return;
        }
        let digests: Vec<Digest> = self
            .served
            .load()
            .clusters
            .values()
            .map(|c| c.digest.clone())
            .collect();
        for digest in digests {
            if let Err(err @ ObjectError::Corrupt { .. }) = self.store.objects.read(&digest).await {
                tracing::error!("{err}");
                let _ = self.store.objects.remove(&digest).await;
            }
        }
    }

    /// Deletes objects the store does not refer to (see
    /// [`Store::referenced_digests`]). Only the follower writes new objects of renders
    /// this hub records, and it calls this between renders, so no object of a render
    /// being installed is taken. Returns how many objects were deleted.
    ///
    /// Alone on its database, a hub deletes every unreferenced object at once (those a
    /// crash left between writing a render's objects and recording it). With several
    /// hubs only the rollout lease's holder collects, and only objects unreferenced
    /// for at least [`Settings::gc_grace`] on the database's clock: another hub may
    /// have written an object for a render the holder records a moment later.
    pub async fn collect_garbage(&self) -> usize {
        let shared = self.lease.is_shared();
        if shared && !self.lease.holds() {
            return 0;
        }
        let objects = &self.store.objects;
        let unreferenced = match self.unreferenced_objects().await {
            Ok(unreferenced) => unreferenced,
            Err(err) => {
                tracing::warn!("cannot collect unused objects: {err}");
                return 0;
            }
        };
        let due: Vec<Digest> = if shared {
            let grace = i64::try_from(self.settings.gc_grace.as_millis()).unwrap_or(i64::MAX);
            let due = match self.store.mark_unreferenced(&unreferenced, grace).await {
                Ok(due) => due,
                Err(err) => {
                    tracing::warn!("cannot collect unused objects: {err}");
                    return 0;
                }
            };
            // Asked again just before deleting: a rollout step may have named one of
            // them since the listing.
            match self.store.referenced_digests().await {
                Ok(referenced) => due
                    .into_iter()
                    .filter(|d| !referenced.contains(d))
                    .collect(),
                Err(err) => {
                    tracing::warn!("cannot collect unused objects: {err}");
                    return 0;
                }
            }
        } else {
            unreferenced.into_iter().collect()
        };
        let mut deleted = Vec::new();
        for digest in due {
            if shared && !self.lease.holds() {
                break;
            }
            match objects.remove(&digest).await {
                Ok(()) => deleted.push(digest),
                Err(err) => tracing::warn!(%digest, "cannot delete an unused object: {err}"),
            }
        }
        if shared && let Err(err) = self.store.forget_unreferenced(&deleted).await {
            tracing::warn!("cannot record the deleted objects: {err}");
        }
        if !deleted.is_empty() {
            tracing::info!(
                objects = deleted.len(),
                "deleted objects no cluster refers to"
            );
        }
        deleted.len()
    }

    /// The stored objects nothing in the database refers to.
    async fn unreferenced_objects(&self) -> Result<std::collections::BTreeSet<Digest>, HubError> {
        let referenced = self.store.referenced_digests().await?;
        Ok(self
            .store
            .objects
            .list()
            .await?
            .into_iter()
            .filter(|d| !referenced.contains(d))
            .collect())
    }

    /// Writes the objects of a render this hub does not record (several hubs), so it
    /// can serve them when the database says so.
    pub async fn install_objects_only(&self, output: &RenderOutput) -> Result<(), HubError> {
        let written = self.write_objects(output).await?;
        self.metrics.objects_written(written as u64);
        Ok(())
    }

    /// Writes the objects of a render's new digests, off the async threads. Digests a
    /// cluster is served or was last rendered with are there already (referenced
    /// objects are never deleted), unless a file went missing on disk (deleted, or
    /// found corrupt at start): those are written again. New digests are written when
    /// absent (in S3, one HEAD each first).
    async fn write_objects(&self, output: &RenderOutput) -> Result<usize, HubError> {
        self.store.objects.forget_recent();
        let current = self.served.load_full();
        let latest = self.latest.load_full();
        let objects_to_write: Vec<(Digest, Arc<flotilla_core::bundle::Bundle>)> = {
            let mut seen = std::collections::BTreeSet::new();
            output
                .bundles
                .values()
                .filter(|b| {
                    let known = latest.get(&b.cluster).is_some_and(|l| l.digest == b.digest)
                        || current
                            .clusters
                            .get(&b.cluster)
                            .is_some_and(|c| c.digest == b.digest);
                    !known || self.store.objects.known_missing(&b.digest)
                })
                .filter(|b| seen.insert(b.digest.clone()))
                .map(|b| (b.digest.clone(), Arc::new(b.clone())))
                .collect()
        };
        if objects_to_write.is_empty() {
            return Ok(0);
        }
        // A batch at a time: the bytes of 10,000 bundles of per-cluster templates are
        // hundreds of megabytes, and need not all be held at once.
        let mut written = 0;
        let mut pending = objects_to_write.into_iter().peekable();
        while pending.peek().is_some() {
            let batch: Vec<_> = pending.by_ref().take(OBJECTS_PER_BATCH).collect();
            let bytes = tokio::task::spawn_blocking(move || {
                batch
                    .iter()
                    .map(|(digest, bundle)| (digest.clone(), bundle.canonical_resources()))
                    .collect::<Vec<_>>()
            })
            .await
            .map_err(|e| HubError::Task(e.to_string()))?;
            written += self.store.objects.write_all(bytes).await?;
        }
        Ok(written)
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

    /// Installs a clean render: writes the objects of new digests, then records what
    /// HEAD renders and what changes for whom in one transaction (ungoverned and new
    /// clusters at once; governed ones through a rollout of their policy), then swaps
    /// what is served. A cluster whose served digest does not change keeps its entry
    /// (and its revision), so its ETag and bytes stay the same.
    pub async fn install(
        &self,
        output: &RenderOutput,
        duration: Duration,
        forced: bool,
        expect_revision: Option<Option<String>>,
    ) -> Result<InstallReport, HubError> {
        debug_assert!(output.is_clean());
        let started = Instant::now();
        let written = self.write_objects(output).await?;
        self.metrics.objects_written(written as u64);
        let objects_duration = started.elapsed();

        let now = self.settings.clock.now_ms();
        let recording = Instant::now();
        let outcome = self
            .record_render(output, forced, now, expect_revision)
            .await?;
        let record_duration = outcome
            .swapped_at
            .map(|at| at.saturating_duration_since(recording));
        if self.lease.is_shared() && !self.lease.holds() {
            // Another hub records renders: serve what it recorded, now that this
            // hub has the objects too.
            self.sync_from_store().await?;
        }
        self.placement.store(Arc::new(Placement::of_render(output)));
        let report = InstallReport {
            revision: output.revision.clone(),
            clusters: output.bundles.len(),
            changed: outcome.served_changes,
            removed: outcome.removed,
            rollouts_started: outcome.rollouts_started,
            objects_written: written,
            objects_duration,
            record_duration,
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
    /// Clusters whose served digest changed at once (ungoverned, new, first waves).
    pub changed: usize,
    pub removed: usize,
    pub rollouts_started: usize,
    pub objects_written: usize,
    /// Of the install, the time spent writing objects (the rest records the render
    /// and what is served in the database).
    pub objects_duration: Duration,
    /// From the objects being written to what is served being swapped (the render
    /// recorded in the database); `None` when this hub did not record it.
    pub record_duration: Option<Duration>,
    pub render_duration: Duration,
    pub install_duration: Duration,
}
