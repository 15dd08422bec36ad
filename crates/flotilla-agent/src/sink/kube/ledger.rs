//! The ledger: the inventory the kube sink keeps in the cluster, in a ConfigMap of the
//! agent's namespace, beside the one in the state folder.
//!
//! It survives a lost state folder (a missing inventory would otherwise read as empty
//! and leave every object flotilla created behind for ever), and it knows what the
//! state folder does not: which objects flotilla **created** (the apply answered 201)
//! rather than adopted (an object that existed, whose fields agreed), each object's uid,
//! for Jobs the manifest they last ran from, and for each Helm release with hooks the
//! fingerprint of the release as last installed or upgraded (see the hooks module).

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use flotilla_core::bundle::{Bundle, Digest, ResourceKey, api_group};

use super::Api;
use super::failure::Failure;
use crate::cache::InventoryEntry;
use crate::sink::{CLUSTER_LABEL, PRUNE_ANNOTATION};

/// The ConfigMap key holding the ledger.
const DATA_KEY: &str = "inventory.json";
/// The ConfigMap key holding, instead of the ledger, why it is not there: it outgrew
/// the ConfigMap. A copy older than the state folder's is worse than none (it would
/// run Jobs again and prune from a stale list after a restart), so it is removed.
const OUTGROWN_KEY: &str = "outgrown";
/// A ConfigMap holds at most 1 MiB; the ledger stops short of it.
const MAX_BYTES: usize = 900 * 1024;

/// Where an object flotilla applied came from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Origin {
    /// flotilla's apply created it (the API server answered 201).
    Created,
    /// It existed before flotilla first applied it (answered 200): flotilla adopted it.
    Adopted,
    /// Applied by an agent that kept no ledger: flotilla applied it, but cannot tell
    /// whether it created it.
    #[default]
    Unknown,
    /// Recorded before it was applied, and no answer recorded since (an apply cut
    /// short): flotilla cannot tell whether it exists at all.
    Pending,
}

/// One object flotilla applied.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct LedgerEntry {
    pub api_version: String,
    pub kind: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    pub name: String,
    #[serde(default)]
    pub origin: Origin,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// For a Job: the digest of the manifest it was last created from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ran: Option<String>,
    /// For a Job: the digest of the manifest whose run a health read saw fail (a
    /// status report; no later phase waited on it). Once its TTL removes it, it is
    /// reported failed, not as a run that finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed: Option<String>,
    /// The user it was last applied as, when the agent impersonated a tenant's
    /// ServiceAccount (`--impersonate-tenants`): it is pruned as that user too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
}

impl LedgerEntry {
    pub fn key(&self) -> ResourceKey {
        ResourceKey::new(
            api_group(&self.api_version),
            &self.kind,
            &self.namespace,
            &self.name,
        )
    }

    pub fn inventory_entry(&self) -> InventoryEntry {
        InventoryEntry::new(
            &self.api_version,
            self.kind.clone(),
            self.namespace.clone(),
            self.name.clone(),
        )
    }

    fn unknown(entry: &InventoryEntry) -> LedgerEntry {
        LedgerEntry {
            api_version: entry.api_version().to_string(),
            kind: entry.kind().to_string(),
            namespace: entry.namespace().to_string(),
            name: entry.name().to_string(),
            origin: Origin::Unknown,
            uid: None,
            ran: None,
            failed: None,
            user: None,
        }
    }
}

/// Why the ledger was not written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SaveError {
    /// It has outgrown a ConfigMap: the cluster keeps no copy, the state folder's stays.
    TooBig(String),
    /// The API server refused or did not answer.
    Failed(String),
}

