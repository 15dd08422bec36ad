//! The paths of the hub's HTTP API (version 1), in one place for the three parties that
//! use them: the hub's router (route templates), `publish` (the same paths as a folder
//! layout) and the agent's client (URLs and `file://` folders).
//!
//! Paths are given as segments, so that a caller joins them the way its medium needs:
//! percent-encoded into a URL, or as file names under a folder.

/// Every token starts with this, so a leaked one is easy to recognise and scan for.
pub const TOKEN_PREFIX: &str = "flt_";

/// Whether `text` has the shape of a flotilla token: [`TOKEN_PREFIX`], then letters,
/// digits, `-` or `_` (nothing else, no spaces).
pub fn is_token(text: &str) -> bool {
    text.strip_prefix(TOKEN_PREFIX).is_some_and(|rest| {
        !rest.is_empty()
            && rest
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    })
}

/// Route templates, in the `{name}` syntax of the hub's router.
pub mod routes {
    pub const BUNDLE: &str = "/v1/clusters/{cluster}/bundle";
    pub const BUNDLE_BY_DIGEST: &str = "/v1/clusters/{cluster}/bundles/{digest}";
    pub const STATUS: &str = "/v1/clusters/{cluster}/status";
    pub const FLEET: &str = "/v1/fleet";
    pub const ROLLOUTS: &str = "/v1/rollouts";
    pub const ROLLOUT: &str = "/v1/rollouts/{id}";
    pub const ROLLOUT_ACTION: &str = "/v1/rollouts/{id}/{action}";
    pub const GIT_HOOK: &str = "/v1/hooks/git";
    pub const HEALTHZ: &str = "/healthz";
    pub const READYZ: &str = "/readyz";
    pub const METRICS: &str = "/metrics";
}

/// The folder, under a published root, that holds every cluster's files: `v1/clusters`.
pub const CLUSTERS: [&str; 2] = ["v1", "clusters"];

/// The file name of a cluster's current bundle inside its folder.
pub const CURRENT_BUNDLE: &str = "bundle";

/// The file, inside a cluster's deltas folder on a static mirror ([`DELTAS`]), that
/// holds the sha256 of its current bundle document (`sha256:` and 64 hexadecimal
/// digits, then a newline), written by `publish` after the deltas and before the
/// document (which the deltas already lead to): an agent that
/// holds that very document reads these 72 bytes at each poll, not the document or a
/// delta it would have to rebuild to find it unchanged. It lives among the deltas
/// because every publish that changes the document removes from that folder each
/// file it did not write, older versions of flotilla included, so it never outlives
/// the document it names.
pub const CURRENT_SHA256: &str = "current.sha256";

/// The folder, inside a cluster's folder, of its bundles by digest.
pub const BUNDLES_BY_DIGEST: &str = "bundles";

/// The response header in which a hub names the revision of the bundle it sends (a
/// static mirror sends none).
pub const REVISION_HEADER: &str = "x-flotilla-revision";

/// The content codings the hub accepts on a status report's body, which it names in
/// the `Accept-Encoding` header of its answer to a report (RFC 7694): an agent
/// compresses its later reports only once a hub has said so.
pub const REPORT_ENCODINGS: &str = "gzip, zstd";

/// The folder, inside a cluster's folder on a static mirror, of deltas (RFC 9842
/// `dcz` bodies) from recent bundles to the current one, each named by its base's
/// digest (`publish --deltas`).
pub const DELTAS: &str = "deltas";

/// The file, inside a cluster's folder on a static mirror, that lists the digests
/// the mirror has given the cluster, newest first (the bases of its deltas).
pub const SERVED_DIGESTS: &str = "served";

/// `v1/clusters/{cluster}/deltas/{base}`: the delta from the bundle `base` to the
/// current one, on a static mirror (none: fetch the current bundle).
pub fn delta<'a>(cluster: &'a str, base: &'a str) -> [&'a str; 5] {
    ["v1", "clusters", cluster, DELTAS, base]
}

