//! `flotilla publish`: bundles laid out as static files under the API's own paths, so
//! any static web server, an object store or a `file://` reader can stand in for the
//! hub (without token checks: a static server cannot check them).
//!
//! A static server knows no rollout: [`publish`] writes what HEAD renders for every
//! cluster at once; [`publish_served`] writes what a hub's store says each cluster is
//! served, so rollouts hold on the mirror too.
//!
//! ```text
//! OUT/v1/clusters/<cluster>/bundle               the current Bundle document
//! OUT/v1/clusters/<cluster>/bundles/<digest>     the same document, by digest
//! OUT/v1/clusters/<cluster>/deltas/<base>        the delta from <base> to the current one
//! OUT/v1/clusters/<cluster>/deltas/current.sha256  the sha256 of the current document
//! OUT/v1/clusters/<cluster>/served               the digests given, newest first
//! ```
//!
//! With `--deltas N` (3 by default) each cluster's folder holds, beside its current
//! document, a delta (RFC 9842 `dcz`, as the hub sends them) to it from each of the
//! last N digests the mirror gave the cluster and from the current digest itself
//! (which agents older than `current.sha256` poll while nothing changes: a few hundred
//! bytes). A delta is made from the base's
//! document by digest (checked against its digest, as the mirror is untrusted), and
//! deltas from bases no longer listed are removed: each leads to the current
//! document. An agent verifies what it rebuilds as any document.
//!
//! OUT is a folder ([`Site::Dir`]) or a bucket and prefix in S3 ([`Site::Bucket`],
//! `publish --objects s3://bucket/prefix`), with the same keys under the prefix.
//!
//! With a signing key the current document is signed (the documents by digest are
//! history and are not). Its sequence continues the one in the previous output, but
//! only when that output's signature verifies with the publishing key: the same as
//! before while the digest is unchanged, else `max(previous + 1, the time in
//! milliseconds)`, and never below the hub's own sequence for the cluster when the
//! hub's store is given. A previous document that does not verify (a mirror's writer
//! planted it) is ignored with a warning, and a sequence that cannot go up any more
//! is refused rather than signed again. The mirror is untrusted input: a document by
//! digest already there is kept only when it matches its digest and cluster.

use std::collections::BTreeSet;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use flotilla_core::bundle::{Digest, document_bytes, verify_document};
use flotilla_core::signing::{BundleSignature, SigningKey};
use flotilla_core::{api, names};
use flotilla_fs::Mode;
use flotilla_render::RenderOutput;

use crate::store::{Bucket, ObjectError, Objects, StoredCluster};

mod oci;

/// Where a publish writes.
#[derive(Debug, Clone)]
pub enum Site {
    /// A folder on disk.
    Dir(PathBuf),
    /// A bucket (and prefix) in S3 or an S3-compatible store, for a CDN to front.
    Bucket(Bucket),
    /// A repository in an OCI registry: each cluster's bundle as an artifact tagged
    /// with the cluster's name (`publish --oci`, see [`oci`]).
    Oci(flotilla_oci::Registry),
}

impl Site {
    /// Where, for messages.
    pub fn display(&self) -> String {
        match self {
            Site::Dir(path) => path.display().to_string(),
            Site::Bucket(bucket) => bucket.url.clone(),
            Site::Oci(registry) => format!("oci://{}", registry.repository()),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error("cannot write {path}: {source}")]
    Write { path: String, source: io::Error },
    /// A cluster name that is not a DNS-1123 label could name a path outside `out`
    /// (`..`, `a/b`); the renderer refuses such names, and publish checks again.
    #[error("cluster name {0} is not a DNS-1123 label; nothing was published")]
    UnsafeName(String),
    #[error("cannot read what the hub serves to {cluster}: {source}")]
    Served {
        cluster: String,
        source: ObjectError,
    },
    #[error(
        "{path} is not a bundle document flotilla wrote ({message}); remove it and publish again"
    )]
    Unreadable { path: String, message: String },
    /// The previous output was signed, with the publishing key, at the highest
    /// sequence there is: no later document can be signed above it.
    #[error(
        "{path} is signed with sequence {sequence}, and no higher one exists: agents would refuse anything signed after it. \
         The signing key signed it, so treat the key as stolen: generate a new one, give agents its public key, and reset their state"
    )]
    SequenceExhausted { path: String, sequence: u64 },
    #[error(
        "another publish is writing to {path}: run one publish at a time to a folder, and run \
         this one again when it has finished"
    )]
    Busy { path: String },
    #[error("cannot {what} {path}: {source}")]
    Remote {
        what: &'static str,
        path: String,
        source: Box<object_store::Error>,
    },
    #[error("cannot push the bundle of {cluster} to {repository}: {source}")]
    Oci {
        cluster: String,
        repository: String,
        source: Box<flotilla_oci::OciError>,
    },
    #[error("cannot push the Flux artifact of {cluster} to {repository}: {source}")]
    OciFlux {
        cluster: String,
        repository: String,
        source: Box<flotilla_oci::OciError>,
    },
}

/// One cluster's bundle as it is to be published.
struct Document {
    cluster: String,
    digest: Digest,
    revision: String,
    /// The bundle's canonical body (what its digest covers).
    body: Vec<u8>,
    /// The hub's serve sequence for what it serves the cluster, if a hub's store says.
    hub_sequence: Option<u64>,
}

/// How documents are written: signed or not, and how many deltas each cluster's
/// folder keeps.
#[derive(Clone, Copy, Debug, Default)]
pub struct Writing<'a> {
    pub signer: Option<&'a SigningKey>,
    /// Deltas from this many previous digests (and one from the current digest);
    /// none when 0. Not written to a registry.
    pub deltas: usize,
}

/// What one publish wrote.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Published {
    pub clusters: usize,
    pub written: usize,
    pub unchanged: usize,
    pub removed: Vec<String>,
    /// Blobs uploaded (to a registry: each distinct bundle once, and only when the
    /// registry lacks it).
    pub uploaded_blobs: usize,
    /// Documents found in the output that were not flotilla's (a signature that does
    /// not verify, a document by digest that does not match it): ignored, and written
    /// over.
    pub warnings: Vec<String>,
    /// Clusters left out, each with the reason (a Flux artifact that cannot be made):
    /// the others were published.
    pub refused: Vec<String>,
}

/// Writes every bundle of a clean render under `out`, as if every cluster were served
/// what HEAD renders (no rollout holds a static mirror back).
pub fn publish(
    output: &RenderOutput,
    out: &Path,
    writing: Writing<'_>,
) -> Result<Published, PublishError> {
    // The folder's futures are ready when first polled: nothing here waits.
    futures::executor::block_on(write_documents(
        head_documents(output),
        &InFolder(out),
        writing,
    ))
}

/// [`publish`] into a folder or a bucket.
pub async fn publish_to(
    output: &RenderOutput,
    site: &Site,
    writing: Writing<'_>,
) -> Result<Published, PublishError> {
    write_to(head_documents(output), site, writing).await
}

