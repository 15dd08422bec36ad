//! The `kube` sink: server-side apply through the Kubernetes API with kube-rs. This is
//! the only module that knows kube-rs.
//!
//! One apply: CustomResourceDefinitions first, waiting until each is Established; then
//! Namespaces; then everything else, in bundle order. Every object is labelled with
//! the cluster and annotated with the bundle digest, and applied with field manager
//! `flotilla` (forcing conflicts only when asked). Only when every object was applied
//! are the objects of the previous inventory that the bundle no longer holds deleted,
//! in reverse order, skipping those annotated `flotilla.dev/prune: disabled` and those
//! that do not carry this cluster's label (flotilla does not own them).
//!
//! Errors the API server gives for one object (4xx: invalid, forbidden, conflict) fail
//! that object and the apply goes on; errors that say the server or the network is in
//! trouble (5xx, 429, transport) stop the apply, and the agent tries again later.
//! Server-side apply is idempotent, so the next attempt applies everything again and
//! so resumes where this one stopped.

use std::collections::HashMap;
use std::time::Duration;

use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams};
use kube::core::GroupVersionKind;
use serde_json::Value;

use super::{
    ApplyOutcome, CLUSTER_LABEL, Sink, apply_order, apply_rank, prune_disabled, prune_order,
    with_flotilla_metadata,
};
use crate::cache::InventoryEntry;
use flotilla_core::bundle::{Bundle, Resource, ResourceKey, api_group};
use flotilla_core::status::{ResourceState, ResourceStatus};

/// The field manager of every apply.
pub const FIELD_MANAGER: &str = "flotilla";

/// Why the sink could not connect to the Kubernetes API.
#[derive(Debug, thiserror::Error)]
#[error(
    "cannot find a Kubernetes API to apply to (in-cluster service account or kubeconfig): {0}; \
     run the agent in the cluster, or set KUBECONFIG"
)]
pub struct ConnectError(#[source] kube::Error);

/// Applies bundles to a Kubernetes cluster.
#[derive(Clone)]
pub struct KubeSink {
    client: kube::Client,
    force_conflicts: bool,
    /// How long to wait for a CRD to become Established.
    crd_timeout: Duration,
    /// How often to look at a CRD while waiting.
    crd_poll: Duration,
}

impl std::fmt::Debug for KubeSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeSink")
            .field("force_conflicts", &self.force_conflicts)
            .finish_non_exhaustive()
    }
}

impl KubeSink {
    /// Connects the way kube-rs finds a cluster: the in-cluster service account, or
    /// the kubeconfig (KUBECONFIG, ~/.kube/config).
    pub async fn connect(force_conflicts: bool) -> Result<KubeSink, ConnectError> {
        let client = kube::Client::try_default().await.map_err(ConnectError)?;
        Ok(KubeSink::with_client(client, force_conflicts))
    }

    pub fn with_client(client: kube::Client, force_conflicts: bool) -> KubeSink {
        KubeSink {
            client,
            force_conflicts,
            crd_timeout: Duration::from_secs(60),
            crd_poll: Duration::from_secs(1),
        }
    }

    /// Sets how long a CRD may take to become Established.
    pub fn with_crd_timeout(mut self, timeout: Duration) -> KubeSink {
        self.crd_timeout = timeout;
        self
    }

