//! A template's resources rendered once for every cluster that differs only in the
//! values of its holes.
//!
//! With per-cluster templates every output is different, but the outputs of one
//! template differ only in the scalars that hold its values (see [`crate::shape`]).
//! So a template's documents are transformed once per list of overlays with a
//! stand-in string at each of those scalars (its *sites*), and written as canonical
//! JSON in which each stand-in is a gap: a [`Stencil`]. A cluster's resource is then
//! the stencil with each gap filled with the canonical JSON of that site's scalar.
//!
//! That is exactly what transforming the cluster's own documents and writing them
//! gives, as long as the transform never looks at a site's value, only carries it
//! along. [`compile`] takes a stencil only where that holds, and refuses the rest
//! (the caller then renders each output as before):
//!
//! - no site is (or holds) `apiVersion`, `kind`, `metadata.name` or
//!   `metadata.namespace`, which decide the identity, the scope, the default
//!   namespace and which patches match;
//! - no site is among `metadata.labels` (or `annotations`) when a patch of the
//!   overlays has a label (or annotation) selector, and none is an `image` when an
//!   overlay rewrites images;
//! - no strategic merge patch matched (its list merge keys and directives read
//!   values); JSON merge patches and JSON patches replace, add, remove or move whole
//!   values, which a scalar's value cannot change (a scalar is never an object), and
//!   a JSON patch `test` of a site or what holds one fails on the stand-in, which
//!   no overlay's value equals (the output is then rendered as before); but no
//!   JSON patch `copy` applied, so that each value is in the document once
//!   whenever a patch's size is checked (below);
//! - no overlay carries the stand-ins' marker characters, so every marker in the
//!   written bytes is a site's own stand-in, whole, once;
//! - JSON patches are checked against their size limit as they apply, and a
//!   site's value can be longer than its stand-in: the stencil is made within the
//!   limit less [`SLACK`], and a cluster whose values add more than that is
//!   rendered as before;
//! - the transform succeeds (an error is rendered per output as before, to say
//!   which cluster it is on).
//!
//! Everything else the transform does depends on the structure only (nesting
//! depth, where the metadata maps are). The resource size limit is checked on the
//! filled bytes. `tests/it/stencil.rs` holds whole renders with stencils equal to
//! renders without them on generated fleets.

use std::sync::Arc;

use serde_json::Value;

use flotilla_core::bundle::{ResourceKey, approximate_json_size, to_canonical_vec};

use crate::kyaml::{HOLE_END, HOLE_START, Step};
use crate::load::{Overlay, PatchAction, SourcedDocument, Workload};
use crate::patch::PatchLimits;
use crate::scope::CustomScopes;
use crate::shape::{Shape, place};
use crate::transform;

/// How much larger than their stand-ins the values of a cluster may be, in all, for
/// its resources to be filled from a stencil made with JSON patches. A stencil is
/// made within the patch size limit less this.
pub const SLACK: usize = 64 * 1024;

/// One resource of a [`StencilUnit`]: its identity and canonical bytes with gaps.
#[derive(Debug)]
pub struct Stencil {
    pub key: Arc<ResourceKey>,
    pub file: Arc<str>,
    pub line: u64,
    /// The canonical bytes with each stand-in taken out.
    fixed: Vec<u8>,
    gaps: Gaps,
}

/// Where each gap is in a stencil's fixed bytes, in order, and the site whose value
/// fills it.
type Gaps = Vec<(usize, usize)>;

/// A template's documents transformed under one list of overlays, as stencils.
#[derive(Debug)]
pub struct StencilUnit {
    pub resources: Vec<Stencil>,
    /// Per overlay of the list, which of its patches matched a resource.
    pub matched: Vec<Vec<bool>>,
    /// Whether a JSON patch applied, so that values may not grow past [`SLACK`].
    patched: bool,
    /// The approximate JSON size of each site's stand-in.
    stand_in_sizes: Vec<usize>,
}

/// The stand-in for site `index`: the hole markers around its number, which no
/// other text of the documents or overlays holds.
fn stand_in(index: usize) -> String {
    format!("{HOLE_START}{index}{HOLE_END}")
}

const START: [u8; 3] = utf8(HOLE_START);
const END: [u8; 3] = utf8(HOLE_END);

const fn utf8(c: char) -> [u8; 3] {
    let mut bytes = [0; 3];
    c.encode_utf8(&mut bytes);
    bytes
}

/// What [`compile`] needs besides the template: the workload and overlays of the
/// unit, its custom scopes and the patch limits.
pub struct Under<'a> {
    pub workload: &'a Workload,
    pub overlays: &'a [&'a Overlay],
    pub scopes: &'a CustomScopes,
    pub limits: &'a PatchLimits,
}

