//! How requests and renders cross the pipes between the hub and its render
//! process: the snapshot, limits and the render to render since going in, the
//! names of the clusters whose previous bundles the child needs, and the render
//! coming back with each distinct resource and list once.

use std::collections::{BTreeMap, HashMap};
use std::io::{self, Read, Write};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use flotilla_core::bundle::{Bundle, Digest, Resource, ResourceKey};
use flotilla_core::diagnostic::Diagnostic;
use flotilla_core::limits::Limits;
use flotilla_core::rollout::RolloutPlan;
use flotilla_core::snapshot::FleetSnapshot;
use flotilla_render::inputs::{ClusterInput, InputDigest, WorkloadInputs};
use flotilla_render::sops::DecryptionKeys;
use flotilla_render::{ClusterProvenance, PatchMatches, Provenance, ReleaseWarnings, RenderOutput};

/// What a render is made with besides the snapshot.
pub(super) struct RenderSettings {
    pub limits: Limits,
    pub helm_seed: Option<[u8; 32]>,
    /// The identities SOPS files are opened with (sent over the pipe to the render
    /// process, never written anywhere).
    pub decryption: Arc<DecryptionKeys>,
}

impl RenderSettings {
    /// Budgets only: the public Helm seed, no decryption key.
    #[cfg(test)]
    pub fn plain(limits: Limits) -> RenderSettings {
        RenderSettings {
            limits,
            helm_seed: None,
            decryption: Arc::default(),
        }
    }
}

/// Everything of the input but the files' contents.
#[derive(Serialize, Deserialize)]
struct InputHeader {
    limits: Limits,
    /// The Helm seed, in hex (absent: the public seed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    helm_seed: Option<String>,
    /// The age identities SOPS files are opened with.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    decryption: Vec<String>,
    revision: String,
    problems: Vec<Diagnostic>,
    skipped: BTreeMap<String, String>,
    /// The files read through symlinks, and their targets ([`FleetSnapshot::links`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    links: BTreeMap<String, String>,
    /// Whether the snapshot stopped at a budget ([`FleetSnapshot::incomplete`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    incomplete: bool,
}

/// A render's header. Memberships and labels are written as changes against the
/// render the reader has, when it has one (see [`Known::Render`]).
#[derive(Serialize, Deserialize)]
struct Header {
    revision: String,
    diagnostics: Vec<Diagnostic>,
    memberships: Changes<Vec<String>>,
    labels: Changes<BTreeMap<String, String>>,
    rollouts: RolloutPlan,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    generated_from_public_seed: bool,
    #[serde(default)]
    unsealed_for_agent_keys: bool,
    /// Each cluster's `spec.agentKey`, as `age1…`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    agent_keys: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    charts: BTreeMap<String, String>,
}

/// A map, whole or as changes against the one the reader has: the entries that
/// differ or are new, and the keys that are gone.
#[derive(Serialize, Deserialize)]
struct Changes<V> {
    /// Whether `changed` and `gone` are against the reader's render.
    against_known: bool,
    changed: BTreeMap<String, V>,
    gone: Vec<String>,
}

impl<V: Clone> Changes<V> {
    fn whole(map: &BTreeMap<String, V>) -> Changes<V> {
        Changes {
            against_known: false,
            changed: map.clone(),
            gone: Vec::new(),
        }
    }

    /// The entries of `now` whose cluster's own inputs (its file and its groups,
    /// which are all its memberships and labels come from) differ from `since`'s.
    fn by_inputs(since: &Provenance, now: &RenderOutput, map: &BTreeMap<String, V>) -> Changes<V> {
        let own = |p: &Provenance, name: &str| p.inputs.clusters.get(name).map(|i| i.own);
        Changes {
            against_known: true,
            changed: map
                .iter()
                .filter(|(name, _)| {
                    own(since, name).is_none() || own(since, name) != own(&now.provenance, name)
                })
                .map(|(name, value)| (name.clone(), value.clone()))
                .collect(),
            gone: since
                .inputs
                .clusters
                .keys()
                .filter(|name| !map.contains_key(*name))
                .cloned()
                .collect(),
        }
    }

