//! Canonical bundles: RFC 8785 (JSON Canonicalization Scheme) serialisation, the
//! content digest, and the served `Bundle` document.
//!
//! The digest is computed over the canonical bytes of the sorted resource list (and
//! the bundle's metadata when it has some) only, so it depends on content and nothing
//! else (not the commit, the hub or the time).

use std::fmt;
use std::io::Write;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest as _, Sha256};

/// The API version of every flotilla document.
pub const API_VERSION: &str = "flotilla.dev/v1alpha1";

/// The deepest nesting of arrays and objects a resource may have (a scalar is at
/// depth 0, `{"a": 1}` at depth 1). The renderer refuses to produce a deeper resource
/// and the agent refuses to accept one, with this one constant on both sides, so a
/// hub never serves a bundle its agents would refuse. Real manifests stay far below
/// it (a large CustomResourceDefinition nests about 30 deep); the served document
/// wraps resources two levels deeper, well inside a JSON reader's default limit of 128.
pub const MAX_NESTING_DEPTH: usize = 100;

/// The largest served bundle document an agent accepts, in bytes: an edge agent must
/// not be made to buffer an unbounded body. The renderer refuses a bundle whose
/// resources leave less than [`BUNDLE_ENVELOPE_BYTES`] of it for the rest of the
/// document, with this one constant on both sides, so a hub never serves a bundle its
/// agents would refuse.
pub const MAX_BUNDLE_BYTES: usize = 64 * 1024 * 1024;

/// What the served document may hold besides its resources (apiVersion, cluster,
/// digest, kind, revision and a signature, a few hundred bytes in all), with room to
/// spare: a bundle's resources may come to [`MAX_BUNDLE_BYTES`] less this.
pub const BUNDLE_ENVELOPE_BYTES: usize = 64 * 1024;

/// Whether `value` nests arrays and objects deeper than `max` (see
/// [`MAX_NESTING_DEPTH`]). Walks the value without recursion and stops at the first
/// path that is too deep.
pub fn nests_deeper_than(value: &Value, max: usize) -> bool {
    let mut stack: Vec<(&Value, usize)> = vec![(value, 0)];
    while let Some((value, depth)) = stack.pop() {
        match value {
            Value::Array(_) | Value::Object(_) if depth >= max => return true,
            Value::Array(items) => stack.extend(items.iter().map(|child| (child, depth + 1))),
            Value::Object(map) => stack.extend(map.values().map(|child| (child, depth + 1))),
            _ => {}
        }
    }
    false
}

/// The nesting depth of `value` (0 for a scalar), found without recursion.
pub fn nesting_depth(value: &Value) -> usize {
    let mut deepest = 0;
    let mut stack: Vec<(&Value, usize)> = vec![(value, 0)];
    while let Some((value, depth)) = stack.pop() {
        match value {
            Value::Array(items) => {
                deepest = deepest.max(depth + 1);
                stack.extend(items.iter().map(|child| (child, depth + 1)));
            }
            Value::Object(map) => {
                deepest = deepest.max(depth + 1);
                stack.extend(map.values().map(|child| (child, depth + 1)));
            }
            _ => {}
        }
    }
    deepest
}

/// About how many bytes `value` takes as compact JSON (string escapes are not
/// counted, a fractional number counts as 24), found without recursion. Counting
/// stops as soon as the total passes `stop_above`, so measuring a huge value costs
/// no more than measuring `stop_above` bytes of it; the result is then some number
/// above `stop_above`.
pub fn approximate_json_size(value: &Value, stop_above: usize) -> usize {
    let mut total = 0usize;
    let mut stack: Vec<&Value> = vec![value];
    while let Some(value) = stack.pop() {
        total = total.saturating_add(match value {
            Value::Null | Value::Bool(true) => 4,
            Value::Bool(false) => 5,
            Value::Number(number) => number_size(number),
            Value::String(text) => text.len() + 2,
            Value::Array(items) => {
                stack.extend(items.iter());
                2 + items.len().saturating_sub(1)
            }
            Value::Object(map) => {
                stack.extend(map.values());
                2 + map.len().saturating_sub(1) + map.keys().map(|k| k.len() + 3).sum::<usize>()
            }
        });
        if total > stop_above {
            break;
        }
    }
    total
}

fn number_size(number: &serde_json::Number) -> usize {
    let digits = |n: u64| n.checked_ilog10().map_or(1, |d| d as usize + 1);
    if let Some(n) = number.as_u64() {
        digits(n)
    } else if let Some(n) = number.as_i64() {
        digits(n.unsigned_abs()) + 1
    } else {
        24
    }
}

/// A content digest, always of the form `sha256:<64 lowercase hex digits>`.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Digest(String);

impl Digest {
    /// The digest of some bytes.
    pub fn of(bytes: &[u8]) -> Digest {
        Digest::from_hasher(Sha256::new_with_prefix(bytes))
    }

    /// The digest of what `reader` gives, read a block at a time (never held whole).
    pub fn of_reader(mut reader: impl std::io::Read) -> std::io::Result<Digest> {
        let mut hasher = Sha256::new();
        let mut block = vec![0u8; 64 * 1024];
        loop {
            match reader.read(&mut block) {
                Ok(0) => return Ok(Digest::from_hasher(hasher)),
                Ok(n) => hasher.update(&block[..n]),
                Err(err) if err.kind() == std::io::ErrorKind::Interrupted => {}
                Err(err) => return Err(err),
            }
        }
    }

    fn from_hasher(hasher: Sha256) -> Digest {
        Digest(format!("sha256:{}", hex::encode(hasher.finalize())))
    }

    /// Parses `sha256:<hex>`; anything else is refused.
    pub fn parse(text: &str) -> Result<Digest, InvalidDigest> {
        let hex_part = text
            .strip_prefix("sha256:")
            .ok_or_else(|| InvalidDigest(text.to_string()))?;
        if hex_part.len() == 64
            && hex_part
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            Ok(Digest(text.to_string()))
        } else {
            Err(InvalidDigest(text.to_string()))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The 64 hex digits without the `sha256:` prefix (used for object file names).
    pub fn hex(&self) -> &str {
        &self.0["sha256:".len()..]
    }

    /// A short form for humans: the first 12 hex digits.
    pub fn short(&self) -> &str {
        &self.0["sha256:".len().."sha256:".len() + 12]
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Digest({})", self.0)
    }
}

impl TryFrom<String> for Digest {
    type Error = InvalidDigest;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        Digest::parse(&value)
    }
}

impl From<Digest> for String {
    fn from(value: Digest) -> Self {
        value.0
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid digest {0:?}: expected \"sha256:\" followed by 64 lowercase hex digits")]
pub struct InvalidDigest(pub String);

/// The identity of a resource inside one cluster's bundle, which is also its sort key:
/// (API group, kind, namespace, name). The group of `v1` is `""`, and so is the
/// namespace of a cluster-scoped resource.
///
/// The four are kept in one allocation: an agent holds an identity for every
/// resource it runs, and for a bundle of many small resources four `String`s each
/// cost more memory than the resources' own bytes. It compares, hashes, prints and
/// serialises as the four strings in that order (`{"group", "kind", "namespace",
/// "name"}` on the wire).
#[derive(Clone)]
pub struct ResourceKey {
    /// The group, kind, namespace and name one after the other.
    text: Box<str>,
    /// Where the kind, the namespace and the name begin in `text`.
    starts: [usize; 3],
}

impl ResourceKey {
    pub fn new(
        group: impl AsRef<str>,
        kind: impl AsRef<str>,
        namespace: impl AsRef<str>,
        name: impl AsRef<str>,
    ) -> ResourceKey {
        let (group, kind, namespace, name) = (
            group.as_ref(),
            kind.as_ref(),
            namespace.as_ref(),
            name.as_ref(),
        );
        let mut text =
            String::with_capacity(group.len() + kind.len() + namespace.len() + name.len());
        let mut starts = [0; 3];
        text.push_str(group);
        starts[0] = text.len();
        text.push_str(kind);
        starts[1] = text.len();
        text.push_str(namespace);
        starts[2] = text.len();
        text.push_str(name);
        ResourceKey {
            text: text.into_boxed_str(),
            starts,
        }
    }

    /// Reads the identity of a Kubernetes object; `None` if `apiVersion`, `kind` or
    /// `metadata.name` is missing or not a string.
    pub fn of(resource: &Value) -> Option<ResourceKey> {
        identity_of(resource).map(ResourceKey::from_parts)
    }

    fn from_parts((group, kind, namespace, name): IdentityParts<'_>) -> ResourceKey {
        ResourceKey::new(group, kind, namespace, name)
    }

    /// The API group (`""` for the core group).
    pub fn group(&self) -> &str {
        &self.text[..self.starts[0]]
    }

    pub fn kind(&self) -> &str {
        &self.text[self.starts[0]..self.starts[1]]
    }

    /// The namespace (`""` for a cluster-scoped resource).
    pub fn namespace(&self) -> &str {
        &self.text[self.starts[1]..self.starts[2]]
    }

    pub fn name(&self) -> &str {
        &self.text[self.starts[2]..]
    }

    /// (group, kind, namespace, name), borrowed: compared as the key is.
    pub fn parts(&self) -> IdentityParts<'_> {
        (self.group(), self.kind(), self.namespace(), self.name())
    }
}

impl PartialEq for ResourceKey {
    fn eq(&self, other: &ResourceKey) -> bool {
        self.starts == other.starts && self.text == other.text
    }
}

impl Eq for ResourceKey {}

impl Ord for ResourceKey {
    fn cmp(&self, other: &ResourceKey) -> std::cmp::Ordering {
        self.parts().cmp(&other.parts())
    }
}

impl PartialOrd for ResourceKey {
    fn partial_cmp(&self, other: &ResourceKey) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl std::hash::Hash for ResourceKey {
    /// As four strings hash: the same as a key of four `String` fields did.
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.parts().hash(state);
    }
}

impl fmt::Debug for ResourceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResourceKey")
            .field("group", &self.group())
            .field("kind", &self.kind())
            .field("namespace", &self.namespace())
            .field("name", &self.name())
            .finish()
    }
}

/// A [`ResourceKey`] as it travels.
#[derive(Serialize, Deserialize)]
struct KeyFields<'a> {
    #[serde(borrow)]
    group: std::borrow::Cow<'a, str>,
    #[serde(borrow)]
    kind: std::borrow::Cow<'a, str>,
    #[serde(borrow)]
    namespace: std::borrow::Cow<'a, str>,
    #[serde(borrow)]
    name: std::borrow::Cow<'a, str>,
}

impl Serialize for ResourceKey {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        KeyFields {
            group: self.group().into(),
            kind: self.kind().into(),
            namespace: self.namespace().into(),
            name: self.name().into(),
        }
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for ResourceKey {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<ResourceKey, D::Error> {
        let fields = KeyFields::deserialize(deserializer)?;
        Ok(ResourceKey::new(
            &fields.group,
            &fields.kind,
            &fields.namespace,
            &fields.name,
        ))
    }
}

/// An identity's (group, kind, namespace, name), borrowed from a resource or a key.
pub type IdentityParts<'a> = (&'a str, &'a str, &'a str, &'a str);

/// [`ResourceKey::of`] without making the key.
fn identity_of(resource: &Value) -> Option<IdentityParts<'_>> {
    let api_version = resource.get("apiVersion")?.as_str()?;
    let kind = resource.get("kind")?.as_str()?;
    let metadata = resource.get("metadata")?;
    let name = metadata.get("name")?.as_str()?;
    let namespace = metadata
        .get("namespace")
        .and_then(Value::as_str)
        .unwrap_or("");
    Some((api_group(api_version), kind, namespace, name))
}

