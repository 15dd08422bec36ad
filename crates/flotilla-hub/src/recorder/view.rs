//! What the hub holds in memory, as the request handlers read it ([`View`]): one
//! immutable [`Served`] snapshot of every cluster's current bundle, swapped
//! atomically after each change and read without locks; a generation counter that
//! every swap bumps, which long-polls wait on; the tokens, the latest render, the
//! reports and the active rollouts.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::Duration;

use arc_swap::ArcSwap;
use bytes::Bytes;
use http::HeaderValue;
use tokio::sync::watch;

use super::lease::PeerTiming;
use super::workloads::{RenderedWorkloads, WorkloadList};
use crate::auth::TokenTable;
use crate::clock::Clock;
use crate::fleet::{
    Counts, Desired, FleetSummary, Line, NO_LABELS, RenderStatus, lines, summarize,
};
use crate::store::{ObjectError, Store, StoredStatus};
use flotilla_core::bundle::Digest;
use flotilla_core::rollout::view::RolloutView;
use flotilla_core::signing::signed_document_bytes;
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
    /// The bundle features (a bit set, `flotilla_core::bundle::features::bits`) the
    /// cluster's served bundle needs and its agent did not name at its last poll.
    lacking: AtomicU8,
}

impl Pulse {
    pub(in crate::recorder) fn lack(&self, features: u8) {
        self.lacking.store(features, Ordering::Relaxed);
    }