    async fn apply_bundle(&self, bundle: &Bundle, prune: &[InventoryEntry]) -> ApplyOutcome {
        let mut run = Run {
            sink: self,
            discovery: Discovery::default(),
            stopped: None,
        };
        let ordered = apply_order(bundle);
        let mut statuses: Vec<ResourceStatus> = Vec::with_capacity(ordered.len());

        let (definitions, others): (Vec<_>, Vec<_>) =
            ordered.into_iter().partition(|r| apply_rank(&r.key) == 0);
        let mut to_wait = Vec::new();
        for resource in &definitions {
            let (status, live) = run.apply_one(bundle, resource).await;
            if let Some(live) = live
                && !is_established(&live)
            {
                to_wait.push(statuses.len());
            }
            statuses.push(status);
        }
        for index in to_wait {
            if run.stopped.is_some() {
                break;
            }
            let name = statuses[index].name.clone();
            if let Err(message) = run.wait_established(&name).await {
                statuses[index].state = ResourceState::Failed;
                statuses[index].message = message;
            }
        }
        for resource in &others {
            let (status, _) = run.apply_one(bundle, resource).await;
            statuses.push(status);
        }

        let failed = statuses
            .iter()
            .filter(|s| s.state == ResourceState::Failed)
            .count();
        if failed > 0 {
            let mut message = format!(
                "{failed} of {} resources failed to apply; nothing was pruned",
                bundle.resources.len()
            );
            if let Some(reason) = &run.stopped {
                message = format!("{message} (stopped early: {reason})");
            } else if let Some(first) = statuses.iter().find(|s| s.state == ResourceState::Failed) {
                message = format!("{message}; first: {}: {}", first.key(), first.message);
            }
            return ApplyOutcome {
                resources: statuses,
                complete: false,
                message,
            };
        }

        let mut prune_failed = 0;
        let mut pruned = 0;
        for entry in prune_order(prune) {
            let status = run.prune_one(bundle, &entry).await;
            match status.state {
                ResourceState::Failed => prune_failed += 1,
                ResourceState::Pruned => pruned += 1,
                _ => {}
            }
            statuses.push(status);
        }
        let healthy = statuses
            .iter()
            .filter(|s| s.state == ResourceState::Healthy)
            .count();
        let progressing = statuses
            .iter()
            .filter(|s| s.state == ResourceState::Progressing)
            .count();
        if prune_failed > 0 {
            let reason = run
                .stopped
                .clone()
                .map(|r| format!(" (stopped early: {r})"))
                .unwrap_or_default();
            return ApplyOutcome {
                resources: statuses,
                complete: false,
                message: format!(
                    "applied {} resources, but {prune_failed} could not be pruned{reason}",
                    bundle.resources.len()
                ),
            };
        }
        ApplyOutcome {
            resources: statuses,
            complete: true,
            message: format!(
                "applied {} resources ({healthy} healthy, {progressing} progressing), pruned {pruned}",
                bundle.resources.len()
            ),
        }
    }

    async fn bundle_health(&self, bundle: &Bundle) -> Option<Vec<ResourceStatus>> {
        let mut discovery = Discovery::default();
        let mut statuses = Vec::with_capacity(bundle.resources.len());
        for resource in apply_order(bundle) {
            let key = &resource.key;
            if !has_health_rule(key) {
                statuses.push(ResourceStatus::new(key, ResourceState::Applied, ""));
                continue;
            }
            let api_version = api_version_of(resource);
            let found = match discovery
                .resolve(&self.client, api_version, &key.kind)
                .await
            {
                Ok(Some(found)) => found,
                Ok(None) => {
                    let message = format!(
                        "the API server does not serve kind {} in {api_version}",
                        key.kind
                    );
                    statuses.push(ResourceStatus::new(key, ResourceState::Failed, message));
                    continue;
                }
                // The API cannot be reached now: health is unknown, keep what was reported.
                Err(_) => return None,
            };
            let api = self.api_for(&found, &key.namespace);
            match api.get(&key.name).await {
                Ok(object) => {
                    let (state, message) = health(key, &to_value(&object));
                    statuses.push(ResourceStatus::new(key, state, message));
                }
                Err(kube::Error::Api(err)) if err.code == 404 => statuses.push(
                    ResourceStatus::new(key, ResourceState::Failed, "not found in the cluster"),
                ),
                Err(_) => return None,
            }
        }
        Some(statuses)
    }

    fn api_for(&self, found: &Found, namespace: &str) -> Api<DynamicObject> {
        if found.namespaced {
            let namespace = if namespace.is_empty() {
                self.client.default_namespace()
            } else {
                namespace
            };
            Api::namespaced_with(self.client.clone(), namespace, &found.resource)
        } else {
            Api::all_with(self.client.clone(), &found.resource)
        }
    }
}

impl Sink for KubeSink {
    fn id(&self) -> String {
        "kube".to_string()
    }

    fn apply<'a>(
        &'a mut self,
        bundle: &'a Bundle,
        prune: &'a [InventoryEntry],
    ) -> impl std::future::Future<Output = ApplyOutcome> + Send + 'a {
        self.apply_bundle(bundle, prune)
    }

    fn health<'a>(
        &'a mut self,
        bundle: &'a Bundle,
    ) -> impl std::future::Future<Output = Option<Vec<ResourceStatus>>> + Send + 'a {
        self.bundle_health(bundle)
    }
}

