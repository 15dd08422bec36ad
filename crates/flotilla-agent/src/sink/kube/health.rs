//! How healthy a workload is, read from the object as the API server returns it.
//!
//! Deployments, StatefulSets and DaemonSets follow `kubectl rollout status`
//! (`staging/src/k8s.io/kubectl/pkg/polymorphichelpers/rollout_status.go`), with the
//! cases where it would wait for ever settled: a paused Deployment is not followed, and
//! a StatefulSet or DaemonSet that updates `OnDelete` is judged by readiness alone.
//! Jobs are judged by their conditions. Every other kind is `applied`.

use serde_json::Value;

use flotilla_core::bundle::ResourceKey;
use flotilla_core::status::ResourceState;

/// Whether flotilla judges the health of this kind.
pub fn has_health_rule(key: &ResourceKey) -> bool {
    matches!(
        (key.group(), key.kind()),
        ("apps", "Deployment" | "StatefulSet" | "DaemonSet") | ("batch", "Job")
    )
}

fn int(object: &Value, pointer: &str) -> Option<i64> {
    object.pointer(pointer).and_then(Value::as_i64)
}

fn condition<'v>(object: &'v Value, kind: &str) -> Option<&'v Value> {
    object
        .pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c.get("type").and_then(Value::as_str) == Some(kind))
}

fn condition_true(object: &Value, kind: &str) -> bool {
    condition(object, kind)
        .and_then(|c| c.get("status"))
        .and_then(Value::as_str)
        == Some("True")
}

/// The health of an object as the server returned it, with a message for humans.
pub fn health(key: &ResourceKey, object: &Value) -> (ResourceState, String) {
    match (key.group(), key.kind()) {
        ("apps", "Deployment") => deployment(object),
        ("apps", "StatefulSet") => stateful_set(object),
        ("apps", "DaemonSet") => daemon_set(object),
        ("batch", "Job") => job(object),
        _ => (ResourceState::Applied, String::new()),
    }
}

/// Whether the controller has seen the current spec: `generation <= observedGeneration`.
fn observed(object: &Value) -> Result<(), (ResourceState, String)> {
    let generation = int(object, "/metadata/generation").unwrap_or(0);
    let observed = int(object, "/status/observedGeneration").unwrap_or(0);
    if generation > observed {
        return Err((
            ResourceState::Progressing,
            format!("waiting for the controller to observe generation {generation}"),
        ));
    }
    Ok(())
}

fn deployment(object: &Value) -> (ResourceState, String) {
    use ResourceState::{Applied, Failed, Healthy, Progressing};
    if object.pointer("/spec/paused").and_then(Value::as_bool) == Some(true) {
        // A paused Deployment does not roll out until it is resumed; waiting for it
        // would hold every rollout of this cluster.
        return (
            Applied,
            "paused (spec.paused): its rollout is not followed until it is resumed".into(),
        );
    }
    if let Err(waiting) = observed(object) {
        return waiting;
    }
    if let Some(progress) = condition(object, "Progressing")
        && progress.get("reason").and_then(Value::as_str) == Some("ProgressDeadlineExceeded")
    {
        let why = progress
            .get("message")
            .and_then(Value::as_str)
            .unwrap_or("");
        return (Failed, format!("progress deadline exceeded: {why}"));
    }
    let count = |field: &str| int(object, &format!("/status/{field}")).unwrap_or(0);
    let wanted = int(object, "/spec/replicas").unwrap_or(1);
    let (replicas, updated, available) = (
        count("replicas"),
        count("updatedReplicas"),
        count("availableReplicas"),
    );
    if updated < wanted {
        (
            Progressing,
            format!("{updated} of {wanted} new replicas updated"),
        )
    } else if replicas > updated {
        (
            Progressing,
            format!("{} old replicas pending termination", replicas - updated),
        )
    } else if available < updated {
        (
            Progressing,
            format!("{available} of {updated} updated replicas available"),
        )
    } else {
        (
            Healthy,
            format!("{available} of {wanted} replicas available"),
        )
    }
}

