//! Helm hooks (`meta.hooks`): resources of a Helm release that run around it, as Helm
//! runs them, instead of being applied with the rest.
//!
//! A release (a workload with hooks) is **installed** when the agent never applied
//! any of its other resources, and **upgraded** when its resources (hooks included)
//! differ from those of its last install or upgrade, which the ledger keeps as a
//! fingerprint per release ([`super::ledger::Ledger::releases`]). A release that did
//! not change runs no hook: a resync, or a bundle that changes another workload,
//! leaves its hooks alone.
//!
//! In the release's apply phase, its `pre-*` hooks of the event run first (by weight,
//! then kind and name), each Job or Pod waited for until it completes; then the
//! release's resources are applied; then its `post-*` hooks run, waited for the same
//! way (like Helm without `--wait`, the release's health is not waited for before
//! them). A hook that fails, or does not complete within `--phase-timeout`, stops the
//! apply there. `before-hook-creation` deletes the hook's previous object before it is
//! created, `hook-succeeded` and `hook-failed` delete it after it ran. The fingerprint
//! is recorded once the post hooks completed, so a release whose hooks or resources
//! failed runs them again on the next attempt.
//!
//! A release **leaves** when the bundle last applied completely held it and the new one
//! does not ([`Leaving`]): in its prune step, its `pre-delete` hooks (from that previous
//! bundle) run and are waited for before its objects are deleted, and its `post-delete`
//! hooks after; a `pre-delete` hook that fails keeps the release in place.
//!
//! Hooks are not in the ledger: they are never pruned, never checked for drift and
//! never applied again by a resync.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use serde_json::Value;
use tokio::time::Instant;

use super::discovery::Found;
use super::ledger::{Ledger, Origin};
use super::{Line, Run, api_version_of, health, qualified};
use flotilla_core::bundle::{Bundle, Digest, HookMark, Resource, ResourceKey};
use flotilla_core::status::{ResourceState, ResourceStatus};

/// What happens to a release in this apply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Change {
    Install,
    Upgrade,
}

impl Change {
    fn event(self, when: When) -> &'static str {
        match (self, when) {
            (Change::Install, When::Pre) => "pre-install",
            (Change::Install, When::Post) => "post-install",
            (Change::Upgrade, When::Pre) => "pre-upgrade",
            (Change::Upgrade, When::Post) => "post-upgrade",
        }
    }
}

/// Before or after the release's resources.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum When {
    Pre,
    Post,
}

/// The hooks of a bundle and what is due of them.
#[derive(Debug, Default)]
pub(super) struct Hooks<'b> {
    /// Each hook resource: its mark and its release.
    marks: HashMap<&'b ResourceKey, (&'b HookMark, &'b str)>,
    /// Each release with hooks: its fingerprint now, and its change if it has one.
    releases: BTreeMap<&'b str, (String, Option<Change>)>,
}

/// One hook to run.
pub(super) struct Due<'b> {
    pub resource: &'b Arc<Resource>,
    pub mark: &'b HookMark,
    pub event: &'static str,
    pub release: &'b str,
}

/// The kinds in the order Helm installs them (and so runs hooks of one weight and
/// one name); any other kind comes after these, by name.
const HELM_INSTALL_ORDER: [&str; 38] = [
    "PriorityClass",
    "Namespace",
    "NetworkPolicy",
    "ResourceQuota",
    "LimitRange",
    "PodSecurityPolicy",
    "PodDisruptionBudget",
    "ServiceAccount",
    "Secret",
    "SecretList",
    "ConfigMap",
    "StorageClass",
    "PersistentVolume",
    "PersistentVolumeClaim",
    "CustomResourceDefinition",
    "ClusterRole",
    "ClusterRoleList",
    "ClusterRoleBinding",
    "ClusterRoleBindingList",
    "Role",
    "RoleList",
    "RoleBinding",
    "RoleBindingList",
    "Service",
    "DaemonSet",
    "Pod",
    "ReplicationController",
    "ReplicaSet",
    "Deployment",
    "HorizontalPodAutoscaler",
    "StatefulSet",
    "Job",
    "CronJob",
    "IngressClass",
    "Ingress",
    "APIService",
    "MutatingWebhookConfiguration",
    "ValidatingWebhookConfiguration",
];

