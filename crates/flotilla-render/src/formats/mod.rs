//! A cluster's bundle in the formats other fleet tools read, made from a render's
//! output: pure functions from a [`Bundle`](flotilla_core::bundle::Bundle) to bytes or
//! documents, which the command line writes and `publish` pushes.
//!
//! - [`flux`] — the layer of a Flux `OCIRepository` artifact: a `tar.gz` of one YAML
//!   file per resource, Secrets as SOPS documents for the cluster's `agentKey`.
//! - [`manifestwork`] — Open Cluster Management `ManifestWork`s holding the
//!   resources, split to the size OCM's webhook accepts.
//!
//! Both need the render's Secrets in plain text (a render without the hub's seed):
//! neither Flux nor OCM can open a value flotilla sealed for its own agent, so a
//! sealed Secret is an error here.

pub mod flux;
pub mod manifestwork;

use flotilla_core::bundle::Resource;

/// Whether a resource's canonical JSON is a sealed Secret (sealed for flotilla's
/// agent, which neither Flux nor OCM runs).
fn is_sealed(resource: &Resource) -> bool {
    is_secret(resource) && resource.value().get(crate::seal::SEALED_FIELD).is_some()
}

/// Whether `bundle` holds a `Secret` that is not sealed for flotilla's agent: what a
/// render without the hub's seed gives a cluster that names an `agentKey`, and what
/// must not be served to that cluster's agent (sealing would change it).
pub fn holds_plain_secrets(bundle: &flotilla_core::bundle::Bundle) -> bool {
    bundle
        .resources
        .iter()
        .any(|resource| is_secret(resource) && !is_sealed(resource))
}

/// Whether a resource is a core `Secret`.
fn is_secret(resource: &Resource) -> bool {
    resource.key.group().is_empty() && resource.key.kind() == "Secret"
}