fn update_strategy(object: &Value) -> &str {
    object
        .pointer("/spec/updateStrategy/type")
        .and_then(Value::as_str)
        .unwrap_or("RollingUpdate")
}

fn stateful_set(object: &Value) -> (ResourceState, String) {
    use ResourceState::{Healthy, Progressing};
    let count = |field: &str| int(object, &format!("/status/{field}")).unwrap_or(0);
    let generation = int(object, "/metadata/generation").unwrap_or(0);
    let observed_generation = int(object, "/status/observedGeneration").unwrap_or(0);
    if observed_generation == 0 || generation > observed_generation {
        return (
            Progressing,
            format!("waiting for the controller to observe generation {generation}"),
        );
    }
    let wanted = int(object, "/spec/replicas").unwrap_or(1);
    let ready = count("readyReplicas");
    if ready < wanted {
        return (Progressing, format!("{ready} of {wanted} replicas ready"));
    }
    if update_strategy(object) == "OnDelete" {
        // kubectl cannot follow OnDelete: pods change only when someone deletes them.
        return (
            Healthy,
            format!("{ready} of {wanted} replicas ready (OnDelete: pods are updated when deleted)"),
        );
    }
    let updated = count("updatedReplicas");
    if let Some(partition) = int(object, "/spec/updateStrategy/rollingUpdate/partition") {
        let due = wanted - partition;
        if updated < due {
            return (
                Progressing,
                format!("partitioned roll out: {updated} of {due} new pods updated"),
            );
        }
        return (
            Healthy,
            format!("partitioned roll out complete: {updated} new pods updated"),
        );
    }
    let current = object
        .pointer("/status/currentRevision")
        .and_then(Value::as_str)
        .unwrap_or("");
    let target = object
        .pointer("/status/updateRevision")
        .and_then(Value::as_str)
        .unwrap_or("");
    if target != current {
        return (
            Progressing,
            format!("rolling update: {updated} pods at revision {target}"),
        );
    }
    (
        Healthy,
        format!("{ready} of {wanted} replicas ready at revision {current}"),
    )
}

fn daemon_set(object: &Value) -> (ResourceState, String) {
    use ResourceState::{Healthy, Progressing};
    if let Err(waiting) = observed(object) {
        return waiting;
    }
    let count = |field: &str| int(object, &format!("/status/{field}")).unwrap_or(0);
    let wanted = count("desiredNumberScheduled");
    let (updated, available) = (count("updatedNumberScheduled"), count("numberAvailable"));
    let on_delete = update_strategy(object) == "OnDelete";
    if !on_delete && updated < wanted {
        return (Progressing, format!("{updated} of {wanted} pods updated"));
    }
    if available < wanted {
        return (
            Progressing,
            format!("{available} of {wanted} pods available"),
        );
    }
    let note = if on_delete {
        " (OnDelete: pods are updated when deleted)"
    } else {
        ""
    };
    (
        Healthy,
        format!("{available} of {wanted} pods available{note}"),
    )
}

