//! What prune does with one object the bundle no longer holds, decided from the object
//! as the API server returns it, what the ledger knows of it and what the new bundle
//! still needs.
//!
//! flotilla deletes only what it created and still owns, never what something else
//! made, and never what deleting would take a cluster's contents with it unless told:
//! a Namespace (deleting it deletes everything in it) or a CustomResourceDefinition
//! (deleting it deletes every custom resource of its kind).

use std::collections::HashSet;

use serde_json::Value;

use super::SYSTEM_NAMESPACES;
use super::ledger::{LedgerEntry, Origin};
use crate::cache::InventoryEntry;
use crate::sink::{CLUSTER_LABEL, PRUNE_ANNOTATION, prune_allowed, prune_disabled};
use flotilla_core::bundle::Bundle;

/// The annotation that makes an object a Helm hook.
const HELM_HOOK_ANNOTATION: &str = "helm.sh/hook";

/// Why a Helm hook is left in place when it leaves the bundle.
pub(crate) const HOOK_KEPT: &str = "a Helm hook: hooks are not part of their release, and flotilla never prunes \
                                    them (as Helm never deletes them with the release)";

/// What the new bundle and the agent's settings say about pruning.
pub(crate) struct Context<'a> {
    pub cluster: &'a str,
    /// Namespaces the bundle's resources live in.
    pub namespaces_in_use: HashSet<&'a str>,
    /// (group, kind) of every resource of the bundle.
    pub kinds_in_use: HashSet<(&'a str, &'a str)>,
    /// The uids of the objects the bundle's resources were applied to (as the
    /// ledger records them after the apply).
    pub applied_uids: HashSet<String>,
    /// `--prune-namespaces-and-crds`.
    pub allow_namespaces_and_crds: bool,
    /// Where the ledger lives; never pruned.
    pub ledger_namespace: &'a str,
}

impl<'a> Context<'a> {
    pub fn new(bundle: &'a Bundle, allow: bool, ledger_namespace: &'a str) -> Context<'a> {
        Context {
            cluster: &bundle.cluster,
            namespaces_in_use: bundle
                .resources
                .iter()
                .map(|r| r.key.namespace())
                .filter(|n| !n.is_empty())
                .collect(),
            kinds_in_use: bundle
                .resources
                .iter()
                .map(|r| (r.key.group(), r.key.kind()))
                .collect(),
            applied_uids: HashSet::new(),
            allow_namespaces_and_crds: allow,
            ledger_namespace,
        }
    }
}

/// The decision for one object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Delete it, on condition that it is still this very object.
    Delete {
        uid: Option<String>,
        resource_version: Option<String>,
    },
    /// It is going or gone already.
    Gone(String),
    /// Leave it in place. With `retry`, it stays in the inventory and a later apply
    /// looks at it again (what holds it may go away).
    Keep { reason: String, retry: bool },
}

fn keep(reason: impl Into<String>, retry: bool) -> Verdict {
    Verdict::Keep {
        reason: reason.into(),
        retry,
    }
}

fn text<'v>(object: &'v Value, pointer: &str) -> Option<&'v str> {
    object.pointer(pointer).and_then(Value::as_str)
}