impl fmt::Display for ResourceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.kind())?;
        if !self.group().is_empty() {
            write!(f, ".{}", self.group())?;
        }
        if self.namespace().is_empty() {
            write!(f, "/{}", self.name())
        } else {
            write!(f, " {}/{}", self.namespace(), self.name())
        }
    }
}

/// Metadata the Kubernetes API server sets on an object. A manifest exported with
/// `kubectl get -o yaml` carries it: the renderer warns about it, and the agent drops it
/// (and `status`) before applying.
pub const SERVER_SET_METADATA: &[&str] = &[
    "resourceVersion",
    "uid",
    "creationTimestamp",
    "generation",
    "managedFields",
    "selfLink",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
];

/// The API group of an `apiVersion`: `apps/v1` → `apps`, `v1` → `""`.
pub fn api_group(api_version: &str) -> &str {
    match api_version.rsplit_once('/') {
        Some((group, _)) => group,
        None => "",
    }
}

/// One fully rendered resource, kept only as its canonical bytes (RFC 8785 JSON) and
/// its identity, and shared between every cluster whose rendering produced the same
/// content. A fleet holds one of these per distinct resource per cluster, so it keeps
/// no parsed tree: [`Resource::value`] parses the bytes again for the few readers that
/// need one (the diff of a changed resource, the agent's apply).
///
/// The identity is shared too: every cluster's copy of a per-cluster template's
/// resource has the same one.
#[derive(Debug, PartialEq)]
pub struct Resource {
    pub key: Arc<ResourceKey>,
    pub canonical: Canonical,
}

/// A resource's canonical bytes: its own allocation, or the part of a received
/// document that already holds exactly those bytes. An agent keeps the resources of a
/// bundle it verified inside the document they came in (which it keeps anyway, as its
/// last-known-good and as the base of the next delta) instead of copying each one out,
/// so a bundle and its document are one copy of its bytes in memory.
#[derive(Clone)]
pub struct Canonical(CanonicalBytes);

#[derive(Clone)]
enum CanonicalBytes {
    Owned(Box<[u8]>),
    /// `document[start..end]`; a document is at most [`MAX_BUNDLE_BYTES`], so the
    /// offsets fit in 32 bits, which keeps this no larger than the owned form.
    InDocument {
        document: Arc<Vec<u8>>,
        start: u32,
        end: u32,
    },
}

impl Canonical {
    /// `document[range]`, shared with the document; its own copy of those bytes
    /// if the range does not fit in 32 bits (never for a document an agent takes).
    pub fn in_document(document: &Arc<Vec<u8>>, range: std::ops::Range<usize>) -> Canonical {
        match (u32::try_from(range.start), u32::try_from(range.end)) {
            (Ok(start), Ok(end)) if range.end <= document.len() && start <= end => {
                Canonical(CanonicalBytes::InDocument {
                    document: document.clone(),
                    start,
                    end,
                })
            }
            _ => Canonical::from(document[range].to_vec()),
        }
    }
}

impl std::ops::Deref for Canonical {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.0 {
            CanonicalBytes::Owned(bytes) => bytes,
            CanonicalBytes::InDocument {
                document,
                start,
                end,
            } => &document[*start as usize..*end as usize],
        }
    }
}

impl From<Vec<u8>> for Canonical {
    fn from(bytes: Vec<u8>) -> Canonical {
        Canonical(CanonicalBytes::Owned(bytes.into_boxed_slice()))
    }
}

impl From<Box<[u8]>> for Canonical {
    fn from(bytes: Box<[u8]>) -> Canonical {
        Canonical(CanonicalBytes::Owned(bytes))
    }
}

impl PartialEq for Canonical {
    fn eq(&self, other: &Canonical) -> bool {
        **self == **other
    }
}

impl Eq for Canonical {}

impl fmt::Debug for Canonical {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}

impl Resource {
    pub fn new(key: ResourceKey, value: &Value) -> Resource {
        Resource {
            key: Arc::new(key),
            canonical: to_canonical_vec(value).into(),
        }
    }

    /// The resource as a JSON value, parsed from its canonical bytes. Parsing canonical
    /// JSON gives back a value whose canonical form is the same bytes, so this is the
    /// resource exactly as the digest covers it (and as an agent receives it).
    pub fn value(&self) -> Value {
        // The bytes were written by `write_canonical` from a value no deeper than
        // `MAX_NESTING_DEPTH`, so they are always valid JSON that serde_json reads.
        serde_json::from_slice(&self.canonical)
            .expect("canonical bytes written from a JSON value parse as JSON")
    }

    /// The resource's `apiVersion`, read from its canonical bytes without building the
    /// whole tree; `None` if it has none (a bundle's resources always have one).
    pub fn api_version(&self) -> Option<String> {
        #[derive(serde::Deserialize)]
        struct Head {
            #[serde(rename = "apiVersion")]
            api_version: Option<String>,
        }
        serde_json::from_slice::<Head>(&self.canonical)
            .ok()
            .and_then(|head| head.api_version)
    }
}

/// The field of a `Secret` sealed to its cluster's agent: `{"sealed": "<base64 of an
/// age file>"}` in place of its `data` and `stringData` (docs/api.md).
pub const SEALED_SECRET_FIELD: &str = "flotilla.dev/sealed";

/// The bundle features an agent may understand (docs/api.md, "Bundle features"): it
/// names them in the `Flotilla-Features` header of its bundle requests and in its
/// reports, and a hub serves an agent no bundle that needs one it does not name.
pub mod features {
    /// The request header an agent names its features in, comma-separated.
    pub const HEADER: &str = "flotilla-features";
    /// The document's `meta` object, with each resource's workload.
    pub const META: &str = "meta";
    /// Apply phases (`meta.phases`).
    pub const PHASES: &str = "phases";
    /// Drift policies (`meta.drift`).
    pub const DRIFT: &str = "drift";
    /// Secrets sealed to the agent's key.
    pub const SEALED: &str = "sealed";
    /// Helm hooks run around their release (`meta.hooks`).
    pub const HOOKS: &str = "hooks";
    /// Tenant rules the agent enforces (`meta.tenants`).
    pub const TENANTS: &str = "tenants";
    /// A tenant's ClusterRole and ClusterRoleBinding `flotilla-tenant-<tenant>` among
    /// the `flotilla-tenancy` objects (for its cluster-scoped objects), which an agent
    /// that knows only `tenants` refuses.
    pub const TENANT_CLUSTER_ROLES: &str = "tenant-cluster-roles";

    /// Every feature this version knows, in the order of their bits (see [`bits`]).
    pub const ALL: [&str; 7] = [
        META,
        PHASES,
        DRIFT,
        SEALED,
        HOOKS,
        TENANTS,
        TENANT_CLUSTER_ROLES,
    ];

    /// The features named in a header value (`meta, phases`).
    pub fn parse(header: &str) -> Vec<&str> {
        header
            .split(',')
            .map(str::trim)
            .filter(|f| !f.is_empty())
            .collect()
    }

    /// The known features among `names` as a bit set (bit `i` for `ALL[i]`); names
    /// this version does not know are left out.
    pub fn bits<'a>(names: impl IntoIterator<Item = &'a str>) -> u8 {
        names
            .into_iter()
            .filter_map(|name| ALL.iter().position(|known| *known == name))
            .fold(0, |set, i| set | (1 << i))
    }

    /// The features of a bit set made by [`bits`].
    pub fn names(bits: u8) -> Vec<&'static str> {
        ALL.iter()
            .enumerate()
            .filter(|(i, _)| bits & (1 << i) != 0)
            .map(|(_, name)| *name)
            .collect()
    }

    /// The features a stored bundle body (what [`super::Bundle::canonical_body`]
    /// gives) needs; `None` if the bytes are not a bundle body.
    pub fn needed_by_body(body: &[u8]) -> Option<Vec<&'static str>> {
        #[derive(serde::Deserialize)]
        struct WithMeta {
            meta: super::BundleMeta,
            resources: Vec<serde_json::Value>,
        }
        let (meta, resources) = match body.first() {
            Some(b'{') => {
                let parsed: WithMeta = serde_json::from_slice(body).ok()?;
                (Some(parsed.meta), parsed.resources)
            }
            _ => (None, serde_json::from_slice(body).ok()?),
        };
        let sealed = resources.iter().any(is_sealed_secret);
        let cluster_roles = meta.as_ref().is_some_and(|meta| {
            resources
                .iter()
                .zip(&meta.workloads)
                .any(|(resource, workload)| {
                    workload == super::TENANCY_WORKLOAD && resource["kind"] == "ClusterRoleBinding"
                })
        });
        Some(needed(meta.as_ref(), sealed, cluster_roles))
    }

    fn is_sealed_secret(resource: &serde_json::Value) -> bool {
        resource["kind"] == "Secret"
            && resource["apiVersion"] == "v1"
            && resource.get(super::SEALED_SECRET_FIELD).is_some()
    }

    fn needed(
        meta: Option<&super::BundleMeta>,
        sealed: bool,
        cluster_roles: bool,
    ) -> Vec<&'static str> {
        let mut needs = Vec::new();
        if let Some(meta) = meta {
            needs.push(META);
            if !meta.phases.is_empty() {
                needs.push(PHASES);
            }
            if !meta.drift.is_empty() {
                needs.push(DRIFT);
            }
            if !meta.hooks.is_empty() {
                needs.push(HOOKS);
            }
            if !meta.tenants.is_empty() || meta.tenant_rules.is_some() {
                needs.push(TENANTS);
            }
            if cluster_roles {
                needs.push(TENANT_CLUSTER_ROLES);
            }
        }
        if sealed {
            needs.push(SEALED);
        }
        needs
    }
}

/// What a workload's drift policy says to do with a change made on the cluster.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum DriftPolicy {
    /// Put the drifted fields back and report what was corrected.
    #[default]
    Correct,
    /// Leave the drift in place and report it.
    Report,
}

impl DriftPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            DriftPolicy::Correct => "correct",
            DriftPolicy::Report => "report",
        }
    }
}

/// The bundle's metadata (`meta` in the served document, docs/api.md): what an agent
/// must know beyond the resources. A bundle that needs none has no `meta`, and its
/// digest is the digest of its resource list alone; with `meta`, the digest covers
/// `{"meta": ..., "resources": [...]}`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct BundleMeta {
    /// The workload each resource comes from, in the order of the resources (one entry
    /// per resource).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub workloads: Vec<String>,
    /// The apply phases in order, each the workloads of one level of the dependency
    /// graph (`spec.dependsOn`): a phase is applied once the previous one is healthy.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub phases: Vec<Vec<String>>,
    /// Workloads whose drift policy is not the default (`correct`).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub drift: std::collections::BTreeMap<String, DriftPolicy>,
    /// The resources of Helm releases that are Helm hooks (`helm.sh/hook`), in the
    /// order of the resources: the agent runs them around their release as Helm does
    /// instead of applying them with the rest.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hooks: Vec<HookMark>,
    /// The tenants whose workloads the bundle holds, by name: which workloads are
    /// theirs and where their resources may go. The agent refuses a tenant's resource
    /// outside them. Workloads named by no tenant are the platform's.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub tenants: std::collections::BTreeMap<String, TenantMark>,
    /// The platform's tenant rules as its key signed them (`tenants/rules.signed.json`
    /// in the fleet): an agent given that key (`--tenant-key`) enforces these
    /// instead of `tenants`, which the hub writes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant_rules: Option<SignedTenantRules>,
}