    /// The features the cluster's agent lacks for the bundle it is served, as of its
    /// last poll: it keeps what it runs until it is upgraded.
    pub fn lacking(&self) -> Vec<&'static str> {
        flotilla_core::bundle::features::names(self.lacking_bits())
    }

    /// [`Pulse::lacking`] as a bit set (`flotilla_core::bundle::features::bits`).
    pub fn lacking_bits(&self) -> u8 {
        self.lacking.load(Ordering::Relaxed)
    }

    pub(in crate::recorder) fn see(&self, now_ms: i64) {
        self.seen.fetch_max(now_ms, Ordering::Relaxed);
    }

    pub(in crate::recorder) fn fetch(&self, now_ms: i64) {
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
pub(in crate::recorder) fn latest_of(
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
pub struct Membership {
    pub groups: Vec<String>,
    pub labels: BTreeMap<String, String>,
}

impl Membership {
    /// Every cluster's membership in a render.
    pub fn of_render(output: &RenderOutput) -> HashMap<String, Membership> {
        let mut membership: HashMap<String, Membership> = output
            .memberships
            .iter()
            .map(|(cluster, groups)| {
                (
                    cluster.clone(),
                    Membership {
                        groups: groups.clone(),
                        labels: BTreeMap::new(),
                    },
                )
            })
            .collect();
        for (cluster, labels) in &output.labels {
            membership.entry(cluster.clone()).or_default().labels = labels.clone();
        }
        membership
    }
}

/// A served cluster as the fleet summary needs it.
fn desired<'a>(
    entry: &'a ClusterBundle,
    latest: Option<&'a Arc<Latest>>,
    membership: Option<&'a Membership>,
) -> Desired<'a> {
    Desired {
        seen_ms: entry.pulse.seen(),
        served_since_ms: entry.served_since_ms,
        lacking: entry.pulse.lacking_bits(),
        ..stored_desired(
            &entry.name,
            &entry.digest,
            &entry.revision,
            entry.hold,
            latest,
            membership,
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
    membership: Option<&'a Membership>,
) -> Desired<'a> {
    Desired {
        name,
        digest,
        revision,
        hold,
        seen_ms: None,
        served_since_ms: None,
        lacking: 0,
        latest: latest.map(|l| &l.digest),
        policy: latest.and_then(|l| l.policy.as_deref()),
        wave: latest.and_then(|l| l.wave.as_deref()),
        paused: latest.is_some_and(|l| l.paused),
        groups: membership.map_or(&[][..], |p| p.groups.as_slice()),
        labels: membership.map_or(&NO_LABELS, |p| &p.labels),
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
    /// The digest the cluster was served just before this entry, when this hub
    /// recorded the change (the history is trimmed in the same transaction) and that
    /// digest was really served (not a hold): with a history of two or more it is in
    /// the cluster's history, so a delta from it needs no look-up.
    pub replaced: Option<Digest>,
    signature: OnceLock<BundleSignature>,
    /// The bundle features an agent needs to apply it, read from the stored object
    /// the first time an agent that does not name every feature asks.
    needs: OnceLock<Vec<&'static str>>,
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
            replaced: None,
            signature: OnceLock::new(),
            needs: OnceLock::new(),
            canonical: OnceLock::new(),
            gzip: OnceLock::new(),
            zstd: OnceLock::new(),
        }
    }

    /// The entry with the digest it replaces ([`ClusterBundle::replaced`]): `before`'s,
    /// when `before` was really served (not a hold) and differs from this entry's.
    pub fn replacing(self, before: Option<&ClusterBundle>) -> ClusterBundle {
        let replaced = before
            .filter(|before| !before.hold && before.digest != self.digest)
            .map(|before| before.digest.clone());
        ClusterBundle { replaced, ..self }
    }

    /// The bundle features an agent needs to apply it, if they were read already.
    pub fn known_needs(&self) -> Option<&[&'static str]> {
        self.needs.get().map(Vec::as_slice)
    }

    /// The served document, read from the store and checked against its digest, and
    /// signed with the hub's key when it has one. Call it on a blocking thread
    /// (`spawn_blocking`): it reads a file or waits for the object store.
    pub(in crate::recorder) fn document(
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
    /// How long an ended rollout is kept (the latest of each policy, and those of the
    /// recorded revision, always are).
    pub keep_rollouts: Duration,
    /// Several hubs: the lease's length (also how long a hub counts as live after its
    /// last heartbeat) and how often the database is looked at.
    pub peers: PeerTiming,
    /// Several hubs: `clock`, as the database's clock, sampled at every heartbeat.
    pub database_clock: Option<Arc<crate::clock::DatabaseClock>>,
}

/// What the hub holds in memory, as the request handlers read it: what each cluster
/// is served (swapped whole after each change, read without locks), the long-poll
/// generation, the tokens, the latest clean render and where it places each
/// cluster, the agents' reports, when each cluster was last heard from, and the
/// active rollouts as last decided. Handlers only read it; every change is made by
/// the [`Recorder`](super::Recorder), whose writers below are visible to the
/// `recorder` module alone.
pub struct View {
    served: ArcSwap<Served>,
    /// Bumped on every change of what is served; long-polls wait on it.
    generation: watch::Sender<u64>,
    tokens: ArcSwap<TokenTable>,
    ready: AtomicBool,
    render: Mutex<RenderStatus>,
    statuses: RwLock<HashMap<String, StoredStatus>>,
    /// What the last clean render gives each cluster.
    latest: ArcSwap<HashMap<String, Arc<Latest>>>,
    /// The fleet groups and labels of each cluster, from the last clean render (for
    /// the fleet summary, `flotilla status --group` and the web page).
    membership: ArcSwap<HashMap<String, Membership>>,
    /// Per cluster, when it was last seen and fetched (kept across swaps of `served`).
    pulses: Mutex<HashMap<String, Arc<Pulse>>>,
    /// The active rollouts as last decided, for `/metrics`, `/v1/fleet` and the page.
    rollouts: ArcSwap<Vec<RolloutView>>,
    /// Each resource's workload in the bundles this hub rendered that are rendered
    /// or served now, for the web page (a bundle names them only when its agent
    /// needs them).
    workloads: ArcSwap<RenderedWorkloads>,
    superseded: AtomicU64,
    decisions: AtomicU64,
    /// Objects, sessions and history are read through [`View::reads`].
    store: Arc<Store>,
    settings: Arc<Settings>,
}

/// What the handlers may read from the store: served documents, web sessions, a
/// cluster's recent digests and the rollouts' records.
pub struct StoreReads<'a>(&'a Store);

