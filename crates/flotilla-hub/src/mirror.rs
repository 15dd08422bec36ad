//! `serve --oci REGISTRY/REPOSITORY`: what the hub serves each cluster, pushed to an
//! OCI registry on every change, as `publish --oci` pushes it.
//!
//! The pushed artifact carries the document the hub serves: the same digest, revision
//! and signature (with the hub's sequence), so an agent pulling from the registry
//! accepts exactly what one polling the hub would. A cluster the hub holds (a new
//! cluster whose wave is not released) is not pushed. A push that fails is tried
//! again after [`RETRY`], or at the next change.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use flotilla_core::bundle::{Digest, verify_document_parts};
use flotilla_oci::{Artifact, Registry};

use crate::recorder::Shared;
use crate::recorder::view::ClusterBundle;

/// How long after a failed push the served state is pushed again.
const RETRY: Duration = Duration::from_secs(30);

/// Pushes every change of what is served until the hub stops.
pub(crate) async fn run(shared: Arc<Shared>, registry: Registry) {
    let mut generations = shared.view.generations();
    // What each tag was last given: the digest and the serve sequence.
    let mut pushed: HashMap<String, (Digest, u64)> = HashMap::new();
    loop {
        generations.borrow_and_update();
        let served = shared.view.served();
        let mut failed = 0;
        let mut changed = 0;
        for entry in served.clusters.values() {
            let now = (entry.digest.clone(), entry.sequence);
            if entry.hold || pushed.get(&entry.name) == Some(&now) {
                continue;
            }
            match push(&shared, &registry, entry.clone()).await {
                Ok(moved) => {
                    changed += usize::from(moved);
                    pushed.insert(entry.name.clone(), now);
                }
                Err(message) => {
                    failed += 1;
                    tracing::warn!(cluster = %entry.name, registry = %registry.repository(), "cannot push the served bundle: {message}");
                }
            }
        }
        if changed > 0 || failed > 0 {
            tracing::info!(registry = %registry.repository(), tags_moved = changed, failed, "pushed what is served to the registry");
        }
        tokio::select! {
            result = generations.changed() => if result.is_err() {
                return;
            },
            () = tokio::time::sleep(RETRY), if failed > 0 => {}
        }
    }
}

/// Pushes one cluster's served document; whether its tag moved.
async fn push(
    shared: &Arc<Shared>,
    registry: &Registry,
    entry: Arc<ClusterBundle>,
) -> Result<bool, String> {
    let reader = shared.clone();
    let name = entry.name.clone();
    let document = tokio::task::spawn_blocking(move || {
        reader
            .view
            .reads()
            .document(&entry, reader.settings.signing_key.as_deref())
    })
    .await
    .map_err(|err| err.to_string())?
    .map_err(|err| err.to_string())?;
    let verified = verify_document_parts(&document, Some(&name)).map_err(|err| err.to_string())?;
    let artifact = Artifact::bundle(
        &name,
        &verified.revision,
        verified.bundle.canonical_body(),
        verified.signature.as_ref(),
    );
    registry
        .push(&name, &artifact)
        .await
        .map(|pushed| pushed.changed)
        .map_err(|err| err.to_string())
}
