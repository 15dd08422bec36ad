//! Drift in the dir sink: a file the sink wrote that was edited or deleted by hand.
//!
//! The sink compares each resource's file with what it would write for the applied
//! bundle (byte for byte, as it decides what to rewrite). A missing file is drift
//! (`deleted`); a different one is drift at the applied fields whose values differ
//! (the file read back as YAML), or, when no applied field differs (a comment, a field
//! added, YAML that does not read), at the marker path [`FILE_CONTENT`]. Files have no
//! field managers, so none are named. Under `correct` the file is written again;
//! under `report` it is left. Files the sink never wrote are never looked at.

use std::fs;
use std::io;

use serde_json::Value;

use super::{DirSink, file_name, header};
use crate::sink::drift::{self, DriftCheck, FILE_CONTENT};
use crate::sink::with_flotilla_metadata;
use flotilla_core::bundle::{Bundle, DriftPolicy, Resource};
use flotilla_core::status::DriftAction;

/// Files larger than this are not read as YAML to name fields: only the marker is.
const MAX_READ_BACK: usize = 1024 * 1024;

impl DirSink {
    pub(super) fn detect_drift(&mut self, bundle: &Bundle) -> DriftCheck {
        let manifest = self.load_manifest();
        let header = header(&bundle.cluster);
        self.memory.start(&bundle.digest);
        let mut report = Vec::new();
        let mut rewritten = false;
        for (index, resource) in bundle.resources.iter().enumerate() {
            let key = &resource.key;
            let name = file_name(key);
            if !manifest.files.contains(&name) {
                continue;
            }
            // Made one file at a time, as an apply makes them; a resource that cannot
            // be written as YAML has no file to compare.
            let Ok(content) = Self::content(bundle, resource, &header) else {
                continue;
            };
            let path = self.target.join(&name);
            let found = match fs::read(&path) {
                Ok(bytes) if bytes == content => {
                    self.memory.settled(key);
                    continue;
                }
                Ok(bytes) => drift::Found {
                    fields: edited_fields(bundle, resource, &bytes),
                    deleted: false,
                },
                Err(err) if err.kind() == io::ErrorKind::NotFound => drift::Found {
                    fields: Vec::new(),
                    deleted: true,
                },
                Err(err) => {
                    tracing::warn!(resource = %key, file = %path.display(), error = %err,
                        "cannot read the file to look for drift");
                    continue;
                }
            };
            let policy = bundle
                .meta
                .as_ref()
                .map_or(DriftPolicy::Correct, |meta| meta.drift_of(index));
            let mut action = self.memory.decide(key, policy, &found);
            if action == DriftAction::Corrected {
                match self.write_file(&name, &content) {
                    Ok(()) => {
                        self.memory.corrected(key, &found);
                        rewritten = true;
                    }
                    Err(err) => {
                        tracing::warn!(resource = %key, file = %path.display(), error = %err,
                            "cannot write the file again to correct its drift; left as it is");
                        action = DriftAction::Reported;
                    }
                }
            }
            report.push(found.report(key, Vec::new(), action));
        }
        if rewritten && let Err(err) = flotilla_fs::sync_dir(&self.target) {
            tracing::warn!(folder = %self.target.display(), error = %err, "cannot sync the folder");
        }
        for drifted in &report {
            self.memory.log(drifted);
        }
        DriftCheck::Checked {
            drift: report,
            health: Vec::new(),
        }
    }
}

/// The applied fields whose values differ in an edited file, or the marker.
fn edited_fields(bundle: &Bundle, resource: &Resource, bytes: &[u8]) -> Vec<String> {
    let written = with_flotilla_metadata(resource.value(), &bundle.cluster, None);
    let read = (bytes.len() <= MAX_READ_BACK)
        .then(|| std::str::from_utf8(bytes).ok())
        .flatten()
        .and_then(|text| serde_saphyr::from_str::<Value>(text).ok());
    let fields = read
        .map(|read| drift::differing_paths(&written, &read))
        .unwrap_or_default();
    if fields.is_empty() {
        vec![FILE_CONTENT.to_string()]
    } else {
        fields
    }
}
