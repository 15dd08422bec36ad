//! Drift in the kube sink ([`crate::sink::drift`] says what counts).
//!
//! Every apply keeps, per applied object, where the object lives (its kind as
//! discovery found it) and a [`Fingerprint`] of the server's answer at the applied
//! leaves; no object is kept. A check reads each applied object once (one GET each, no
//! discovery: a check costs no more requests than an apply) and compares. A 404 is
//! drift (`deleted`), except for a Job that ran and was removed after it finished. The
//! managers that changed a drifted field come from the live object's managed fields.
//!
//! Under `correct` the drifted objects alone are applied again, taking the fields back
//! from whoever changed them (a forced apply: the workload's policy asks flotilla to
//! own them); the answer is the new fingerprint. Under `report` nothing is written.

use std::collections::{HashMap, HashSet};

use serde_json::Value;

use super::discovery::Found;
use super::{FIELD_MANAGER, KubeSink, has_health_rule, health, job_ran};
use crate::cache::InventoryEntry;
use crate::sink::apply_rank;
use crate::sink::drift::{self, DriftCheck, Fingerprint, Memory};
use flotilla_core::bundle::{Bundle, Digest, DriftPolicy, ResourceKey};
use flotilla_core::status::{DriftAction, ResourceStatus};

/// What the sink keeps of its applies for drift checks.
#[derive(Debug, Default)]
pub(super) struct Tracker {
    /// The bundle the fingerprints are of.
    digest: Option<Digest>,
    applied: HashMap<ResourceKey, Applied>,
    memory: Memory,
}

#[derive(Debug)]
struct Applied {
    found: Found,
    fingerprint: Fingerprint,
}

/// One object the server answered an apply for.
#[derive(Debug)]
pub(super) struct Answered {
    key: ResourceKey,
    applied: Applied,
}

impl Answered {
    /// `object` as it was applied, and `answer` as the server returned it.
    pub fn of(key: &ResourceKey, found: &Found, object: &Value, answer: &Value) -> Answered {
        Answered {
            key: key.clone(),
            applied: Applied {
                found: found.clone(),
                fingerprint: Fingerprint::of(object, answer),
            },
        }
    }
}

impl Tracker {
    /// Records what an apply of `bundle` was answered; a new bundle starts afresh.
    pub fn record(&mut self, bundle: &Bundle, answers: Vec<Answered>) {
        if self.digest.as_ref() != Some(&bundle.digest) {
            self.digest = Some(bundle.digest.clone());
            self.applied.clear();
        }
        for answer in answers {
            self.applied.insert(answer.key, answer.applied);
        }
    }
}

/// A drifted resource waiting for its correction.
struct Correction {
    /// Its index in the bundle and in the report's drift.
    index: usize,
    line: usize,
    found: drift::Found,
}

impl KubeSink {
    pub(super) async fn detect_drift(&mut self, bundle: &Bundle) -> DriftCheck {
        if self.drift.digest.as_ref() != Some(&bundle.digest) || self.drift.applied.is_empty() {
            return DriftCheck::Unavailable;
        }
        self.drift.memory.start(&bundle.digest);
        let mut report = Vec::new();
        let mut health_lines = Vec::new();
        let mut corrections = Vec::new();
        let users = super::Users::of(bundle, self.options.impersonate_tenants);
        for (index, resource) in bundle.resources.iter().enumerate() {
            let key = &resource.key;
            let Some(applied) = self.drift.applied.get(&**key) else {
                continue;
            };
            let object = super::applied_object(bundle, resource, applied.found.namespaced);
            let namespace = applied.found.namespaced.then_some(key.namespace());
            let (found, managers) = match self
                .api
                .acting_as(users.user(key))
                .get(&applied.found.resource, namespace, key.name())
                .await
            {
                Ok(live) => {
                    if has_health_rule(key) {
                        let (state, message) = health(key, &live);
                        health_lines.push(ResourceStatus::new(key, state, message));
                    }
                    match applied.fingerprint.drifted(&object, &live) {
                        Some(fields) if !fields.is_empty() => {
                            let managers = drift::owners(&live, &object, &fields, FIELD_MANAGER);
                            let found = drift::Found {
                                fields,
                                deleted: false,
                            };
                            (found, managers)
                        }
                        _ => {
                            self.drift.memory.settled(key);
                            continue;
                        }
                    }
                }
                Err(failure) if failure.is_not_found() => {
                    if job_ran(self.ledger.as_ref(), resource) {
                        continue;
                    }
                    let found = drift::Found {
                        fields: Vec::new(),
                        deleted: true,
                    };
                    (found, Vec::new())
                }
                Err(failure) if failure.stops_run() => {
                    return DriftCheck::Failed(format!(
                        "cannot look for drift: {key}: {}",
                        failure.describe("get", &applied.found.resource.plural)
                    ));
                }
                Err(failure) => {
                    tracing::warn!(
                        resource = %key,
                        "cannot read it to look for drift: {}",
                        failure.describe("get", &applied.found.resource.plural)
                    );
                    continue;
                }
            };
            let policy = bundle
                .meta
                .as_ref()
                .map_or(DriftPolicy::Correct, |meta| meta.drift_of(index));
            let action = self.drift.memory.decide(key, policy, &found);
            if action == DriftAction::Corrected {
                corrections.push(Correction {
                    index,
                    line: report.len(),
                    found: found.clone(),
                });
            }
            report.push(found.report(key, managers, action));
        }
        // Put back in apply order: a deleted Namespace before what lives in it.
        corrections.sort_by_key(|c| (apply_rank(&bundle.resources[c.index].key), c.index));
        let mut ledger_changed = false;
        for correction in corrections {
            let resource = &bundle.resources[correction.index];
            let key = &resource.key;
            let Some(applied) = self.drift.applied.get_mut(&**key) else {
                continue;
            };
            let object = super::applied_object(bundle, resource, applied.found.namespaced);
            let namespace = applied.found.namespaced.then_some(key.namespace());
            match self
                .api
                .acting_as(users.user(key))
                .apply(
                    &applied.found.resource,
                    namespace,
                    key.name(),
                    &object,
                    true,
                )
                .await
            {
                Ok((code, answer)) => {
                    applied.fingerprint = Fingerprint::of(&object, &answer);
                    self.drift.memory.corrected(key, &correction.found);
                    if let Some(ledger) = &mut self.ledger {
                        let uid = answer.pointer("/metadata/uid").and_then(Value::as_str);
                        let before = ledger.entry(key).cloned();
                        ledger.record_apply(&InventoryEntry::of(resource), code == 201, uid);
                        ledger_changed |= ledger.entry(key) != before.as_ref();
                    }
                    if has_health_rule(key) {
                        let (state, message) = health(key, &answer);
                        health_lines.retain(|line| *line.key != **key);
                        health_lines.push(ResourceStatus::new(key, state, message));
                    }
                }
                Err(failure) => {
                    tracing::warn!(
                        resource = %key,
                        "cannot correct its drift: {}; left as it is",
                        failure.describe("patch", &applied.found.resource.plural)
                    );
                    report[correction.line].action = DriftAction::Reported;
                }
            }
        }
        if ledger_changed {
            let api = self.api.clone();
            if let Err(err) = self.save_ledger(&api).await {
                tracing::warn!("{err}");
            }
        }
        let kept: HashSet<&ResourceKey> = bundle.resources.iter().map(|r| &*r.key).collect();
        self.drift.applied.retain(|key, _| kept.contains(key));
        for drifted in &report {
            self.drift.memory.log(drifted);
        }
        DriftCheck::Checked {
            drift: report,
            health: health_lines,
        }
    }
}