/// `v1/clusters/{cluster}/bundle`: the cluster's current bundle.
pub fn bundle(cluster: &str) -> [&str; 4] {
    ["v1", "clusters", cluster, CURRENT_BUNDLE]
}

/// What [`CURRENT_SHA256`] holds for `document`: its digest and a newline.
pub fn current_sha256_text(document: &[u8]) -> String {
    format!("{}\n", crate::bundle::Digest::of(document))
}

/// `v1/clusters/{cluster}/deltas/current.sha256`: the sha256 of the cluster's current
/// bundle document, on a static mirror.
pub fn current_sha256(cluster: &str) -> [&str; 5] {
    ["v1", "clusters", cluster, DELTAS, CURRENT_SHA256]
}

/// `v1/clusters/{cluster}/bundles/{digest}`: one of the cluster's bundles, immutable.
pub fn bundle_by_digest<'a>(cluster: &'a str, digest: &'a str) -> [&'a str; 5] {
    ["v1", "clusters", cluster, BUNDLES_BY_DIGEST, digest]
}

/// `v1/clusters/{cluster}/status`: where the agent posts its report.
pub fn status(cluster: &str) -> [&str; 4] {
    ["v1", "clusters", cluster, "status"]
}

/// `/v1/rollouts/{id}`: one rollout.
pub fn rollout(id: u64) -> String {
    format!("{}/{id}", routes::ROLLOUTS)
}

/// `/v1/rollouts/{id}/{action}`: pause, resume, promote or abort a rollout.
pub fn rollout_action(id: u64, action: &str) -> String {
    format!("{}/{id}/{action}", routes::ROLLOUTS)
}

/// Joins segments into an absolute URL path (no escaping: for display and tests).
pub fn to_path(segments: &[&str]) -> String {
    let mut path = String::new();
    for segment in segments {
        path.push('/');
        path.push_str(segment);
    }
    path
}

/// The content codings an `Accept-Encoding` value accepts: each named one whose
/// quality is not `q=0`, in the order given.
pub fn accepted_encodings(accept_encoding: &str) -> impl Iterator<Item = &str> {
    accept_encoding.split(',').filter_map(|item| {
        let mut parts = item.split(';');
        let name = parts.next().unwrap_or("").trim();
        let quality = parts
            .find_map(|p| p.trim().strip_prefix("q="))
            .and_then(|q| q.trim().parse::<f32>().ok())
            .unwrap_or(1.0);
        (!name.is_empty() && quality > 0.0).then_some(name)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fill(template: &str, cluster: &str, digest: &str) -> String {
        template
            .replace("{cluster}", cluster)
            .replace("{digest}", digest)
    }

    #[test]
    fn tells_tokens_from_other_text() {
        assert!(is_token("flt_0123abcdef"));
        assert!(!is_token("flt_"));
        assert!(!is_token("0123abcdef"));
        assert!(!is_token(
            "created token 0123 for cluster red (shown once): flt_0123"
        ));
        assert!(!is_token("flt_01 23"));
    }

    #[test]
    fn segments_and_route_templates_name_the_same_paths() {
        let (c, d) = ("edge-7", "sha256:ab");
        assert_eq!(to_path(&bundle(c)), fill(routes::BUNDLE, c, d));
        assert_eq!(
            to_path(&bundle_by_digest(c, d)),
            fill(routes::BUNDLE_BY_DIGEST, c, d)
        );
        assert_eq!(to_path(&status(c)), fill(routes::STATUS, c, d));
        assert_eq!(
            to_path(&bundle(c)),
            format!("{}/{c}/{CURRENT_BUNDLE}", to_path(&CLUSTERS))
        );
        assert_eq!(rollout(7), routes::ROLLOUT.replace("{id}", "7"));
        assert_eq!(
            rollout_action(7, "pause"),
            routes::ROLLOUT_ACTION
                .replace("{id}", "7")
                .replace("{action}", "pause")
        );
    }
}