/// Decides what to do with `live`, the object the inventory entry names.
pub(crate) fn judge(
    entry: &InventoryEntry,
    recorded: Option<&LedgerEntry>,
    live: &Value,
    context: &Context,
) -> Verdict {
    if text(live, "/metadata/deletionTimestamp").is_some() {
        let finalizers: Vec<&str> = live
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let waiting = if finalizers.is_empty() {
            String::new()
        } else {
            format!(", waiting for finalizers {}", finalizers.join(", "))
        };
        return Verdict::Gone(format!("terminating: its deletion is under way{waiting}"));
    }
    // The bundle may still apply this very object (the same uid) under another
    // identity: a cluster-scoped kind the renderer could not know (its definition is
    // not in the fleet) is keyed with its workload's namespace, which changed; or the
    // resource moved to another API group that serves the same objects (Ingress from
    // `extensions` to `networking.k8s.io`). Deleting it would delete what the bundle
    // wants: it is left to the new identity. Another object of the same kind and
    // name (a Gateway of another project's group) has another uid, and goes.
    if text(live, "/metadata/uid").is_some_and(|uid| context.applied_uids.contains(uid)) {
        return keep(
            "the bundle still applies this object, under another API group or namespace",
            false,
        );
    }
    if (api_group(entry.api_version()), entry.kind()) == ("", "Namespace") {
        let name = entry.name();
        if SYSTEM_NAMESPACES.contains(&name) {
            return keep(
                format!("{name} is a namespace Kubernetes itself needs; it is never deleted"),
                false,
            );
        }
        if name == context.ledger_namespace {
            return keep("it holds the agent's inventory", false);
        }
    }
    if prune_disabled(live) {
        return keep(format!("annotated {PRUNE_ANNOTATION}: disabled"), false);
    }
    if live
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(HELM_HOOK_ANNOTATION))
        .is_some()
    {
        return keep(HOOK_KEPT, false);
    }
    if text(
        live,
        &format!("/metadata/labels/{}", CLUSTER_LABEL.replace('/', "~1")),
    ) != Some(context.cluster)
    {
        return keep(
            format!(
                "it does not carry the label {CLUSTER_LABEL}={}, so flotilla does not own it",
                context.cluster
            ),
            false,
        );
    }
    let uid = text(live, "/metadata/uid");
    if let Some(recorded) = recorded {
        match recorded.origin {
            Origin::Adopted => {
                return keep(
                    "it existed before flotilla first applied it, so flotilla leaves it to whoever made it \
                     (delete it by hand if it should go)",
                    false,
                );
            }
            Origin::Pending => {
                return keep(
                    "flotilla cannot tell whether it created it (the apply that would have told was cut short)",
                    false,
                );
            }
            Origin::Created | Origin::Unknown => {}
        }
        if let (Some(recorded_uid), Some(uid)) = (recorded.uid.as_deref(), uid)
            && recorded_uid != uid
        {
            return keep(
                "it was deleted and made again by someone else since flotilla applied it (its uid changed)",
                false,
            );
        }
    }
    match (api_group(entry.api_version()), entry.kind()) {
        ("", "Namespace") => {
            let name = entry.name();
            if context.namespaces_in_use.contains(name) {
                return keep("resources of the bundle are still in it", true);
            }
            if !(context.allow_namespaces_and_crds || prune_allowed(live)) {
                return keep(
                    format!(
                        "deleting a Namespace deletes everything in it, so flotilla prunes one only when it is \
                         annotated {PRUNE_ANNOTATION}: allow or the agent runs with --prune-namespaces-and-crds"
                    ),
                    false,
                );
            }
        }
        ("apiextensions.k8s.io", "CustomResourceDefinition") => {
            let defines = (
                text(live, "/spec/group").unwrap_or_default(),
                text(live, "/spec/names/kind").unwrap_or_default(),
            );
            if context.kinds_in_use.contains(&defines) {
                return keep(
                    format!("the bundle still holds {} resources", defines.1),
                    true,
                );
            }
            if !(context.allow_namespaces_and_crds || prune_allowed(live)) {
                return keep(
                    format!(
                        "deleting a CustomResourceDefinition deletes every custom resource of its kind, so flotilla \
                         prunes one only when it is annotated {PRUNE_ANNOTATION}: allow or the agent runs with \
                         --prune-namespaces-and-crds"
                    ),
                    false,
                );
            }
        }
        _ => {}
    }
    Verdict::Delete {
        uid: uid.map(str::to_string),
        resource_version: text(live, "/metadata/resourceVersion").map(str::to_string),
    }
}

fn api_group(api_version: &str) -> &str {
    flotilla_core::bundle::api_group(api_version)
}