impl Due<'_> {
    /// Whether the hook's delete policies delete it on `policy`. As in Helm, a
    /// CustomResourceDefinition hook is never deleted: that would delete every object
    /// of its kind in the cluster.
    fn deletes_on(&self, policy: &str) -> bool {
        self.mark.deletes_on(policy)
            && !(self.resource.key.group() == "apiextensions.k8s.io"
                && self.resource.key.kind() == "CustomResourceDefinition")
    }

    /// Hooks run as Helm runs them: by weight, then by name, then by the order
    /// Helm installs kinds in (a ServiceAccount before the Job of the same name).
    fn in_order(a: &Due, b: &Due) -> std::cmp::Ordering {
        fn key<'d>(due: &'d Due) -> (i64, &'d str, usize, &'d str) {
            let kind = due.resource.key.kind();
            let rank = HELM_INSTALL_ORDER
                .iter()
                .position(|k| *k == kind)
                .unwrap_or(HELM_INSTALL_ORDER.len());
            (due.mark.weight, due.resource.key.name(), rank, kind)
        }
        key(a).cmp(&key(b))
    }
}

impl<'b> Hooks<'b> {
    /// The bundle's hooks, and which of them are due given what the ledger (as it was
    /// before this apply) says of each release.
    /// What is due for `bundle`'s releases, against their fingerprints in `ledger`.
    /// With `key` (the agent's own, [`crate::sink::Sink::keep_private`]) a release's
    /// fingerprint is keyed: it covers the release's opened Secrets, and a plain hash
    /// of them, kept in a ConfigMap, would let a reader test guesses of their values.
    /// A fingerprint an older agent kept without a key still counts as the same.
    pub fn plan(bundle: &'b Bundle, ledger: &Ledger, key: Option<&[u8; 32]>) -> Hooks<'b> {
        let Some(meta) = bundle.meta.as_deref() else {
            return Hooks::default();
        };
        let mut marks = HashMap::new();
        for hook in &meta.hooks {
            if let (Some(resource), Some(release)) = (
                bundle.resources.get(hook.resource),
                meta.workloads.get(hook.resource),
            ) {
                marks.insert(&*resource.key, (hook, release.as_str()));
            }
        }
        let mut digests: BTreeMap<&str, String> = BTreeMap::new();
        let mut applied_before: HashSet<&str> = HashSet::new();
        let released: HashSet<&str> = marks.values().map(|(_, release)| *release).collect();
        for (resource, workload) in bundle.resources.iter().zip(&meta.workloads) {
            let workload = workload.as_str();
            if !released.contains(workload) {
                continue;
            }
            let text = digests.entry(workload).or_default();
            text.push_str(Digest::of(&resource.canonical).hex());
            if !marks.contains_key(&*resource.key)
                && ledger
                    .entry(&resource.key)
                    .is_some_and(|e| e.origin != Origin::Pending)
            {
                applied_before.insert(workload);
            }
        }
        let releases = digests
            .into_iter()
            .map(|(release, text)| {
                let unkeyed = || Digest::of(text.as_bytes()).to_string();
                let fingerprint = match key {
                    Some(key) => {
                        let mut keyed = key.to_vec();
                        keyed.extend_from_slice(text.as_bytes());
                        Digest::of(&keyed).to_string()
                    }
                    None => unkeyed(),
                };
                let change = match ledger.releases.get(release) {
                    Some(last) if *last == fingerprint || *last == unkeyed() => None,
                    Some(_) => Some(Change::Upgrade),
                    None if applied_before.contains(release) => Some(Change::Upgrade),
                    None => Some(Change::Install),
                };
                (release, (fingerprint, change))
            })
            .collect();
        Hooks { marks, releases }
    }

    pub fn is_hook(&self, key: &ResourceKey) -> bool {
        self.marks.contains_key(key)
    }

    /// The hooks among `resources` due `when`, in the order they run: by weight, then
    /// kind and name.
    pub fn due(&self, resources: &[&'b Arc<Resource>], when: When) -> Vec<Due<'b>> {
        let mut due: Vec<Due<'b>> = resources
            .iter()
            .filter_map(|resource| {
                let &(mark, release) = self.marks.get(&*resource.key)?;
                let (_, change) = self.releases.get(release)?;
                let event = change.as_ref()?.event(when);
                mark.runs_on(event).then_some(Due {
                    resource,
                    mark,
                    event,
                    release,
                })
            })
            .collect();
        due.sort_by(Due::in_order);
        due
    }

    /// A line for each hook among `resources` that is not due in this apply.
    pub fn idle_lines(&self, resources: &[&Arc<Resource>]) -> Vec<Line> {
        resources
            .iter()
            .filter_map(|resource| {
                let &(mark, release) = self.marks.get(&*resource.key)?;
                let change = self.releases.get(release).and_then(|(_, c)| *c);
                let due = change.is_some_and(|c| {
                    mark.runs_on(c.event(When::Pre)) || mark.runs_on(c.event(When::Post))
                });
                if due {
                    return None;
                }
                let why = match change {
                    None => format!("release {release} did not change"),
                    Some(Change::Install) => format!("release {release} is being installed"),
                    Some(Change::Upgrade) => format!("release {release} is being upgraded"),
                };
                let message = format!("Helm hook ({}): not run, {why}", mark.events.join(", "));
                Some(Line {
                    status: ResourceStatus::new(&resource.key, ResourceState::Applied, message),
                    apply_error: false,
                })
            })
            .collect()
    }

    /// The releases among `resources`' workloads that have hooks, with their
    /// fingerprint now.
    pub fn releases_of(
        &self,
        bundle: &Bundle,
        resources: &[&Arc<Resource>],
    ) -> Vec<(String, String)> {
        let Some(meta) = bundle.meta.as_deref() else {
            return Vec::new();
        };
        let in_phase: HashSet<&ResourceKey> = resources.iter().map(|r| &*r.key).collect();
        let mut found: Vec<(String, String)> = Vec::new();
        for (resource, workload) in bundle.resources.iter().zip(&meta.workloads) {
            if !in_phase.contains(&*resource.key) || found.iter().any(|(w, _)| w == workload) {
                continue;
            }
            if let Some((fingerprint, _)) = self.releases.get(workload.as_str()) {
                found.push((workload.clone(), fingerprint.clone()));
            }
        }
        found
    }

    /// The release of a resource, if it belongs to one with hooks.
    pub fn release_of(&self, bundle: &'b Bundle, key: &ResourceKey) -> Option<&'b str> {
        let meta = bundle.meta.as_deref()?;
        let index = bundle
            .resources
            .binary_search_by(|r| (*r.key).cmp(key))
            .ok()?;
        let workload = meta.workloads.get(index)?.as_str();
        self.releases.contains_key(workload).then_some(workload)
    }
}

/// The releases that leave the cluster and their delete hooks: releases with hooks in
/// the bundle last applied completely whose workload the new bundle no longer holds, and
/// of which flotilla's inventory still lists a resource (so a release whose prune was
/// done does not run its hooks again). The hooks come from that previous bundle, since
/// the new one does not hold them.
#[derive(Default)]
pub(super) struct Leaving<'b> {
    /// Each leaving release: its apply phase in the previous bundle, its `pre-delete`
    /// and its `post-delete` hooks, each in the order they run.
    releases: BTreeMap<&'b str, (usize, Vec<Due<'b>>, Vec<Due<'b>>)>,
    /// The release each resource of the previous bundle belongs to, for those leaving.
    members: HashMap<&'b ResourceKey, &'b str>,
}

impl<'b> Leaving<'b> {
    pub fn plan(previous: &'b Bundle, bundle: &Bundle, ledger: &Ledger) -> Leaving<'b> {
        let Some(meta) = previous.meta.as_deref() else {
            return Leaving::default();
        };
        let staying: HashSet<&str> = bundle
            .meta
            .iter()
            .flat_map(|meta| meta.workloads.iter().map(String::as_str))
            .collect();
        let mut hooks: BTreeMap<&str, Vec<(&Arc<Resource>, &HookMark)>> = BTreeMap::new();
        for hook in &meta.hooks {
            if let (Some(resource), Some(release)) = (
                previous.resources.get(hook.resource),
                meta.workloads.get(hook.resource),
            ) && !staying.contains(release.as_str())
            {
                hooks.entry(release).or_default().push((resource, hook));
            }
        }
        let phases = previous.resource_phases();
        let mut releases = BTreeMap::new();
        let mut members = HashMap::new();
        for ((resource, workload), phase) in
            previous.resources.iter().zip(&meta.workloads).zip(&phases)
        {
            let Some(release_hooks) = hooks.get(workload.as_str()) else {
                continue;
            };
            members.insert(&*resource.key, workload.as_str());
            let is_hook = release_hooks.iter().any(|(r, _)| r.key == resource.key);
            if is_hook
                || ledger.entry(&resource.key).is_none()
                || releases.contains_key(workload.as_str())
            {
                continue;
            }
            let due = |event: &'static str| {
                let mut due: Vec<Due<'b>> = release_hooks
                    .iter()
                    .filter(|(_, mark)| mark.runs_on(event))
                    .map(|&(resource, mark)| Due {
                        resource,
                        mark,
                        event,
                        release: workload.as_str(),
                    })
                    .collect();
                due.sort_by(Due::in_order);
                due
            };
            releases.insert(
                workload.as_str(),
                (*phase, due("pre-delete"), due("post-delete")),
            );
        }
        members.retain(|_, release| releases.contains_key(*release));
        Leaving { releases, members }
    }

    /// The leaving releases whose workload was in apply phase `phase`.
    pub fn in_phase(&self, phase: usize) -> Vec<&'b str> {
        self.releases
            .iter()
            .filter(|(_, (p, ..))| *p == phase)
            .map(|(release, _)| *release)
            .collect()
    }

    /// A release's `pre-delete` hooks.
    pub fn pre(&self, release: &str) -> &[Due<'b>] {
        self.releases
            .get(release)
            .map_or(&[][..], |(_, pre, _)| pre.as_slice())
    }

    /// A release's `post-delete` hooks.
    pub fn post(&self, release: &str) -> &[Due<'b>] {
        self.releases
            .get(release)
            .map_or(&[][..], |(_, _, post)| post.as_slice())
    }

    /// Whether the object is a delete hook of a leaving release.
    pub fn runs(&self, key: &ResourceKey) -> bool {
        self.releases
            .values()
            .any(|(_, pre, post)| pre.iter().chain(post).any(|due| *due.resource.key == *key))
    }

    /// The leaving release an object belongs to.
    pub fn release_of(&self, key: &ResourceKey) -> Option<&'b str> {
        self.members.get(key).copied()
    }
}

/// How a hook ended.
enum End {
    Succeeded(String),
    Failed(String),
}

/// Whether a hook object as the server returned it has finished: a Job once it
/// completed or failed, a Pod once it succeeded or failed, anything else at once.
fn finished(key: &ResourceKey, live: &Value) -> Option<End> {
    match (key.group(), key.kind()) {
        ("batch", "Job") => match health(key, live) {
            (ResourceState::Healthy, message) => Some(End::Succeeded(message)),
            (ResourceState::Failed, message) => Some(End::Failed(message)),
            _ => None,
        },
        ("", "Pod") => match live.pointer("/status/phase").and_then(Value::as_str) {
            Some("Succeeded") => Some(End::Succeeded("succeeded".into())),
            Some("Failed") => Some(End::Failed(
                live.pointer("/status/message")
                    .and_then(Value::as_str)
                    .unwrap_or("the pod failed")
                    .to_string(),
            )),
            _ => None,
        },
        _ => Some(End::Succeeded("applied".into())),
    }
}

fn running(live: &Value) -> String {
    let active = live
        .pointer("/status/active")
        .and_then(Value::as_i64)
        .unwrap_or(0);
    match live.pointer("/status/phase").and_then(Value::as_str) {
        Some(phase) => format!("phase {phase}"),
        None => format!("running: {active} active"),
    }
}

impl Run {
    /// Runs hooks one after the other; the first that fails stops them. Returns a
    /// line per hook, and why they stopped. As in Helm, the hooks whose policy is
    /// `hook-succeeded` are deleted only once every hook of the run has succeeded
    /// (the last first): a ServiceAccount or RoleBinding hook stays until the Job
    /// hook after it that uses it has run.
    pub(super) async fn run_hooks(
        &mut self,
        bundle: &Bundle,
        due: &[Due<'_>],
        defined: &HashSet<(String, String)>,
    ) -> (Vec<Line>, Option<String>) {
        let mut lines = Vec::with_capacity(due.len());
        let mut succeeded: Vec<(usize, Found, ResourceKey)> = Vec::new();
        for (index, hook) in due.iter().enumerate() {
            let (line, found) = self.run_hook(bundle, hook, defined).await;
            if !line.apply_error {
                if let Some(found) = found
                    && hook.deletes_on("hook-succeeded")
                {
                    succeeded.push((lines.len(), found, hook.resource.key.as_ref().clone()));
                }
                lines.push(line);
                continue;
            }
            let reason = format!(
                "Helm hook {} ({} of release {}) failed: {}",
                hook.resource.key, hook.event, hook.release, line.status.message
            );
            lines.push(line);
            lines.extend(due[index + 1..].iter().map(|later| Line {
                status: ResourceStatus::new(
                    &later.resource.key,
                    ResourceState::Failed,
                    format!("not run: {reason}"),
                ),
                apply_error: true,
            }));
            return (lines, Some(reason));
        }
        for (line, found, key) in succeeded.into_iter().rev() {
            let namespace = found.namespaced.then_some(key.namespace());
            let deleted = match self.delete_hook(&found, namespace, &key).await {
                Ok(()) => "; deleted (hook-succeeded)".to_string(),
                Err(message) => format!("; cannot delete it (hook-succeeded): {message}"),
            };
            lines[line].status.message.push_str(&deleted);
        }
        (lines, None)
    }

    /// The delete hooks of a release that left the bundle, from `previous` (the
    /// bundle that held it): each is applied, waited for and deleted as whoever that
    /// bundle applied it as (a tenant's ServiceAccount, with `--impersonate-tenants`),
    /// not as the agent, although the bundle being applied no longer names it.
    pub(super) async fn run_leaving_hooks(
        &mut self,
        previous: &Bundle,
        due: &[Due<'_>],
    ) -> (Vec<Line>, Option<String>) {
        let users = super::Users::of(previous, self.options.impersonate_tenants);
        let current = std::mem::replace(&mut self.users, users);
        let ran = self.run_hooks(previous, due, &HashSet::new()).await;
        self.users = current;
        ran
    }

    /// Runs one hook: its line, and where it is when it succeeded (for a deletion by
    /// `hook-succeeded`, which [`Run::run_hooks`] makes once every hook has run).
    async fn run_hook(
        &mut self,
        bundle: &Bundle,
        hook: &Due<'_>,
        defined: &HashSet<(String, String)>,
    ) -> (Line, Option<Found>) {
        let key = &hook.resource.key;
        let failed = |message: String| {
            let line = Line {
                status: ResourceStatus::new(key, ResourceState::Failed, message),
                apply_error: true,
            };
            (line, None)
        };
        if let Some(reason) = &self.stopped {
            return failed(format!("not run: the apply stopped early ({reason})"));
        }
        let api_version = api_version_of(hook.resource);
        let found = match self
            .resolve_for_apply(&api_version, key.kind(), defined)
            .await
        {
            Ok(Some(found)) => found,
            Ok(None) => {
                return failed(format!(
                    "the API server does not serve kind {} in {api_version}",
                    key.kind()
                ));
            }
            Err(failure) => {
                let line =
                    self.apply_failed(key, "cannot discover its API", "get", &api_version, failure);
                return (line, None);
            }
        };
        let namespace = found.namespaced.then_some(key.namespace());
        let resource_name = qualified(&found);
        if hook.deletes_on("before-hook-creation")
            && let Err(message) = self.delete_hook(&found, namespace, key).await
        {
            return failed(format!(
                "cannot delete its previous object (before-hook-creation): {message}"
            ));
        }
        let object = super::applied_object(bundle, hook.resource, found.namespaced);
        let live = match self
            .api_for(key)
            .apply(
                &found.resource,
                namespace,
                key.name(),
                &object,
                self.options.force_conflicts,
            )
            .await
        {
            Ok((_, live)) => {
                self.server_errors = 0;
                live
            }
            Err(failure) => {
                let line = self.apply_failed(key, "apply failed", "patch", &resource_name, failure);
                return (line, None);
            }
        };
        let end = self.wait_finished(&found, namespace, key, live).await;
        // A failed hook is deleted now (hook-failed); a succeeded one once every hook
        // of the run has succeeded ([`Run::run_hooks`]).
        let mut deleted = String::new();
        if matches!(end, End::Failed(_)) && hook.deletes_on("hook-failed") {
            deleted = match self.delete_hook(&found, namespace, key).await {
                Ok(()) => "; deleted (hook-failed)".to_string(),
                Err(message) => format!("; cannot delete it (hook-failed): {message}"),
            };
        }
        match end {
            End::Succeeded(message) => {
                let state = if matches!(key.kind(), "Job" | "Pod") {
                    ResourceState::Healthy
                } else {
                    ResourceState::Applied
                };
                let line = Line {
                    status: ResourceStatus::new(
                        key,
                        state,
                        format!(
                            "Helm hook {} of release {}: {message}",
                            hook.event, hook.release
                        ),
                    ),
                    apply_error: false,
                };
                (line, Some(found))
            }
            End::Failed(message) => failed(format!("{message}{deleted}")),
        }
    }

    /// Waits until a hook Job or Pod finishes, for at most `--phase-timeout`.
    async fn wait_finished(
        &mut self,
        found: &Found,
        namespace: Option<&str>,
        key: &ResourceKey,
        mut live: Value,
    ) -> End {
        let deadline = Instant::now() + self.options.phase_timeout;
        loop {
            if let Some(end) = finished(key, &live) {
                return end;
            }
            if Instant::now() + self.options.crd_poll > deadline {
                return End::Failed(format!(
                    "not complete after {} (--phase-timeout): {}",
                    humantime::format_duration(self.options.phase_timeout),
                    running(&live)
                ));
            }
            let read = async {
                self.pause(self.options.crd_poll).await?;
                self.api_for(key)
                    .get(&found.resource, namespace, key.name())
                    .await
            };
            match read.await {
                Ok(read) => live = read,
                Err(failure) if failure.is_not_found() => {
                    return End::Failed("it was deleted before it finished".into());
                }
                Err(failure) => {
                    let described = failure.describe("get", key.kind());
                    self.note(key, &failure, &described);
                    if failure.stops_run() {
                        return End::Failed(described);
                    }
                }
            }
        }
    }

    /// Deletes a hook's object (or a Job run from an older manifest) if there is one,
    /// and waits until it is gone (for at most `--phase-timeout`).
    pub(super) async fn delete_hook(
        &mut self,
        found: &Found,
        namespace: Option<&str>,
        key: &ResourceKey,
    ) -> Result<(), String> {
        self.delete_object(found, namespace, key, None).await
    }

    /// [`Run::delete_hook`], of the object with uid `expected` only, when given: one
    /// made again since (someone else's) is left, and that is the error.
    pub(super) async fn delete_object(
        &mut self,
        found: &Found,
        namespace: Option<&str>,
        key: &ResourceKey,
        expected: Option<&str>,
    ) -> Result<(), String> {
        let mut deleting = false;
        let deadline = Instant::now() + self.options.phase_timeout;
        loop {
            let live = match self
                .api_for(key)
                .get(&found.resource, namespace, key.name())
                .await
            {
                Ok(live) => live,
                Err(failure) if failure.is_not_found() => return Ok(()),
                Err(failure) => {
                    let described = failure.describe("get", key.kind());
                    self.note(key, &failure, &described);
                    return Err(described);
                }
            };
            if !deleting {
                let uid = live
                    .pointer("/metadata/uid")
                    .and_then(Value::as_str)
                    .map(str::to_string);
                if expected.is_some() && uid.as_deref() != expected {
                    return Err(
                        "it was made again since it was read (its uid changed); left as it is"
                            .into(),
                    );
                }
                match self
                    .api_for(key)
                    .delete(&found.resource, namespace, key.name(), uid, None)
                    .await
                {
                    Ok(_) => deleting = true,
                    Err(failure) if failure.is_not_found() => return Ok(()),
                    Err(failure) => {
                        let described = failure.describe("delete", key.kind());
                        self.note(key, &failure, &described);
                        return Err(described);
                    }
                }
                continue;
            }
            if Instant::now() + self.options.crd_poll > deadline {
                return Err(format!(
                    "still there after {} (--phase-timeout)",
                    humantime::format_duration(self.options.phase_timeout)
                ));
            }
            if let Err(failure) = self.pause(self.options.crd_poll).await {
                return Err(failure.describe("delete", key.kind()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::InventoryEntry;
    use crate::testing::phased_bundle_of;
    use serde_json::json;

    fn object(kind: &str, name: &str, replicas: i64) -> Value {
        let api_version = if kind == "Job" { "batch/v1" } else { "apps/v1" };
        json!({"apiVersion": api_version, "kind": kind,
               "metadata": {"name": name, "namespace": "demo"}, "spec": {"replicas": replicas}})
    }

    /// Release `web` (a Deployment with `replicas`) with two pre-install,pre-upgrade
    /// hooks of weights 5 and -1 and a post-install one, beside workload `other`.
    fn release(replicas: i64) -> Bundle {
        let bundle = phased_bundle_of(
            "edge-1",
            vec![
                ("web", object("Deployment", "web", replicas)),
                ("web", object("Job", "a-late", 0)),
                ("web", object("Job", "z-early", 0)),
                ("web", object("Job", "notify", 0)),
                ("other", object("Deployment", "other", 1)),
            ],
            &[&["web", "other"]],
        );
        let mut meta = bundle.meta.as_deref().cloned().expect("meta");
        for (index, resource) in bundle.resources.iter().enumerate() {
            let (events, weight): (&[&str], i64) = match resource.key.name() {
                "a-late" => (&["pre-install", "pre-upgrade"], 5),
                "z-early" => (&["pre-install", "pre-upgrade"], -1),
                "notify" => (&["post-install"], 0),
                _ => continue,
            };
            meta.hooks.push(HookMark {
                resource: index,
                events: events.iter().map(|e| e.to_string()).collect(),
                weight,
                delete_policies: Vec::new(),
            });
        }
        Bundle::from_sorted_with_meta("edge-1", bundle.resources.clone(), Some(meta))
    }

    fn due(hooks: &Hooks<'_>, bundle: &Bundle, when: When) -> Vec<(String, &'static str)> {
        let all: Vec<&Arc<Resource>> = bundle.resources.iter().collect();
        hooks
            .due(&all, when)
            .iter()
            .map(|d| (d.resource.key.name().to_string(), d.event))
            .collect()
    }

    fn names(list: &[(&str, &'static str)]) -> Vec<(String, &'static str)> {
        list.iter().map(|(n, e)| (n.to_string(), *e)).collect()
    }

    #[test]
    fn a_release_is_installed_once_upgraded_when_it_changes_and_left_alone_otherwise() {
        let bundle = release(1);
        let mut ledger = Ledger::new("edge-1");
        let hooks = Hooks::plan(&bundle, &ledger, None);
        let hook_names: Vec<&str> = bundle
            .resources
            .iter()
            .filter(|r| hooks.is_hook(&r.key))
            .map(|r| r.key.name())
            .collect();
        assert_eq!(hook_names, ["a-late", "notify", "z-early"]);
        assert_eq!(
            due(&hooks, &bundle, When::Pre),
            names(&[("z-early", "pre-install"), ("a-late", "pre-install")]),
            "by weight, then kind and name"
        );
        assert_eq!(
            due(&hooks, &bundle, When::Post),
            names(&[("notify", "post-install")])
        );

        // Its Deployment was applied before (by an agent that kept no fingerprint):
        // an upgrade, which the post-install hook does not run on.
        let web = bundle
            .resources
            .iter()
            .find(|r| r.key.name() == "web")
            .expect("web");
        ledger.record_apply(&InventoryEntry::of(web), true, Some("uid-1"));
        let hooks = Hooks::plan(&bundle, &ledger, None);
        assert_eq!(
            due(&hooks, &bundle, When::Pre),
            names(&[("z-early", "pre-upgrade"), ("a-late", "pre-upgrade")])
        );
        assert!(due(&hooks, &bundle, When::Post).is_empty());
        let all: Vec<&Arc<Resource>> = bundle.resources.iter().collect();
        let notify_line = hooks.idle_lines(&all);
        assert_eq!(notify_line.len(), 1);
        assert_eq!(
            notify_line[0].status.message,
            "Helm hook (post-install): not run, release web is being upgraded"
        );

        // Recorded as run to the end: nothing is due until the release changes.
        ledger.releases.extend(hooks.releases_of(&bundle, &all));
        assert_eq!(ledger.releases.len(), 1, "only web has hooks");
        let hooks = Hooks::plan(&bundle, &ledger, None);
        assert!(due(&hooks, &bundle, When::Pre).is_empty());
        assert_eq!(hooks.idle_lines(&all).len(), 3);
        let changed = release(2);
        let hooks = Hooks::plan(&changed, &ledger, None);
        assert_eq!(due(&hooks, &changed, When::Pre).len(), 2);
    }

    /// With the agent's key a release's fingerprint is keyed (it covers the release's
    /// opened Secrets): not the plain hash an older agent kept, which still counts as
    /// the same release (no hook runs for the change of form), and is then replaced.
    #[test]
    fn a_release_fingerprint_is_keyed_and_an_older_unkeyed_one_still_matches() {
        let bundle = release(1);
        let all: Vec<&Arc<Resource>> = bundle.resources.iter().collect();
        let mut ledger = Ledger::new("edge-1");
        let unkeyed: Vec<(String, String)> =
            Hooks::plan(&bundle, &ledger, None).releases_of(&bundle, &all);
        let key = [7u8; 32];
        let keyed: Vec<(String, String)> =
            Hooks::plan(&bundle, &ledger, Some(&key)).releases_of(&bundle, &all);
        assert_eq!(unkeyed.len(), 1);
        assert_eq!(keyed.len(), 1);
        assert_ne!(keyed[0].1, unkeyed[0].1, "keyed, not the plain hash");
        let other: Vec<(String, String)> =
            Hooks::plan(&bundle, &ledger, Some(&[8u8; 32])).releases_of(&bundle, &all);
        assert_ne!(
            keyed[0].1, other[0].1,
            "another agent's key, another fingerprint"
        );
        // An older agent's fingerprint: nothing is due.
        ledger.releases.extend(unkeyed);
        let hooks = Hooks::plan(&bundle, &ledger, Some(&key));
        assert!(due(&hooks, &bundle, When::Pre).is_empty());
        assert!(due(&hooks, &bundle, When::Post).is_empty());
        assert_eq!(
            hooks.releases_of(&bundle, &all),
            keyed,
            "recorded keyed from now on"
        );
    }
}