/// [`publish_to`] for every cluster but those in `except`.
pub async fn publish_to_except(
    output: &RenderOutput,
    site: &Site,
    writing: Writing<'_>,
    except: &BTreeSet<String>,
) -> Result<Published, PublishError> {
    let documents = head_documents(output)
        .into_iter()
        .filter(|d| !except.contains(&d.cluster))
        .collect();
    write_to(documents, site, writing).await
}

/// `publish --oci … --format flux`: each cluster's Flux `OCIRepository` artifact
/// pushed to `registry` under the tag `<cluster>-flux` (see [`oci::push_flux`]). A
/// cluster whose artifact cannot be made is in [`Published::refused`]; the others
/// are pushed.
pub async fn publish_flux(
    output: &RenderOutput,
    registry: &flotilla_oci::Registry,
    sops: &flotilla_render::sops::SopsWriter,
    source: Option<&str>,
) -> Result<Published, PublishError> {
    oci::push_flux(output, registry, sops, source).await
}

pub use oci::{FLUX_TAG_SUFFIX, flux_tag};

fn head_documents(output: &RenderOutput) -> Vec<Document> {
    output
        .bundles
        .iter()
        .map(|(name, bundle)| Document {
            cluster: name.clone(),
            digest: bundle.digest.clone(),
            revision: output.revision.clone(),
            body: bundle.canonical_body(),
            hub_sequence: None,
        })
        .collect()
}

async fn write_to(
    documents: Vec<Document>,
    site: &Site,
    writing: Writing<'_>,
) -> Result<Published, PublishError> {
    match site {
        Site::Dir(out) => write_documents(documents, &InFolder(out), writing).await,
        Site::Bucket(bucket) => write_documents(documents, &InBucket(bucket), writing).await,
        Site::Oci(registry) => oci::push_documents(documents, registry, writing.signer).await,
    }
}

/// Writes, for every cluster of a clean render, what a hub's store says it is served
/// (with the revision the hub serves it with); a cluster the hub does not serve yet,
/// or holds on what its agent runs, gets HEAD's render, as the hub gives a fresh agent.
pub async fn publish_served(
    output: &RenderOutput,
    served: &[StoredCluster],
    objects: &Objects,
    site: &Site,
    writing: Writing<'_>,
) -> Result<Published, PublishError> {
    let served: std::collections::HashMap<&str, &StoredCluster> =
        served.iter().map(|c| (c.name.as_str(), c)).collect();
    let mut documents = Vec::with_capacity(output.bundles.len());
    for (name, bundle) in &output.bundles {
        let document =
            // A held cluster too: the store's digest is what the hub gives an agent
            // that names no other (a mirror's reader is one), not HEAD's bundle.
            match served.get(name.as_str()) {
                Some(cluster) => {
                    let canonical = objects.read(&cluster.digest).await.map_err(|source| {
                        PublishError::Served {
                            cluster: name.clone(),
                            source,
                        }
                    })?;
                    Document {
                        cluster: name.clone(),
                        digest: cluster.digest.clone(),
                        revision: cluster.revision.clone(),
                        body: canonical,
                        hub_sequence: Some(cluster.sequence),
                    }
                }
                // Not served yet (a cluster the hub has not recorded): HEAD's.
                None => Document {
                    cluster: name.clone(),
                    digest: bundle.digest.clone(),
                    revision: output.revision.clone(),
                    body: bundle.canonical_body(),
                    hub_sequence: None,
                },
            };
        documents.push(document);
    }
    write_to(documents, site, writing).await
}

/// Writes `documents` to `site` and removes the clusters that left the fleet.
/// Earlier `bundles/<digest>` documents stay, which gives mirrors a history.
async fn write_documents(
    documents: Vec<Document>,
    site: &impl Destination,
    writing: Writing<'_>,
) -> Result<Published, PublishError> {
    check_names(&documents)?;
    // Held until every document is written (see `Held`).
    let _held = site.prepare().await?;
    let clusters = api::CLUSTERS.join("/");
    let mut published = Published {
        clusters: documents.len(),
        ..Published::default()
    };
    for document in &documents {
        if write_document(document, &clusters, site, writing, &mut published.warnings).await? {
            published.written += 1;
        } else {
            published.unchanged += 1;
        }
    }
    let keep: BTreeSet<&str> = documents.iter().map(|d| d.cluster.as_str()).collect();
    for (name, folder) in site.clusters().await? {
        if !keep.contains(name.as_str()) && site.holds_bundle(&name, &folder).await? {
            // Its sha256 first: a removal cut short (a bucket's objects go one at a
            // time) leaves none telling the cluster's agents that nothing changed.
            site.delete(&api::current_sha256(&name).join("/")).await?;
            site.remove(&name, &folder).await?;
            published.removed.push(name);
        }
    }
    site.finish().await?;
    Ok(published)
}

/// Writes one cluster's document by digest (unless there) and as its current
/// bundle (unless unchanged), with its sha256; whether the current bundle was
/// written.
async fn write_document(
    document: &Document,
    clusters: &str,
    site: &impl Destination,
    writing: Writing<'_>,
    warnings: &mut Vec<String>,
) -> Result<bool, PublishError> {
    let Document {
        cluster,
        digest,
        revision,
        body,
        hub_sequence,
    } = document;
    let bytes = &document_bytes(cluster, digest, revision, body);
    let dir = format!("{clusters}/{cluster}");
    let digest_key = format!("{dir}/{}/{}", api::BUNDLES_BY_DIGEST, digest.as_str());
    let current_key = format!("{dir}/{}", api::CURRENT_BUNDLE);
    let current_path = site.shown(&current_key);
    let previous = site.read(&current_key).await?;
    // What the previous current document's signature vouches for, when signing.
    let held = match (writing.signer, previous.as_deref()) {
        (Some(key), Some(bytes)) => verified_claims(cluster, bytes, key, &current_path, warnings),
        _ => None,
    };
    // A digest document's content is fixed by its digest, except for the revision in
    // it: the first one written stays, as on the hub, if it is what its name says.
    // When signing, only a revision the key signed before stays: whoever can write
    // the output must not have the key sign a revision of their choosing.
    let vouched = |existing: &[u8]| {
        writing.signer.is_none()
            || held.as_ref().is_some_and(|held| {
                held.digest == digest.as_str()
                    && read_claims("", existing).is_ok_and(|c| c.revision == held.revision)
            })
    };
    let digest_document = match site.read(&digest_key).await? {
        Some(existing) if holds(&existing, cluster, digest) && vouched(&existing) => existing,
        found => {
            if found
                .as_deref()
                .is_some_and(|existing| !holds(existing, cluster, digest))
            {
                warnings.push(format!(
                    "{} is not the document of {digest} for {cluster}; it was written again",
                    site.shown(&digest_key)
                ));
            }
            site.write(&digest_key, bytes).await?;
            bytes.clone()
        }
    };
    let current_document = match writing.signer {
        None => digest_document,
        Some(key) => {
            let sequence = next_sequence(held.as_ref(), digest, now_ms(), &current_path)?
                .max(hub_sequence.unwrap_or(0));
            let claims = read_claims(&site.shown(&digest_key), &digest_document)?;
            signed(
                &digest_document,
                &key.sign(cluster, digest, &claims.revision, sequence),
            )
        }
    };
    let changed = previous.is_none_or(|existing| existing != current_document);
    // Deltas first, then the sha256, then the document. An agent that holds the
    // document the sha256 names takes the folder as unchanged, so it must never name
    // one the folder no longer holds: a change of document removes it with the deltas
    // it did not write (older versions of flotilla that write deltas do too), and the
    // new one names the new document, which the deltas already lead to (an agent that
    // reads it before the document lands and has no delta finds the document it
    // holds, unchanged, and asks again). It is also written when the document is
    // unchanged but the file is missing or names another (a publish stopped
    // halfway); deltas such a publish left are put right by the next one that
    // changes the document, or, with `--deltas 0`, by any.
    let current = Current {
        dir: &dir,
        cluster,
        digest,
        document: &current_document,
    };
    if writing.deltas > 0 {
        write_deltas(site, &current, writing.deltas, changed, warnings).await?;
    } else {
        // Deltas an earlier publish left (or one stopped before its document) would
        // lead elsewhere than to the document kept; the sha256 of an unchanged one
        // stays, so that no agent reading meanwhile finds it missing.
        remove_deltas(site, &current, changed).await?;
    }
    let sha256_key = format!("{dir}/{}/{}", api::DELTAS, api::CURRENT_SHA256);
    let sha256 = api::current_sha256_text(&current_document);
    if changed || site.read(&sha256_key).await?.as_deref() != Some(sha256.as_bytes()) {
        site.write(&sha256_key, sha256.as_bytes()).await?;
    }
    if changed {
        site.write(&current_key, &current_document).await?;
    }
    Ok(changed)
}