/// The platform's tenant rules: each tenant's workloads (names or globs), namespaces
/// and cluster-scoped kinds, and optionally the platform's own workloads (then a
/// workload that is neither is refused).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TenantRules {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform_workloads: Option<Vec<String>>,
    #[serde(default)]
    pub tenants: std::collections::BTreeMap<String, TenantMark>,
}

impl TenantRules {
    /// The bytes a signature covers.
    pub fn canonical(&self) -> Vec<u8> {
        let value = serde_json::to_value(self).expect("tenant rules serialise to JSON");
        to_canonical_vec(&value)
    }
}

/// [`TenantRules`] with the platform key's signature (`flotilla key sign-tenants`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SignedTenantRules {
    pub rules: TenantRules,
    /// The id of the key that signed them.
    pub key_id: String,
    /// The base64 ed25519 signature of the canonical rules.
    pub sig: String,
}

/// The workload name of the objects the render adds for tenants (a ServiceAccount and
/// a RoleBinding per tenant namespace, docs/tenants.md): the platform's, applied in
/// the first phase. No fleet workload may have this name.
pub const TENANCY_WORKLOAD: &str = "flotilla-tenancy";

/// The ClusterRole a tenant's ServiceAccounts are bound to in its namespaces
/// (deploy/tenant-rbac.yaml).
pub const TENANT_CLUSTER_ROLE: &str = "flotilla-tenant";

/// The label that makes a namespace enforce a Pod Security level.
pub const POD_SECURITY_LABEL: &str = "pod-security.kubernetes.io/enforce";

/// The name of a tenant's ServiceAccount (and of its RoleBinding) in each of its
/// namespaces: the agent impersonates it to apply the tenant's resources there.
pub fn tenant_service_account(tenant: &str) -> String {
    format!("flotilla-tenant-{tenant}")
}

/// Whether `key` is one of the objects the render adds for a tenant (named
/// `flotilla-tenant-<tenant>`): a ServiceAccount and a RoleBinding per namespace, and
/// a ClusterRole and ClusterRoleBinding for its cluster-scoped objects. The agent
/// applies them before the other objects of their phase and prunes them after.
pub fn is_tenancy_object(key: &ResourceKey) -> bool {
    let kind = (key.group(), key.kind());
    key.name().starts_with("flotilla-tenant-")
        && matches!(
            kind,
            ("", "ServiceAccount")
                | (
                    "rbac.authorization.k8s.io",
                    "RoleBinding" | "ClusterRole" | "ClusterRoleBinding"
                )
        )
}

/// The verbs a tenant's ClusterRole `flotilla-tenant-<tenant>` grants on each kind of
/// its `spec.clusterScoped`, as the shared ClusterRole `flotilla-tenant` does on the
/// namespaced kinds.
pub const TENANT_VERBS: [&str; 7] = [
    "get", "list", "watch", "create", "update", "patch", "delete",
];

/// The built-in cluster-scoped Kubernetes kinds: (API group, kind, resource), sorted.
/// The resource (plural) name is what RBAC rules name.
pub const BUILT_IN_CLUSTER_SCOPED: &[(&str, &str, &str)] = &[
    ("", "ComponentStatus", "componentstatuses"),
    ("", "Namespace", "namespaces"),
    ("", "Node", "nodes"),
    ("", "PersistentVolume", "persistentvolumes"),
    (
        "admissionregistration.k8s.io",
        "MutatingAdmissionPolicy",
        "mutatingadmissionpolicies",
    ),
    (
        "admissionregistration.k8s.io",
        "MutatingAdmissionPolicyBinding",
        "mutatingadmissionpolicybindings",
    ),
    (
        "admissionregistration.k8s.io",
        "MutatingWebhookConfiguration",
        "mutatingwebhookconfigurations",
    ),
    (
        "admissionregistration.k8s.io",
        "ValidatingAdmissionPolicy",
        "validatingadmissionpolicies",
    ),
    (
        "admissionregistration.k8s.io",
        "ValidatingAdmissionPolicyBinding",
        "validatingadmissionpolicybindings",
    ),
    (
        "admissionregistration.k8s.io",
        "ValidatingWebhookConfiguration",
        "validatingwebhookconfigurations",
    ),
    (
        "apiextensions.k8s.io",
        "CustomResourceDefinition",
        "customresourcedefinitions",
    ),
    ("apiregistration.k8s.io", "APIService", "apiservices"),
    (
        "certificates.k8s.io",
        "CertificateSigningRequest",
        "certificatesigningrequests",
    ),
    (
        "certificates.k8s.io",
        "ClusterTrustBundle",
        "clustertrustbundles",
    ),
    ("flowcontrol.apiserver.k8s.io", "FlowSchema", "flowschemas"),
    (
        "flowcontrol.apiserver.k8s.io",
        "PriorityLevelConfiguration",
        "prioritylevelconfigurations",
    ),
    ("networking.k8s.io", "IPAddress", "ipaddresses"),
    ("networking.k8s.io", "IngressClass", "ingressclasses"),
    ("networking.k8s.io", "ServiceCIDR", "servicecidrs"),
    ("node.k8s.io", "RuntimeClass", "runtimeclasses"),
    ("rbac.authorization.k8s.io", "ClusterRole", "clusterroles"),
    (
        "rbac.authorization.k8s.io",
        "ClusterRoleBinding",
        "clusterrolebindings",
    ),
    ("resource.k8s.io", "DeviceClass", "deviceclasses"),
    ("scheduling.k8s.io", "PriorityClass", "priorityclasses"),
    ("storage.k8s.io", "CSIDriver", "csidrivers"),
    ("storage.k8s.io", "CSINode", "csinodes"),
    ("storage.k8s.io", "StorageClass", "storageclasses"),
    ("storage.k8s.io", "VolumeAttachment", "volumeattachments"),
    (
        "storage.k8s.io",
        "VolumeAttributesClass",
        "volumeattributesclasses",
    ),
    (
        "storagemigration.k8s.io",
        "StorageVersionMigration",
        "storageversionmigrations",
    ),
];

/// Whether `group` is one of Kubernetes' own API groups (the core group, a group
/// without a dot such as `apps`, or one under `k8s.io`), which no
/// CustomResourceDefinition of a fleet defines kinds in.
pub fn is_built_in_group(group: &str) -> bool {
    !group.contains('.') || group == "k8s.io" || group.ends_with(".k8s.io")
}

/// Whether the `clusterScoped` entry `allowed` (`Kind` or `Kind.group`) names the
/// kind `kind` of `group`.
pub fn names_kind(allowed: &str, group: &str, kind: &str) -> bool {
    match allowed.split_once('.') {
        Some((k, g)) => k == kind && g == group,
        None => allowed == kind,
    }
}

/// One tenant of a bundle (`meta.tenants.<name>`, docs/tenants.md).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TenantMark {
    /// The tenant's workloads in this bundle, sorted.
    pub workloads: Vec<String>,
    /// The namespaces its resources may be in: names and globs (`team-a-*`).
    pub namespaces: Vec<String>,
    /// The cluster-scoped kinds it may write (none unless listed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cluster_scoped: Vec<String>,
}

/// One Helm hook of a bundle (`meta.hooks`, docs/api.md): the resource, the events it
/// runs on, its weight and what deletes it, as its `helm.sh/hook*` annotations say.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HookMark {
    /// The hook's index in the bundle's resources.
    pub resource: usize,
    /// `pre-install`, `post-install`, `pre-upgrade`, `post-upgrade`, `pre-delete`,
    /// `post-delete`, in the annotation's order.
    pub events: Vec<String>,
    /// `helm.sh/hook-weight`: hooks of one event run in ascending weight.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub weight: i64,
    /// `helm.sh/hook-delete-policy`: `before-hook-creation` (Helm's default when
    /// the annotation is absent), `hook-succeeded`, `hook-failed`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub delete_policies: Vec<String>,
}

/// Why a tenant may not write a resource: the one rule the hub checks when it
/// renders and the agent checks again before it applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TenantRefusal {
    /// A namespaced resource in a namespace that is not the tenant's.
    OtherNamespace,
    /// A `Namespace` that is not one of the tenant's.
    NotItsNamespace,
    /// A cluster-scoped kind the tenant may not write.
    ClusterScoped,
}

impl TenantRefusal {
    /// Whether a tenant whose namespaces match `namespaces` (globs) and who may write
    /// the cluster-scoped kinds `cluster_scoped` (each `Kind` or `Kind.group`) may
    /// write the resource `key`; why not, if it may not.
    pub fn of<'a>(
        namespaces: impl IntoIterator<Item = &'a str>,
        cluster_scoped: impl IntoIterator<Item = &'a str>,
        key: &ResourceKey,
    ) -> Option<TenantRefusal> {
        // Called at most once: each branch below that asks returns.
        let ours = |name: &str| {
            namespaces
                .into_iter()
                .any(|pattern| crate::names::glob_matches(pattern, name))
        };
        if !key.namespace().is_empty() {
            return (!ours(key.namespace())).then_some(TenantRefusal::OtherNamespace);
        }
        if key.group().is_empty() && key.kind() == "Namespace" {
            return (!ours(key.name())).then_some(TenantRefusal::NotItsNamespace);
        }
        let allowed = cluster_scoped
            .into_iter()
            .any(|allowed| names_kind(allowed, key.group(), key.kind()));
        (!allowed).then_some(TenantRefusal::ClusterScoped)
    }
}

impl TenantMark {
    /// Why the tenant may not write the resource `key`, if it may not: a namespace
    /// outside its own, a `Namespace` not its own, or a cluster-scoped kind it may
    /// not write (`clusterScoped` names `Kind` or `Kind.group`).
    pub fn refusal(&self, key: &ResourceKey) -> Option<String> {
        let refusal = TenantRefusal::of(
            self.namespaces.iter().map(String::as_str),
            self.cluster_scoped.iter().map(String::as_str),
            key,
        )?;
        Some(match refusal {
            TenantRefusal::OtherNamespace => {
                format!("namespace {:?} is not the tenant's", key.namespace())
            }
            TenantRefusal::NotItsNamespace => "the namespace is not the tenant's".to_string(),
            TenantRefusal::ClusterScoped => {
                format!("the tenant may not write cluster-scoped {}", key.kind())
            }
        })
    }
}

fn is_zero(weight: &i64) -> bool {
    *weight == 0
}