    fn read(self, since: Option<&BTreeMap<String, V>>) -> io::Result<BTreeMap<String, V>> {
        if !self.against_known {
            return Ok(self.changed);
        }
        let mut map = since
            .ok_or_else(|| {
                invalid("the render answered with changes to a render the hub does not have")
            })?
            .clone();
        for key in &self.gone {
            map.remove(key);
        }
        map.extend(self.changed);
        Ok(map)
    }
}

/// The names of the clusters whose previous bundles the child needs.
pub(super) fn write_request(out: &mut impl Write, names: &[String]) -> io::Result<()> {
    put_len(out, names.len())?;
    for name in names {
        put_bytes(out, name.as_bytes())?;
    }
    out.flush()
}

/// Reads what [`write_request`] wrote.
pub(super) fn read_request(input: &mut impl Read) -> io::Result<Vec<String>> {
    let mut names = Vec::new();
    for _ in 0..read_len(input)? {
        names.push(read_text(input)?);
    }
    Ok(names)
}

fn put_len(out: &mut impl Write, len: usize) -> io::Result<()> {
    out.write_all(&(len as u64).to_le_bytes())
}

fn put_bytes(out: &mut impl Write, bytes: &[u8]) -> io::Result<()> {
    put_len(out, bytes.len())?;
    out.write_all(bytes)
}

/// The render a request is rendered since.
pub(super) enum Since<P> {
    Nothing,
    /// This one, sent with the request (its digests and provenance).
    Given(P),
    /// The one the render process answered last and keeps.
    Kept,
}

/// Writes a snapshot and the limits to render it within: a JSON header, then each
/// distinct file content once (paths to the same content share it), then each path
/// with the index of its content; then which render to render since: none, one
/// given (as [`encode_output`] writes it, its bundles as digests only), or the one
/// the process keeps.
pub(super) fn encode_input(
    snapshot: &FleetSnapshot,
    since: Since<&RenderOutput>,
    settings: &RenderSettings,
    out: &mut impl Write,
) -> io::Result<()> {
    let header = InputHeader {
        limits: settings.limits.clone(),
        helm_seed: settings.helm_seed.map(hex::encode),
        decryption: settings.decryption.identity_lines(),
        revision: snapshot.revision.clone(),
        problems: snapshot.problems.clone(),
        skipped: snapshot.skipped.clone(),
        links: snapshot.links.clone(),
        incomplete: snapshot.incomplete,
    };
    put_bytes(out, &serde_json::to_vec(&header).map_err(io::Error::other)?)?;
    let (order, indexes) = by_address(snapshot.files.values().map(|text| Some(&**text)));
    put_len(out, order.len())?;
    for text in order {
        put_bytes(out, text.as_bytes())?;
    }
    put_len(out, snapshot.files.len())?;
    for (path, i) in snapshot.files.keys().zip(indexes.into_iter().flatten()) {
        put_bytes(out, path.as_bytes())?;
        put_len(out, i)?;
    }
    put_len(out, snapshot.binaries.len())?;
    for (path, bytes) in &snapshot.binaries {
        put_bytes(out, path.as_bytes())?;
        put_bytes(out, bytes)?;
    }
    match since {
        Since::Nothing => put_len(out, 0),
        Since::Given(previous) => {
            put_len(out, 1)?;
            encode_output(previous, Known::Digests, out)
        }
        Since::Kept => put_len(out, 2),
    }
}