/// Removes every delta of the cluster, and its list of bases.
async fn remove_deltas(
    site: &impl Destination,
    current: &Current<'_>,
    changed: bool,
) -> Result<(), PublishError> {
    let deltas_dir = format!("{}/{}", current.dir, api::DELTAS);
    for name in site.list(&deltas_dir).await? {
        if changed || name != api::CURRENT_SHA256 {
            site.delete(&format!("{deltas_dir}/{name}")).await?;
        }
    }
    site.delete(&format!("{}/{}", current.dir, api::SERVED_DIGESTS))
        .await
}

/// A cluster's current document, as [`write_deltas`] reads it.
struct Current<'a> {
    /// The cluster's folder (`v1/clusters/<cluster>`).
    dir: &'a str,
    cluster: &'a str,
    digest: &'a Digest,
    document: &'a [u8],
}

/// Writes the deltas from the current digest and the `keep` before it (as the
/// cluster's `served` list says, which it then updates) to `current`, and removes
/// those from any other base. Nothing is written when the document is unchanged and
/// its deltas were made for it.
async fn write_deltas(
    site: &impl Destination,
    current: &Current<'_>,
    keep: usize,
    changed: bool,
    warnings: &mut Vec<String>,
) -> Result<(), PublishError> {
    let Current {
        dir,
        cluster,
        digest,
        document,
    } = current;
    let list_key = format!("{dir}/{}", api::SERVED_DIGESTS);
    let deltas_dir = format!("{dir}/{}", api::DELTAS);
    // The mirror is untrusted: only well-formed digests are read from the list.
    let listed: Vec<Digest> = site
        .read(&list_key)
        .await?
        .map(|bytes| {
            String::from_utf8_lossy(&bytes)
                .lines()
                .filter_map(|line| Digest::parse(line.trim()).ok())
                .collect()
        })
        .unwrap_or_default();
    let mut bases: Vec<Digest> = vec![(*digest).clone()];
    for base in listed.iter() {
        if bases.len() > keep {
            break;
        }
        if !bases.contains(base) {
            bases.push(base.clone());
        }
    }
    // The list is written last, after the deltas it names: while the document is
    // unchanged and the list still begins with it (and keeps as many bases), the
    // deltas were made for it, and a publish asks nothing more of the site.
    if !changed && listed.first() == Some(*digest) && listed.len() == bases.len() {
        return Ok(());
    }
    let made: Vec<String> = site.list(&deltas_dir).await?;
    let mut written = Vec::with_capacity(bases.len());
    for base in &bases {
        let base_key = format!("{dir}/{}/{}", api::BUNDLES_BY_DIGEST, base.as_str());
        let Some(base_document) = site.read(&base_key).await? else {
            // Its document is gone from the mirror: no delta from it.
            continue;
        };
        let dictionary = match verify_document(&base_document, Some(cluster)) {
            Ok(bundle) if bundle.digest == *base => bundle.canonical_body(),
            _ => {
                warnings.push(format!(
                    "{} is not the document of {base} for {cluster}; no delta is made from it",
                    site.shown(&base_key)
                ));
                continue;
            }
        };
        let delta_key = format!("{deltas_dir}/{}", base.as_str());
        let delta =
            crate::delta::encode(&dictionary, document).map_err(|source| PublishError::Write {
                path: site.shown(&delta_key),
                source,
            })?;
        site.write(&delta_key, &delta).await?;
        written.push(base.as_str().to_string());
    }
    // A delta from any other base would lead to an older document. The sha256 goes
    // too when the document changes (it names the one replaced); otherwise it stays,
    // so that no agent reads the folder without it meanwhile.
    for name in made {
        if !written.contains(&name) && (changed || name != api::CURRENT_SHA256) {
            site.delete(&format!("{deltas_dir}/{name}")).await?;
        }
    }
    let list: String = bases.iter().map(|d| format!("{d}\n")).collect();
    site.write(&list_key, list.as_bytes()).await
}

/// Whether `document` is a bundle document of `cluster` whose resources match `digest`.
fn holds(document: &[u8], cluster: &str, digest: &Digest) -> bool {
    verify_document(document, Some(cluster)).is_ok_and(|bundle| bundle.digest == *digest)
}

/// The claims of the previous current document, when `key` signed them for `cluster`;
/// anything else is only a warning, since whoever can write the output can put it
/// there, and continuing from it would let them choose the sequence.
fn verified_claims(
    cluster: &str,
    bytes: &[u8],
    key: &SigningKey,
    path: &str,
    warnings: &mut Vec<String>,
) -> Option<Claims> {
    let claims = match read_claims(path, bytes) {
        Ok(claims) => claims,
        Err(err) => {
            warnings.push(format!("{err}; it is ignored and written over"));
            return None;
        }
    };
    verified(cluster, claims, key, path, warnings)
}