impl HookMark {
    /// The Helm hook events flotilla knows (test hooks are not among them).
    pub const EVENTS: [&str; 6] = [
        "pre-install",
        "post-install",
        "pre-upgrade",
        "post-upgrade",
        "pre-delete",
        "post-delete",
    ];
    /// The delete policies flotilla knows.
    pub const DELETE_POLICIES: [&str; 3] =
        ["before-hook-creation", "hook-succeeded", "hook-failed"];

    /// Whether the hook runs on `event`.
    pub fn runs_on(&self, event: &str) -> bool {
        self.events.iter().any(|e| e == event)
    }

    /// Whether the hook is deleted on `policy`.
    pub fn deletes_on(&self, policy: &str) -> bool {
        self.delete_policies.iter().any(|p| p == policy)
    }
}

impl BundleMeta {
    /// Whether there is nothing in it (then a bundle carries no `meta`).
    pub fn is_empty(&self) -> bool {
        self.workloads.is_empty()
            && self.phases.is_empty()
            && self.drift.is_empty()
            && self.hooks.is_empty()
            && self.tenants.is_empty()
            && self.tenant_rules.is_none()
    }

    /// The canonical bytes of the `meta` object.
    pub fn canonical(&self) -> Vec<u8> {
        let value = serde_json::to_value(self).expect("bundle metadata serialises to JSON");
        to_canonical_vec(&value)
    }

    /// Checks the metadata against the bundle's resources: a workload per resource,
    /// every workload in exactly one phase when there are phases, and hooks that name
    /// resources of the bundle, each once and in order, with known events and policies.
    pub fn check(&self, resources: usize) -> Result<(), String> {
        if !self.workloads.is_empty() && self.workloads.len() != resources {
            return Err(format!(
                "meta.workloads names {} workloads for {} resources",
                self.workloads.len(),
                resources
            ));
        }
        self.check_hooks(resources)?;
        self.check_tenants()?;
        if self.phases.is_empty() {
            return Ok(());
        }
        if self.workloads.is_empty() {
            return Err("meta.phases without meta.workloads".into());
        }
        let mut phase_of = std::collections::HashMap::new();
        for (index, phase) in self.phases.iter().enumerate() {
            for workload in phase {
                if phase_of.insert(workload.as_str(), index).is_some() {
                    return Err(format!("workload {workload:?} is in two phases"));
                }
            }
        }
        match self
            .workloads
            .iter()
            .find(|w| !phase_of.contains_key(w.as_str()))
        {
            Some(workload) => Err(format!("workload {workload:?} is in no phase")),
            None => Ok(()),
        }
    }

    fn check_tenants(&self) -> Result<(), String> {
        if !self.tenants.is_empty() && self.workloads.is_empty() {
            return Err("meta.tenants without meta.workloads".into());
        }
        let mut owner = std::collections::HashMap::new();
        for (tenant, mark) in &self.tenants {
            for workload in &mark.workloads {
                if let Some(other) = owner.insert(workload.as_str(), tenant.as_str()) {
                    return Err(format!(
                        "workload {workload:?} belongs to two tenants, {other:?} and {tenant:?}"
                    ));
                }
            }
        }
        Ok(())
    }

    /// The tenant a workload belongs to, if any (`None`: the platform's).
    pub fn tenant_of(&self, workload: &str) -> Option<(&str, &TenantMark)> {
        self.tenants
            .iter()
            .find(|(_, mark)| mark.workloads.iter().any(|w| w == workload))
            .map(|(name, mark)| (name.as_str(), mark))
    }

    fn check_hooks(&self, resources: usize) -> Result<(), String> {
        if !self.hooks.is_empty() && self.workloads.is_empty() {
            return Err("meta.hooks without meta.workloads".into());
        }
        let mut previous = None;
        for hook in &self.hooks {
            if hook.resource >= resources {
                return Err(format!(
                    "meta.hooks names resource {} of a bundle of {resources} resources",
                    hook.resource
                ));
            }
            if previous.is_some_and(|p| p >= hook.resource) {
                return Err(format!(
                    "meta.hooks names resource {} out of order or twice",
                    hook.resource
                ));
            }
            previous = Some(hook.resource);
            if hook.events.is_empty() {
                return Err(format!(
                    "meta.hooks: resource {} has no events",
                    hook.resource
                ));
            }
            if let Some(event) = hook
                .events
                .iter()
                .find(|e| !HookMark::EVENTS.contains(&e.as_str()))
            {
                return Err(format!("meta.hooks: unknown hook event {event:?}"));
            }
            if let Some(policy) = hook
                .delete_policies
                .iter()
                .find(|p| !HookMark::DELETE_POLICIES.contains(&p.as_str()))
            {
                return Err(format!("meta.hooks: unknown hook delete policy {policy:?}"));
            }
        }
        Ok(())
    }

    /// The hook mark of resource `index`, if it is a Helm hook.
    pub fn hook_of(&self, index: usize) -> Option<&HookMark> {
        self.hooks
            .binary_search_by_key(&index, |h| h.resource)
            .ok()
            .map(|at| &self.hooks[at])
    }

    /// The phase of each resource (an index into `phases`), or all 0 without phases.
    pub fn resource_phases(&self, resources: usize) -> Vec<usize> {
        if self.phases.is_empty() || self.workloads.len() != resources {
            return vec![0; resources];
        }
        let phase_of: std::collections::HashMap<&str, usize> = self
            .phases
            .iter()
            .enumerate()
            .flat_map(|(index, phase)| phase.iter().map(move |w| (w.as_str(), index)))
            .collect();
        self.workloads
            .iter()
            .map(|w| phase_of.get(w.as_str()).copied().unwrap_or(0))
            .collect()
    }

    /// The drift policy of the workload of resource `index`.
    pub fn drift_of(&self, index: usize) -> DriftPolicy {
        self.workloads
            .get(index)
            .and_then(|w| self.drift.get(w))
            .copied()
            .unwrap_or_default()
    }
}

/// Bundle metadata with its canonical bytes, made once and shared by the bundles that
/// have the same.
#[derive(Clone, Debug)]
pub struct SharedMeta {
    pub meta: Arc<BundleMeta>,
    pub canonical: Arc<[u8]>,
}

impl SharedMeta {
    /// `None` for empty metadata (a bundle then has none).
    pub fn new(meta: BundleMeta) -> Option<SharedMeta> {
        if meta.is_empty() {
            return None;
        }
        let canonical = meta.canonical().into();
        Some(SharedMeta {
            meta: Arc::new(meta),
            canonical,
        })
    }
}

/// One cluster's bundle: its resources sorted by key, its metadata, and their digest.
#[derive(Clone, Debug)]
pub struct Bundle {
    pub cluster: String,
    pub digest: Digest,
    pub resources: Vec<Arc<Resource>>,
    /// What the agent must know beyond the resources; `None` when nothing.
    pub meta: Option<Arc<BundleMeta>>,
}

impl Bundle {
    /// Builds a bundle from resources in any order. Sorting here is what makes the
    /// digest independent of file order; callers have already rejected duplicate keys.
    pub fn new(cluster: impl Into<String>, mut resources: Vec<Arc<Resource>>) -> Bundle {
        resources.sort_by(|a, b| a.key.cmp(&b.key));
        Bundle::from_sorted(cluster, resources)
    }

    /// Builds a bundle from resources already in key order.
    pub fn from_sorted(cluster: impl Into<String>, resources: Vec<Arc<Resource>>) -> Bundle {
        Bundle::from_sorted_with_meta(cluster, resources, None)
    }

    /// Builds a bundle from resources already in key order and its metadata (an empty
    /// one is none).
    pub fn from_sorted_with_meta(
        cluster: impl Into<String>,
        resources: Vec<Arc<Resource>>,
        meta: Option<BundleMeta>,
    ) -> Bundle {
        let shared = meta.and_then(SharedMeta::new);
        Bundle::from_sorted_with_shared_meta(cluster, resources, shared.as_ref())
    }

    /// [`Bundle::from_sorted_with_meta`] with metadata made once for every bundle that
    /// has the same (a fleet's clusters mostly do): the bundle holds the shared copy,
    /// and its canonical bytes are not written again for the digest.
    pub fn from_sorted_with_shared_meta(
        cluster: impl Into<String>,
        resources: Vec<Arc<Resource>>,
        meta: Option<&SharedMeta>,
    ) -> Bundle {
        debug_assert!(resources.windows(2).all(|pair| pair[0].key < pair[1].key));
        let mut hasher = HashWriter(Sha256::new());
        write_body_with(&mut hasher, meta.map(|m| &*m.canonical), &resources);
        Bundle {
            cluster: cluster.into(),
            digest: Digest::from_hasher(hasher.0),
            resources,
            meta: meta.map(|m| m.meta.clone()),
        }
    }

    /// The bytes the digest covers: the canonical resource list, or, for a bundle
    /// with metadata, the canonical `{"meta": ..., "resources": [...]}`. The hub keeps
    /// these as the bundle's object.
    pub fn canonical_body(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(resource_list_bytes(&self.resources) + 64);
        write_body(&mut out, self.meta.as_deref(), &self.resources);
        out
    }

    /// The served document (docs/api.md, "The bundle document") as bytes: what
    /// [`document_bytes`] makes of the canonical body, written at once into one buffer
    /// (no copy of the body first).
    pub fn document(&self, revision: &str) -> Vec<u8> {
        let meta = self.meta.as_deref().map(BundleMeta::canonical);
        let members = resource_list_bytes(&self.resources) + meta.as_ref().map_or(0, Vec::len);
        let mut out = Vec::with_capacity(members + self.cluster.len() + revision.len() + 384);
        write_document(&mut out, &self.cluster, &self.digest, revision, |out| {
            if let Some(meta) = &meta {
                out.extend_from_slice(b"\"meta\":");
                out.extend_from_slice(meta);
                out.push(b',');
            }
            out.extend_from_slice(b"\"resources\":");
            write_resource_list(out, &self.resources);
        });
        out
    }

    /// The phase of each resource, in resource order (all 0 without phases).
    pub fn resource_phases(&self) -> Vec<usize> {
        match &self.meta {
            Some(meta) => meta.resource_phases(self.resources.len()),
            None => vec![0; self.resources.len()],
        }
    }

    /// How many apply phases the bundle has (at least one).
    pub fn phase_count(&self) -> usize {
        self.meta.as_ref().map_or(1, |m| m.phases.len().max(1))
    }
}

fn write_body<W: Write>(out: &mut W, meta: Option<&BundleMeta>, resources: &[Arc<Resource>]) {
    let canonical = meta.map(BundleMeta::canonical);
    write_body_with(out, canonical.as_deref(), resources);
}

/// [`write_body`] given the canonical bytes of the metadata.
fn write_body_with<W: Write>(out: &mut W, meta: Option<&[u8]>, resources: &[Arc<Resource>]) {
    match meta {
        None => write_resource_list(out, resources),
        Some(meta) => {
            let _ = out.write_all(b"{\"meta\":");
            let _ = out.write_all(meta);
            let _ = out.write_all(b",\"resources\":");
            write_resource_list(out, resources);
            let _ = out.write_all(b"}");
        }
    }
}

/// The length of the canonical resource list (`[`, the resources, the commas between
/// them and `]`), without writing it.
pub fn resource_list_bytes(resources: &[Arc<Resource>]) -> usize {
    resources
        .iter()
        .map(|r| r.canonical.len() + 1)
        .sum::<usize>()
        .max(1)
        + 1
}