/// The stencils of `shape`'s documents (the template at `file`) under these
/// overlays, or `None` where the transform could depend on a site's value (see the
/// module's documentation).
pub fn compile(shape: &Shape, file: &Arc<str>, under: &Under<'_>) -> Option<StencilUnit> {
    let sites = shape.sites();
    let overlays = under.overlays;
    let selects_labels = overlays
        .iter()
        .flat_map(|o| &o.patches)
        .any(|p| p.label_selector.is_some());
    let selects_annotations = overlays
        .iter()
        .flat_map(|o| &o.patches)
        .any(|p| p.annotation_selector.is_some());
    let rewrites_images = overlays.iter().any(|o| !o.images.is_empty());
    for site in sites {
        let path = &site.path;
        let names = |keys: &[&str]| {
            path.len() >= keys.len()
                && path
                    .iter()
                    .zip(keys)
                    .all(|(step, key)| matches!(step, Step::Key(k) if k == key))
        };
        let identity = path.len() <= 2
            && (names(&["apiVersion"])
                || names(&["kind"])
                || names(&["metadata"]) && path.len() == 1
                || names(&["metadata", "name"])
                || names(&["metadata", "namespace"]));
        let image = rewrites_images && matches!(path.last(), Some(Step::Key(k)) if k == "image");
        if identity
            || image
            || (selects_labels && names(&["metadata", "labels"]))
            || (selects_annotations && names(&["metadata", "annotations"]))
        {
            return None;
        }
    }
    if overlays.iter().any(|o| carries_markers(o)) {
        return None;
    }
    let mut documents: Vec<Value> = shape.documents().iter().map(|d| d.value.clone()).collect();
    for (index, site) in sites.iter().enumerate() {
        *place(documents.get_mut(site.document)?, &site.path)? = Value::String(stand_in(index));
    }
    let limits = PatchLimits {
        max_bytes: under.limits.max_bytes.saturating_sub(SLACK),
        ..*under.limits
    };
    let mut matched: Vec<Vec<bool>> = overlays
        .iter()
        .map(|o| vec![false; o.patches.len()])
        .collect();
    let mut resources = Vec::with_capacity(documents.len());
    for (index, (value, document)) in documents.into_iter().zip(shape.documents()).enumerate() {
        let sourced = SourcedDocument {
            value,
            file: file.clone(),
            line: document.line,
        };
        let (key, value) = transform::transform(
            sourced,
            under.workload,
            overlays,
            under.scopes,
            &limits,
            &mut matched,
        )
        .ok()?;
        let (fixed, gaps) = gaps_in(to_canonical_vec(&value), |site| {
            sites.get(site).is_some_and(|s| s.document == index)
        })?;
        resources.push(Stencil {
            key: Arc::new(key),
            file: file.clone(),
            line: document.line,
            fixed,
            gaps,
        });
    }
    let mut patched = false;
    for (overlay, flags) in overlays.iter().zip(&matched) {
        for (patch, _) in overlay.patches.iter().zip(flags).filter(|(_, hit)| **hit) {
            match &patch.action {
                PatchAction::StrategicMerge(_) => return None,
                PatchAction::JsonPatch(ops) => {
                    patched = true;
                    if copies(ops) {
                        return None;
                    }
                }
                PatchAction::MergePatch(_) => {}
            }
        }
    }
    let stand_in_sizes = (0..sites.len())
        .map(|i| approximate_json_size(&Value::String(stand_in(i)), usize::MAX))
        .collect();
    Some(StencilUnit {
        resources,
        matched,
        patched,
        stand_in_sizes,
    })
}

impl StencilUnit {
    /// The canonical bytes of each resource with `scalars` (one per site, as
    /// [`Shape::scalars`] gives them) in its gaps; `None` when the values are too
    /// large to be sure the patches would have passed their size limit, or a
    /// resource is over `max_resource_bytes` (rendered as before, that says so).
    pub fn fill(&self, scalars: &[Value], max_resource_bytes: usize) -> Option<Vec<Vec<u8>>> {
        if scalars.len() != self.stand_in_sizes.len() {
            return None;
        }
        if self.patched {
            let growth: usize = scalars
                .iter()
                .zip(&self.stand_in_sizes)
                .map(|(value, &stand_in)| {
                    approximate_json_size(value, usize::MAX).saturating_sub(stand_in)
                })
                .sum();
            if growth > SLACK {
                return None;
            }
        }
        let written: Vec<Vec<u8>> = scalars.iter().map(to_canonical_vec).collect();
        self.resources
            .iter()
            .map(|stencil| {
                let size = stencil.fixed.len()
                    + stencil
                        .gaps
                        .iter()
                        .map(|&(_, site)| written[site].len())
                        .sum::<usize>();
                if size > max_resource_bytes {
                    return None;
                }
                let mut bytes = Vec::with_capacity(size);
                let mut from = 0;
                for &(at, site) in &stencil.gaps {
                    bytes.extend_from_slice(&stencil.fixed[from..at]);
                    bytes.extend_from_slice(&written[site]);
                    from = at;
                }
                bytes.extend_from_slice(&stencil.fixed[from..]);
                Some(bytes)
            })
            .collect()
    }
}