/// `claims` when `key` signed them for `cluster`, else `None` with a warning.
fn verified(
    cluster: &str,
    claims: Claims,
    key: &SigningKey,
    path: &str,
    warnings: &mut Vec<String>,
) -> Option<Claims> {
    let signature = claims.signature.as_ref()?;
    let public = key.public_key();
    let verifies = signature.key_id == public.key_id()
        && Digest::parse(&claims.digest)
            .is_ok_and(|digest| public.verifies(cluster, &digest, &claims.revision, signature));
    if verifies {
        return Some(claims);
    }
    warnings.push(format!(
        "{path}: its signature (key {}, sequence {}) does not verify with the signing key {}; \
         its sequence is ignored and the document written over",
        names::shown(&signature.key_id),
        signature.sequence,
        public.key_id()
    ));
    None
}

/// Where documents are published, by their keys under the API's paths
/// (`v1/clusters/<cluster>/bundle`, ...): a folder or a bucket.
trait Destination {
    /// A cluster's folder, as [`Destination::clusters`] lists it.
    type Folder;

    /// Where `key` is, for messages.
    fn shown(&self, key: &str) -> String;

    /// Makes ready for writing, once nothing can be refused any more; what it
    /// returns is held until the publish has written everything.
    async fn prepare(&self) -> Result<Held, PublishError> {
        Ok(Held::default())
    }

    /// The document at `key`, or `None` when there is none.
    async fn read(&self, key: &str) -> Result<Option<Vec<u8>>, PublishError>;

    /// Replaces the document at `key` whole, so a reader never sees half of one.
    async fn write(&self, key: &str, bytes: &[u8]) -> Result<(), PublishError>;

    /// The names of the documents directly in the folder `key` (none when it is not
    /// there).
    async fn list(&self, key: &str) -> Result<Vec<String>, PublishError>;

    /// Removes the document at `key`, if there.
    async fn delete(&self, key: &str) -> Result<(), PublishError>;

    /// The clusters' folders already there, each with its name.
    async fn clusters(&self) -> Result<Vec<(String, Self::Folder)>, PublishError>;

    /// Whether the cluster's folder holds a current bundle, that is whether a
    /// publish wrote it (nothing else is removed).
    async fn holds_bundle(&self, name: &str, folder: &Self::Folder) -> Result<bool, PublishError>;

    /// Removes a cluster's folder and everything in it.
    async fn remove(&self, name: &str, folder: &Self::Folder) -> Result<(), PublishError>;

    /// Makes what was written durable.
    async fn finish(&self) -> Result<(), PublishError> {
        Ok(())
    }
}

/// What a publish holds while it writes: for a folder, an exclusive lock on it.
///
/// Two publishes writing one folder at once could leave a cluster's document and its
/// `deltas/current.sha256` from different publishes (an agent would then keep what
/// it runs until the next publish), and each would remove the other's deltas. So a
/// publish to a folder takes an exclusive advisory lock (`flock`) on the folder
/// itself (no file of its own that a static server or a copy to a bucket would carry
/// along), and a second publish to it while the first holds it is refused at once
/// ([`PublishError::Busy`]), as a second hub on one state dir is; the lock is given
/// back when the publish is done, and by the kernel when the process ends, however
/// it ends. The lock is between processes of one machine: publishes from two
/// machines into one network share are not kept apart by it. A folder that cannot
/// be locked (not on Unix, NFS, a folder the publisher may write but not read) is
/// written without it, as before. A bucket or a registry
/// takes no lock: two publishes to one must not run at once (docs/api.md).
#[derive(Debug, Default)]
pub(crate) struct Held(Option<fs::File>);

impl Held {
    /// The lock on the folder `out`, unless another publish holds it. A folder that
    /// cannot be opened or locked for any other reason (not on Unix; NFS, which
    /// locks no folder opened to read; a folder the publisher may write but not
    /// list) is written without a lock, as before there was one.
    fn folder(out: &Path) -> Result<Held, PublishError> {
        let Ok(folder) = fs::File::open(out) else {
            return Ok(Held(None));
        };
        match folder.try_lock() {
            Ok(()) => Ok(Held(Some(folder))),
            Err(fs::TryLockError::WouldBlock) => Err(PublishError::Busy {
                path: out.display().to_string(),
            }),
            Err(fs::TryLockError::Error(_)) => Ok(Held(None)),
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        // Released now, even while a process being started holds a copy of the
        // descriptor (the lock belongs to the open file, not to the descriptor).
        if let Some(folder) = &self.0
            && let Err(err) = folder.unlock()
        {
            tracing::warn!("cannot unlock the publish folder: {err}");
        }
    }
}

/// A folder on disk. Files are replaced atomically (temporary file, fsync, rename),
/// and each folder is synced after a change in it. Its operations never wait on
/// anything but the disk, so its futures are ready when first polled.
struct InFolder<'a>(&'a Path);

impl InFolder<'_> {
    fn path(&self, key: &str) -> PathBuf {
        join(self.0, &key.split('/').collect::<Vec<_>>())
    }

    fn clusters_dir(&self) -> PathBuf {
        join(self.0, &api::CLUSTERS)
    }
}

impl Destination for InFolder<'_> {
    type Folder = PathBuf;

    fn shown(&self, key: &str) -> String {
        self.path(key).display().to_string()
    }

    /// `out` is made private when publish makes it (an existing one is the
    /// operator's), and every folder below it down to the clusters' is, those of an
    /// earlier publish included, so nothing written stays readable to others. `out`
    /// is locked ([`Held::folder`]) as soon as it exists, before anything in it is
    /// touched: a second publish to it is refused and changes nothing.
    async fn prepare(&self) -> Result<Held, PublishError> {
        let mut dir = self.0.to_path_buf();
        if !dir.exists() {
            create_dir(&dir)?;
        }
        let held = Held::folder(self.0)?;
        for segment in api::CLUSTERS {
            dir.push(segment);
            create_dir(&dir)?;
        }
        Ok(held)
    }

    async fn read(&self, key: &str) -> Result<Option<Vec<u8>>, PublishError> {
        // A file that cannot be read is written again.
        Ok(fs::read(self.path(key)).ok())
    }

    async fn write(&self, key: &str, bytes: &[u8]) -> Result<(), PublishError> {
        let path = self.path(key);
        let dir = path.parent().unwrap_or(self.0);
        create_dir(dir)?;
        write_atomically(&path, bytes)?;
        sync(dir)
    }

    async fn list(&self, key: &str) -> Result<Vec<String>, PublishError> {
        let dir = self.path(key);
        let entries = match fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => return Err(error(&dir, source)),
        };
        Ok(entries
            .flatten()
            .filter(|entry| entry.file_type().is_ok_and(|kind| kind.is_file()))
            .map(|entry| entry.file_name().to_string_lossy().into_owned())
            .collect())
    }

    async fn delete(&self, key: &str) -> Result<(), PublishError> {
        let path = self.path(key);
        match fs::remove_file(&path) {
            Ok(()) => sync(path.parent().unwrap_or(self.0)),
            Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(error(&path, source)),
        }
    }

    async fn clusters(&self) -> Result<Vec<(String, PathBuf)>, PublishError> {
        let clusters_dir = self.clusters_dir();
        let entries = fs::read_dir(&clusters_dir).map_err(|source| error(&clusters_dir, source))?;
        Ok(entries
            .flatten()
            .map(|entry| {
                (
                    entry.file_name().to_string_lossy().into_owned(),
                    entry.path(),
                )
            })
            .collect())
    }

    async fn holds_bundle(&self, _: &str, folder: &PathBuf) -> Result<bool, PublishError> {
        Ok(folder.join(api::CURRENT_BUNDLE).is_file())
    }

    async fn remove(&self, _: &str, folder: &PathBuf) -> Result<(), PublishError> {
        fs::remove_dir_all(folder).map_err(|source| error(folder, source))
    }

    async fn finish(&self) -> Result<(), PublishError> {
        sync(&self.clusters_dir())
    }
}