fn write_resource_list<W: Write>(out: &mut W, resources: &[Arc<Resource>]) {
    // Writing into a Vec or a hasher cannot fail, so the results are ignored.
    let _ = out.write_all(b"[");
    for (index, resource) in resources.iter().enumerate() {
        if index > 0 {
            let _ = out.write_all(b",");
        }
        let _ = out.write_all(&resource.canonical);
    }
    let _ = out.write_all(b"]");
}

struct HashWriter(Sha256);

impl Write for HashWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Builds the served Bundle document from a bundle's canonical body (what
/// [`Bundle::canonical_body`] gives: the resource list, or `{"meta":…,"resources":…}`),
/// without re-serialising it. The document is itself canonical JSON (its keys are in
/// canonical order: `meta` and `resources` fall between `kind` and `revision`), though
/// only the body is covered by the digest.
pub fn document_bytes(cluster: &str, digest: &Digest, revision: &str, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len() + cluster.len() + revision.len() + 384);
    write_document(&mut out, cluster, digest, revision, |out| {
        match body.first() {
            // `{"meta":…,"resources":[…]}`: its members, between the braces, go in as
            // they are.
            Some(b'{') if body.len() >= 2 => out.extend_from_slice(&body[1..body.len() - 1]),
            _ => {
                out.extend_from_slice(b"\"resources\":");
                out.extend_from_slice(body);
            }
        }
    });
    out
}

/// The served document around the body's members, which `members` writes.
fn write_document(
    out: &mut Vec<u8>,
    cluster: &str,
    digest: &Digest,
    revision: &str,
    members: impl FnOnce(&mut Vec<u8>),
) {
    out.extend_from_slice(b"{\"apiVersion\":");
    write_canonical_string(out, API_VERSION);
    out.extend_from_slice(b",\"cluster\":");
    write_canonical_string(out, cluster);
    out.extend_from_slice(b",\"digest\":");
    write_canonical_string(out, digest.as_str());
    out.extend_from_slice(b",\"kind\":\"Bundle\",");
    members(out);
    out.extend_from_slice(b",\"revision\":");
    write_canonical_string(out, revision);
    out.extend_from_slice(b"}");
}

/// Calls `f` with the canonical body (what [`Bundle::canonical_body`] gives) found
/// inside a served document laid out as [`document_bytes`] writes it, signed or not,
/// without parsing or copying the document: the resource list of a document without
/// metadata as it stands; for one with metadata, its `"meta":…,"resources":[…]`
/// members, with braces written over the commas around them while `f` runs (the
/// document is put back afterwards). `None` when the document is not laid out so.
/// Nothing here is verified: the caller compares the body's sha256 with the digest it
/// expects, which a document laid out otherwise, or damaged, fails.
pub fn with_body_in_document<R>(document: &mut [u8], f: impl FnOnce(&[u8]) -> R) -> Option<R> {
    let (start, end) = body_members(document)?;
    if document[start..end].starts_with(RESOURCES_MEMBER) {
        Some(f(&document[start + RESOURCES_MEMBER.len()..end]))
    } else if document[start..end].starts_with(b"\"meta\":") {
        document[start - 1] = b'{';
        document[end] = b'}';
        let result = f(&document[start - 1..=end]);
        document[start - 1] = b',';
        document[end] = b',';
        Some(result)
    } else {
        None
    }
}

const RESOURCES_MEMBER: &[u8] = b"\"resources\":";

/// Where the members of the body lie in a document laid out as [`document_bytes`]
/// writes it: from the first after `kind` to the comma before `revision`.
fn body_members(document: &[u8]) -> Option<(usize, usize)> {
    const KIND: &[u8] = b",\"kind\":\"Bundle\",";
    const REVISION: &[u8] = b",\"revision\":";
    // `kind` comes right after the head's three strings; `revision` (and after it only
    // the signature, which has no such member) comes last.
    let start = document.windows(KIND.len()).position(|w| w == KIND)? + KIND.len();
    let end = document
        .windows(REVISION.len())
        .rposition(|w| w == REVISION)?;
    (start < end).then_some((start, end))
}

/// The canonical body inside a served document without metadata (its resource list,
/// as it stands there), found as [`with_body_in_document`] finds it but without
/// writing to the document, so a document that is shared can serve; `None` for a
/// document with metadata, whose body is not one run of its bytes, or one laid out
/// otherwise. Nothing here is verified either.
pub fn resource_list_in_document(document: &[u8]) -> Option<&[u8]> {
    let (start, end) = body_members(document)?;
    document[start..end]
        .starts_with(RESOURCES_MEMBER)
        .then(|| &document[start + RESOURCES_MEMBER.len()..end])
}

/// A served document with its `signature` added (outside the digest). `signature`
/// sorts after every other member of the document, so adding it last keeps a
/// canonical document canonical.
pub fn with_signature(unsigned: &[u8], signature: &BundleSignature) -> Vec<u8> {
    let mut out = Vec::with_capacity(unsigned.len() + 160);
    out.extend_from_slice(unsigned);
    add_signature(&mut out, signature);
    out
}

/// [`with_signature`] in place, for a document that need not be kept unsigned (no
/// second copy of it).
pub fn add_signature(document: &mut Vec<u8>, signature: &BundleSignature) {
    if document.last() == Some(&b'}') {
        document.pop();
    }
    document.extend_from_slice(b",\"signature\":");
    // A struct of strings and a number always serialises.
    let _ = serde_json::to_writer(&mut *document, signature);
    document.push(b'}');
}

/// The signature a served document carries (`"signature"` in the document).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct BundleSignature {
    pub key_id: String,
    pub sequence: u64,
    /// Base64 (standard alphabet, padded) of the 64-byte ed25519 signature.
    pub sig: String,
}

/// A Bundle document as received by an agent or read back from disk, its resources
/// already checked one at a time as they are read: the document is never held as a
/// tree of values, only the resource being read is.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ReceivedDocument<'a> {
    api_version: String,
    kind: String,
    cluster: String,
    digest: String,
    revision: String,
    /// Read as text first, then resource by resource ([`ResourcesSeed`]).
    #[serde(borrow)]
    resources: &'a serde_json::value::RawValue,
    /// The bundle's metadata, covered by the digest; absent when it has none.
    #[serde(default)]
    meta: Option<BundleMeta>,
    /// Present when the hub signs what it serves; outside the digest.
    #[serde(default)]
    signature: Option<BundleSignature>,
}

/// The `resources` of a received document: each one checked (depth, identity) as
/// soon as it is read, or why the first bad one is refused. After a bad one the rest
/// are still read (and dropped), so a document that is not JSON, or nests too deep, is
/// refused as that, as before any resource is looked at.
enum ReceivedResources<'a> {
    Good(Vec<ReceivedResource<'a>>),
    Bad(VerifyError),
}

/// One resource as read: its identity and its canonical bytes.
struct ReceivedResource<'a> {
    key: Arc<ResourceKey>,
    canonical: ReceivedBytes<'a>,
}

enum ReceivedBytes<'a> {
    /// The document's own text of the resource, which is already its canonical form
    /// (as a flotilla hub writes every document).
    AsRead(&'a [u8]),
    /// The canonical form, written anew: the document wrote the resource otherwise.
    Written(Vec<u8>),
}

/// Reads the `resources` of a received document; a resource whose identity `previous`
/// (the bundle the reader runs, in key order) has too takes that identity instead of
/// a copy of it, found in one walk of both lists and before any is made.
struct ResourcesSeed<'p> {
    previous: &'p [Arc<Resource>],
}

impl<'de> serde::de::DeserializeSeed<'de> for ResourcesSeed<'_> {
    type Value = ReceivedResources<'de>;

    fn deserialize<D: serde::Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_seq(ResourcesVisitor {
            previous: self.previous,
            marker: std::marker::PhantomData,
        })
    }
}

struct ResourcesVisitor<'p, 'a> {
    previous: &'p [Arc<Resource>],
    marker: std::marker::PhantomData<&'a ()>,
}

impl<'de: 'a, 'a> serde::de::Visitor<'de> for ResourcesVisitor<'_, 'a> {
    type Value = ReceivedResources<'a>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of resources")
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        // A bundle is mostly the one before it again: sized as that one, the list
        // is not grown by doubling (which for 100,000 resources held a third more
        // than needed, and the half before it while copying).
        let mut resources = Vec::with_capacity(self.previous.len());
        let mut bad = None;
        let mut earlier = self.previous.iter().peekable();
        let mut canonical = Vec::new();
        // Each resource is first taken as its text in the document, then read as a
        // tree of values (one resource at a time) to check it and write its canonical
        // form, which is compared with that text.
        while let Some(raw) = seq.next_element::<&'de serde_json::value::RawValue>()? {
            if bad.is_some() {
                continue;
            }
            let index = resources.len();
            // A resource nested deeper than a JSON reader goes is a document that
            // nests too deep (the caller tells that error by its text).
            let value: Value = serde_json::from_str(raw.get()).map_err(serde::de::Error::custom)?;
            if nests_deeper_than(&value, MAX_NESTING_DEPTH) {
                bad = Some(VerifyError::TooDeep { index });
                continue;
            }
            let Some(identity) = identity_of(&value) else {
                bad = Some(VerifyError::BadResource { index });
                continue;
            };
            while earlier.next_if(|r| r.key.parts() < identity).is_some() {}
            let key = match earlier.peek() {
                Some(same) if same.key.parts() == identity => Arc::clone(&same.key),
                _ => Arc::new(ResourceKey::from_parts(identity)),
            };
            canonical.clear();
            write_canonical(&mut canonical, &value);
            drop(value);
            let text = raw.get().as_bytes();
            resources.push(ReceivedResource {
                key,
                canonical: if canonical == text {
                    ReceivedBytes::AsRead(text)
                } else {
                    ReceivedBytes::Written(canonical.clone())
                },
            });
        }
        Ok(match bad {
            Some(err) => ReceivedResources::Bad(err),
            None => ReceivedResources::Good(resources),
        })
    }
}

/// A received document that matches its digest: the bundle, and what the document
/// says beside it (checked against trusted keys by an agent that has some).
#[derive(Clone, Debug)]
pub struct VerifiedDocument {
    pub bundle: Bundle,
    pub revision: String,
    pub signature: Option<BundleSignature>,
}

/// Why a received bundle is not trusted.
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    #[error("bundle is not valid JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("bundle has apiVersion {0:?} and kind {1:?}, expected {API_VERSION:?} and \"Bundle\"")]
    WrongKind(String, String),
    #[error("bundle is for cluster {found:?}, expected {expected:?}")]
    WrongCluster { expected: String, found: String },
    #[error(
        "bundle digest mismatch: the document says {claimed} but its resources hash to {actual}"
    )]
    DigestMismatch { claimed: String, actual: Digest },
    #[error("bundle resource {index} has no apiVersion, kind or metadata.name")]
    BadResource { index: usize },
    #[error(
        "bundle resources are not sorted by (group, kind, namespace, name) or repeat an identity at {index}"
    )]
    NotSorted { index: usize },
    #[error(
        "bundle resource {index} nests arrays and objects deeper than {MAX_NESTING_DEPTH} levels, which flotilla never renders"
    )]
    TooDeep { index: usize },
    #[error(
        "bundle nests arrays and objects deeper than {MAX_NESTING_DEPTH} levels, which flotilla never renders"
    )]
    DocumentTooDeep,
    #[error("bundle metadata does not fit its resources: {0}")]
    BadMeta(String),
}

