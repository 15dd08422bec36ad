//! Delta bundles: a changed bundle sent to an agent as the difference from the digest
//! it runs (RFC 9842, `Content-Encoding: dcz`).
//!
//! The agent names the digest it runs in `Available-Dictionary`; the dictionary is
//! that digest's stored object (the canonical body, whose sha256 is the digest), and
//! the delta is the full served document (signature included) compressed with zstd
//! against it as a raw-content prefix, behind the `dcz` header ([`flotilla_core::dcz`]).
//!
//! Deltas are made off the request path: a request finds one made already in
//! [`Deltas`] (a bounded cache keyed by cluster, serve sequence, target and base), or
//! asks for one and is answered with the full document. At most [`WORKERS`] deltas are
//! made at a time, on the blocking pool, and at most [`MAX_QUEUED`] wait for a worker;
//! others are not made. A long-poll that a change woke waits up to [`GRACE`] for its
//! delta (without a thread: it only waits for the cache to say so), then takes the
//! full document. Only a base the hub keeps in the cluster's history is used.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::HeaderMap;
use http::header::ACCEPT_ENCODING;
use tokio::sync::{Notify, Semaphore};

use crate::recorder::{ClusterBundle, Shared};
use flotilla_core::bundle::{Digest, MAX_BUNDLE_BYTES};
use flotilla_core::dcz;

/// How many deltas are made at once.
pub const WORKERS: usize = 2;
/// How many deltas may wait for a worker; past that a request's delta is not made.
/// A commit that changes every cluster of a fleet of 10,000 queues one for each.
pub const MAX_QUEUED: usize = 16_384;
/// How long a long-poll woken by a change waits for its delta before it takes the
/// full document.
pub const GRACE: Duration = Duration::from_secs(2);
/// The cache's bounds: entries, and bytes of deltas. The entries cover the deltas a
/// commit that changes every cluster of a fleet of 10,000 makes ahead, so none is
/// dropped before its agent asks for it; the bytes bound the rest.
const MAX_ENTRIES: usize = 32_768;
const MAX_BYTES: usize = 64 * 1024 * 1024;
/// The zstd level of deltas (with long-distance matching, which finds the base).
const LEVEL: i32 = 3;

/// Compresses `document` against `dictionary` as RFC 9842 `dcz`: the header naming
/// the dictionary's digest, then a zstd frame with the dictionary as a raw-content
/// prefix and a window that spans both.
pub fn encode(dictionary: &[u8], document: &[u8]) -> std::io::Result<Vec<u8>> {
    use zstd::zstd_safe::{CCtx, CParameter};
    let error = |code: usize| std::io::Error::other(zstd::zstd_safe::get_error_name(code));
    let header = dcz::header(&Digest::of(dictionary))
        .ok_or_else(|| std::io::Error::other("a digest that is not sha256"))?;
    let span = (dictionary.len() + document.len()).max(1 << 10);
    // The smallest power of two that covers base and target (zstd allows 10 to 31).
    let window_log = (usize::BITS - (span - 1).leading_zeros()).clamp(10, 31);
    let mut context = CCtx::create();
    context
        .set_parameter(CParameter::CompressionLevel(LEVEL))
        .map_err(error)?;
    context
        .set_parameter(CParameter::WindowLog(window_log))
        .map_err(error)?;
    context
        .set_parameter(CParameter::EnableLongDistanceMatching(true))
        .map_err(error)?;
    context
        .set_parameter(CParameter::ContentSizeFlag(true))
        .map_err(error)?;
    context.ref_prefix(dictionary).map_err(error)?;
    // zstd writes from the start of the buffer it is given.
    let mut frame = Vec::with_capacity(zstd::zstd_safe::compress_bound(document.len()));
    context.compress2(&mut frame, document).map_err(error)?;
    let mut out = Vec::with_capacity(header.len() + frame.len());
    out.extend_from_slice(&header);
    out.extend_from_slice(&frame);
    Ok(out)
}