/// A bucket: the same keys under its prefix. A PUT replaces an object whole.
struct InBucket<'a>(&'a Bucket);

impl InBucket<'_> {
    fn remote(
        &self,
        what: &'static str,
        relative: &str,
    ) -> impl FnOnce(object_store::Error) -> PublishError {
        let path = self.0.url_of(relative);
        move |source| PublishError::Remote {
            what,
            path,
            source: Box::new(source),
        }
    }
}

impl Destination for InBucket<'_> {
    type Folder = object_store::path::Path;

    fn shown(&self, key: &str) -> String {
        self.0.url_of(key)
    }

    async fn read(&self, key: &str) -> Result<Option<Vec<u8>>, PublishError> {
        use object_store::ObjectStoreExt as _;
        match self.0.store.get(&self.0.key(key)).await {
            Ok(got) => got
                .bytes()
                .await
                .map(|bytes| Some(bytes.to_vec()))
                .map_err(self.remote("read", key)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(err) => Err(self.remote("read", key)(err)),
        }
    }

    async fn write(&self, key: &str, bytes: &[u8]) -> Result<(), PublishError> {
        use object_store::ObjectStoreExt as _;
        self.0
            .store
            .put(&self.0.key(key), bytes.to_vec().into())
            .await
            .map(|_| ())
            .map_err(self.remote("write", key))
    }

    async fn list(&self, key: &str) -> Result<Vec<String>, PublishError> {
        let listed = self
            .0
            .store
            .list_with_delimiter(Some(&self.0.key(key)))
            .await
            .map_err(self.remote("list", &format!("{key}/")))?;
        Ok(listed
            .objects
            .into_iter()
            .filter_map(|object| Some(object.location.filename()?.to_string()))
            .collect())
    }

    async fn delete(&self, key: &str) -> Result<(), PublishError> {
        use object_store::ObjectStoreExt as _;
        match self.0.store.delete(&self.0.key(key)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(err) => Err(self.remote("delete", key)(err)),
        }
    }

    async fn clusters(&self) -> Result<Vec<(String, Self::Folder)>, PublishError> {
        let clusters = api::CLUSTERS.join("/");
        let listed = self
            .0
            .store
            .list_with_delimiter(Some(&self.0.key(&clusters)))
            .await
            .map_err(self.remote("list", &format!("{clusters}/")))?;
        Ok(listed
            .common_prefixes
            .into_iter()
            .filter_map(|folder| Some((folder.filename()?.to_string(), folder)))
            .collect())
    }

    async fn holds_bundle(&self, name: &str, _: &Self::Folder) -> Result<bool, PublishError> {
        let clusters = api::CLUSTERS.join("/");
        let current_key = format!("{clusters}/{name}/{}", api::CURRENT_BUNDLE);
        Ok(self.read(&current_key).await?.is_some())
    }

    /// Every key under the folder goes.
    async fn remove(&self, name: &str, folder: &Self::Folder) -> Result<(), PublishError> {
        use futures::TryStreamExt as _;
        use object_store::ObjectStoreExt as _;
        let clusters = api::CLUSTERS.join("/");
        let keys: Vec<object_store::ObjectMeta> = self
            .0
            .store
            .list(Some(folder))
            .try_collect()
            .await
            .map_err(self.remote("list", &format!("{clusters}/{name}/")))?;
        for meta in keys {
            match self.0.store.delete(&meta.location).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(err) => return Err(self.remote("delete", meta.location.as_ref())(err)),
            }
        }
        Ok(())
    }
}

/// Checked before anything is written: no name may lead out of the folder or prefix.
fn check_names(documents: &[Document]) -> Result<(), PublishError> {
    match documents
        .iter()
        .map(|d| &d.cluster)
        .find(|name| names::dns1123_label(name).is_err())
    {
        Some(name) => Err(PublishError::UnsafeName(names::shown(name))),
        None => Ok(()),
    }
}

/// What a published document says besides its resources (which are not read).
#[derive(serde::Deserialize)]
struct Claims {
    digest: String,
    revision: String,
    signature: Option<BundleSignature>,
}

fn read_claims(path: &str, bytes: &[u8]) -> Result<Claims, PublishError> {
    serde_json::from_slice(bytes).map_err(|err| PublishError::Unreadable {
        path: path.to_string(),
        message: err.to_string(),
    })
}

/// The sequence to sign for `digest`, continuing the previous output (already
/// verified): the same while the digest is unchanged; when it changes (a rollback
/// included) or there is no previous output, `max(previous + 1, the time in
/// milliseconds)` — so a mirror rebuilt from nothing still signs above what agents
/// hold. A previous sequence with none above it is refused.
fn next_sequence(
    previous: Option<&Claims>,
    digest: &Digest,
    now_ms: u64,
    path: &str,
) -> Result<u64, PublishError> {
    let held = previous.and_then(|claims| claims.signature.as_ref().map(|s| (claims, s)));
    match held {
        Some((claims, signature)) if claims.digest == digest.as_str() => Ok(signature.sequence),
        Some((_, signature)) => signature
            .sequence
            .checked_add(1)
            .map(|next| next.max(now_ms))
            .ok_or_else(|| PublishError::SequenceExhausted {
                path: path.to_string(),
                sequence: signature.sequence,
            }),
        None => Ok(now_ms.max(1)),
    }
}

/// Milliseconds since the Unix epoch on this machine's clock.
fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| {
            u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
        })
}

/// The unsigned canonical document with its signature added. `signature` sorts after
/// every other member of the document, so adding it last keeps the document canonical.
fn signed(unsigned: &[u8], signature: &BundleSignature) -> Vec<u8> {
    flotilla_core::bundle::with_signature(unsigned, signature)
}

fn error(path: &Path, source: io::Error) -> PublishError {
    PublishError::Write {
        path: path.display().to_string(),
        source,
    }
}

fn join(root: &Path, segments: &[&str]) -> PathBuf {
    segments
        .iter()
        .fold(root.to_path_buf(), |path, s| path.join(s))
}

// Bundles may hold Secrets, so what publish writes is its user's only (folders 0700,
// files 0600, and an existing folder it writes into tightened to 0700): a web server
// or a sync to a mirror runs as that user, or copies the files out as it must.
fn create_dir(path: &Path) -> Result<(), PublishError> {
    flotilla_fs::create_dir(path, Mode::Private).map_err(|source| error(path, source))
}