fn job(object: &Value) -> (ResourceState, String) {
    use ResourceState::{Applied, Failed, Healthy, Progressing};
    // `FailureTarget` and `SuccessCriteriaMet` come first on Kubernetes 1.31 and later,
    // while the pods are still being terminated.
    for failed in ["Failed", "FailureTarget"] {
        if let Some(condition) = condition(object, failed)
            && condition.get("status").and_then(Value::as_str) == Some("True")
        {
            let why = condition
                .get("message")
                .or_else(|| condition.get("reason"))
                .and_then(Value::as_str)
                .unwrap_or("the job failed");
            return (Failed, why.to_string());
        }
    }
    if condition_true(object, "Complete") || condition_true(object, "SuccessCriteriaMet") {
        return (Healthy, "completed".into());
    }
    if object.pointer("/spec/suspend").and_then(Value::as_bool) == Some(true) {
        return (Applied, "suspended (spec.suspend)".into());
    }
    let active = int(object, "/status/active").unwrap_or(0);
    let succeeded = int(object, "/status/succeeded").unwrap_or(0);
    (
        Progressing,
        format!("running: {active} active, {succeeded} succeeded"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn check(group: &str, kind: &str, object: Value, expect: ResourceState, says: &str) {
        let key = ResourceKey::new(group, kind, "demo", "x");
        let (state, message) = health(&key, &object);
        assert_eq!((state, message.as_str()), (expect, says), "{kind} {object}");
    }

    #[test]
    fn deployments_follow_kubectl_rollout_status() {
        use ResourceState::*;
        let d = |spec: Value, status: Value| json!({"metadata": {"generation": 2}, "spec": spec, "status": status});
        check(
            "apps",
            "Deployment",
            json!({"metadata": {"generation": 1}, "spec": {"replicas": 2}}),
            Progressing,
            "waiting for the controller to observe generation 1",
        );
        check(
            "apps",
            "Deployment",
            d(
                json!({"replicas": 3}),
                json!({"observedGeneration": 1, "replicas": 3, "updatedReplicas": 3, "availableReplicas": 3}),
            ),
            Progressing,
            "waiting for the controller to observe generation 2",
        );
        check(
            "apps",
            "Deployment",
            d(
                json!({"replicas": 3}),
                json!({"observedGeneration": 2, "replicas": 4, "updatedReplicas": 3, "availableReplicas": 3}),
            ),
            Progressing,
            "1 old replicas pending termination",
        );
        check(
            "apps",
            "Deployment",
            d(
                json!({"replicas": 3}),
                json!({"observedGeneration": 2, "replicas": 3, "updatedReplicas": 3, "availableReplicas": 2}),
            ),
            Progressing,
            "2 of 3 updated replicas available",
        );
        check(
            "apps",
            "Deployment",
            d(
                json!({"replicas": 3}),
                json!({"observedGeneration": 2, "conditions": [
                {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded",
                 "message": "ReplicaSet \"web-5d\" has timed out progressing."}]}),
            ),
            Failed,
            "progress deadline exceeded: ReplicaSet \"web-5d\" has timed out progressing.",
        );
        check(
            "apps",
            "Deployment",
            d(
                json!({"replicas": 1}),
                json!({"observedGeneration": 2, "replicas": 1, "updatedReplicas": 1, "availableReplicas": 1}),
            ),
            Healthy,
            "1 of 1 replicas available",
        );
        check(
            "apps",
            "Deployment",
            d(json!({"replicas": 0}), json!({"observedGeneration": 2})),
            Healthy,
            "0 of 0 replicas available",
        );
        check(
            "apps",
            "Deployment",
            d(
                json!({"replicas": 3, "paused": true}),
                json!({"observedGeneration": 2, "updatedReplicas": 1}),
            ),
            Applied,
            "paused (spec.paused): its rollout is not followed until it is resumed",
        );
    }

    #[test]
    fn stateful_sets_follow_kubectl_with_partitions_and_revisions() {
        use ResourceState::*;
        let s = |strategy: Value, status: Value| {
            json!({"metadata": {"generation": 1},
            "spec": {"replicas": 3, "updateStrategy": strategy}, "status": status})
        };
        let observed = |extra: Value| {
            let mut status = json!({"observedGeneration": 1, "readyReplicas": 3});
            status
                .as_object_mut()
                .expect("object")
                .extend(extra.as_object().expect("object").clone());
            status
        };
        check(
            "apps",
            "StatefulSet",
            s(json!({"type": "RollingUpdate"}), json!({})),
            Progressing,
            "waiting for the controller to observe generation 1",
        );
        check(
            "apps",
            "StatefulSet",
            s(
                json!({"type": "RollingUpdate"}),
                json!({"observedGeneration": 1, "readyReplicas": 2}),
            ),
            Progressing,
            "2 of 3 replicas ready",
        );
        // A partition of 2 means only one pod gets the new revision: done at 1.
        check(
            "apps",
            "StatefulSet",
            s(
                json!({"type": "RollingUpdate", "rollingUpdate": {"partition": 2}}),
                observed(json!({"updatedReplicas": 1})),
            ),
            Healthy,
            "partitioned roll out complete: 1 new pods updated",
        );
        check(
            "apps",
            "StatefulSet",
            s(
                json!({"type": "RollingUpdate", "rollingUpdate": {"partition": 0}}),
                observed(json!({"updatedReplicas": 2})),
            ),
            Progressing,
            "partitioned roll out: 2 of 3 new pods updated",
        );
        check(
            "apps",
            "StatefulSet",
            s(
                json!({"type": "RollingUpdate"}),
                observed(
                    json!({"updatedReplicas": 3, "currentRevision": "web-1", "updateRevision": "web-2"}),
                ),
            ),
            Progressing,
            "rolling update: 3 pods at revision web-2",
        );
        check(
            "apps",
            "StatefulSet",
            s(
                json!({"type": "RollingUpdate"}),
                observed(json!({"currentRevision": "web-2", "updateRevision": "web-2"})),
            ),
            Healthy,
            "3 of 3 replicas ready at revision web-2",
        );
        check(
            "apps",
            "StatefulSet",
            s(
                json!({"type": "OnDelete"}),
                observed(
                    json!({"updatedReplicas": 0, "currentRevision": "web-1", "updateRevision": "web-2"}),
                ),
            ),
            Healthy,
            "3 of 3 replicas ready (OnDelete: pods are updated when deleted)",
        );
    }

    #[test]
    fn daemon_sets_that_update_on_delete_are_judged_by_availability() {
        use ResourceState::*;
        let ds = |strategy: &str, updated: i64, available: i64| {
            json!({"metadata": {"generation": 4},
            "spec": {"updateStrategy": {"type": strategy}},
            "status": {"observedGeneration": 4, "desiredNumberScheduled": 3,
                       "updatedNumberScheduled": updated, "numberAvailable": available}})
        };
        check(
            "apps",
            "DaemonSet",
            ds("RollingUpdate", 2, 3),
            Progressing,
            "2 of 3 pods updated",
        );
        check(
            "apps",
            "DaemonSet",
            ds("RollingUpdate", 3, 2),
            Progressing,
            "2 of 3 pods available",
        );
        check(
            "apps",
            "DaemonSet",
            ds("RollingUpdate", 3, 3),
            Healthy,
            "3 of 3 pods available",
        );
        check(
            "apps",
            "DaemonSet",
            ds("OnDelete", 0, 3),
            Healthy,
            "3 of 3 pods available (OnDelete: pods are updated when deleted)",
        );
    }

    #[test]
    fn jobs_are_judged_by_their_conditions() {
        use ResourceState::*;
        let job = |conditions: Value| json!({"status": {"conditions": conditions, "active": 1}});
        check(
            "batch",
            "Job",
            job(json!([{"type": "Complete", "status": "True"}])),
            Healthy,
            "completed",
        );
        check(
            "batch",
            "Job",
            job(json!([{"type": "SuccessCriteriaMet", "status": "True"}])),
            Healthy,
            "completed",
        );
        check(
            "batch",
            "Job",
            job(
                json!([{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
                        "message": "Job has reached the specified backoff limit"}]),
            ),
            Failed,
            "Job has reached the specified backoff limit",
        );
        check(
            "batch",
            "Job",
            job(json!([{"type": "FailureTarget", "status": "True", "reason": "DeadlineExceeded"}])),
            Failed,
            "DeadlineExceeded",
        );
        check(
            "batch",
            "Job",
            job(json!([])),
            Progressing,
            "running: 1 active, 0 succeeded",
        );
        check(
            "batch",
            "Job",
            json!({"spec": {"suspend": true}}),
            Applied,
            "suspended (spec.suspend)",
        );
        check("", "ConfigMap", json!({}), Applied, "");
    }
}