/// Parses a served Bundle document and checks it: the recomputed digest over the
/// canonical resources must equal the claimed one. This is the only way an agent
/// accepts a bundle.
pub fn verify_document(
    bytes: &[u8],
    expected_cluster: Option<&str>,
) -> Result<Bundle, VerifyError> {
    verify_document_parts(bytes, expected_cluster).map(|verified| verified.bundle)
}

/// [`verify_document`], keeping the document's revision and signature.
pub fn verify_document_parts(
    bytes: &[u8],
    expected_cluster: Option<&str>,
) -> Result<VerifiedDocument, VerifyError> {
    verify(bytes, expected_cluster, None, |text| {
        Canonical::from(text.to_vec())
    })
}

/// [`verify_document_parts`] for a document the caller keeps: the bundle's resources
/// are kept as parts of `document`, not copied out of it, wherever it holds them in
/// their canonical form (as every document a flotilla hub serves does), so the
/// document and its bundle are one copy of the resources' bytes.
pub fn verify_shared_document(
    document: &Arc<Vec<u8>>,
    expected_cluster: Option<&str>,
) -> Result<VerifiedDocument, VerifyError> {
    verify_shared_document_after(document, expected_cluster, None)
}

/// [`verify_shared_document`] for the document that follows `previous` (the bundle an
/// agent runs): a resource whose identity `previous` has too takes that identity, not
/// a copy of it. An agent holds both bundles while it moves from one to the other, and
/// its inventory and report share the identities of the bundle it ran, so for a bundle
/// of many small resources a second set of identities would cost more than their
/// bytes. What is verified, and how, is unchanged.
pub fn verify_shared_document_after(
    document: &Arc<Vec<u8>>,
    expected_cluster: Option<&str>,
    previous: Option<&Bundle>,
) -> Result<VerifiedDocument, VerifyError> {
    let start = document.as_ptr() as usize;
    verify(document, expected_cluster, previous, |text| {
        // `text` is a part of `document` (it was read from it): its offset in it.
        let offset = (text.as_ptr() as usize).wrapping_sub(start);
        if offset
            .checked_add(text.len())
            .is_some_and(|end| end <= document.len())
        {
            Canonical::in_document(document, offset..offset + text.len())
        } else {
            Canonical::from(text.to_vec())
        }
    })
}

/// Why a document (or its list of resources) could not be read: too deep for the JSON
/// reader, or not JSON.
fn unreadable(err: serde_json::Error) -> VerifyError {
    if err.to_string().starts_with("recursion limit exceeded") {
        VerifyError::DocumentTooDeep
    } else {
        VerifyError::Json(err)
    }
}

/// Parses and checks a document; `keep` makes the canonical bytes of a resource
/// whose text in the document is already canonical; the identities `previous` has
/// too are taken from it.
fn verify(
    bytes: &[u8],
    expected_cluster: Option<&str>,
    previous: Option<&Bundle>,
    keep: impl Fn(&[u8]) -> Canonical,
) -> Result<VerifiedDocument, VerifyError> {
    // serde_json stops at 128 levels of nesting: deeper than any document flotilla
    // serves (resources at most MAX_NESTING_DEPTH, wrapped two levels deeper).
    let doc: ReceivedDocument = serde_json::from_slice(bytes).map_err(unreadable)?;
    let resources = serde::de::DeserializeSeed::deserialize(
        ResourcesSeed {
            previous: previous.map_or(&[][..], |b| &b.resources[..]),
        },
        &mut serde_json::Deserializer::from_str(doc.resources.get()),
    )
    .map_err(unreadable)?;
    if doc.api_version != API_VERSION || doc.kind != "Bundle" {
        return Err(VerifyError::WrongKind(doc.api_version, doc.kind));
    }
    if let Some(expected) = expected_cluster
        && expected != doc.cluster
    {
        return Err(VerifyError::WrongCluster {
            expected: expected.to_string(),
            found: doc.cluster,
        });
    }
    let received = match resources {
        ReceivedResources::Good(resources) => resources,
        ReceivedResources::Bad(err) => return Err(err),
    };
    for (index, pair) in received.windows(2).enumerate() {
        if pair[0].key >= pair[1].key {
            return Err(VerifyError::NotSorted { index: index + 1 });
        }
    }
    let mut resources: Vec<Arc<Resource>> = received
        .into_iter()
        .map(|resource| {
            Arc::new(Resource {
                key: resource.key,
                canonical: match resource.canonical {
                    ReceivedBytes::AsRead(text) => keep(text),
                    ReceivedBytes::Written(bytes) => bytes.into(),
                },
            })
        })
        .collect();
    // Collected in place, into the list of what was read (five times larger a
    // resource): kept for the bundle's life, that would be most of the list unused.
    resources.shrink_to_fit();
    if let Some(meta) = &doc.meta {
        if meta.is_empty() {
            return Err(VerifyError::BadMeta(
                "meta is empty (a bundle without metadata has no meta)".into(),
            ));
        }
        meta.check(resources.len()).map_err(VerifyError::BadMeta)?;
    }
    let bundle = Bundle::from_sorted_with_meta(doc.cluster, resources, doc.meta);
    if bundle.digest.as_str() != doc.digest {
        return Err(VerifyError::DigestMismatch {
            claimed: doc.digest,
            actual: bundle.digest,
        });
    }
    Ok(VerifiedDocument {
        bundle,
        revision: doc.revision,
        signature: doc.signature,
    })
}

/// Serialises a JSON value as RFC 8785 canonical JSON.
pub fn to_canonical_vec(value: &Value) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    write_canonical(&mut out, value);
    out
}

/// Writes `value` as RFC 8785 canonical JSON: object members sorted by the UTF-16
/// code units of their names, no insignificant whitespace, ECMAScript number forms,
/// and the minimal string escapes. The walk keeps its own stack instead of
/// recursing, so no value, however deep, can overflow the thread's stack here.
pub fn write_canonical(out: &mut Vec<u8>, value: &Value) {
    let mut stack: Vec<Open<'_>> = Vec::new();
    let mut next = Some(value);
    loop {
        if let Some(value) = next.take() {
            match value {
                Value::Null => out.extend_from_slice(b"null"),
                Value::Bool(true) => out.extend_from_slice(b"true"),
                Value::Bool(false) => out.extend_from_slice(b"false"),
                Value::Number(number) => write_canonical_number(out, number),
                Value::String(text) => write_canonical_string(out, text),
                Value::Array(items) => {
                    out.push(b'[');
                    stack.push(Open::Array(items.iter(), true));
                }
                Value::Object(map) => {
                    out.push(b'{');
                    // serde_json's map is ordered by UTF-8 bytes, which equals UTF-16
                    // order unless a key holds a character at or above U+E000; only
                    // then re-sort.
                    let members = if map.keys().any(|k| k.chars().any(|c| c >= '\u{e000}')) {
                        let mut entries: Vec<_> = map.iter().collect();
                        entries.sort_by(|a, b| a.0.encode_utf16().cmp(b.0.encode_utf16()));
                        Members::Sorted(entries.into_iter())
                    } else {
                        Members::InOrder(map.iter())
                    };
                    stack.push(Open::Object(members, true));
                }
            }
        }
        let Some(open) = stack.last_mut() else {
            return;
        };
        match open {
            Open::Array(items, first) => match items.next() {
                Some(item) => {
                    if !std::mem::take(first) {
                        out.push(b',');
                    }
                    next = Some(item);
                }
                None => {
                    out.push(b']');
                    stack.pop();
                }
            },
            Open::Object(members, first) => match members.next() {
                Some((key, item)) => {
                    if !std::mem::take(first) {
                        out.push(b',');
                    }
                    write_canonical_string(out, key);
                    out.push(b':');
                    next = Some(item);
                }
                None => {
                    out.push(b'}');
                    stack.pop();
                }
            },
        }
    }
}