/// The ledger of one cluster.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(from = "StoredLedger")]
pub(crate) struct Ledger {
    pub cluster: String,
    /// Its entries, in the order they were first recorded (read with
    /// [`Ledger::entries`]; changed only through the ledger, which keeps `index`).
    entries: Vec<LedgerEntry>,
    /// Each Helm release (workload) with hooks, and the fingerprint of its resources
    /// when its hooks last ran to the end: its hooks run again when it changes.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub releases: std::collections::BTreeMap<String, String>,
    /// Where each object's entry is in `entries` (the first, should one repeat): an
    /// apply looks up every object of its bundle, which a search of the list made
    /// quadratic (3 s of CPU for 10,000 objects).
    #[serde(skip)]
    index: HashMap<ResourceKey, usize>,
}

/// The ledger as it is written.
#[derive(Deserialize)]
struct StoredLedger {
    cluster: String,
    entries: Vec<LedgerEntry>,
    #[serde(default)]
    releases: std::collections::BTreeMap<String, String>,
}

impl From<StoredLedger> for Ledger {
    fn from(stored: StoredLedger) -> Ledger {
        Ledger::with_entries(&stored.cluster, stored.entries, stored.releases)
    }
}

impl PartialEq for Ledger {
    fn eq(&self, other: &Ledger) -> bool {
        self.cluster == other.cluster
            && self.entries == other.entries
            && self.releases == other.releases
    }
}

impl Eq for Ledger {}

/// The ConfigMap's name: `flotilla-inventory-<cluster>`, or with a hash of the name
/// when the name cannot be part of an object name.
pub(crate) fn configmap_name(cluster: &str) -> String {
    const PREFIX: &str = "flotilla-inventory-";
    let dns_label = !cluster.is_empty()
        && cluster.len() + PREFIX.len() <= 63
        && cluster
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !cluster.ends_with('-');
    if dns_label {
        format!("{PREFIX}{cluster}")
    } else {
        let digest = Digest::of(cluster.as_bytes());
        format!("{PREFIX}{}", &digest.hex()[..16])
    }
}

impl Ledger {
    pub fn new(cluster: &str) -> Ledger {
        Ledger::with_entries(cluster, Vec::new(), std::collections::BTreeMap::new())
    }

    fn with_entries(
        cluster: &str,
        entries: Vec<LedgerEntry>,
        releases: std::collections::BTreeMap<String, String>,
    ) -> Ledger {
        let mut ledger = Ledger {
            cluster: cluster.to_string(),
            entries,
            releases,
            index: HashMap::new(),
        };
        ledger.reindex();
        ledger
    }

    fn reindex(&mut self) {
        self.index.clear();
        for (at, entry) in self.entries.iter().enumerate() {
            self.index.entry(entry.key()).or_insert(at);
        }
    }

    /// Every entry, in the order they were first recorded.
    pub fn entries(&self) -> &[LedgerEntry] {
        &self.entries
    }

    pub fn entry(&self, key: &ResourceKey) -> Option<&LedgerEntry> {
        self.entries.get(*self.index.get(key)?)
    }

    fn entry_mut(&mut self, key: &ResourceKey) -> Option<&mut LedgerEntry> {
        self.entries.get_mut(*self.index.get(key)?)
    }

    fn push(&mut self, entry: LedgerEntry) {
        self.index.entry(entry.key()).or_insert(self.entries.len());
        self.entries.push(entry);
    }

    /// Records, before an apply touches anything, what it is about to touch: objects
    /// the ledger does not know yet are `Pending` until the API server answers.
    pub fn intend(&mut self, bundle: &[InventoryEntry]) {
        for entry in bundle {
            if self.entry(entry.key()).is_none() {
                let mut pending = LedgerEntry::unknown(entry);
                pending.origin = Origin::Pending;
                self.push(pending);
            }
        }
    }

    /// Takes over what an agent without a ledger applied (its state folder's
    /// inventory), with origin `Unknown`.
    pub fn adopt_inventory(&mut self, applied_before: &[InventoryEntry]) {
        for entry in applied_before {
            if self.entry(entry.key()).is_none() {
                self.push(LedgerEntry::unknown(entry));
            }
        }
    }