/// What a successful delete answered: the object, still there with a
/// `deletionTimestamp` (finalizers, a Namespace terminating), or a `Status`.
pub(crate) fn after_delete(answer: &Value) -> String {
    if text(answer, "/metadata/deletionTimestamp").is_some() {
        if text(answer, "/status/phase") == Some("Terminating") {
            return "deleted; the namespace is terminating".into();
        }
        return "deleted; waiting for its finalizers".into();
    }
    String::new()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::bundle_of;
    use serde_json::json;

    fn entry(api_version: &str, kind: &str, namespace: &str, name: &str) -> InventoryEntry {
        InventoryEntry::new(api_version, kind, namespace, name)
    }

    fn live(kind: &str, name: &str, extra: Value) -> Value {
        let mut object = json!({"kind": kind, "metadata": {"name": name, "uid": "u1", "resourceVersion": "7",
                                "labels": {CLUSTER_LABEL: "edge-1"}}});
        crate::testing::merge(&mut object, &extra);
        object
    }

    fn recorded(origin: Origin, uid: &str) -> LedgerEntry {
        LedgerEntry {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            namespace: "demo".into(),
            name: "x".into(),
            origin,
            uid: Some(uid.into()),
            ran: None,
            failed: None,
            user: None,
        }
    }

    fn check(
        entry: &InventoryEntry,
        recorded: Option<LedgerEntry>,
        live: Value,
        allow: bool,
        expect: &str,
    ) {
        let bundle = bundle_of(
            "edge-1",
            vec![
                json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "kept"}}),
                json!({"apiVersion": "example.com/v1", "kind": "Gadget", "metadata": {"name": "g", "namespace": "kept"}}),
            ],
        );
        let context = Context::new(&bundle, allow, "flotilla-system");
        let verdict = judge(entry, recorded.as_ref(), &live, &context);
        let shown = match &verdict {
            Verdict::Delete {
                uid,
                resource_version,
            } => {
                format!(
                    "delete uid={} rv={}",
                    uid.as_deref().unwrap_or("-"),
                    resource_version.as_deref().unwrap_or("-")
                )
            }
            Verdict::Gone(why) => format!("gone: {why}"),
            Verdict::Keep { reason, retry } => {
                format!("keep{}: {reason}", if *retry { " (retry)" } else { "" })
            }
        };
        assert!(shown.starts_with(expect), "{shown}");
    }

    #[test]
    fn deletes_only_what_flotilla_created_and_still_owns() {
        let cm = entry("v1", "ConfigMap", "demo", "x");
        check(
            &cm,
            Some(recorded(Origin::Created, "u1")),
            live("ConfigMap", "x", json!({})),
            false,
            "delete uid=u1 rv=7",
        );
        // An older agent's object: the label decides, as it did.
        check(
            &cm,
            Some(recorded(Origin::Unknown, "u1")),
            live("ConfigMap", "x", json!({})),
            false,
            "delete uid=u1",
        );
        check(
            &cm,
            None,
            live("ConfigMap", "x", json!({})),
            false,
            "delete uid=u1",
        );
        check(
            &cm,
            Some(recorded(Origin::Adopted, "u1")),
            live("ConfigMap", "x", json!({})),
            false,
            "keep: it existed before",
        );
        check(
            &cm,
            Some(recorded(Origin::Pending, "u1")),
            live("ConfigMap", "x", json!({})),
            false,
            "keep: flotilla cannot tell",
        );
        check(
            &cm,
            Some(recorded(Origin::Created, "u0")),
            live("ConfigMap", "x", json!({})),
            false,
            "keep: it was deleted and made again",
        );
        check(
            &cm,
            None,
            live(
                "ConfigMap",
                "x",
                json!({"metadata": {"labels": {CLUSTER_LABEL: "edge-2"}}}),
            ),
            false,
            "keep: it does not carry",
        );
        check(
            &cm,
            None,
            live(
                "ConfigMap",
                "x",
                json!({"metadata": {"annotations": {PRUNE_ANNOTATION: "disabled"}}}),
            ),
            true,
            "keep: annotated",
        );
        check(
            &cm,
            None,
            live(
                "ConfigMap",
                "x",
                json!({"metadata": {"deletionTimestamp": "2025-01-01T00:00:00Z", "finalizers": ["x.io/y"]}}),
            ),
            false,
            "gone: terminating: its deletion is under way, waiting for finalizers x.io/y",
        );
    }

    /// An object the bundle still applies under another key (the same uid as one it
    /// just applied) is never deleted: a cluster-scoped object whose key's namespace
    /// changed, or a resource that moved to another API group serving the same
    /// objects. Another object of the same kind and name (another group's, another
    /// namespace's) has another uid, and goes.
    #[test]
    fn what_the_bundle_still_applies_under_another_key_is_kept() {
        let bundle = bundle_of(
            "edge-1",
            vec![
                json!({"apiVersion": "example.com/v1", "kind": "Gadget", "metadata": {"name": "g", "namespace": "kept"}}),
            ],
        );
        let mut context = Context::new(&bundle, false, "flotilla-system");
        context.applied_uids.insert("u-applied".to_string());
        let judged = |uid: &str| {
            judge(
                &entry("other.example.com/v1", "Gadget", "old-namespace", "g"),
                Some(&recorded(Origin::Created, uid)),
                &live("Gadget", "g", json!({"metadata": {"uid": uid}})),
                &context,
            )
        };
        assert_eq!(
            judged("u-applied"),
            Verdict::Keep {
                reason:
                    "the bundle still applies this object, under another API group or namespace"
                        .into(),
                retry: false
            }
        );
        assert!(
            matches!(judged("u-other"), Verdict::Delete { .. }),
            "{:?}",
            judged("u-other")
        );
    }

    #[test]
    fn namespaces_and_definitions_need_an_explicit_yes_and_must_be_unused() {
        let ns = |name: &str| entry("v1", "Namespace", "", name);
        let created = |name: &str| {
            let mut r = recorded(Origin::Created, "u1");
            r.kind = "Namespace".into();
            r.name = name.into();
            r.namespace = String::new();
            Some(r)
        };
        check(
            &ns("old"),
            created("old"),
            live("Namespace", "old", json!({})),
            false,
            "keep: deleting a Namespace deletes everything",
        );
        check(
            &ns("old"),
            created("old"),
            live("Namespace", "old", json!({})),
            true,
            "delete uid=u1",
        );
        check(
            &ns("old"),
            created("old"),
            live(
                "Namespace",
                "old",
                json!({"metadata": {"annotations": {PRUNE_ANNOTATION: "allow"}}}),
            ),
            false,
            "delete",
        );
        check(
            &ns("kept"),
            created("kept"),
            live("Namespace", "kept", json!({})),
            true,
            "keep (retry): resources of the bundle are still in it",
        );
        for system in ["default", "kube-system", "kube-public", "kube-node-lease"] {
            check(
                &ns(system),
                created(system),
                live("Namespace", system, json!({})),
                true,
                "keep: ",
            );
        }
        check(
            &ns("flotilla-system"),
            created("flotilla-system"),
            live("Namespace", "flotilla-system", json!({})),
            true,
            "keep: it holds the agent's inventory",
        );

        let crd = entry(
            "apiextensions.k8s.io/v1",
            "CustomResourceDefinition",
            "",
            "gadgets.example.com",
        );
        let definition = |kind: &str| {
            live(
                "CustomResourceDefinition",
                "gadgets.example.com",
                json!({"spec": {"group": "example.com", "names": {"kind": kind, "plural": "gadgets"}}}),
            )
        };
        check(
            &crd,
            None,
            definition("Gadget"),
            true,
            "keep (retry): the bundle still holds Gadget resources",
        );
        check(
            &crd,
            None,
            definition("Widget"),
            false,
            "keep: deleting a CustomResourceDefinition",
        );
        check(&crd, None, definition("Widget"), true, "delete");
    }
}