fn sync(dir: &Path) -> Result<(), PublishError> {
    flotilla_fs::sync_dir(dir).map_err(|source| error(dir, source))
}

fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), PublishError> {
    flotilla_fs::replace_file(path, bytes, Mode::Private).map_err(|source| error(path, source))
}

#[cfg(test)]
mod tests {
    use super::*;
    use flotilla_core::bundle::Bundle;

    #[test]
    fn a_name_that_could_leave_the_folder_writes_nothing() {
        let out = tempfile::tempdir().expect("tempdir");
        let inside = out.path().join("site");
        for name in ["..", "../escape", "a/b", "%2e%2e", "A B"] {
            let mut output = RenderOutput::default();
            output
                .bundles
                .insert(name.to_string(), Bundle::new(name, Vec::new()));
            let err = publish(&output, &inside, Writing::default()).expect_err("refused");
            assert!(matches!(err, PublishError::UnsafeName(_)), "{name}: {err}");
            assert!(!inside.exists(), "{name}: nothing was written");
            assert!(!out.path().join("v1").exists() && !out.path().join("escape").exists());
        }
    }

    #[cfg(unix)]
    #[test]
    fn a_second_publish_to_a_folder_is_refused_while_one_writes_and_it_is_free_after_each() {
        let out = tempfile::tempdir().expect("tempdir");
        let mut output = RenderOutput::default();
        output
            .bundles
            .insert("edge-1".into(), Bundle::new("edge-1", Vec::new()));
        let current = out.path().join("v1/clusters/edge-1/bundle");
        // A publish under way: it holds the folder's lock from its start to its end.
        let under_way = Held::folder(out.path()).expect("the first publish's lock");
        let err = publish(&output, out.path(), Writing::default()).expect_err("refused");
        assert!(matches!(err, PublishError::Busy { .. }), "{err}");
        assert!(
            err.to_string().contains(&out.path().display().to_string()),
            "names the folder: {err}"
        );
        assert!(
            !out.path().join("v1").exists(),
            "the refused publish made nothing in the folder"
        );
        drop(under_way);
        // Once it is done the folder is free, and each publish gives it back at its end.
        for _ in 0..2 {
            let published = publish(&output, out.path(), Writing::default()).expect("published");
            assert_eq!(published.clusters, 1);
        }
        assert!(current.is_file());
        Held::folder(out.path()).expect("free after the publishes");
        // A publish that fails halfway (a cluster's folder is a file) gives it back too.
        output
            .bundles
            .insert("edge-2".into(), Bundle::new("edge-2", Vec::new()));
        fs::write(out.path().join("v1/clusters/edge-2"), b"not a folder").expect("write");
        publish(&output, out.path(), Writing::default()).expect_err("cannot write edge-2");
        Held::folder(out.path()).expect("free after a publish that failed");
    }

    #[test]
    fn a_sequence_is_the_time_or_one_more_than_before_whichever_is_higher() {
        use flotilla_core::signing::SigningKey;
        let key = SigningKey::from_seed([9; 32]);
        let (a, b) = (Digest::of(b"a"), Digest::of(b"b"));
        let claims = |digest: &Digest, sequence: u64| Claims {
            digest: digest.as_str().to_string(),
            revision: "r".into(),
            signature: Some(key.sign("edge-1", digest, "r", sequence)),
        };
        let next = |previous: Option<&Claims>, digest: &Digest, now: u64| {
            next_sequence(previous, digest, now, "bundle").expect("a sequence")
        };
        // Nothing published before: the time.
        assert_eq!(next(None, &a, 5_000), 5_000);
        // The same digest keeps its sequence, even one from the future.
        assert_eq!(next(Some(&claims(&a, 9_000)), &a, 5_000), 9_000);
        // A change: the time, or one more when the last one is ahead of the clock.
        assert_eq!(next(Some(&claims(&a, 4_000)), &b, 5_000), 5_000);
        assert_eq!(next(Some(&claims(&a, 9_000)), &b, 5_000), 9_001);
        // Nothing is above the highest sequence: refused, never signed again.
        let err = next_sequence(Some(&claims(&a, u64::MAX)), &b, 5_000, "bundle")
            .expect_err("no sequence above u64::MAX");
        assert!(
            matches!(err, PublishError::SequenceExhausted { .. }),
            "{err}"
        );
    }

    /// The document a `dcz` delta rebuilds into, against `dictionary`.
    fn rebuilt(dictionary: &[u8], delta: &[u8]) -> Vec<u8> {
        let (named, frame) = flotilla_core::dcz::split(delta).expect("a dcz body");
        assert_eq!(named, Digest::of(dictionary));
        let mut context = zstd::zstd_safe::DCtx::create();
        context.ref_prefix(dictionary).expect("the dictionary");
        let mut out = Vec::with_capacity(1 << 20);
        context.decompress(&mut out, frame).expect("decompresses");
        out
    }