impl StoreReads<'_> {
    /// The document served for an entry, signed with `key` if given.
    pub fn document(
        &self,
        entry: &ClusterBundle,
        key: Option<&SigningKey>,
    ) -> Result<Vec<u8>, ObjectError> {
        entry.document(self.0, key)
    }

    pub async fn session(
        &self,
        id_hash: &str,
        now_ms: i64,
    ) -> Result<Option<crate::store::StoredSession>, crate::StoreError> {
        self.0.session(id_hash, now_ms).await
    }

    /// The revision of an earlier digest of a cluster, if the hub still keeps it.
    pub async fn revision_in_history(
        &self,
        cluster: &str,
        digest: &Digest,
    ) -> Result<Option<String>, crate::StoreError> {
        self.0.revision_in_history(cluster, digest).await
    }

    /// [`StoreReads::revision_in_history`] of many clusters, a few statements in all.
    pub async fn revisions_in_history(
        &self,
        wanted: &[(&str, &Digest)],
    ) -> Result<HashMap<(String, Digest), String>, crate::StoreError> {
        self.0.revisions_in_history(wanted).await
    }

    /// The bundle features an entry's bundle needs, read from its stored object the
    /// first time (call it off the async threads).
    pub fn needs_blocking(&self, entry: &ClusterBundle) -> Result<Vec<&'static str>, ObjectError> {
        if let Some(needs) = entry.needs.get() {
            return Ok(needs.clone());
        }
        let body = self.0.objects.read_blocking(&entry.digest)?;
        let needs = flotilla_core::bundle::features::needed_by_body(&body).unwrap_or_default();
        Ok(entry.needs.get_or_init(|| needs).clone())
    }

    /// A stored object's bytes, read on this thread (call it off the async threads).
    pub fn object_blocking(&self, digest: &Digest) -> Result<Bytes, ObjectError> {
        self.0.objects.read_blocking(digest)
    }

    pub async fn history(&self, cluster: &str) -> Result<Vec<(Digest, String)>, crate::StoreError> {
        self.0.history(cluster).await
    }

    /// The revision the store records as rendered (several hubs: the lease holder's).
    pub async fn revision(&self) -> Result<Option<String>, crate::StoreError> {
        self.0.revision().await
    }

    /// The hubs whose heartbeat is younger than `live_ms`, with their force-push counts.
    pub async fn live_hubs(
        &self,
        live_ms: i64,
    ) -> Result<Vec<crate::store::Sighting>, crate::StoreError> {
        self.0.live_hubs(live_ms).await
    }

    /// The counter every recorded change moves (several hubs poll it).
    pub async fn changes(&self) -> Result<i64, crate::StoreError> {
        self.0.changes().await
    }

    /// The counter every token change moves.
    pub async fn tokens_generation(&self) -> Result<i64, crate::StoreError> {
        self.0.tokens_generation().await
    }

    pub async fn tokens(&self) -> Result<Vec<crate::store::StoredToken>, crate::StoreError> {
        self.0.tokens().await
    }
}

impl View {
    pub(in crate::recorder) fn new(store: Arc<Store>, settings: Arc<Settings>) -> View {
        View {
            served: ArcSwap::default(),
            generation: watch::channel(0).0,
            tokens: ArcSwap::default(),
            ready: AtomicBool::new(false),
            render: Mutex::default(),
            statuses: RwLock::default(),
            latest: ArcSwap::default(),
            membership: ArcSwap::default(),
            pulses: Mutex::default(),
            rollouts: ArcSwap::default(),
            workloads: ArcSwap::default(),
            superseded: AtomicU64::new(0),
            decisions: AtomicU64::new(0),
            store,
            settings,
        }
    }

    /// What every cluster is served now.
    pub fn served(&self) -> Arc<Served> {
        self.served.load_full()
    }

    /// One cluster's served entry.
    pub fn served_to(&self, cluster: &str) -> Option<Arc<ClusterBundle>> {
        self.served.load().clusters.get(cluster).cloned()
    }

    /// A receiver of the generation, which every change of what is served bumps.
    pub fn generations(&self) -> watch::Receiver<u64> {
        self.generation.subscribe()
    }

    pub fn tokens(&self) -> Arc<TokenTable> {
        self.tokens.load_full()
    }