/// Reads what [`encode_input`] wrote, as it arrives (the files are not held twice),
/// and nothing after it.
pub(super) fn decode_input(
    mut input: impl Read,
) -> io::Result<(RenderSettings, FleetSnapshot, Since<RenderOutput>)> {
    let header: InputHeader = serde_json::from_slice(&read_bytes(&mut input)?).map_err(invalid)?;
    let helm_seed = match &header.helm_seed {
        None => None,
        Some(text) => Some(
            hex::decode(text)
                .ok()
                .and_then(|bytes| <[u8; 32]>::try_from(bytes.as_slice()).ok())
                .ok_or_else(|| invalid("the Helm seed is not 32 bytes in hex"))?,
        ),
    };
    let count = read_len(&mut input)?;
    let mut texts: Vec<Arc<str>> = Vec::new();
    for _ in 0..count {
        texts.push(Arc::from(read_text(&mut input)?));
    }
    let count = read_len(&mut input)?;
    let mut files = BTreeMap::new();
    for _ in 0..count {
        let path = read_text(&mut input)?;
        let content = texts
            .get(read_len(&mut input)?)
            .ok_or_else(|| invalid("file index out of range"))?;
        files.insert(path, content.clone());
    }
    let count = read_len(&mut input)?;
    let mut binaries = BTreeMap::new();
    for _ in 0..count {
        let path = read_text(&mut input)?;
        binaries.insert(path, Arc::from(read_bytes(&mut input)?));
    }
    let since = match read_len(&mut input)? {
        0 => Since::Nothing,
        1 => Since::Given(read_output(&mut input, Known::Digests)?),
        2 => Since::Kept,
        _ => return Err(invalid("unknown render to render since")),
    };
    let snapshot = FleetSnapshot {
        incomplete: header.incomplete,
        files,
        revision: header.revision,
        problems: header.problems,
        skipped: header.skipped,
        binaries,
        hash_keys: Default::default(),
        links: header.links,
    };
    let decryption = DecryptionKeys::from_lines(&header.decryption).map_err(invalid)?;
    let settings = RenderSettings {
        limits: header.limits,
        helm_seed,
        decryption: Arc::new(decryption),
    };
    Ok((settings, snapshot, since))
}

/// Marks a bundle, or a cluster's inputs or provenance, that is the same as in the
/// render the reader already has.
const SAME: usize = usize::MAX;

/// What the reader of a render already knows of it.
#[derive(Clone, Copy)]
pub enum Known<'a> {
    /// Nothing: everything is written.
    Nothing,
    /// This render: what is the same in it is written as [`SAME`].
    Render(&'a RenderOutput),
    /// Nothing, but it needs the bundles' digests only: every bundle is written as
    /// [`SAME`] with its digest, and read as a bundle without resources; the
    /// memberships, labels and rollout plan are left out.
    Digests,
}

impl Header {
    /// The header of `rendered` for a reader that knows `known`.
    fn of(rendered: &RenderOutput, known: Known<'_>) -> Header {
        // A reader that needs the digests only (a render process rendering since this
        // render) needs none of the memberships, labels and rollout plan either. One
        // that has a render of the whole fleet gets the memberships and labels of the
        // clusters whose own inputs changed since.
        let (memberships, labels) = match known {
            Known::Digests => (
                Changes::whole(&BTreeMap::new()),
                Changes::whole(&BTreeMap::new()),
            ),
            Known::Render(since)
                if !since.provenance.inputs.is_empty()
                    && !rendered.provenance.inputs.is_empty() =>
            {
                (
                    Changes::by_inputs(&since.provenance, rendered, &rendered.memberships),
                    Changes::by_inputs(&since.provenance, rendered, &rendered.labels),
                )
            }
            _ => (
                Changes::whole(&rendered.memberships),
                Changes::whole(&rendered.labels),
            ),
        };
        Header {
            revision: rendered.revision.clone(),
            diagnostics: rendered.diagnostics.clone(),
            memberships,
            labels,
            rollouts: match known {
                Known::Digests => RolloutPlan::default(),
                _ => rendered.rollouts.clone(),
            },
            generated_from_public_seed: rendered.generated_from_public_seed,
            unsealed_for_agent_keys: rendered.unsealed_for_agent_keys,
            agent_keys: rendered
                .agent_keys
                .iter()
                .map(|(cluster, key)| (cluster.clone(), key.to_string()))
                .collect(),
            charts: rendered.charts.clone(),
        }
    }
}