/// The digest a request's `Available-Dictionary` names, when its `Accept-Encoding`
/// takes `dcz`.
pub fn requested(headers: &HeaderMap) -> Option<Digest> {
    let accepts = headers
        .get_all(ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(dcz::accepts);
    if !accepts {
        return None;
    }
    let value = headers.get(dcz::AVAILABLE_DICTIONARY)?.to_str().ok()?;
    dcz::parse_available_dictionary(value)
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct Key {
    cluster: String,
    sequence: u64,
    target: Digest,
    base: Digest,
}

impl Key {
    fn new(entry: &ClusterBundle, base: &Digest) -> Key {
        Key {
            cluster: entry.name.clone(),
            sequence: entry.sequence,
            target: entry.digest.clone(),
            base: base.clone(),
        }
    }
}

/// The deltas made, being made and refused.
pub struct Deltas {
    state: Mutex<State>,
    workers: Arc<Semaphore>,
}

#[derive(Default)]
struct State {
    /// `None`: no delta for this pair (a base the cluster never ran, or too large).
    done: HashMap<Key, Option<Bytes>>,
    /// In the order they were made, oldest first: the first to go.
    order: VecDeque<Key>,
    bytes: usize,
    /// The deltas being made, each with what wakes the requests waiting for it.
    queued: HashMap<Key, Arc<Notify>>,
}

enum Lookup {
    Ready(Bytes),
    Refused,
    Missing,
}

impl Default for Deltas {
    fn default() -> Deltas {
        Deltas::new()
    }
}

impl Deltas {
    pub fn new() -> Deltas {
        Deltas {
            state: Mutex::default(),
            workers: Arc::new(Semaphore::new(WORKERS)),
        }
    }

    fn lookup(&self, key: &Key) -> Lookup {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        match state.done.get(key) {
            Some(Some(bytes)) => Lookup::Ready(bytes.clone()),
            Some(None) => Lookup::Refused,
            None => Lookup::Missing,
        }
    }

    fn keep(&self, key: Key, delta: Option<Bytes>) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let waiting = state.queued.remove(&key);
        state.bytes += delta.as_ref().map_or(0, Bytes::len);
        if let Some(old) = state.done.insert(key.clone(), delta) {
            state.bytes -= old.map_or(0, |b| b.len());
        } else {
            state.order.push_back(key);
        }
        while state.done.len() > MAX_ENTRIES || state.bytes > MAX_BYTES {
            let Some(oldest) = state.order.pop_front() else {
                break;
            };
            if let Some(old) = state.done.remove(&oldest) {
                state.bytes -= old.map_or(0, |b| b.len());
            }
        }
        drop(state);
        if let Some(waiting) = waiting {
            waiting.notify_waiters();
        }
    }

    /// Ends the making of a delta that is not kept (its base is not in the cluster's
    /// history, or the making failed for a reason that may pass): the requests waiting
    /// for it answer with the full document, and the next request tries again.
    fn forget(&self, key: &Key) {
        let waiting = self
            .state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .queued
            .remove(key);
        if let Some(waiting) = waiting {
            waiting.notify_waiters();
        }
    }

    /// How many deltas the cache holds (made or refused).
    pub fn len(&self) -> usize {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .done
            .len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The `dcz` body for a request naming `base`, when one is ready (or, for a woken
/// long-poll, becomes ready within [`GRACE`]); `None`: answer with the full document.
/// Counts hits and misses.
pub async fn answer(
    shared: &Arc<Shared>,
    deltas: &Arc<Deltas>,
    entry: &Arc<ClusterBundle>,
    base: &Digest,
    woken: bool,
) -> Option<Bytes> {
    if *base == entry.digest {
        return None;
    }
    let key = Key::new(entry, base);
    let known = Base::of(shared, entry, base);
    let found = match deltas.lookup(&key) {
        Lookup::Ready(bytes) => Some(bytes),
        Lookup::Refused => None,
        Lookup::Missing => match prepare(shared, deltas, entry, key.clone(), known) {
            Some(made) if woken => {
                // Subscribed before looking again, so a delta made meanwhile is seen.
                let made = made.notified();
                tokio::pin!(made);
                made.as_mut().enable();
                match deltas.lookup(&key) {
                    Lookup::Ready(bytes) => Some(bytes),
                    Lookup::Refused => None,
                    Lookup::Missing => match tokio::time::timeout(GRACE, made).await {
                        Ok(()) => match deltas.lookup(&key) {
                            Lookup::Ready(bytes) => Some(bytes),
                            _ => None,
                        },
                        Err(_) => None,
                    },
                }
            }
            _ => None,
        },
    };
    shared.metrics.delta(found.is_some());
    found
}

/// Whether a delta's base is known to be in its cluster's history already.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Base {
    /// Named by a request: looked up before the delta is made.
    Unchecked,
    /// Found in the history by [`make_ahead`], with the other clusters of the change,
    /// or the digest the cluster was served just before (with a history of two or
    /// more, always in it).
    InHistory,
}

impl Base {
    /// How a request's base is known: the digest its entry replaced needs no look-up.
    /// The agents a change wakes name that digest; looking each one up in the store,
    /// as the fleet's reports of the change are being written, kept most of their
    /// deltas from being made in time.
    fn of(shared: &Shared, entry: &ClusterBundle, base: &Digest) -> Base {
        if shared.settings.history >= 2 && entry.replaced.as_ref() == Some(base) {
            Base::InHistory
        } else {
            Base::Unchecked
        }
    }
}

/// Queues the making of a delta unless it is queued already; what wakes the requests
/// waiting for it, or `None` when the queue is full.
fn prepare(
    shared: &Arc<Shared>,
    deltas: &Arc<Deltas>,
    entry: &Arc<ClusterBundle>,
    key: Key,
    base: Base,
) -> Option<Arc<Notify>> {
    let made = {
        let mut state = deltas.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(made) = state.queued.get(&key) {
            return Some(made.clone());
        }
        if state.queued.len() >= MAX_QUEUED || state.done.contains_key(&key) {
            return None;
        }
        let made = Arc::new(Notify::new());
        state.queued.insert(key.clone(), made.clone());
        made
    };
    let (shared, deltas, entry) = (shared.clone(), deltas.clone(), entry.clone());
    tokio::spawn(async move {
        match make(&shared, &deltas, entry, &key, base).await {
            Made::Delta(delta) => {
                shared.metrics.delta_made();
                deltas.keep(key, Some(delta));
            }
            Made::NoUse => deltas.keep(key, None),
            Made::NotKept => deltas.forget(&key),
        }
    });
    Some(made)
}

/// Makes deltas ahead of the polls: each time what the hub serves changes, the delta
/// to each cluster's new bundle from the digest its agent last reported applying is
/// queued (as many as the queue takes; the others are made when asked for), so an
/// agent woken by the change finds it made rather than waiting for it or taking the
/// whole document. Runs until the hub shuts down.
pub async fn make_ahead(shared: Arc<Shared>, deltas: Arc<Deltas>) {
    let mut generations = shared.view.generations();
    let mut shutdown = shared.shutdown.subscribe();
    // The serve sequence of each cluster's entry when last looked at: an entry is
    // made for each change of what the cluster is served.
    let mut seen: HashMap<String, u64> = shared
        .view
        .served()
        .clusters
        .iter()
        .map(|(name, entry)| (name.clone(), entry.sequence))
        .collect();
    loop {
        tokio::select! {
            changed = generations.changed() => if changed.is_err() { return },
            _ = shutdown.changed() => return,
        }
        let served = shared.view.served();
        let changed: Vec<&Arc<ClusterBundle>> = served
            .clusters
            .iter()
            .filter(|(name, entry)| !entry.hold && seen.get(*name) != Some(&entry.sequence))
            .map(|(_, entry)| entry)
            .collect();
        if changed.is_empty() {
            continue;
        }
        let bases: Vec<(Arc<ClusterBundle>, Digest)> = {
            let statuses = shared.view.statuses();
            changed
                .iter()
                .filter_map(|entry| {
                    let applied = statuses.get(&entry.name)?.report.applied.clone()?;
                    (applied != entry.digest).then(|| ((*entry).clone(), applied))
                })
                .collect()
        };
        for entry in &changed {
            seen.insert(entry.name.clone(), entry.sequence);
        }
        // Every base looked up in the history at once, a few statements for a whole
        // fleet: one look-up per delta, at the moment the fleet's reports of the
        // change arrive, left the makers waiting for the database and the woken
        // long-polls without their deltas.
        let wanted: Vec<(&str, &Digest)> = bases
            .iter()
            .map(|(entry, base)| (entry.name.as_str(), base))
            .collect();
        let in_history = match shared.view.reads().revisions_in_history(&wanted).await {
            Ok(found) => found,
            Err(err) => {
                tracing::warn!("no deltas made ahead: {err}");
                continue;
            }
        };
        for (entry, base) in bases {
            if !in_history.contains_key(&(entry.name.clone(), base.clone())) {
                continue;
            }
            let key = Key::new(&entry, &base);
            if prepare(&shared, &deltas, &entry, key, Base::InHistory).is_none() {
                // The queue is full: the rest are made when their agents ask.
                break;
            }
        }
    }
}

/// What making a delta came to.
enum Made {
    Delta(Bytes),
    /// No delta is of use for this key (no smaller than the document, or the two too
    /// large to compare): remembered, so it is not made again.
    NoUse,
    /// None now, and nothing remembered: a base not in the cluster's history (a request
    /// may name any digest: remembering each would crowd real deltas out of the cache),
    /// or a failure that may pass (the store, an object, the worker).
    NotKept,
}

async fn make(
    shared: &Arc<Shared>,
    deltas: &Deltas,
    entry: Arc<ClusterBundle>,
    key: &Key,
    base: Base,
) -> Made {
    // The semaphore is never closed.
    let Ok(_permit) = deltas.workers.clone().acquire_owned().await else {
        return Made::NotKept;
    };
    if base == Base::Unchecked {
        let kept = shared
            .view
            .reads()
            .revision_in_history(&key.cluster, &key.base)
            .await;
        match kept {
            Ok(Some(_)) => {}
            Ok(None) => return Made::NotKept,
            Err(err) => {
                tracing::warn!(cluster = %key.cluster, base = %key.base, "no delta: {err}");
                return Made::NotKept;
            }
        }
    }
    let shared = shared.clone();
    let base = key.base.clone();
    let made = tokio::task::spawn_blocking(move || -> Result<Made, String> {
        let reads = shared.view.reads();
        let dictionary = reads.object_blocking(&base).map_err(|e| e.to_string())?;
        if Digest::of(&dictionary) != base {
            return Err("the stored base does not hash to its digest".into());
        }
        let document = reads
            .document(&entry, shared.settings.signing_key.as_deref())
            .map_err(|e| e.to_string())?;
        if dictionary.len() + document.len() > 2 * MAX_BUNDLE_BYTES {
            return Ok(Made::NoUse);
        }
        let delta = encode(&dictionary, &document).map_err(|e| e.to_string())?;
        // A delta no smaller than the document is no use.
        Ok(if delta.len() < document.len() {
            Made::Delta(Bytes::from(delta))
        } else {
            Made::NoUse
        })
    })
    .await;
    match made {
        Ok(Ok(made)) => made,
        Ok(Err(err)) => {
            tracing::warn!(cluster = %key.cluster, base = %key.base, "no delta: {err}");
            Made::NotKept
        }
        Err(err) => {
            tracing::warn!(cluster = %key.cluster, base = %key.base, "no delta: {err}");
            Made::NotKept
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delta_names_its_base_and_is_small_for_a_small_change() {
        let base: Vec<u8> = (0..20_000u32)
            .flat_map(|i| {
                format!(
                    "{{\"n\":{i},\"h\":\"{:08x}\"}},",
                    i.wrapping_mul(2_654_435_761)
                )
                .into_bytes()
            })
            .collect();
        let mut target = base.clone();
        target[100_000] = b'Z';
        let delta = encode(&base, &target).expect("encodes");
        let (named, frame) = dcz::split(&delta).expect("a dcz header");
        assert_eq!(named, Digest::of(&base));
        assert!(
            frame.len() < 200,
            "{} bytes for one changed byte",
            frame.len()
        );
    }

    /// A delta whose making failed, or whose base the cluster's history lacks, leaves
    /// nothing behind: its waiters answer at once, and the next request asks again
    /// (before, each was remembered as "no delta": a failure of the store for good,
    /// and every made-up base a request named crowded real deltas out).
    #[tokio::test]
    async fn a_delta_not_kept_wakes_its_waiters_and_is_asked_for_again() {
        let deltas = Deltas::new();
        let key = Key {
            cluster: "c".into(),
            sequence: 1,
            target: Digest::of(b"t"),
            base: Digest::of(b"b"),
        };
        let made = Arc::new(Notify::new());
        deltas
            .state
            .lock()
            .expect("lock")
            .queued
            .insert(key.clone(), made.clone());
        let woken = made.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        deltas.forget(&key);
        tokio::time::timeout(std::time::Duration::from_secs(5), woken)
            .await
            .expect("the waiters are woken");
        assert!(matches!(deltas.lookup(&key), Lookup::Missing));
        assert!(deltas.is_empty());
        assert!(deltas.state.lock().expect("lock").queued.is_empty());
    }

    #[test]
    fn the_cache_keeps_its_bounds() {
        let deltas = Deltas::new();
        let digest = Digest::of(b"t");
        for i in 0..(MAX_ENTRIES + 10) {
            let key = Key {
                cluster: format!("c{i}"),
                sequence: 1,
                target: digest.clone(),
                base: digest.clone(),
            };
            deltas.keep(key, Some(Bytes::from_static(b"delta")));
        }
        assert_eq!(deltas.len(), MAX_ENTRIES);
        let first = Key {
            cluster: "c0".into(),
            sequence: 1,
            target: digest.clone(),
            base: digest.clone(),
        };
        assert!(matches!(deltas.lookup(&first), Lookup::Missing));
        let last = Key {
            cluster: format!("c{}", MAX_ENTRIES + 9),
            ..first
        };
        assert!(matches!(deltas.lookup(&last), Lookup::Ready(_)));
    }

    #[test]
    fn only_a_request_that_accepts_dcz_names_a_dictionary() {
        let digest = Digest::of(b"[]");
        let value = dcz::available_dictionary(&digest).expect("value");
        let mut headers = HeaderMap::new();
        headers.insert(dcz::AVAILABLE_DICTIONARY, value.parse().expect("header"));
        assert_eq!(requested(&headers), None);
        headers.insert(ACCEPT_ENCODING, "gzip, dcz".parse().expect("header"));
        assert_eq!(requested(&headers), Some(digest));
    }
}