    /// Whether the hub has something to serve (or has tried to render once).
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }

    /// Whether the newest clean render could not be installed (without copying the
    /// render status, for `/readyz`).
    pub fn install_failing(&self) -> bool {
        self.render
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .install_error
            .is_some()
    }

    pub fn render_status(&self) -> RenderStatus {
        self.render
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// What the last clean render gives each cluster.
    pub fn latest(&self) -> Arc<HashMap<String, Arc<Latest>>> {
        self.latest.load_full()
    }

    /// The agents' latest reports, read-locked: let go soon.
    pub fn statuses(&self) -> std::sync::RwLockReadGuard<'_, HashMap<String, StoredStatus>> {
        self.statuses.read().unwrap_or_else(|e| e.into_inner())
    }

    /// The active rollouts, as of the last decision.
    pub fn active_rollouts(&self) -> Arc<Vec<RolloutView>> {
        self.rollouts.load_full()
    }

    /// The workload of each resource of the bundle with this digest, as this hub's
    /// renders said; `None` for a bundle with metadata (it names them itself) or one
    /// no render of this hub made (a digest served before it started).
    pub fn rendered_workloads(&self, digest: &Digest) -> Option<WorkloadList> {
        self.workloads.load().of(digest).cloned()
    }

    /// Rollouts superseded since the hub started.
    pub fn rollouts_superseded(&self) -> u64 {
        self.superseded.load(Ordering::Relaxed)
    }

    /// Rollout decisions taken since the hub started.
    pub fn rollout_decisions(&self) -> u64 {
        self.decisions.load(Ordering::Relaxed)
    }

    pub fn reads(&self) -> StoreReads<'_> {
        StoreReads(&self.store)
    }

    /// Calls `f` with every served cluster's line of the fleet (see [`Line`]) and the
    /// time they were judged at, borrowed from what the hub holds: nothing is copied.
    /// The agents' reports are read-locked meanwhile, so `f` must be short: pick what
    /// to show, copy that, and let go.
    pub fn with_fleet<R>(&self, f: impl FnOnce(&[Line<'_>], i64) -> R) -> R {
        let served = self.served.load();
        let latest = self.latest.load();
        let membership = self.membership.load();
        let statuses = self.statuses();
        let now = self.settings.clock.now_ms();
        let lines = lines(
            served
                .clusters
                .values()
                .map(|c| desired(c, latest.get(&c.name), membership.get(&c.name))),
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
    pub fn fleet_summary_of(&self, cluster: &str) -> Option<super::super::fleet::ClusterSummary> {
        let served = self.served.load();
        let entry = served.clusters.get(cluster)?;
        let latest = self.latest.load();
        let membership = self.membership.load();
        let statuses = self.statuses();
        let now = self.settings.clock.now_ms();
        let line = Line::new(
            desired(entry, latest.get(cluster), membership.get(cluster)),
            statuses.get(cluster),
            now,
            self.settings.offline_after,
        );
        Some(line.summary(now))
    }

    // The writers: the recorder's alone.

    pub(in crate::recorder) fn swap(&self, served: Served) {
        self.served.store(Arc::new(served));
        self.generation.send_modify(|g| *g += 1);
    }

    pub(in crate::recorder) fn set_tokens(&self, tokens: TokenTable) {
        self.tokens.store(Arc::new(tokens));
    }

    pub(in crate::recorder) fn set_ready(&self) {
        self.ready.store(true, Ordering::Relaxed);
    }

    pub(in crate::recorder) fn update_render_status(&self, update: impl FnOnce(&mut RenderStatus)) {
        update(&mut self.render.lock().unwrap_or_else(|e| e.into_inner()));
    }

    pub(in crate::recorder) fn statuses_mut(
        &self,
    ) -> std::sync::RwLockWriteGuard<'_, HashMap<String, StoredStatus>> {
        self.statuses.write().unwrap_or_else(|e| e.into_inner())
    }

    pub(in crate::recorder) fn set_latest(&self, latest: HashMap<String, Arc<Latest>>) {
        self.latest.store(Arc::new(latest));
    }

    pub(in crate::recorder) fn set_membership(&self, membership: HashMap<String, Membership>) {
        self.membership.store(Arc::new(membership));
    }

    /// The pulse of a cluster, made on first use and kept for as long as the hub runs.
    pub(in crate::recorder) fn pulse(&self, cluster: &str) -> Arc<Pulse> {
        let mut pulses = self.pulses.lock().unwrap_or_else(|e| e.into_inner());
        pulses.entry(cluster.to_string()).or_default().clone()
    }

    /// When each cluster was last seen, for those ever seen.
    pub(in crate::recorder) fn seen_times(&self) -> Vec<(String, i64)> {
        let pulses = self.pulses.lock().unwrap_or_else(|e| e.into_inner());
        pulses
            .iter()
            .filter_map(|(name, pulse)| Some((name.clone(), pulse.seen()?)))
            .collect()
    }

    pub(in crate::recorder) fn known_workloads(&self) -> Arc<RenderedWorkloads> {
        self.workloads.load_full()
    }

    pub(in crate::recorder) fn set_known_workloads(&self, workloads: RenderedWorkloads) {
        self.workloads.store(Arc::new(workloads));
    }

    pub(in crate::recorder) fn set_rollouts(&self, views: Vec<RolloutView>) {
        self.rollouts.store(Arc::new(views));
    }

    pub(in crate::recorder) fn count_superseded(&self) {
        self.superseded.fetch_add(1, Ordering::Relaxed);
    }

    pub(in crate::recorder) fn count_decisions(&self, decisions: u64) {
        self.decisions.fetch_add(decisions, Ordering::Relaxed);
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