/// Writes a render: the header, every distinct resource once, then each bundle as
/// its cluster, digest and resource indexes, then its provenance (what an
/// incremental render from it compares). What the reader knows (see [`Known`]) is
/// written as [`SAME`] instead.
pub fn encode_output(
    rendered: &RenderOutput,
    known: Known<'_>,
    out: &mut impl Write,
) -> io::Result<()> {
    let since = match known {
        Known::Render(since) => Some(since),
        _ => None,
    };
    let unchanged = |bundle: &Bundle| match known {
        Known::Nothing => false,
        Known::Digests => true,
        Known::Render(since) => since
            .bundles
            .get(&bundle.cluster)
            .is_some_and(|b| b.digest == bundle.digest),
    };
    let header = Header::of(rendered, known);
    put_bytes(out, &serde_json::to_vec(&header).map_err(io::Error::other)?)?;
    let mut index: HashMap<*const Resource, usize> = HashMap::new();
    let mut order: Vec<&Arc<Resource>> = Vec::new();
    for bundle in rendered.bundles.values().filter(|b| !unchanged(b)) {
        for resource in &bundle.resources {
            index.entry(Arc::as_ptr(resource)).or_insert_with(|| {
                order.push(resource);
                order.len() - 1
            });
        }
    }
    put_len(out, order.len())?;
    for resource in order {
        put_bytes(
            out,
            &serde_json::to_vec(&resource.key).map_err(io::Error::other)?,
        )?;
        put_bytes(out, &resource.canonical)?;
    }
    put_len(out, rendered.bundles.len())?;
    for bundle in rendered.bundles.values() {
        put_bytes(out, bundle.cluster.as_bytes())?;
        put_bytes(out, bundle.digest.as_str().as_bytes())?;
        if unchanged(bundle) {
            put_len(out, SAME)?;
            continue;
        }
        put_len(out, bundle.resources.len())?;
        for resource in &bundle.resources {
            put_len(out, index[&Arc::as_ptr(resource)])?;
        }
        // The bundle's metadata as canonical JSON; nothing when it has none.
        match &bundle.meta {
            Some(meta) => put_bytes(out, &meta.canonical())?,
            None => put_bytes(out, b"")?,
        }
    }
    encode_provenance(&rendered.provenance, since.map(|s| &s.provenance), out)
}

fn put_digest(out: &mut impl Write, digest: &InputDigest) -> io::Result<()> {
    out.write_all(digest)
}

fn read_digest(input: &mut impl Read) -> io::Result<InputDigest> {
    let mut digest = [0u8; 32];
    input.read_exact(&mut digest)?;
    Ok(digest)
}

/// Each distinct list of workloads with their digests, once, then each cluster's
/// inputs (index of its list, own digest); each distinct list of the workloads of a
/// bundle's resources and of matched patches, once, then each cluster's provenance
/// (index of each list, custom scopes); either [`SAME`] where it equals `since`'s.
/// Clusters with the same workloads share their lists (most of a fleet's clusters
/// do), so the lists are written once, not once per cluster.
fn encode_provenance(
    provenance: &Provenance,
    since: Option<&Provenance>,
    out: &mut impl Write,
) -> io::Result<()> {
    // What is written, not "the same", per cluster.
    let inputs: Vec<(&String, Option<&ClusterInput>)> = provenance
        .inputs
        .clusters
        .iter()
        .map(|(name, input)| {
            let same = since.is_some_and(|s| s.inputs.clusters.get(name) == Some(input));
            (name, (!same).then_some(input))
        })
        .collect();
    let lists = put_lists(
        out,
        inputs.iter().map(|(_, i)| Some(&*i.as_ref()?.workloads)),
        |out, (workload, digest)| {
            put_bytes(out, workload.as_bytes())?;
            put_digest(out, digest)
        },
    )?;
    put_len(out, inputs.len())?;
    for ((name, input), list) in inputs.into_iter().zip(lists) {
        put_bytes(out, name.as_bytes())?;
        match input.zip(list) {
            Some((input, list)) => {
                put_len(out, list)?;
                put_digest(out, &input.own)?;
            }
            None => put_len(out, SAME)?,
        }
    }
    let clusters: Vec<(&String, Option<&ClusterProvenance>)> = provenance
        .clusters
        .iter()
        .map(|(name, found)| {
            let same = since.is_some_and(|s| s.clusters.get(name) == Some(found));
            (name, (!same).then_some(found))
        })
        .collect();
    let lists = put_lists(
        out,
        clusters
            .iter()
            .map(|(_, f)| Some(&*f.as_ref()?.resource_workloads)),
        |out, workload| out.write_all(&workload.to_le_bytes()),
    )?;
    let matches = put_lists(
        out,
        clusters
            .iter()
            .map(|(_, f)| Some(&*f.as_ref()?.patch_matches)),
        |out, (file, patch, workload)| {
            put_bytes(out, file.as_bytes())?;
            put_len(out, *patch as usize)?;
            put_len(out, *workload as usize)
        },
    )?;
    // Each cluster's warnings, as JSON (lists that clusters share written once).
    let warnings = put_lists(
        out,
        clusters.iter().map(|(_, f)| Some(&*f.as_ref()?.warnings)),
        |out, warning| put_bytes(out, &serde_json::to_vec(warning).map_err(invalid)?),
    )?;
    // Each cluster's Helm release warnings: a workload's position, then the
    // warning as JSON.
    let release_warnings = put_lists(
        out,
        clusters
            .iter()
            .map(|(_, f)| Some(&*f.as_ref()?.release_warnings)),
        |out, (workload, warning)| {
            put_len(out, *workload as usize)?;
            put_bytes(out, &serde_json::to_vec(warning).map_err(invalid)?)
        },
    )?;
    put_len(out, clusters.len())?;
    for (((((name, found), list), matched), warned), released) in clusters
        .into_iter()
        .zip(lists)
        .zip(matches)
        .zip(warnings)
        .zip(release_warnings)
    {
        put_bytes(out, name.as_bytes())?;
        match (found, list, matched, warned, released) {
            (Some(found), Some(list), Some(matched), Some(warned), Some(released)) => {
                put_len(out, list)?;
                put_len(out, matched)?;
                put_len(out, usize::from(found.custom_scopes))?;
                put_len(out, warned)?;
                put_len(out, released)?;
                put_len(out, usize::from(found.warnings_beyond_inputs))?;
            }
            _ => put_len(out, SAME)?,
        }
    }
    Ok(())
}