    #[test]
    fn deltas_lead_from_the_last_bundles_given_to_the_current_one_and_no_further() {
        use flotilla_core::bundle::{Resource, ResourceKey};
        use std::sync::Arc;
        let out = tempfile::tempdir().expect("tempdir");
        let bundle = |value: &str| {
            let resource = serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "c"}, "data": {"v": value}});
            let key = ResourceKey::of(&resource).expect("identity");
            Bundle::new("edge-1", vec![Arc::new(Resource::new(key, &resource))])
        };
        let publish_with = |value: &str, deltas: usize| {
            let mut output = RenderOutput {
                revision: format!("main@sha1:{value}"),
                ..RenderOutput::default()
            };
            output.bundles.insert("edge-1".into(), bundle(value));
            publish(
                &output,
                out.path(),
                Writing {
                    signer: None,
                    deltas,
                },
            )
            .expect("publishes")
        };
        let folder = out.path().join("v1/clusters/edge-1");
        // The deltas, without the current document's sha256 beside them.
        let deltas = || -> BTreeSet<String> {
            fs::read_dir(folder.join("deltas"))
                .map(|entries| {
                    entries
                        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
                        .filter(|name| name != api::CURRENT_SHA256)
                        .collect()
                })
                .unwrap_or_default()
        };
        let digest = |value: &str| bundle(value).digest.to_string();
        for value in ["a", "b", "c", "c", "d"] {
            publish_with(value, 2);
        }
        // d's own, and from the two before it; a's is gone (it led to b's document).
        assert_eq!(
            deltas(),
            [digest("b"), digest("c"), digest("d")]
                .into_iter()
                .collect()
        );
        assert_eq!(
            fs::read_to_string(folder.join("served")).expect("the list"),
            format!("{}\n{}\n{}\n", digest("d"), digest("c"), digest("b"))
        );
        let current = fs::read(folder.join("bundle")).expect("the current document");
        for base in ["b", "c", "d"] {
            let delta = fs::read(folder.join("deltas").join(digest(base))).expect("a delta");
            assert_eq!(
                rebuilt(&bundle(base).canonical_body(), &delta),
                current,
                "from {base}"
            );
        }
        // A planted list names a base whose document is not there: no delta from it.
        fs::write(
            folder.join("served"),
            format!("{}\nnot a digest\n{}\n", digest("d"), digest("zz")),
        )
        .expect("plants");
        publish_with("e", 2);
        assert_eq!(deltas(), [digest("d"), digest("e")].into_iter().collect());
        // Without deltas, a change removes them all.
        publish_with("f", 0);
        assert!(deltas().is_empty(), "{:?}", deltas());
        assert!(!folder.join("served").exists());
    }

    /// A render of one cluster, `edge-1`, whose one ConfigMap holds `value`.
    fn one_cluster(value: &str) -> RenderOutput {
        use flotilla_core::bundle::{Resource, ResourceKey};
        let resource = serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "c"}, "data": {"v": value}});
        let key = ResourceKey::of(&resource).expect("identity");
        let mut output = RenderOutput {
            revision: format!("main@sha1:{value}"),
            ..RenderOutput::default()
        };
        output.bundles.insert(
            "edge-1".into(),
            Bundle::new(
                "edge-1",
                vec![std::sync::Arc::new(Resource::new(key, &resource))],
            ),
        );
        output
    }

    #[test]
    fn the_sha256_of_the_current_document_is_written_with_it_and_kept_true() {
        let out = tempfile::tempdir().expect("tempdir");
        let publish_with = |value: &str| {
            publish(
                &one_cluster(value),
                out.path(),
                Writing {
                    signer: None,
                    deltas: 1,
                },
            )
            .expect("publishes")
        };
        let folder = out.path().join("v1/clusters/edge-1");
        let named =
            || fs::read_to_string(folder.join("deltas/current.sha256")).expect("the sha256");
        let of_document = || {
            format!(
                "{}\n",
                Digest::of(&fs::read(folder.join("bundle")).expect("the document"))
            )
        };
        publish_with("a");
        assert_eq!(named(), of_document());
        publish_with("b");
        assert_eq!(named(), of_document());
        // A publish that stopped after the sha256 and before the document (or a
        // writer's edit), then an unchanged publish: the file names the document again.
        fs::write(
            folder.join("deltas/current.sha256"),
            "sha256:".to_string() + &"0".repeat(64),
        )
        .expect("plants");
        publish_with("b");
        assert_eq!(named(), of_document());
        fs::remove_file(folder.join("deltas/current.sha256")).expect("removes");
        publish_with("b");
        assert_eq!(named(), of_document());
    }

    /// `--deltas 0` leaves no delta behind, even when the document is unchanged (a
    /// publish stopped before its document leaves deltas leading elsewhere), and
    /// never removes the sha256 of an unchanged document; a cluster that left the
    /// fleet loses its sha256 before anything else of its folder.
    #[test]
    fn no_deltas_leaves_none_behind_and_a_removed_cluster_loses_its_sha256_first() {
        let out = tempfile::tempdir().expect("tempdir");
        let site = Recorded(InFolder(out.path()), Default::default());
        let publish_with = |output: &RenderOutput, deltas: usize| site.publish(output, deltas);
        let folder = out.path().join("v1/clusters/edge-1/deltas");
        let listed = || -> Vec<String> {
            let mut names: Vec<String> = fs::read_dir(&folder)
                .expect("the deltas folder")
                .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
                .collect();
            names.sort();
            names
        };
        let sha256 = "v1/clusters/edge-1/deltas/current.sha256";
        publish_with(&one_cluster("a"), 2);
        assert!(listed().len() > 1, "deltas: {:?}", listed());
        let steps = publish_with(&one_cluster("a"), 0);
        assert_eq!(listed(), [api::CURRENT_SHA256]);
        assert!(
            steps.iter().all(|step| !step.ends_with(sha256)),
            "{steps:?}"
        );

        let mut two = one_cluster("a");
        let edge_2 = two.bundles["edge-1"].clone();
        two.bundles.insert(
            "edge-2".into(),
            Bundle::new("edge-2", edge_2.resources.clone()),
        );
        publish_with(&two, 0);
        let gone = out.path().join("v1/clusters/edge-2");
        assert!(gone.join("deltas/current.sha256").is_file());
        let steps = publish_with(&one_cluster("a"), 0);
        let of_edge_2: Vec<&String> = steps.iter().filter(|s| s.contains("edge-2")).collect();
        assert_eq!(
            of_edge_2,
            ["delete v1/clusters/edge-2/deltas/current.sha256"],
            "the sha256 goes first, then the folder"
        );
        assert!(!gone.exists());
    }

    /// A folder that records what a publish writes and deletes, in order.
    struct Recorded<'a>(InFolder<'a>, std::sync::Mutex<Vec<String>>);

    impl Recorded<'_> {
        fn took(&self) -> Vec<String> {
            std::mem::take(&mut *self.1.lock().expect("lock"))
        }

        /// Publishes `output` here (unsigned) and gives what it wrote and deleted.
        fn publish(&self, output: &RenderOutput, deltas: usize) -> Vec<String> {
            futures::executor::block_on(write_documents(
                head_documents(output),
                self,
                Writing {
                    signer: None,
                    deltas,
                },
            ))
            .expect("publishes");
            self.took()
        }

        /// Every file is written and removed while the publish holds the folder.
        fn assert_locked(&self, key: &str) {
            if cfg!(unix) {
                let err = Held::folder(self.0.0).expect_err("the folder is locked");
                assert!(matches!(err, PublishError::Busy { .. }), "{key}: {err}");
            }
        }
    }

    impl Destination for Recorded<'_> {
        type Folder = PathBuf;
        fn shown(&self, key: &str) -> String {
            self.0.shown(key)
        }
        async fn read(&self, key: &str) -> Result<Option<Vec<u8>>, PublishError> {
            self.0.read(key).await
        }
        async fn prepare(&self) -> Result<Held, PublishError> {
            self.0.prepare().await
        }
        async fn write(&self, key: &str, bytes: &[u8]) -> Result<(), PublishError> {
            self.1.lock().expect("lock").push(format!("write {key}"));
            self.assert_locked(key);
            self.0.write(key, bytes).await
        }
        async fn list(&self, key: &str) -> Result<Vec<String>, PublishError> {
            self.0.list(key).await
        }
        async fn delete(&self, key: &str) -> Result<(), PublishError> {
            self.1.lock().expect("lock").push(format!("delete {key}"));
            self.assert_locked(key);
            self.0.delete(key).await
        }
        async fn clusters(&self) -> Result<Vec<(String, PathBuf)>, PublishError> {
            self.0.clusters().await
        }
        async fn holds_bundle(&self, name: &str, folder: &PathBuf) -> Result<bool, PublishError> {
            self.0.holds_bundle(name, folder).await
        }
        async fn remove(&self, name: &str, folder: &PathBuf) -> Result<(), PublishError> {
            self.0.remove(name, folder).await
        }
    }

    /// The order that keeps the sha256 true for an agent reading meanwhile: a changed
    /// document's old sha256 goes with the old deltas, the new one is written after the
    /// deltas that lead to the new document and before the document; an unchanged
    /// publish that writes deltas again never removes it.
    #[test]
    fn the_sha256_goes_with_the_old_deltas_and_comes_before_the_new_document() {
        let out = tempfile::tempdir().expect("tempdir");
        let site = Recorded(InFolder(out.path()), Default::default());
        let publish_with = |value: &str, deltas: usize| site.publish(&one_cluster(value), deltas);
        let dir = "v1/clusters/edge-1";
        let sha256 = format!("{dir}/deltas/current.sha256");
        let at = |steps: &[String], step: &str| {
            steps
                .iter()
                .position(|s| s == step)
                .unwrap_or_else(|| panic!("no {step:?} in {steps:?}"))
        };
        publish_with("a", 3);
        let steps = publish_with("b", 3);
        let bundle = at(&steps, &format!("write {dir}/bundle"));
        assert!(at(&steps, &format!("delete {sha256}")) < at(&steps, &format!("write {sha256}")));
        assert!(at(&steps, &format!("write {sha256}")) < bundle, "{steps:?}");
        assert!(
            steps
                .iter()
                .filter(|s| s.contains("/deltas/sha256:"))
                .all(|s| at(&steps, s) < bundle),
            "{steps:?}"
        );
        // Unchanged, with fewer deltas kept: the oldest delta goes, the sha256 stays.
        publish_with("c", 3);
        let steps = publish_with("c", 1);
        assert!(steps.iter().any(|s| s.starts_with("delete ")), "{steps:?}");
        assert!(
            !steps.iter().any(|s| s.contains("current.sha256")),
            "{steps:?}"
        );
        // Without deltas, a change removes every delta, then writes the sha256 first.
        let steps = publish_with("d", 0);
        assert!(at(&steps, &format!("delete {sha256}")) < at(&steps, &format!("write {sha256}")));
        assert!(
            at(&steps, &format!("write {sha256}")) < at(&steps, &format!("write {dir}/bundle"))
        );
    }

    #[test]
    fn a_signed_publish_signs_no_revision_planted_in_the_output() {
        use flotilla_core::bundle::{Resource, ResourceKey, document_bytes, verify_document_parts};
        use flotilla_core::signing::SigningKey;
        use std::sync::Arc;
        let out = tempfile::tempdir().expect("tempdir");
        let key = SigningKey::from_seed([9; 32]);
        let resource = serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "c"}, "data": {"v": "a"}});
        let resource_key = ResourceKey::of(&resource).expect("identity");
        let bundle = Bundle::new(
            "edge-1",
            vec![Arc::new(Resource::new(resource_key, &resource))],
        );
        // Whoever writes the output plants the document of the coming bundle, with a
        // revision of their choosing.
        let planted = out.path().join(format!(
            "v1/clusters/edge-1/bundles/{}",
            bundle.digest.as_str()
        ));
        fs::create_dir_all(planted.parent().expect("folder")).expect("creates");
        let body = bundle.canonical_body();
        fs::write(
            &planted,
            document_bytes("edge-1", &bundle.digest, "deploy me, I am reviewed", &body),
        )
        .expect("plants");
        let mut output = RenderOutput {
            revision: "main@sha1:0123456789ab".into(),
            ..RenderOutput::default()
        };
        output.bundles.insert("edge-1".into(), bundle);
        publish(
            &output,
            out.path(),
            Writing {
                signer: Some(&key),
                deltas: 0,
            },
        )
        .expect("publishes");
        for path in [planted, out.path().join("v1/clusters/edge-1/bundle")] {
            let bytes = fs::read(&path).expect("reads");
            let document = verify_document_parts(&bytes, Some("edge-1")).expect("verifies");
            assert_eq!(
                document.revision,
                "main@sha1:0123456789ab",
                "{}",
                path.display()
            );
        }
    }

    #[test]
    fn signed_output_continues_its_sequence_across_publishes() {
        use flotilla_core::bundle::{Resource, ResourceKey, verify_document_parts};
        use flotilla_core::signing::{Held, SigningKey, TrustedKeys};
        use std::sync::Arc;
        let out = tempfile::tempdir().expect("tempdir");
        let key = SigningKey::from_seed([9; 32]);
        let trusted = TrustedKeys::new(vec![key.public_key()]);
        let render = |value: &str, revision: &str| {
            let resource = serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "c"}, "data": {"v": value}});
            let resource_key = ResourceKey::of(&resource).expect("identity");
            let mut output = RenderOutput {
                revision: revision.to_string(),
                ..RenderOutput::default()
            };
            output.bundles.insert(
                "edge-1".into(),
                Bundle::new(
                    "edge-1",
                    vec![Arc::new(Resource::new(resource_key, &resource))],
                ),
            );
            output
        };
        let current = out.path().join("v1/clusters/edge-1/bundle");
        let mut held: Option<Held> = None;
        // A, A again, B, then A again (a rollback): the same sequence while the digest
        // stays, a higher one at each change; the first is the time in milliseconds.
        let started = now_ms();
        let mut sequences = Vec::new();
        for (value, revision, written) in [
            ("a", "main@sha1:1", 1),
            ("a", "main@sha1:2", 0),
            ("b", "main@sha1:3", 1),
            ("a", "main@sha1:4", 1),
        ] {
            let published = publish(
                &render(value, revision),
                out.path(),
                Writing {
                    signer: Some(&key),
                    deltas: 0,
                },
            )
            .expect("publishes");
            assert_eq!(published.written, written, "{value} at {revision}");
            let bytes = fs::read(&current).expect("current");
            let document = verify_document_parts(&bytes, Some("edge-1")).expect("verifies");
            let signature = document.signature.clone().expect("signed");
            sequences.push(signature.sequence);
            trusted
                .check(
                    "edge-1",
                    &document.bundle.digest,
                    &document.revision,
                    Some(&signature),
                    held.as_ref(),
                )
                .expect("an agent following the mirror accepts every step");
            held = Some(Held {
                sequence: signature.sequence,
                digest: document.bundle.digest,
            });
        }
        assert!(sequences[0] >= started, "{sequences:?} from {started}");
        assert_eq!(
            sequences[1], sequences[0],
            "the same digest keeps its sequence"
        );
        assert!(
            sequences[2] > sequences[1] && sequences[3] > sequences[2],
            "{sequences:?}"
        );
        // The documents by digest stay unsigned history. A's kept its first revision
        // while the signed current document vouched for it; the rollback to A, which
        // nothing signed vouches for any more, is written with its own revision.
        let by_digest = fs::read_dir(out.path().join("v1/clusters/edge-1/bundles")).expect("dir");
        let mut revisions: Vec<String> = by_digest
            .map(|entry| {
                let bytes = fs::read(entry.expect("entry").path()).expect("reads");
                let document = verify_document_parts(&bytes, None).expect("verifies");
                assert!(document.signature.is_none());
                document.revision
            })
            .collect();
        revisions.sort();
        assert_eq!(revisions, ["main@sha1:3", "main@sha1:4"]);
    }
}