    /// Records an apply's answer: 201 means flotilla created the object; 200 for an
    /// object it had not applied before, or for one whose uid changed since (someone
    /// deleted and re-created it), means it adopted it; otherwise what was known stays.
    pub fn record_apply(&mut self, entry: &InventoryEntry, created: bool, uid: Option<&str>) {
        let key = entry.key();
        if self.entry(key).is_none() {
            self.intend(std::slice::from_ref(entry));
        }
        // An object flotilla created under another identity (its API group or, for
        // a cluster-scoped kind, the namespace of its key changed) stays flotilla's.
        // (Looked for only when an object new to the ledger turns out to exist.)
        let adopting = !created && self.entry(key).is_some_and(|e| e.origin == Origin::Pending);
        let created_before = adopting
            && uid.is_some_and(|uid| {
                self.entries.iter().any(|e| {
                    e.origin == Origin::Created && e.uid.as_deref() == Some(uid) && e.key() != *key
                })
            });
        if let Some(recorded) = self.entry_mut(key) {
            let replaced = recorded.uid.is_some() && recorded.uid.as_deref() != uid;
            if created || (created_before && recorded.origin == Origin::Pending) {
                recorded.origin = Origin::Created;
            } else if recorded.origin == Origin::Pending || replaced {
                recorded.origin = Origin::Adopted;
            }
            recorded.api_version = entry.api_version().to_string();
            recorded.uid = uid.map(str::to_string);
        }
    }

    /// Records the user an object was applied as (`None`: the agent itself).
    pub fn record_user(&mut self, key: &ResourceKey, user: Option<&str>) {
        if let Some(recorded) = self.entry_mut(key) {
            recorded.user = user.map(str::to_string);
        }
    }

    /// Records that a Job was applied from the manifest with this digest.
    pub fn record_run(&mut self, key: &ResourceKey, manifest: &Digest) {
        if let Some(recorded) = self.entry_mut(key) {
            if recorded.ran.as_deref() != Some(manifest.as_str()) {
                recorded.failed = None;
            }
            recorded.ran = Some(manifest.to_string());
        }
    }

    /// Records that a health read saw the Job's run from this manifest fail; returns
    /// whether that is news.
    pub fn record_failure(&mut self, key: &ResourceKey, manifest: &str) -> bool {
        match self.entry_mut(key) {
            Some(recorded) if recorded.failed.as_deref() != Some(manifest) => {
                recorded.failed = Some(manifest.to_string());
                true
            }
            _ => false,
        }
    }

    /// Records that a Job was seen failed: the next apply deletes it (if it is still
    /// there) and creates it again, which runs it again, whether or not its manifest
    /// changed. (A `ran` that names no manifest never equals the current one.)
    pub fn forget_run(&mut self, key: &ResourceKey) {
        if let Some(recorded) = self.entry_mut(key) {
            recorded.ran = Some("failed".to_string());
        }
    }

    /// Keeps only the entries of `bundle` and `kept`: the objects still listed
    /// somewhere after this apply (every candidate for prune it did not delete).
    pub fn settle(&mut self, bundle: &Bundle, kept: &[InventoryEntry]) {
        let keys: std::collections::HashSet<ResourceKey> = bundle
            .resources
            .iter()
            .map(|r| (*r.key).clone())
            .chain(kept.iter().map(|e| e.key().clone()))
            .collect();
        self.entries.retain(|e| keys.contains(&e.key()));
        self.reindex();
        // A release that left the bundle is installed anew if it comes back.
        let workloads: std::collections::HashSet<&str> = bundle
            .meta
            .iter()
            .flat_map(|meta| meta.workloads.iter().map(String::as_str))
            .collect();
        self.releases
            .retain(|release, _| workloads.contains(release.as_str()));
    }