/// An array or object being written by [`write_canonical`], with whether its first
/// element is still to come.
enum Open<'a> {
    Array(std::slice::Iter<'a, Value>, bool),
    Object(Members<'a>, bool),
}

enum Members<'a> {
    InOrder(serde_json::map::Iter<'a>),
    Sorted(std::vec::IntoIter<(&'a String, &'a Value)>),
}

impl<'a> Iterator for Members<'a> {
    type Item = (&'a String, &'a Value);
    fn next(&mut self) -> Option<Self::Item> {
        match self {
            Members::InOrder(members) => members.next(),
            Members::Sorted(members) => members.next(),
        }
    }
}

/// Integers beyond 2^53 are not exactly representable in the IEEE 754 doubles that
/// RFC 8785 is defined over, so they are written the way ECMAScript would print them.
const MAX_SAFE_INTEGER: u64 = 1 << 53;

fn write_canonical_number(out: &mut Vec<u8>, number: &serde_json::Number) {
    if let Some(n) = number.as_u64()
        && n <= MAX_SAFE_INTEGER
    {
        let _ = write!(out, "{n}");
        return;
    }
    if let Some(n) = number.as_i64()
        && n.unsigned_abs() <= MAX_SAFE_INTEGER
    {
        let _ = write!(out, "{n}");
        return;
    }
    let float = number.as_f64().unwrap_or(0.0);
    if float == 0.0 {
        // ECMAScript prints negative zero as "0".
        out.push(b'0');
    } else if float.is_finite() {
        let mut buffer = ryu_js::Buffer::new();
        out.extend_from_slice(buffer.format_finite(float).as_bytes());
    } else {
        // serde_json cannot hold NaN or infinities; this arm is unreachable in practice.
        out.extend_from_slice(b"null");
    }
}

/// Writes a JSON string with exactly the escapes RFC 8785 prescribes.
pub fn write_canonical_string(out: &mut Vec<u8>, text: &str) {
    out.push(b'"');
    let bytes = text.as_bytes();
    let mut start = 0;
    for (index, &byte) in bytes.iter().enumerate() {
        let escape: &[u8] = match byte {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x08 => b"\\b",
            0x0c => b"\\f",
            0x00..=0x1f => {
                out.extend_from_slice(&bytes[start..index]);
                out.extend_from_slice(format!("\\u{byte:04x}").as_bytes());
                start = index + 1;
                continue;
            }
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..index]);
        out.extend_from_slice(escape);
        start = index + 1;
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn canonical(value: Value) -> String {
        String::from_utf8(to_canonical_vec(&value)).expect("canonical JSON is UTF-8")
    }

    #[test]
    fn a_tenant_writes_only_in_its_namespaces_and_the_cluster_scoped_kinds_it_names() {
        let key = |group: &str, kind: &str, namespace: &str, name: &str| {
            ResourceKey::new(group, kind, namespace, name)
        };
        let of = |key: &ResourceKey| {
            TenantRefusal::of(
                ["shop-*", "shop"],
                ["PriorityClass", "Widget.shop.example"],
                key,
            )
        };
        for (resource, expected) in [
            (key("apps", "Deployment", "shop-a", "pos"), None),
            (
                key("apps", "Deployment", "bank", "pos"),
                Some(TenantRefusal::OtherNamespace),
            ),
            (key("", "Namespace", "", "shop"), None),
            (
                key("", "Namespace", "", "kube-system"),
                Some(TenantRefusal::NotItsNamespace),
            ),
            (key("scheduling.k8s.io", "PriorityClass", "", "high"), None),
            (key("shop.example", "Widget", "", "w"), None),
            (
                key("other.example", "Widget", "", "w"),
                Some(TenantRefusal::ClusterScoped),
            ),
            (
                key("rbac.authorization.k8s.io", "ClusterRole", "", "admin"),
                Some(TenantRefusal::ClusterScoped),
            ),
        ] {
            assert_eq!(of(&resource), expected, "{resource}");
        }
    }

    #[test]
    fn sorts_keys_and_drops_whitespace() {
        assert_eq!(
            canonical(json!({"b": [1, 2], "a": {"d": true, "c": null}})),
            r#"{"a":{"c":null,"d":true},"b":[1,2]}"#
        );
    }

    #[test]
    fn numbers_use_ecmascript_forms() {
        assert_eq!(
            canonical(json!([
                1.0,
                -0.0,
                1e21,
                1.5e-7,
                0.1,
                9007199254740993u64,
                -5
            ])),
            "[1,0,1e+21,1.5e-7,0.1,9007199254740992,-5]"
        );
    }

    #[test]
    fn strings_use_minimal_escapes() {
        assert_eq!(
            canonical(json!("a\"b\\c\n\u{1}\u{7f}\u{2028}é")),
            "\"a\\\"b\\\\c\\n\\u0001\u{7f}\u{2028}é\""
        );
    }

    #[test]
    fn keys_sort_by_utf16_code_units() {
        // U+1F600 is a surrogate pair (D83D DE00) and so sorts before U+E000 in UTF-16,
        // although its UTF-8 form sorts after.
        assert_eq!(
            canonical(json!({"\u{e000}": 1, "\u{1f600}": 2})),
            "{\"\u{1f600}\":2,\"\u{e000}\":1}"
        );
    }

    #[test]
    fn the_resource_list_length_is_known_before_it_is_written() {
        let resources: Vec<Arc<Resource>> = ["a", "b", "c"]
            .iter()
            .map(|name| {
                let resource =
                    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}});
                let key = ResourceKey::of(&resource).expect("has identity");
                Arc::new(Resource::new(key, &resource))
            })
            .collect();
        for count in 0..=3 {
            let bundle = Bundle::new("edge-1", resources[..count].to_vec());
            assert_eq!(
                resource_list_bytes(&bundle.resources),
                bundle.canonical_body().len(),
                "{count} resources"
            );
        }
    }

    #[test]
    fn a_key_compares_hashes_and_travels_as_its_four_strings() {
        use std::hash::{BuildHasher, BuildHasherDefault};
        type Hasher = BuildHasherDefault<std::collections::hash_map::DefaultHasher>;
        let parts = [
            ("", "ConfigMap", "demo", "a"),
            ("", "ConfigMap", "demo", "ab"),
            ("", "ConfigMap", "demob", ""),
            ("", "ConfigMapd", "emo", "a"),
            ("apps", "Deployment", "", "web"),
            ("app", "sDeployment", "", "web"),
        ];
        let keys: Vec<ResourceKey> = parts
            .iter()
            .map(|&(g, k, ns, n)| ResourceKey::new(g, k, ns, n))
            .collect();
        for (key, part) in keys.iter().zip(&parts) {
            assert_eq!(key.parts(), *part);
            assert_eq!(
                Hasher::default().hash_one(key),
                Hasher::default().hash_one(part),
            );
        }
        // Equal only when each of the four is: the same letters split otherwise differ.
        for (a, pa) in keys.iter().zip(&parts) {
            for (b, pb) in keys.iter().zip(&parts) {
                assert_eq!(a == b, pa == pb, "{a:?} {b:?}");
                assert_eq!(a.cmp(b), pa.cmp(pb), "{a:?} {b:?}");
            }
        }
        let key = &keys[4];
        let wire = serde_json::to_value(key).expect("serialises");
        assert_eq!(
            wire,
            json!({"group": "apps", "kind": "Deployment", "namespace": "", "name": "web"})
        );
        let back: ResourceKey = serde_json::from_value(wire).expect("reads");
        assert_eq!(&back, key);
        assert!(serde_json::from_value::<ResourceKey>(json!({"group": "", "kind": "x"})).is_err());
        assert_eq!(key.to_string(), "Deployment.apps/web");
        assert_eq!(keys[0].to_string(), "ConfigMap demo/a");
        assert_eq!(
            format!("{:?}", keys[0]),
            r#"ResourceKey { group: "", kind: "ConfigMap", namespace: "demo", name: "a" }"#
        );
    }

    #[test]
    fn the_digest_of_a_reader_is_the_digest_of_its_bytes() {
        // Longer than one block of the reader, and not a multiple of one.
        let bytes: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        for len in [0, 1, 65_536, 65_537, bytes.len()] {
            let read = Digest::of_reader(&bytes[..len]).expect("reads");
            assert_eq!(read, Digest::of(&bytes[..len]), "{len}");
        }
    }

    #[test]
    fn digest_round_trips_through_a_document() {
        let resource = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "namespace": "d"}});
        let key = ResourceKey::of(&resource).expect("has identity");
        let bundle = Bundle::new("edge-1", vec![Arc::new(Resource::new(key, &resource))]);
        let document = bundle.document("main@sha1:abc");
        let verified = verify_document(&document, Some("edge-1")).expect("verifies");
        assert_eq!(verified.digest, bundle.digest);
        let tampered = String::from_utf8(document)
            .expect("utf-8")
            .replace("\"x\"", "\"y\"");
        assert!(matches!(
            verify_document(tampered.as_bytes(), Some("edge-1")),
            Err(VerifyError::DigestMismatch { .. })
        ));
    }

    #[test]
    fn a_signed_document_is_canonical_and_its_signature_outside_the_digest() {
        let resource = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}});
        let key = ResourceKey::of(&resource).expect("has identity");
        let bundle = Bundle::new("edge-1", vec![Arc::new(Resource::new(key, &resource))]);
        let signer = crate::signing::SigningKey::from_seed([7; 32]);
        let signature = signer.sign("edge-1", &bundle.digest, "main@sha1:abc", 12);
        let document = crate::signing::signed_document_bytes(
            "edge-1",
            &bundle.digest,
            "main@sha1:abc",
            &bundle.canonical_body(),
            Some(&signature),
        );
        let parsed: Value = serde_json::from_slice(&document).expect("JSON");
        assert_eq!(
            to_canonical_vec(&parsed),
            document,
            "the document is canonical"
        );
        assert_eq!(parsed["signature"]["sequence"], json!(12));
        let verified = verify_document_parts(&document, Some("edge-1")).expect("verifies");
        assert_eq!(verified.bundle.digest, bundle.digest);
        assert_eq!(verified.revision, "main@sha1:abc");
        assert_eq!(verified.signature, Some(signature));
        let unsigned = verify_document_parts(&bundle.document("r"), None).expect("verifies");
        assert_eq!(unsigned.signature, None);
    }

    /// A ConfigMap whose `data` holds arrays nested until the resource is `depth` deep.
    fn nested_config_map(depth: usize) -> Value {
        let mut value = json!(1);
        for _ in 0..depth - 1 {
            value = json!([value]);
        }
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "deep"}, "data": value})
    }

    fn two_config_maps() -> Vec<Arc<Resource>> {
        ["a", "b"]
            .iter()
            .map(|name| {
                let value =
                    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}});
                Arc::new(Resource::new(
                    ResourceKey::of(&value).expect("identity"),
                    &value,
                ))
            })
            .collect()
    }

    fn chain_meta() -> BundleMeta {
        BundleMeta {
            workloads: vec!["db".into(), "app".into()],
            phases: vec![vec!["db".into()], vec!["app".into()]],
            drift: [("app".to_string(), DriftPolicy::Report)].into(),
            ..BundleMeta::default()
        }
    }

    #[test]
    fn a_bundle_without_metadata_keeps_the_digest_of_its_resource_list() {
        let plain = Bundle::from_sorted("c", two_config_maps());
        let empty =
            Bundle::from_sorted_with_meta("c", two_config_maps(), Some(BundleMeta::default()));
        assert!(empty.meta.is_none());
        assert_eq!(plain.digest, empty.digest);
        assert_eq!(plain.digest, Digest::of(&plain.canonical_body()));
        assert!(plain.canonical_body().starts_with(b"["));
        assert!(
            !String::from_utf8(plain.document("main@sha1:0"))
                .expect("UTF-8")
                .contains("\"meta\"")
        );
    }

    #[test]
    fn metadata_is_covered_by_the_digest_and_travels_in_the_document() {
        let plain = Bundle::from_sorted("c", two_config_maps());
        let with = Bundle::from_sorted_with_meta("c", two_config_maps(), Some(chain_meta()));
        assert_ne!(plain.digest, with.digest);
        let body = with.canonical_body();
        assert_eq!(with.digest, Digest::of(&body));
        let expected_body = to_canonical_vec(&json!({
            "meta": {"drift": {"app": "report"}, "phases": [["db"], ["app"]], "workloads": ["db", "app"]},
            "resources": two_config_maps().iter().map(|r| r.value()).collect::<Vec<_>>(),
        }));
        assert_eq!(body, expected_body);
        let document = with.document("main@sha1:0");
        // The document is canonical JSON, `meta` between `kind` and `resources`.
        let parsed: Value = serde_json::from_slice(&document).expect("JSON");
        assert_eq!(to_canonical_vec(&parsed), document);
        let back = verify_document(&document, Some("c")).expect("verifies");
        assert_eq!(back.digest, with.digest);
        assert_eq!(back.meta.as_deref(), Some(&chain_meta()));
        assert_eq!(back.resource_phases(), vec![0, 1]);
        assert_eq!(back.phase_count(), 2);
        assert_eq!(chain_meta().drift_of(1), DriftPolicy::Report);
        assert_eq!(chain_meta().drift_of(0), DriftPolicy::Correct);
        // Changing the metadata in transit breaks the digest.
        let tampered = String::from_utf8(document)
            .expect("UTF-8")
            .replace("\"report\"", "\"correct\"");
        assert!(matches!(
            verify_document(tampered.as_bytes(), Some("c")),
            Err(VerifyError::DigestMismatch { .. })
        ));
    }

    #[test]
    fn metadata_that_does_not_fit_the_resources_is_refused() {
        let mut short = chain_meta();
        short.workloads.pop();
        let mut unphased = chain_meta();
        unphased.phases.pop();
        for meta in [short, unphased] {
            let bundle = Bundle::from_sorted_with_meta("c", two_config_maps(), Some(meta));
            assert!(
                matches!(
                    verify_document(&bundle.document("r"), Some("c")),
                    Err(VerifyError::BadMeta(_))
                ),
                "{:?}",
                bundle.meta
            );
        }
        let unknown = r#"{"apiVersion":"flotilla.dev/v1alpha1","cluster":"c","digest":"sha256:00","kind":"Bundle","meta":{"tenants":{}},"resources":[],"revision":"r"}"#;
        assert!(verify_document(unknown.as_bytes(), Some("c")).is_err());
    }

    fn hooked_meta(hooks: Vec<HookMark>) -> BundleMeta {
        BundleMeta {
            workloads: vec!["web".into(), "web".into()],
            hooks,
            ..BundleMeta::default()
        }
    }

    #[test]
    fn hook_marks_travel_camel_case_and_must_name_resources_of_the_bundle() {
        let migrate = HookMark {
            resource: 1,
            events: vec!["pre-install".into(), "pre-upgrade".into()],
            weight: -5,
            delete_policies: vec!["before-hook-creation".into()],
        };
        let meta = hooked_meta(vec![migrate.clone()]);
        assert_eq!(
            serde_json::to_value(&meta).expect("serialises")["hooks"],
            json!([{"resource": 1, "events": ["pre-install", "pre-upgrade"], "weight": -5,
                    "deletePolicies": ["before-hook-creation"]}])
        );
        let bundle = Bundle::from_sorted_with_meta("c", two_config_maps(), Some(meta));
        let back = verify_document(&bundle.document("r"), Some("c")).expect("verifies");
        let back_meta = back.meta.as_deref().expect("has meta");
        assert_eq!(back_meta.hook_of(1), Some(&migrate));
        assert_eq!(back_meta.hook_of(0), None);
        assert_eq!(
            features::needed_by_body(&bundle.canonical_body()),
            Some(vec![features::META, features::HOOKS])
        );
        let out_of_range = HookMark {
            resource: 2,
            ..migrate.clone()
        };
        let unknown_event = HookMark {
            events: vec!["crd-install".into()],
            ..migrate.clone()
        };
        let unknown_policy = HookMark {
            delete_policies: vec!["never".into()],
            ..migrate.clone()
        };
        for (hooks, expected) in [
            (vec![out_of_range], "resource 2 of a bundle of 2"),
            (
                vec![migrate.clone(), migrate.clone()],
                "out of order or twice",
            ),
            (vec![unknown_event], "unknown hook event \"crd-install\""),
            (vec![unknown_policy], "unknown hook delete policy \"never\""),
        ] {
            let bundle =
                Bundle::from_sorted_with_meta("c", two_config_maps(), Some(hooked_meta(hooks)));
            match verify_document(&bundle.document("r"), Some("c")) {
                Err(VerifyError::BadMeta(message)) => {
                    assert!(message.contains(expected), "{message}")
                }
                other => panic!("{expected}: {other:?}"),
            }
        }
    }

    #[test]
    fn depth_is_measured_without_recursion() {
        assert_eq!(nesting_depth(&json!(1)), 0);
        assert_eq!(nesting_depth(&json!({"a": [1, {"b": []}]})), 4);
        assert!(!nests_deeper_than(&json!({"a": [1]}), 2));
        assert!(nests_deeper_than(&json!({"a": [[1]]}), 2));
        assert!(!nests_deeper_than(&json!([]), 1));
        assert!(nests_deeper_than(&json!([]), 0));
        assert_eq!(
            nesting_depth(&nested_config_map(MAX_NESTING_DEPTH)),
            MAX_NESTING_DEPTH
        );
    }

    #[test]
    fn sizes_are_those_of_compact_json() {
        for value in [
            json!({"a": [1, -20, 3.5, null, true, false, "xyz"], "bc": {}}),
            json!([]),
            json!(""),
            json!(u64::MAX),
        ] {
            let exact = serde_json::to_vec(&value).expect("serialises").len();
            let approximate = approximate_json_size(&value, usize::MAX);
            assert!(
                approximate >= exact.saturating_sub(16) && approximate <= exact + 24,
                "{value}: {approximate} against {exact}"
            );
        }
        let big = Value::Array(vec![json!("x".repeat(1000)); 1000]);
        assert!(approximate_json_size(&big, 10_000) <= 10_000 + 1002);
    }

    #[test]
    fn the_agent_refuses_what_the_renderer_would_never_produce() {
        let bundle_of = |resource: Value| {
            let key = ResourceKey::of(&resource).expect("has identity");
            Bundle::new("edge-1", vec![Arc::new(Resource::new(key, &resource))])
        };
        let at_limit = bundle_of(nested_config_map(MAX_NESTING_DEPTH));
        assert!(verify_document(&at_limit.document("r"), Some("edge-1")).is_ok());
        let deeper = bundle_of(nested_config_map(MAX_NESTING_DEPTH + 1));
        let err = verify_document(&deeper.document("r"), Some("edge-1")).expect_err("too deep");
        assert_eq!(
            err.to_string(),
            "bundle resource 0 nests arrays and objects deeper than 100 levels, which flotilla never renders"
        );
        let far_deeper = bundle_of(nested_config_map(300));
        let err = verify_document(&far_deeper.document("r"), Some("edge-1")).expect_err("too deep");
        assert!(matches!(err, VerifyError::DocumentTooDeep), "{err}");
    }

    #[test]
    fn the_document_is_written_at_once_and_its_body_found_in_it() {
        let signature = BundleSignature {
            key_id: "k".into(),
            sequence: 7,
            sig: "c2ln".into(),
        };
        let with_meta =
            Bundle::from_sorted_with_meta("edge-1", two_config_maps(), Some(chain_meta()));
        let without_meta = Bundle::from_sorted("edge-1", two_config_maps());
        for bundle in [&with_meta, &without_meta] {
            let unsigned = bundle.document("r");
            assert_eq!(
                unsigned,
                document_bytes("edge-1", &bundle.digest, "r", &bundle.canonical_body())
            );
            for document in [unsigned.clone(), with_signature(&unsigned, &signature)] {
                let mut read = document.clone();
                let body = with_body_in_document(&mut read, <[u8]>::to_vec).expect("found");
                assert_eq!(body, bundle.canonical_body());
                assert_eq!(Digest::of(&body), bundle.digest);
                assert_eq!(read, document, "the document is put back");
                // Without metadata the body is one run of the document's bytes, found
                // without writing to it; with metadata it is not.
                assert_eq!(
                    resource_list_in_document(&document),
                    bundle.meta.is_none().then_some(&body[..])
                );
            }
        }
        // Laid out otherwise: not found, or found and not hashing to the digest.
        let mut pretty = serde_json::to_vec_pretty(
            &serde_json::from_slice::<Value>(&without_meta.document("r")).expect("json"),
        )
        .expect("serialises");
        let found = with_body_in_document(&mut pretty, Digest::of);
        assert!(found.is_none_or(|digest| digest != without_meta.digest));
        assert_eq!(
            with_body_in_document(&mut b"{\"damaged\"".to_vec(), Digest::of),
            None
        );
    }

    #[test]
    fn a_kept_document_holds_its_bundles_resources_without_copying_them() {
        let with_meta =
            Bundle::from_sorted_with_meta("edge-1", two_config_maps(), Some(chain_meta()));
        let without_meta = Bundle::from_sorted("edge-1", two_config_maps());
        for bundle in [&with_meta, &without_meta] {
            let document = Arc::new(bundle.document("r"));
            let inside = document.as_ptr_range();
            let shared = verify_shared_document(&document, Some("edge-1")).expect("verifies");
            assert_eq!(shared.bundle.digest, bundle.digest);
            assert_eq!(shared.bundle.resources, bundle.resources);
            for resource in &shared.bundle.resources {
                assert!(
                    inside.contains(&resource.canonical.as_ptr()),
                    "{} is a part of the document",
                    resource.key
                );
            }
            // Read from a document it does not keep, each resource is its own copy.
            let copied = verify_document_parts(&document, Some("edge-1")).expect("verifies");
            assert_eq!(copied.bundle.resources, bundle.resources);
            assert!(
                copied
                    .bundle
                    .resources
                    .iter()
                    .all(|r| !inside.contains(&r.canonical.as_ptr()))
            );
            // A document that writes its resources otherwise (spaced out) is the same
            // bundle: its resources are written anew in canonical form.
            let pretty = Arc::new(
                serde_json::to_vec_pretty(
                    &serde_json::from_slice::<Value>(&document).expect("json"),
                )
                .expect("serialises"),
            );
            let inside = pretty.as_ptr_range();
            let spaced = verify_shared_document(&pretty, Some("edge-1")).expect("verifies");
            assert_eq!(spaced.bundle.digest, bundle.digest);
            assert_eq!(spaced.bundle.resources, bundle.resources);
            assert!(
                spaced
                    .bundle
                    .resources
                    .iter()
                    .all(|r| !inside.contains(&r.canonical.as_ptr()))
            );
        }
        // A tampered resource still fails the digest when it is kept in place.
        let tampered = String::from_utf8(without_meta.document("r"))
            .expect("utf-8")
            .replace("\"name\":\"b\"", "\"name\":\"c\"");
        let err = verify_shared_document(&Arc::new(tampered.into_bytes()), Some("edge-1"))
            .expect_err("refused");
        assert!(matches!(err, VerifyError::DigestMismatch { .. }), "{err}");
    }

    #[test]
    fn the_next_document_takes_the_identities_it_shares_with_the_bundle_before() {
        let config_map = |name: &str, level: &str| {
            let value = json!({"apiVersion": "v1", "kind": "ConfigMap",
                               "metadata": {"name": name}, "data": {"level": level}});
            Arc::new(Resource::new(
                ResourceKey::of(&value).expect("identity"),
                &value,
            ))
        };
        let before = Bundle::new(
            "edge-1",
            vec![config_map("a", "info"), config_map("c", "info")],
        );
        let next = Bundle::new(
            "edge-1",
            vec![
                config_map("a", "debug"),
                config_map("b", "info"),
                config_map("c", "info"),
            ],
        );
        let document = Arc::new(next.document("r"));
        let alone = verify_shared_document(&document, Some("edge-1")).expect("verifies");
        let after = verify_shared_document_after(&document, Some("edge-1"), Some(&before))
            .expect("verifies");
        // The same bundle either way.
        assert_eq!(after.bundle.digest, next.digest);
        assert_eq!(after.bundle.resources, alone.bundle.resources);
        let shares = |name: &str| {
            let key = &after
                .bundle
                .resources
                .iter()
                .find(|r| r.key.name() == name)
                .expect("in the bundle")
                .key;
            before.resources.iter().any(|r| Arc::ptr_eq(&r.key, key))
        };
        // a changed and c did not: both keep the identity they had; b is new.
        assert!(shares("a") && shares("c") && !shares("b"));
        // A tampered document is refused as without a bundle before it.
        let tampered = String::from_utf8(next.document("r"))
            .expect("utf-8")
            .replace("\"name\":\"b\"", "\"name\":\"bb\"");
        let err = verify_shared_document_after(
            &Arc::new(tampered.into_bytes()),
            Some("edge-1"),
            Some(&before),
        )
        .expect_err("refused");
        assert!(matches!(err, VerifyError::DigestMismatch { .. }), "{err}");
    }

    #[test]
    fn parses_only_well_formed_digests() {
        assert!(Digest::parse(&format!("sha256:{}", "a".repeat(64))).is_ok());
        assert!(Digest::parse(&format!("sha256:{}", "A".repeat(64))).is_err());
        assert!(Digest::parse("sha256:abc").is_err());
        assert!(Digest::parse("md5:0").is_err());
    }
}