/// Takes each stand-in (a whole JSON string) out of canonical bytes: the bytes left
/// and where each gap is, with its site. `None` if a marker is anywhere else or
/// `belongs` refuses a site.
fn gaps_in(bytes: Vec<u8>, belongs: impl Fn(usize) -> bool) -> Option<(Vec<u8>, Gaps)> {
    let mut fixed = Vec::with_capacity(bytes.len());
    let mut gaps: Gaps = Vec::new();
    let mut rest = bytes.as_slice();
    while let Some(at) = rest.windows(3).position(|w| w == START || w == END) {
        // A stand-in is `"`, the start marker, digits, the end marker, `"`.
        let before = rest[..at].strip_suffix(b"\"")?;
        let after = rest[at..].strip_prefix(&START)?;
        let digits = after.iter().take_while(|b| b.is_ascii_digit()).count();
        let site: usize = std::str::from_utf8(&after[..digits]).ok()?.parse().ok()?;
        let after = after[digits..].strip_prefix(&END)?.strip_prefix(b"\"")?;
        if !belongs(site) {
            return None;
        }
        fixed.extend_from_slice(before);
        gaps.push((fixed.len(), site));
        rest = after;
    }
    fixed.extend_from_slice(rest);
    Some((fixed, gaps))
}

/// Whether a JSON patch copies a value (a patch that is not a list of operations
/// fails in the transform).
fn copies(ops: &Value) -> bool {
    ops.as_array().is_some_and(|ops| {
        ops.iter()
            .any(|op| op.get("op").and_then(Value::as_str) == Some("copy"))
    })
}

/// Whether any text an overlay adds holds a hole marker.
fn carries_markers(overlay: &Overlay) -> bool {
    let marked = |s: &str| s.contains(HOLE_START) || s.contains(HOLE_END);
    overlay.patches.iter().any(|p| {
        let (PatchAction::JsonPatch(v)
        | PatchAction::MergePatch(v)
        | PatchAction::StrategicMerge(v)) = &p.action;
        value_holds(v, &marked)
    }) || overlay.images.iter().any(|i| {
        marked(&i.name)
            || [&i.new_name, &i.new_tag, &i.digest]
                .into_iter()
                .flatten()
                .any(|s| marked(s))
    }) || overlay
        .labels
        .iter()
        .chain(&overlay.annotations)
        .any(|(k, v)| marked(k) || marked(v))
}

/// Whether a key or string anywhere in `value` passes `test`.
fn value_holds(value: &Value, test: &impl Fn(&str) -> bool) -> bool {
    let mut stack = vec![value];
    while let Some(value) = stack.pop() {
        match value {
            Value::String(s) if test(s) => return true,
            Value::Array(items) => stack.extend(items),
            Value::Object(map) => {
                for (key, item) in map {
                    if test(key) {
                        return true;
                    }
                    stack.push(item);
                }
            }
            _ => {}
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stand_ins_become_gaps_and_anything_else_with_a_marker_is_refused() {
        let bytes = format!(
            "{{\"a\":\"{}\",\"b\":[1,\"{}\"]}}",
            stand_in(0),
            stand_in(1)
        );
        let (fixed, gaps) = gaps_in(bytes.into_bytes(), |_| true).expect("gaps");
        assert_eq!(fixed, b"{\"a\":,\"b\":[1,]}");
        assert_eq!(gaps, vec![(5, 0), (13, 1)]);
        for refused in [
            format!("\"x{}\"", stand_in(0)),
            format!("\"{}x\"", stand_in(0)),
            format!("\"{HOLE_END}\""),
            format!("\"{HOLE_START}\""),
        ] {
            assert!(
                gaps_in(refused.clone().into_bytes(), |_| true).is_none(),
                "{refused}"
            );
        }
        assert!(gaps_in(format!("\"{}\"", stand_in(3)).into_bytes(), |s| s != 3).is_none());
    }
}