/// The distinct items, told apart by where they are in memory, in the order first
/// met, and the index of each item among them (`None` for no item). Things shared
/// by reference (a file's text at several paths, a list many clusters have) are so
/// found once; two equal ones held apart count twice, which costs bytes, not
/// correctness.
fn by_address<'a, T: ?Sized>(
    items: impl Iterator<Item = Option<&'a T>>,
) -> (Vec<&'a T>, Vec<Option<usize>>) {
    let mut index: HashMap<(*const u8, usize), usize> = HashMap::new();
    let mut order: Vec<&T> = Vec::new();
    let indexes = items
        .map(|item| {
            let item = item?;
            let at = (
                std::ptr::from_ref(item).cast::<u8>(),
                std::mem::size_of_val(item),
            );
            Some(*index.entry(at).or_insert_with(|| {
                order.push(item);
                order.len() - 1
            }))
        })
        .collect();
    (order, indexes)
}

/// Writes each distinct list of `lists` once (see [`by_address`]: its length, then
/// each item as `put` writes it) and returns, for each of `lists`, the index of its
/// list among them (`None` where there is no list).
fn put_lists<'a, T: 'a, W: Write>(
    out: &mut W,
    lists: impl Iterator<Item = Option<&'a [T]>>,
    mut put: impl FnMut(&mut W, &T) -> io::Result<()>,
) -> io::Result<Vec<Option<usize>>> {
    let (order, indexes) = by_address(lists);
    put_len(out, order.len())?;
    for list in order {
        put_len(out, list.len())?;
        for item in list {
            put(out, item)?;
        }
    }
    Ok(indexes)
}

/// Reads what [`put_lists`] wrote: each list, its items as `read` reads them.
fn read_lists<R: Read, T>(
    input: &mut R,
    mut read: impl FnMut(&mut R) -> io::Result<T>,
) -> io::Result<Vec<Arc<[T]>>> {
    let mut lists = Vec::new();
    for _ in 0..read_len(input)? {
        let mut list = Vec::new();
        for _ in 0..read_len(input)? {
            list.push(read(input)?);
        }
        lists.push(list.into());
    }
    Ok(lists)
}