    fn to_configmap(&self, namespace: &str) -> Result<Value, SaveError> {
        let text = serde_json::to_string(self).map_err(|err| SaveError::Failed(err.to_string()))?;
        if text.len() > MAX_BYTES {
            return Err(SaveError::TooBig(format!(
                "the inventory of {} objects takes {} bytes, more than a ConfigMap holds: the cluster keeps \
                 no copy of it (the state folder does)",
                self.entries.len(),
                text.len()
            )));
        }
        Ok(self.configmap_holding(namespace, DATA_KEY, &text))
    }

    /// The ledger's ConfigMap with `data` holding only `key: text`.
    fn configmap_holding(&self, namespace: &str, key: &str, text: &str) -> Value {
        json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": configmap_name(&self.cluster), "namespace": namespace,
                         "labels": {CLUSTER_LABEL: self.cluster},
                         // It is no resource of any bundle; never prune it.
                         "annotations": {PRUNE_ANNOTATION: "disabled"}},
            "data": {key: text}})
    }

    fn from_configmap(configmap: &Value, cluster: &str) -> Option<Ledger> {
        if let Some(note) = configmap
            .pointer(&format!("/data/{OUTGROWN_KEY}"))
            .and_then(Value::as_str)
        {
            tracing::warn!(
                cluster,
                "the cluster keeps no inventory ConfigMap ({note}); the state folder's inventory is used"
            );
            return None;
        }
        let text = configmap.pointer(&format!("/data/{DATA_KEY}"))?.as_str()?;
        match serde_json::from_str::<Ledger>(text) {
            Ok(ledger) if ledger.cluster == cluster => Some(ledger),
            Ok(ledger) => {
                tracing::warn!(
                    found = %ledger.cluster, cluster,
                    "the cluster's inventory ConfigMap belongs to another cluster; ignoring it"
                );
                None
            }
            Err(err) => {
                tracing::error!(error = %err, "the cluster's inventory ConfigMap cannot be read; ignoring it");
                None
            }
        }
    }

    /// Reads the ledger; `None` when there is none yet.
    pub async fn load(
        api: &Api,
        namespace: &str,
        cluster: &str,
    ) -> Result<Option<Ledger>, Failure> {
        let name = configmap_name(cluster);
        match api.get(&configmap_resource(), Some(namespace), &name).await {
            Ok(configmap) => Ok(Ledger::from_configmap(&configmap, cluster)),
            Err(failure) if failure.is_not_found() => Ok(None),
            Err(failure) => Err(failure),
        }
    }

    /// Writes the ledger (server-side apply, taking over any field). A ledger too
    /// big for its ConfigMap replaces the copy there with a note saying so (the
    /// apply drops the fields it no longer sends), and is then `TooBig`: an agent
    /// started later, its state folder or not, must not take the old copy for the
    /// current one.
    pub async fn save(&self, api: &Api, namespace: &str) -> Result<(), SaveError> {
        match self.to_configmap(namespace) {
            Ok(configmap) => self
                .write(api, namespace, &configmap)
                .await
                .map_err(|failure| self.failed(namespace, &failure)),
            Err(SaveError::TooBig(note)) => {
                let configmap = self.configmap_holding(namespace, OUTGROWN_KEY, &note);
                match self.write(api, namespace, &configmap).await {
                    Ok(()) => Err(SaveError::TooBig(note)),
                    // No namespace to hold it: no older copy there to be read either.
                    Err(failure) if failure.is_not_found() => Err(SaveError::TooBig(note)),
                    Err(failure) => Err(self.failed(namespace, &failure)),
                }
            }
            Err(failed) => Err(failed),
        }
    }

    async fn write(&self, api: &Api, namespace: &str, configmap: &Value) -> Result<(), Failure> {
        let name = configmap_name(&self.cluster);
        api.apply(
            &configmap_resource(),
            Some(namespace),
            &name,
            configmap,
            true,
        )
        .await
        .map(|_| ())
    }

    fn failed(&self, namespace: &str, failure: &Failure) -> SaveError {
        let name = configmap_name(&self.cluster);
        let hint = if failure.is_not_found() {
            format!("; create namespace {namespace} or choose another with --inventory-namespace")
        } else {
            String::new()
        };
        SaveError::Failed(format!(
            "cannot record the inventory in ConfigMap {namespace}/{name}: {}{hint}",
            failure.describe("patch", "configmaps")
        ))
    }
}