/// The state of one apply: discovery learnt so far, and whether it had to stop.
struct Run<'s> {
    sink: &'s KubeSink,
    discovery: Discovery,
    /// Set when the server or the network failed: the rest is not attempted.
    stopped: Option<String>,
}

impl Run<'_> {
    /// Applies one resource; returns its status and, on success, the object as the
    /// server returned it.
    async fn apply_one(
        &mut self,
        bundle: &Bundle,
        resource: &Resource,
    ) -> (ResourceStatus, Option<Value>) {
        let key = &resource.key;
        if let Some(reason) = &self.stopped {
            let message = format!("not attempted: the apply stopped early ({reason})");
            return (
                ResourceStatus::new(key, ResourceState::Failed, message),
                None,
            );
        }
        let api_version = api_version_of(resource);
        let found = match self
            .discovery
            .resolve(&self.sink.client, api_version, &key.kind)
            .await
        {
            Ok(Some(found)) => found,
            Ok(None) => {
                let message = format!(
                    "the API server does not serve kind {} in {api_version} (is its CustomResourceDefinition installed?)",
                    key.kind
                );
                return (
                    ResourceStatus::new(key, ResourceState::Failed, message),
                    None,
                );
            }
            Err(err) => return (self.failure(key, "cannot discover its API", err), None),
        };
        let mut object =
            with_flotilla_metadata(&resource.value, &bundle.cluster, Some(&bundle.digest));
        if !found.namespaced
            && let Some(metadata) = object.get_mut("metadata").and_then(Value::as_object_mut)
        {
            // The API server rejects a namespace on a cluster-scoped object.
            metadata.remove("namespace");
        }
        let mut params = PatchParams::apply(FIELD_MANAGER);
        if self.sink.force_conflicts {
            params = params.force();
        }
        let api = self.sink.api_for(&found, &key.namespace);
        match api.patch(&key.name, &params, &Patch::Apply(&object)).await {
            Ok(applied) => {
                let live = to_value(&applied);
                let (state, message) = health(key, &live);
                (ResourceStatus::new(key, state, message), Some(live))
            }
            Err(kube::Error::Api(err)) if err.code == 409 && !self.sink.force_conflicts => {
                let message = format!(
                    "conflict with another field manager: {}; take the fields over with --force-conflicts",
                    err.message
                );
                (
                    ResourceStatus::new(key, ResourceState::Failed, message),
                    None,
                )
            }
            Err(err) => (self.failure(key, "apply failed", err), None),
        }
    }

    /// Waits until the CRD `name` is Established.
    async fn wait_established(&mut self, name: &str) -> Result<(), String> {
        let crds = Api::<DynamicObject>::all_with(self.sink.client.clone(), &crd_resource());
        let deadline = tokio::time::Instant::now() + self.sink.crd_timeout;
        loop {
            match crds.get(name).await {
                Ok(object) if is_established(&to_value(&object)) => return Ok(()),
                Ok(_) => {}
                Err(err) => {
                    if is_fatal(&err) {
                        self.stopped = Some(describe(&err));
                    }
                    return Err(format!(
                        "cannot read it back to see it established: {}",
                        describe(&err)
                    ));
                }
            }
            if tokio::time::Instant::now() + self.sink.crd_poll > deadline {
                return Err(format!(
                    "not Established after {}s; its custom resources cannot be applied",
                    self.sink.crd_timeout.as_secs()
                ));
            }
            tokio::time::sleep(self.sink.crd_poll).await;
        }
    }

    /// Deletes one object the bundle no longer holds, unless it is protected or not ours.
    async fn prune_one(&mut self, bundle: &Bundle, entry: &InventoryEntry) -> ResourceStatus {
        let key = entry.key();
        let status = |state, message: String| ResourceStatus::new(&key, state, message);
        if let Some(reason) = &self.stopped {
            return status(
                ResourceState::Failed,
                format!("not pruned yet: the apply stopped early ({reason})"),
            );
        }
        let found = match self
            .discovery
            .resolve(&self.sink.client, &entry.api_version, &entry.kind)
            .await
        {
            Ok(Some(found)) => found,
            Ok(None) => {
                return status(
                    ResourceState::Pruned,
                    "its kind is no longer served, so it is gone".into(),
                );
            }
            Err(err) => return self.failure(&key, "cannot discover its API to prune it", err),
        };
        let api = self.sink.api_for(&found, &entry.namespace);
        let live = match api.get(&entry.name).await {
            Ok(object) => to_value(&object),
            Err(kube::Error::Api(err)) if err.code == 404 => {
                return status(ResourceState::Pruned, "already gone".into());
            }
            Err(err) => return self.failure(&key, "cannot read it to prune it", err),
        };
        if prune_disabled(&live) {
            return status(
                ResourceState::Applied,
                "left in place: annotated flotilla.dev/prune: disabled".into(),
            );
        }
        let owner = live
            .pointer("/metadata/labels")
            .and_then(|labels| labels.get(CLUSTER_LABEL))
            .and_then(Value::as_str);
        if owner != Some(bundle.cluster.as_str()) {
            return status(
                ResourceState::Applied,
                format!(
                    "left in place: it does not carry the label {CLUSTER_LABEL}={}, so flotilla does not own it",
                    bundle.cluster
                ),
            );
        }
        match api.delete(&entry.name, &DeleteParams::background()).await {
            Ok(_) => status(ResourceState::Pruned, String::new()),
            Err(kube::Error::Api(err)) if err.code == 404 => {
                status(ResourceState::Pruned, "already gone".into())
            }
            Err(err) => self.failure(&key, "prune failed", err),
        }
    }

    /// A failed status for `key`; an error that says the server or network is in
    /// trouble also stops the apply.
    fn failure(&mut self, key: &ResourceKey, what: &str, err: kube::Error) -> ResourceStatus {
        let described = describe(&err);
        if is_fatal(&err) {
            self.stopped = Some(format!("{key}: {described}"));
        }
        ResourceStatus::new(key, ResourceState::Failed, format!("{what}: {described}"))
    }
}