fn decode_provenance(input: &mut impl Read, since: Option<&Provenance>) -> io::Result<Provenance> {
    let absent = |what: &str, cluster: &str| {
        invalid(format!(
            "the render answered \"the same {what}\" for cluster {cluster:?}, which the hub does not have"
        ))
    };
    let mut provenance = Provenance::default();
    let mut names: HashMap<String, Arc<str>> = HashMap::new();
    let mut shared = |text: String| -> Arc<str> {
        names
            .entry(text)
            .or_insert_with_key(|t| Arc::from(t.as_str()))
            .clone()
    };
    // A list named by its index, for a cluster: an index past the lists is an
    // unreadable answer, named with the cluster it was for.
    fn nth<T: ?Sized>(
        lists: &[Arc<T>],
        at: usize,
        what: &str,
        cluster: &str,
    ) -> io::Result<Arc<T>> {
        lists.get(at).cloned().ok_or_else(|| {
            invalid(format!(
                "the {what} list of cluster {cluster:?} is number {at} of {}",
                lists.len()
            ))
        })
    }
    let lists: Vec<WorkloadInputs> = read_lists(input, |input| {
        Ok((shared(read_text(input)?), read_digest(input)?))
    })?;
    for _ in 0..read_len(input)? {
        let name = read_text(input)?;
        let list = read_len(input)?;
        if list == SAME {
            let same = since
                .and_then(|s| s.inputs.clusters.get(&name))
                .ok_or_else(|| absent("inputs", &name))?;
            provenance.inputs.clusters.insert(name, same.clone());
            continue;
        }
        let workloads = nth(&lists, list, "workload", &name)?;
        let own = read_digest(input)?;
        provenance
            .inputs
            .clusters
            .insert(name, ClusterInput { own, workloads });
    }
    let lists: Vec<Arc<[u32]>> = read_lists(input, |input| {
        let mut word = [0u8; 4];
        input.read_exact(&mut word)?;
        Ok(u32::from_le_bytes(word))
    })?;
    let matches: Vec<PatchMatches> = read_lists(input, |input| {
        let file = shared(read_text(input)?);
        let patch = u32::try_from(read_len(input)?).map_err(invalid)?;
        let workload = u32::try_from(read_len(input)?).map_err(invalid)?;
        Ok((file, patch, workload))
    })?;
    let warnings: Vec<Arc<[Diagnostic]>> = read_lists(input, |input| {
        serde_json::from_slice(&read_bytes(input)?).map_err(invalid)
    })?;
    let release_warnings: Vec<ReleaseWarnings> = read_lists(input, |input| {
        let workload = u32::try_from(read_len(input)?).map_err(invalid)?;
        let warning = serde_json::from_slice(&read_bytes(input)?).map_err(invalid)?;
        Ok((workload, warning))
    })?;
    for _ in 0..read_len(input)? {
        let name = read_text(input)?;
        let list = read_len(input)?;
        if list == SAME {
            let same = since
                .and_then(|s| s.clusters.get(&name))
                .ok_or_else(|| absent("provenance", &name))?;
            provenance.clusters.insert(name, same.clone());
            continue;
        }
        let found = ClusterProvenance {
            resource_workloads: nth(&lists, list, "resource workload", &name)?,
            patch_matches: nth(&matches, read_len(input)?, "matched patch", &name)?,
            custom_scopes: read_len(input)? != 0,
            warnings: nth(&warnings, read_len(input)?, "warning", &name)?,
            release_warnings: nth(
                &release_warnings,
                read_len(input)?,
                "release warning",
                &name,
            )?,
            warnings_beyond_inputs: read_len(input)? != 0,
        };
        provenance.clusters.insert(name, found);
    }
    Ok(provenance)
}

/// Reads what [`encode_output`] wrote, as it arrives, and nothing after it;
/// `since` is the render it was written against.
pub fn decode_output(
    mut input: impl Read,
    since: Option<&RenderOutput>,
) -> io::Result<RenderOutput> {
    let known = since.map_or(Known::Nothing, Known::Render);
    let output = read_output(&mut input, known)?;
    if input.read(&mut [0u8])? != 0 {
        return Err(invalid("trailing bytes"));
    }
    Ok(output)
}

