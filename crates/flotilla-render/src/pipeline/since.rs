//! Incremental renders ([`crate::render_since`]): how much of each cluster a
//! previous render leaves to render again, by comparing its inputs, and the job a
//! pass is given for a cluster rendered in part (the workloads to render, the
//! previous bundle the others' resources come from).

use flotilla_core::bundle::Bundle;

use crate::inputs;
use crate::{ClusterProvenance, RenderOutput};

/// How much of one cluster to render again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Redo {
    All,
    /// Only these workloads (positions in its targeted list); the others' resources
    /// are the previous bundle's.
    Workloads(Vec<usize>),
    Nothing,
}

/// How much of a cluster `previous` leaves to render again, given its new inputs.
pub(super) fn redo_since(
    previous: &RenderOutput,
    name: &str,
    input: &inputs::ClusterInput,
) -> Redo {
    let (Some(before), Some(kept), true) = (
        previous.provenance.inputs.clusters.get(name),
        previous.provenance.clusters.get(name),
        previous.bundles.contains_key(name),
    ) else {
        return Redo::All;
    };
    if before == input {
        return Redo::Nothing;
    }
    let same_workloads = before.workloads.len() == input.workloads.len()
        && before
            .workloads
            .iter()
            .zip(input.workloads.iter())
            .all(|(a, b)| a.0 == b.0);
    if before.own != input.own || !same_workloads || kept.custom_scopes {
        return Redo::All;
    }
    Redo::Workloads(
        (0..input.workloads.len())
            .filter(|&w| before.workloads[w].1 != input.workloads[w].1)
            .collect(),
    )
}

/// One cluster to render: the fleet indices of the workloads that target it, and,
/// when only some of them are rendered, those (positions in `targeted`) and the
/// previous bundle the others come from.
pub(super) struct Job<'a> {
    pub(super) targeted: &'a [usize],
    pub(super) only: Option<(&'a [usize], &'a Bundle, &'a ClusterProvenance)>,
}