/// Errors after which applying the next object would most likely fail the same way.
fn is_fatal(err: &kube::Error) -> bool {
    match err {
        kube::Error::Api(response) => response.code >= 500 || response.code == 429,
        _ => true,
    }
}

fn describe(err: &kube::Error) -> String {
    match err {
        kube::Error::Api(response) => format!(
            "{} {} ({})",
            response.code, response.message, response.reason
        ),
        other => other.to_string(),
    }
}

/// What discovery says about one kind.
#[derive(Clone)]
struct Found {
    resource: ApiResource,
    namespaced: bool,
}

/// Discovery of the kinds served per group-version, one request per group-version
/// and apply. It is rebuilt for every apply, since an apply may install CRDs.
#[derive(Default)]
struct Discovery {
    /// apiVersion → kind → what the server said; `None` if the group-version is not served.
    served: HashMap<String, Option<HashMap<String, Found>>>,
}

impl Discovery {
    async fn resolve(
        &mut self,
        client: &kube::Client,
        api_version: &str,
        kind: &str,
    ) -> Result<Option<Found>, kube::Error> {
        if !self.served.contains_key(api_version) {
            let listed = if api_group(api_version).is_empty() {
                client.list_core_api_resources(api_version).await
            } else {
                client.list_api_group_resources(api_version).await
            };
            let kinds = match listed {
                Ok(list) => Some(
                    list.resources
                        .into_iter()
                        .filter(|r| !r.name.contains('/'))
                        .map(|r| {
                            let gvk = GroupVersionKind::gvk(
                                api_group(api_version),
                                api_version.rsplit('/').next().unwrap_or(api_version),
                                &r.kind,
                            );
                            let found = Found {
                                resource: ApiResource::from_gvk_with_plural(&gvk, &r.name),
                                namespaced: r.namespaced,
                            };
                            (r.kind, found)
                        })
                        .collect(),
                ),
                Err(kube::Error::Api(err)) if err.code == 404 => None,
                Err(err) => return Err(err),
            };
            self.served.insert(api_version.to_string(), kinds);
        }
        Ok(self
            .served
            .get(api_version)
            .and_then(Option::as_ref)
            .and_then(|kinds| kinds.get(kind))
            .cloned())
    }
}