/// Reads what [`encode_output`] wrote for a reader that knows `known`.
pub(super) fn read_output(mut input: impl Read, known: Known<'_>) -> io::Result<RenderOutput> {
    let since = match known {
        Known::Render(since) => Some(since),
        _ => None,
    };
    let header: Header = serde_json::from_slice(&read_bytes(&mut input)?).map_err(invalid)?;
    let count = read_len(&mut input)?;
    let mut resources = Vec::new();
    // Resources of many clusters have the same identity (every cluster's copy of a
    // per-cluster template's resource): one shared key each.
    let mut keys: HashMap<ResourceKey, Arc<ResourceKey>> = HashMap::new();
    for _ in 0..count {
        let key: ResourceKey = serde_json::from_slice(&read_bytes(&mut input)?).map_err(invalid)?;
        let key = keys
            .entry(key)
            .or_insert_with_key(|key| Arc::new(key.clone()))
            .clone();
        let canonical = read_bytes(&mut input)?.into();
        resources.push(Arc::new(Resource { key, canonical }));
    }
    let count = read_len(&mut input)?;
    let mut bundles = BTreeMap::new();
    for _ in 0..count {
        let cluster = read_text(&mut input)?;
        let digest = Digest::try_from(read_text(&mut input)?).map_err(invalid)?;
        let n = read_len(&mut input)?;
        if n == SAME {
            let same = match known {
                // Known by digest only: a bundle without its resources.
                Known::Digests => Bundle {
                    cluster: cluster.clone(),
                    digest,
                    resources: Vec::new(),
                    meta: None,
                },
                _ => since
                    .and_then(|s| s.bundles.get(&cluster))
                    .filter(|b| b.digest == digest)
                    .ok_or_else(|| {
                        invalid(format!(
                            "the render answered \"the same bundle\" ({digest}) for cluster \
                             {cluster:?}, which the hub does not have"
                        ))
                    })?
                    .clone(),
            };
            bundles.insert(cluster, same);
            continue;
        }
        let mut list = Vec::new();
        for _ in 0..n {
            let resource = resources
                .get(read_len(&mut input)?)
                .ok_or_else(|| invalid("resource index out of range"))?;
            list.push(resource.clone());
        }
        let meta = read_bytes(&mut input)?;
        let meta = if meta.is_empty() {
            None
        } else {
            Some(Arc::new(serde_json::from_slice(&meta).map_err(invalid)?))
        };
        bundles.insert(
            cluster.clone(),
            Bundle {
                cluster,
                digest,
                resources: list,
                meta,
            },
        );
    }
    let provenance = decode_provenance(&mut input, since.map(|s| &s.provenance))?;
    Ok(RenderOutput {
        incomplete: false,
        revision: header.revision,
        bundles,
        diagnostics: header.diagnostics,
        memberships: header.memberships.read(since.map(|s| &s.memberships))?,
        labels: header.labels.read(since.map(|s| &s.labels))?,
        rollouts: header.rollouts,
        provenance,
        parsed: None,
        generated_from_public_seed: header.generated_from_public_seed,
        unsealed_for_agent_keys: header.unsealed_for_agent_keys,
        agent_keys: header
            .agent_keys
            .iter()
            .map(|(cluster, key)| {
                flotilla_render::seal::AgentKey::parse(key)
                    .map(|key| (cluster.clone(), key))
                    .map_err(invalid)
            })
            .collect::<io::Result<_>>()?,
        charts: header.charts,
        // A count for benchmarks and tests of the renderer, not carried.
        helm_stencil_releases: 0,
        sops_files: Vec::new(),
    })
}

pub(super) fn invalid(message: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message.to_string())
}

fn read_len(input: &mut impl Read) -> io::Result<usize> {
    let mut word = [0u8; 8];
    input.read_exact(&mut word)?;
    usize::try_from(u64::from_le_bytes(word)).map_err(invalid)
}

fn read_bytes(input: &mut impl Read) -> io::Result<Vec<u8>> {
    let len = read_len(input)?;
    let mut bytes = Vec::new();
    bytes.try_reserve_exact(len)?;
    input.take(len as u64).read_to_end(&mut bytes)?;
    if bytes.len() != len {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    Ok(bytes)
}

fn read_text(input: &mut impl Read) -> io::Result<String> {
    String::from_utf8(read_bytes(input)?).map_err(invalid)
}