fn configmap_resource() -> kube::core::ApiResource {
    kube::core::ApiResource::from_gvk_with_plural(
        &kube::core::GroupVersionKind::gvk("", "v1", "ConfigMap"),
        "configmaps",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str) -> InventoryEntry {
        InventoryEntry::new("v1", "ConfigMap", "demo", name)
    }

    #[test]
    fn names_are_object_names() {
        assert_eq!(configmap_name("edge-7"), "flotilla-inventory-edge-7");
        let odd = configmap_name("Edge_7");
        assert!(
            odd.starts_with("flotilla-inventory-") && odd.len() == 35,
            "{odd}"
        );
        assert_ne!(odd, configmap_name("edge_7"));
        assert_eq!(configmap_name(&"a".repeat(60)).len(), 35);
    }

    #[test]
    fn provenance_is_learnt_from_the_answers() {
        let origin =
            |ledger: &Ledger, name: &str| ledger.entry(entry(name).key()).map(|e| e.origin);
        let mut ledger = Ledger::new("edge-1");
        // "legacy" was applied by an agent that kept no ledger.
        ledger.adopt_inventory(&[entry("legacy")]);
        ledger.intend(&[entry("new"), entry("found"), entry("legacy")]);
        assert_eq!(origin(&ledger, "new"), Some(Origin::Pending));
        assert_eq!(origin(&ledger, "legacy"), Some(Origin::Unknown));
        ledger.record_apply(&entry("new"), true, Some("u1"));
        ledger.record_apply(&entry("found"), false, Some("u2"));
        ledger.record_apply(&entry("legacy"), false, Some("u3"));
        assert_eq!(origin(&ledger, "new"), Some(Origin::Created));
        assert_eq!(origin(&ledger, "found"), Some(Origin::Adopted));
        assert_eq!(
            origin(&ledger, "legacy"),
            Some(Origin::Unknown),
            "an older agent may have created it"
        );
        // The same object again keeps what was known; a new uid means someone else
        // re-created it.
        ledger.record_apply(&entry("new"), false, Some("u1"));
        assert_eq!(origin(&ledger, "new"), Some(Origin::Created));
        ledger.record_apply(&entry("new"), false, Some("u9"));
        assert_eq!(origin(&ledger, "new"), Some(Origin::Adopted));
        ledger.record_apply(&entry("legacy"), false, Some("u3"));
        assert_eq!(origin(&ledger, "legacy"), Some(Origin::Unknown));
        // The object flotilla created, found again under another identity (its API
        // group changed): still flotilla's, not adopted.
        ledger.record_apply(&entry("made"), true, Some("u5"));
        let moved = InventoryEntry::new("example.com/v1", "ConfigMap", "demo", "made");
        ledger.record_apply(&moved, false, Some("u5"));
        assert_eq!(
            ledger.entry(moved.key()).map(|e| e.origin),
            Some(Origin::Created)
        );
    }

    #[test]
    fn entries_are_found_after_those_before_them_left() {
        let mut ledger = Ledger::new("edge-1");
        for name in ["a", "b", "c"] {
            ledger.record_apply(&entry(name), true, Some(name));
        }
        let config_map = |name: &str| {
            serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
                               "metadata": {"name": name, "namespace": "demo"}})
        };
        let bundle = crate::testing::bundle_of("edge-1", vec![config_map("c")]);
        ledger.settle(&bundle, &[entry("b")]);
        assert_eq!(ledger.entries().len(), 2);
        assert!(ledger.entry(entry("a").key()).is_none());
        for name in ["b", "c"] {
            let found = ledger
                .entry(entry(name).key())
                .and_then(|e| e.uid.as_deref());
            assert_eq!(found, Some(name));
        }
        ledger.record_apply(&entry("d"), true, Some("d"));
        ledger.record_run(entry("d").key(), &Digest::of(b"job"));
        assert_eq!(ledger.entries()[2].name, "d");
        assert!(ledger.entries()[2].ran.is_some());
    }

    #[test]
    fn the_configmap_round_trips_and_belongs_to_one_cluster() {
        let mut ledger = Ledger::new("edge-1");
        ledger.record_apply(&entry("a"), true, Some("u1"));
        let configmap = ledger.to_configmap("flotilla-system").expect("fits");
        assert_eq!(configmap["metadata"]["labels"][CLUSTER_LABEL], "edge-1");
        assert_eq!(
            Ledger::from_configmap(&configmap, "edge-1"),
            Some(ledger.clone())
        );
        assert_eq!(Ledger::from_configmap(&configmap, "edge-2"), None);
        let read = Ledger::from_configmap(&configmap, "edge-1").expect("read");
        assert_eq!(
            read.entry(entry("a").key()).and_then(|e| e.uid.as_deref()),
            Some("u1"),
            "a ledger read back finds its entries"
        );
        let huge = Ledger::with_entries(
            "edge-1",
            vec![ledger.entries[0].clone(); 20_000],
            Default::default(),
        );
        assert!(
            matches!(huge.to_configmap("x"), Err(SaveError::TooBig(note)) if note.contains("20000 objects"))
        );
    }

    /// A ledger that outgrows its ConfigMap takes the old copy out of the cluster:
    /// read after a restart, the old copy would say Jobs ran from manifests they no
    /// longer run from (and run them again) and list what to prune as it was.
    #[tokio::test]
    async fn an_outgrown_ledger_leaves_no_stale_copy_to_be_read_after_a_restart() {
        let fake = flotilla_kube_fake::FakeApiServer::new();
        let api = Api {
            client: fake.client_in("flotilla-system"),
            timeout: std::time::Duration::from_secs(10),
            stop: crate::sink::StopSignal::default(),
            user: None,
        };
        let mut ledger = Ledger::new("edge-1");
        ledger.record_apply(&entry("a"), true, Some("u1"));
        ledger.save(&api, "flotilla-system").await.expect("saved");
        let read = Ledger::load(&api, "flotilla-system", "edge-1").await;
        assert_eq!(read.expect("read"), Some(ledger.clone()));

        let huge = Ledger::with_entries(
            "edge-1",
            vec![ledger.entries[0].clone(); 20_000],
            Default::default(),
        );
        let saved = huge.save(&api, "flotilla-system").await;
        assert!(matches!(saved, Err(SaveError::TooBig(_))), "{saved:?}");
        let read = Ledger::load(&api, "flotilla-system", "edge-1").await;
        assert_eq!(read.expect("read"), None, "the old copy is gone");
        let configmap = fake
            .get(
                "v1",
                "ConfigMap",
                "flotilla-system",
                &configmap_name("edge-1"),
            )
            .expect("the ConfigMap stays, with the note");
        assert!(configmap["data"].get(DATA_KEY).is_none(), "{configmap}");
        assert!(
            configmap["data"][OUTGROWN_KEY]
                .as_str()
                .is_some_and(|note| note.contains("20000 objects")),
            "{configmap}"
        );

        // Without the namespace there is no older copy to hide: still only too big,
        // which applies carry on without.
        let saved = huge.save(&api, "no-such-namespace").await;
        assert!(matches!(saved, Err(SaveError::TooBig(_))), "{saved:?}");

        // Once it fits again, it is kept again.
        ledger.save(&api, "flotilla-system").await.expect("saved");
        let read = Ledger::load(&api, "flotilla-system", "edge-1").await;
        assert_eq!(read.expect("read"), Some(ledger));
    }
}