fn crd_resource() -> ApiResource {
    let gvk = GroupVersionKind::gvk("apiextensions.k8s.io", "v1", "CustomResourceDefinition");
    ApiResource::from_gvk_with_plural(&gvk, "customresourcedefinitions")
}

fn api_version_of(resource: &Resource) -> &str {
    resource
        .value
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or("v1")
}

fn to_value(object: &DynamicObject) -> Value {
    serde_json::to_value(object).unwrap_or(Value::Null)
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

fn is_established(crd: &Value) -> bool {
    condition_true(crd, "Established")
}

fn has_health_rule(key: &ResourceKey) -> bool {
    matches!(
        (key.group.as_str(), key.kind.as_str()),
        ("apps", "Deployment" | "StatefulSet" | "DaemonSet") | ("batch", "Job")
    )
}

fn int(object: &Value, pointer: &str) -> Option<i64> {
    object.pointer(pointer).and_then(Value::as_i64)
}

/// The health of an object as the server returned it: ready replicas at the current
/// generation for workloads, completion for Jobs; other kinds are `applied`.
pub fn health(key: &ResourceKey, object: &Value) -> (ResourceState, String) {
    use ResourceState::{Applied, Failed, Healthy, Progressing};
    if !has_health_rule(key) {
        return (Applied, String::new());
    }
    if key.kind == "Job" {
        if condition_true(object, "Complete") {
            return (Healthy, "completed".into());
        }
        if let Some(failed) = condition(object, "Failed")
            && failed.get("status").and_then(Value::as_str) == Some("True")
        {
            let why = failed
                .get("message")
                .or_else(|| failed.get("reason"))
                .and_then(Value::as_str)
                .unwrap_or("the job failed");
            return (Failed, why.to_string());
        }
        return (Progressing, "running".into());
    }
    let generation = int(object, "/metadata/generation").unwrap_or(0);
    let observed = int(object, "/status/observedGeneration").unwrap_or(0);
    if observed < generation {
        return (
            Progressing,
            format!("waiting for the controller to observe generation {generation}"),
        );
    }
    let count = |field: &str| int(object, &format!("/status/{field}")).unwrap_or(0);
    match key.kind.as_str() {
        "Deployment" => {
            if let Some(progress) = condition(object, "Progressing")
                && progress.get("reason").and_then(Value::as_str)
                    == Some("ProgressDeadlineExceeded")
            {
                return (Failed, "progress deadline exceeded".into());
            }
            let wanted = int(object, "/spec/replicas").unwrap_or(1);
            let (updated, available) = (count("updatedReplicas"), count("availableReplicas"));
            if updated < wanted {
                (
                    Progressing,
                    format!("{updated} of {wanted} replicas updated"),
                )
            } else if count("replicas") > updated {
                (
                    Progressing,
                    format!("{} old replicas terminating", count("replicas") - updated),
                )
            } else if available < wanted {
                (
                    Progressing,
                    format!("{available} of {wanted} replicas available"),
                )
            } else {
                (
                    Healthy,
                    format!("{available} of {wanted} replicas available"),
                )
            }
        }
        "StatefulSet" => {
            let wanted = int(object, "/spec/replicas").unwrap_or(1);
            let rolling = object
                .pointer("/spec/updateStrategy/type")
                .and_then(Value::as_str)
                .is_none_or(|t| t == "RollingUpdate");
            let ready = count("readyReplicas");
            if rolling && count("updatedReplicas") < wanted {
                (
                    Progressing,
                    format!("{} of {wanted} replicas updated", count("updatedReplicas")),
                )
            } else if ready < wanted {
                (Progressing, format!("{ready} of {wanted} replicas ready"))
            } else {
                (Healthy, format!("{ready} of {wanted} replicas ready"))
            }
        }
        _ => {
            // DaemonSet
            let wanted = count("desiredNumberScheduled");
            let (updated, available) = (count("updatedNumberScheduled"), count("numberAvailable"));
            if updated < wanted {
                (Progressing, format!("{updated} of {wanted} pods updated"))
            } else if available < wanted {
                (
                    Progressing,
                    format!("{available} of {wanted} pods available"),
                )
            } else {
                (Healthy, format!("{available} of {wanted} pods available"))
            }
        }
    }
}

#[cfg(test)]
#[path = "kube_tests.rs"]
mod tests;
